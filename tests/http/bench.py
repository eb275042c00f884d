"""Benchmarks of the HTTP API against a running `k3d serve` (see tests/http/bench.sh).

1. Transport overhead: the same greedy generation (prompt ids, max_tokens) through gRPC
   (`k3 run --ids`, a real client process) and through HTTP (`/v1/completions`, streamed),
   wall time per generated token, medians of RUNS; reported as the HTTP/gRPC ratio.
2. Prefix reuse: time to first token of turn 3 of a chat through `/v1/chat/completions`,
   computed afresh (`prefix_reuse: false`) vs continuing the caller's kept state, each on an
   idle daemon (after the reply was read, so the warming of the history has finished); medians
   of RUNS, reported as reuse/fresh. Also turn 3 sent the moment turn 2 ends (an agent's next
   turn), which waits for that warming: one figure.

Figures are ratios measured in one run on a shared, noisy machine: compare them, not the
absolute times, with other runs.
"""

import argparse
import json
import statistics
import subprocess
import time

import httpx2 as httpx


def http_client(socket):
    return httpx.Client(transport=httpx.HTTPTransport(uds=socket), base_url="http://k3d", timeout=3600)


def stream(client, path, body):
    """Streams `body` to `path`; returns (seconds to the first content chunk, total seconds,
    the text)."""
    t = time.monotonic()
    first = None
    text = []
    with client.stream("POST", path, json={**body, "stream": True}) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[len("data: "):])
            for choice in chunk.get("choices", []):
                piece = choice.get("text") or choice.get("delta", {}).get("content") \
                    or choice.get("delta", {}).get("reasoning_content")
                if piece:
                    first = first or time.monotonic() - t
                    text.append(piece)
    return first, time.monotonic() - t, "".join(text)


def overhead(args, client):
    ids = " ".join(str(i) for i in args.prompt_ids)
    grpc, http = [], []
    for _ in range(args.runs):
        t = time.monotonic()
        out = subprocess.run([args.k3, "--socket", args.grpc_socket, "run", "--ids", ids,
                              "--max-tokens", str(args.tokens)], check=True, capture_output=True)
        grpc.append((time.monotonic() - t) / args.tokens)
        generated = len(out.stdout.split())
        assert generated == args.tokens, (generated, out.stderr)
        body = {"model": args.model, "prompt": args.prompt_ids, "max_tokens": args.tokens,
                "temperature": 0, "prefix_reuse": False}
        _, total, _ = stream(client, "/v1/completions", body)
        http.append(total / args.tokens)
    g, h = statistics.median(grpc), statistics.median(http)
    print(f"overhead: {args.tokens} tokens, medians of {args.runs}: gRPC {g * 1e3:.3f} ms/token, "
          f"HTTP {h * 1e3:.3f} ms/token, HTTP/gRPC {h / g:.3f}x (target <= 1.05x)")


def warmed_tokens(client):
    """The daemon's count of history tokens fed to warm callers' next turns (`/metrics`)."""
    for line in client.get("/metrics").text.splitlines():
        if line.startswith("k3d_prefix_warmed_tokens"):
            return float(line.split()[-1])
    raise SystemExit("bench: /metrics has no k3d_prefix_warmed_tokens")


def reused_turn(client, body):
    """Time to first token of `body` continuing the caller's kept state; returns once the
    warming its reply starts has finished (as it has when a person reads the reply before
    typing the next turn), so the next measured request starts on an idle daemon."""
    before = warmed_tokens(client)
    ttft = stream(client, "/v1/chat/completions", body)[0]
    deadline = time.monotonic() + 5 + 3 * ttft
    while warmed_tokens(client) <= before:
        if time.monotonic() > deadline:
            print("bench: warming did not end")
            break
        time.sleep(0.05)
    return ttft


def prefix_reuse(args, client):
    turns = [{"role": "user", "content": "Write a long story about a river, with many details."}]
    common = {"model": args.model, "max_tokens": args.reply_tokens, "temperature": 0,
              "thinking": {"type": "disabled"}}
    for follow_up in ["Continue the story, please.", "Now tell it from the fish's side."]:
        _, _, reply = stream(client, "/v1/chat/completions", {**common, "messages": turns})
        turns += [{"role": "assistant", "content": reply}, {"role": "user", "content": follow_up}]
    body = {**common, "messages": turns, "max_tokens": 1}
    # At once: turn 3 sent the moment turn 2's reply ends, as an agent's next turn is, so it
    # waits for the daemon to finish warming turn 2's history. One figure per conversation.
    at_once = reused_turn(client, body)
    # Each measured request starts on an idle daemon (a fresh request would otherwise wait for
    # a round of the warming that follows a reused one).
    fresh, reused = [], []
    for _ in range(args.runs):
        fresh.append(stream(client, "/v1/chat/completions", {**body, "prefix_reuse": False})[0])
        reused.append(reused_turn(client, body))
    usage = client.post("/v1/chat/completions", json=body).json()["usage"]
    f, r = statistics.median(fresh), statistics.median(reused)
    print(f"prefix reuse: turn 3 ({usage['prompt_tokens']} prompt tokens, "
          f"{(usage.get('prompt_tokens_details') or {}).get('cached_tokens', 0)} from a kept state), "
          f"time to first token, medians of {args.runs}: fresh {f * 1e3:.1f} ms, "
          f"reused after the reply was read {r * 1e3:.1f} ms, reused/fresh {r / f:.3f}x "
          f"(target <= 0.1x); sent at once after turn 2 {at_once * 1e3:.1f} ms, {at_once / f:.3f}x")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--k3", required=True)
    p.add_argument("--grpc-socket", required=True)
    p.add_argument("--http-socket", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--prompt-ids", type=lambda s: [int(i) for i in s.split()], default=[1, 2, 3, 4])
    p.add_argument("--tokens", type=int, default=512)
    p.add_argument("--reply-tokens", type=int, default=64)
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--only", choices=["overhead", "prefix"])
    args = p.parse_args()
    client = http_client(args.http_socket)
    if args.only in (None, "overhead"):
        overhead(args, client)
    if args.only in (None, "prefix"):
        prefix_reuse(args, client)


if __name__ == "__main__":
    main()
