/* Unit tests for src/server: tool-call parsing and streaming hold-back on
 * fixed model outputs. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "server/server.h"
#include "server/job.h"
#include "server/server_impl.h"

static json_t *tools_fixture(void) {
    json_error_t err;
    return json_loads("[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":{}}},"
                      "{\"type\":\"function\",\"function\":{\"name\":\"get_time\"}}]",
                      0, &err);
}

/* Parses and checks call k: its name and its arguments (as JSON, compared
 * structurally with `args_json`). */
static void check_call(json_t *calls, size_t k, const char *name, const char *args_json) {
    json_t *call = json_array_get(calls, k);
    assert_non_null(call);
    assert_string_equal(json_string_value(json_object_get(call, "type")), "function");
    const char *id = json_string_value(json_object_get(call, "id"));
    assert_non_null(id);
    assert_int_equal(strncmp(id, "call_", 5), 0);
    assert_int_equal(strlen(id), 5 + 24);
    json_t *fn = json_object_get(call, "function");
    assert_string_equal(json_string_value(json_object_get(fn, "name")), name);
    const char *args = json_string_value(json_object_get(fn, "arguments"));
    assert_non_null(args);
    json_error_t err;
    json_t *got = json_loads(args, 0, &err);
    json_t *want = json_loads(args_json, 0, &err);
    assert_non_null(got);
    assert_non_null(want);
    assert_true(json_equal(got, want));
    json_decref(got);
    json_decref(want);
}

static bool parse(ag_tool_format f, const char *text, const json_t *tools, json_t **calls, ag_buf *content) {
    return ag_server_parse_tool_calls(f, text, strlen(text), tools, calls, content);
}

static void hermes_single_call(void **state) {
    json_t *calls;
    ag_buf content = {0};
    const char *out = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";
    assert_true(parse(AG_TOOLS_HERMES, out, NULL, &calls, &content));
    assert_int_equal(json_array_size(calls), 1);
    check_call(calls, 0, "get_weather", "{\"city\": \"Paris\"}");
    assert_int_equal(content.len, 0);
    json_decref(calls);
    ag_buf_free(&content);
}

static void hermes_content_and_two_calls(void **state) {
    json_t *calls;
    ag_buf content = {0};
    const char *out = "Let me check both.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": "
                      "\"Oslo\", \"days\": [1, 2]}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_time\", "
                      "\"arguments\": {}}\n</tool_call>";
    assert_true(parse(AG_TOOLS_GENERIC, out, NULL, &calls, &content));
    assert_int_equal(json_array_size(calls), 2);
    check_call(calls, 0, "get_weather", "{\"city\": \"Oslo\", \"days\": [1, 2]}");
    check_call(calls, 1, "get_time", "{}");
    assert_string_equal(ag_buf_cstr(&content), "Let me check both.");
    /* ids differ */
    assert_string_not_equal(json_string_value(json_object_get(json_array_get(calls, 0), "id")),
                            json_string_value(json_object_get(json_array_get(calls, 1), "id")));
    json_decref(calls);
    ag_buf_free(&content);
}

/* parallel_tool_calls false (Anthropic: disable_parallel_tool_use): the
 * job keeps the first call of an output that makes two; allowed, both. */
static void one_call_keeps_the_first(void **state) {
    const char *out = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>\n"
                      "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>";
    json_t *tools = tools_fixture();
    srv_job j = {.tf = AG_TOOLS_HERMES, .tool_list = tools, .tools = true};
    for (int one = 0; one < 2; one++) {
        j.one_call = one;
        json_t *calls = NULL;
        ag_buf content = {0};
        assert_true(srv_job_tool_calls(&j, out, strlen(out), &calls, &content));
        assert_int_equal(json_array_size(calls), one ? 1 : 2);
        check_call(calls, 0, "get_weather", "{\"city\": \"Oslo\"}");
        json_decref(calls);
        ag_buf_free(&content);
    }
    json_decref(tools);
}

static void hermes_unterminated_and_string_args(void **state) {
    json_t *calls;
    ag_buf content = {0};
    /* cut at end of output before </tool_call>: the JSON is complete */
    assert_true(parse(AG_TOOLS_HERMES, "<tool_call>{\"name\": \"get_time\", \"arguments\": \"{\\\"tz\\\": \\\"UTC\\\"}\"}",
                      NULL, &calls, &content));
    check_call(calls, 0, "get_time", "{\"tz\": \"UTC\"}");
    json_decref(calls);
    /* no arguments at all: {} */
    assert_true(parse(AG_TOOLS_HERMES, "<tool_call>{\"name\": \"get_time\"}</tool_call>", NULL, &calls, &content));
    check_call(calls, 0, "get_time", "{}");
    json_decref(calls);
    ag_buf_free(&content);
}

static void hermes_malformed_falls_back(void **state) {
    const char *bad[] = {
        "<tool_call>{\"name\": \"get_weather\", \"arguments\": {\"city\": </tool_call>",
        "<tool_call>{\"arguments\": {}}</tool_call>",
        "<tool_call>{\"name\": 5}</tool_call>",
        "<tool_call>{\"name\": \"\"}</tool_call>",
        "<tool_call>[1, 2]</tool_call>",
        "<tool_call>{\"name\": \"get_time\", \"arguments\": [1]}</tool_call>",
        "<tool_call></tool_call>",
        "<tool_call>{\"name\": \"a\"}</tool_call><tool_call>nope</tool_call>",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        json_t *calls = (json_t *)1;
        ag_buf content = {0};
        ag_buf_append_str(&content, "keep");
        assert_false(parse(AG_TOOLS_HERMES, bad[i], NULL, &calls, &content));
        assert_null(calls);
        assert_string_equal(ag_buf_cstr(&content), "keep");
        ag_buf_free(&content);
    }
}

static void bare_json_needs_a_known_tool(void **state) {
    json_t *tools = tools_fixture();
    json_t *calls;
    ag_buf content = {0};
    /* Qwen2.5 0.5B writes the call without tags */
    const char *out = "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}";
    assert_true(parse(AG_TOOLS_HERMES, out, tools, &calls, &content));
    check_call(calls, 0, "get_weather", "{\"city\": \"Paris\"}");
    json_decref(calls);
    /* a JSON answer that is not a call of ours stays content */
    assert_false(parse(AG_TOOLS_HERMES, "{\"name\": \"Alice\", \"arguments\": {}}", tools, &calls, &content));
    assert_false(parse(AG_TOOLS_HERMES, out, NULL, &calls, &content));
    /* trailing prose: not a call */
    assert_false(parse(AG_TOOLS_GENERIC, "{\"name\": \"get_time\"} and then", tools, &calls, &content));
    json_decref(tools);
    ag_buf_free(&content);
}

static void llama3_python_tag_and_parameters(void **state) {
    json_t *tools = tools_fixture();
    json_t *calls;
    ag_buf content = {0};
    const char *out = "<|python_tag|>{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Rome\"}}; "
                      "{\"name\": \"get_time\", \"parameters\": {\"tz\": \"CET\"}}";
    assert_true(parse(AG_TOOLS_LLAMA3, out, tools, &calls, &content));
    assert_int_equal(json_array_size(calls), 2);
    check_call(calls, 0, "get_weather", "{\"city\": \"Rome\"}");
    check_call(calls, 1, "get_time", "{\"tz\": \"CET\"}");
    assert_int_equal(content.len, 0);
    json_decref(calls);
    /* Llama 3 format ignores <tool_call> tags: such text is content */
    assert_false(parse(AG_TOOLS_LLAMA3, "<tool_call>{\"name\": \"get_time\"}</tool_call>", tools, &calls, &content));
    json_decref(tools);
    ag_buf_free(&content);
}

static void plain_text_is_not_a_call(void **state) {
    json_t *tools = tools_fixture();
    json_t *calls;
    ag_buf content = {0};
    const char *texts[] = {"", "   ", "The weather in Paris is sunny.", "Use <tool_call to call", "{", "{}",
                           "null"};
    for (size_t i = 0; i < sizeof texts / sizeof texts[0]; i++)
        assert_false(parse(AG_TOOLS_GENERIC, texts[i], tools, &calls, &content));
    assert_false(ag_server_parse_tool_calls(AG_TOOLS_GENERIC, NULL, 0, tools, &calls, &content));
    json_decref(tools);
    ag_buf_free(&content);
}

/* Small models fence a bare call in Markdown; it counts only as the whole
 * output and with a known name (Qwen2.5-0.5B under tool_choice auto). */
static void fenced_bare_call(void **state) {
    json_t *tools = tools_fixture();
    json_t *calls;
    ag_buf content = {0};
    const char *out = "```json\n{\n  \"name\": \"get_weather\",\n  \"arguments\": {\"city\": \"Paris\"}\n}\n```";
    assert_true(parse(AG_TOOLS_HERMES, out, tools, &calls, &content));
    check_call(calls, 0, "get_weather", "{\"city\": \"Paris\"}");
    json_decref(calls);
    const char *not_calls[] = {
        "```json\n{\"name\": \"get_date\", \"arguments\": {}}\n```",          /* unknown function */
        "```json\n{\"name\": \"get_weather\", \"arguments\": {}}\n``` and then", /* more text */
        "```json\n{\"name\": \"get_weather\", \"arguments\": {}}",               /* unclosed */
        "```python\nprint(1)\n```",
    };
    for (size_t i = 0; i < sizeof not_calls / sizeof *not_calls; i++)
        assert_false(parse(AG_TOOLS_HERMES, not_calls[i], tools, &calls, &content));
    json_decref(tools);
    ag_buf_free(&content);
}

static size_t safe(ag_tool_format f, const char *s) { return ag_server_tool_safe_prefix(f, s, strlen(s)); }

static void safe_prefix_holds_back_calls(void **state) {
    assert_int_equal(safe(AG_TOOLS_HERMES, "Hello"), 5);
    assert_int_equal(safe(AG_TOOLS_HERMES, "Hello <"), 6);
    assert_int_equal(safe(AG_TOOLS_HERMES, "Hello <tool_c"), 6);
    assert_int_equal(safe(AG_TOOLS_HERMES, "Hello <tool_call>{\"name\""), 6);
    assert_int_equal(safe(AG_TOOLS_HERMES, "Hello <b>"), 9);
    assert_int_equal(safe(AG_TOOLS_HERMES, ""), 0);
    assert_int_equal(safe(AG_TOOLS_HERMES, "  "), 0);
    assert_int_equal(safe(AG_TOOLS_HERMES, " {\"na"), 0);
    assert_int_equal(safe(AG_TOOLS_GENERIC, "<|python"), 0);
    assert_int_equal(safe(AG_TOOLS_LLAMA3, "<|python_tag|>{"), 0);
    assert_int_equal(safe(AG_TOOLS_LLAMA3, "Sure <tool_c"), 12);
    assert_int_equal(safe(AG_TOOLS_LLAMA3, "x {"), 3);
    /* a fence whose body could be a call is held; any other is released */
    assert_int_equal(safe(AG_TOOLS_HERMES, "``"), 0);
    assert_int_equal(safe(AG_TOOLS_HERMES, "```js"), 0);
    assert_int_equal(safe(AG_TOOLS_HERMES, "```json\n  "), 0);
    assert_int_equal(safe(AG_TOOLS_HERMES, "```json\n{\"na"), 0);
    assert_int_equal(safe(AG_TOOLS_HERMES, "```python\nprint"), 15);
}

static void format_from_template(void **state) {
    assert_int_equal(ag_server_tool_format(NULL, 0), AG_TOOLS_HERMES);
    const char *qwen = "{%- if tools %}... <tool_call>\\n{\"name\": ...";
    assert_int_equal(ag_server_tool_format(qwen, strlen(qwen)), AG_TOOLS_HERMES);
    const char *llama = "{{- '<|start_header_id|>ipython<|end_header_id|>' }} <|python_tag|>";
    assert_int_equal(ag_server_tool_format(llama, strlen(llama)), AG_TOOLS_LLAMA3);
    const char *other = "{% for m in messages %}[INST]{{ m.content }}{% endfor %}";
    assert_int_equal(ag_server_tool_format(other, strlen(other)), AG_TOOLS_GENERIC);
}

/* Arbitrary bytes never crash the parser or the hold-back. */
static void random_outputs_are_safe(void **state) {
    json_t *tools = tools_fixture();
    const char *atoms[] = {"<tool_call>", "</tool_call>", "{", "}", "\"name\"", ":", "\"get_time\"", ",",
                           "\"arguments\"", "[", "]", ";", " ", "\n", "<|python_tag|>", "\"", "\\", "\xff", "x"};
    uint64_t rng = 88172645463325252ull;
    for (int it = 0; it < 3000; it++) {
        char buf[512];
        size_t n = 0;
        rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
        int parts = (int)(rng % 24);
        for (int p = 0; p < parts; p++) {
            rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
            const char *a = atoms[rng % (sizeof atoms / sizeof atoms[0])];
            size_t l = strlen(a);
            if (n + l >= sizeof buf) break;
            memcpy(buf + n, a, l);
            n += l;
        }
        for (int f = 0; f < 3; f++) {
            json_t *calls = NULL;
            ag_buf content = {0};
            if (ag_server_parse_tool_calls((ag_tool_format)f, buf, n, tools, &calls, &content)) {
                assert_true(json_array_size(calls) >= 1);
                json_decref(calls);
            }
            ag_buf_free(&content);
            assert_true(ag_server_tool_safe_prefix((ag_tool_format)f, buf, n) <= n);
        }
    }
    json_decref(tools);
}

/* The <think> split: what each output holds, and streaming it one byte
 * at a time gives monotone pieces that end as the whole-text split does. */
static void think_split(void **state) {
    static const struct {
        const char *text;
        bool        opened;
        const char *reasoning, *answer;
    } cases[] = {
        {"<think>\nWhy? Because.\n</think>\n\nThe answer.", false, "Why? Because.", "The answer."},
        {"  <think>a</think>b", false, "a", "b"},
        {"The answer <think>not</think>.", false, "", "The answer <think>not</think>."},
        {"<thinking>x", false, "", "<thinking>x"},
        {"<thi", false, "", "<thi"},                  /* a tag never finished: text */
        {"<think>\nstill thinking", false, "still thinking", ""}, /* never closed */
        {"reason\n</think>\nanswer", true, "reason", "answer"}, /* the prompt opened it */
        {"</think>answer", true, "", "answer"},
        {"<think>\n\n</think>\n\n", false, "", ""},
        {"<think>a</th</think>b", false, "a</th", "b"},
    };
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        const char *t = cases[k].text;
        size_t n = strlen(t);
        ag_think whole;
        ag_think_init(&whole, cases[k].opened);
        ag_think_scan(&whole, t, n, true);
        assert_true(ag_think_answer_known(&whole));
        size_t rlen = whole.phase == AG_THINK_NONE ? 0 : whole.reason_end - whole.reason_start;
        if (rlen != strlen(cases[k].reasoning) || memcmp(t + whole.reason_start, cases[k].reasoning, rlen))
            fail_msg("case %zu: reasoning '%.*s'", k, (int)rlen, t + whole.reason_start);
        if (strcmp(t + whole.answer_start, cases[k].answer)) fail_msg("case %zu: answer '%s'", k, t + whole.answer_start);
        /* byte by byte: the reasoning and the answer only grow, to the same end */
        ag_think inc;
        ag_think_init(&inc, cases[k].opened);
        size_t last_r = 0, last_a = 0;
        bool answer_seen = false;
        for (size_t len = 0; len <= n; len++) {
            ag_think_scan(&inc, t, len, len == n);
            size_t r = inc.phase == AG_THINK_LEAD || inc.phase == AG_THINK_NONE ? 0 : inc.reason_end - inc.reason_start;
            assert_true(r >= last_r);
            last_r = r;
            if (ag_think_answer_known(&inc)) {
                if (answer_seen) assert_int_equal(inc.answer_start, whole.answer_start);
                answer_seen = true;
                last_a = len - inc.answer_start;
            }
        }
        assert_int_equal(last_r, rlen);
        assert_int_equal(last_a, strlen(cases[k].answer));
    }
    assert_true(ag_think_template_thinks("{{ '</think>' }}", 15));
    assert_false(ag_think_template_thinks("{{ messages }}", 14));
    assert_true(ag_think_prompt_opens("<|Assistant|><think>\n", 21));
    assert_false(ag_think_prompt_opens("<think>\n</think>\n", 18));
}

/* gpt-oss's harmony format: what each output holds, and reading it
 * incrementally (a byte at a time, and in two pieces split at every byte)
 * gives only growing reasoning and answer that end as the whole-text read
 * does, never with a piece of a marker in them. */
static void harmony_split(void **state) {
    static const struct {
        const char *text, *prompt_tail;
        const char *reasoning, *content;
        const char *calls; /* "name=args;..." */
    } cases[] = {
        {"<|channel|>analysis<|message|>The user greets me.<|end|><|start|>assistant<|channel|>final<|message|>Hello!",
         NULL, "The user greets me.", "Hello!", ""},
        /* <|return|> / <|call|> rendered as text (a vocabulary without them) end the message too */
        {"<|channel|>analysis<|message|>think<|end|><|start|>assistant<|channel|>final<|message|>Hi<|return|>", NULL,
         "think", "Hi", ""},
        {"<|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant<|channel|>commentary "
         "to=functions.get_weather <|constrain|>json<|message|>{\"city\": \"Paris\"}",
         NULL, "Need weather.", "", "get_weather={\"city\": \"Paris\"}"},
        /* the recipient before the channel, and two calls */
        {"<|channel|>analysis<|message|>two<|end|><|start|>assistant to=functions.a<|channel|>commentary "
         "json<|message|>{\"x\":1}<|call|><|start|>assistant to=functions.b<|channel|>commentary<|message|>{}<|call|>",
         NULL, "two", "", "a={\"x\":1};b={}"},
        /* a preamble on commentary is answer text; analysis messages join with a line break */
        {"<|channel|>analysis<|message|>one<|end|><|start|>assistant<|channel|>commentary<|message|>Let me check."
         "<|end|><|start|>assistant<|channel|>analysis<|message|>two<|end|><|start|>assistant<|channel|>commentary "
         "to=functions.t<|message|>{}",
         NULL, "one\ntwo", "Let me check.", "t={}"},
        /* no header at all: all answer; whitespace between messages is nothing */
        {"Just an answer.", NULL, "", "Just an answer.", ""},
        {"\n Just an answer.", NULL, "", "Just an answer.", ""},
        {"<|channel|>analysis<|message|>r<|end|>\n<|start|>assistant<|channel|>final<|message|>a\n", NULL, "r", "a\n",
         ""},
        {"<|channel|>final<|message|>a<|end|> \n", NULL, "", "a", ""},
        {"{\"a\": 1}", NULL, "", "{\"a\": 1}", ""},
        /* cut inside the reasoning (max_tokens): reasoning only */
        {"<|channel|>analysis<|message|>still thinking", NULL, "still thinking", "", ""},
        /* a header cut off, a call cut off: nothing of them */
        {"<|channel|>analysis<|message|>r<|end|><|start|>assistant<|chan", NULL, "r", "", ""},
        {"<|channel|>commentary to=functions.f<|message|>{\"a\": ", NULL, "", "", ""},
        /* a message from another role (an imagined tool reply) is dropped */
        {"<|channel|>commentary to=functions.f<|message|>{}<|call|><|start|>functions.f to=assistant<|channel|>"
         "commentary<|message|>\"sunny\"<|end|>",
         NULL, "", "", "f={}"},
        /* text that looks like a marker but is not one stays */
        {"<|channel|>final<|message|>a <| b <|x|> c <", NULL, "", "a <| b <|x|> c <", ""},
        /* the prompt ended inside the final body (a prefill) */
        {"continued.", "<|start|>assistant<|channel|>final<|message|>", "", "continued.", ""},
        {"more<|end|><|start|>assistant<|channel|>final<|message|>done", "<|start|>assistant<|channel|>analysis<|message|>",
         "more", "done", ""},
    };
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        const char *t = cases[k].text;
        size_t n = strlen(t);
        ag_harmony whole;
        ag_harmony_init(&whole);
        if (cases[k].prompt_tail) ag_harmony_start_in(&whole, cases[k].prompt_tail, strlen(cases[k].prompt_tail));
        ag_harmony_scan(&whole, t, n, true);
        if (strcmp(ag_buf_cstr(&whole.reasoning), cases[k].reasoning))
            fail_msg("case %zu: reasoning '%s'", k, ag_buf_cstr(&whole.reasoning));
        if (strcmp(ag_buf_cstr(&whole.content), cases[k].content))
            fail_msg("case %zu: content '%s'", k, ag_buf_cstr(&whole.content));
        ag_buf got = {0};
        size_t i;
        json_t *c;
        json_array_foreach(whole.calls, i, c) {
            json_t *fn = json_object_get(c, "function");
            ag_buf_printf(&got, "%s%s=%s", i ? ";" : "", json_string_value(json_object_get(fn, "name")),
                          json_string_value(json_object_get(fn, "arguments")));
            assert_int_equal(strncmp(json_string_value(json_object_get(c, "id")), "call_", 5), 0);
        }
        if (strcmp(ag_buf_cstr(&got), cases[k].calls)) fail_msg("case %zu: calls '%s'", k, ag_buf_cstr(&got));
        ag_buf_free(&got);
        bool markers_in_text = strstr(cases[k].content, "<|") != NULL;
        for (int mode = 0; mode < 2; mode++) {
            for (size_t split = 0; split <= n; split++) {
                ag_harmony inc;
                ag_harmony_init(&inc);
                if (cases[k].prompt_tail) ag_harmony_start_in(&inc, cases[k].prompt_tail, strlen(cases[k].prompt_tail));
                size_t last_r = 0, last_c = 0;
                for (size_t len = mode ? split : 0; len <= n; len = len < split ? split : len + 1) {
                    ag_harmony_scan(&inc, t, len, len == n);
                    assert_true(inc.reasoning.len >= last_r && inc.content.len >= last_c);
                    last_r = inc.reasoning.len;
                    last_c = inc.content.len;
                    /* what is out so far is the start of the whole read's */
                    assert_true(!memcmp(ag_buf_cstr(&inc.reasoning), ag_buf_cstr(&whole.reasoning), last_r));
                    assert_true(!memcmp(ag_buf_cstr(&inc.content), ag_buf_cstr(&whole.content), last_c));
                    if (!markers_in_text) {
                        assert_null(strchr(ag_buf_cstr(&inc.content), '<'));
                        assert_null(strchr(ag_buf_cstr(&inc.reasoning), '<'));
                    }
                    if (mode && len == split && split < n) {
                        len = n - 1; /* the second piece is the rest */
                    }
                }
                assert_int_equal(last_r, whole.reasoning.len);
                assert_int_equal(last_c, whole.content.len);
                assert_int_equal(json_array_size(inc.calls), json_array_size(whole.calls));
                ag_harmony_free(&inc);
                if (!mode) break; /* byte by byte once */
            }
        }
        ag_harmony_free(&whole);
    }
    const char *tmpl = "{{- '<|start|>system<|message|>' }}...<|start|>assistant<|channel|>final";
    assert_true(ag_harmony_template(tmpl, strlen(tmpl)));
    assert_false(ag_harmony_template("<|im_start|>", 12));
    assert_false(ag_harmony_template(NULL, 0));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(think_split),
        cmocka_unit_test(harmony_split),
        cmocka_unit_test(hermes_single_call),
        cmocka_unit_test(hermes_content_and_two_calls),
        cmocka_unit_test(one_call_keeps_the_first),
        cmocka_unit_test(hermes_unterminated_and_string_args),
        cmocka_unit_test(hermes_malformed_falls_back),
        cmocka_unit_test(fenced_bare_call),
        cmocka_unit_test(bare_json_needs_a_known_tool),
        cmocka_unit_test(llama3_python_tag_and_parameters),
        cmocka_unit_test(plain_text_is_not_a_call),
        cmocka_unit_test(safe_prefix_holds_back_calls),
        cmocka_unit_test(format_from_template),
        cmocka_unit_test(random_outputs_are_safe),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
