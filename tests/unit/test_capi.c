/* The public C API (include/augur.h): its error paths (a missing file, a
 * corrupt one, NULL arguments, invalid UTF-8, bad values, a callback that
 * stops) and, on stories260K, its results against llama2.c's reference
 * (tests/data/parity/stories260K_greedy.json, made by
 * scripts/llama2c_reference.py from the original checkpoint): the prompt's
 * token ids, the greedy continuation streamed through the callback, and the
 * text of the generated ids. Uses only augur.h (and jansson to read the
 * reference). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>
#include <jansson.h>

#include "augur.h"

static char          g_path[4096];
static augur_model  *g_model;
static json_t       *g_ref;

static int setup(void **state) {
    (void)state;
    const char *shared = getenv("AUGUR_SHARED");
    snprintf(g_path, sizeof g_path, "%s/models/tiny/stories260K.gguf", shared ? shared : "../shared");
    augur_model_params p = augur_model_default_params();
    p.n_threads = 2;
    p.n_ctx = 256;
    if (augur_model_load(g_path, &p, &g_model)) {
        fprintf(stderr, "%s\n", augur_last_error());
        return -1;
    }
    json_error_t err;
    g_ref = json_load_file("tests/data/parity/stories260K_greedy.json", 0, &err);
    if (!g_ref) fprintf(stderr, "reference: %s\n", err.text);
    return g_ref ? 0 : -1;
}

static int teardown(void **state) {
    (void)state;
    augur_model_free(g_model);
    json_decref(g_ref);
    return 0;
}

/* ---- loading ---- */

static void test_missing_file(void **state) {
    (void)state;
    augur_model *m = (augur_model *)&m; /* must be reset to NULL */
    augur_status st = augur_model_load("/nonexistent/dir/model.gguf", NULL, &m);
    assert_int_equal(st, AUGUR_ERR_IO);
    assert_null(m);
    assert_non_null(strstr(augur_last_error(), "/nonexistent/dir/model.gguf"));
}

static void write_file(const char *path, const void *data, size_t len) {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(data, 1, len, f), len);
    fclose(f);
}

static void test_corrupt_files(void **state) {
    (void)state;
    char dir[] = "/tmp/augur-capi-XXXXXX";
    assert_non_null(mkdtemp(dir));
    char garbage[4200], truncated[4200];
    snprintf(garbage, sizeof garbage, "%s/garbage.gguf", dir);
    snprintf(truncated, sizeof truncated, "%s/truncated.gguf", dir);
    write_file(garbage, "this is not a GGUF file at all", 30);
    /* the real model cut inside its tensor data */
    FILE *f = fopen(g_path, "rb");
    assert_non_null(f);
    static char head[5000];
    assert_int_equal(fread(head, 1, sizeof head, f), sizeof head);
    fclose(f);
    write_file(truncated, head, sizeof head);
    const char *paths[] = {garbage, truncated};
    for (int i = 0; i < 2; i++) {
        augur_model *m = NULL;
        assert_int_equal(augur_model_load(paths[i], NULL, &m), AUGUR_ERR_FORMAT);
        assert_null(m);
        assert_non_null(strstr(augur_last_error(), paths[i]));
        unlink(paths[i]);
    }
    rmdir(dir);
}

static void test_bad_load_params(void **state) {
    (void)state;
    augur_model       *m = NULL;
    augur_model_params p = augur_model_default_params();
    p.n_ctx = -1;
    assert_int_equal(augur_model_load(g_path, &p, &m), AUGUR_ERR_RANGE);
    assert_null(m);
    p = augur_model_default_params();
    p.draft = "/nonexistent/draft.gguf";
    assert_int_equal(augur_model_load(g_path, &p, &m), AUGUR_ERR_IO);
    assert_non_null(strstr(augur_last_error(), "draft"));
    assert_null(m);
    p.draft = "ngram";
    p.draft_max = 33; /* must be 0 (the source's own) or 1..32 */
    assert_int_equal(augur_model_load(g_path, &p, &m), AUGUR_ERR_RANGE);
    assert_non_null(strstr(augur_last_error(), "draft_max"));
    assert_null(m);
}

/* ---- NULL arguments ---- */

static void test_null_arguments(void **state) {
    (void)state;
    augur_model *m = NULL;
    int32_t     *ids = NULL;
    size_t       n = 0;
    char        *text = NULL;
    assert_int_equal(augur_model_load(NULL, NULL, &m), AUGUR_ERR_INVALID);
    assert_int_equal(augur_model_load(g_path, NULL, NULL), AUGUR_ERR_INVALID);
    assert_int_equal(augur_model_get_info(NULL, &(augur_model_info){0}), AUGUR_ERR_INVALID);
    assert_int_equal(augur_model_get_info(g_model, NULL), AUGUR_ERR_INVALID);
    assert_int_equal(augur_tokenize(NULL, "x", 1, 0, &ids, &n), AUGUR_ERR_INVALID);
    assert_int_equal(augur_tokenize(g_model, NULL, 1, 0, &ids, &n), AUGUR_ERR_INVALID);
    assert_int_equal(augur_tokenize(g_model, "x", 1, 0, NULL, &n), AUGUR_ERR_INVALID);
    assert_int_equal(augur_tokenize(g_model, "x", 1, 0, &ids, NULL), AUGUR_ERR_INVALID);
    assert_int_equal(augur_detokenize(NULL, (int32_t[]){1}, 1, 0, &text, NULL), AUGUR_ERR_INVALID);
    assert_int_equal(augur_detokenize(g_model, NULL, 1, 0, &text, NULL), AUGUR_ERR_INVALID);
    assert_int_equal(augur_detokenize(g_model, (int32_t[]){1}, 1, 0, NULL, NULL), AUGUR_ERR_INVALID);
    augur_message ok = {"user", "hi"}, no_role = {NULL, "hi"}, no_content = {"user", NULL};
    assert_int_equal(augur_chat_render(NULL, &ok, 1, true, &text, NULL), AUGUR_ERR_INVALID);
    assert_int_equal(augur_chat_render(g_model, NULL, 1, true, &text, NULL), AUGUR_ERR_INVALID);
    assert_int_equal(augur_chat_render(g_model, &ok, 1, true, NULL, NULL), AUGUR_ERR_INVALID);
    assert_int_equal(augur_chat_render(g_model, &no_role, 1, true, &text, NULL), AUGUR_ERR_INVALID);
    assert_non_null(strstr(augur_last_error(), "role"));
    assert_int_equal(augur_chat_render(g_model, &no_content, 1, true, &text, NULL), AUGUR_ERR_INVALID);
    assert_non_null(strstr(augur_last_error(), "content"));
    assert_null(text);
    assert_int_equal(augur_generate(NULL, "x", 1, NULL, NULL, NULL, NULL), AUGUR_ERR_INVALID);
    assert_int_equal(augur_generate(g_model, NULL, 1, NULL, NULL, NULL, NULL), AUGUR_ERR_INVALID);
    assert_int_equal(augur_generate_tokens(g_model, NULL, 3, NULL, NULL, NULL, NULL), AUGUR_ERR_INVALID);
    augur_gen_params gp = augur_gen_default_params();
    const char *stops[] = {"a", NULL};
    gp.stop = stops;
    gp.n_stop = 2;
    assert_int_equal(augur_generate(g_model, "x", 1, &gp, NULL, NULL, NULL), AUGUR_ERR_INVALID);
    assert_non_null(strstr(augur_last_error(), "stop string 1"));
    gp.stop = NULL;
    assert_int_equal(augur_generate(g_model, "x", 1, &gp, NULL, NULL, NULL), AUGUR_ERR_INVALID);
    augur_model_free(NULL);
    augur_free(NULL);
}

/* ---- invalid text and values ---- */

static void test_invalid_utf8(void **state) {
    (void)state;
    const char bad[] = "Once upon \xff a time"; /* 0xff never occurs in UTF-8 */
    int32_t   *ids = NULL;
    size_t     n = 7;
    char      *text = NULL;
    augur_usage u;
    assert_int_equal(augur_generate(g_model, bad, sizeof bad - 1, NULL, NULL, NULL, &u), AUGUR_ERR_INVALID);
    assert_non_null(strstr(augur_last_error(), "UTF-8 (byte 10)"));
    assert_int_equal(u.generated_tokens, 0);
    /* a character cut short at the end, and an encoded surrogate */
    assert_int_equal(augur_generate(g_model, "caf\xc3", 4, NULL, NULL, NULL, NULL), AUGUR_ERR_INVALID);
    assert_int_equal(augur_generate(g_model, "\xed\xa0\x80", 3, NULL, NULL, NULL, NULL), AUGUR_ERR_INVALID);
    assert_int_equal(augur_tokenize(g_model, bad, sizeof bad - 1, 0, &ids, &n), AUGUR_ERR_INVALID);
    assert_null(ids);
    assert_int_equal(n, 0);
    augur_message msg = {"user", bad};
    assert_int_equal(augur_chat_render(g_model, &msg, 1, true, &text, NULL), AUGUR_ERR_INVALID);
    assert_non_null(strstr(augur_last_error(), "message 0's content"));
    augur_gen_params gp = augur_gen_default_params();
    const char *stops[] = {"\xc0\xaf"}; /* an overlong '/' */
    gp.stop = stops;
    gp.n_stop = 1;
    assert_int_equal(augur_generate(g_model, "Once", 4, &gp, NULL, NULL, NULL), AUGUR_ERR_INVALID);
}

static void test_bad_values(void **state) {
    (void)state;
    augur_gen_params gp = augur_gen_default_params();
    gp.temperature = -1;
    assert_int_equal(augur_generate(g_model, "Once", 4, &gp, NULL, NULL, NULL), AUGUR_ERR_RANGE);
    assert_non_null(strstr(augur_last_error(), "temperature"));
    gp = augur_gen_default_params();
    gp.max_tokens = -3;
    assert_int_equal(augur_generate(g_model, "Once", 4, &gp, NULL, NULL, NULL), AUGUR_ERR_RANGE);
    gp = augur_gen_default_params();
    gp.prompt_kind = (augur_prompt_kind)7;
    assert_int_equal(augur_generate(g_model, "Once", 4, &gp, NULL, NULL, NULL), AUGUR_ERR_INVALID);
    /* an empty prompt (text "" still gets the BOS stories260K asks for) */
    int32_t *ids = NULL;
    size_t   n = 0;
    assert_int_equal(augur_tokenize(g_model, "", 0, 0, &ids, &n), AUGUR_OK);
    assert_int_equal(n, 0);
    assert_int_equal(augur_generate_tokens(g_model, (int32_t[]){1}, 0, NULL, NULL, NULL, NULL), AUGUR_ERR_INVALID);
    assert_non_null(strstr(augur_last_error(), "empty"));
    assert_int_equal(augur_generate_tokens(g_model, (int32_t[]){1, 99999}, 2, NULL, NULL, NULL, NULL),
                     AUGUR_ERR_INVALID);
    char *text = NULL;
    assert_int_equal(augur_detokenize(g_model, (int32_t[]){1, 99999}, 2, 0, &text, NULL), AUGUR_ERR_RANGE);
    assert_null(text);
    /* a prompt longer than the context (256 tokens) */
    char long_prompt[4000];
    long_prompt[0] = '\0';
    for (int i = 0; i < 100; i++) strcat(long_prompt, "the big dog ");
    assert_int_equal(augur_generate(g_model, long_prompt, strlen(long_prompt), NULL, NULL, NULL, NULL),
                     AUGUR_ERR_RANGE);
    assert_non_null(strstr(augur_last_error(), "context_length_exceeded"));
}

/* ---- results against llama2.c ---- */

typedef struct {
    char   text[4096];
    size_t len;
    int    pieces, stop_after;
} collected;

static int collect(const char *piece, size_t len, void *user) {
    collected *c = user;
    assert_true(len > 0);
    assert_true(c->len + len < sizeof c->text);
    memcpy(c->text + c->len, piece, len);
    c->len += len;
    c->text[c->len] = '\0';
    c->pieces++;
    return c->stop_after > 0 && c->pieces >= c->stop_after;
}

static void test_matches_llama2c(void **state) {
    (void)state;
    const char *prompt = json_string_value(json_object_get(g_ref, "prompt"));
    json_t     *want_ids = json_object_get(g_ref, "prompt_tokens"), *gen = json_object_get(g_ref, "generated");
    const char *want_text = json_string_value(json_object_get(g_ref, "text"));
    int32_t    *ids = NULL;
    size_t      n = 0;
    assert_int_equal(augur_tokenize(g_model, prompt, strlen(prompt), AUGUR_TOKENIZE_ADD_SPECIAL, &ids, &n), AUGUR_OK);
    assert_int_equal(n, json_array_size(want_ids));
    for (size_t i = 0; i < n; i++) assert_int_equal(ids[i], json_integer_value(json_array_get(want_ids, i)));
    augur_free(ids);

    augur_gen_params gp = augur_gen_default_params();
    gp.temperature = 0;
    gp.max_tokens = (int)json_array_size(gen);
    gp.ignore_eos = true;
    collected   c = {.len = 0};
    augur_usage u;
    assert_int_equal(augur_generate(g_model, prompt, strlen(prompt), &gp, collect, &c, &u), AUGUR_OK);
    assert_string_equal(c.text, want_text);
    assert_int_equal(u.finish, AUGUR_FINISH_LENGTH);
    assert_int_equal(u.prompt_tokens, (int)json_array_size(want_ids));
    assert_int_equal(u.generated_tokens, gp.max_tokens);

    /* the text of the generated ids, at once */
    int32_t *out = malloc(sizeof *out * json_array_size(gen));
    for (size_t i = 0; i < json_array_size(gen); i++) out[i] = (int32_t)json_integer_value(json_array_get(gen, i));
    char  *text = NULL;
    size_t len = 0;
    assert_int_equal(augur_detokenize(g_model, out, json_array_size(gen), 0, &text, &len), AUGUR_OK);
    assert_int_equal(len, strlen(want_text));
    assert_string_equal(text, want_text);
    augur_free(text);
    free(out);
}

static void test_callback_stops(void **state) {
    (void)state;
    augur_gen_params gp = augur_gen_default_params();
    gp.temperature = 0;
    gp.max_tokens = 100;
    gp.ignore_eos = true;
    collected   c = {.len = 0, .stop_after = 3};
    augur_usage u;
    assert_int_equal(augur_generate(g_model, "Once upon a time", 16, &gp, collect, &c, &u), AUGUR_OK);
    assert_int_equal(c.pieces, 3); /* nothing after the callback said stop */
    assert_int_equal(u.finish, AUGUR_FINISH_CALLBACK);
    assert_true(u.generated_tokens >= 3 && u.generated_tokens < 100);
    /* the greedy text so far is the start of the reference */
    assert_memory_equal(c.text, json_string_value(json_object_get(g_ref, "text")), c.len);
    /* and the model goes on serving */
    collected all = {.len = 0};
    gp.max_tokens = 5;
    assert_int_equal(augur_generate(g_model, "Once upon a time", 16, &gp, collect, &all, &u), AUGUR_OK);
    assert_int_equal(u.finish, AUGUR_FINISH_LENGTH);
    assert_int_equal(u.generated_tokens, 5);
}

static void test_stop_string(void **state) {
    (void)state;
    augur_gen_params gp = augur_gen_default_params();
    gp.temperature = 0;
    gp.max_tokens = 60;
    gp.ignore_eos = true;
    const char *stops[] = {"Lily"};
    gp.stop = stops;
    gp.n_stop = 1;
    collected   c = {.len = 0};
    augur_usage u;
    assert_int_equal(augur_generate(g_model, "Once upon a time", 16, &gp, collect, &c, &u), AUGUR_OK);
    assert_int_equal(u.finish, AUGUR_FINISH_STOP);
    assert_string_equal(c.text, ", there was a little girl named "); /* the reference up to "Lily" */
}

static void test_info_and_chat(void **state) {
    (void)state;
    augur_model_info info;
    assert_int_equal(augur_model_get_info(g_model, &info), AUGUR_OK);
    assert_string_equal(info.architecture, "llama");
    assert_int_equal(info.n_vocab, 512);
    assert_int_equal(info.n_ctx, 256);
    assert_int_equal(info.bos, 1);
    assert_false(info.chat_template); /* stories260K has none: ChatML */
    assert_null(info.draft);
    assert_string_equal(augur_version(), AUGUR_VERSION);
    augur_message msgs[] = {{"system", "Be brief."}, {"user", "Hi"}};
    char  *text = NULL;
    size_t len = 0;
    assert_int_equal(augur_chat_render(g_model, msgs, 2, true, &text, &len), AUGUR_OK);
    assert_string_equal(text, "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
                              "<|im_start|>assistant\n");
    assert_int_equal(len, strlen(text));
    augur_free(text);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_missing_file),    cmocka_unit_test(test_corrupt_files),
        cmocka_unit_test(test_bad_load_params), cmocka_unit_test(test_null_arguments),
        cmocka_unit_test(test_invalid_utf8),    cmocka_unit_test(test_bad_values),
        cmocka_unit_test(test_matches_llama2c), cmocka_unit_test(test_callback_stops),
        cmocka_unit_test(test_stop_string),     cmocka_unit_test(test_info_and_chat),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
