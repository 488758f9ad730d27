/* Render-time internals shared by value.c, eval.c and builtins.c. */
#ifndef AG_TMPL_RENDER_H
#define AG_TMPL_RENDER_H

#include <jansson.h>

#include "tmpl/internal.h"
#include "tmpl/tmpl.h"

/* A frame instance: the slots of one tframe_info, chained to the frame
 * instance it is nested in (lexically). */
typedef struct tframe tframe;
struct tframe {
    tframe            *parent;
    const tframe_info *fi;
    tv                *slots;
};

typedef struct R {
    tm_err          err;
    tm_arena        arena;
    const ag_tmpl  *T;
    ag_buf         *out;
    ag_buf        **pool; /* idle scratch buffers */
    int             npool, cappool;
    ag_buf        **all; /* every buffer made, freed at the end */
    int             nall, capall;
    size_t          max_output;
    uint64_t        steps, max_steps;
    int             depth, max_depth;   /* macro/call nesting */
    int             cdepth, max_cdepth; /* C recursion guard */
    int             line;
    int64_t         now;
    tv             *ctxv; /* context variables by name id (missing when absent) */
    int             nctx;
} R;

/* A value that was not passed (optional argument slots). */
#define TV_MISSING_FLAG 0xFF
static inline tv tv_missing(void) { return (tv){.t = TV_UNDEF, .f = TV_MISSING_FLAG}; }
static inline bool is_missing(tv v) { return v.t == TV_UNDEF && v.f == TV_MISSING_FLAG; }

static inline tv tv_none(void) { return (tv){.t = TV_NONE}; }
static inline tv tv_bool(bool b) { return (tv){.t = TV_BOOL, .i = b ? 1 : 0}; }
static inline tv tv_int(int64_t i) { return (tv){.t = TV_INT, .i = i}; }
static inline tv tv_float(double d) { return (tv){.t = TV_FLOAT, .d = d}; }
static inline tv tv_undef_plain(void) { return (tv){.t = TV_UNDEF}; }
static inline bool is_str(tv v) { return v.t == TV_STR; }
static inline bool is_num(tv v) { return v.t == TV_INT || v.t == TV_FLOAT || v.t == TV_BOOL; }
static inline bool is_intlike(tv v) { return v.t == TV_INT || v.t == TV_BOOL; }
static inline double num_d(tv v) { return v.t == TV_FLOAT ? v.d : (double)v.i; }
static inline tv tv_list_kind(tlist *l, int kind) { return (tv){.t = TV_LIST, .f = (uint8_t)(kind << 1), .l = l}; }

/* call arguments */
typedef struct {
    tv        *pos;
    int        npos;
    const int *kwid; /* interned name ids */
    tv        *kwv;
    int        nkw;
} targs;

/* A lazy generator: the filter runs (and may fail) only when consumed, once. */
struct tgen {
    int    fid;
    tv     input;
    targs  args;
    int    line;
    bool   started, done;
    tlist *src; /* the input's items, or ... */
    size_t pos;
    tgen  *srcgen; /* ... the input generator, consumed lazily */
    /* prepared on the first step, as jinja2 prepares inside the generator */
    int    test;  /* select/reject: test id, -1: truthiness, -2: unknown name */
    tv     attr;  /* selectattr/rejectattr, map(attribute=), unique(attribute=) */
    tv     dflt;  /* map(default=) */
    int    mapfid; /* map: filter id, -1: attribute mode, -2: unknown name */
    targs  rest;  /* remaining arguments for the test / filter */
    bool   flag;  /* unique: case_sensitive */
    tdict *seen;
    tlist *out;   /* items / slice: precomputed results */
    size_t opos;
};
tlist *gen_force(R *r, tgen *g);
bool   gen_next(R *r, tgen *g, tv *out);
tv     make_gen(R *r, int fid, tv input, targs *a);
const char *gen_pyname(int fid);

/* ---- errors */
_Noreturn void rfail(R *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
_Noreturn void rfail_code(R *r, ag_status code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
_Noreturn void fail_undefined(R *r, tv u);
void           undef_message(R *r, tv u, char *buf, size_t cap);

/* ---- memory, buffers */
void   *ralloc(R *r, size_t n);
ag_buf *buf_get(R *r);
void    buf_put(R *r, ag_buf *b);
void    buf_add(R *r, ag_buf *b, const char *p, size_t n);
void    buf_adds(R *r, ag_buf *b, const char *s);
void    buf_addc(R *r, ag_buf *b, char c);
tv      buf_finish(R *r, ag_buf *b, bool safe); /* string value, buffer returned to the pool */

/* ---- strings */
tv     mkstr(R *r, const char *p, size_t n);
tv     mkstr_safe(R *r, const char *p, size_t n, bool safe);
tv     mkcstr(R *r, const char *s);
tlist *mklist(R *r, size_t n);
size_t cp_offset(const tstr *s, size_t cp); /* byte offset of code point index cp (clamped) */

/* ---- type info, conversions */
const char *tv_type_name(tv v);           /* Python type name: "str", "int", "NoneType"... */
void        object_type_repr(tv v, char *buf, size_t cap); /* jinja2's object_type_repr */
bool        tv_truthy(R *r, tv v);
void        tv_write_str(R *r, ag_buf *b, tv v);         /* str(v) */
void        tv_write_repr(R *r, ag_buf *b, tv v, int depth);
tv          tv_str(R *r, tv v);                          /* str(v) as a plain str value */
tv          tv_soft_str(R *r, tv v);                     /* jinja2's soft_str: keeps Markup */
void        write_float_repr(ag_buf *tmp, double d, R *r);
void        write_html_escaped(R *r, ag_buf *b, const char *s, size_t n);

/* ---- equality, ordering, hashing */
bool     tv_eq(R *r, tv a, tv b, int depth);
int      tv_cmp(R *r, tv a, tv b, const char *opname); /* <0, 0, >0; TypeError when unorderable */
uint64_t tv_hash(R *r, tv v, int depth);
/* sorts keys (and idx alongside) as Python's sorted(..., reverse=) does */
void     py_sort(R *r, tv *keys, size_t *idx, size_t n, bool reverse);

/* ---- dicts */
tdict *dict_new(R *r, size_t cap);
void   dict_set(R *r, tdict *d, tv k, tv v);
tv    *dict_get(R *r, tdict *d, tv k);
tv    *dict_get_str(R *r, tdict *d, const char *s, size_t n);

/* ---- iteration: the items a `for` loop would see (dict keys, string chars) */
tlist *tv_iterate(R *r, tv v);
/* len(v), failing like Python when v has no length */
int64_t tv_len(R *r, tv v);

/* ---- JSON */
typedef struct {
    bool        ensure_ascii;
    const char *indent; /* NULL: no indent */
    size_t      indent_len;
    const char *item_sep, *key_sep;
    size_t      item_sep_len, key_sep_len;
    bool        sort_keys;
} json_opts;
void tv_write_json(R *r, ag_buf *b, tv v, const json_opts *o, int level);
tv   tv_from_json(R *r, const json_t *j, int depth);

/* ---- eval entry points used by builtins */
tv   tv_getattr(R *r, tv obj, const tstr *name);
tv   tv_getitem(R *r, tv obj, tv key);
tv   tv_call(R *r, tv fn, targs *a);
tv   make_undef(R *r, const char *hint, bool has_obj, tv obj, tv name);
void step(R *r);

/* ---- builtins */
tv   call_filter(R *r, int id, tv v, targs *a);
bool call_test(R *r, int id, tv v, targs *a);
tv   call_global(R *r, int id, targs *a);
tv   call_method(R *r, tfunc *f, targs *a);
/* attribute lookup of a Python method on a builtin value: returns true and a
 * bound method (or an unsafe-undefined) when `name` names one. */
bool method_lookup(R *r, tv obj, const tstr *name, tv *out);
tv   tv_binop(R *r, int op, tv a, tv b);
bool tv_contains(R *r, tv container, tv item);
tv   str_percent_format(R *r, tv fmt, tv args);

const tstr *name_str(R *r, int id);

#endif
