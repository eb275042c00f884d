"""Anthropic's Messages API of a real `k3d serve`, through the official `anthropic` package.

Started by `tests/e2e_http.rs` on the tiny model; the reference is the same daemon's OpenAI
route (tests/http/test_openai.py checks that one against gRPC): the same conversation must
render the same prompt and get the same greedy reply (issue 15 point 9).
"""

import json
import os
import re
import subprocess

# anthropic 2 is built on httpx2 (httpx's successor; the same API): its transport takes `uds`.
import anthropic
import httpx2 as httpx
import openai
import pytest

SOCKET = os.environ["K3_HTTP_SOCKET"]
URL = os.environ["K3_HTTP_URL"]
KEY = os.environ["K3_HTTP_KEY"]
MODEL = os.environ["K3_MODEL"]

OFF = {"type": "disabled"}
ON = {"type": "enabled", "budget_tokens": 1024}
SYSTEM = "You are terse."
ASK = [{"role": "user", "content": "Name three rivers."}]


def unix_client():
    # The Unix socket needs no key: the caller is known by uid. The SDK insists on some key.
    http = httpx.Client(transport=httpx.HTTPTransport(uds=SOCKET))
    return anthropic.Anthropic(base_url="http://k3d", api_key="unused", http_client=http, max_retries=0)


def tcp_client(key=KEY):
    # The SDK sends the key as `x-api-key`.
    return anthropic.Anthropic(base_url=URL, api_key=key, max_retries=0)


def openai_client():
    http = httpx.Client(transport=httpx.HTTPTransport(uds=SOCKET))
    return openai.OpenAI(base_url="http://k3d/v1", api_key="unused", http_client=http, max_retries=0)


def raw():
    return httpx.Client(transport=httpx.HTTPTransport(uds=SOCKET), base_url="http://k3d", timeout=30)


def create(client, messages, max_tokens, thinking=OFF, **kw):
    # Greedy: k3d's default temperature is 0 (the anthropic SDK 2 has no sampling arguments;
    # extra_body carries them).
    return client.messages.create(model=MODEL, messages=messages, max_tokens=max_tokens,
                                  thinking=thinking, **kw)


def openai_chat(messages, max_tokens, thinking="disabled", **kw):
    return openai_client().chat.completions.create(
        model=MODEL, messages=messages, max_tokens=max_tokens, temperature=0,
        extra_body={"thinking": {"type": thinking}}, **kw)


def text(message):
    return "".join(b.text for b in message.content if b.type == "text")


def thinking(message):
    return "".join(b.thinking for b in message.content if b.type == "thinking")


def prompt_tokens(message):
    """What the prompt rendered to: Anthropic counts the tokens read from a kept state apart."""
    return message.usage.input_tokens + (message.usage.cache_read_input_tokens or 0)


STOP = {"length": "max_tokens", "stop": "end_turn", "tool_calls": "tool_use"}


def test_text_equals_the_openai_route_over_the_socket_and_over_tcp():
    want = openai_chat([{"role": "system", "content": SYSTEM}] + ASK, 24)
    for client in (unix_client(), tcp_client()):
        m = create(client, ASK, 24, system=SYSTEM)
        assert m.type == "message" and m.role == "assistant" and m.model == MODEL
        assert re.fullmatch(r"msg_\d+", m.id), m.id
        assert text(m) == (want.choices[0].message.content or "")
        assert [b.type for b in m.content] == (["text"] if text(m) else [])
        assert prompt_tokens(m) == want.usage.prompt_tokens
        assert m.usage.output_tokens == want.usage.completion_tokens
        assert m.stop_reason == STOP[want.choices[0].finish_reason] and m.stop_sequence is None
    # A bearer token (Claude Code's ANTHROPIC_AUTH_TOKEN) is the same key.
    bearer = anthropic.Anthropic(base_url=URL, api_key=None, auth_token=KEY, max_retries=0)
    assert text(create(bearer, ASK, 24, system=SYSTEM)) == (want.choices[0].message.content or "")


def test_thinking_comes_back_as_a_thinking_block_and_effort_maps_as_on_the_openai_route():
    want = openai_chat(ASK, 24, thinking="enabled")
    m = create(unix_client(), ASK, 24, thinking=ON)
    assert thinking(m) == want.choices[0].message.reasoning_content
    assert text(m) == (want.choices[0].message.content or "")
    assert m.content[0].type == "thinking" and m.content[0].signature == ""
    assert m.usage.output_tokens_details.thinking_tokens == \
        want.usage.completion_tokens_details.reasoning_tokens
    assert prompt_tokens(m) == want.usage.prompt_tokens
    # output_config.effort is K3's effort note when thinking is on (Claude Code's adaptive
    # thinking with an effort); it is an independent control: it never turns thinking on.
    low = openai_chat(ASK, 1, thinking="enabled", reasoning_effort="low")
    for kw in ({"thinking": ON}, {"thinking": {"type": "adaptive"}}):
        m = create(unix_client(), ASK, 1, output_config={"effort": "low"}, **kw)
        assert prompt_tokens(m) == low.usage.prompt_tokens, kw
    # Thinking is off unless asked for, as on Anthropic's API, whatever the effort
    # (CLAUDE_CODE_DISABLE_THINKING=1 still sends output_config.effort).
    off = openai_chat(ASK, 1).usage.prompt_tokens
    for kw in ({"thinking": anthropic.omit}, {"thinking": OFF}):
        for effort in (anthropic.omit, {"effort": "high"}):
            m = create(unix_client(), ASK, 1, output_config=effort, **kw)
            assert prompt_tokens(m) == off and thinking(m) == "", (kw, effort)
    # display "omitted" keeps the block, without its text.
    m = create(unix_client(), ASK, 24, thinking={"type": "adaptive", "display": "omitted"})
    assert [b.thinking for b in m.content if b.type == "thinking"] in ([], [""]), m.content


def test_streamed_equals_whole_for_greedy_over_tcp():
    client = tcp_client()
    for mode in (OFF, ON):
        whole = create(client, ASK, 16, thinking=mode, system=SYSTEM)
        events = list(create(client, ASK, 16, thinking=mode, system=SYSTEM, stream=True))
        kinds = [e.type for e in events]
        assert kinds[0] == "message_start" and kinds[-2:] == ["message_delta", "message_stop"], kinds
        assert re.fullmatch(r"msg_\d+", events[0].message.id) and events[0].message.id != whole.id
        assert events[0].message.content == [] and events[0].message.stop_reason is None
        deltas = [e.delta for e in events if e.type == "content_block_delta"]
        assert "".join(d.text for d in deltas if d.type == "text_delta") == text(whole)
        assert "".join(d.thinking for d in deltas if d.type == "thinking_delta") == thinking(whole)
        assert events[-2].delta.stop_reason == whole.stop_reason
        assert events[-2].usage.output_tokens == whole.usage.output_tokens
        starts = [e.index for e in events if e.type == "content_block_start"]
        stops = [e.index for e in events if e.type == "content_block_stop"]
        assert starts == stops == list(range(len(whole.content)))
        # The SDK's own accumulation of the events is the whole message.
        with client.messages.stream(model=MODEL, messages=ASK, max_tokens=16, thinking=mode,
                                    system=SYSTEM) as s:
            final = s.get_final_message()
        assert [b.model_dump() for b in final.content] == [b.model_dump() for b in whole.content]
        assert final.stop_reason == whole.stop_reason
        assert prompt_tokens(final) == prompt_tokens(whole)


WEATHER = {"name": "get_weather", "description": "Current weather of a city",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string"}, "unit": {"type": "string"}},
                            "required": ["city"]}}


def tool_turns(arguments, result):
    """The same history for both routes: a call with `arguments` (JSON text) and its `result`."""
    anthropic_turns = [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": [
            {"type": "text", "text": "Checking."},
            {"type": "tool_use", "id": "toolu_01", "name": "get_weather", "input": json.loads(arguments)}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_01", "content": result},
            {"type": "text", "text": "And tomorrow?"}]},
    ]
    openai_turns = [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "Checking.", "tool_calls": [
            {"id": "call_0", "type": "function", "function": {"name": "get_weather", "arguments": arguments}}]},
        {"role": "tool", "tool_call_id": "call_0", "content": result},
        {"role": "user", "content": "And tomorrow?"},
    ]
    return anthropic_turns, openai_turns


OPENAI_WEATHER = {"type": "function", "function": {
    "name": WEATHER["name"], "description": WEATHER["description"], "parameters": WEATHER["input_schema"]}}


def test_tools_tool_use_and_tool_results_render_as_on_the_openai_route():
    client = unix_client()
    replies = {}
    # Two key orders of the same arguments: the template renders them in the caller's order,
    # which the route must keep (JSON objects as parsed by serde_json would be sorted).
    for arguments in ('{"unit": "C", "city": "Paris"}', '{"city": "Paris", "unit": "C"}'):
        ours, theirs = tool_turns(arguments, "sunny, 21 C")
        want = openai_chat(theirs, 16, tools=[OPENAI_WEATHER])
        m = create(client, ours, 16, tools=[WEATHER])
        assert prompt_tokens(m) == want.usage.prompt_tokens
        assert text(m) == (want.choices[0].message.content or ""), arguments
        assert len([b for b in m.content if b.type == "tool_use"]) == len(want.choices[0].message.tool_calls or [])
        assert client.messages.count_tokens(model=MODEL, messages=ours, tools=[WEATHER],
                                            thinking=OFF).input_tokens == want.usage.prompt_tokens
        replies[arguments] = text(m)
    assert len(set(replies.values())) == 2, f"the two orders got the same reply, so it cannot tell them apart: {replies}"
    # A result as text blocks, marked as an error, renders as the same text (the template's
    # tool message has no error mark).
    ours, _ = tool_turns('{"unit": "C", "city": "Paris"}', "sunny, 21 C")
    ours[2]["content"][0] = {"type": "tool_result", "tool_use_id": "toolu_01", "is_error": True,
                             "content": [{"type": "text", "text": "sunny, "}, {"type": "text", "text": "21 C"}]}
    m = create(client, ours, 16, tools=[WEATHER])
    assert text(m) == replies['{"unit": "C", "city": "Paris"}']
    # tool_choice any and none are the template's notes, as required and none on the OpenAI route.
    # A forced call needs room for its tags (issue 45.4: fewer is a 400 naming max_tokens).
    for ours_choice, theirs_choice, room in (({"type": "any"}, "required", 40), ({"type": "none"}, "none", 1)):
        want = openai_chat(ASK, room, tools=[OPENAI_WEATHER], tool_choice=theirs_choice)
        m = create(client, ASK, room, tools=[WEATHER], tool_choice=ours_choice)
        assert prompt_tokens(m) == want.usage.prompt_tokens, ours_choice
    # Without the tools the prompt is shorter: the declaration is really rendered.
    assert prompt_tokens(create(client, ASK, 1)) < prompt_tokens(create(client, ASK, 1, tools=[WEATHER]))


def test_count_tokens_is_the_rendered_prompt_and_system_blocks_equal_the_string():
    client = unix_client()
    m = create(client, ASK, 2, system=SYSTEM)
    counted = client.messages.count_tokens(model=MODEL, messages=ASK, system=SYSTEM, thinking=OFF)
    blocks = client.messages.count_tokens(model=MODEL, messages=ASK, thinking=OFF, system=[
        {"type": "text", "text": "You are "}, {"type": "text", "text": "terse.", "cache_control": {"type": "ephemeral"}}])
    assert counted.input_tokens == blocks.input_tokens == prompt_tokens(m)


def test_a_later_turn_reads_its_prefix_from_a_kept_state_with_identical_output():
    client = unix_client()
    fresh = {"prefix_reuse": False}
    first = [{"role": "user", "content": "Name a lake."}]
    reply = text(create(client, first, 6, extra_body=fresh))
    turns = first + [{"role": "assistant", "content": reply}, {"role": "user", "content": "Another?"}]
    alone = create(client, turns, 6, extra_body=fresh)
    assert (alone.usage.cache_read_input_tokens or 0) == 0
    # The first turn with reuse keeps the state before its prompt's last id (an identical
    # retry then feeds one id), a strict prefix of the next turn's: that turn reads it
    # (cache_read_input_tokens) and computes the rest.
    turn1 = create(client, first, 6)
    assert text(turn1) == reply
    again = create(client, turns, 6)
    # Bit-identical to the prompt computed afresh.
    assert text(again) == text(alone) and prompt_tokens(again) == prompt_tokens(alone)
    assert again.usage.cache_read_input_tokens >= prompt_tokens(turn1) - 1, again.usage
    assert again.usage.input_tokens == prompt_tokens(alone) - again.usage.cache_read_input_tokens


def test_a_stop_sequence_ends_the_reply_and_is_named():
    whole = text(create(unix_client(), ASK, 24, system=SYSTEM))
    plain = [i for i in range(len(whole) - 2) if re.fullmatch(r"[A-Za-z ]{3}", whole[i:i + 3])
             and whole.index(whole[i:i + 3]) == i]
    assert plain, f"no plain text in the reply: {whole!r}"
    at = plain[len(plain) // 2]
    m = create(unix_client(), ASK, 24, system=SYSTEM, stop_sequences=[whole[at:at + 3]])
    assert text(m) == whole[:at]
    assert m.stop_reason == "stop_sequence" and m.stop_sequence == whole[at:at + 3]


def test_invalid_requests_are_400_naming_the_field_in_anthropics_shape():
    client = unix_client()
    cases = [
        (dict(extra_body={"speed": "fast"}), "speed"),
        (dict(extra_body={"temperature": 1.5}), "temperature"),
        (dict(extra_body={"top_k": -1}), "top_k"),
        (dict(stop_sequences=[""]), "stop_sequences"),
        (dict(thinking={"type": "enabled"}), "thinking.budget_tokens"),
        (dict(tools=[WEATHER], tool_choice={"type": "tool", "name": "nope"}), "tool_choice"),
        (dict(tools=[WEATHER], tool_choice={"type": "auto", "disable_parallel_tool_use": True}),
         "tool_choice.disable_parallel_tool_use"),
        (dict(tools=[{"type": "web_search_20250305", "name": "web_search"}]), "tools[0].type"),
        (dict(output_config={"effort": "huge"}, thinking=ON), "output_config.effort"),
        (dict(extra_body={"context_management": {"edits": [{"type": "clear_tool_uses_20250919"}]}}),
         "context_management.edits[0].type"),
        (dict(extra_body={"context_management": {"edits": [
            {"type": "clear_thinking_20251015", "keep": {"type": "thinking_turns"}}]}}),
         "context_management.edits[0].keep.value"),
    ]
    for kw, field in cases:
        kw.setdefault("thinking", anthropic.omit)
        with pytest.raises(anthropic.BadRequestError) as e:
            create(client, ASK, 2, **kw)
        assert e.value.body["type"] == "error", e.value.body
        assert e.value.body["error"]["type"] == "invalid_request_error"
        assert e.value.body["error"]["message"].startswith(field + ":"), (kw, e.value.body)
    messages = [
        ([{"role": "user", "content": [{"type": "image", "source": {"type": "url", "url": "x"}}]}],
         "messages[0].content[0].type"),
        ([{"role": "robot", "content": "hi"}], "messages[0].role"),
        ([{"role": "system", "content": "hi", "clear_at": "sometimes"}] + ASK, "messages[0].clear_at"),
        ([{"role": "user", "content": "hi", "name": "me"}], "messages[0].name"),
        (ASK + [{"role": "assistant", "content": [
            {"type": "tool_use", "id": "t1", "name": "get_weather", "input": {}}]}], "messages[1]"),
    ]
    for msgs, field in messages:
        with pytest.raises(anthropic.BadRequestError) as e:
            create(client, msgs, 2)
        assert e.value.body["error"]["message"].startswith(field + ":"), (msgs, e.value.body)
    r = raw().post("/v1/messages", json={"model": MODEL, "messages": ASK})
    assert r.status_code == 400 and r.json()["error"]["message"].startswith("max_tokens:"), r.text


def test_a_wrong_key_is_401_and_an_unknown_model_404_in_anthropics_shape():
    with pytest.raises(anthropic.AuthenticationError) as e:
        create(tcp_client("wrong-key"), ASK, 2)
    assert e.value.body["error"]["type"] == "authentication_error"
    r = httpx.post(URL + "/v1/messages", json={"model": MODEL, "messages": ASK, "max_tokens": 2})
    assert r.status_code == 401 and r.json()["type"] == "error", r.text
    with pytest.raises(anthropic.NotFoundError) as e:
        unix_client().messages.create(model="no-such-model", messages=ASK, max_tokens=2)
    assert e.value.body["error"]["type"] == "not_found_error"
    assert "no-such-model" in e.value.body["error"]["message"]


def test_curl_sees_well_formed_sse_ending_in_message_stop():
    body = json.dumps({"model": MODEL, "messages": ASK, "max_tokens": 5, "stream": True,
                       "thinking": ON})
    out = subprocess.run(
        ["curl", "-sS", "-N", URL + "/v1/messages", "-H", "content-type: application/json",
         "-H", "x-api-key: " + KEY, "-H", "anthropic-version: 2023-06-01", "-d", body, "-D", "-"],
        check=True, capture_output=True, timeout=60).stdout.decode()
    head, _, events = out.partition("\r\n\r\n")
    assert head.startswith("HTTP/1.1 200") and "content-type: text/event-stream" in head.lower()
    assert events.endswith("\n\n"), events[-200:]
    names = []
    for block in events.split("\n\n")[:-1]:
        lines = block.split("\n")
        assert len(lines) == 2 and lines[0].startswith("event: ") and lines[1].startswith("data: "), block
        name = lines[0][len("event: "):]
        assert json.loads(lines[1][len("data: "):])["type"] == name, block
        names.append(name)
    assert names[:2] == ["message_start", "ping"] and names[-1] == "message_stop", names
    assert "content_block_start" in names


def test_metrics_count_the_messages_endpoint():
    create(unix_client(), ASK, 1)
    text_ = raw().get("/metrics").text
    assert re.search(r'k3d_http_requests_total\{endpoint="/v1/messages",status="200"\} [1-9]', text_), text_


def test_claude_codes_conversations_render_as_on_the_openai_route():
    """What Claude Code sends (issue 34.1): system messages inside `messages`, a final assistant
    turn to continue, context_management's clear_thinking edit — each renders the prompt the
    OpenAI route renders for the same conversation, and gets the same greedy reply."""
    client = unix_client()
    # A system message mid-conversation is rendered where it stands.
    mid = [ASK[0], {"role": "system", "content": "Answer in French."}]
    m = create(client, mid + [{"role": "user", "content": "Go."}], 12)
    want = openai_chat(mid + [{"role": "user", "content": "Go."}], 12)
    assert prompt_tokens(m) == want.usage.prompt_tokens and text(m) == (want.choices[0].message.content or "")
    # clear_at "next_user_message": shown only until a user turn follows.
    gone = [ASK[0], {"role": "system", "content": "x" * 50, "clear_at": "next_user_message"},
            {"role": "user", "content": "Go."}]
    assert prompt_tokens(create(client, gone, 1)) == \
        openai_chat([ASK[0], {"role": "user", "content": "Go."}], 1).usage.prompt_tokens
    # A final assistant turn is continued (Anthropic's prefill): the OpenAI route's
    # `partial` (Kimi's Partial Mode); the reply leaves the given text out.
    prefill = ASK + [{"role": "assistant", "content": "The Nile,"}]
    m = create(client, prefill, 12)
    want = openai_chat(ASK + [{"role": "assistant", "content": "The Nile,", "partial": True}], 12)
    assert prompt_tokens(m) == want.usage.prompt_tokens
    assert text(m) == (want.choices[0].message.content or "")
    # Without `partial` the OpenAI route answers with a new turn: a longer prompt.
    answered = openai_chat(ASK + [{"role": "assistant", "content": "The Nile,"}], 1)
    assert answered.usage.prompt_tokens > want.usage.prompt_tokens
    # clear_thinking_20251015: the reasoning of all but the `keep` latest assistant turns is not
    # rendered ("all" keeps every one; Claude Code sends that).
    history = [
        ASK[0],
        {"role": "assistant", "content": [{"type": "thinking", "thinking": "first idea", "signature": ""},
                                          {"type": "text", "text": "Nile."}]},
        {"role": "user", "content": "More?"},
        {"role": "assistant", "content": [{"type": "thinking", "thinking": "second idea", "signature": ""},
                                          {"type": "text", "text": "Amazon."}]},
        {"role": "user", "content": "More?"},
    ]
    oa = [ASK[0], {"role": "assistant", "content": "Nile.", "reasoning_content": "first idea"},
          {"role": "user", "content": "More?"},
          {"role": "assistant", "content": "Amazon.", "reasoning_content": "second idea"},
          {"role": "user", "content": "More?"}]
    for keep, cleared in (("all", []), ({"type": "thinking_turns", "value": 1}, [1]),
                          ({"type": "thinking_turns", "value": 0}, [1, 3])):
        edits = {"edits": [{"type": "clear_thinking_20251015", "keep": keep}]}
        m = create(client, history, 1, thinking=ON, extra_body={"context_management": edits})
        same = [dict(x) for x in oa]
        for i in cleared:
            del same[i]["reasoning_content"]
        assert prompt_tokens(m) == openai_chat(same, 1, thinking="enabled").usage.prompt_tokens, keep


def test_max_tokens_over_the_cap_is_clamped_and_reported_truthfully():
    """Claude Code asks for 32,000 new tokens; this daemon's cap is 64 (`--max-tokens-cap`): the
    request is served up to the cap, never refused, and the reply says where it stopped."""
    whole = create(unix_client(), ASK, 64, system=SYSTEM)
    # Streamed, as Claude Code asks (the SDK refuses a whole reply that large).
    with unix_client().messages.stream(model=MODEL, messages=ASK, max_tokens=32000, system=SYSTEM,
                                       thinking=OFF) as s:
        m = s.get_final_message()
    assert text(m) == text(whole) and m.usage.output_tokens == whole.usage.output_tokens <= 64
    assert m.stop_reason in ("max_tokens", "end_turn")
    assert (m.stop_reason == "max_tokens") == (m.usage.output_tokens == 64)
    # The OpenAI route without max_tokens runs up to the cap too (aider sends none).
    unset = openai_client().chat.completions.create(
        model=MODEL, messages=[{"role": "system", "content": SYSTEM}] + ASK, temperature=0,
        extra_body={"thinking": {"type": "disabled"}})
    assert unset.choices[0].message.content == text(whole)
    assert unset.choices[0].finish_reason == {"max_tokens": "length", "end_turn": "stop"}[whole.stop_reason]
