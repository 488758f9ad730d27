/* Tokenizer construction: vocabulary tables, merges, special tokens, the
 * decoded-piece cache, and reading it all from GGUF metadata.
 *
 * Behaviour follows llama.cpp's llama_vocab::impl::load(): the same defaults
 * per model type, the same detection of end-of-generation tokens by their
 * text, the same per-model attribute quirks. Where llama.cpp picks by hash
 * map iteration order (which EOT token wins when several match), we pick by
 * the order of its list, which is deterministic. */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/hash.h"
#include "base/log.h"
#include "gguf/gguf.h"
#include "tok/tok_internal.h"

/* ---- string table ---- */

static uint64_t str_hash(const char *s, size_t len) { return ag_hash64(s, len); }

int32_t tok_lookup(const ag_tok *tok, const char *s, size_t len) {
    uint64_t h = str_hash(s, len);
    uint32_t tag = (uint32_t)(h >> 32);
    for (uint64_t i = h & tok->str_mask;; i = (i + 1) & tok->str_mask) {
        uint64_t slot = tok->str_slots[i];
        if (!slot) return -1;
        if ((uint32_t)(slot >> 32) != tag) continue;
        uint32_t         id = (uint32_t)slot - 1;
        const tok_entry *e = &tok->entries[id];
        if (e->len == len && !memcmp(tok->blob + e->off, s, len)) return (int32_t)id;
    }
}

static void str_insert(ag_tok *tok, uint32_t id) {
    const tok_entry *e = &tok->entries[id];
    uint64_t         h = str_hash(tok->blob + e->off, e->len);
    uint64_t         i = h & tok->str_mask;
    while (tok->str_slots[i]) i = (i + 1) & tok->str_mask;
    tok->str_slots[i] = (h & 0xFFFFFFFF00000000ull) | (uint64_t)(id + 1);
}

/* Entries (text in blob) grow as merges add strings that are not tokens. */
typedef struct {
    ag_tok *tok;
    size_t  entries_cap, blob_cap;
} builder;

static ag_status add_entry(builder *b, const char *s, size_t len, uint32_t *id) {
    ag_tok *tok = b->tok;
    if (len > UINT32_MAX / 2 || tok->blob_len + len > UINT32_MAX)
        return ag_errorf(AG_ERR_RANGE, "tokenizer vocabulary too large");
    if (tok->n_entries == b->entries_cap) {
        size_t     cap = b->entries_cap ? b->entries_cap * 2 : 1024;
        tok_entry *e = realloc(tok->entries, cap * sizeof *e);
        if (!e) return ag_errorf(AG_ERR_NOMEM, "out of memory loading the vocabulary");
        tok->entries = e;
        b->entries_cap = cap;
    }
    if (tok->blob_len + len + 1 > b->blob_cap) {
        size_t cap = b->blob_cap ? b->blob_cap : 4096;
        while (cap < tok->blob_len + len + 1) cap *= 2;
        char *nb = realloc(tok->blob, cap);
        if (!nb) return ag_errorf(AG_ERR_NOMEM, "out of memory loading the vocabulary");
        tok->blob = nb;
        b->blob_cap = cap;
    }
    memcpy(tok->blob + tok->blob_len, s, len);
    tok->blob[tok->blob_len + len] = '\0'; /* so ag_tok_text() can hand out C strings */
    tok_entry *e = &tok->entries[tok->n_entries];
    e->off = (uint32_t)tok->blob_len;
    e->len = (uint32_t)len;
    e->score = 0;
    e->attr = 0;
    tok->blob_len += len + 1;
    *id = tok->n_entries++;
    return AG_OK;
}

static ag_status str_table_init(ag_tok *tok, size_t n_expected) {
    uint64_t size = 1024;
    while (size < n_expected * 2) size *= 2;
    free(tok->str_slots);
    tok->str_slots = calloc(size, sizeof *tok->str_slots);
    if (!tok->str_slots) return ag_errorf(AG_ERR_NOMEM, "out of memory loading the vocabulary");
    tok->str_mask = size - 1;
    return AG_OK;
}

/* Interns a string that merges need: a token id, or a new non-token entry. */
static ag_status intern(builder *b, const char *s, size_t len, int32_t *id) {
    int32_t found = tok_lookup(b->tok, s, len);
    if (found >= 0) {
        *id = found;
        return AG_OK;
    }
    ag_tok *tok = b->tok;
    if ((uint64_t)(tok->n_entries + 1) * 2 > tok->str_mask + 1) {
        /* grow the table: re-insert everything */
        uint64_t  size = (tok->str_mask + 1) * 2;
        uint64_t *slots = calloc(size, sizeof *slots);
        if (!slots) return ag_errorf(AG_ERR_NOMEM, "out of memory loading merges");
        free(tok->str_slots);
        tok->str_slots = slots;
        tok->str_mask = size - 1;
        for (uint32_t i = 0; i < tok->n_entries; i++) str_insert(tok, i);
    }
    uint32_t nid;
    ag_status st = add_entry(b, s, len, &nid);
    if (st) return st;
    str_insert(tok, nid);
    *id = (int32_t)nid;
    return AG_OK;
}

/* ---- merges: (left, right) -> rank, result ---- */

static inline uint64_t pair_key(int32_t l, int32_t r) { return ((uint64_t)(uint32_t)l << 32) | (uint32_t)r; }
static inline uint64_t pair_slot(uint64_t key) { return (key * 0x9E3779B97F4A7C15ull) >> 17; }

static ag_status pair_table_init(ag_tok *tok, size_t n) {
    uint64_t size = 1024;
    while (size < n * 2) size *= 2;
    tok->pair_keys = malloc(size * sizeof *tok->pair_keys);
    tok->pair_rank = malloc(size * sizeof *tok->pair_rank);
    tok->pair_res = malloc(size * sizeof *tok->pair_res);
    if (!tok->pair_keys || !tok->pair_rank || !tok->pair_res)
        return ag_errorf(AG_ERR_NOMEM, "out of memory loading merges");
    memset(tok->pair_keys, 0xFF, size * sizeof *tok->pair_keys);
    tok->pair_mask = size - 1;
    return AG_OK;
}

/* The first rank given to a pair wins, as with std::map::emplace. */
static void pair_insert(ag_tok *tok, int32_t l, int32_t r, int32_t rank, int32_t res) {
    uint64_t key = pair_key(l, r);
    for (uint64_t i = pair_slot(key) & tok->pair_mask;; i = (i + 1) & tok->pair_mask) {
        if (tok->pair_keys[i] == key) return;
        if (tok->pair_keys[i] == UINT64_MAX) {
            tok->pair_keys[i] = key;
            tok->pair_rank[i] = rank;
            tok->pair_res[i] = res;
            return;
        }
    }
}

/* ---- special tokens found by text (llama.cpp's lists) ---- */

static const char *const k_eot_texts[] = {
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|end_of_text|>",
    "<EOT>", "_<EOT>", "[EOT]", "<｜end▁of▁sentence｜>", "<end_of_utterance>", NULL};
static const char *const k_eom_texts[] = {"<|eom_id|>", NULL};
static const char *const k_fim_pre_texts[] = {"<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>",
                                              "<｜fim▁begin｜>", "<PRE>", "▁<PRE>", "<|code_prefix|>",
                                              "<|prefix|>", NULL};
static const char *const k_fim_suf_texts[] = {"<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>",
                                              "<｜fim▁hole｜>", "<SUF>", "▁<SUF>", "<|code_suffix|>",
                                              "<|suffix|>", NULL};
static const char *const k_fim_mid_texts[] = {"<|fim_middle|>", "<fim-middle>", "<fim_middle>",
                                              "<｜fim▁end｜>", "<MID>", "▁<MID>", "<|code_middle|>",
                                              "<|middle|>", NULL};
static const char *const k_fim_pad_texts[] = {"<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]", NULL};
static const char *const k_fim_rep_texts[] = {"<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>",
                                              "<reponame>", NULL};
static const char *const k_fim_sep_texts[] = {"<|file_sep|>", NULL};
static const char *const k_eog_texts[] = {
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>",
    "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]",
    "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
    "<｜end▁of▁sentence｜>", "[e~[", NULL};

static int32_t find_cstr(const ag_tok *tok, const char *s) {
    int32_t id = tok_lookup(tok, s, strlen(s));
    return id < tok->n_vocab ? id : -1;
}

static void force_control(ag_tok *tok, int32_t id) {
    if (!(tok->entries[id].attr & AG_TOK_ATTR_CONTROL)) {
        AG_LOGD("tokenizer: token %d '%s' looks like a control token; treating it as one", id,
                tok->blob + tok->entries[id].off);
        tok->entries[id].attr |= AG_TOK_ATTR_CONTROL;
    }
}

/* Sets *slot to the first token of the list present in the vocabulary, if
 * *slot is unset, and marks it a control token. */
static void detect(ag_tok *tok, int32_t *slot, const char *const *texts) {
    if (*slot >= 0) return;
    for (const char *const *t = texts; *t; t++) {
        int32_t id = find_cstr(tok, *t);
        if (id >= 0) {
            *slot = id;
            force_control(tok, id);
            return;
        }
    }
}

static int cmp_i32(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

static ag_status eog_add(ag_tok *tok, int32_t id, size_t *cap) {
    if (id < 0) return AG_OK;
    for (size_t i = 0; i < tok->n_eog; i++)
        if (tok->eog[i] == id) return AG_OK;
    if (tok->n_eog == *cap) {
        size_t   c = *cap ? *cap * 2 : 16;
        int32_t *v = realloc(tok->eog, c * sizeof *v);
        if (!v) return ag_errorf(AG_ERR_NOMEM, "out of memory");
        tok->eog = v;
        *cap = c;
    }
    tok->eog[tok->n_eog++] = id;
    return AG_OK;
}

static void eog_remove(ag_tok *tok, int32_t id) {
    for (size_t i = 0; i < tok->n_eog; i++)
        if (tok->eog[i] == id) {
            tok->eog[i] = tok->eog[--tok->n_eog];
            return;
        }
}

static bool eog_has_text(const ag_tok *tok, const char *s, int32_t *id) {
    for (size_t i = 0; i < tok->n_eog; i++) {
        const tok_entry *e = &tok->entries[tok->eog[i]];
        if (e->len == strlen(s) && !memcmp(tok->blob + e->off, s, e->len)) {
            if (id) *id = tok->eog[i];
            return true;
        }
    }
    return false;
}

static ag_status collect_special(ag_tok *tok) {
    detect(tok, &tok->eot, k_eot_texts);
    detect(tok, &tok->eom, k_eom_texts);
    detect(tok, &tok->fim_pre, k_fim_pre_texts);
    detect(tok, &tok->fim_suf, k_fim_suf_texts);
    detect(tok, &tok->fim_mid, k_fim_mid_texts);
    detect(tok, &tok->fim_pad, k_fim_pad_texts);
    detect(tok, &tok->fim_rep, k_fim_rep_texts);
    detect(tok, &tok->fim_sep, k_fim_sep_texts);

    size_t    cap = 0;
    ag_status st;
    if ((st = eog_add(tok, tok->fim_pad, &cap)) || (st = eog_add(tok, tok->fim_rep, &cap)) ||
        (st = eog_add(tok, tok->fim_sep, &cap)))
        return st;
    for (const char *const *t = k_eog_texts; *t; t++) {
        int32_t id = find_cstr(tok, *t);
        if (id < 0) continue;
        if ((st = eog_add(tok, id, &cap))) return st;
        force_control(tok, id);
    }
    /* gpt-oss: these always render */
    static const char *const harmony[] = {"<|channel|>", "<|message|>", "<|start|>", "<|constrain|>", NULL};
    for (const char *const *t = harmony; *t; t++) {
        int32_t id = find_cstr(tok, *t);
        if (id >= 0) tok->entries[id].attr = AG_TOK_ATTR_USER_DEFINED;
    }
    if ((st = eog_add(tok, tok->eos, &cap)) || (st = eog_add(tok, tok->eot, &cap)) ||
        (st = eog_add(tok, tok->eom, &cap)))
        return st;
    /* o200k_harmony and solar-open: <|end|> ends a message, not generation */
    int32_t end_id = -1;
    bool    has_end = eog_has_text(tok, "<|end|>", &end_id);
    bool    has_return = eog_has_text(tok, "<|return|>", NULL);
    bool    has_call = eog_has_text(tok, "<|call|>", NULL) || eog_has_text(tok, "<|calls|>", NULL);
    bool    has_flush = eog_has_text(tok, "<|flush|>", NULL);
    if (has_end && ((has_return && has_call) || (has_call && has_flush))) {
        eog_remove(tok, end_id);
        tok->entries[end_id].attr = AG_TOK_ATTR_USER_DEFINED;
    }
    /* gemma4, paddleocr: </s> is not an end token there */
    int32_t s_id = -1;
    if (eog_has_text(tok, "<|tool_response>", NULL) && eog_has_text(tok, "</s>", &s_id)) {
        eog_remove(tok, s_id);
        tok->entries[s_id].attr = AG_TOK_ATTR_NORMAL;
    }
    if (tok->n_eog) qsort(tok->eog, tok->n_eog, sizeof *tok->eog, cmp_i32);
    return AG_OK;
}

static bool contains_ci(const char *hay, const char *needle) {
    if (!hay) return false;
    size_t n = strlen(needle);
    for (const char *p = hay; *p; p++) {
        size_t i = 0;
        while (i < n && p[i] && tolower((unsigned char)p[i]) == needle[i]) i++;
        if (i == n) return true;
    }
    return false;
}

/* Per-model attributes llama.cpp sets by name (its "Handle per token
 * attributes" block). */
static void model_quirks(ag_tok *tok, const ag_tok_spec *spec) {
    const char *pre = spec->pre ? spec->pre : "";
    if (strstr(pre, "jina-v2-de") || strstr(pre, "jina-v2-es") || strstr(pre, "jina-v2-code")) {
        int32_t id = find_cstr(tok, "<mask>");
        if (id >= 0) tok->entries[id].attr |= AG_TOK_ATTR_LSTRIP;
    } else if (contains_ci(spec->name, "phi-3") || contains_ci(spec->name, "phi3")) {
        for (int32_t id = 0; id < tok->n_vocab; id++)
            if (tok->entries[id].attr &
                (AG_TOK_ATTR_CONTROL | AG_TOK_ATTR_USER_DEFINED | AG_TOK_ATTR_UNKNOWN))
                tok->entries[id].attr |= AG_TOK_ATTR_RSTRIP;
        int32_t id = find_cstr(tok, "</s>");
        if (id >= 0) tok->entries[id].attr |= AG_TOK_ATTR_RSTRIP;
        static const char *const keep[] = {"<unk>", "<s>", "<|endoftext|>", NULL};
        for (const char *const *t = keep; *t; t++)
            if ((id = find_cstr(tok, *t)) >= 0) tok->entries[id].attr &= ~(uint32_t)AG_TOK_ATTR_RSTRIP;
    } else if (contains_ci(spec->name, "modern-bert")) {
        int32_t id = find_cstr(tok, "[MASK]");
        if (id >= 0) tok->entries[id].attr |= AG_TOK_ATTR_LSTRIP;
    }
}

/* ---- special-token trie ---- */

static inline uint64_t edge_key(uint32_t node, unsigned char c) { return (((uint64_t)node << 8) | c) + 1; }

static uint32_t trie_get(const ag_tok *tok, uint32_t node, unsigned char c) {
    if (node == 0) return tok->trie_child[c];
    uint64_t key = edge_key(node, c);
    for (uint64_t i = pair_slot(key) & tok->trie_emask;; i = (i + 1) & tok->trie_emask) {
        if (tok->trie_ekeys[i] == key) return tok->trie_evals[i];
        if (!tok->trie_ekeys[i]) return 0;
    }
}

static ag_status build_trie(ag_tok *tok) {
    size_t total = 0, n_special = 0;
    for (int32_t id = 0; id < tok->n_vocab; id++) {
        const tok_entry *e = &tok->entries[id];
        if (!(e->attr & (AG_TOK_ATTR_CONTROL | AG_TOK_ATTR_USER_DEFINED | AG_TOK_ATTR_UNKNOWN))) continue;
        total += e->len;
        n_special++;
        if (e->attr & (AG_TOK_ATTR_LSTRIP | AG_TOK_ATTR_RSTRIP)) tok->special_strip = true;
        if (e->len > tok->special_max_len) tok->special_max_len = e->len;
    }
    tok->trie_child = calloc(256, sizeof *tok->trie_child);
    tok->trie_tok = malloc((total + 1) * sizeof *tok->trie_tok);
    uint64_t esize = 16;
    while (esize < total * 2 + 2) esize *= 2;
    tok->trie_ekeys = calloc(esize, sizeof *tok->trie_ekeys);
    tok->trie_evals = calloc(esize, sizeof *tok->trie_evals);
    if (!tok->trie_child || !tok->trie_tok || !tok->trie_ekeys || !tok->trie_evals)
        return ag_errorf(AG_ERR_NOMEM, "out of memory building the special-token matcher");
    tok->trie_emask = esize - 1;
    tok->trie_nodes = 1;
    tok->trie_tok[0] = -1;
    for (int32_t id = 0; id < tok->n_vocab; id++) {
        const tok_entry *e = &tok->entries[id];
        if (!(e->attr & (AG_TOK_ATTR_CONTROL | AG_TOK_ATTR_USER_DEFINED | AG_TOK_ATTR_UNKNOWN))) continue;
        const unsigned char *s = (const unsigned char *)tok->blob + e->off;
        uint32_t             node = 0;
        for (uint32_t k = 0; k < e->len; k++) {
            uint32_t next = trie_get(tok, node, s[k]);
            if (!next) {
                next = tok->trie_nodes++;
                tok->trie_tok[next] = -1;
                if (node == 0) {
                    tok->trie_child[s[k]] = next;
                } else {
                    uint64_t key = edge_key(node, s[k]);
                    uint64_t i = pair_slot(key) & tok->trie_emask;
                    while (tok->trie_ekeys[i]) i = (i + 1) & tok->trie_emask;
                    tok->trie_ekeys[i] = key;
                    tok->trie_evals[i] = next;
                }
            }
            node = next;
        }
        tok->trie_tok[node] = id;
    }
    (void)n_special;
    return AG_OK;
}

/* ---- pieces (llama.cpp's token_to_piece with special = true) ---- */

static int hexval(int c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* The byte of a "<0xNN>" token, parsed as leniently as strtol does. */
static unsigned char byte_token_value(const char *s, size_t len) {
    unsigned v = 0;
    for (size_t i = 3; i < len && i < 5; i++) {
        int h = hexval((unsigned char)s[i]);
        if (h < 0) break;
        v = v * 16 + (unsigned)h;
    }
    return (unsigned char)v;
}

static ag_status piece_of(const ag_tok *tok, int32_t id, ag_buf *out) {
    const tok_entry *e = &tok->entries[id];
    const char      *s = tok->blob + e->off;
    const bool ud = tok->ud_escaped && (e->attr & AG_TOK_ATTR_USER_DEFINED);
    if (!ud && (e->attr & (AG_TOK_ATTR_UNKNOWN | AG_TOK_ATTR_CONTROL | AG_TOK_ATTR_USER_DEFINED)))
        return ag_buf_append(out, s, e->len);
    if (ud || (e->attr & AG_TOK_ATTR_NORMAL)) {
        if (tok->kind == TOK_SPM || tok->kind == TOK_WPM || tok->escape_ws) {
            for (uint32_t i = 0; i < e->len; i++) {
                ag_status st;
                if (i + 2 < e->len && !memcmp(s + i, "\xE2\x96\x81", 3)) {
                    st = ag_buf_append_char(out, ' ');
                    i += 2;
                } else {
                    st = ag_buf_append_char(out, s[i]);
                }
                if (st) return st;
            }
            return AG_OK;
        }
        /* GPT-2 byte decoding; a code point outside the map is written the
         * way llama.cpp writes it. */
        for (uint32_t i = 0; i < e->len;) {
            uint32_t  cp;
            size_t    k = tok_utf8_decode((const unsigned char *)s + i, e->len - i, &cp);
            int       b = tok_cpt_to_byte(cp);
            ag_status st;
            if (b >= 0) {
                st = ag_buf_append_char(out, (char)b);
            } else {
                char   u[4];
                size_t ul = tok_utf8_encode(cp, u);
                st = ag_buf_append_str(out, "[UNK_BYTE_0x");
                for (size_t j = 0; !st && j < ul; j++) st = ag_buf_printf(out, "%02x", (unsigned char)u[j]);
                if (!st) st = ag_buf_append(out, s, e->len);
                if (!st) st = ag_buf_append_char(out, ']');
            }
            if (st) return st;
            i += k;
        }
        return AG_OK;
    }
    if (e->attr & AG_TOK_ATTR_BYTE) return ag_buf_append_char(out, (char)byte_token_value(s, e->len));
    return AG_OK; /* undefined / unused: nothing */
}

static ag_status build_pieces(ag_tok *tok) {
    ag_buf    all = {0};
    ag_status st = AG_OK;
    tok->piece_off = malloc(((size_t)tok->n_vocab + 1) * sizeof *tok->piece_off);
    if (!tok->piece_off) return ag_errorf(AG_ERR_NOMEM, "out of memory");
    for (int32_t id = 0; id < tok->n_vocab && !st; id++) {
        tok->piece_off[id] = (uint32_t)all.len;
        st = piece_of(tok, id, &all);
        if (!st && all.len > UINT32_MAX / 2) st = ag_errorf(AG_ERR_RANGE, "vocabulary pieces too large");
    }
    if (st) {
        ag_buf_free(&all);
        return st;
    }
    tok->piece_off[tok->n_vocab] = (uint32_t)all.len;
    tok->pieces = all.data ? ag_buf_take(&all) : calloc(1, 1);
    if (!tok->pieces) return ag_errorf(AG_ERR_NOMEM, "out of memory");
    return AG_OK;
}

/* ---- byte tables ---- */

static void build_byte_tables(ag_tok *tok) {
    static const char hex[] = "0123456789ABCDEF";
    for (int b = 0; b < 256; b++) {
        char    name[7] = {'<', '0', 'x', hex[b >> 4], hex[b & 15], '>', 0};
        int32_t hexid = find_cstr(tok, name);
        char    one = (char)b;
        int32_t oneid = tok_lookup(tok, &one, 1);
        if (oneid >= tok->n_vocab) oneid = -1;
        tok->spm_byte_tok[b] = hexid >= 0 ? hexid : oneid;
        tok->byte_fb[b][0] = tok->byte_fb[b][1] = -1;
        if (tok->kind == TOK_BPE) {
            if (tok->byte_encode) {
                char   u[4];
                size_t ul = tok_utf8_encode(tok_byte_to_cpt((uint8_t)b), u);
                tok->byte_sym[b] = tok_lookup(tok, u, ul);
                for (size_t k = 0; k < ul && k < 2; k++) {
                    int32_t id = tok_lookup(tok, u + k, 1);
                    tok->byte_fb[b][k] = id < tok->n_vocab ? id : -1;
                }
            } else {
                tok->byte_fb[b][0] = hexid; /* <0xNN> byte fallback of raw-UTF-8 BPE */
                tok->byte_sym[b] = -1;
            }
        }
    }
}

/* ---- construction ---- */

void ag_tok_spec_init(ag_tok_spec *spec) {
    memset(spec, 0, sizeof *spec);
    spec->bos = spec->eos = spec->eot = spec->eom = spec->unk = spec->sep = spec->pad = spec->mask = -1;
    spec->fim_pre = spec->fim_suf = spec->fim_mid = spec->fim_pad = spec->fim_rep = spec->fim_sep = -1;
    spec->add_bos = spec->add_eos = spec->add_space_prefix = spec->remove_extra_whitespaces = -1;
}

static void set_special(ag_tok *tok, int32_t *slot, int64_t given, const char *what) {
    if (*slot >= tok->n_vocab) *slot = -1; /* a default out of range is disabled */
    if (given < 0 || given == 0xFFFFFFFFll) return; /* -1 stored as u32: "none" */
    if (given >= tok->n_vocab) {
        AG_LOGW("tokenizer: %s id %lld is out of the vocabulary, using %d", what, (long long)given, *slot);
        return;
    }
    *slot = (int32_t)given;
}

static uint64_t fingerprint(const ag_tok *tok) {
    uint64_t h = ag_hash64(tok->model, strlen(tok->model));
    h = ag_hash64_seed(tok->pre, strlen(tok->pre), h);
    for (int32_t i = 0; i < tok->n_vocab; i++) {
        const tok_entry *e = &tok->entries[i];
        h = ag_hash64_seed(tok->blob + e->off, e->len, h);
        struct {
            float    s;
            uint32_t a;
        } sa = {e->score, e->attr};
        h = ag_hash64_seed(&sa, sizeof sa, h);
    }
    if (tok->pair_keys) {
        /* merges by rank order are implied by the table contents */
        uint64_t acc = 0;
        for (uint64_t i = 0; i <= tok->pair_mask; i++)
            if (tok->pair_keys[i] != UINT64_MAX) {
                uint64_t v[2] = {tok->pair_keys[i], ((uint64_t)(uint32_t)tok->pair_rank[i] << 32) |
                                                        (uint32_t)tok->pair_res[i]};
                acc += ag_hash64(v, sizeof v); /* order-independent */
            }
        h = ag_hash64_seed(&acc, sizeof acc, h);
    }
    int32_t flags[] = {tok->add_bos, tok->add_eos, tok->add_space_prefix, tok->clean_spaces,
                       tok->ignore_merges, tok->escape_ws, tok->byte_encode, tok->bos, tok->eos};
    return ag_hash64_seed(flags, sizeof flags, h);
}

ag_status ag_tok_new(const ag_tok_spec *spec, ag_tok **out) {
    *out = NULL;
    if (!spec || !spec->model) return ag_errorf(AG_ERR_INVALID, "tokenizer: no model type given");
    if (!tok_cpt_table()) return ag_errorf(AG_ERR_NOMEM, "out of memory (Unicode tables)");

    ag_tok *tok = calloc(1, sizeof *tok);
    if (!tok) return ag_errorf(AG_ERR_NOMEM, "out of memory");
    builder   b = {tok, 0, 0};
    ag_status st = AG_OK;
    unsigned  pre_flags = 0;

    tok->bos = tok->eos = tok->eot = tok->eom = tok->unk = tok->sep = tok->pad = tok->mask = -1;
    tok->fim_pre = tok->fim_suf = tok->fim_mid = tok->fim_pad = tok->fim_rep = tok->fim_sep = -1;
    if (!strcmp(spec->model, "llama")) {
        tok->kind = TOK_SPM;
        tok->bos = 1;
        tok->eos = 2;
        tok->unk = 0;
        tok->add_space_prefix = true;
        tok->add_bos = true;
        tok->pre = strdup("default");
    } else if (!strcmp(spec->model, "gpt2")) {
        tok->kind = TOK_BPE;
        tok->bos = 11;
        tok->eos = 11;
        const char *pre = spec->pre && *spec->pre ? spec->pre : "default";
        tok->pre = strdup(pre);
        st = tok_pretok_new(spec->pre, &tok->pretok, &tok->byte_encode, &pre_flags);
        if (st) goto fail;
        tok->clean_spaces = pre_flags & PRE_CLEAN_SPACES;
        tok->ignore_merges = pre_flags & PRE_IGNORE_MERGES;
        tok->add_bos = pre_flags & PRE_ADD_BOS;
        tok->escape_ws = pre_flags & PRE_ESCAPE_WS;
        tok->ud_escaped = pre_flags & PRE_UD_ESCAPED;
        if (pre_flags & PRE_NO_BOS) tok->bos = -1;
    } else if (!strcmp(spec->model, "bert")) {
        /* WordPiece (llama.cpp's WPM defaults): [CLS] text [SEP] */
        tok->kind = TOK_WPM;
        tok->bos = 101;
        tok->unk = 100;
        tok->sep = 102;
        tok->pad = 0;
        tok->mask = 103;
        tok->add_bos = true;
        tok->add_sep = true;
        tok->pre = strdup("default");
    } else {
        st = ag_errorf(AG_ERR_UNSUPPORTED,
                       "tokenizer type '%s' is not supported (only llama/SPM, gpt2/BPE and bert/WordPiece)",
                       spec->model);
        goto fail;
    }
    snprintf(tok->model, sizeof tok->model, "%s", spec->model);
    if (!tok->pre) {
        st = ag_errorf(AG_ERR_NOMEM, "out of memory");
        goto fail;
    }
    if (spec->add_space_prefix >= 0) tok->add_space_prefix = spec->add_space_prefix;
    if (spec->remove_extra_whitespaces >= 0) tok->remove_extra_ws = spec->remove_extra_whitespaces;

    /* tokens */
    if (spec->n_tokens == 0 || !spec->token_text || !spec->token_len) {
        st = ag_errorf(AG_ERR_FORMAT, "tokenizer: the vocabulary is empty");
        goto fail;
    }
    if (spec->n_tokens > INT32_MAX / 4) {
        st = ag_errorf(AG_ERR_FORMAT, "tokenizer: %u tokens is too many", spec->n_tokens);
        goto fail;
    }
    tok->n_vocab = (int32_t)spec->n_tokens;
    if ((st = str_table_init(tok, spec->n_tokens + spec->n_merges / 8))) goto fail;
    for (uint32_t i = 0; i < spec->n_tokens; i++) {
        const char *s = spec->token_text[i];
        size_t      len = spec->token_len[i];
        char        empty[32];
        if (len == 0 || !s) {
            AG_LOGW("tokenizer: empty token at index %u", i);
            len = (size_t)snprintf(empty, sizeof empty, "[EMPTY_%u]", i);
            s = empty;
        }
        int32_t dup = tok_lookup(tok, s, len);
        if (dup >= 0) {
            st = ag_errorf(AG_ERR_FORMAT, "tokenizer: duplicate token in the vocabulary: ids %d and %u", dup, i);
            goto fail;
        }
        uint32_t id;
        if ((st = add_entry(&b, s, len, &id))) goto fail;
        str_insert(tok, id);
        tok_entry *e = &tok->entries[id];
        e->score = spec->scores ? spec->scores[i] : 0.0f;
        e->attr = AG_TOK_ATTR_NORMAL;
        if (spec->types) {
            switch (spec->types[i]) {
            case AG_TOK_TYPE_UNKNOWN: e->attr = AG_TOK_ATTR_UNKNOWN; break;
            case AG_TOK_TYPE_UNUSED: e->attr = AG_TOK_ATTR_UNUSED; break;
            case AG_TOK_TYPE_NORMAL: e->attr = AG_TOK_ATTR_NORMAL; break;
            case AG_TOK_TYPE_CONTROL: e->attr = AG_TOK_ATTR_CONTROL; break;
            case AG_TOK_TYPE_USER_DEFINED: e->attr = AG_TOK_ATTR_USER_DEFINED; break;
            case AG_TOK_TYPE_BYTE: e->attr = AG_TOK_ATTR_BYTE; break;
            default: e->attr = 0; break;
            }
        }
    }

    /* special ids */
    set_special(tok, &tok->bos, spec->bos, "BOS");
    set_special(tok, &tok->eos, spec->eos, "EOS");
    set_special(tok, &tok->eot, spec->eot, "EOT");
    set_special(tok, &tok->eom, spec->eom, "EOM");
    set_special(tok, &tok->unk, spec->unk, "UNK");
    set_special(tok, &tok->sep, spec->sep, "SEP");
    set_special(tok, &tok->pad, spec->pad, "PAD");
    set_special(tok, &tok->mask, spec->mask, "MASK");
    set_special(tok, &tok->fim_pre, spec->fim_pre, "FIM prefix");
    set_special(tok, &tok->fim_suf, spec->fim_suf, "FIM suffix");
    set_special(tok, &tok->fim_mid, spec->fim_mid, "FIM middle");
    set_special(tok, &tok->fim_pad, spec->fim_pad, "FIM pad");
    set_special(tok, &tok->fim_rep, spec->fim_rep, "FIM repo");
    set_special(tok, &tok->fim_sep, spec->fim_sep, "FIM separator");
    if (spec->add_bos >= 0) tok->add_bos = spec->add_bos;
    if (spec->add_eos >= 0) tok->add_eos = spec->add_eos;
    if (tok->add_bos && tok->bos < 0) {
        st = ag_errorf(AG_ERR_FORMAT, "tokenizer: add_bos_token is true but there is no BOS token");
        goto fail;
    }
    if (tok->add_eos && tok->eos < 0) {
        st = ag_errorf(AG_ERR_FORMAT, "tokenizer: add_eos_token is true but there is no EOS token");
        goto fail;
    }
    if ((st = collect_special(tok))) goto fail;
    for (int32_t i = 0; i < tok->n_vocab; i++)
        if (tok->entries[i].len > tok->max_tok_len) tok->max_tok_len = tok->entries[i].len;
    if (tok->kind == TOK_WPM && (tok->unk < 0 || tok->unk >= tok->n_vocab)) {
        st = ag_errorf(AG_ERR_FORMAT, "tokenizer: a WordPiece vocabulary needs an unknown token");
        goto fail;
    }
    if (tok->kind == TOK_WPM && (tok->sep < 0 || tok->sep >= tok->n_vocab)) tok->add_sep = false;

    if ((st = build_pieces(tok))) goto fail; /* before the strip attributes, as llama.cpp */
    model_quirks(tok, spec);
    if ((st = build_trie(tok))) goto fail;

    /* merges */
    if (tok->kind == TOK_BPE) {
        if (spec->n_merges && (!spec->merge_text || !spec->merge_len)) {
            st = ag_errorf(AG_ERR_FORMAT, "tokenizer: merges missing");
            goto fail;
        }
        tok->n_merges = spec->n_merges;
        if ((st = pair_table_init(tok, spec->n_merges))) goto fail;
        char  *tmp = NULL;
        size_t tmp_cap = 0;
        for (uint32_t i = 0; i < spec->n_merges; i++) {
            const char *m = spec->merge_text[i];
            size_t      len = spec->merge_len[i];
            const char *sp = len > 1 ? memchr(m + 1, ' ', len - 1) : NULL;
            if (!sp) continue; /* llama.cpp stores ("", ""), which never matches */
            size_t  la = (size_t)(sp - m), lb = len - la - 1;
            int32_t l, r, res;
            if (la + lb > tmp_cap) {
                tmp_cap = (la + lb) * 2 + 64;
                char *t = realloc(tmp, tmp_cap);
                if (!t) {
                    free(tmp);
                    st = ag_errorf(AG_ERR_NOMEM, "out of memory loading merges");
                    goto fail;
                }
                tmp = t;
            }
            memcpy(tmp, m, la);
            memcpy(tmp + la, sp + 1, lb);
            if (la == 0 || lb == 0) continue;
            if ((st = intern(&b, m, la, &l)) || (st = intern(&b, sp + 1, lb, &r)) ||
                (st = intern(&b, tmp, la + lb, &res))) {
                free(tmp);
                goto fail;
            }
            pair_insert(tok, l, r, (int32_t)i, res);
        }
        free(tmp);
    }
    build_byte_tables(tok);
    tok->fingerprint = fingerprint(tok);
    *out = tok;
    return AG_OK;
fail:
    ag_tok_free(tok);
    return st;
}

void ag_tok_free(ag_tok *tok) {
    if (!tok) return;
    tok_pretok_free(tok->pretok);
    free(tok->pre);
    free(tok->entries);
    free(tok->blob);
    free(tok->str_slots);
    free(tok->pair_keys);
    free(tok->pair_rank);
    free(tok->pair_res);
    free(tok->eog);
    free(tok->trie_child);
    free(tok->trie_ekeys);
    free(tok->trie_evals);
    free(tok->trie_tok);
    free(tok->piece_off);
    free(tok->pieces);
    free(tok);
}

/* ---- from GGUF ---- */

static int64_t gguf_id(const ag_gguf *g, const char *key) {
    uint32_t v;
    if (!ag_gguf_get_u32(g, key, &v)) return -1;
    return (int64_t)v;
}

static int gguf_flag(const ag_gguf *g, const char *key) {
    bool v;
    if (!ag_gguf_get_bool(g, key, &v)) return -1;
    return v;
}

static ag_status string_array(const ag_gguf *g, const char *key, bool required, uint32_t *n,
                              const char ***texts, uint32_t **lens) {
    *n = 0;
    *texts = NULL;
    *lens = NULL;
    const ag_gguf_value *v = ag_gguf_get(g, key);
    if (!v) return required ? ag_errorf(AG_ERR_FORMAT, "tokenizer: %s is missing", key) : AG_OK;
    if (v->type != AG_GGUF_ARRAY || v->arr.elem_type != AG_GGUF_STRING || !v->arr.items)
        return ag_errorf(AG_ERR_FORMAT, "tokenizer: %s is not an array of strings", key);
    if (v->arr.n > UINT32_MAX / 2) return ag_errorf(AG_ERR_FORMAT, "tokenizer: %s is too long", key);
    uint32_t     cnt = (uint32_t)v->arr.n;
    const char **t = malloc((cnt ? cnt : 1) * sizeof *t);
    uint32_t    *l = malloc((cnt ? cnt : 1) * sizeof *l);
    if (!t || !l) {
        free(t);
        free(l);
        return ag_errorf(AG_ERR_NOMEM, "out of memory");
    }
    for (uint32_t i = 0; i < cnt; i++) {
        if (v->arr.items[i].str.len > UINT32_MAX / 2) {
            free(t);
            free(l);
            return ag_errorf(AG_ERR_FORMAT, "tokenizer: %s[%u] is too long", key, i);
        }
        t[i] = v->arr.items[i].str.ptr;
        l[i] = (uint32_t)v->arr.items[i].str.len;
    }
    *n = cnt;
    *texts = t;
    *lens = l;
    return AG_OK;
}

ag_status ag_tok_from_gguf(const ag_gguf *g, ag_tok **out) { return ag_tok_from_gguf_pre(g, NULL, out); }

ag_status ag_tok_from_gguf_pre(const ag_gguf *g, const char *pre_override, ag_tok **out) {
    *out = NULL;
    ag_tok_spec spec;
    ag_tok_spec_init(&spec);
    char        model[32], pre[64], name[256];
    uint64_t    len = 0;
    const char *s = ag_gguf_get_str(g, "tokenizer.ggml.model", &len);
    if (!s) return ag_errorf(AG_ERR_FORMAT, "tokenizer: tokenizer.ggml.model is missing");
    if (len >= sizeof model) return ag_errorf(AG_ERR_UNSUPPORTED, "tokenizer type '%.*s...' is not supported", 20, s);
    memcpy(model, s, len);
    model[len] = '\0';
    spec.model = model;
    pre[0] = '\0';
    if ((s = ag_gguf_get_str(g, "tokenizer.ggml.pre", &len))) {
        if (len >= sizeof pre) return ag_errorf(AG_ERR_UNSUPPORTED, "unknown pre-tokenizer type '%.*s...'", 40, s);
        memcpy(pre, s, len);
        pre[len] = '\0';
    }
    spec.pre = pre_override ? pre_override : pre;
    name[0] = '\0';
    if ((s = ag_gguf_get_str(g, "general.name", &len))) {
        if (len >= sizeof name) len = sizeof name - 1;
        memcpy(name, s, len);
        name[len] = '\0';
    }
    spec.name = name;

    if (strcmp(model, "llama") && strcmp(model, "gpt2") && strcmp(model, "bert"))
        return ag_errorf(AG_ERR_UNSUPPORTED,
                         "tokenizer type '%s' is not supported (only llama/SPM, gpt2/BPE and bert/WordPiece)", model);

    const char **texts = NULL, **mtexts = NULL;
    uint32_t    *lens = NULL, *mlens = NULL;
    float       *scores = NULL;
    int32_t     *types = NULL;
    ag_status    st = string_array(g, "tokenizer.ggml.tokens", true, &spec.n_tokens, &texts, &lens);
    if (st) goto done;
    spec.token_text = texts;
    spec.token_len = lens;

    const ag_gguf_value *v = ag_gguf_get(g, "tokenizer.ggml.scores");
    if (v) {
        if (v->type != AG_GGUF_ARRAY || (v->arr.elem_type != AG_GGUF_F32 && v->arr.elem_type != AG_GGUF_I32)) {
            st = ag_errorf(AG_ERR_FORMAT, "tokenizer: tokenizer.ggml.scores is not an f32/i32 array");
            goto done;
        }
        if (v->arr.n < spec.n_tokens) {
            st = ag_errorf(AG_ERR_FORMAT, "tokenizer: %llu scores for %u tokens",
                           (unsigned long long)v->arr.n, spec.n_tokens);
            goto done;
        }
        scores = malloc(spec.n_tokens * sizeof *scores + 1);
        if (!scores) {
            st = ag_errorf(AG_ERR_NOMEM, "out of memory");
            goto done;
        }
        for (uint32_t i = 0; i < spec.n_tokens; i++) {
            double d = 0;
            ag_gguf_arr_f64(v, i, &d);
            scores[i] = (float)d;
        }
        spec.scores = scores;
    }
    v = ag_gguf_get(g, "tokenizer.ggml.token_type");
    if (v) {
        if (v->type != AG_GGUF_ARRAY || v->arr.elem_type != AG_GGUF_I32) {
            st = ag_errorf(AG_ERR_FORMAT, "tokenizer: tokenizer.ggml.token_type is not an i32 array");
            goto done;
        }
        if (v->arr.n < spec.n_tokens) {
            st = ag_errorf(AG_ERR_FORMAT, "tokenizer: %llu token types for %u tokens",
                           (unsigned long long)v->arr.n, spec.n_tokens);
            goto done;
        }
        types = malloc(spec.n_tokens * sizeof *types + 1);
        if (!types) {
            st = ag_errorf(AG_ERR_NOMEM, "out of memory");
            goto done;
        }
        for (uint32_t i = 0; i < spec.n_tokens; i++) {
            int64_t t = 0;
            ag_gguf_arr_i64(v, i, &t);
            types[i] = (int32_t)t;
        }
        spec.types = types;
    }
    if (!strcmp(model, "gpt2")) {
        st = string_array(g, "tokenizer.ggml.merges", true, &spec.n_merges, &mtexts, &mlens);
        if (st) goto done;
        spec.merge_text = mtexts;
        spec.merge_len = mlens;
    }
    spec.bos = gguf_id(g, "tokenizer.ggml.bos_token_id");
    spec.eos = gguf_id(g, "tokenizer.ggml.eos_token_id");
    spec.eot = gguf_id(g, "tokenizer.ggml.eot_token_id");
    spec.eom = gguf_id(g, "tokenizer.ggml.eom_token_id");
    spec.unk = gguf_id(g, "tokenizer.ggml.unknown_token_id");
    spec.sep = gguf_id(g, "tokenizer.ggml.seperator_token_id");
    spec.pad = gguf_id(g, "tokenizer.ggml.padding_token_id");
    spec.mask = gguf_id(g, "tokenizer.ggml.mask_token_id");
    spec.fim_pre = gguf_id(g, "tokenizer.ggml.fim_pre_token_id");
    spec.fim_suf = gguf_id(g, "tokenizer.ggml.fim_suf_token_id");
    spec.fim_mid = gguf_id(g, "tokenizer.ggml.fim_mid_token_id");
    spec.fim_pad = gguf_id(g, "tokenizer.ggml.fim_pad_token_id");
    spec.fim_rep = gguf_id(g, "tokenizer.ggml.fim_rep_token_id");
    spec.fim_sep = gguf_id(g, "tokenizer.ggml.fim_sep_token_id");
    /* deprecated spellings of the FIM ids */
    if (spec.fim_pre < 0) spec.fim_pre = gguf_id(g, "tokenizer.ggml.prefix_token_id");
    if (spec.fim_suf < 0) spec.fim_suf = gguf_id(g, "tokenizer.ggml.suffix_token_id");
    if (spec.fim_mid < 0) spec.fim_mid = gguf_id(g, "tokenizer.ggml.middle_token_id");
    spec.add_bos = gguf_flag(g, "tokenizer.ggml.add_bos_token");
    spec.add_eos = gguf_flag(g, "tokenizer.ggml.add_eos_token");
    spec.add_space_prefix = gguf_flag(g, "tokenizer.ggml.add_space_prefix");
    spec.remove_extra_whitespaces = gguf_flag(g, "tokenizer.ggml.remove_extra_whitespaces");
    st = ag_tok_new(&spec, out);
done:
    free(texts);
    free(lens);
    free(mtexts);
    free(mlens);
    free(scores);
    free(types);
    return st;
}

/* ---- accessors ---- */

int32_t     ag_tok_n_vocab(const ag_tok *tok) { return tok->n_vocab; }
const char *ag_tok_model(const ag_tok *tok) { return tok->model; }
const char *ag_tok_pre(const ag_tok *tok) { return tok->pre; }
int32_t     ag_tok_bos(const ag_tok *tok) { return tok->bos; }
int32_t     ag_tok_eos(const ag_tok *tok) { return tok->eos; }
int32_t     ag_tok_eot(const ag_tok *tok) { return tok->eot; }
int32_t     ag_tok_eom(const ag_tok *tok) { return tok->eom; }
int32_t     ag_tok_pad(const ag_tok *tok) { return tok->pad; }
int32_t     ag_tok_unk(const ag_tok *tok) { return tok->unk; }
bool        ag_tok_add_bos(const ag_tok *tok) { return tok->add_bos; }
bool        ag_tok_add_eos(const ag_tok *tok) { return tok->add_eos; }
uint64_t    ag_tok_fingerprint(const ag_tok *tok) { return tok->fingerprint; }

const char *ag_tok_text(const ag_tok *tok, int32_t id, size_t *len) {
    if (id < 0 || id >= tok->n_vocab) return NULL;
    if (len) *len = tok->entries[id].len;
    return tok->blob + tok->entries[id].off;
}

const char *ag_tok_piece(const ag_tok *tok, int32_t id, size_t *len) {
    if (id < 0 || id >= tok->n_vocab) return NULL;
    if (len) *len = tok->piece_off[id + 1] - tok->piece_off[id];
    return tok->pieces + tok->piece_off[id];
}

uint32_t ag_tok_attr(const ag_tok *tok, int32_t id) {
    if (id < 0 || id >= tok->n_vocab) return 0;
    return tok->entries[id].attr;
}

int32_t ag_tok_find(const ag_tok *tok, const char *text, size_t len) {
    int32_t id = tok_lookup(tok, text, len);
    return id < tok->n_vocab ? id : -1;
}

bool ag_tok_is_eog(const ag_tok *tok, int32_t id) {
    if (id < 0) return false;
    size_t lo = 0, hi = tok->n_eog;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (tok->eog[mid] == id) return true;
        if (tok->eog[mid] < id) lo = mid + 1;
        else hi = mid;
    }
    return false;
}

const int32_t *ag_tok_eog_ids(const ag_tok *tok, size_t *n) {
    *n = tok->n_eog;
    return tok->eog;
}

/* exported for tok_encode.c */
uint32_t tok_trie_next(const ag_tok *tok, uint32_t node, unsigned char c);
uint32_t tok_trie_next(const ag_tok *tok, uint32_t node, unsigned char c) { return trie_get(tok, node, c); }
