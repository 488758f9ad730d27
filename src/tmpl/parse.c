/* The parser: jinja2's recursive-descent grammar (jinja2/parser.py), built
 * into tnode trees in the template's arena. Unknown filters and tests fail
 * after the whole template has parsed, where jinja2's compiler fails on
 * them, except inside an if statement or a conditional expression, where
 * jinja2 3.x fails only when one is evaluated (check_names below); jinja2
 * filters we do not implement fail when evaluated. Constructs we do not
 * implement (template inheritance, includes, imports, recursive loops, *args
 * in calls) fail with "unsupported: ..." naming the construct. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/utf8.h"
#include "tmpl/internal.h"

#define MAX_PARSE_DEPTH 200

typedef struct {
    tm_arena    *a;
    tm_err      *e;
    tm_tok      *t;
    int          nt, i;
    ag_tmpl     *T;
    int          depth;
    int          loop_depth; /* for break/continue: loops since the last macro boundary */
    /* end-token stack for error messages */
    const char  *innermost; /* name of the innermost open block tag */
} parser;

typedef struct {
    tnode **v;
    int     n, cap;
} nvec;

static void nv_push(parser *P, nvec *v, tnode *x) {
    if (v->n == v->cap) {
        int     nc = v->cap ? v->cap * 2 : 8;
        tnode **nvv = tm_alloc(P->a, sizeof(tnode *) * (size_t)nc);
        if (v->n) memcpy(nvv, v->v, sizeof(tnode *) * (size_t)v->n);
        v->v = nvv;
        v->cap = nc;
    }
    v->v[v->n++] = x;
}

/* ---------------------------------------------------------------- names */

static uint32_t name_hash(const char *s, size_t n) {
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 16777619u;
    return h;
}

int tm_names_find(const tm_names *nm, const char *s, size_t n) {
    if (!nm->hcap) return -1;
    uint32_t h = name_hash(s, n) & (uint32_t)(nm->hcap - 1);
    for (;;) {
        int32_t id = nm->hash[h];
        if (id < 0) return -1;
        const tstr *x = nm->names[id];
        if (x->len == n && memcmp(x->s, s, n) == 0) return id;
        h = (h + 1) & (uint32_t)(nm->hcap - 1);
    }
}

static tstr *arena_str(tm_arena *a, const char *s, size_t n) {
    tstr *x = tm_alloc(a, sizeof(tstr) + n + 1);
    memcpy(x->s, s, n);
    x->s[n] = 0;
    x->len = n;
    size_t cp = 0;
    for (size_t i = 0; i < n; i++) cp += ((unsigned char)s[i] & 0xC0) != 0x80;
    x->ncp = cp;
    return x;
}

static int intern(ag_tmpl *T, const char *s, size_t n) {
    tm_names *nm = &T->names;
    int       id = tm_names_find(nm, s, n);
    if (id >= 0) return id;
    if (nm->n == nm->cap) {
        int    nc = nm->cap ? nm->cap * 2 : 64;
        tstr **nn = tm_alloc(&T->arena, sizeof(tstr *) * (size_t)nc);
        if (nm->n) memcpy(nn, nm->names, sizeof(tstr *) * (size_t)nm->n);
        nm->names = nn;
        nm->cap = nc;
    }
    if ((nm->n + 1) * 2 > nm->hcap) {
        int      hc = nm->hcap ? nm->hcap * 2 : 128;
        int32_t *hh = tm_alloc(&T->arena, sizeof(int32_t) * (size_t)hc);
        for (int k = 0; k < hc; k++) hh[k] = -1;
        for (int k = 0; k < nm->n; k++) {
            uint32_t h = name_hash(nm->names[k]->s, nm->names[k]->len) & (uint32_t)(hc - 1);
            while (hh[h] >= 0) h = (h + 1) & (uint32_t)(hc - 1);
            hh[h] = k;
        }
        nm->hash = hh;
        nm->hcap = hc;
    }
    id = nm->n++;
    nm->names[id] = arena_str(&T->arena, s, n);
    uint32_t h = name_hash(s, n) & (uint32_t)(nm->hcap - 1);
    while (nm->hash[h] >= 0) h = (h + 1) & (uint32_t)(nm->hcap - 1);
    nm->hash[h] = id;
    return id;
}

/* ---------------------------------------------------------------- token stream */

static tm_tok *cur(parser *P) { return &P->t[P->i]; }
static tm_tok *look(parser *P) { return &P->t[P->i + 1 < P->nt ? P->i + 1 : P->i]; }
static tm_tok *advance(parser *P) {
    tm_tok *t = &P->t[P->i];
    if (P->i + 1 < P->nt) P->i++;
    return t;
}

static bool is_op(tm_tok *t, int op) { return t->type == T_OP && t->op == op; }
static bool is_name(tm_tok *t, const char *s) {
    size_t n = strlen(s);
    return t->type == T_NAME && t->n == n && memcmp(t->s, s, n) == 0;
}

static const char *op_text(int op) {
    static const char *txt[] = {"+", "-", "/", "//", "*", "%", "**", "~", "[", "]", "(", ")", "{",
                                "}", "==", "!=", ">", ">=", "<", "<=", "=", ".", ":", "|", ",", ";"};
    return (op >= 0 && op < (int)(sizeof txt / sizeof txt[0])) ? txt[op] : "?";
}

static void describe(char *buf, size_t cap, tm_tok *t) {
    switch (t->type) {
    case T_EOF: snprintf(buf, cap, "end of template"); break;
    case T_DATA: snprintf(buf, cap, "template data / text"); break;
    case T_VAR_BEGIN: snprintf(buf, cap, "begin of print statement"); break;
    case T_VAR_END: snprintf(buf, cap, "end of print statement"); break;
    case T_BLOCK_BEGIN: snprintf(buf, cap, "begin of statement block"); break;
    case T_BLOCK_END: snprintf(buf, cap, "end of statement block"); break;
    case T_NAME: snprintf(buf, cap, "%.*s", (int)(t->n > 60 ? 60 : t->n), t->s); break;
    case T_STRING: snprintf(buf, cap, "string"); break;
    case T_INT: snprintf(buf, cap, "integer"); break;
    case T_FLOAT: snprintf(buf, cap, "float"); break;
    case T_OP: snprintf(buf, cap, "%s", op_text(t->op)); break;
    default: snprintf(buf, cap, "?");
    }
}

_Noreturn static void fail_unexpected(parser *P, tm_tok *t) {
    char d[80];
    describe(d, sizeof d, t);
    if (t->type == T_EOF)
        tm_fail(P->e, AG_ERR_TEMPLATE, t->line, "unexpected end of template%s%s%s",
                P->innermost ? " (the innermost open block is '" : "", P->innermost ? P->innermost : "",
                P->innermost ? "')" : "");
    tm_fail(P->e, AG_ERR_TEMPLATE, t->line, "unexpected '%s'", d);
}

static tm_tok *expect_op(parser *P, int op) {
    tm_tok *t = cur(P);
    if (!is_op(t, op)) {
        char d[80];
        describe(d, sizeof d, t);
        tm_fail(P->e, AG_ERR_TEMPLATE, t->line, "expected token '%s', got '%s'", op_text(op), d);
    }
    return advance(P);
}

static tm_tok *expect_type(parser *P, int type, const char *what) {
    tm_tok *t = cur(P);
    if (t->type != type) {
        char d[80];
        describe(d, sizeof d, t);
        tm_fail(P->e, AG_ERR_TEMPLATE, t->line, "expected token '%s', got '%s'", what, d);
    }
    return advance(P);
}

static void expect_name(parser *P, const char *s) {
    tm_tok *t = cur(P);
    if (!is_name(t, s)) {
        char d[80];
        describe(d, sizeof d, t);
        tm_fail(P->e, AG_ERR_TEMPLATE, t->line, "expected token '%s', got '%s'", s, d);
    }
    advance(P);
}

static tnode *mk(parser *P, int kind, int line) {
    tnode *n = tm_alloc(P->a, sizeof *n);
    n->kind = (uint8_t)kind;
    n->line = line;
    n->name = -1;
    n->hops = -1;
    n->slot = -1;
    n->loop_slot = n->caller_slot = n->varargs_slot = n->kwargs_slot = -1;
    return n;
}

static void enter(parser *P) {
    if (++P->depth > MAX_PARSE_DEPTH)
        tm_fail(P->e, AG_ERR_RANGE, cur(P)->line, "template nested too deeply (more than %d levels)", MAX_PARSE_DEPTH);
}
static void leave(parser *P) { P->depth--; }

/* ---------------------------------------------------------------- expressions */

static tnode *parse_expression(parser *P, bool with_condexpr);
static tnode *parse_tuple(parser *P, int mode /* 0 full, 1 no condexpr, 2 simplified */, bool explicit_parens,
                          const char *extra_end);
static tnode *parse_unary(parser *P, bool with_filter);
static tnode *parse_primary(parser *P);
static tnode *parse_postfix(parser *P, tnode *node);
static tnode *parse_filter(parser *P, tnode *node, bool start_inline);

static tv const_str(parser *P, const char *s, size_t n) {
    tv v = {.t = TV_STR};
    v.s = arena_str(P->a, s, n);
    return v;
}

static void parse_call_args(parser *P, tnode *call) {
    tm_tok *lp = expect_op(P, TO_LPAREN);
    nvec    args = {0}, kwv = {0};
    int    *kwn = NULL;
    int     nk = 0, capk = 0;
    bool    require_comma = false;
    while (!is_op(cur(P), TO_RPAREN)) {
        if (require_comma) {
            expect_op(P, TO_COMMA);
            if (is_op(cur(P), TO_RPAREN)) break;
        }
        if (is_op(cur(P), TO_MUL) || is_op(cur(P), TO_POW))
            tm_fail(P->e, AG_ERR_UNSUPPORTED, cur(P)->line, "unsupported: *args / **kwargs in a call");
        if (cur(P)->type == T_NAME && is_op(look(P), TO_ASSIGN)) {
            tm_tok *k = advance(P);
            advance(P);
            tnode *v = parse_expression(P, true);
            if (nk == capk) {
                int  nc = capk ? capk * 2 : 4;
                int *nn = tm_alloc(P->a, sizeof(int) * (size_t)nc);
                if (nk) memcpy(nn, kwn, sizeof(int) * (size_t)nk);
                kwn = nn;
                capk = nc;
            }
            kwn[nk++] = intern(P->T, k->s, k->n);
            nv_push(P, &kwv, v);
        } else {
            if (nk) tm_fail(P->e, AG_ERR_TEMPLATE, lp->line, "invalid syntax for function call expression");
            nv_push(P, &args, parse_expression(P, true));
        }
        require_comma = true;
    }
    expect_op(P, TO_RPAREN);
    call->items = args.v;
    call->nitems = args.n;
    call->items2 = kwv.v;
    call->nitems2 = kwv.n;
    call->kwnames = kwn;
}

static tnode *parse_list(parser *P) {
    tm_tok *t = expect_op(P, TO_LBRACKET);
    nvec    items = {0};
    while (!is_op(cur(P), TO_RBRACKET)) {
        if (items.n) expect_op(P, TO_COMMA);
        if (is_op(cur(P), TO_RBRACKET)) break;
        nv_push(P, &items, parse_expression(P, true));
    }
    expect_op(P, TO_RBRACKET);
    tnode *n = mk(P, N_LIST, t->line);
    n->items = items.v;
    n->nitems = items.n;
    return n;
}

static tnode *parse_dict(parser *P) {
    tm_tok *t = expect_op(P, TO_LBRACE);
    nvec    keys = {0}, vals = {0};
    while (!is_op(cur(P), TO_RBRACE)) {
        if (keys.n) expect_op(P, TO_COMMA);
        if (is_op(cur(P), TO_RBRACE)) break;
        tnode *k = parse_expression(P, true);
        expect_op(P, TO_COLON);
        tnode *v = parse_expression(P, true);
        nv_push(P, &keys, k);
        nv_push(P, &vals, v);
    }
    expect_op(P, TO_RBRACE);
    tnode *n = mk(P, N_DICT, t->line);
    n->items = keys.v;
    n->nitems = keys.n;
    n->items2 = vals.v;
    n->nitems2 = vals.n;
    return n;
}

static tnode *parse_primary(parser *P) {
    tm_tok *t = cur(P);
    tnode  *n;
    enter(P);
    if (t->type == T_NAME) {
        n = mk(P, N_CONST, t->line);
        if (is_name(t, "true") || is_name(t, "True")) {
            n->val.t = TV_BOOL;
            n->val.i = 1;
        } else if (is_name(t, "false") || is_name(t, "False")) {
            n->val.t = TV_BOOL;
            n->val.i = 0;
        } else if (is_name(t, "none") || is_name(t, "None")) {
            n->val.t = TV_NONE;
        } else {
            n->kind = N_NAME;
            n->name = intern(P->T, t->s, t->n);
        }
        advance(P);
    } else if (t->type == T_STRING) {
        /* adjacent string literals concatenate */
        size_t total = 0;
        int    j = P->i;
        while (P->t[j].type == T_STRING) total += P->t[j++].n;
        char  *buf = tm_alloc(P->a, total + 1);
        size_t o = 0;
        while (cur(P)->type == T_STRING) {
            memcpy(buf + o, cur(P)->s, cur(P)->n);
            o += cur(P)->n;
            advance(P);
        }
        n = mk(P, N_CONST, t->line);
        n->val = const_str(P, buf, o);
    } else if (t->type == T_INT) {
        n = mk(P, N_CONST, t->line);
        n->val.t = TV_INT;
        n->val.i = t->i;
        advance(P);
    } else if (t->type == T_FLOAT) {
        n = mk(P, N_CONST, t->line);
        n->val.t = TV_FLOAT;
        n->val.d = t->d;
        advance(P);
    } else if (is_op(t, TO_LPAREN)) {
        advance(P);
        n = parse_tuple(P, 0, true, NULL);
        expect_op(P, TO_RPAREN);
    } else if (is_op(t, TO_LBRACKET)) {
        n = parse_list(P);
    } else if (is_op(t, TO_LBRACE)) {
        n = parse_dict(P);
    } else {
        fail_unexpected(P, t);
    }
    leave(P);
    return n;
}

static tnode *parse_subscribed(parser *P) {
    int    line = cur(P)->line;
    tnode *args[3] = {NULL, NULL, NULL};
    if (is_op(cur(P), TO_COLON)) {
        advance(P);
    } else {
        tnode *node = parse_expression(P, true);
        if (!is_op(cur(P), TO_COLON)) return node;
        advance(P);
        args[0] = node;
    }
    if (is_op(cur(P), TO_COLON)) {
        /* stop is None */
    } else if (!is_op(cur(P), TO_RBRACKET) && !is_op(cur(P), TO_COMMA)) {
        args[1] = parse_expression(P, true);
    }
    if (is_op(cur(P), TO_COLON)) {
        advance(P);
        if (!is_op(cur(P), TO_RBRACKET) && !is_op(cur(P), TO_COMMA)) args[2] = parse_expression(P, true);
    }
    tnode *s = mk(P, N_SLICE, line);
    s->a = args[0];
    s->b = args[1];
    s->c = args[2];
    return s;
}

static tnode *parse_subscript(parser *P, tnode *node) {
    tm_tok *t = advance(P);
    if (t->type == T_OP && t->op == TO_DOT) {
        tm_tok *at = cur(P);
        advance(P);
        if (at->type == T_NAME) {
            tnode *g = mk(P, N_GETATTR, t->line);
            g->a = node;
            g->val = const_str(P, at->s, at->n);
            return g;
        }
        if (at->type != T_INT) tm_fail(P->e, AG_ERR_TEMPLATE, at->line, "expected name or number");
        tnode *k = mk(P, N_CONST, at->line);
        k->val.t = TV_INT;
        k->val.i = at->i;
        tnode *g = mk(P, N_GETITEM, t->line);
        g->a = node;
        g->b = k;
        return g;
    }
    /* '[' */
    nvec args = {0};
    while (!is_op(cur(P), TO_RBRACKET)) {
        if (args.n) expect_op(P, TO_COMMA);
        nv_push(P, &args, parse_subscribed(P));
    }
    expect_op(P, TO_RBRACKET);
    tnode *key;
    if (args.n == 1) key = args.v[0];
    else {
        key = mk(P, N_TUPLE, t->line);
        key->items = args.v;
        key->nitems = args.n;
    }
    tnode *g = mk(P, N_GETITEM, t->line);
    g->a = node;
    g->b = key;
    return g;
}

static tnode *parse_postfix(parser *P, tnode *node) {
    for (;;) {
        tm_tok *t = cur(P);
        if (is_op(t, TO_DOT) || is_op(t, TO_LBRACKET)) node = parse_subscript(P, node);
        else if (is_op(t, TO_LPAREN)) {
            tnode *c = mk(P, N_CALL, t->line);
            c->a = node;
            parse_call_args(P, c);
            node = c;
        } else break;
    }
    return node;
}

static void dotted_name(parser *P, char *buf, size_t cap, int *line) {
    tm_tok *t = expect_type(P, T_NAME, "name");
    *line = t->line;
    snprintf(buf, cap, "%.*s", (int)t->n, t->s);
    while (is_op(cur(P), TO_DOT)) {
        advance(P);
        tm_tok *u = expect_type(P, T_NAME, "name");
        size_t  l = strlen(buf);
        snprintf(buf + l, cap - l, ".%.*s", (int)u->n, u->s);
    }
}

static tnode *parse_filter(parser *P, tnode *node, bool start_inline) {
    while (is_op(cur(P), TO_PIPE) || start_inline) {
        if (!start_inline) advance(P);
        char name[128];
        int  line;
        dotted_name(P, name, sizeof name, &line);
        bool   unsupported = false;
        tnode *f = mk(P, N_FILTER, line);
        f->a = node;
        f->name = tm_filter_id(name, strlen(name), &unsupported);
        if (f->name < 0) f->val = const_str(P, name, strlen(name)); /* unknown: see check_names */
        if (is_op(cur(P), TO_LPAREN)) parse_call_args(P, f);
        node = f;
        start_inline = false;
    }
    return node;
}

static tnode *parse_test(parser *P, tnode *node) {
    tm_tok *is = advance(P); /* 'is' */
    bool    negated = false;
    if (is_name(cur(P), "not")) {
        advance(P);
        negated = true;
    }
    char name[128];
    int  line;
    dotted_name(P, name, sizeof name, &line);
    tnode *t = mk(P, N_TEST, is->line);
    t->a = node;
    t->name = tm_test_id(name, strlen(name));
    if (t->name < 0) t->val = const_str(P, name, strlen(name)); /* unknown: see check_names */
    tm_tok *c = cur(P);
    if (is_op(c, TO_LPAREN)) {
        parse_call_args(P, t);
    } else if ((c->type == T_NAME || c->type == T_STRING || c->type == T_INT || c->type == T_FLOAT ||
                is_op(c, TO_LPAREN) || is_op(c, TO_LBRACKET) || is_op(c, TO_LBRACE)) &&
               !is_name(c, "else") && !is_name(c, "or") && !is_name(c, "and")) {
        if (is_name(c, "is")) tm_fail(P->e, AG_ERR_TEMPLATE, c->line, "You cannot chain multiple tests with is");
        tnode *arg = parse_primary(P);
        arg = parse_postfix(P, arg);
        t->items = tm_alloc(P->a, sizeof(tnode *));
        t->items[0] = arg;
        t->nitems = 1;
    }
    if (negated) {
        tnode *n = mk(P, N_NOT, is->line);
        n->a = t;
        return n;
    }
    return t;
}

static tnode *parse_filter_expr(parser *P, tnode *node) {
    for (;;) {
        tm_tok *t = cur(P);
        if (is_op(t, TO_PIPE)) node = parse_filter(P, node, false);
        else if (is_name(t, "is")) node = parse_test(P, node);
        else if (is_op(t, TO_LPAREN)) {
            tnode *c = mk(P, N_CALL, t->line);
            c->a = node;
            parse_call_args(P, c);
            node = c;
        } else break;
    }
    return node;
}

static tnode *parse_unary(parser *P, bool with_filter) {
    tm_tok *t = cur(P);
    tnode  *node;
    enter(P);
    if (is_op(t, TO_SUB) || is_op(t, TO_ADD)) {
        advance(P);
        node = mk(P, t->op == TO_SUB ? N_NEG : N_POS, t->line);
        node->a = parse_unary(P, false);
    } else {
        node = parse_primary(P);
    }
    node = parse_postfix(P, node);
    if (with_filter) node = parse_filter_expr(P, node);
    leave(P);
    return node;
}

static tnode *binop(parser *P, int op, tnode *l, tnode *r, int line) {
    tnode *n = mk(P, N_BINOP, line);
    n->op = (uint8_t)op;
    n->a = l;
    n->b = r;
    return n;
}

static tnode *parse_pow(parser *P) {
    int    line = cur(P)->line;
    tnode *left = parse_unary(P, true);
    while (is_op(cur(P), TO_POW)) {
        advance(P);
        tnode *right = parse_unary(P, true);
        left = binop(P, OP_POW, left, right, line);
        line = cur(P)->line;
    }
    return left;
}

static tnode *parse_math2(parser *P) {
    int    line = cur(P)->line;
    tnode *left = parse_pow(P);
    for (;;) {
        tm_tok *t = cur(P);
        int     op;
        if (is_op(t, TO_MUL)) op = OP_MUL;
        else if (is_op(t, TO_DIV)) op = OP_DIV;
        else if (is_op(t, TO_FLOORDIV)) op = OP_FLOORDIV;
        else if (is_op(t, TO_MOD)) op = OP_MOD;
        else break;
        advance(P);
        tnode *right = parse_pow(P);
        left = binop(P, op, left, right, line);
        line = cur(P)->line;
    }
    return left;
}

static tnode *parse_concat(parser *P) {
    int    line = cur(P)->line;
    tnode *first = parse_math2(P);
    if (!is_op(cur(P), TO_TILDE)) return first;
    nvec args = {0};
    nv_push(P, &args, first);
    while (is_op(cur(P), TO_TILDE)) {
        advance(P);
        nv_push(P, &args, parse_math2(P));
    }
    tnode *n = mk(P, N_CONCAT, line);
    n->items = args.v;
    n->nitems = args.n;
    return n;
}

static tnode *parse_math1(parser *P) {
    int    line = cur(P)->line;
    tnode *left = parse_concat(P);
    while (is_op(cur(P), TO_ADD) || is_op(cur(P), TO_SUB)) {
        int op = cur(P)->op == TO_ADD ? OP_ADD : OP_SUB;
        advance(P);
        tnode *right = parse_concat(P);
        left = binop(P, op, left, right, line);
        line = cur(P)->line;
    }
    return left;
}

static tnode *parse_compare(parser *P) {
    int    line = cur(P)->line;
    tnode *expr = parse_math1(P);
    nvec   operands = {0};
    uint8_t opsbuf[64];
    int    nops = 0;
    for (;;) {
        tm_tok *t = cur(P);
        int     op = -1;
        if (is_op(t, TO_EQ)) op = CMP_EQ;
        else if (is_op(t, TO_NE)) op = CMP_NE;
        else if (is_op(t, TO_LT)) op = CMP_LT;
        else if (is_op(t, TO_LTEQ)) op = CMP_LE;
        else if (is_op(t, TO_GT)) op = CMP_GT;
        else if (is_op(t, TO_GTEQ)) op = CMP_GE;
        if (op >= 0) advance(P);
        else if (is_name(t, "in")) {
            advance(P);
            op = CMP_IN;
        } else if (is_name(t, "not") && is_name(look(P), "in")) {
            advance(P);
            advance(P);
            op = CMP_NOTIN;
        } else break;
        if (nops >= (int)sizeof opsbuf) tm_fail(P->e, AG_ERR_RANGE, t->line, "comparison chain too long");
        opsbuf[nops++] = (uint8_t)op;
        nv_push(P, &operands, parse_math1(P));
    }
    if (!nops) return expr;
    tnode *n = mk(P, N_COMPARE, line);
    n->a = expr;
    n->items = operands.v;
    n->nitems = operands.n;
    n->ops = tm_alloc(P->a, (size_t)nops);
    memcpy(n->ops, opsbuf, (size_t)nops);
    return n;
}

static tnode *parse_not(parser *P) {
    if (is_name(cur(P), "not")) {
        tm_tok *t = advance(P);
        enter(P);
        tnode *n = mk(P, N_NOT, t->line);
        n->a = parse_not(P);
        leave(P);
        return n;
    }
    return parse_compare(P);
}

static tnode *parse_and(parser *P) {
    int    line = cur(P)->line;
    tnode *left = parse_not(P);
    while (is_name(cur(P), "and")) {
        advance(P);
        tnode *right = parse_not(P);
        tnode *n = mk(P, N_AND, line);
        n->a = left;
        n->b = right;
        left = n;
        line = cur(P)->line;
    }
    return left;
}

static tnode *parse_or(parser *P) {
    int    line = cur(P)->line;
    tnode *left = parse_and(P);
    while (is_name(cur(P), "or")) {
        advance(P);
        tnode *right = parse_and(P);
        tnode *n = mk(P, N_OR, line);
        n->a = left;
        n->b = right;
        left = n;
        line = cur(P)->line;
    }
    return left;
}

static tnode *parse_condexpr(parser *P) {
    int    line = cur(P)->line;
    tnode *expr1 = parse_or(P);
    while (is_name(cur(P), "if")) {
        advance(P);
        tnode *expr2 = parse_or(P);
        tnode *expr3 = NULL;
        if (is_name(cur(P), "else")) {
            advance(P);
            enter(P);
            expr3 = parse_condexpr(P);
            leave(P);
        }
        tnode *n = mk(P, N_COND, line);
        n->a = expr2;
        n->b = expr1;
        n->c = expr3;
        expr1 = n;
        line = cur(P)->line;
    }
    return expr1;
}

static tnode *parse_expression(parser *P, bool with_condexpr) {
    enter(P);
    tnode *n = with_condexpr ? parse_condexpr(P) : parse_or(P);
    leave(P);
    return n;
}

static bool is_tuple_end(parser *P, const char *extra_end) {
    tm_tok *t = cur(P);
    if (t->type == T_VAR_END || t->type == T_BLOCK_END || is_op(t, TO_RPAREN)) return true;
    if (extra_end && is_name(t, extra_end)) return true;
    return false;
}

static tnode *parse_tuple(parser *P, int mode, bool explicit_parens, const char *extra_end) {
    int  line = cur(P)->line;
    nvec args = {0};
    bool is_tuple = false;
    for (;;) {
        if (args.n) expect_op(P, TO_COMMA);
        if (is_tuple_end(P, extra_end)) break;
        tnode *x;
        if (mode == 2) x = parse_primary(P);
        else x = parse_expression(P, mode == 0);
        nv_push(P, &args, x);
        if (is_op(cur(P), TO_COMMA)) is_tuple = true;
        else break;
        line = cur(P)->line;
    }
    if (!is_tuple) {
        if (args.n) return args.v[0];
        if (!explicit_parens) {
            char d[80];
            describe(d, sizeof d, cur(P));
            tm_fail(P->e, AG_ERR_TEMPLATE, cur(P)->line, "Expected an expression, got '%s'", d);
        }
    }
    tnode *n = mk(P, N_TUPLE, line);
    n->items = args.v;
    n->nitems = args.n;
    return n;
}

/* ---------------------------------------------------------------- assignment targets */

static void check_assignable(parser *P, tnode *t) {
    if (t->kind == N_NAME) return;
    if (t->kind == N_TUPLE) {
        for (int i = 0; i < t->nitems; i++) check_assignable(P, t->items[i]);
        return;
    }
    tm_fail(P->e, AG_ERR_TEMPLATE, t->line, "can't assign to '%s'",
            t->kind == N_CONST ? "const" : t->kind == N_LIST ? "list" : "expression");
}

static tnode *parse_assign_target(parser *P, bool with_tuple, bool name_only, const char *extra_end,
                                  bool with_namespace) {
    if (with_namespace && cur(P)->type == T_NAME && is_op(look(P), TO_DOT)) {
        tm_tok *t = advance(P);
        advance(P);
        tm_tok *attr = expect_type(P, T_NAME, "name");
        tnode  *n = mk(P, N_NSREF, t->line);
        n->name = intern(P->T, t->s, t->n);
        n->val = const_str(P, attr->s, attr->n);
        return n;
    }
    tnode *target;
    if (name_only) {
        tm_tok *t = expect_type(P, T_NAME, "name");
        target = mk(P, N_NAME, t->line);
        target->name = intern(P->T, t->s, t->n);
        if (is_name(t, "true") || is_name(t, "false") || is_name(t, "none") || is_name(t, "True") ||
            is_name(t, "False") || is_name(t, "None"))
            tm_fail(P->e, AG_ERR_TEMPLATE, t->line, "can't assign to 'const'");
    } else if (with_tuple) {
        target = parse_tuple(P, 2, false, extra_end);
    } else {
        target = parse_primary(P);
    }
    check_assignable(P, target);
    return target;
}

/* ---------------------------------------------------------------- statements */

static tnode **subparse(parser *P, const char *const *end_tokens, int *nout);
static tnode *parse_statement(parser *P);

/* Parses `%} body {% <end token>`: on return cur() is the end token name. */
static tnode **parse_statements(parser *P, const char *const *end_tokens, bool drop_needle, int *nout) {
    if (is_op(cur(P), TO_COLON)) advance(P);
    expect_type(P, T_BLOCK_END, "end of statement block");
    tnode **body = subparse(P, end_tokens, nout);
    if (cur(P)->type == T_EOF) {
        char want[160] = "";
        for (int k = 0; end_tokens[k]; k++) {
            size_t l = strlen(want);
            snprintf(want + l, sizeof want - l, "%s'%s'", k ? " or " : "", end_tokens[k]);
        }
        tm_fail(P->e, AG_ERR_TEMPLATE, cur(P)->line,
                "Unexpected end of template. Jinja was looking for the following tags: %s. "
                "The innermost block that needs to be closed is '%s'.",
                want, P->innermost ? P->innermost : "?");
    }
    if (drop_needle) advance(P);
    return body;
}

/* Macro and caller signature: (a, b=default, ...) into items (N_NAME) and
 * items2 (defaults, aligned to the last params). */
static void parse_signature(parser *P, tnode *node) {
    expect_op(P, TO_LPAREN);
    nvec args = {0}, defaults = {0};
    while (!is_op(cur(P), TO_RPAREN)) {
        if (args.n) expect_op(P, TO_COMMA);
        tnode *arg = parse_assign_target(P, false, true, NULL, false);
        if (is_op(cur(P), TO_ASSIGN)) {
            advance(P);
            nv_push(P, &defaults, parse_expression(P, true));
        } else if (defaults.n) {
            tm_fail(P->e, AG_ERR_TEMPLATE, arg->line, "non-default argument follows default argument");
        }
        nv_push(P, &args, arg);
    }
    expect_op(P, TO_RPAREN);
    node->items = args.v;
    node->nitems = args.n;
    node->items2 = defaults.v;
    node->nitems2 = defaults.n;
}

/* The body of a statement lives in node->c as an S_BODY wrapper for
 * statements that already use items/items2 for other things. */
static tnode *wrap_body(parser *P, tnode **body, int n, int line) {
    tnode *b = mk(P, S_BODY, line);
    b->items = body;
    b->nitems = n;
    return b;
}

static const char *const END_FOR[] = {"endfor", "else", NULL};
static const char *const END_FOR2[] = {"endfor", NULL};
static const char *const END_IF[] = {"elif", "else", "endif", NULL};
static const char *const END_IF2[] = {"endif", NULL};
static const char *const END_SET[] = {"endset", NULL};
static const char *const END_MACRO[] = {"endmacro", NULL};
static const char *const END_CALL[] = {"endcall", NULL};
static const char *const END_FILTER[] = {"endfilter", NULL};
static const char *const END_WITH[] = {"endwith", NULL};
static const char *const END_GENERATION[] = {"endgeneration", NULL};

static tnode *parse_for(parser *P, int line) {
    tnode *n = mk(P, S_FOR, line);
    n->a = parse_assign_target(P, true, false, "in", false);
    int loop_id = tm_names_find(&P->T->names, "loop", 4);
    if (n->a->kind == N_NAME && n->a->name == loop_id)
        tm_fail(P->e, AG_ERR_TEMPLATE, line, "Can't assign to special loop variable in for-loop target");
    for (int k = 0; n->a->kind == N_TUPLE && k < n->a->nitems; k++)
        if (n->a->items[k]->kind == N_NAME && n->a->items[k]->name == loop_id)
            tm_fail(P->e, AG_ERR_TEMPLATE, line, "Can't assign to special loop variable in for-loop target");
    expect_name(P, "in");
    n->b = parse_tuple(P, 1, false, "recursive");
    if (is_name(cur(P), "if")) {
        advance(P);
        n->c = parse_expression(P, true);
    }
    if (is_name(cur(P), "recursive"))
        tm_fail(P->e, AG_ERR_UNSUPPORTED, cur(P)->line, "unsupported: recursive for loops");
    const char *saved = P->innermost;
    P->innermost = "for";
    P->loop_depth++;
    n->items = parse_statements(P, END_FOR, false, &n->nitems);
    P->loop_depth--;
    tm_tok *t = advance(P);
    if (is_name(t, "else")) n->items2 = parse_statements(P, END_FOR2, true, &n->nitems2);
    P->innermost = saved;
    return n;
}

static tnode *parse_if(parser *P, int line) {
    const char *saved = P->innermost;
    P->innermost = "if";
    tnode *result = mk(P, S_IF, line), *node = result;
    for (;;) {
        node->a = parse_tuple(P, 1, false, NULL);
        node->items = parse_statements(P, END_IF, false, &node->nitems);
        tm_tok *t = advance(P);
        if (is_name(t, "elif")) {
            tnode *e = mk(P, S_IF, cur(P)->line);
            node->items2 = tm_alloc(P->a, sizeof(tnode *));
            node->items2[0] = e;
            node->nitems2 = 1;
            node = e;
            continue;
        }
        if (is_name(t, "else")) node->items2 = parse_statements(P, END_IF2, true, &node->nitems2);
        break;
    }
    P->innermost = saved;
    return result;
}

static tnode *parse_set(parser *P, int line) {
    tnode *target = parse_assign_target(P, true, false, NULL, true);
    if (is_op(cur(P), TO_ASSIGN)) {
        advance(P);
        tnode *n = mk(P, S_SET, line);
        n->a = target;
        n->b = parse_tuple(P, 0, false, NULL);
        return n;
    }
    tnode *n = mk(P, S_SETBLOCK, line);
    n->a = target;
    n->b = parse_filter(P, NULL, false);
    const char *saved = P->innermost;
    P->innermost = "set";
    n->items = parse_statements(P, END_SET, true, &n->nitems);
    P->innermost = saved;
    return n;
}

static tnode *parse_macro(parser *P, int line) {
    tnode *n = mk(P, S_MACRO, line);
    tnode *nm = parse_assign_target(P, false, true, NULL, false);
    n->name = nm->name;
    parse_signature(P, n);
    const char *saved = P->innermost;
    int         saved_loops = P->loop_depth;
    P->innermost = "macro";
    P->loop_depth = 0;
    int     nb;
    tnode **body = parse_statements(P, END_MACRO, true, &nb);
    P->loop_depth = saved_loops;
    P->innermost = saved;
    n->c = wrap_body(P, body, nb, line);
    return n;
}

static tnode *parse_call_block(parser *P, int line) {
    tnode *n = mk(P, S_CALLBLOCK, line); /* n itself is the caller macro */
    if (is_op(cur(P), TO_LPAREN)) parse_signature(P, n);
    tnode *call = parse_expression(P, true);
    if (call->kind != N_CALL) tm_fail(P->e, AG_ERR_TEMPLATE, line, "expected call");
    n->a = call;
    const char *saved = P->innermost;
    int         saved_loops = P->loop_depth;
    P->innermost = "call";
    P->loop_depth = 0;
    int     nb;
    tnode **body = parse_statements(P, END_CALL, true, &nb);
    P->loop_depth = saved_loops;
    P->innermost = saved;
    n->c = wrap_body(P, body, nb, line);
    n->name = NM_CALLER;
    return n;
}

static tnode *parse_statement(parser *P) {
    tm_tok *t = cur(P);
    if (t->type != T_NAME) {
        if (t->type == T_EOF) fail_unexpected(P, t);
        tm_fail(P->e, AG_ERR_TEMPLATE, t->line, "tag name expected");
    }
    int line = t->line;
    enter(P);
    tnode *r = NULL;
    if (is_name(t, "for")) {
        advance(P);
        r = parse_for(P, line);
    } else if (is_name(t, "if")) {
        advance(P);
        r = parse_if(P, line);
    } else if (is_name(t, "set")) {
        advance(P);
        r = parse_set(P, line);
    } else if (is_name(t, "macro")) {
        advance(P);
        r = parse_macro(P, line);
    } else if (is_name(t, "call")) {
        advance(P);
        r = parse_call_block(P, line);
    } else if (is_name(t, "filter")) {
        advance(P);
        r = mk(P, S_FILTERBLOCK, line);
        r->b = parse_filter(P, NULL, true);
        const char *saved = P->innermost;
        P->innermost = "filter";
        r->items = parse_statements(P, END_FILTER, true, &r->nitems);
        P->innermost = saved;
    } else if (is_name(t, "with")) {
        advance(P);
        r = mk(P, S_WITH, line);
        nvec targets = {0}, values = {0};
        while (cur(P)->type != T_BLOCK_END) {
            if (targets.n) expect_op(P, TO_COMMA);
            tnode *target = parse_assign_target(P, true, false, NULL, false);
            expect_op(P, TO_ASSIGN);
            nv_push(P, &targets, target);
            nv_push(P, &values, parse_expression(P, true));
        }
        r->items = targets.v;
        r->nitems = targets.n;
        r->items2 = values.v;
        r->nitems2 = values.n;
        const char *saved = P->innermost;
        P->innermost = "with";
        int     nb;
        tnode **body = parse_statements(P, END_WITH, true, &nb);
        P->innermost = saved;
        r->c = wrap_body(P, body, nb, line);
    } else if (is_name(t, "break") || is_name(t, "continue")) {
        bool brk = is_name(t, "break");
        advance(P);
        if (P->loop_depth == 0)
            tm_fail(P->e, AG_ERR_TEMPLATE, line, "'%s' outside loop", brk ? "break" : "continue");
        r = mk(P, brk ? S_BREAK : S_CONTINUE, line);
    } else if (is_name(t, "generation")) {
        /* transformers' AssistantTracker: renders its body unchanged */
        advance(P);
        const char *saved = P->innermost;
        P->innermost = "generation";
        int saved_loops = P->loop_depth;
        P->loop_depth = 0; /* the body is a caller function in jinja2 */
        r = mk(P, S_GENERATION, line);
        r->items = parse_statements(P, END_GENERATION, true, &r->nitems);
        P->loop_depth = saved_loops;
        P->innermost = saved;
    } else if (is_name(t, "print")) {
        advance(P);
        r = mk(P, S_OUTPUT, line);
        nvec items = {0};
        while (cur(P)->type != T_BLOCK_END) {
            if (items.n) expect_op(P, TO_COMMA);
            nv_push(P, &items, parse_expression(P, true));
        }
        r->items = items.v;
        r->nitems = items.n;
    } else if (is_name(t, "block") || is_name(t, "extends") || is_name(t, "include") || is_name(t, "import") ||
               is_name(t, "from") || is_name(t, "autoescape") || is_name(t, "do") || is_name(t, "trans")) {
        tm_fail(P->e, AG_ERR_UNSUPPORTED, line, "unsupported: '%.*s' tag", (int)t->n, t->s);
    } else {
        tm_fail(P->e, AG_ERR_TEMPLATE, line, "Encountered unknown tag '%.*s'.%s%s%s", (int)(t->n > 60 ? 60 : t->n),
                t->s, P->innermost ? " The innermost block that needs to be closed is '" : "",
                P->innermost ? P->innermost : "", P->innermost ? "'." : "");
    }
    leave(P);
    return r;
}

static tnode **subparse(parser *P, const char *const *end_tokens, int *nout) {
    nvec body = {0};
    nvec data = {0}; /* pending output items, merged into one S_OUTPUT */
    int  data_line = 0;
    enter(P);
#define FLUSH()                                                                                                        \
    do {                                                                                                               \
        if (data.n) {                                                                                                  \
            tnode *o = mk(P, S_OUTPUT, data_line);                                                                     \
            o->items = data.v;                                                                                         \
            o->nitems = data.n;                                                                                        \
            nv_push(P, &body, o);                                                                                      \
            data = (nvec){0};                                                                                          \
        }                                                                                                              \
    } while (0)
    for (;;) {
        tm_tok *t = cur(P);
        if (t->type == T_EOF) break;
        if (t->type == T_DATA) {
            tnode *d = mk(P, S_DATA, t->line);
            d->val = const_str(P, t->s, t->n);
            if (!data.n) data_line = t->line;
            nv_push(P, &data, d);
            advance(P);
        } else if (t->type == T_VAR_BEGIN) {
            advance(P);
            if (!data.n) data_line = t->line;
            nv_push(P, &data, parse_tuple(P, 0, false, NULL));
            expect_type(P, T_VAR_END, "end of print statement");
        } else if (t->type == T_BLOCK_BEGIN) {
            FLUSH();
            advance(P);
            if (end_tokens)
                for (int k = 0; end_tokens[k]; k++)
                    if (is_name(cur(P), end_tokens[k])) {
                        leave(P);
                        *nout = body.n;
                        return body.v;
                    }
            tnode *st = parse_statement(P);
            nv_push(P, &body, st);
            expect_type(P, T_BLOCK_END, "end of statement block");
        } else {
            fail_unexpected(P, t);
        }
    }
    FLUSH();
#undef FLUSH
    leave(P);
    *nout = body.n;
    return body.v;
}

/* ---------------------------------------------------------------- unknown filters and tests */

/* jinja2 3.x checks that a filter or test exists when it compiles the
 * template, except in a "soft" frame: the test and branches of an if
 * statement and all of a conditional expression. There an unknown name
 * compiles to a function that raises when called, so a branch that never
 * runs may use filters the environment lacks (templates write
 * `{% if args is string %}{{ args|from_json }}...`). Frames jinja2 makes
 * anew are hard again, even inside an if: for-loop bodies, else and
 * filters, macro and call-block bodies and defaults, set blocks, filter
 * blocks, with bodies. Finds the first unknown name in a hard frame. */
static void check_names(const tnode *n, bool soft, const tnode **bad);

static void check_list(tnode *const *v, int n, bool soft, const tnode **bad) {
    for (int i = 0; i < n && !*bad; i++) check_names(v[i], soft, bad);
}

static void check_names(const tnode *n, bool soft, const tnode **bad) {
    if (!n || *bad) return;
    switch (n->kind) {
    case S_IF:
        check_names(n->a, true, bad);
        check_list(n->items, n->nitems, true, bad);
        check_list(n->items2, n->nitems2, true, bad); /* else, or the elif S_IF */
        return;
    case N_COND:
        check_names(n->b, true, bad);
        check_names(n->a, true, bad);
        check_names(n->c, true, bad);
        return;
    case S_FOR:
        check_names(n->b, soft, bad); /* the iterable: in the enclosing frame */
        check_names(n->c, false, bad);
        check_list(n->items, n->nitems, false, bad);
        check_list(n->items2, n->nitems2, false, bad);
        return;
    case S_MACRO:
        check_list(n->items2, n->nitems2, false, bad);
        check_names(n->c, false, bad);
        return;
    case S_CALLBLOCK:
        check_list(n->items2, n->nitems2, false, bad);
        check_names(n->c, false, bad);
        check_names(n->a, soft, bad); /* the call: in the enclosing frame */
        return;
    case S_SETBLOCK:
    case S_FILTERBLOCK:
        check_names(n->b, false, bad);
        check_list(n->items, n->nitems, false, bad);
        return;
    case S_WITH:
        check_list(n->items2, n->nitems2, soft, bad); /* the values: in the enclosing frame */
        check_names(n->c, false, bad);
        return;
    case S_GENERATION: check_list(n->items, n->nitems, false, bad); return;
    case N_FILTER:
    case N_TEST:
        if (n->name < 0 && !soft) {
            *bad = n;
            return;
        }
        break;
    default: break;
    }
    check_names(n->a, soft, bad);
    check_names(n->b, soft, bad);
    check_names(n->c, soft, bad);
    check_list(n->items, n->nitems, soft, bad);
    check_list(n->items2, n->nitems2, soft, bad);
}

/* ---------------------------------------------------------------- entry */

void tm_parse_template(ag_tmpl *T, const char *src, size_t len);

void tm_parse_template(ag_tmpl *T, const char *src, size_t len) {
    static const char *fixed[] = {"loop",         "varargs",      "kwargs", "caller", "range", "namespace",
                                  "raise_exception", "strftime_now", "dict",   "joiner", "cycler"};
    for (size_t k = 0; k < sizeof fixed / sizeof fixed[0]; k++) intern(T, fixed[k], strlen(fixed[k]));
    tm_tok *toks;
    int     nt;
    tm_lex(&T->arena, &T->err, src, len, &toks, &nt);
    parser P = {0};
    P.a = &T->arena;
    P.e = &T->err;
    P.t = toks;
    P.nt = nt;
    P.T = T;
    T->body = subparse(&P, NULL, &T->nbody);
    const tnode *bad = NULL;
    check_list(T->body, T->nbody, false, &bad);
    if (bad)
        tm_fail(P.e, AG_ERR_TEMPLATE, bad->line, "No %s named '%s'.", bad->kind == N_FILTER ? "filter" : "test",
                bad->val.s->s);
    tm_scope_analyze(T);
}
