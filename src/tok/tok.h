/* Tokenizers: SentencePiece-style BPE ("llama" vocabularies) and byte-level
 * BPE with a pre-tokenizer ("gpt2" vocabularies), plus an incremental
 * detokenizer for streaming.
 *
 * The reference behaviour is llama.cpp's (llama-vocab.cpp / unicode.cpp):
 * the same token ids for the same GGUF and text, the same special-token
 * handling, the same detokenized bytes. Where llama.cpp's behaviour is
 * unspecified or crashes, what we do instead is written next to the function.
 *
 * An ag_tok is immutable after construction: any number of threads may call
 * every function below on the same ag_tok at once (each call keeps its
 * scratch memory to itself). An ag_detok is a small per-stream state and is
 * used by one thread at a time. */
#ifndef AG_TOK_H
#define AG_TOK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/buf.h"
#include "base/status.h"

typedef struct ag_gguf ag_gguf;
typedef struct ag_tok  ag_tok;

/* Token attributes (llama.cpp's llama_token_attr bits). */
enum {
    AG_TOK_ATTR_UNKNOWN      = 1 << 0,
    AG_TOK_ATTR_UNUSED       = 1 << 1,
    AG_TOK_ATTR_NORMAL       = 1 << 2,
    AG_TOK_ATTR_CONTROL      = 1 << 3,
    AG_TOK_ATTR_USER_DEFINED = 1 << 4,
    AG_TOK_ATTR_BYTE         = 1 << 5,
    AG_TOK_ATTR_LSTRIP       = 1 << 7, /* eat whitespace left of the token when matched in text */
    AG_TOK_ATTR_RSTRIP       = 1 << 8, /* eat whitespace right of it */
};

/* GGUF token types (tokenizer.ggml.token_type values). */
enum {
    AG_TOK_TYPE_UNDEFINED    = 0,
    AG_TOK_TYPE_NORMAL       = 1,
    AG_TOK_TYPE_UNKNOWN      = 2,
    AG_TOK_TYPE_CONTROL      = 3,
    AG_TOK_TYPE_USER_DEFINED = 4,
    AG_TOK_TYPE_UNUSED       = 5,
    AG_TOK_TYPE_BYTE         = 6,
};

/* ---- construction ---- */

/* A vocabulary described in memory, independent of any file format: what
 * ag_tok_new() needs. Strings are (pointer, length) pairs, not
 * NUL-terminated; everything is copied, so the description only has to live
 * for the call. Ids default to -1 (absent); booleans given as -1 mean "the
 * model type's default", as with a missing GGUF key. */
typedef struct {
    const char *model;  /* "llama" (SPM) or "gpt2" (byte-level BPE); NUL-terminated */
    const char *pre;    /* pre-tokenizer name (gpt2 only), NULL or "" = "default" */
    const char *name;   /* general.name, used for a few per-model quirks; may be NULL */
    uint32_t    n_tokens;
    const char *const *token_text; /* [n_tokens] */
    const uint32_t    *token_len;  /* [n_tokens] */
    const float       *scores;     /* [n_tokens] or NULL (all 0) */
    const int32_t     *types;      /* [n_tokens] AG_TOK_TYPE_*, or NULL (all NORMAL) */
    uint32_t    n_merges;          /* gpt2 only: "left right" strings, rank = index */
    const char *const *merge_text;
    const uint32_t    *merge_len;
    /* Special ids as found in metadata (-1 = key absent: keep the default). */
    int64_t bos, eos, eot, eom, unk, sep, pad, mask;
    int64_t fim_pre, fim_suf, fim_mid, fim_pad, fim_rep, fim_sep;
    /* -1 = default. remove_extra_whitespaces is kept but, as in llama.cpp,
     * changes nothing. */
    int add_bos, add_eos, add_space_prefix, remove_extra_whitespaces;
} ag_tok_spec;

/* Fills every id with -1 and every boolean with -1. */
void ag_tok_spec_init(ag_tok_spec *spec);

/* Builds a tokenizer from a description. Unsupported model types (bert, t5,
 * rwkv, ...) give AG_ERR_UNSUPPORTED; an unknown pre-tokenizer name gives
 * AG_ERR_UNSUPPORTED naming it (llama.cpp refuses such files too: guessing a
 * pre-tokenizer silently changes the token ids); inconsistent data (duplicate
 * token text, add_bos without a BOS id, ...) gives AG_ERR_FORMAT. */
ag_status ag_tok_new(const ag_tok_spec *spec, ag_tok **out);

/* Builds a tokenizer from a GGUF file's tokenizer.ggml.* metadata. The result
 * copies what it needs: the ag_gguf may be freed right after. */
ag_status ag_tok_from_gguf(const ag_gguf *g, ag_tok **out);

/* Same, with the pre-tokenizer forced to `pre` (a tokenizer.ggml.pre name)
 * instead of the file's: for files converted without one, and for tests.
 * NULL = the file's. */
ag_status ag_tok_from_gguf_pre(const ag_gguf *g, const char *pre, ag_tok **out);

void ag_tok_free(ag_tok *tok); /* NULL-safe */

/* Translates a Hugging Face tokenizer.json into GGUF tokenizer metadata
 * (tokenizer.ggml.*), added to w, so that ag_tok_from_gguf builds the same
 * tokenizer (tok_hf.c says which forms are taken). n_model > 0: the model's
 * vocabulary size; added tokens past it (ids no embedding row has, such as
 * EmbeddingGemma's <image_soft_token>) are left out, so their text is
 * tokenized as text. A form whose behaviour augur does not reproduce exactly
 * is AG_ERR_UNSUPPORTED, named; bad JSON is AG_ERR_FORMAT. Messages name the
 * path. */
typedef struct ag_gguf_writer ag_gguf_writer;
ag_status ag_tok_hf_to_gguf(const char *path, int64_t n_model, ag_gguf_writer *w);

/* ---- vocabulary ---- */

int32_t     ag_tok_n_vocab(const ag_tok *tok);
const char *ag_tok_model(const ag_tok *tok); /* "llama" or "gpt2" */
const char *ag_tok_pre(const ag_tok *tok);   /* pre-tokenizer name, "default" for llama */
/* Raw token text as stored in the vocabulary (e.g. "Ġhello", "▁hello",
 * "<0x0A>"), or NULL for an id out of range. Borrowed, valid as long as tok. */
const char *ag_tok_text(const ag_tok *tok, int32_t id, size_t *len);
/* The bytes a token stands for in output text (special tokens as their
 * text), or NULL for an id out of range. Borrowed, valid as long as tok. */
const char *ag_tok_piece(const ag_tok *tok, int32_t id, size_t *len);
uint32_t    ag_tok_attr(const ag_tok *tok, int32_t id); /* AG_TOK_ATTR_* bits, 0 if out of range */
/* Id of the token whose raw text is exactly text[0..len), or -1. */
int32_t ag_tok_find(const ag_tok *tok, const char *text, size_t len);

/* Special ids, -1 when the model has none. */
int32_t ag_tok_bos(const ag_tok *tok);
int32_t ag_tok_eos(const ag_tok *tok);
int32_t ag_tok_eot(const ag_tok *tok);
int32_t ag_tok_eom(const ag_tok *tok);
int32_t ag_tok_pad(const ag_tok *tok);
int32_t ag_tok_unk(const ag_tok *tok);
bool    ag_tok_add_bos(const ag_tok *tok); /* whether encode(add_special) prepends BOS */
bool    ag_tok_add_eos(const ag_tok *tok);
/* End of generation: EOS, EOT, EOM and the end tokens llama.cpp collects by
 * text (<|im_end|>, <|endoftext|>, <end_of_turn>, <|eot_id|>, FIM pad/repo/
 * file-separator tokens, ...). */
bool ag_tok_is_eog(const ag_tok *tok, int32_t id);
/* The end-of-generation ids, ascending. Borrowed. */
const int32_t *ag_tok_eog_ids(const ag_tok *tok, size_t *n);
/* A 64-bit fingerprint of everything that decides token ids (texts, scores,
 * types, merges, pre-tokenizer, flags): equal fingerprints encode alike.
 * Used to key persisted KV caches. */
uint64_t ag_tok_fingerprint(const ag_tok *tok);

/* ---- encoding ---- */

/* A growable id vector: zero-initialise, free with ag_tok_ids_free. */
typedef struct {
    int32_t *data;
    size_t   n, cap;
} ag_tok_ids;
void ag_tok_ids_free(ag_tok_ids *v);

/* Tokenizes text[0..len) and appends the ids to *out.
 * add_special: add BOS/EOS as the model's metadata says (add_bos_token /
 *   add_eos_token).
 * parse_special: text of control tokens (e.g. "<|im_start|>") becomes that
 *   single id; when false, it is tokenized as plain text. User-defined
 *   tokens are matched in the text either way, like llama.cpp.
 * Invalid UTF-8 is accepted as llama.cpp does: byte-level BPE replaces each
 * invalid byte with U+FFFD before tokenizing; SPM vocabularies encode such
 * bytes through their <0xNN> byte tokens.
 * On error *out keeps its previous contents. */
ag_status ag_tok_encode_append(const ag_tok *tok, const char *text, size_t len, bool add_special,
                               bool parse_special, ag_tok_ids *out);
/* Same into a fresh array the caller frees (NULL when *n is 0). */
ag_status ag_tok_encode(const ag_tok *tok, const char *text, size_t len, bool add_special,
                        bool parse_special, int32_t **ids, size_t *n);

/* ---- decoding ---- */

enum {
    /* Render control/unknown tokens as their text (llama.cpp's
     * unparse_special); otherwise they produce nothing. User-defined tokens
     * always render. */
    AG_DECODE_SPECIAL = 1 << 0,
    /* Drop a leading BOS (when the model adds one) and a trailing EOS (when
     * the model adds one): llama.cpp's remove_special. */
    AG_DECODE_REMOVE_SPECIAL = 1 << 1,
};

/* Appends the text of ids[0..n) to *out, exactly as llama.cpp's
 * llama_detokenize(): the leading space SentencePiece's add_space_prefix
 * inserted is stripped from the first token, and vocabularies with
 * clean_spaces get its " ." / " '" clean-up. The bytes are not validated: a
 * cut inside a multi-byte character stays cut (ag_detok is for streams).
 * AG_ERR_RANGE for an id outside the vocabulary (nothing appended). */
ag_status ag_tok_decode(const ag_tok *tok, const int32_t *ids, size_t n, unsigned flags, ag_buf *out);

/* Incremental detokenizer: push ids one at a time and get back only complete
 * UTF-8 text. Bytes of a character split across tokens are held until it
 * completes; a sequence that can no longer become valid is replaced by
 * U+FFFD (maximal subparts, as Python's errors="replace"), and so is an
 * incomplete tail at flush. The concatenation of all pushes and the flush
 * equals ag_tok_decode() of the same ids with the same flags whenever that
 * is valid UTF-8, and its replacement-decoded form otherwise.
 * The detok borrows tok, which must outlive it. */
typedef struct ag_detok ag_detok;
ag_status ag_detok_new(const ag_tok *tok, unsigned flags, ag_detok **out);
/* A detokenizer for the text that continues the text of ctx[0..n_ctx) (a
 * prompt): what a reply streams after its prompt. The start-of-text rules
 * belong to the context, not to the reply: the first pushed token keeps the
 * leading space that a new text loses to add_space_prefix (" named", not
 * "named", after "Once upon a time, a little dog"), and a BOS pushed first
 * is not the text's leading BOS (AG_DECODE_REMOVE_SPECIAL keeps it). A
 * character the context leaves unfinished (ids given by the caller can end
 * inside one) is completed by the first pushed bytes and released whole.
 * So the pushes and the flush give ag_tok_decode(ctx + ids) less
 * ag_tok_decode(ctx) (less that unfinished character), replacement-decoded
 * as above; the one exception is a clean_spaces deletion of a space that
 * ends the context, which cannot be taken back from text already released.
 * n_ctx == 0 is a new text, as ag_detok_new. Reads ctx only during the call;
 * AG_ERR_RANGE for an id outside the vocabulary. ag_detok_reset and the
 * reset in ag_detok_flush forget the context: what follows is a new text. */
ag_status ag_detok_new_after(const ag_tok *tok, unsigned flags, const int32_t *ctx, size_t n_ctx, ag_detok **out);
/* Appends the newly completed text (possibly nothing) to *out. */
ag_status ag_detok_push(ag_detok *d, int32_t id, ag_buf *out);
/* Appends everything still held back and resets the stream. */
ag_status ag_detok_flush(ag_detok *d, ag_buf *out);
void      ag_detok_reset(ag_detok *d); /* drops held bytes: a new stream */
void      ag_detok_free(ag_detok *d);  /* NULL-safe */

#endif
