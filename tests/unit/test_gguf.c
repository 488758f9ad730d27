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


/* ---- writer round trip ---- */

/* Deep comparison of two values (the expected one built in memory, the
 * actual one read back). */
static void assert_value_equal(const ag_gguf_value *want, const ag_gguf_value *got) {
    assert_int_equal(got->type, want->type);
    switch (want->type) {
    case AG_GGUF_U8: case AG_GGUF_U16: case AG_GGUF_U32: case AG_GGUF_U64: case AG_GGUF_BOOL:
        assert_true(got->u == want->u);
        break;
    case AG_GGUF_I8: case AG_GGUF_I16: case AG_GGUF_I32: case AG_GGUF_I64:
        assert_true(got->i == want->i);
        break;
    case AG_GGUF_F32: assert_true((float)got->f == (float)want->f); break;
    case AG_GGUF_F64: assert_true(got->f == want->f); break;
    case AG_GGUF_STRING:
        assert_int_equal(got->str.len, want->str.len);
        if (want->str.len) assert_memory_equal(got->str.ptr, want->str.ptr, want->str.len);
        break;
    case AG_GGUF_ARRAY: {
        assert_int_equal(got->arr.elem_type, want->arr.elem_type);
        assert_int_equal(got->arr.n, want->arr.n);
        ag_gguf_type et = want->arr.elem_type;
        if (et == AG_GGUF_STRING || et == AG_GGUF_ARRAY) {
            for (uint64_t k = 0; k < want->arr.n; k++) assert_value_equal(&want->arr.items[k], &got->arr.items[k]);
        } else {
            size_t es = et == AG_GGUF_U8 || et == AG_GGUF_I8 || et == AG_GGUF_BOOL ? 1
                        : et == AG_GGUF_U16 || et == AG_GGUF_I16                    ? 2
                        : et == AG_GGUF_U32 || et == AG_GGUF_I32 || et == AG_GGUF_F32 ? 4
                                                                                      : 8;
            if (want->arr.n) assert_memory_equal(got->arr.raw, want->arr.raw, want->arr.n * es);
        }
        break;
    }
    default: fail();
    }
}

#define SCALAR(t, field, val) ((ag_gguf_value){.type = (t), .field = (val)})
#define STRV(s) ((ag_gguf_value){.type = AG_GGUF_STRING, .str = {(s), sizeof(s) - 1}})
#define NUMARR(et, A) \
    ((ag_gguf_value){.type = AG_GGUF_ARRAY, .arr = {.elem_type = (et), .n = sizeof(A) / sizeof((A)[0]), .raw = (A)}})
#define ITEMARR(et, A) \
    ((ag_gguf_value){.type = AG_GGUF_ARRAY, .arr = {.elem_type = (et), .n = sizeof(A) / sizeof((A)[0]), .items = (A)}})

static const uint8_t a_u8[] = {0, 1, 255};
static const int8_t a_i8[] = {-128, 0, 127};
static const uint16_t a_u16[] = {0, 65535, 300};
static const int16_t a_i16[] = {-32768, 32767};
static const uint32_t a_u32[] = {7, 4000000000u};
static const int32_t a_i32[] = {-2147483647 - 1, 5, 2147483647};
static const float a_f32[] = {1.5f, -0.0f, 3.4e38f, 1e-40f};
static const uint8_t a_bool[] = {1, 0, 1, 1};
static const uint64_t a_u64[] = {UINT64_MAX, 0};
static const int64_t a_i64[] = {INT64_MIN, INT64_MAX, -1};
static const double a_f64[] = {3.141592653589793, -1e300};

typedef struct {
    const char   *key;
    ag_gguf_value v;
} kv_case;

/* Builds every value type: scalars, numeric arrays, string arrays, arrays
 * of arrays (of numbers, of strings, of arrays) and empty ones. */
static size_t build_cases(kv_case *c) {
    static ag_gguf_value strs[4], inner_nums[3], inner_strs[2], inner_inner[1], deep[AG_GGUF_MAX_DEPTH];
    static char longstr[3000];
    memset(longstr, 'x', sizeof longstr);
    strs[0] = STRV("hello");
    strs[1] = STRV("");
    strs[2] = STRV("h\xC3\xA9llo \xE2\x82\xAC");
    strs[3] = (ag_gguf_value){.type = AG_GGUF_STRING, .str = {longstr, sizeof longstr}};
    inner_nums[0] = NUMARR(AG_GGUF_U32, a_u32);
    inner_nums[1] = NUMARR(AG_GGUF_F32, a_f32); /* sub-arrays may differ in type */
    inner_nums[2] = (ag_gguf_value){.type = AG_GGUF_ARRAY, .arr = {.elem_type = AG_GGUF_I64, .n = 0}};
    inner_strs[0] = ITEMARR(AG_GGUF_STRING, strs);
    inner_strs[1] = (ag_gguf_value){.type = AG_GGUF_ARRAY, .arr = {.elem_type = AG_GGUF_STRING, .n = 0}};
    inner_inner[0] = ITEMARR(AG_GGUF_ARRAY, inner_nums);
    /* The deepest nesting the reader accepts: AG_GGUF_MAX_DEPTH arrays. */
    deep[0] = NUMARR(AG_GGUF_U8, a_u8);
    for (int d = 1; d < AG_GGUF_MAX_DEPTH; d++)
        deep[d] = (ag_gguf_value){.type = AG_GGUF_ARRAY, .arr = {.elem_type = AG_GGUF_ARRAY, .n = 1, .items = &deep[d - 1]}};
    size_t n = 0;
    c[n++] = (kv_case){"general.alignment", SCALAR(AG_GGUF_U32, u, 64)};
    c[n++] = (kv_case){"s.u8", SCALAR(AG_GGUF_U8, u, 200)};
    c[n++] = (kv_case){"s.i8", SCALAR(AG_GGUF_I8, i, -5)};
    c[n++] = (kv_case){"s.u16", SCALAR(AG_GGUF_U16, u, 60000)};
    c[n++] = (kv_case){"s.i16", SCALAR(AG_GGUF_I16, i, -30000)};
    c[n++] = (kv_case){"s.u32", SCALAR(AG_GGUF_U32, u, 4000000000u)};
    c[n++] = (kv_case){"s.i32", SCALAR(AG_GGUF_I32, i, -2000000000)};
    c[n++] = (kv_case){"s.f32", SCALAR(AG_GGUF_F32, f, 3.25)};
    c[n++] = (kv_case){"s.bool", SCALAR(AG_GGUF_BOOL, u, 1)};
    c[n++] = (kv_case){"s.bool0", SCALAR(AG_GGUF_BOOL, u, 0)};
    c[n++] = (kv_case){"s.str", STRV("h\xC3\xA9llo")};
    c[n++] = (kv_case){"s.empty", STRV("")};
    c[n++] = (kv_case){"s.u64", SCALAR(AG_GGUF_U64, u, UINT64_MAX - 3)};
    c[n++] = (kv_case){"s.i64", SCALAR(AG_GGUF_I64, i, INT64_MIN)};
    c[n++] = (kv_case){"s.f64", SCALAR(AG_GGUF_F64, f, -2.718281828459045)};
    c[n++] = (kv_case){"a.u8", NUMARR(AG_GGUF_U8, a_u8)};
    c[n++] = (kv_case){"a.i8", NUMARR(AG_GGUF_I8, a_i8)};
    c[n++] = (kv_case){"a.u16", NUMARR(AG_GGUF_U16, a_u16)};
    c[n++] = (kv_case){"a.i16", NUMARR(AG_GGUF_I16, a_i16)};
    c[n++] = (kv_case){"a.u32", NUMARR(AG_GGUF_U32, a_u32)};
    c[n++] = (kv_case){"a.i32", NUMARR(AG_GGUF_I32, a_i32)};
    c[n++] = (kv_case){"a.f32", NUMARR(AG_GGUF_F32, a_f32)};
    c[n++] = (kv_case){"a.bool", NUMARR(AG_GGUF_BOOL, a_bool)};
    c[n++] = (kv_case){"a.u64", NUMARR(AG_GGUF_U64, a_u64)};
    c[n++] = (kv_case){"a.i64", NUMARR(AG_GGUF_I64, a_i64)};
    c[n++] = (kv_case){"a.f64", NUMARR(AG_GGUF_F64, a_f64)};
    c[n++] = (kv_case){"a.str", ITEMARR(AG_GGUF_STRING, strs)};
    c[n++] = (kv_case){"a.empty", {.type = AG_GGUF_ARRAY, .arr = {.elem_type = AG_GGUF_U32, .n = 0}}};
    c[n++] = (kv_case){"a.arr_nums", ITEMARR(AG_GGUF_ARRAY, inner_nums)};
    c[n++] = (kv_case){"a.arr_strs", ITEMARR(AG_GGUF_ARRAY, inner_strs)};
    c[n++] = (kv_case){"a.arr_arr", ITEMARR(AG_GGUF_ARRAY, inner_inner)};
    c[n++] = (kv_case){"a.deep", deep[AG_GGUF_MAX_DEPTH - 1]};
    return n;
}

typedef struct {
    const char *name;
    uint32_t    type, n_dims;
    uint64_t    ne[4];
} tensor_case;

static const tensor_case tensor_cases[] = {
    {"t.f32", AG_TYPE_F32, 2, {4, 3}},       {"t.f16", AG_TYPE_F16, 1, {8}},
    {"t.q4_0", AG_TYPE_Q4_0, 2, {64, 2}},    {"t.q4_k", AG_TYPE_Q4_K, 3, {256, 1, 2}},
    {"t.i8", AG_TYPE_I8, 1, {5}},            {"t.bf16", AG_TYPE_BF16, 4, {2, 3, 1, 2}},
    {"t.q6_k", AG_TYPE_Q6_K, 2, {512, 1}},   {"t.q8_0", AG_TYPE_Q8_0, 1, {32}},
};

static uint64_t tensor_case_size(const tensor_case *t) {
    uint32_t be, bb;
    assert_true(ag_tensor_type_layout(t->type, &be, &bb));
    uint64_t n = 1;
    for (uint32_t d = 0; d < t->n_dims; d++) n *= t->ne[d];
    return n / be * bb;
}

static void fill_pattern(uint8_t *p, uint64_t n, uint32_t seed) {
    for (uint64_t i = 0; i < n; i++) p[i] = (uint8_t)(i * 31 + seed * 7 + 1);
}

/* Writes the test file; returns the bytes (caller frees). */
static uint8_t *write_case_file(size_t *len, kv_case *cases, size_t *n_cases) {
    ag_gguf_writer *w = ag_gguf_writer_new();
    assert_non_null(w);
    *n_cases = build_cases(cases);
    for (size_t i = 0; i < *n_cases; i++) {
        ag_status s = ag_gguf_writer_add(w, cases[i].key, &cases[i].v);
        if (s) fail_msg("add %s: %s", cases[i].key, ag_error_message());
    }
    for (size_t i = 0; i < sizeof tensor_cases / sizeof tensor_cases[0]; i++) {
        const tensor_case *t = &tensor_cases[i];
        uint64_t size = tensor_case_size(t);
        uint8_t *data = malloc(size);
        fill_pattern(data, size, (uint32_t)i);
        assert_int_equal(ag_gguf_writer_add_tensor(w, t->name, t->type, t->n_dims, t->ne, data, size), AG_OK);
        free(data);
    }
    uint8_t *bytes;
    assert_int_equal(ag_gguf_writer_to_memory(w, &bytes, len), AG_OK);
    ag_gguf_writer_free(w);
    return bytes;
}

static void check_case_file(const ag_gguf *g, const kv_case *cases, size_t n_cases) {
    assert_int_equal(ag_gguf_version(g), 3);
    assert_int_equal(ag_gguf_alignment(g), 64);
    assert_int_equal(ag_gguf_n_kv(g), (int64_t)n_cases);
    for (size_t i = 0; i < n_cases; i++) {
        int64_t k = ag_gguf_find_key(g, cases[i].key);
        assert_int_equal(k, (int64_t)i); /* order preserved */
        assert_string_equal(ag_gguf_key(g, k), cases[i].key);
        assert_int_equal(ag_gguf_kv_type(g, k), cases[i].v.type);
        assert_value_equal(&cases[i].v, ag_gguf_kv_value(g, k));
    }
    size_t nt = sizeof tensor_cases / sizeof tensor_cases[0];
    assert_int_equal(ag_gguf_n_tensors(g), (int64_t)nt);
    assert_int_equal(ag_gguf_data_offset(g) % 64, 0);
    for (size_t i = 0; i < nt; i++) {
        const tensor_case *tc = &tensor_cases[i];
        const ag_gguf_tensor *t = ag_gguf_find_tensor(g, tc->name);
        assert_non_null(t);
        assert_ptr_equal(t, ag_gguf_tensor_at(g, (int64_t)i));
        assert_int_equal(t->type, tc->type);
        assert_int_equal(t->n_dims, tc->n_dims);
        for (uint32_t d = 0; d < 4; d++) assert_int_equal(t->ne[d], d < tc->n_dims ? tc->ne[d] : 1);
        uint64_t size = tensor_case_size(tc);
        assert_int_equal(t->size, size);
        assert_int_equal(t->offset % 64, 0);
        uint8_t *want = malloc(size);
        fill_pattern(want, size, (uint32_t)i);
        assert_memory_equal(t->data, want, size);
        free(want);
    }
    check_consistent(g);
}

static void writer_round_trip_every_type(void **state) {
    kv_case cases[64];
    size_t n_cases, len;
    uint8_t *bytes = write_case_file(&len, cases, &n_cases);
    ag_gguf *g = NULL;
    ag_status s = ag_gguf_open_memory(bytes, len, &g);
    if (s) fail_msg("%s", ag_error_message());
    check_case_file(g, cases, n_cases);

    /* Typed getters, with their conversions and refusals. */
    uint32_t u32;
    int64_t i64;
    float f;
    bool b;
    uint64_t sl;
    assert_true(ag_gguf_get_u32(g, "s.u8", &u32));
    assert_int_equal(u32, 200);
    assert_true(ag_gguf_get_u32(g, "s.u32", &u32));
    assert_int_equal(u32, 4000000000u);
    assert_false(ag_gguf_get_u32(g, "s.i8", &u32));  /* negative */
    assert_false(ag_gguf_get_u32(g, "s.u64", &u32)); /* too big */
    assert_false(ag_gguf_get_u32(g, "s.str", &u32)); /* not an integer */
    assert_false(ag_gguf_get_u32(g, "missing", &u32));
    assert_true(ag_gguf_get_i64(g, "s.i64", &i64));
    assert_true(i64 == INT64_MIN);
    assert_true(ag_gguf_get_i64(g, "s.i16", &i64));
    assert_int_equal(i64, -30000);
    assert_false(ag_gguf_get_i64(g, "s.u64", &i64));
    assert_true(ag_gguf_get_f32(g, "s.f32", &f));
    assert_true(f == 3.25f);
    assert_true(ag_gguf_get_f32(g, "s.i32", &f));
    assert_true(f == -2000000000.0f);
    assert_false(ag_gguf_get_f32(g, "s.str", &f));
    assert_true(ag_gguf_get_bool(g, "s.bool", &b));
    assert_true(b);
    assert_false(ag_gguf_get_bool(g, "s.u8", &b));
    const char *str = ag_gguf_get_str(g, "s.str", &sl);
    assert_int_equal(sl, 6);
    assert_memory_equal(str, "h\xC3\xA9llo", 6);
    assert_non_null(ag_gguf_get_str(g, "s.empty", &sl));
    assert_int_equal(sl, 0);
    assert_null(ag_gguf_get_str(g, "s.u8", &sl));
    const ag_gguf_value *a = ag_gguf_get(g, "a.i32");
    assert_true(ag_gguf_arr_i64(a, 0, &i64));
    assert_true(i64 == INT32_MIN);
    assert_false(ag_gguf_arr_i64(a, 3, &i64)); /* out of range */
    double d;
    assert_true(ag_gguf_arr_f64(ag_gguf_get(g, "a.f64"), 1, &d));
    assert_true(d == -1e300);
    assert_true(ag_gguf_arr_f64(ag_gguf_get(g, "a.u16"), 1, &d));
    assert_true(d == 65535.0);
    assert_false(ag_gguf_arr_i64(ag_gguf_get(g, "a.f32"), 0, &i64));
    assert_false(ag_gguf_arr_i64(ag_gguf_get(g, "a.u64"), 0, &i64)); /* UINT64_MAX */
    assert_false(ag_gguf_arr_f64(ag_gguf_get(g, "a.str"), 0, &d));
    ag_gguf_free(g);

    /* Through a file too: write, map, read. */
    char path[] = "/tmp/augur_gguf_rt_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    ag_gguf_writer *w = ag_gguf_writer_new();
    assert_int_equal(ag_gguf_open_memory(bytes, len, &g), AG_OK);
    for (int64_t i = 0; i < ag_gguf_n_kv(g); i++)
        assert_int_equal(ag_gguf_writer_add(w, ag_gguf_key(g, i), ag_gguf_kv_value(g, i)), AG_OK);
    for (int64_t i = 0; i < ag_gguf_n_tensors(g); i++) {
        const ag_gguf_tensor *t = ag_gguf_tensor_at(g, i);
        assert_int_equal(ag_gguf_writer_add_tensor(w, t->name, t->type, t->n_dims, t->ne, t->data, t->size), AG_OK);
    }
    ag_gguf_free(g);
    assert_int_equal(ag_gguf_writer_write(w, path), AG_OK);
    ag_gguf_writer_free(w);
    assert_int_equal(ag_gguf_open(path, &g), AG_OK);
    check_case_file(g, cases, n_cases);
    assert_int_equal(ag_gguf_file_size(g), len); /* a re-write of a read is the same size */
    ag_gguf_free(g);
    unlink(path);
    free(bytes);
}

/* The writer reproduces a real file byte for byte (the tiny model was
 * written by llama.cpp's converter: same layout rules, independent code). */
static void writer_reproduces_tiny_model(void **state) {
    ag_gguf *g = NULL;
    assert_int_equal(ag_gguf_open(shared_path("models/tiny/stories260K.gguf"), &g), AG_OK);
    ag_gguf_writer *w = ag_gguf_writer_new();
    for (int64_t i = 0; i < ag_gguf_n_kv(g); i++)
        assert_int_equal(ag_gguf_writer_add(w, ag_gguf_key(g, i), ag_gguf_kv_value(g, i)), AG_OK);
    for (int64_t i = 0; i < ag_gguf_n_tensors(g); i++) {
        const ag_gguf_tensor *t = ag_gguf_tensor_at(g, i);
        assert_int_equal(ag_gguf_writer_add_tensor(w, t->name, t->type, t->n_dims, t->ne, t->data, t->size), AG_OK);
    }
    uint8_t *bytes;
    size_t len;
    assert_int_equal(ag_gguf_writer_to_memory(w, &bytes, &len), AG_OK);
    char path[] = "/tmp/augur_gguf_tiny_XXXXXX";
    int fd = mkstemp(path);
    close(fd);
    FILE *f = fopen(shared_path("models/tiny/stories260K.gguf"), "rb");
    assert_non_null(f);
    uint8_t *orig = malloc(ag_gguf_file_size(g));
    assert_int_equal(fread(orig, 1, ag_gguf_file_size(g), f), ag_gguf_file_size(g));
    fclose(f);
    assert_int_equal(len, ag_gguf_file_size(g));
    assert_memory_equal(bytes, orig, len);
    free(orig);
    free(bytes);
    unlink(path);
    ag_gguf_writer_free(w);
    ag_gguf_free(g);
}

static int released;
static void count_release(void *owner) { released += *(int *)owner; }

/* ag_gguf_open_composite: metadata from an image, tensors from elsewhere;
 * the owner is released exactly once, on success (at free) and on failure. */
static void composite_reads_parts(void **state) {
    ag_gguf_writer *w = ag_gguf_writer_new();
    assert_int_equal(ag_gguf_writer_add_str(w, "general.architecture", "llama"), AG_OK);
    assert_int_equal(ag_gguf_writer_add_u32(w, "llama.block_count", 3), AG_OK);
    uint8_t *img;
    size_t   len;
    assert_int_equal(ag_gguf_writer_to_memory(w, &img, &len), AG_OK);
    static const float a[6] = {1, 2, 3, 4, 5, 6};
    static const uint16_t b[3] = {1, 2, 3};
    ag_gguf_tensor t[2] = {{.name = "a", .type = AG_TYPE_F32, .n_dims = 2, .ne = {3, 2}, .size = 24, .data = (const uint8_t *)a},
                           {.name = "b", .type = AG_TYPE_BF16, .n_dims = 1, .ne = {3}, .size = 6, .data = (const uint8_t *)b}};
    int one = 1;
    released = 0;
    ag_gguf *g = NULL;
    assert_int_equal(ag_gguf_open_composite(img, len, t, 2, count_release, &one, &g), AG_OK);
    {
        uint64_t sl;
        const char *arch = ag_gguf_get_str(g, "general.architecture", &sl);
        assert_true(arch && sl == 5 && !memcmp(arch, "llama", 5));
        int64_t bc;
        assert_true(ag_gguf_get_i64(g, "llama.block_count", &bc) && bc == 3);
    }
    const ag_gguf_tensor *ta = ag_gguf_find_tensor(g, "a");
    assert_non_null(ta);
    assert_ptr_equal(ta->data, (const uint8_t *)a);
    assert_int_equal(ta->n_elems, 6);
    assert_int_equal(ta->ne[1], 2);
    assert_int_equal(ta->ne[2], 1);
    assert_non_null(ag_gguf_find_tensor(g, "b"));
    assert_null(ag_gguf_find_tensor(g, "c"));
    assert_int_equal(released, 0);
    ag_gguf_free(g);
    assert_int_equal(released, 1);
    /* a wrong size, a duplicate name: refused, owner released */
    t[1].size = 8;
    assert_int_equal(ag_gguf_writer_to_memory(w, &img, &len), AG_OK);
    assert_int_equal(ag_gguf_open_composite(img, len, t, 2, count_release, &one, &g), AG_ERR_FORMAT);
    assert_null(g);
    assert_int_equal(released, 2);
    t[1].size = 6;
    t[1].name = "a";
    assert_int_equal(ag_gguf_writer_to_memory(w, &img, &len), AG_OK);
    assert_int_equal(ag_gguf_open_composite(img, len, t, 2, count_release, &one, &g), AG_ERR_FORMAT);
    assert_int_equal(released, 3);
    ag_gguf_writer_free(w);
}

static void writer_refuses_bad_input(void **state) {
    ag_gguf_writer *w = ag_gguf_writer_new();
    assert_int_equal(ag_gguf_writer_add_u32(w, "k", 1), AG_OK);
    assert_int_equal(ag_gguf_writer_add_u32(w, "k", 2), AG_ERR_INVALID);
    assert_int_equal(ag_gguf_writer_add_u32(w, "", 2), AG_ERR_INVALID);
    assert_int_equal(ag_gguf_writer_add_u32(w, "general.alignment", 48), AG_ERR_INVALID);
    assert_int_equal(ag_gguf_writer_add_u32(w, "general.alignment", 0), AG_ERR_INVALID);
    assert_int_equal(ag_gguf_writer_add_str(w, "general.alignment", "32"), AG_ERR_INVALID);
    ag_gguf_value big = {.type = AG_GGUF_U8, .u = 256};
    assert_int_equal(ag_gguf_writer_add(w, "u8", &big), AG_ERR_RANGE);
    ag_gguf_value bad_bool = {.type = AG_GGUF_BOOL, .u = 2};
    assert_int_equal(ag_gguf_writer_add(w, "b", &bad_bool), AG_ERR_RANGE);
    ag_gguf_value strs[1] = {{.type = AG_GGUF_U32, .u = 1}};
    ag_gguf_value mixed = ITEMARR(AG_GGUF_STRING, strs); /* item type mismatch */
    assert_int_equal(ag_gguf_writer_add(w, "m", &mixed), AG_ERR_INVALID);
    ag_gguf_value deep[AG_GGUF_MAX_DEPTH + 1];
    deep[0] = NUMARR(AG_GGUF_U8, a_u8);
    for (int d = 1; d <= AG_GGUF_MAX_DEPTH; d++)
        deep[d] = (ag_gguf_value){.type = AG_GGUF_ARRAY, .arr = {.elem_type = AG_GGUF_ARRAY, .n = 1, .items = &deep[d - 1]}};
    assert_int_equal(ag_gguf_writer_add(w, "deep", &deep[AG_GGUF_MAX_DEPTH]), AG_ERR_INVALID);
    uint8_t data[64] = {0};
    uint64_t ne[2] = {32, 1};
    assert_int_equal(ag_gguf_writer_add_tensor(w, "t", AG_TYPE_Q4_0, 2, ne, data, 18), AG_OK);
    assert_int_equal(ag_gguf_writer_add_tensor(w, "t", AG_TYPE_Q4_0, 2, ne, data, 18), AG_ERR_INVALID);
    assert_int_equal(ag_gguf_writer_add_tensor(w, "u", AG_TYPE_Q4_0, 2, ne, data, 20), AG_ERR_INVALID);
    assert_int_equal(ag_gguf_writer_add_tensor(w, "u", 4, 2, ne, data, 18), AG_ERR_INVALID);
    assert_int_equal(ag_gguf_writer_add_tensor(w, "u", AG_TYPE_Q4_0, 5, ne, data, 18), AG_ERR_INVALID);
    uint64_t ne_bad[2] = {33, 1};
    assert_int_equal(ag_gguf_writer_add_tensor(w, "u", AG_TYPE_Q4_0, 2, ne_bad, data, 18), AG_ERR_INVALID);
    /* After the refusals the file still holds exactly what was accepted. */
    uint8_t *bytes;
    size_t len;
    assert_int_equal(ag_gguf_writer_to_memory(w, &bytes, &len), AG_OK);
    ag_gguf *g;
    assert_int_equal(ag_gguf_open_memory(bytes, len, &g), AG_OK);
    assert_int_equal(ag_gguf_n_kv(g), 1);
    assert_int_equal(ag_gguf_n_tensors(g), 1);
    ag_gguf_free(g);
    free(bytes);
    ag_gguf_writer_free(w);
}

static void type_layouts(void **state) {
    uint32_t be, bb;
    /* gaps in ggml's numbering are unknown */
    assert_false(ag_tensor_type_layout(4, &be, &bb));
    assert_false(ag_tensor_type_layout(5, &be, &bb));
    assert_false(ag_tensor_type_layout(31, &be, &bb));
    assert_false(ag_tensor_type_layout(AG_TYPE_COUNT, &be, &bb));
    assert_false(ag_tensor_type_layout(UINT32_MAX, &be, &bb));
    assert_string_equal(ag_tensor_type_name(4), "?");
    assert_string_equal(ag_tensor_type_name(AG_TYPE_Q4_K), "Q4_K");
    /* Every known type: the bytes per block cover the elements with at
     * least the raw bits the name promises (a sanity bound, the exact
     * numbers are checked against the gguf package in tests/py). */
    int known = 0;
    for (uint32_t t = 0; t < AG_TYPE_COUNT; t++) {
        if (!ag_tensor_type_layout(t, &be, &bb)) continue;
        known++;
        assert_true(be == 1 || be % 32 == 0);
        assert_true(bb > 0);
        assert_string_not_equal(ag_tensor_type_name(t), "?");
    }
    assert_int_equal(known, 34);
}

/* ---- corrupted files ---- */

/* Opens `len` bytes at `p` (a heap block of exactly that size, so ASan
 * sees any over-read) and checks the outcome is clean either way. */
static ag_status open_check(const uint8_t *p, size_t len) {
    ag_gguf *g = NULL;
    ag_status s = ag_gguf_open_memory(p, len, &g);
    if (s == AG_OK) {
        check_consistent(g);
        assert_non_null(g);
    } else {
        assert_null(g);
        assert_true(strlen(ag_error_message()) > 0);
    }
    ag_gguf_free(g);
    return s;
}

static ag_status open_copy(const uint8_t *p, size_t len) {
    uint8_t *copy = malloc(len ? len : 1);
    if (len) memcpy(copy, p, len);
    ag_status s = open_check(copy, len);
    free(copy);
    return s;
}

static uint8_t *slurp(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) fail_msg("cannot open %s", path);
    fseek(f, 0, SEEK_END);
    *len = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *p = malloc(*len);
    assert_int_equal(fread(p, 1, *len, f), *len);
    fclose(f);
    return p;
}

static void truncations_fail_cleanly(void **state) {
    size_t len;
    uint8_t *file = slurp(shared_path("models/tiny/stories260K.gguf"), &len);
    ag_gguf *g;
    assert_int_equal(ag_gguf_open_memory(file, len, &g), AG_OK);
    uint64_t data_end = 0, header_end = ag_gguf_data_offset(g);
    for (int64_t i = 0; i < ag_gguf_n_tensors(g); i++) {
        const ag_gguf_tensor *t = ag_gguf_tensor_at(g, i);
        uint64_t e = ag_gguf_data_offset(g) + t->offset + t->size;
        if (e > data_end) data_end = e;
    }
    ag_gguf_free(g);
    /* Every prefix through the header, every 61st through the first 64K and
     * every 4093rd after: valid exactly when every tensor's data is present. */
    size_t tried = 0;
    for (size_t n = 0; n < len; n += n < header_end + 64 ? 1 : n < 65536 ? 61 : 4093) {
        ag_status s = open_copy(file, n);
        if (n >= data_end) assert_int_equal(s, AG_OK);
        else if (s != AG_ERR_FORMAT) fail_msg("prefix %zu: status %d", n, s);
        tried++;
    }
    assert_true(tried > header_end);
    /* Specific header boundaries: in magic, version, counts, first key. */
    static const size_t cuts[] = {0, 1, 3, 4, 5, 7, 8, 12, 15, 16, 20, 23, 24, 25, 31, 32, 33};
    for (size_t i = 0; i < sizeof cuts / sizeof cuts[0]; i++)
        assert_int_equal(open_copy(file, cuts[i]), AG_ERR_FORMAT);
    /* The message names the offset. */
    assert_int_equal(open_copy(file, header_end - 3), AG_ERR_FORMAT);
    assert_non_null(strstr(ag_error_message(), "offset"));
    free(file);
}

/* Flips bits across the header of a real file: whatever the result, no
 * crash, no over-read, and a success is a consistent file. */
static void bit_flips_fail_cleanly(void **state) {
    size_t len;
    uint8_t *file = slurp(shared_path("models/tiny/stories260K.gguf"), &len);
    ag_gguf *g;
    assert_int_equal(ag_gguf_open_memory(file, len, &g), AG_OK);
    size_t header_end = (size_t)ag_gguf_data_offset(g);
    ag_gguf_free(g);
    int fails = 0, oks = 0;
    static const uint8_t masks[] = {0x01, 0x80, 0xFF, 0x40};
    for (size_t pos = 0; pos < header_end; pos += pos < 4096 ? 1 : 7) {
        for (size_t m = 0; m < sizeof masks; m++) {
            file[pos] ^= masks[m];
            ag_status s = open_check(file, len);
            file[pos] ^= masks[m];
            if (s == AG_OK) oks++;
            else if (s == AG_ERR_FORMAT) fails++;
            else fail_msg("flip at %zu: status %d: %s", pos, s, ag_error_message());
        }
    }
    assert_true(fails > 0 && oks > 0); /* flips inside string bytes stay valid */
    free(file);
}

/* ---- hand-built files: an encoder independent of the writer ---- */

typedef struct {
    uint8_t b[4096];
    size_t  n;
} raw;

static void r_bytes(raw *r, const void *p, size_t n) {
    assert_true(r->n + n <= sizeof r->b);
    memcpy(r->b + r->n, p, n);
    r->n += n;
}
static void r_u32(raw *r, uint32_t v) { r_bytes(r, &v, 4); }
static void r_u64(raw *r, uint64_t v) { r_bytes(r, &v, 8); }
static void r_str(raw *r, const char *s) {
    r_u64(r, strlen(s));
    r_bytes(r, s, strlen(s));
}
static void r_zeros(raw *r, size_t n) {
    assert_true(r->n + n <= sizeof r->b);
    memset(r->b + r->n, 0, n);
    r->n += n;
}
static void r_header(raw *r, uint32_t version, uint64_t n_tensors, uint64_t n_kv) {
    r->n = 0;
    r_bytes(r, "GGUF", 4);
    r_u32(r, version);
    r_u64(r, n_tensors);
    r_u64(r, n_kv);
}
static void r_tensor(raw *r, const char *name, uint32_t n_dims, const uint64_t *ne, uint32_t type, uint64_t off) {
    r_str(r, name);
    r_u32(r, n_dims);
    for (uint32_t d = 0; d < n_dims; d++) r_u64(r, ne[d]);
    r_u32(r, type);
    r_u64(r, off);
}
static void r_pad(raw *r, size_t align, size_t extra) {
    while (r->n % align) r->b[r->n++] = 0;
    for (size_t i = 0; i < extra; i++) r->b[r->n++] = (uint8_t)i;
}

static void expect_format(raw *r, const char *needle) {
    ag_status s = open_copy(r->b, r->n);
    if (s != AG_ERR_FORMAT) fail_msg("expected a format error containing '%s', got status %d", needle, s);
    if (!strstr(ag_error_message(), needle)) fail_msg("message '%s' lacks '%s'", ag_error_message(), needle);
}

static void crafted_bad_headers(void **state) {
    raw r;
    uint64_t ne1[1] = {32}, ne2[2] = {32, 2};

    /* A valid baseline: one key, one F32 tensor of 32 elements. */
    r_header(&r, 3, 1, 1);
    r_str(&r, "a");
    r_u32(&r, AG_GGUF_U32);
    r_u32(&r, 7);
    r_tensor(&r, "t", 1, ne1, AG_TYPE_F32, 0);
    r_pad(&r, 32, 128);
    assert_int_equal(open_copy(r.b, r.n), AG_OK);
    r_header(&r, 2, 0, 0); /* v2 reads like v3 */
    assert_int_equal(open_copy(r.b, r.n), AG_OK);

    r_header(&r, 1, 0, 0);
    expect_format(&r, "version 1");
    r_header(&r, 4, 0, 0);
    expect_format(&r, "version 4");
    r_header(&r, 0x03000000, 0, 0);
    expect_format(&r, "big-endian");
    r_header(&r, 3, 0, 0);
    r.b[0] = 'g';
    expect_format(&r, "magic");

    /* huge counts */
    r_header(&r, 3, UINT64_MAX, 0);
    r_zeros(&r, 32);
    expect_format(&r, "tensor count");
    r_header(&r, 3, 0, UINT64_MAX);
    r_zeros(&r, 32);
    expect_format(&r, "key/value count");
    r_header(&r, 3, 0, 1);
    r_u64(&r, UINT64_MAX - 2); /* key length */
    r_zeros(&r, 32);
    expect_format(&r, "runs past the end");
    /* value type out of range, array element type out of range */
    r_header(&r, 3, 0, 1);
    r_str(&r, "k");
    r_u32(&r, 13);
    r_zeros(&r, 32);
    expect_format(&r, "unknown value type 13");
    r_header(&r, 3, 0, 1);
    r_str(&r, "k");
    r_u32(&r, AG_GGUF_ARRAY);
    r_u32(&r, 99);
    r_u64(&r, 0);
    r_zeros(&r, 32);
    expect_format(&r, "unknown array element type 99");
    /* array lengths beyond the file, for each element kind */
    static const uint32_t kinds[] = {AG_GGUF_U8, AG_GGUF_U64, AG_GGUF_STRING, AG_GGUF_ARRAY};
    static const uint64_t huge[] = {UINT64_MAX, UINT64_MAX / 8 + 1, 1ull << 40, 1000};
    for (size_t k = 0; k < 4; k++)
        for (size_t h = 0; h < 4; h++) {
            r_header(&r, 3, 0, 1);
            r_str(&r, "k");
            r_u32(&r, AG_GGUF_ARRAY);
            r_u32(&r, kinds[k]);
            r_u64(&r, huge[h]);
            r_u64(&r, 0);
            r_zeros(&r, 32);
    expect_format(&r, "key 'k'");
        }
    /* nesting one level too deep */
    r_header(&r, 3, 0, 1);
    r_str(&r, "deep");
    r_u32(&r, AG_GGUF_ARRAY);
    for (int d = 0; d < AG_GGUF_MAX_DEPTH; d++) {
        r_u32(&r, AG_GGUF_ARRAY);
        r_u64(&r, 1);
    }
    r_u32(&r, AG_GGUF_U8);
    r_u64(&r, 0);
    r_zeros(&r, 32);
    expect_format(&r, "nested deeper");
    /* bool must be 0 or 1; keys must be non-empty, NUL-free, unique */
    r_header(&r, 3, 0, 1);
    r_str(&r, "b");
    r_u32(&r, AG_GGUF_BOOL);
    r.b[r.n++] = 2;
    r_zeros(&r, 32);
    expect_format(&r, "bool");
    r_header(&r, 3, 0, 1);
    r_str(&r, "");
    r_u32(&r, AG_GGUF_U8);
    r.b[r.n++] = 2;
    r_zeros(&r, 32);
    expect_format(&r, "empty key");
    r_header(&r, 3, 0, 1);
    r_u64(&r, 3);
    r_bytes(&r, "a\0b", 3);
    r_u32(&r, AG_GGUF_U8);
    r.b[r.n++] = 2;
    r_zeros(&r, 32);
    expect_format(&r, "NUL");
    r_header(&r, 3, 0, 2);
    for (int i = 0; i < 2; i++) {
        r_str(&r, "same");
        r_u32(&r, AG_GGUF_U8);
        r.b[r.n++] = 1;
    }
    r_zeros(&r, 32);
    expect_format(&r, "duplicate key 'same'");

    /* alignment: not a power of two, zero, wrong type; a valid 64 is honoured */
    static const uint32_t bad_align[] = {0, 3, 48};
    for (size_t i = 0; i < 3; i++) {
        r_header(&r, 3, 0, 1);
        r_str(&r, "general.alignment");
        r_u32(&r, AG_GGUF_U32);
        r_u32(&r, bad_align[i]);
        r_zeros(&r, 32);
    expect_format(&r, "power of two");
    }
    r_header(&r, 3, 0, 1);
    r_str(&r, "general.alignment");
    r_u32(&r, AG_GGUF_U64);
    r_u64(&r, 32);
    r_zeros(&r, 32);
    expect_format(&r, "expected u32");
    r_header(&r, 3, 1, 1);
    r_str(&r, "general.alignment");
    r_u32(&r, AG_GGUF_U32);
    r_u32(&r, 64);
    r_tensor(&r, "t", 1, ne1, AG_TYPE_F32, 32); /* aligned to 32, not 64 */
    r_pad(&r, 64, 256);
    expect_format(&r, "alignment 64");

    /* tensor infos */
    uint64_t ne5[5] = {32, 1, 1, 1, 1}, ne0[2] = {32, 0}, ne33[1] = {33}, nebig[2] = {1ull << 62, 1ull << 62};
    struct {
        uint32_t n_dims;
        const uint64_t *ne;
        uint32_t type;
        uint64_t off;
        const char *needle;
    } bad_t[] = {
        {5, ne5, AG_TYPE_F32, 0, "5 dimensions"},
        {0, ne1, AG_TYPE_F32, 0, "0 dimensions"},
        {2, ne0, AG_TYPE_F32, 0, "dimension 1 is 0"},
        {1, ne1, 4, 0, "unknown tensor type 4"},
        {1, ne1, 1000, 0, "unknown tensor type 1000"},
        {1, ne33, AG_TYPE_Q4_0, 0, "not a multiple of the Q4_0 block size"},
        {2, nebig, AG_TYPE_F32, 0, "overflows"},
        {1, ne1, AG_TYPE_F32, 7, "not a multiple of the alignment"},
        {1, ne1, AG_TYPE_F32, 1ull << 20, "beyond end of file"},
        {1, ne1, AG_TYPE_F32, UINT64_MAX - 31, "beyond end of file"},
        {2, ne2, AG_TYPE_F32, 0, "beyond end of file"},
    };
    for (size_t i = 0; i < sizeof bad_t / sizeof bad_t[0]; i++) {
        r_header(&r, 3, 1, 0);
        r_tensor(&r, "t", bad_t[i].n_dims, bad_t[i].ne, bad_t[i].type, bad_t[i].off);
        r_pad(&r, 32, 128);
        expect_format(&r, bad_t[i].needle);
    }
    /* overlapping and duplicate tensors */
    r_header(&r, 3, 2, 0);
    r_tensor(&r, "x", 1, ne1, AG_TYPE_F32, 0);
    r_tensor(&r, "y", 1, ne1, AG_TYPE_F32, 96); /* x covers [0,128) */
    r_pad(&r, 32, 512);
    expect_format(&r, "overlaps");
    r_header(&r, 3, 2, 0);
    r_tensor(&r, "x", 1, ne1, AG_TYPE_F32, 0);
    r_tensor(&r, "x", 1, ne1, AG_TYPE_F32, 128);
    r_pad(&r, 32, 512);
    expect_format(&r, "duplicate tensor name 'x'");
    r_header(&r, 3, 2, 0); /* out of order but disjoint is fine */
    r_tensor(&r, "x", 1, ne1, AG_TYPE_F32, 128);
    r_tensor(&r, "y", 1, ne1, AG_TYPE_F32, 0);
    r_pad(&r, 32, 256);
    assert_int_equal(open_copy(r.b, r.n), AG_OK);
    /* names from the file are escaped in messages, which stay one line */
    r_header(&r, 3, 2, 0);
    r_tensor(&r, "a\nb\xff", 1, ne1, AG_TYPE_F32, 0);
    r_tensor(&r, "a\nb\xff", 1, ne1, AG_TYPE_F32, 128);
    r_pad(&r, 32, 512);
    expect_format(&r, "duplicate tensor name 'a\\x0ab\\xff'");
    assert_null(strchr(ag_error_message(), '\n'));
    /* the message of an out-of-file tensor names it, its range and the size */
    r_header(&r, 3, 1, 0);
    r_tensor(&r, "w", 1, ne1, AG_TYPE_F32, 0);
    r_pad(&r, 32, 100);
    expect_format(&r, "tensor 'w': data [64, 192) beyond end of file (size 164)");
}

/* v2 differs from v3 only in what v3 added outside the layout (big-endian
 * files): a real file relabelled v2 reads the same; v1 is refused. */
static void version_2_reads_version_1_refused(void **state) {
    size_t len;
    uint8_t *file = slurp(shared_path("models/tiny/stories260K.gguf"), &len);
    ag_gguf *g3, *g2;
    assert_int_equal(ag_gguf_open_memory(file, len, &g3), AG_OK);
    uint8_t *v2 = malloc(len);
    memcpy(v2, file, len);
    uint32_t two = 2, one = 1;
    memcpy(v2 + 4, &two, 4);
    assert_int_equal(ag_gguf_open_memory(v2, len, &g2), AG_OK);
    assert_int_equal(ag_gguf_version(g2), 2);
    assert_int_equal(ag_gguf_n_kv(g2), ag_gguf_n_kv(g3));
    assert_int_equal(ag_gguf_n_tensors(g2), ag_gguf_n_tensors(g3));
    for (int64_t i = 0; i < ag_gguf_n_tensors(g3); i++)
        assert_int_equal(ag_gguf_tensor_at(g2, i)->offset, ag_gguf_tensor_at(g3, i)->offset);
    ag_gguf_free(g2);
    memcpy(v2 + 4, &one, 4);
    assert_int_equal(ag_gguf_open_memory(v2, len, &g2), AG_ERR_FORMAT);
    assert_non_null(strstr(ag_error_message(), "unsupported GGUF version 1"));
    ag_gguf_free(g3);
    free(v2);
    free(file);
}

static void missing_file_is_io_error(void **state) {
    ag_gguf *g = (ag_gguf *)1;
    assert_int_equal(ag_gguf_open("/nonexistent/x.gguf", &g), AG_ERR_IO);
    assert_null(g);
    ag_gguf_free(NULL);
}

/* `test_gguf --write-sample PATH` writes the round-trip file for the Python
 * tests, which check it with the gguf package's reader. */
static int write_sample(const char *path) {
    kv_case cases[64];
    size_t n_cases, len;
    uint8_t *bytes = write_case_file(&len, cases, &n_cases);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(bytes, 1, len, f) != len || fclose(f) != 0) {
        fprintf(stderr, "cannot write %s\n", path);
        return 1;
    }
    free(bytes);
    return 0;
}

int main(int argc, char **argv) {
    if (argc == 3 && !strcmp(argv[1], "--write-sample")) return write_sample(argv[2]);
    const char *env = getenv("AUGUR_SHARED");
    snprintf(shared_dir, sizeof shared_dir, "%s", env && *env ? env : "../shared");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(reads_tiny_model),
        cmocka_unit_test(reads_smollm2),
        cmocka_unit_test(writer_round_trip_every_type),
        cmocka_unit_test(writer_reproduces_tiny_model),
        cmocka_unit_test(writer_refuses_bad_input),
        cmocka_unit_test(composite_reads_parts),
        cmocka_unit_test(type_layouts),
        cmocka_unit_test(truncations_fail_cleanly),
        cmocka_unit_test(bit_flips_fail_cleanly),
        cmocka_unit_test(crafted_bad_headers),
        cmocka_unit_test(version_2_reads_version_1_refused),
        cmocka_unit_test(missing_file_is_io_error),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
