"""Forced tool choices are honoured (issue 45 point 4), through the official clients, on the
trained fixture with the daemon's default thinking budget (512 ids: the fixture thinks until it
is closed, so a reply that thought first would spend all of a small max_tokens thinking).

Started by `tests/e2e_http.rs`. The wire-contract suite's request — a named `tool_choice`,
thinking on by default — must come back as a call within max_tokens: a forced call is made
without thinking (docs/decoding.md). The suite sends `max_tokens: 64`; the fixture's small
vocabulary spells the call's tags in more ids than K3's does (over 64), so here max_tokens is
ROOM, still below the 512 ids of thinking that took all of it before. Its arguments are valid
against the schema (constrained decoding), streamed and whole, on the OpenAI, Responses and Anthropic routes; a
max_tokens too small for any call is a 400 naming max_tokens; Anthropic's own rule (no forced
tool use with thinking enabled) is a 400 as on Anthropic's API.
"""

import json

import anthropic
import jsonschema
import openai
import pytest

# The clients and the model id, as the constrained-decoding suite makes them.
from test_constrained import MODEL, ant, oai

# The wire-contract suite's tool; `location` bounded so the fixture's call ends within ROOM.
WEATHER = {
    "type": "object",
    "properties": {
        "location": {"type": "string", "maxLength": 16},
        "unit": {"enum": ["celsius", "fahrenheit"]},
    },
    "required": ["location"],
    "additionalProperties": False,
}
TOOL = {"type": "function", "function": {"name": "get_current_weather", "description": "Weather", "parameters": WEATHER}}
ASK = [{"role": "user", "content": "What's the weather like in Boston today?"}]
NAMED = {"type": "function", "function": {"name": "get_current_weather"}}
ROOM = 256


def valid(arguments):
    args = json.loads(arguments) if isinstance(arguments, str) else arguments
    jsonschema.validate(args, WEATHER)
    return args


@pytest.mark.parametrize("choice", ["required", NAMED])
def test_openai_forced_call_fits_with_thinking_on_by_default(choice):
    r = oai().chat.completions.create(model=MODEL, messages=ASK, tools=[TOOL], tool_choice=choice,
                                      max_tokens=ROOM, temperature=0)
    c = r.choices[0]
    assert c.finish_reason == "tool_calls", c
    assert c.message.tool_calls and c.message.tool_calls[0].function.name == "get_current_weather"
    valid(c.message.tool_calls[0].function.arguments)
    assert r.usage.completion_tokens <= ROOM
    # Streamed: the same call, rebuilt from the deltas.
    calls, finish = {}, None
    for chunk in oai().chat.completions.create(model=MODEL, messages=ASK, tools=[TOOL], tool_choice=choice,
                                               max_tokens=ROOM, temperature=0, stream=True):
        if not chunk.choices:
            continue
        finish = chunk.choices[0].finish_reason or finish
        for d in chunk.choices[0].delta.tool_calls or []:
            call = calls.setdefault(d.index, {"name": "", "arguments": ""})
            call["name"] += (d.function and d.function.name) or ""
            call["arguments"] += (d.function and d.function.arguments) or ""
    assert finish == "tool_calls"
    assert [calls[i] for i in sorted(calls)] == [
        {"name": "get_current_weather", "arguments": c.message.tool_calls[0].function.arguments}]


def test_responses_forced_call_fits():
    tool = {"type": "function", "name": "get_current_weather", "parameters": WEATHER}
    for choice in ["required", {"type": "function", "name": "get_current_weather"}]:
        r = oai().responses.create(model=MODEL, input=ASK, tools=[tool], tool_choice=choice, max_output_tokens=ROOM)
        calls = [o for o in r.output if o.type == "function_call"]
        assert r.status == "completed", r
        assert len(calls) >= 1 and calls[0].name == "get_current_weather", r
        valid(calls[0].arguments)
        with oai().responses.stream(model=MODEL, input=ASK, tools=[tool], tool_choice=choice,
                                    max_output_tokens=ROOM) as s:
            final = s.get_final_response()
        streamed = [o for o in final.output if o.type == "function_call"]
        assert [(o.name, o.arguments) for o in streamed] == [(o.name, o.arguments) for o in calls]


def test_anthropic_any_and_tool_fit():
    tool = {"name": "get_current_weather", "input_schema": WEATHER}
    for choice in [{"type": "any"}, {"type": "tool", "name": "get_current_weather"}]:
        m = ant().messages.create(model=MODEL, max_tokens=ROOM, messages=ASK, tools=[tool], tool_choice=choice)
        assert m.stop_reason == "tool_use", m
        uses = [b for b in m.content if b.type == "tool_use"]
        assert uses and uses[0].name == "get_current_weather"
        valid(uses[0].input)
        with ant().messages.stream(model=MODEL, max_tokens=ROOM, messages=ASK, tools=[tool], tool_choice=choice) as s:
            final = s.get_final_message()
        assert final.stop_reason == "tool_use"
        assert [(b.name, b.input) for b in final.content if b.type == "tool_use"] == [(uses[0].name, uses[0].input)]
    # Anthropic refuses forced tool use with thinking enabled; so does k3, naming tool_choice.
    with pytest.raises(anthropic.BadRequestError) as e:
        ant().messages.create(model=MODEL, max_tokens=ROOM, messages=ASK, tools=[tool], tool_choice={"type": "any"},
                              thinking={"type": "enabled", "budget_tokens": 16})
    assert e.value.body["error"]["message"].startswith("tool_choice: thinking may not be enabled"), e.value.body


def test_max_tokens_too_small_for_any_call_is_a_400_naming_it():
    with pytest.raises(openai.BadRequestError) as e:
        oai().chat.completions.create(model=MODEL, messages=ASK, tools=[TOOL], tool_choice="required", max_tokens=8)
    assert e.value.body["param"] == "max_tokens", e.value.body
    assert "max_tokens 8 is too small for the tool call tool_choice forces" in e.value.body["message"]
    with pytest.raises(anthropic.BadRequestError) as e:
        ant().messages.create(model=MODEL, max_tokens=8, messages=ASK, tool_choice={"type": "any"},
                              tools=[{"name": "get_current_weather", "input_schema": WEATHER}])
    assert e.value.body["error"]["message"].startswith("max_tokens: max_tokens 8 is too small"), e.value.body
