"""augur serve: OpenAI's Responses API (POST /v1/responses, GET/DELETE
/v1/responses/{id}), driven by the official `openai` client and by
openai-agents' default (Responses) model, against SmolLM2.

References: the chat completions endpoint for the same conversation (the
same rendering, so the same prompt tokens and the same greedy text), the
request's JSON schemas (jsonschema) and the stream's own final response
(the deltas must add up to it)."""
import asyncio
import json
import socket

import jsonschema
import openai
import pytest

from test_server_load import metrics, wait_idle

GREEDY = {"temperature": 0}
QUESTION = "What is the capital of France?"
INSTRUCTIONS = "Answer in one short sentence."
WEATHER = {"type": "function", "name": "get_weather", "description": "Get the current weather in a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
WEATHER_CHAT = {"type": "function", "function": {"name": WEATHER["name"], "description": WEATHER["description"],
                                                 "parameters": WEATHER["parameters"]}}
PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 20},
                                           "age": {"type": "integer", "minimum": 0, "maximum": 120}},
          "required": ["name", "age"]}


def post(server, path, obj):
    """POSTs JSON; (status, parsed body) for errors too."""
    import urllib.error
    import urllib.request
    req = urllib.request.Request(server.base + path, data=json.dumps(obj).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def chat(server, messages, max_tokens, **kw):
    return server.client().chat.completions.create(model="x", messages=messages, max_tokens=max_tokens,
                                                   temperature=0, **kw)


# ---- create ----

def test_same_prompt_and_greedy_text_as_chat_completions(smol_server):
    c = smol_server.client()
    r = c.responses.create(model="x", instructions=INSTRUCTIONS, input=QUESTION, max_output_tokens=24, **GREEDY)
    ref = chat(smol_server, [{"role": "system", "content": INSTRUCTIONS}, {"role": "user", "content": QUESTION}], 24)
    assert r.object == "response" and r.id.startswith("resp_")
    assert r.output_text == ref.choices[0].message.content
    assert r.usage.input_tokens == ref.usage.prompt_tokens
    assert r.usage.output_tokens == ref.usage.completion_tokens
    assert r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens
    assert [o.type for o in r.output] == ["message"]
    assert r.output[0].role == "assistant" and r.output[0].content[0].type == "output_text"
    assert r.instructions == INSTRUCTIONS and r.max_output_tokens == 24
    # max_output_tokens reached: incomplete, saying why
    if r.usage.output_tokens == 24:
        assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    else:
        assert r.status == "completed"


def test_item_list_input_is_the_same_conversation(smol_server):
    """Easy messages, typed messages with input_text/output_text parts and
    developer instructions render as the chat messages they stand for."""
    c = smol_server.client()
    items = [{"role": "developer", "content": "Be brief."},
             {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hi, I am Ann."}]},
             {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Hello Ann!"}]},
             {"role": "user", "content": "What is my name?"}]
    r = c.responses.create(model="x", input=items, max_output_tokens=16, **GREEDY)
    ref = chat(smol_server, [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi, I am Ann."},
                             {"role": "assistant", "content": "Hello Ann!"},
                             {"role": "user", "content": "What is my name?"}], 16)
    assert r.output_text == ref.choices[0].message.content
    assert r.usage.input_tokens == ref.usage.prompt_tokens


def test_previous_response_id_continues_the_conversation(smol_server):
    c = smol_server.client()
    r1 = c.responses.create(model="x", input=QUESTION, max_output_tokens=16, **GREEDY)
    r2 = c.responses.create(model="x", input="And of Italy?", previous_response_id=r1.id, max_output_tokens=16,
                            **GREEDY)
    ref = chat(smol_server, [{"role": "user", "content": QUESTION},
                             {"role": "assistant", "content": r1.output_text},
                             {"role": "user", "content": "And of Italy?"}], 16)
    assert r2.previous_response_id == r1.id
    assert r2.output_text == ref.choices[0].message.content
    assert r2.usage.input_tokens == ref.usage.prompt_tokens
    # the first turn's prompt came from the prefix cache
    assert r2.usage.input_tokens_details.cached_tokens > 0
    # instructions are not carried over (as OpenAI does)
    r3 = c.responses.create(model="x", instructions=INSTRUCTIONS, input=QUESTION, max_output_tokens=8, **GREEDY)
    r4 = c.responses.create(model="x", input="Thanks", previous_response_id=r3.id, max_output_tokens=8, **GREEDY)
    ref = chat(smol_server, [{"role": "user", "content": QUESTION}, {"role": "assistant", "content": r3.output_text},
                             {"role": "user", "content": "Thanks"}], 8)
    assert r4.usage.input_tokens == ref.usage.prompt_tokens and r4.instructions is None


def test_retrieve_delete_and_store_false(smol_server):
    c = smol_server.client()
    r = c.responses.create(model="x", input="Hi", max_output_tokens=4, metadata={"k": "v"}, **GREEDY)
    got = c.responses.retrieve(r.id)
    assert got.model_dump() == r.model_dump() and got.metadata == {"k": "v"}
    c.responses.delete(r.id)
    with pytest.raises(openai.NotFoundError):
        c.responses.retrieve(r.id)
    with pytest.raises(openai.NotFoundError):
        c.responses.delete(r.id)
    with pytest.raises(openai.NotFoundError):
        c.responses.create(model="x", input="more", previous_response_id=r.id, max_output_tokens=4)
    r = c.responses.create(model="x", input="Hi", max_output_tokens=4, store=False, **GREEDY)
    assert r.store is False
    with pytest.raises(openai.NotFoundError):
        c.responses.retrieve(r.id)


# ---- streaming ----

def test_stream_event_sequence_adds_up_to_the_response(smol_server):
    c = smol_server.client()
    events = list(c.responses.create(model="x", input=QUESTION, max_output_tokens=20, stream=True, **GREEDY))
    types = [e.type for e in events]
    assert types[:2] == ["response.created", "response.in_progress"]
    assert types[2:4] == ["response.output_item.added", "response.content_part.added"]
    assert types[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                          "response.incomplete" if types[-1] == "response.incomplete" else "response.completed"]
    assert set(types[4:-4]) == {"response.output_text.delta"}
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert events[0].response.status == "in_progress" and events[0].response.output == []
    final = events[-1].response
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    done = next(e for e in events if e.type == "response.output_text.done")
    assert text == done.text == final.output_text
    item_ids = {e.item_id for e in events if hasattr(e, "item_id")}
    assert item_ids == {final.output[0].id}
    # the same greedy text as without streaming, and stored the same way
    r = c.responses.create(model="x", input=QUESTION, max_output_tokens=20, **GREEDY)
    assert r.output_text == final.output_text
    assert c.responses.retrieve(final.id).output_text == final.output_text


def test_stream_helper_of_the_client(smol_server):
    """The client's stream helper needs response.completed: an answer that
    ends by itself (a schema's value is complete), parsed on the way."""
    from pydantic import BaseModel

    class Person(BaseModel):
        name: str
        age: int

    c = smol_server.client()
    with c.responses.stream(model="x", input="Invent a person.", text_format=Person, max_output_tokens=64,
                            **GREEDY) as s:
        deltas = [e.delta for e in s if e.type == "response.output_text.delta"]
        final = s.get_final_response()
    assert "".join(deltas) == final.output_text and final.status == "completed"
    assert isinstance(final.output_parsed, Person)


# ---- tools ----

def test_function_call_round_trip(smol_server):
    """tool_choice required: one function_call whose arguments follow the
    tool's schema; its output, sent back as function_call_output, gives the
    prompt chat completions would render for the same turns."""
    c = smol_server.client()
    ask = "What is the weather in Paris?"
    r = c.responses.create(model="x", input=ask, tools=[WEATHER], tool_choice="required", max_output_tokens=64,
                           **GREEDY)
    calls = [o for o in r.output if o.type == "function_call"]
    assert len(calls) == 1 and calls[0].name == "get_weather" and calls[0].status == "completed"
    jsonschema.validate(json.loads(calls[0].arguments), WEATHER["parameters"])
    assert calls[0].call_id and calls[0].id.startswith("fc_")
    out = [{"type": "function_call_output", "call_id": calls[0].call_id, "output": "22 C, sunny"}]
    r2 = c.responses.create(model="x", input=out, previous_response_id=r.id, tools=[WEATHER], max_output_tokens=24,
                            **GREEDY)
    # the same turns, stateless: the call item itself in the input
    call_item = {"type": "function_call", "call_id": calls[0].call_id, "name": "get_weather",
                 "arguments": calls[0].arguments}
    r3 = c.responses.create(model="x", input=[{"role": "user", "content": ask}, call_item, *out], tools=[WEATHER],
                            max_output_tokens=24, **GREEDY)
    ref = chat(smol_server, [{"role": "user", "content": ask},
                             {"role": "assistant", "content": None,
                              "tool_calls": [{"id": calls[0].call_id, "type": "function",
                                              "function": {"name": "get_weather", "arguments": calls[0].arguments}}]},
                             {"role": "tool", "tool_call_id": calls[0].call_id, "content": "22 C, sunny"}], 24,
               tools=[WEATHER_CHAT])
    for x in (r2, r3):
        assert x.usage.input_tokens == ref.usage.prompt_tokens
        if ref.choices[0].message.tool_calls:
            assert [o.type for o in x.output if o.type == "function_call"]
        else:
            assert x.output_text == ref.choices[0].message.content


def test_function_call_streamed(smol_server):
    c = smol_server.client()
    events = list(c.responses.create(model="x", input="Weather in Rome?", tools=[WEATHER],
                                     tool_choice={"type": "function", "name": "get_weather"}, max_output_tokens=64,
                                     stream=True, **GREEDY))
    types = [e.type for e in events]
    assert types == ["response.created", "response.in_progress", "response.output_item.added",
                     "response.function_call_arguments.delta", "response.function_call_arguments.done",
                     "response.output_item.done", "response.completed"]
    added, delta, done, item_done = events[2:6]
    assert added.item.type == "function_call" and added.item.arguments == "" and added.item.status == "in_progress"
    assert delta.delta == done.arguments == item_done.item.arguments
    assert item_done.item.status == "completed" and done.name == "get_weather"
    jsonschema.validate(json.loads(done.arguments), WEATHER["parameters"])
    assert events[-1].response.output[0].call_id == item_done.item.call_id


def test_text_format_json_schema(smol_server):
    c = smol_server.client()
    fmt = {"format": {"type": "json_schema", "name": "person", "schema": PERSON, "strict": True}}
    r = c.responses.create(model="x", input="Invent a person.", text=fmt, max_output_tokens=64, **GREEDY)
    jsonschema.validate(json.loads(r.output_text), PERSON)
    assert r.text.format.type == "json_schema" and r.text.format.name == "person"
    # streamed too
    final = list(c.responses.create(model="x", input="Invent a person.", text=fmt, max_output_tokens=64,
                                    stream=True, **GREEDY))[-1].response
    assert final.output_text == r.output_text
    # and through the client's parse() with a Pydantic model
    from pydantic import BaseModel

    class City(BaseModel):
        name: str
        country: str

    p = c.responses.parse(model="x", input="Name a city.", text_format=City, max_output_tokens=48, **GREEDY)
    assert isinstance(p.output_parsed, City)


def test_agents_run_with_a_function_tool_and_output_type(smol_server):
    """openai-agents' default model (Responses): the agent calls the tool
    (required on the first turn; the SDK resets tool_choice after a call),
    gets its output back (function_call_output) and ends with a value of
    output_type (text.format json_schema), parsed by the SDK."""
    agents = pytest.importorskip("agents")
    from agents.models.openai_responses import OpenAIResponsesModel
    from pydantic import BaseModel

    agents.set_tracing_disabled(True)
    seen = []

    # called once: then the agent has no tool left and must answer (SmolLM2
    # would go on calling a tool it is offered)
    @agents.function_tool(is_enabled=lambda ctx, agent: not seen)
    def get_weather(city: str) -> str:
        """Get the current weather in a city."""
        seen.append(city)
        return f"It is 22 degrees and sunny in {city}."

    class Weather(BaseModel):
        city: str
        temperature_c: int

    client = openai.AsyncOpenAI(base_url=smol_server.base + "/v1", api_key="none", max_retries=0, timeout=120)
    agent = agents.Agent(name="weather", instructions="Use the tool, then answer.", tools=[get_weather],
                         output_type=Weather, model=OpenAIResponsesModel(model="x", openai_client=client),
                         model_settings=agents.ModelSettings(tool_choice="required", temperature=0, max_tokens=96))
    result = asyncio.run(agents.Runner.run(agent, "What is the weather in Paris?", max_turns=6))
    assert len(seen) == 1 and isinstance(seen[0], str)
    kinds = [type(i).__name__ for i in result.new_items]
    assert kinds[:2] == ["ToolCallItem", "ToolCallOutputItem"] and kinds[-1] == "MessageOutputItem"
    assert isinstance(result.final_output, Weather)


# ---- bad input ----

@pytest.mark.parametrize("body, param", [
    ({"input": 5}, "input"),
    ({"input": []}, "input"),
    ({}, "input"),
    ({"input": [{"type": "computer_call_output", "call_id": "c", "output": {}}]}, "input[0]"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "http://x/y.png"}]}]},
     "input[0].content"),
    ({"input": [{"role": "robot", "content": "hi"}]}, "input[0].role"),
    ({"input": [{"type": "function_call", "name": "f"}]}, "input[0]"),
    ({"input": [{"type": "function_call_output", "call_id": "c", "output": 3}]}, "input[0].output"),
    ({"input": "hi", "tools": [{"type": "web_search"}]}, "tools[0]"),
    ({"input": "hi", "tools": [{"type": "function"}]}, "tools[0]"),
    ({"input": "hi", "tool_choice": {"type": "function", "name": "nope"}, "tools": [WEATHER]}, "tool_choice"),
    ({"input": "hi", "text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": "string",
                                                                                      "pattern": "a+"}}}},
     "text.format.schema"),
    ({"input": "hi", "text": {"format": {"type": "xml"}}}, "text.format.type"),
    ({"input": "hi", "max_output_tokens": 0}, "max_output_tokens"),
    ({"input": "hi", "max_tokens": 5}, "max_tokens"),
    ({"input": "hi", "reasoning": {"effort": "high"}}, "reasoning"),
    ({"input": "hi", "background": True}, "background"),
    ({"input": "hi", "truncation": "auto"}, "truncation"),
    ({"input": "hi", "previous_response_id": 7}, "previous_response_id"),
    ({"input": "hi", "instructions": ["a"]}, "instructions"),
])
def test_bad_requests_are_400_naming_the_field(smol_server, body, param):
    status, r = post(smol_server, "/v1/responses", {"model": "x", **body})
    assert status == 400, r
    assert r["error"]["param"] == param, r
    assert r["error"]["message"]


def test_malformed_json_and_wrong_methods(smol_server):
    import urllib.request
    req = urllib.request.Request(smol_server.base + "/v1/responses", data=b'{"input": "hi",', method="POST",
                                 headers={"Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req)
    assert e.value.code == 400 and "column 15" in json.loads(e.value.read())["error"]["message"]
    for method, url, code in [("GET", "/v1/responses", 405), ("PUT", "/v1/responses/resp_x", 405),
                              ("GET", "/v1/responses/resp_missing", 404), ("GET", "/v1/responses/", 404)]:
        req = urllib.request.Request(smol_server.base + url, method=method)
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(req)
        assert e.value.code == code, (method, url)


def test_over_long_input_is_400(smol_server):
    status, r = post(smol_server, "/v1/responses", {"model": "x", "input": "word " * 20000})
    assert status == 400 and r["error"]["code"] == "context_length_exceeded"


def test_client_disconnect_mid_stream(smol_server):
    before = metrics(smol_server)["augur_client_cancels_total"]
    body = json.dumps({"model": "x", "input": QUESTION, "stream": True, "max_output_tokens": 400,
                       "ignore_eos": True}).encode()
    s = socket.create_connection(("127.0.0.1", smol_server.port), timeout=30)
    s.sendall(b"POST /v1/responses HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    got = b""
    while got.count(b"response.output_text.delta") < 3:
        chunk = s.recv(4096)
        assert chunk, got
        got += chunk
    s.close()
    m = wait_idle(smol_server)
    assert m["augur_client_cancels_total"] >= before + 1
    r = smol_server.client().responses.create(model="x", input="Hi", max_output_tokens=4, **GREEDY)
    assert r.status in ("completed", "incomplete")


# ---- tools beside an answer schema (tool_choice auto) ----

WEATHER_ANSWER = {"type": "object", "properties": {"city": {"type": "string"}, "temperature_c": {"type": "integer"}},
                  "required": ["city", "temperature_c"]}
ASKS = ["What is the weather in Paris?", "Tell me a joke.", "Use the tool to get the weather in Oslo."]


def test_tools_beside_an_answer_schema_on_every_api(smol_server):
    """The grammar lets the model call a tool (arguments in the tool's
    schema) or answer with a value of the answer's schema, nothing else; a
    schema enforced from the first token never let it call one. SmolLM2
    calls the tool for the weather questions (greedy, so every time)."""
    import anthropic
    c = smol_server.client()
    fmt = {"type": "json_schema", "json_schema": {"name": "weather", "schema": WEATHER_ANSWER}}
    kinds = []
    for ask in ASKS:
        r = c.chat.completions.create(model="x", messages=[{"role": "user", "content": ask}], tools=[WEATHER_CHAT],
                                      response_format=fmt, max_tokens=80, **GREEDY)
        m = r.choices[0].message
        if m.tool_calls:
            assert r.choices[0].finish_reason == "tool_calls" and len(m.tool_calls) == 1
            jsonschema.validate(json.loads(m.tool_calls[0].function.arguments), WEATHER["parameters"])
            kinds.append("call")
        else:
            jsonschema.validate(json.loads(m.content), WEATHER_ANSWER)
            kinds.append("value")
        # Responses (text.format) and Anthropic (output_config.format): the same choice
        rr = c.responses.create(model="x", input=ask, tools=[WEATHER], max_output_tokens=80, **GREEDY,
                                text={"format": {"type": "json_schema", "name": "weather", "schema": WEATHER_ANSWER}})
        if kinds[-1] == "call":
            assert [o.type for o in rr.output] == ["function_call"]
            assert rr.output[0].arguments == m.tool_calls[0].function.arguments
        else:
            assert rr.output_text == m.content
        a = anthropic.Anthropic(base_url=smol_server.base, api_key="none", max_retries=0)
        am = a.messages.create(model="x", max_tokens=80, messages=[{"role": "user", "content": ask}],
                               tools=[{"name": "get_weather", "description": WEATHER["description"],
                                       "input_schema": WEATHER["parameters"]}],
                               extra_body={"temperature": 0,
                                           "output_config": {"format": {"type": "json_schema",
                                                                        "schema": WEATHER_ANSWER}}})
        if kinds[-1] == "call":
            assert am.stop_reason == "tool_use" and am.content[-1].type == "tool_use"
            jsonschema.validate(am.content[-1].input, WEATHER["parameters"])
        else:
            jsonschema.validate(json.loads(am.content[0].text), WEATHER_ANSWER)
    assert "call" in kinds
    # tool_choice none: the answer's schema alone
    r = c.chat.completions.create(model="x", messages=[{"role": "user", "content": ASKS[0]}], tools=[WEATHER_CHAT],
                                  tool_choice="none", response_format=fmt, max_tokens=80, **GREEDY)
    assert not r.choices[0].message.tool_calls
    jsonschema.validate(json.loads(r.choices[0].message.content), WEATHER_ANSWER)
