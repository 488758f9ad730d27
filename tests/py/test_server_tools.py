"""augur serve: tools. Prompts are checked against the model's own template
rendered by Python's jinja2 the way Hugging Face's apply_chat_template does
(the independent reference), and tool calls come back out of a real
tool-using model (Qwen2.5 0.5B: one test in `make test` when the model is
present, the rest in `make test-models`)."""
import functools
import json

import jinja2
import jinja2.sandbox
import pytest

from conftest import QWEN_05B, SMOLLM2, AugurServer, require_model
from test_server import post

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "The city name"}},
                   "required": ["city"]}}}
ASK = [{"role": "user", "content": "What is the weather like in Paris today?"}]


@functools.lru_cache(maxsize=None)
def gguf_template(path):
    """tokenizer.chat_template straight from the GGUF header (the gguf
    package's reader maps every tensor too and takes seconds)."""
    import struct
    sizes = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
    with open(path, "rb") as f:
        magic, version, n_tensors, n_kv = struct.unpack("<4sIQQ", f.read(24))
        assert magic == b"GGUF" and version >= 2

        def string():
            (n,) = struct.unpack("<Q", f.read(8))
            return f.read(n)

        def skip(t):
            if t == 8:
                string()
            elif t == 9:
                et, n = struct.unpack("<IQ", f.read(12))
                if et == 8:
                    for _ in range(n):
                        string()
                else:
                    f.seek(sizes[et] * n, 1)
            else:
                f.seek(sizes[t], 1)

        for _ in range(n_kv):
            key = string().decode()
            (t,) = struct.unpack("<I", f.read(4))
            if key == "tokenizer.chat_template" and t == 8:
                return string().decode()
            skip(t)
    raise KeyError(f"{path} has no chat template")


def hf_render(template, messages, tools=None):
    """transformers' apply_chat_template: sandboxed jinja2, trim/lstrip blocks,
    tojson = json.dumps(ensure_ascii=False)."""
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                                       extensions=["jinja2.ext.loopcontrols"])

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def raise_exception(msg):
        raise jinja2.exceptions.TemplateError(msg)

    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    return env.from_string(template).render(messages=messages, tools=tools, add_generation_prompt=True)


def n_tokens(server, text):
    return len(post(server, "/tokenize", {"content": text, "add_special": True, "parse_special": True})[1]["tokens"])


def generic_tools_system(tools):
    """The documented default for templates without tool support: Hermes'
    instructions in the system message (the server's docs, restated)."""
    lines = "\n".join(json.dumps(t, separators=(",", ":")) for t in tools)
    return ("# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
            "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n" + lines +
            "\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
            "<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": "
            "<args-json-object>}\n</tool_call>")


def test_tools_on_a_template_without_tools(smol_server):
    """SmolLM2's template ignores tools: the server teaches them in the system
    message, spells earlier calls out as <tool_call> text and tool results as
    <tool_response> user turns."""
    c = smol_server.client()
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    msgs = ASK + [{"role": "assistant", "content": None, "tool_calls": [call]},
                  {"role": "tool", "tool_call_id": "call_1", "content": "18 C, sunny"}]
    r = c.chat.completions.create(model="x", messages=msgs, tools=[WEATHER], max_tokens=4, temperature=0)
    ref_msgs = [{"role": "system", "content": generic_tools_system([WEATHER])}, ASK[0],
                {"role": "assistant",
                 "content": '<tool_call>\n{"name":"get_weather","arguments":{"city":"Paris"}}\n</tool_call>'},
                {"role": "user", "content": "<tool_response>\n18 C, sunny\n</tool_response>"}]
    want = n_tokens(smol_server, hf_render(gguf_template(SMOLLM2), ref_msgs))
    assert r.usage.prompt_tokens == want
    # tool_choice "none": the plain conversation
    r = c.chat.completions.create(model="x", messages=ASK, tools=[WEATHER], tool_choice="none", max_tokens=2,
                                  temperature=0)
    assert r.usage.prompt_tokens == n_tokens(smol_server, hf_render(gguf_template(SMOLLM2), ASK))
    assert r.choices[0].message.tool_calls is None


def test_plain_chat_never_yields_tool_calls_without_tools(tiny_server):
    r = tiny_server.client().chat.completions.create(model="x", messages=ASK, max_tokens=20, temperature=0)
    assert r.choices[0].message.tool_calls is None and r.choices[0].finish_reason in ("stop", "length")


@pytest.fixture(scope="module")
def qwen_server():
    require_model(QWEN_05B)
    s = AugurServer(QWEN_05B, "--parallel", "2", "--ctx", "2048")
    yield s
    assert s.stop() == 0, s.final_stderr[-4000:]


def test_qwen_tool_call(qwen_server):
    """Fast enough for `make test` (~3 s) when the model is fetched; skipped
    otherwise."""
    c = qwen_server.client()
    r = c.chat.completions.create(model="x", messages=ASK, tools=[WEATHER], max_tokens=60, temperature=0)
    # the template rendered the tools itself
    assert r.usage.prompt_tokens == n_tokens(qwen_server, hf_render(gguf_template(QWEN_05B), ASK, [WEATHER]))
    ch = r.choices[0]
    assert ch.finish_reason == "tool_calls", ch
    assert ch.message.content is None
    [call] = ch.message.tool_calls
    assert call.type == "function" and call.id.startswith("call_")
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris"}


@pytest.mark.slow
def test_qwen_tool_call_streamed(qwen_server):
    c = qwen_server.client()
    chunks = list(c.chat.completions.create(model="x", messages=ASK, tools=[WEATHER], max_tokens=60, temperature=0,
                                            stream=True))
    content = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert "{" not in content  # the call never leaks out as text
    calls = [tc for ch in chunks if ch.choices and ch.choices[0].delta.tool_calls for tc in ch.choices[0].delta.tool_calls]
    assert len(calls) == 1 and calls[0].index == 0
    assert calls[0].function.name == "get_weather" and json.loads(calls[0].function.arguments) == {"city": "Paris"}
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


@pytest.mark.slow
def test_qwen_tool_result_turn(qwen_server):
    c = qwen_server.client()
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    msgs = ASK + [{"role": "assistant", "content": None, "tool_calls": [call]},
                  {"role": "tool", "tool_call_id": "call_1", "content": "18 degrees Celsius and sunny"}]
    r = c.chat.completions.create(model="x", messages=msgs, tools=[WEATHER], max_tokens=40, temperature=0)
    ref = [ASK[0], {"role": "assistant", "content": None,
                    "tool_calls": [{"id": "call_1", "type": "function",
                                    "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
           msgs[2]]
    assert r.usage.prompt_tokens == n_tokens(qwen_server, hf_render(gguf_template(QWEN_05B), ref, [WEATHER]))
    # (this 0.5B coder model tends to call the tool again rather than answer:
    # either way the answer must be well-formed)
    ch = r.choices[0]
    if ch.message.tool_calls:
        assert ch.finish_reason == "tool_calls"
        assert all(json.loads(tc.function.arguments) is not None for tc in ch.message.tool_calls)
    else:
        assert isinstance(ch.message.content, str) and ch.finish_reason in ("stop", "length")
