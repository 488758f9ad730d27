/* Decoding: ids -> text as llama.cpp's llama_detokenize(), and the
 * incremental detokenizer for streaming. */
#include <stdlib.h>
#include <string.h>

#include "tok/tok_internal.h"

/* The piece of one token as llama_token_to_piece(special, lstrip) gives it. */
static void piece(const ag_tok *tok, int32_t id, bool special, bool lstrip, const char **p, size_t *n) {
    if (!special && (tok->entries[id].attr & (AG_TOK_ATTR_UNKNOWN | AG_TOK_ATTR_CONTROL))) {
        *p = "";
        *n = 0;
        return;
    }
    *p = tok->pieces + tok->piece_off[id];
    *n = tok->piece_off[id + 1] - tok->piece_off[id];
    if (lstrip && *n && **p == ' ') {
        (*p)++;
        (*n)--;
    }
}

/* llama.cpp's clean_spaces passes over s[0..n) in place; returns the new
 * length. (1) drop a space before ? ! . ,  (2) " ' " -> "'"  (3) drop the
 * space before 's 'm 're 've. */
static size_t clean_spaces(char *text, size_t n) {
    size_t total1 = n, total = n ? 1 : 0;
    for (size_t i = 1; i < total1; i++) {
        char x = text[i];
        if (text[i - 1] == ' ' && (x == '?' || x == '!' || x == '.' || x == ',')) total--;
        text[total++] = x;
    }
    size_t total2 = total;
    total = total ? 1 : 0;
    for (size_t i = 1; i < total2; i++) {
        char x = text[i];
        if (x == '\'' && i + 1 < total2 && text[i - 1] == ' ' && text[i + 1] == ' ') {
            total--;
            text[++i] = '\0';
        }
        text[total++] = x;
    }
    size_t total3 = total;
    total = total ? 1 : 0;
    for (size_t i = 1; i < total3; i++) {
        char x = text[i];
        if (text[i - 1] == ' ' && x == '\'' && i + 1 < total3) {
            char x1 = text[i + 1];
            if (x1 == 's' || x1 == 'm') {
                total--;
            } else if (x1 != 't' && x1 != 'd' && i + 2 < total3) {
                char x2 = text[i + 2];
                if ((x1 == 'r' && x2 == 'e') || (x1 == 'v' && x2 == 'e')) total--;
            }
        }
        text[total++] = x;
    }
    return total;
}

ag_status ag_tok_decode(const ag_tok *tok, const int32_t *ids, size_t n, unsigned flags, ag_buf *out) {
    for (size_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= tok->n_vocab)
            return ag_errorf(AG_ERR_RANGE, "token id %d is outside the vocabulary (0..%d)", ids[i],
                             tok->n_vocab - 1);
    bool special = flags & AG_DECODE_SPECIAL;
    bool remove_space = tok->add_space_prefix;
    if ((flags & AG_DECODE_REMOVE_SPECIAL) && tok->add_bos && n > 0 && ids[0] == tok->bos) {
        remove_space = false;
        ids++;
        n--;
    }
    if ((flags & AG_DECODE_REMOVE_SPECIAL) && tok->add_eos && n > 0 && ids[n - 1] == tok->eos) n--;
    size_t start = out->len;
    for (size_t i = 0; i < n; i++) {
        const char *p;
        size_t      len;
        piece(tok, ids[i], special, remove_space, &p, &len);
        remove_space = false;
        ag_status st = ag_buf_append(out, p, len);
        if (st) {
            out->len = start;
            if (out->data) out->data[start] = '\0';
            return st;
        }
    }
    if (tok->clean_spaces && out->len > start) {
        out->len = start + clean_spaces(out->data + start, out->len - start);
        out->data[out->len] = '\0';
    }
    return AG_OK;
}

/* ---- streaming ---- */

struct ag_detok {
    const ag_tok *tok;
    unsigned      flags;
    bool          started;      /* a token has been seen */
    bool          remove_space; /* the next piece loses one leading space */
    bool          held_eos;     /* an EOS that is dropped if nothing follows */
    ag_buf        pending;      /* clean_spaces: raw text since the last safe cut */
    ag_buf        u8;           /* bytes of an incomplete UTF-8 character */
};

ag_status ag_detok_new(const ag_tok *tok, unsigned flags, ag_detok **out) {
    ag_detok *d = calloc(1, sizeof *d);
    if (!d) return ag_errorf(AG_ERR_NOMEM, "out of memory");
    d->tok = tok;
    d->flags = flags;
    ag_detok_reset(d);
    *out = d;
    return AG_OK;
}

void ag_detok_reset(ag_detok *d) {
    d->started = false;
    d->remove_space = d->tok->add_space_prefix;
    d->held_eos = false;
    ag_buf_clear(&d->pending);
    ag_buf_clear(&d->u8);
}

void ag_detok_free(ag_detok *d) {
    if (!d) return;
    ag_buf_free(&d->pending);
    ag_buf_free(&d->u8);
    free(d);
}

/* Length of the valid sequence at s[0..n) (1..4), 0 if s[0..n) is a valid
 * but incomplete prefix, or -k if the first k bytes are a maximal invalid
 * subpart (Unicode's "maximal subpart" rule, as Python's decoder). */
static int utf8_step(const unsigned char *s, size_t n) {
    unsigned char c = s[0];
    if (c < 0x80) return 1;
    int           len;
    unsigned char lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) len = 2;
    else if (c >= 0xE0 && c <= 0xEF) {
        len = 3;
        if (c == 0xE0) lo = 0xA0;
        if (c == 0xED) hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
        len = 4;
        if (c == 0xF0) lo = 0x90;
        if (c == 0xF4) hi = 0x8F;
    } else {
        return -1;
    }
    for (int i = 1; i < len; i++) {
        if ((size_t)i >= n) return 0;
        unsigned char lo_i = i == 1 ? lo : 0x80, hi_i = i == 1 ? hi : 0xBF;
        if (s[i] < lo_i || s[i] > hi_i) return -i;
    }
    return len;
}

static const char k_fffd[] = "\xEF\xBF\xBD";

/* Appends the complete characters of d->u8 + data to out; keeps an
 * incomplete tail in d->u8. At the end of a stream (final) the tail
 * becomes U+FFFD. */
static ag_status utf8_feed(ag_detok *d, const char *data, size_t n, bool final, ag_buf *out) {
    ag_status st = ag_buf_append(&d->u8, data, n);
    if (st) return st;
    const unsigned char *s = (const unsigned char *)d->u8.data;
    size_t               len = d->u8.len, i = 0, run = 0; /* run: valid bytes not yet copied */
    while (i + run < len) {
        int k = utf8_step(s + i + run, len - i - run);
        if (k > 0) {
            run += (size_t)k;
            continue;
        }
        if ((st = ag_buf_append(out, s + i, run))) return st;
        i += run;
        run = 0;
        if (k == 0) {
            if (!final) break;
            k = -(int)(len - i);
        }
        if ((st = ag_buf_append(out, k_fffd, 3))) return st;
        i += (size_t)(-k);
    }
    if (run) {
        if ((st = ag_buf_append(out, s + i, run))) return st;
        i += run;
    }
    if (d->u8.data) {
        memmove(d->u8.data, s + i, len - i);
        d->u8.len = len - i;
        d->u8.data[d->u8.len] = '\0';
    }
    return AG_OK;
}

static inline bool plain(char c) { return c != ' ' && c != '\''; }

/* Text through clean_spaces (when the vocabulary uses it) and on to the
 * UTF-8 stage. clean_spaces only ever deletes spaces and only looks at
 * neighbours up to two characters away, so the text before two consecutive
 * characters that are neither space nor apostrophe is final: cleaning can
 * restart there. */
static ag_status emit_text(ag_detok *d, const char *p, size_t n, bool final, ag_buf *out) {
    if (!d->tok->clean_spaces) return utf8_feed(d, p, n, final, out);
    ag_status st = ag_buf_append(&d->pending, p, n);
    if (st) return st;
    size_t cut = final ? d->pending.len : 0;
    if (!final)
        for (size_t k = d->pending.len; k >= 2; k--)
            if (plain(d->pending.data[k - 1]) && plain(d->pending.data[k - 2])) {
                cut = k;
                break;
            }
    if (cut == 0) return final ? utf8_feed(d, "", 0, true, out) : AG_OK;
    size_t cleaned = clean_spaces(d->pending.data, cut);
    st = utf8_feed(d, d->pending.data, cleaned, final, out);
    memmove(d->pending.data, d->pending.data + cut, d->pending.len - cut);
    d->pending.len -= cut;
    d->pending.data[d->pending.len] = '\0';
    return st;
}

static ag_status emit_token(ag_detok *d, int32_t id, ag_buf *out) {
    const char *p;
    size_t      n;
    piece(d->tok, id, d->flags & AG_DECODE_SPECIAL, d->remove_space, &p, &n);
    d->remove_space = false;
    return emit_text(d, p, n, false, out);
}

/* The bytes of an incomplete UTF-8 character at the end of s[0..n) (which
 * the stream would still hold), as a length 0..3. */
static size_t utf8_incomplete_tail(const unsigned char *s, size_t n) {
    for (size_t k = 1; k <= 3 && k <= n; k++) {
        unsigned char c = s[n - k];
        if (c >= 0x80 && c <= 0xBF) continue; /* a continuation byte: look further back */
        return c >= 0xC2 && c <= 0xF4 && utf8_step(s + n - k, k) == 0 ? k : 0;
    }
    return 0;
}

ag_status ag_detok_new_after(const ag_tok *tok, unsigned flags, const int32_t *ctx, size_t n_ctx, ag_detok **out) {
    *out = NULL;
    for (size_t i = 0; i < n_ctx; i++)
        if (ctx[i] < 0 || ctx[i] >= tok->n_vocab)
            return ag_errorf(AG_ERR_RANGE, "context token id %d is outside the vocabulary (0..%d)", ctx[i],
                             tok->n_vocab - 1);
    ag_detok *d;
    ag_status st = ag_detok_new(tok, flags, &d);
    if (st) return st;
    if (n_ctx == 0) {
        *out = d;
        return AG_OK;
    }
    /* The state ag_detok_push would be in after the context, less the text
     * it released. Only the last few bytes of that text matter, and they
     * only for a character the context leaves unfinished: clean_spaces
     * never deletes the first character of what follows, so it needs no
     * context (what it would delete across the boundary lies in the
     * context's text, which is not ours to change). */
    bool   remove_special = flags & AG_DECODE_REMOVE_SPECIAL;
    size_t start = 0, end = n_ctx;
    if (remove_special && tok->add_bos && ctx[0] == tok->bos) start = 1;
    if (remove_special && tok->add_eos && end > start && ctx[end - 1] == tok->eos) {
        d->held_eos = true;
        end--;
    }
    d->started = true;
    d->remove_space = false; /* the text began in the context */
    unsigned char tail[3];
    size_t        have = 0;
    for (size_t i = end; i > start && have < sizeof tail; i--) {
        const char *p;
        size_t      n;
        piece(tok, ctx[i - 1], flags & AG_DECODE_SPECIAL, i - 1 == 0 && tok->add_space_prefix, &p, &n);
        size_t take = n < sizeof tail - have ? n : sizeof tail - have;
        memmove(tail + take, tail, have);
        memcpy(tail, p + n - take, take);
        have += take;
    }
    size_t k = utf8_incomplete_tail(tail, have);
    if (k && (st = ag_buf_append(&d->u8, tail + have - k, k))) {
        ag_detok_free(d);
        return st;
    }
    *out = d;
    return AG_OK;
}

ag_status ag_detok_push(ag_detok *d, int32_t id, ag_buf *out) {
    const ag_tok *tok = d->tok;
    if (id < 0 || id >= tok->n_vocab)
        return ag_errorf(AG_ERR_RANGE, "token id %d is outside the vocabulary (0..%d)", id, tok->n_vocab - 1);
    bool remove_special = d->flags & AG_DECODE_REMOVE_SPECIAL;
    bool first = !d->started;
    d->started = true;
    if (remove_special && first && tok->add_bos && id == tok->bos) {
        d->remove_space = false;
        return AG_OK;
    }
    ag_status st;
    if (d->held_eos) {
        d->held_eos = false;
        if ((st = emit_token(d, tok->eos, out))) return st;
    }
    if (remove_special && tok->add_eos && id == tok->eos) {
        d->held_eos = true; /* dropped if it turns out to be the last token */
        return AG_OK;
    }
    return emit_token(d, id, out);
}

ag_status ag_detok_flush(ag_detok *d, ag_buf *out) {
    ag_status st = emit_text(d, "", 0, true, out);
    ag_detok_reset(d);
    return st;
}
