/* libFuzzer target for the GGUF reader: any byte string must either open
 * cleanly or fail with AG_ERR_FORMAT (never crash, over-read or leak). On
 * success it walks everything the API hands out, so a header that passed
 * validation but lies (a string or tensor past the end) trips ASan. The
 * input is copied into an exact-size heap block so over-reads are caught. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "gguf/gguf.h"

static volatile uint64_t sink;

static void touch(const void *p, uint64_t n) {
    const uint8_t *b = p;
    uint64_t acc = 0;
    for (uint64_t i = 0; i < n; i++) acc += b[i];
    sink += acc;
}

static void walk(const ag_gguf_value *v, int depth) {
    if (depth > AG_GGUF_MAX_DEPTH + 1) abort(); /* the reader's limit must hold */
    switch (v->type) {
    case AG_GGUF_STRING: touch(v->str.ptr, v->str.len); break;
    case AG_GGUF_ARRAY:
        if (v->arr.elem_type == AG_GGUF_STRING || v->arr.elem_type == AG_GGUF_ARRAY) {
            for (uint64_t i = 0; i < v->arr.n; i++) {
                if (v->arr.items[i].type != v->arr.elem_type) abort();
                walk(&v->arr.items[i], depth + 1);
            }
        } else {
            for (uint64_t i = 0; i < v->arr.n; i++) {
                double d;
                int64_t x;
                if (ag_gguf_arr_f64(v, i, &d)) sink += (uint64_t)(d == d);
                if (ag_gguf_arr_i64(v, i, &x)) sink += (uint64_t)x;
            }
        }
        break;
    default: sink += v->u; break;
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    uint8_t *copy = malloc(size ? size : 1);
    if (!copy) return 0;
    if (size) memcpy(copy, data, size);
    ag_gguf *g = NULL;
    ag_status s = ag_gguf_open_memory(copy, size, &g);
    if (s == AG_OK) {
        for (int64_t i = 0; i < ag_gguf_n_kv(g); i++) {
            const char *k = ag_gguf_key(g, i);
            if (ag_gguf_find_key(g, k) != i) abort(); /* keys are unique and indexed */
            walk(ag_gguf_kv_value(g, i), 0);
            uint32_t u;
            int64_t x;
            float f;
            bool b;
            uint64_t len;
            ag_gguf_get_u32(g, k, &u);
            ag_gguf_get_i64(g, k, &x);
            ag_gguf_get_f32(g, k, &f);
            ag_gguf_get_bool(g, k, &b);
            if (ag_gguf_get_str(g, k, &len) == NULL && ag_gguf_kv_type(g, i) == AG_GGUF_STRING) abort();
        }
        for (int64_t i = 0; i < ag_gguf_n_tensors(g); i++) {
            const ag_gguf_tensor *t = ag_gguf_tensor_at(g, i);
            if (ag_gguf_find_tensor(g, t->name) != t) abort();
            if (t->data < copy || t->size > size || t->data + t->size > copy + size) abort();
            if (t->size) {
                touch(t->data, 1);
                touch(t->data + t->size - 1, 1);
            }
        }
        ag_gguf_free(g);
    } else if (s != AG_ERR_FORMAT && s != AG_ERR_NOMEM) {
        abort(); /* only a format error (or OOM) is a valid refusal */
    } else if (!ag_error_message()[0] || strchr(ag_error_message(), '\n')) {
        abort(); /* the message is one non-empty line */
    }
    free(copy);
    return 0;
}
