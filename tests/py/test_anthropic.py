"""augur serve: Anthropic's Messages API (POST /v1/messages), driven by the
official `anthropic` client, unchanged, against SmolLM2.

References: prompts are checked against the model's own chat template
rendered by Python's jinja2 (test_server_tools.hf_render, the way Hugging
Face renders it) and tokenized; generated text against the OpenAI endpoint
for the same conversation (same rendering, so the same greedy text), and
stop sequences against Python's own string search over the unstopped text.
Recent clients no longer take sampling parameters as arguments, so
temperature goes in extra_body (the API field is unchanged)."""
import http.client
import json
import socket
import threading

import anthropic
import pytest
from anthropic.types import Message

from conftest import SMOLLM2, TINY_GGUF, AugurServer, require_model
from test_server import post
from test_server_load import metrics, wait_idle
from test_server_tools import generic_tools_system, gguf_template, hf_render

GREEDY = {"temperature": 0}
ASK = [{"role": "user", "content": "What is the capital of France?"}]
SYSTEM = "You are a helpful geography teacher."
WEATHER = {"name": "get_weather", "description": "Get the current weather in a city",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
# the same tool as the OpenAI API spells it (what the server's tool prompt shows)
WEATHER_OPENAI = {"type": "function", "function": {"name": WEATHER["name"], "description": WEATHER["description"],
                                                   "parameters": WEATHER["input_schema"]}}


def client(server, api_key="none", **kw):
    return anthropic.Anthropic(base_url=server.base, api_key=api_key, max_retries=0, timeout=120, **kw)


def reference_tokens(server, messages):
    """Prompt tokens of `messages` rendered by jinja2 with SmolLM2's template."""
    text = hf_render(gguf_template(SMOLLM2), messages)
    return len(post(server, "/tokenize", {"content": text, "add_special": True, "parse_special": True})[1]["tokens"])


def prompt_tokens(usage):
    """Anthropic counts prompt tokens read from the cache apart from input_tokens."""
    return usage.input_tokens + usage.cache_read_input_tokens + usage.cache_creation_input_tokens


def openai_text(server, messages, max_tokens):
    r = server.client().chat.completions.create(model="x", messages=messages, max_tokens=max_tokens, temperature=0)
    return r.choices[0].message.content, r.choices[0].finish_reason


def raw_sse(server, body, headers=None):
    """POSTs a streaming request and returns its (event name, data) pairs, in order."""
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    conn.request("POST", "/v1/messages", body=json.dumps(body),
                 headers={"Content-Type": "application/json", **(headers or {})})
    r = conn.getresponse()
    assert r.status == 200 and r.headers["Content-Type"].split(";")[0] == "text/event-stream"
    text = r.read().decode()
    conn.close()
    events = []
    for frame in text.split("\n\n"):
        if not frame.strip():
            continue
        lines = dict(line.split(": ", 1) for line in frame.split("\n"))
        events.append((lines["event"], json.loads(lines["data"])))
    return events


# ---- messages ----

def test_message_matches_openai_endpoint(smol_server):
    """Same conversation, same template rendering: the same greedy text as
    /v1/chat/completions; a repeat reads the prompt from the prefix cache."""
    c = client(smol_server)
    msgs = [{"role": "system", "content": SYSTEM}] + ASK
    m = c.messages.create(model="x", max_tokens=24, system=SYSTEM, messages=ASK, extra_body=GREEDY)
    assert m.type == "message" and m.role == "assistant" and m.id.startswith("msg_")
    assert m.model == smol_server.model_id
    [block] = m.content
    assert block.type == "text" and block.text
    want_text, want_finish = openai_text(smol_server, msgs, 24)
    assert block.text == want_text
    assert m.stop_reason == {"length": "max_tokens", "stop": "end_turn"}[want_finish]
    assert m.stop_sequence is None
    assert prompt_tokens(m.usage) == reference_tokens(smol_server, msgs)
    assert 1 <= m.usage.output_tokens <= 24
    again = c.messages.create(model="x", max_tokens=24, system=SYSTEM, messages=ASK, extra_body=GREEDY)
    assert again.content[0].text == block.text  # temperature 0 is deterministic
    assert again.usage.cache_read_input_tokens > 0
    assert prompt_tokens(again.usage) == prompt_tokens(m.usage)


def test_system_blocks_and_multi_turn(smol_server):
    """system as a list of text blocks, an earlier assistant turn and text
    blocks in user turns: rendered as the OpenAI messages they stand for."""
    c = client(smol_server)
    system = [{"type": "text", "text": "You are terse."}, {"type": "text", "text": "Answer in English."}]
    turns = [{"role": "user", "content": "Name a French city."},
             {"role": "assistant", "content": [{"type": "text", "text": "Lyon."}]},
             {"role": "user", "content": [{"type": "text", "text": "And another one?"}]}]
    m = c.messages.create(model="x", max_tokens=16, system=system, messages=turns, extra_body=GREEDY)
    # the chat API joins text parts with a newline
    msgs = [{"role": "system", "content": "You are terse.\nAnswer in English."},
            {"role": "user", "content": "Name a French city."}, {"role": "assistant", "content": "Lyon."},
            {"role": "user", "content": "And another one?"}]
    assert prompt_tokens(m.usage) == reference_tokens(smol_server, msgs)
    assert m.content[0].text == openai_text(smol_server, msgs, 16)[0]


def test_prefill_continues_the_assistant_turn(smol_server):
    """A final assistant message is the start of the reply: the output is
    what the model writes after the rendered prompt plus that text."""
    prefill = "The capital of France is"
    m = client(smol_server).messages.create(model="x", max_tokens=12, extra_body=GREEDY,
                                            messages=ASK + [{"role": "assistant", "content": prefill}])
    prompt = hf_render(gguf_template(SMOLLM2), ASK) + prefill
    r = smol_server.client().completions.create(model="x", prompt=prompt, max_tokens=12, temperature=0)
    assert m.content[0].text == r.choices[0].text
    assert prompt_tokens(m.usage) == r.usage.prompt_tokens


def test_max_tokens_stop_reason(smol_server):
    m = client(smol_server).messages.create(model="x", max_tokens=3, messages=ASK, extra_body=GREEDY)
    assert m.stop_reason == "max_tokens" and m.usage.output_tokens == 3


def test_ignore_eos_runs_past_the_answer(smol_server):
    # sampled answers mostly end within a few tokens (the greedy one loops);
    # take the first seed whose answer ends, then the same seed with
    # ignore_eos keeps going past the end, through the same tokens
    c = client(smol_server)
    for seed in range(1, 17):
        short = c.messages.create(model="x", max_tokens=48, messages=ASK, extra_body={"seed": seed})
        if short.stop_reason == "end_turn":
            break
    assert short.stop_reason == "end_turn"
    m = c.messages.create(model="x", max_tokens=48, messages=ASK, extra_body={"seed": seed, "ignore_eos": True})
    assert m.stop_reason == "max_tokens" and m.usage.output_tokens == 48
    assert m.content[0].text.startswith(short.content[0].text)
    expect_error(anthropic.BadRequestError,
                 lambda: c.messages.create(model="x", max_tokens=4, messages=ASK, extra_body={"ignore_eos": "yes"}),
                 "invalid_request_error", "ignore_eos")


def first_stop(text, stops):
    """The stop string whose first occurrence ends first (ties: the longer)."""
    found = [(text.index(s) + len(s), -len(s), s) for s in stops if s in text]
    return min(found)[2] if found else None


def test_stop_sequences(smol_server):
    c = client(smol_server)
    full = c.messages.create(model="x", max_tokens=40, messages=ASK, extra_body=GREEDY).content[0].text
    words = full.split()
    assert len(words) >= 6, full
    # two stops that both occur; the second in the list comes first in the text
    late, early = words[5], words[2]
    stops = ["never-in-this-text", late, early]
    want = first_stop(full, stops)
    m = c.messages.create(model="x", max_tokens=40, messages=ASK, stop_sequences=stops, extra_body=GREEDY)
    assert m.stop_reason == "stop_sequence" and m.stop_sequence == want
    assert m.content[0].text == full[:full.index(want)]
    assert want not in m.content[0].text
    # streamed: the stop sequence comes with message_delta
    events = raw_sse(smol_server, {"model": "x", "max_tokens": 40, "messages": ASK, "stop_sequences": stops,
                                   "stream": True, "temperature": 0})
    delta = [d for name, d in events if name == "message_delta"][0]["delta"]
    assert delta == {"stop_reason": "stop_sequence", "stop_sequence": want}
    text = "".join(d["delta"]["text"] for name, d in events if name == "content_block_delta")
    assert text == m.content[0].text


# ---- streaming ----

def test_stream_event_sequence(smol_server):
    """The raw events in Anthropic's order, and the same text and usage as
    the same request not streamed."""
    body = {"model": "x", "max_tokens": 20, "system": SYSTEM, "messages": ASK, "temperature": 0}
    full = client(smol_server).messages.create(**{k: v for k, v in body.items() if k != "temperature"},
                                               extra_body=GREEDY)
    events = raw_sse(smol_server, {**body, "stream": True})
    names = [n for n, _ in events]
    assert names[:3] == ["message_start", "ping", "content_block_start"]
    assert names[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert set(names[3:-3]) == {"content_block_delta"}
    assert all(n == d["type"] for n, d in events)
    start = events[0][1]["message"]
    assert start["role"] == "assistant" and start["content"] == [] and start["stop_reason"] is None
    assert start["id"].startswith("msg_")
    assert prompt_tokens(anthropic.types.Usage(**start["usage"])) == prompt_tokens(full.usage)
    assert events[2][1] == {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}
    deltas = [d for n, d in events if n == "content_block_delta"]
    assert all(d["index"] == 0 and d["delta"]["type"] == "text_delta" for d in deltas)
    assert "".join(d["delta"]["text"] for d in deltas) == full.content[0].text
    message_delta = events[-2][1]
    assert message_delta["delta"] == {"stop_reason": full.stop_reason, "stop_sequence": None}
    assert message_delta["usage"]["output_tokens"] == full.usage.output_tokens


def test_stream_helper(smol_server):
    """The client's MessageStream accumulates the same message."""
    c = client(smol_server)
    full = c.messages.create(model="x", max_tokens=20, messages=ASK, extra_body=GREEDY)
    with c.messages.stream(model="x", max_tokens=20, messages=ASK, extra_body=GREEDY) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == full.content[0].text == final.content[0].text
    assert final.stop_reason == full.stop_reason and final.usage.output_tokens == full.usage.output_tokens
    # the raw events through the client: `stream=True`
    types = [e.type for e in c.messages.create(model="x", max_tokens=5, messages=ASK, stream=True,
                                               extra_body=GREEDY)]
    assert types[0] == "message_start" and types[-1] == "message_stop" and "content_block_delta" in types


def test_client_disconnect_mid_stream(smol_server):
    before = metrics(smol_server)["augur_client_cancels_total"]
    # ignore_eos: the short answer must not end (and flush) before the server
    # sees the closed socket; a race that CI's 2 cores once lost
    body = json.dumps({"model": "x", "max_tokens": 400, "messages": ASK, "stream": True, "ignore_eos": True,
                       "metadata": {"user_id": "u-1"}}).encode()
    for _ in range(2):
        s = socket.create_connection(("127.0.0.1", smol_server.port), timeout=30)
        s.sendall(b"POST /v1/messages HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        got = b""
        while got.count(b"event: content_block_delta") < 3:
            chunk = s.recv(4096)
            assert chunk, got
            got += chunk
        s.close()
    m = wait_idle(smol_server)
    assert m["augur_client_cancels_total"] >= before + 2
    # still serving, with the same greedy output
    c = client(smol_server)
    a = c.messages.create(model="x", max_tokens=8, messages=ASK, extra_body=GREEDY)
    assert a.content[0].text == openai_text(smol_server, ASK, 8)[0]


# ---- tools ----

def test_tool_use_round_trip(smol_server):
    """A forced tool gives a tool_use block with its input as a dict; the
    follow-up with tool_result is rendered the way the chat API renders the
    same exchange (SmolLM2's template has no tools: Hermes-style text)."""
    c = client(smol_server)
    m = c.messages.create(model="x", max_tokens=60, messages=ASK, tools=[WEATHER],
                          tool_choice={"type": "tool", "name": "get_weather"}, extra_body=GREEDY)
    assert m.stop_reason == "tool_use", m
    [call] = [b for b in m.content if b.type == "tool_use"]
    assert call.name == "get_weather" and call.id.startswith("toolu_")
    assert isinstance(call.input, dict)
    # streamed: the same call, its input as input_json_delta
    with c.messages.stream(model="x", max_tokens=60, messages=ASK, tools=[WEATHER],
                           tool_choice={"type": "any"}, extra_body=GREEDY) as stream:
        events = list(stream)
        final = stream.get_final_message()
    assert [b.type for b in final.content] == ["tool_use"] and final.stop_reason == "tool_use"
    assert final.content[0].input == call.input and final.content[0].name == "get_weather"
    assert any(e.type == "input_json" for e in events)

    follow = ASK + [{"role": "assistant", "content": [b.model_dump(include={"type", "id", "name", "input"})
                                                      for b in m.content]},
                    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id,
                                                  "content": "18 C, sunny"}]}]
    r = c.messages.create(model="x", max_tokens=8, messages=follow, tools=[WEATHER], extra_body=GREEDY)
    assert r.content and r.stop_reason in ("end_turn", "max_tokens", "tool_use")
    spelled = json.dumps({"name": "get_weather", "arguments": call.input}, separators=(",", ":"), ensure_ascii=False)
    ref = [{"role": "system", "content": generic_tools_system([WEATHER_OPENAI])}, ASK[0],
           {"role": "assistant", "content": "<tool_call>\n" + spelled + "\n</tool_call>"},
           {"role": "user", "content": "<tool_response>\n18 C, sunny\n</tool_response>"}]
    assert prompt_tokens(r.usage) == reference_tokens(smol_server, ref)
    # tool_choice none: the plain conversation
    r = c.messages.create(model="x", max_tokens=2, messages=ASK, tools=[WEATHER], tool_choice={"type": "none"},
                          extra_body=GREEDY)
    assert prompt_tokens(r.usage) == reference_tokens(smol_server, ASK)
    assert all(b.type == "text" for b in r.content)


def test_count_tokens(smol_server):
    c = client(smol_server)
    n = c.messages.count_tokens(model="x", system=SYSTEM, messages=ASK).input_tokens
    assert n == reference_tokens(smol_server, [{"role": "system", "content": SYSTEM}] + ASK)
    n = c.messages.count_tokens(model="x", messages=ASK, tools=[WEATHER]).input_tokens
    assert n == reference_tokens(smol_server, [{"role": "system", "content": generic_tools_system([WEATHER_OPENAI])}]
                                 + ASK)


def test_output_config_format_is_a_json_schema(smol_server):
    """output_config.format makes the reply one JSON value of the schema, as
    OpenAI's response_format does; effort (a reasoning model's) is a 400."""
    c = client(smol_server)
    schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20},
                                               "days": {"type": "integer", "minimum": 1, "maximum": 9}},
              "required": ["city", "days"]}
    m = c.messages.create(model="x", max_tokens=60, messages=ASK,
                          extra_body={"temperature": 0,
                                      "output_config": {"format": {"type": "json_schema", "schema": schema}}})
    v = json.loads(m.content[0].text)
    assert isinstance(v["city"], str) and 1 <= v["days"] <= 9 and set(v) == {"city", "days"}
    expect_error(anthropic.BadRequestError,
                 lambda: c.messages.create(model="x", max_tokens=5, messages=ASK,
                                           extra_body={"output_config": {"effort": "high"}}),
                 "invalid_request_error", "output_config.effort")


# ---- errors ----

def expect_error(exc, call, error_type, needle):
    with pytest.raises(exc) as e:
        call()
    body = e.value.body
    assert body["type"] == "error" and body["error"]["type"] == error_type, body
    assert needle in body["error"]["message"], body
    return e.value


def test_errors_have_anthropics_shape(smol_server):
    c = client(smol_server)
    expect_error(anthropic.BadRequestError,
                 lambda: c.post("/v1/messages", cast_to=Message, body={"model": "x", "messages": ASK}),
                 "invalid_request_error", "max_tokens")
    expect_error(anthropic.BadRequestError,
                 lambda: c.messages.create(model="x", max_tokens=5,
                                           messages=[{"role": "system", "content": "hi"}]),
                 "invalid_request_error", "messages.0.role")
    expect_error(anthropic.BadRequestError,
                 lambda: c.post("/v1/messages", cast_to=Message, content=b'{"model": "x", "max_tokens": ',
                                options={"headers": {"Content-Type": "application/json"}}),
                 "invalid_request_error", "malformed JSON")
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}
    expect_error(anthropic.BadRequestError,
                 lambda: c.messages.create(model="x", max_tokens=5,
                                           messages=[{"role": "user", "content": [image]}]),
                 "invalid_request_error", "text only")
    expect_error(anthropic.BadRequestError,
                 lambda: c.messages.create(model="x", max_tokens=5, messages=ASK, extra_body={"temperature": 1.5}),
                 "invalid_request_error", "temperature")
    expect_error(anthropic.BadRequestError,
                 lambda: c.messages.create(model="x", max_tokens=5, messages=ASK,
                                           tool_choice={"type": "tool", "name": "nope"}, tools=[WEATHER]),
                 "invalid_request_error", "nope")
    expect_error(anthropic.NotFoundError, lambda: c.post("/v1/messages/nope", cast_to=Message, body={}),
                 "not_found_error", "unknown route")
    # the server is fine afterwards
    assert c.messages.create(model="x", max_tokens=2, messages=ASK).content


def test_api_key_header():
    require_model(SMOLLM2)
    s = AugurServer(None, "--api-key", "sekret")
    try:
        expect_error(anthropic.AuthenticationError,
                     lambda: client(s, api_key="wrong").messages.create(model="x", max_tokens=2, messages=ASK),
                     "authentication_error", "x-api-key")
        # x-api-key (the client's default) and Authorization: Bearer both work
        assert client(s, api_key="sekret").messages.create(model="x", max_tokens=2, messages=ASK).content
        bearer = anthropic.Anthropic(base_url=s.base, auth_token="sekret", max_retries=0, timeout=120)
        assert bearer.messages.create(model="x", max_tokens=2, messages=ASK).content
        assert s.client(api_key="sekret").models.list().data[0].id == s.model_id  # OpenAI's clients too
    finally:
        assert s.stop() == 0, s.final_stderr[-4000:]


def u(content):
    return {"role": "user", "content": content}


BAD_PROMPTS = [
    {"max_tokens": 5, "messages": [u("hi")], "model": 5},
    {"max_tokens": 5, "messages": "hi"},
    {"max_tokens": 5, "messages": []},
    {"max_tokens": 5},
    {"max_tokens": 5, "messages": ["hi"]},
    {"max_tokens": 5, "messages": [u(None)]},
    {"max_tokens": 5, "messages": [u(5)]},
    {"max_tokens": 5, "messages": [u([])]},
    {"max_tokens": 5, "messages": [u(["text"])]},
    {"max_tokens": 5, "messages": [u([{"text": "no type"}])]},
    {"max_tokens": 5, "messages": [u([{"type": "text", "text": 5}])]},
    {"max_tokens": 5, "messages": [u([{"type": "tool_result", "content": "x"}])]},
    {"max_tokens": 5, "messages": [u([{"type": "tool_result", "tool_use_id": "t", "content": 5}])]},
    {"max_tokens": 5, "messages": [u([{"type": "tool_result", "tool_use_id": "t", "is_error": "no"}])]},
    {"max_tokens": 5, "messages": [u([{"type": "tool_result", "tool_use_id": "t",
                                       "content": [{"type": "image", "source": {}}]}])]},
    {"max_tokens": 5, "messages": [u([{"type": "tool_use", "id": "t", "name": "f", "input": {}}])]},
    {"max_tokens": 5, "messages": [u("hi"), {"role": "assistant", "content": [
        {"type": "tool_use", "id": "t", "name": "f", "input": "not an object"}]}]},
    {"max_tokens": 5, "messages": [u("hi"), {"role": "assistant", "content": [
        {"type": "tool_result", "tool_use_id": "t", "content": "x"}]}]},
    {"max_tokens": 5, "messages": [{"content": "no role"}]},
    {"max_tokens": 5, "messages": [{"role": "tool", "content": "x"}]},
    {"max_tokens": 5, "messages": [u("hi")], "system": 5},
    {"max_tokens": 5, "messages": [u("hi")], "system": [{"type": "image", "source": {}}]},
    {"max_tokens": 5, "messages": [u("hi")], "tools": {"name": "f"}},
    {"max_tokens": 5, "messages": [u("hi")], "tools": [{"name": "f"}]},
    {"max_tokens": 5, "messages": [u("hi")], "tools": [{"name": "", "input_schema": {}}]},
    {"max_tokens": 5, "messages": [u("hi")], "tools": [{"type": "bash_20250124", "name": "bash"}]},
    {"max_tokens": 5, "messages": [u("hi")], "tools": [WEATHER], "tool_choice": "auto"},
    {"max_tokens": 5, "messages": [u("hi")], "tools": [WEATHER], "tool_choice": {"type": "bogus"}},
    {"max_tokens": 5, "messages": [u("hi")], "tools": [WEATHER], "tool_choice": {"type": "tool"}},
    {"max_tokens": 5, "messages": [u("hi")], "tool_choice": {"type": "any"}},
]
# fields only /v1/messages reads (count_tokens ignores them)
BAD_OPTIONS = [
    {"max_tokens": 5, "messages": [u("hi")], "stop_sequences": "END"},
    {"max_tokens": 5, "messages": [u("hi")], "stop_sequences": [1]},
    {"max_tokens": 5, "messages": [u("hi")], "stop_sequences": ["s"] * 17},
    {"max_tokens": 0, "messages": [u("hi")]},
    {"max_tokens": "5", "messages": [u("hi")]},
    {"max_tokens": 5, "messages": [u("hi")], "stream": "yes"},
    {"max_tokens": 5, "messages": [u("hi")], "metadata": "x"},
    {"max_tokens": 5, "messages": [u("hi")], "metadata": {"user_id": 5}},
    {"max_tokens": 5, "messages": [u("hi")], "top_k": "a"},
    {"max_tokens": 5, "messages": [u("hi")], "top_p": 2},
]


def test_bad_requests_are_clear_400s(smol_server):
    """Every malformed field: a 400 in Anthropic's shape that names it, and
    the server goes on."""
    def send(body, path="/v1/messages"):
        conn = http.client.HTTPConnection("127.0.0.1", smol_server.port, timeout=30)
        conn.request("POST", path, body=body, headers={"Content-Type": "application/json"})
        r = conn.getresponse()
        out = r.status, json.loads(r.read())
        conn.close()
        return out

    not_json = [b"", b"[1]", b"{\"max_tokens\": 5, \"messages\": \"\xff\"}"]
    both = ("/v1/messages", "/v1/messages/count_tokens")
    cases = [(json.dumps(b), both) for b in BAD_PROMPTS] + [(b, both) for b in not_json] + \
        [(json.dumps(b), both[:1]) for b in BAD_OPTIONS]
    for body, paths in cases:
        for path in paths:
            status, err = send(body, path)
            assert status == 400, (path, body, err)
            assert err["type"] == "error" and err["error"]["type"] == "invalid_request_error", err
            assert len(err["error"]["message"]) > 10, err
    for body in BAD_OPTIONS:  # the prompt is fine
        assert send(json.dumps(body), both[1])[0] == 200
    assert client(smol_server).messages.create(model="x", max_tokens=2, messages=ASK).content


def test_queue_full_is_529_overloaded(augur_server):
    """One sequence at a time, one waiting: the overflow of a burst gets
    Anthropic's 529 overloaded_error with Retry-After, the rest 200s."""
    s = augur_server(TINY_GGUF, "--parallel", "1", "--max-queue", "1", "--ctx", "256")
    results = []

    def one():
        conn = http.client.HTTPConnection("127.0.0.1", s.port, timeout=60)
        conn.request("POST", "/v1/messages", headers={"Content-Type": "application/json"},
                     body=json.dumps({"model": "x", "max_tokens": 200, "messages": [u("Once upon a time")]}))
        r = conn.getresponse()
        results.append((r.status, r.headers.get("Retry-After"), json.loads(r.read())))
        conn.close()

    threads = [threading.Thread(target=one) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    codes = sorted(r[0] for r in results)
    assert set(codes) <= {200, 529} and codes.count(200) >= 1 and codes.count(529) >= 1, codes
    for status, retry_after, body in results:
        if status == 529:
            assert retry_after == "1" and body["type"] == "error"
            assert body["error"]["type"] == "overloaded_error", body
        else:
            assert body["type"] == "message"


def test_messages_parse_with_a_pydantic_model(smol_server):
    """The client's messages.parse(output_format=Model) sends
    output_config.format: enforced, so the reply parses into the model."""
    from pydantic import BaseModel

    class Trip(BaseModel):
        city: str
        days: int

    c = client(smol_server)
    m = c.messages.parse(model="x", max_tokens=60, messages=ASK, output_format=Trip, extra_body=GREEDY)
    assert isinstance(m.parsed_output, Trip)
    # streamed, the same text
    with c.messages.stream(model="x", max_tokens=60, messages=ASK, extra_body={
            "temperature": 0, "output_config": {"format": {"type": "json_schema",
                                                           "schema": Trip.model_json_schema()}}}) as s:
        text = s.get_final_message().content[0].text
    assert Trip.model_validate_json(text) == m.parsed_output


@pytest.mark.parametrize("schema, keyword", [
    ({"type": "string", "pattern": "^a+$"}, "pattern"),
    ({"type": "object", "properties": {"x": {"oneOf": [{"type": "string"}, {"type": "integer"}]}}}, "oneOf"),
    ({"type": "object", "minProperties": 1}, "minProperties"),
])
def test_output_config_unsupported_keyword_is_a_400_naming_it(smol_server, schema, keyword):
    c = client(smol_server)
    expect_error(anthropic.BadRequestError,
                 lambda: c.messages.create(model="x", max_tokens=5, messages=ASK, extra_body={
                     "output_config": {"format": {"type": "json_schema", "schema": schema}}}),
                 "invalid_request_error", f"'{keyword}'")
