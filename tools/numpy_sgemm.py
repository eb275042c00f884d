#!/usr/bin/env python3
"""numpy's (OpenBLAS's) SGEMM and DGEMM rate on this machine, the outside yardstick `k3d bench`'s
own GEMM probes are checked against (issue 41: prefill at >= 0.75x numpy sgemm).

Usage: python3 tools/numpy_sgemm.py [--threads N] [--seconds S] [--size N]
Prints one line per precision: GFLOP/s (2*n^3 per multiply), median of the timed calls, with
the thread count OpenBLAS actually used (threadpoolctl). Needs numpy and threadpoolctl.
"""
import argparse
import statistics
import time

import numpy as np
from threadpoolctl import threadpool_info, threadpool_limits


def rate(dtype, n, seconds):
    rng = np.random.default_rng(0)
    a = rng.uniform(-1, 1, (n, n)).astype(dtype)
    b = rng.uniform(-1, 1, (n, n)).astype(dtype)
    c = a @ b  # warm-up: threads, pages
    times = []
    end = time.perf_counter() + seconds
    while time.perf_counter() < end or len(times) < 3:
        t0 = time.perf_counter()
        np.matmul(a, b, out=c)
        times.append(time.perf_counter() - t0)
    return 2.0 * n**3 / statistics.median(times) / 1e9, len(times)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--seconds", type=float, default=3.0)
    p.add_argument("--size", type=int, default=2048)
    args = p.parse_args()
    with threadpool_limits(limits=args.threads, user_api="blas"):
        used = [i.get("num_threads") for i in threadpool_info() if i.get("user_api") == "blas"]
        for name, dtype in (("sgemm", np.float32), ("dgemm", np.float64)):
            gflops, calls = rate(dtype, args.size, args.seconds)
            print(f"numpy {name}: {gflops:.1f} GFLOP/s ({args.size}^3, {calls} calls, blas threads {used})")


if __name__ == "__main__":
    main()
