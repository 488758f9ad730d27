/* jinja2's filters and tests, the Python str/dict/list methods templates
 * call, the globals (range, namespace, dict, joiner, raise_exception,
 * strftime_now), binary operators and %-formatting, each following the
 * CPython / jinja2 behaviour they stand for (messages included). */
#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <utf8proc.h>

#include "base/utf8.h"
#include "tmpl/render.h"

/* ================================================================ helpers */

static tv tv_of_list(tlist *l, int kind) { return tv_list_kind(l, kind); }

static tv dict_tv(tdict *d) {
    tv v = {.t = TV_DICT};
    v.m = d;
    return v;
}

static bool kwname_is(R *r, int id, const char *s) { return strcmp(name_str(r, id)->s, s) == 0; }

/* Binds call arguments to named parameter slots (Python's rules for a
 * function `fname(names...)`); unfilled slots are tv_missing(). */
static void bind(R *r, const char *fname, targs *a, const char *const *names, int nnames, tv *out) {
    for (int i = 0; i < nnames; i++) out[i] = tv_missing();
    if (a->npos > nnames)
        rfail(r, "%s() takes at most %d argument%s (%d given)", fname, nnames, nnames == 1 ? "" : "s", a->npos);
    for (int i = 0; i < a->npos; i++) out[i] = a->pos[i];
    for (int k = 0; k < a->nkw; k++) {
        const char *kn = name_str(r, a->kwid[k])->s;
        int         j;
        for (j = 0; j < nnames; j++)
            if (!strcmp(names[j], kn)) break;
        if (j == nnames) rfail(r, "%s() got an unexpected keyword argument '%s'", fname, kn);
        if (!is_missing(out[j])) rfail(r, "%s() got multiple values for argument '%s'", fname, kn);
        out[j] = a->kwv[k];
    }
}

static void no_args(R *r, const char *fname, targs *a) {
    if (a->npos || a->nkw) rfail(r, "%s() takes no arguments", fname);
}

static int64_t want_int(R *r, tv v, const char *what) {
    if (v.t == TV_UNDEF) fail_undefined(r, v);
    if (!is_intlike(v)) rfail(r, "'%s' object cannot be interpreted as an integer%s%s", tv_type_name(v),
                              what ? " in " : "", what ? what : "");
    return v.i;
}

static const tstr *want_str(R *r, tv v, const char *fname) {
    if (v.t == TV_UNDEF) fail_undefined(r, v);
    if (v.t != TV_STR) rfail(r, "%s() argument must be str, not %s", fname, tv_type_name(v));
    return v.s;
}

/* ---- Unicode case and classes */

static bool is_cased(uint32_t c) {
    utf8proc_category_t k = utf8proc_category((utf8proc_int32_t)c);
    return k == UTF8PROC_CATEGORY_LU || k == UTF8PROC_CATEGORY_LL || k == UTF8PROC_CATEGORY_LT;
}
static bool is_alpha(uint32_t c) {
    utf8proc_category_t k = utf8proc_category((utf8proc_int32_t)c);
    return k == UTF8PROC_CATEGORY_LU || k == UTF8PROC_CATEGORY_LL || k == UTF8PROC_CATEGORY_LT ||
           k == UTF8PROC_CATEGORY_LM || k == UTF8PROC_CATEGORY_LO;
}
static bool is_decimal(uint32_t c) { return utf8proc_category((utf8proc_int32_t)c) == UTF8PROC_CATEGORY_ND; }
static bool is_numeric(uint32_t c) {
    utf8proc_category_t k = utf8proc_category((utf8proc_int32_t)c);
    return k == UTF8PROC_CATEGORY_ND || k == UTF8PROC_CATEGORY_NL || k == UTF8PROC_CATEGORY_NO;
}
static bool is_word(uint32_t c) { return c == '_' || is_alpha(c) || is_numeric(c); }

enum { CASE_UPPER, CASE_LOWER, CASE_TITLE };

static void put_cp(R *r, ag_buf *b, uint32_t c) {
    char   e[4];
    size_t k = ag_utf8_encode(c, e);
    buf_add(r, b, e, k);
}

static void put_case(R *r, ag_buf *b, uint32_t c, int mode) {
    /* the full (multi-character) mappings Python applies most often */
    if (c == 0xDF && mode != CASE_LOWER) {
        buf_adds(r, b, mode == CASE_UPPER ? "SS" : "Ss");
        return;
    }
    if (c == 0x130 && mode == CASE_LOWER) {
        buf_adds(r, b, "i\xCC\x87");
        return;
    }
    utf8proc_int32_t m = mode == CASE_UPPER  ? utf8proc_toupper((utf8proc_int32_t)c)
                         : mode == CASE_LOWER ? utf8proc_tolower((utf8proc_int32_t)c)
                                              : utf8proc_totitle((utf8proc_int32_t)c);
    put_cp(r, b, (uint32_t)m);
}

static tv str_case(R *r, tv v, int mode) {
    ag_buf *b = buf_get(r);
    size_t  i = 0;
    while (i < v.s->len) {
        uint32_t c = tm_utf8_next(v.s->s, v.s->len, &i);
        if (c < 0x80) {
            char ch = (char)c;
            if (mode == CASE_LOWER && ch >= 'A' && ch <= 'Z') ch = (char)(ch + 32);
            else if (mode != CASE_LOWER && ch >= 'a' && ch <= 'z') ch = (char)(ch - 32);
            buf_addc(r, b, ch);
        } else put_case(r, b, c, mode);
    }
    return buf_finish(r, b, v.f & TVF_SAFE);
}

/* Python str.title() */
static tv str_title_py(R *r, tv v) {
    ag_buf *b = buf_get(r);
    size_t  i = 0;
    bool    prev_cased = false;
    while (i < v.s->len) {
        uint32_t c = tm_utf8_next(v.s->s, v.s->len, &i);
        put_case(r, b, c, prev_cased ? CASE_LOWER : CASE_TITLE);
        prev_cased = is_cased(c);
    }
    return buf_finish(r, b, v.f & TVF_SAFE);
}

/* Python str.capitalize() (3.8+: first character title-cased) */
static tv str_capitalize(R *r, tv v) {
    ag_buf *b = buf_get(r);
    size_t  i = 0;
    bool    first = true;
    while (i < v.s->len) {
        uint32_t c = tm_utf8_next(v.s->s, v.s->len, &i);
        put_case(r, b, c, first ? CASE_TITLE : CASE_LOWER);
        first = false;
    }
    return buf_finish(r, b, v.f & TVF_SAFE);
}

static tv str_swapcase(R *r, tv v) {
    ag_buf *b = buf_get(r);
    size_t  i = 0;
    while (i < v.s->len) {
        uint32_t c = tm_utf8_next(v.s->s, v.s->len, &i);
        utf8proc_category_t k = utf8proc_category((utf8proc_int32_t)c);
        if (k == UTF8PROC_CATEGORY_LU) put_case(r, b, c, CASE_LOWER);
        else if (k == UTF8PROC_CATEGORY_LL) put_case(r, b, c, CASE_UPPER);
        else put_cp(r, b, c);
    }
    return buf_finish(r, b, v.f & TVF_SAFE);
}

/* jinja2's title filter: split on ([-\s({\[<]+), item[0].upper() + item[1:].lower() */
static bool title_sep(uint32_t c) {
    return c == '-' || c == '(' || c == '{' || c == '[' || c == '<' || tm_py_isspace(c);
}

static tv jinja_title(R *r, tv v) {
    ag_buf *b = buf_get(r);
    size_t  i = 0;
    int     state = -1; /* -1: at item start */
    bool    in_sep = false;
    while (i < v.s->len) {
        uint32_t c = tm_utf8_next(v.s->s, v.s->len, &i);
        bool     sep = title_sep(c);
        if (state == -1 || sep != in_sep) {
            /* a new item starts */
            put_case(r, b, c, CASE_UPPER);
            in_sep = sep;
            state = 0;
        } else put_case(r, b, c, CASE_LOWER);
    }
    return buf_finish(r, b, v.f & TVF_SAFE);
}

/* ---- strip */

static bool in_chars(uint32_t c, const tstr *chars) {
    if (!chars) return tm_py_isspace(c);
    size_t i = 0;
    while (i < chars->len)
        if (tm_utf8_next(chars->s, chars->len, &i) == c) return true;
    return false;
}

static tv str_strip(R *r, tv v, const tstr *chars, bool left, bool right) {
    const char *s = v.s->s;
    size_t      n = v.s->len, a = 0, e = n;
    if (left)
        while (a < n) {
            size_t   k = a;
            uint32_t c = tm_utf8_next(s, n, &k);
            if (!in_chars(c, chars)) break;
            a = k;
        }
    if (right)
        while (e > a) {
            size_t st = e - 1;
            while (st > a && ((unsigned char)s[st] & 0xC0) == 0x80) st--;
            size_t   k = st;
            uint32_t c = tm_utf8_next(s, n, &k);
            if (!in_chars(c, chars)) break;
            e = st;
        }
    if (a == 0 && e == n) return v;
    return mkstr_safe(r, s + a, e - a, v.f & TVF_SAFE);
}

static const tstr *opt_chars(R *r, tv c, const char *fname) {
    if (is_missing(c) || c.t == TV_NONE) return NULL;
    return want_str(r, c, fname);
}

/* ---- searching */

static const char *find_bytes(const char *h, size_t hn, const char *nd, size_t nn) {
    if (nn == 0) return h;
    if (nn > hn) return NULL;
    return memmem(h, hn, nd, nn);
}

static const char *rfind_bytes(const char *h, size_t hn, const char *nd, size_t nn) {
    if (nn > hn) return NULL;
    for (size_t i = hn - nn + 1; i-- > 0;)
        if (memcmp(h + i, nd, nn) == 0) return h + i;
    return NULL;
}

static size_t cp_count(const char *s, size_t n) {
    size_t c = 0;
    for (size_t i = 0; i < n; i++) c += ((unsigned char)s[i] & 0xC0) != 0x80;
    return c;
}

/* Python's start/end arguments of find/count/startswith, as byte offsets */
static void sub_range(R *r, const tstr *s, tv vstart, tv vend, size_t *a, size_t *b) {
    int64_t len = (int64_t)s->ncp, st = 0, en = len;
    if (!is_missing(vstart) && vstart.t != TV_NONE) st = want_int(r, vstart, NULL);
    if (!is_missing(vend) && vend.t != TV_NONE) en = want_int(r, vend, NULL);
    if (st < 0) st = st + len < 0 ? 0 : st + len;
    if (en < 0) en = en + len < 0 ? 0 : en + len;
    if (st > len) st = len;
    if (en > len) en = len;
    if (en < st) en = st;
    *a = cp_offset(s, (size_t)st);
    *b = cp_offset(s, (size_t)en);
}

static tv str_replace(R *r, tv s, const tstr *old, const tstr *new_, int64_t count, bool safe) {
    ag_buf *b = buf_get(r);
    const char *p = s.s->s, *end = s.s->s + s.s->len;
    int64_t     done = 0;
    if (old->len == 0) {
        /* inserts `new` before every code point and at the end */
        size_t i = 0;
        while (i <= s.s->len) {
            if (count < 0 || done < count) {
                buf_add(r, b, new_->s, new_->len);
                done++;
            }
            if (i == s.s->len) break;
            size_t st = i;
            tm_utf8_next(s.s->s, s.s->len, &i);
            buf_add(r, b, s.s->s + st, i - st);
        }
        return buf_finish(r, b, safe);
    }
    while (p < end && (count < 0 || done < count)) {
        const char *q = find_bytes(p, (size_t)(end - p), old->s, old->len);
        if (!q) break;
        buf_add(r, b, p, (size_t)(q - p));
        buf_add(r, b, new_->s, new_->len);
        p = q + old->len;
        done++;
    }
    buf_add(r, b, p, (size_t)(end - p));
    return buf_finish(r, b, safe);
}

static tv str_split(R *r, tv v, tv vsep, tv vmax, bool from_right) {
    int64_t maxsplit = -1;
    if (!is_missing(vmax)) maxsplit = want_int(r, vmax, NULL);
    const char *s = v.s->s;
    size_t      n = v.s->len;
    tv         *parts = ralloc(r, sizeof(tv) * (v.s->ncp + 2));
    size_t      np = 0;
    bool        safe = v.f & TVF_SAFE;
    if (is_missing(vsep) || vsep.t == TV_NONE) {
        /* runs of whitespace; leading/trailing ignored */
        if (!from_right) {
            size_t i = 0;
            int64_t splits = 0;
            for (;;) {
                while (i < n) {
                    size_t k = i;
                    if (!tm_py_isspace(tm_utf8_next(s, n, &k))) break;
                    i = k;
                }
                if (i >= n) break;
                if (maxsplit >= 0 && splits >= maxsplit) {
                    /* rest, with trailing whitespace stripped */
                    size_t e = n;
                    while (e > i) {
                        size_t st = e - 1;
                        while (st > i && ((unsigned char)s[st] & 0xC0) == 0x80) st--;
                        size_t k = st;
                        if (!tm_py_isspace(tm_utf8_next(s, n, &k))) break;
                        e = st;
                    }
                    parts[np++] = mkstr_safe(r, s + i, e - i, safe);
                    break;
                }
                size_t st = i;
                while (i < n) {
                    size_t k = i;
                    if (tm_py_isspace(tm_utf8_next(s, n, &k))) break;
                    i = k;
                }
                parts[np++] = mkstr_safe(r, s + st, i - st, safe);
                splits++;
            }
        } else {
            size_t  e = n;
            int64_t splits = 0;
            for (;;) {
                while (e > 0) {
                    size_t st = e - 1;
                    while (st > 0 && ((unsigned char)s[st] & 0xC0) == 0x80) st--;
                    size_t k = st;
                    if (!tm_py_isspace(tm_utf8_next(s, n, &k))) break;
                    e = st;
                }
                if (e == 0) break;
                if (maxsplit >= 0 && splits >= maxsplit) {
                    size_t a = 0;
                    while (a < e) {
                        size_t k = a;
                        if (!tm_py_isspace(tm_utf8_next(s, n, &k))) break;
                        a = k;
                    }
                    parts[np++] = mkstr_safe(r, s + a, e - a, safe);
                    break;
                }
                size_t b = e;
                while (b > 0) {
                    size_t st = b - 1;
                    while (st > 0 && ((unsigned char)s[st] & 0xC0) == 0x80) st--;
                    size_t k = st;
                    if (tm_py_isspace(tm_utf8_next(s, n, &k))) break;
                    b = st;
                }
                parts[np++] = mkstr_safe(r, s + b, e - b, safe);
                e = b;
                splits++;
            }
            for (size_t i = 0; i < np / 2; i++) {
                tv t = parts[i];
                parts[i] = parts[np - 1 - i];
                parts[np - 1 - i] = t;
            }
        }
    } else {
        const tstr *sep = want_str(r, vsep, "split");
        if (sep->len == 0) rfail(r, "empty separator");
        if (!from_right) {
            const char *p = s, *end = s + n;
            int64_t     splits = 0;
            for (;;) {
                const char *q = (maxsplit < 0 || splits < maxsplit) ? find_bytes(p, (size_t)(end - p), sep->s, sep->len)
                                                                    : NULL;
                if (!q) {
                    parts[np++] = mkstr_safe(r, p, (size_t)(end - p), safe);
                    break;
                }
                parts[np++] = mkstr_safe(r, p, (size_t)(q - p), safe);
                p = q + sep->len;
                splits++;
            }
        } else {
            size_t  e = n;
            int64_t splits = 0;
            for (;;) {
                const char *q = (maxsplit < 0 || splits < maxsplit) ? rfind_bytes(s, e, sep->s, sep->len) : NULL;
                if (!q) {
                    parts[np++] = mkstr_safe(r, s, e, safe);
                    break;
                }
                size_t at = (size_t)(q - s);
                parts[np++] = mkstr_safe(r, q + sep->len, e - at - sep->len, safe);
                e = at;
                splits++;
            }
            for (size_t i = 0; i < np / 2; i++) {
                tv t = parts[i];
                parts[i] = parts[np - 1 - i];
                parts[np - 1 - i] = t;
            }
        }
    }
    tlist *l = mklist(r, np);
    memcpy(l->v, parts, sizeof(tv) * np);
    return tv_of_list(l, LK_LIST);
}

/* str.splitlines() boundaries */
static size_t line_break_len(const char *s, size_t n, size_t i) {
    unsigned char c = (unsigned char)s[i];
    if (c == '\r') return (i + 1 < n && s[i + 1] == '\n') ? 2 : 1;
    if (c == '\n' || c == 0x0B || c == 0x0C || c == 0x1C || c == 0x1D || c == 0x1E) return 1;
    if (c == 0xC2 && i + 1 < n && (unsigned char)s[i + 1] == 0x85) return 2;
    if (c == 0xE2 && i + 2 < n && (unsigned char)s[i + 1] == 0x80 &&
        ((unsigned char)s[i + 2] == 0xA8 || (unsigned char)s[i + 2] == 0xA9))
        return 3;
    return 0;
}

static tlist *str_splitlines(R *r, const tstr *s, bool keepends) {
    tv    *parts = ralloc(r, sizeof(tv) * (s->ncp + 1));
    size_t np = 0, st = 0, i = 0;
    while (i < s->len) {
        size_t k = line_break_len(s->s, s->len, i);
        if (k) {
            parts[np++] = mkstr(r, s->s + st, keepends ? i + k - st : i - st);
            i += k;
            st = i;
        } else i++;
    }
    if (st < s->len) parts[np++] = mkstr(r, s->s + st, s->len - st);
    tlist *l = mklist(r, np);
    memcpy(l->v, parts, sizeof(tv) * np);
    return l;
}

static tv pad_str(R *r, tv v, int64_t width, char align, const char *fill, size_t filln) {
    int64_t len = (int64_t)v.s->ncp;
    if (width <= len) return v;
    int64_t total = width - len, left = 0, right = 0;
    if (align == '<') right = total;
    else if (align == '>') left = total;
    else {
        /* str.center: extra goes left when the padding is odd and width is odd */
        left = total / 2 + (total & width & 1);
        right = total - left;
    }
    if (width > (int64_t)r->max_output) rfail_code(r, AG_ERR_RANGE, "output limit exceeded");
    ag_buf *b = buf_get(r);
    for (int64_t k = 0; k < left; k++) buf_add(r, b, fill, filln);
    buf_add(r, b, v.s->s, v.s->len);
    for (int64_t k = 0; k < right; k++) buf_add(r, b, fill, filln);
    return buf_finish(r, b, v.f & TVF_SAFE);
}

/* ================================================================ operators */

static bool add_ovf(int64_t a, int64_t b, int64_t *o) { return __builtin_add_overflow(a, b, o); }
static bool sub_ovf(int64_t a, int64_t b, int64_t *o) { return __builtin_sub_overflow(a, b, o); }
static bool mul_ovf(int64_t a, int64_t b, int64_t *o) { return __builtin_mul_overflow(a, b, o); }

_Noreturn static void int_overflow(R *r) {
    rfail_code(r, AG_ERR_UNSUPPORTED, "unsupported: integer result larger than 64 bits");
}

static tv repeat(R *r, tv seq, int64_t n) {
    if (n < 0) n = 0;
    if (seq.t == TV_STR) {
        if (n && seq.s->len && (uint64_t)n > r->max_output / seq.s->len)
            rfail_code(r, AG_ERR_RANGE, "output limit exceeded (%zu bytes)", r->max_output);
        ag_buf *b = buf_get(r);
        for (int64_t k = 0; k < n; k++) buf_add(r, b, seq.s->s, seq.s->len);
        return buf_finish(r, b, seq.f & TVF_SAFE);
    }
    if (n && seq.l->n && (uint64_t)n > (uint64_t)10000000 / seq.l->n)
        rfail_code(r, AG_ERR_RANGE, "list too large");
    tlist *l = mklist(r, seq.l->n * (size_t)n);
    for (int64_t k = 0; k < n; k++) memcpy(l->v + (size_t)k * seq.l->n, seq.l->v, sizeof(tv) * seq.l->n);
    return tv_list_kind(l, TV_LK(seq));
}

static tv escape_tv(R *r, tv v) {
    if (v.t == TV_STR && (v.f & TVF_SAFE)) return v;
    tv      s = tv_str(r, v);
    ag_buf *b = buf_get(r);
    write_html_escaped(r, b, s.s->s, s.s->len);
    return buf_finish(r, b, true);
}

static double py_fmod(double x, double y) {
    double m = fmod(x, y);
    if (m != 0) {
        if ((y < 0) != (m < 0)) m += y;
    } else m = copysign(0.0, y);
    return m;
}

static double py_floordiv(double vx, double wx) {
    double mod = fmod(vx, wx), div = (vx - mod) / wx;
    if (mod != 0) {
        if ((wx < 0) != (mod < 0)) div -= 1.0;
    }
    if (div != 0) {
        double fl = floor(div);
        if (div - fl > 0.5) fl += 1.0;
        return fl;
    }
    return copysign(0.0, vx / wx);
}

static const char *op_sym(int op) {
    static const char *s[] = {"+", "-", "*", "/", "//", "%", "** or pow()"};
    return s[op];
}

tv tv_binop(R *r, int op, tv a, tv b) {
    if (a.t == TV_UNDEF) fail_undefined(r, a);
    /* str % Undefined is str.__mod__'s business (Undefined is "mapping-like") */
    if (b.t == TV_UNDEF && !(op == OP_MOD && a.t == TV_STR)) fail_undefined(r, b);
    if (is_num(a) && is_num(b)) {
        bool ints = is_intlike(a) && is_intlike(b);
        int64_t o;
        switch (op) {
        case OP_ADD:
            if (ints) {
                if (add_ovf(a.i, b.i, &o)) int_overflow(r);
                return tv_int(o);
            }
            return tv_float(num_d(a) + num_d(b));
        case OP_SUB:
            if (ints) {
                if (sub_ovf(a.i, b.i, &o)) int_overflow(r);
                return tv_int(o);
            }
            return tv_float(num_d(a) - num_d(b));
        case OP_MUL:
            if (ints) {
                if (mul_ovf(a.i, b.i, &o)) int_overflow(r);
                return tv_int(o);
            }
            return tv_float(num_d(a) * num_d(b));
        case OP_DIV:
            if (num_d(b) == 0) rfail(r, ints ? "division by zero" : "float division by zero");
            if (ints) return tv_float((double)a.i / (double)b.i);
            return tv_float(num_d(a) / num_d(b));
        case OP_FLOORDIV:
            if (ints) {
                if (b.i == 0) rfail(r, "integer division or modulo by zero");
                if (a.i == INT64_MIN && b.i == -1) int_overflow(r);
                int64_t q = a.i / b.i;
                if ((a.i % b.i != 0) && ((a.i < 0) != (b.i < 0))) q--;
                return tv_int(q);
            }
            if (num_d(b) == 0) rfail(r, "float floor division by zero");
            return tv_float(py_floordiv(num_d(a), num_d(b)));
        case OP_MOD:
            if (ints) {
                if (b.i == 0) rfail(r, "integer modulo by zero");
                if (b.i == -1) return tv_int(0);
                int64_t m = a.i % b.i;
                if (m != 0 && ((m < 0) != (b.i < 0))) m += b.i;
                return tv_int(m);
            }
            if (num_d(b) == 0) rfail(r, "float modulo");
            return tv_float(py_fmod(num_d(a), num_d(b)));
        case OP_POW:
            if (ints && b.i >= 0) {
                int64_t base = a.i, e = b.i, res = 1;
                while (e > 0) {
                    if (e & 1)
                        if (mul_ovf(res, base, &res)) int_overflow(r);
                    e >>= 1;
                    if (e && mul_ovf(base, base, &base)) {
                        if (base != 0) int_overflow(r);
                    }
                }
                return tv_int(res);
            }
            {
                double x = num_d(a), y = num_d(b);
                if (x == 0 && y < 0) rfail(r, "0.0 cannot be raised to a negative power");
                if (x < 0 && y != floor(y)) rfail_code(r, AG_ERR_UNSUPPORTED, "unsupported: complex result of **");
                double p = pow(x, y);
                if (isinf(p) && !isinf(x) && !isinf(y)) rfail(r, "(34, 'Numerical result out of range')");
                return tv_float(p);
            }
        }
    }
    if (op == OP_ADD) {
        if (a.t == TV_STR && b.t == TV_STR) {
            bool sa = a.f & TVF_SAFE, sb = b.f & TVF_SAFE;
            ag_buf *buf = buf_get(r);
            if (sa || sb) { /* Markup + str escapes the plain side */
                if (sa) buf_add(r, buf, a.s->s, a.s->len);
                else write_html_escaped(r, buf, a.s->s, a.s->len);
                if (sb) buf_add(r, buf, b.s->s, b.s->len);
                else write_html_escaped(r, buf, b.s->s, b.s->len);
                return buf_finish(r, buf, true);
            }
            buf_add(r, buf, a.s->s, a.s->len);
            buf_add(r, buf, b.s->s, b.s->len);
            return buf_finish(r, buf, false);
        }
        if (a.t == TV_LIST && b.t == TV_LIST && TV_LK(a) == TV_LK(b) && (TV_LK(a) == LK_LIST || TV_LK(a) == LK_TUPLE)) {
            tlist *l = mklist(r, a.l->n + b.l->n);
            memcpy(l->v, a.l->v, sizeof(tv) * a.l->n);
            memcpy(l->v + a.l->n, b.l->v, sizeof(tv) * b.l->n);
            return tv_list_kind(l, TV_LK(a));
        }
        if (a.t == TV_STR && !(a.f & TVF_SAFE))
            rfail(r, "can only concatenate str (not \"%s\") to str", tv_type_name(b));
        if (a.t == TV_LIST && (TV_LK(a) == LK_LIST || TV_LK(a) == LK_TUPLE))
            rfail(r, "can only concatenate %s (not \"%s\") to %s", tv_type_name(a), tv_type_name(b), tv_type_name(a));
    }
    if (op == OP_MUL) {
        /* CPython falls back to sequence repetition, which wants an int */
        bool seq_a = a.t == TV_STR || (a.t == TV_LIST && (TV_LK(a) == LK_LIST || TV_LK(a) == LK_TUPLE));
        bool seq_b = b.t == TV_STR || (b.t == TV_LIST && (TV_LK(b) == LK_LIST || TV_LK(b) == LK_TUPLE));
        if (seq_a && is_intlike(b)) return repeat(r, a, b.i);
        if (seq_b && is_intlike(a)) return repeat(r, b, a.i);
        /* Markup's __mul__ hands a non-int straight to str.__mul__ */
        if (a.t == TV_STR && (a.f & TVF_SAFE)) rfail(r, "'%s' object cannot be interpreted as an integer", tv_type_name(b));
        if (b.t == TV_STR && (b.f & TVF_SAFE)) rfail(r, "'%s' object cannot be interpreted as an integer", tv_type_name(a));
        if (seq_a) rfail(r, "can't multiply sequence by non-int of type '%s'", tv_type_name(b));
        if (seq_b) rfail(r, "can't multiply sequence by non-int of type '%s'", tv_type_name(a));
    }
    if (op == OP_MOD && a.t == TV_STR) {
        if (a.f & TVF_SAFE) {
            /* Markup % args escapes the arguments */
            tv args = b;
            if (b.t == TV_LIST && TV_LK(b) == LK_TUPLE) {
                tlist *l = mklist(r, b.l->n);
                for (size_t i = 0; i < b.l->n; i++) l->v[i] = b.l->v[i].t == TV_STR ? escape_tv(r, b.l->v[i]) : b.l->v[i];
                args = tv_list_kind(l, LK_TUPLE);
            } else if (b.t == TV_STR) args = escape_tv(r, b);
            tv res = str_percent_format(r, a, args);
            res.f |= TVF_SAFE;
            return res;
        }
        return str_percent_format(r, a, b);
    }
    rfail(r, "unsupported operand type(s) for %s: '%s' and '%s'", op_sym(op), tv_type_name(a), tv_type_name(b));
}

bool tv_contains(R *r, tv c, tv x) {
    switch (c.t) {
    case TV_UNDEF: return false;
    case TV_STR:
        if (x.t != TV_STR) rfail(r, "'in <string>' requires string as left operand, not %s", tv_type_name(x));
        return find_bytes(c.s->s, c.s->len, x.s->s, x.s->len) != NULL;
    case TV_LIST:
        for (size_t i = 0; i < c.l->n; i++)
            if (tv_eq(r, c.l->v[i], x, 0)) return true;
        return false;
    case TV_DICT: return dict_get(r, c.m, x) != NULL;
    case TV_GEN: {
        tv y;
        while (gen_next(r, c.g, &y))
            if (tv_eq(r, y, x, 0)) return true;
        return false;
    }
    case TV_LOOP: {
        tlist *items = tv_iterate(r, c);
        for (size_t i = 0; i < items->n; i++)
            if (tv_eq(r, items->v[i], x, 0)) return true;
        return false;
    }
    default: rfail(r, "argument of type '%s' is not iterable", tv_type_name(c));
    }
}

/* ================================================================ %-formatting */

static void fmt_pad(R *r, ag_buf *b, const char *s, size_t n, size_t ncp, int64_t width, bool left, char fill) {
    int64_t pad = width > (int64_t)ncp ? width - (int64_t)ncp : 0;
    if (pad > (int64_t)r->max_output) rfail_code(r, AG_ERR_RANGE, "output limit exceeded");
    if (!left)
        for (int64_t k = 0; k < pad; k++) buf_addc(r, b, fill);
    buf_add(r, b, s, n);
    if (left)
        for (int64_t k = 0; k < pad; k++) buf_addc(r, b, ' ');
}

static bool to_int_for_format(R *r, tv v, int64_t *out) {
    if (is_intlike(v)) {
        *out = v.i;
        return true;
    }
    if (v.t == TV_FLOAT) {
        if (!isfinite(v.d) || fabs(v.d) >= 9.2e18) rfail_code(r, AG_ERR_UNSUPPORTED, "unsupported: float too large for %%d");
        *out = (int64_t)v.d;
        return true;
    }
    return false;
}

tv str_percent_format(R *r, tv fmt, tv args) {
    const char *s = fmt.s->s;
    size_t      n = fmt.s->len;
    tv         *argv;
    size_t      argc, ai = 0;
    bool        is_tuple = args.t == TV_LIST && TV_LK(args) == LK_TUPLE;
    if (is_tuple) {
        argv = args.l->v;
        argc = args.l->n;
    } else {
        argv = &args;
        argc = 1;
    }
    bool    used_mapping = false;
    ag_buf *b = buf_get(r);
    for (size_t i = 0; i < n;) {
        if (s[i] != '%') {
            size_t st = i;
            while (i < n && s[i] != '%') i++;
            buf_add(r, b, s + st, i - st);
            continue;
        }
        i++;
        if (i >= n) rfail(r, "incomplete format");
        tv  arg = tv_missing();
        bool have_key = false;
        if (s[i] == '(') {
            size_t st = ++i;
            int    depth = 1;
            while (i < n && depth) {
                if (s[i] == '(') depth++;
                else if (s[i] == ')') depth--;
                if (depth) i++;
            }
            if (i >= n) rfail(r, "incomplete format key");
            if (args.t == TV_UNDEF) fail_undefined(r, args);
            if (args.t != TV_DICT) rfail(r, "format requires a mapping");
            tv *p = dict_get_str(r, args.m, s + st, i - st);
            if (!p) rfail(r, "'%.*s'", (int)(i - st), s + st);
            arg = *p;
            have_key = true;
            used_mapping = true;
            i++;
        }
        bool left = false, plus = false, space = false, alt = false, zero = false;
        for (; i < n; i++) {
            if (s[i] == '-') left = true;
            else if (s[i] == '+') plus = true;
            else if (s[i] == ' ') space = true;
            else if (s[i] == '#') alt = true;
            else if (s[i] == '0') zero = true;
            else break;
        }
        int64_t width = -1, prec = -1;
        if (i < n && s[i] == '*') {
            if (ai >= argc) rfail(r, "not enough arguments for format string");
            width = want_int(r, argv[ai++], NULL);
            if (width < 0) {
                left = true;
                width = -width;
            }
            i++;
        } else if (i < n && s[i] >= '0' && s[i] <= '9') {
            width = 0;
            while (i < n && s[i] >= '0' && s[i] <= '9') {
                width = width * 10 + (s[i++] - '0');
                if (width > 100000000) rfail_code(r, AG_ERR_RANGE, "format width too large");
            }
        }
        if (i < n && s[i] == '.') {
            i++;
            prec = 0;
            if (i < n && s[i] == '*') {
                if (ai >= argc) rfail(r, "not enough arguments for format string");
                prec = want_int(r, argv[ai++], NULL);
                i++;
            } else
                while (i < n && s[i] >= '0' && s[i] <= '9') {
                    prec = prec * 10 + (s[i++] - '0');
                    if (prec > 100000000) rfail_code(r, AG_ERR_RANGE, "format precision too large");
                }
        }
        while (i < n && (s[i] == 'h' || s[i] == 'l' || s[i] == 'L')) i++;
        if (i >= n) rfail(r, "incomplete format");
        char conv = s[i++];
        if (conv == '%') {
            buf_addc(r, b, '%');
            continue;
        }
        if (!have_key) {
            if (ai >= argc) rfail(r, "not enough arguments for format string");
            arg = argv[ai++];
        }
        char numfmt[32], tmp[512];
        if (arg.t == TV_UNDEF && conv != 's' && conv != 'r' && conv != 'a') fail_undefined(r, arg);
        switch (conv) {
        case 's':
        case 'r':
        case 'a': {
            tv sv;
            if (conv == 's') sv = tv_str(r, arg);
            else {
                ag_buf *rb = buf_get(r);
                tv_write_repr(r, rb, arg, 0);
                sv = buf_finish(r, rb, false);
            }
            size_t len = sv.s->len, ncp = sv.s->ncp;
            if (prec >= 0 && (size_t)prec < ncp) {
                len = cp_offset(sv.s, (size_t)prec);
                ncp = (size_t)prec;
            }
            fmt_pad(r, b, sv.s->s, len, ncp, width, left, ' ');
            break;
        }
        case 'c': {
            char   e[4];
            size_t k;
            if (arg.t == TV_STR) {
                if (arg.s->ncp != 1) rfail(r, "%%c requires int or char");
                fmt_pad(r, b, arg.s->s, arg.s->len, 1, width, left, ' ');
                break;
            }
            if (!is_intlike(arg)) rfail(r, "%%c requires int or char");
            if (arg.i < 0 || arg.i > 0x10FFFF || (arg.i >= 0xD800 && arg.i <= 0xDFFF))
                rfail(r, "%%c arg not in range(0x110000)");
            k = ag_utf8_encode((uint32_t)arg.i, e);
            fmt_pad(r, b, e, k, 1, width, left, ' ');
            break;
        }
        case 'd':
        case 'i':
        case 'u':
        case 'o':
        case 'x':
        case 'X': {
            int64_t iv;
            bool    ok = (conv == 'd' || conv == 'i' || conv == 'u') ? to_int_for_format(r, arg, &iv)
                                                                    : (is_intlike(arg) ? (iv = arg.i, true) : false);
            if (!ok) {
                if (arg.t == TV_UNDEF) fail_undefined(r, arg);
                if (conv == 'd' || conv == 'i' || conv == 'u')
                    rfail(r, "%%%c format: a real number is required, not %s", conv, tv_type_name(arg));
                rfail(r, "%%%c format: an integer is required, not %s", conv, tv_type_name(arg));
            }
            /* digits without sign, then sign/prefix/zero padding as Python */
            char     digits[400];
            uint64_t mag = iv < 0 ? (uint64_t)0 - (uint64_t)iv : (uint64_t)iv;
            if (conv == 'o') snprintf(digits, sizeof digits, "%llo", (unsigned long long)mag);
            else if (conv == 'x') snprintf(digits, sizeof digits, "%llx", (unsigned long long)mag);
            else if (conv == 'X') snprintf(digits, sizeof digits, "%llX", (unsigned long long)mag);
            else snprintf(digits, sizeof digits, "%llu", (unsigned long long)mag);
            if (prec >= 0) {
                size_t dl = strlen(digits);
                if ((size_t)prec > dl && prec < 200) {
                    char z[300];
                    memset(z, '0', (size_t)prec - dl);
                    memcpy(z + prec - dl, digits, dl + 1);
                    snprintf(digits, sizeof digits, "%s", z);
                }
            }
            char prefix[8] = "";
            size_t pl = 0;
            if (iv < 0) prefix[pl++] = '-';
            else if (plus) prefix[pl++] = '+';
            else if (space) prefix[pl++] = ' ';
            if (alt && conv == 'o') { prefix[pl++] = '0'; prefix[pl++] = 'o'; }
            if (alt && conv == 'x') { prefix[pl++] = '0'; prefix[pl++] = 'x'; }
            if (alt && conv == 'X') { prefix[pl++] = '0'; prefix[pl++] = 'X'; }
            prefix[pl] = 0;
            size_t dl = strlen(digits);
            if (zero && !left && width > (int64_t)(pl + dl)) {
                buf_add(r, b, prefix, pl);
                for (int64_t k = 0; k < width - (int64_t)(pl + dl); k++) buf_addc(r, b, '0');
                buf_add(r, b, digits, dl);
            } else {
                snprintf(tmp, sizeof tmp, "%s%s", prefix, digits);
                fmt_pad(r, b, tmp, strlen(tmp), strlen(tmp), width, left, ' ');
            }
            break;
        }
        case 'e': case 'E': case 'f': case 'F': case 'g': case 'G': {
            double d;
            if (arg.t == TV_UNDEF) fail_undefined(r, arg);
            if (is_num(arg)) d = num_d(arg);
            else rfail(r, "must be real number, not %s", tv_type_name(arg));
            if (prec > 300) rfail_code(r, AG_ERR_UNSUPPORTED, "unsupported: float precision above 300");
            snprintf(numfmt, sizeof numfmt, "%%%s%s%s%s%s*.*%c", left ? "-" : "", plus ? "+" : "", space ? " " : "",
                     alt ? "#" : "", zero ? "0" : "", conv);
            int w = width < 0 ? 0 : (int)(width > 400 ? 400 : width);
            int pr = prec < 0 ? 6 : (int)prec;
            char big[800];
            snprintf(big, sizeof big, numfmt, w, pr, d);
            if (width > 400) fmt_pad(r, b, big, strlen(big), strlen(big), width, left, zero ? '0' : ' ');
            else buf_adds(r, b, big);
            break;
        }
        default: rfail(r, "unsupported format character '%c' (0x%x) at index %zu", conv, (unsigned char)conv, i - 1);
        }
    }
    /* CPython skips this check when the argument is a "mapping" in the
     * PyMapping_Check sense: anything subscriptable but a tuple or str */
    bool mapping_like = !is_tuple && (args.t == TV_DICT || args.t == TV_UNDEF || (args.t == TV_LIST && TV_LK(args) != LK_REVITER &&
                                                            TV_LK(args) != LK_ITEMS && TV_LK(args) != LK_KEYS &&
                                                            TV_LK(args) != LK_VALUES));
    if (!used_mapping && ai < argc && !mapping_like)
        rfail(r, "not all arguments converted during string formatting");
    return buf_finish(r, b, false);
}

/* ================================================================ str.format */

static void format_spec(R *r, ag_buf *b, tv v, const char *spec, size_t sn) {
    if (sn == 0) {
        tv_write_str(r, b, v);
        return;
    }
    /* [[fill]align][sign][z][#][0][width][grouping][.precision][type] */
    size_t i = 0;
    char   fill[5] = " ";
    size_t filln = 1;
    char   align = 0, sign = '-', type = 0, grouping = 0;
    bool   alt = false, zero = false;
    int64_t width = -1, prec = -1;
    {
        size_t k = 0;
        uint32_t c = sn ? tm_utf8_next(spec, sn, &k) : 0;
        (void)c;
        if (k < sn && (spec[k] == '<' || spec[k] == '>' || spec[k] == '^' || spec[k] == '=')) {
            memcpy(fill, spec, k);
            filln = k;
            fill[k] = 0;
            align = spec[k];
            i = k + 1;
        } else if (spec[0] == '<' || spec[0] == '>' || spec[0] == '^' || spec[0] == '=') {
            align = spec[0];
            i = 1;
        }
    }
    if (i < sn && (spec[i] == '+' || spec[i] == '-' || spec[i] == ' ')) sign = spec[i++];
    if (i < sn && spec[i] == '#') {
        alt = true;
        i++;
    }
    if (i < sn && spec[i] == '0') {
        zero = true;
        i++;
    }
    while (i < sn && spec[i] >= '0' && spec[i] <= '9') {
        if (width < 0) width = 0;
        width = width * 10 + (spec[i++] - '0');
        if (width > 100000000) rfail_code(r, AG_ERR_RANGE, "format width too large");
    }
    if (i < sn && (spec[i] == ',' || spec[i] == '_')) grouping = spec[i++];
    if (i < sn && spec[i] == '.') {
        i++;
        prec = 0;
        if (i >= sn || spec[i] < '0' || spec[i] > '9') rfail(r, "Format specifier missing precision");
        while (i < sn && spec[i] >= '0' && spec[i] <= '9') {
            prec = prec * 10 + (spec[i++] - '0');
            if (prec > 1000) rfail_code(r, AG_ERR_UNSUPPORTED, "unsupported: format precision above 1000");
        }
    }
    if (i < sn) type = spec[i++];
    if (i < sn) rfail(r, "Invalid format specifier");
    if (grouping) rfail_code(r, AG_ERR_UNSUPPORTED, "unsupported: digit grouping in a format spec");
    if (zero && !align) {
        align = '=';
        fill[0] = '0';
        fill[1] = 0;
        filln = 1;
    }
    char    tmp[1200];
    tv      text;
    bool    numeric = false;
    if (v.t == TV_STR) {
        if (type && type != 's') rfail(r, "Unknown format code '%c' for object of type 'str'", type);
        text = v;
        if (prec >= 0 && (size_t)prec < v.s->ncp) text = mkstr(r, v.s->s, cp_offset(v.s, (size_t)prec));
        if (!align) align = '<';
    } else if (is_intlike(v) && (type == 0 || strchr("dxXobcn", type))) {
        if (prec >= 0) rfail(r, "Precision not allowed in integer format specifier");
        if (type == 0 && v.t == TV_BOOL) {
            text = tv_str(r, v);
        } else {
            uint64_t mag = v.i < 0 ? (uint64_t)0 - (uint64_t)v.i : (uint64_t)v.i;
            char     digits[80] = "";
            switch (type) {
            case 'x': snprintf(digits, sizeof digits, "%s%llx", alt ? "0x" : "", (unsigned long long)mag); break;
            case 'X': snprintf(digits, sizeof digits, "%s%llX", alt ? "0X" : "", (unsigned long long)mag); break;
            case 'o': snprintf(digits, sizeof digits, "%s%llo", alt ? "0o" : "", (unsigned long long)mag); break;
            case 'b': {
                size_t o = 0;
                if (alt) {
                    digits[o++] = '0';
                    digits[o++] = 'b';
                }
                int top = 63;
                while (top > 0 && !((mag >> top) & 1)) top--;
                for (int k = top; k >= 0; k--) digits[o++] = (char)('0' + ((mag >> k) & 1));
                digits[o] = 0;
                break;
            }
            case 'c': {
                if (v.i < 0 || v.i > 0x10FFFF) rfail(r, "%%c arg not in range(0x110000)");
                char   e[5] = {0};
                size_t k = ag_utf8_encode((uint32_t)v.i, e);
                e[k] = 0;
                snprintf(digits, sizeof digits, "%s", e);
                mag = 0;
                break;
            }
            default: snprintf(digits, sizeof digits, "%llu", (unsigned long long)mag);
            }
            const char *sg = v.i < 0 ? "-" : sign == '+' ? "+" : sign == ' ' ? " " : "";
            snprintf(tmp, sizeof tmp, "%s%s", sg, digits);
            text = mkcstr(r, tmp);
            numeric = true;
        }
        if (!align) align = '>';
    } else if (is_num(v) && (type == 0 || strchr("eEfFgG%n", type))) {
        double d = num_d(v);
        if (type == 0 && prec < 0) {
            ag_buf *tb = buf_get(r);
            if (v.t == TV_FLOAT) write_float_repr(tb, d, r);
            else tv_write_str(r, tb, tv_float(d));
            text = buf_finish(r, tb, false);
            if (sign == '+' && !(d < 0) && !signbit(d)) text = str_percent_format(r, mkcstr(r, "+%s"), text);
            else if (sign == ' ' && !signbit(d)) text = str_percent_format(r, mkcstr(r, " %s"), text);
        } else {
            char   t = type ? type : 'g';
            double dv = d;
            if (t == '%') {
                dv = d * 100;
                t = 'f';
            }
            char f[32];
            snprintf(f, sizeof f, "%%%s%s.*%c", sign == '+' ? "+" : sign == ' ' ? " " : "", alt ? "#" : "",
                     t == 'n' ? 'g' : t);
            snprintf(tmp, sizeof tmp - 2, f, (int)(prec < 0 ? 6 : prec), dv);
            if (type == '%') strcat(tmp, "%");
            text = mkcstr(r, tmp);
        }
        numeric = true;
        if (!align) align = '>';
    } else {
        rfail(r, "unsupported format string passed to %s.__format__", tv_type_name(v));
    }
    (void)numeric;
    int64_t len = (int64_t)text.s->ncp;
    if (width <= len) {
        buf_add(r, b, text.s->s, text.s->len);
        return;
    }
    int64_t pad = width - len, left = 0, right = 0;
    if (align == '<') right = pad;
    else if (align == '^') {
        left = pad / 2;
        right = pad - left;
    } else left = pad;
    if (align == '=') {
        /* padding after the sign */
        size_t sl = (text.s->len && strchr("+- ", text.s->s[0])) ? 1 : 0;
        buf_add(r, b, text.s->s, sl);
        for (int64_t k = 0; k < left; k++) buf_add(r, b, fill, filln);
        buf_add(r, b, text.s->s + sl, text.s->len - sl);
        return;
    }
    for (int64_t k = 0; k < left; k++) buf_add(r, b, fill, filln);
    buf_add(r, b, text.s->s, text.s->len);
    for (int64_t k = 0; k < right; k++) buf_add(r, b, fill, filln);
}

static tv kwarg_by_name(R *r, targs *a, const char *s, size_t n, bool *found) {
    for (int k = 0; k < a->nkw; k++) {
        const tstr *kn = name_str(r, a->kwid[k]);
        if (kn->len == n && memcmp(kn->s, s, n) == 0) {
            *found = true;
            return a->kwv[k];
        }
    }
    *found = false;
    return tv_missing();
}

static tv str_dot_format(R *r, tv fmt, targs *a) {
    const char *s = fmt.s->s;
    size_t      n = fmt.s->len;
    ag_buf     *b = buf_get(r);
    int         auto_idx = 0;
    bool        used_auto = false, used_manual = false;
    for (size_t i = 0; i < n;) {
        char c = s[i];
        if (c == '{' && i + 1 < n && s[i + 1] == '{') {
            buf_addc(r, b, '{');
            i += 2;
            continue;
        }
        if (c == '}' && i + 1 < n && s[i + 1] == '}') {
            buf_addc(r, b, '}');
            i += 2;
            continue;
        }
        if (c == '}') rfail(r, "Single '}' encountered in format string");
        if (c != '{') {
            size_t st = i;
            while (i < n && s[i] != '{' && s[i] != '}') i++;
            buf_add(r, b, s + st, i - st);
            continue;
        }
        size_t st = ++i;
        int    depth = 1;
        while (i < n) {
            if (s[i] == '{') depth++;
            else if (s[i] == '}' && --depth == 0) break;
            i++;
        }
        if (i >= n) rfail(r, "expected '}' before end of string");
        const char *field = s + st;
        size_t      fn = i - st;
        i++;
        /* split field_name ! conv : spec */
        size_t name_end = 0;
        while (name_end < fn && field[name_end] != '!' && field[name_end] != ':') name_end++;
        char        conv = 0;
        const char *spec = "";
        size_t      specn = 0;
        size_t      p = name_end;
        if (p < fn && field[p] == '!') {
            if (p + 1 >= fn) rfail(r, "end of string while looking for conversion specifier");
            conv = field[p + 1];
            p += 2;
            if (p < fn && field[p] != ':') rfail(r, "expected ':' after conversion specifier");
        }
        if (p < fn && field[p] == ':') {
            spec = field + p + 1;
            specn = fn - p - 1;
            if (memchr(spec, '{', specn)) rfail_code(r, AG_ERR_UNSUPPORTED, "unsupported: nested replacement fields in a format spec");
        }
        /* first part of the name: index or keyword */
        size_t k = 0;
        while (k < name_end && field[k] != '.' && field[k] != '[') k++;
        tv val;
        if (k == 0) {
            if (used_manual) rfail(r, "cannot switch from manual field specification to automatic field numbering");
            used_auto = true;
            if (auto_idx >= a->npos) rfail(r, "Replacement index %d out of range for positional args tuple", auto_idx);
            val = a->pos[auto_idx++];
        } else if (field[0] >= '0' && field[0] <= '9') {
            int64_t idx = 0;
            for (size_t q = 0; q < k; q++) {
                if (field[q] < '0' || field[q] > '9') rfail(r, "invalid format field");
                idx = idx * 10 + (field[q] - '0');
                if (idx > 1000000) rfail(r, "Too many decimal digits in format string");
            }
            if (used_auto) rfail(r, "cannot switch from automatic field numbering to manual field specification");
            used_manual = true;
            if (idx >= a->npos) rfail(r, "Replacement index %lld out of range for positional args tuple", (long long)idx);
            val = a->pos[idx];
        } else {
            bool found;
            val = kwarg_by_name(r, a, field, k, &found);
            if (!found) rfail(r, "'%.*s'", (int)k, field);
        }
        /* .attr and [key] chains */
        while (k < name_end) {
            if (field[k] == '.') {
                size_t q = ++k;
                while (k < name_end && field[k] != '.' && field[k] != '[') k++;
                tv nm = mkstr(r, field + q, k - q);
                val = tv_getattr(r, val, nm.s);
                if (val.t == TV_UNDEF) fail_undefined(r, val);
            } else if (field[k] == '[') {
                size_t q = ++k;
                while (k < name_end && field[k] != ']') k++;
                if (k >= name_end) rfail(r, "Missing ']' in format string");
                bool    digits = k > q;
                int64_t idx = 0;
                for (size_t z = q; z < k; z++) {
                    if (field[z] < '0' || field[z] > '9') digits = false;
                    else if (idx < 1000000000) idx = idx * 10 + (field[z] - '0');
                }
                tv key = digits ? tv_int(idx) : mkstr(r, field + q, k - q);
                val = tv_getitem(r, val, key);
                if (val.t == TV_UNDEF) fail_undefined(r, val);
                k++;
            } else rfail(r, "Only '.' or '[' may follow ']' in format field specifier");
        }
        if (conv == 'r' || conv == 'a') {
            ag_buf *rb = buf_get(r);
            tv_write_repr(r, rb, val, 0);
            val = buf_finish(r, rb, false);
        } else if (conv == 's') val = tv_str(r, val);
        else if (conv) rfail(r, "Unknown conversion specifier %c", conv);
        if (val.t == TV_UNDEF && specn == 0) continue;
        format_spec(r, b, val, spec, specn);
    }
    return buf_finish(r, b, false);
}

/* ================================================================ methods */

enum {
    /* str */
    M_STARTSWITH, M_ENDSWITH, M_STRIP, M_LSTRIP, M_RSTRIP, M_SPLIT, M_RSPLIT, M_SPLITLINES, M_UPPER, M_LOWER,
    M_TITLE, M_CAPITALIZE, M_SWAPCASE, M_CASEFOLD, M_REPLACE, M_FIND, M_RFIND, M_INDEX_S, M_RINDEX, M_COUNT_S,
    M_JOIN, M_FORMAT, M_ISDIGIT, M_ISALPHA, M_ISALNUM, M_ISSPACE, M_ISLOWER, M_ISUPPER, M_ISNUMERIC, M_ISDECIMAL,
    M_ISTITLE, M_ISASCII, M_ZFILL, M_CENTER, M_LJUST, M_RJUST, M_PARTITION, M_RPARTITION, M_REMOVEPREFIX,
    M_REMOVESUFFIX, M_EXPANDTABS,
    M_STR_UNSUPPORTED,
    /* dict */
    M_GET, M_ITEMS, M_KEYS, M_VALUES, M_DICT_COPY,
    /* list / tuple */
    M_LIST_INDEX, M_LIST_COUNT, M_LIST_COPY,
};

static const struct {
    const char *name;
    int         id;
} str_methods[] = {
    {"startswith", M_STARTSWITH}, {"endswith", M_ENDSWITH},   {"strip", M_STRIP},
    {"lstrip", M_LSTRIP},         {"rstrip", M_RSTRIP},       {"split", M_SPLIT},
    {"rsplit", M_RSPLIT},         {"splitlines", M_SPLITLINES}, {"upper", M_UPPER},
    {"lower", M_LOWER},           {"title", M_TITLE},         {"capitalize", M_CAPITALIZE},
    {"swapcase", M_SWAPCASE},     {"casefold", M_CASEFOLD},   {"replace", M_REPLACE},
    {"find", M_FIND},             {"rfind", M_RFIND},         {"index", M_INDEX_S},
    {"rindex", M_RINDEX},         {"count", M_COUNT_S},       {"join", M_JOIN},
    {"format", M_FORMAT},         {"isdigit", M_ISDIGIT},     {"isalpha", M_ISALPHA},
    {"isalnum", M_ISALNUM},       {"isspace", M_ISSPACE},     {"islower", M_ISLOWER},
    {"isupper", M_ISUPPER},       {"isnumeric", M_ISNUMERIC}, {"isdecimal", M_ISDECIMAL},
    {"istitle", M_ISTITLE},       {"isascii", M_ISASCII},     {"zfill", M_ZFILL},
    {"center", M_CENTER},         {"ljust", M_LJUST},         {"rjust", M_RJUST},
    {"partition", M_PARTITION},   {"rpartition", M_RPARTITION}, {"removeprefix", M_REMOVEPREFIX},
    {"removesuffix", M_REMOVESUFFIX}, {"expandtabs", M_EXPANDTABS},
    /* Python has these; we do not implement them */
    {"encode", M_STR_UNSUPPORTED}, {"format_map", M_STR_UNSUPPORTED}, {"isidentifier", M_STR_UNSUPPORTED},
    {"isprintable", M_STR_UNSUPPORTED}, {"maketrans", M_STR_UNSUPPORTED}, {"translate", M_STR_UNSUPPORTED},
};

static tv bound(R *r, tv self, int id, const char *mname) {
    tfunc *f = ralloc(r, sizeof *f);
    f->kind = FN_METHOD;
    f->id = id;
    f->self = self;
    f->mname = mname;
    tv v = {.t = TV_FUNC};
    v.fn = f;
    return v;
}

static tv unsafe(R *r, tv obj, const tstr *name) {
    char *hint = ralloc(r, name->len + 96);
    snprintf(hint, name->len + 96, "access to attribute '%s' of '%s' object is unsafe.", name->s, tv_type_name(obj));
    return make_undef(r, hint, false, tv_none(), tv_none());
}

bool method_lookup(R *r, tv obj, const tstr *name, tv *out) {
    const char *s = name->s;
    if (obj.t == TV_STR) {
        for (size_t i = 0; i < sizeof str_methods / sizeof str_methods[0]; i++)
            if (!strcmp(s, str_methods[i].name)) {
                *out = bound(r, obj, str_methods[i].id, str_methods[i].name);
                return true;
            }
        return false;
    }
    if (obj.t == TV_DICT) {
        if (!strcmp(s, "get")) *out = bound(r, obj, M_GET, s);
        else if (!strcmp(s, "items")) *out = bound(r, obj, M_ITEMS, s);
        else if (!strcmp(s, "keys")) *out = bound(r, obj, M_KEYS, s);
        else if (!strcmp(s, "values")) *out = bound(r, obj, M_VALUES, s);
        else if (!strcmp(s, "copy")) *out = bound(r, obj, M_DICT_COPY, s);
        else if (!strcmp(s, "update") || !strcmp(s, "pop") || !strcmp(s, "popitem") || !strcmp(s, "setdefault") ||
                 !strcmp(s, "clear"))
            *out = unsafe(r, obj, name);
        else return false;
        return true;
    }
    if (obj.t == TV_LIST) {
        int k = TV_LK(obj);
        if (k != LK_LIST && k != LK_TUPLE) return false;
        if (!strcmp(s, "index")) *out = bound(r, obj, M_LIST_INDEX, s);
        else if (!strcmp(s, "count")) *out = bound(r, obj, M_LIST_COUNT, s);
        else if (k == LK_LIST && !strcmp(s, "copy")) *out = bound(r, obj, M_LIST_COPY, s);
        else if (k == LK_LIST && (!strcmp(s, "append") || !strcmp(s, "extend") || !strcmp(s, "insert") ||
                                  !strcmp(s, "pop") || !strcmp(s, "remove") || !strcmp(s, "reverse") ||
                                  !strcmp(s, "sort") || !strcmp(s, "clear")))
            *out = unsafe(r, obj, name);
        else return false;
        return true;
    }
    return false;
}

static bool prefix_match(R *r, const tstr *s, tv prefix, size_t a, size_t b, bool suffix, const char *fname) {
    if (prefix.t == TV_LIST && TV_LK(prefix) == LK_TUPLE) {
        for (size_t i = 0; i < prefix.l->n; i++)
            if (prefix_match(r, s, prefix.l->v[i], a, b, suffix, fname)) return true;
        return false;
    }
    if (prefix.t == TV_UNDEF) fail_undefined(r, prefix);
    if (prefix.t != TV_STR)
        rfail(r, "%s first arg must be str or a tuple of str, not %s", fname, tv_type_name(prefix));
    size_t n = prefix.s->len;
    if (b - a < n) return false;
    return memcmp(s->s + (suffix ? b - n : a), prefix.s->s, n) == 0;
}

static tv str_is(R *r, tv self, int id) {
    const tstr *s = self.s;
    if (s->len == 0) return tv_bool(false);
    size_t i = 0;
    bool   cased = false, ok = true, prev_cased = false, title_ok = true;
    while (i < s->len && ok) {
        uint32_t c = tm_utf8_next(s->s, s->len, &i);
        switch (id) {
        case M_ISDIGIT: ok = is_numeric(c) && utf8proc_category((utf8proc_int32_t)c) != UTF8PROC_CATEGORY_NL &&
                             (is_decimal(c) || utf8proc_category((utf8proc_int32_t)c) == UTF8PROC_CATEGORY_NO);
            break;
        case M_ISDECIMAL: ok = is_decimal(c); break;
        case M_ISNUMERIC: ok = is_numeric(c); break;
        case M_ISALPHA: ok = is_alpha(c); break;
        case M_ISALNUM: ok = is_alpha(c) || is_numeric(c); break;
        case M_ISSPACE: ok = tm_py_isspace(c); break;
        case M_ISASCII: ok = c < 0x80; break;
        case M_ISLOWER:
        case M_ISUPPER: {
            utf8proc_category_t k = utf8proc_category((utf8proc_int32_t)c);
            if (k == UTF8PROC_CATEGORY_LU || k == UTF8PROC_CATEGORY_LT) {
                cased = true;
                if (id == M_ISLOWER) ok = false;
            } else if (k == UTF8PROC_CATEGORY_LL) {
                cased = true;
                if (id == M_ISUPPER) ok = false;
            }
            break;
        }
        case M_ISTITLE: {
            utf8proc_category_t k = utf8proc_category((utf8proc_int32_t)c);
            if (k == UTF8PROC_CATEGORY_LU || k == UTF8PROC_CATEGORY_LT) {
                if (prev_cased) title_ok = false;
                prev_cased = true;
                cased = true;
            } else if (k == UTF8PROC_CATEGORY_LL) {
                if (!prev_cased) title_ok = false;
                prev_cased = true;
                cased = true;
            } else prev_cased = false;
            break;
        }
        }
    }
    if (id == M_ISLOWER || id == M_ISUPPER) return tv_bool(ok && cased);
    if (id == M_ISTITLE) return tv_bool(title_ok && cased);
    if (id == M_ISASCII) return tv_bool(ok);
    return tv_bool(ok);
}

static tv find_method(R *r, tv self, targs *a, int id, const char *fname) {
    static const char *const names[] = {"sub", "start", "end"};
    tv                       p[3];
    bind(r, fname, a, names, 3, p);
    if (is_missing(p[0])) rfail(r, "%s() takes at least 1 argument (0 given)", fname);
    const tstr *sub = want_str(r, p[0], fname);
    size_t      lo, hi;
    sub_range(r, self.s, p[1], p[2], &lo, &hi);
    const char *base = self.s->s;
    if (id == M_COUNT_S) {
        if (sub->len == 0) return tv_int((int64_t)cp_count(base + lo, hi - lo) + 1);
        int64_t     cnt = 0;
        const char *q = base + lo, *end = base + hi;
        while ((q = find_bytes(q, (size_t)(end - q), sub->s, sub->len))) {
            cnt++;
            q += sub->len;
        }
        return tv_int(cnt);
    }
    const char *q = (id == M_FIND || id == M_INDEX_S) ? find_bytes(base + lo, hi - lo, sub->s, sub->len)
                                                      : rfind_bytes(base + lo, hi - lo, sub->s, sub->len);
    if (!q) {
        if (id == M_INDEX_S || id == M_RINDEX) rfail(r, "substring not found");
        return tv_int(-1);
    }
    return tv_int((int64_t)cp_count(base, (size_t)(q - base)));
}

tv call_method(R *r, tfunc *f, targs *a) {
    tv   self = f->self;
    int  id = f->id;
    bool safe = self.t == TV_STR && (self.f & TVF_SAFE);
    tv   p[4];
    switch (id) {
    case M_STARTSWITH:
    case M_ENDSWITH: {
        static const char *const names[] = {"prefix", "start", "end"};
        const char *fname = id == M_STARTSWITH ? "startswith" : "endswith";
        bind(r, fname, a, names, 3, p);
        if (is_missing(p[0])) rfail(r, "%s() takes at least 1 argument (0 given)", fname);
        size_t lo, hi;
        sub_range(r, self.s, p[1], p[2], &lo, &hi);
        return tv_bool(prefix_match(r, self.s, p[0], lo, hi, id == M_ENDSWITH, fname));
    }
    case M_STRIP:
    case M_LSTRIP:
    case M_RSTRIP: {
        static const char *const names[] = {"chars"};
        const char *fname = id == M_STRIP ? "strip" : id == M_LSTRIP ? "lstrip" : "rstrip";
        bind(r, fname, a, names, 1, p);
        return str_strip(r, self, opt_chars(r, p[0], fname), id != M_RSTRIP, id != M_LSTRIP);
    }
    case M_SPLIT:
    case M_RSPLIT: {
        static const char *const names[] = {"sep", "maxsplit"};
        bind(r, id == M_SPLIT ? "split" : "rsplit", a, names, 2, p);
        return str_split(r, self, p[0], p[1], id == M_RSPLIT);
    }
    case M_SPLITLINES: {
        static const char *const names[] = {"keepends"};
        bind(r, "splitlines", a, names, 1, p);
        return tv_of_list(str_splitlines(r, self.s, !is_missing(p[0]) && tv_truthy(r, p[0])), LK_LIST);
    }
    case M_UPPER: no_args(r, "upper", a); return str_case(r, self, CASE_UPPER);
    case M_LOWER: no_args(r, "lower", a); return str_case(r, self, CASE_LOWER);
    case M_CASEFOLD: {
        no_args(r, "casefold", a);
        ag_buf *b = buf_get(r);
        size_t  i = 0;
        while (i < self.s->len) {
            uint32_t         c = tm_utf8_next(self.s->s, self.s->len, &i);
            utf8proc_int32_t dst[8];
            int              last;
            utf8proc_ssize_t k = utf8proc_decompose_char((utf8proc_int32_t)c, dst, 8, UTF8PROC_CASEFOLD, &last);
            if (k < 0 || k > 8) put_cp(r, b, c);
            else
                for (utf8proc_ssize_t j = 0; j < k; j++) put_cp(r, b, (uint32_t)dst[j]);
        }
        return buf_finish(r, b, safe);
    }
    case M_TITLE: no_args(r, "title", a); return str_title_py(r, self);
    case M_CAPITALIZE: no_args(r, "capitalize", a); return str_capitalize(r, self);
    case M_SWAPCASE: no_args(r, "swapcase", a); return str_swapcase(r, self);
    case M_REPLACE: {
        static const char *const names[] = {"old", "new", "count"};
        bind(r, "replace", a, names, 3, p);
        if (is_missing(p[1])) rfail(r, "replace expected at least 2 arguments, got %d", a->npos + a->nkw);
        const tstr *o = want_str(r, p[0], "replace"), *nw = want_str(r, p[1], "replace");
        int64_t     cnt = is_missing(p[2]) ? -1 : want_int(r, p[2], NULL);
        return str_replace(r, self, o, nw, cnt, safe);
    }
    case M_FIND: return find_method(r, self, a, id, "find");
    case M_RFIND: return find_method(r, self, a, id, "rfind");
    case M_INDEX_S: return find_method(r, self, a, id, "index");
    case M_RINDEX: return find_method(r, self, a, id, "rindex");
    case M_COUNT_S: return find_method(r, self, a, id, "count");
    case M_JOIN: {
        static const char *const names[] = {"iterable"};
        bind(r, "join", a, names, 1, p);
        if (is_missing(p[0])) rfail(r, "join() takes exactly one argument (0 given)");
        if (p[0].t == TV_UNDEF) fail_undefined(r, p[0]);
        tlist  *items = tv_iterate(r, p[0]);
        ag_buf *b = buf_get(r);
        for (size_t i = 0; i < items->n; i++) {
            if (items->v[i].t != TV_STR)
                rfail(r, "sequence item %zu: expected str instance, %s found", i, tv_type_name(items->v[i]));
            if (i) buf_add(r, b, self.s->s, self.s->len);
            buf_add(r, b, items->v[i].s->s, items->v[i].s->len);
        }
        return buf_finish(r, b, safe);
    }
    case M_FORMAT: return str_dot_format(r, self, a);
    case M_ISDIGIT: case M_ISALPHA: case M_ISALNUM: case M_ISSPACE: case M_ISLOWER: case M_ISUPPER:
    case M_ISNUMERIC: case M_ISDECIMAL: case M_ISTITLE: case M_ISASCII:
        no_args(r, "is*", a);
        if (id == M_ISASCII && self.s->len == 0) return tv_bool(true);
        return str_is(r, self, id);
    case M_ZFILL: {
        static const char *const names[] = {"width"};
        bind(r, "zfill", a, names, 1, p);
        if (is_missing(p[0])) rfail(r, "zfill() takes exactly one argument (0 given)");
        int64_t w = want_int(r, p[0], NULL), len = (int64_t)self.s->ncp;
        if (w <= len) return self;
        if (w > (int64_t)r->max_output) rfail_code(r, AG_ERR_RANGE, "output limit exceeded");
        ag_buf *b = buf_get(r);
        size_t  sg = (self.s->len && (self.s->s[0] == '+' || self.s->s[0] == '-')) ? 1 : 0;
        buf_add(r, b, self.s->s, sg);
        for (int64_t k = 0; k < w - len; k++) buf_addc(r, b, '0');
        buf_add(r, b, self.s->s + sg, self.s->len - sg);
        return buf_finish(r, b, safe);
    }
    case M_CENTER:
    case M_LJUST:
    case M_RJUST: {
        static const char *const names[] = {"width", "fillchar"};
        bind(r, id == M_CENTER ? "center" : id == M_LJUST ? "ljust" : "rjust", a, names, 2, p);
        if (is_missing(p[0])) rfail(r, "expected at least 1 argument, got 0");
        const char *fill = " ";
        size_t      filln = 1;
        if (!is_missing(p[1])) {
            const tstr *fc = want_str(r, p[1], "fillchar");
            if (fc->ncp != 1) rfail(r, "The fill character must be exactly one character long");
            fill = fc->s;
            filln = fc->len;
        }
        return pad_str(r, self, want_int(r, p[0], NULL), id == M_CENTER ? '^' : id == M_LJUST ? '<' : '>', fill,
                       filln);
    }
    case M_PARTITION:
    case M_RPARTITION: {
        static const char *const names[] = {"sep"};
        bind(r, "partition", a, names, 1, p);
        if (is_missing(p[0])) rfail(r, "partition() takes exactly one argument (0 given)");
        const tstr *sep = want_str(r, p[0], "partition");
        if (!sep->len) rfail(r, "empty separator");
        const char *q = id == M_PARTITION ? find_bytes(self.s->s, self.s->len, sep->s, sep->len)
                                          : rfind_bytes(self.s->s, self.s->len, sep->s, sep->len);
        tlist *l = mklist(r, 3);
        if (!q) {
            tv empty = mkstr_safe(r, "", 0, safe);
            if (id == M_PARTITION) {
                l->v[0] = self;
                l->v[1] = l->v[2] = empty;
            } else {
                l->v[0] = l->v[1] = empty;
                l->v[2] = self;
            }
        } else {
            size_t at = (size_t)(q - self.s->s);
            l->v[0] = mkstr_safe(r, self.s->s, at, safe);
            l->v[1] = mkstr_safe(r, sep->s, sep->len, safe);
            l->v[2] = mkstr_safe(r, q + sep->len, self.s->len - at - sep->len, safe);
        }
        return tv_of_list(l, LK_TUPLE);
    }
    case M_REMOVEPREFIX:
    case M_REMOVESUFFIX: {
        static const char *const names[] = {"affix"};
        bind(r, id == M_REMOVEPREFIX ? "removeprefix" : "removesuffix", a, names, 1, p);
        if (is_missing(p[0])) rfail(r, "takes exactly one argument (0 given)");
        const tstr *x = want_str(r, p[0], "removeprefix");
        if (x->len <= self.s->len) {
            if (id == M_REMOVEPREFIX && memcmp(self.s->s, x->s, x->len) == 0)
                return mkstr_safe(r, self.s->s + x->len, self.s->len - x->len, safe);
            if (id == M_REMOVESUFFIX && x->len && memcmp(self.s->s + self.s->len - x->len, x->s, x->len) == 0)
                return mkstr_safe(r, self.s->s, self.s->len - x->len, safe);
        }
        return self;
    }
    case M_EXPANDTABS: {
        static const char *const names[] = {"tabsize"};
        bind(r, "expandtabs", a, names, 1, p);
        int64_t ts = is_missing(p[0]) ? 8 : want_int(r, p[0], NULL);
        ag_buf *b = buf_get(r);
        int64_t col = 0;
        size_t  i = 0;
        while (i < self.s->len) {
            size_t   st = i;
            uint32_t c = tm_utf8_next(self.s->s, self.s->len, &i);
            if (c == '\t') {
                if (ts > 0) {
                    int64_t sp = ts - col % ts;
                    if (sp > (int64_t)r->max_output) rfail_code(r, AG_ERR_RANGE, "output limit exceeded");
                    for (int64_t k = 0; k < sp; k++) buf_addc(r, b, ' ');
                    col += sp;
                }
            } else {
                buf_add(r, b, self.s->s + st, i - st);
                col = (c == '\n' || c == '\r') ? 0 : col + 1;
            }
        }
        return buf_finish(r, b, safe);
    }
    case M_STR_UNSUPPORTED: rfail_code(r, AG_ERR_UNSUPPORTED, "unsupported: this str method");
    case M_GET: {
        static const char *const names[] = {"key", "default"};
        bind(r, "get", a, names, 2, p);
        if (is_missing(p[0])) rfail(r, "get expected at least 1 argument, got 0");
        if (p[0].t == TV_LIST && TV_LK(p[0]) != LK_TUPLE) rfail(r, "unhashable type: '%s'", tv_type_name(p[0]));
        if (p[0].t == TV_DICT) rfail(r, "unhashable type: 'dict'");
        tv *x = dict_get(r, self.m, p[0]);
        if (x) return *x;
        return is_missing(p[1]) ? tv_none() : p[1];
    }
    case M_ITEMS:
    case M_KEYS:
    case M_VALUES: {
        no_args(r, id == M_ITEMS ? "items" : id == M_KEYS ? "keys" : "values", a);
        tlist *l = mklist(r, self.m->n);
        for (size_t i = 0; i < self.m->n; i++) {
            if (id == M_KEYS) l->v[i] = self.m->k[i];
            else if (id == M_VALUES) l->v[i] = self.m->v[i];
            else {
                tlist *pair = mklist(r, 2);
                pair->v[0] = self.m->k[i];
                pair->v[1] = self.m->v[i];
                l->v[i] = tv_of_list(pair, LK_TUPLE);
            }
        }
        return tv_of_list(l, id == M_ITEMS ? LK_ITEMS : id == M_KEYS ? LK_KEYS : LK_VALUES);
    }
    case M_DICT_COPY: {
        no_args(r, "copy", a);
        tdict *d = dict_new(r, self.m->n);
        for (size_t i = 0; i < self.m->n; i++) dict_set(r, d, self.m->k[i], self.m->v[i]);
        return dict_tv(d);
    }
    case M_LIST_INDEX:
    case M_LIST_COUNT: {
        static const char *const names[] = {"value", "start", "stop"};
        bind(r, id == M_LIST_INDEX ? "index" : "count", a, names, id == M_LIST_INDEX ? 3 : 1, p);
        if (is_missing(p[0])) rfail(r, "expected 1 argument, got 0");
        int64_t cnt = 0;
        for (size_t i = 0; i < self.l->n; i++)
            if (tv_eq(r, self.l->v[i], p[0], 0)) {
                if (id == M_LIST_INDEX) return tv_int((int64_t)i);
                cnt++;
            }
        if (id == M_LIST_INDEX) {
            ag_buf *b = buf_get(r);
            tv_write_repr(r, b, p[0], 0);
            tv m = buf_finish(r, b, false);
            rfail(r, "%s is not in %s", m.s->s, TV_LK(self) == LK_TUPLE ? "tuple" : "list");
        }
        return tv_int(cnt);
    }
    case M_LIST_COPY: {
        no_args(r, "copy", a);
        tlist *l = mklist(r, self.l->n);
        memcpy(l->v, self.l->v, sizeof(tv) * self.l->n);
        return tv_of_list(l, LK_LIST);
    }
    }
    rfail_code(r, AG_ERR_INTERNAL, "internal error: unknown method");
}

/* ================================================================ globals */

static tv ns_from(R *r, targs *a, const char *fname) {
    tdict *d = dict_new(r, 4);
    if (a->npos > 1) rfail(r, "%s expected at most 1 argument, got %d", fname, a->npos);
    if (a->npos == 1) {
        tv src = a->pos[0];
        if (src.t == TV_DICT) {
            for (size_t i = 0; i < src.m->n; i++) dict_set(r, d, src.m->k[i], src.m->v[i]);
        } else {
            if (src.t == TV_UNDEF) fail_undefined(r, src);
            tlist *items = tv_iterate(r, src);
            for (size_t i = 0; i < items->n; i++) {
                tv it = items->v[i];
                if (it.t != TV_LIST && it.t != TV_STR)
                    rfail(r, "cannot convert dictionary update sequence element #%zu to a sequence", i);
                tlist *pair = tv_iterate(r, it);
                if (pair->n != 2)
                    rfail(r, "dictionary update sequence element #%zu has length %zu; 2 is required", i, pair->n);
                dict_set(r, d, pair->v[0], pair->v[1]);
            }
        }
    }
    for (int k = 0; k < a->nkw; k++) {
        const tstr *kn = name_str(r, a->kwid[k]);
        dict_set(r, d, mkstr(r, kn->s, kn->len), a->kwv[k]);
    }
    return dict_tv(d);
}

tv call_global(R *r, int id, targs *a) {
    switch (id) {
    case GL_RANGE: {
        if (a->nkw) rfail(r, "range() takes no keyword arguments");
        if (a->npos < 1 || a->npos > 3) rfail(r, "range expected at least 1 argument, got %d", a->npos);
        int64_t start = 0, stop, stp = 1;
        if (a->npos == 1) stop = want_int(r, a->pos[0], NULL);
        else {
            start = want_int(r, a->pos[0], NULL);
            stop = want_int(r, a->pos[1], NULL);
            if (a->npos == 3) stp = want_int(r, a->pos[2], NULL);
        }
        if (stp == 0) rfail(r, "range() arg 3 must not be zero");
        long double cnt = 0;
        if (stp > 0 && start < stop) cnt = ((long double)stop - start - 1) / stp + 1;
        else if (stp < 0 && start > stop) cnt = ((long double)start - stop - 1) / (-(long double)stp) + 1;
        if (cnt > 100000) rfail(r, "Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000).");
        size_t n = (size_t)cnt;
        tlist *l = mklist(r, n);
        for (size_t i = 0; i < n; i++) l->v[i] = tv_int(start + (int64_t)i * stp);
        l->r_start = start;
        l->r_stop = stop;
        l->r_step = stp;
        return tv_of_list(l, LK_RANGE);
    }
    case GL_NAMESPACE: {
        tv     d = ns_from(r, a, "namespace");
        tns   *ns = ralloc(r, sizeof *ns);
        ns->attrs = d.m;
        tv v = {.t = TV_NS};
        v.ns = ns;
        return v;
    }
    case GL_DICT: return ns_from(r, a, "dict");
    case GL_RAISE_EXCEPTION: {
        tv msg = a->npos ? a->pos[0] : (a->nkw ? a->kwv[0] : tv_missing());
        if (is_missing(msg)) rfail(r, "raise_exception() missing 1 required positional argument: 'message'");
        tv s = tv_str(r, msg);
        snprintf(r->err.msg, sizeof r->err.msg, "%s", s.s->s);
        r->err.code = AG_ERR_TEMPLATE;
        r->err.line = r->line;
        r->err.raw = true;
        longjmp(r->err.jb, 1);
    }
    case GL_STRFTIME_NOW: {
        static const char *const names[] = {"format"};
        tv                       p[1];
        bind(r, "strftime_now", a, names, 1, p);
        if (is_missing(p[0])) rfail(r, "strftime_now() missing 1 required positional argument: 'format'");
        const tstr *f = want_str(r, p[0], "strftime_now");
        if (memchr(f->s, 0, f->len)) rfail(r, "embedded null character");
        time_t    t = r->now >= 0 ? (time_t)r->now : time(NULL);
        struct tm tmv;
        localtime_r(&t, &tmv);
        size_t cap = f->len * 8 + 64;
        if (cap > 1 << 20) rfail_code(r, AG_ERR_RANGE, "strftime format too long");
        char  *out = ralloc(r, cap);
        size_t n = f->len ? strftime(out, cap, f->s, &tmv) : 0;
        return mkstr(r, out, n);
    }
    case GL_JOINER: {
        static const char *const names[] = {"sep"};
        tv                       p[1];
        bind(r, "joiner", a, names, 1, p);
        tfunc *f = ralloc(r, sizeof *f);
        f->kind = FN_JOINER;
        f->state = ralloc(r, sizeof(tv) * 2);
        f->state[0] = is_missing(p[0]) ? mkcstr(r, ", ") : p[0];
        f->state[1] = tv_int(0);
        tv v = {.t = TV_FUNC};
        v.fn = f;
        return v;
    }
    case GL_CYCLER: rfail_code(r, AG_ERR_UNSUPPORTED, "unsupported: cycler()");
    }
    rfail_code(r, AG_ERR_INTERNAL, "internal error: unknown global");
}

/* ================================================================ tests */

enum {
    TT_ODD, TT_EVEN, TT_DIVISIBLEBY, TT_DEFINED, TT_UNDEFINED, TT_FILTER, TT_TEST, TT_NONE, TT_BOOLEAN, TT_FALSE, TT_TRUE,
    TT_INTEGER, TT_FLOAT, TT_LOWER, TT_UPPER, TT_STRING, TT_MAPPING, TT_NUMBER, TT_SEQUENCE, TT_ITERABLE, TT_CALLABLE,
    TT_SAMEAS, TT_ESCAPED, TT_IN, TT_EQ, TT_NE, TT_GT, TT_GE, TT_LT, TT_LE, TT_COUNT
};

static const struct {
    const char *name;
    int         id;
} test_names[] = {
    {"odd", TT_ODD},         {"even", TT_EVEN},       {"divisibleby", TT_DIVISIBLEBY}, {"defined", TT_DEFINED},
    {"undefined", TT_UNDEFINED}, {"filter", TT_FILTER}, {"test", TT_TEST},           {"none", TT_NONE},
    {"boolean", TT_BOOLEAN}, {"false", TT_FALSE},     {"true", TT_TRUE},             {"integer", TT_INTEGER},
    {"float", TT_FLOAT},     {"lower", TT_LOWER},     {"upper", TT_UPPER},           {"string", TT_STRING},
    {"mapping", TT_MAPPING}, {"number", TT_NUMBER},   {"sequence", TT_SEQUENCE},     {"iterable", TT_ITERABLE},
    {"callable", TT_CALLABLE}, {"sameas", TT_SAMEAS}, {"escaped", TT_ESCAPED},       {"in", TT_IN},
    {"==", TT_EQ},           {"eq", TT_EQ},           {"equalto", TT_EQ},            {"!=", TT_NE},
    {"ne", TT_NE},           {">", TT_GT},            {"gt", TT_GT},                 {"greaterthan", TT_GT},
    {"ge", TT_GE},           {">=", TT_GE},           {"<", TT_LT},                  {"lt", TT_LT},
    {"lessthan", TT_LT},     {"<=", TT_LE},           {"le", TT_LE},
};

int tm_test_id(const char *s, size_t n) {
    for (size_t i = 0; i < sizeof test_names / sizeof test_names[0]; i++)
        if (strlen(test_names[i].name) == n && !memcmp(test_names[i].name, s, n)) return test_names[i].id;
    return -1;
}

const char *tm_test_name(int id) {
    for (size_t i = 0; i < sizeof test_names / sizeof test_names[0]; i++)
        if (test_names[i].id == id) return test_names[i].name;
    return "?";
}

int  tm_filter_id(const char *s, size_t n, bool *unsupported);
static bool filter_known(const char *s, size_t n) {
    bool u = false;
    return tm_filter_id(s, n, &u) >= 0;
}

static bool test_arg(R *r, targs *a, const char *tname, tv *out) {
    static const char *const names[] = {"other"};
    tv                       p[1];
    bind(r, tname, a, names, 1, p);
    if (is_missing(p[0])) rfail(r, "%s() missing 1 required positional argument", tname);
    *out = p[0];
    return true;
}

static const char *test_pyname(int id) {
    switch (id) {
    case TT_ODD: return "test_odd";
    case TT_EVEN: return "test_even";
    case TT_DEFINED: return "test_defined";
    case TT_UNDEFINED: return "test_undefined";
    case TT_NONE: return "test_none";
    case TT_BOOLEAN: return "test_boolean";
    case TT_FALSE: return "test_false";
    case TT_TRUE: return "test_true";
    case TT_INTEGER: return "test_integer";
    case TT_FLOAT: return "test_float";
    case TT_LOWER: return "test_lower";
    case TT_UPPER: return "test_upper";
    case TT_STRING: return "test_string";
    case TT_MAPPING: return "test_mapping";
    case TT_NUMBER: return "test_number";
    case TT_SEQUENCE: return "test_sequence";
    case TT_ITERABLE: return "test_iterable";
    case TT_ESCAPED: return "test_escaped";
    case TT_FILTER: return "test_filter";
    case TT_TEST: return "test_test";
    default: return NULL;
    }
}

bool call_test(R *r, int id, tv v, targs *a) {
    tv o;
    const char *one = test_pyname(id);
    if (one && (a->npos || a->nkw)) {
        if (a->nkw) rfail(r, "%s() got an unexpected keyword argument '%s'", one, name_str(r, a->kwid[0])->s);
        rfail(r, "%s() takes %d positional argument%s but %d were given", one, id == TT_FILTER || id == TT_TEST ? 2 : 1,
              id == TT_FILTER || id == TT_TEST ? "s" : "", a->npos + (id == TT_FILTER || id == TT_TEST ? 2 : 1));
    }
    if (id == TT_CALLABLE && (a->npos || a->nkw)) rfail(r, "callable() takes exactly one argument (%d given)", a->npos + 1);
    switch (id) {
    case TT_ODD:
    case TT_EVEN: {
        if (a->npos || a->nkw) rfail(r, "test takes no arguments");
        tv m = tv_binop(r, OP_MOD, v, tv_int(2));
        return tv_eq(r, m, tv_int(id == TT_ODD ? 1 : 0), 0);
    }
    case TT_DIVISIBLEBY: {
        test_arg(r, a, "test_divisibleby", &o);
        tv m = tv_binop(r, OP_MOD, v, o);
        return tv_eq(r, m, tv_int(0), 0);
    }
    case TT_DEFINED: return v.t != TV_UNDEF;
    case TT_UNDEFINED: return v.t == TV_UNDEF;
    case TT_FILTER: return v.t == TV_STR && filter_known(v.s->s, v.s->len);
    case TT_TEST: return v.t == TV_STR && tm_test_id(v.s->s, v.s->len) >= 0;
    case TT_NONE: return v.t == TV_NONE;
    case TT_BOOLEAN: return v.t == TV_BOOL;
    case TT_FALSE: return v.t == TV_BOOL && !v.i;
    case TT_TRUE: return v.t == TV_BOOL && v.i;
    case TT_INTEGER: return v.t == TV_INT;
    case TT_FLOAT: return v.t == TV_FLOAT;
    case TT_LOWER:
    case TT_UPPER: {
        tv s = tv_str(r, v);
        return tv_truthy(r, str_is(r, s, id == TT_LOWER ? M_ISLOWER : M_ISUPPER));
    }
    case TT_STRING: return v.t == TV_STR;
    case TT_MAPPING: return v.t == TV_DICT;
    case TT_NUMBER: return is_num(v);
    case TT_SEQUENCE:
        if (v.t == TV_STR || v.t == TV_DICT || v.t == TV_UNDEF) return true;
        if (v.t == TV_LIST) return TV_LK(v) == LK_LIST || TV_LK(v) == LK_TUPLE || TV_LK(v) == LK_RANGE;
        return false;
    case TT_ITERABLE:
        return v.t == TV_STR || v.t == TV_DICT || v.t == TV_UNDEF || v.t == TV_LIST || v.t == TV_LOOP || v.t == TV_GEN;
    case TT_CALLABLE: return v.t == TV_FUNC || v.t == TV_UNDEF;
    case TT_SAMEAS:
        test_arg(r, a, "test_sameas", &o);
        if (v.t != o.t) return false;
        switch (v.t) {
        case TV_NONE: return true;
        case TV_BOOL: return v.i == o.i;
        case TV_INT: return v.i == o.i && v.i >= -5 && v.i <= 256; /* CPython's small-int cache */
        case TV_STR: return v.s == o.s;
        case TV_LIST: return v.l == o.l;
        case TV_DICT: return v.m == o.m;
        case TV_NS: return v.ns == o.ns;
        case TV_FUNC: return v.fn == o.fn;
        default: return false;
        }
    case TT_ESCAPED: return v.t == TV_STR && (v.f & TVF_SAFE);
    case TT_IN: test_arg(r, a, "test_in", &o); return tv_contains(r, o, v);
    case TT_EQ: test_arg(r, a, "eq", &o); return tv_eq(r, v, o, 0);
    case TT_NE: test_arg(r, a, "ne", &o); return !tv_eq(r, v, o, 0);
    case TT_GT: test_arg(r, a, "gt", &o); { int c = tv_cmp(r, v, o, ">"); return c != 2 && c > 0; }
    case TT_GE: test_arg(r, a, "ge", &o); { int c = tv_cmp(r, v, o, ">="); return c != 2 && c >= 0; }
    case TT_LT: test_arg(r, a, "lt", &o); { int c = tv_cmp(r, v, o, "<"); return c != 2 && c < 0; }
    case TT_LE: test_arg(r, a, "le", &o); { int c = tv_cmp(r, v, o, "<="); return c != 2 && c <= 0; }
    }
    rfail_code(r, AG_ERR_INTERNAL, "internal error: unknown test");
}

/* ================================================================ filters */

static tv filter_impl(R *r, int id, tv v, targs *a);

enum {
    F_ABS, F_ATTR, F_BATCH, F_CAPITALIZE, F_CENTER, F_COUNT, F_DEFAULT, F_DICTSORT, F_ESCAPE, F_FIRST, F_FLOAT,
    F_FORCEESCAPE, F_FORMAT, F_INDENT, F_INT, F_JOIN, F_LAST, F_LENGTH, F_LIST, F_LOWER, F_ITEMS, F_MAP, F_MIN,
    F_MAX, F_REJECT, F_REJECTATTR, F_REPLACE, F_REVERSE, F_ROUND, F_SAFE, F_SELECT, F_SELECTATTR, F_SLICE, F_SORT,
    F_STRING, F_SUM, F_TITLE, F_TRIM, F_TRUNCATE, F_UNIQUE, F_UPPER, F_WORDCOUNT, F_TOJSON, F_GROUPBY,
    F_STRIPTAGS, F_WORDWRAP, F_URLENCODE, F_XMLATTR, F_FILESIZEFORMAT, F_PPRINT,
    /* jinja2 filters this interpreter does not implement: known (a template
     * may name them where they never run), unsupported when called */
    F_RANDOM, F_URLIZE
};

static const struct {
    const char *name;
    int         id;
} filter_names[] = {
    {"abs", F_ABS},         {"attr", F_ATTR},         {"batch", F_BATCH},       {"capitalize", F_CAPITALIZE},
    {"center", F_CENTER},   {"count", F_COUNT},       {"d", F_DEFAULT},         {"default", F_DEFAULT},
    {"dictsort", F_DICTSORT}, {"e", F_ESCAPE},        {"escape", F_ESCAPE},     {"first", F_FIRST},
    {"float", F_FLOAT},     {"forceescape", F_FORCEESCAPE}, {"format", F_FORMAT}, {"indent", F_INDENT},
    {"int", F_INT},         {"join", F_JOIN},         {"last", F_LAST},         {"length", F_LENGTH},
    {"list", F_LIST},       {"lower", F_LOWER},       {"items", F_ITEMS},       {"map", F_MAP},
    {"min", F_MIN},         {"max", F_MAX},           {"reject", F_REJECT},     {"rejectattr", F_REJECTATTR},
    {"replace", F_REPLACE}, {"reverse", F_REVERSE},   {"round", F_ROUND},       {"safe", F_SAFE},
    {"select", F_SELECT},   {"selectattr", F_SELECTATTR}, {"slice", F_SLICE},   {"sort", F_SORT},
    {"string", F_STRING},   {"sum", F_SUM},           {"title", F_TITLE},       {"trim", F_TRIM},
    {"truncate", F_TRUNCATE}, {"unique", F_UNIQUE},   {"upper", F_UPPER},       {"wordcount", F_WORDCOUNT},
    {"tojson", F_TOJSON},   {"groupby", F_GROUPBY},   {"striptags", F_STRIPTAGS}, {"wordwrap", F_WORDWRAP},
    {"urlencode", F_URLENCODE}, {"xmlattr", F_XMLATTR}, {"filesizeformat", F_FILESIZEFORMAT},
    {"pprint", F_PPRINT},   {"random", F_RANDOM},     {"urlize", F_URLIZE},
};

/* Every jinja2 builtin filter has an id; *unsupported says it is one this
 * interpreter does not implement (it fails when called). -1: no such filter. */
int tm_filter_id(const char *s, size_t n, bool *unsupported) {
    *unsupported = false;
    for (size_t i = 0; i < sizeof filter_names / sizeof filter_names[0]; i++)
        if (strlen(filter_names[i].name) == n && !memcmp(filter_names[i].name, s, n)) {
            *unsupported = filter_names[i].id == F_RANDOM || filter_names[i].id == F_URLIZE;
            return filter_names[i].id;
        }
    return -1;
}

const char *tm_filter_name(int id) {
    for (size_t i = 0; i < sizeof filter_names / sizeof filter_names[0]; i++)
        if (filter_names[i].id == id) return filter_names[i].name;
    return "?";
}

/* make_attrgetter: "a.b.0" path, each part through getitem */
static tv attr_path(R *r, tv item, tv attribute, tv dflt) {
    if (is_missing(attribute) || attribute.t == TV_NONE) return item;
    if (attribute.t != TV_STR) {
        item = tv_getitem(r, item, attribute);
        if (!is_missing(dflt) && dflt.t != TV_NONE && item.t == TV_UNDEF) item = dflt;
        return item;
    }
    const char *s = attribute.s->s;
    size_t      n = attribute.s->len, st = 0;
    for (size_t i = 0; i <= n; i++) {
        if (i < n && s[i] != '.') continue;
        bool    digits = i > st;
        int64_t idx = 0;
        for (size_t k = st; k < i; k++) {
            if (s[k] < '0' || s[k] > '9') digits = false;
            else if (idx < 100000000000LL) idx = idx * 10 + (s[k] - '0');
        }
        /* str.isdigit() also accepts other Unicode digits; ASCII covers templates */
        tv key = digits ? tv_int(idx) : mkstr(r, s + st, i - st);
        item = tv_getitem(r, item, key);
        if (!is_missing(dflt) && dflt.t != TV_NONE && item.t == TV_UNDEF) item = dflt;
        st = i + 1;
    }
    return item;
}

static tv lower_if_str(R *r, tv v) { return v.t == TV_STR ? str_case(r, v, CASE_LOWER) : v; }

static tlist *sorted_list(R *r, tlist *src, tv *keys, bool reverse) {
    size_t *idx = ralloc(r, sizeof(size_t) * (src->n + 1));
    for (size_t i = 0; i < src->n; i++) idx[i] = i;
    py_sort(r, keys, idx, src->n, reverse);
    tlist *l = mklist(r, src->n);
    for (size_t i = 0; i < src->n; i++) l->v[i] = src->v[idx[i]];
    return l;
}

/* multi-attribute keys for sort (comma-separated attribute list) */
static tv sort_key(R *r, tv item, tv attribute, bool case_sensitive) {
    if (is_missing(attribute) || attribute.t == TV_NONE || attribute.t != TV_STR) {
        tv k = attr_path(r, item, attribute, tv_missing());
        return case_sensitive ? k : lower_if_str(r, k);
    }
    /* "age,name" -> list of keys */
    const char *s = attribute.s->s;
    size_t      n = attribute.s->len, st = 0, parts = 1;
    for (size_t i = 0; i < n; i++) parts += s[i] == ',';
    tlist *l = mklist(r, parts);
    size_t k = 0;
    for (size_t i = 0; i <= n; i++) {
        if (i < n && s[i] != ',') continue;
        tv kv = attr_path(r, item, mkstr(r, s + st, i - st), tv_missing());
        l->v[k++] = case_sensitive ? kv : lower_if_str(r, kv);
        st = i + 1;
    }
    return tv_list_kind(l, LK_LIST);
}

static tlist *filter_list(R *r, tv v) {
    if (v.t == TV_UNDEF) return mklist(r, 0);
    return tv_iterate(r, v);
}

static tv do_round(R *r, tv v, tv vprec, tv vmethod) {
    int64_t prec = is_missing(vprec) ? 0 : want_int(r, vprec, NULL);
    const char *method = "common";
    if (!is_missing(vmethod)) {
        if (vmethod.t != TV_STR) rfail(r, "method must be common, ceil or floor");
        method = vmethod.s->s;
    }
    if (strcmp(method, "common") && strcmp(method, "ceil") && strcmp(method, "floor"))
        rfail(r, "method must be common, ceil or floor");
    if (!strcmp(method, "common")) {
        if (!is_num(v)) rfail(r, "type %s doesn't define __round__ method", tv_type_name(v));
        if (is_intlike(v)) {
            if (prec >= 0) return tv_int(v.i);
            /* round(int, negative): to a multiple of 10**-prec, half to even */
            if (prec < -18) return tv_int(0);
            int64_t p10 = 1;
            for (int64_t k = 0; k < -prec; k++) p10 *= 10;
            int64_t q = v.i / p10, rem = v.i % p10;
            if (rem < 0) {
                rem += p10;
                q--;
            }
            if (rem * 2 > p10 || (rem * 2 == p10 && (q & 1))) q++;
            int64_t o;
            if (mul_ovf(q, p10, &o)) int_overflow(r);
            return tv_int(o);
        }
        double d = v.d;
        if (!isfinite(d)) return tv_float(d);
        if (prec > 320) return tv_float(d);
        if (prec >= 0) {
            char buf[400];
            snprintf(buf, sizeof buf, "%.*f", (int)prec, d);
            return tv_float(strtod(buf, NULL));
        }
        if (prec < -308) return tv_float(copysign(0.0, d));
        double p = pow(10.0, (double)-prec);
        double y = d / p, z = round(y);
        if (fabs(y - z) == 0.5) z = 2.0 * round(y / 2.0);
        return tv_float(z * p);
    }
    if (v.t == TV_UNDEF) fail_undefined(r, v);
    if (!is_num(v)) {
        /* value * 10**precision happens first: sequences repeat, others fail */
        bool seq = v.t == TV_STR || (v.t == TV_LIST && (TV_LK(v) == LK_LIST || TV_LK(v) == LK_TUPLE));
        if (!seq) rfail(r, "unsupported operand type(s) for *: '%s' and '%s'", tv_type_name(v), prec >= 0 ? "int" : "float");
        rfail(r, "must be real number, not %s", tv_type_name(v));
    }
    double d = num_d(v);
    double p = pow(10.0, (double)prec);
    double x = !strcmp(method, "ceil") ? ceil(d * p) : floor(d * p);
    return tv_float(x / p);
}

static bool parse_py_int(const char *s, size_t n, int base, int64_t *out) {
    size_t i = 0;
    while (i < n) {
        size_t k = i;
        if (!tm_py_isspace(tm_utf8_next(s, n, &k))) break;
        i = k;
    }
    size_t e = n;
    while (e > i) {
        size_t st = e - 1;
        while (st > i && ((unsigned char)s[st] & 0xC0) == 0x80) st--;
        size_t k = st;
        if (!tm_py_isspace(tm_utf8_next(s, n, &k))) break;
        e = st;
    }
    bool neg = false;
    if (i < e && (s[i] == '+' || s[i] == '-')) neg = s[i++] == '-';
    if (base == 0 || base == 16 || base == 8 || base == 2) {
        if (i + 1 < e && s[i] == '0') {
            char x = s[i + 1] | 0x20;
            int  b = x == 'x' ? 16 : x == 'o' ? 8 : x == 'b' ? 2 : 0;
            if (b && (base == 0 || base == b)) {
                base = b;
                i += 2;
                if (i < e && s[i] == '_') i++;
            }
        }
        if (base == 0) base = 10;
    }
    if (base < 2 || base > 36) return false;
    if (i >= e) return false;
    uint64_t v = 0;
    bool     prev_us = true;
    for (; i < e; i++) {
        char c = s[i];
        if (c == '_') {
            if (prev_us) return false;
            prev_us = true;
            continue;
        }
        int d = (c >= '0' && c <= '9') ? c - '0' : ((c | 0x20) >= 'a' && (c | 0x20) <= 'z') ? (c | 0x20) - 'a' + 10 : 99;
        if (d >= base) return false;
        if (v > (UINT64_MAX - (uint64_t)d) / (uint64_t)base) return false;
        v = v * (uint64_t)base + (uint64_t)d;
        prev_us = false;
    }
    if (prev_us) return false;
    if (v > (uint64_t)INT64_MAX + (neg ? 1 : 0)) return false;
    *out = neg ? (int64_t)(0 - v) : (int64_t)v;
    return true;
}

static bool parse_py_float(const char *s, size_t n, double *out) {
    char   buf[256];
    size_t i = 0, e = n;
    while (i < n && tm_py_isspace((unsigned char)s[i])) i++;
    while (e > i && tm_py_isspace((unsigned char)s[e - 1])) e--;
    if (e - i == 0 || e - i >= sizeof buf) return false;
    size_t m = 0;
    for (size_t k = i; k < e; k++) {
        char c = s[k];
        if (c == '_') {
            /* only between digits */
            if (k == i || k + 1 >= e || !(s[k - 1] >= '0' && s[k - 1] <= '9') || !(s[k + 1] >= '0' && s[k + 1] <= '9'))
                return false;
            continue;
        }
        if (!((c >= '0' && c <= '9') || c == '.' || c == 'e' || c == 'E' || c == '+' || c == '-' ||
              strchr("infatyINFATY", c)))
            return false;
        buf[m++] = c;
    }
    buf[m] = 0;
    char  *end;
    double d = strtod(buf, &end);
    if (*end || end == buf) return false;
    /* strtod accepts "infinity"/"nan" spellings Python also accepts; it also
     * takes hex, excluded above (no 'x') */
    *out = d;
    return true;
}

static tv do_indent(R *r, tv v, tv vwidth, tv vfirst, tv vblank) {
    /* jinja2 does `s += "\n"` without converting s first */
    if (v.t == TV_UNDEF) fail_undefined(r, v);
    if (v.t == TV_LIST && TV_LK(v) == LK_LIST) rfail(r, "'list' object has no attribute 'splitlines'");
    if (v.t == TV_LIST && TV_LK(v) == LK_TUPLE) rfail(r, "can only concatenate tuple (not \"str\") to tuple");
    if (v.t != TV_STR) rfail(r, "unsupported operand type(s) for +=: '%s' and 'str'", tv_type_name(v));
    tv s = v;
    const char *ind = "    ";
    size_t      indn = 4;
    if (!is_missing(vwidth)) {
        if (vwidth.t == TV_STR) {
            ind = vwidth.s->s;
            indn = vwidth.s->len;
        } else {
            int64_t w = want_int(r, vwidth, NULL);
            if (w < 0) w = 0;
            if (w > 100000) rfail_code(r, AG_ERR_RANGE, "indent width too large");
            char *sp = ralloc(r, (size_t)w + 1);
            memset(sp, ' ', (size_t)w);
            ind = sp;
            indn = (size_t)w;
        }
    }
    bool first = !is_missing(vfirst) && tv_truthy(r, vfirst);
    bool blank = !is_missing(vblank) && tv_truthy(r, vblank);
    /* s += "\n"; lines = s.splitlines() */
    ag_buf *t = buf_get(r);
    buf_add(r, t, s.s->s, s.s->len);
    buf_addc(r, t, '\n');
    tv     s2 = buf_finish(r, t, false);
    tlist *lines = str_splitlines(r, s2.s, false);
    ag_buf *b = buf_get(r);
    if (first) buf_add(r, b, ind, indn);
    for (size_t i = 0; i < lines->n; i++) {
        const tstr *ln = lines->v[i].s;
        if (i) {
            buf_addc(r, b, '\n');
            if (blank || ln->len) buf_add(r, b, ind, indn);
        }
        buf_add(r, b, ln->s, ln->len);
    }
    return buf_finish(r, b, s.f & TVF_SAFE);
}

static tv do_truncate(R *r, tv v, tv *p) {
    tv s = v;
    int64_t length = is_missing(p[0]) ? 255 : want_int(r, p[0], NULL);
    bool    killwords = !is_missing(p[1]) && tv_truthy(r, p[1]);
    tv      end = is_missing(p[2]) ? mkcstr(r, "...") : p[2];
    int64_t leeway = (is_missing(p[3]) || p[3].t == TV_NONE) ? 5 : want_int(r, p[3], NULL);
    if (end.t != TV_STR) rfail(r, "truncate end must be a string");
    if (length < (int64_t)end.s->ncp) rfail(r, "expected length >= %zu, got %lld", end.s->ncp, (long long)length);
    if (leeway < 0) rfail(r, "expected leeway >= 0, got %lld", (long long)leeway);
    /* jinja2 does not convert: len(s) and slicing apply to the value as is */
    if (s.t == TV_UNDEF) return s;
    if (s.t != TV_STR) {
        int64_t n = tv_len(r, s);
        if (n <= length + leeway) return s;
        if (killwords) rfail(r, "can only concatenate %s (not \"str\") to %s", tv_type_name(s), tv_type_name(s));
        rfail(r, "'%s' object has no attribute 'rsplit'", tv_type_name(s));
    }
    if ((int64_t)s.s->ncp <= length + leeway) return s;
    size_t cut = cp_offset(s.s, (size_t)(length - (int64_t)end.s->ncp));
    ag_buf *b = buf_get(r);
    if (killwords) buf_add(r, b, s.s->s, cut);
    else {
        const char *q = rfind_bytes(s.s->s, cut, " ", 1);
        buf_add(r, b, s.s->s, q ? (size_t)(q - s.s->s) : cut);
    }
    buf_add(r, b, end.s->s, end.s->len);
    return buf_finish(r, b, false);
}

/* ---- groupby, striptags, urlencode, xmlattr, filesizeformat, pprint */

/* groupby: sorted by the attribute (lower-cased unless case_sensitive),
 * runs of equal keys become _GroupTuple(grouper, list): a tuple whose
 * .grouper / .list are its items (tv_getattr). Without case_sensitive the
 * grouper is the first item's value as is. */
static tv do_groupby(R *r, tv v, tv attribute, tv dflt, bool cs) {
    tlist  *items = filter_list(r, v);
    size_t  n = items->n;
    tv     *keys = ralloc(r, sizeof(tv) * (n + 1)), *sk = ralloc(r, sizeof(tv) * (n + 1));
    size_t *idx = ralloc(r, sizeof(size_t) * (n + 1));
    for (size_t i = 0; i < n; i++) {
        step(r);
        keys[i] = attr_path(r, items->v[i], attribute, dflt);
        if (!cs) keys[i] = lower_if_str(r, keys[i]);
        sk[i] = keys[i];
        idx[i] = i;
    }
    py_sort(r, sk, idx, n, false);
    tv    *groups = ralloc(r, sizeof(tv) * (n + 1));
    size_t ng = 0;
    for (size_t i = 0; i < n;) {
        size_t j = i + 1;
        while (j < n && tv_eq(r, keys[idx[j]], keys[idx[i]], 0)) j++;
        tlist *members = mklist(r, j - i);
        for (size_t k = i; k < j; k++) members->v[k - i] = items->v[idx[k]];
        tlist *pair = mklist(r, 2);
        pair->v[0] = cs ? keys[idx[i]] : attr_path(r, members->v[0], attribute, dflt);
        pair->v[1] = tv_list_kind(members, LK_LIST);
        pair->r_start = TL_GROUP_TUPLE;
        groups[ng++] = tv_list_kind(pair, LK_TUPLE);
        i = j;
    }
    tlist *l = mklist(r, ng);
    memcpy(l->v, groups, sizeof(tv) * ng);
    return tv_list_kind(l, LK_LIST);
}

/* html.unescape over striptags' output, as Python does it: numeric
 * references with HTML5's replacements, named ones from the full HTML5 table
 * (exact name, else the longest name without ";" it starts with). */
#include "tmpl/html_entities.h"

static const char *html5_lookup(const char *s, size_t n) {
    size_t lo = 0, hi = sizeof k_html5 / sizeof k_html5[0];
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        const char *m = k_html5[mid].name;
        size_t      mn = strlen(m);
        int         c = memcmp(m, s, mn < n ? mn : n);
        if (c == 0) c = mn < n ? -1 : mn > n ? 1 : 0;
        if (c == 0) return k_html5[mid].text;
        if (c < 0) lo = mid + 1;
        else hi = mid;
    }
    return NULL;
}

/* html._invalid_charrefs 0x80..0x9F: Windows-1252 (five map to themselves) */
static const uint16_t k_cp1252[32] = {0x20AC, 0x81,   0x201A, 0x0192, 0x201E, 0x2026, 0x2020, 0x2021,
                                      0x02C6, 0x2030, 0x0160, 0x2039, 0x0152, 0x8D,   0x017D, 0x8F,
                                      0x90,   0x2018, 0x2019, 0x201C, 0x201D, 0x2022, 0x2013, 0x2014,
                                      0x02DC, 0x2122, 0x0161, 0x203A, 0x0153, 0x9D,   0x017E, 0x0178};

static void html_unescape(R *r, ag_buf *b, const char *s, size_t n) {
    for (size_t i = 0; i < n;) {
        if (s[i] != '&' || i + 1 >= n) {
            buf_addc(r, b, s[i++]);
            continue;
        }
        const char *p = s + i + 1;
        size_t      left = n - i - 1;
        if (p[0] == '#') {
            bool   hex = left > 1 && (p[1] == 'x' || p[1] == 'X');
            size_t k = hex ? 2 : 1, d0 = k;
            uint64_t num = 0;
            while (k < left && (hex ? isxdigit((unsigned char)p[k]) : isdigit((unsigned char)p[k]))) {
                int dv = isdigit((unsigned char)p[k]) ? p[k] - '0' : (p[k] | 0x20) - 'a' + 10;
                if (num <= 0x10FFFF) num = num * (hex ? 16 : 10) + (uint64_t)dv;
                k++;
            }
            if (k == d0) { /* "&#" without digits: no reference */
                buf_addc(r, b, s[i++]);
                continue;
            }
            if (k < left && p[k] == ';') k++;
            i += 1 + k;
            if (num == 0) put_cp(r, b, 0xFFFD);
            else if (num == 13) buf_addc(r, b, '\r');
            else if (num >= 0x80 && num <= 0x9F) put_cp(r, b, k_cp1252[num - 0x80]);
            else if ((num >= 0xD800 && num <= 0xDFFF) || num > 0x10FFFF) put_cp(r, b, 0xFFFD);
            else if ((num >= 1 && num <= 8) || num == 11 || (num >= 14 && num <= 31) || num == 127 ||
                     (num >= 0xFDD0 && num <= 0xFDEF) || (num & 0xFFFE) == 0xFFFE)
                continue; /* html._invalid_codepoints: dropped */
            else put_cp(r, b, (uint32_t)num);
            continue;
        }
        /* a name: [^\t\n\f <&#;]{1,32};? */
        size_t k = 0;
        while (k < left && k < 32 && !(p[k] && strchr("\t\n\f <&#;", p[k]))) k++;
        if (k == 0) {
            buf_addc(r, b, s[i++]);
            continue;
        }
        if (k < left && p[k] == ';') k++;
        const char *text = html5_lookup(p, k);
        size_t      used = k;
        for (size_t x = k - 1; !text && x >= 2; x--) /* Python: range(len(s) - 1, 1, -1) */
            if ((text = html5_lookup(p, x))) used = x;
        if (text) {
            buf_adds(r, b, text);
            buf_add(r, b, p + used, k - used);
        } else {
            buf_addc(r, b, '&');
            buf_add(r, b, p, k);
        }
        i += 1 + k;
    }
}

static size_t find_from(const char *s, size_t n, size_t from, const char *needle) {
    size_t m = strlen(needle);
    for (size_t i = from; i + m <= n; i++)
        if (!memcmp(s + i, needle, m)) return i;
    return SIZE_MAX;
}

/* markupsafe's Markup.striptags: drop <!-- comments -->, then <tags>, then
 * collapse whitespace runs (str.split()) to single spaces and unescape. */
static tv do_striptags(R *r, tv v) {
    tv     sv = tv_str(r, v);
    size_t n = sv.s->len;
    char  *s = ralloc(r, n + 1);
    memcpy(s, sv.s->s, n + 1);
    for (size_t from = 0;;) {
        size_t st = find_from(s, n, from, "<!--");
        if (st == SIZE_MAX) break;
        size_t en = find_from(s, n, st, "-->");
        if (en == SIZE_MAX) break;
        memmove(s + st, s + en + 3, n - en - 3);
        n -= en + 3 - st;
        from = st >= 3 ? st - 3 : 0; /* the cut may have joined a new "<!--" */
    }
    for (size_t from = 0;;) {
        size_t st = find_from(s, n, from, "<");
        if (st == SIZE_MAX) break;
        size_t en = find_from(s, n, st, ">");
        if (en == SIZE_MAX) break;
        memmove(s + st, s + en + 1, n - en - 1);
        n -= en + 1 - st;
        from = st;
    }
    ag_buf *w = buf_get(r);
    for (size_t i = 0; i < n;) {
        size_t   k = i;
        uint32_t c = tm_utf8_next(s, n, &k);
        if (tm_py_isspace(c)) {
            i = k;
            continue;
        }
        if (w->len) buf_addc(r, w, ' ');
        while (i < n) {
            k = i;
            if (tm_py_isspace(tm_utf8_next(s, n, &k))) break;
            buf_add(r, w, s + i, k - i);
            i = k;
        }
    }
    ag_buf *b = buf_get(r);
    html_unescape(r, b, w->data ? w->data : "", w->len);
    buf_put(r, w);
    return buf_finish(r, b, false);
}

/* jinja2's url_quote: UTF-8, %XX for all but ASCII letters, digits and
 * "_.-~" ("/" too outside query strings, where a space is "+"). */
static void url_quote(R *r, ag_buf *b, tv x, bool for_qs) {
    tv s = x.t == TV_STR ? x : tv_str(r, x);
    for (size_t i = 0; i < s.s->len; i++) {
        unsigned char c = (unsigned char)s.s->s[i];
        if (isalnum(c) || c == '_' || c == '.' || c == '-' || c == '~' || (!for_qs && c == '/')) buf_addc(r, b, (char)c);
        else if (for_qs && c == ' ') buf_addc(r, b, '+');
        else {
            char h[4];
            snprintf(h, sizeof h, "%%%02X", c);
            buf_add(r, b, h, 3);
        }
    }
}

static tv do_urlencode(R *r, tv v) {
    ag_buf *b = buf_get(r);
    bool    iterable = v.t == TV_LIST || v.t == TV_DICT || v.t == TV_GEN || v.t == TV_UNDEF || v.t == TV_LOOP;
    if (v.t == TV_STR || !iterable) {
        url_quote(r, b, v, false);
        return buf_finish(r, b, false);
    }
    tlist *items;
    if (v.t == TV_DICT) {
        items = mklist(r, v.m->n);
        for (size_t i = 0; i < v.m->n; i++) {
            tlist *pr = mklist(r, 2);
            pr->v[0] = v.m->k[i];
            pr->v[1] = v.m->v[i];
            items->v[i] = tv_list_kind(pr, LK_TUPLE);
        }
    } else items = filter_list(r, v);
    for (size_t i = 0; i < items->n; i++) {
        step(r);
        tv it = items->v[i];
        if (!(it.t == TV_LIST || it.t == TV_DICT || it.t == TV_STR || it.t == TV_GEN || it.t == TV_UNDEF))
            rfail(r, "cannot unpack non-iterable %s object", tv_type_name(it));
        tlist *kv = tv_iterate(r, it);
        if (kv->n < 2) rfail(r, "not enough values to unpack (expected 2, got %zu)", kv->n);
        if (kv->n > 2) rfail(r, "too many values to unpack (expected 2)");
        if (i) buf_addc(r, b, '&');
        url_quote(r, b, kv->v[0], true);
        buf_addc(r, b, '=');
        url_quote(r, b, kv->v[1], true);
    }
    return buf_finish(r, b, false);
}

/* markupsafe's escape: Markup passes through, anything else is str()-ed */
static void add_escaped(R *r, ag_buf *b, tv x) {
    if (x.t == TV_STR && (x.f & TVF_SAFE)) {
        buf_add(r, b, x.s->s, x.s->len);
        return;
    }
    tv s = tv_str(r, x);
    write_html_escaped(r, b, s.s->s, s.s->len);
}

static tv do_xmlattr(R *r, tv d, bool autospace) {
    if (d.t == TV_UNDEF) fail_undefined(r, d);
    if (d.t != TV_DICT) rfail(r, "'%s' object has no attribute 'items'", tv_type_name(d));
    ag_buf *b = buf_get(r);
    for (size_t i = 0; i < d.m->n; i++) {
        tv k = d.m->k[i], x = d.m->v[i];
        if (x.t == TV_NONE || x.t == TV_UNDEF) continue;
        if (k.t != TV_STR) rfail(r, "expected string or bytes-like object, got '%s'", tv_type_name(k));
        for (size_t j = 0; j < k.s->len; j++)
            if (strchr(" \t\n\r\f\v/>=", k.s->s[j])) {
                ag_buf *m = buf_get(r);
                tv_write_repr(r, m, k, 0);
                rfail(r, "Invalid character in attribute name: %.*s", (int)m->len, m->data);
            }
        if (b->len || autospace) buf_addc(r, b, ' ');
        add_escaped(r, b, k);
        buf_adds(r, b, "=\"");
        add_escaped(r, b, x);
        buf_addc(r, b, '"');
    }
    return buf_finish(r, b, false);
}

static tv do_filesizeformat(R *r, tv v, bool binary) {
    double x;
    if (v.t == TV_UNDEF) fail_undefined(r, v);
    if (is_num(v)) x = num_d(v);
    else if (v.t == TV_STR) {
        if (!parse_py_float(v.s->s, v.s->len, &x)) {
            ag_buf *m = buf_get(r);
            tv_write_repr(r, m, v, 0);
            rfail(r, "could not convert string to float: %.*s", (int)m->len, m->data);
        }
    } else rfail(r, "float() argument must be a string or a real number, not '%s'", tv_type_name(v));
    static const char *const dec[] = {"kB", "MB", "GB", "TB", "PB", "EB", "ZB", "YB"};
    static const char *const bin[] = {"KiB", "MiB", "GiB", "TiB", "PiB", "EiB", "ZiB", "YiB"};
    double base = binary ? 1024 : 1000;
    char   out[96];
    if (x == 1) snprintf(out, sizeof out, "1 Byte");
    else if (x < base) {
        if (isinf(x)) rfail(r, "cannot convert float infinity to integer");
        if (x <= -9.2e18) int_overflow(r);
        snprintf(out, sizeof out, "%lld Bytes", (long long)x); /* int(): toward zero */
    }
    else {
        double unit = base;
        int    i;
        for (i = 0; i < 8; i++) {
            unit *= base; /* base ** (i + 2) */
            if (x < unit) break;
        }
        if (i == 8) i = 7;
        snprintf(out, sizeof out, "%.1f %s", base * x / unit, binary ? bin[i] : dec[i]);
    }
    return mkcstr(r, out);
}

/* pprint.pformat's one-line form: repr with dict keys sorted at every level
 * of dicts, lists and tuples. Longer than 80 characters, pformat breaks
 * lines: unsupported. */
static void pp_repr(R *r, ag_buf *b, tv v, int depth) {
    if (depth > 100) rfail_code(r, AG_ERR_RANGE, "value nested too deeply");
    bool list = v.t == TV_LIST && TV_LK(v) == LK_LIST;
    bool tuple = v.t == TV_LIST && TV_LK(v) == LK_TUPLE && v.l->r_start != TL_GROUP_TUPLE;
    if (list || tuple) {
        buf_addc(r, b, list ? '[' : '(');
        for (size_t i = 0; i < v.l->n; i++) {
            if (i) buf_adds(r, b, ", ");
            pp_repr(r, b, v.l->v[i], depth + 1);
        }
        if (tuple && v.l->n == 1) buf_addc(r, b, ',');
        buf_addc(r, b, list ? ']' : ')');
        return;
    }
    if (v.t != TV_DICT) {
        tv_write_repr(r, b, v, depth);
        return;
    }
    size_t n = v.m->n;
    bool   strs = true, nums = true;
    for (size_t i = 0; i < n; i++) {
        strs &= v.m->k[i].t == TV_STR;
        nums &= is_num(v.m->k[i]);
    }
    /* pprint orders keys of different types by type name and id() */
    if (!strs && !nums) rfail_code(r, AG_ERR_UNSUPPORTED, "unsupported: pprint of a dict with keys of mixed types");
    tv     *keys = ralloc(r, sizeof(tv) * (n + 1));
    size_t *idx = ralloc(r, sizeof(size_t) * (n + 1));
    for (size_t i = 0; i < n; i++) {
        keys[i] = v.m->k[i];
        idx[i] = i;
    }
    py_sort(r, keys, idx, n, false);
    buf_addc(r, b, '{');
    for (size_t i = 0; i < n; i++) {
        if (i) buf_adds(r, b, ", ");
        pp_repr(r, b, v.m->k[idx[i]], depth + 1);
        buf_adds(r, b, ": ");
        pp_repr(r, b, v.m->v[idx[i]], depth + 1);
    }
    buf_addc(r, b, '}');
}

static tv do_pprint(R *r, tv v) {
    ag_buf *b = buf_get(r);
    pp_repr(r, b, v, 0);
    tv     s = buf_finish(r, b, false);
    bool   multi = v.t == TV_DICT || (v.t == TV_STR && !(v.f & TVF_SAFE)) ||
                 (v.t == TV_LIST && TV_LK(v) != LK_RANGE && TV_LK(v) != LK_REVITER && v.l->r_start != TL_GROUP_TUPLE);
    if (multi && s.s->ncp > 80) rfail_code(r, AG_ERR_UNSUPPORTED, "unsupported: pprint of a value longer than a line");
    return s;
}

/* ---- wordwrap: textwrap.wrap(width, expand_tabs=False,
 * replace_whitespace=False, break_long_words, break_on_hyphens) per line */

static bool ww_ws(uint32_t c) { return c == ' ' || (c >= '\t' && c <= '\r'); } /* textwrap's ASCII set */
static bool ww_word(uint32_t c) { return is_word(c); }                         /* re's \w */
static bool ww_letter(uint32_t c) { return is_word(c) && !is_decimal(c); }     /* [^\d\W] */
static bool ww_punct(uint32_t c) { return is_word(c) || (c < 128 && strchr("!\"'&.,?", (int)c) && c); }

/* "--" (or more) at cp[j..] followed by a word character */
static bool ww_emdash_at(const uint32_t *cp, size_t n, size_t j) {
    size_t d = j;
    while (d < n && cp[d] == '-') d++;
    return d - j >= 2 && d < n && ww_word(cp[d]);
}

/* textwrap's wordsep_re (or, without hyphen breaking, wordsep_simple_re)
 * over code points: chunk boundaries into ends[] */
static size_t ww_split(const uint32_t *cp, size_t n, bool hyphens, size_t *ends) {
    size_t nc = 0;
    for (size_t i = 0; i < n;) {
        size_t j = i + 1;
        if (ww_ws(cp[i])) {
            while (j < n && ww_ws(cp[j])) j++;
        } else if (!hyphens) {
            while (j < n && !ww_ws(cp[j])) j++;
        } else if (cp[i] == '-' && i > 0 && ww_punct(cp[i - 1]) && ww_emdash_at(cp, n, i)) {
            while (j < n && cp[j] == '-') j++; /* an em-dash between words */
        } else {
            for (;; j++) { /* the shortest word that ends at one of these */
                if (j < n && cp[j] == '-' &&
                    ((j >= 2 && ww_letter(cp[j - 2]) && ww_letter(cp[j - 1])) ||
                     (j >= 3 && ww_letter(cp[j - 3]) && cp[j - 2] == '-' && ww_letter(cp[j - 1]))) &&
                    j + 1 < n && ww_letter(cp[j + 1]) &&
                    (j + 2 < n && (ww_letter(cp[j + 2]) || (cp[j + 2] == '-' && j + 3 < n && ww_letter(cp[j + 3]))))) {
                    j++; /* a hyphenated word: break after the hyphen */
                    break;
                }
                if (j == n || ww_ws(cp[j])) break;
                if (ww_punct(cp[j - 1]) && ww_emdash_at(cp, n, j)) break;
            }
        }
        ends[nc++] = j;
        i = j;
    }
    return nc;
}

static bool ww_blank(const uint32_t *cp, size_t a, size_t b) {
    for (size_t k = a; k < b; k++)
        if (!tm_py_isspace(cp[k])) return false;
    return true;
}

static void ww_put(R *r, ag_buf *b, const uint32_t *cp, size_t a, size_t e) {
    for (size_t k = a; k < e; k++) put_cp(r, b, cp[k]);
}

/* One paragraph: textwrap's _wrap_chunks (no indents, drop_whitespace),
 * its lines joined by wrapstr onto b; *first says whether b has no line yet
 * from this paragraph (for the join). */
static void ww_wrap(R *r, ag_buf *b, const tstr *line, int64_t width, bool long_words, bool hyphens,
                    const tstr *wrapstr) {
    size_t    n = 0, i = 0;
    uint32_t *cp = ralloc(r, sizeof(uint32_t) * (line->ncp + 1));
    while (i < line->len) cp[n++] = tm_utf8_next(line->s, line->len, &i);
    size_t *ends = ralloc(r, sizeof(size_t) * (n + 1));
    size_t  nc = ww_split(cp, n, hyphens, ends);
    size_t *cs = ralloc(r, sizeof(size_t) * (nc + 1)), *ce = ralloc(r, sizeof(size_t) * (nc + 1));
    for (size_t k = 0; k < nc; k++) {
        cs[k] = k ? ends[k - 1] : 0;
        ce[k] = ends[k];
    }
    /* a line is a run of spans; spans of one line are contiguous in cp
     * except that a line may end with a cut-off head of a long word */
    size_t *ps = ralloc(r, sizeof(size_t) * (nc + 2)), *pe = ralloc(r, sizeof(size_t) * (nc + 2));
    size_t  next = 0, nlines = 0;
    while (next < nc) {
        step(r);
        size_t np = 0, cur = 0;
        if (nlines && ww_blank(cp, cs[next], ce[next])) next++;
        while (next < nc && cur + (ce[next] - cs[next]) <= (size_t)width) {
            ps[np] = cs[next];
            pe[np++] = ce[next];
            cur += ce[next] - cs[next];
            next++;
        }
        if (next < nc && ce[next] - cs[next] > (size_t)width) {
            size_t space_left = (size_t)width - cur;
            if (long_words) {
                size_t end = space_left, len = ce[next] - cs[next];
                if (hyphens && len > space_left) {
                    size_t h = SIZE_MAX;
                    for (size_t k = 0; k < space_left; k++)
                        if (cp[cs[next] + k] == '-') h = k;
                    bool other = false;
                    for (size_t k = 0; h != SIZE_MAX && k < h; k++) other |= cp[cs[next] + k] != '-';
                    if (h != SIZE_MAX && h > 0 && other) end = h + 1;
                }
                ps[np] = cs[next];
                pe[np++] = cs[next] + end;
                cs[next] += end;
            } else if (!np) {
                ps[np] = cs[next];
                pe[np++] = ce[next];
                next++;
            }
        }
        if (np && ww_blank(cp, ps[np - 1], pe[np - 1])) np--;
        if (!np) continue;
        if (nlines++) buf_add(r, b, wrapstr->s, wrapstr->len);
        for (size_t k = 0; k < np; k++) ww_put(r, b, cp, ps[k], pe[k]);
    }
}

static tv do_wordwrap(R *r, tv s, tv *p) {
    int64_t width = is_missing(p[0]) ? 79 : want_int(r, p[0], NULL);
    bool    long_words = is_missing(p[1]) || tv_truthy(r, p[1]);
    bool    hyphens = is_missing(p[3]) || tv_truthy(r, p[3]);
    tv      wrapstr = is_missing(p[2]) || p[2].t == TV_NONE ? mkcstr(r, "\n") : p[2];
    if (s.t == TV_UNDEF) fail_undefined(r, s);
    if (s.t != TV_STR) rfail(r, "'%s' object has no attribute 'splitlines'", tv_type_name(s));
    if (wrapstr.t != TV_STR) rfail(r, "'%s' object has no attribute 'join'", tv_type_name(wrapstr));
    tlist *lines = str_splitlines(r, s.s, false);
    if (lines->n && width <= 0) rfail(r, "invalid width %lld (must be > 0)", (long long)width);
    ag_buf *b = buf_get(r);
    for (size_t k = 0; k < lines->n; k++) {
        if (k) buf_add(r, b, wrapstr.s->s, wrapstr.s->len);
        ww_wrap(r, b, lines->v[k].s, width, long_words, hyphens, wrapstr.s);
    }
    return buf_finish(r, b, false);
}

static tv filter_impl(R *r, int id, tv v, targs *a) {
    tv p[5];
    switch (id) {
    case F_ABS:
        no_args(r, "abs", a);
        if (v.t == TV_FLOAT) return tv_float(fabs(v.d));
        if (is_intlike(v)) {
            if (v.i == INT64_MIN) int_overflow(r);
            return tv_int(v.i < 0 ? -v.i : v.i);
        }
        rfail(r, "bad operand type for abs(): '%s'", tv_type_name(v));
    case F_ATTR: {
        static const char *const names[] = {"name"};
        bind(r, "do_attr", a, names, 1, p);
        if (is_missing(p[0])) rfail(r, "do_attr() missing 1 required positional argument: 'name'");
        if (p[0].t != TV_STR) rfail(r, "attribute name must be string, not '%s'", tv_type_name(p[0]));
        if (v.t == TV_UNDEF) fail_undefined(r, v);
        tv m;
        if (v.t == TV_NS || v.t == TV_LOOP) return tv_getattr(r, v, p[0].s);
        if (method_lookup(r, v, p[0].s, &m)) return m;
        return make_undef(r, NULL, true, v, p[0]);
    }
    case F_CAPITALIZE: no_args(r, "capitalize", a); return str_capitalize(r, tv_soft_str(r, v));
    case F_CENTER: {
        static const char *const names[] = {"width"};
        bind(r, "do_center", a, names, 1, p);
        int64_t w = is_missing(p[0]) ? 80 : want_int(r, p[0], NULL);
        return pad_str(r, tv_soft_str(r, v), w, '^', " ", 1);
    }
    case F_COUNT:
    case F_LENGTH: no_args(r, "len", a); return tv_int(tv_len(r, v));
    case F_DEFAULT: {
        static const char *const names[] = {"default_value", "boolean"};
        bind(r, "do_default", a, names, 2, p);
        tv   dflt = is_missing(p[0]) ? mkstr(r, "", 0) : p[0];
        bool boolean = !is_missing(p[1]) && tv_truthy(r, p[1]);
        if (v.t == TV_UNDEF || (boolean && !tv_truthy(r, v))) return dflt;
        return v;
    }
    case F_DICTSORT: {
        static const char *const names[] = {"case_sensitive", "by", "reverse"};
        bind(r, "do_dictsort", a, names, 3, p);
        bool cs = !is_missing(p[0]) && tv_truthy(r, p[0]);
        int  pos = 0;
        if (!is_missing(p[1])) {
            if (p[1].t == TV_STR && !strcmp(p[1].s->s, "key")) pos = 0;
            else if (p[1].t == TV_STR && !strcmp(p[1].s->s, "value")) pos = 1;
            else rfail(r, "You can only sort by either \"key\" or \"value\"");
        }
        bool rev = !is_missing(p[2]) && tv_truthy(r, p[2]);
        if (v.t == TV_UNDEF) fail_undefined(r, v);
        if (v.t != TV_DICT) rfail(r, "'%s' object has no attribute 'items'", tv_type_name(v));
        tlist *pairs = mklist(r, v.m->n);
        tv    *keys = ralloc(r, sizeof(tv) * (v.m->n + 1));
        for (size_t i = 0; i < v.m->n; i++) {
            tlist *pr = mklist(r, 2);
            pr->v[0] = v.m->k[i];
            pr->v[1] = v.m->v[i];
            pairs->v[i] = tv_list_kind(pr, LK_TUPLE);
            keys[i] = cs ? pr->v[pos] : lower_if_str(r, pr->v[pos]);
        }
        return tv_list_kind(sorted_list(r, pairs, keys, rev), LK_LIST);
    }
    case F_ESCAPE: no_args(r, "escape", a); return escape_tv(r, v);
    case F_FORCEESCAPE: {
        no_args(r, "forceescape", a);
        tv s = tv_str(r, v);
        return escape_tv(r, s);
    }
    case F_FIRST: {
        no_args(r, "first", a);
        if (v.t == TV_GEN) {
            tv x;
            if (gen_next(r, v.g, &x)) return x;
        } else if (v.t == TV_LIST && TV_LK(v) == LK_REVITER) {
            if (v.l->n) return v.l->v[0];
        } else {
            tlist *items = filter_list(r, v);
            if (items->n) return items->v[0];
        }
        return make_undef(r, "No first item, sequence was empty.", false, tv_none(), tv_none());
    }
    case F_LAST: {
        no_args(r, "last", a);
        if (v.t == TV_GEN || (v.t == TV_LIST && TV_LK(v) == LK_REVITER))
            rfail(r, "'%s' object is not reversible", tv_type_name(v));
        if (v.t != TV_UNDEF && v.t != TV_LIST && v.t != TV_STR && v.t != TV_DICT)
            rfail(r, "'%s' object is not reversible", tv_type_name(v));
        tlist *items = filter_list(r, v);
        if (items->n) return items->v[items->n - 1];
        return make_undef(r, "No last item, sequence was empty.", false, tv_none(), tv_none());
    }
    case F_FLOAT: {
        static const char *const names[] = {"default"};
        bind(r, "do_float", a, names, 1, p);
        tv dflt = is_missing(p[0]) ? tv_float(0.0) : p[0];
        if (v.t == TV_UNDEF) fail_undefined(r, v);
        if (is_num(v)) return tv_float(num_d(v));
        if (v.t == TV_STR) {
            double d;
            if (parse_py_float(v.s->s, v.s->len, &d)) return tv_float(d);
        }
        return dflt;
    }
    case F_INT: {
        static const char *const names[] = {"default", "base"};
        bind(r, "do_int", a, names, 2, p);
        tv      dflt = is_missing(p[0]) ? tv_int(0) : p[0];
        int64_t base = is_missing(p[1]) ? 10 : want_int(r, p[1], NULL);
        if (v.t == TV_UNDEF) fail_undefined(r, v);
        if (is_intlike(v)) return tv_int(v.i);
        if (v.t == TV_FLOAT) {
            if (!isfinite(v.d)) return dflt;
            if (fabs(v.d) >= 9.2e18) int_overflow(r);
            return tv_int((int64_t)v.d);
        }
        if (v.t == TV_STR) {
            int64_t iv;
            if (parse_py_int(v.s->s, v.s->len, (int)base, &iv)) return tv_int(iv);
            double d;
            if (parse_py_float(v.s->s, v.s->len, &d) && isfinite(d)) {
                if (fabs(d) >= 9.2e18) int_overflow(r);
                return tv_int((int64_t)d);
            }
        }
        return dflt;
    }
    case F_FORMAT: {
        tv s = tv_soft_str(r, v);
        if (a->npos && a->nkw) rfail(r, "can't handle positional and keyword arguments at the same time");
        if (a->nkw) {
            tdict *d = dict_new(r, (size_t)a->nkw);
            for (int k = 0; k < a->nkw; k++) {
                const tstr *kn = name_str(r, a->kwid[k]);
                dict_set(r, d, mkstr(r, kn->s, kn->len), a->kwv[k]);
            }
            return str_percent_format(r, s, dict_tv(d));
        }
        tlist *l = mklist(r, (size_t)a->npos);
        for (int i = 0; i < a->npos; i++) l->v[i] = a->pos[i];
        tv res = tv_binop(r, OP_MOD, s, tv_list_kind(l, LK_TUPLE));
        return res;
    }
    case F_INDENT: {
        static const char *const names[] = {"width", "first", "blank"};
        bind(r, "do_indent", a, names, 3, p);
        return do_indent(r, v, p[0], p[1], p[2]);
    }
    case F_JOIN: {
        static const char *const names[] = {"d", "attribute"};
        bind(r, "do_join", a, names, 2, p);
        tv      d = is_missing(p[0]) ? mkstr(r, "", 0) : tv_str(r, p[0]);
        tlist  *items = filter_list(r, v);
        ag_buf *b = buf_get(r);
        for (size_t i = 0; i < items->n; i++) {
            if (i) buf_add(r, b, d.s->s, d.s->len);
            tv x = items->v[i];
            if (!is_missing(p[1])) x = attr_path(r, x, p[1], tv_missing());
            tv_write_str(r, b, x);
        }
        return buf_finish(r, b, false);
    }
    case F_LIST: {
        no_args(r, "list", a);
        tlist *items = filter_list(r, v);
        tlist *l = mklist(r, items->n);
        memcpy(l->v, items->v, sizeof(tv) * items->n);
        return tv_list_kind(l, LK_LIST);
    }
    case F_LOWER: no_args(r, "lower", a); return str_case(r, tv_soft_str(r, v), CASE_LOWER);
    case F_UPPER: no_args(r, "upper", a); return str_case(r, tv_soft_str(r, v), CASE_UPPER);
    case F_TITLE: no_args(r, "title", a); return jinja_title(r, tv_soft_str(r, v));
    case F_MIN:
    case F_MAX: {
        static const char *const names[] = {"case_sensitive", "attribute"};
        bind(r, id == F_MIN ? "do_min" : "do_max", a, names, 2, p);
        bool   cs = !is_missing(p[0]) && tv_truthy(r, p[0]);
        tlist *items = filter_list(r, v);
        if (!items->n) return make_undef(r, "No aggregated item, sequence was empty.", false, tv_none(), tv_none());
        size_t best = 0;
        tv     bk = attr_path(r, items->v[0], p[1], tv_missing());
        if (!cs) bk = lower_if_str(r, bk);
        for (size_t i = 1; i < items->n; i++) {
            tv k = attr_path(r, items->v[i], p[1], tv_missing());
            if (!cs) k = lower_if_str(r, k);
            int c = tv_cmp(r, k, bk, id == F_MIN ? "<" : ">");
            if (c != 2 && (id == F_MIN ? c < 0 : c > 0)) {
                best = i;
                bk = k;
            }
        }
        return items->v[best];
    }
    case F_REPLACE: {
        static const char *const names[] = {"old", "new", "count"};
        bind(r, "do_replace", a, names, 3, p);
        if (is_missing(p[0]) || is_missing(p[1])) rfail(r, "do_replace() missing required positional arguments");
        tv      s = tv_str(r, v);
        tv      o = tv_str(r, p[0]), nw = tv_str(r, p[1]);
        int64_t cnt = (is_missing(p[2]) || p[2].t == TV_NONE) ? -1 : want_int(r, p[2], NULL);
        return str_replace(r, s, o.s, nw.s, cnt, false);
    }
    case F_REVERSE: {
        no_args(r, "reverse", a);
        if (v.t == TV_STR) {
            ag_buf *b = buf_get(r);
            size_t  e = v.s->len;
            while (e > 0) {
                size_t st = e - 1;
                while (st > 0 && ((unsigned char)v.s->s[st] & 0xC0) == 0x80) st--;
                buf_add(r, b, v.s->s + st, e - st);
                e = st;
            }
            return buf_finish(r, b, v.f & TVF_SAFE);
        }
        /* reversed(Undefined) works: it has __len__ (0) and __getitem__ */
        if (v.t == TV_UNDEF) return tv_list_kind(mklist(r, 0), LK_REVITER);
        if (!(v.t == TV_LIST || v.t == TV_DICT || v.t == TV_GEN || v.t == TV_LOOP))
            rfail(r, "argument must be iterable");
        tlist *items = filter_list(r, v);
        tlist *l = mklist(r, items->n);
        for (size_t i = 0; i < items->n; i++) l->v[i] = items->v[items->n - 1 - i];
        bool reversible = (v.t == TV_LIST && (TV_LK(v) == LK_LIST || TV_LK(v) == LK_TUPLE || TV_LK(v) == LK_KEYS ||
                                              TV_LK(v) == LK_RANGE ||
                                              TV_LK(v) == LK_ITEMS || TV_LK(v) == LK_VALUES)) ||
                          v.t == TV_DICT;
        /* remember what was reversed: Python names the iterator after it */
        if (v.t == TV_DICT) l->r_start = 2;
        else if (v.t == TV_LIST)
            l->r_start = TV_LK(v) == LK_TUPLE ? 1 : TV_LK(v) == LK_KEYS ? 2 : TV_LK(v) == LK_RANGE ? 3
                       : TV_LK(v) == LK_ITEMS ? 4 : TV_LK(v) == LK_VALUES ? 5 : 0;
        return tv_list_kind(l, reversible ? LK_REVITER : LK_LIST);
    }
    case F_ROUND: {
        static const char *const names[] = {"precision", "method"};
        bind(r, "do_round", a, names, 2, p);
        return do_round(r, v, p[0], p[1]);
    }
    case F_SAFE: {
        no_args(r, "safe", a);
        tv s = tv_str(r, v);
        s.f |= TVF_SAFE;
        return s;
    }
    case F_SORT: {
        static const char *const names[] = {"reverse", "case_sensitive", "attribute"};
        bind(r, "do_sort", a, names, 3, p);
        bool   rev = !is_missing(p[0]) && tv_truthy(r, p[0]);
        bool   cs = !is_missing(p[1]) && tv_truthy(r, p[1]);
        tlist *items = tv_iterate(r, v);
        tv    *keys = ralloc(r, sizeof(tv) * (items->n + 1));
        for (size_t i = 0; i < items->n; i++) {
            step(r);
            keys[i] = sort_key(r, items->v[i], p[2], cs);
        }
        return tv_list_kind(sorted_list(r, items, keys, rev), LK_LIST);
    }
    case F_STRING: no_args(r, "string", a); return tv_soft_str(r, v);
    case F_SUM: {
        static const char *const names[] = {"attribute", "start"};
        bind(r, "sync_do_sum", a, names, 2, p);
        tv     acc = is_missing(p[1]) ? tv_int(0) : p[1];
        tlist *items = tv_iterate(r, v);
        for (size_t i = 0; i < items->n; i++) {
            step(r);
            tv x = attr_path(r, items->v[i], p[0], tv_missing());
            if (acc.t == TV_STR) rfail(r, "sum() can't sum strings [use ''.join(seq) instead]");
            acc = tv_binop(r, OP_ADD, acc, x);
        }
        return acc;
    }
    case F_TRIM: {
        static const char *const names[] = {"chars"};
        bind(r, "do_trim", a, names, 1, p);
        return str_strip(r, tv_soft_str(r, v), opt_chars(r, p[0], "strip"), true, true);
    }
    case F_TRUNCATE: {
        static const char *const names[] = {"length", "killwords", "end", "leeway"};
        bind(r, "do_truncate", a, names, 4, p);
        return do_truncate(r, v, p);
    }
    case F_WORDCOUNT: {
        no_args(r, "wordcount", a);
        tv      s = tv_soft_str(r, v);
        int64_t cnt = 0;
        bool    in = false;
        size_t  i = 0;
        while (i < s.s->len) {
            uint32_t c = tm_utf8_next(s.s->s, s.s->len, &i);
            bool     w = is_word(c);
            if (w && !in) cnt++;
            in = w;
        }
        return tv_int(cnt);
    }
    case F_TOJSON: {
        static const char *const names[] = {"ensure_ascii", "indent", "separators", "sort_keys"};
        bind(r, "tojson", a, names, 4, p);
        json_opts o = {0};
        o.ensure_ascii = !is_missing(p[0]) && tv_truthy(r, p[0]);
        o.sort_keys = !is_missing(p[3]) && tv_truthy(r, p[3]);
        if (!is_missing(p[1]) && p[1].t != TV_NONE) {
            if (p[1].t == TV_STR) {
                o.indent = p[1].s->s;
                o.indent_len = p[1].s->len;
            } else {
                int64_t w = want_int(r, p[1], NULL);
                if (w < 0) w = 0;
                if (w > 10000) rfail_code(r, AG_ERR_RANGE, "tojson indent too large");
                char *sp = ralloc(r, (size_t)w + 1);
                memset(sp, ' ', (size_t)w);
                o.indent = sp;
                o.indent_len = (size_t)w;
            }
        }
        if (!is_missing(p[2]) && p[2].t != TV_NONE) {
            tlist *sep = (p[2].t == TV_LIST) ? p[2].l : NULL;
            if (!sep || sep->n != 2 || sep->v[0].t != TV_STR || sep->v[1].t != TV_STR)
                rfail(r, "separators must be a pair of strings");
            o.item_sep = sep->v[0].s->s;
            o.item_sep_len = sep->v[0].s->len;
            o.key_sep = sep->v[1].s->s;
            o.key_sep_len = sep->v[1].s->len;
        } else {
            o.item_sep = o.indent ? "," : ", ";
            o.item_sep_len = o.indent ? 1 : 2;
            o.key_sep = ": ";
            o.key_sep_len = 2;
        }
        ag_buf *b = buf_get(r);
        tv_write_json(r, b, v, &o, 0);
        return buf_finish(r, b, false);
    }
    case F_GROUPBY: {
        static const char *const names[] = {"attribute", "default", "case_sensitive"};
        bind(r, "sync_do_groupby", a, names, 3, p);
        if (is_missing(p[0])) rfail(r, "sync_do_groupby() missing 1 required positional argument: 'attribute'");
        return do_groupby(r, v, p[0], p[1], !is_missing(p[2]) && tv_truthy(r, p[2]));
    }
    case F_STRIPTAGS: no_args(r, "do_striptags", a); return do_striptags(r, v);
    case F_WORDWRAP: {
        static const char *const names[] = {"width", "break_long_words", "wrapstring", "break_on_hyphens"};
        bind(r, "do_wordwrap", a, names, 4, p);
        return do_wordwrap(r, v, p);
    }
    case F_URLENCODE: no_args(r, "do_urlencode", a); return do_urlencode(r, v);
    case F_XMLATTR: {
        static const char *const names[] = {"autospace"};
        bind(r, "do_xmlattr", a, names, 1, p);
        return do_xmlattr(r, v, is_missing(p[0]) || tv_truthy(r, p[0]));
    }
    case F_FILESIZEFORMAT: {
        static const char *const names[] = {"binary"};
        bind(r, "do_filesizeformat", a, names, 1, p);
        return do_filesizeformat(r, v, !is_missing(p[0]) && tv_truthy(r, p[0]));
    }
    case F_PPRINT: no_args(r, "do_pprint", a); return do_pprint(r, v);
    case F_RANDOM:
    case F_URLIZE: rfail_code(r, AG_ERR_UNSUPPORTED, "unsupported: filter '%s'", tm_filter_name(id));
    }
    rfail_code(r, AG_ERR_INTERNAL, "internal error: unknown filter %d", id);
}

/* ================================================================ generators */

static bool is_gen_filter(int id) {
    switch (id) {
    case F_SELECT: case F_REJECT: case F_SELECTATTR: case F_REJECTATTR: case F_MAP: case F_ITEMS: case F_UNIQUE:
    case F_BATCH: case F_SLICE: return true;
    default: return false;
    }
}

const char *gen_pyname(int fid) {
    switch (fid) {
    case F_SELECT: case F_REJECT: case F_SELECTATTR: case F_REJECTATTR: return "select_or_reject";
    case F_MAP: return "sync_do_map";
    case F_ITEMS: return "do_items";
    case F_UNIQUE: return "sync_do_unique";
    case F_BATCH: return "do_batch";
    case F_SLICE: return "sync_do_slice";
    default: return "generator";
    }
}

tv make_gen(R *r, int fid, tv input, targs *a) {
    tgen *g = ralloc(r, sizeof *g);
    g->fid = fid;
    g->input = input;
    g->args = *a; /* the argument arrays live in the render arena */
    g->line = r->line;
    tv v = {.t = TV_GEN};
    v.g = g;
    return v;
}

static bool src_next(R *r, tgen *g, tv *out) {
    if (g->srcgen) return gen_next(r, g->srcgen, out);
    if (g->src && g->pos < g->src->n) {
        *out = g->src->v[g->pos++];
        return true;
    }
    return false;
}

static void src_open(R *r, tgen *g) {
    if (g->input.t == TV_GEN) g->srcgen = g->input.g;
    else g->src = tv_iterate(r, g->input);
}

static tv kwarg(R *r, targs *a, const char *name) {
    for (int k = 0; k < a->nkw; k++)
        if (kwname_is(r, a->kwid[k], name)) return a->kwv[k];
    return tv_missing();
}

/* The first step of a generator: what jinja2 does before its first yield. */
static void gen_start(R *r, tgen *g) {
    targs *a = &g->args;
    switch (g->fid) {
    case F_SELECT:
    case F_REJECT:
    case F_SELECTATTR:
    case F_REJECTATTR: {
        if (!tv_truthy(r, g->input)) {
            g->done = true;
            return;
        }
        bool by_attr = g->fid == F_SELECTATTR || g->fid == F_REJECTATTR;
        int  off = 0;
        g->attr = tv_missing();
        if (by_attr) {
            if (a->npos < 1) rfail(r, "Missing parameter for attribute name");
            g->attr = a->pos[0];
            off = 1;
        }
        g->test = -1;
        if (a->npos > off) {
            tv tn = a->pos[off];
            g->test = tn.t == TV_STR ? tm_test_id(tn.s->s, tn.s->len) : -2;
            if (g->test < 0) g->test = -2;
        }
        g->rest = (targs){.pos = a->pos + off + 1, .npos = a->npos > off + 1 ? a->npos - off - 1 : 0,
                          .kwid = a->kwid, .kwv = a->kwv, .nkw = a->nkw};
        src_open(r, g);
        return;
    }
    case F_MAP:
        if (!tv_truthy(r, g->input)) {
            g->done = true;
            return;
        }
        if (a->npos == 0 && !is_missing(kwarg(r, a, "attribute"))) {
            g->attr = kwarg(r, a, "attribute");
            g->dflt = kwarg(r, a, "default");
            for (int k = 0; k < a->nkw; k++)
                if (!kwname_is(r, a->kwid[k], "attribute") && !kwname_is(r, a->kwid[k], "default"))
                    rfail(r, "Unexpected keyword argument '%s'", name_str(r, a->kwid[k])->s);
            g->mapfid = -1;
        } else {
            if (a->npos == 0) rfail(r, "map requires a filter argument");
            tv   fname = a->pos[0];
            bool uns = false;
            g->mapfid = fname.t == TV_STR ? tm_filter_id(fname.s->s, fname.s->len, &uns) : -2;
            if (g->mapfid < 0) g->mapfid = -2;
            g->rest = (targs){.pos = a->pos + 1, .npos = a->npos - 1, .kwid = a->kwid, .kwv = a->kwv, .nkw = a->nkw};
        }
        src_open(r, g);
        return;
    case F_ITEMS: {
        if (a->npos || a->nkw) rfail(r, "do_items() takes 1 positional argument but %d were given", a->npos + 1);
        tv v = g->input;
        if (v.t == TV_UNDEF) {
            g->done = true;
            return;
        }
        if (v.t != TV_DICT) rfail(r, "Can only get item pairs from a mapping.");
        g->out = mklist(r, v.m->n);
        for (size_t i = 0; i < v.m->n; i++) {
            tlist *pr = mklist(r, 2);
            pr->v[0] = v.m->k[i];
            pr->v[1] = v.m->v[i];
            g->out->v[i] = tv_list_kind(pr, LK_TUPLE);
        }
        return;
    }
    case F_UNIQUE: {
        static const char *const names[] = {"case_sensitive", "attribute"};
        tv                       p[2];
        bind(r, "do_unique", a, names, 2, p);
        g->flag = !is_missing(p[0]) && tv_truthy(r, p[0]);
        g->attr = p[1];
        g->seen = dict_new(r, 8);
        src_open(r, g);
        return;
    }
    case F_BATCH: {
        static const char *const names[] = {"linecount", "fill_with"};
        tv                       p[2];
        bind(r, "do_batch", a, names, 2, p);
        if (is_missing(p[0])) rfail(r, "do_batch() missing 1 required positional argument: 'linecount'");
        int64_t n = want_int(r, p[0], NULL);
        if (n <= 0) rfail_code(r, AG_ERR_UNSUPPORTED, "unsupported: batch size below 1");
        g->dflt = p[1];
        g->attr = tv_int(n);
        src_open(r, g);
        return;
    }
    case F_SLICE: {
        static const char *const names[] = {"slices", "fill_with"};
        tv                       p[2];
        bind(r, "sync_do_slice", a, names, 2, p);
        if (is_missing(p[0])) rfail(r, "sync_do_slice() missing 1 required positional argument: 'slices'");
        src_open(r, g);
        tv    item;
        size_t n = 0, cap = 16;
        tv    *seq = ralloc(r, sizeof(tv) * cap);
        while (src_next(r, g, &item)) {
            if (n == cap) {
                tv *ns = ralloc(r, sizeof(tv) * cap * 2);
                memcpy(ns, seq, sizeof(tv) * n);
                seq = ns;
                cap *= 2;
            }
            seq[n++] = item;
        }
        int64_t slices = want_int(r, p[0], NULL);
        if (slices <= 0) {
            if (slices == 0 && n) rfail(r, "integer division or modulo by zero");
            g->out = mklist(r, 0);
            return;
        }
        if (slices > 100000) rfail(r, "Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000).");
        int64_t length = (int64_t)n, per = length / slices, extra = length % slices, offset = 0;
        g->out = mklist(r, (size_t)slices);
        for (int64_t sn = 0; sn < slices; sn++) {
            step(r);
            int64_t start = offset + sn * per;
            if (sn < extra) offset++;
            int64_t end = offset + (sn + 1) * per;
            bool    fill = !is_missing(p[1]) && p[1].t != TV_NONE && sn >= extra;
            tlist  *row = mklist(r, (size_t)(end - start) + (fill ? 1 : 0));
            for (int64_t k = start; k < end; k++) row->v[k - start] = seq[k];
            if (fill) row->v[end - start] = p[1];
            g->out->v[sn] = tv_list_kind(row, LK_LIST);
        }
        return;
    }
    }
}

bool gen_next(R *r, tgen *g, tv *out) {
    if (g->done) return false;
    int saved = r->line;
    r->line = g->line;
    if (!g->started) {
        g->started = true;
        gen_start(r, g);
        if (g->done) {
            r->line = saved;
            return false;
        }
    }
    bool got = false;
    tv   item;
    switch (g->fid) {
    case F_SELECT:
    case F_REJECT:
    case F_SELECTATTR:
    case F_REJECTATTR: {
        bool select = g->fid == F_SELECT || g->fid == F_SELECTATTR;
        bool by_attr = g->fid == F_SELECTATTR || g->fid == F_REJECTATTR;
        while (src_next(r, g, &item)) {
            step(r);
            tv x = by_attr ? attr_path(r, item, g->attr, tv_missing()) : item;
            if (g->test == -2) {
                tv tn = g->args.pos[by_attr ? 1 : 0];
                if (tn.t == TV_STR) rfail(r, "No test named '%s'.", tn.s->s);
                rfail(r, "No test named %s.", tv_type_name(tn));
            }
            bool t = g->test >= 0 ? call_test(r, g->test, x, &g->rest) : tv_truthy(r, x);
            if (t == select) {
                *out = item;
                got = true;
                break;
            }
        }
        break;
    }
    case F_MAP:
        if (src_next(r, g, &item)) {
            step(r);
            if (g->mapfid == -1) *out = attr_path(r, item, g->attr, g->dflt);
            else if (g->mapfid == -2) {
                tv fname = g->args.pos[0];
                if (fname.t == TV_STR) rfail(r, "No filter named '%s'.", fname.s->s);
                rfail(r, "No filter named %s.", tv_type_name(fname));
            } else *out = call_filter(r, g->mapfid, item, &g->rest);
            got = true;
        }
        break;
    case F_ITEMS:
    case F_SLICE:
        if (g->opos < g->out->n) {
            *out = g->out->v[g->opos++];
            got = true;
        }
        break;
    case F_UNIQUE:
        while (src_next(r, g, &item)) {
            step(r);
            tv key = attr_path(r, item, g->attr, tv_missing());
            if (!g->flag) key = lower_if_str(r, key);
            if (dict_get(r, g->seen, key)) continue;
            dict_set(r, g->seen, key, tv_none());
            *out = item;
            got = true;
            break;
        }
        break;
    case F_BATCH: {
        int64_t n = g->attr.i;
        tlist  *row = mklist(r, (size_t)n);
        size_t  k = 0;
        while (k < (size_t)n && src_next(r, g, &item)) {
            step(r);
            row->v[k++] = item;
        }
        if (k == 0) break;
        if (k < (size_t)n && !is_missing(g->dflt) && g->dflt.t != TV_NONE)
            for (; k < (size_t)n; k++) row->v[k] = g->dflt;
        row->n = k;
        *out = tv_list_kind(row, LK_LIST);
        got = true;
        break;
    }
    }
    if (!got) g->done = true;
    r->line = saved;
    return got;
}

tlist *gen_force(R *r, tgen *g) {
    size_t n = 0, cap = 16;
    tv    *items = ralloc(r, sizeof(tv) * cap), x;
    while (gen_next(r, g, &x)) {
        if (n == cap) {
            tv *ni = ralloc(r, sizeof(tv) * cap * 2);
            memcpy(ni, items, sizeof(tv) * n);
            items = ni;
            cap *= 2;
        }
        items[n++] = x;
    }
    tlist *l = mklist(r, n);
    memcpy(l->v, items, sizeof(tv) * n);
    return l;
}

tv call_filter(R *r, int id, tv v, targs *a) {
    if (is_gen_filter(id)) {
        if (id == F_BATCH || id == F_SLICE || id == F_UNIQUE) {
            /* positional/keyword binding fails at call time in Python */
            static const char *const bn[] = {"linecount", "fill_with"}, *const sn[] = {"slices", "fill_with"},
                                     *const un[] = {"case_sensitive", "attribute"};
            tv p[2];
            bind(r, id == F_BATCH ? "do_batch" : id == F_SLICE ? "sync_do_slice" : "do_unique", a,
                 id == F_BATCH ? bn : id == F_SLICE ? sn : un, 2, p);
        }
        return make_gen(r, id, v, a);
    }
    return filter_impl(r, id, v, a);
}
