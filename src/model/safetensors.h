/* safetensors files, and model folders in the Hugging Face layout that hold
 * them (config.json + *.safetensors + tokenizer.json, plus the
 * sentence-transformers modules of an embedding model).
 *
 * A safetensors file is an 8-byte little-endian header length, a JSON header
 * {name: {dtype, shape, data_offsets: [begin, end)}, "__metadata__": {...}},
 * then the data section the offsets count from. Like GGUF files these are
 * untrusted input: the header is validated whole (types, shapes, sizes,
 * bounds, overlaps) before anything is handed out.
 *
 * A model folder is not run from its own names: ag_hf_open() translates it
 * into an ag_gguf (ag_gguf_open_composite) with llama.cpp's metadata keys and
 * tensor names, its tensors still in the mapped files, so the rest of augur
 * (model binding, tokenizer, `augur info`) reads it as it reads a GGUF. */
#ifndef AG_MODEL_SAFETENSORS_H
#define AG_MODEL_SAFETENSORS_H

#include <stdbool.h>
#include <stdint.h>

#include "base/status.h"
#include "gguf/gguf.h"

typedef struct {
    const char    *name;  /* NUL-terminated, owned by the file */
    uint32_t       type;  /* ag_tensor_type: F32, F16, BF16, F64, I8, I16, I32, I64 */
    uint32_t       n_dims; /* 0 (a scalar) .. 4 */
    uint64_t       shape[4]; /* as the file lists it: shape[n_dims - 1] is the contiguous dimension */
    uint64_t       n_elems;
    uint64_t       offset; /* into the data section */
    uint64_t       size;   /* bytes */
    const uint8_t *data;   /* into the mapping */
} ag_st_tensor;

typedef struct ag_st_file ag_st_file;

/* Maps and validates `path`. AG_ERR_IO (cannot open), AG_ERR_FORMAT (a bad
 * file; the message says what and where), AG_ERR_UNSUPPORTED (a dtype augur
 * does not read, named). The message does not repeat the path. */
ag_status ag_st_open(const char *path, ag_st_file **out);
/* Same over caller-owned bytes (no copy: `data` must outlive the result):
 * for the fuzzer and tests. */
ag_status ag_st_open_memory(const void *data, size_t size, ag_st_file **out);
void      ag_st_free(ag_st_file *f); /* NULL-safe */

/* Tensors in file-header order; pointers live as long as the file. */
int64_t             ag_st_n_tensors(const ag_st_file *f);
const ag_st_tensor *ag_st_tensor_at(const ag_st_file *f, int64_t i);
const ag_st_tensor *ag_st_find(const ag_st_file *f, const char *name); /* or NULL */

/* Scalar conversions of the 16-bit float types safetensors files hold. */
float ag_half_to_f32(uint16_t h);
float ag_bf16_to_f32(uint16_t h);

/* Opens a model file: a GGUF, or a Hugging Face model folder through
 * ag_hf_open. For every reader of models (the model, tokenize, info). */
ag_status ag_model_file_open(const char *path, ag_gguf **out);

/* Whether `path` is a folder that looks like a Hugging Face model (has a
 * config.json). */
bool ag_hf_is_model_dir(const char *path);

/* Reads the model folder `dir` as an ag_gguf (see above): config.json's
 * architecture and hyper-parameters, every *.safetensors file's tensors
 * (renamed; norm gains that the GGUF convention stores differently are
 * converted into memory the result owns), tokenizer.json's vocabulary, and,
 * for a sentence-transformers model (modules.json), its pooling and Dense
 * layers. Supported: Gemma 3 text models (model_type gemma3_text), as the
 * decoder gemma3 or, with use_bidirectional_attention (EmbeddingGemma), as
 * the embedding model gemma-embedding. Anything else is AG_ERR_UNSUPPORTED
 * naming what. Free the result with ag_gguf_free (it unmaps the files). */
ag_status ag_hf_open(const char *dir, ag_gguf **out);

#endif
