/* Internals of src/tok shared between its files. Not a public API. */
#ifndef AG_TOK_INTERNAL_H
#define AG_TOK_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/status.h"
#include "tok/tok.h"

/* ---- Unicode ----
 * Code point classes as llama.cpp's unicode_cpt_flags: one general-category
 * bit (from utf8proc) plus the whitespace set llama.cpp uses for \s. */
enum {
    CPT_UNDEFINED = 0x0001, /* unassigned (Cn) */
    CPT_NUMBER    = 0x0002, /* \p{N} */
    CPT_LETTER    = 0x0004, /* \p{L} */
    CPT_SEPARATOR = 0x0008, /* \p{Z} */
    CPT_MARK      = 0x0010, /* \p{M} */
    CPT_PUNCT     = 0x0020, /* \p{P} */
    CPT_SYMBOL    = 0x0040, /* \p{S} */
    CPT_CONTROL   = 0x0080, /* \p{C} */
    CPT_CATEGORY  = 0x00FF,
    CPT_SPACE     = 0x0100, /* \s */
};

#define CPT_MAX 0x110000u

/* The flags of every code point below CPT_MAX (built once, thread-safe). */
const uint16_t *tok_cpt_table(void);
static inline uint16_t tok_cpt_flags(const uint16_t *table, uint32_t cp) {
    return cp < CPT_MAX ? table[cp] : CPT_UNDEFINED;
}

/* Decodes one code point the way llama.cpp does: only the structure of the
 * sequence is checked (overlongs and surrogates pass); an invalid lead byte
 * or a missing continuation byte yields U+FFFD and consumes one byte. Values
 * above U+10FFFF (where llama.cpp throws) also become U+FFFD / one byte.
 * n > 0. Returns the bytes consumed. */
size_t tok_utf8_decode(const unsigned char *s, size_t n, uint32_t *cp);
/* Encodes any value <= 0x10FFFF, surrogates included (as llama.cpp). */
size_t tok_utf8_encode(uint32_t cp, char out[4]);
/* Byte length of a UTF-8 sequence from its lead byte (llama.cpp's
 * unicode_len_utf8: 1 for ASCII and for stray continuation bytes). */
static inline size_t tok_utf8_len(unsigned char c) {
    static const unsigned char lut[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
    return lut[c >> 4];
}

/* GPT-2's byte <-> printable code point mapping. */
uint32_t tok_byte_to_cpt(uint8_t b);
int      tok_cpt_to_byte(uint32_t cp); /* -1 if cp is not in the mapping */

/* ---- pre-tokenizer (byte-level BPE) ---- */
typedef struct tok_pretok tok_pretok;

/* Builds the pre-tokenizer llama.cpp uses for `pre` (its
 * tokenizer.ggml.pre name). *byte_encode: GPT-2 byte encoding of words;
 * *flags: behaviour bits below. AG_ERR_UNSUPPORTED for an unknown name. */
enum {
    PRE_IGNORE_MERGES = 1 << 0, /* a word that is a whole token is not merged */
    PRE_CLEAN_SPACES  = 1 << 1, /* decode removes " ." etc. */
    PRE_ADD_BOS       = 1 << 2, /* default add_bos for this pre-tokenizer */
    PRE_ESCAPE_WS     = 1 << 3, /* spaces become U+2581 before BPE (gemma4) */
    PRE_NO_BOS        = 1 << 4, /* the BOS id is unset for this pre (chatglm) */
    PRE_UD_ESCAPED    = 1 << 5, /* user-defined tokens decode through the U+2581 escape too
                                   (tokenizers' decoder chain sees every token) */
};
ag_status tok_pretok_new(const char *pre, tok_pretok **out, bool *byte_encode, unsigned *flags);
void      tok_pretok_free(tok_pretok *p);

/* A span of code points [start, end) of one text. */
typedef struct {
    uint32_t start, end;
} tok_span;

/* Growable span list. */
typedef struct {
    tok_span *v;
    size_t    n, cap;
} tok_spans;

/* Scratch for one split call; zero-initialise, free with tok_split_free. */
typedef struct {
    tok_spans a, b;     /* ping-pong span lists */
    char     *coll;     /* collapsed text: one byte per code point */
    size_t    coll_cap;
    char     *u8;       /* UTF-8 text for regexes run on code points */
    uint32_t *u8_off;   /* byte offset of each code point in u8, plus the end */
    size_t    u8_cap, u8_off_cap;
    void     *match_data; /* pcre2_match_data_8 */
    void     *jit_stack;  /* pcre2_jit_stack_8, made on demand */
} tok_split_scratch;
void tok_split_free(tok_split_scratch *s);

/* Splits cps[0..n) (with their flags) into words; the result is a list of
 * consecutive spans covering all of it, in scratch (returned pointer). */
ag_status tok_pretok_split(const tok_pretok *p, const uint32_t *cps, const uint16_t *flags, size_t n,
                           tok_split_scratch *s, const tok_spans **words);

/* ---- the tokenizer ---- */
typedef enum { TOK_SPM, TOK_BPE, TOK_WPM } tok_kind;

typedef struct {
    uint32_t off, len; /* text in blob */
    float    score;
    uint32_t attr;
} tok_entry;

struct ag_tok {
    tok_kind   kind;
    char       model[16];
    char      *pre;
    int32_t    n_vocab;
    uint32_t   n_entries; /* n_vocab + strings only merges use */
    tok_entry *entries;
    char      *blob;
    size_t     blob_len;
    /* text -> id: open addressing, slot = (hash high 32 bits << 32) | (id + 1) */
    uint64_t *str_slots;
    uint64_t  str_mask;
    /* (left id, right id) -> rank, result id */
    uint64_t *pair_keys;
    int32_t  *pair_rank;
    int32_t  *pair_res;
    uint64_t  pair_mask;
    uint32_t  n_merges;
    /* byte-level BPE */
    tok_pretok *pretok;
    bool        byte_encode;
    int32_t     byte_sym[256];    /* symbol of each raw byte's encoded char, or -1 */
    int32_t     byte_fb[256][2];  /* fallback tokens of each raw byte, -1 = none */
    /* SPM */
    int32_t spm_byte_tok[256];    /* <0xNN> (or the 1-byte token), -1 if none */
    /* flags */
    bool add_sep;         /* WordPiece: SEP after the text when adding specials */
    uint32_t max_tok_len; /* WordPiece: the longest token, in bytes */
    bool add_bos, add_eos, add_space_prefix, remove_extra_ws, clean_spaces, ignore_merges,
        escape_ws, ud_escaped;
    int32_t bos, eos, eot, eom, unk, sep, pad, mask, nl;
    int32_t fim_pre, fim_suf, fim_mid, fim_pad, fim_rep, fim_sep;
    int32_t *eog;
    size_t   n_eog;
    /* special tokens matched in text: a byte trie; node 0 is the root */
    uint32_t *trie_child;  /* root: 256 direct entries; others via trie_edges */
    uint64_t *trie_ekeys;  /* (node << 8 | byte) + 1, 0 = empty */
    uint32_t *trie_evals;
    uint64_t  trie_emask;
    int32_t  *trie_tok;    /* token id ending at the node, or -1 */
    uint32_t  trie_nodes;
    uint32_t  special_max_len;
    bool      special_strip; /* some special token has LSTRIP/RSTRIP */
    /* decoded pieces (special tokens as text), llama.cpp's token_to_piece cache */
    uint32_t *piece_off;   /* [n_vocab + 1] into pieces */
    char     *pieces;
    uint64_t  fingerprint;
};

int32_t tok_lookup(const ag_tok *tok, const char *s, size_t len); /* any entry id, or -1 */

#endif
