/* GGUF model files: a bounds-checked reader over an mmapped file, and a writer.
 *
 * Model files are untrusted input. ag_gguf_open() validates the whole header
 * (every count, string length, array length, type tag, tensor dimension,
 * offset and size, with overflow-safe arithmetic) before returning; after a
 * successful open every accessor below is safe and O(1) or O(log n). A bad
 * file yields AG_ERR_FORMAT with a message naming what is wrong and at which
 * byte offset, never a crash.
 *
 * Ownership: an ag_gguf owns its mapping. Every pointer it hands out (strings,
 * array data, tensor data) is borrowed and valid until ag_gguf_free(). Strings
 * in GGUF are NOT NUL-terminated: they come as (pointer, length) pairs. */
#ifndef AG_GGUF_H
#define AG_GGUF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/status.h"

/* Metadata value types, with their on-disk tags. */
typedef enum {
    AG_GGUF_U8 = 0,
    AG_GGUF_I8 = 1,
    AG_GGUF_U16 = 2,
    AG_GGUF_I16 = 3,
    AG_GGUF_U32 = 4,
    AG_GGUF_I32 = 5,
    AG_GGUF_F32 = 6,
    AG_GGUF_BOOL = 7,
    AG_GGUF_STRING = 8,
    AG_GGUF_ARRAY = 9,
    AG_GGUF_U64 = 10,
    AG_GGUF_I64 = 11,
    AG_GGUF_F64 = 12,
} ag_gguf_type;

/* Tensor element types (ggml's numbering, which GGUF stores). */
typedef enum {
    AG_TYPE_F32 = 0,
    AG_TYPE_F16 = 1,
    AG_TYPE_Q4_0 = 2,
    AG_TYPE_Q4_1 = 3,
    AG_TYPE_Q5_0 = 6,
    AG_TYPE_Q5_1 = 7,
    AG_TYPE_Q8_0 = 8,
    AG_TYPE_Q8_1 = 9,
    AG_TYPE_Q2_K = 10,
    AG_TYPE_Q3_K = 11,
    AG_TYPE_Q4_K = 12,
    AG_TYPE_Q5_K = 13,
    AG_TYPE_Q6_K = 14,
    AG_TYPE_Q8_K = 15,
    AG_TYPE_IQ2_XXS = 16,
    AG_TYPE_IQ2_XS = 17,
    AG_TYPE_IQ3_XXS = 18,
    AG_TYPE_IQ1_S = 19,
    AG_TYPE_IQ4_NL = 20,
    AG_TYPE_IQ3_S = 21,
    AG_TYPE_IQ2_S = 22,
    AG_TYPE_IQ4_XS = 23,
    AG_TYPE_I8 = 24,
    AG_TYPE_I16 = 25,
    AG_TYPE_I32 = 26,
    AG_TYPE_I64 = 27,
    AG_TYPE_F64 = 28,
    AG_TYPE_IQ1_M = 29,
    AG_TYPE_BF16 = 30,
    AG_TYPE_TQ1_0 = 34,
    AG_TYPE_TQ2_0 = 35,
    AG_TYPE_MXFP4 = 39,
    AG_TYPE_NVFP4 = 40,
    AG_TYPE_Q1_0 = 41,
    AG_TYPE_COUNT = 42,
} ag_tensor_type;

/* Layout of a tensor type: elements per block and bytes per block.
 * Returns false for a tag that is unknown or unused (a gap in the numbering). */
bool        ag_tensor_type_layout(uint32_t type, uint32_t *block_elems, uint32_t *block_bytes);
const char *ag_tensor_type_name(uint32_t type); /* "Q4_K", or "?" */

#define AG_GGUF_MAX_DIMS 4
/* Limits the reader enforces on untrusted files (and the writer on its
 * input), far above anything real: array nesting depth, key length, tensor
 * name length (ggml's own limit is 64). */
#define AG_GGUF_MAX_DEPTH 8
#define AG_GGUF_MAX_KEY_LEN 65535
#define AG_GGUF_MAX_NAME_LEN 4096
#define AG_GGUF_DEFAULT_ALIGNMENT 32

typedef struct {
    const char    *name; /* borrowed, NUL-terminated copy owned by the ag_gguf */
    uint32_t       type; /* ag_tensor_type */
    uint32_t       n_dims;
    uint64_t       ne[AG_GGUF_MAX_DIMS]; /* ne[0] is the contiguous (row) dimension; unused dims are 1 */
    uint64_t       n_elems;
    uint64_t       offset; /* from the start of the data section */
    uint64_t       size;   /* bytes */
    const uint8_t *data;   /* into the mapping */
} ag_gguf_tensor;

typedef struct ag_gguf ag_gguf;

/* Opens and validates a GGUF file (v2 or v3), mmapping it. On failure *out
 * is NULL and the status is AG_ERR_IO (cannot open/map), AG_ERR_FORMAT (bad
 * file) or AG_ERR_NOMEM; the message does not repeat the path, so callers
 * print "<path>: <message>". */
ag_status ag_gguf_open(const char *path, ag_gguf **out);
/* Same over caller-owned bytes (no copy: `data` must outlive the result).
 * Used by the fuzzer and by tests. */
ag_status ag_gguf_open_memory(const void *data, size_t size, ag_gguf **out);
void      ag_gguf_free(ag_gguf *g); /* NULL-safe */
/* A GGUF put together from parts, for models read from other formats
 * (safetensors): the metadata from `image`, a GGUF with no tensors (as
 * ag_gguf_writer_to_memory makes it; heap memory the result takes over and
 * frees), and the tensors described by tensors[0..n_tensors) (name, type,
 * n_dims, ne, size, data; copied, names too), whose bytes belong to `owner`:
 * release(owner) (NULL: nothing to release) runs when the result is freed,
 * or at once on failure, as the image is freed. The tensors are checked as
 * a file's are (unique names, dimensions, whole blocks, size from the type
 * layout); offsets are kept as given (for fingerprints only). */
ag_status ag_gguf_open_composite(void *image, size_t image_len, const ag_gguf_tensor *tensors, int64_t n_tensors,
                                 void (*release)(void *owner), void *owner, ag_gguf **out);

uint32_t ag_gguf_version(const ag_gguf *g);
size_t   ag_gguf_file_size(const ag_gguf *g);
uint64_t ag_gguf_alignment(const ag_gguf *g);
uint64_t ag_gguf_data_offset(const ag_gguf *g); /* byte offset of the tensor data section */

/* ---- metadata ---- */
/* Keys keep their file order (index 0..n_kv-1); lookup is a hash probe.
 * Keys are non-empty, unique, and hold no NUL byte; nothing else is
 * promised about their bytes (print them with care). An index out of range
 * gives NULL / (ag_gguf_type)-1. */
int64_t      ag_gguf_n_kv(const ag_gguf *g);
int64_t      ag_gguf_find_key(const ag_gguf *g, const char *key); /* index, or -1 */
const char  *ag_gguf_key(const ag_gguf *g, int64_t i);            /* NUL-terminated */
ag_gguf_type ag_gguf_kv_type(const ag_gguf *g, int64_t i);

/* Scalar getters by key. They return false (and leave *out alone) when the
 * key is missing or its value cannot be represented in the requested type:
 * integer getters accept any integer type whose value fits (and bool),
 * ag_gguf_get_f32 accepts F32, F64 and integers. */
bool ag_gguf_get_u32(const ag_gguf *g, const char *key, uint32_t *out);
bool ag_gguf_get_i64(const ag_gguf *g, const char *key, int64_t *out);
bool ag_gguf_get_f32(const ag_gguf *g, const char *key, float *out);
bool ag_gguf_get_bool(const ag_gguf *g, const char *key, bool *out);
/* A string value: pointer (not NUL-terminated) and length, or NULL when the
 * key is missing or not a string. Strings are raw bytes: not checked for
 * UTF-8 validity (some vocabularies hold partial sequences). */
const char *ag_gguf_get_str(const ag_gguf *g, const char *key, uint64_t *len);

/* A metadata value of any type, for generic walkers (augur info, tests). */
typedef struct ag_gguf_value {
    ag_gguf_type type;
    union {
        uint64_t u;   /* U8..U64, BOOL */
        int64_t  i;   /* I8..I64 */
        double   f;   /* F32, F64 */
        struct {
            const char *ptr;
            uint64_t    len;
        } str;
        struct {
            ag_gguf_type elem_type;
            uint64_t     n;
            /* For numeric and bool elements: the packed little-endian
             * values in the file (`n` elements of the element size). */
            const void *raw;
            /* For STRING and ARRAY elements: n parsed values. */
            const struct ag_gguf_value *items;
        } arr;
    };
} ag_gguf_value;

const ag_gguf_value *ag_gguf_kv_value(const ag_gguf *g, int64_t i);
/* By key, or NULL if missing. */
const ag_gguf_value *ag_gguf_get(const ag_gguf *g, const char *key);
/* Element i of a numeric array as double / int64 (false on a type mismatch
 * or i out of range). Works for any numeric element type. */
bool ag_gguf_arr_f64(const ag_gguf_value *arr, uint64_t i, double *out);
bool ag_gguf_arr_i64(const ag_gguf_value *arr, uint64_t i, int64_t *out);

/* ---- tensors ----
 * Tensors keep their file order. Every tensor has 1..4 dimensions, each > 0,
 * ne[0] a multiple of its type's block size, a byte size computed from the
 * type layout, data aligned to ag_gguf_alignment() inside the file, and no
 * two tensors overlap. Names are unique, non-empty, NUL-free. */
int64_t               ag_gguf_n_tensors(const ag_gguf *g);
const ag_gguf_tensor *ag_gguf_tensor_at(const ag_gguf *g, int64_t i);
const ag_gguf_tensor *ag_gguf_find_tensor(const ag_gguf *g, const char *name); /* or NULL */

/* ---- writer ----
 * Builds a GGUF v3 file in memory: add key/values and tensors in order, then
 * ag_gguf_writer_write() lays them out and writes the file atomically.
 * Values and tensor bytes are copied at add time, so the caller's buffers
 * may go right after each call. The layout follows ggml's: tensors in the
 * order added, each at an offset aligned to general.alignment (if added,
 * a u32 power of two; else 32), padded to it, the data section aligned too;
 * so a read-then-rewrite of a ggml-written file is byte-identical.
 * The writer refuses (AG_ERR_INVALID / AG_ERR_RANGE, nothing added) what the
 * reader would reject: duplicate or empty keys/names, a scalar that does not
 * fit its type, bools other than 0/1, nesting deeper than
 * AG_GGUF_MAX_DEPTH, array items whose type differs from the element type,
 * unknown tensor types, bad dimensions, a `size` that differs from the
 * type layout's. */
typedef struct ag_gguf_writer ag_gguf_writer;

ag_gguf_writer *ag_gguf_writer_new(void); /* NULL on OOM */
void            ag_gguf_writer_free(ag_gguf_writer *w);
/* Adds a key with a value; strings/arrays inside `v` are deep-copied. The
 * value is read as the reader hands it out: .u for unsigned ints and bool,
 * .i for signed, .f for floats, arrays through .raw (numbers) or .items
 * (strings, arrays); so a value from ag_gguf_kv_value() can be passed on. */
ag_status ag_gguf_writer_add(ag_gguf_writer *w, const char *key, const ag_gguf_value *v);
ag_status ag_gguf_writer_add_u32(ag_gguf_writer *w, const char *key, uint32_t v);
ag_status ag_gguf_writer_add_f32(ag_gguf_writer *w, const char *key, float v);
ag_status ag_gguf_writer_add_bool(ag_gguf_writer *w, const char *key, bool v);
ag_status ag_gguf_writer_add_str(ag_gguf_writer *w, const char *key, const char *s);
ag_status ag_gguf_writer_add_tensor(ag_gguf_writer *w, const char *name, uint32_t type,
                                    uint32_t n_dims, const uint64_t *ne, const void *data,
                                    uint64_t size);
/* Serialises to a heap buffer (caller frees) or to a file. */
ag_status ag_gguf_writer_to_memory(ag_gguf_writer *w, uint8_t **out, size_t *len);
ag_status ag_gguf_writer_write(ag_gguf_writer *w, const char *path);

#endif
