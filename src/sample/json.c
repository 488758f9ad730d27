/* JSON mode: see json.h. */
#include "sample/json.h"

#include <math.h>
#include <string.h>

enum {
    M_START,     /* before the top-level object: ws or '{' */
    M_VALUE,     /* a value must start (after ':' or ',' in an array) */
    M_ARR_FIRST, /* after '[': a value or ']' */
    M_OBJ_FIRST, /* after '{': a key or '}' */
    M_OBJ_KEY,   /* after ',' in an object: a key */
    M_COLON,     /* after a key */
    M_AFTER,     /* after a value: ',' or the container's closer */
    M_DONE,      /* the object is complete */
    M_STR,       /* inside a string */
    M_ESC,       /* after a backslash */
    M_HEX,       /* in \uXXXX (lit = digits seen) */
    M_N_MINUS,   /* number: after '-' */
    M_N_ZERO,    /* a leading 0 */
    M_N_INT,     /* integer digits */
    M_N_DOT,     /* after '.' */
    M_N_FRAC,    /* fraction digits */
    M_N_E,       /* after 'e' */
    M_N_ESIGN,   /* after the exponent's sign */
    M_N_EXP,     /* exponent digits */
    M_LIT,       /* in true / false / null */
};

static const char *const k_words[3] = {"true", "false", "null"};

void ag_json_init(ag_json_state *s) {
    memset(s, 0, sizeof *s);
    s->mode = M_START;
    s->in_object = 1; /* no prefix */
}

void ag_json_init_wrapped(ag_json_state *s, const char *const *pre, int n_pre, const char *suf) {
    ag_json_init(s);
    s->pre = pre;
    s->n_pre = (uint16_t)(n_pre < 0 ? 0 : n_pre > AG_JSON_MAX_PREFIXES ? AG_JSON_MAX_PREFIXES : n_pre);
    s->pre_alive = s->n_pre == 32 ? 0xFFFFFFFFu : (1u << s->n_pre) - 1;
    s->in_object = s->n_pre == 0;
    s->suf = suf;
    s->suf_len = (uint16_t)(suf ? strlen(suf) : 0);
}

bool ag_json_done(const ag_json_state *s) { return s->mode == M_DONE && s->in_object && s->suf_pos == s->suf_len; }

static bool is_ws(unsigned c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }
static bool is_digit(unsigned c) { return c >= '0' && c <= '9'; }
static bool is_hex(unsigned c) { return is_digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'); }

static bool push(ag_json_state *s, uint8_t open) {
    if (s->depth >= AG_JSON_MAX_DEPTH) return false;
    s->stack[s->depth++] = open;
    s->mode = open == '{' ? M_OBJ_FIRST : M_ARR_FIRST;
    return true;
}

/* A value ended (a string, number or literal; containers via close()). */
static void value_end(ag_json_state *s) { s->mode = s->depth ? M_AFTER : M_DONE; }

static bool close_container(ag_json_state *s, unsigned c) {
    if (!s->depth || s->stack[s->depth - 1] != (c == '}' ? '{' : '[')) return false;
    s->depth--;
    value_end(s);
    return true;
}

/* The first byte of a value. */
static bool value_start(ag_json_state *s, unsigned c) {
    switch (c) {
    case '{':
    case '[': return push(s, (uint8_t)c);
    case '"':
        s->mode = M_STR;
        s->key = 0;
        return true;
    case '-': s->mode = M_N_MINUS; return true;
    case '0': s->mode = M_N_ZERO; return true;
    case 't':
    case 'f':
    case 'n':
        s->mode = M_LIT;
        s->word = c == 't' ? 0 : c == 'f' ? 1 : 2;
        s->lit = 1;
        return true;
    default:
        if (c >= '1' && c <= '9') {
            s->mode = M_N_INT;
            return true;
        }
        return false;
    }
}

/* A byte inside a string (mode M_STR). */
static bool string_byte(ag_json_state *s, unsigned c) {
    if (s->utf8_left) {
        if (c < s->utf8_min || c > s->utf8_max) return false;
        s->utf8_left--;
        s->utf8_min = 0x80, s->utf8_max = 0xBF;
        return true;
    }
    if (c == '"') {
        if (s->key) s->mode = M_COLON;
        else value_end(s);
        return true;
    }
    if (c == '\\') {
        s->mode = M_ESC;
        return true;
    }
    if (c < 0x20) return false;
    if (c < 0x80) return true;
    /* UTF-8 lead bytes, with the first continuation's range (no overlongs, surrogates or > U+10FFFF) */
    s->utf8_min = 0x80, s->utf8_max = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) s->utf8_left = 1;
    else if (c == 0xE0) s->utf8_left = 2, s->utf8_min = 0xA0;
    else if (c == 0xED) s->utf8_left = 2, s->utf8_max = 0x9F;
    else if (c >= 0xE1 && c <= 0xEF) s->utf8_left = 2;
    else if (c == 0xF0) s->utf8_left = 3, s->utf8_min = 0x90;
    else if (c == 0xF4) s->utf8_left = 3, s->utf8_max = 0x8F;
    else if (c >= 0xF1 && c <= 0xF3) s->utf8_left = 3;
    else return false;
    return true;
}

static bool step(ag_json_state *s, unsigned c) {
    if (is_ws(c) && s->mode <= M_DONE) {
        if (++s->ws > AG_JSON_MAX_WS) return false;
        return true;
    }
    if (s->mode <= M_DONE) s->ws = 0;
    switch (s->mode) {
    case M_START: return c == '{' && push(s, '{');
    case M_VALUE: return value_start(s, c);
    case M_ARR_FIRST: return c == ']' ? close_container(s, c) : value_start(s, c);
    case M_OBJ_FIRST:
        if (c == '}') return close_container(s, c);
        __attribute__((fallthrough)); /* else a key */
    case M_OBJ_KEY:
        if (c != '"') return false;
        s->mode = M_STR;
        s->key = 1;
        return true;
    case M_COLON:
        if (c != ':') return false;
        s->mode = M_VALUE;
        return true;
    case M_AFTER:
        if (c == ',') {
            s->mode = s->stack[s->depth - 1] == '{' ? M_OBJ_KEY : M_VALUE;
            return true;
        }
        return (c == '}' || c == ']') && close_container(s, c);
    case M_DONE: return false;
    case M_STR: return string_byte(s, c);
    case M_ESC:
        if (c == 'u') {
            s->mode = M_HEX;
            s->lit = 0;
            return true;
        }
        if (!strchr("\"\\/bfnrt", (int)c) || !c) return false;
        s->mode = M_STR;
        return true;
    case M_HEX:
        if (!is_hex(c)) return false;
        if (++s->lit == 4) s->mode = M_STR;
        return true;
    case M_N_MINUS:
        if (c == '0') s->mode = M_N_ZERO;
        else if (c >= '1' && c <= '9') s->mode = M_N_INT;
        else return false;
        return true;
    case M_N_DOT:
        if (!is_digit(c)) return false;
        s->mode = M_N_FRAC;
        return true;
    case M_N_E:
        if (c == '+' || c == '-') s->mode = M_N_ESIGN;
        else if (is_digit(c)) s->mode = M_N_EXP;
        else return false;
        return true;
    case M_N_ESIGN:
        if (!is_digit(c)) return false;
        s->mode = M_N_EXP;
        return true;
    case M_N_ZERO:
    case M_N_INT:
    case M_N_FRAC:
    case M_N_EXP:
        if (is_digit(c) && s->mode != M_N_ZERO) return true;
        if (c == '.' && (s->mode == M_N_ZERO || s->mode == M_N_INT)) {
            s->mode = M_N_DOT;
            return true;
        }
        if ((c == 'e' || c == 'E') && s->mode != M_N_EXP) {
            s->mode = M_N_E;
            return true;
        }
        /* the number ended: this byte belongs to what follows it */
        value_end(s);
        return step(s, c);
    case M_LIT:
        if (c != (unsigned char)k_words[s->word][s->lit]) return false;
        if (!k_words[s->word][++s->lit]) value_end(s);
        return true;
    }
    return false;
}

/* A byte of the wrapper's prefix: keeps the prefixes that still match;
 * when one of them is complete the object starts. */
static bool prefix_byte(ag_json_state *s, unsigned c) {
    uint32_t alive = 0;
    bool     complete = false;
    for (int i = 0; i < s->n_pre; i++) {
        if (!(s->pre_alive >> i & 1) || (unsigned char)s->pre[i][s->pos] != c) continue;
        alive |= 1u << i;
        complete = complete || !s->pre[i][s->pos + 1];
    }
    s->pre_alive = alive;
    s->pos++;
    if (complete) s->in_object = 1;
    return alive != 0;
}

bool ag_json_feed(ag_json_state *s, const char *bytes, size_t n) {
    for (size_t i = 0; i < n; i++) {
        unsigned c = (unsigned char)bytes[i];
        bool     ok;
        if (!s->in_object) ok = prefix_byte(s, c);
        else if (s->mode == M_DONE && s->suf) ok = s->suf_pos < s->suf_len && (unsigned char)s->suf[s->suf_pos++] == c;
        else ok = step(s, c);
        if (!ok) return false;
    }
    return true;
}

void ag_json_mask(const ag_json_state *s, const ag_tok *tok, float *logits) {
    const int32_t n = ag_tok_n_vocab(tok);
    const bool    done = ag_json_done(s);
    for (int32_t id = 0; id < n; id++) {
        if (logits[id] == -INFINITY) continue;
        bool ok;
        if (ag_tok_is_eog(tok, id)) {
            ok = done;
        } else if (done || (ag_tok_attr(tok, id) & (AG_TOK_ATTR_CONTROL | AG_TOK_ATTR_UNKNOWN | AG_TOK_ATTR_UNUSED))) {
            ok = false;
        } else {
            size_t      len;
            const char *p = ag_tok_piece(tok, id, &len);
            ag_json_state t = *s;
            ok = p && len && ag_json_feed(&t, p, len);
        }
        if (!ok) logits[id] = -INFINITY;
    }
}
