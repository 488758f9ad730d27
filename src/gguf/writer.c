/* GGUF writer: serialises key/values as they are added (that is the copy),
 * keeps tensor bytes until the file is laid out, then writes v3 with every
 * tensor offset aligned. It refuses anything the reader would reject, so a
 * written file always reads back. */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "base/buf.h"
#include "base/file.h"
#include "gguf/gguf.h"

typedef struct {
    char    *name;
    uint32_t type, n_dims;
    uint64_t ne[AG_GGUF_MAX_DIMS];
    uint8_t *data;
    uint64_t size;
} wtensor;

struct ag_gguf_writer {
    ag_buf   kv; /* serialised key/value pairs */
    int64_t  n_kv;
    char   **keys; /* for the duplicate check */
    size_t   keys_cap;
    uint64_t alignment;
    wtensor *tensors;
    int64_t  n_tensors;
    size_t   tensors_cap;
};

ag_gguf_writer *ag_gguf_writer_new(void) {
    ag_gguf_writer *w = calloc(1, sizeof *w);
    if (w) w->alignment = AG_GGUF_DEFAULT_ALIGNMENT;
    return w;
}

void ag_gguf_writer_free(ag_gguf_writer *w) {
    if (!w) return;
    ag_buf_free(&w->kv);
    for (int64_t i = 0; i < w->n_kv; i++) free(w->keys[i]);
    free(w->keys);
    for (int64_t i = 0; i < w->n_tensors; i++) {
        free(w->tensors[i].name);
        free(w->tensors[i].data);
    }
    free(w->tensors);
    free(w);
}

static ag_status put(ag_buf *b, const void *p, size_t n) { return ag_buf_append(b, p, n); }
static ag_status put_u32(ag_buf *b, uint32_t v) { return put(b, &v, 4); }
static ag_status put_u64(ag_buf *b, uint64_t v) { return put(b, &v, 8); }
static ag_status put_str(ag_buf *b, const char *p, uint64_t len) {
    ag_status s = put_u64(b, len);
    return s ? s : put(b, p, (size_t)len);
}

static size_t scalar_size(uint32_t t) {
    switch (t) {
    case AG_GGUF_U8: case AG_GGUF_I8: case AG_GGUF_BOOL: return 1;
    case AG_GGUF_U16: case AG_GGUF_I16: return 2;
    case AG_GGUF_U32: case AG_GGUF_I32: case AG_GGUF_F32: return 4;
    case AG_GGUF_U64: case AG_GGUF_I64: case AG_GGUF_F64: return 8;
    default: return 0;
    }
}

/* Appends the payload of `v` (not its type tag) to `b`. */
static ag_status put_value(ag_buf *b, const ag_gguf_value *v, int depth, const char *key) {
    ag_status s;
    switch (v->type) {
    case AG_GGUF_U8: case AG_GGUF_U16: case AG_GGUF_U32: {
        size_t n = scalar_size(v->type);
        if (v->u >> (8 * n))
            return ag_errorf(AG_ERR_RANGE, "key '%s': %" PRIu64 " does not fit the value type", key, v->u);
        return put(b, &v->u, n); /* little-endian: the low bytes come first */
    }
    case AG_GGUF_U64: return put_u64(b, v->u);
    case AG_GGUF_I8: case AG_GGUF_I16: case AG_GGUF_I32: {
        size_t n = scalar_size(v->type);
        int64_t lo = -((int64_t)1 << (8 * n - 1)), hi = ((int64_t)1 << (8 * n - 1)) - 1;
        if (v->i < lo || v->i > hi)
            return ag_errorf(AG_ERR_RANGE, "key '%s': %" PRId64 " does not fit the value type", key, v->i);
        return put(b, &v->i, n);
    }
    case AG_GGUF_I64: return put(b, &v->i, 8);
    case AG_GGUF_F32: {
        float f = (float)v->f;
        return put(b, &f, 4);
    }
    case AG_GGUF_F64: return put(b, &v->f, 8);
    case AG_GGUF_BOOL: {
        if (v->u > 1) return ag_errorf(AG_ERR_RANGE, "key '%s': bool value %" PRIu64, key, v->u);
        uint8_t x = (uint8_t)v->u;
        return put(b, &x, 1);
    }
    case AG_GGUF_STRING:
        if (!v->str.ptr && v->str.len) return ag_errorf(AG_ERR_INVALID, "key '%s': NULL string", key);
        return put_str(b, v->str.ptr, v->str.len);
    case AG_GGUF_ARRAY: {
        if (depth >= AG_GGUF_MAX_DEPTH)
            return ag_errorf(AG_ERR_INVALID, "key '%s': arrays nested deeper than %d", key, AG_GGUF_MAX_DEPTH);
        uint32_t et = v->arr.elem_type;
        uint64_t n = v->arr.n;
        if (et > AG_GGUF_F64) return ag_errorf(AG_ERR_INVALID, "key '%s': unknown element type %u", key, et);
        if ((s = put_u32(b, et)) || (s = put_u64(b, n))) return s;
        size_t es = scalar_size(et);
        if (es) {
            uint64_t bytes;
            if (__builtin_mul_overflow(n, (uint64_t)es, &bytes) || bytes > SIZE_MAX / 2)
                return ag_errorf(AG_ERR_INVALID, "key '%s': array too large", key);
            if (n && !v->arr.raw) return ag_errorf(AG_ERR_INVALID, "key '%s': array without data", key);
            if (et == AG_GGUF_BOOL)
                for (uint64_t k = 0; k < n; k++)
                    if (((const uint8_t *)v->arr.raw)[k] > 1)
                        return ag_errorf(AG_ERR_RANGE, "key '%s': bool element %" PRIu64 " is not 0 or 1", key, k);
            return put(b, v->arr.raw, (size_t)bytes);
        }
        if (n && !v->arr.items) return ag_errorf(AG_ERR_INVALID, "key '%s': array without items", key);
        for (uint64_t k = 0; k < n; k++) {
            const ag_gguf_value *it = &v->arr.items[k];
            if (it->type != et)
                return ag_errorf(AG_ERR_INVALID, "key '%s': array item %" PRIu64 " has type %u, not %u", key, k,
                                 it->type, et);
            if ((s = put_value(b, it, depth + 1, key))) return s;
        }
        return AG_OK;
    }
    default:
        return ag_errorf(AG_ERR_INVALID, "key '%s': unknown value type %u", key, v->type);
    }
}

ag_status ag_gguf_writer_add(ag_gguf_writer *w, const char *key, const ag_gguf_value *v) {
    if (!w || !key || !v) return ag_errorf(AG_ERR_INVALID, "gguf writer: NULL argument");
    size_t klen = strlen(key);
    if (klen == 0 || klen > AG_GGUF_MAX_KEY_LEN)
        return ag_errorf(AG_ERR_INVALID, "gguf writer: key length %zu (must be 1..%d)", klen, AG_GGUF_MAX_KEY_LEN);
    /* Linear duplicate check: writers hold tens of keys, not millions. */
    for (int64_t i = 0; i < w->n_kv; i++)
        if (!strcmp(w->keys[i], key)) return ag_errorf(AG_ERR_INVALID, "gguf writer: duplicate key '%s'", key);
    if (!strcmp(key, "general.alignment")) {
        if (v->type != AG_GGUF_U32 || v->u == 0 || (v->u & (v->u - 1)) || v->u > UINT32_MAX)
            return ag_errorf(AG_ERR_INVALID, "gguf writer: general.alignment must be a u32 power of two");
    }
    size_t old_len = w->kv.len;
    ag_buf one = {0};
    ag_status s;
    if ((s = put_str(&one, key, klen)) || (s = put_u32(&one, v->type)) || (s = put_value(&one, v, 0, key)) ||
        (s = put(&w->kv, one.data, one.len))) {
        ag_buf_free(&one);
        return s;
    }
    ag_buf_free(&one);
    if ((size_t)w->n_kv == w->keys_cap) {
        size_t cap = w->keys_cap ? w->keys_cap * 2 : 16;
        char **k = realloc(w->keys, cap * sizeof *k);
        if (!k) goto nomem;
        w->keys = k;
        w->keys_cap = cap;
    }
    if (!(w->keys[w->n_kv] = strdup(key))) goto nomem;
    w->n_kv++;
    if (!strcmp(key, "general.alignment")) w->alignment = v->u;
    return AG_OK;
nomem:
    /* Take the serialised pair back out so the writer stays consistent. */
    w->kv.len = old_len;
    return ag_errorf(AG_ERR_NOMEM, "out of memory");
}

ag_status ag_gguf_writer_add_u32(ag_gguf_writer *w, const char *key, uint32_t v) {
    ag_gguf_value x = {.type = AG_GGUF_U32, .u = v};
    return ag_gguf_writer_add(w, key, &x);
}

ag_status ag_gguf_writer_add_f32(ag_gguf_writer *w, const char *key, float v) {
    ag_gguf_value x = {.type = AG_GGUF_F32, .f = v};
    return ag_gguf_writer_add(w, key, &x);
}

ag_status ag_gguf_writer_add_bool(ag_gguf_writer *w, const char *key, bool v) {
    ag_gguf_value x = {.type = AG_GGUF_BOOL, .u = v};
    return ag_gguf_writer_add(w, key, &x);
}

ag_status ag_gguf_writer_add_str(ag_gguf_writer *w, const char *key, const char *s) {
    if (!s) return ag_errorf(AG_ERR_INVALID, "gguf writer: NULL string for '%s'", key ? key : "?");
    ag_gguf_value x = {.type = AG_GGUF_STRING, .str = {s, strlen(s)}};
    return ag_gguf_writer_add(w, key, &x);
}

ag_status ag_gguf_writer_add_tensor(ag_gguf_writer *w, const char *name, uint32_t type, uint32_t n_dims,
                                    const uint64_t *ne, const void *data, uint64_t size) {
    if (!w || !name || !ne) return ag_errorf(AG_ERR_INVALID, "gguf writer: NULL argument");
    size_t nlen = strlen(name);
    if (nlen == 0 || nlen > AG_GGUF_MAX_NAME_LEN)
        return ag_errorf(AG_ERR_INVALID, "gguf writer: tensor name length %zu (must be 1..%d)", nlen,
                         AG_GGUF_MAX_NAME_LEN);
    for (int64_t i = 0; i < w->n_tensors; i++)
        if (!strcmp(w->tensors[i].name, name))
            return ag_errorf(AG_ERR_INVALID, "gguf writer: duplicate tensor '%s'", name);
    uint32_t be, bb;
    if (!ag_tensor_type_layout(type, &be, &bb))
        return ag_errorf(AG_ERR_INVALID, "gguf writer: tensor '%s': unknown type %u", name, type);
    if (n_dims == 0 || n_dims > AG_GGUF_MAX_DIMS)
        return ag_errorf(AG_ERR_INVALID, "gguf writer: tensor '%s': %u dimensions", name, n_dims);
    wtensor t = {.type = type, .n_dims = n_dims, .size = size};
    uint64_t n_elems = 1;
    for (uint32_t d = 0; d < AG_GGUF_MAX_DIMS; d++) {
        t.ne[d] = d < n_dims ? ne[d] : 1;
        if (t.ne[d] == 0 || __builtin_mul_overflow(n_elems, t.ne[d], &n_elems) || n_elems > INT64_MAX)
            return ag_errorf(AG_ERR_INVALID, "gguf writer: tensor '%s': bad dimension %u", name, d);
    }
    if (t.ne[0] % be)
        return ag_errorf(AG_ERR_INVALID, "gguf writer: tensor '%s': row %" PRIu64 " not a multiple of %u", name,
                         t.ne[0], be);
    uint64_t want;
    if (__builtin_mul_overflow(n_elems / be, (uint64_t)bb, &want) || want != size)
        return ag_errorf(AG_ERR_INVALID, "gguf writer: tensor '%s': %" PRIu64 " bytes given, %s needs %" PRIu64,
                         name, size, ag_tensor_type_name(type), want);
    if (size && !data) return ag_errorf(AG_ERR_INVALID, "gguf writer: tensor '%s': no data", name);
    if (size > SIZE_MAX / 2) return ag_errorf(AG_ERR_NOMEM, "gguf writer: tensor '%s' too large", name);
    if ((size_t)w->n_tensors == w->tensors_cap) {
        size_t cap = w->tensors_cap ? w->tensors_cap * 2 : 16;
        wtensor *p = realloc(w->tensors, cap * sizeof *p);
        if (!p) return ag_errorf(AG_ERR_NOMEM, "out of memory");
        w->tensors = p;
        w->tensors_cap = cap;
    }
    t.name = strdup(name);
    t.data = malloc(size ? (size_t)size : 1);
    if (!t.name || !t.data) {
        free(t.name);
        free(t.data);
        return ag_errorf(AG_ERR_NOMEM, "out of memory");
    }
    if (size) memcpy(t.data, data, (size_t)size);
    w->tensors[w->n_tensors++] = t;
    return AG_OK;
}

static ag_status pad_to(ag_buf *b, uint64_t align) {
    static const uint8_t zeros[64];
    while (b->len % align) {
        size_t n = (size_t)(align - b->len % align);
        if (n > sizeof zeros) n = sizeof zeros;
        ag_status s = put(b, zeros, n);
        if (s) return s;
    }
    return AG_OK;
}

ag_status ag_gguf_writer_to_memory(ag_gguf_writer *w, uint8_t **out, size_t *len) {
    *out = NULL;
    *len = 0;
    ag_buf b = {0};
    ag_status s;
    if ((s = put(&b, "GGUF", 4)) || (s = put_u32(&b, 3)) || (s = put_u64(&b, (uint64_t)w->n_tensors)) ||
        (s = put_u64(&b, (uint64_t)w->n_kv)) || (s = put(&b, w->kv.data, w->kv.len)))
        goto fail;
    uint64_t off = 0;
    for (int64_t i = 0; i < w->n_tensors; i++) {
        const wtensor *t = &w->tensors[i];
        if ((s = put_str(&b, t->name, strlen(t->name))) || (s = put_u32(&b, t->n_dims))) goto fail;
        for (uint32_t d = 0; d < t->n_dims; d++)
            if ((s = put_u64(&b, t->ne[d]))) goto fail;
        if ((s = put_u32(&b, t->type)) || (s = put_u64(&b, off))) goto fail;
        off += (t->size + w->alignment - 1) / w->alignment * w->alignment;
    }
    if ((s = pad_to(&b, w->alignment))) goto fail;
    for (int64_t i = 0; i < w->n_tensors; i++) {
        const wtensor *t = &w->tensors[i];
        if ((s = put(&b, t->data, (size_t)t->size)) || (s = pad_to(&b, w->alignment))) goto fail;
    }
    *len = b.len;
    *out = (uint8_t *)ag_buf_take(&b);
    return AG_OK;
fail:
    ag_buf_free(&b);
    return s;
}

ag_status ag_gguf_writer_write(ag_gguf_writer *w, const char *path) {
    uint8_t *bytes;
    size_t n;
    ag_status s = ag_gguf_writer_to_memory(w, &bytes, &n);
    if (s) return s;
    s = ag_file_write_atomic(path, bytes, n);
    free(bytes);
    return s;
}
