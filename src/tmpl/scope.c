/* The scope pass: jinja2 resolves variables statically when it compiles a
 * template (jinja2/idtracking.py and the frame handling in compiler.py), and
 * that resolution is observable. For example a variable assigned at the top
 * level *after* a for loop is undefined inside that loop, even when the
 * render context has a value for it, and a store inside an if-branch falls
 * back to the context instead. To render byte for byte the same, this pass
 * mirrors jinja2's algorithm: every frame (template root, for-loop body, loop
 * filter, loop else, macro, call block, set block, filter block, with block,
 * generation block) gets a symbol table built in visiting order with the same
 * load instructions (param / resolve / alias / undefined), and every name use
 * is bound to a (frames up, slot) pair. eval.c then enters frames by those
 * instructions. */
#include <stdlib.h>
#include <string.h>

#include "tmpl/internal.h"

typedef struct {
    int *v;
    int  n, cap;
} ivec;

typedef struct {
    int     name;
    uint8_t act;
    int     hops, slot; /* ACT_ALIAS target, relative to the frame */
} lentry;

typedef struct syms syms;
struct syms {
    syms        *parent; /* the enclosing frame's (final) symbols */
    tframe_info *fi;     /* slot layout, shared by the copies of one frame */
    ivec         refs;   /* names with a reference in this frame */
    lentry      *loads;
    int          nloads, caploads;
    ivec         stores;
};

typedef struct {
    tm_arena *a;
    tm_err   *e;
    ag_tmpl  *T;
} pass;

static void iv_add(pass *P, ivec *v, int x) {
    for (int i = 0; i < v->n; i++)
        if (v->v[i] == x) return;
    if (v->n == v->cap) {
        int  nc = v->cap ? v->cap * 2 : 8;
        int *nv = tm_alloc(P->a, sizeof(int) * (size_t)nc);
        if (v->n) memcpy(nv, v->v, sizeof(int) * (size_t)v->n);
        v->v = nv;
        v->cap = nc;
    }
    v->v[v->n++] = x;
}

static bool iv_has(const ivec *v, int x) {
    for (int i = 0; i < v->n; i++)
        if (v->v[i] == x) return true;
    return false;
}

static ivec iv_copy(pass *P, const ivec *v) {
    ivec c = {0};
    if (v->n) {
        c.v = tm_alloc(P->a, sizeof(int) * (size_t)v->n);
        memcpy(c.v, v->v, sizeof(int) * (size_t)v->n);
        c.n = c.cap = v->n;
    }
    return c;
}

static int fi_slot(pass *P, tframe_info *fi, int name) {
    for (int i = 0; i < fi->nslots; i++)
        if (fi->names[i] == name) return i;
    if (fi->nslots == fi->cap) {
        int      nc = fi->cap ? fi->cap * 2 : 8;
        int     *nn = tm_alloc(P->a, sizeof(int) * (size_t)nc);
        uint8_t *na = tm_alloc(P->a, (size_t)nc);
        int     *nh = tm_alloc(P->a, sizeof(int) * (size_t)nc);
        int     *ns = tm_alloc(P->a, sizeof(int) * (size_t)nc);
        if (fi->nslots) {
            memcpy(nn, fi->names, sizeof(int) * (size_t)fi->nslots);
            memcpy(na, fi->act, (size_t)fi->nslots);
            memcpy(nh, fi->alias_hops, sizeof(int) * (size_t)fi->nslots);
            memcpy(ns, fi->alias_slot, sizeof(int) * (size_t)fi->nslots);
        }
        fi->names = nn;
        fi->act = na;
        fi->alias_hops = nh;
        fi->alias_slot = ns;
        fi->cap = nc;
    }
    fi->names[fi->nslots] = name;
    fi->act[fi->nslots] = ACT_UNDEFINED;
    return fi->nslots++;
}

static syms *syms_new(pass *P, syms *parent) {
    syms *s = tm_alloc(P->a, sizeof *s);
    s->parent = parent;
    s->fi = tm_alloc(P->a, sizeof(tframe_info));
    return s;
}

static syms *syms_copy(pass *P, const syms *s) {
    syms *c = tm_alloc(P->a, sizeof *c);
    c->parent = s->parent;
    c->fi = s->fi;
    c->refs = iv_copy(P, &s->refs);
    c->stores = iv_copy(P, &s->stores);
    if (s->nloads) {
        c->loads = tm_alloc(P->a, sizeof(lentry) * (size_t)s->nloads);
        memcpy(c->loads, s->loads, sizeof(lentry) * (size_t)s->nloads);
        c->nloads = c->caploads = s->nloads;
    }
    return c;
}

static void set_load(pass *P, syms *s, lentry e) {
    for (int i = 0; i < s->nloads; i++)
        if (s->loads[i].name == e.name) {
            s->loads[i] = e;
            return;
        }
    if (s->nloads == s->caploads) {
        int     nc = s->caploads ? s->caploads * 2 : 8;
        lentry *nl = tm_alloc(P->a, sizeof(lentry) * (size_t)nc);
        if (s->nloads) memcpy(nl, s->loads, sizeof(lentry) * (size_t)s->nloads);
        s->loads = nl;
        s->caploads = nc;
    }
    s->loads[s->nloads++] = e;
}

static bool find_ref(pass *P, const syms *s, int name, int *hops, int *slot) {
    for (int h = 0; s; s = s->parent, h++)
        if (iv_has(&s->refs, name)) {
            *hops = h;
            *slot = fi_slot(P, s->fi, name);
            return true;
        }
    return false;
}

static void define_ref(pass *P, syms *s, int name, uint8_t act, int hops, int slot) {
    iv_add(P, &s->refs, name);
    fi_slot(P, s->fi, name);
    set_load(P, s, (lentry){.name = name, .act = act, .hops = hops, .slot = slot});
}

static void sym_store(pass *P, syms *s, int name) {
    iv_add(P, &s->stores, name);
    if (iv_has(&s->refs, name)) return;
    int h, sl;
    if (s->parent && find_ref(P, s->parent, name, &h, &sl)) {
        define_ref(P, s, name, ACT_ALIAS, h + 1, sl);
        return;
    }
    define_ref(P, s, name, ACT_UNDEFINED, 0, 0);
}

static void sym_param(pass *P, syms *s, int name) {
    iv_add(P, &s->stores, name);
    define_ref(P, s, name, ACT_PARAM, 0, 0);
}

static void sym_load(pass *P, syms *s, int name) {
    int h, sl;
    if (!find_ref(P, s, name, &h, &sl)) define_ref(P, s, name, ACT_RESOLVE, 0, 0);
}

static void branch_update(pass *P, syms *s, syms **br, int nbr) {
    ivec stores = {0};
    for (int b = 0; b < nbr; b++)
        for (int i = 0; i < br[b]->stores.n; i++)
            if (!iv_has(&s->stores, br[b]->stores.v[i])) iv_add(P, &stores, br[b]->stores.v[i]);
    for (int b = 0; b < nbr; b++) {
        for (int i = 0; i < br[b]->refs.n; i++) iv_add(P, &s->refs, br[b]->refs.v[i]);
        for (int i = 0; i < br[b]->nloads; i++) set_load(P, s, br[b]->loads[i]);
        for (int i = 0; i < br[b]->stores.n; i++) iv_add(P, &s->stores, br[b]->stores.v[i]);
    }
    for (int i = 0; i < stores.n; i++) {
        int name = stores.v[i], h, sl;
        if (s->parent && find_ref(P, s->parent, name, &h, &sl)) {
            set_load(P, s, (lentry){.name = name, .act = ACT_ALIAS, .hops = h + 1, .slot = sl});
            continue;
        }
        set_load(P, s, (lentry){.name = name, .act = ACT_RESOLVE});
    }
}

/* ---------------------------------------------------------------- FrameSymbolVisitor */

enum { CTX_LOAD, CTX_STORE, CTX_PARAM };

static void fsv(pass *P, syms **sp, const tnode *n);

static void fsv_target(pass *P, syms *s, const tnode *t, int ctx) {
    if (!t) return;
    if (t->kind == N_NAME) {
        if (ctx == CTX_PARAM) sym_param(P, s, t->name);
        else if (ctx == CTX_STORE) sym_store(P, s, t->name);
        else sym_load(P, s, t->name);
    } else if (t->kind == N_NSREF) {
        sym_load(P, s, t->name);
    } else if (t->kind == N_TUPLE) {
        for (int i = 0; i < t->nitems; i++) fsv_target(P, s, t->items[i], ctx);
    }
}

static void fsv_list(pass *P, syms **sp, tnode *const *v, int n) {
    for (int i = 0; i < n; i++) fsv(P, sp, v[i]);
}

static void fsv(pass *P, syms **sp, const tnode *n) {
    if (!n) return;
    syms *s = *sp;
    switch (n->kind) {
    case N_NAME: sym_load(P, s, n->name); return;
    case N_NSREF: sym_load(P, s, n->name); return;
    case S_DATA:
    case S_BREAK:
    case S_CONTINUE:
    case S_GENERATION: return;
    case S_IF: {
        fsv(P, sp, n->a);
        syms *b1 = syms_copy(P, s), *b2 = syms_copy(P, s), *b3 = syms_copy(P, s);
        fsv_list(P, &b1, n->items, n->nitems);
        fsv_list(P, &b3, n->items2, n->nitems2);
        syms *br[3] = {b1, b2, b3};
        branch_update(P, s, br, 3);
        return;
    }
    case S_FOR: fsv(P, sp, n->b); return;
    case S_SET:
        fsv(P, sp, n->b);
        fsv_target(P, s, n->a, CTX_STORE);
        return;
    case S_SETBLOCK: fsv_target(P, s, n->a, CTX_STORE); return;
    case S_MACRO: sym_store(P, s, n->name); return;
    case S_CALLBLOCK: fsv(P, sp, n->a); return;
    case S_FILTERBLOCK: fsv(P, sp, n->b); return;
    case S_WITH: fsv_list(P, sp, n->items2, n->nitems2); return;
    case S_BODY: fsv_list(P, sp, n->items, n->nitems); return;
    default:
        /* expressions and S_OUTPUT: every child, in order */
        fsv(P, sp, n->a);
        fsv(P, sp, n->b);
        fsv(P, sp, n->c);
        fsv_list(P, sp, n->items, n->nitems);
        fsv_list(P, sp, n->items2, n->nitems2);
        return;
    }
}

/* ---------------------------------------------------------------- find_undeclared */

typedef struct {
    int  want[3];
    bool active[3];
    bool found[3];
    int  n;
} undecl;

static void ud_name(undecl *u, int name, bool load) {
    for (int i = 0; i < u->n; i++) {
        if (u->want[i] != name || !u->active[i]) continue;
        if (load) u->found[i] = true;
        else u->active[i] = false; /* stored or declared first: not undeclared */
    }
}

static void ud_walk(undecl *u, const tnode *n);

static void ud_target(undecl *u, const tnode *t) {
    if (!t) return;
    if (t->kind == N_NAME) ud_name(u, t->name, false);
    else if (t->kind == N_TUPLE)
        for (int i = 0; i < t->nitems; i++) ud_target(u, t->items[i]);
    else if (t->kind == N_NSREF) ud_name(u, t->name, true);
}

static void ud_list(undecl *u, tnode *const *v, int n) {
    for (int i = 0; i < n; i++) ud_walk(u, v[i]);
}

static void ud_walk(undecl *u, const tnode *n) {
    if (!n) return;
    switch (n->kind) {
    case N_NAME: ud_name(u, n->name, true); return;
    case S_FOR: /* fields: target, iter, body, else_, test */
        ud_target(u, n->a);
        ud_walk(u, n->b);
        ud_list(u, n->items, n->nitems);
        ud_list(u, n->items2, n->nitems2);
        ud_walk(u, n->c);
        return;
    case S_SET: /* target, node */
        ud_target(u, n->a);
        ud_walk(u, n->b);
        return;
    case S_SETBLOCK: /* target, filter, body */
        ud_target(u, n->a);
        ud_walk(u, n->b);
        ud_list(u, n->items, n->nitems);
        return;
    case S_MACRO:
    case S_CALLBLOCK: /* (call,) args, defaults, body */
        if (n->kind == S_CALLBLOCK) ud_walk(u, n->a);
        for (int i = 0; i < n->nitems; i++) ud_target(u, n->items[i]);
        ud_list(u, n->items2, n->nitems2);
        if (n->c) ud_list(u, n->c->items, n->c->nitems);
        return;
    case S_FILTERBLOCK: /* body, filter */
        ud_list(u, n->items, n->nitems);
        ud_walk(u, n->b);
        return;
    case S_WITH: /* targets, values, body */
        for (int i = 0; i < n->nitems; i++) ud_target(u, n->items[i]);
        ud_list(u, n->items2, n->nitems2);
        if (n->c) ud_list(u, n->c->items, n->c->nitems);
        return;
    default:
        ud_walk(u, n->a);
        ud_walk(u, n->b);
        ud_walk(u, n->c);
        ud_list(u, n->items, n->nitems);
        ud_list(u, n->items2, n->nitems2);
        return;
    }
}

static bool undeclared1(tnode *const *body, int n, int name) {
    undecl u = {.want = {name}, .active = {true}, .n = 1};
    ud_list(&u, body, n);
    return u.found[0];
}

/* ---------------------------------------------------------------- resolution ("codegen") */

static void finalize(pass *P, syms *s) {
    tframe_info *fi = s->fi;
    for (int i = 0; i < s->nloads; i++) {
        int slot = fi_slot(P, fi, s->loads[i].name);
        fi->act[slot] = s->loads[i].act;
        fi->alias_hops[slot] = s->loads[i].hops;
        fi->alias_slot[slot] = s->loads[i].slot;
    }
}

static void res(pass *P, syms *s, tnode *n);

static void res_list(pass *P, syms *s, tnode *const *v, int k) {
    for (int i = 0; i < k; i++) res(P, s, v[i]);
}

static void res_name(pass *P, syms *s, tnode *n) {
    int h, sl;
    if (find_ref(P, s, n->name, &h, &sl)) {
        n->hops = h;
        n->slot = sl;
    } else {
        n->hops = -1; /* jinja2 would fail to compile; look it up in the context */
        n->slot = -1;
    }
}

static void res_target(pass *P, syms *s, tnode *t) {
    if (!t) return;
    if (t->kind == N_NAME || t->kind == N_NSREF) res_name(P, s, t);
    else if (t->kind == N_TUPLE)
        for (int i = 0; i < t->nitems; i++) res_target(P, s, t->items[i]);
}

/* Macro and call-block frames (compiler.macro_body). */
static tframe_info *macro_frame(pass *P, syms *parent, tnode *n, tnode *const *body, int nbody) {
    syms *m = syms_new(P, parent);
    for (int pass_no = 0; pass_no < 2; pass_no++) {
        syms *mp = m;
        for (int i = 0; i < n->nitems; i++) fsv_target(P, m, n->items[i], CTX_PARAM);
        fsv_list(P, &mp, n->items2, n->nitems2);
        fsv_list(P, &mp, body, nbody);
        if (pass_no == 0) {
            /* special parameters the body uses (and an explicit parameter of
             * the same name turns off, as in jinja2) */
            static const int special[3] = {NM_CALLER, NM_KWARGS, NM_VARARGS};
            undecl u = {.n = 3};
            for (int k = 0; k < 3; k++) {
                u.want[k] = special[k];
                u.active[k] = true;
            }
            ud_list(&u, body, nbody);
            bool explicit_param[3] = {false, false, false};
            for (int i = 0; i < n->nitems; i++)
                for (int k = 0; k < 3; k++)
                    if (n->items[i]->name == special[k]) explicit_param[k] = true;
            if (u.found[0]) {
                if (explicit_param[0]) {
                    /* jinja2 requires a default for an explicit caller parameter */
                    int idx = -1;
                    for (int i = 0; i < n->nitems; i++)
                        if (n->items[i]->name == NM_CALLER) idx = i;
                    if (idx < n->nitems - n->nitems2)
                        tm_fail(P->e, AG_ERR_TEMPLATE, n->line,
                                "When defining macros or call blocks the special \"caller\" argument must be omitted "
                                "or be given a default.");
                } else {
                    sym_param(P, m, NM_CALLER);
                    n->caller_slot = fi_slot(P, m->fi, NM_CALLER);
                }
            }
            if (u.found[1] && !explicit_param[1]) {
                sym_param(P, m, NM_KWARGS);
                n->kwargs_slot = fi_slot(P, m->fi, NM_KWARGS);
            }
            if (u.found[2] && !explicit_param[2]) {
                sym_param(P, m, NM_VARARGS);
                n->varargs_slot = fi_slot(P, m->fi, NM_VARARGS);
            }
        }
    }
    finalize(P, m);
    for (int i = 0; i < n->nitems; i++) res_target(P, m, n->items[i]);
    res_list(P, m, n->items2, n->nitems2);
    res_list(P, m, body, nbody);
    return m->fi;
}

static void res(pass *P, syms *s, tnode *n) {
    if (!n) return;
    switch (n->kind) {
    case N_NAME:
    case N_NSREF: res_name(P, s, n); return;
    case S_DATA:
    case S_BREAK:
    case S_CONTINUE: return;
    case S_FOR: {
        res(P, s, n->b); /* iter, in the enclosing frame */
        /* loop body frame */
        syms *lb = syms_new(P, s);
        bool  extended = undeclared1(n->items, n->nitems, NM_LOOP);
        if (extended) sym_param(P, lb, NM_LOOP);
        fsv_target(P, lb, n->a, CTX_PARAM);
        syms *lbp = lb;
        fsv_list(P, &lbp, n->items, n->nitems);
        finalize(P, lb);
        n->fr = lb->fi;
        n->loop_slot = extended ? fi_slot(P, lb->fi, NM_LOOP) : -1;
        res_target(P, lb, n->a);
        res_list(P, lb, n->items, n->nitems);
        /* loop filter frame */
        if (n->c) {
            syms *tf = syms_new(P, s);
            fsv_target(P, tf, n->a, CTX_PARAM);
            syms *tfp = tf;
            fsv(P, &tfp, n->c);
            finalize(P, tf);
            n->fr2 = tf->fi;
            res(P, tf, n->c);
        }
        /* else frame */
        if (n->nitems2) {
            syms *ef = syms_new(P, s);
            syms *efp = ef;
            fsv_list(P, &efp, n->items2, n->nitems2);
            finalize(P, ef);
            n->fr3 = ef->fi;
            res_list(P, ef, n->items2, n->nitems2);
        }
        return;
    }
    case S_IF:
        res(P, s, n->a);
        res_list(P, s, n->items, n->nitems);
        res_list(P, s, n->items2, n->nitems2);
        return;
    case S_SET:
        res(P, s, n->b);
        res_target(P, s, n->a);
        return;
    case S_SETBLOCK: {
        syms *bf = syms_new(P, s), *bfp = bf;
        fsv_list(P, &bfp, n->items, n->nitems);
        finalize(P, bf);
        n->fr = bf->fi;
        res_list(P, bf, n->items, n->nitems);
        res(P, bf, n->b);
        res_target(P, s, n->a);
        return;
    }
    case S_MACRO: {
        int h, sl;
        find_ref(P, s, n->name, &h, &sl);
        n->hops = h;
        n->slot = sl;
        n->fr = macro_frame(P, s, n, n->c->items, n->c->nitems);
        return;
    }
    case S_CALLBLOCK:
        n->fr = macro_frame(P, s, n, n->c->items, n->c->nitems);
        res(P, s, n->a);
        return;
    case S_GENERATION: {
        tnode fake = *n;
        fake.nitems = 0;
        fake.nitems2 = 0;
        n->fr = macro_frame(P, s, &fake, n->items, n->nitems);
        return;
    }
    case S_FILTERBLOCK: {
        syms *ff = syms_new(P, s), *ffp = ff;
        fsv(P, &ffp, n->b);
        fsv_list(P, &ffp, n->items, n->nitems);
        finalize(P, ff);
        n->fr = ff->fi;
        res_list(P, ff, n->items, n->nitems);
        res(P, ff, n->b);
        return;
    }
    case S_WITH: {
        res_list(P, s, n->items2, n->nitems2);
        syms *wf = syms_new(P, s), *wfp = wf;
        for (int i = 0; i < n->nitems; i++) fsv_target(P, wf, n->items[i], CTX_PARAM);
        fsv_list(P, &wfp, n->c->items, n->c->nitems);
        finalize(P, wf);
        n->fr = wf->fi;
        for (int i = 0; i < n->nitems; i++) res_target(P, wf, n->items[i]);
        res_list(P, wf, n->c->items, n->c->nitems);
        return;
    }
    case S_BODY: res_list(P, s, n->items, n->nitems); return;
    default:
        res(P, s, n->a);
        res(P, s, n->b);
        res(P, s, n->c);
        res_list(P, s, n->items, n->nitems);
        res_list(P, s, n->items2, n->nitems2);
        return;
    }
}

void tm_scope_analyze(ag_tmpl *T) {
    pass  P = {.a = &T->arena, .e = &T->err, .T = T};
    syms *root = syms_new(&P, NULL), *rp = root;
    fsv_list(&P, &rp, T->body, T->nbody);
    finalize(&P, root);
    T->root = root->fi;
    res_list(&P, root, T->body, T->nbody);
}
