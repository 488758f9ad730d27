/* The lexer: jinja2's regex lexer (jinja2/lexer.py) re-expressed as a hand
 * scanner, for the environment transformers uses: default delimiters,
 * trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=False.
 *
 * The whitespace rules are where byte mismatches come from, so they follow
 * jinja2's code step by step:
 *  - newlines are normalised to "\n" and one trailing newline is dropped;
 *  - the text before a tag is rstripped (Unicode whitespace) when the tag
 *    opens with '-'; otherwise, unless it opens with '+' or is a {{ }} tag,
 *    whitespace between the last newline (or the template start / a
 *    preceding trimmed tag end) and the tag is removed (lstrip_blocks);
 *  - '-%}' '-}}' '-#}' eat all following whitespace; '%}' and '#}' eat one
 *    following "\n" (trim_blocks); '+%}' and '}}' eat nothing;
 *  - {% raw %} keeps its body verbatim, with the same rules at its edges. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/utf8.h"
#include "tmpl/internal.h"

bool tm_py_isspace(uint32_t c) {
    /* str.isspace() / the \s class of Python's re for str patterns */
    if (c <= 0x20) return c == 0x20 || (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x1F);
    if (c < 0x85) return false;
    return c == 0x85 || c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 ||
           c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

uint32_t tm_utf8_next(const char *s, size_t n, size_t *i) {
    uint32_t cp;
    size_t   k = ag_utf8_decode(s + *i, n - *i, &cp);
    if (k == 0) { /* never for validated text; stay safe anyway */
        (*i)++;
        return 0xFFFD;
    }
    *i += k;
    return cp;
}

/* Length of the Unicode whitespace run starting at s[i]. */
static size_t ws_run(const char *s, size_t n, size_t i) {
    size_t j = i;
    while (j < n) {
        size_t   k = j;
        uint32_t c = tm_utf8_next(s, n, &k);
        if (!tm_py_isspace(c)) break;
        j = k;
    }
    return j - i;
}

/* Whether s[a..b) is non-empty and all Unicode whitespace. */
static bool all_ws(const char *s, size_t a, size_t b) {
    if (a >= b) return false;
    return ws_run(s, b, a) == b - a;
}

/* Position after rstripping Unicode whitespace from s[a..b). */
static size_t rstrip_pos(const char *s, size_t a, size_t b) {
    size_t end = b;
    while (end > a) {
        size_t st = end - 1;
        while (st > a && ((unsigned char)s[st] & 0xC0) == 0x80) st--;
        size_t   k = st;
        uint32_t c = tm_utf8_next(s, end, &k);
        if (!tm_py_isspace(c)) break;
        end = st;
    }
    return end;
}

typedef struct {
    tm_arena   *a;
    tm_err     *e;
    const char *s;
    size_t      n;
    size_t      pos;
    int         line;
    size_t      line_pos; /* position up to which `line` has been counted */
    tm_tok     *toks;
    int         ntok, cap;
    bool        line_starting;
} lexer;

static int line_at(lexer *L, size_t p) {
    if (p < L->line_pos) { /* never goes backwards in practice; recount */
        L->line = 1;
        L->line_pos = 0;
    }
    for (size_t i = L->line_pos; i < p && i < L->n; i++)
        if (L->s[i] == '\n') L->line++;
    L->line_pos = p;
    return L->line;
}

static tm_tok *push(lexer *L, int type, size_t at) {
    if (L->ntok == L->cap) {
        int     ncap = L->cap ? L->cap * 2 : 256;
        tm_tok *nt = tm_alloc(L->a, sizeof(tm_tok) * (size_t)ncap);
        if (L->ntok) memcpy(nt, L->toks, sizeof(tm_tok) * (size_t)L->ntok);
        L->toks = nt;
        L->cap = ncap;
    }
    tm_tok *t = &L->toks[L->ntok++];
    memset(t, 0, sizeof *t);
    t->type = (uint8_t)type;
    t->line = line_at(L, at);
    return t;
}

static void emit_data(lexer *L, size_t a, size_t b) {
    if (b <= a) return;
    tm_tok *t = push(L, T_DATA, a);
    t->s = L->s + a;
    t->n = b - a;
}

/* Applies jinja2's OptionalLStrip rule to the text s[a..b) that precedes a
 * tag whose whitespace-control sign is `sign` ('-', '+' or 0); returns the
 * new end of the text. */
static size_t strip_before_tag(lexer *L, size_t a, size_t b, char sign, bool is_variable) {
    if (sign == '-') return rstrip_pos(L->s, a, b);
    if (sign != '+' && !is_variable) {
        size_t l_pos = a;
        for (size_t i = b; i > a; i--)
            if (L->s[i - 1] == '\n') {
                l_pos = i;
                break;
            }
        if ((l_pos > a || L->line_starting) && all_ws(L->s, l_pos, b)) return l_pos;
    }
    return b;
}

/* ---- string literal decoding: value.encode("ascii", "backslashreplace")
 * .decode("unicode-escape"), as jinja2's lexer does */

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

static void decode_string(lexer *L, tm_tok *t, const char *s, size_t n) {
    /* pass 1: backslashreplace non-ASCII into an ASCII buffer */
    size_t cap = n * 10 + 1;
    char  *asc = tm_alloc(L->a, cap);
    size_t m = 0;
    for (size_t i = 0; i < n;) {
        unsigned char c = (unsigned char)s[i];
        if (c < 0x80) {
            asc[m++] = (char)c;
            i++;
            continue;
        }
        uint32_t cp = tm_utf8_next(s, n, &i);
        if (cp < 0x100) m += (size_t)snprintf(asc + m, cap - m, "\\x%02x", cp);
        else if (cp < 0x10000) m += (size_t)snprintf(asc + m, cap - m, "\\u%04x", cp);
        else m += (size_t)snprintf(asc + m, cap - m, "\\U%08x", cp);
    }
    /* pass 2: unicode-escape decoding into UTF-8 */
    char  *out = tm_alloc(L->a, m * 4 + 1);
    size_t o = 0;
    for (size_t i = 0; i < m;) {
        char c = asc[i];
        if (c != '\\') {
            out[o++] = c;
            i++;
            continue;
        }
        if (i + 1 >= m) tm_fail(L->e, AG_ERR_TEMPLATE, t->line, "\\ at end of string");
        char     e = asc[i + 1];
        uint32_t cp = 0;
        i += 2;
        switch (e) {
        case '\n': continue;
        case '\\': cp = '\\'; break;
        case '\'': cp = '\''; break;
        case '"': cp = '"'; break;
        case 'b': cp = 8; break;
        case 'f': cp = 12; break;
        case 't': cp = 9; break;
        case 'n': cp = 10; break;
        case 'r': cp = 13; break;
        case 'v': cp = 11; break;
        case 'a': cp = 7; break;
        case '0': case '1': case '2': case '3': case '4': case '5': case '6': case '7': {
            cp = (uint32_t)(e - '0');
            for (int k = 0; k < 2 && i < m && asc[i] >= '0' && asc[i] <= '7'; k++)
                cp = cp * 8 + (uint32_t)(asc[i++] - '0');
            break;
        }
        case 'x': case 'u': case 'U': {
            int digits = e == 'x' ? 2 : e == 'u' ? 4 : 8;
            for (int k = 0; k < digits; k++) {
                int h = i < m ? hexval(asc[i]) : -1;
                if (h < 0)
                    tm_fail(L->e, AG_ERR_TEMPLATE, t->line, "truncated \\%s escape",
                            e == 'x' ? "xXX" : e == 'u' ? "uXXXX" : "UXXXXXXXX");
                cp = cp * 16 + (uint32_t)h;
                i++;
            }
            if (cp > 0x10FFFF) tm_fail(L->e, AG_ERR_TEMPLATE, t->line, "illegal Unicode character");
            break;
        }
        case 'N':
            tm_fail(L->e, AG_ERR_UNSUPPORTED, t->line, "unsupported: \\N{...} escape in a string literal");
        default:
            out[o++] = '\\';
            out[o++] = e;
            continue;
        }
        if (cp >= 0xD800 && cp <= 0xDFFF)
            tm_fail(L->e, AG_ERR_UNSUPPORTED, t->line, "unsupported: surrogate escape in a string literal");
        o += ag_utf8_encode(cp, out + o);
    }
    out[o] = 0;
    t->s = out;
    t->n = o;
}

/* ---- numbers (jinja2's float_re and integer_re) */

/* (\d+_)*\d+ at p: returns the end, or p when no match */
static size_t digit_run(const char *s, size_t n, size_t p) {
    size_t i = p;
    if (i >= n || s[i] < '0' || s[i] > '9') return p;
    for (;;) {
        while (i < n && s[i] >= '0' && s[i] <= '9') i++;
        if (i + 1 < n && s[i] == '_' && s[i + 1] >= '0' && s[i + 1] <= '9') {
            i++;
            continue;
        }
        return i;
    }
}

static size_t match_float(const char *s, size_t n, size_t p) {
    if (p > 0 && s[p - 1] == '.') return 0;
    size_t i = digit_run(s, n, p);
    if (i == p) return 0;
    /* alternative 1: (\.digits)? e[+-]?digits */
    size_t j = i;
    for (int with_frac = 1; with_frac >= 0; with_frac--) {
        j = i;
        if (with_frac) {
            if (j < n && s[j] == '.') {
                size_t k = digit_run(s, n, j + 1);
                if (k == j + 1) continue;
                j = k;
            } else continue;
        }
        if (j < n && (s[j] == 'e' || s[j] == 'E')) {
            size_t k = j + 1;
            if (k < n && (s[k] == '+' || s[k] == '-')) k++;
            size_t e = digit_run(s, n, k);
            if (e > k) return e - p;
        }
    }
    /* alternative 2: \.digits */
    if (i < n && s[i] == '.') {
        size_t k = digit_run(s, n, i + 1);
        if (k > i + 1) return k - p;
    }
    return 0;
}

static size_t match_int(const char *s, size_t n, size_t p, int *base) {
    if (p >= n || s[p] < '0' || s[p] > '9') return 0;
    if (s[p] == '0' && p + 1 < n) {
        char x = s[p + 1] | 0x20;
        int  b = x == 'b' ? 2 : x == 'o' ? 8 : x == 'x' ? 16 : 0;
        if (b) {
            size_t i = p + 2, cnt = 0;
            for (;;) {
                size_t k = i;
                if (k < n && s[k] == '_') k++;
                int h = k < n ? hexval(s[k]) : -1;
                if (h < 0 || h >= b) break;
                i = k + 1;
                cnt++;
            }
            if (cnt) {
                *base = b;
                return i - p;
            }
        }
    }
    *base = 10;
    size_t i = p + 1;
    if (s[p] == '0') {
        for (;;) {
            size_t k = i;
            if (k < n && s[k] == '_') k++;
            if (k < n && s[k] == '0') i = k + 1;
            else break;
        }
        return i - p;
    }
    for (;;) {
        size_t k = i;
        if (k < n && s[k] == '_') k++;
        if (k < n && s[k] >= '0' && s[k] <= '9') i = k + 1;
        else break;
    }
    return i - p;
}

static const struct {
    const char *s;
    int         op;
} ops2[] = {{"//", TO_FLOORDIV}, {"**", TO_POW}, {"==", TO_EQ}, {"!=", TO_NE}, {">=", TO_GTEQ}, {"<=", TO_LTEQ}};

static int op1(char c) {
    switch (c) {
    case '+': return TO_ADD;
    case '-': return TO_SUB;
    case '/': return TO_DIV;
    case '*': return TO_MUL;
    case '%': return TO_MOD;
    case '~': return TO_TILDE;
    case '[': return TO_LBRACKET;
    case ']': return TO_RBRACKET;
    case '(': return TO_LPAREN;
    case ')': return TO_RPAREN;
    case '{': return TO_LBRACE;
    case '}': return TO_RBRACE;
    case '>': return TO_GT;
    case '<': return TO_LT;
    case '=': return TO_ASSIGN;
    case '.': return TO_DOT;
    case ':': return TO_COLON;
    case '|': return TO_PIPE;
    case ',': return TO_COMMA;
    case ';': return TO_SEMICOLON;
    default: return -1;
    }
}

static void describe_char(char *buf, size_t cap, const char *s, size_t n, size_t p) {
    size_t   k = p;
    uint32_t c = tm_utf8_next(s, n, &k);
    if (c == '\'') snprintf(buf, cap, "\"'\"");
    else if (c < 0x20 || c == 0x7f) snprintf(buf, cap, "'\\x%02x'", c);
    else snprintf(buf, cap, "'%.*s'", (int)(k - p), s + p);
}

/* Lexes the inside of a {{ }} or {% %} tag until its end; returns false at
 * the end of the source (jinja2 then just stops; the parser reports it). */
static bool lex_tag(lexer *L, bool is_block) {
    const char *s = L->s;
    size_t      n = L->n;
    char        balance[256];
    int         nb = 0;
    for (;;) {
        size_t p = L->pos;
        if (nb == 0) {
            /* end of tag */
            if (is_block) {
                size_t end = 0;
                if (p + 2 < n + 0 && s[p] == '+' && s[p + 1] == '%' && s[p + 2] == '}') end = p + 3;
                else if (p + 2 < n && s[p] == '-' && s[p + 1] == '%' && s[p + 2] == '}')
                    end = p + 3 + ws_run(s, n, p + 3);
                else if (p + 1 < n && s[p] == '%' && s[p + 1] == '}') {
                    end = p + 2;
                    if (end < n && s[end] == '\n') end++;
                }
                if (end) {
                    push(L, T_BLOCK_END, p);
                    L->line_starting = s[end - 1] == '\n';
                    L->pos = end;
                    return true;
                }
            } else {
                size_t end = 0;
                if (p + 2 < n && s[p] == '-' && s[p + 1] == '}' && s[p + 2] == '}')
                    end = p + 3 + ws_run(s, n, p + 3);
                else if (p + 1 < n && s[p] == '}' && s[p + 1] == '}') end = p + 2;
                if (end) {
                    push(L, T_VAR_END, p);
                    L->line_starting = s[end - 1] == '\n';
                    L->pos = end;
                    return true;
                }
            }
        }
        if (p >= n) return false;
        size_t w = ws_run(s, n, p);
        if (w) {
            L->pos = p + w;
            continue;
        }
        size_t fl = match_float(s, n, p);
        if (fl) {
            char buf[128];
            if (fl >= sizeof buf) tm_fail(L->e, AG_ERR_UNSUPPORTED, line_at(L, p), "unsupported: float literal too long");
            size_t m = 0;
            for (size_t i = p; i < p + fl; i++)
                if (s[i] != '_') buf[m++] = s[i];
            buf[m] = 0;
            tm_tok *t = push(L, T_FLOAT, p);
            t->d = strtod(buf, NULL);
            L->pos = p + fl;
            continue;
        }
        int    base;
        size_t il = match_int(s, n, p, &base);
        if (il) {
            uint64_t v = 0;
            size_t   i = p + (base == 10 ? 0 : 2);
            for (; i < p + il; i++) {
                if (s[i] == '_') continue;
                int h = hexval(s[i]);
                if (v > (UINT64_MAX - (uint64_t)h) / (uint64_t)base || v * (uint64_t)base + (uint64_t)h > (uint64_t)INT64_MAX)
                    tm_fail(L->e, AG_ERR_UNSUPPORTED, line_at(L, p), "unsupported: integer literal larger than 64 bits");
                v = v * (uint64_t)base + (uint64_t)h;
            }
            tm_tok *t = push(L, T_INT, p);
            t->i = (int64_t)v;
            L->pos = p + il;
            continue;
        }
        char c = s[p];
        if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_') {
            size_t i = p + 1;
            while (i < n && ((s[i] >= 'a' && s[i] <= 'z') || (s[i] >= 'A' && s[i] <= 'Z') || s[i] == '_' ||
                             (s[i] >= '0' && s[i] <= '9')))
                i++;
            if (i < n && (unsigned char)s[i] >= 0x80)
                tm_fail(L->e, AG_ERR_UNSUPPORTED, line_at(L, p), "unsupported: non-ASCII identifier");
            tm_tok *t = push(L, T_NAME, p);
            t->s = s + p;
            t->n = i - p;
            L->pos = i;
            continue;
        }
        if (c == '\'' || c == '"') {
            size_t i = p + 1;
            bool   closed = false;
            while (i < n) {
                if (s[i] == '\\') {
                    if (i + 1 >= n) break;
                    i += 2;
                    continue;
                }
                if (s[i] == c) {
                    closed = true;
                    break;
                }
                i++;
            }
            if (closed) {
                tm_tok *t = push(L, T_STRING, p);
                decode_string(L, t, s + p + 1, i - p - 1);
                L->pos = i + 1;
                continue;
            }
            /* unterminated: falls through to "unexpected char" like jinja2 */
        }
        int op = -1;
        size_t ol = 0;
        if (p + 1 < n)
            for (size_t k = 0; k < sizeof ops2 / sizeof ops2[0]; k++)
                if (s[p] == ops2[k].s[0] && s[p + 1] == ops2[k].s[1]) {
                    op = ops2[k].op;
                    ol = 2;
                    break;
                }
        if (op < 0) {
            op = op1(c);
            ol = 1;
        }
        if (op < 0) {
            if ((unsigned char)c >= 0x80 && c != 0) {
                /* a non-ASCII letter would start an identifier in jinja2 */
                size_t   k = p;
                uint32_t cp = tm_utf8_next(s, n, &k);
                (void)cp;
            }
            char d[16];
            describe_char(d, sizeof d, s, n, p);
            tm_fail(L->e, AG_ERR_TEMPLATE, line_at(L, p), "unexpected char %s at %zu", d, p);
        }
        if (op == TO_LPAREN || op == TO_LBRACKET || op == TO_LBRACE) {
            if (nb >= (int)sizeof balance)
                tm_fail(L->e, AG_ERR_RANGE, line_at(L, p), "brackets nested too deeply");
            balance[nb++] = op == TO_LPAREN ? ')' : op == TO_LBRACKET ? ']' : '}';
        } else if (op == TO_RPAREN || op == TO_RBRACKET || op == TO_RBRACE) {
            if (nb == 0) tm_fail(L->e, AG_ERR_TEMPLATE, line_at(L, p), "unexpected '%c'", c);
            char want = balance[--nb];
            if (want != c) tm_fail(L->e, AG_ERR_TEMPLATE, line_at(L, p), "unexpected '%c', expected '%c'", c, want);
        }
        tm_tok *t = push(L, T_OP, p);
        t->op = (uint8_t)op;
        L->pos = p + ol;
    }
}

void tm_lex(tm_arena *a, tm_err *e, const char *src, size_t len, tm_tok **out, int *nout) {
    lexer L = {0};
    L.a = a;
    L.e = e;
    /* newline normalisation and the dropped trailing newline */
    char  *s = tm_alloc(a, len + 1);
    size_t n = 0;
    for (size_t i = 0; i < len; i++) {
        if (src[i] == '\r') {
            s[n++] = '\n';
            if (i + 1 < len && src[i + 1] == '\n') i++;
        } else s[n++] = src[i];
    }
    if (n > 0 && s[n - 1] == '\n') n--;
    s[n] = 0;
    L.s = s;
    L.n = n;
    L.line = 1;
    L.line_starting = true;

    while (L.pos < n) {
        size_t p = L.pos, i = p;
        int    kind = 0; /* '%', '{', '#' */
        while (i + 1 < n) {
            if (s[i] == '{' && (s[i + 1] == '%' || s[i + 1] == '{' || s[i + 1] == '#')) {
                kind = s[i + 1];
                break;
            }
            i++;
        }
        if (!kind) { /* the rest is data */
            emit_data(&L, p, n);
            L.pos = n;
            break;
        }
        size_t after = i + 2;
        char   sign = (after < n && (s[after] == '-' || s[after] == '+')) ? s[after] : 0;

        /* {% raw %} ? */
        size_t raw_end = 0;
        if (kind == '%') {
            size_t k = after + (sign ? 1 : 0);
            k += ws_run(s, n, k);
            if (k + 3 <= n && memcmp(s + k, "raw", 3) == 0) {
                k += 3;
                k += ws_run(s, n, k);
                if (k + 2 < n && s[k] == '-' && s[k + 1] == '%' && s[k + 2] == '}')
                    raw_end = k + 3 + ws_run(s, n, k + 3);
                else if (k + 1 < n && s[k] == '%' && s[k + 1] == '}') raw_end = k + 2;
            }
        }
        size_t text_end = strip_before_tag(&L, p, i, sign, kind == '{');
        emit_data(&L, p, text_end);
        L.line_starting = false;

        if (raw_end) {
            L.line_starting = s[raw_end - 1] == '\n';
            /* find {%[-+]? \s* endraw \s* (+%} | -%}\s* | %}\n?) */
            size_t j = raw_end, body_end = 0, end = 0;
            char   esign = 0;
            for (; j + 1 < n; j++) {
                if (s[j] != '{' || s[j + 1] != '%') continue;
                size_t k = j + 2;
                char   sg = (k < n && (s[k] == '-' || s[k] == '+')) ? s[k] : 0;
                if (sg) k++;
                k += ws_run(s, n, k);
                if (k + 6 > n || memcmp(s + k, "endraw", 6) != 0) continue;
                k += 6;
                k += ws_run(s, n, k);
                if (k + 2 < n && s[k] == '+' && s[k + 1] == '%' && s[k + 2] == '}') end = k + 3;
                else if (k + 2 < n && s[k] == '-' && s[k + 1] == '%' && s[k + 2] == '}')
                    end = k + 3 + ws_run(s, n, k + 3);
                else if (k + 1 < n && s[k] == '%' && s[k + 1] == '}') {
                    end = k + 2;
                    if (end < n && s[end] == '\n') end++;
                }
                if (end) {
                    body_end = j;
                    esign = sg;
                    break;
                }
            }
            if (!end) {
                if (raw_end >= n) { /* nothing left: jinja2 stops silently */
                    L.pos = n;
                    break;
                }
                tm_fail(e, AG_ERR_TEMPLATE, line_at(&L, i), "Missing end of raw directive");
            }
            size_t te = strip_before_tag(&L, raw_end, body_end, esign, false);
            emit_data(&L, raw_end, te);
            L.line_starting = s[end - 1] == '\n';
            L.pos = end;
            continue;
        }

        size_t body = after + (sign ? 1 : 0);
        if (kind == '#') {
            size_t j = body, end = 0;
            for (; j + 1 < n; j++) {
                if ((s[j] == '+' || s[j] == '-') && j + 2 < n && s[j + 1] == '#' && s[j + 2] == '}') {
                    end = s[j] == '+' ? j + 3 : j + 3 + ws_run(s, n, j + 3);
                    break;
                }
                if (s[j] == '#' && s[j + 1] == '}') {
                    end = j + 2;
                    if (end < n && s[end] == '\n') end++;
                    break;
                }
            }
            if (!end) {
                if (body >= n) {
                    L.pos = n;
                    break;
                }
                tm_fail(e, AG_ERR_TEMPLATE, line_at(&L, i), "Missing end of comment tag");
            }
            L.line_starting = s[end - 1] == '\n';
            L.pos = end;
            continue;
        }
        push(&L, kind == '%' ? T_BLOCK_BEGIN : T_VAR_BEGIN, i);
        L.pos = body;
        if (!lex_tag(&L, kind == '%')) break;
    }
    push(&L, T_EOF, n);
    *out = L.toks;
    *nout = L.ntok;
}
