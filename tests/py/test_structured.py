"""Structured outputs (response_format json_schema) end to end: every output
the server returns under a schema is valid JSON that Python's `jsonschema`
(the reference validator, Draft 2020-12) accepts, on SmolLM2 and Qwen2.5-0.5B,
at temperature 0 and at temperature 1 with several seeds; schemas outside the
supported language, and malformed ones, get a 400 naming the keyword and
where it is."""
import json
from concurrent.futures import ThreadPoolExecutor

import jsonschema
import pytest

from conftest import AugurServer, QWEN_05B, SMOLLM2, require_model
from test_server_errors import CHAT, assert_error, raw

# Every supported feature appears in at least one schema. Strings have a
# maxLength and arrays a maxItems where the output must finish within
# max_tokens; the recursive and map schemas may run out (see BOUNDED).
SCHEMAS = {
    "person": {
        "type": "object",
        "properties": {
            "name": {"type": "string", "minLength": 1, "maxLength": 30},
            "age": {"type": "integer", "minimum": 0, "maximum": 130},
            "email": {"type": "string", "maxLength": 40},
            "hobbies": {"type": "array", "items": {"type": "string", "maxLength": 20}, "minItems": 1, "maxItems": 3},
        },
        "required": ["name", "age", "hobbies"],
        "additionalProperties": False,
    },
    "literals": {
        "type": "object",
        "properties": {
            "color": {"enum": ["red", "green", "blue"]},
            "version": {"const": 2},
            "active": {"type": "boolean"},
            "deleted_at": {"type": "null"},
            "size": {"enum": [1, 12, "big", None]},
        },
        "required": ["color", "version", "active", "deleted_at", "size"],
    },
    "numbers": {
        "type": "object",
        "properties": {
            "temperature": {"type": "number", "minimum": -50, "maximum": 60},
            "probability": {"type": "number", "minimum": 0, "exclusiveMaximum": 1},
            "count": {"type": "integer", "exclusiveMinimum": 0, "maximum": 1000},
            "offset": {"type": "integer", "maximum": -1},
        },
        "required": ["temperature", "probability", "count", "offset"],
    },
    "unions": {
        "type": "object",
        "properties": {
            "nickname": {"type": ["string", "null"], "maxLength": 15},
            "id": {"anyOf": [{"type": "integer", "minimum": 1, "maximum": 99999},
                             {"type": "string", "minLength": 3, "maxLength": 8}]},
            "extra": {"anyOf": [{"type": "object", "properties": {"note": {"type": "string", "maxLength": 20}},
                                 "required": ["note"]},
                                {"type": "boolean"}]},
        },
        "required": ["nickname", "id", "extra"],
    },
    "defs": {
        "$defs": {"address": {"type": "object",
                              "properties": {"street": {"type": "string", "maxLength": 30},
                                             "city": {"type": "string", "maxLength": 20},
                                             "zip": {"type": "string", "minLength": 5, "maxLength": 5}},
                              "required": ["street", "city", "zip"]}},
        "type": "object",
        "properties": {"home": {"$ref": "#/$defs/address"}, "work": {"$ref": "#/$defs/address"}},
        "required": ["home"],
    },
    "order": {
        "definitions": {"item": {"type": "object",
                                 "properties": {"sku": {"type": "string", "maxLength": 10},
                                                "qty": {"type": "integer", "minimum": 1, "maximum": 99}},
                                 "required": ["sku", "qty"]}},
        "type": "object",
        "properties": {"items": {"type": "array", "items": {"$ref": "#/definitions/item"}, "minItems": 1, "maxItems": 3},
                       "total": {"type": "number", "minimum": 0, "maximum": 10000}},
        "required": ["items", "total"],
    },
    "tree": {
        "$defs": {"node": {"type": "object",
                           "properties": {"name": {"type": "string", "maxLength": 12},
                                          "children": {"type": "array", "items": {"$ref": "#/$defs/node"},
                                                       "maxItems": 2}},
                           "required": ["name"]}},
        "$ref": "#/$defs/node",
    },
    "digits": {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 9}, "minItems": 2, "maxItems": 5},
    "map": {"type": "object", "properties": {"scores": {"type": "object",
                                                        "additionalProperties": {"type": "integer", "minimum": 0,
                                                                                 "maximum": 100}}},
            "required": ["scores"]},
    "answer": {"enum": ["yes", "no", "maybe"]},
}
# Schemas whose every text fits in MAX_TOKENS: the output must complete.
BOUNDED = {"person", "literals", "numbers", "unions", "defs", "order", "digits", "answer"}
MAX_TOKENS = 300

PROMPTS = {
    "person": "Describe a fictional person as JSON.",
    "literals": "Describe a product's status as JSON.",
    "numbers": "Give some weather measurements as JSON.",
    "unions": "Describe a user account as JSON.",
    "defs": "Give a person's home and work addresses as JSON.",
    "order": "Give a shopping order as JSON.",
    "tree": "Describe a small family tree as JSON.",
    "digits": "List a few digits as JSON.",
    "map": "Give test scores of three students as JSON.",
    "answer": "Is the sky blue? Answer yes, no or maybe.",
}


def rf(schema, name="out"):
    return {"type": "json_schema", "json_schema": {"name": name, "schema": schema, "strict": True}}


def check_choices(name, choices):
    """Each finished choice is one value the reference validator accepts; a
    choice cut by max_tokens is allowed only for the unbounded schemas."""
    validator = jsonschema.Draft202012Validator(SCHEMAS[name])
    for ch in choices:
        text = ch.message.content if hasattr(ch, "message") else ch.text
        if ch.finish_reason == "length":
            assert name not in BOUNDED, f"{name}: a bounded schema's output did not finish: {text!r}"
            continue
        assert ch.finish_reason == "stop", (name, ch.finish_reason, text)
        value = json.loads(text)  # exactly one JSON value, nothing after it
        errors = list(validator.iter_errors(value))
        assert not errors, f"{name}: {text!r} fails the schema: {errors[0].message}"


@pytest.fixture(scope="module")
def smol():
    require_model(SMOLLM2)
    s = AugurServer(SMOLLM2, "--parallel", "5")
    yield s
    assert s.stop() == 0, s.final_stderr[-4000:]


@pytest.fixture(scope="module")
def qwen():
    require_model(QWEN_05B)
    s = AugurServer(QWEN_05B, "--parallel", "3")
    yield s
    assert s.stop() == 0, s.final_stderr[-4000:]


def ask(server, name, **kw):
    c = server.client()
    r = c.chat.completions.create(model=server.model_id, messages=[{"role": "user", "content": PROMPTS[name]}],
                                  max_tokens=MAX_TOKENS if name in BOUNDED else 100,
                                  response_format=rf(SCHEMAS[name]), **kw)
    return r.choices


def check_schema(server, name, seeds):
    """Temperature 0, and temperature 1 with each seed (two choices each),
    asked at once so that the server batches them."""
    runs = [dict(temperature=0)] + [dict(temperature=1.0, seed=s, n=2) for s in seeds]
    with ThreadPoolExecutor(len(runs)) as pool:
        for choices in pool.map(lambda kw: ask(server, name, **kw), runs):
            check_choices(name, choices)


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_smollm2_outputs_validate(smol, name):
    check_schema(smol, name, (1, 2))


# Qwen2.5-0.5B is four times SmolLM2's size: the default run covers the
# schemas that together use every feature but recursion and maps (those
# are covered on SmolLM2), `-m slow` all of them.
QWEN_DEFAULT = {"unions", "defs", "literals", "numbers"}


@pytest.mark.parametrize("name", [pytest.param(n, marks=() if n in QWEN_DEFAULT else pytest.mark.slow)
                                  for n in sorted(SCHEMAS)])
def test_qwen_outputs_validate(qwen, name):
    check_schema(qwen, name, (5,))


def test_streamed_and_completions_endpoint(smol):
    """The streamed text is the same constrained value; /v1/completions takes
    response_format too."""
    c = smol.client()
    parts = []
    for chunk in c.chat.completions.create(model=smol.model_id, messages=[{"role": "user", "content": PROMPTS["person"]}],
                                           max_tokens=MAX_TOKENS, temperature=0, response_format=rf(SCHEMAS["person"]),
                                           stream=True):
        if chunk.choices and chunk.choices[0].delta.content:
            parts.append(chunk.choices[0].delta.content)
    jsonschema.validate(json.loads("".join(parts)), SCHEMAS["person"])
    r = c.completions.create(model=smol.model_id, prompt="A person described in JSON:\n", max_tokens=MAX_TOKENS,
                             temperature=1.0, seed=4, n=2, extra_body={"response_format": rf(SCHEMAS["order"])})
    check_choices("order", r.choices)


def test_tool_arguments_follow_the_parameters_schema(smol):
    """A forced call's arguments are a value of the tool's parameters schema."""
    c = smol.client()
    params = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 30},
                                               "unit": {"enum": ["celsius", "fahrenheit"]},
                                               "days": {"type": "integer", "minimum": 1, "maximum": 7}},
              "required": ["city", "unit", "days"]}
    tools = [{"type": "function", "function": {"name": "forecast", "parameters": params}}]

    def call(seed):
        return c.chat.completions.create(model=smol.model_id, messages=[{"role": "user", "content": "Weather in Oslo?"}],
                                         tools=tools, tool_choice="required", max_tokens=120, temperature=1.0,
                                         seed=seed)

    with ThreadPoolExecutor(3) as pool:
        for r in pool.map(call, (1, 2, 3)):
            ch = r.choices[0]
            assert ch.finish_reason == "tool_calls", ch.message.content
            (tc,) = ch.message.tool_calls
            assert tc.function.name == "forecast"
            jsonschema.validate(json.loads(tc.function.arguments), params)


# ---- errors ----

def error_of(server, path, body, param):
    """The 400 answer's error object (OpenAI's shape, naming `param`)."""
    resp = raw(server, "POST", path, body)
    assert_error(resp, 400, param=param)
    return resp[2]["error"]


def schema_error(server, schema, *words, path=CHAT):
    if path == CHAT:
        body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "response_format": rf(schema)}
    else:
        body = {"prompt": "hi", "max_tokens": 4, "response_format": rf(schema)}
    err = error_of(server, path, body, "response_format.json_schema.schema")
    for w in words:
        assert w in err["message"], err["message"]


@pytest.mark.parametrize("schema,words", [
    ({"type": "object", "properties": {"x": {"type": "object", "patternProperties": {"^a": {}}}}},
     ["unsupported JSON schema keyword 'patternProperties'", "at /properties/x"]),
    ({"type": "string", "pattern": "^[a-z]+$"}, ["'pattern'"]),
    ({"oneOf": [{"type": "string"}, {"type": "integer"}]}, ["'oneOf'"]),
    ({"type": "array", "items": {"not": {"type": "null"}}}, ["'not'", "/items"]),
    ({"type": "array", "prefixItems": [{"type": "string"}]}, ["'prefixItems'"]),
    ({"type": "object", "properties": {"a": {"type": "integer", "multipleOf": 3}}}, ["'multipleOf'", "/properties/a"]),
    ({"type": "object", "minProperties": 1}, ["'minProperties'"]),
    ({"if": {"type": "string"}, "then": {"maxLength": 3}}, ["'if'"]),
])
def test_unsupported_keywords_are_400(smol, schema, words):
    schema_error(smol, schema, *words)


@pytest.mark.parametrize("schema,words", [
    ({"type": "string", "minLength": 5, "maxLength": 2}, ["minLength"]),
    ({"type": "integer", "minimum": 10, "maximum": 3}, ["bounds"]),
    ({"type": "wibble"}, ["'wibble'"]),
    ({"$ref": "#/$defs/nowhere"}, ["#/$defs/nowhere"]),
    ({"type": "object", "properties": {"a": {"type": "string"}}, "required": ["b"]}, ["'b'"]),
    ({"type": "array", "items": {"type": "string", "maxLength": -1}}, ["maxLength", "/items"]),
    ({"$defs": {"a": {"anyOf": [{"$ref": "#/$defs/a"}]}}, "$ref": "#/$defs/a"}, ["refers to itself"]),
    ({"enum": []}, ["enum"]),
])
def test_invalid_schemas_are_400(smol, schema, words):
    schema_error(smol, schema, *words)


def test_completions_endpoint_checks_the_schema_too(smol):
    schema_error(smol, {"type": "string", "pattern": "x"}, "'pattern'", path="/v1/completions")


@pytest.mark.parametrize("fmt,param", [
    ({"type": "json_schema"}, "response_format.json_schema"),
    ({"type": "json_schema", "json_schema": {"schema": {"type": "object"}}}, "response_format.json_schema"),
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": []}}, "response_format.json_schema.schema"),
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": {}, "strict": "yes"}}, "response_format.json_schema"),
    ({"type": "xml"}, "response_format"),
])
def test_malformed_response_format_is_400(smol, fmt, param):
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "response_format": fmt}
    error_of(smol, CHAT, body, param)


def test_unsupported_tool_parameters_are_400_when_forced(smol):
    tools = [{"type": "function", "function": {"name": "a", "parameters": {"type": "object"}}},
             {"type": "function", "function": {"name": "b", "parameters": {
                 "type": "object", "properties": {"q": {"type": "string", "pattern": "x"}}}}}]
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "tools": tools,
            "tool_choice": "required"}
    err = error_of(smol, CHAT, body, "tools[1].function.parameters")
    assert "'pattern'" in err["message"] and "/properties/q" in err["message"], err["message"]
    # tool_choice auto does not enforce, so it does not compile the schema
    body["tool_choice"] = "auto"
    status, _, _ = raw(smol, "POST", CHAT, body)
    assert status == 200


def test_rows_masked_where_computed_equal_masked_copies():
    """A structured output's rows are masked where the logits are computed
    (the engine's bitmap of the tokens the schema lets through, applied by
    the model; on a GPU by the mask op), so its argmax, picked token or
    candidates come from there: the same text and logprobs, bit for bit, as
    a server that copies the rows and masks them on the host (AUGUR_MASKS=0):
    greedy, top-k with logprobs, a temperature alone, with penalties, n = 2,
    at once; and with n-gram drafts, greedy and sampled (each verify row's
    mask made past the drafts before it; the first server poisons the rows
    a device would not copy back)."""
    require_model(SMOLLM2)
    env = {"AUGUR_SPEC_ROW_COST": "0.1"}
    import os
    servers = [AugurServer(SMOLLM2, "--parallel", "6", env={**os.environ, **env, "AUGUR_POISON_ROWS": "1"}),
               AugurServer(SMOLLM2, "--parallel", "6", env={**os.environ, **env, "AUGUR_MASKS": "0"})]
    runs = [("person", dict(temperature=0)), ("literals", dict(temperature=0.9, seed=3, logprobs=True, top_logprobs=2,
                                                                extra_body={"top_k": 20})),
            ("numbers", dict(temperature=1.0, seed=5, extra_body={"top_k": 0, "top_p": 1.0, "min_p": 0})),
            ("order", dict(temperature=0.8, seed=7, frequency_penalty=0.5, logit_bias={"28": 2.0})),
            ("unions", dict(temperature=1.0, seed=2, n=2)), ("answer", dict(temperature=0, logprobs=True))]
    try:
        def one(server, name, kw):
            choices = ask(server, name, **kw)
            return [(c.message.content, c.finish_reason,
                     c.logprobs and [(t.token, t.logprob) for t in c.logprobs.content]) for c in choices]
        got = []
        for s in servers:
            with ThreadPoolExecutor(len(runs)) as pool:
                got.append(list(pool.map(lambda r, s=s: one(s, *r), runs)))
        assert got[0] == got[1]
        for (name, _), res in zip(runs, got[0]):
            for text, finish, _ in res:
                if finish == "stop":
                    jsonschema.validate(json.loads(text), SCHEMAS[name])
    finally:
        for s in servers:
            assert s.stop() == 0, s.final_stderr[-4000:]
    spec = [AugurServer(SMOLLM2, "--draft", "ngram", env={**os.environ, **env, "AUGUR_POISON_ROWS": "1"}),
            AugurServer(SMOLLM2, "--draft", "ngram", env={**os.environ, **env, "AUGUR_MASKS": "0"})]
    # (one request at a time: the draft lengths then depend only on the text, so sampled runs draft alike)
    asks = [("person", dict(temperature=0)), ("order", dict(temperature=0)),
            ("literals", dict(temperature=0.8, seed=3, extra_body={"top_k": 20})),
            ("numbers", dict(temperature=1.0, seed=4, extra_body={"top_k": 0, "top_p": 0.95, "min_p": 0}))]
    try:
        outs = [[s.client().chat.completions.create(model=s.model_id, messages=[{"role": "user", "content": PROMPTS[n]}],
                                                    max_tokens=MAX_TOKENS, response_format=rf(SCHEMAS[n]), **kw)
                 for n, kw in asks] for s in spec]
        assert [r.choices[0].message.content for r in outs[0]] == [r.choices[0].message.content for r in outs[1]]
        # verify windows ran, their rows masked where computed (accepted drafts: their masks came after drafts)
        accepted = sum(r.usage.completion_tokens_details.accepted_prediction_tokens for r in outs[0])
        assert accepted > 20, accepted
    finally:
        for s in spec:
            assert s.stop() == 0, s.final_stderr[-4000:]
