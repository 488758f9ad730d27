/* GGUF reader: validates the whole header of an untrusted file once, then
 * serves O(1) lookups from hash indexes over keys and tensor names.
 *
 * Layout (little-endian, v2 and v3 are identical for our purposes):
 *   "GGUF" u32 version u64 n_tensors u64 n_kv
 *   n_kv x { string key, u32 type, value }
 *   n_tensors x { string name, u32 n_dims, u64 ne[n_dims], u32 type, u64 offset }
 *   padding to `alignment`, then the data section; tensor offsets are
 *   relative to it.
 * A string is u64 length + bytes (no NUL). An array is u32 element type,
 * u64 count, then the elements (arrays of arrays nest). */
#include "gguf/gguf.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/arena.h"
#include "base/file.h"
#include "base/hash.h"
#include "base/utf8.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the GGUF reader assumes a little-endian host"
#endif


/* ---- tensor type layouts ----
 * Block sizes and bytes per block, as in ggml's type traits (ggml-common.h).
 * Q8_1 is 36 bytes (fp16 d and s) in current ggml. */
static const struct {
    const char *name;
    uint32_t    blck, bytes;
} type_layout[AG_TYPE_COUNT] = {
    [AG_TYPE_F32] = {"F32", 1, 4},          [AG_TYPE_F16] = {"F16", 1, 2},
    [AG_TYPE_Q4_0] = {"Q4_0", 32, 18},      [AG_TYPE_Q4_1] = {"Q4_1", 32, 20},
    [AG_TYPE_Q5_0] = {"Q5_0", 32, 22},      [AG_TYPE_Q5_1] = {"Q5_1", 32, 24},
    [AG_TYPE_Q8_0] = {"Q8_0", 32, 34},      [AG_TYPE_Q8_1] = {"Q8_1", 32, 36},
    [AG_TYPE_Q2_K] = {"Q2_K", 256, 84},     [AG_TYPE_Q3_K] = {"Q3_K", 256, 110},
    [AG_TYPE_Q4_K] = {"Q4_K", 256, 144},    [AG_TYPE_Q5_K] = {"Q5_K", 256, 176},
    [AG_TYPE_Q6_K] = {"Q6_K", 256, 210},    [AG_TYPE_Q8_K] = {"Q8_K", 256, 292},
    [AG_TYPE_IQ2_XXS] = {"IQ2_XXS", 256, 66}, [AG_TYPE_IQ2_XS] = {"IQ2_XS", 256, 74},
    [AG_TYPE_IQ3_XXS] = {"IQ3_XXS", 256, 98}, [AG_TYPE_IQ1_S] = {"IQ1_S", 256, 50},
    [AG_TYPE_IQ4_NL] = {"IQ4_NL", 32, 18},  [AG_TYPE_IQ3_S] = {"IQ3_S", 256, 110},
    [AG_TYPE_IQ2_S] = {"IQ2_S", 256, 82},   [AG_TYPE_IQ4_XS] = {"IQ4_XS", 256, 136},
    [AG_TYPE_I8] = {"I8", 1, 1},            [AG_TYPE_I16] = {"I16", 1, 2},
    [AG_TYPE_I32] = {"I32", 1, 4},          [AG_TYPE_I64] = {"I64", 1, 8},
    [AG_TYPE_F64] = {"F64", 1, 8},          [AG_TYPE_IQ1_M] = {"IQ1_M", 256, 56},
    [AG_TYPE_BF16] = {"BF16", 1, 2},        [AG_TYPE_TQ1_0] = {"TQ1_0", 256, 54},
    [AG_TYPE_TQ2_0] = {"TQ2_0", 256, 66},   [AG_TYPE_MXFP4] = {"MXFP4", 32, 17},
    [AG_TYPE_NVFP4] = {"NVFP4", 64, 36},    [AG_TYPE_Q1_0] = {"Q1_0", 128, 18},
};

bool ag_tensor_type_layout(uint32_t type, uint32_t *block_elems, uint32_t *block_bytes) {
    if (type >= AG_TYPE_COUNT || type_layout[type].blck == 0) return false;
    if (block_elems) *block_elems = type_layout[type].blck;
    if (block_bytes) *block_bytes = type_layout[type].bytes;
    return true;
}

const char *ag_tensor_type_name(uint32_t type) {
    if (type >= AG_TYPE_COUNT || type_layout[type].blck == 0) return "?";
    return type_layout[type].name;
}

/* Bytes of one scalar of a metadata type; 0 for STRING/ARRAY/unknown. */
static size_t scalar_size(uint32_t t) {
    switch (t) {
    case AG_GGUF_U8: case AG_GGUF_I8: case AG_GGUF_BOOL: return 1;
    case AG_GGUF_U16: case AG_GGUF_I16: return 2;
    case AG_GGUF_U32: case AG_GGUF_I32: case AG_GGUF_F32: return 4;
    case AG_GGUF_U64: case AG_GGUF_I64: case AG_GGUF_F64: return 8;
    default: return 0;
    }
}

static const char *value_type_name(uint32_t t) {
    static const char *names[] = {"u8",  "i8",  "u16",    "i16",   "u32", "i32", "f32",
                                  "bool", "string", "array", "u64", "i64", "f64"};
    return t < sizeof names / sizeof names[0] ? names[t] : "?";
}

/* Open-addressing hash index (linear probing) from a name to its position.
 * Slots hold index+1; 0 is empty. Capacity is a power of two >= 2n. */
typedef struct {
    uint32_t *slots;
    uint64_t  mask;
} name_index;

struct ag_gguf {
    ag_mapped_file map; /* zero when opened over memory */
    const uint8_t *data;
    size_t         size;
    uint32_t       version;
    uint64_t       alignment;
    uint64_t       data_offset;

    int64_t        n_kv;
    const char   **keys;    /* NUL-terminated copies in the arena */
    size_t        *key_len;
    ag_gguf_value *values;
    name_index     kv_index;

    int64_t         n_tensors;
    ag_gguf_tensor *tensors;
    const char    **tensor_names; /* tensors[i].name, as an array for the index */
    size_t         *name_len;
    name_index      tensor_index;

    ag_arena arena; /* keys, names, array items */

    /* ag_gguf_open_composite: the metadata image (heap, freed with g) and
     * the owner of the tensors' bytes (released with g) */
    void *own_image;
    void (*release)(void *owner);
    void *owner;
};

/* ---- cursor over the untrusted bytes ---- */
typedef struct {
    const uint8_t *p;
    size_t         size, pos;
} cursor;

static size_t remaining(const cursor *c) { return c->size - c->pos; }

static ag_status need(const cursor *c, uint64_t n, const char *what) {
    if (n > remaining(c))
        return ag_errorf(AG_ERR_FORMAT,
                         "at offset %zu: %s needs %" PRIu64 " bytes but the file ends at %zu",
                         c->pos, what, n, c->size);
    return AG_OK;
}

static ag_status rd_u32(cursor *c, uint32_t *v, const char *what) {
    ag_status s = need(c, 4, what);
    if (s) return s;
    memcpy(v, c->p + c->pos, 4);
    c->pos += 4;
    return AG_OK;
}

static ag_status rd_u64(cursor *c, uint64_t *v, const char *what) {
    ag_status s = need(c, 8, what);
    if (s) return s;
    memcpy(v, c->p + c->pos, 8);
    c->pos += 8;
    return AG_OK;
}

/* A string: u64 length + bytes, returned as a borrowed pointer into the file. */
static ag_status rd_str(cursor *c, const char **ptr, uint64_t *len, const char *what) {
    size_t at = c->pos;
    ag_status s = rd_u64(c, len, what);
    if (s) return s;
    if (*len > remaining(c))
        return ag_errorf(AG_ERR_FORMAT,
                         "at offset %zu: %s length %" PRIu64 " runs past the end of the file (size %zu)",
                         at, what, *len, c->size);
    *ptr = (const char *)c->p + c->pos;
    c->pos += (size_t)*len;
    return AG_OK;
}

static void *arena_calloc(ag_arena *a, uint64_t n, size_t elem, ag_status *st) {
    uint64_t bytes;
    if (__builtin_mul_overflow(n, (uint64_t)elem, &bytes) || bytes > SIZE_MAX / 2) {
        *st = ag_errorf(AG_ERR_NOMEM, "allocation of %" PRIu64 " x %zu bytes too large", n, elem);
        return NULL;
    }
    if (bytes == 0) bytes = 1;
    void *p = ag_arena_alloc(a, (size_t)bytes);
    if (!p) {
        *st = ag_errorf(AG_ERR_NOMEM, "out of memory (%" PRIu64 " bytes)", bytes);
        return NULL;
    }
    memset(p, 0, (size_t)bytes);
    *st = AG_OK;
    return p;
}

/* Parses a value of type `type` at the cursor into *v. */
static ag_status parse_value(ag_gguf *g, cursor *c, uint32_t type, ag_gguf_value *v, int depth) {
    size_t at = c->pos;
    ag_status s;
    v->type = (ag_gguf_type)type;
    switch (type) {
    case AG_GGUF_U8: case AG_GGUF_U16: case AG_GGUF_U32: case AG_GGUF_U64: {
        size_t n = scalar_size(type);
        if ((s = need(c, n, "value"))) return s;
        uint64_t u = 0;
        memcpy(&u, c->p + c->pos, n); /* little-endian host: low bytes first */
        c->pos += n;
        v->u = u;
        return AG_OK;
    }
    case AG_GGUF_I8: case AG_GGUF_I16: case AG_GGUF_I32: case AG_GGUF_I64: {
        size_t n = scalar_size(type);
        if ((s = need(c, n, "value"))) return s;
        const uint8_t *q = c->p + c->pos;
        c->pos += n;
        if (type == AG_GGUF_I8) { int8_t x; memcpy(&x, q, 1); v->i = x; }
        else if (type == AG_GGUF_I16) { int16_t x; memcpy(&x, q, 2); v->i = x; }
        else if (type == AG_GGUF_I32) { int32_t x; memcpy(&x, q, 4); v->i = x; }
        else { int64_t x; memcpy(&x, q, 8); v->i = x; }
        return AG_OK;
    }
    case AG_GGUF_F32: {
        if ((s = need(c, 4, "value"))) return s;
        float f;
        memcpy(&f, c->p + c->pos, 4);
        c->pos += 4;
        v->f = f;
        return AG_OK;
    }
    case AG_GGUF_F64: {
        if ((s = need(c, 8, "value"))) return s;
        memcpy(&v->f, c->p + c->pos, 8);
        c->pos += 8;
        return AG_OK;
    }
    case AG_GGUF_BOOL: {
        if ((s = need(c, 1, "value"))) return s;
        uint8_t b = c->p[c->pos];
        if (b > 1)
            return ag_errorf(AG_ERR_FORMAT, "at offset %zu: bool value %u is not 0 or 1",
                             at, b);
        c->pos += 1;
        v->u = b;
        return AG_OK;
    }
    case AG_GGUF_STRING:
        return rd_str(c, &v->str.ptr, &v->str.len, "string value");
    case AG_GGUF_ARRAY: {
        if (depth >= AG_GGUF_MAX_DEPTH)
            return ag_errorf(AG_ERR_FORMAT, "at offset %zu: arrays nested deeper than %d",
                             at, AG_GGUF_MAX_DEPTH);
        uint32_t et;
        uint64_t n;
        if ((s = rd_u32(c, &et, "array element type"))) return s;
        if (et > AG_GGUF_F64)
            return ag_errorf(AG_ERR_FORMAT, "at offset %zu: unknown array element type %u",
                             at, et);
        if ((s = rd_u64(c, &n, "array length"))) return s;
        v->arr.elem_type = (ag_gguf_type)et;
        v->arr.n = n;
        size_t es = scalar_size(et);
        if (es) {
            uint64_t bytes;
            if (__builtin_mul_overflow(n, (uint64_t)es, &bytes) || bytes > remaining(c))
                return ag_errorf(AG_ERR_FORMAT,
                                 "at offset %zu: array of %" PRIu64
                                 " %s runs past the end of the file (size %zu)",
                                 at, n, value_type_name(et), c->size);
            v->arr.raw = c->p + c->pos;
            if (et == AG_GGUF_BOOL)
                for (uint64_t k = 0; k < n; k++)
                    if (c->p[c->pos + k] > 1)
                        return ag_errorf(AG_ERR_FORMAT,
                                         "at offset %zu: bool array element %" PRIu64
                                         " is %u, not 0 or 1",
                                         c->pos + (size_t)k, k, c->p[c->pos + k]);
            c->pos += (size_t)bytes;
            return AG_OK;
        }
        /* Strings take at least 8 bytes each, nested arrays at least 12:
         * bound the count by what is left before allocating for it. */
        uint64_t min_each = et == AG_GGUF_STRING ? 8 : 12;
        if (n > remaining(c) / min_each)
            return ag_errorf(AG_ERR_FORMAT,
                             "at offset %zu: array of %" PRIu64
                             " %ss cannot fit in the %zu bytes left in the file",
                             at, n, value_type_name(et), remaining(c));
        ag_gguf_value *items = arena_calloc(&g->arena, n, sizeof *items, &s);
        if (!items) return s;
        if (et == AG_GGUF_STRING) {
            /* The hot path for 150k-token vocabularies: inline, one pass. */
            for (uint64_t k = 0; k < n; k++) {
                items[k].type = AG_GGUF_STRING;
                if ((s = rd_str(c, &items[k].str.ptr, &items[k].str.len, "string in array")))
                    return s;
            }
        } else {
            for (uint64_t k = 0; k < n; k++)
                if ((s = parse_value(g, c, AG_GGUF_ARRAY, &items[k], depth + 1))) return s;
        }
        v->arr.items = items;
        return AG_OK;
    }
    default:
        return ag_errorf(AG_ERR_FORMAT, "at offset %zu: unknown value type %u", at,
                         type);
    }
}

/* A name from the file made fit for a one-line message: control bytes and
 * bytes that are not UTF-8 become \xNN, and long names are cut at ~64. */
static const char *show(const char *s, char out[160]) {
    size_t n = strlen(s), k = 0;
    for (size_t i = 0; i < n && k < 64;) {
        unsigned char c = (unsigned char)s[i];
        uint32_t cp;
        size_t len = c < 0x80 ? 1 : ag_utf8_decode(s + i, n - i, &cp);
        if (c < 0x20 || c == 0x7f || len == 0) {
            k += (size_t)snprintf(out + k, 160 - k, "\\x%02x", c);
            i++;
        } else {
            memcpy(out + k, s + i, len);
            k += len;
            i += len;
        }
        if (i < n && k >= 64) k += (size_t)snprintf(out + k, 160 - k, "...");
    }
    out[k] = '\0';
    return out;
}

/* Re-issues the current error message as "<what> '<name>': <message>". */
static ag_status prefix_error(ag_status s, const char *what, const char *name) {
    char msg[512];
    snprintf(msg, sizeof msg, "%s", ag_error_message());
    return ag_errorf(s, "%s '%s': %s", what, name, msg);
}

/* ---- name index ---- */

static ag_status index_init(name_index *ix, uint64_t n, ag_arena *a) {
    uint64_t cap = 8;
    while (cap < n * 2) cap <<= 1; /* n is bounded by the file size, no overflow */
    ag_status s;
    ix->slots = arena_calloc(a, cap, sizeof *ix->slots, &s);
    if (!ix->slots) return s;
    ix->mask = cap - 1;
    return AG_OK;
}

/* Finds `name` among names[] through the index; returns its position or -1.
 * With `insert` >= 0, adds that position if the name is absent and returns
 * -1, or returns the existing position of a duplicate. */
static int64_t index_lookup(const name_index *ix, const char *const *names, const size_t *lens,
                            const char *name, size_t len, int64_t insert) {
    if (!ix->slots) return -1;
    uint64_t h = ag_hash64(name, len) & ix->mask;
    for (;;) {
        uint32_t s = ix->slots[h];
        if (s == 0) {
            if (insert >= 0) ix->slots[h] = (uint32_t)insert + 1;
            return -1;
        }
        int64_t i = (int64_t)s - 1;
        if (lens[i] == len && memcmp(names[i], name, len) == 0) return i;
        h = (h + 1) & ix->mask;
    }
}

/* Copies a key or tensor name into the arena after checking it. */
static ag_status take_name(ag_gguf *g, const char *p, uint64_t len, size_t max, size_t at,
                           const char *what, char **out) {
    if (len == 0) return ag_errorf(AG_ERR_FORMAT, "at offset %zu: empty %s", at, what);
    if (len > max)
        return ag_errorf(AG_ERR_FORMAT, "at offset %zu: %s of %" PRIu64 " bytes (limit %zu)", at,
                         what, len, max);
    if (memchr(p, '\0', (size_t)len))
        return ag_errorf(AG_ERR_FORMAT, "at offset %zu: %s contains a NUL byte", at, what);
    ag_status s;
    char *q = arena_calloc(&g->arena, len + 1, 1, &s);
    if (!q) return s;
    memcpy(q, p, (size_t)len);
    *out = q;
    return AG_OK;
}

static ag_status parse(ag_gguf *g) {
    cursor c = {g->data, g->size, 0};
    ag_status s;
    if (g->size < 4 || memcmp(g->data, "GGUF", 4) != 0)
        return ag_errorf(AG_ERR_FORMAT, "not a GGUF file (bad magic at offset 0)");
    c.pos = 4;
    if ((s = rd_u32(&c, &g->version, "version"))) return s;
    if (g->version == 1)
        return ag_errorf(AG_ERR_FORMAT, "unsupported GGUF version 1 (only 2 and 3 are read)");
    if (g->version != 2 && g->version != 3) {
        if ((g->version & 0xFFFF) == 0)
            return ag_errorf(AG_ERR_FORMAT,
                             "unsupported GGUF version %u (a big-endian file? only little-endian "
                             "v2 and v3 are read)",
                             g->version);
        return ag_errorf(AG_ERR_FORMAT, "unsupported GGUF version %u (only 2 and 3 are read)",
                         g->version);
    }
    uint64_t n_tensors, n_kv;
    if ((s = rd_u64(&c, &n_tensors, "tensor count"))) return s;
    if ((s = rd_u64(&c, &n_kv, "key/value count"))) return s;
    /* Each key/value takes at least 8 (key length) + 1 + 4 (type) + 1 bytes,
     * each tensor info at least 8 + 1 + 4 + 8 + 4 + 8. */
    if (n_kv > remaining(&c) / 14)
        return ag_errorf(AG_ERR_FORMAT,
                         "at offset 16: key/value count %" PRIu64 " cannot fit in a file of %zu bytes",
                         n_kv, g->size);
    if (n_tensors > remaining(&c) / 33)
        return ag_errorf(AG_ERR_FORMAT,
                         "at offset 8: tensor count %" PRIu64 " cannot fit in a file of %zu bytes",
                         n_tensors, g->size);
    if (n_kv >= UINT32_MAX || n_tensors >= UINT32_MAX) /* the indexes hold u32 positions */
        return ag_errorf(AG_ERR_FORMAT, "at offset 8: too many tensors or keys");
    g->n_kv = (int64_t)n_kv;
    g->n_tensors = (int64_t)n_tensors;

    g->keys = arena_calloc(&g->arena, n_kv, sizeof *g->keys, &s);
    if (!g->keys) return s;
    g->key_len = arena_calloc(&g->arena, n_kv, sizeof *g->key_len, &s);
    if (!g->key_len) return s;
    g->values = arena_calloc(&g->arena, n_kv, sizeof *g->values, &s);
    if (!g->values) return s;
    if ((s = index_init(&g->kv_index, n_kv, &g->arena))) return s;

    g->alignment = AG_GGUF_DEFAULT_ALIGNMENT;
    for (uint64_t i = 0; i < n_kv; i++) {
        size_t at = c.pos;
        const char *kp;
        uint64_t klen;
        if ((s = rd_str(&c, &kp, &klen, "key"))) return s;
        char *key;
        if ((s = take_name(g, kp, klen, AG_GGUF_MAX_KEY_LEN, at, "key", &key))) return s;
        g->keys[i] = key;
        char kshow[160];
        show(key, kshow);
        g->key_len[i] = (size_t)klen;
        int64_t dup = index_lookup(&g->kv_index, g->keys, g->key_len, key, (size_t)klen, (int64_t)i);
        if (dup >= 0)
            return ag_errorf(AG_ERR_FORMAT, "at offset %zu: duplicate key '%s'", at, kshow);
        uint32_t type;
        size_t tat = c.pos;
        if ((s = rd_u32(&c, &type, "value type"))) return s;
        if (type > AG_GGUF_F64)
            return ag_errorf(AG_ERR_FORMAT, "key '%s': at offset %zu: unknown value type %u", kshow,
                             tat, type);
        if ((s = parse_value(g, &c, type, &g->values[i], 0))) return prefix_error(s, "key", kshow);
        if (!strcmp(key, "general.alignment")) {
            /* ggml requires a u32 power of two. */
            if (type != AG_GGUF_U32)
                return ag_errorf(AG_ERR_FORMAT, "key 'general.alignment': at offset %zu: type %s, expected u32",
                                 tat, value_type_name(type));
            uint64_t a = g->values[i].u;
            if (a == 0 || (a & (a - 1)) != 0)
                return ag_errorf(AG_ERR_FORMAT,
                                 "key 'general.alignment': at offset %zu: %" PRIu64
                                 " is not a power of two",
                                 tat + 4, a);
            g->alignment = a;
        }
    }

    g->tensors = arena_calloc(&g->arena, n_tensors, sizeof *g->tensors, &s);
    if (!g->tensors) return s;
    g->name_len = arena_calloc(&g->arena, n_tensors, sizeof *g->name_len, &s);
    if (!g->name_len) return s;
    if ((s = index_init(&g->tensor_index, n_tensors, &g->arena))) return s;
    const char **names = arena_calloc(&g->arena, n_tensors, sizeof *names, &s);
    if (!names) return s;
    g->tensor_names = names;

    for (uint64_t i = 0; i < n_tensors; i++) {
        ag_gguf_tensor *t = &g->tensors[i];
        size_t at = c.pos;
        const char *np;
        uint64_t nlen;
        if ((s = rd_str(&c, &np, &nlen, "tensor name"))) return s;
        char *name;
        if ((s = take_name(g, np, nlen, AG_GGUF_MAX_NAME_LEN, at, "tensor name", &name))) return s;
        t->name = name;
        char nshow[160];
        show(name, nshow);
        names[i] = name;
        g->name_len[i] = (size_t)nlen;
        if (index_lookup(&g->tensor_index, names, g->name_len, name, (size_t)nlen, (int64_t)i) >= 0)
            return ag_errorf(AG_ERR_FORMAT, "at offset %zu: duplicate tensor name '%s'", at, nshow);
        size_t dat = c.pos;
        if ((s = rd_u32(&c, &t->n_dims, "tensor dimension count"))) return s;
        if (t->n_dims == 0 || t->n_dims > AG_GGUF_MAX_DIMS)
            return ag_errorf(AG_ERR_FORMAT, "tensor '%s': at offset %zu: %u dimensions (must be 1..%d)",
                             nshow, dat, t->n_dims, AG_GGUF_MAX_DIMS);
        uint64_t n_elems = 1;
        for (uint32_t d = 0; d < AG_GGUF_MAX_DIMS; d++) t->ne[d] = 1;
        for (uint32_t d = 0; d < t->n_dims; d++) {
            size_t nat = c.pos;
            if ((s = rd_u64(&c, &t->ne[d], "tensor dimension"))) return s;
            if (t->ne[d] == 0 || t->ne[d] > (uint64_t)INT64_MAX)
                return ag_errorf(AG_ERR_FORMAT, "tensor '%s': at offset %zu: dimension %u is %" PRIu64,
                                 nshow, nat, d, t->ne[d]);
            if (__builtin_mul_overflow(n_elems, t->ne[d], &n_elems) || n_elems > (uint64_t)INT64_MAX)
                return ag_errorf(AG_ERR_FORMAT, "tensor '%s': at offset %zu: element count overflows",
                                 nshow, nat);
        }
        t->n_elems = n_elems;
        size_t tat = c.pos;
        if ((s = rd_u32(&c, &t->type, "tensor type"))) return s;
        uint32_t blck, bytes;
        if (!ag_tensor_type_layout(t->type, &blck, &bytes))
            return ag_errorf(AG_ERR_FORMAT, "tensor '%s': at offset %zu: unknown tensor type %u", nshow,
                             tat, t->type);
        if (t->ne[0] % blck != 0)
            return ag_errorf(AG_ERR_FORMAT,
                             "tensor '%s': row length %" PRIu64 " is not a multiple of the %s block size %u",
                             nshow, t->ne[0], ag_tensor_type_name(t->type), blck);
        /* size = (ne0 / blck) * bytes * ne1 * ne2 * ne3; n_elems fits in
         * int64, but bytes per block can exceed elements per block. */
        uint64_t size;
        bool ovf = __builtin_mul_overflow(t->ne[0] / blck, (uint64_t)bytes, &size);
        for (uint32_t d = 1; d < AG_GGUF_MAX_DIMS; d++) ovf |= __builtin_mul_overflow(size, t->ne[d], &size);
        if (ovf)
            return ag_errorf(AG_ERR_FORMAT, "tensor '%s': byte size overflows", nshow);
        t->size = size;
        size_t oat = c.pos;
        if ((s = rd_u64(&c, &t->offset, "tensor offset"))) return s;
        if (t->offset % g->alignment != 0)
            return ag_errorf(AG_ERR_FORMAT,
                             "tensor '%s': at offset %zu: data offset %" PRIu64
                             " is not a multiple of the alignment %" PRIu64,
                             nshow, oat, t->offset, g->alignment);
    }

    /* The data section starts at the next multiple of the alignment. */
    uint64_t end = c.pos, data_off;
    if (__builtin_add_overflow(end, g->alignment - 1, &data_off))
        return ag_errorf(AG_ERR_FORMAT, "data offset overflows");
    data_off -= data_off % g->alignment;
    g->data_offset = data_off;
    if (n_tensors > 0 && data_off > g->size)
        return ag_errorf(AG_ERR_FORMAT,
                         "data section at offset %" PRIu64 " beyond end of file (size %zu)", data_off,
                         g->size);

    for (uint64_t i = 0; i < n_tensors; i++) {
        ag_gguf_tensor *t = &g->tensors[i];
        char nshow[160];
        uint64_t a, b;
        if (__builtin_add_overflow(data_off, t->offset, &a) || __builtin_add_overflow(a, t->size, &b) ||
            b > g->size)
            return ag_errorf(AG_ERR_FORMAT,
                             "tensor '%s': data [%" PRIu64 ", %" PRIu64 ") beyond end of file (size %zu)",
                             show(t->name, nshow), data_off + t->offset, data_off + t->offset + t->size, g->size);
        t->data = g->data + a;
    }

    /* No two tensors may overlap: sort positions by offset, compare neighbours. */
    if (n_tensors > 1) {
        uint32_t *order = malloc((size_t)n_tensors * sizeof *order);
        if (!order) return ag_errorf(AG_ERR_NOMEM, "out of memory");
        for (uint64_t i = 0; i < n_tensors; i++) order[i] = (uint32_t)i;
        /* qsort needs the tensors: a small insertion-free heap sort keyed
         * through a static-free comparator is overkill; use a merge sort. */
        uint32_t *tmp = malloc((size_t)n_tensors * sizeof *tmp);
        if (!tmp) {
            free(order);
            return ag_errorf(AG_ERR_NOMEM, "out of memory");
        }
        for (uint64_t w = 1; w < n_tensors; w *= 2) {
            for (uint64_t lo = 0; lo < n_tensors; lo += 2 * w) {
                uint64_t mid = lo + w < n_tensors ? lo + w : n_tensors;
                uint64_t hi = lo + 2 * w < n_tensors ? lo + 2 * w : n_tensors;
                uint64_t x = lo, y = mid, k = lo;
                while (x < mid && y < hi)
                    tmp[k++] = g->tensors[order[y]].offset < g->tensors[order[x]].offset ? order[y++]
                                                                                         : order[x++];
                while (x < mid) tmp[k++] = order[x++];
                while (y < hi) tmp[k++] = order[y++];
            }
            uint32_t *sw = order;
            order = tmp;
            tmp = sw;
        }
        ag_status st = AG_OK;
        for (uint64_t k = 1; k < n_tensors; k++) {
            const ag_gguf_tensor *p = &g->tensors[order[k - 1]], *q = &g->tensors[order[k]];
            char ps[160], qs[160];
            if (p->offset + p->size > q->offset) {
                st = ag_errorf(AG_ERR_FORMAT,
                               "tensor '%s': data [%" PRIu64 ", %" PRIu64 ") overlaps tensor '%s' [%" PRIu64
                               ", %" PRIu64 ")",
                               show(q->name, qs), data_off + q->offset, data_off + q->offset + q->size, show(p->name, ps),
                               data_off + p->offset, data_off + p->offset + p->size);
                break;
            }
        }
        free(order);
        free(tmp);
        if (st) return st;
    }
    return AG_OK;
}

static ag_status open_common(ag_gguf *g, ag_gguf **out) {
    ag_status s = parse(g);
    if (s) {
        ag_gguf_free(g);
        return s;
    }
    *out = g;
    return AG_OK;
}

ag_status ag_gguf_open_memory(const void *data, size_t size, ag_gguf **out) {
    *out = NULL;
    ag_gguf *g = calloc(1, sizeof *g);
    if (!g) return ag_errorf(AG_ERR_NOMEM, "out of memory");
    g->arena.min_chunk = 64 << 10;
    g->data = data;
    g->size = size;
    return open_common(g, out);
}

ag_status ag_gguf_open_composite(void *image, size_t image_len, const ag_gguf_tensor *tensors, int64_t n_tensors,
                                 void (*release)(void *owner), void *owner, ag_gguf **out) {
    *out = NULL;
    ag_gguf *g = calloc(1, sizeof *g);
    if (!g) {
        free(image);
        if (release) release(owner);
        return ag_errorf(AG_ERR_NOMEM, "out of memory");
    }
    g->arena.min_chunk = 64 << 10;
    g->data = image;
    g->size = image_len;
    g->own_image = image;
    g->release = release;
    g->owner = owner;
    ag_status s = parse(g);
    if (!s && g->n_tensors)
        s = ag_errorf(AG_ERR_INVALID, "composite GGUF: the metadata image holds tensors of its own");
    if (!s && (n_tensors < 0 || n_tensors >= UINT32_MAX))
        s = ag_errorf(AG_ERR_INVALID, "composite GGUF: %" PRId64 " tensors", n_tensors);
    if (!s) {
        g->n_tensors = n_tensors;
        g->tensors = arena_calloc(&g->arena, (uint64_t)n_tensors, sizeof *g->tensors, &s);
        if (!s) g->name_len = arena_calloc(&g->arena, (uint64_t)n_tensors, sizeof *g->name_len, &s);
        if (!s) g->tensor_names = arena_calloc(&g->arena, (uint64_t)n_tensors, sizeof *g->tensor_names, &s);
        if (!s) s = index_init(&g->tensor_index, (uint64_t)n_tensors, &g->arena);
    }
    /* the same promises as a file's tensors: unique names, 1..4 dims, rows
     * whole blocks, sizes from the type layout (the bytes are the caller's) */
    for (int64_t i = 0; !s && i < n_tensors; i++) {
        const ag_gguf_tensor *src = &tensors[i];
        ag_gguf_tensor       *t = &g->tensors[i];
        *t = *src;
        char  *name;
        size_t nlen = src->name ? strlen(src->name) : 0;
        if ((s = take_name(g, src->name ? src->name : "", nlen, AG_GGUF_MAX_NAME_LEN, 0, "tensor name", &name))) break;
        t->name = name;
        g->tensor_names[i] = name;
        g->name_len[i] = nlen;
        if (index_lookup(&g->tensor_index, g->tensor_names, g->name_len, name, nlen, i) >= 0) {
            s = ag_errorf(AG_ERR_FORMAT, "duplicate tensor name '%s'", name);
            break;
        }
        uint32_t blck, bytes;
        uint64_t n_elems = 1, size;
        bool     ovf = t->n_dims == 0 || t->n_dims > AG_GGUF_MAX_DIMS || !ag_tensor_type_layout(t->type, &blck, &bytes);
        for (uint32_t d = 0; !ovf && d < AG_GGUF_MAX_DIMS; d++) {
            if (d >= t->n_dims) t->ne[d] = 1;
            ovf |= t->ne[d] == 0 || t->ne[d] > (uint64_t)INT64_MAX || __builtin_mul_overflow(n_elems, t->ne[d], &n_elems);
        }
        ovf = ovf || t->ne[0] % blck || __builtin_mul_overflow(t->ne[0] / blck, (uint64_t)bytes, &size);
        for (uint32_t d = 1; !ovf && d < AG_GGUF_MAX_DIMS; d++) ovf |= __builtin_mul_overflow(size, t->ne[d], &size);
        if (ovf || size != src->size || !t->data) {
            s = ag_errorf(AG_ERR_FORMAT, "tensor '%s': bad type, shape or size", name);
            break;
        }
        t->n_elems = n_elems;
    }
    if (s) {
        ag_gguf_free(g);
        return s;
    }
    *out = g;
    return AG_OK;
}

ag_status ag_gguf_open(const char *path, ag_gguf **out) {
    *out = NULL;
    ag_gguf *g = calloc(1, sizeof *g);
    if (!g) return ag_errorf(AG_ERR_NOMEM, "out of memory");
    g->arena.min_chunk = 64 << 10;
    ag_status s = ag_file_map(path, &g->map);
    if (s) {
        free(g);
        /* Messages never name the path (callers add it); ag_file_map's do. */
        const char *m = ag_error_message();
        size_t pl = strlen(path);
        if (!strncmp(m, path, pl) && m[pl] == ':' && m[pl + 1] == ' ') {
            char msg[512];
            snprintf(msg, sizeof msg, "%s", m + pl + 2);
            return ag_errorf(s, "%s", msg);
        }
        return s;
    }
    g->data = g->map.data;
    g->size = g->map.size;
    return open_common(g, out);
}

void ag_gguf_free(ag_gguf *g) {
    if (!g) return;
    ag_arena_free(&g->arena);
    ag_file_unmap(&g->map);
    free(g->own_image);
    if (g->release) g->release(g->owner);
    free(g);
}

uint32_t ag_gguf_version(const ag_gguf *g) { return g->version; }
size_t   ag_gguf_file_size(const ag_gguf *g) { return g->size; }
uint64_t ag_gguf_alignment(const ag_gguf *g) { return g->alignment; }
uint64_t ag_gguf_data_offset(const ag_gguf *g) { return g->data_offset; }

/* ---- metadata ---- */

int64_t ag_gguf_n_kv(const ag_gguf *g) { return g->n_kv; }

int64_t ag_gguf_find_key(const ag_gguf *g, const char *key) {
    if (!key) return -1;
    return index_lookup(&g->kv_index, g->keys, g->key_len, key, strlen(key), -1);
}

const char *ag_gguf_key(const ag_gguf *g, int64_t i) {
    return i >= 0 && i < g->n_kv ? g->keys[i] : NULL;
}

ag_gguf_type ag_gguf_kv_type(const ag_gguf *g, int64_t i) {
    return i >= 0 && i < g->n_kv ? g->values[i].type : (ag_gguf_type)-1;
}

const ag_gguf_value *ag_gguf_kv_value(const ag_gguf *g, int64_t i) {
    return i >= 0 && i < g->n_kv ? &g->values[i] : NULL;
}

const ag_gguf_value *ag_gguf_get(const ag_gguf *g, const char *key) {
    return ag_gguf_kv_value(g, ag_gguf_find_key(g, key));
}

/* A scalar integer (or bool) value as a signed/unsigned pair; false if the
 * value is not an integer. `neg` says it is below zero. */
static bool as_int(const ag_gguf_value *v, bool *neg, uint64_t *mag, int64_t *sv) {
    switch (v->type) {
    case AG_GGUF_U8: case AG_GGUF_U16: case AG_GGUF_U32: case AG_GGUF_U64: case AG_GGUF_BOOL:
        *neg = false;
        *mag = v->u;
        return true;
    case AG_GGUF_I8: case AG_GGUF_I16: case AG_GGUF_I32: case AG_GGUF_I64:
        *neg = v->i < 0;
        *sv = v->i;
        *mag = v->i < 0 ? 0 : (uint64_t)v->i;
        return true;
    default:
        return false;
    }
}

bool ag_gguf_get_u32(const ag_gguf *g, const char *key, uint32_t *out) {
    const ag_gguf_value *v = ag_gguf_get(g, key);
    bool neg;
    uint64_t m;
    int64_t sv;
    if (!v || !as_int(v, &neg, &m, &sv) || neg || m > UINT32_MAX) return false;
    *out = (uint32_t)m;
    return true;
}

bool ag_gguf_get_i64(const ag_gguf *g, const char *key, int64_t *out) {
    const ag_gguf_value *v = ag_gguf_get(g, key);
    bool neg;
    uint64_t m;
    int64_t sv = 0;
    if (!v || !as_int(v, &neg, &m, &sv)) return false;
    if (neg) {
        *out = sv;
        return true;
    }
    if (m > (uint64_t)INT64_MAX) return false;
    *out = (int64_t)m;
    return true;
}

bool ag_gguf_get_f32(const ag_gguf *g, const char *key, float *out) {
    const ag_gguf_value *v = ag_gguf_get(g, key);
    if (!v) return false;
    if (v->type == AG_GGUF_F32 || v->type == AG_GGUF_F64) {
        *out = (float)v->f;
        return true;
    }
    bool neg;
    uint64_t m;
    int64_t sv = 0;
    if (v->type == AG_GGUF_BOOL || !as_int(v, &neg, &m, &sv)) return false;
    *out = neg ? (float)sv : (float)m;
    return true;
}

bool ag_gguf_get_bool(const ag_gguf *g, const char *key, bool *out) {
    const ag_gguf_value *v = ag_gguf_get(g, key);
    if (!v || v->type != AG_GGUF_BOOL) return false;
    *out = v->u != 0;
    return true;
}

const char *ag_gguf_get_str(const ag_gguf *g, const char *key, uint64_t *len) {
    const ag_gguf_value *v = ag_gguf_get(g, key);
    if (!v || v->type != AG_GGUF_STRING) return NULL;
    if (len) *len = v->str.len;
    /* A zero-length string may sit at the very end of the file: return a
     * non-NULL pointer anyway, since NULL means "missing". */
    return v->str.ptr ? v->str.ptr : "";
}

bool ag_gguf_arr_i64(const ag_gguf_value *arr, uint64_t i, int64_t *out) {
    if (!arr || arr->type != AG_GGUF_ARRAY || i >= arr->arr.n) return false;
    const uint8_t *p = (const uint8_t *)arr->arr.raw;
    switch (arr->arr.elem_type) {
    case AG_GGUF_U8: case AG_GGUF_BOOL: *out = p[i]; return true;
    case AG_GGUF_I8: { int8_t x; memcpy(&x, p + i, 1); *out = x; return true; }
    case AG_GGUF_U16: { uint16_t x; memcpy(&x, p + 2 * i, 2); *out = x; return true; }
    case AG_GGUF_I16: { int16_t x; memcpy(&x, p + 2 * i, 2); *out = x; return true; }
    case AG_GGUF_U32: { uint32_t x; memcpy(&x, p + 4 * i, 4); *out = x; return true; }
    case AG_GGUF_I32: { int32_t x; memcpy(&x, p + 4 * i, 4); *out = x; return true; }
    case AG_GGUF_U64: {
        uint64_t x;
        memcpy(&x, p + 8 * i, 8);
        if (x > (uint64_t)INT64_MAX) return false;
        *out = (int64_t)x;
        return true;
    }
    case AG_GGUF_I64: { int64_t x; memcpy(&x, p + 8 * i, 8); *out = x; return true; }
    default: return false; /* floats, strings, arrays */
    }
}

bool ag_gguf_arr_f64(const ag_gguf_value *arr, uint64_t i, double *out) {
    if (!arr || arr->type != AG_GGUF_ARRAY || i >= arr->arr.n) return false;
    const uint8_t *p = (const uint8_t *)arr->arr.raw;
    if (arr->arr.elem_type == AG_GGUF_F32) {
        float x;
        memcpy(&x, p + 4 * i, 4);
        *out = x;
        return true;
    }
    if (arr->arr.elem_type == AG_GGUF_F64) {
        memcpy(out, p + 8 * i, 8);
        return true;
    }
    if (arr->arr.elem_type == AG_GGUF_U64) {
        uint64_t x;
        memcpy(&x, p + 8 * i, 8);
        *out = (double)x;
        return true;
    }
    int64_t x;
    if (!ag_gguf_arr_i64(arr, i, &x)) return false;
    *out = (double)x;
    return true;
}

/* ---- tensors ---- */

int64_t ag_gguf_n_tensors(const ag_gguf *g) { return g->n_tensors; }

const ag_gguf_tensor *ag_gguf_tensor_at(const ag_gguf *g, int64_t i) {
    return i >= 0 && i < g->n_tensors ? &g->tensors[i] : NULL;
}

const ag_gguf_tensor *ag_gguf_find_tensor(const ag_gguf *g, const char *name) {
    if (!name || g->n_tensors == 0) return NULL;
    int64_t i = index_lookup(&g->tensor_index, g->tensor_names, g->name_len, name, strlen(name), -1);
    return i >= 0 ? &g->tensors[i] : NULL;
}
