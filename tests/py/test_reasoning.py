"""augur serve: reasoning apart from the answer, for chat templates whose
models think in <think> tags (Qwen3's template, from llama.cpp's
repository, in ../shared/testdata), on every API: chat completions'
message.reasoning_content / delta.reasoning_content, Anthropic's thinking
blocks, Responses' reasoning items; content holds only the answer.

The model is stories260K with Qwen3's chat template written into a copy of
its GGUF. Its outputs are scripted: the server's AUGUR_TEST_SCRIPT hook
makes each request write a given text, token by token through the engine
(a literal grammar), so what the server makes of an output that thinks is
checked against the text that went in, not against itself."""
import json
import os

import anthropic
import pytest

from conftest import SHARED, TINY_GGUF, ScriptedServers
from gguf_edit import copy_with_template

QWEN3_TEMPLATE = os.path.join(SHARED, "testdata", "templates", "Qwen-Qwen3-0.6B.jinja")
REASONING = "The user greets me.\nI should greet back."
ANSWER = "Hello there!"
THINKING_OUTPUT = f"<think>\n{REASONING}\n</think>\n\n{ANSWER}"
CALL_ARGS = {"city": "Paris"}
TOOL_OUTPUT = (f"<think>\nI need the weather.\n</think>\n\n<tool_call>\n"
               f"{json.dumps({'name': 'get_weather', 'arguments': CALL_ARGS})}\n</tool_call>")
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Get the weather",
                                            "parameters": {"type": "object",
                                                           "properties": {"city": {"type": "string"}},
                                                           "required": ["city"]}}}
HI = [{"role": "user", "content": "Hi!"}]


@pytest.fixture(scope="module")
def thinking_model(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("think") / "stories260K-qwen3-template.gguf")
    with open(QWEN3_TEMPLATE) as f:
        copy_with_template(TINY_GGUF, path, f.read())
    return path


@pytest.fixture
def scripted(thinking_model, tmp_path):
    """scripted(*outputs): a server on the thinking model whose requests
    write outputs[0], outputs[1], ... in turn."""
    with ScriptedServers(thinking_model, tmp_path) as start:
        yield start


def test_chat_reasoning_content(scripted):
    s = scripted(THINKING_OUTPUT)
    r = s.client().chat.completions.create(model="x", messages=HI, max_tokens=200)
    m = r.choices[0].message
    assert m.content == ANSWER
    assert m.model_extra["reasoning_content"] == REASONING
    assert r.choices[0].finish_reason == "stop"


def test_chat_streamed_reasoning_then_content(scripted):
    s = scripted(THINKING_OUTPUT)
    chunks = list(s.client().chat.completions.create(model="x", messages=HI, max_tokens=200, stream=True))
    kinds, reasoning, content = [], "", ""
    for ch in chunks:
        if not ch.choices:
            continue
        d = ch.choices[0].delta
        r = (d.model_extra or {}).get("reasoning_content")
        if r:
            reasoning += r
            kinds.append("r")
        if d.content:
            content += d.content
            kinds.append("c")
    assert reasoning == REASONING and content == ANSWER
    # all of the reasoning comes before any of the answer, in several pieces
    assert kinds == sorted(kinds, key=lambda k: k != "r") and kinds.count("r") > 1


def test_reasoning_cut_by_max_tokens_stays_reasoning(scripted):
    s = scripted(THINKING_OUTPUT)
    r = s.client().chat.completions.create(model="x", messages=HI, max_tokens=20)
    m = r.choices[0].message
    assert r.choices[0].finish_reason == "length"
    reasoning = m.model_extra["reasoning_content"]
    assert m.content == "" and reasoning and REASONING.startswith(reasoning) and reasoning != REASONING


def test_an_answer_without_think_tags_is_all_content(scripted):
    s = scripted("Just an answer.")
    m = s.client().chat.completions.create(model="x", messages=HI, max_tokens=50).choices[0].message
    assert m.content == "Just an answer." and "reasoning_content" not in (m.model_extra or {})


def test_reasoning_with_a_tool_call(scripted):
    s = scripted(TOOL_OUTPUT, TOOL_OUTPUT, TOOL_OUTPUT)
    r = s.client().chat.completions.create(model="x", messages=HI, tools=[WEATHER], max_tokens=200)
    m = r.choices[0].message
    assert r.choices[0].finish_reason == "tool_calls"
    assert m.model_extra["reasoning_content"] == "I need the weather." and not m.content
    assert json.loads(m.tool_calls[0].function.arguments) == CALL_ARGS
    # Responses: a reasoning item, then the function call
    tools = [{"type": "function", **WEATHER["function"]}]
    out = s.client().responses.create(model="x", input="Hi!", tools=tools, max_output_tokens=200).output
    assert [o.type for o in out] == ["reasoning", "function_call"]
    assert out[0].content[0].text == "I need the weather." and json.loads(out[1].arguments) == CALL_ARGS
    # Anthropic: a thinking block, then tool_use
    a = anthropic.Anthropic(base_url=s.base, api_key="none", max_retries=0)
    msg = a.messages.create(model="x", max_tokens=200, messages=HI,
                            tools=[{"name": "get_weather", "description": "Get the weather",
                                    "input_schema": WEATHER["function"]["parameters"]}])
    assert [b.type for b in msg.content] == ["thinking", "tool_use"] and msg.stop_reason == "tool_use"
    assert msg.content[0].thinking == "I need the weather." and msg.content[1].input == CALL_ARGS


def test_responses_reasoning_item(scripted):
    s = scripted(THINKING_OUTPUT, THINKING_OUTPUT)
    r = s.client().responses.create(model="x", input="Hi!", max_output_tokens=200)
    assert [o.type for o in r.output] == ["reasoning", "message"]
    assert r.output[0].content[0].type == "reasoning_text" and r.output[0].content[0].text == REASONING
    assert r.output_text == ANSWER
    # the reasoning's tokens are counted apart, within the output's
    assert 0 < r.usage.output_tokens_details.reasoning_tokens < r.usage.output_tokens
    events = list(s.client().responses.create(model="x", input="Hi!", max_output_tokens=200, stream=True))
    types = [e.type for e in events]
    rdeltas = "".join(e.delta for e in events if e.type == "response.reasoning_text.delta")
    tdeltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert rdeltas == REASONING and tdeltas == ANSWER
    assert types.index("response.reasoning_text.done") < types.index("response.output_text.delta")
    added = [e.item.type for e in events if e.type == "response.output_item.added"]
    assert added == ["reasoning", "message"] and [e.output_index for e in events if e.type ==
                                                  "response.output_item.done"] == [0, 1]
    final = events[-1].response
    assert final.output[0].content[0].text == REASONING and final.output_text == ANSWER
    assert [e.sequence_number for e in events] == list(range(len(events)))


def test_anthropic_thinking_blocks(scripted):
    s = scripted(THINKING_OUTPUT, THINKING_OUTPUT)
    a = anthropic.Anthropic(base_url=s.base, api_key="none", max_retries=0)
    m = a.messages.create(model="x", max_tokens=200, messages=HI, thinking={"type": "enabled", "budget_tokens": 1024})
    assert [b.type for b in m.content] == ["thinking", "text"]
    assert m.content[0].thinking == REASONING and m.content[1].text == ANSWER
    with a.messages.stream(model="x", max_tokens=200, messages=HI) as st:
        events = list(st)
        final = st.get_final_message()
    assert [b.type for b in final.content] == ["thinking", "text"]
    assert final.content[0].thinking == REASONING and final.content[1].text == ANSWER
    starts = [e.content_block.type for e in events if e.type == "content_block_start"]
    assert starts == ["thinking", "text"]
    # earlier thinking blocks sent back in the history are accepted
    m2 = a.messages.create(model="x", max_tokens=10, messages=[
        *HI, {"role": "assistant", "content": [{"type": "thinking", "thinking": REASONING, "signature": ""},
                                               {"type": "text", "text": ANSWER}]},
        {"role": "user", "content": "Again"}])
    assert m2.content


def test_prompt_that_opens_the_think_block(scripted):
    """An assistant prefill "<think>\\n" (Anthropic) leaves the prompt inside
    the think block: the output's reasoning has no opening tag."""
    s = scripted(f"{REASONING}\n</think>\n\n{ANSWER}")
    a = anthropic.Anthropic(base_url=s.base, api_key="none", max_retries=0)
    m = a.messages.create(model="x", max_tokens=200,
                          messages=[*HI, {"role": "assistant", "content": "<think>\n"}])
    assert [b.type for b in m.content] == ["thinking", "text"]
    assert m.content[0].thinking == REASONING and m.content[1].text == ANSWER


def test_thinking_is_refused_where_the_model_does_not_think(tiny_server):
    a = anthropic.Anthropic(base_url=tiny_server.base, api_key="none", max_retries=0)
    with pytest.raises(anthropic.BadRequestError) as e:
        a.messages.create(model="x", max_tokens=8, messages=HI, thinking={"type": "enabled", "budget_tokens": 1024})
    assert "thinking" in str(e.value)
