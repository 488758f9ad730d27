/* The safetensors reader (see safetensors.h). The header is JSON, parsed by
 * jansson; every number in it is checked before it is used as an offset. */
#include "model/safetensors.h"

#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/file.h"

struct ag_st_file {
    ag_mapped_file map;
    int64_t        n;
    ag_st_tensor  *t;
    char          *names; /* all names, NUL-separated */
    bool           borrowed; /* ag_st_open_memory: map is the caller's bytes */
};

/* dtype names as the format spells them; bool, unsigned and 8-bit float
 * types are refused (no model weight augur runs comes in them). */
static bool dtype_of(const char *s, uint32_t *type) {
    static const struct {
        const char *name;
        uint32_t    type;
    } k[] = {{"F32", AG_TYPE_F32}, {"F16", AG_TYPE_F16}, {"BF16", AG_TYPE_BF16}, {"F64", AG_TYPE_F64},
             {"I8", AG_TYPE_I8},   {"I16", AG_TYPE_I16}, {"I32", AG_TYPE_I32},   {"I64", AG_TYPE_I64}};
    for (size_t i = 0; i < sizeof k / sizeof k[0]; i++)
        if (!strcmp(s, k[i].name)) {
            *type = k[i].type;
            return true;
        }
    return false;
}

static int cmp_off(const void *a, const void *b) {
    const ag_st_tensor *x = *(const ag_st_tensor *const *)a, *y = *(const ag_st_tensor *const *)b;
    return (x->offset > y->offset) - (x->offset < y->offset);
}

static ag_status parse(ag_st_file *f) {
    const uint8_t *p = f->map.data;
    const size_t   size = f->map.size;
    if (size < 8) return ag_errorf(AG_ERR_FORMAT, "not a safetensors file (%zu bytes, no header length)", size);
    uint64_t hlen;
    memcpy(&hlen, p, 8);
    if (hlen < 2 || hlen > size - 8)
        return ag_errorf(AG_ERR_FORMAT, "header length %" PRIu64 " does not fit a file of %zu bytes", hlen, size);
    const uint64_t data_off = 8 + hlen, data_size = size - data_off;
    json_error_t   je;
    json_t        *root = json_loadb((const char *)p + 8, (size_t)hlen, JSON_REJECT_DUPLICATES, &je);
    if (!root) return ag_errorf(AG_ERR_FORMAT, "header JSON: %s (at byte %d of the header)", je.text, je.position);
    ag_status st = AG_OK;
    if (!json_is_object(root)) {
        st = ag_errorf(AG_ERR_FORMAT, "the header is not a JSON object");
        goto done;
    }
    size_t      names_len = 0;
    const char *key;
    json_t     *val;
    json_object_foreach(root, key, val) {
        if (strcmp(key, "__metadata__")) f->n++, names_len += strlen(key) + 1;
    }
    f->t = calloc((size_t)f->n + 1, sizeof *f->t);
    f->names = malloc(names_len + 1);
    if (!f->t || !f->names) {
        st = ag_errorf(AG_ERR_NOMEM, "out of memory");
        goto done;
    }
    int64_t i = 0;
    size_t  at = 0;
    json_object_foreach(root, key, val) {
        if (!strcmp(key, "__metadata__")) continue;
        ag_st_tensor *t = &f->t[i++];
        size_t        kl = strlen(key);
        if (kl == 0) {
            st = ag_errorf(AG_ERR_FORMAT, "a tensor with an empty name");
            goto done;
        }
        memcpy(f->names + at, key, kl + 1);
        t->name = f->names + at;
        at += kl + 1;
        json_t     *dt = json_object_get(val, "dtype"), *sh = json_object_get(val, "shape"),
               *off = json_object_get(val, "data_offsets");
        if (!json_is_string(dt) || !json_is_array(sh) || !json_is_array(off) || json_array_size(off) != 2) {
            st = ag_errorf(AG_ERR_FORMAT, "tensor '%s': needs dtype, shape and data_offsets [begin, end]", key);
            goto done;
        }
        if (!dtype_of(json_string_value(dt), &t->type)) {
            st = ag_errorf(AG_ERR_UNSUPPORTED, "tensor '%s': dtype %s is not supported (F32, F16, BF16, F64, I8-I64)",
                           key, json_string_value(dt));
            goto done;
        }
        if (json_array_size(sh) > 4) {
            st = ag_errorf(AG_ERR_UNSUPPORTED, "tensor '%s': %zu dimensions (at most 4)", key, json_array_size(sh));
            goto done;
        }
        t->n_dims = (uint32_t)json_array_size(sh);
        uint64_t n = 1;
        bool     bad = false;
        for (uint32_t d = 0; d < t->n_dims; d++) {
            json_t *e = json_array_get(sh, d);
            if (!json_is_integer(e) || json_integer_value(e) < 0) {
                bad = true;
                break;
            }
            t->shape[d] = (uint64_t)json_integer_value(e);
            bad |= __builtin_mul_overflow(n, t->shape[d], &n);
        }
        uint32_t be, bb;
        ag_tensor_type_layout(t->type, &be, &bb);
        json_t *o0 = json_array_get(off, 0), *o1 = json_array_get(off, 1);
        if (bad || __builtin_mul_overflow(n, (uint64_t)bb, &t->size) || !json_is_integer(o0) || !json_is_integer(o1) ||
            json_integer_value(o0) < 0 || json_integer_value(o1) < json_integer_value(o0)) {
            st = ag_errorf(AG_ERR_FORMAT, "tensor '%s': bad shape or data_offsets", key);
            goto done;
        }
        t->n_elems = n;
        t->offset = (uint64_t)json_integer_value(o0);
        uint64_t end = (uint64_t)json_integer_value(o1);
        if (end - t->offset != t->size || end > data_size) {
            st = ag_errorf(AG_ERR_FORMAT,
                           "tensor '%s': data [%" PRIu64 ", %" PRIu64 ") is not its %" PRIu64
                           " bytes inside the data section (%" PRIu64 " bytes)",
                           key, t->offset, end, t->size, data_size);
            goto done;
        }
        t->data = p + data_off + t->offset;
    }
    /* no two tensors overlap */
    ag_st_tensor **order = malloc(sizeof *order * ((size_t)f->n + 1));
    if (!order) {
        st = ag_errorf(AG_ERR_NOMEM, "out of memory");
        goto done;
    }
    for (int64_t k = 0; k < f->n; k++) order[k] = &f->t[k];
    qsort(order, (size_t)f->n, sizeof *order, cmp_off);
    for (int64_t k = 1; k < f->n && !st; k++)
        if (order[k - 1]->offset + order[k - 1]->size > order[k]->offset)
            st = ag_errorf(AG_ERR_FORMAT, "tensors '%s' and '%s' overlap", order[k - 1]->name, order[k]->name);
    free(order);
done:
    json_decref(root);
    return st;
}

ag_status ag_st_open(const char *path, ag_st_file **out) {
    *out = NULL;
    ag_st_file *f = calloc(1, sizeof *f);
    if (!f) return ag_errorf(AG_ERR_NOMEM, "out of memory");
    ag_status st = ag_file_map(path, &f->map);
    if (!st) st = parse(f);
    if (st) {
        ag_st_free(f);
        return st;
    }
    *out = f;
    return AG_OK;
}

ag_status ag_st_open_memory(const void *data, size_t size, ag_st_file **out) {
    *out = NULL;
    ag_st_file *f = calloc(1, sizeof *f);
    if (!f) return ag_errorf(AG_ERR_NOMEM, "out of memory");
    f->map.data = data;
    f->map.size = size;
    f->borrowed = true;
    ag_status st = parse(f);
    if (st) {
        ag_st_free(f);
        return st;
    }
    *out = f;
    return AG_OK;
}

void ag_st_free(ag_st_file *f) {
    if (!f) return;
    if (!f->borrowed) ag_file_unmap(&f->map);
    free(f->t);
    free(f->names);
    free(f);
}

int64_t             ag_st_n_tensors(const ag_st_file *f) { return f->n; }
const ag_st_tensor *ag_st_tensor_at(const ag_st_file *f, int64_t i) { return i >= 0 && i < f->n ? &f->t[i] : NULL; }

const ag_st_tensor *ag_st_find(const ag_st_file *f, const char *name) {
    for (int64_t i = 0; i < f->n; i++)
        if (!strcmp(f->t[i].name, name)) return &f->t[i];
    return NULL;
}
