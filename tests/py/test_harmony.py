"""augur serve: gpt-oss's chat format ("harmony") on every API. The model's
reasoning (the analysis channel) goes to chat completions'
message.reasoning_content / delta.reasoning_content, Anthropic's thinking
blocks and Responses' reasoning items; the final channel is the answer;
a message to=functions.NAME is a tool call (tool_calls, tool_use,
function_call items). Earlier turns sent back by a client render as
jinja2 renders gpt-oss's template for them.

The model is stories260K with gpt-oss's chat template (tests/data/templates,
from llama.cpp's repository) written into a copy of its GGUF. Its outputs
are scripted (AUGUR_TEST_SCRIPT, as in test_reasoning.py): each request
writes a given harmony text token by token through the engine. The
stories260K vocabulary has no harmony special tokens, so the markers
(<|channel|>, <|message|>, <|end|>, <|start|>, <|constrain|>) come out as
the plain text they are also in a gpt-oss output, where the tokenizer
renders those tokens as text (tok.c, as llama.cpp); <|call|> and <|return|>
end a gpt-oss generation without text, as the end of a script does here.
test_special_tokens_render_and_parse checks that token path itself on a copy
of stories260K whose vocabulary gets the harmony tokens appended as control
tokens (gguf_edit.copy_with_template: the token list, scores and types extended, and
small random rows appended to token_embd and output)."""
import json
import os
import re

import anthropic
import pytest

from conftest import ROOT, TINY_GGUF, AugurServer, ScriptedServers
import jinja_ref
from gguf_edit import copy_with_template

TEMPLATE = os.path.join(ROOT, "tests", "data", "templates", "openai-gpt-oss-120b.jinja")
REASONING = "The user greets me.\nI should greet back."
ANSWER = "Hello there!"
OUTPUT = (f"<|channel|>analysis<|message|>{REASONING}<|end|>"
          f"<|start|>assistant<|channel|>final<|message|>{ANSWER}")
CALL_ARGS = {"city": "Paris"}
CALL_REASONING = "I need the weather."
TOOL_OUTPUT = (f"<|channel|>analysis<|message|>{CALL_REASONING}<|end|><|start|>assistant<|channel|>commentary "
               f"to=functions.get_weather <|constrain|>json<|message|>{json.dumps(CALL_ARGS)}")
# the recipient before the channel, as the template writes calls in the history
TOOL_OUTPUT_ROLE_FIRST = (f"<|channel|>analysis<|message|>{CALL_REASONING}<|end|><|start|>assistant "
                          f"to=functions.get_weather<|channel|>commentary json<|message|>{json.dumps(CALL_ARGS)}")
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Get the weather",
                                            "parameters": {"type": "object",
                                                           "properties": {"city": {"type": "string"}},
                                                           "required": ["city"]}}}
ANTHROPIC_WEATHER = {"name": "get_weather", "description": "Get the weather",
                     "input_schema": WEATHER["function"]["parameters"]}
HI = [{"role": "user", "content": "Hi!"}]
CLOCK = {"SOURCE_DATE_EPOCH": "1735689600", "TZ": "UTC"}


@pytest.fixture(scope="module")
def harmony_model(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("harmony") / "stories260K-gpt-oss-template.gguf")
    with open(TEMPLATE, encoding="utf-8") as f:
        copy_with_template(TINY_GGUF, path, f.read())
    return path


@pytest.fixture
def scripted(harmony_model, tmp_path):
    """scripted(*outputs): a server on the harmony model whose requests write
    outputs[0], outputs[1], ... in turn (debug log: the rendered prompts)."""
    with ScriptedServers(harmony_model, tmp_path, {**CLOCK, "AUGUR_LOG": "debug"}) as start:
        yield start


HARMONY_TOKENS = ["<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|constrain|>", "<|return|>", "<|call|>"]


def anthropic_client(s):
    return anthropic.Anthropic(base_url=s.base, api_key="none", max_retries=0)


def test_chat_reasoning_and_answer(scripted):
    s = scripted(OUTPUT)
    r = s.client().chat.completions.create(model="x", messages=HI, max_tokens=400)
    m = r.choices[0].message
    assert m.content == ANSWER and m.model_extra["reasoning_content"] == REASONING
    assert r.choices[0].finish_reason == "stop" and not m.tool_calls


def test_chat_streamed_never_shows_a_marker(scripted):
    s = scripted(OUTPUT)
    chunks = list(s.client().chat.completions.create(model="x", messages=HI, max_tokens=400, stream=True))
    kinds, reasoning, content = [], "", ""
    for ch in chunks:
        if not ch.choices:
            continue
        d = ch.choices[0].delta
        r = (d.model_extra or {}).get("reasoning_content")
        for piece in (r, d.content):
            assert not piece or ("<" not in piece and "|" not in piece), piece
        if r:
            reasoning += r
            kinds.append("r")
        if d.content:
            content += d.content
            kinds.append("c")
    assert reasoning == REASONING and content == ANSWER
    assert kinds == sorted(kinds, key=lambda k: k != "r") and kinds.count("r") > 1 and kinds.count("c") > 1
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_cut_by_max_tokens_stays_reasoning(scripted):
    s = scripted(OUTPUT)
    r = s.client().chat.completions.create(model="x", messages=HI, max_tokens=40)
    m = r.choices[0].message
    assert r.choices[0].finish_reason == "length" and m.content == ""
    assert REASONING.startswith(m.model_extra["reasoning_content"]) and m.model_extra["reasoning_content"]


def test_output_without_channels_is_the_answer(scripted):
    s = scripted("Just an answer.")
    m = s.client().chat.completions.create(model="x", messages=HI, max_tokens=50).choices[0].message
    assert m.content == "Just an answer." and "reasoning_content" not in (m.model_extra or {})


@pytest.mark.parametrize("output", [TOOL_OUTPUT, TOOL_OUTPUT_ROLE_FIRST], ids=["channel-first", "recipient-first"])
def test_chat_tool_call(scripted, output):
    s = scripted(output, output)
    r = s.client().chat.completions.create(model="x", messages=HI, tools=[WEATHER], max_tokens=400)
    m = r.choices[0].message
    assert r.choices[0].finish_reason == "tool_calls" and not m.content
    assert m.model_extra["reasoning_content"] == CALL_REASONING
    assert m.tool_calls[0].function.name == "get_weather"
    assert json.loads(m.tool_calls[0].function.arguments) == CALL_ARGS
    # streamed: reasoning deltas, then the call, nothing of it as content
    chunks = list(s.client().chat.completions.create(model="x", messages=HI, tools=[WEATHER], max_tokens=400,
                                                     stream=True))
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    assert "".join(d.content or "" for d in deltas) == ""
    assert "".join((d.model_extra or {}).get("reasoning_content") or "" for d in deltas) == CALL_REASONING
    calls = [tc for d in deltas for tc in (d.tool_calls or [])]
    assert len(calls) == 1 and calls[0].function.name == "get_weather"
    assert json.loads(calls[0].function.arguments) == CALL_ARGS
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_forced_tool_call_is_written_in_harmony(harmony_model):
    """tool_choice required: the grammar makes the model write a harmony
    call message (no script: stories260K writes whatever the grammar lets)."""
    s = AugurServer(harmony_model, "--parallel", "1", env={**os.environ, **CLOCK})
    try:
        r = s.client().chat.completions.create(model="x", messages=HI, tools=[WEATHER], tool_choice="required",
                                               max_tokens=200, temperature=0)
        m = r.choices[0].message
        assert r.choices[0].finish_reason == "tool_calls", m
        assert m.tool_calls[0].function.name == "get_weather"
        assert isinstance(json.loads(m.tool_calls[0].function.arguments), dict)
    finally:
        assert s.stop() == 0


def test_responses_items(scripted):
    s = scripted(OUTPUT, OUTPUT, TOOL_OUTPUT, TOOL_OUTPUT)
    r = s.client().responses.create(model="x", input="Hi!", max_output_tokens=400)
    assert [o.type for o in r.output] == ["reasoning", "message"]
    assert r.output[0].content[0].text == REASONING and r.output_text == ANSWER
    assert 0 < r.usage.output_tokens_details.reasoning_tokens < r.usage.output_tokens
    events = list(s.client().responses.create(model="x", input="Hi!", max_output_tokens=400, stream=True))
    assert "".join(e.delta for e in events if e.type == "response.reasoning_text.delta") == REASONING
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == ANSWER
    assert [e.item.type for e in events if e.type == "response.output_item.added"] == ["reasoning", "message"]
    tools = [{"type": "function", **WEATHER["function"]}]
    out = s.client().responses.create(model="x", input="Hi!", tools=tools, max_output_tokens=400).output
    assert [o.type for o in out] == ["reasoning", "function_call"]
    assert out[0].content[0].text == CALL_REASONING and out[1].name == "get_weather"
    assert json.loads(out[1].arguments) == CALL_ARGS
    events = list(s.client().responses.create(model="x", input="Hi!", tools=tools, max_output_tokens=400,
                                              stream=True))
    assert [e.item.type for e in events if e.type == "response.output_item.added"] == ["reasoning", "function_call"]
    assert "".join(e.delta for e in events if e.type == "response.reasoning_text.delta") == CALL_REASONING
    assert not [e for e in events if e.type == "response.output_text.delta"]
    args = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    assert json.loads(args) == CALL_ARGS and events[-1].response.output[1].name == "get_weather"


def test_anthropic_thinking_and_tool_use(scripted):
    s = scripted(OUTPUT, OUTPUT, TOOL_OUTPUT, TOOL_OUTPUT)
    a = anthropic_client(s)
    m = a.messages.create(model="x", max_tokens=400, messages=HI, thinking={"type": "enabled", "budget_tokens": 1024})
    assert [b.type for b in m.content] == ["thinking", "text"]
    assert m.content[0].thinking == REASONING and m.content[1].text == ANSWER and m.stop_reason == "end_turn"
    with a.messages.stream(model="x", max_tokens=400, messages=HI) as st:
        events = list(st)
        final = st.get_final_message()
    assert [b.type for b in final.content] == ["thinking", "text"]
    assert final.content[0].thinking == REASONING and final.content[1].text == ANSWER
    assert [e.content_block.type for e in events if e.type == "content_block_start"] == ["thinking", "text"]
    m = a.messages.create(model="x", max_tokens=400, messages=HI, tools=[ANTHROPIC_WEATHER])
    assert [b.type for b in m.content] == ["thinking", "tool_use"] and m.stop_reason == "tool_use"
    assert m.content[0].thinking == CALL_REASONING and m.content[1].input == CALL_ARGS
    with a.messages.stream(model="x", max_tokens=400, messages=HI, tools=[ANTHROPIC_WEATHER]) as st:
        final = st.get_final_message()
    assert [b.type for b in final.content] == ["thinking", "tool_use"] and final.content[1].input == CALL_ARGS


def test_prefill_continues_the_final_answer(scripted):
    """Anthropic's trailing assistant message: the prompt ends in the final
    channel's body, and the output continues it."""
    s = scripted(" there!")
    m = anthropic_client(s).messages.create(model="x", max_tokens=100,
                                            messages=[*HI, {"role": "assistant", "content": "Hello"}])
    assert [b.type for b in m.content] == ["text"] and m.content[0].text == " there!"
    assert "<|start|>assistant<|channel|>final<|message|>Hello" in s.stderr()


def rendered(messages, tools=None):
    """What jinja2 makes of gpt-oss's template for these messages."""
    with open(TEMPLATE, encoding="utf-8") as f:
        src = f.read()
    conv = {"messages": messages, "add_generation_prompt": True}
    if tools:
        conv["tools"] = tools
    old = {k: os.environ.get(k) for k in CLOCK}
    os.environ.update(CLOCK)
    try:
        ok, text = jinja_ref.render(src, conv)
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    assert ok, text
    return text


def undated(text):
    """The server's template clock is the real one: the date line aside."""
    return re.sub(r"Current date: \d{4}-\d{2}-\d{2}", "Current date: D", text)


def test_history_renders_as_the_template_expects(scripted):
    """A tool-call turn sent back with its reasoning (OpenAI
    reasoning_content, Anthropic thinking blocks, Responses reasoning items)
    renders its analysis before the call, as jinja2 renders `thinking`; an
    earlier final turn's reasoning is dropped by the template."""
    s = scripted(OUTPUT)
    call = {"id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": json.dumps(CALL_ARGS)}}
    history = [{"role": "system", "content": "Be brief."}, *HI,
               {"role": "assistant", "content": "Hi!", "reasoning_content": "Say hi."},
               {"role": "user", "content": "Weather in Paris?"},
               {"role": "assistant", "content": None, "reasoning_content": CALL_REASONING, "tool_calls": [call]},
               {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}]
    expected = rendered([{"role": "system", "content": "Be brief."}, *HI,
                         {"role": "assistant", "content": "Hi!", "thinking": "Say hi."},
                         {"role": "user", "content": "Weather in Paris?"},
                         {"role": "assistant", "thinking": CALL_REASONING,
                          "tool_calls": [{**call, "function": {"name": "get_weather", "arguments": CALL_ARGS}}]},
                         {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}], tools=[WEATHER])
    assert f"<|channel|>analysis<|message|>{CALL_REASONING}<|end|>" in expected and "Say hi." not in expected
    r = s.client().chat.completions.create(model="x", messages=history, tools=[WEATHER], max_tokens=400)
    assert r.choices[0].message.content == ANSWER
    expected = undated(expected)
    assert f"chat prompt ({r.usage.prompt_tokens} tokens): {expected}" in undated(s.stderr())

    # the same turn through Anthropic (system apart, thinking blocks)
    a = anthropic_client(s)
    a.messages.create(model="x", max_tokens=400, system="Be brief.", tools=[ANTHROPIC_WEATHER], messages=[
        *HI, {"role": "assistant", "content": [{"type": "thinking", "thinking": "Say hi.", "signature": ""},
                                               {"type": "text", "text": "Hi!"}]},
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": [{"type": "thinking", "thinking": CALL_REASONING, "signature": ""},
                                          {"type": "tool_use", "id": "call_1", "name": "get_weather",
                                           "input": CALL_ARGS}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "call_1", "content": "sunny"}]}])
    assert undated(s.stderr()).count(expected) == 2

    # and through Responses (instructions, reasoning and function_call items)
    s.client().responses.create(model="x", instructions="Be brief.", max_output_tokens=400,
                                tools=[{"type": "function", **WEATHER["function"]}], input=[
        {"role": "user", "content": "Hi!"},
        {"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "reasoning_text", "text": "Say hi."}]},
        {"role": "assistant", "content": "Hi!"},
        {"role": "user", "content": "Weather in Paris?"},
        {"type": "reasoning", "id": "rs_2", "summary": [],
         "content": [{"type": "reasoning_text", "text": CALL_REASONING}]},
        {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": json.dumps(CALL_ARGS)},
        {"type": "function_call_output", "call_id": "call_1", "output": "sunny"}])
    assert undated(s.stderr()).count(expected) == 3


def test_reasoning_effort_reaches_the_template(scripted):
    """gpt-oss's template takes reasoning_effort ("Reasoning: high" in its
    system message): chat completions' reasoning_effort and Responses'
    reasoning.effort set it; other values are a 400."""
    s = scripted(OUTPUT)
    r = s.client().chat.completions.create(model="x", messages=HI, max_tokens=400, reasoning_effort="high")
    assert r.choices[0].message.content == ANSWER
    s.client().responses.create(model="x", input="Hi!", max_output_tokens=400, reasoning={"effort": "low"})
    log = s.stderr()
    assert "\nReasoning: high\n" in log and "\nReasoning: low\n" in log
    import openai
    with pytest.raises(openai.BadRequestError) as e:
        s.client().chat.completions.create(model="x", messages=HI, max_tokens=4, reasoning_effort="extreme")
    assert e.value.body["param"] == "reasoning_effort"


def post(server, route, body):
    import urllib.request
    req = urllib.request.Request(server.base + route, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    return json.loads(urllib.request.urlopen(req).read())


def test_special_tokens_render_and_parse(tmp_path):
    """With harmony's markers as single control tokens (as in gpt-oss's
    vocabulary): the prompt's markers tokenize to them, the output's
    <|channel|>, <|message|>, <|end|>, <|start|> tokens come out as their
    text and the output reads as when spelled out; <|return|> and <|call|>
    end generation."""
    path = str(tmp_path / "stories260K-harmony-tokens.gguf")
    with open(TEMPLATE, encoding="utf-8") as f:
        copy_with_template(TINY_GGUF, path, f.read(), HARMONY_TOKENS)
    with ScriptedServers(path, tmp_path, CLOCK, "--parallel", "1") as start:
        s = start(OUTPUT)
        ids = {t: post(s, "/tokenize", {"content": t, "parse_special": True})["tokens"] for t in HARMONY_TOKENS}
        assert all(len(v) == 1 and v[0] >= 512 for v in ids.values()), ids
        # the script's markers are written as the special tokens (a bias
        # makes the model pick them where the script allows them)
        bias = {str(ids[t][0]): 100 for t in ("<|start|>", "<|end|>", "<|message|>", "<|channel|>")}
        r = s.client().chat.completions.create(model="x", messages=HI, max_tokens=400, logit_bias=bias,
                                               logprobs=True)
        m = r.choices[0].message
        assert m.content == ANSWER and m.model_extra["reasoning_content"] == REASONING
        tokens = [e.token for e in r.choices[0].logprobs.content]
        assert tokens.count("<|channel|>") == 2 and tokens.count("<|message|>") == 2
        assert tokens.count("<|end|>") == 1 and tokens.count("<|start|>") == 1
    # without a script: <|return|> and <|call|> end generation (nothing of
    # them is text); <|end|> does not, it ends a message
    s = AugurServer(path, "--parallel", "1")
    try:
        for t in ("<|return|>", "<|call|>", "<|end|>"):
            c = post(s, "/v1/completions", {"prompt": "Once", "max_tokens": 3, "logit_bias": {str(ids[t][0]): 100}})
            ch = c["choices"][0]
            if t == "<|end|>":
                assert ch["finish_reason"] == "length" and ch["text"] == "<|end|>" * 3, ch
            else:
                assert ch["finish_reason"] == "stop" and ch["text"] == "", ch
    finally:
        assert s.stop() == 0


def test_answer_schema_is_a_final_message(harmony_model):
    """response_format (alone, and beside tools): the value is written as the
    body of a final message, as gpt-oss writes answers (no script:
    stories260K writes whatever the grammar lets)."""
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"],
              "additionalProperties": False}
    rf = {"type": "json_schema", "json_schema": {"name": "n", "schema": schema, "strict": True}}
    s = AugurServer(harmony_model, "--parallel", "1", env={**os.environ, **CLOCK})
    try:
        for tools in (None, [WEATHER]):
            kw = {"tools": tools} if tools else {}
            r = s.client().chat.completions.create(model="x", messages=HI, response_format=rf, max_tokens=200,
                                                   temperature=0, logprobs=True, **kw)
            m = r.choices[0].message
            raw = "".join(e.token for e in r.choices[0].logprobs.content)
            if m.tool_calls:  # beside tools the model may call one instead
                assert raw.startswith("<|channel|>commentary to=functions.get_weather")
                continue
            assert raw.startswith("<|channel|>final<|message|>{"), raw
            assert isinstance(json.loads(m.content)["n"], int) and "reasoning_content" not in (m.model_extra or {})
    finally:
        assert s.stop() == 0


def test_several_calls_of_one_turn_render_one_by_one(scripted):
    """gpt-oss's template renders only an assistant message's first call and
    names every tool result after the latest call: a turn with two calls
    (and their results, in any order) renders as two call messages, each
    followed by its own result, as a harmony transcript has them."""
    s = scripted(OUTPUT)
    calls = [{"id": f"call_{k}", "type": "function",
              "function": {"name": "get_weather", "arguments": json.dumps({"city": c})}}
             for k, c in enumerate(["Paris", "Rome"])]
    msgs = [*HI, {"role": "assistant", "content": None, "reasoning_content": CALL_REASONING, "tool_calls": calls},
            {"role": "tool", "tool_call_id": "call_1", "content": "rainy"},
            {"role": "tool", "tool_call_id": "call_0", "content": "sunny"}]
    one = [{**c, "function": {**c["function"], "arguments": json.loads(c["function"]["arguments"])}} for c in calls]
    expected = undated(rendered([
        *HI, {"role": "assistant", "thinking": CALL_REASONING, "tool_calls": [one[0]]},
        {"role": "tool", "tool_call_id": "call_0", "content": "sunny"},
        {"role": "assistant", "content": "", "tool_calls": [one[1]]},
        {"role": "tool", "tool_call_id": "call_1", "content": "rainy"}], tools=[WEATHER]))
    assert '{"city": "Rome"}<|call|><|start|>functions.get_weather to=assistant<|channel|>commentary' \
           '<|message|>"rainy"' in expected
    s.client().chat.completions.create(model="x", messages=msgs, tools=[WEATHER], max_tokens=400)
    assert expected in undated(s.stderr())


def test_previous_response_keeps_the_calls_reasoning(scripted):
    """Responses' previous_response_id: the stored turn's reasoning and call
    reach the template, so the analysis before the call renders again."""
    s = scripted(TOOL_OUTPUT, OUTPUT)
    tools = [{"type": "function", **WEATHER["function"]}]
    first = s.client().responses.create(model="x", input="Hi!", tools=tools, max_output_tokens=400)
    call = first.output[1]
    second = s.client().responses.create(model="x", previous_response_id=first.id, tools=tools, max_output_tokens=400,
                                         input=[{"type": "function_call_output", "call_id": call.call_id,
                                                 "output": "sunny"}])
    assert second.output_text == ANSWER
    log = s.stderr()
    assert (f"<|start|>user<|message|>Hi!<|end|><|start|>assistant<|channel|>analysis<|message|>{CALL_REASONING}"
            f"<|end|><|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>"
            f"{json.dumps(CALL_ARGS)}<|call|><|start|>functions.get_weather to=assistant<|channel|>commentary"
            f"<|message|>\"sunny\"<|end|><|start|>assistant") in log
