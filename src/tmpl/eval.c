/* The tree-walking renderer, with jinja2's runtime rules:
 *  - scopes: a for-loop iteration, a macro call and a with block each get a
 *    fresh scope whose parent is the enclosing one, so `set` inside them
 *    never leaks out (hence namespace()); if-blocks share their scope;
 *  - attribute access falls back to item access and vice versa (the
 *    sandbox's getattr/getitem), misses give Undefined values that print as
 *    "" and fail with jinja2's message when used;
 *  - macros close over the scope they are defined in, and see later
 *    assignments to it (jinja2 resolves them through the live context). */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/utf8.h"
#include "tmpl/render.h"
#include "tmpl/tmpl.h"

enum { FLOW_NORMAL, FLOW_BREAK, FLOW_CONTINUE };

static tv  eval(R *r, const tnode *n, tframe *fr);
static int exec_body(R *r, tnode *const *body, int n, tframe *fr);

const tstr *name_str(R *r, int id) { return r->T->names.names[id]; }

void step(R *r) {
    if (++r->steps > r->max_steps)
        rfail_code(r, AG_ERR_RANGE, "template step limit exceeded (%llu loop iterations and calls)",
                   (unsigned long long)r->max_steps);
}

/* ---------------------------------------------------------------- frames */

static tv global_fn(R *r, int gl) {
    tfunc *f = ralloc(r, sizeof *f);
    f->kind = FN_GLOBAL;
    f->id = gl;
    tv v = {.t = TV_FUNC};
    v.fn = f;
    return v;
}

/* jinja2's context.resolve_or_missing: render variables, then globals */
static tv ctx_resolve(R *r, int id) {
    if (id >= 0 && id < r->nctx && !is_missing(r->ctxv[id])) return r->ctxv[id];
    switch (id) {
    case NM_RANGE: return global_fn(r, GL_RANGE);
    case NM_NAMESPACE: return global_fn(r, GL_NAMESPACE);
    case NM_RAISE_EXCEPTION: return global_fn(r, GL_RAISE_EXCEPTION);
    case NM_STRFTIME_NOW: return global_fn(r, GL_STRFTIME_NOW);
    case NM_DICT: return global_fn(r, GL_DICT);
    case NM_JOINER: return global_fn(r, GL_JOINER);
    case NM_CYCLER: return global_fn(r, GL_CYCLER);
    }
    return tv_missing();
}

static tframe *frame_up(tframe *f, int hops) {
    while (f && hops-- > 0) f = f->parent;
    return f;
}

/* Enters a frame: every slot starts as its load instruction says. */
static tframe *frame_enter(R *r, const tframe_info *fi, tframe *parent) {
    tframe *f = ralloc(r, sizeof *f);
    f->parent = parent;
    f->fi = fi;
    f->slots = ralloc(r, sizeof(tv) * (size_t)(fi->nslots + 1));
    for (int i = 0; i < fi->nslots; i++) {
        tv v = tv_missing();
        if (fi->act[i] == ACT_RESOLVE) v = ctx_resolve(r, fi->names[i]);
        else if (fi->act[i] == ACT_ALIAS) {
            tframe *t = frame_up(parent, fi->alias_hops[i] - 1);
            if (t && fi->alias_slot[i] < t->fi->nslots) v = t->slots[fi->alias_slot[i]];
        }
        f->slots[i] = v;
    }
    return f;
}

static tv undefined_name(R *r, int id) {
    tv name = {.t = TV_STR};
    name.s = (tstr *)name_str(r, id);
    return make_undef(r, NULL, false, tv_none(), name);
}

static tv load_name(R *r, const tnode *n, tframe *fr) {
    tv v;
    if (n->hops < 0) v = ctx_resolve(r, n->name);
    else {
        tframe *t = frame_up(fr, n->hops);
        v = (t && n->slot >= 0 && n->slot < t->fi->nslots) ? t->slots[n->slot] : tv_missing();
    }
    if (is_missing(v)) return undefined_name(r, n->name);
    return v;
}

static void store_slot(R *r, tframe *fr, int hops, int slot, tv v) {
    tframe *t = frame_up(fr, hops < 0 ? 0 : hops);
    if (!t || slot < 0 || slot >= t->fi->nslots) rfail_code(r, AG_ERR_INTERNAL, "internal error: unresolved store");
    t->slots[slot] = v;
}

/* stores by name into a frame (the loop filter frame shares the target
 * nodes with the loop body frame, whose slots they were resolved to) */
static void store_by_name(R *r, tframe *fr, int name, tv v) {
    for (int i = 0; i < fr->fi->nslots; i++)
        if (fr->fi->names[i] == name) {
            fr->slots[i] = v;
            return;
        }
    rfail_code(r, AG_ERR_INTERNAL, "internal error: unresolved loop target");
}

/* ---------------------------------------------------------------- attribute / item access */

static tv loop_attr(R *r, tloop *lp, const tstr *name) {
    const char *s = name->s;
    size_t      n = lp->items->n, i0 = lp->index0;
    if (!strcmp(s, "index")) return tv_int((int64_t)i0 + 1);
    if (!strcmp(s, "index0")) return tv_int((int64_t)i0);
    if (!strcmp(s, "revindex")) return tv_int((int64_t)(n - i0));
    if (!strcmp(s, "revindex0")) return tv_int((int64_t)(n - i0 - 1));
    if (!strcmp(s, "first")) return tv_bool(i0 == 0);
    if (!strcmp(s, "last")) return tv_bool(i0 + 1 >= n);
    if (!strcmp(s, "length")) return tv_int((int64_t)n);
    if (!strcmp(s, "depth")) return tv_int(lp->depth0 + 1);
    if (!strcmp(s, "depth0")) return tv_int(lp->depth0);
    if (!strcmp(s, "previtem")) {
        if (i0 == 0) return make_undef(r, "there is no previous item", false, tv_none(), tv_none());
        return lp->items->v[i0 - 1];
    }
    if (!strcmp(s, "nextitem")) {
        if (i0 + 1 >= n) return make_undef(r, "there is no next item", false, tv_none(), tv_none());
        return lp->items->v[i0 + 1];
    }
    if (!strcmp(s, "cycle") || !strcmp(s, "changed")) {
        tfunc *f = ralloc(r, sizeof *f);
        f->kind = s[1] == 'y' ? FN_LOOP_CYCLE : FN_LOOP_CHANGED;
        f->loop = lp;
        tv v = {.t = TV_FUNC};
        v.fn = f;
        return v;
    }
    tv obj = {.t = TV_LOOP};
    obj.lp = lp;
    tv nm = {.t = TV_STR};
    nm.s = (tstr *)name;
    return make_undef(r, NULL, true, obj, nm);
}

static tv unsafe_undef(R *r, tv obj, const tstr *name) {
    char *hint = ralloc(r, name->len + 96);
    snprintf(hint, name->len + 96, "access to attribute '%s' of '%s' object is unsafe.", name->s, tv_type_name(obj));
    return make_undef(r, hint, false, tv_none(), tv_none());
}

tv tv_getattr(R *r, tv obj, const tstr *name) {
    tv nm = {.t = TV_STR};
    nm.s = (tstr *)name;
    if (obj.t == TV_UNDEF) fail_undefined(r, obj);
    if (name->len >= 2 && name->s[0] == '_' && name->s[1] == '_' && obj.t != TV_DICT) return unsafe_undef(r, obj, name);
    tv m;
    switch (obj.t) {
    case TV_DICT: {
        if (name->len >= 2 && name->s[0] == '_' && name->s[1] == '_') {
            tv *p = dict_get_str(r, obj.m, name->s, name->len);
            if (p) return *p;
            return unsafe_undef(r, obj, name);
        }
        if (method_lookup(r, obj, name, &m)) return m;
        tv *p = dict_get_str(r, obj.m, name->s, name->len);
        if (p) return *p;
        break;
    }
    case TV_NS: {
        tv *p = dict_get_str(r, obj.ns->attrs, name->s, name->len);
        if (p) return *p;
        break;
    }
    case TV_LOOP: return loop_attr(r, obj.lp, name);
    case TV_STR:
    case TV_LIST:
        if (method_lookup(r, obj, name, &m)) return m;
        if (obj.t == TV_LIST && TV_LK(obj) == LK_TUPLE && obj.l->r_start == TL_GROUP_TUPLE && obj.l->n == 2) {
            if (!strcmp(name->s, "grouper")) return obj.l->v[0];
            if (!strcmp(name->s, "list")) return obj.l->v[1];
        }
        break;
    default: break;
    }
    return make_undef(r, NULL, true, obj, nm);
}

static bool index_of(tv key, int64_t len, int64_t *out) {
    if (!is_intlike(key)) return false;
    int64_t i = key.i;
    if (i < 0) i += len;
    if (i < 0 || i >= len) return false;
    *out = i;
    return true;
}

tv tv_getitem(R *r, tv obj, tv key) {
    if (obj.t == TV_UNDEF) fail_undefined(r, obj);
    int64_t i;
    switch (obj.t) {
    case TV_DICT:
        if (!(key.t == TV_LIST && (TV_LK(key) != LK_TUPLE)) && key.t != TV_DICT) {
            tv *p = dict_get(r, obj.m, key);
            if (p) return *p;
        }
        break;
    case TV_LIST:
        if (TV_LK(obj) == LK_LIST || TV_LK(obj) == LK_TUPLE || TV_LK(obj) == LK_RANGE) {
            if (index_of(key, (int64_t)obj.l->n, &i)) return obj.l->v[i];
        }
        break;
    case TV_STR:
        if (index_of(key, (int64_t)obj.s->ncp, &i)) {
            size_t a = cp_offset(obj.s, (size_t)i), b = cp_offset(obj.s, (size_t)i + 1);
            return mkstr_safe(r, obj.s->s + a, b - a, obj.f & TVF_SAFE);
        }
        break;
    default: break;
    }
    if (key.t == TV_STR) {
        if (obj.t == TV_NS || obj.t == TV_LOOP) return tv_getattr(r, obj, key.s);
        tv m;
        if ((obj.t == TV_DICT || obj.t == TV_STR || obj.t == TV_LIST) && method_lookup(r, obj, key.s, &m)) return m;
    }
    return make_undef(r, NULL, true, obj, key);
}

static int64_t slice_bound(R *r, tv v, bool *none) {
    *none = false;
    if (v.t == TV_NONE || is_missing(v)) {
        *none = true;
        return 0;
    }
    if (!is_intlike(v)) rfail(r, "slice indices must be integers or None or have an __index__ method");
    return v.i;
}

static tv do_slice(R *r, tv obj, tv vstart, tv vstop, tv vstep) {
    if (obj.t == TV_UNDEF) fail_undefined(r, obj);
    bool    ns, ne, nst;
    int64_t start = slice_bound(r, vstart, &ns), stop = slice_bound(r, vstop, &ne), stp = slice_bound(r, vstep, &nst);
    if (nst) stp = 1;
    if (stp == 0) rfail(r, "slice step cannot be zero");
    /* jinja2 compiles a slice to a plain Python subscription (not the
     * sandbox's getitem), so errors surface as Python's */
    int64_t len;
    if (obj.t == TV_STR) len = (int64_t)obj.s->ncp;
    else if (obj.t == TV_LIST && (TV_LK(obj) == LK_LIST || TV_LK(obj) == LK_TUPLE || TV_LK(obj) == LK_RANGE))
        len = (int64_t)obj.l->n;
    else if (obj.t == TV_DICT) rfail(r, "unhashable type: 'slice'");
    else rfail(r, "'%s' object is not subscriptable", tv_type_name(obj));
    int64_t lower = stp < 0 ? -1 : 0, upper = stp < 0 ? len - 1 : len;
    if (ns) start = stp < 0 ? upper : lower;
    else {
        if (start < 0) {
            start += len;
            if (start < lower) start = lower;
        } else if (start > upper) start = upper;
    }
    if (ne) stop = stp < 0 ? lower : upper;
    else {
        if (stop < 0) {
            stop += len;
            if (stop < lower) stop = lower;
        } else if (stop > upper) stop = upper;
    }
    int64_t count = 0;
    if (stp > 0 && start < stop) count = (stop - start - 1) / stp + 1;
    else if (stp < 0 && start > stop) count = (start - stop - 1) / (-stp) + 1;
    if (obj.t == TV_LIST) {
        tlist *l = mklist(r, (size_t)count);
        for (int64_t k = 0; k < count; k++) l->v[k] = obj.l->v[start + k * stp];
        if (TV_LK(obj) == LK_RANGE) { /* range(a, b, s)[i:j:k] is range(a+i*s, a+j*s, s*k) */
            l->r_start = obj.l->r_start + start * obj.l->r_step;
            l->r_stop = obj.l->r_start + stop * obj.l->r_step;
            l->r_step = obj.l->r_step * stp;
        }
        return tv_list_kind(l, TV_LK(obj));
    }
    ag_buf *b = buf_get(r);
    if (stp == 1 && count > 0) {
        size_t a = cp_offset(obj.s, (size_t)start), e = cp_offset(obj.s, (size_t)(start + count));
        buf_add(r, b, obj.s->s + a, e - a);
    } else {
        for (int64_t k = 0; k < count; k++) {
            int64_t idx = start + k * stp;
            size_t  a = cp_offset(obj.s, (size_t)idx), e = cp_offset(obj.s, (size_t)idx + 1);
            buf_add(r, b, obj.s->s + a, e - a);
        }
    }
    return buf_finish(r, b, obj.f & TVF_SAFE);
}

/* ---------------------------------------------------------------- calls */

static tv capture_body(R *r, tnode *const *body, int n, tframe *fr) {
    ag_buf *saved = r->out, *b = buf_get(r);
    r->out = b;
    exec_body(r, body, n, fr);
    r->out = saved;
    return buf_finish(r, b, false);
}

static tv call_macro(R *r, tfunc *f, targs *a) {
    const tnode *m = f->macro;
    const char  *mname = name_str(r, m->name)->s;
    if (++r->depth > r->max_depth)
        rfail_code(r, AG_ERR_RANGE, "maximum recursion depth exceeded (macro calls nested too deeply, more than %d)", r->max_depth);
    step(r);
    /* argument binding as jinja2's Macro.__call__ */
    int     np = m->nitems, nd = m->nitems2;
    tframe *mf = frame_enter(r, m->fr, f->closure);
    tv     *vals = ralloc(r, sizeof(tv) * (size_t)(np + 1));
    bool   *used_kw = ralloc(r, (size_t)a->nkw + 1);
    int     npos = a->npos < np ? a->npos : np;
    for (int i = 0; i < np; i++) vals[i] = tv_missing();
    for (int i = 0; i < npos; i++) vals[i] = a->pos[i];
    bool found_caller = false;
    if (npos != np) {
        for (int i = npos; i < np; i++) {
            int pid = m->items[i]->name;
            for (int k = 0; k < a->nkw; k++)
                if (!used_kw[k] && a->kwid[k] == pid) {
                    vals[i] = a->kwv[k];
                    used_kw[k] = true;
                    break;
                }
            if (pid == NM_CALLER) found_caller = true;
        }
    } else {
        for (int i = 0; i < np; i++)
            if (m->items[i]->name == NM_CALLER) found_caller = true;
    }
    tv caller = {.t = TV_UNDEF};
    if (m->caller_slot >= 0 && !found_caller) {
        bool have = false;
        for (int k = 0; k < a->nkw; k++)
            if (!used_kw[k] && a->kwid[k] == NM_CALLER) {
                caller = a->kwv[k];
                used_kw[k] = true;
                have = true;
                break;
            }
        if (!have) caller = make_undef(r, "No caller defined", false, tv_none(), tv_none());
    }
    tdict *kwd = NULL;
    if (m->kwargs_slot >= 0) {
        kwd = dict_new(r, 4);
        for (int k = 0; k < a->nkw; k++)
            if (!used_kw[k]) {
                const tstr *kn = name_str(r, a->kwid[k]);
                dict_set(r, kwd, mkstr(r, kn->s, kn->len), a->kwv[k]);
            }
    } else {
        for (int k = 0; k < a->nkw; k++)
            if (!used_kw[k]) {
                if (a->kwid[k] == NM_CALLER)
                    rfail(r,
                          "macro '%s' was invoked with two values for the special 'caller' argument. This is most "
                          "likely a bug.",
                          mname);
                rfail(r, "macro '%s' takes no keyword argument '%s'", mname, name_str(r, a->kwid[k])->s);
            }
    }
    if (a->npos > np && m->varargs_slot < 0) rfail(r, "macro '%s' takes not more than %d argument(s)", mname, np);
    for (int i = 0; i < np; i++) mf->slots[m->items[i]->slot] = vals[i];
    if (m->caller_slot >= 0 && !found_caller) mf->slots[m->caller_slot] = caller;
    if (m->kwargs_slot >= 0) {
        tv d = {.t = TV_DICT};
        d.m = kwd;
        mf->slots[m->kwargs_slot] = d;
    }
    if (m->varargs_slot >= 0) {
        int    extra = a->npos > np ? a->npos - np : 0;
        tlist *l = mklist(r, (size_t)extra);
        for (int i = 0; i < extra; i++) l->v[i] = a->pos[np + i];
        mf->slots[m->varargs_slot] = tv_list_kind(l, LK_TUPLE);
    }
    /* missing parameters: defaults, evaluated in order inside the macro */
    for (int i = 0; i < np; i++) {
        if (!is_missing(vals[i])) continue;
        int di = i - (np - nd);
        tv  v;
        if (di >= 0) v = eval(r, m->items2[di], mf);
        else {
            const tstr *pn = name_str(r, m->items[i]->name);
            char       *hint = ralloc(r, pn->len + 40);
            snprintf(hint, pn->len + 40, "parameter '%s' was not provided", pn->s);
            v = make_undef(r, hint, false, tv_none(), tv_none());
        }
        mf->slots[m->items[i]->slot] = v;
    }
    int saved_line = r->line;
    tv  out = capture_body(r, m->c->items, m->c->nitems, mf);
    r->line = saved_line;
    r->depth--;
    return out;
}

tv tv_call(R *r, tv fn, targs *a) {
    if (fn.t == TV_UNDEF) fail_undefined(r, fn);
    if (fn.t != TV_FUNC) rfail(r, "'%s' object is not callable", tv_type_name(fn));
    tfunc *f = fn.fn;
    switch (f->kind) {
    case FN_GLOBAL: return call_global(r, f->id, a);
    case FN_METHOD: return call_method(r, f, a);
    case FN_MACRO: return call_macro(r, f, a);
    case FN_LOOP_CYCLE:
        if (a->nkw) rfail(r, "cycle() got an unexpected keyword argument");
        if (a->npos == 0) rfail(r, "no items for cycling given");
        return a->pos[f->loop->index0 % (size_t)a->npos];
    case FN_LOOP_CHANGED: {
        tlist *l = mklist(r, (size_t)a->npos);
        for (int i = 0; i < a->npos; i++) l->v[i] = a->pos[i];
        tv cur = tv_list_kind(l, LK_TUPLE);
        if (!f->loop->has_changed || !tv_eq(r, f->loop->last_changed, cur, 0)) {
            f->loop->last_changed = cur;
            f->loop->has_changed = true;
            return tv_bool(true);
        }
        return tv_bool(false);
    }
    case FN_JOINER:
        if (a->npos || a->nkw) rfail(r, "joiner takes no arguments");
        if (f->state[1].i == 0) {
            f->state[1].i = 1;
            return mkstr(r, "", 0);
        }
        return f->state[0];
    default: rfail(r, "unsupported callable");
    }
}

static void eval_args(R *r, const tnode *n, tframe *fr, targs *a, int extra_kw) {
    a->npos = n->nitems;
    a->pos = ralloc(r, sizeof(tv) * (size_t)(n->nitems + 1));
    for (int i = 0; i < n->nitems; i++) a->pos[i] = eval(r, n->items[i], fr);
    a->nkw = n->nitems2;
    a->kwv = ralloc(r, sizeof(tv) * (size_t)(n->nitems2 + extra_kw + 1));
    int *ids = ralloc(r, sizeof(int) * (size_t)(n->nitems2 + extra_kw + 1));
    for (int i = 0; i < n->nitems2; i++) {
        ids[i] = n->kwnames[i];
        a->kwv[i] = eval(r, n->items2[i], fr);
    }
    a->kwid = ids;
}

/* ---------------------------------------------------------------- assignment */

static void assign(R *r, const tnode *target, tv v, tframe *fr, bool by_name) {
    if (target->kind == N_NAME) {
        if (by_name) store_by_name(r, fr, target->name, v);
        else store_slot(r, fr, target->hops, target->slot, v);
        return;
    }
    if (target->kind == N_NSREF) {
        tv ns = load_name(r, target, fr);
        if (ns.t != TV_NS) rfail(r, "cannot assign attribute on non-namespace object");
        dict_set(r, ns.ns->attrs, target->val, v);
        return;
    }
    /* tuple unpacking */
    if (v.t == TV_UNDEF) fail_undefined(r, v);
    if (!(v.t == TV_LIST || v.t == TV_DICT || v.t == TV_STR || v.t == TV_GEN || v.t == TV_LOOP))
        rfail(r, "cannot unpack non-iterable %s object", tv_type_name(v));
    tlist *items = tv_iterate(r, v);
    int    want = target->nitems;
    if ((int64_t)items->n < want)
        rfail(r, "not enough values to unpack (expected %d, got %zu)", want, items->n);
    if ((int64_t)items->n > want) rfail(r, "too many values to unpack (expected %d)", want);
    for (int i = 0; i < want; i++) assign(r, target->items[i], items->v[i], fr, by_name);
}

/* ---------------------------------------------------------------- expressions */

static tv apply_filters(R *r, const tnode *f, tv base, tframe *fr) {
    if (!f) return base;
    tv    v = f->a ? apply_filters(r, f->a, base, fr) : base;
    targs a;
    eval_args(r, f, fr, &a, 0);
    r->line = f->line;
    if (f->name < 0) rfail(r, "No filter named '%s' found.", f->val.s->s); /* the parser refuses these */
    return call_filter(r, f->name, v, &a);
}

static bool compare(R *r, int op, tv a, tv b) {
    switch (op) {
    case CMP_EQ: return tv_eq(r, a, b, 0);
    case CMP_NE: return !tv_eq(r, a, b, 0);
    case CMP_IN: return tv_contains(r, b, a);
    case CMP_NOTIN: return !tv_contains(r, b, a);
    default: break;
    }
    static const char *names[] = {"==", "!=", "<", "<=", ">", ">="};
    int c = tv_cmp(r, a, b, names[op]);
    if (c == 2) return false; /* nan */
    switch (op) {
    case CMP_LT: return c < 0;
    case CMP_LE: return c <= 0;
    case CMP_GT: return c > 0;
    default: return c >= 0;
    }
}

static tv eval(R *r, const tnode *n, tframe *fr) {
    if (++r->cdepth > r->max_cdepth) rfail_code(r, AG_ERR_RANGE, "template evaluation nested too deeply");
    tv v;
    switch (n->kind) {
    case N_CONST: v = n->val; break;
    case N_NAME: v = load_name(r, n, fr); break;
    case N_GETATTR: {
        tv obj = eval(r, n->a, fr);
        r->line = n->line;
        v = tv_getattr(r, obj, n->val.s);
        break;
    }
    case N_GETITEM: {
        tv obj = eval(r, n->a, fr);
        if (n->b->kind == N_SLICE) {
            const tnode *s = n->b;
            tv           a = s->a ? eval(r, s->a, fr) : tv_missing();
            tv           b = s->b ? eval(r, s->b, fr) : tv_missing();
            tv           c = s->c ? eval(r, s->c, fr) : tv_missing();
            r->line = n->line;
            v = do_slice(r, obj, a, b, c);
        } else {
            tv key = eval(r, n->b, fr);
            r->line = n->line;
            v = tv_getitem(r, obj, key);
        }
        break;
    }
    case N_CALL: {
        tv    fn = eval(r, n->a, fr);
        targs a;
        eval_args(r, n, fr, &a, 0);
        r->line = n->line;
        v = tv_call(r, fn, &a);
        break;
    }
    case N_FILTER: {
        tv    x = eval(r, n->a, fr);
        targs a;
        eval_args(r, n, fr, &a, 0);
        r->line = n->line;
        /* an unknown name the parser let through (inside an if): jinja2's
         * stand-in raises once its arguments are evaluated */
        if (n->name < 0) rfail(r, "No filter named '%s' found.", n->val.s->s);
        v = call_filter(r, n->name, x, &a);
        break;
    }
    case N_TEST: {
        tv    x = eval(r, n->a, fr);
        targs a;
        eval_args(r, n, fr, &a, 0);
        r->line = n->line;
        if (n->name < 0) rfail(r, "No test named '%s' found.", n->val.s->s);
        v = tv_bool(call_test(r, n->name, x, &a));
        break;
    }
    case N_NOT: v = tv_bool(!tv_truthy(r, eval(r, n->a, fr))); break;
    case N_NEG:
    case N_POS: {
        tv x = eval(r, n->a, fr);
        r->line = n->line;
        if (x.t == TV_UNDEF) fail_undefined(r, x);
        if (x.t == TV_FLOAT) v = tv_float(n->kind == N_NEG ? -x.d : x.d);
        else if (is_intlike(x)) {
            if (n->kind == N_NEG && x.i == INT64_MIN) rfail_code(r, AG_ERR_UNSUPPORTED, "unsupported: integer overflow");
            v = tv_int(n->kind == N_NEG ? -x.i : x.i);
        } else rfail(r, "bad operand type for unary %c: '%s'", n->kind == N_NEG ? '-' : '+', tv_type_name(x));
        break;
    }
    case N_BINOP: {
        tv a = eval(r, n->a, fr);
        tv b = eval(r, n->b, fr);
        r->line = n->line;
        v = tv_binop(r, n->op, a, b);
        break;
    }
    case N_AND: {
        tv a = eval(r, n->a, fr);
        v = tv_truthy(r, a) ? eval(r, n->b, fr) : a;
        break;
    }
    case N_OR: {
        tv a = eval(r, n->a, fr);
        v = tv_truthy(r, a) ? a : eval(r, n->b, fr);
        break;
    }
    case N_COMPARE: {
        tv left = eval(r, n->a, fr);
        v = tv_bool(true);
        for (int i = 0; i < n->nitems; i++) {
            tv right = eval(r, n->items[i], fr);
            r->line = n->line;
            if (!compare(r, n->ops[i], left, right)) {
                v = tv_bool(false);
                break;
            }
            left = right;
        }
        break;
    }
    case N_CONCAT: {
        ag_buf *b = buf_get(r);
        for (int i = 0; i < n->nitems; i++) {
            tv x = eval(r, n->items[i], fr);
            tv_write_str(r, b, x);
        }
        v = buf_finish(r, b, false);
        break;
    }
    case N_COND:
        if (tv_truthy(r, eval(r, n->a, fr))) v = eval(r, n->b, fr);
        else if (n->c) v = eval(r, n->c, fr);
        else {
            char *hint = ralloc(r, 128);
            snprintf(hint, 128,
                     "the inline if-expression on line %d evaluated to false and no else section was defined.",
                     n->line);
            v = make_undef(r, hint, false, tv_none(), tv_none());
        }
        break;
    case N_LIST:
    case N_TUPLE: {
        tlist *l = mklist(r, (size_t)n->nitems);
        for (int i = 0; i < n->nitems; i++) l->v[i] = eval(r, n->items[i], fr);
        v = tv_list_kind(l, n->kind == N_LIST ? LK_LIST : LK_TUPLE);
        break;
    }
    case N_DICT: {
        tdict *d = dict_new(r, (size_t)n->nitems);
        for (int i = 0; i < n->nitems; i++) {
            tv k = eval(r, n->items[i], fr);
            tv x = eval(r, n->items2[i], fr);
            r->line = n->line;
            dict_set(r, d, k, x);
        }
        v.t = TV_DICT;
        v.f = 0;
        v.m = d;
        break;
    }
    default: rfail_code(r, AG_ERR_INTERNAL, "internal error: unexpected node %d in an expression", n->kind);
    }
    r->cdepth--;
    return v;
}

/* ---------------------------------------------------------------- statements */

static int exec_for(R *r, const tnode *n, tframe *fr) {
    tv it = eval(r, n->b, fr);
    r->line = n->line;
    tlist *items = tv_iterate(r, it);
    if (n->c) { /* loop filter: its own frame sees the target, not `loop` */
        tlist  *kept = mklist(r, items->n);
        size_t  k = 0;
        tframe *tf = frame_enter(r, n->fr2, fr);
        for (size_t i = 0; i < items->n; i++) {
            step(r);
            assign(r, n->a, items->v[i], tf, true);
            if (tv_truthy(r, eval(r, n->c, tf))) kept->v[k++] = items->v[i];
        }
        kept->n = k;
        items = kept;
    }
    tloop *lp = ralloc(r, sizeof *lp);
    lp->items = items;
    tv loopv = {.t = TV_LOOP};
    loopv.lp = lp;
    for (size_t i = 0; i < items->n; i++) {
        step(r);
        lp->index0 = i;
        /* jinja2 re-enters the body frame on every iteration */
        tframe *lf = frame_enter(r, n->fr, fr);
        if (n->loop_slot >= 0) lf->slots[n->loop_slot] = loopv;
        assign(r, n->a, items->v[i], lf, false);
        int fl = exec_body(r, n->items, n->nitems, lf);
        if (fl == FLOW_BREAK) break;
    }
    if (items->n == 0 && n->nitems2) {
        tframe *ef = frame_enter(r, n->fr3, fr);
        exec_body(r, n->items2, n->nitems2, ef);
    }
    return FLOW_NORMAL;
}

static tv make_macro(R *r, const tnode *n, tframe *fr) {
    tfunc *f = ralloc(r, sizeof *f);
    f->kind = FN_MACRO;
    f->macro = n;
    f->closure = fr;
    tv v = {.t = TV_FUNC};
    v.fn = f;
    return v;
}

static int exec_stmt(R *r, const tnode *n, tframe *fr) {
    r->line = n->line;
    switch (n->kind) {
    case S_OUTPUT:
        for (int i = 0; i < n->nitems; i++) {
            const tnode *x = n->items[i];
            if (x->kind == S_DATA) buf_add(r, r->out, x->val.s->s, x->val.s->len);
            else {
                tv v = eval(r, x, fr);
                tv_write_str(r, r->out, v);
            }
        }
        return FLOW_NORMAL;
    case S_IF: {
        tv t = eval(r, n->a, fr);
        if (tv_truthy(r, t)) return exec_body(r, n->items, n->nitems, fr);
        return exec_body(r, n->items2, n->nitems2, fr);
    }
    case S_FOR: return exec_for(r, n, fr);
    case S_SET: {
        tv v = eval(r, n->b, fr);
        r->line = n->line;
        assign(r, n->a, v, fr, false);
        return FLOW_NORMAL;
    }
    case S_SETBLOCK: {
        tframe *bf = frame_enter(r, n->fr, fr);
        tv      v = capture_body(r, n->items, n->nitems, bf);
        v = apply_filters(r, n->b, v, bf);
        r->line = n->line;
        assign(r, n->a, v, fr, false);
        return FLOW_NORMAL;
    }
    case S_MACRO: store_slot(r, fr, n->hops, n->slot, make_macro(r, n, fr)); return FLOW_NORMAL;
    case S_CALLBLOCK: {
        const tnode *call = n->a;
        tv           fn = eval(r, call->a, fr);
        targs        a;
        eval_args(r, call, fr, &a, 1);
        ((int *)a.kwid)[a.nkw] = NM_CALLER;
        a.kwv[a.nkw] = make_macro(r, n, fr);
        a.nkw++;
        r->line = n->line;
        tv v = tv_call(r, fn, &a);
        tv_write_str(r, r->out, v);
        return FLOW_NORMAL;
    }
    case S_FILTERBLOCK: {
        tframe *ff = frame_enter(r, n->fr, fr);
        tv      v = capture_body(r, n->items, n->nitems, ff);
        v = apply_filters(r, n->b, v, ff);
        tv_write_str(r, r->out, v);
        return FLOW_NORMAL;
    }
    case S_WITH: {
        tv *vals = ralloc(r, sizeof(tv) * (size_t)(n->nitems + 1));
        for (int i = 0; i < n->nitems; i++) vals[i] = eval(r, n->items2[i], fr);
        tframe *wf = frame_enter(r, n->fr, fr);
        for (int i = 0; i < n->nitems; i++) assign(r, n->items[i], vals[i], wf, false);
        return exec_body(r, n->c->items, n->c->nitems, wf);
    }
    case S_GENERATION: {
        /* a call block whose caller is rendered in place */
        tframe *gf = frame_enter(r, n->fr, fr);
        exec_body(r, n->items, n->nitems, gf);
        return FLOW_NORMAL;
    }
    case S_BREAK: return FLOW_BREAK;
    case S_CONTINUE: return FLOW_CONTINUE;
    case S_BODY: return exec_body(r, n->items, n->nitems, fr);
    default: rfail_code(r, AG_ERR_INTERNAL, "internal error: unexpected node %d as a statement", n->kind);
    }
}

static int exec_body(R *r, tnode *const *body, int n, tframe *fr) {
    if (++r->cdepth > r->max_cdepth) rfail_code(r, AG_ERR_RANGE, "template evaluation nested too deeply");
    int fl = FLOW_NORMAL;
    for (int i = 0; i < n; i++) {
        fl = exec_stmt(r, body[i], fr);
        if (fl != FLOW_NORMAL) break;
    }
    r->cdepth--;
    return fl;
}

/* ---------------------------------------------------------------- public API */

ag_tmpl_params ag_tmpl_default_params(void) {
    ag_tmpl_params p;
    p.max_output = (size_t)16 << 20;
    p.max_memory = (size_t)256 << 20;
    p.max_steps = 10000000;
    p.max_depth = 200;
    p.now = -1;
    return p;
}

ag_status ag_tmpl_parse(const char *src, size_t len, ag_tmpl **out) {
    void tm_parse_template(ag_tmpl * T, const char *src, size_t len);
    *out = NULL;
    if (!src && len) return ag_errorf(AG_ERR_INVALID, "template: NULL source");
    if (len && !ag_utf8_valid(src, len)) {
        /* find the line of the first bad byte */
        size_t i = 0;
        int    line = 1;
        while (i < len) {
            uint32_t cp;
            size_t   k = ag_utf8_decode(src + i, len - i, &cp);
            if (!k) break;
            if (src[i] == '\n') line++;
            i += k;
        }
        return ag_errorf(AG_ERR_TEMPLATE, "template line %d: not valid UTF-8 (byte offset %zu)", line, i);
    }
    ag_tmpl *T = calloc(1, sizeof *T);
    if (!T) return ag_errorf(AG_ERR_NOMEM, "template: out of memory");
    T->arena.err = &T->err;
    T->arena.limit = (size_t)256 << 20;
    if (setjmp(T->err.jb)) {
        ag_status code = T->err.code;
        ag_errorf(code, "template line %d: %s", T->err.line, T->err.msg);
        ag_tmpl_free(T);
        return code;
    }
    tm_parse_template(T, src ? src : "", len);
    *out = T;
    return AG_OK;
}

void ag_tmpl_free(ag_tmpl *t) {
    if (!t) return;
    tm_arena_free(&t->arena);
    free(t);
}

bool ag_tmpl_uses_variable(const ag_tmpl *t, const char *name) {
    return t && name && tm_names_find(&t->names, name, strlen(name)) >= NM_COUNT_FIXED;
}

static void render_free(R *r) {
    for (int i = 0; i < r->nall; i++) {
        ag_buf_free(r->all[i]);
        free(r->all[i]);
    }
    free(r->all);
    free(r->pool);
    tm_arena_free(&r->arena);
}

ag_status ag_tmpl_render(const ag_tmpl *t, const json_t *context, const ag_tmpl_params *params, ag_buf *out) {
    if (!t || !out) return ag_errorf(AG_ERR_INVALID, "template: NULL argument");
    if (context && !json_is_object(context)) return ag_errorf(AG_ERR_INVALID, "template: context is not a JSON object");
    ag_tmpl_params p = params ? *params : ag_tmpl_default_params();
    R *r = calloc(1, sizeof *r);
    if (!r) return ag_errorf(AG_ERR_NOMEM, "template: out of memory");
    r->T = t;
    r->arena.err = &r->err;
    r->arena.limit = p.max_memory;
    r->max_output = p.max_output;
    r->max_steps = p.max_steps;
    r->max_depth = p.max_depth > 0 ? p.max_depth : 1;
    r->max_cdepth = 2000;
    r->now = p.now;
    if (setjmp(r->err.jb)) {
        ag_status code = r->err.code;
        if (r->err.raw) ag_errorf(code, "%s", r->err.msg);
        else ag_errorf(code, "template line %d: %s", r->err.line, r->err.msg);
        render_free(r);
        free(r);
        return code;
    }
    r->nctx = t->names.n;
    r->ctxv = ralloc(r, sizeof(tv) * (size_t)(r->nctx + 1));
    for (int i = 0; i < r->nctx; i++) r->ctxv[i] = tv_missing();
    if (context) {
        const char *key;
        json_t     *val;
        json_object_foreach((json_t *)context, key, val) {
            int id = tm_names_find(&t->names, key, strlen(key));
            if (id < 0) continue; /* the template never names it */
            r->ctxv[id] = tv_from_json(r, val, 0);
        }
    }
    tframe *root = frame_enter(r, t->root, NULL);
    ag_buf *b = buf_get(r);
    r->out = b;
    exec_body(r, t->body, t->nbody, root);
    ag_status st = b->len ? ag_buf_append(out, b->data, b->len) : AG_OK;
    render_free(r);
    free(r);
    if (st != AG_OK) return ag_errorf(AG_ERR_NOMEM, "template: out of memory");
    return AG_OK;
}

ag_status ag_tmpl_render_json(const ag_tmpl *t, const char *context_json, size_t len, const ag_tmpl_params *params,
                              ag_buf *out) {
    json_error_t je;
    json_t      *ctx = json_loadb(context_json, len, JSON_DECODE_ANY | JSON_ALLOW_NUL, &je);
    if (!ctx) return ag_errorf(AG_ERR_FORMAT, "context JSON: %s (line %d, column %d)", je.text, je.line, je.column);
    if (!json_is_object(ctx)) {
        json_decref(ctx);
        return ag_errorf(AG_ERR_FORMAT, "context JSON: not an object");
    }
    ag_status st = ag_tmpl_render(t, ctx, params, out);
    json_decref(ctx);
    return st;
}

json_t *ag_tmpl_chat_context(const json_t *messages, const json_t *tools, bool add_generation_prompt,
                             const char *bos_token, const char *eos_token, const json_t *extra) {
    json_t *c = json_object();
    if (!c) return NULL;
    int bad = 0;
    bad |= json_object_set_new(c, "messages", messages ? json_deep_copy(messages) : json_array());
    bad |= json_object_set_new(c, "tools", tools ? json_deep_copy(tools) : json_null());
    bad |= json_object_set_new(c, "documents", json_null());
    bad |= json_object_set_new(c, "add_generation_prompt", json_boolean(add_generation_prompt));
    if (bos_token) bad |= json_object_set_new(c, "bos_token", json_string(bos_token));
    if (eos_token) bad |= json_object_set_new(c, "eos_token", json_string(eos_token));
    if (extra && json_is_object(extra)) {
        const char *key;
        json_t     *val;
        json_object_foreach((json_t *)extra, key, val) bad |= json_object_set_new(c, key, json_deep_copy(val));
    }
    if (bad) {
        json_decref(c);
        return NULL;
    }
    return c;
}
