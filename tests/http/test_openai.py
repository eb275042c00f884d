"""The OpenAI-compatible HTTP API of a real `k3d serve`, through the official `openai` package.

Started by `tests/e2e_http.rs`, which runs the daemon on the tiny model and passes, through the
environment, where it listens and what gRPC answered for the same requests (K3_REFERENCE).
"""

import json
import os
import re
import socket
import subprocess
import time

# openai >= 3 is built on httpx2 (httpx's successor; the same API): its transport takes `uds`.
import httpx2 as httpx
import openai
import pytest

SOCKET = os.environ["K3_HTTP_SOCKET"]
URL = os.environ["K3_HTTP_URL"]
KEY = os.environ["K3_HTTP_KEY"]
MODEL = os.environ["K3_MODEL"]
BODY_LIMIT = int(os.environ["K3_BODY_LIMIT"])
with open(os.environ["K3_REFERENCE"]) as f:
    REF = json.load(f)

THINKING_OFF = {"thinking": {"type": "disabled"}}


def unix_client(**kw):
    # The Unix socket needs no key: the caller is known by uid. The SDK insists on some key.
    http = httpx.Client(transport=httpx.HTTPTransport(uds=SOCKET))
    return openai.OpenAI(base_url="http://k3d/v1", api_key="unused", http_client=http, max_retries=0, **kw)


def tcp_client(key=KEY):
    return openai.OpenAI(base_url=URL + "/v1", api_key=key, max_retries=0)


def raw():
    return httpx.Client(transport=httpx.HTTPTransport(uds=SOCKET), base_url="http://k3d", timeout=30)


def active_requests():
    text = raw().get("/metrics").text
    m = re.search(r"^k3d_active_requests (\d+)$", text, re.M)
    assert m, text
    return int(m.group(1))


def chat(client, messages, **kw):
    kw.setdefault("temperature", 0)
    return client.chat.completions.create(model=MODEL, messages=messages, **kw)


def test_models_over_the_socket_and_over_tcp_with_a_key():
    for client in (unix_client(), tcp_client()):
        models = client.models.list()
        assert [m.id for m in models.data] == [MODEL]
        assert client.models.retrieve(MODEL).id == MODEL
        # The limits clients size requests by: the model's context under OpenRouter's and
        # vLLM's names, and the cap a larger max_tokens is clamped to (the daemon's default).
        for m in (models.data[0], client.models.retrieve(MODEL)):
            extra = m.model_extra
            assert extra["context_length"] == extra["max_model_len"] == 1 << 20, extra
            assert extra["max_tokens_cap"] == 4096, extra


def test_a_wrong_or_missing_key_is_401_on_tcp():
    with pytest.raises(openai.AuthenticationError) as e:
        tcp_client("wrong-key").models.list()
    assert e.value.body["type"] == "authentication_error"
    r = httpx.get(URL + "/v1/models")
    assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
    # Supervisors probe /health without a key.
    assert httpx.get(URL + "/health").json()["status"] == "ready"


def test_chat_equals_grpc_for_the_same_conversation():
    ref = REF["chat_off"]
    r = chat(unix_client(), ref["messages"], max_tokens=ref["max_tokens"], extra_body=THINKING_OFF)
    assert r.object == "chat.completion" and r.id.startswith("chatcmpl-")
    choice = r.choices[0]
    assert choice.message.role == "assistant"
    assert choice.message.content == ref["response"]
    assert r.usage.prompt_tokens == ref["prompt_tokens"]
    assert r.usage.completion_tokens == ref["generated_tokens"]
    assert r.usage.total_tokens == ref["prompt_tokens"] + ref["generated_tokens"]
    assert choice.finish_reason == ("length" if ref["stop_reason"] == "max_tokens" else "stop")


def test_reasoning_arrives_as_reasoning_content():
    ref = REF["chat_on"]
    r = chat(unix_client(), ref["messages"], max_tokens=ref["max_tokens"], reasoning_effort="high")
    msg = r.choices[0].message
    assert msg.reasoning_content == ref["reasoning"]
    assert (msg.content or "") == ref["response"]
    assert r.usage.completion_tokens_details.reasoning_tokens == ref["reasoning_tokens"]
    assert r.usage.prompt_tokens == ref["prompt_tokens"]


def test_streamed_equals_whole_for_greedy_over_tcp():
    client = tcp_client()
    for extra in (THINKING_OFF, {}):
        msgs = [{"role": "user", "content": "Write a haiku about disks."}]
        whole = chat(client, msgs, max_tokens=16, extra_body=extra)
        chunks = list(chat(client, msgs, max_tokens=16, extra_body=extra, stream=True,
                           stream_options={"include_usage": True}))
        assert len({c.id for c in chunks}) == 1 and len({c.created for c in chunks}) == 1
        assert chunks[0].choices[0].delta.role == "assistant"
        assert all(c.choices[0].delta.role is None for c in chunks[1:-1])
        content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        reasoning = "".join(getattr(c.choices[0].delta, "reasoning_content", None) or ""
                            for c in chunks if c.choices)
        assert content == (whole.choices[0].message.content or "")
        assert reasoning == (getattr(whole.choices[0].message, "reasoning_content", None) or "")
        finishing = [c for c in chunks if c.choices and c.choices[0].finish_reason]
        assert len(finishing) == 1 and finishing[0].choices[0].finish_reason == whole.choices[0].finish_reason
        assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens


def test_content_as_a_list_of_text_parts_equals_the_string():
    text = "Tell me about the sea."
    parts = [{"type": "text", "text": "Tell me "}, {"type": "text", "text": "about the sea."}]
    client = unix_client()
    a = chat(client, [{"role": "user", "content": text}], max_tokens=6, extra_body=THINKING_OFF)
    b = chat(client, [{"role": "user", "content": parts}], max_tokens=6, extra_body=THINKING_OFF)
    assert a.choices[0].message.content == b.choices[0].message.content
    assert a.usage.prompt_tokens == b.usage.prompt_tokens
    with pytest.raises(openai.BadRequestError) as e:
        chat(client, [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}],
             max_tokens=2)
    assert e.value.body["param"] == "messages[0].content[0].type"


def plain_stop(full):
    """A stop string of ordinary text from the middle of `full` (the random tiny model also
    emits reserved tokens, whose `<|...|>` text is not output text a stop string can match),
    and `full` cut just before its first occurrence."""
    specials = [m.span() for m in re.finditer(r"<\|[^|]*\|>", full)]
    plain = lambda i: all(not (a <= i < b) for a, b in specials) and full[i] != "\ufffd"
    starts = [i for i in range(len(full) - 2)
              if all(plain(j) for j in range(i, i + 3)) and full.index(full[i:i + 3]) == i]
    assert starts, f"no plain text in the reference reply: {full!r}"
    at = starts[len(starts) // 2]
    return full[at:at + 3], full[:at]


def test_a_stop_string_ends_the_reply_and_is_left_out():
    ref = REF["chat_off"]
    stop, cut = plain_stop(ref["response"])
    client = unix_client()
    r = chat(client, ref["messages"], max_tokens=ref["max_tokens"], extra_body=THINKING_OFF, stop=[stop])
    assert r.choices[0].message.content == cut
    assert r.choices[0].finish_reason == "stop"
    s = chat(client, ref["messages"], max_tokens=ref["max_tokens"], extra_body=THINKING_OFF, stop=stop,
             stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in s if c.choices) == cut


def test_a_stop_string_is_cut_out_of_the_reasoning_too():
    """Issue 34.3: the stop string ends the reply inside the thinking and is left out of it
    (it once stayed in `reasoning_content`)."""
    ref = REF["chat_on"]
    stop, cut = plain_stop(ref["reasoning"])
    for stream in (False, True):
        r = chat(unix_client(), ref["messages"], max_tokens=ref["max_tokens"],
                 reasoning_effort="high", stop=[stop], stream=stream)
        if stream:
            chunks = [c for c in r if c.choices]
            reasoning = "".join(getattr(c.choices[0].delta, "reasoning_content", None) or ""
                                for c in chunks)
            content = "".join(c.choices[0].delta.content or "" for c in chunks)
            finish = [c.choices[0].finish_reason for c in chunks if c.choices[0].finish_reason]
        else:
            reasoning, content = r.choices[0].message.reasoning_content, r.choices[0].message.content
            finish = [r.choices[0].finish_reason]
        assert (reasoning, content or "", finish) == (cut, "", ["stop"]), stream


def test_a_conversation_ending_with_an_assistant_message_is_answered_or_continued():
    """Issue 34.3: opencode resends a conversation whose last message is the assistant's: it is
    answered with a new turn (OpenAI's and vLLM's reading); `partial: true` on it (Kimi's Partial
    Mode) continues it instead, the reply leaving the given text out. An assistant's `name`
    (OpenAI's types allow it) is accepted and not rendered."""
    client = unix_client()
    ask = [{"role": "user", "content": "Name three rivers."}]
    answered = chat(client, ask + [{"role": "assistant", "content": "The Nile"}], max_tokens=8,
                    extra_body=THINKING_OFF)
    assert answered.choices[0].finish_reason in ("stop", "length")
    named = chat(client, ask + [{"role": "assistant", "content": "The Nile", "name": "bot"}],
                 max_tokens=8, extra_body=THINKING_OFF)
    assert named.choices[0].message.content == answered.choices[0].message.content
    assert named.usage.prompt_tokens == answered.usage.prompt_tokens
    continued = chat(client, ask + [{"role": "assistant", "content": "The Nile", "partial": True}],
                     max_tokens=8, extra_body=THINKING_OFF)
    # Continued: no new assistant message opened, so a shorter prompt than the answered one.
    assert continued.usage.prompt_tokens < answered.usage.prompt_tokens
    assert continued.choices[0].finish_reason in ("stop", "length")
    with pytest.raises(openai.BadRequestError) as e:
        chat(client, [{"role": "user", "content": "hi", "partial": True}], max_tokens=2)
    assert "partial" in e.value.body["message"]


def test_completions_with_token_ids_equal_grpc():
    ref = REF["generate"]
    client = unix_client()
    r = client.completions.create(model=MODEL, prompt=ref["prompt_ids"], max_tokens=ref["max_tokens"], temperature=0)
    assert r.object == "text_completion"
    assert r.choices[0].text == ref["text"]
    assert r.usage.completion_tokens == len(ref["ids"])
    assert r.usage.prompt_tokens == len(ref["prompt_ids"])
    assert r.choices[0].finish_reason == "length"
    streamed = "".join(c.choices[0].text for c in client.completions.create(
        model=MODEL, prompt=ref["prompt_ids"], max_tokens=ref["max_tokens"], temperature=0, stream=True) if c.choices)
    assert streamed == ref["text"]
    t = client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=4, temperature=0)
    assert t.usage.completion_tokens == 4


def test_logit_bias_and_penalties_are_honoured_exactly_and_range_checked():
    client = unix_client()
    ids = REF["generate"]["prompt_ids"]

    def complete(max_tokens, **kw):
        return client.completions.create(model=MODEL, prompt=ids, max_tokens=max_tokens, temperature=0, **kw)

    plain = complete(6)
    # +100 on one id: greedy takes it every time (OpenAI: "should result in exclusive selection").
    one = complete(1, logit_bias={"40": 100})
    six = complete(6, logit_bias={"40": 100})
    assert six.choices[0].text == one.choices[0].text * 6 != plain.choices[0].text
    # -100 on the first id greedy chose bans it; the transform is deterministic, streamed or not.
    first = complete(1).choices[0].text
    banned = complete(6, logit_bias={str(i): -100 for i in range(0, 300)})
    assert banned.choices[0].text != plain.choices[0].text and not banned.choices[0].text.startswith(first)
    penalised = complete(6, frequency_penalty=2, presence_penalty=2)
    assert penalised.choices[0].text == complete(6, frequency_penalty=2, presence_penalty=2).choices[0].text
    streamed = "".join(c.choices[0].text for c in client.completions.create(
        model=MODEL, prompt=ids, max_tokens=6, temperature=0, stream=True,
        frequency_penalty=2, presence_penalty=2) if c.choices)
    assert streamed == penalised.choices[0].text
    # Chat takes them too.
    msgs = [{"role": "user", "content": "hi"}]
    biased = chat(client, msgs, max_tokens=3, logit_bias={"40": 100}, extra_body=THINKING_OFF)
    assert biased.usage.completion_tokens == 3
    # OpenAI's ranges, each refused naming its field.
    for kw, param in [
        (dict(logit_bias={"40": 100.5}), "logit_bias"),
        (dict(logit_bias={"forty": 1}), "logit_bias"),
        (dict(logit_bias={str(i): 1 for i in range(301)}), "logit_bias"),
        (dict(frequency_penalty=2.5), "frequency_penalty"),
        (dict(presence_penalty=-3), "presence_penalty"),
    ]:
        with pytest.raises(openai.BadRequestError) as e:
            chat(client, msgs, **kw)
        assert e.value.body["param"] == param, (kw, e.value.body)
    with pytest.raises(openai.BadRequestError) as e:
        complete(1, logit_bias={"99999999": 1})
    assert "outside the vocabulary" in e.value.body["message"]


def test_invalid_requests_are_400_naming_the_field():
    client = unix_client()
    msgs = [{"role": "user", "content": "hi"}]
    cases = [
        (dict(n=2), "n"),
        (dict(temperature=7), "temperature"),
        (dict(max_tokens=0), "max_tokens"),
        (dict(logprobs=True), "logprobs"),
        (dict(reasoning_effort="huge"), "reasoning_effort"),
        (dict(extra_body={"thinking": {"type": "sometimes"}}), "thinking"),
    ]
    for kw, param in cases:
        with pytest.raises(openai.BadRequestError) as e:
            chat(client, msgs, **kw)
        assert e.value.body["param"] == param, (kw, e.value.body)
        assert e.value.body["type"] == "invalid_request_error"
    with pytest.raises(openai.BadRequestError) as e:
        chat(client, [{"role": "robot", "content": "hi"}])
    assert e.value.body["param"] == "messages[0].role"
    with pytest.raises(openai.NotFoundError) as e:
        client.chat.completions.create(model="gpt-4o", messages=msgs)
    assert e.value.body["param"] == "model"
    r = raw().post("/v1/nothing", json={})
    assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error"
    # The root answers clients' connection probes (Claude Code's `HEAD /`), never a 404.
    assert raw().head("/").status_code == 200 and "/v1/models" in raw().get("/").text
    r = raw().post("/v1/chat/completions", content=b"{not json")
    assert r.status_code == 400 and "error" in r.json()
    r = raw().post("/v1/chat/completions", content=b" " * (BODY_LIMIT + 1))
    assert r.status_code == 413 and "http_body_limit" in r.json()["error"]["message"]
    # Unknown fields that clients send are ignored.
    ok = chat(client, msgs, max_tokens=2, user="me", metadata={"a": "b"}, store=False, logprobs=False)
    assert ok.usage.completion_tokens == 2


def test_a_full_queue_is_429_with_retry_after_and_a_disconnect_frees_the_slot():
    # The daemon runs with --max-active 1 --max-queue 0: one long generation fills it (a text
    # completion: a chat reply may end its turn early).
    body = {"model": MODEL, "prompt": REF["generate"]["prompt_ids"], "max_tokens": 4000,
            "temperature": 0, "stream": True}
    with raw() as c, c.stream("POST", "/v1/completions", json=body) as long:
        assert long.status_code == 200
        lines = long.iter_lines()
        seen = 0
        while seen < 3:
            if next(lines).startswith("data: "):
                seen += 1
        with pytest.raises(openai.RateLimitError) as e:
            chat(unix_client(), [{"role": "user", "content": "hi"}], max_tokens=2)
        assert int(e.value.response.headers["retry-after"]) >= 1
        assert e.value.body["type"] == "rate_limit_error"
        assert active_requests() == 1
    # The stream is closed: the slot is free within a second.
    t = time.monotonic()
    while active_requests() != 0:
        assert time.monotonic() - t < 1.0, "the generation still runs after the client left"
        time.sleep(0.005)
    print(f"disconnect freed the slot in {time.monotonic() - t:.3f}s")
    assert chat(unix_client(), [{"role": "user", "content": "hi"}], max_tokens=2).usage.completion_tokens == 2


def test_curl_over_the_socket_sees_well_formed_sse():
    body = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "hello"}],
                       "max_tokens": 5, "temperature": 0, "stream": True})
    out = subprocess.run(
        ["curl", "-sS", "-N", "--unix-socket", SOCKET, "http://k3d/v1/chat/completions",
         "-H", "Content-Type: application/json", "-d", body, "-D", "-"],
        check=True, capture_output=True, timeout=60).stdout.decode()
    head, _, events = out.partition("\r\n\r\n")
    assert head.startswith("HTTP/1.1 200") and "content-type: text/event-stream" in head.lower()
    assert events.endswith("data: [DONE]\n\n"), events[-200:]
    blocks = events.split("\n\n")[:-1]
    for block in blocks[:-1]:
        assert block.startswith("data: ") and "\n" not in block, block
        assert json.loads(block[len("data: "):])["object"] == "chat.completion.chunk"


def test_metrics_are_prometheus_text():
    text = raw().get("/metrics").text
    for name in ["k3d_http_requests_total{", "k3d_tokens_total{direction=\"out\"}",
                 "k3d_time_to_first_token_seconds_bucket", "k3d_decode_seconds_per_token_count",
                 "k3d_queue_depth ", "k3d_weight_bytes_read_total{class=\"trunk\"}", "k3d_weight_bytes_read_total{class=\"experts\"}", "k3d_expert_cache_hits_total ",
                 "k3d_rss_bytes ", "k3d_batch_size_max "]:
        assert name in text, name
    assert re.search(r'k3d_http_requests_total\{endpoint="/v1/chat/completions",status="200"\} [1-9]', text)
    assert text.rstrip().endswith("# EOF")


WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather of a city", "parameters": REF["tools"]["parameters"]}}
TOOL_TURNS = [
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_0", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
    {"role": "tool", "tool_call_id": "call_0", "content": "sunny, 21 C"},
]


def test_tools_calls_and_results_render_as_grpc_renders_them():
    ref = REF["tools"]
    for client in (unix_client(), tcp_client()):
        r = chat(client, TOOL_TURNS, tools=[WEATHER], tool_choice="auto",
                 max_tokens=ref["max_tokens"], extra_body=THINKING_OFF)
        # Exactly the renderer's prompt: the same count gRPC's Chat reports for the same turns.
        assert r.usage.prompt_tokens == ref["prompt_tokens"], r.usage
        assert (r.choices[0].message.content or "") == ref["response"]
        assert len(r.choices[0].message.tool_calls or []) == ref["tool_calls"]
        streamed = chat(client, TOOL_TURNS, tools=[WEATHER], max_tokens=ref["max_tokens"],
                        extra_body=THINKING_OFF, stream=True)
        assert "".join(c.choices[0].delta.content or "" for c in streamed if c.choices) == ref["response"]
    # Without the tools the prompt is shorter: the declaration is really rendered.
    bare = chat(unix_client(), [TOOL_TURNS[0]], max_tokens=1, extra_body=THINKING_OFF)
    assert bare.usage.prompt_tokens < ref["prompt_tokens"]


def test_tool_requests_k3_cannot_honour_are_400_naming_the_field():
    client = unix_client()
    msgs = [{"role": "user", "content": "hi"}]
    cases = [
        (dict(tools=[WEATHER], tool_choice={"type": "function", "function": {"name": "nope"}}), "tool_choice"),
        (dict(tool_choice="required"), "tool_choice"),
        (dict(tools=[{"type": "retrieval"}]), "tools[0].type"),
        (dict(response_format={"type": "json_schema"}), "response_format.json_schema.schema"),
        (dict(response_format={"type": "yaml"}), "response_format.type"),
    ]
    for kw, param in cases:
        with pytest.raises(openai.BadRequestError) as e:
            chat(client, msgs, max_tokens=2, **kw)
        assert e.value.body["param"] == param, (kw, e.value.body)
    # A tool result answering no call is the renderer's refusal, reported as a 400.
    with pytest.raises(openai.BadRequestError) as e:
        chat(client, [msgs[0], {"role": "tool", "tool_call_id": "call_9", "content": "x"}], max_tokens=2)
    assert e.value.body["param"] == "messages", e.value.body
    # json_object and json_schema are rendered as the template's notes: accepted.
    for fmt in ({"type": "json_object"},
                {"type": "json_schema", "json_schema": {"name": "w", "schema": REF["tools"]["parameters"]}}):
        assert chat(client, msgs, max_tokens=2, response_format=fmt).usage.completion_tokens == 2


def test_prefix_reuse_continues_the_conversation_with_identical_output():
    client = unix_client()
    follow_ups = ["And another?", "And a third?"]
    fresh_off = {**THINKING_OFF, "prefix_reuse": False}
    # What each later turn adds to the history: the user's message and the generation prompt,
    # which render on their own exactly as after the history (segments are encoded one by one).
    added = [chat(client, [{"role": "user", "content": f}], max_tokens=1, extra_body=fresh_off)
             .usage.prompt_tokens for f in follow_ups]
    # The conversation computed afresh every turn (an opted-out request keeps nothing).
    turns = [{"role": "user", "content": "Name a river."}]
    fresh = []
    for follow_up in follow_ups + [None]:
        reply = chat(client, turns, max_tokens=6, extra_body=fresh_off)
        assert reply.usage.prompt_tokens_details.cached_tokens == 0
        fresh.append(reply)
        if follow_up:
            turns += [{"role": "assistant", "content": reply.choices[0].message.content},
                      {"role": "user", "content": follow_up}]
    # The same conversation with reuse, each turn sent as soon as the last reply is in.
    turns = turns[:1]
    for n, want in enumerate(fresh):
        reused = chat(client, turns, max_tokens=6, extra_body=THINKING_OFF)
        # Bit-identical to computing the whole prompt afresh (greedy).
        assert reused.choices[0].message.content == want.choices[0].message.content
        assert reused.usage.prompt_tokens == want.usage.prompt_tokens
        cached = reused.usage.prompt_tokens_details.cached_tokens
        if n == 0:
            assert cached == 0, reused.usage
        else:
            # The daemon warmed the history after the last reply (re-rendered from its
            # message, whatever ids were generated): only the new message is prefilled.
            assert reused.usage.prompt_tokens - cached == added[n - 1], (reused.usage, added)
        if n < len(follow_ups):
            turns += [{"role": "assistant", "content": reused.choices[0].message.content},
                      {"role": "user", "content": follow_ups[n]}]


# ---------------------------------------------------------------------------------------------
# The Responses API (issue 34.2): what Codex speaks, through the SDK's `responses.create`.

def responses(client, **kw):
    kw.setdefault("temperature", 0)
    return client.responses.create(model=MODEL, **kw)


def output_types(response):
    return [item.type for item in response.output]


def test_responses_equal_the_chat_route_whole_and_streamed():
    ref = REF["chat_off"]
    system, user = ref["messages"][0]["content"], ref["messages"][1]["content"]
    want = chat(unix_client(), ref["messages"], max_tokens=ref["max_tokens"], extra_body=THINKING_OFF)
    for client in (unix_client(), tcp_client()):
        r = responses(client, instructions=system, input=user, max_output_tokens=ref["max_tokens"],
                      reasoning={"effort": "none"})
        assert r.object == "response" and re.fullmatch(r"resp_\d+", r.id), r.id
        assert r.output_text == (want.choices[0].message.content or "")
        assert r.usage.input_tokens == want.usage.prompt_tokens
        assert r.usage.output_tokens == want.usage.completion_tokens
        incomplete = want.choices[0].finish_reason == "length"
        assert r.status == ("incomplete" if incomplete else "completed")
        assert (r.incomplete_details and r.incomplete_details.reason) == \
            ("max_output_tokens" if incomplete else None)
        assert output_types(r) == ["message"]
        # Streamed: the events in order, numbered, the deltas concatenating to the whole text,
        # the last event carrying the whole response.
        events = list(responses(client, instructions=system, input=user, stream=True,
                                max_output_tokens=ref["max_tokens"], reasoning={"effort": "none"}))
        kinds = [e.type for e in events]
        assert kinds[:2] == ["response.created", "response.in_progress"], kinds
        assert kinds[-1] == ("response.incomplete" if incomplete else "response.completed"), kinds
        assert [e.sequence_number for e in events] == list(range(len(events)))
        assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == r.output_text
        last = events[-1].response
        assert last.output_text == r.output_text and last.usage.input_tokens == r.usage.input_tokens
        assert [i.model_dump(exclude={"id"}) for i in last.output] == \
            [i.model_dump(exclude={"id"}) for i in r.output]
    # The SDK's own accumulation of a stream (its helper wants `response.completed`: a reply that
    # ends its turn; the random tiny model ends some within a few tokens).
    client = unix_client()
    asks = (f"Name {n} rivers." for n in range(40))
    done = next((a for a in asks if responses(client, input=a, max_output_tokens=48,
                                              reasoning={"effort": "none"}).status == "completed"), None)
    assert done, "no prompt whose reply ends within 48 tokens"
    whole = responses(client, input=done, max_output_tokens=48, reasoning={"effort": "none"})
    with client.responses.stream(model=MODEL, input=done, temperature=0, max_output_tokens=48,
                                 reasoning={"effort": "none"}) as s:
        final = s.get_final_response()
    assert final.output_text == whole.output_text and final.status == "completed"


def test_responses_reasoning_is_a_reasoning_item_and_items_render_as_chat_messages():
    ref = REF["chat_on"]
    want = chat(unix_client(), ref["messages"], max_tokens=ref["max_tokens"], reasoning_effort="high")
    items = [{"role": m["role"] if m["role"] != "system" else "developer", "content": m["content"]}
             for m in ref["messages"]]
    r = responses(unix_client(), input=items, max_output_tokens=ref["max_tokens"],
                  reasoning={"effort": "high", "summary": "auto"})
    assert r.output[0].type == "reasoning"
    assert "".join(c.text for c in r.output[0].content) == ref["reasoning"]
    assert r.output[0].summary == []
    assert r.usage.output_tokens_details.reasoning_tokens == ref["reasoning_tokens"]
    assert r.usage.input_tokens == want.usage.prompt_tokens == ref["prompt_tokens"]
    streamed = list(responses(unix_client(), input=items, max_output_tokens=ref["max_tokens"],
                              reasoning={"effort": "high"}, stream=True))
    assert "".join(e.delta for e in streamed if e.type == "response.reasoning_text.delta") == ref["reasoning"]
    # A tool round trip as items (Codex's history: function_call, function_call_output) renders
    # exactly as the chat route's assistant tool_calls and tool message — and as gRPC's.
    tools_ref = REF["tools"]
    weather = {"type": "function", "name": "get_weather", "description": "Current weather of a city",
               "parameters": tools_ref["parameters"]}
    history = [
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Weather in Paris?"}]},
        {"type": "function_call", "call_id": "call_0", "name": "get_weather", "arguments": "{\"city\": \"Paris\"}"},
        {"type": "function_call_output", "call_id": "call_0", "output": "sunny, 21 C"},
    ]
    r = responses(unix_client(), input=history, tools=[weather, {"type": "web_search"}],
                  max_output_tokens=tools_ref["max_tokens"], reasoning={"effort": "none"})
    assert r.usage.input_tokens == tools_ref["prompt_tokens"], r.usage
    assert r.output_text == tools_ref["response"]
    assert r.tools[0].name == "get_weather" and r.parallel_tool_calls is True


def test_responses_k3_cannot_honour_are_400_naming_the_field():
    client = unix_client()
    cases = [
        (dict(previous_response_id="resp_1"), "previous_response_id"),
        (dict(background=True), "background"),
        (dict(max_output_tokens=0), "max_output_tokens"),
        (dict(reasoning={"effort": "huge"}), "reasoning.effort"),
        (dict(tools=[{"type": "custom", "name": "patch"}]), "tools[0].type"),
        (dict(text={"format": {"type": "json_schema", "name": "x"}}), "text.format.schema"),
        (dict(input=[{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]),
         "input[0].content[0].type"),
        (dict(input=[{"type": "item_reference", "id": "msg_1"}]), "input[0].type"),
    ]
    for kw, param in cases:
        kw.setdefault("input", "hi")
        with pytest.raises(openai.BadRequestError) as e:
            responses(client, **kw)
        assert e.value.body["param"] == param, (kw, e.value.body)
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model="gpt-5", input="hi")
