/* Encoding: special tokens in the text, then SentencePiece-style BPE (merge
 * the adjacent pair whose merged text is the highest-scoring token) or
 * byte-level BPE (pre-tokenize into words, merge the lowest-ranked pair),
 * as llama.cpp's llm_tokenizer_spm / llm_tokenizer_bpe.
 *
 * All scratch memory belongs to one call (an enc_ctx on the stack), so
 * concurrent calls on one ag_tok do not interact. */
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "tok/tok_internal.h"

uint32_t tok_trie_next(const ag_tok *tok, uint32_t node, unsigned char c);

void ag_tok_ids_free(ag_tok_ids *v) {
    free(v->data);
    memset(v, 0, sizeof *v);
}

static ag_status ids_push(ag_tok_ids *v, int32_t id) {
    if (v->n == v->cap) {
        size_t   cap = v->cap ? v->cap * 2 : 64;
        int32_t *d = realloc(v->data, cap * sizeof *d);
        if (!d) return ag_errorf(AG_ERR_NOMEM, "out of memory tokenizing");
        v->data = d;
        v->cap = cap;
    }
    v->data[v->n++] = id;
    return AG_OK;
}

/* growable scratch array */
static ag_status reserve(void **p, size_t *cap, size_t n, size_t elem) {
    if (n <= *cap) return AG_OK;
    size_t c = *cap ? *cap : 64;
    while (c < n) c *= 2;
    void *q = realloc(*p, c * elem);
    if (!q) return ag_errorf(AG_ERR_NOMEM, "out of memory tokenizing");
    *p = q;
    *cap = c;
    return AG_OK;
}

typedef struct {
    int32_t  id;    /* symbol id (token or merge-only string), -1 = none */
    uint32_t start; /* byte offset in the word / text */
    uint32_t len;   /* 0 once merged away */
    int32_t  prev, next;
} sym;

typedef struct {
    float    score; /* SPM: higher first */
    int32_t  rank;  /* BPE: lower first */
    int32_t  left, right;
    int32_t  lid, rid; /* BPE: the ids the pair had when queued */
    uint32_t size;     /* SPM: merged byte length when queued */
} bigram;

typedef struct {
    const ag_tok *tok;
    ag_tok_ids   *out;
    /* symbols and the merge queue */
    sym    *syms;
    size_t  syms_cap;
    bigram *heap;
    size_t  heap_n, heap_cap;
    /* text buffers */
    char  *buf;
    size_t buf_cap;
    char  *wbuf;
    size_t wbuf_cap;
    /* code points of a BPE fragment */
    uint32_t *cps;
    uint16_t *fl;
    uint32_t *cp_off;
    size_t    cps_cap, fl_cap, off_cap;
    tok_split_scratch split;
} enc_ctx;

static void enc_free(enc_ctx *c) {
    free(c->syms);
    free(c->heap);
    free(c->buf);
    free(c->wbuf);
    free(c->cps);
    free(c->fl);
    free(c->cp_off);
    tok_split_free(&c->split);
}

/* ---- binary heap ---- */

static inline bool spm_before(const bigram *a, const bigram *b) {
    return a->score > b->score || (a->score == b->score && a->left < b->left);
}
static inline bool bpe_before(const bigram *a, const bigram *b) {
    return a->rank < b->rank || (a->rank == b->rank && a->left < b->left);
}

static ag_status heap_push(enc_ctx *c, const bigram *g, bool spm) {
    ag_status st = reserve((void **)&c->heap, &c->heap_cap, c->heap_n + 1, sizeof *c->heap);
    if (st) return st;
    size_t i = c->heap_n++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!(spm ? spm_before(g, &c->heap[p]) : bpe_before(g, &c->heap[p]))) break;
        c->heap[i] = c->heap[p];
        i = p;
    }
    c->heap[i] = *g;
    return AG_OK;
}

static bigram heap_pop(enc_ctx *c, bool spm) {
    bigram top = c->heap[0];
    bigram last = c->heap[--c->heap_n];
    size_t i = 0, n = c->heap_n;
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        const bigram *best = &last;
        if (l < n && (spm ? spm_before(&c->heap[l], best) : bpe_before(&c->heap[l], best))) {
            m = l;
            best = &c->heap[l];
        }
        if (r < n && (spm ? spm_before(&c->heap[r], best) : bpe_before(&c->heap[r], best))) m = r;
        if (m == i) break;
        c->heap[i] = c->heap[m];
        i = m;
    }
    if (n) c->heap[i] = last;
    return top;
}

/* ---- SentencePiece-style ---- */

static ag_status spm_try_bigram(enc_ctx *c, const char *text, int32_t l, int32_t r) {
    if (l < 0 || r < 0) return AG_OK;
    const sym *a = &c->syms[l], *b = &c->syms[r];
    int32_t    id = tok_lookup(c->tok, text + a->start, a->len + b->len);
    if (id < 0 || id >= c->tok->n_vocab) return AG_OK;
    bigram g = {.score = c->tok->entries[id].score, .left = l, .right = r, .size = a->len + b->len};
    return heap_push(c, &g, true);
}

static ag_status spm_byte(enc_ctx *c, unsigned char b) {
    int32_t id = c->tok->spm_byte_tok[b];
    /* llama.cpp aborts when a vocabulary has no token for a byte; we fall
     * back to <unk>, or drop the byte if there is none. */
    if (id < 0) id = c->tok->unk;
    return id >= 0 ? ids_push(c->out, id) : AG_OK;
}

/* Tokenizes one fragment of raw text. */
static ag_status spm_fragment(enc_ctx *c, const char *raw, size_t len, bool space_prefix) {
    /* escape: optional leading space, every ' ' -> U+2581 */
    size_t    need = (len + 1) * 3;
    ag_status st = reserve((void **)&c->buf, &c->buf_cap, need, 1);
    if (st) return st;
    size_t n = 0;
    if (space_prefix) {
        memcpy(c->buf, "\xE2\x96\x81", 3);
        n = 3;
    }
    for (size_t i = 0; i < len; i++) {
        if (raw[i] == ' ') {
            memcpy(c->buf + n, "\xE2\x96\x81", 3);
            n += 3;
        } else {
            c->buf[n++] = raw[i];
        }
    }
    if (n == 0) return AG_OK;
    if (n > UINT32_MAX / 2) return ag_errorf(AG_ERR_RANGE, "text fragment too long to tokenize");
    const char *text = c->buf;

    /* one symbol per UTF-8 character (by its lead byte, unchecked) */
    size_t nsym = 0;
    if ((st = reserve((void **)&c->syms, &c->syms_cap, n, sizeof *c->syms))) return st;
    for (size_t off = 0; off < n;) {
        size_t k = tok_utf8_len((unsigned char)text[off]);
        if (k > n - off) k = n - off;
        sym *s = &c->syms[nsym];
        s->start = (uint32_t)off;
        s->len = (uint32_t)k;
        s->prev = (int32_t)nsym - 1;
        off += k;
        s->next = off == n ? -1 : (int32_t)nsym + 1;
        nsym++;
    }
    c->heap_n = 0;
    for (size_t i = 1; i < nsym; i++)
        if ((st = spm_try_bigram(c, text, (int32_t)i - 1, (int32_t)i))) return st;
    while (c->heap_n) {
        bigram g = heap_pop(c, true);
        sym   *l = &c->syms[g.left], *r = &c->syms[g.right];
        if (l->len == 0 || r->len == 0 || l->len + r->len != g.size) continue;
        l->len += r->len;
        r->len = 0;
        l->next = r->next;
        if (r->next >= 0) c->syms[r->next].prev = g.left;
        if ((st = spm_try_bigram(c, text, l->prev, g.left))) return st;
        if ((st = spm_try_bigram(c, text, g.left, l->next))) return st;
    }
    for (int32_t i = 0; i != -1; i = c->syms[i].next) {
        const sym *s = &c->syms[i];
        int32_t    id = tok_lookup(c->tok, text + s->start, s->len);
        if (id >= 0 && id < c->tok->n_vocab) {
            if ((st = ids_push(c->out, id))) return st;
            continue;
        }
        for (uint32_t k = 0; k < s->len; k++)
            if ((st = spm_byte(c, (unsigned char)text[s->start + k]))) return st;
    }
    return AG_OK;
}

/* ---- byte-level BPE ---- */

static inline bool pair_find(const ag_tok *tok, int32_t l, int32_t r, int32_t *rank, int32_t *res) {
    uint64_t key = ((uint64_t)(uint32_t)l << 32) | (uint32_t)r;
    for (uint64_t i = ((key * 0x9E3779B97F4A7C15ull) >> 17) & tok->pair_mask;; i = (i + 1) & tok->pair_mask) {
        uint64_t k = tok->pair_keys[i];
        if (k == key) {
            *rank = tok->pair_rank[i];
            *res = tok->pair_res[i];
            return true;
        }
        if (k == UINT64_MAX) return false;
    }
}

static ag_status bpe_try_bigram(enc_ctx *c, int32_t l, int32_t r) {
    if (l < 0 || r < 0) return AG_OK;
    int32_t lid = c->syms[l].id, rid = c->syms[r].id, rank, res;
    if (lid < 0 || rid < 0 || !pair_find(c->tok, lid, rid, &rank, &res)) return AG_OK;
    bigram g = {.rank = rank, .left = l, .right = r, .lid = lid, .rid = rid};
    return heap_push(c, &g, false);
}

/* The encoded form of word bytes: GPT-2 byte characters, or the bytes
 * themselves for raw-UTF-8 vocabularies. */
static ag_status encode_word_text(enc_ctx *c, const unsigned char *w, size_t n, size_t *out_len) {
    ag_status st = reserve((void **)&c->wbuf, &c->wbuf_cap, n * 2 + 1, 1);
    if (st) return st;
    size_t o = 0;
    if (!c->tok->byte_encode) {
        memcpy(c->wbuf, w, n);
        o = n;
    } else {
        for (size_t i = 0; i < n; i++) o += tok_utf8_encode(tok_byte_to_cpt(w[i]), c->wbuf + o);
    }
    *out_len = o;
    return AG_OK;
}

static ag_status bpe_word(enc_ctx *c, const unsigned char *w, size_t n, bool newline_word) {
    const ag_tok *tok = c->tok;
    ag_status     st;
    if (n == 0) return AG_OK;
    if (tok->ignore_merges || newline_word) {
        size_t el;
        if ((st = encode_word_text(c, w, n, &el))) return st;
        int32_t id = tok_lookup(tok, c->wbuf, el);
        if (id >= 0 && id < tok->n_vocab) return ids_push(c->out, id);
    }
    if ((st = reserve((void **)&c->syms, &c->syms_cap, n, sizeof *c->syms))) return st;
    size_t nsym = 0;
    if (tok->byte_encode) {
        for (size_t i = 0; i < n; i++) {
            sym *s = &c->syms[i];
            s->id = tok->byte_sym[w[i]];
            s->start = (uint32_t)i;
            s->len = 1;
            s->prev = (int32_t)i - 1;
            s->next = i + 1 == n ? -1 : (int32_t)i + 1;
        }
        nsym = n;
    } else {
        for (size_t off = 0; off < n;) {
            size_t k = tok_utf8_len(w[off]);
            if (k > n - off) k = n - off;
            sym *s = &c->syms[nsym];
            s->id = tok_lookup(tok, (const char *)w + off, k);
            s->start = (uint32_t)off;
            s->len = (uint32_t)k;
            s->prev = (int32_t)nsym - 1;
            off += k;
            s->next = off == n ? -1 : (int32_t)nsym + 1;
            nsym++;
        }
    }
    c->heap_n = 0;
    for (size_t i = 1; i < nsym; i++)
        if ((st = bpe_try_bigram(c, (int32_t)i - 1, (int32_t)i))) return st;
    while (c->heap_n) {
        bigram g = heap_pop(c, false);
        sym   *l = &c->syms[g.left], *r = &c->syms[g.right];
        if (l->len == 0 || r->len == 0 || l->id != g.lid || r->id != g.rid) continue;
        int32_t rank, res = -1;
        pair_find(tok, g.lid, g.rid, &rank, &res);
        l->id = res;
        l->len += r->len;
        r->len = 0;
        l->next = r->next;
        if (r->next >= 0) c->syms[r->next].prev = g.left;
        if ((st = bpe_try_bigram(c, l->prev, g.left))) return st;
        if ((st = bpe_try_bigram(c, g.left, l->next))) return st;
    }
    for (int32_t i = 0; i != -1; i = c->syms[i].next) {
        const sym *s = &c->syms[i];
        if (s->id >= 0 && s->id < tok->n_vocab) {
            if ((st = ids_push(c->out, s->id))) return st;
            continue;
        }
        /* not a token: llama.cpp looks each byte of the encoded text up as
         * a one-byte token (or <0xNN> for raw-UTF-8 vocabularies) */
        for (uint32_t k = 0; k < s->len; k++) {
            const int32_t *fb = tok->byte_fb[w[s->start + k]];
            for (int j = 0; j < 2; j++)
                if (fb[j] >= 0 && (st = ids_push(c->out, fb[j]))) return st;
        }
    }
    return AG_OK;
}

static ag_status bpe_fragment(enc_ctx *c, const char *raw, size_t len) {
    const ag_tok *tok = c->tok;
    ag_status     st;
    if (len == 0) return AG_OK;
    const unsigned char *text = (const unsigned char *)raw;
    if (tok->escape_ws) {
        if ((st = reserve((void **)&c->buf, &c->buf_cap, len * 3, 1))) return st;
        size_t n = 0;
        for (size_t i = 0; i < len; i++) {
            if (raw[i] == ' ') {
                memcpy(c->buf + n, "\xE2\x96\x81", 3);
                n += 3;
            } else {
                c->buf[n++] = raw[i];
            }
        }
        text = (const unsigned char *)c->buf;
        len = n;
    }
    if (len > UINT32_MAX / 8) return ag_errorf(AG_ERR_RANGE, "text fragment too long to tokenize");
    /* code points as llama.cpp decodes them, their classes, and the
     * normalised UTF-8 the words are cut from (invalid bytes become U+FFFD) */
    if ((st = reserve((void **)&c->cps, &c->cps_cap, len, sizeof *c->cps)) ||
        (st = reserve((void **)&c->fl, &c->fl_cap, len, sizeof *c->fl)) ||
        (st = reserve((void **)&c->cp_off, &c->off_cap, len + 1, sizeof *c->cp_off)) ||
        (st = reserve((void **)&c->wbuf, &c->wbuf_cap, len * 3 + 4, 1)))
        return st;
    const uint16_t *table = tok_cpt_table();
    size_t          ncp = 0, nb = 0;
    char           *norm = c->wbuf; /* borrowed until the words are cut */
    for (size_t i = 0; i < len;) {
        uint32_t cp;
        size_t   k = tok_utf8_decode(text + i, len - i, &cp);
        c->cps[ncp] = cp;
        c->fl[ncp] = tok_cpt_flags(table, cp);
        c->cp_off[ncp] = (uint32_t)nb;
        nb += tok_utf8_encode(cp, norm + nb);
        ncp++;
        i += k;
    }
    c->cp_off[ncp] = (uint32_t)nb;
    const tok_spans *words;
    if ((st = tok_pretok_split(tok->pretok, c->cps, c->fl, ncp, &c->split, &words))) return st;
    /* the normalised text moves to buf: wbuf is needed per word */
    if ((st = reserve((void **)&c->buf, &c->buf_cap, nb + 1, 1))) return st;
    memcpy(c->buf, norm, nb);
    const unsigned char *u = (const unsigned char *)c->buf;
    bool gemma_newlines = tok->escape_ws && !tok->byte_encode && !strcmp(tok->pre, "gemma4");
    for (size_t i = 0; i < words->n; i++) {
        uint32_t a = c->cp_off[words->v[i].start], b = c->cp_off[words->v[i].end];
        bool     nl = false;
        if (gemma_newlines) {
            nl = true;
            for (uint32_t k = a; k < b; k++)
                if (u[k] != '\n') nl = false;
        }
        if ((st = bpe_word(c, u + a, b - a, nl))) return st;
    }
    return AG_OK;
}

/* ---- special tokens in the text ----
 * llama.cpp takes the special tokens longest first and, for each, splits
 * every remaining raw fragment at each of its occurrences (left to right).
 * Equivalently, over candidate matches: by length descending, then by
 * position, accept a match if its bytes are all still raw. We find the
 * candidates with a trie walk from every position, then take lengths from
 * the longest down. */

typedef struct {
    uint32_t pos;
    uint64_t mask; /* bit L-1: a special token of length L starts here (L <= 64) */
} cand;

typedef struct {
    uint32_t pos, len;
    int32_t  id;
} accepted;

static bool allowed(const ag_tok *tok, int32_t id, bool parse_special) {
    return parse_special || !(tok->entries[id].attr & (AG_TOK_ATTR_CONTROL | AG_TOK_ATTR_UNKNOWN));
}

static int cmp_accepted(const void *a, const void *b) {
    uint32_t x = ((const accepted *)a)->pos, y = ((const accepted *)b)->pos;
    return (x > y) - (x < y);
}

static inline bool is_c_space(unsigned char ch) { return ch == ' ' || (ch >= '\t' && ch <= '\r'); }

typedef ag_status (*frag_fn)(enc_ctx *c, const char *raw, size_t len, bool after_special);

static ag_status spm_frag_cb(enc_ctx *c, const char *raw, size_t len, bool after_special) {
    return spm_fragment(c, raw, len, c->tok->add_space_prefix && after_special);
}
static ag_status bpe_frag_cb(enc_ctx *c, const char *raw, size_t len, bool after_special) {
    (void)after_special;
    return bpe_fragment(c, raw, len);
}

/* ---- WordPiece (BERT), as llama.cpp's WPM tokenizer ---- */

static bool wpm_cjk(uint32_t c) {
    return (c >= 0x4E00 && c <= 0x9FFF) || (c >= 0x3400 && c <= 0x4DBF) || (c >= 0x20000 && c <= 0x2A6DF) ||
           (c >= 0x2A700 && c <= 0x2B73F) || (c >= 0x2B740 && c <= 0x2B81F) || (c >= 0x2B920 && c <= 0x2CEAF) ||
           (c >= 0xF900 && c <= 0xFAFF) || (c >= 0x2F800 && c <= 0x2FA1F);
}

/* One word (already lower-cased, accents dropped), U+2581-prefixed as the
 * GGUF vocabulary spells word starts: greedy longest match from the left,
 * byte by byte; a word with an unmatched rest becomes [UNK] as a whole. */
static ag_status wpm_word(enc_ctx *c, const char *w, size_t n) {
    const ag_tok *tok = c->tok;
    const size_t  n0 = c->out->n;
    for (size_t i = 0; i < n;) {
        size_t j = n < i + tok->max_tok_len ? n : i + tok->max_tok_len;
        int32_t id = -1;
        for (; j > i; j--) {
            id = tok_lookup(tok, w + i, j - i);
            if (id >= 0 && id < tok->n_vocab) break;
            id = -1;
        }
        if (id < 0) { /* discard the word's tokens */
            c->out->n = n0;
            break;
        }
        ag_status st = ids_push(c->out, id);
        if (st) return st;
        i = j;
    }
    return c->out->n == n0 ? ids_push(c->out, tok->unk) : AG_OK;
}

/* Splits the fragment into words: each code point mapped to the first code
 * point of its canonical decomposition (llama.cpp's one-to-one "NFD", which
 * drops accents) and lower-cased; whitespace separates words; NUL, U+FFFD
 * and control characters are dropped; punctuation, ASCII symbols and CJK
 * ideographs are words of their own. */
static ag_status wpm_fragment(enc_ctx *c, const char *raw, size_t len, bool after_special) {
    (void)after_special;
    const uint16_t      *table = tok_cpt_table();
    const unsigned char *t = (const unsigned char *)raw;
    char                *w = malloc(len * 4 + 8); /* a word: "\u2581" + at most 4 bytes per input byte */
    if (!w) return ag_errorf(AG_ERR_NOMEM, "out of memory tokenizing");
    size_t    wn = 0;
    ag_status st = AG_OK;
#define FLUSH()                                             \
    do {                                                    \
        if (wn && (st = wpm_word(c, w, wn + 3))) goto done; \
        wn = 0;                                             \
    } while (0)
    memcpy(w, "\xE2\x96\x81", 3);
    for (size_t p = 0; p < len;) {
        uint32_t cp;
        p += tok_utf8_decode(t + p, len - p, &cp);
        utf8proc_int32_t d[8];
        int              last = 0;
        if (cp < CPT_MAX && utf8proc_decompose_char((utf8proc_int32_t)cp, d, 8, UTF8PROC_DECOMPOSE, &last) >= 1)
            cp = (uint32_t)d[0];
        const uint16_t f = tok_cpt_flags(table, cp);
        if (f & CPT_SPACE) {
            FLUSH();
            continue;
        }
        if (cp == 0 || cp == 0xFFFD || (f & CPT_CONTROL)) continue;
        const uint32_t lc = cp < CPT_MAX ? (uint32_t)utf8proc_tolower((utf8proc_int32_t)cp) : cp;
        char           u[4];
        const size_t   ul = tok_utf8_encode(lc, u);
        if ((f & CPT_PUNCT) || (cp < 0x7F && (f & CPT_SYMBOL)) || wpm_cjk(cp)) {
            FLUSH();
            memcpy(w + 3, u, ul);
            wn = ul;
            FLUSH();
        } else {
            memcpy(w + 3 + wn, u, ul);
            wn += ul;
        }
    }
    FLUSH();
#undef FLUSH
done:
    free(w);
    return st;
}

static ag_status partition(enc_ctx *c, const char *text, size_t len, bool parse_special, frag_fn fn) {
    const ag_tok        *tok = c->tok;
    const unsigned char *t = (const unsigned char *)text;
    cand                *cands = NULL;
    size_t               nc = 0, cc = 0;
    accepted            *longc = NULL, *acc = NULL; /* candidates longer than 64 bytes; accepted */
    size_t               nl = 0, lc = 0, na = 0, ac = 0;
    unsigned char       *claim = NULL;
    ag_status            st = AG_OK;

    if (tok->trie_nodes > 1) {
        for (size_t p = 0; p < len; p++) {
            uint32_t node = tok->trie_child[t[p]];
            if (!node) continue;
            uint64_t mask = 0;
            for (size_t q = p;;) {
                int32_t id = tok->trie_tok[node];
                size_t  L = q - p + 1;
                if (id >= 0 && allowed(tok, id, parse_special)) {
                    if (L <= 64) {
                        mask |= 1ull << (L - 1);
                    } else {
                        if ((st = reserve((void **)&longc, &lc, nl + 1, sizeof *longc))) goto done;
                        longc[nl++] = (accepted){(uint32_t)p, (uint32_t)L, id};
                    }
                }
                if (++q >= len) break;
                node = tok_trie_next(tok, node, t[q]);
                if (!node) break;
            }
            if (mask) {
                if ((st = reserve((void **)&cands, &cc, nc + 1, sizeof *cands))) goto done;
                cands[nc++] = (cand){(uint32_t)p, mask};
            }
        }
    }
    if (nc == 0 && nl == 0) {
        st = len ? fn(c, text, len, true) : AG_OK;
        goto done;
    }

    claim = calloc(len, 1); /* 0 raw, 1 stripped whitespace, 2 special token */
    if (!claim) {
        st = ag_errorf(AG_ERR_NOMEM, "out of memory tokenizing");
        goto done;
    }
    for (uint32_t L = tok->special_max_len; L >= 1; L--) {
        size_t n_here = L > 64 ? nl : nc;
        for (size_t i = 0; i < n_here; i++) {
            uint32_t p;
            if (L > 64) {
                if (longc[i].len != L) continue;
                p = longc[i].pos;
            } else {
                if (!(cands[i].mask & (1ull << (L - 1)))) continue;
                p = cands[i].pos;
            }
            /* Without strips every claimed block is at least L long, so
             * checking both ends suffices. */
            bool free_ = !claim[p] && !claim[p + L - 1];
            if (free_ && tok->special_strip)
                for (uint32_t k = p; k < p + L && free_; k++) free_ = !claim[k];
            if (!free_) continue;
            uint32_t node = 0;
            for (uint32_t k = 0; k < L; k++) node = tok_trie_next(tok, node, t[p + k]);
            int32_t id = tok->trie_tok[node];
            memset(claim + p, 2, L);
            if ((st = reserve((void **)&acc, &ac, na + 1, sizeof *acc))) goto done;
            acc[na++] = (accepted){p, L, id};
            uint32_t attr = tok->entries[id].attr;
            if (attr & AG_TOK_ATTR_LSTRIP)
                for (size_t q = p; q > 0 && !claim[q - 1] && is_c_space(t[q - 1]); q--) claim[q - 1] = 1;
            if (attr & AG_TOK_ATTR_RSTRIP)
                for (size_t q = p + L; q < len && !claim[q] && is_c_space(t[q]); q++) claim[q] = 1;
        }
        if (L == 1) break;
    }
    if (na) qsort(acc, na, sizeof *acc, cmp_accepted);
    bool   after_special = true;
    size_t ai = 0;
    for (size_t p = 0; p < len;) {
        if (claim[p] == 0) {
            size_t q = p;
            while (q < len && claim[q] == 0) q++;
            if ((st = fn(c, text + p, q - p, after_special))) goto done;
            after_special = false;
            p = q;
        } else if (claim[p] == 1) {
            p++;
        } else {
            while (ai < na && acc[ai].pos < p) ai++;
            if ((st = ids_push(c->out, acc[ai].id))) goto done;
            after_special = true;
            p += acc[ai].len;
        }
    }
done:
    free(cands);
    free(longc);
    free(acc);
    free(claim);
    return st;
}

ag_status ag_tok_encode_append(const ag_tok *tok, const char *text, size_t len, bool add_special,
                               bool parse_special, ag_tok_ids *out) {
    if (!text && len) return ag_errorf(AG_ERR_INVALID, "tokenize: NULL text");
    size_t    n0 = out->n;
    enc_ctx   c = {.tok = tok, .out = out};
    ag_status st = AG_OK;
    if (add_special && tok->add_bos) st = ids_push(out, tok->bos);
    if (!st && len)
        st = partition(&c, text, len, parse_special,
                       tok->kind == TOK_SPM ? spm_frag_cb : tok->kind == TOK_WPM ? wpm_fragment : bpe_frag_cb);
    if (!st && add_special && tok->add_eos) st = ids_push(out, tok->eos);
    if (!st && add_special && tok->add_sep) st = ids_push(out, tok->sep);
    enc_free(&c);
    if (st) out->n = n0;
    return st;
}

ag_status ag_tok_encode(const ag_tok *tok, const char *text, size_t len, bool add_special, bool parse_special,
                        int32_t **ids, size_t *n) {
    ag_tok_ids v = {0};
    ag_status  st = ag_tok_encode_append(tok, text, len, add_special, parse_special, &v);
    if (st) {
        ag_tok_ids_free(&v);
        *ids = NULL;
        *n = 0;
        return st;
    }
    *ids = v.data;
    *n = v.n;
    return AG_OK;
}
