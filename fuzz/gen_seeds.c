/* Writes the fuzzer's seed corpus (fuzz/seeds/gguf/) with our GGUF writer:
 * small valid files covering every value type, nested and string arrays,
 * several tensor types, a non-default alignment, and a llama-like header.
 *   cc -std=c11 -Isrc fuzz/gen_seeds.c build/libaugur.a -lxxhash -o build/gen_seeds
 *   build/gen_seeds fuzz/seeds/gguf [path/to/stories260K.gguf] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gguf/gguf.h"

static void save(ag_gguf_writer *w, const char *dir, const char *name) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    if (ag_gguf_writer_write(w, path) != AG_OK) {
        fprintf(stderr, "%s: %s\n", path, ag_error_message());
        exit(1);
    }
    ag_gguf_writer_free(w);
}

static void add_tensor(ag_gguf_writer *w, const char *name, uint32_t type, uint32_t n_dims, uint64_t ne0,
                       uint64_t ne1) {
    uint32_t be, bb;
    ag_tensor_type_layout(type, &be, &bb);
    uint64_t ne[2] = {ne0, ne1};
    uint64_t size = ne0 / be * bb * (n_dims > 1 ? ne1 : 1);
    uint8_t *d = calloc(1, size);
    for (uint64_t i = 0; i < size; i++) d[i] = (uint8_t)(i * 13);
    if (ag_gguf_writer_add_tensor(w, name, type, n_dims, ne, d, size) != AG_OK) {
        fprintf(stderr, "%s\n", ag_error_message());
        exit(1);
    }
    free(d);
}

int main(int argc, char **argv) {
    if (argc < 2) return 2;
    const char *dir = argv[1];

    /* 1: empty */
    save(ag_gguf_writer_new(), dir, "empty.gguf");

    /* 2: every scalar type and arrays, nested */
    ag_gguf_writer *w = ag_gguf_writer_new();
    static const uint8_t u8s[] = {1, 2, 3};
    static const int32_t i32s[] = {-1, 0, 1};
    static const float f32s[] = {0.5f, -2.0f};
    static const uint8_t bools[] = {1, 0};
    ag_gguf_value strs[3] = {{.type = AG_GGUF_STRING, .str = {"a", 1}},
                             {.type = AG_GGUF_STRING, .str = {"", 0}},
                             {.type = AG_GGUF_STRING, .str = {"\xC3\xA9t\xC3\xA9", 5}}};
    ag_gguf_value inner[2] = {
        {.type = AG_GGUF_ARRAY, .arr = {.elem_type = AG_GGUF_U8, .n = 3, .raw = u8s}},
        {.type = AG_GGUF_ARRAY, .arr = {.elem_type = AG_GGUF_STRING, .n = 3, .items = strs}},
    };
    ag_gguf_value outer = {.type = AG_GGUF_ARRAY, .arr = {.elem_type = AG_GGUF_ARRAY, .n = 2, .items = inner}};
    ag_gguf_value outer2 = {.type = AG_GGUF_ARRAY, .arr = {.elem_type = AG_GGUF_ARRAY, .n = 1, .items = &outer}};
    for (int t = AG_GGUF_U8; t <= AG_GGUF_F64; t++) {
        if (t == AG_GGUF_STRING || t == AG_GGUF_ARRAY) continue;
        char key[32];
        snprintf(key, sizeof key, "scalar.%d", t);
        ag_gguf_value v = {.type = (ag_gguf_type)t, .u = 1};
        if (t == AG_GGUF_F32 || t == AG_GGUF_F64) v.f = 1.5;
        ag_gguf_writer_add(w, key, &v);
    }
    ag_gguf_writer_add_str(w, "general.architecture", "llama");
    ag_gguf_value a;
    a = (ag_gguf_value){.type = AG_GGUF_ARRAY, .arr = {.elem_type = AG_GGUF_I32, .n = 3, .raw = i32s}};
    ag_gguf_writer_add(w, "arr.i32", &a);
    a = (ag_gguf_value){.type = AG_GGUF_ARRAY, .arr = {.elem_type = AG_GGUF_F32, .n = 2, .raw = f32s}};
    ag_gguf_writer_add(w, "arr.f32", &a);
    a = (ag_gguf_value){.type = AG_GGUF_ARRAY, .arr = {.elem_type = AG_GGUF_BOOL, .n = 2, .raw = bools}};
    ag_gguf_writer_add(w, "arr.bool", &a);
    a = (ag_gguf_value){.type = AG_GGUF_ARRAY, .arr = {.elem_type = AG_GGUF_STRING, .n = 3, .items = strs}};
    ag_gguf_writer_add(w, "arr.str", &a);
    ag_gguf_writer_add(w, "arr.nested", &outer);
    ag_gguf_writer_add(w, "arr.nested2", &outer2);
    save(w, dir, "values.gguf");

    /* 3: tensors of several types, alignment 64 */
    w = ag_gguf_writer_new();
    ag_gguf_writer_add_u32(w, "general.alignment", 64);
    add_tensor(w, "f32", AG_TYPE_F32, 2, 4, 3);
    add_tensor(w, "f16", AG_TYPE_F16, 1, 8, 1);
    add_tensor(w, "q4_0", AG_TYPE_Q4_0, 2, 32, 2);
    add_tensor(w, "q4_k", AG_TYPE_Q4_K, 1, 256, 1);
    add_tensor(w, "q8_0", AG_TYPE_Q8_0, 2, 64, 1);
    add_tensor(w, "i8", AG_TYPE_I8, 1, 3, 1);
    save(w, dir, "tensors.gguf");

    /* 4: a llama-like header: the tiny model's metadata (its 512-token
     * vocabulary) with a few small tensors instead of its weights. */
    if (argc > 2) {
        ag_gguf *g;
        if (ag_gguf_open(argv[2], &g) != AG_OK) {
            fprintf(stderr, "%s: %s\n", argv[2], ag_error_message());
            return 1;
        }
        w = ag_gguf_writer_new();
        for (int64_t i = 0; i < ag_gguf_n_kv(g); i++) ag_gguf_writer_add(w, ag_gguf_key(g, i), ag_gguf_kv_value(g, i));
        for (int64_t i = 0; i < ag_gguf_n_tensors(g) && i < 4; i++) {
            const ag_gguf_tensor *t = ag_gguf_tensor_at(g, i);
            if (t->size <= 1024) ag_gguf_writer_add_tensor(w, t->name, t->type, t->n_dims, t->ne, t->data, t->size);
        }
        add_tensor(w, "extra.q4_1", AG_TYPE_Q4_1, 2, 64, 2);
        save(w, dir, "llama_like.gguf");
        ag_gguf_free(g);
    }
    return 0;
}
