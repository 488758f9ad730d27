"""augur serve: every error case has OpenAI's shape and the right status, and
no client fault yields a 5xx, a crash or a stall."""
import http.client
import json
import random
import socket
import threading
import time

import openai
import pytest

from conftest import SMOLLM2, TINY_GGUF, require_model


def raw(server, method, path, body=None, headers=None, timeout=60):
    """One request on a fresh connection; returns (status, headers, parsed JSON or bytes)."""
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=timeout)
    h = {"Content-Type": "application/json"}
    h.update(headers or {})
    if isinstance(body, (dict, list)):
        body = json.dumps(body)
    conn.request(method, path, body=body, headers=h)
    r = conn.getresponse()
    data = r.read()
    conn.close()
    try:
        data = json.loads(data)
    except ValueError:
        pass
    return r.status, r.headers, data


def assert_error(resp, status, param=None, code=None, contains=None):
    st, _, body = resp
    assert st == status, body
    err = body["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert isinstance(err["message"], str) and err["message"]
    if param is not None:
        assert err["param"] == param, err
    if code is not None:
        assert err["code"] == code, err
    if contains:
        assert contains in err["message"], err


CHAT = "/v1/chat/completions"
COMP = "/v1/completions"
MSG = [{"role": "user", "content": "Hi"}]


def test_malformed_json_reports_position(tiny_server):
    r = raw(tiny_server, "POST", CHAT, '{"messages": [}')
    assert_error(r, 400, code="invalid_json", contains="column 15")
    assert_error(raw(tiny_server, "POST", CHAT, "[1, 2]"), 400, code="invalid_json")
    assert_error(raw(tiny_server, "POST", CHAT, ""), 400, code="invalid_json")


def test_invalid_utf8_body(tiny_server):
    body = b'{"prompt": "caf\xc3 \xff", "max_tokens": 2}'
    assert_error(raw(tiny_server, "POST", COMP, body), 400, contains="UTF-8")


@pytest.mark.parametrize("field,value,param", [
    ("temperature", "hot", "temperature"),
    ("temperature", 2.5, "temperature"),
    ("temperature", -0.1, "temperature"),
    ("top_p", 1.5, "top_p"),
    ("top_k", 1.5, "top_k"),
    ("min_p", -1, "min_p"),
    ("n", 0, "n"),
    ("n", 9, "n"),  # more than --parallel 8
    ("n", "2", "n"),
    ("max_tokens", 0, "max_tokens"),
    ("max_tokens", -5, "max_tokens"),
    ("max_completion_tokens", "x", "max_completion_tokens"),
    ("presence_penalty", 3, "presence_penalty"),
    ("frequency_penalty", -2.5, "frequency_penalty"),
    ("repetition_penalty", 0, "repetition_penalty"),
    ("seed", 1.5, "seed"),
    ("stop", 5, "stop"),
    ("stop", ["a", 3], "stop"),
    ("stop", ["x"] * 17, "stop"),
    ("stream", "yes", "stream"),
    ("stream_options", 3, "stream_options"),
    ("logprobs", 1, "logprobs"),
    ("top_logprobs", 21, "top_logprobs"),
    ("logit_bias", {"abc": 1}, "logit_bias"),
    ("logit_bias", {"999999": 1}, "logit_bias"),
    ("logit_bias", {"5": 101}, "logit_bias"),
    ("logit_bias", [1], "logit_bias"),
    ("model", 5, "model"),
    ("tools", {"a": 1}, "tools"),
    ("tools", [{"type": "function"}], "tools[0]"),
    ("tool_choice", "sometimes", "tool_choice"),
    ("response_format", {"type": "json_schema", "json_schema": {"name": "x", "schema": {"pattern": "a"}}},
     "response_format.json_schema.schema"),
    ("response_format", "json_object", "response_format"),
])
def test_chat_bad_params(tiny_server, field, value, param):
    assert_error(raw(tiny_server, "POST", CHAT, {"messages": MSG, field: value}), 400, param=param)


@pytest.mark.parametrize("messages,param", [
    (None, "messages"),
    ("hi", "messages"),
    ([], "messages"),
    ([1], "messages[0]"),
    ([{"content": "x"}], "messages[0].role"),
    ([{"role": "wizard", "content": "x"}], "messages[0].role"),
    ([{"role": "user"}], "messages[0].content"),
    ([{"role": "user", "content": 5}], "messages[0].content"),
    ([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://x"}}]}], "messages[0].content"),
    ([{"role": "user", "content": [{"type": "text"}]}], "messages[0].content"),
    ([{"role": "assistant", "content": None, "tool_calls": [{"function": {}}]}], "messages[0].tool_calls"),
])
def test_chat_bad_messages(tiny_server, messages, param):
    body = {"max_tokens": 2}
    if messages is not None:
        body["messages"] = messages
    assert_error(raw(tiny_server, "POST", CHAT, body), 400, param=param)


def test_top_logprobs_needs_logprobs(tiny_server):
    assert_error(raw(tiny_server, "POST", CHAT, {"messages": MSG, "top_logprobs": 2}), 400, param="top_logprobs")


def test_tool_choice_unknown_function(tiny_server):
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    body = {"messages": MSG, "tools": tools, "tool_choice": {"type": "function", "function": {"name": "g"}}}
    assert_error(raw(tiny_server, "POST", CHAT, body), 400, param="tool_choice")


@pytest.mark.parametrize("prompt", [None, 5, [], [[]], ["a", 3], [1, -1], [1, 100000], {"a": 1}])
def test_completion_bad_prompt(tiny_server, prompt):
    body = {"max_tokens": 2}
    if prompt is not None:
        body["prompt"] = prompt
    assert_error(raw(tiny_server, "POST", COMP, body), 400, param="prompt")


def test_completion_bad_params(tiny_server):
    assert_error(raw(tiny_server, "POST", COMP, {"prompt": "a", "logprobs": 21}), 400, param="logprobs")
    assert_error(raw(tiny_server, "POST", COMP, {"prompt": "a", "logprobs": True}), 400, param="logprobs")
    assert_error(raw(tiny_server, "POST", COMP, {"prompt": "a", "echo": "no"}), 400, param="echo")
    assert_error(raw(tiny_server, "POST", COMP, {"prompt": "a", "best_of": 3}), 400, param="best_of")


def test_nulls_and_documented_fields_are_accepted(tiny_server):
    st, _, body = raw(tiny_server, "POST", CHAT, {"messages": MSG, "max_tokens": 2, "temperature": None,
                                                  "user": "u1", "stop": None})
    assert st == 200 and body["choices"][0]["message"]["role"] == "assistant"


MESSAGES = "/v1/messages"
COUNT = "/v1/messages/count_tokens"


def assert_anthropic_error(resp, status, contains):
    st, _, body = resp
    assert st == status, body
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error", body
    assert contains in body["error"]["message"], body


def test_unknown_field_is_a_400_naming_it(tiny_server):
    """A misspelled field used to be ignored, changing the request's meaning
    without a word ({"max_tok{ns": 8} ran to the end of the context; issue
    51). OpenAI's wording on the OpenAI routes, Anthropic's on its own."""
    for path, body in [(CHAT, {"messages": MSG}), (COMP, {"prompt": "Once"})]:
        r = raw(tiny_server, "POST", path, {**body, "max_tok{ns": 8})
        assert_error(r, 400, param="max_tok{ns", code="unknown_parameter",
                     contains="Unrecognized request argument supplied: max_tok{ns")
    for path in (MESSAGES, COUNT):
        r = raw(tiny_server, "POST", path, {"messages": MSG, "max_tokens": 8, "max_tok{ns": 8})
        assert_anthropic_error(r, 400, "max_tok{ns: Extra inputs are not permitted")
    # through the official client, as a caller's typo in extra_body arrives
    c = tiny_server.client()
    with pytest.raises(openai.BadRequestError) as e:
        c.chat.completions.create(model="x", messages=MSG, max_tokens=2, extra_body={"frobnicate": 1})
    assert e.value.code == "unknown_parameter" and "frobnicate" in str(e.value)


# Fields of the documented request schemas that cannot change the output:
# accepted, and the greedy text is the one without them.
IGNORED_CHAT = {"metadata": {"k": "v"}, "store": True, "user": "u1", "safety_identifier": "s",
                "prompt_cache_key": "k", "prompt_cache_retention": "24h", "prompt_cache_options": {"mode": "implicit"},
                "service_tier": "auto", "prediction": {"type": "content", "content": "Hello"},
                "modalities": ["text"], "parallel_tool_calls": True, "functions": [], "audio": None}
IGNORED_COMP = {"user": "u1", "suffix": ""}
IGNORED_MSG = {"metadata": {"user_id": "u"}, "service_tier": "auto", "inference_geo": "us", "speed": "standard",
               "cache_control": {"type": "ephemeral"}, "diagnostics": None, "user_profile_id": "p",
               "workspace_id": "w", "thinking": {"type": "disabled"}, "mcp_servers": [], "container": None}


def test_fields_that_cannot_change_the_output_are_accepted(tiny_server):
    base = {"messages": MSG, "max_tokens": 6, "temperature": 0}
    st, _, a = raw(tiny_server, "POST", CHAT, base)
    st2, _, b = raw(tiny_server, "POST", CHAT, {**base, **IGNORED_CHAT})
    assert st == st2 == 200, b
    assert a["choices"][0]["message"]["content"] == b["choices"][0]["message"]["content"]
    base = {"prompt": "Once upon", "max_tokens": 6, "temperature": 0}
    st, _, a = raw(tiny_server, "POST", COMP, base)
    st2, _, b = raw(tiny_server, "POST", COMP, {**base, **IGNORED_COMP})
    assert st == st2 == 200, b
    assert a["choices"][0]["text"] == b["choices"][0]["text"]
    base = {"messages": MSG, "max_tokens": 6, "temperature": 0}
    st, _, a = raw(tiny_server, "POST", MESSAGES, base)
    st2, _, b = raw(tiny_server, "POST", MESSAGES, {**base, **IGNORED_MSG})
    assert st == st2 == 200, b
    assert a["content"] == b["content"]
    st, _, b = raw(tiny_server, "POST", COUNT, {**base, **IGNORED_MSG})
    assert st == 200 and b["input_tokens"] > 0


@pytest.mark.parametrize("path,field,value", [
    (CHAT, "reasoning_effort", "low"),
    (CHAT, "verbosity", "low"),
    (CHAT, "audio", {"voice": "alloy", "format": "mp3"}),
    (CHAT, "modalities", ["text", "audio"]),
    (CHAT, "web_search_options", {}),
    (CHAT, "moderation", {"model": "omni-moderation-latest"}),
    (CHAT, "functions", [{"name": "f", "parameters": {}}]),
    (CHAT, "function_call", "auto"),
    (COMP, "suffix", "the end"),
    (MESSAGES, "thinking", {"type": "enabled", "budget_tokens": 2048}),
    (MESSAGES, "container", "c1"),
    (MESSAGES, "mcp_servers", [{"type": "url", "url": "https://x", "name": "x"}]),
    (MESSAGES, "context_management", {"edits": []}),
])
def test_unsupported_fields_are_a_400(tiny_server, path, field, value):
    body = {"prompt": "Once"} if path == COMP else {"messages": MSG, "max_tokens": 4}
    r = raw(tiny_server, "POST", path, {**body, field: value})
    if path == MESSAGES:
        assert_anthropic_error(r, 400, f"'{field}' is not supported")
    else:
        assert_error(r, 400, param=field, code="unsupported_parameter", contains=f"'{field}' is not supported")


def test_lenient_fields_flag(augur_server):
    s = augur_server(TINY_GGUF, "--lenient-fields")
    for path, body in [(CHAT, {"messages": MSG}), (COMP, {"prompt": "Once"}), (MESSAGES, {"messages": MSG})]:
        st, _, b = raw(s, "POST", path, {**body, "max_tokens": 2, "max_tok{ns": 8, "reasoning_effort": "high",
                                         "thinking": {"type": "enabled", "budget_tokens": 2048}})
        assert st == 200, b
    # NUL stays refused where it cannot be represented, lenient or not
    assert_error(raw(s, "POST", COMP, {"prompt": "Once", "stop": "a\u0000b"}), 400, param="stop")


def test_nul_in_text_is_accepted(tiny_server):
    """\u0000 is valid JSON (issue 51: it was refused with a message naming a
    library flag). Text keeps it, tokenized as the tokenizer does byte 0;
    where a string is read as a C string the request is refused with a
    message about the content."""
    text = "Once upon\u0000a time"
    want = raw(tiny_server, "POST", "/tokenize", {"content": text, "add_special": True})[2]["tokens"]
    st, _, b = raw(tiny_server, "POST", COMP, {"prompt": text, "max_tokens": 2, "echo": True, "temperature": 0})
    assert st == 200, b
    assert b["usage"]["prompt_tokens"] == len(want) == len(raw(tiny_server, "POST", "/tokenize", {
        "content": "Once upona time", "add_special": True})[2]["tokens"]) + 1
    assert b["choices"][0]["text"].startswith(text)
    st, _, b = raw(tiny_server, "POST", CHAT, {"messages": [{"role": "user", "content": "Hi\u0000there"}],
                                               "max_tokens": 2})
    assert st == 200, b
    st, _, b = raw(tiny_server, "POST", MESSAGES, {"system": "be\u0000brief", "max_tokens": 2, "messages": [
        {"role": "user", "content": [{"type": "text", "text": "Hi\u0000"}]}]})
    assert st == 200, b
    for path, body, param in [
        (COMP, {"prompt": "Once", "stop": ["x", "a\u0000b"]}, "stop[1]"),
        (CHAT, {"messages": [{"role": "us\u0000er", "content": "Hi"}]}, "messages[0].role"),
        (CHAT, {"messages": MSG, "tools": [{"type": "function", "function": {"name": "f\u0000g"}}]},
         "tools[0].function.name"),
    ]:
        r = raw(tiny_server, "POST", path, body)
        assert_error(r, 400, param=param, contains="NUL character")
        assert "JSON_" not in r[2]["error"]["message"]
    r = raw(tiny_server, "POST", MESSAGES, {"messages": MSG, "max_tokens": 2, "stop_sequences": ["\u0000"]})
    assert_anthropic_error(r, 400, "'stop_sequences.0' contains a NUL character")
    # a key cannot hold one (the JSON library refuses): said about the content
    r = raw(tiny_server, "POST", COMP, '{"prompt": "a", "x\\u0000y": 1}')
    assert_error(r, 400, code="invalid_json", contains="NUL character")
    assert "JSON_" not in r[2]["error"]["message"]


def test_context_length_exceeded(tiny_server):
    long = "Once upon a time there was a big dog. " * 300  # > 2048 tokens
    assert_error(raw(tiny_server, "POST", COMP, {"prompt": long}), 400, param="prompt",
                 code="context_length_exceeded")
    assert_error(raw(tiny_server, "POST", CHAT, {"messages": [{"role": "user", "content": long}]}), 400,
                 param="messages", code="context_length_exceeded")
    c = tiny_server.client()
    with pytest.raises(openai.BadRequestError) as e:
        c.completions.create(model="x", prompt=long)
    assert e.value.code == "context_length_exceeded"


def test_404_405(tiny_server):
    assert_error(raw(tiny_server, "GET", "/v1/nothing"), 404, code="not_found")
    assert_error(raw(tiny_server, "POST", "/nothing"), 404)
    st, headers, body = raw(tiny_server, "GET", CHAT)
    assert_error((st, headers, body), 405)
    assert "POST" in headers["Allow"]
    assert_error(raw(tiny_server, "DELETE", "/v1/models"), 405)
    assert_error(raw(tiny_server, "POST", "/health", {}), 405)
    assert_error(raw(tiny_server, "GET", "/v1/models/other-model"), 404, code="model_not_found")
    with pytest.raises(openai.NotFoundError):
        tiny_server.client().models.retrieve("nope")


def test_413_body_too_large(tiny_server):
    big = json.dumps({"prompt": "x" * (9 << 20)})
    assert_error(raw(tiny_server, "POST", COMP, big), 413, code="request_too_large")
    # the server is fine afterwards
    st, _, _ = raw(tiny_server, "GET", "/health")
    assert st == 200


def test_413_chunked_upload(augur_server):
    s = augur_server(TINY_GGUF, "--max-body", "1000")
    conn = http.client.HTTPConnection("127.0.0.1", s.port, timeout=30)
    body = (json.dumps({"prompt": "y" * 5000}).encode(),)
    conn.request("POST", COMP, body=iter(body), headers={"Content-Type": "application/json"},
                 encode_chunked=True)
    r = conn.getresponse()
    assert r.status == 413 and json.loads(r.read())["error"]["code"] == "request_too_large"
    st, _, _ = raw(s, "POST", COMP, {"prompt": "Once", "max_tokens": 2})
    assert st == 200


def test_oversized_header_is_a_4xx(tiny_server):
    conn = socket.create_connection(("127.0.0.1", tiny_server.port), timeout=30)
    conn.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 100000 + b"\r\n\r\n")
    data = b""
    try:
        while b"\r\n" not in data:
            chunk = conn.recv(4096)
            if not chunk:
                break
            data += chunk
    except ConnectionResetError:
        pass
    conn.close()
    if data:
        status = int(data.split()[1])
        assert 400 <= status < 500
    assert raw(tiny_server, "GET", "/health")[0] == 200


def test_api_key(augur_server):
    s = augur_server(TINY_GGUF, "--api-key", "sekret")
    assert_error(raw(s, "GET", "/v1/models"), 401, code="invalid_api_key")
    assert_error(raw(s, "POST", COMP, {"prompt": "a"}, {"Authorization": "Bearer wrong"}), 401)
    assert_error(raw(s, "POST", COMP, {"prompt": "a"}, {"Authorization": "Basic sekret"}), 401)
    assert_error(raw(s, "GET", "/metrics", None, {"Authorization": "Bearer sekre"}), 401)
    assert raw(s, "GET", "/health")[0] == 200  # probes need no key
    with pytest.raises(openai.AuthenticationError):
        s.client(api_key="wrong").models.list()
    c = s.client(api_key="sekret")
    assert c.models.list().data[0].id == "stories260K"
    assert c.completions.create(model="x", prompt="Once", max_tokens=2).usage.completion_tokens >= 1


def test_cors(augur_server):
    s = augur_server(TINY_GGUF, "--cors-origin", "https://app.example")
    st, h, _ = raw(s, "OPTIONS", CHAT, None, {"Origin": "https://app.example",
                                             "Access-Control-Request-Method": "POST",
                                             "Access-Control-Request-Headers": "authorization, content-type"})
    assert st == 204
    assert h["Access-Control-Allow-Origin"] == "https://app.example"
    assert "POST" in h["Access-Control-Allow-Methods"]
    assert "authorization" in h["Access-Control-Allow-Headers"].lower()
    st, h, _ = raw(s, "GET", "/v1/models", None, {"Origin": "https://app.example"})
    assert st == 200 and h["Access-Control-Allow-Origin"] == "https://app.example"
    st, h, _ = raw(s, "GET", "/nope")
    assert st == 404 and h["Access-Control-Allow-Origin"] == "https://app.example"


def test_queue_full_is_429(augur_server):
    """One sequence at a time, one waiting: a burst of requests gets 429s (with
    Retry-After) for the overflow and 200s for the rest; nothing else."""
    s = augur_server(TINY_GGUF, "--parallel", "1", "--max-queue", "1", "--ctx", "256")
    results = []

    def one():
        results.append(raw(s, "POST", COMP, {"prompt": "Once upon a time", "max_tokens": 200,
                                              "ignore_eos": True, "temperature": 0}))

    threads = [threading.Thread(target=one) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    codes = sorted(r[0] for r in results)
    assert set(codes) <= {200, 429} and codes.count(200) >= 1 and codes.count(429) >= 1, codes
    for st, h, body in results:
        if st == 429:
            assert_error((st, h, body), 429, code="server_busy")
            assert h["Retry-After"] == "1"
    # the openai client sees a RateLimitError
    assert raw(s, "GET", "/health")[0] == 200


def test_garbage_never_5xx(tiny_server):
    """Random bodies against every route: always a 2xx/4xx answer, and the
    server keeps serving."""
    rng = random.Random(7)
    paths = [CHAT, COMP, "/tokenize", "/detokenize"]
    pieces = ['{', '}', '[', ']', '"messages"', '"prompt"', ':', ',', '"x"', '1', '-1e999', 'null', 'true',
              '"role"', '"content"', '"user"', '\\u00e9', '"\\ud800"', '{"role":"user","content":"hi"}',
              '"tokens"', '[1,2,3]', '"max_tokens"', '2', '"n"', '"stop"', '"logit_bias"', '"tools"']
    for i in range(150):
        body = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 12)))
        if i % 3 == 0:
            body = '{"messages":[{"role":"user","content":"hi"}],"max_tokens":2,' + body[1:] if body else "{}"
        st, _, _ = raw(tiny_server, "POST", rng.choice(paths), body.encode())
        assert 200 <= st < 500, (body, st)
    assert raw(tiny_server, "GET", "/health")[0] == 200


def test_tokenize_errors(tiny_server):
    assert_error(raw(tiny_server, "POST", "/tokenize", {"content": 5}), 400, param="content")
    assert_error(raw(tiny_server, "POST", "/tokenize", {"content": "a", "add_special": 1}), 400, param="add_special")
    assert_error(raw(tiny_server, "POST", "/detokenize", {"tokens": [1, "a"]}), 400, param="tokens")
    assert_error(raw(tiny_server, "POST", "/detokenize", {"tokens": [99999]}), 400, param="tokens")
    assert_error(raw(tiny_server, "POST", "/detokenize", {}), 400, param="tokens")


def test_serve_cli_errors(tiny_server):
    from conftest import run_augur
    p = run_augur("serve", "-m", TINY_GGUF, "--port", "70000")
    assert p.returncode == 2 and b"invalid value '70000' for --port" in p.stderr
    p = run_augur("serve", "-m", TINY_GGUF, "--frobnicate", "1")
    assert p.returncode == 2 and b"unknown option" in p.stderr
    p = run_augur("serve", "-m", "/nonexistent.gguf")
    assert p.returncode == 1 and b"/nonexistent.gguf" in p.stderr
    # the port is taken (by the session's server)
    p = run_augur("serve", "-m", TINY_GGUF, "--port", str(tiny_server.port))
    assert p.returncode == 1 and b"cannot listen on 127.0.0.1:" in p.stderr and b"in use" in p.stderr
    assert p.stdout == b""  # no ready line


# ---- slow clients ----

class Trickler(threading.Thread):
    """A slowloris client: sends a request's headers one byte every 0.3 s
    (which resets any idle timeout) until the server closes the connection.
    Records what the server answered and how long the connection lived."""

    def __init__(self, port):
        super().__init__(daemon=True)
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=30)
        self.opened = time.time()
        self.answer, self.lived = None, None

    def run(self):
        data = b"GET /health HTTP/1.1\r\nHost: x\r\nX-Pad: " + b"a" * 1000
        try:
            for i in range(len(data)):
                self.sock.send(data[i:i + 1])
                time.sleep(0.3)
        except OSError:
            pass
        try:
            self.sock.settimeout(5)
            self.answer = self.sock.recv(200)
        except OSError:
            self.answer = b""
        self.lived = time.time() - self.opened
        self.sock.close()


def metric(server, name):
    st, _, body = raw(server, "GET", "/metrics")
    for line in body.decode().splitlines() if isinstance(body, bytes) else []:
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"no metric {name}")


def test_slow_headers_cannot_hold_every_slot(augur_server):
    """Clients trickling their headers get a deadline, and may hold only
    7/8 of the connection slots (issue 51: 260 of them held all 256 slots
    and every other client got resets until they gave up)."""
    s = augur_server(TINY_GGUF, "--max-connections", "32", "--header-timeout", "2")
    slow = [Trickler(s.port) for _ in range(40)]
    for t in slow:
        t.start()
    time.sleep(0.5)
    # everyone else is served meanwhile, at once
    for _ in range(10):
        t0 = time.time()
        st, _, body = raw(s, "POST", COMP, {"prompt": "Once", "max_tokens": 2}, timeout=10)
        assert st == 200, body
        assert time.time() - t0 < 1.5
    for t in slow:
        t.join(timeout=15)
    assert not any(t.is_alive() for t in slow)
    # none lived much past the deadline; those that reached it got a 408
    assert max(t.lived for t in slow) < 2 + 2.5, sorted(t.lived for t in slow)
    assert sum(t.answer.startswith(b"HTTP/1.1 408") for t in slow) >= 20, [t.answer for t in slow]
    # (a burst of connections may also meet the connection limit itself
    # while closed ones are being cleaned up: those are refused at once)
    closed = metric(s, "augur_http_request_timeouts_total") + metric(s, "augur_http_slow_connections_closed_total")
    assert closed >= 20
    assert raw(s, "GET", "/health")[0] == 200


def test_a_stream_longer_than_the_header_deadline_is_not_cut(augur_server):
    require_model(SMOLLM2)
    s = augur_server(SMOLLM2, "--header-timeout", "1")
    c = s.client()
    t0 = time.time()
    text, usage = "", None
    for ch in c.chat.completions.create(model="x", messages=MSG, max_tokens=250, stream=True,
                                        stream_options={"include_usage": True},
                                        extra_body={"ignore_eos": True}):
        if ch.choices:
            text += ch.choices[0].delta.content or ""
        if ch.usage:
            usage = ch.usage
    assert time.time() - t0 > 1.5  # (longer than the deadline, or the test proves nothing)
    assert usage.completion_tokens == 250 and text
    # a kept-alive connection waits for its next request up to the deadline
    conn = http.client.HTTPConnection("127.0.0.1", s.port, timeout=10)
    conn.request("GET", "/health")
    assert conn.getresponse().read() is not None
    time.sleep(0.3)
    conn.request("GET", "/health")
    r = conn.getresponse()
    assert r.status == 200
    r.read()
    conn.close()


def test_slow_body_gets_a_deadline_too(augur_server):
    s = augur_server(TINY_GGUF, "--header-timeout", "1")
    sock = socket.create_connection(("127.0.0.1", s.port), timeout=30)
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: 100000\r\n\r\n")
    t0, answer = time.time(), b""
    try:
        for _ in range(40):
            sock.send(b" ")
            time.sleep(0.2)
    except OSError:
        pass
    try:
        answer = sock.recv(200)
    except OSError:
        pass
    sock.close()
    assert answer.startswith(b"HTTP/1.1 408") or answer == b"", answer
    assert time.time() - t0 < 6
    # a body that keeps coming is taken whatever its size
    st, _, _ = raw(s, "POST", COMP, {"prompt": "Once " * 20000, "max_tokens": 1})
    assert st == 400  # (over the context: it was read whole and parsed)


def test_a_long_generation_is_not_a_slow_request(augur_server):
    """The deadline is for the request's arrival only: a non-streamed
    answer that takes longer than --header-timeout (plus the body's
    allowance) is still answered (it got a 408 while the route ran)."""
    require_model(SMOLLM2)
    s = augur_server(SMOLLM2, "--header-timeout", "1", "-t", "1")
    t0 = time.time()
    st, _, body = raw(s, "POST", COMP, {"prompt": "Once upon a time", "max_tokens": 400, "ignore_eos": True,
                                        "temperature": 0})
    assert st == 200, body
    assert time.time() - t0 > 1.5  # (long enough to have met the deadline)


def test_connections_per_address(augur_server):
    s = augur_server(TINY_GGUF, "--max-connections-per-ip", "3")
    held = [socket.create_connection(("127.0.0.1", s.port), timeout=10) for _ in range(3)]
    time.sleep(0.2)
    extra = socket.create_connection(("127.0.0.1", s.port), timeout=10)
    try:
        extra.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        got = extra.recv(200)
    except OSError:
        got = b""
    extra.close()
    assert got == b""  # closed at once, without an answer
    held.pop().close()
    time.sleep(0.2)
    assert raw(s, "GET", "/health")[0] == 200
    for h in held:
        h.close()
