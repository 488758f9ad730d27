/* Values with Python semantics: str() and repr() as CPython prints them,
 * == / < / hash as Python compares, json.dumps as Python's json module
 * writes it, and conversion from jansson values (object key order kept). */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "base/utf8.h"
#include "tmpl/render.h"

#define MAX_VALUE_DEPTH 2100

static uint64_t str_hash(const char *s, size_t n);

/* ---------------------------------------------------------------- errors */

_Noreturn void tm_fail(tm_err *e, ag_status code, int line, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->msg, sizeof e->msg, fmt, ap);
    va_end(ap);
    e->code = code;
    e->line = line;
    longjmp(e->jb, 1);
}

_Noreturn void rfail(R *r, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->err.msg, sizeof r->err.msg, fmt, ap);
    va_end(ap);
    r->err.code = AG_ERR_TEMPLATE;
    r->err.line = r->line;
    longjmp(r->err.jb, 1);
}

_Noreturn void rfail_code(R *r, ag_status code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->err.msg, sizeof r->err.msg, fmt, ap);
    va_end(ap);
    r->err.code = code;
    r->err.line = r->line;
    longjmp(r->err.jb, 1);
}

/* ---------------------------------------------------------------- arena */

struct tm_chunk {
    tm_chunk *next;
    size_t    size, off;
    max_align_t data[];
};

void *tm_alloc(tm_arena *a, size_t size) {
    size = (size + 15) & ~(size_t)15;
    if (size == 0) size = 16;
    if (a->limit && (size > a->limit || a->used > a->limit - size))
        tm_fail(a->err, AG_ERR_RANGE, a->err->line, "memory limit exceeded (%zu bytes)", a->limit);
    tm_chunk *c = a->head;
    if (!c || c->size - c->off < size) {
        size_t want = c ? c->size * 2 : 64 * 1024;
        if (want > 16 * 1024 * 1024) want = 16 * 1024 * 1024;
        if (want < size) want = size;
        c = malloc(sizeof *c + want);
        if (!c) tm_fail(a->err, AG_ERR_NOMEM, a->err->line, "out of memory");
        c->size = want;
        c->off = 0;
        c->next = a->head;
        a->head = c;
    }
    void *p = (char *)c->data + c->off;
    c->off += size;
    a->used += size;
    memset(p, 0, size);
    return p;
}

void tm_arena_free(tm_arena *a) {
    tm_chunk *c = a->head;
    while (c) {
        tm_chunk *n = c->next;
        free(c);
        c = n;
    }
    a->head = NULL;
    a->used = 0;
}

void *ralloc(R *r, size_t n) {
    r->err.line = r->line;
    return tm_alloc(&r->arena, n);
}

/* ---------------------------------------------------------------- buffers */

ag_buf *buf_get(R *r) {
    if (r->npool) return r->pool[--r->npool];
    if (r->nall == r->capall) {
        int      nc = r->capall ? r->capall * 2 : 16;
        ag_buf **na = realloc(r->all, sizeof(ag_buf *) * (size_t)nc);
        if (!na) rfail_code(r, AG_ERR_NOMEM, "out of memory");
        r->all = na;
        r->capall = nc;
    }
    if (r->npool == 0 && r->cappool < r->capall) {
        ag_buf **np = realloc(r->pool, sizeof(ag_buf *) * (size_t)r->capall);
        if (!np) rfail_code(r, AG_ERR_NOMEM, "out of memory");
        r->pool = np;
        r->cappool = r->capall;
    }
    ag_buf *b = calloc(1, sizeof *b);
    if (!b) rfail_code(r, AG_ERR_NOMEM, "out of memory");
    r->all[r->nall++] = b;
    return b;
}

void buf_put(R *r, ag_buf *b) {
    ag_buf_clear(b);
    if (r->npool < r->cappool) r->pool[r->npool++] = b;
}

void buf_add(R *r, ag_buf *b, const char *p, size_t n) {
    if (n == 0) return;
    if (b->len + n > r->max_output || b->len + n < b->len)
        rfail_code(r, AG_ERR_RANGE, "output limit exceeded (%zu bytes)", r->max_output);
    if (ag_buf_append(b, p, n) != AG_OK) rfail_code(r, AG_ERR_NOMEM, "out of memory");
}
void buf_adds(R *r, ag_buf *b, const char *s) { buf_add(r, b, s, strlen(s)); }
void buf_addc(R *r, ag_buf *b, char c) { buf_add(r, b, &c, 1); }

tv buf_finish(R *r, ag_buf *b, bool safe) {
    tv v = mkstr_safe(r, b->data ? b->data : "", b->len, safe);
    buf_put(r, b);
    return v;
}

/* ---------------------------------------------------------------- strings, lists */

tv mkstr_safe(R *r, const char *p, size_t n, bool safe) {
    tstr *x = ralloc(r, sizeof(tstr) + n + 1);
    if (n) memcpy(x->s, p, n);
    x->s[n] = 0;
    x->len = n;
    size_t cp = 0;
    for (size_t i = 0; i < n; i++) cp += ((unsigned char)p[i] & 0xC0) != 0x80;
    x->ncp = cp;
    tv v = {.t = TV_STR, .f = safe ? TVF_SAFE : 0};
    v.s = x;
    return v;
}
tv mkstr(R *r, const char *p, size_t n) { return mkstr_safe(r, p, n, false); }
tv mkcstr(R *r, const char *s) { return mkstr(r, s, strlen(s)); }

tlist *mklist(R *r, size_t n) {
    if (n > (SIZE_MAX - sizeof(tlist)) / sizeof(tv)) rfail_code(r, AG_ERR_RANGE, "list too large");
    tlist *l = ralloc(r, sizeof(tlist) + n * sizeof(tv));
    l->n = n;
    return l;
}

size_t cp_offset(const tstr *s, size_t cp) {
    if (cp >= s->ncp) return s->len;
    if (s->ncp == s->len) return cp;
    size_t i = 0, k = 0;
    while (i < s->len) {
        if (((unsigned char)s->s[i] & 0xC0) != 0x80) {
            if (k == cp) return i;
            k++;
        }
        i++;
    }
    return s->len;
}

/* ---------------------------------------------------------------- type names */

const char *tv_type_name(tv v) {
    switch (v.t) {
    case TV_UNDEF: return "Undefined";
    case TV_NONE: return "NoneType";
    case TV_BOOL: return "bool";
    case TV_INT: return "int";
    case TV_FLOAT: return "float";
    case TV_STR: return (v.f & TVF_SAFE) ? "Markup" : "str";
    case TV_LIST:
        switch (TV_LK(v)) {
        case LK_TUPLE: return "tuple";
        case LK_RANGE: return "range";
        case LK_REVITER:
            switch (v.l->r_start) {
            case 1: return "reversed";
            case 2: return "dict_reversekeyiterator";
            case 3: return "range_iterator";
            case 4: return "dict_reverseitemiterator";
            case 5: return "dict_reversevalueiterator";
            default: return "list_reverseiterator";
            }
        case LK_ITEMS: return "dict_items";
        case LK_KEYS: return "dict_keys";
        case LK_VALUES: return "dict_values";
        default: return "list";
        }
    case TV_DICT: return "dict";
    case TV_NS: return "Namespace";
    case TV_FUNC:
        if (v.fn->kind == FN_MACRO) return "Macro";
        if (v.fn->kind == FN_METHOD) return "builtin_function_or_method";
        if (v.fn->kind == FN_LOOP_CYCLE || v.fn->kind == FN_LOOP_CHANGED) return "method";
        if (v.fn->kind == FN_JOINER) return "Joiner";
        if (v.fn->kind == FN_GLOBAL && (v.fn->id == GL_RAISE_EXCEPTION || v.fn->id == GL_STRFTIME_NOW)) return "function";
        return "type";
    case TV_LOOP: return "LoopContext";
    case TV_GEN: return "generator";
    }
    return "object";
}

void object_type_repr(tv v, char *buf, size_t cap) {
    if (v.t == TV_NONE) {
        snprintf(buf, cap, "None");
        return;
    }
    const char *mod = NULL;
    if (v.t == TV_STR && (v.f & TVF_SAFE)) mod = "markupsafe";
    else if (v.t == TV_NS) mod = "jinja2.utils";
    else if (v.t == TV_LOOP) mod = "jinja2.runtime";
    else if (v.t == TV_FUNC && v.fn->kind == FN_MACRO) mod = "jinja2.runtime";
    else if (v.t == TV_UNDEF) mod = "jinja2.runtime";
    if (mod) snprintf(buf, cap, "%s.%s object", mod, tv_type_name(v));
    else snprintf(buf, cap, "%s object", tv_type_name(v));
}

/* ---------------------------------------------------------------- undefined */

tv make_undef(R *r, const char *hint, bool has_obj, tv obj, tv name) {
    tundef *u = ralloc(r, sizeof *u);
    u->hint = hint;
    u->has_obj = has_obj;
    u->obj = obj;
    u->name = name;
    tv v = {.t = TV_UNDEF};
    v.u = u;
    return v;
}

void undef_message(R *r, tv v, char *buf, size_t cap) {
    tundef *u = v.u;
    if (!u) {
        snprintf(buf, cap, "'None' is undefined"); /* Undefined() with nothing known */
        return;
    }
    if (u->hint) {
        snprintf(buf, cap, "%s", u->hint);
        return;
    }
    ag_buf *nb = buf_get(r);
    tv_write_repr(r, nb, u->name, 0);
    if (!u->has_obj) {
        snprintf(buf, cap, "%s is undefined", ag_buf_cstr(nb));
    } else {
        char otr[96];
        object_type_repr(u->obj, otr, sizeof otr);
        if (u->name.t != TV_STR) snprintf(buf, cap, "%s has no element %s", otr, ag_buf_cstr(nb));
        else snprintf(buf, cap, "'%s' has no attribute %s", otr, ag_buf_cstr(nb));
    }
    buf_put(r, nb);
}

_Noreturn void fail_undefined(R *r, tv u) {
    char msg[600];
    undef_message(r, u, msg, sizeof msg);
    rfail(r, "%s", msg);
}

/* ---------------------------------------------------------------- truthiness */

bool tv_truthy(R *r, tv v) {
    switch (v.t) {
    case TV_UNDEF:
    case TV_NONE: return false;
    case TV_BOOL:
    case TV_INT: return v.i != 0;
    case TV_FLOAT: return v.d != 0.0;
    case TV_STR: return v.s->len != 0;
    case TV_LIST:
        if (TV_LK(v) == LK_REVITER) return true;
        return v.l->n != 0;
    case TV_DICT: return v.m->n != 0;
    default: return true;
    }
}

/* ---------------------------------------------------------------- float repr */

/* Python's repr(float): the shortest digits that round-trip, in fixed
 * notation for exponents -4 <= e < 16, otherwise scientific with a signed
 * two-digit (at least) exponent. */
void write_float_repr(ag_buf *b, double d, R *r) {
    char out[64];
    if (isnan(d)) {
        buf_adds(r, b, "nan");
        return;
    }
    if (isinf(d)) {
        buf_adds(r, b, d < 0 ? "-inf" : "inf");
        return;
    }
    if (d == 0) {
        buf_adds(r, b, signbit(d) ? "-0.0" : "0.0");
        return;
    }
    char tmp[40];
    int  prec;
    for (prec = 1; prec <= 17; prec++) {
        snprintf(tmp, sizeof tmp, "%.*e", prec - 1, d);
        if (strtod(tmp, NULL) == d) break;
    }
    /* tmp: [-]D.DDDDe[+-]XX */
    const char *p = tmp;
    bool        neg = false;
    if (*p == '-') {
        neg = true;
        p++;
    }
    char digits[24];
    int  nd = 0;
    for (; *p && *p != 'e'; p++)
        if (*p >= '0' && *p <= '9') digits[nd++] = *p;
    while (nd > 1 && digits[nd - 1] == '0') nd--;
    digits[nd] = 0;
    int exp10 = atoi(p + 1); /* value = d.ddd * 10^exp10 */
    int decpt = exp10 + 1;   /* value = 0.ddd * 10^decpt */
    size_t o = 0;
    if (neg) out[o++] = '-';
    if (decpt > -4 && decpt <= 16) {
        if (decpt <= 0) {
            out[o++] = '0';
            out[o++] = '.';
            for (int k = 0; k < -decpt; k++) out[o++] = '0';
            for (int k = 0; k < nd; k++) out[o++] = digits[k];
        } else if (decpt >= nd) {
            for (int k = 0; k < nd; k++) out[o++] = digits[k];
            for (int k = nd; k < decpt; k++) out[o++] = '0';
            out[o++] = '.';
            out[o++] = '0';
        } else {
            for (int k = 0; k < decpt; k++) out[o++] = digits[k];
            out[o++] = '.';
            for (int k = decpt; k < nd; k++) out[o++] = digits[k];
        }
        out[o] = 0;
    } else {
        out[o++] = digits[0];
        if (nd > 1) {
            out[o++] = '.';
            for (int k = 1; k < nd; k++) out[o++] = digits[k];
        }
        int e = decpt - 1;
        snprintf(out + o, sizeof out - o, "e%c%02d", e < 0 ? '-' : '+', e < 0 ? -e : e);
    }
    buf_adds(r, b, out);
}

/* ---------------------------------------------------------------- str() and repr() */

static bool py_isprintable(uint32_t cp) {
    if (cp == ' ') return true;
    if (cp < 0x20 || cp == 0x7F) return false;
    if (cp < 0x7F) return true;
    utf8proc_category_t c = utf8proc_category((utf8proc_int32_t)cp);
    switch (c) {
    case UTF8PROC_CATEGORY_CC:
    case UTF8PROC_CATEGORY_CF:
    case UTF8PROC_CATEGORY_CS:
    case UTF8PROC_CATEGORY_CO:
    case UTF8PROC_CATEGORY_CN:
    case UTF8PROC_CATEGORY_ZL:
    case UTF8PROC_CATEGORY_ZP:
    case UTF8PROC_CATEGORY_ZS: return false;
    default: return true;
    }
}

static void write_str_repr(R *r, ag_buf *b, const tstr *s) {
    bool has_sq = memchr(s->s, '\'', s->len) != NULL, has_dq = memchr(s->s, '"', s->len) != NULL;
    char q = (has_sq && !has_dq) ? '"' : '\'';
    buf_addc(r, b, q);
    size_t i = 0, run = 0;
    while (i < s->len) {
        size_t   st = i;
        uint32_t c = tm_utf8_next(s->s, s->len, &i);
        char     esc[16];
        const char *e = NULL;
        if (c == (uint32_t)q || c == '\\') {
            esc[0] = '\\';
            esc[1] = (char)c;
            esc[2] = 0;
            e = esc;
        } else if (c == '\t') e = "\\t";
        else if (c == '\n') e = "\\n";
        else if (c == '\r') e = "\\r";
        else if (!py_isprintable(c)) {
            if (c < 0x100) snprintf(esc, sizeof esc, "\\x%02x", c);
            else if (c < 0x10000) snprintf(esc, sizeof esc, "\\u%04x", c);
            else snprintf(esc, sizeof esc, "\\U%08x", c);
            e = esc;
        }
        if (e) {
            if (run) buf_add(r, b, s->s + st - run, run);
            run = 0;
            buf_adds(r, b, e);
        } else run += i - st;
    }
    if (run) buf_add(r, b, s->s + s->len - run, run);
    buf_addc(r, b, q);
}

void tv_write_repr(R *r, ag_buf *b, tv v, int depth) {
    if (depth > MAX_VALUE_DEPTH) rfail_code(r, AG_ERR_RANGE, "value nested too deeply");
    char tmp[64];
    switch (v.t) {
    case TV_STR:
        if (v.f & TVF_SAFE) {
            buf_adds(r, b, "Markup(");
            write_str_repr(r, b, v.s);
            buf_addc(r, b, ')');
        } else write_str_repr(r, b, v.s);
        return;
    case TV_GEN:
        snprintf(tmp, sizeof tmp, "<generator object %s at %p>", gen_pyname(v.g->fid), (void *)v.g);
        buf_adds(r, b, tmp);
        return;
    case TV_LIST: {
        int k = TV_LK(v);
        if (k == LK_REVITER) {
            snprintf(tmp, sizeof tmp, "<%s object at %p>", tv_type_name(v), (void *)v.l);
            buf_adds(r, b, tmp);
            return;
        }
        if (k == LK_RANGE) {
            if (v.l->r_step == 1)
                snprintf(tmp, sizeof tmp, "range(%lld, %lld)", (long long)v.l->r_start, (long long)v.l->r_stop);
            else
                snprintf(tmp, sizeof tmp, "range(%lld, %lld, %lld)", (long long)v.l->r_start, (long long)v.l->r_stop,
                         (long long)v.l->r_step);
            buf_adds(r, b, tmp);
            return;
        }
        if (k == LK_ITEMS || k == LK_KEYS || k == LK_VALUES) {
            buf_adds(r, b, tv_type_name(v));
            buf_addc(r, b, '(');
        }
        bool tuple = k == LK_TUPLE;
        buf_addc(r, b, tuple ? '(' : '[');
        for (size_t i = 0; i < v.l->n; i++) {
            if (i) buf_adds(r, b, ", ");
            tv_write_repr(r, b, v.l->v[i], depth + 1);
        }
        if (tuple && v.l->n == 1) buf_addc(r, b, ',');
        buf_addc(r, b, tuple ? ')' : ']');
        if (k == LK_ITEMS || k == LK_KEYS || k == LK_VALUES) buf_addc(r, b, ')');
        return;
    }
    case TV_DICT:
        buf_addc(r, b, '{');
        for (size_t i = 0; i < v.m->n; i++) {
            if (i) buf_adds(r, b, ", ");
            tv_write_repr(r, b, v.m->k[i], depth + 1);
            buf_adds(r, b, ": ");
            tv_write_repr(r, b, v.m->v[i], depth + 1);
        }
        buf_addc(r, b, '}');
        return;
    case TV_NS: {
        buf_adds(r, b, "<Namespace ");
        tv d = {.t = TV_DICT};
        d.m = v.ns->attrs;
        tv_write_repr(r, b, d, depth + 1);
        buf_addc(r, b, '>');
        return;
    }
    case TV_UNDEF: buf_adds(r, b, "Undefined"); return;
    default: tv_write_str(r, b, v); return;
    }
}

void tv_write_str(R *r, ag_buf *b, tv v) {
    char tmp[160];
    switch (v.t) {
    case TV_UNDEF: return;
    case TV_NONE: buf_adds(r, b, "None"); return;
    case TV_BOOL: buf_adds(r, b, v.i ? "True" : "False"); return;
    case TV_INT:
        snprintf(tmp, sizeof tmp, "%lld", (long long)v.i);
        buf_adds(r, b, tmp);
        return;
    case TV_FLOAT: write_float_repr(b, v.d, r); return;
    case TV_STR: buf_add(r, b, v.s->s, v.s->len); return;
    case TV_LIST:
    case TV_DICT:
    case TV_GEN:
    case TV_NS: tv_write_repr(r, b, v, 0); return;
    case TV_FUNC:
        if (v.fn->kind == FN_MACRO) {
            buf_adds(r, b, "<Macro '");
            const tnode *m = v.fn->macro;
            const tstr  *nm = name_str(r, m->name);
            buf_add(r, b, nm->s, nm->len);
            buf_adds(r, b, "'>");
        } else if (v.fn->kind == FN_METHOD) {
            char self_t[64];
            snprintf(self_t, sizeof self_t, "%s", tv_type_name(v.fn->self));
            snprintf(tmp, sizeof tmp, "<built-in method %.20s of %.20s object at %p>", v.fn->mname ? v.fn->mname : "?",
                     self_t, (void *)v.fn);
            buf_adds(r, b, tmp);
        } else if (v.fn->kind == FN_GLOBAL) {
            static const char *names[] = {NULL, "<class 'jinja2.utils.Namespace'>", NULL, NULL,
                                          "<class 'dict'>", "<class 'jinja2.utils.Joiner'>",
                                          "<class 'jinja2.utils.Cycler'>"};
            const char *nm = v.fn->id >= 0 && v.fn->id < 7 ? names[v.fn->id] : NULL;
            if (nm) buf_adds(r, b, nm);
            else {
                snprintf(tmp, sizeof tmp, "<function %s at %p>",
                         v.fn->id == GL_RAISE_EXCEPTION ? "raise_exception"
                         : v.fn->id == GL_RANGE        ? "safe_range"
                                                       : "strftime_now",
                         (void *)v.fn);
                buf_adds(r, b, tmp);
            }
        } else if (v.fn->kind == FN_JOINER) {
            snprintf(tmp, sizeof tmp, "<jinja2.utils.Joiner object at %p>", (void *)v.fn);
            buf_adds(r, b, tmp);
        } else {
            snprintf(tmp, sizeof tmp, "<bound method LoopContext.%s of <LoopContext %zu/%zu>>",
                     v.fn->kind == FN_LOOP_CYCLE ? "cycle" : "changed", v.fn->loop->index0 + 1, v.fn->loop->items->n);
            buf_adds(r, b, tmp);
        }
        return;
    case TV_LOOP: {
        snprintf(tmp, sizeof tmp, "<LoopContext %zu/%zu>", v.lp->index0 + 1, v.lp->items->n);
        buf_adds(r, b, tmp);
        return;
    }
    }
}

tv tv_str(R *r, tv v) {
    if (v.t == TV_STR) {
        if (!(v.f & TVF_SAFE)) return v;
        tv w = v;
        w.f = 0;
        return w;
    }
    ag_buf *b = buf_get(r);
    tv_write_str(r, b, v);
    return buf_finish(r, b, false);
}

tv tv_soft_str(R *r, tv v) {
    if (v.t == TV_STR) return v;
    return tv_str(r, v);
}

void write_html_escaped(R *r, ag_buf *b, const char *s, size_t n) {
    size_t run = 0;
    for (size_t i = 0; i < n; i++) {
        const char *e = NULL;
        switch (s[i]) {
        case '&': e = "&amp;"; break;
        case '<': e = "&lt;"; break;
        case '>': e = "&gt;"; break;
        case '"': e = "&#34;"; break;
        case '\'': e = "&#39;"; break;
        }
        if (e) {
            if (run) buf_add(r, b, s + i - run, run);
            run = 0;
            buf_adds(r, b, e);
        } else run++;
    }
    if (run) buf_add(r, b, s + n - run, run);
}

/* ---------------------------------------------------------------- equality, ordering */

static int cmp_int_float(int64_t i, double d) {
    /* exact comparison of an int with a float, as Python does */
    if (isnan(d)) return 2; /* unordered */
    if (d >= 9.3e18) return -1;
    if (d <= -9.3e18) return 1;
    double fl = floor(d);
    int64_t fi = (int64_t)fl;
    if (i < fi) return -1;
    if (i > fi) return 1;
    return fl == d ? 0 : -1;
}

static int num_cmp(tv a, tv b) {
    if (a.t != TV_FLOAT && b.t != TV_FLOAT) return a.i < b.i ? -1 : a.i > b.i;
    if (a.t == TV_FLOAT && b.t == TV_FLOAT) {
        if (isnan(a.d) || isnan(b.d)) return 2;
        return a.d < b.d ? -1 : a.d > b.d;
    }
    if (a.t == TV_FLOAT) {
        int c = cmp_int_float(b.i, a.d);
        return c == 2 ? 2 : -c;
    }
    return cmp_int_float(a.i, b.d);
}

static bool is_seq_kind(tv v) { return v.t == TV_LIST && (TV_LK(v) == LK_LIST || TV_LK(v) == LK_TUPLE); }

bool tv_eq(R *r, tv a, tv b, int depth) {
    if (depth > MAX_VALUE_DEPTH) rfail_code(r, AG_ERR_RANGE, "value nested too deeply");
    if (is_num(a) && is_num(b)) return num_cmp(a, b) == 0;
    switch (a.t) {
    case TV_UNDEF: return b.t == TV_UNDEF;
    case TV_NONE: return b.t == TV_NONE;
    case TV_STR: return b.t == TV_STR && a.s->len == b.s->len && memcmp(a.s->s, b.s->s, a.s->len) == 0;
    case TV_LIST:
        if (b.t != TV_LIST) return false;
        if ((is_seq_kind(a) && is_seq_kind(b)) || (TV_LK(a) == LK_RANGE && TV_LK(b) == LK_RANGE)) {
            if (TV_LK(a) != TV_LK(b) || a.l->n != b.l->n) return false;
            for (size_t i = 0; i < a.l->n; i++)
                if (!tv_eq(r, a.l->v[i], b.l->v[i], depth + 1)) return false;
            return true;
        }
        if (TV_LK(a) == LK_KEYS && TV_LK(b) == LK_KEYS) { /* set-like */
            if (a.l->n != b.l->n) return false;
            for (size_t i = 0; i < a.l->n; i++) {
                bool found = false;
                for (size_t j = 0; j < b.l->n && !found; j++) found = tv_eq(r, a.l->v[i], b.l->v[j], depth + 1);
                if (!found) return false;
            }
            return true;
        }
        return a.l == b.l && a.f == b.f;
    case TV_DICT:
        if (b.t != TV_DICT || a.m->n != b.m->n) return false;
        for (size_t i = 0; i < a.m->n; i++) {
            tv *o = dict_get(r, b.m, a.m->k[i]);
            if (!o || !tv_eq(r, a.m->v[i], *o, depth + 1)) return false;
        }
        return true;
    case TV_NS: return b.t == TV_NS && a.ns == b.ns;
    case TV_FUNC: return b.t == TV_FUNC && a.fn == b.fn;
    case TV_LOOP: return b.t == TV_LOOP && a.lp == b.lp;
    case TV_GEN: return b.t == TV_GEN && a.g == b.g;
    default: return false;
    }
}

int tv_cmp(R *r, tv a, tv b, const char *opname) {
    if (a.t == TV_UNDEF) fail_undefined(r, a);
    if (b.t == TV_UNDEF) fail_undefined(r, b);
    if (is_num(a) && is_num(b)) {
        int c = num_cmp(a, b);
        return c; /* 2: unordered (nan): every comparison false */
    }
    if (a.t == TV_STR && b.t == TV_STR) {
        size_t n = a.s->len < b.s->len ? a.s->len : b.s->len;
        int    c = memcmp(a.s->s, b.s->s, n);
        if (c) return c < 0 ? -1 : 1;
        return a.s->len < b.s->len ? -1 : a.s->len > b.s->len;
    }
    if (is_seq_kind(a) && is_seq_kind(b) && TV_LK(a) == TV_LK(b)) {
        size_t n = a.l->n < b.l->n ? a.l->n : b.l->n;
        for (size_t i = 0; i < n; i++) {
            if (tv_eq(r, a.l->v[i], b.l->v[i], 1)) continue;
            return tv_cmp(r, a.l->v[i], b.l->v[i], opname);
        }
        return a.l->n < b.l->n ? -1 : a.l->n > b.l->n;
    }
    rfail(r, "'%s' not supported between instances of '%s' and '%s'", opname, tv_type_name(a), tv_type_name(b));
}

static uint64_t mix(uint64_t h) {
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdULL;
    h ^= h >> 33;
    return h;
}

uint64_t tv_hash(R *r, tv v, int depth) {
    if (depth > MAX_VALUE_DEPTH) rfail_code(r, AG_ERR_RANGE, "value nested too deeply");
    switch (v.t) {
    case TV_NONE: return 0x9e3779b97f4a7c15ULL;
    case TV_BOOL:
    case TV_INT: return mix((uint64_t)v.i);
    case TV_FLOAT:
        if (v.d == floor(v.d) && fabs(v.d) < 9.2e18) return mix((uint64_t)(int64_t)v.d);
        {
            uint64_t u;
            memcpy(&u, &v.d, sizeof u);
            return mix(u ^ 0x1234567);
        }
    case TV_STR: return str_hash(v.s->s, v.s->len);
    case TV_LIST:
        if (TV_LK(v) == LK_TUPLE) {
            uint64_t h = 0x345678;
            for (size_t i = 0; i < v.l->n; i++) h = mix(h ^ tv_hash(r, v.l->v[i], depth + 1)) + i;
            return h;
        }
        if (TV_LK(v) == LK_REVITER) return mix((uint64_t)(uintptr_t)v.l);
        if (TV_LK(v) == LK_RANGE) return mix((uint64_t)v.l->r_start * 31 + (uint64_t)v.l->n);
        rfail(r, "unhashable type: '%s'", tv_type_name(v));
    case TV_DICT: rfail(r, "unhashable type: 'dict'");
    case TV_UNDEF: return 0x55;
    default: return mix((uint64_t)(uintptr_t)v.fn);
    }
}

/* ---------------------------------------------------------------- dicts */

tdict *dict_new(R *r, size_t cap) {
    tdict *d = ralloc(r, sizeof *d);
    if (cap < 4) cap = 4;
    d->cap = cap;
    d->k = ralloc(r, sizeof(tv) * cap);
    d->v = ralloc(r, sizeof(tv) * cap);
    return d;
}

static void dict_reindex(R *r, tdict *d) {
    size_t ic = 16;
    while (ic < d->n * 2 + 2) ic *= 2;
    d->idx = ralloc(r, sizeof(uint32_t) * ic);
    d->icap = ic;
    for (size_t i = 0; i < d->n; i++) {
        size_t h = tv_hash(r, d->k[i], 0) & (ic - 1);
        while (d->idx[h]) h = (h + 1) & (ic - 1);
        d->idx[h] = (uint32_t)(i + 1);
    }
}

static long dict_find(R *r, tdict *d, tv k) {
    if (d->n <= 8 && !d->idx) {
        if (k.t == TV_LIST || k.t == TV_DICT) tv_hash(r, k, 0); /* unhashable check */
        for (size_t i = 0; i < d->n; i++)
            if (tv_eq(r, d->k[i], k, 0)) return (long)i;
        return -1;
    }
    if (!d->idx || d->icap < d->n * 2 + 2) dict_reindex(r, d);
    size_t h = tv_hash(r, k, 0) & (d->icap - 1);
    while (d->idx[h]) {
        size_t i = d->idx[h] - 1;
        if (tv_eq(r, d->k[i], k, 0)) return (long)i;
        h = (h + 1) & (d->icap - 1);
    }
    return -1;
}

tv *dict_get(R *r, tdict *d, tv k) {
    long i = dict_find(r, d, k);
    return i < 0 ? NULL : &d->v[i];
}

static uint64_t str_hash(const char *s, size_t n) {
    uint64_t h = 1469598103934665603ULL;
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 1099511628211ULL;
    return h;
}

tv *dict_get_str(R *r, tdict *d, const char *s, size_t n) {
    if (d->n <= 8 && !d->idx) {
        for (size_t i = 0; i < d->n; i++)
            if (d->k[i].t == TV_STR && d->k[i].s->len == n && memcmp(d->k[i].s->s, s, n) == 0) return &d->v[i];
        return NULL;
    }
    if (!d->idx || d->icap < d->n * 2 + 2) dict_reindex(r, d);
    size_t h = str_hash(s, n) & (d->icap - 1);
    while (d->idx[h]) {
        size_t i = d->idx[h] - 1;
        if (d->k[i].t == TV_STR && d->k[i].s->len == n && memcmp(d->k[i].s->s, s, n) == 0) return &d->v[i];
        h = (h + 1) & (d->icap - 1);
    }
    return NULL;
}

void dict_set(R *r, tdict *d, tv k, tv v) {
    long i = dict_find(r, d, k);
    if (i >= 0) {
        d->v[i] = v;
        return;
    }
    if (d->n == d->cap) {
        size_t nc = d->cap * 2;
        tv    *nk = ralloc(r, sizeof(tv) * nc);
        tv    *nv = ralloc(r, sizeof(tv) * nc);
        memcpy(nk, d->k, sizeof(tv) * d->n);
        memcpy(nv, d->v, sizeof(tv) * d->n);
        d->k = nk;
        d->v = nv;
        d->cap = nc;
    }
    d->k[d->n] = k;
    d->v[d->n] = v;
    d->n++;
    if (d->idx) {
        if (d->icap < d->n * 2 + 2) dict_reindex(r, d);
        else {
            size_t h = tv_hash(r, k, 0) & (d->icap - 1);
            while (d->idx[h]) h = (h + 1) & (d->icap - 1);
            d->idx[h] = (uint32_t)d->n;
        }
    }
}

/* ---------------------------------------------------------------- iteration, len */

tlist *tv_iterate(R *r, tv v) {
    switch (v.t) {
    case TV_UNDEF: return mklist(r, 0);
    case TV_LIST: return v.l;
    case TV_DICT: {
        tlist *l = mklist(r, v.m->n);
        for (size_t i = 0; i < v.m->n; i++) l->v[i] = v.m->k[i];
        return l;
    }
    case TV_STR: {
        tlist *l = mklist(r, v.s->ncp);
        size_t i = 0, k = 0;
        while (i < v.s->len && k < l->n) {
            size_t st = i;
            tm_utf8_next(v.s->s, v.s->len, &i);
            l->v[k++] = mkstr(r, v.s->s + st, i - st); /* iterating a Markup yields plain str */
        }
        l->n = k;
        return l;
    }
    case TV_LOOP: return v.lp->items;
    case TV_GEN: return gen_force(r, v.g);
    default: rfail(r, "'%s' object is not iterable", tv_type_name(v));
    }
}

int64_t tv_len(R *r, tv v) {
    switch (v.t) {
    case TV_UNDEF: return 0;
    case TV_STR: return (int64_t)v.s->ncp;
    case TV_LIST:
        if (TV_LK(v) == LK_REVITER) rfail(r, "object of type '%s' has no len()", tv_type_name(v));
        return (int64_t)v.l->n;
    case TV_DICT: return (int64_t)v.m->n;
    case TV_LOOP: return (int64_t)v.lp->items->n;
    default: rfail(r, "object of type '%s' has no len()", tv_type_name(v));
    }
}

/* ---------------------------------------------------------------- JSON out */

static void json_str(R *r, ag_buf *b, const char *s, size_t n, bool ensure_ascii) {
    buf_addc(r, b, '"');
    size_t i = 0, run = 0;
    while (i < n) {
        size_t   st = i;
        unsigned char c0 = (unsigned char)s[i];
        uint32_t c;
        if (c0 < 0x80) {
            c = c0;
            i++;
        } else c = tm_utf8_next(s, n, &i);
        char        esc[16];
        const char *e = NULL;
        switch (c) {
        case '"': e = "\\\""; break;
        case '\\': e = "\\\\"; break;
        case '\n': e = "\\n"; break;
        case '\r': e = "\\r"; break;
        case '\t': e = "\\t"; break;
        case '\b': e = "\\b"; break;
        case '\f': e = "\\f"; break;
        default:
            if (c < 0x20 || (ensure_ascii && c >= 0x7F)) {
                if (ensure_ascii && c >= 0x10000) {
                    uint32_t v = c - 0x10000;
                    snprintf(esc, sizeof esc, "\\u%04x\\u%04x", 0xD800 + (v >> 10), 0xDC00 + (v & 0x3FF));
                } else snprintf(esc, sizeof esc, "\\u%04x", c);
                e = esc;
            }
        }
        if (e) {
            if (run) buf_add(r, b, s + st - run, run);
            run = 0;
            buf_adds(r, b, e);
        } else run += i - st;
    }
    if (run) buf_add(r, b, s + n - run, run);
    buf_addc(r, b, '"');
}

static void json_float(R *r, ag_buf *b, double d) {
    if (isnan(d)) buf_adds(r, b, "NaN");
    else if (isinf(d)) buf_adds(r, b, d < 0 ? "-Infinity" : "Infinity");
    else write_float_repr(b, d, r);
}

static void json_newline(R *r, ag_buf *b, const json_opts *o, int level) {
    buf_addc(r, b, '\n');
    for (int i = 0; i < level; i++) buf_add(r, b, o->indent, o->indent_len);
}

/* ---- sorting, as CPython's list.sort compares: the order of comparisons
 * decides which TypeError a mixed list raises, so small lists (where CPython
 * uses count_run + binary insertion) follow it exactly; longer ones use a
 * stable merge sort (same result, comparison order may differ). */

static bool py_lt(R *r, tv a, tv b) {
    int c = tv_cmp(r, a, b, "<");
    return c != 2 && c < 0;
}

static void swap_pair(tv *keys, size_t *idx, size_t i, size_t j) {
    tv t = keys[i];
    keys[i] = keys[j];
    keys[j] = t;
    size_t u = idx[i];
    idx[i] = idx[j];
    idx[j] = u;
}

static void merge_idx(R *r, tv *keys, size_t *idx, size_t n, tv *tk, size_t *ti) {
    if (n < 2) return;
    size_t h = n / 2;
    merge_idx(r, keys, idx, h, tk, ti);
    merge_idx(r, keys + h, idx + h, n - h, tk, ti);
    size_t i = 0, j = h, o = 0;
    while (i < h && j < n) {
        if (py_lt(r, keys[j], keys[i])) {
            tk[o] = keys[j];
            ti[o++] = idx[j++];
        } else {
            tk[o] = keys[i];
            ti[o++] = idx[i++];
        }
    }
    while (i < h) {
        tk[o] = keys[i];
        ti[o++] = idx[i++];
    }
    while (j < n) {
        tk[o] = keys[j];
        ti[o++] = idx[j++];
    }
    memcpy(keys, tk, sizeof(tv) * n);
    memcpy(idx, ti, sizeof(size_t) * n);
}

void py_sort(R *r, tv *keys, size_t *idx, size_t n, bool reverse) {
    if (reverse)
        for (size_t i = 0; i < n / 2; i++) swap_pair(keys, idx, i, n - 1 - i);
    if (n >= 2 && n < 64) {
        /* count_run */
        size_t run = 2;
        bool   desc = false;
        if (py_lt(r, keys[1], keys[0])) {
            desc = true;
            while (run < n && py_lt(r, keys[run], keys[run - 1])) run++;
        } else {
            while (run < n && !py_lt(r, keys[run], keys[run - 1])) run++;
        }
        if (desc)
            for (size_t i = 0; i < run / 2; i++) swap_pair(keys, idx, i, run - 1 - i);
        /* binarysort */
        for (size_t start = run; start < n; start++) {
            tv     pivot = keys[start];
            size_t pidx = idx[start], l = 0, rr = start;
            do {
                size_t p = l + ((rr - l) >> 1);
                if (py_lt(r, pivot, keys[p])) rr = p;
                else l = p + 1;
            } while (l < rr);
            for (size_t k = start; k > l; k--) {
                keys[k] = keys[k - 1];
                idx[k] = idx[k - 1];
            }
            keys[l] = pivot;
            idx[l] = pidx;
        }
    } else if (n >= 64) {
        tv     *tk = ralloc(r, sizeof(tv) * n);
        size_t *ti = ralloc(r, sizeof(size_t) * n);
        merge_idx(r, keys, idx, n, tk, ti);
    }
    if (reverse)
        for (size_t i = 0; i < n / 2; i++) swap_pair(keys, idx, i, n - 1 - i);
}

void tv_write_json(R *r, ag_buf *b, tv v, const json_opts *o, int level) {
    if (level > MAX_VALUE_DEPTH) rfail_code(r, AG_ERR_RANGE, "value nested too deeply");
    char tmp[64];
    switch (v.t) {
    case TV_NONE: buf_adds(r, b, "null"); return;
    case TV_BOOL: buf_adds(r, b, v.i ? "true" : "false"); return;
    case TV_INT:
        snprintf(tmp, sizeof tmp, "%lld", (long long)v.i);
        buf_adds(r, b, tmp);
        return;
    case TV_FLOAT: json_float(r, b, v.d); return;
    case TV_STR: json_str(r, b, v.s->s, v.s->len, o->ensure_ascii); return;
    case TV_LIST:
        if (is_seq_kind(v)) {
            if (v.l->n == 0) {
                buf_adds(r, b, "[]");
                return;
            }
            buf_addc(r, b, '[');
            for (size_t i = 0; i < v.l->n; i++) {
                if (i) buf_add(r, b, o->item_sep, o->item_sep_len);
                if (o->indent) json_newline(r, b, o, level + 1);
                tv_write_json(r, b, v.l->v[i], o, level + 1);
            }
            if (o->indent) json_newline(r, b, o, level);
            buf_addc(r, b, ']');
            return;
        }
        break;
    case TV_DICT: {
        if (v.m->n == 0) {
            buf_adds(r, b, "{}");
            return;
        }
        size_t n = v.m->n;
        size_t *idx = ralloc(r, sizeof(size_t) * n);
        for (size_t i = 0; i < n; i++) idx[i] = i;
        if (o->sort_keys) {
            tv *keys = ralloc(r, sizeof(tv) * n);
            memcpy(keys, v.m->k, sizeof(tv) * n);
            py_sort(r, keys, idx, n, false);
        }
        buf_addc(r, b, '{');
        for (size_t k = 0; k < n; k++) {
            size_t i = idx[k];
            tv     key = v.m->k[i];
            if (k) buf_add(r, b, o->item_sep, o->item_sep_len);
            if (o->indent) json_newline(r, b, o, level + 1);
            switch (key.t) {
            case TV_STR: json_str(r, b, key.s->s, key.s->len, o->ensure_ascii); break;
            case TV_INT:
                snprintf(tmp, sizeof tmp, "\"%lld\"", (long long)key.i);
                buf_adds(r, b, tmp);
                break;
            case TV_BOOL: buf_adds(r, b, key.i ? "\"true\"" : "\"false\""); break;
            case TV_NONE: buf_adds(r, b, "\"null\""); break;
            case TV_FLOAT:
                buf_addc(r, b, '"');
                json_float(r, b, key.d);
                buf_addc(r, b, '"');
                break;
            default: rfail(r, "keys must be str, int, float, bool or None, not %s", tv_type_name(key));
            }
            buf_add(r, b, o->key_sep, o->key_sep_len);
            tv_write_json(r, b, v.m->v[i], o, level + 1);
        }
        if (o->indent) json_newline(r, b, o, level);
        buf_addc(r, b, '}');
        return;
    }
    default: break;
    }
    rfail(r, "Object of type %s is not JSON serializable", tv_type_name(v));
}

/* ---------------------------------------------------------------- JSON in */

tv tv_from_json(R *r, const json_t *j, int depth) {
    if (depth > MAX_VALUE_DEPTH) rfail_code(r, AG_ERR_RANGE, "value nested too deeply");
    switch (json_typeof(j)) {
    case JSON_NULL: return tv_none();
    case JSON_TRUE: return tv_bool(true);
    case JSON_FALSE: return tv_bool(false);
    case JSON_INTEGER: return tv_int((int64_t)json_integer_value(j));
    case JSON_REAL: return tv_float(json_real_value(j));
    case JSON_STRING: return mkstr(r, json_string_value(j), json_string_length(j));
    case JSON_ARRAY: {
        size_t n = json_array_size(j);
        tlist *l = mklist(r, n);
        for (size_t i = 0; i < n; i++) l->v[i] = tv_from_json(r, json_array_get(j, i), depth + 1);
        return tv_list_kind(l, LK_LIST);
    }
    case JSON_OBJECT: {
        tdict      *d = dict_new(r, json_object_size(j));
        const char *key;
        json_t     *val;
        json_object_foreach((json_t *)j, key, val) {
            size_t klen = strlen(key);
            /* jansson keys may hold NUL when JSON_ALLOW_NUL is used; the
             * iteration API gives a C string, so use its length */
            dict_set(r, d, mkstr(r, key, klen), tv_from_json(r, val, depth + 1));
        }
        tv v = {.t = TV_DICT};
        v.m = d;
        return v;
    }
    }
    return tv_none();
}
