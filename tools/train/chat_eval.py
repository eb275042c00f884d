#!/usr/bin/env python3
"""Structure metrics of a trained fixture's chat replies, read by k3d's own reply parser.

Usage: chat_eval.py MODEL_DIR [--k3d PATH] [--scenes N] [--agents DIR] [--out FILE]

Starts `k3d serve MODEL_DIR --http 127.0.0.1:PORT` (one thread) and sends greedy
`/v1/chat/completions` requests: held-out scenes from `conversations.py` (a seed training never
uses) and, with --agents, the real first requests of Claude Code, Codex, opencode and aider
(`/work/shared/agent-requests`-style captures: Anthropic Messages and Responses bodies are
converted to chat completions here), each also continued by a round trip (the expected call,
a tool result) so the answer to a result is measured too. Per reply it records what k3d made
of it: well-formed or `k3_malformed`, `finish_reason`, the calls (name, arguments) and the
content. The summary counts, per kind of scene, the replies that are well-formed and that do
what the scene expects: a call of the expected tool with the expected argument keys and the
values it copies from the request (a command, a file, a city; `description` is free), or an
answer with text and no call; in a held-out scene with thinking on, also thinking that opens
with the expected reply's first three words (which say what kind of reply it decided on).
"""

import argparse
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import corpus  # noqa: E402
import conversations as cv  # noqa: E402

EVAL_SEED = 777  # never a training seed
MAX_TOKENS = 256


def chat_body(scene):
    """A scene as an OpenAI chat-completions request (thinking as the `thinking` extension and
    `reasoning_effort`, which k3d maps onto the template's settings)."""
    messages, calls = [], []
    for m in scene["messages"]:
        if m["role"] == "assistant":
            calls = [{"id": f"call_{i}", "type": "function",
                      "function": {"name": n, "arguments": json.dumps(a)}}
                     for i, (n, a) in enumerate(m.get("calls") or [])]
            out = {"role": "assistant", "content": m["content"]}
            if m.get("reasoning"):
                out["reasoning_content"] = m["reasoning"]
            if calls:
                out["tool_calls"] = calls
            messages.append(out)
        elif m["role"] == "tool":
            messages.append({"role": "tool", "tool_call_id": f"call_{m['index'] - 1}",
                             "content": m["content"]})
        else:
            messages.append({"role": m["role"], "content": m["content"]})
    body = {"messages": messages, "thinking": scene["thinking"]}
    if scene["thinking"]:
        body["reasoning_effort"] = scene.get("effort") or "max"
    if scene["tools"]:
        body["tools"] = scene["tools"]
    if scene.get("tool_choice"):
        body["tool_choice"] = scene["tool_choice"]
    if scene.get("json"):
        body["response_format"] = {"type": "json_object"}
    return body


def expectation(reply):
    calls = reply.get("calls")
    if calls:
        # The values copied from the request (a command, a file, a city) must be right too; a
        # `description` argument is free text.
        values = {k: v for k, v in calls[0][1].items() if k != "description"}
        return {"call": calls[0][0], "keys": sorted(calls[0][1]), "values": values}
    return {"answer": True}


def text_of(content):
    if isinstance(content, str):
        return content
    return "".join(b.get("text", "") for b in content if b.get("type") in ("text", "input_text"))


def from_anthropic(body):
    """Claude Code's Messages request as chat completions (system blocks joined by newlines,
    text blocks of a message joined, `system` messages inside `messages` kept in place)."""
    messages = [{"role": "system", "content": "\n".join(b["text"] for b in body["system"])}]
    for m in body["messages"]:
        messages.append({"role": m["role"], "content": text_of(m["content"])})
    tools = [{"type": "function", "function": {"name": t["name"], "description": t["description"],
                                               "parameters": t["input_schema"]}}
             for t in body["tools"]]
    return {"messages": messages, "tools": tools, "thinking": True, "reasoning_effort": "high"}


def from_responses(body):
    """Codex's Responses request as chat completions (developer items as system messages;
    only function tools, the others have no chat-completions form)."""
    messages = [{"role": "system" if m["role"] == "developer" else m["role"],
                 "content": text_of(m["content"])} for m in body["input"]]
    tools = [{"type": "function", "function": {"name": t["name"], "description": t["description"],
                                               "parameters": t["parameters"]}}
             for t in body["tools"] if t.get("type") == "function"]
    return {"messages": messages, "tools": tools, "thinking": True, "reasoning_effort": "max"}


# The real agents' first requests: converter, the shell tool and its command argument.
AGENTS = {
    "claude-code.json": (from_anthropic, "Bash", ["command", "description"], "ls"),
    "codex.json": (from_responses, "exec_command", ["cmd"], "ls"),
    "opencode.json": (lambda b: dict(b), "bash", ["command"], "ls"),
    "aider.json": (lambda b: dict(b), None, None, None),
}


def agent_cases(directory):
    """(name, body, expectation) for each capture, and each with tools continued by a round
    trip: the expected call and its result, after which an answer is expected."""
    cases = []
    for name, (convert, shell, keys, command) in AGENTS.items():
        path = Path(directory) / name
        if not path.exists():
            continue
        body = convert(json.loads(path.read_text())["body"])
        body = {k: body[k] for k in ("messages", "tools", "thinking", "reasoning_effort")
                if k in body}
        if shell is None:
            cases.append((name, body, {"answer": True}))
            continue
        cases.append((name, body, {"call": shell, "keys": sorted(keys)}))
        arguments = {keys[0]: command}
        if "description" in keys:
            arguments["description"] = "List files in current directory"
        trip = json.loads(json.dumps(body))
        trip["messages"] += [
            {"role": "assistant", "content": "Let me list the files.", "tool_calls": [
                {"id": "call_0", "type": "function",
                 "function": {"name": shell, "arguments": json.dumps(arguments)}}]},
            {"role": "tool", "tool_call_id": "call_0", "content": "add.py\nREADME.md"}]
        cases.append((name + " +result", trip, {"answer": True}))
    return cases


def scene_cases(n, simple=False):
    """n held-out scenes: of session 2's full generator, or (simple) of the r4 curriculum's
    `SimpleScenes` — the same generators as training, from a seed training never uses."""
    _, files = corpus.stdlib_files()
    Scenes = cv.SimpleScenes if simple else cv.Scenes
    scenes = Scenes(corpus.docstring_paragraphs(files), corpus.docstring_facts(files), EVAL_SEED)
    out = []
    for i in range(n):
        s = scenes.make()
        if s["thinking"] and not s.get("effort"):
            s["effort"] = "max"  # chat completions always name an effort with thinking on
        if s["reply"].get("calls"):
            kind = "call"
        elif any(m["role"] == "tool" for m in s["messages"][-2:]):
            kind = "answer after a result"
        else:
            kind = "answer with tools declared" if s["tools"] else "answer"
        want = expectation(s["reply"])
        if s["thinking"] and s["reply"].get("reasoning"):
            # The thinking's first words name the kind the reply decided on ("I will call …",
            # "The command finished …", "The user wants …"): an answer of the wrong kind has
            # text and no call too, which the structural check alone counts as expected.
            want["opening"] = " ".join(s["reply"]["reasoning"].split()[:3])
        out.append((f"scene {i}: {kind}", chat_body(s), want))
    return out


class Daemon:
    def __init__(self, k3d, model):
        self.dir = tempfile.mkdtemp(prefix="k3d-chat-eval-")
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.proc = subprocess.Popen(
            [k3d, "serve", "--model", str(model), "--socket", f"{self.dir}/k3d.sock",
             "--threads", "1", "--max-active", "1", "--session-dir", f"{self.dir}/sessions",
             "--http", f"127.0.0.1:{self.port}"],
            stdout=subprocess.DEVNULL, stderr=open(f"{self.dir}/log", "w"))
        for _ in range(600):
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=1):
                    pass  # 200 once the model is loaded (503 while loading)
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/v1/models",
                                            timeout=1) as r:
                    self.model = json.load(r)["data"][0]["id"]
                return
            except OSError:
                time.sleep(0.2)
        raise SystemExit(f"k3d did not come up; log in {self.dir}/log")

    def chat(self, body):
        body = dict(body, model=self.model, max_tokens=MAX_TOKENS, temperature=0)
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}/v1/chat/completions",
                                     data=json.dumps(body).encode(),
                                     headers={"content-type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=3600) as r:
                return json.load(r)
        except urllib.error.HTTPError as e:
            return {"http_error": e.code, "body": e.read().decode(errors="replace")}

    def stop(self):
        """Stops the daemon and removes its directory (socket, sessions, log)."""
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


def judge(answer, want):
    """(well-formed, as expected, summary) of one response. As expected: the call of the
    expected tool with the expected argument keys, or an answer with text and no call; and
    where the scene thinks, thinking that opens with the expected reply's first words."""
    if "http_error" in answer:
        return False, False, f"HTTP {answer['http_error']}: {answer['body'][:200]}"
    choice = answer["choices"][0]
    message = choice["message"]
    if "k3_malformed" in choice:
        return False, False, f"malformed: {choice['k3_malformed']['error']}; raw " + repr(
            choice["k3_malformed"]["raw"][:300])
    calls = message.get("tool_calls") or []
    try:
        got = [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls]
    except json.JSONDecodeError:
        return False, False, f"arguments are not JSON: {calls}"
    finish = choice["finish_reason"]
    thinking = message.get("reasoning_content") or ""
    summary = (f"{finish}; calls {got}; thinking {thinking!r:.60}; "
               f"content {message.get('content')!r:.120}")
    if finish == "length":
        return False, False, "truncated: " + summary
    if "call" in want:
        ok = bool(got) and got[0][0] == want["call"] and sorted(got[0][1]) == want["keys"] and all(
            got[0][1].get(k) == v for k, v in want.get("values", {}).items())
    else:
        ok = not got and bool((message.get("content") or "").strip())
    if "opening" in want:
        ok = ok and " ".join(thinking.split()[:3]) == want["opening"]
    return True, ok, summary


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model", type=Path)
    ap.add_argument("--k3d", default=str(Path(__file__).resolve().parents[2] / "target/debug/k3d"))
    ap.add_argument("--scenes", type=int, default=60)
    ap.add_argument("--simple", action="store_true",
                    help="held-out scenes of SimpleScenes (what --data simple trains on)")
    ap.add_argument("--agents", type=Path)
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()
    cases = scene_cases(a.scenes, a.simple) + (agent_cases(a.agents) if a.agents else [])
    daemon = Daemon(a.k3d, a.model)
    results, tally = [], {}
    try:
        for name, body, want in cases:
            t = time.time()
            answer = daemon.chat(body)
            formed, ok, summary = judge(answer, want)
            usage = answer.get("usage", {})
            results.append({"case": name, "want": want, "well_formed": formed, "as_expected": ok,
                            "prompt_tokens": usage.get("prompt_tokens"), "summary": summary})
            kind = name.split(": ", 1)[1] if name.startswith("scene") else name
            k = tally.setdefault(kind, [0, 0, 0])
            k[0] += 1
            k[1] += formed
            k[2] += ok
            print(f"{'ok ' if ok else 'WF ' if formed else 'BAD'} {name} "
                  f"[{usage.get('prompt_tokens')} ids, {time.time() - t:.0f} s] {summary}",
                  flush=True)
    finally:
        daemon.stop()
    total = [sum(v[i] for v in tally.values()) for i in range(3)]
    print("\nkind: cases, well-formed, as expected")
    for kind, (n, f, o) in sorted(tally.items()):
        print(f"  {kind}: {n}, {f}, {o}")
    print(f"  all: {total[0]}, {total[1]}, {total[2]}")
    if a.out:
        a.out.write_text(json.dumps({"results": results, "tally": tally}, indent=1) + "\n")


if __name__ == "__main__":
    main()
