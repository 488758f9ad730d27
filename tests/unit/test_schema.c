/* Structured output (sample/schema.h): for each feature, texts a compiled
 * schema must accept and texts it must reject, written by hand from the
 * JSON Schema spec (each accepted text was checked valid, and each
 * rejected one invalid or outside the documented language, with Python's
 * jsonschema when written); compile errors; the logit mask against trying
 * every token of a small vocabulary on the byte automaton.
 *
 * Test strings use ' for " (q() swaps them) to stay readable. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "sample/schema.h"

static char *q(const char *s) {
    char *r = strdup(s);
    for (char *p = r; *p; p++)
        if (*p == '\'') *p = '"';
    return r;
}

static ag_schema *compile_q(const char *schema_q) {
    char        *text = q(schema_q);
    json_error_t err;
    json_t      *j = json_loads(text, 0, &err);
    if (!j) fail_msg("test schema does not parse: %s (%s)", text, err.text);
    ag_schema *s = NULL;
    ag_status  st = ag_schema_compile(j, &s);
    if (st) fail_msg("compile failed: %s: %s", text, ag_error_message());
    json_decref(j);
    free(text);
    return s;
}

/* Whole text fed byte by byte, and the output may end after it. */
static bool accepts(ag_schema *s, const char *doc) {
    ag_schema_matcher *m;
    assert_int_equal(ag_schema_matcher_new(s, NULL, &m), AG_OK);
    bool ok = true;
    for (const char *p = doc; *p && ok; p++) ok = ag_schema_feed(m, p, 1);
    ok = ok && ag_schema_can_end(m);
    ag_schema_matcher_free(m);
    return ok;
}

typedef struct {
    const char *schema;
    const char *ok[8];
    const char *bad[12];
} schema_case;

static const schema_case k_cases[] = {
    /* objects: schema order, required always, optional may be skipped, nothing else */
    {"{'type':'object','properties':{'a':{'type':'integer'},'b':{'type':'string'},'c':{'type':'boolean'}},"
     "'required':['a','c']}",
     {"{'a':1,'c':true}", "{'a':1,'b':'x','c':false}", " { 'a' : -5 ,\n  'c':true }"},
     {"{'c':true,'a':1}", "{'a':1}", "{'a':1,'c':true,'d':1}", "{'b':'x','a':1,'c':true}", "{'a':1.5,'c':true}",
      "{'a':1,'b':2,'c':true}", "{}", "{'a':1,'c':true,}", "{'a':1,'a':1,'c':true}", "{'a':1,'c':true} "}},
    /* all optional: any ordered subset */
    {"{'type':'object','properties':{'x':{'type':'null'},'y':{'type':'null'}}}",
     {"{}", "{'y':null}", "{'x':null,'y':null}"},
     {"{'y':null,'x':null}", "{'x':null,}", "{,}"}},
    /* arrays */
    {"{'type':'array','items':{'type':'integer'},'minItems':1,'maxItems':3}",
     {"[1]", "[1,2,3]", "[ 1 , 2 ]"},
     {"[]", "[1,2,3,4]", "[1,]", "['a']", "[1 2]", "[1]]"}},
    /* enum and const: compact JSON text of the values */
    {"{'enum':['red','green',1,12,null,{'k':[1,2]}]}",
     {"'red'", "'green'", "1", "12", "null", "{'k':[1,2]}"},
     {"'blue'", "2", "123", "'gree'", "nul", "{'k': [1,2]}"}},
    {"{'const':'only'}", {"'only'"}, {"'onl'", "'only '", "'onlyy'"}},
    /* strings: length in code points, an escape is one */
    {"{'type':'string','minLength':2,'maxLength':4}",
     {"'ab'", "'abcd'", "'\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80'", "'\\n\\u00e9'"},
     {"'a'", "'abcde'", "'\\ud800'", "'a\x01'", "'\xc3\x28'", "'ab", "'\\x41b'"}},
    /* integers: exact bounds, no fraction or exponent */
    {"{'type':'integer','minimum':-5,'maximum':120}",
     {"-5", "0", "7", "120", "99", "-0"},
     {"-6", "121", "1.0", "007", "1000", "-", "1e2", "130"}},
    {"{'type':'integer','exclusiveMinimum':0,'exclusiveMaximum':10}", {"1", "9"}, {"0", "10", "-1"}},
    {"{'type':'integer','minimum':0,'exclusiveMinimum':true}", {"1", "12345"}, {"0", "-3"}},
    /* numbers: bounds on the value, exponents only without bounds */
    {"{'type':'number','minimum':0.5,'maximum':2.5}",
     {"0.5", "1", "2.5", "2.49", "0.75"},
     {"0.4", "2.51", "3", "-1", "1e0", "0"}},
    {"{'type':'number','exclusiveMaximum':1}", {"0.999", "-7", "0"}, {"1", "1.0", "2"}},
    {"{'type':'number'}", {"-0.5e+10", "12.25E-3", "0", "3.0"}, {"01", "1.", ".5", "+1", "1e", "--1", "0x1"}},
    /* booleans, null, type lists */
    {"{'type':'boolean'}", {"true", "false"}, {"tru", "null", "1", "truee"}},
    {"{'type':['string','null']}", {"'x'", "null"}, {"1", "true", "[]"}},
    /* anyOf: chosen by the first byte; literal alternatives merge */
    {"{'anyOf':[{'type':'integer'},{'type':'object','properties':{'k':{'const':'v'}},'required':['k']}]}",
     {"3", "{'k':'v'}"},
     {"{'k':'w'}", "'x'", "{}"}},
    {"{'anyOf':[{'const':'a'},{'const':'b'},{'type':'null'}]}", {"'a'", "'b'", "null"}, {"'c'", "'ab'"}},
    /* $ref, recursion, definitions */
    {"{'$defs':{'node':{'type':'object','properties':{'v':{'type':'integer'},'kids':{'type':'array',"
     "'items':{'$ref':'#/$defs/node'}}},'required':['v']}},'$ref':'#/$defs/node'}",
     {"{'v':1}", "{'v':1,'kids':[{'v':2},{'v':3,'kids':[]}]}"},
     {"{'v':1,'kids':[{'w':2}]}", "{'kids':[]}", "{'v':1,'kids':[{}]}"}},
    {"{'definitions':{'s':{'type':'string'}},'type':'array','items':{'$ref':'#/definitions/s'}}",
     {"['a','b']", "[]"},
     {"[1]", "['a',null]"}},
    {"{'type':'object','properties':{'next':{'anyOf':[{'$ref':'#'},{'type':'null'}]}},'required':['next']}",
     {"{'next':null}", "{'next':{'next':{'next':null}}}"},
     {"{}", "{'next':{}}"}},
    /* objects without properties */
    {"{'type':'object'}", {"{}", "{'x':[1,{'y':null}],'z':'w'}", "{'a':{'b':{'c':[]}}}"}, {"[1]", "{'a'}", "'x'"}},
    {"{'type':'object','additionalProperties':{'type':'integer'}}", {"{'a':1,'b':2}", "{}"}, {"{'a':'x'}"}},
    {"{'type':'object','additionalProperties':false}", {"{}"}, {"{'a':1}"}},
    /* anything */
    {"{}", {"1", "'s'", "[true,{}]", "null"}, {"", "tru", "[1,]"}},
    /* annotations are ignored */
    {"{'type':'string','title':'t','description':'d','format':'date-time','default':'x','examples':['y']}",
     {"'z'"},
     {"1"}},
};

static void accepted_and_rejected_texts(void **state) {
    for (size_t i = 0; i < sizeof k_cases / sizeof *k_cases; i++) {
        const schema_case *c = &k_cases[i];
        ag_schema         *s = compile_q(c->schema);
        for (int k = 0; k < 8 && c->ok[k]; k++) {
            char *d = q(c->ok[k]);
            if (!accepts(s, d)) fail_msg("case %zu: rejected %s", i, d);
            free(d);
        }
        for (int k = 0; k < 12 && c->bad[k]; k++) {
            char *d = q(c->bad[k]);
            if (accepts(s, d)) fail_msg("case %zu: accepted %s", i, d);
            free(d);
        }
        ag_schema_unref(s);
    }
}

/* JSON mode (response_format json_object) is the schema {"type": "object"}:
 * the documents below were checked with Python's json.loads when written:
 * the valid ones parse to a dict; each invalid one fails to parse, is not
 * an object, or (the UTF-8 cases) is not valid UTF-8. */
static const char *const k_json_valid[] = {
    "{}",
    " {\042a\042:1}",
    "{\042a\042:[1,2,{\042b\042:null}],\042c\042:true,\042d\042:false}",
    "{\042n\042:-0.5e+10,\042m\042:0,\042k\042:12.25E-3,\042z\042:-0}",
    "{\042s\042:\042caf\134u00e9 \134\042q\134\042 \134\134 \134/ \134b\134f\134n\134r\134t\042}",
    "{\042u\042:\042\303\251\344\270\255\360\237\230\200\042}",
    "{\042e\042:[],\042o\042:{}}",
    "{ \042a\042 : [ 1 , 2 ] }",
};

static const char *const k_json_invalid[] = {
    "[1]", /* valid JSON, not an object */
    "\042s\042",
    "{a:1}",
    "{'a':1}",
    "{\042a\042:01}",
    "{\042a\042:1.}",
    "{\042a\042:.5}",
    "{\042a\042:1e}",
    "{\042a\042:+1}",
    "{\042a\042:tru}",
    "{\042a\042:nul}",
    "{\042a\042:1,}",
    "{\042a\042:[1,]}",
    "{\042a\042}",
    "{\042a\042:1}}",
    "{\042a\042:\042\001\042}",
    "{\042a\042:\042\134x\042}",
    "{\042a\042:\042\134u12G4\042}",
    "{\042a\042:1]",
    "{\042a\042:[1}",
    "{,}",
    "{\042a\042:1}x",
    "{\042a\042 1}",
    "{\042a\042:-}",
    "{\042a\042:--1}",
    "{\042a\042:\042\300\200\042}",     /* overlong */
    "{\042a\042:\042\355\240\200\042}", /* a surrogate */
    "{\042a\042:\042\200\042}",         /* a lone continuation byte */
    "{\042a\042:\042\344\270\042}",     /* a character cut short */
    "{\042a\042:\042\364\220\200\200\042}", /* above U+10FFFF */
};

static void json_mode_objects(void **state) {
    ag_schema *s = compile_q("{'type':'object'}");
    for (size_t i = 0; i < sizeof k_json_valid / sizeof *k_json_valid; i++) {
        if (!accepts(s, k_json_valid[i])) fail_msg("valid document %zu rejected: %s", i, k_json_valid[i]);
        /* done exactly when the object closes */
        ag_schema_matcher *m;
        assert_int_equal(ag_schema_matcher_new(s, NULL, &m), AG_OK);
        size_t n = strlen(k_json_valid[i]);
        for (size_t k = 0; k < n; k++) {
            assert_false(ag_schema_done(m));
            assert_true(ag_schema_feed(m, k_json_valid[i] + k, 1));
        }
        assert_true(ag_schema_done(m));
        ag_schema_matcher_free(m);
    }
    for (size_t i = 0; i < sizeof k_json_invalid / sizeof *k_json_invalid; i++)
        if (accepts(s, k_json_invalid[i])) fail_msg("invalid document %zu accepted: %s", i, k_json_invalid[i]);
    ag_schema_unref(s);
}

/* Prefix feasibility: a byte is refused as soon as no text can follow. */
static void bounded_numbers_refuse_dead_prefixes(void **state) {
    ag_schema *s = compile_q("{'type':'integer','minimum':100,'maximum':120}");
    static const struct {
        const char *text;
        bool        ok;
    } k[] = {{"1", true}, {"12", true}, {"13", false}, {"9", false}, {"-", false}, {"0", false}, {"10", true},
             {"121", false}};
    for (size_t i = 0; i < sizeof k / sizeof *k; i++) {
        ag_schema_matcher *m;
        assert_int_equal(ag_schema_matcher_new(s, NULL, &m), AG_OK);
        if (ag_schema_feed(m, k[i].text, strlen(k[i].text)) != k[i].ok) fail_msg("%s", k[i].text);
        ag_schema_matcher_free(m);
    }
    ag_schema_unref(s);
    /* a string at its maxLength takes only the closing quote; done right after */
    s = compile_q("{'type':'string','maxLength':1}");
    ag_schema_matcher *m;
    assert_int_equal(ag_schema_matcher_new(s, NULL, &m), AG_OK);
    assert_true(ag_schema_feed(m, "\"x", 2));
    assert_false(ag_schema_can_end(m));
    ag_schema_matcher *copy;
    assert_int_equal(ag_schema_matcher_new(s, NULL, &copy), AG_OK);
    assert_true(ag_schema_feed(copy, "\"x", 2));
    assert_false(ag_schema_feed(copy, "y", 1));
    assert_true(ag_schema_feed(m, "\"", 1));
    assert_true(ag_schema_done(m));
    ag_schema_matcher_free(m);
    ag_schema_matcher_free(copy);
    ag_schema_unref(s);
    /* a number at the root may end, but is not done: more digits could come */
    s = compile_q("{'type':'integer'}");
    assert_int_equal(ag_schema_matcher_new(s, NULL, &m), AG_OK);
    assert_true(ag_schema_feed(m, "42", 2));
    assert_true(ag_schema_can_end(m));
    assert_false(ag_schema_done(m));
    ag_schema_matcher_free(m);
    ag_schema_unref(s);
}

static void compile_errors(void **state) {
    static const struct {
        const char *schema;
        ag_status   code;
        const char *words[2]; /* the message names these */
    } k[] = {
        {"{'type':'object','properties':{'x':{'type':'object','patternProperties':{'a':{}}}}}", AG_ERR_UNSUPPORTED,
         {"'patternProperties'", "at /properties/x"}},
        {"{'type':'string','pattern':'^a'}", AG_ERR_UNSUPPORTED, {"'pattern'", "at /"}},
        {"{'oneOf':[{'type':'string'}]}", AG_ERR_UNSUPPORTED, {"'oneOf'", NULL}},
        {"{'not':{'type':'string'}}", AG_ERR_UNSUPPORTED, {"'not'", NULL}},
        {"{'type':'array','prefixItems':[{}]}", AG_ERR_UNSUPPORTED, {"'prefixItems'", NULL}},
        {"{'type':'array','items':{'type':'string','minLength':'x'}}", AG_ERR_INVALID, {"minLength", "/items"}},
        {"{'type':'string','minLength':3,'maxLength':2}", AG_ERR_INVALID, {"minLength", NULL}},
        {"{'type':'foo'}", AG_ERR_INVALID, {"'foo'", NULL}},
        {"{'$ref':'#/$defs/missing'}", AG_ERR_UNSUPPORTED, {"#/$defs/missing", NULL}},
        {"{'$ref':'http://example.com/s.json'}", AG_ERR_UNSUPPORTED, {"http://example.com", NULL}},
        {"{'type':'object','properties':{'a':{}},'required':['b']}", AG_ERR_UNSUPPORTED, {"'b'", NULL}},
        {"{'$defs':{'a':{'anyOf':[{'$ref':'#/$defs/a'},{'type':'null'}]}},'$ref':'#/$defs/a'}", AG_ERR_UNSUPPORTED,
         {"refers to itself", NULL}},
        {"{'type':'integer','minimum':5,'maximum':4}", AG_ERR_INVALID, {"bounds", NULL}},
        {"{'enum':[1,2],'type':'string'}", AG_ERR_INVALID, {"enum", NULL}},
        {"{'type':'array','uniqueItems':true}", AG_ERR_UNSUPPORTED, {"'uniqueItems'", NULL}},
        {"{'properties':{'a':{'type':'integer','multipleOf':2}}}", AG_ERR_UNSUPPORTED, {"'multipleOf'", "/properties/a"}},
        {"{'allOf':[{'type':'string'},{'maxLength':2}]}", AG_ERR_UNSUPPORTED, {"allOf", NULL}},
        {"{'$ref':'#/$defs/a','type':'string','$defs':{'a':{}}}", AG_ERR_UNSUPPORTED, {"'type'", NULL}},
    };
    for (size_t i = 0; i < sizeof k / sizeof *k; i++) {
        char   *text = q(k[i].schema);
        json_t *j = json_loads(text, 0, NULL);
        assert_non_null(j);
        ag_schema *s = NULL;
        ag_status  st = ag_schema_compile(j, &s);
        if (st != k[i].code) fail_msg("%s: status %d (%s)", text, (int)st, ag_error_message());
        assert_null(s);
        for (int w = 0; w < 2 && k[i].words[w]; w++)
            if (!strstr(ag_error_message(), k[i].words[w]))
                fail_msg("%s: message '%s' lacks %s", text, ag_error_message(), k[i].words[w]);
        json_decref(j);
        free(text);
    }
    /* a boolean schema false, a non-schema */
    json_t    *f = json_false(), *n = json_integer(3);
    ag_schema *s = NULL;
    assert_int_equal(ag_schema_compile(f, &s), AG_ERR_UNSUPPORTED);
    assert_int_equal(ag_schema_compile(n, &s), AG_ERR_INVALID);
    json_decref(n);
}

/* A forced tool call: one of the prefixes, that function's schema, the suffix. */
static void calls(void **state) {
    static const char *const pre[] = {"<tool_call>\n{\"name\": \"get_weather\", \"arguments\": ",
                                      "<tool_call>\n{\"name\": \"get_time\", \"arguments\": "};
    char   *weather = q("{'type':'object','properties':{'city':{'type':'string'}},'required':['city']}");
    json_t *schemas[2] = {json_loads(weather, 0, NULL), NULL};
    ag_schema *s;
    assert_int_equal(ag_schema_compile_calls(pre, (const json_t *const *)schemas, 2, "}\n</tool_call>", &s), AG_OK);
    static const char *const ok[] = {
        "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>",
        "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>",
        "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"tz\": 1}}\n</tool_call>",
    };
    static const char *const bad[] = {
        "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {}}\n</tool_call>", /* city is required */
        "<tool_call>\n{\"name\": \"get_date\", \"arguments\": {}}\n</tool_call>",    /* not a given function */
        "<tool_call>\n{\"name\": \"get_time\", \"arguments\": []}\n</tool_call>",
        "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {} }\n</tool_call>", /* not the suffix */
        "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>x",
    };
    for (size_t i = 0; i < 3; i++) {
        ag_schema_matcher *m;
        assert_int_equal(ag_schema_matcher_new(s, NULL, &m), AG_OK);
        for (const char *p = ok[i]; *p; p++) {
            assert_false(ag_schema_done(m));
            assert_false(ag_schema_can_end(m));
            if (!ag_schema_feed(m, p, 1)) fail_msg("%zu: rejected at %s", i, p);
        }
        assert_true(ag_schema_done(m));
        ag_schema_matcher_free(m);
    }
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        if (accepts(s, bad[i])) fail_msg("accepted: %s", bad[i]);
    ag_schema_unref(s);
    /* errors name the alternative */
    json_t *badj = json_loads("{\"type\": \"string\", \"pattern\": \"x\"}", 0, NULL);
    json_t *two[2] = {NULL, badj};
    assert_int_equal(ag_schema_compile_calls(pre, (const json_t *const *)two, 2, "}", &s), AG_ERR_UNSUPPORTED);
    assert_non_null(strstr(ag_error_message(), "schema 1: "));
    json_decref(badj);
    json_decref(schemas[0]);
    free(weather);
}

/* tool_choice auto with an answer schema: a call of either tool, or a
 * bare value of the answer's schema, decided by the first byte. */
static void calls_or_a_value(void **state) {
    char   *weather = q("{'type':'object','properties':{'city':{'type':'string'}},'required':['city']}");
    char   *answer = q("{'type':'object','properties':{'temp':{'type':'integer'}},'required':['temp']}");
    json_t *wj = json_loads(weather, 0, NULL), *aj = json_loads(answer, 0, NULL);
    const ag_schema_alt alts[] = {
        {.prefix = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": ", .schema = wj,
         .suffix = "}\n</tool_call>"},
        {.prefix = "", .schema = aj},
        {.prefix = "<tool_call>\n{\"name\": \"get_time\", \"arguments\": ", .schema = NULL,
         .suffix = "}\n</tool_call>"},
    };
    ag_schema *s;
    assert_int_equal(ag_schema_compile_alts(alts, 3, &s), AG_OK);
    static const char *const ok[] = {
        "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>",
        "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>",
        "{\"temp\": 21}",
        "\n {\"temp\": -3}", /* a bare value may follow whitespace */
    };
    static const char *const bad[] = {
        "{\"city\": \"Paris\"}",                                                  /* not the answer's schema */
        "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {}}\n</tool_call>", /* city required */
        "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"P\"}}",  /* no suffix */
        "{\"temp\": 21}\n</tool_call>",                                          /* the value's end is the end */
        "Sure: {\"temp\": 21}",
        "\"temp\"",
    };
    for (size_t i = 0; i < sizeof ok / sizeof *ok; i++)
        if (!accepts(s, ok[i])) fail_msg("rejected: %s", ok[i]);
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        if (accepts(s, bad[i])) fail_msg("accepted: %s", bad[i]);
    ag_schema_unref(s);
    /* a prefix that may start the bare value is ambiguous: refused */
    const ag_schema_alt llama3[] = {{.prefix = "{\"name\": \"f\", \"parameters\": ", .suffix = "}"},
                                    {.prefix = "", .schema = aj}};
    assert_int_equal(ag_schema_compile_alts(llama3, 2, &s), AG_ERR_INVALID);
    const ag_schema_alt two_bare[] = {{.prefix = "", .schema = aj}, {.prefix = "", .schema = wj}};
    assert_int_equal(ag_schema_compile_alts(two_bare, 2, &s), AG_ERR_INVALID);
    json_decref(wj);
    json_decref(aj);
    free(weather);
    free(answer);
}

/* A literal: exactly its text, then done. */
static void literal(void **state) {
    ag_schema *s;
    assert_int_equal(ag_schema_compile_literal("<think>\nhm\n</think>\n\nHi!", &s), AG_OK);
    assert_true(accepts(s, "<think>\nhm\n</think>\n\nHi!"));
    assert_false(accepts(s, "<think>\nhm\n</think>\n\nHi"));
    assert_false(accepts(s, "<think>\nhm\n</think>\n\nHi!!"));
    ag_schema_matcher *m;
    assert_int_equal(ag_schema_matcher_new(s, NULL, &m), AG_OK);
    assert_true(ag_schema_feed(m, "<think>\nhm\n</think>\n\nHi!", 24));
    assert_true(ag_schema_done(m));
    ag_schema_matcher_free(m);
    ag_schema_unref(s);
    assert_int_equal(ag_schema_compile_literal("", &s), AG_ERR_INVALID);
}

/* Limits that keep a greedy model from looping. */
static void limits(void **state) {
    ag_schema *s = compile_q("{'type':'object'}");
    ag_schema_matcher *m;
    assert_int_equal(ag_schema_matcher_new(s, NULL, &m), AG_OK);
    char ws[AG_SCHEMA_MAX_WS + 1];
    memset(ws, ' ', sizeof ws);
    assert_true(ag_schema_feed(m, ws, AG_SCHEMA_MAX_WS));
    assert_true(ag_schema_feed(m, "{\"a\":", 5));
    assert_true(ag_schema_feed(m, ws, AG_SCHEMA_MAX_WS)); /* a run restarts after a token */
    for (int i = 1; i < AG_SCHEMA_MAX_DEPTH; i++) assert_true(ag_schema_feed(m, "[", 1));
    assert_false(ag_schema_feed(m, "[", 1));
    ag_schema_matcher_free(m);
    assert_int_equal(ag_schema_matcher_new(s, NULL, &m), AG_OK);
    assert_false(ag_schema_feed(m, ws, AG_SCHEMA_MAX_WS + 1));
    ag_schema_matcher_free(m);
    /* a character split across feeds (as across tokens) */
    assert_int_equal(ag_schema_matcher_new(s, NULL, &m), AG_OK);
    assert_true(ag_schema_feed(m, "{\"a\":\"\xe4", 7));
    assert_true(ag_schema_feed(m, "\xb8\xad\"}", 4));
    assert_true(ag_schema_done(m));
    ag_schema_matcher_free(m);
    ag_schema_unref(s);
}

/* ---- the mask ---- */

/* A small SentencePiece-style vocabulary: structure, words, partial UTF-8
 * pieces, a control token and an end token. */
static const char *const k_vocab[] = {
    "<unk>", "<s>", "</s>", "{", "}", "[", "]", "\"", ":", ",", " ", "\n", "{\"", "\":", "\",", "\"}", "\"]",
    "a", "ab", "abc", "name", "\"name\"", "\"name\":", " \"", "1", "12", "-", "0", ".", "5", "e", "true", "false",
    "null", "tr", "ue", "\xe4", "\xb8\xad", "\xe4\xb8\xad", "\\", "\\n", "\\u00", "e9", "x y", "<|ctl|>", "}\n",
    "\"age\"", "age", ":\"", ": ", ", \"", "\u00e9", "]}",
};

static ag_tok *small_tok(void) {
    size_t   n = sizeof k_vocab / sizeof *k_vocab;
    uint32_t lens[64];
    int32_t  types[64];
    for (size_t i = 0; i < n; i++) {
        lens[i] = (uint32_t)strlen(k_vocab[i]);
        types[i] = i == 0 ? AG_TOK_TYPE_UNKNOWN : (i <= 2 || !strcmp(k_vocab[i], "<|ctl|>")) ? AG_TOK_TYPE_CONTROL
                                                                                              : AG_TOK_TYPE_NORMAL;
    }
    ag_tok_spec spec;
    ag_tok_spec_init(&spec);
    spec.model = "llama";
    spec.n_tokens = (uint32_t)n;
    spec.token_text = k_vocab;
    spec.token_len = lens;
    spec.types = types;
    spec.bos = 1, spec.eos = 2, spec.unk = 0;
    spec.add_space_prefix = 0;
    ag_tok *tok = NULL;
    if (ag_tok_new(&spec, &tok)) fail_msg("ag_tok_new: %s", ag_error_message());
    return tok;
}

/* At every byte position of each text: the mask lets through exactly the
 * tokens whose piece the automaton accepts from there (tried one by one),
 * and the end token only where the output may end. */
static void mask_matches_the_automaton(void **state) {
    ag_tok *tok = small_tok();
    ag_schema_vocab *v;
    assert_int_equal(ag_schema_vocab_new(tok, &v), AG_OK);
    const int32_t n = ag_tok_n_vocab(tok);
    static const struct {
        const char *schema, *text;
    } k[] = {
        {"{'type':'object','properties':{'name':{'type':'string','maxLength':3},'age':{'type':'integer',"
         "'minimum':0,'maximum':15}},'required':['name']}",
         "{'name': '\xe4\xb8\xad\\n', 'age': 12}"},
        {"{'type':'object'}", "{'ab': [true, null, -0.5e1, 'x y\\u00e9']}"},
        {"{'type':'array','items':{'enum':['abc','ab',12,1]}}", "['ab', 1, 12, 'abc']"},
        {"{'type':'number','maximum':12}", "12"},
    };
    float *logits = malloc((size_t)n * sizeof *logits);
    for (size_t c = 0; c < sizeof k / sizeof *k; c++) {
        ag_schema *s = compile_q(k[c].schema);
        char      *text = q(k[c].text);
        size_t     len = strlen(text);
        for (size_t at = 0; at <= len; at++) {
            ag_schema_matcher *m;
            assert_int_equal(ag_schema_matcher_new(s, v, &m), AG_OK);
            if (!ag_schema_feed(m, text, at)) fail_msg("case %zu: the text itself is rejected at %zu", c, at);
            for (int32_t id = 0; id < n; id++) logits[id] = 0.0f;
            ag_schema_mask(m, logits);
            for (int32_t id = 0; id < n; id++) {
                bool want;
                if (id == 2) {
                    want = ag_schema_can_end(m);
                } else if (id < 2 || !strcmp(k_vocab[id], "<|ctl|>")) {
                    want = false;
                } else {
                    ag_schema_matcher *t;
                    assert_int_equal(ag_schema_matcher_new(s, NULL, &t), AG_OK);
                    want = ag_schema_feed(t, text, at) && ag_schema_feed(t, k_vocab[id], strlen(k_vocab[id])) &&
                           !ag_schema_done(m);
                    ag_schema_matcher_free(t);
                }
                if (want != (logits[id] == 0.0f))
                    fail_msg("case %zu at %zu ('%.*s'): token '%s' %s", c, at, (int)at, text, k_vocab[id],
                             want ? "masked" : "let through");
            }
            /* the same mask as a bitmap over a larger vocabulary (ids past the
             * matcher's allowed), also after a feed undone by save/restore */
            for (int round = 0; round < 2; round++) {
                uint32_t bits[(64 + 40 + 31) / 32];
                assert_true(n <= 64);
                if (round) {
                    ag_schema_matcher_save(m);
                    ag_schema_feed(m, "1\"", 2);
                    ag_schema_matcher_restore(m);
                }
                ag_schema_allowed_bits(m, bits, n + 40);
                for (int32_t id = 0; id < n + 40; id++)
                    if ((bits[id / 32] >> (id % 32) & 1u) != (id >= n || logits[id] == 0.0f))
                        fail_msg("case %zu at %zu: bitmap of token %d (round %d) differs from the mask", c, at, id,
                                 round);
            }
            ag_schema_matcher_free(m);
        }
        free(text);
        ag_schema_unref(s);
    }
    free(logits);
    ag_schema_vocab_free(v);
    ag_tok_free(tok);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(accepted_and_rejected_texts),
        cmocka_unit_test(json_mode_objects),
        cmocka_unit_test(bounded_numbers_refuse_dead_prefixes),
        cmocka_unit_test(compile_errors),
        cmocka_unit_test(calls),
        cmocka_unit_test(calls_or_a_value),
        cmocka_unit_test(literal),
        cmocka_unit_test(limits),
        cmocka_unit_test(mask_matches_the_automaton),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
