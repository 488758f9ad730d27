/* JSON mode's recognizer (sample/json.h). The documents below were checked
 * with Python's json.loads when they were written: the valid ones parse to a
 * dict; each invalid one fails to parse, is not an object, or (the UTF-8
 * cases) is not valid UTF-8. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "sample/json.h"

static const char *const k_valid[] = {
    "{}",
    " {\042a\042:1}",
    "{\042a\042:[1,2,{\042b\042:null}],\042c\042:true,\042d\042:false}",
    "{\042n\042:-0.5e+10,\042m\042:0,\042k\042:12.25E-3,\042z\042:-0}",
    "{\042s\042:\042caf\134u00e9 \134\042q\134\042 \134\134 \134/ \134b\134f\134n\134r\134t\042}",
    "{\042u\042:\042\303\251\344\270\255\360\237\230\200\042}",
    "{\042e\042:[],\042o\042:{}}",
    "{ \042a\042 : [ 1 , 2 ] }\012",
};

static const char *const k_invalid[] = {
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

static bool accepts(const char *doc, size_t n) {
    ag_json_state s;
    ag_json_init(&s);
    return ag_json_feed(&s, doc, n) && ag_json_done(&s);
}

static void valid_documents_and_their_prefixes(void **state) {
    for (size_t i = 0; i < sizeof k_valid / sizeof *k_valid; i++) {
        const char *d = k_valid[i];
        size_t      n = strlen(d);
        if (!accepts(d, n)) fail_msg("valid document %zu rejected: %s", i, d);
        /* every prefix is accepted byte by byte, and done only once the object closed */
        ag_json_state s;
        ag_json_init(&s);
        size_t close = n;
        while (close > 0 && (d[close - 1] == ' ' || d[close - 1] == '\n')) close--;
        for (size_t k = 0; k < n; k++) {
            assert_true(ag_json_feed(&s, d + k, 1));
            assert_int_equal(ag_json_done(&s), k + 1 >= close);
        }
    }
}

static void invalid_documents(void **state) {
    for (size_t i = 0; i < sizeof k_invalid / sizeof *k_invalid; i++)
        if (accepts(k_invalid[i], strlen(k_invalid[i]))) fail_msg("invalid document %zu accepted: %s", i, k_invalid[i]);
}

static void limits(void **state) {
    char buf[256];
    /* nesting: AG_JSON_MAX_DEPTH containers, not one more */
    size_t n = 0;
    buf[n++] = '{', buf[n++] = '"', buf[n++] = 'a', buf[n++] = '"', buf[n++] = ':';
    for (int i = 1; i < AG_JSON_MAX_DEPTH; i++) buf[n++] = '[';
    ag_json_state s;
    ag_json_init(&s);
    assert_true(ag_json_feed(&s, buf, n));
    assert_false(ag_json_feed(&s, "[", 1));
    /* whitespace runs: AG_JSON_MAX_WS bytes, not one more */
    ag_json_init(&s);
    memset(buf, ' ', AG_JSON_MAX_WS);
    assert_true(ag_json_feed(&s, buf, AG_JSON_MAX_WS));
    ag_json_state t = s;
    assert_false(ag_json_feed(&t, "\n", 1));
    assert_true(ag_json_feed(&s, "{", 1));
    assert_true(ag_json_feed(&s, buf, AG_JSON_MAX_WS)); /* a run restarts after a token */
    /* a character split across feeds (as across tokens) */
    ag_json_init(&s);
    assert_true(ag_json_feed(&s, "{\"a\":\"\xe4", 7));
    assert_true(ag_json_feed(&s, "\xb8\xad\"}", 4));
    assert_true(ag_json_done(&s));
}

/* A forced tool call: one of several prefixes, an object, a suffix. */
static void wrapped(void **state) {
    static const char *const pre[] = {"<tool_call>\n{\"name\": \"get_weather\", \"arguments\": ",
                                      "<tool_call>\n{\"name\": \"get_time\", \"arguments\": "};
    const char              *suf = "}\n</tool_call>";
    static const char *const ok[] = {
        "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>",
        "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {}}\n</tool_call>",
    };
    static const char *const bad[] = {
        "<tool_call>\n{\"name\": \"get_date\", \"arguments\": {}}\n</tool_call>", /* not a given function */
        "<tool_call>\n{\"name\": \"get_time\", \"arguments\": []}\n</tool_call>", /* arguments not an object */
        "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {} }\n</tool_call>", /* not the suffix */
        "{\"name\": \"get_time\", \"arguments\": {}}",                               /* no prefix */
        "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>x",
    };
    for (size_t i = 0; i < 2; i++) {
        ag_json_state s;
        ag_json_init_wrapped(&s, pre, 2, suf);
        size_t n = strlen(ok[i]);
        for (size_t k = 0; k < n; k++) {
            assert_false(ag_json_done(&s));
            assert_true(ag_json_feed(&s, ok[i] + k, 1));
        }
        assert_true(ag_json_done(&s));
    }
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        ag_json_state s;
        ag_json_init_wrapped(&s, pre, 2, suf);
        if (ag_json_feed(&s, bad[i], strlen(bad[i])) && ag_json_done(&s)) fail_msg("accepted: %s", bad[i]);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(valid_documents_and_their_prefixes),
        cmocka_unit_test(invalid_documents),
        cmocka_unit_test(limits),
        cmocka_unit_test(wrapped),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
