"""Constrained decoding through the official clients (issue 34 point 6), on the trained fixture.

Started by `tests/e2e_http.rs` with `--thinking-budget 16` (the fixture would otherwise think
until max_tokens). Every constrained reply must parse in the client, streamed and whole, its
tool call's arguments valid against the tool's schema by `jsonschema` (an independent
validator), its JSON content valid against the response schema. The schemas here bound every
value (maxLength, maximum, enums), so each reply ends within max_tokens whatever the model
writes; unbounded strings end when the model ends them (or `length`, as on OpenAI's API).
"""

import json
import os

import anthropic
import jsonschema
import openai
import pytest

URL = os.environ["K3_HTTP_URL"]
KEY = os.environ["K3_HTTP_KEY"]
MODEL = os.environ["K3_MODEL"]
AGENT_TOOLS = os.environ["K3_AGENT_TOOLS"]

WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 12},
        "days": {"type": "integer", "minimum": 1, "maximum": 14},
        "unit": {"enum": ["C", "F"]},
    },
    "required": ["city", "days"],
    "additionalProperties": False,
}
TIME = {
    "type": "object",
    "properties": {"zone": {"type": "string", "enum": ["UTC", "CET", "PST"]}},
    "required": ["zone"],
    "additionalProperties": False,
}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Weather", "parameters": WEATHER}},
    {"type": "function", "function": {"name": "get_time", "description": "Time", "parameters": TIME}},
]
SCHEMAS = {"get_weather": WEATHER, "get_time": TIME}
ASK = [{"role": "user", "content": "What is the weather in Paris for 3 days?"}]


def oai():
    return openai.OpenAI(base_url=URL + "/v1", api_key=KEY, max_retries=0)


def ant():
    return anthropic.Anthropic(base_url=URL, api_key=KEY, max_retries=0)


def chat(**kw):
    kw.setdefault("temperature", 0)
    kw.setdefault("max_tokens", 400)
    return oai().chat.completions.create(model=MODEL, messages=ASK, **kw)


def streamed_calls(**kw):
    """Tool calls rebuilt from the stream's deltas, as the SDK's users do; and the finish."""
    calls, finish = {}, None
    for chunk in oai().chat.completions.create(model=MODEL, messages=ASK, temperature=0, max_tokens=400, stream=True, **kw):
        if not chunk.choices:
            continue
        c = chunk.choices[0]
        finish = c.finish_reason or finish
        for d in c.delta.tool_calls or []:
            call = calls.setdefault(d.index, {"id": None, "name": "", "arguments": ""})
            call["id"] = d.id or call["id"]
            if d.function and d.function.name:
                call["name"] += d.function.name
            if d.function and d.function.arguments:
                call["arguments"] += d.function.arguments
    return [calls[i] for i in sorted(calls)], finish


def terse(schema):
    """`schema` without its `description` annotations (a keyword, not a property of that name):
    what constrains a call is kept, the prompt is a fraction as long (prefill on the fixture
    runs at seconds per thousand ids)."""
    if isinstance(schema, list):
        return [terse(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {}
    for k, v in schema.items():
        if k == "description":
            continue
        if k in ("properties", "$defs", "definitions") and isinstance(v, dict):
            out[k] = {name: terse(s) for name, s in v.items()}
        else:
            out[k] = terse(v)
    return out


def valid_call(name, arguments, schemas=SCHEMAS):
    args = json.loads(arguments)
    jsonschema.validate(args, schemas[name])
    return args


@pytest.mark.parametrize("choice, names", [
    ("required", {"get_weather", "get_time"}),
    ({"type": "function", "function": {"name": "get_time"}}, {"get_time"}),
])
def test_a_forced_call_parses_and_is_valid_streamed_and_whole(choice, names):
    r = chat(tools=TOOLS, tool_choice=choice, parallel_tool_calls=False)
    c = r.choices[0]
    assert c.finish_reason == "tool_calls", c
    assert not c.message.content
    assert len(c.message.tool_calls) == 1
    call = c.message.tool_calls[0]
    assert call.function.name in names
    valid_call(call.function.name, call.function.arguments)
    streamed, finish = streamed_calls(tools=TOOLS, tool_choice=choice, parallel_tool_calls=False)
    assert finish == "tool_calls"
    assert streamed == [{"id": call.id, "name": call.function.name, "arguments": call.function.arguments}]


def test_json_schema_and_json_object_content_parse_and_are_valid_streamed_and_whole():
    schema = {
        "type": "object",
        "properties": {"name": {"type": "string", "maxLength": 8}, "ok": {"type": "boolean"}},
        "required": ["name", "ok"],
        "additionalProperties": False,
    }
    fmt = {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema, "strict": True}}
    r = chat(response_format=fmt)
    assert r.choices[0].finish_reason == "stop", r
    jsonschema.validate(json.loads(r.choices[0].message.content), schema)
    streamed = "".join(ch.choices[0].delta.content or "" for ch in oai().chat.completions.create(
        model=MODEL, messages=ASK, temperature=0, max_tokens=400, stream=True, response_format=fmt) if ch.choices)
    assert streamed == r.choices[0].message.content
    # json_object: some object (the fixture's is bounded by max_tokens only: it may be cut).
    r = chat(response_format={"type": "json_object"}, max_tokens=600)
    if r.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(r.choices[0].message.content), dict)
    else:
        assert r.choices[0].finish_reason == "length"
        assert r.choices[0].message.content.lstrip().startswith("{")


def test_anthropic_any_and_tool_give_a_valid_tool_use_block_streamed_and_whole():
    tools = [{"name": t["function"]["name"], "input_schema": t["function"]["parameters"]} for t in TOOLS]
    for choice, names in [
        ({"type": "any", "disable_parallel_tool_use": True}, {"get_weather", "get_time"}),
        ({"type": "tool", "name": "get_weather", "disable_parallel_tool_use": True}, {"get_weather"}),
    ]:
        m = ant().messages.create(model=MODEL, max_tokens=400, messages=ASK, tools=tools, tool_choice=choice)
        assert m.stop_reason == "tool_use", m
        uses = [b for b in m.content if b.type == "tool_use"]
        assert len(uses) == 1 and uses[0].name in names
        jsonschema.validate(uses[0].input, SCHEMAS[uses[0].name])
        with ant().messages.stream(model=MODEL, max_tokens=400, messages=ASK, tools=tools, tool_choice=choice) as s:
            final = s.get_final_message()
        streamed = [b for b in final.content if b.type == "tool_use"]
        assert [(b.name, b.input) for b in streamed] == [(uses[0].name, uses[0].input)]
        assert final.stop_reason == "tool_use"


def test_real_agents_tools_compile_or_are_refused_naming_the_schema_path():
    with open(os.path.join(AGENT_TOOLS, "claude-code.json")) as f:
        claude = [{"name": t["name"], "input_schema": terse(t["input_schema"])} for t in json.load(f)]
    with open(os.path.join(AGENT_TOOLS, "opencode.json")) as f:
        opencode = [{"type": "function", "function": {"name": t["function"]["name"], "parameters": terse(t["function"]["parameters"])}}
                    for t in json.load(f)]
    with open(os.path.join(AGENT_TOOLS, "codex.json")) as f:
        codex = [{"type": "function", "function": {"name": t["name"], "parameters": terse(t["parameters"])}} for t in json.load(f)]
    # Claude Code's set (schemas as sent, descriptions dropped): its Workflow tool's
    # `resumeFromRunId` has a `pattern`, outside the subset, so "any" is refused naming the
    # field, the tool and the schema path, before any prefill.
    with pytest.raises(anthropic.BadRequestError) as e:
        ant().messages.create(model=MODEL, max_tokens=8, messages=ASK, tools=claude, tool_choice={"type": "any"})
    message = e.value.body["error"]["message"]
    assert message.startswith("tools: cannot constrain the reply"), message
    assert "tools[22] (`Workflow`) at /properties/resumeFromRunId: pattern is not supported" in message, message
    # Without that tool the other 23 compile: a forced call is served (possibly cut by
    # max_tokens inside an unbounded string; a finished one is valid against its schema).
    rest = [t for t in claude if t["name"] != "Workflow"]
    m = ant().messages.create(model=MODEL, max_tokens=96, messages=ASK, tools=rest, tool_choice={"type": "any"})
    uses = [b for b in m.content if b.type == "tool_use"]
    if m.stop_reason == "tool_use":
        assert uses, m
        schema = {t["name"]: t["input_schema"] for t in rest}
        for u in uses:
            jsonschema.validate(u.input, schema[u.name])
    else:
        assert m.stop_reason == "max_tokens", m
    # opencode's and Codex's sets compile whole; a forced call of their shell tool is served
    # (its command is an unbounded string: the fixture may not end it within max_tokens, so
    # only a finished call is checked against the schema).
    for tools, shell in [(opencode, "bash"), (codex, "exec_command")]:
        names = {t["function"]["name"] for t in tools}
        assert shell in names, names
        r = chat(tools=tools, tool_choice="required", parallel_tool_calls=False, max_tokens=96)
        c = r.choices[0]
        assert c.message.tool_calls and c.message.tool_calls[0].function.name in names
        if c.finish_reason == "tool_calls":
            schema = {t["function"]["name"]: t["function"]["parameters"] for t in tools}
            valid_call(c.message.tool_calls[0].function.name, c.message.tool_calls[0].function.arguments, schema)
        else:
            assert c.finish_reason == "length"


def test_requests_that_cannot_be_constrained_are_400_naming_the_field():
    bad = dict(TOOLS[0]["function"])
    bad["parameters"] = {"type": "object", "properties": {"id": {"type": "string", "pattern": "^x"}}}
    with pytest.raises(openai.BadRequestError) as e:
        chat(tools=[{"type": "function", "function": bad}], tool_choice="required")
    assert "the parameters schema of tools[0] (`get_weather`) at /properties/id: pattern is not supported" in e.value.body["message"]
    assert e.value.body["param"] == "tools"
    with pytest.raises(openai.BadRequestError) as e:
        chat(tools=TOOLS, tool_choice={"type": "function", "function": {"name": "nope"}})
    assert "tool_choice names the function \"nope\"" in e.value.body["message"]
    with pytest.raises(openai.BadRequestError) as e:
        chat(response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {"oneOf": [{}]}}})
    assert "the response format's schema at /" in e.value.body["message"]
    assert e.value.body["param"] == "response_format"
