#!/usr/bin/env bash
# Coverage-guided fuzzing of k3's inputs on stable Rust (libFuzzer through `libfuzzer-sys`).
#
#   fuzz/fuzz.sh build                      build the driver (release, sancov-instrumented)
#   fuzz/fuzz.sh run TARGET [OPTION...]     fuzz one target; libFuzzer options override the defaults
#
# Scratch lives outside the repository: the build in $K3_FUZZ_BUILD (/tmp/k3-fuzz-build), the
# growing corpus and any crash in $K3_FUZZ_WORK/{corpus,artifacts}/TARGET (/tmp/k3-fuzz). The
# committed seeds and regressions are read, never written. See fuzz/README.md.
set -euo pipefail

fuzz_dir=$(cd "$(dirname "$0")" && pwd)
build_dir=${K3_FUZZ_BUILD:-/tmp/k3-fuzz-build}
work_dir=${K3_FUZZ_WORK:-/tmp/k3-fuzz}
host=x86_64-unknown-linux-gnu
binary=$build_dir/$host/release/k3-fuzz

# Stable rustc instruments for libFuzzer with the LLVM sancov pass: inline 8-bit edge counters
# and the PC table (coverage feedback), comparison tracing (so the fuzzer learns the magic keys
# and lengths the parsers compare against). `--cfg fuzzing` is what `libfuzzer-sys` expects.
# The explicit `--target` keeps these flags off build scripts and proc macros, which run on
# the host and would not link without libFuzzer.
sancov_flags="--cfg fuzzing -Cpasses=sancov-module -Cllvm-args=-sanitizer-coverage-level=4
  -Cllvm-args=-sanitizer-coverage-inline-8bit-counters -Cllvm-args=-sanitizer-coverage-pc-table
  -Cllvm-args=-sanitizer-coverage-trace-compares"

usage() {
    sed -n '4,5p' "$0" | sed 's/^# *//' >&2
    exit 2
}

case "${1:-}" in
build)
    cd "$fuzz_dir/libfuzzer"
    CARGO_TARGET_DIR=$build_dir RUSTFLAGS="$sancov_flags" \
        nice -n 10 cargo build --release --target "$host"
    echo "fuzz driver: $binary"
    ;;
run)
    target=${2:-}
    [[ -n $target ]] || usage
    shift 2
    if [[ ! -d $fuzz_dir/corpus/$target ]]; then
        echo "no target '$target': one of $(ls "$fuzz_dir/corpus" | tr '\n' ' ')" >&2
        exit 2
    fi
    [[ -x $binary ]] || { echo "no fuzz driver at $binary: run '$0 build' first" >&2; exit 1; }
    seeds=("$fuzz_dir/corpus/$target")
    [[ -d $fuzz_dir/regressions/$target ]] && seeds+=("$fuzz_dir/regressions/$target")
    mkdir -p "$work_dir/corpus/$target" "$work_dir/artifacts/$target"
    # The file-based targets write each input to a scratch file: keep that off the disk.
    if [[ -z ${TMPDIR:-} && -d /dev/shm ]]; then
        export TMPDIR=/dev/shm/k3-fuzz-tmp
        mkdir -p "$TMPDIR"
    fi
    # Defaults: stop at 1e6 executions or 30 minutes, an input running 10 s is a hang, 2 GB
    # is a leak; inputs up to 8 KiB (the tokenizer seeds are ~4 KiB). `nice -n 19`: the
    # machine is shared.
    K3_FUZZ_TARGET=$target exec nice -n 19 "$binary" \
        "$work_dir/corpus/$target" "${seeds[@]}" \
        -runs=1000000 -max_total_time=1800 -timeout=10 -rss_limit_mb=2048 -max_len=8192 \
        -print_final_stats=1 -artifact_prefix="$work_dir/artifacts/$target/" "$@"
    ;;
*)
    usage
    ;;
esac
