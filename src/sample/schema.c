/* Structured output: see schema.h for the language and the cost model.
 *
 * A compiled schema is a graph of nodes. Concrete nodes are one kind of
 * value (object, array, string, number, a set of literal texts); a union
 * node (anyOf, a "type" list) is resolved when its value's first byte
 * arrives, through a table from the byte's class to a concrete node built
 * at compile time. The matcher is a stack of open containers plus the state
 * of the one leaf (string, number, literal, property name) being read; it is
 * a plain value, copied freely, so the mask can try bytes on copies. */
#include "sample/schema.h"

#include <math.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- compiled form ------------------------------------------------------ */

enum { N_UNION, N_OBJ, N_ARR, N_STR, N_NUM, N_LIT };

/* First-byte classes of a JSON value. */
enum { C_OBJ, C_ARR, C_STR, C_NUM, C_TRUE, C_FALSE, C_NULL, N_CLASSES };

#define NUM_INT_DIGITS  15 /* 10^15 < 2^53: every prefix is exact in a double */
#define NUM_FRAC_DIGITS 15
#define NUM_EXP_DIGITS  3
#define NUM_TEXT_MAX    40
#define MAX_NODES       20000
#define MAX_COMPILE_DEPTH 64
#define MAX_LITERALS    4096
#define NO_MAX          UINT32_MAX

typedef struct {
    char    *text; /* the key as JSON text, quotes included */
    uint32_t len;
    int32_t  node;
    bool     required;
} sc_prop;

typedef struct {
    uint8_t kind;
    uint8_t resolved; /* by_class: 0 not yet, 1 in progress, 2 done */
    int32_t by_class[N_CLASSES];
    /* N_UNION */
    int32_t *alts;
    int      n_alts;
    /* N_OBJ */
    sc_prop *props;
    int      n_props;
    int32_t  extra; /* no properties: the values' node, -1 for none ({} only) */
    /* N_ARR */
    int32_t  items;
    uint32_t min_items, max_items;
    /* N_STR */
    uint32_t min_len, max_len;
    /* N_NUM: bounds (integers: integral and inclusive) */
    bool   integer, bounded, lo_excl, hi_excl;
    double lo, hi;
    /* N_LIT: texts sorted bytewise, distinct */
    char    **lits;
    uint32_t *lit_lens;
    uint32_t  n_lits;
} sc_node;

struct ag_schema {
    atomic_int refs;
    sc_node   *nodes;
    int32_t    n_nodes, cap_nodes;
    /* The output: one of n_roots alternatives (prefix, value, suffix). The
     * prefixes are sorted; root[k] is the alternative (its index as
     * compiled) of the k-th prefix, whose value is node[alt] (-1: a literal,
     * no value) and suffix suf[alt]. A bare schema: one alternative with
     * empty prefix and suffix. At most one prefix is empty; that
     * alternative is taken by a first byte no other prefix starts with. */
    char    **pre;
    uint32_t *pre_len;
    int32_t  *root;
    uint32_t  n_roots;
    int32_t  *node;
    char    **suf;
    uint32_t *suf_len;
};

static int class_of(unsigned c) {
    switch (c) {
    case '{': return C_OBJ;
    case '[': return C_ARR;
    case '"': return C_STR;
    case 't': return C_TRUE;
    case 'f': return C_FALSE;
    case 'n': return C_NULL;
    default: return c == '-' || (c >= '0' && c <= '9') ? C_NUM : -1;
    }
}

/* ---- the compiler ------------------------------------------------------- */

typedef struct {
    ag_schema    *s;
    const json_t *doc; /* the document $refs point into */
    struct ref_memo {
        const json_t *target;
        int32_t       node;
    } *memo;
    int     n_memo, cap_memo;
    int32_t any; /* the "any JSON value" node, -1 until needed */
    int     depth;
    char    path[512]; /* JSON pointer of the schema being compiled */
    size_t  path_len;
    ag_status err;
} compiler;

static const char *where(const compiler *c) { return c->path_len ? c->path : "/"; }

static int32_t new_node(compiler *c, int kind) {
    ag_schema *s = c->s;
    if (s->n_nodes >= MAX_NODES) {
        c->err = ag_errorf(AG_ERR_INVALID, "JSON schema too large (more than %d nodes) at %s", MAX_NODES, where(c));
        return -1;
    }
    if (s->n_nodes == s->cap_nodes) {
        int32_t  cap = s->cap_nodes ? s->cap_nodes * 2 : 16;
        sc_node *n = realloc(s->nodes, (size_t)cap * sizeof *n);
        if (!n) {
            c->err = ag_errorf(AG_ERR_NOMEM, "out of memory compiling a JSON schema");
            return -1;
        }
        s->nodes = n;
        s->cap_nodes = cap;
    }
    sc_node *n = &s->nodes[s->n_nodes];
    memset(n, 0, sizeof *n);
    n->kind = (uint8_t)kind;
    n->extra = n->items = -1;
    n->max_items = n->max_len = NO_MAX;
    for (int k = 0; k < N_CLASSES; k++) n->by_class[k] = -1;
    return s->n_nodes++;
}

static void free_node(sc_node *n) {
    free(n->alts);
    for (int i = 0; i < n->n_props; i++) free(n->props[i].text);
    free(n->props);
    for (uint32_t i = 0; i < n->n_lits; i++) free(n->lits[i]);
    free(n->lits);
    free(n->lit_lens);
}

/* Appends "/seg" (escaped as a JSON pointer) to the path; returns the old
 * length to restore. A path too long for the buffer is cut (it is only
 * for messages). */
static size_t path_push(compiler *c, const char *seg) {
    size_t old = c->path_len;
    size_t room = sizeof c->path - 1;
    if (c->path_len < room) c->path[c->path_len++] = '/';
    for (const char *p = seg; *p && c->path_len + 2 <= room; p++) {
        if (*p == '~' || *p == '/') {
            c->path[c->path_len++] = '~';
            c->path[c->path_len++] = *p == '~' ? '0' : '1';
        } else {
            c->path[c->path_len++] = *p;
        }
    }
    c->path[c->path_len] = '\0';
    return old;
}

static void path_pop(compiler *c, size_t old) {
    c->path_len = old;
    c->path[old] = '\0';
}

static int32_t fail(compiler *c, ag_status code, const char *fmt, const char *arg) {
    char msg[256];
    snprintf(msg, sizeof msg, fmt, arg);
    c->err = ag_errorf(code, "%s at %s", msg, where(c));
    return -1;
}

static int cmp_bytes(const char *a, uint32_t la, const char *b, uint32_t lb) {
    int r = memcmp(a, b, la < lb ? la : lb);
    return r ? r : (la > lb) - (la < lb);
}

/* Sorts texts[0..n) (with lens, and `tag` carried along when non-NULL)
 * bytewise, shorter first among equal prefixes: the order the literal
 * matcher's range narrowing needs. Insertion sort: the lists are short. */
static void sort_texts(char **texts, uint32_t *lens, int32_t *tag, uint32_t n) {
    for (uint32_t i = 1; i < n; i++)
        for (uint32_t j = i; j > 0 && cmp_bytes(texts[j - 1], lens[j - 1], texts[j], lens[j]) > 0; j--) {
            char *t = texts[j];
            texts[j] = texts[j - 1], texts[j - 1] = t;
            uint32_t l = lens[j];
            lens[j] = lens[j - 1], lens[j - 1] = l;
            if (tag) {
                int32_t g = tag[j];
                tag[j] = tag[j - 1], tag[j - 1] = g;
            }
        }
}

/* A literal node from texts (taken over, freed on failure too). */
static int32_t literal_node(compiler *c, char **texts, uint32_t *lens, uint32_t n) {
    int32_t id = new_node(c, N_LIT);
    if (id < 0) {
        for (uint32_t i = 0; i < n; i++) free(texts[i]);
        free(texts);
        free(lens);
        return -1;
    }
    sort_texts(texts, lens, NULL, n);
    uint32_t k = 0; /* drop duplicates */
    for (uint32_t i = 0; i < n; i++) {
        if (k && !cmp_bytes(texts[k - 1], lens[k - 1], texts[i], lens[i])) {
            free(texts[i]);
            continue;
        }
        texts[k] = texts[i], lens[k] = lens[i], k++;
    }
    sc_node *nd = &c->s->nodes[id];
    nd->lits = texts, nd->lit_lens = lens, nd->n_lits = k;
    return id;
}

static bool alloc_texts(compiler *c, size_t n, char ***texts, uint32_t **lens) {
    *texts = calloc(n ? n : 1, sizeof **texts);
    *lens = calloc(n ? n : 1, sizeof **lens);
    if (*texts && *lens) return true;
    free(*texts);
    free(*lens);
    c->err = ag_errorf(AG_ERR_NOMEM, "out of memory compiling a JSON schema");
    return false;
}

static int32_t words_node(compiler *c, const char *const *words, uint32_t n) {
    char    **texts;
    uint32_t *lens;
    if (!alloc_texts(c, n, &texts, &lens)) return -1;
    for (uint32_t i = 0; i < n; i++) {
        lens[i] = (uint32_t)strlen(words[i]);
        if (!(texts[i] = strdup(words[i]))) {
            for (uint32_t k = 0; k < i; k++) free(texts[k]);
            free(texts);
            free(lens);
            c->err = ag_errorf(AG_ERR_NOMEM, "out of memory compiling a JSON schema");
            return -1;
        }
    }
    return literal_node(c, texts, lens, n);
}

enum { T_OBJECT = 1, T_ARRAY = 2, T_STRING = 4, T_NUMBER = 8, T_INTEGER = 16, T_BOOLEAN = 32, T_NULL = 64,
       T_ALL = 127 };

static int type_bit(const char *name) {
    static const char *const names[] = {"object", "array", "string", "number", "integer", "boolean", "null"};
    for (int i = 0; i < 7; i++)
        if (!strcmp(name, names[i])) return 1 << i;
    return 0;
}

/* Whether a JSON value is of one of the types in `types`. */
static bool value_has_type(const json_t *v, int types) {
    switch (json_typeof(v)) {
    case JSON_OBJECT: return types & T_OBJECT;
    case JSON_ARRAY: return types & T_ARRAY;
    case JSON_STRING: return types & T_STRING;
    case JSON_INTEGER: return types & (T_INTEGER | T_NUMBER);
    case JSON_REAL: return (types & T_NUMBER) || ((types & T_INTEGER) && json_real_value(v) == floor(json_real_value(v)));
    case JSON_TRUE:
    case JSON_FALSE: return types & T_BOOLEAN;
    case JSON_NULL: return types & T_NULL;
    }
    return false;
}

static int32_t compile(compiler *c, const json_t *sch, int32_t into);

static int32_t any_node(compiler *c);

/* A union of the given nodes (into a reserved slot when into >= 0). */
static int32_t union_node(compiler *c, const int32_t *alts, int n, int32_t into) {
    int32_t id = into >= 0 ? into : new_node(c, N_UNION);
    if (id < 0) return -1;
    int32_t *a = malloc((size_t)n * sizeof *a);
    if (!a) {
        c->err = ag_errorf(AG_ERR_NOMEM, "out of memory compiling a JSON schema");
        return -1;
    }
    memcpy(a, alts, (size_t)n * sizeof *a);
    sc_node *nd = &c->s->nodes[id];
    nd->kind = N_UNION;
    nd->alts = a;
    nd->n_alts = n;
    return id;
}

/* Places a compiled node in a reserved slot: as itself when it is the slot,
 * else through a one-alternative union. */
static int32_t place(compiler *c, int32_t id, int32_t into) {
    if (id < 0 || into < 0 || id == into) return id;
    return union_node(c, &id, 1, into);
}

static int32_t any_node(compiler *c) {
    if (c->any >= 0) return c->any;
    /* reserved first, so the containers can refer to it */
    int32_t any = new_node(c, N_UNION);
    if (any < 0) return -1;
    c->any = any;
    int32_t alts[5];
    if ((alts[0] = new_node(c, N_OBJ)) < 0) return -1;
    c->s->nodes[alts[0]].extra = any;
    if ((alts[1] = new_node(c, N_ARR)) < 0) return -1;
    c->s->nodes[alts[1]].items = any;
    if ((alts[2] = new_node(c, N_STR)) < 0) return -1;
    if ((alts[3] = new_node(c, N_NUM)) < 0) return -1;
    static const char *const words[] = {"true", "false", "null"};
    if ((alts[4] = words_node(c, words, 3)) < 0) return -1;
    return union_node(c, alts, 5, any);
}

/* A non-negative integer keyword (absent: def). */
static bool get_count(compiler *c, const json_t *sch, const char *key, uint32_t def, uint32_t *out) {
    const json_t *v = json_object_get(sch, key);
    *out = def;
    if (!v) return true;
    if (json_is_real(v) && json_real_value(v) == floor(json_real_value(v)) && json_real_value(v) >= 0 &&
        json_real_value(v) < 4e9) {
        *out = (uint32_t)json_real_value(v);
        return true;
    }
    if (!json_is_integer(v) || json_integer_value(v) < 0) {
        fail(c, AG_ERR_INVALID, "'%s' must be a non-negative integer", key);
        return false;
    }
    json_int_t x = json_integer_value(v);
    *out = x >= (json_int_t)NO_MAX ? NO_MAX - 1 : (uint32_t)x;
    return true;
}

static int32_t compile_string(compiler *c, const json_t *sch) {
    uint32_t mn, mx;
    if (!get_count(c, sch, "minLength", 0, &mn) || !get_count(c, sch, "maxLength", NO_MAX, &mx)) return -1;
    if (mn > mx) return fail(c, AG_ERR_INVALID, "%s", "'minLength' is greater than 'maxLength'");
    int32_t id = new_node(c, N_STR);
    if (id < 0) return -1;
    c->s->nodes[id].min_len = mn;
    c->s->nodes[id].max_len = mx;
    return id;
}

/* A numeric bound keyword: absent, a number, or (draft 4's exclusive
 * flags) a boolean. */
static bool get_number(compiler *c, const json_t *sch, const char *key, bool *set, double *v) {
    const json_t *x = json_object_get(sch, key);
    *set = false;
    if (!x) return true;
    if (!json_is_number(x)) {
        fail(c, AG_ERR_INVALID, "'%s' must be a number", key);
        return false;
    }
    *set = true;
    *v = json_number_value(x);
    return true;
}

static int32_t compile_number(compiler *c, const json_t *sch, bool integer) {
    bool   has_min, has_max, has_xmin = false, has_xmax = false;
    double mn = 0, mx = 0, xmn = 0, xmx = 0;
    if (!get_number(c, sch, "minimum", &has_min, &mn) || !get_number(c, sch, "maximum", &has_max, &mx)) return -1;
    /* exclusiveMinimum: a number (2020-12), or true meaning "minimum is exclusive" (draft 4) */
    bool          min_excl = false, max_excl = false;
    const json_t *e = json_object_get(sch, "exclusiveMinimum");
    if (json_is_boolean(e)) min_excl = json_is_true(e) && has_min;
    else if (!get_number(c, sch, "exclusiveMinimum", &has_xmin, &xmn)) return -1;
    e = json_object_get(sch, "exclusiveMaximum");
    if (json_is_boolean(e)) max_excl = json_is_true(e) && has_max;
    else if (!get_number(c, sch, "exclusiveMaximum", &has_xmax, &xmx)) return -1;
    double lo = -INFINITY, hi = INFINITY;
    if (has_min) lo = mn;
    if (has_xmin && (xmn > lo || (xmn == lo && !min_excl))) lo = xmn, min_excl = true;
    if (has_max) hi = mx;
    if (has_xmax && (xmx < hi || (xmx == hi && !max_excl))) hi = xmx, max_excl = true;
    int32_t id = new_node(c, N_NUM);
    if (id < 0) return -1;
    sc_node *n = &c->s->nodes[id];
    n->integer = integer;
    n->bounded = isfinite(lo) || isfinite(hi);
    const double limit = 1e15 - 1; /* NUM_INT_DIGITS nines */
    if (integer) {
        /* integral, inclusive bounds within the digits the matcher writes */
        double ilo = isfinite(lo) ? (min_excl ? floor(lo) + 1 : ceil(lo)) : -limit;
        double ihi = isfinite(hi) ? (max_excl ? ceil(hi) - 1 : floor(hi)) : limit;
        if (ilo < -limit) ilo = -limit;
        if (ihi > limit) ihi = limit;
        lo = ilo, hi = ihi, min_excl = max_excl = false;
    }
    if (lo > hi || (lo == hi && (min_excl || max_excl)) || lo > limit || hi < -limit)
        return fail(c, AG_ERR_INVALID, "%s", "no number satisfies the bounds");
    n->lo = lo, n->hi = hi, n->lo_excl = min_excl, n->hi_excl = max_excl;
    return id;
}

static int32_t compile_array(compiler *c, const json_t *sch) {
    uint32_t mn, mx;
    if (!get_count(c, sch, "minItems", 0, &mn) || !get_count(c, sch, "maxItems", NO_MAX, &mx)) return -1;
    if (mn > mx) return fail(c, AG_ERR_INVALID, "%s", "'minItems' is greater than 'maxItems'");
    const json_t *items = json_object_get(sch, "items");
    if (items && !json_is_object(items) && !json_is_boolean(items))
        return fail(c, AG_ERR_UNSUPPORTED, "%s", "'items' as a list (tuple validation) is unsupported");
    int32_t it;
    if (!items || json_is_true(items)) {
        it = any_node(c);
    } else if (json_is_false(items)) {
        if (mn > 0) return fail(c, AG_ERR_INVALID, "%s", "'items' is false but 'minItems' > 0");
        it = -1, mx = 0;
    } else {
        size_t old = path_push(c, "items");
        it = compile(c, items, -1);
        path_pop(c, old);
    }
    if (it < 0 && mx > 0) return -1;
    int32_t id = new_node(c, N_ARR);
    if (id < 0) return -1;
    sc_node *n = &c->s->nodes[id];
    n->items = it, n->min_items = mn, n->max_items = mx;
    return id;
}

static int32_t compile_object(compiler *c, const json_t *sch) {
    const json_t *props = json_object_get(sch, "properties");
    const json_t *req = json_object_get(sch, "required");
    const json_t *addl = json_object_get(sch, "additionalProperties");
    if (props && !json_is_object(props)) return fail(c, AG_ERR_INVALID, "%s", "'properties' must be an object");
    if (req && !json_is_array(req)) return fail(c, AG_ERR_INVALID, "%s", "'required' must be a list of strings");
    if (addl && !json_is_object(addl) && !json_is_boolean(addl))
        return fail(c, AG_ERR_INVALID, "%s", "'additionalProperties' must be a schema or a boolean");
    size_t        i;
    const json_t *r;
    json_array_foreach(req, i, r) {
        if (!json_is_string(r)) return fail(c, AG_ERR_INVALID, "%s", "'required' must be a list of strings");
        if (!json_object_get(props, json_string_value(r)))
            return fail(c, AG_ERR_UNSUPPORTED, "required property '%s' is not in 'properties'", json_string_value(r));
    }
    int32_t id = new_node(c, N_OBJ);
    if (id < 0) return -1;
    size_t np = json_object_size(props);
    if (np == 0) {
        /* a map: any keys, values of additionalProperties */
        int32_t extra = -1;
        if (!addl || json_is_true(addl)) {
            extra = any_node(c);
        } else if (json_is_object(addl)) {
            size_t old = path_push(c, "additionalProperties");
            extra = compile(c, addl, -1);
            path_pop(c, old);
        } else {
            return id; /* false: {} only */
        }
        if (extra < 0) return -1;
        c->s->nodes[id].extra = extra;
        return id;
    }
    /* Listed properties only; additionalProperties may say more are
     * allowed, but never producing them is valid whatever it says. */
    sc_prop *pp = calloc(np, sizeof *pp);
    if (!pp) {
        c->err = ag_errorf(AG_ERR_NOMEM, "out of memory compiling a JSON schema");
        return -1;
    }
    c->s->nodes[id].props = pp;
    const char   *key;
    const json_t *sub;
    int           k = 0;
    json_object_foreach((json_t *)props, key, sub) {
        json_t *ks = json_string(key);
        char   *text = ks ? json_dumps(ks, JSON_ENCODE_ANY | JSON_COMPACT) : NULL;
        json_decref(ks);
        if (!text) {
            c->err = ag_errorf(AG_ERR_NOMEM, "out of memory compiling a JSON schema");
            return -1;
        }
        sc_prop *p = &c->s->nodes[id].props[k];
        p->text = text;
        p->len = (uint32_t)strlen(text);
        c->s->nodes[id].n_props = ++k;
        json_array_foreach(req, i, r)
            if (!strcmp(json_string_value(r), key)) p->required = true;
        size_t  o1 = path_push(c, "properties");
        size_t  o2 = path_push(c, key);
        int32_t v = compile(c, sub, -1);
        path_pop(c, o2);
        path_pop(c, o1);
        if (v < 0) return -1;
        c->s->nodes[id].props[k - 1].node = v; /* nodes may have moved */
    }
    return id;
}

/* The enum/const values (of the allowed types) as a literal node. */
static int32_t compile_literals(compiler *c, const json_t *sch, int types) {
    const json_t *cst = json_object_get(sch, "const");
    const json_t *en = json_object_get(sch, "enum");
    if (!cst && !json_is_array(en)) return fail(c, AG_ERR_INVALID, "%s", "'enum' must be a list");
    size_t n = cst ? 1 : json_array_size(en);
    if (n > MAX_LITERALS) return fail(c, AG_ERR_UNSUPPORTED, "%s", "'enum' with more than 4096 values");
    char    **texts;
    uint32_t *lens;
    if (!alloc_texts(c, n, &texts, &lens)) return -1;
    uint32_t k = 0;
    for (size_t i = 0; i < n; i++) {
        const json_t *v = cst ? cst : json_array_get(en, i);
        if (!value_has_type(v, types)) continue;
        char *t = json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT);
        if (!t) {
            for (uint32_t j = 0; j < k; j++) free(texts[j]);
            free(texts);
            free(lens);
            c->err = ag_errorf(AG_ERR_NOMEM, "out of memory compiling a JSON schema");
            return -1;
        }
        texts[k] = t;
        lens[k++] = (uint32_t)strlen(t);
    }
    if (k == 0) {
        free(texts);
        free(lens);
        return fail(c, AG_ERR_INVALID, "%s", "no value of 'enum'/'const' has an allowed type");
    }
    return literal_node(c, texts, lens, k);
}

/* Keywords by what the compiler does with them. */
static const char *const k_annotations[] = {"title",      "description", "default",  "examples",
                                            "$comment",   "$schema",     "$id",      "deprecated",
                                            "readOnly",   "writeOnly",   "format",   "$defs",
                                            "definitions", NULL};
static const char *const k_constraints[] = {"type",     "enum",      "const",     "properties",       "required",
                                            "additionalProperties", "items",     "minItems",  "maxItems",
                                            "minLength", "maxLength", "minimum",   "maximum",
                                            "exclusiveMinimum",     "exclusiveMaximum", "anyOf",
                                            "allOf",    "$ref",      "uniqueItems", NULL};

static bool in_list(const char *const *list, const char *k) {
    for (; *list; list++)
        if (!strcmp(*list, k)) return true;
    return false;
}

/* Resolves a local JSON pointer ("#", "#/a/b", with ~0 ~1 escapes). */
static const json_t *resolve_ref(const json_t *doc, const char *ref) {
    if (ref[0] != '#') return NULL;
    const json_t *cur = doc;
    const char   *p = ref + 1;
    while (*p) {
        if (*p != '/') return NULL;
        p++;
        char   seg[256];
        size_t n = 0;
        while (*p && *p != '/') {
            char ch = *p++;
            if (ch == '~') {
                if (*p != '0' && *p != '1') return NULL;
                ch = *p++ == '0' ? '~' : '/';
            }
            if (n + 1 >= sizeof seg) return NULL;
            seg[n++] = ch;
        }
        seg[n] = '\0';
        if (json_is_object(cur)) {
            cur = json_object_get(cur, seg);
        } else if (json_is_array(cur)) {
            char *end;
            long  idx = strtol(seg, &end, 10);
            if (!n || *end || idx < 0) return NULL;
            cur = json_array_get(cur, (size_t)idx);
        } else {
            return NULL;
        }
        if (!cur) return NULL;
    }
    return cur;
}

static int32_t compile_ref(compiler *c, const json_t *sch, int32_t into) {
    const json_t *ref = json_object_get(sch, "$ref");
    if (!json_is_string(ref)) return fail(c, AG_ERR_INVALID, "%s", "'$ref' must be a string");
    const char   *k;
    const json_t *v;
    json_object_foreach((json_t *)sch, k, v)
        if (strcmp(k, "$ref") && !in_list(k_annotations, k))
            return fail(c, AG_ERR_UNSUPPORTED, "unsupported JSON schema keyword '%s' next to '$ref'", k);
    const json_t *target = resolve_ref(c->doc, json_string_value(ref));
    if (!target)
        return fail(c, AG_ERR_UNSUPPORTED, "'$ref' '%s' does not name a schema in this document",
                    json_string_value(ref));
    for (int i = 0; i < c->n_memo; i++)
        if (c->memo[i].target == target) return place(c, c->memo[i].node, into);
    int32_t slot = into >= 0 ? into : new_node(c, N_UNION);
    if (slot < 0) return -1;
    if (c->n_memo == c->cap_memo) {
        int              cap = c->cap_memo ? c->cap_memo * 2 : 8;
        struct ref_memo *m = realloc(c->memo, (size_t)cap * sizeof *m);
        if (!m) {
            c->err = ag_errorf(AG_ERR_NOMEM, "out of memory compiling a JSON schema");
            return -1;
        }
        c->memo = m, c->cap_memo = cap;
    }
    c->memo[c->n_memo++] = (struct ref_memo){target, slot};
    /* the target is compiled at its own place in the document */
    char   saved[sizeof c->path];
    size_t saved_len = c->path_len;
    memcpy(saved, c->path, sizeof saved);
    const char *r = json_string_value(ref) + 1;
    snprintf(c->path, sizeof c->path, "%s", r);
    c->path_len = strlen(c->path);
    int32_t id = compile(c, target, slot);
    memcpy(c->path, saved, sizeof saved);
    c->path_len = saved_len;
    return id;
}

static int32_t compile_any_of(compiler *c, const json_t *sch, int32_t into) {
    const json_t *list = json_object_get(sch, "anyOf");
    if (!json_is_array(list) || json_array_size(list) == 0)
        return fail(c, AG_ERR_INVALID, "%s", "'anyOf' must be a non-empty list");
    if (json_array_size(list) > 64) return fail(c, AG_ERR_UNSUPPORTED, "%s", "'anyOf' with more than 64 schemas");
    int32_t alts[64];
    size_t  i;
    const json_t *sub;
    json_array_foreach(list, i, sub) {
        char idx[24];
        snprintf(idx, sizeof idx, "%zu", i);
        size_t o1 = path_push(c, "anyOf"), o2 = path_push(c, idx);
        alts[i] = compile(c, sub, -1);
        path_pop(c, o2);
        path_pop(c, o1);
        if (alts[i] < 0) return -1;
    }
    return union_node(c, alts, (int)json_array_size(list), into);
}

/* Types a schema without "type" may have, from its keywords: {"properties":
 * ...} is meant as an object. None of them: any type. */
static int implied_types(const json_t *sch) {
    int t = 0;
    if (json_object_get(sch, "properties") || json_object_get(sch, "required") ||
        json_object_get(sch, "additionalProperties"))
        t |= T_OBJECT;
    if (json_object_get(sch, "items") || json_object_get(sch, "minItems") || json_object_get(sch, "maxItems"))
        t |= T_ARRAY;
    if (json_object_get(sch, "minLength") || json_object_get(sch, "maxLength")) t |= T_STRING;
    if (json_object_get(sch, "minimum") || json_object_get(sch, "maximum") ||
        json_object_get(sch, "exclusiveMinimum") || json_object_get(sch, "exclusiveMaximum"))
        t |= T_NUMBER;
    return t ? t : T_ALL;
}

static int32_t compile_typed(compiler *c, const json_t *sch, int32_t into) {
    const json_t *type = json_object_get(sch, "type");
    int           types = 0;
    if (!type) {
        types = implied_types(sch);
    } else if (json_is_string(type)) {
        if (!(types = type_bit(json_string_value(type))))
            return fail(c, AG_ERR_INVALID, "unknown type '%s'", json_string_value(type));
    } else if (json_is_array(type) && json_array_size(type) > 0) {
        size_t        i;
        const json_t *t;
        json_array_foreach(type, i, t) {
            int bit = json_is_string(t) ? type_bit(json_string_value(t)) : 0;
            if (!bit) return fail(c, AG_ERR_INVALID, "%s", "'type' must name JSON types");
            types |= bit;
        }
    } else {
        return fail(c, AG_ERR_INVALID, "%s", "'type' must be a string or a non-empty list");
    }
    if (json_object_get(sch, "enum") || json_object_get(sch, "const")) return place(c, compile_literals(c, sch, types), into);
    if (types == T_ALL && !type) return place(c, any_node(c), into);
    if (types & T_NUMBER) types &= ~T_INTEGER; /* integers are numbers */
    /* one concrete node per type, in a fixed order (the union's order) */
    static const char *const k_bool[] = {"true", "false"}, *const k_null[] = {"null"};
    static const int         k_order[] = {T_OBJECT, T_ARRAY, T_STRING, T_NUMBER | T_INTEGER, T_BOOLEAN, T_NULL};
    int32_t                  alts[6];
    int                      n = 0;
    for (int k = 0; k < 6; k++) {
        if (!(types & k_order[k])) continue;
        switch (k_order[k]) {
        case T_OBJECT: alts[n] = compile_object(c, sch); break;
        case T_ARRAY: alts[n] = compile_array(c, sch); break;
        case T_STRING: alts[n] = compile_string(c, sch); break;
        case T_BOOLEAN: alts[n] = words_node(c, k_bool, 2); break;
        case T_NULL: alts[n] = words_node(c, k_null, 1); break;
        default: alts[n] = compile_number(c, sch, !(types & T_NUMBER)); break;
        }
        if (alts[n++] < 0) return -1;
    }
    if (n == 1) return place(c, alts[0], into);
    return union_node(c, alts, n, into);
}

/* Compiles one schema (into a reserved slot when into >= 0); the node id,
 * or -1 with c->err set. */
static int32_t compile(compiler *c, const json_t *sch, int32_t into) {
    if (json_is_true(sch)) return place(c, any_node(c), into);
    if (json_is_false(sch)) return fail(c, AG_ERR_UNSUPPORTED, "%s", "the schema false (nothing is valid)");
    if (!json_is_object(sch)) return fail(c, AG_ERR_INVALID, "%s", "a schema must be an object or a boolean");
    if (++c->depth > MAX_COMPILE_DEPTH) return fail(c, AG_ERR_UNSUPPORTED, "%s", "schema nested too deeply");
    int32_t       id = -1;
    const char   *k;
    const json_t *v;
    json_object_foreach((json_t *)sch, k, v) {
        if (in_list(k_annotations, k)) continue;
        if (!in_list(k_constraints, k)) {
            id = fail(c, AG_ERR_UNSUPPORTED, "unsupported JSON schema keyword '%s'", k);
            goto out;
        }
        if (!strcmp(k, "uniqueItems") && !json_is_false(v)) {
            id = fail(c, AG_ERR_UNSUPPORTED, "unsupported JSON schema keyword '%s'", k);
            goto out;
        }
    }
    if (json_object_get(sch, "$ref")) {
        id = compile_ref(c, sch, into);
        goto out;
    }
    const json_t *all = json_object_get(sch, "allOf");
    const json_t *anyof = json_object_get(sch, "anyOf");
    if (all || anyof) {
        json_object_foreach((json_t *)sch, k, v)
            if (strcmp(k, all ? "allOf" : "anyOf") && !in_list(k_annotations, k)) {
                id = fail(c, AG_ERR_UNSUPPORTED,
                          all ? "unsupported JSON schema keyword '%s' next to 'allOf'"
                              : "unsupported JSON schema keyword '%s' next to 'anyOf'",
                          k);
                goto out;
            }
        if (anyof) {
            id = compile_any_of(c, sch, into);
        } else if (!json_is_array(all) || json_array_size(all) != 1) {
            id = fail(c, AG_ERR_UNSUPPORTED, "%s", "'allOf' with other than one schema");
        } else {
            size_t o1 = path_push(c, "allOf"), o2 = path_push(c, "0");
            id = compile(c, json_array_get(all, 0), into);
            path_pop(c, o2);
            path_pop(c, o1);
        }
        goto out;
    }
    id = compile_typed(c, sch, into);
out:
    c->depth--;
    return id;
}

/* Fills by_class for node id (and what it depends on): concrete nodes are
 * their own entry for their classes; a union takes, per class, its first
 * alternative that has one, merging literal alternatives that share it. */
static bool resolve(compiler *c, int32_t id) {
    sc_node *n = &c->s->nodes[id];
    if (n->resolved == 2) return true;
    if (n->resolved == 1) {
        c->err = ag_errorf(AG_ERR_UNSUPPORTED,
                           "a JSON schema refers to itself without an object or array in between");
        return false;
    }
    n->resolved = 1;
    switch (n->kind) {
    case N_OBJ: n->by_class[C_OBJ] = id; break;
    case N_ARR: n->by_class[C_ARR] = id; break;
    case N_STR: n->by_class[C_STR] = id; break;
    case N_NUM: n->by_class[C_NUM] = id; break;
    case N_LIT:
        for (uint32_t i = 0; i < n->n_lits; i++) n->by_class[class_of((unsigned char)n->lits[i][0])] = id;
        break;
    case N_UNION:
        for (int a = 0; a < n->n_alts; a++)
            if (!resolve(c, c->s->nodes[id].alts[a])) return false;
        for (int k = 0; k < N_CLASSES; k++) {
            int32_t  first = -1;
            uint32_t lit_count = 0, n_lit_alts = 0;
            bool     all_lit = true;
            n = &c->s->nodes[id];
            for (int a = 0; a < n->n_alts; a++) {
                int32_t t = c->s->nodes[n->alts[a]].by_class[k];
                if (t < 0) continue;
                if (first < 0) first = t;
                if (c->s->nodes[t].kind != N_LIT) all_lit = false;
                lit_count += c->s->nodes[t].n_lits, n_lit_alts++;
            }
            if (first >= 0 && all_lit && n_lit_alts > 1) {
                /* several literal sets start alike: one set of them all */
                char    **texts;
                uint32_t *lens;
                if (!alloc_texts(c, lit_count, &texts, &lens)) return false;
                uint32_t m = 0;
                for (int a = 0; a < n->n_alts; a++) {
                    int32_t t = c->s->nodes[n->alts[a]].by_class[k];
                    if (t < 0) continue;
                    const sc_node *ln = &c->s->nodes[t];
                    for (uint32_t i = 0; i < ln->n_lits && m < lit_count; i++)
                        if (class_of((unsigned char)ln->lits[i][0]) == k) {
                            texts[m] = malloc(ln->lit_lens[i] + 1);
                            if (!texts[m]) continue;
                            memcpy(texts[m], ln->lits[i], ln->lit_lens[i] + 1);
                            lens[m++] = ln->lit_lens[i];
                        }
                }
                first = literal_node(c, texts, lens, m);
                if (first < 0) return false;
                c->s->nodes[first].by_class[k] = first;
                c->s->nodes[first].resolved = 2;
                n = &c->s->nodes[id];
            }
            n->by_class[k] = first;
        }
        break;
    }
    c->s->nodes[id].resolved = 2;
    return true;
}

static ag_schema *schema_new(void) {
    ag_schema *s = calloc(1, sizeof *s);
    if (s) atomic_init(&s->refs, 1);
    return s;
}

ag_schema *ag_schema_ref(ag_schema *s) {
    if (s) atomic_fetch_add(&s->refs, 1);
    return s;
}

void ag_schema_unref(ag_schema *s) {
    if (!s || atomic_fetch_sub(&s->refs, 1) != 1) return;
    for (int32_t i = 0; i < s->n_nodes; i++) free_node(&s->nodes[i]);
    free(s->nodes);
    for (uint32_t i = 0; i < s->n_roots; i++) {
        if (s->pre) free(s->pre[i]);
        if (s->suf) free(s->suf[i]);
    }
    free(s->pre);
    free(s->pre_len);
    free(s->root);
    free(s->node);
    free(s->suf);
    free(s->suf_len);
    free(s);
}

/* Compiles one root schema of s (NULL: {"type": "object"}) into *id. */
static ag_status compile_root(ag_schema *s, const json_t *schema, int32_t *id) {
    compiler c = {.s = s, .doc = schema, .any = -1};
    json_t  *obj = NULL;
    if (!schema && !(schema = c.doc = obj = json_pack("{s:s}", "type", "object")))
        return ag_errorf(AG_ERR_NOMEM, "out of memory compiling a JSON schema");
    *id = compile(&c, schema, -1);
    /* every node, including those compiled for other roots before */
    for (int32_t i = 0; *id >= 0 && i < s->n_nodes; i++)
        if (!resolve(&c, i)) *id = -1;
    free(c.memo);
    json_decref(obj);
    return *id >= 0 ? AG_OK : c.err;
}

ag_status ag_schema_compile(const json_t *schema, ag_schema **out) {
    const ag_schema_alt alt = {.prefix = "", .schema = schema};
    return ag_schema_compile_alts(&alt, 1, out);
}

ag_status ag_schema_compile_calls(const char *const *prefixes, const json_t *const *schemas, int n,
                                  const char *suffix, ag_schema **out) {
    *out = NULL;
    if (n < 1 || n > AG_SCHEMA_MAX_CALLS) return ag_errorf(AG_ERR_INVALID, "schema: %d alternatives", n);
    ag_schema_alt alts[AG_SCHEMA_MAX_CALLS];
    for (int i = 0; i < n; i++) alts[i] = (ag_schema_alt){.prefix = prefixes[i], .schema = schemas[i], .suffix = suffix};
    return ag_schema_compile_alts(alts, n, out);
}

ag_status ag_schema_compile_literal(const char *text, ag_schema **out) {
    *out = NULL;
    if (!text || !*text) return ag_errorf(AG_ERR_INVALID, "schema: an empty literal");
    const ag_schema_alt alt = {.prefix = text, .literal = true};
    return ag_schema_compile_alts(&alt, 1, out);
}

/* Whether a value may start with byte c (whitespace included: a bare value
 * may follow some). */
static bool value_first_byte(unsigned c) { return class_of(c) >= 0 || c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

ag_status ag_schema_compile_alts(const ag_schema_alt *alts, int n, ag_schema **out) {
    *out = NULL;
    if (n < 1 || n > AG_SCHEMA_MAX_ALTS) return ag_errorf(AG_ERR_INVALID, "schema: %d alternatives", n);
    ag_schema *s = schema_new();
    if (!s) return ag_errorf(AG_ERR_NOMEM, "out of memory compiling a JSON schema");
    s->pre = calloc((size_t)n, sizeof *s->pre);
    s->pre_len = calloc((size_t)n, sizeof *s->pre_len);
    s->root = calloc((size_t)n, sizeof *s->root);
    s->node = calloc((size_t)n, sizeof *s->node);
    s->suf = calloc((size_t)n, sizeof *s->suf);
    s->suf_len = calloc((size_t)n, sizeof *s->suf_len);
    if (!s->pre || !s->pre_len || !s->root || !s->node || !s->suf || !s->suf_len) goto oom;
    for (int i = 0; i < n; i++) {
        s->n_roots = (uint32_t)i + 1;
        if (!(s->pre[i] = strdup(alts[i].prefix ? alts[i].prefix : "")) ||
            !(s->suf[i] = strdup(alts[i].suffix ? alts[i].suffix : "")))
            goto oom;
        s->pre_len[i] = (uint32_t)strlen(s->pre[i]);
        s->suf_len[i] = (uint32_t)strlen(s->suf[i]);
        s->root[i] = i;
        if (alts[i].literal) {
            s->node[i] = -1;
            if (!s->pre_len[i] && !s->suf_len[i]) {
                ag_schema_unref(s);
                return ag_errorf(AG_ERR_INVALID, "schema: an empty literal");
            }
            continue;
        }
        ag_status st = compile_root(s, alts[i].schema, &s->node[i]);
        if (st) {
            if (n > 1) {
                char copy[512];
                snprintf(copy, sizeof copy, "%s", ag_error_message());
                ag_errorf(st, "schema %d: %s", i, copy);
            }
            ag_schema_unref(s);
            return st;
        }
    }
    sort_texts(s->pre, s->pre_len, s->root, s->n_roots);
    /* the empty prefix sorts first; every other must be told apart from it
     * and from each other by what has been read */
    for (uint32_t i = 1; i < s->n_roots; i++) {
        if (s->pre_len[i - 1] == 0) {
            if (s->pre_len[i] == 0) goto ambiguous;
            if (s->node[s->root[0]] >= 0 && value_first_byte((unsigned char)s->pre[i][0])) goto ambiguous;
            continue;
        }
        if (s->pre_len[i - 1] <= s->pre_len[i] && !memcmp(s->pre[i - 1], s->pre[i], s->pre_len[i - 1])) goto ambiguous;
    }
    *out = s;
    return AG_OK;
ambiguous:
    ag_schema_unref(s);
    return ag_errorf(AG_ERR_INVALID, "schema: a call prefix is a prefix of another, or may start the bare value");
oom:
    ag_schema_unref(s);
    return ag_errorf(AG_ERR_NOMEM, "out of memory compiling a JSON schema");
}

/* ---- the matcher -------------------------------------------------------- */

/* Where the output is: the wrapper's prefix, the value, the suffix. */
enum { M_PRE, M_BODY, M_SUF, M_DONE };
/* The leaf being read at the top of the stack. */
enum { L_NONE, L_STR, L_NUM, L_LIT, L_KEY };
/* Container phases. Objects: after '{', after a key, after ':', after a
 * value, after ','. Arrays: after '[', after an item, after ','. A value
 * that starts sets its parent's phase to "after a value" at once, so a
 * finished child leaves nothing to do but pop. */
enum { O_OPEN, O_COLON, O_VALUE, O_AFTER, O_KEY, A_OPEN, A_AFTER, A_VALUE };
/* Number phases. */
enum { NP_MINUS, NP_ZERO, NP_INT, NP_DOT, NP_FRAC, NP_E, NP_ESIGN, NP_EXP };

typedef struct {
    int32_t  node;
    uint8_t  phase;
    uint32_t count; /* arrays: items started; objects with properties: the next candidate property */
} sc_frame;

typedef struct {
    uint8_t  mode, leaf, ws, depth;
    uint8_t  root_started;
    uint8_t  str_key;  /* the string leaf is a key of a map */
    uint8_t  utf8_left, utf8_min, utf8_max;
    uint8_t  esc;      /* 0; 1 after '\'; 2..5 reading \u's hex digits */
    uint8_t  esc_d;    /* the \u's first hex digit was d/D (a surrogate may follow) */
    uint8_t  nphase, nlen, nint, nfrac, nexp;
    int32_t  root;     /* the chosen root, once the prefix is matched */
    int32_t  lnode;    /* the leaf's node (for a key: the object) */
    uint32_t pos;      /* literal / key / wrapper position; string: code points so far */
    uint32_t lo, hi;   /* literal / prefix candidates still matching */
    uint64_t alive;    /* key: candidate properties, bit i = the object's count + i */
    char     num[NUM_TEXT_MAX];
    sc_frame stack[AG_SCHEMA_MAX_DEPTH];
} sc_state;

/* Only the frames in use are copied. */
static inline void state_copy(sc_state *dst, const sc_state *src) {
    memcpy(dst, src, offsetof(sc_state, stack) + src->depth * sizeof(sc_frame));
}

struct ag_schema_matcher {
    ag_schema             *s;
    const ag_schema_vocab *v;
    sc_state               st;
    sc_state               saved;   /* ag_schema_matcher_save's position */
    sc_state              *scratch; /* [max token length + 1] states for the trie walk */
    uint64_t              *allowed; /* bitset over the vocabulary */
};

static bool step(const ag_schema *s, sc_state *t, unsigned c);

/* Narrows the sorted literals [*lo, *hi), which agree on their first pos
 * bytes, to those whose byte at pos is c; false when none is. */
static bool lit_narrow(char *const *texts, const uint32_t *lens, uint32_t *lo, uint32_t *hi, uint32_t pos, unsigned c) {
    uint32_t a = *lo;
    while (a < *hi && (lens[a] <= pos || (unsigned char)texts[a][pos] < c)) a++;
    uint32_t b = a;
    while (b < *hi && lens[b] > pos && (unsigned char)texts[b][pos] == c) b++;
    if (a == b) return false;
    *lo = a, *hi = b;
    return true;
}

/* A value ended (a leaf, or a container's closer was popped). */
static void value_end(const ag_schema *s, sc_state *t) {
    t->leaf = L_NONE;
    if (t->depth > 0) return;
    t->mode = s->suf_len[s->root[t->root]] ? M_SUF : M_DONE;
    t->pos = 0;
}

/* The first required property at or after i, or n_props. */
static int next_required(const sc_node *o, uint32_t i) {
    while ((int)i < o->n_props && !o->props[i].required) i++;
    return (int)i;
}

static bool push(sc_state *t, int32_t node, uint8_t phase) {
    if (t->depth >= AG_SCHEMA_MAX_DEPTH) return false;
    t->stack[t->depth++] = (sc_frame){node, phase, 0};
    return true;
}

/* ---- numbers ---- */

static bool num_can_end(const ag_schema *s, const sc_state *t) {
    if (t->nphase != NP_ZERO && t->nphase != NP_INT && t->nphase != NP_FRAC && t->nphase != NP_EXP) return false;
    const sc_node *n = &s->nodes[t->lnode];
    if (!n->bounded) return true;
    char buf[NUM_TEXT_MAX + 1];
    memcpy(buf, t->num, t->nlen);
    buf[t->nlen] = '\0';
    double v = strtod(buf, NULL);
    return (n->lo_excl ? v > n->lo : v >= n->lo) && (n->hi_excl ? v < n->hi : v <= n->hi);
}

/* Whether the values between a and b (ends included as flagged) meet the
 * node's bounds. */
static bool meets(const sc_node *n, double a, bool a_in, double b, bool b_in) {
    double L = a, U = b;
    bool   L_in = a_in, U_in = b_in;
    if (n->lo > L || (n->lo == L && n->lo_excl)) L = n->lo, L_in = !n->lo_excl;
    if (n->hi < U || (n->hi == U && n->hi_excl)) U = n->hi, U_in = !n->hi_excl;
    return L < U || (L == U && L_in && U_in);
}

/* Whether a bounded number's prefix can still become a number in range:
 * the magnitudes its completions can have are unions of intervals (more
 * integer digits multiply the range by 10 each; fraction digits narrow it),
 * checked against the bounds with the sign applied. */
static bool num_feasible(const ag_schema *s, const sc_state *t) {
    const sc_node *n = &s->nodes[t->lnode];
    if (!n->bounded) return true;
    const bool neg = t->nlen > 0 && t->num[0] == '-';
    double     ip = 0, fp = 0, scale = 1;
    for (uint8_t i = neg; i < t->nlen && t->num[i] != '.'; i++) ip = ip * 10 + (t->num[i] - '0');
    const char *dot = memchr(t->num, '.', t->nlen);
    if (dot)
        for (const char *p = dot + 1; p < t->num + t->nlen; p++) fp = fp * 10 + (*p - '0'), scale *= 10;
    /* magnitude intervals [a, b) (integers: [a, b - 1]), or a single point */
#define TRY(a, b, point)                                                                                           \
    do {                                                                                                           \
        double a_ = (a), b_ = (point) ? (a) : n->integer ? (b) - 1 : (b);                                         \
        bool   b_in_ = (point) || n->integer;                                                                      \
        if (neg ? meets(n, -b_, b_in_, -a_, true) : meets(n, a_, true, b_, b_in_)) return true;                   \
    } while (0)
    if (t->nint == 0) { /* just '-' */
        TRY(0, 1e15, false);
        return false;
    }
    if (dot) {
        if (t->nfrac >= NUM_FRAC_DIGITS) TRY(ip + fp / scale, 0, true);
        else TRY(ip + fp / scale, ip + (fp + 1) / scale, false);
        return false;
    }
    if (ip == 0) { /* a leading zero: 0, or 0.x for numbers */
        if (n->integer) TRY(0, 0, true);
        else TRY(0, 1, false);
        return false;
    }
    double p10 = 1;
    for (int k = 0; t->nint + k <= NUM_INT_DIGITS; k++, p10 *= 10) {
        TRY(ip * p10, (ip + 1) * p10, false);
    }
#undef TRY
    return false;
}

static bool num_append(const ag_schema *s, sc_state *t, unsigned c, uint8_t phase) {
    if (t->nlen >= NUM_TEXT_MAX) return false;
    t->num[t->nlen++] = (char)c;
    t->nphase = phase;
    return num_feasible(s, t);
}

/* A byte while reading a number: it continues the number, or ends it and
 * belongs to what follows. */
static bool num_step(const ag_schema *s, sc_state *t, unsigned c) {
    const sc_node *n = &s->nodes[t->lnode];
    const bool     digit = c >= '0' && c <= '9';
    const bool     exp_ok = !n->integer && !n->bounded;
    switch (t->nphase) {
    case NP_MINUS:
        if (!digit) return false;
        t->nint = 1;
        return num_append(s, t, c, c == '0' ? NP_ZERO : NP_INT);
    case NP_INT:
        if (digit) {
            if (t->nint >= NUM_INT_DIGITS) return false;
            t->nint++;
            return num_append(s, t, c, NP_INT);
        }
        __attribute__((fallthrough));
    case NP_ZERO:
        if (c == '.' && !n->integer) return num_append(s, t, c, NP_DOT);
        if ((c == 'e' || c == 'E') && exp_ok) return num_append(s, t, c, NP_E);
        break;
    case NP_DOT:
    case NP_FRAC:
        if (digit) {
            if (t->nfrac >= NUM_FRAC_DIGITS) return false;
            t->nfrac++;
            return num_append(s, t, c, NP_FRAC);
        }
        if (t->nphase == NP_DOT) return false;
        if ((c == 'e' || c == 'E') && exp_ok) return num_append(s, t, c, NP_E);
        break;
    case NP_E:
        if (c == '+' || c == '-') return num_append(s, t, c, NP_ESIGN);
        __attribute__((fallthrough));
    case NP_ESIGN:
        if (!digit) return false;
        t->nexp = 1;
        return num_append(s, t, c, NP_EXP);
    case NP_EXP:
        if (digit) {
            if (t->nexp >= NUM_EXP_DIGITS) return false;
            t->nexp++;
            return num_append(s, t, c, NP_EXP);
        }
        break;
    }
    if (!num_can_end(s, t)) return false;
    value_end(s, t);
    return step(s, t, c);
}

/* ---- strings ---- */

static bool is_hex(unsigned c) { return (c >= '0' && c <= '9') || ((c | 0x20) >= 'a' && (c | 0x20) <= 'f'); }

static bool str_step(const ag_schema *s, sc_state *t, unsigned c) {
    const uint32_t max_len = t->lnode >= 0 ? s->nodes[t->lnode].max_len : NO_MAX;
    if (t->utf8_left) {
        if (c < t->utf8_min || c > t->utf8_max) return false;
        t->utf8_left--;
        t->utf8_min = 0x80, t->utf8_max = 0xBF;
        return true;
    }
    if (t->esc == 1) {
        if (c == 'u') {
            t->esc = 2;
            return true;
        }
        if (!c || !strchr("\"\\/bfnrt", (int)c)) return false;
        t->esc = 0;
        return true;
    }
    if (t->esc >= 2) {
        if (!is_hex(c)) return false;
        /* \uD800-\uDFFF (surrogates) are not produced: one escape, one code point */
        if (t->esc == 2) t->esc_d = (c | 0x20) == 'd';
        else if (t->esc == 3 && t->esc_d && (c >= '8' || (c | 0x20) >= 'a')) return false;
        t->esc = t->esc == 5 ? 0 : t->esc + 1;
        return true;
    }
    if (c == '"') {
        if (t->lnode >= 0 && t->pos < s->nodes[t->lnode].min_len) return false;
        if (t->str_key) {
            t->leaf = L_NONE;
            t->stack[t->depth - 1].phase = O_COLON;
            return true;
        }
        value_end(s, t);
        return true;
    }
    if (c < 0x20 || t->pos >= max_len) return false;
    t->pos++;
    if (c == '\\') {
        t->esc = 1;
        return true;
    }
    if (c < 0x80) return true;
    /* UTF-8 lead bytes, with the first continuation's range (no overlongs,
     * surrogates or code points above U+10FFFF) */
    t->utf8_min = 0x80, t->utf8_max = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) t->utf8_left = 1;
    else if (c == 0xE0) t->utf8_left = 2, t->utf8_min = 0xA0;
    else if (c == 0xED) t->utf8_left = 2, t->utf8_max = 0x9F;
    else if (c >= 0xE1 && c <= 0xEF) t->utf8_left = 2;
    else if (c == 0xF0) t->utf8_left = 3, t->utf8_min = 0x90;
    else if (c == 0xF4) t->utf8_left = 3, t->utf8_max = 0x8F;
    else if (c >= 0xF1 && c <= 0xF3) t->utf8_left = 3;
    else return false;
    return true;
}

/* ---- literals and keys ---- */

static bool lit_step(const ag_schema *s, sc_state *t, unsigned c) {
    const sc_node *n = &s->nodes[t->lnode];
    const bool     complete = n->lit_lens[t->lo] == t->pos; /* sorts first in the range */
    if (!lit_narrow(n->lits, n->lit_lens, &t->lo, &t->hi, t->pos, c)) {
        if (!complete) return false;
        value_end(s, t); /* a number literal ended: c belongs to what follows */
        return step(s, t, c);
    }
    t->pos++;
    if (t->hi - t->lo == 1 && n->lit_lens[t->lo] == t->pos) value_end(s, t);
    return true;
}

static bool key_step(const ag_schema *s, sc_state *t, unsigned c) {
    sc_frame      *f = &t->stack[t->depth - 1];
    const sc_node *o = &s->nodes[f->node];
    uint64_t       alive = 0;
    int            done = -1;
    for (uint64_t m = t->alive; m; m &= m - 1) {
        int            i = __builtin_ctzll(m);
        const sc_prop *p = &o->props[f->count + (uint32_t)i];
        if (t->pos < p->len && (unsigned char)p->text[t->pos] == c) {
            alive |= 1ull << i;
            if (t->pos + 1 == p->len) done = i; /* only the closing quote ends a key: unique */
        }
    }
    if (!alive) return false;
    t->pos++;
    t->alive = alive;
    if (done >= 0) {
        f->count += (uint32_t)done + 1;
        f->phase = O_COLON;
        t->leaf = L_NONE;
    }
    return true;
}

/* A '"' where a key may start. */
static bool key_start(const ag_schema *s, sc_state *t) {
    sc_frame      *f = &t->stack[t->depth - 1];
    const sc_node *o = &s->nodes[f->node];
    if (o->n_props == 0) { /* a map: any string */
        t->leaf = L_STR, t->str_key = 1, t->lnode = -1, t->pos = 0;
        return true;
    }
    /* candidates: the properties from the next one up to the first required one */
    int last = next_required(o, f->count);
    if (last == o->n_props) last = o->n_props - 1;
    if ((int)f->count > last) return false;
    int      n = last - (int)f->count + 1;
    uint64_t alive = n >= 64 ? ~0ull : (1ull << n) - 1;
    t->leaf = L_KEY, t->pos = 1, t->alive = alive;
    return true;
}

/* ---- structure ---- */

/* The first byte of a value of node id. */
static bool value_start(const ag_schema *s, sc_state *t, int32_t id, unsigned c) {
    int k = class_of(c);
    if (k < 0) return false;
    int32_t cn = s->nodes[id].by_class[k];
    if (cn < 0) return false;
    const sc_node *n = &s->nodes[cn];
    switch (n->kind) {
    case N_OBJ: return push(t, cn, O_OPEN);
    case N_ARR: return push(t, cn, A_OPEN);
    case N_STR:
        t->leaf = L_STR, t->str_key = 0, t->lnode = cn, t->pos = 0;
        return true;
    case N_NUM:
        t->leaf = L_NUM, t->lnode = cn, t->nlen = 0, t->nint = t->nfrac = t->nexp = 0;
        if (c == '-') return num_append(s, t, c, NP_MINUS);
        t->nint = 1;
        return num_append(s, t, c, c == '0' ? NP_ZERO : NP_INT);
    case N_LIT:
        t->leaf = L_LIT, t->lnode = cn, t->pos = 0, t->lo = 0, t->hi = n->n_lits;
        return lit_step(s, t, c);
    }
    return false;
}

static bool is_ws(unsigned c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

/* A byte between tokens (no leaf open). */
static bool struct_step(const ag_schema *s, sc_state *t, unsigned c) {
    if (t->depth == 0) {
        if (t->root_started) return false;
        const int32_t alt = s->root[t->root];
        /* whitespace before a value that nothing precedes or follows */
        if (is_ws(c)) return !s->pre_len[t->root] && !s->suf_len[alt] && ++t->ws <= AG_SCHEMA_MAX_WS;
        t->root_started = 1;
        return value_start(s, t, s->node[alt], c);
    }
    if (is_ws(c)) return ++t->ws <= AG_SCHEMA_MAX_WS;
    t->ws = 0;
    sc_frame      *f = &t->stack[t->depth - 1];
    const sc_node *n = &s->nodes[f->node];
    switch (f->phase) {
    case O_OPEN:
        if (c == '}') {
            if (next_required(n, 0) < n->n_props) return false;
            t->depth--;
            value_end(s, t);
            return true;
        }
        return c == '"' && key_start(s, t);
    case O_KEY: return c == '"' && key_start(s, t);
    case O_COLON:
        if (c != ':') return false;
        f->phase = O_VALUE;
        return true;
    case O_VALUE: {
        int32_t vn = n->n_props ? n->props[f->count - 1].node : n->extra;
        f->phase = O_AFTER;
        return vn >= 0 && value_start(s, t, vn, c);
    }
    case O_AFTER:
        if (c == ',') {
            if (n->n_props && (int)f->count >= n->n_props) return false;
            f->phase = O_KEY;
            return true;
        }
        if (c != '}' || (n->n_props && next_required(n, f->count) < n->n_props)) return false;
        t->depth--;
        value_end(s, t);
        return true;
    case A_OPEN:
    case A_AFTER:
        if (c == ']') {
            if (f->count < n->min_items) return false;
            t->depth--;
            value_end(s, t);
            return true;
        }
        if (f->phase == A_AFTER) {
            if (c != ',' || f->count >= n->max_items) return false;
            f->phase = A_VALUE;
            return true;
        }
        __attribute__((fallthrough));
    case A_VALUE:
        if (f->count >= n->max_items || n->items < 0) return false;
        f->count++;
        f->phase = A_AFTER;
        return value_start(s, t, n->items, c);
    }
    return false;
}

static bool step(const ag_schema *s, sc_state *t, unsigned c) {
    switch (t->mode) {
    case M_PRE:
        if (!lit_narrow(s->pre, s->pre_len, &t->lo, &t->hi, t->pos, c)) {
            /* no prefix goes on with c: the bare value, if there is one */
            if (t->pos || s->pre_len[0]) return false;
            t->mode = M_BODY, t->root = 0, t->pos = 0;
            return struct_step(s, t, c);
        }
        if (s->pre_len[t->lo] == ++t->pos) {
            t->root = (int32_t)t->lo, t->pos = 0;
            const int32_t alt = s->root[t->root];
            t->mode = s->node[alt] >= 0 ? M_BODY : s->suf_len[alt] ? M_SUF : M_DONE;
        }
        return true;
    case M_BODY:
        switch (t->leaf) {
        case L_NONE: return struct_step(s, t, c);
        case L_STR: return str_step(s, t, c);
        case L_NUM: return num_step(s, t, c);
        case L_LIT: return lit_step(s, t, c);
        case L_KEY: return key_step(s, t, c);
        }
        return false;
    case M_SUF: {
        const int32_t alt = s->root[t->root];
        if (t->pos >= s->suf_len[alt] || (unsigned char)s->suf[alt][t->pos] != c) return false;
        if (++t->pos == s->suf_len[alt]) t->mode = M_DONE;
        return true;
    }
    }
    return false;
}

static void state_init(const ag_schema *s, sc_state *t) {
    memset(t, 0, offsetof(sc_state, stack));
    t->lo = 0, t->hi = s->n_roots;
    t->mode = M_PRE;
    if (s->n_roots == 1 && s->pre_len[0] == 0) t->mode = M_BODY;
}

static bool state_done(const sc_state *t) { return t->mode == M_DONE; }

static bool state_can_end(const ag_schema *s, const sc_state *t) {
    if (t->mode == M_DONE) return true;
    /* a number (or number literal) at the root may end where it is */
    if (t->mode != M_BODY || t->depth || s->suf_len[s->root[t->root]]) return false;
    if (t->leaf == L_NUM) return num_can_end(s, t);
    return t->leaf == L_LIT && s->nodes[t->lnode].lit_lens[t->lo] == t->pos;
}

bool ag_schema_feed(ag_schema_matcher *m, const char *bytes, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!step(m->s, &m->st, (unsigned char)bytes[i])) return false;
    return true;
}

bool ag_schema_can_end(const ag_schema_matcher *m) { return state_can_end(m->s, &m->st); }

bool ag_schema_done(const ag_schema_matcher *m) { return state_done(&m->st); }

/* ---- the vocabulary's tables and the mask ------------------------------- */

/* A byte trie of token pieces: children are contiguous and sorted by byte;
 * the tokens whose piece ends at a node are contiguous in `toks`. */
typedef struct {
    uint32_t first_child, tok_start;
    uint16_t n_child, n_tok;
    uint8_t  byte;
} trie_node;

typedef struct {
    trie_node *nodes;
    uint32_t   n_nodes;
    int32_t   *toks;
} trie;

enum { TOK_NORMAL, TOK_BANNED, TOK_EOG };

struct ag_schema_vocab {
    int32_t      n_vocab;
    const char **piece;
    uint32_t    *len;
    uint8_t     *kind;
    /* tokens that are plain string text (no '"', '\', control byte; whole
     * UTF-8 characters) and their length in code points */
    int32_t  *plain_ids;
    uint32_t *plain_chars;
    uint32_t  n_plain;
    trie      all, nonplain; /* every usable token; the usable ones that are not plain */
    uint32_t  max_len;
};

/* Code points of a plain string piece, or -1. */
static int64_t plain_chars(const unsigned char *p, uint32_t n) {
    int64_t chars = 0;
    for (uint32_t i = 0; i < n;) {
        unsigned c = p[i];
        uint32_t k;
        if (c == '"' || c == '\\' || c < 0x20) return -1;
        if (c < 0x80) k = 1;
        else if (c >= 0xC2 && c <= 0xDF) k = 2;
        else if (c >= 0xE0 && c <= 0xEF) k = 3;
        else if (c >= 0xF0 && c <= 0xF4) k = 4;
        else return -1;
        if (i + k > n) return -1;
        /* the same checks as str_step, through a scratch state */
        if (k > 1) {
            sc_state t = {.leaf = L_STR, .lnode = -1};
            for (uint32_t j = 0; j < k; j++)
                if (!str_step(NULL, &t, p[i + j])) return -1;
        }
        i += k;
        chars++;
    }
    return chars;
}

static int cmp_piece(const void *a, const void *b, void *ctx) {
    const ag_schema_vocab *v = ctx;
    int32_t                x = *(const int32_t *)a, y = *(const int32_t *)b;
    int                    r = cmp_bytes(v->piece[x], v->len[x], v->piece[y], v->len[y]);
    return r ? r : (x > y) - (x < y);
}

/* Fills node `at` from the sorted ids[a, b), which share their first d bytes. */
static void trie_fill(trie *tr, const ag_schema_vocab *v, uint32_t at, uint32_t a, uint32_t b, uint32_t d) {
    uint32_t i = a;
    while (i < b && v->len[tr->toks[i]] == d) i++;
    tr->nodes[at].tok_start = a;
    tr->nodes[at].n_tok = (uint16_t)(i - a);
    uint32_t groups = 0;
    for (uint32_t j = i; j < b; j++)
        if (j == i || v->piece[tr->toks[j]][d] != v->piece[tr->toks[j - 1]][d]) groups++;
    uint32_t first = tr->n_nodes;
    tr->nodes[at].first_child = first;
    tr->nodes[at].n_child = (uint16_t)groups;
    tr->n_nodes += groups;
    uint32_t g = 0;
    for (uint32_t j = i; j < b;) {
        uint32_t e = j + 1;
        while (e < b && v->piece[tr->toks[e]][d] == v->piece[tr->toks[j]][d]) e++;
        memset(&tr->nodes[first + g], 0, sizeof(trie_node));
        tr->nodes[first + g].byte = (uint8_t)v->piece[tr->toks[j]][d];
        trie_fill(tr, v, first + g, j, e, d + 1);
        g++;
        j = e;
    }
}

/* A trie of the usable tokens, those with plain_only / not plain. */
static bool trie_build(trie *tr, ag_schema_vocab *v, bool nonplain_only, const int64_t *chars) {
    size_t   bytes = 1;
    uint32_t n = 0;
    for (int32_t id = 0; id < v->n_vocab; id++)
        if (v->kind[id] == TOK_NORMAL && (!nonplain_only || chars[id] < 0)) n++, bytes += v->len[id];
    tr->toks = malloc((n ? n : 1) * sizeof *tr->toks);
    tr->nodes = malloc(bytes * sizeof *tr->nodes);
    if (!tr->toks || !tr->nodes) return false;
    n = 0;
    for (int32_t id = 0; id < v->n_vocab; id++)
        if (v->kind[id] == TOK_NORMAL && (!nonplain_only || chars[id] < 0)) tr->toks[n++] = id;
    qsort_r(tr->toks, n, sizeof *tr->toks, cmp_piece, v);
    memset(&tr->nodes[0], 0, sizeof(trie_node));
    tr->n_nodes = 1;
    trie_fill(tr, v, 0, 0, n, 0);
    return true;
}

void ag_schema_vocab_free(ag_schema_vocab *v) {
    if (!v) return;
    free(v->piece);
    free(v->len);
    free(v->kind);
    free(v->plain_ids);
    free(v->plain_chars);
    free(v->all.nodes);
    free(v->all.toks);
    free(v->nonplain.nodes);
    free(v->nonplain.toks);
    free(v);
}

ag_status ag_schema_vocab_new(const ag_tok *tok, ag_schema_vocab **out) {
    *out = NULL;
    ag_schema_vocab *v = calloc(1, sizeof *v);
    if (!v) return ag_errorf(AG_ERR_NOMEM, "out of memory for the schema mask's tables");
    const int32_t n = ag_tok_n_vocab(tok);
    v->n_vocab = n;
    v->piece = calloc((size_t)n, sizeof *v->piece);
    v->len = calloc((size_t)n, sizeof *v->len);
    v->kind = calloc((size_t)n, sizeof *v->kind);
    v->plain_ids = malloc((size_t)n * sizeof *v->plain_ids);
    v->plain_chars = malloc((size_t)n * sizeof *v->plain_chars);
    int64_t *chars = malloc((size_t)n * sizeof *chars);
    if (!v->piece || !v->len || !v->kind || !v->plain_ids || !v->plain_chars || !chars) goto oom;
    for (int32_t id = 0; id < n; id++) {
        size_t      len = 0;
        const char *p = ag_tok_piece(tok, id, &len);
        v->piece[id] = p;
        v->len[id] = p && len < UINT32_MAX ? (uint32_t)len : 0;
        if (ag_tok_is_eog(tok, id)) v->kind[id] = TOK_EOG;
        else if (!p || !len || (ag_tok_attr(tok, id) & (AG_TOK_ATTR_CONTROL | AG_TOK_ATTR_UNKNOWN | AG_TOK_ATTR_UNUSED)))
            v->kind[id] = TOK_BANNED;
        chars[id] = v->kind[id] == TOK_NORMAL ? plain_chars((const unsigned char *)p, v->len[id]) : -1;
        if (chars[id] >= 0) {
            v->plain_ids[v->n_plain] = id;
            v->plain_chars[v->n_plain++] = (uint32_t)chars[id];
        }
        if (v->kind[id] == TOK_NORMAL && v->len[id] > v->max_len) v->max_len = v->len[id];
    }
    if (!trie_build(&v->all, v, false, chars) || !trie_build(&v->nonplain, v, true, chars)) goto oom;
    free(chars);
    *out = v;
    return AG_OK;
oom:
    free(chars);
    ag_schema_vocab_free(v);
    return ag_errorf(AG_ERR_NOMEM, "out of memory for the schema mask's tables");
}

ag_status ag_schema_matcher_new(ag_schema *s, const ag_schema_vocab *v, ag_schema_matcher **out) {
    *out = NULL;
    ag_schema_matcher *m = calloc(1, sizeof *m);
    if (!m) return ag_errorf(AG_ERR_NOMEM, "out of memory for a schema matcher");
    if (v) {
        m->scratch = malloc(((size_t)v->max_len + 2) * sizeof *m->scratch);
        m->allowed = malloc(((size_t)v->n_vocab + 63) / 64 * sizeof *m->allowed);
    }
    if (v && (!m->scratch || !m->allowed)) {
        free(m->scratch);
        free(m->allowed);
        free(m);
        return ag_errorf(AG_ERR_NOMEM, "out of memory for a schema matcher");
    }
    m->s = ag_schema_ref(s);
    m->v = v;
    state_init(s, &m->st);
    *out = m;
    return AG_OK;
}

void ag_schema_matcher_save(ag_schema_matcher *m) { m->saved = m->st; }

void ag_schema_matcher_restore(ag_schema_matcher *m) { m->st = m->saved; }

void ag_schema_matcher_free(ag_schema_matcher *m) {
    if (!m) return;
    ag_schema_unref(m->s);
    free(m->scratch);
    free(m->allowed);
    free(m);
}

/* Marks every token under trie node `at` whose bytes the automaton accepts
 * from scratch[d] on: each child byte is stepped once on a copy, and a
 * rejected byte skips its whole subtree. */
static void walk(ag_schema_matcher *m, const trie *tr, uint32_t at, uint32_t d) {
    const trie_node *nd = &tr->nodes[at];
    for (uint32_t i = 0; i < nd->n_child; i++) {
        const uint32_t   ci = nd->first_child + i;
        const trie_node *ch = &tr->nodes[ci];
        sc_state        *t = &m->scratch[d + 1];
        state_copy(t, &m->scratch[d]);
        if (!step(m->s, t, ch->byte)) continue;
        for (uint32_t k = 0; k < ch->n_tok; k++) {
            int32_t id = tr->toks[ch->tok_start + k];
            m->allowed[id >> 6] |= 1ull << (id & 63);
        }
        if (ch->n_child) walk(m, tr, ci, d + 1);
    }
}

/* m->allowed = the tokens that may come next (end-of-generation tokens
 * where the value may end), over the matcher's vocabulary. */
static void find_allowed(ag_schema_matcher *m) {
    const ag_schema_vocab *v = m->v;
    const sc_state        *st = &m->st;
    memset(m->allowed, 0, ((size_t)v->n_vocab + 63) / 64 * sizeof *m->allowed);
    if (!state_done(st)) {
        state_copy(&m->scratch[0], st);
        if (st->mode == M_BODY && st->leaf == L_STR && !st->utf8_left && !st->esc) {
            /* inside a string: plain text tokens by their length alone */
            uint32_t max_len = st->lnode >= 0 ? m->s->nodes[st->lnode].max_len : NO_MAX;
            uint32_t room = max_len - st->pos;
            for (uint32_t i = 0; i < v->n_plain; i++)
                if (v->plain_chars[i] <= room) {
                    int32_t id = v->plain_ids[i];
                    m->allowed[id >> 6] |= 1ull << (id & 63);
                }
            walk(m, &v->nonplain, 0, 0);
        } else {
            walk(m, &v->all, 0, 0);
        }
    }
    const bool end = state_can_end(m->s, st);
    for (int32_t id = 0; id < v->n_vocab; id++)
        if (v->kind[id] == TOK_EOG) {
            if (end) m->allowed[id >> 6] |= 1ull << (id & 63);
            else m->allowed[id >> 6] &= ~(1ull << (id & 63));
        }
}

void ag_schema_mask(ag_schema_matcher *m, float *logits) {
    find_allowed(m);
    for (int32_t id = 0; id < m->v->n_vocab; id++)
        if (!((m->allowed[id >> 6] >> (id & 63)) & 1)) logits[id] = -INFINITY;
}

void ag_schema_allowed_bits(ag_schema_matcher *m, uint32_t *bits, int32_t n) {
    find_allowed(m);
    const int32_t nv = m->v->n_vocab < n ? m->v->n_vocab : n;
    for (int32_t w = 0; w < (n + 31) / 32; w++) /* (ids past the vocabulary: allowed, as ag_schema_mask leaves them) */
        bits[w] = w * 32 + 32 <= nv ? (uint32_t)(m->allowed[w >> 1] >> (32 * (w & 1))) : 0xFFFFFFFFu;
    for (int32_t id = nv & ~31; id < nv; id++) /* the word the vocabulary ends in */
        if (!((m->allowed[id >> 6] >> (id & 63)) & 1)) bits[id >> 5] &= ~(1u << (id & 31));
}
