"""Benchmarks of the HTTP API against a running `k3d serve` (see tests/http/bench.sh).

1. Transport overhead: the same greedy generation (prompt ids, max_tokens) through gRPC
   (`k3 run --ids`, a real client process) and through HTTP (`/v1/completions`, streamed),
   wall time per generated token, medians of RUNS; reported as the HTTP/gRPC ratio.
2. Prefix reuse: time to first token of turn 3 of a chat through `/v1/chat/completions`,
   computed afresh (`prefix_reuse: false`) vs continuing the caller's kept state, each on an
   idle daemon (after the reply was read, so the warming of the history has finished); medians
   of RUNS, reported as reuse/fresh. Also turn 3 sent the moment turn 2 ends (an agent's next
   turn), which waits for that warming: one figure.
3. Time to first token where users feel it (`--only ttft`): a chat of about `--ttft-tokens`
   prompt tokens (an editor's file context: a system prompt and one long user message) through
   streamed `/v1/chat/completions`, on a daemon this script starts afresh for each run (`--k3d`,
   `--model-dir`, `--serve-args`): cold = the first request of the new daemon (nothing kept,
   expert cache empty); warm = the same daemon, after the cold reply was read, the next turn
   (the same conversation + that reply + a short question), which continues the kept state.
   Medians of RUNS daemon starts, printed as a table; `--results FILE` appends each run to FILE
   and prints the table over every run in it, so runs may be taken in separate sittings.
4. A new session's time to first token (`--only session`, issue 42): three conversations that
   share a system prompt of about `--ttft-tokens` prompt tokens (an agent's prelude) and ask
   different questions, each a new session: cold = the first, on a daemon just started;
   warm in memory = the second, on the same daemon once the first reply's warming is done;
   warm from disk = the third, on the daemon started again on the same session directory
   (the prelude's state written to disk by the first daemon, which SIGTERM lets finish).
   Medians of RUNS, as for `--only ttft` (and `--results` likewise).

Figures are ratios measured in one run on a shared, noisy machine: compare them, not the
absolute times, with other runs.
"""

import argparse
import json
import os
import shlex
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


# Words of the synthetic file context; a fixed generator makes the prompt the same every run.
WORDS = ("the river ran past old mills and quiet towns where people kept boats under willow trees "
         "while a storm gathered over the hills and the miller counted sacks of grain before "
         "winter came early that year with frost on every window and smoke from each chimney "
         "function returns value index buffer error config module test parser token stream").split()


def filler(words):
    state = 12345
    out = []
    for _ in range(words):
        state = (state * 6364136223846793005 + 1442695040888963407) % (1 << 64)
        out.append(WORDS[(state >> 33) % len(WORDS)])
    return " ".join(out)


def ttft_conversation(words):
    system = "You are a careful assistant. Answer questions about the document the user sends."
    user = "Here is a document:\n\n" + filler(words) + "\n\nWhat is this document about?"
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


def prompt_tokens(client, args, messages):
    """The daemon's count of the conversation's prompt tokens (`/v1/messages/count_tokens`)."""
    body = {"model": args.model, "system": messages[0]["content"], "messages": messages[1:]}
    r = client.post("/v1/messages/count_tokens", json=body)
    r.raise_for_status()
    return r.json()["input_tokens"]


def sized_conversation(client, args):
    """A conversation of about --ttft-tokens prompt tokens: the word count is corrected from
    the daemon's own count until it lands within 1 %."""
    words = args.ttft_tokens
    for _ in range(8):
        messages = ttft_conversation(words)
        n = prompt_tokens(client, args, messages)
        if abs(n - args.ttft_tokens) <= args.ttft_tokens // 100:
            return messages
        words = max(1, round(words * args.ttft_tokens / n))
    raise SystemExit(f"bench: no conversation of ~{args.ttft_tokens} tokens (last {n})")


def chat_turn(client, args, messages):
    """One streamed chat turn: (seconds to its first token, reply text, usage)."""
    body = {"model": args.model, "messages": messages, "max_tokens": args.reply_tokens,
            "temperature": 0, "thinking": {"type": "disabled"},
            "stream_options": {"include_usage": True}}
    t = time.monotonic()
    first, text, usage = None, [], None
    with client.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[len("data: "):])
            usage = chunk.get("usage") or usage
            for choice in chunk.get("choices", []):
                delta = choice.get("delta", {})
                piece = delta.get("content") or delta.get("reasoning_content")
                if piece:
                    first = first or time.monotonic() - t
                    text.append(piece)
    if first is None or usage is None:
        raise SystemExit(f"bench: the chat turn produced no token or no usage ({usage})")
    return first, "".join(text), usage


def start_daemon(args, run, sessions=None):
    """`k3d serve` on fresh sockets and session directory (or `sessions`); returns (process,
    HTTP client, seconds until /health said ready)."""
    work = os.path.join(args.work, f"run{run}")
    os.makedirs(work)
    http = os.path.join(work, "http.sock")
    cmd = [args.k3d, "serve", "--model", args.model_dir, "--socket", os.path.join(work, "k3d.sock"),
           "--http", f"unix:{http}", "--session-dir", sessions or os.path.join(work, "sessions"),
           *shlex.split(args.serve_args)]
    log = open(os.path.join(work, "k3d.log"), "w")
    t = time.monotonic()
    daemon = subprocess.Popen(cmd, stdout=log, stderr=log)
    client = http_client(http)
    while True:
        if daemon.poll() is not None:
            raise SystemExit(f"bench: k3d exited ({daemon.returncode}); see {log.name}")
        if time.monotonic() - t > 900:
            daemon.kill()
            raise SystemExit("bench: k3d was not ready within 15 minutes")
        try:
            if client.get("/health").status_code == 200:
                return daemon, client, time.monotonic() - t
        except httpx.TransportError:
            pass
        time.sleep(0.1)


def ttft_run(args, run):
    daemon, client, ready = start_daemon(args, run)
    try:
        messages = sized_conversation(client, args)
        cold, reply, cold_usage = chat_turn(client, args, messages)
        # The reply was read before the next turn is typed: wait until the daemon has warmed
        # the conversation's history (or clearly will not), so the warm turn starts idle.
        wait_warmed(client)
        messages += [{"role": "assistant", "content": reply},
                     {"role": "user", "content": "Thank you. Say it again in one sentence."}]
        warm, _, warm_usage = chat_turn(client, args, messages)
    finally:
        daemon.terminate()
        daemon.wait()
    cached = lambda u: (u.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
    return {"model": args.model, "serve_args": args.serve_args, "ready_s": ready,
            "cold": {"ttft_s": cold, "prompt_tokens": cold_usage["prompt_tokens"],
                     "cached_tokens": cached(cold_usage)},
            "warm": {"ttft_s": warm, "prompt_tokens": warm_usage["prompt_tokens"],
                     "cached_tokens": cached(warm_usage)}}


def wait_warmed(client, before=0):
    """Waits until the daemon has warmed the last reply's history — its count of warmed tokens
    passed `before`, what it was before that reply — or clearly will not."""
    deadline = time.monotonic() + 120
    while warmed_tokens(client) <= before:
        if time.monotonic() > deadline:
            print("bench: the daemon did not warm the history within 120 s", flush=True)
            return
        time.sleep(0.05)


def session_conversation(words, question):
    system = "You are a careful coding agent. Follow these instructions:\n\n" + filler(words)
    return [{"role": "system", "content": system}, {"role": "user", "content": question}]


SESSION_QUESTIONS = ["What do the instructions say first?", "Name one rule you must follow.",
                     "Summarise the instructions in one line."]


def session_run(args, run):
    daemon, client, ready = start_daemon(args, f"{run}a")
    sessions = os.path.join(args.work, f"run{run}a", "sessions")
    sides = {}
    try:
        words = args.ttft_tokens
        for _ in range(8):
            n = prompt_tokens(client, args, session_conversation(words, SESSION_QUESTIONS[0]))
            if abs(n - args.ttft_tokens) <= args.ttft_tokens // 100:
                break
            words = max(1, round(words * args.ttft_tokens / n))
        for side, question in zip(("cold", "memory"), SESSION_QUESTIONS):
            before = warmed_tokens(client)
            sides[side] = chat_turn(client, args, session_conversation(words, question))
            wait_warmed(client, before)
    finally:
        daemon.terminate()
        daemon.wait()
    daemon, client, _ = start_daemon(args, f"{run}b", sessions)
    try:
        sides["disk"] = chat_turn(client, args, session_conversation(words, SESSION_QUESTIONS[2]))
        written = [line for line in client.get("/metrics").text.splitlines()
                   if line.startswith("k3d_prefix_disk_hits")]
    finally:
        daemon.terminate()
        daemon.wait()
    cached = lambda u: (u.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
    files = sorted(os.path.getsize(os.path.join(sessions, f))
                   for f in os.listdir(sessions) if f.endswith(".k3p"))
    return {"model": args.model, "serve_args": args.serve_args, "ready_s": ready,
            "kept_files_bytes": files, "disk_hits": written,
            **{side: {"ttft_s": t, "prompt_tokens": u["prompt_tokens"], "cached_tokens": cached(u)}
               for side, (t, _, u) in sides.items()}}


def ttft(args, sides=("cold", "warm"), run_once=None):
    runs = []
    for run in range(args.runs):
        r = (run_once or ttft_run)(args, run)
        print(f"ttft run: {json.dumps(r)}", flush=True)
        runs.append(r)
        if args.results:
            with open(args.results, "a") as f:
                f.write(json.dumps(r) + "\n")
    if args.results:
        with open(args.results) as f:
            runs = [json.loads(line) for line in f if line.strip()]
        runs = [r for r in runs if (r["model"], r["serve_args"]) == (args.model, args.serve_args)
                and all(side in r for side in sides)]
    med = lambda side, key: statistics.median(r[side][key] for r in runs)
    cold = med("cold", "ttft_s")
    print(f"\nTime to first token, streamed /v1/chat/completions, k3d serve {args.serve_args}, "
          f"medians of {len(runs)} daemon starts:")
    print("| model | turn | prompt tokens | from kept state | TTFT s (runs) | median s |")
    print("|---|---|---|---|---|---|")
    for side in sides:
        each = " / ".join(f"{r[side]['ttft_s']:.2f}" for r in runs)
        print(f"| {args.model} | {side} | {med(side, 'prompt_tokens'):.0f} | "
              f"{med(side, 'cached_tokens'):.0f} | {each} | {med(side, 'ttft_s'):.2f} |")
    for side in sides[1:]:
        print(f"{side}/cold {med(side, 'ttft_s') / cold:.3f}x")
    print(f"daemon ready after {statistics.median(r['ready_s'] for r in runs):.1f} s (median)")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--k3")
    p.add_argument("--grpc-socket")
    p.add_argument("--http-socket")
    p.add_argument("--model", required=True)
    p.add_argument("--k3d", help="ttft: the k3d binary to start")
    p.add_argument("--model-dir", help="ttft: the checkpoint k3d serves")
    p.add_argument("--work", help="ttft: a fresh directory for sockets, sessions and logs")
    p.add_argument("--serve-args", default="", help="ttft: more `k3d serve` flags")
    p.add_argument("--ttft-tokens", type=int, default=2000)
    p.add_argument("--results", help="ttft: append each run here; the table covers them all")
    p.add_argument("--prompt-ids", type=lambda s: [int(i) for i in s.split()], default=[1, 2, 3, 4])
    p.add_argument("--tokens", type=int, default=512)
    p.add_argument("--reply-tokens", type=int, default=64)
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--only", choices=["overhead", "prefix", "ttft", "session"])
    args = p.parse_args()
    if args.only in ("ttft", "session"):
        if not (args.k3d and args.model_dir and args.work):
            p.error(f"--only {args.only} needs --k3d, --model-dir and --work")
        if args.only == "session":
            return ttft(args, ("cold", "memory", "disk"), session_run)
        return ttft(args)
    if not (args.k3 and args.grpc_socket and args.http_socket):
        p.error("overhead and prefix need --k3, --grpc-socket and --http-socket")
    client = http_client(args.http_socket)
    if args.only in (None, "overhead"):
        overhead(args, client)
    if args.only in (None, "prefix"):
        prefix_reuse(args, client)


if __name__ == "__main__":
    main()
