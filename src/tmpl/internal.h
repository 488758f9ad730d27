/* Internals of the Jinja-subset interpreter (src/tmpl). Not a public header.
 *
 * Pipeline: lex.c turns the source into tokens the way jinja2's regex lexer
 * does (trim_blocks + lstrip_blocks whitespace rules included), parse.c
 * builds an AST with jinja2's grammar, eval.c walks it with Python value
 * semantics (value.c: values, str()/repr(), json.dumps; builtins.c: filters,
 * tests, methods, globals).
 *
 * Memory: the AST lives in the template's arena; every value made while
 * rendering lives in the render arena, released at once when the render
 * ends. Values are immutable once built (ImmutableSandboxedEnvironment
 * forbids mutating lists and dicts), except namespaces, so they are shared
 * freely without copying or reference counts.
 *
 * Errors: both the parser and the renderer leave through longjmp to their
 * entry point (tm_fail), which turns the message into an ag_status. Every
 * allocation is in an arena or in a registered buffer, so nothing leaks. */
#ifndef AG_TMPL_INTERNAL_H
#define AG_TMPL_INTERNAL_H

#include <setjmp.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/buf.h"
#include "base/status.h"

/* ---------------------------------------------------------------- errors */

typedef struct {
    jmp_buf   jb;
    ag_status code;
    int       line;     /* template line of the failing construct, 0 unknown */
    bool      raw;      /* message is a raise_exception() text: no line prefix */
    char      msg[768];
} tm_err;

_Noreturn void tm_fail(tm_err *e, ag_status code, int line, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* ---------------------------------------------------------------- arena */

typedef struct tm_chunk tm_chunk;
typedef struct {
    tm_chunk *head;
    size_t    used, limit; /* limit 0: none */
    tm_err   *err;         /* where to fail on exhaustion */
} tm_arena;

void *tm_alloc(tm_arena *a, size_t size); /* zeroed; fails through a->err */
void  tm_arena_free(tm_arena *a);

/* ---------------------------------------------------------------- values */

typedef enum {
    TV_UNDEF = 0,
    TV_NONE,
    TV_BOOL,
    TV_INT,
    TV_FLOAT,
    TV_STR,
    TV_LIST, /* list, tuple, or a lazy-iterator stand-in (see TVF_*) */
    TV_DICT,
    TV_NS,   /* jinja2.utils.Namespace */
    TV_FUNC, /* macro, builtin global, bound method, loop.cycle ... */
    TV_LOOP, /* the `loop` variable */
    TV_GEN,  /* a lazy generator (select, map, items, unique, batch, slice) */
} tv_type;

/* flags */
#define TVF_SAFE 1 /* TV_STR: markupsafe.Markup */
/* TV_LIST kind (flags >> 1 & 7): what Python object the list stands for, which
 * decides printing, truthiness, len() and subscripting. */
enum {
    LK_LIST = 0,
    LK_TUPLE,
    LK_RANGE,    /* range(): a sequence printed as range(a, b[, s]) */
    LK_REVITER,  /* list_reverseiterator (reverse filter on a list) */
    LK_ITEMS,    /* dict_items view: len ok, not subscriptable */
    LK_KEYS,     /* dict_keys view */
    LK_VALUES,   /* dict_values view */
};
#define TV_LK(v) (((v).f >> 1) & 7)

typedef struct tstr {
    size_t len; /* bytes */
    size_t ncp; /* code points */
    char   s[]; /* NUL-terminated UTF-8 */
} tstr;

typedef struct tv tv;
typedef struct tlist tlist;
typedef struct tdict tdict;
typedef struct tfunc tfunc;
typedef struct tundef tundef;
typedef struct tloop tloop;
typedef struct tns tns;
typedef struct tgen tgen;

struct tv {
    uint8_t t; /* tv_type */
    uint8_t f; /* TVF_* / list kind */
    union {
        int64_t i; /* INT, BOOL (0/1) */
        double  d;
        tstr   *s;
        tlist  *l;
        tdict  *m;
        tns    *ns;
        tfunc  *fn;
        tundef *u; /* NULL: anonymous undefined */
        tloop  *lp;
        tgen   *g;
    };
};

struct tlist {
    size_t  n;
    int64_t r_start, r_stop, r_step; /* LK_RANGE only; see also TL_GROUP_TUPLE */
    tv      v[];
};
/* r_start of an LK_TUPLE pair made by the groupby filter: a _GroupTuple,
 * whose items are also its attributes .grouper and .list */
#define TL_GROUP_TUPLE 0x6772707475706cLL

struct tdict {
    size_t    n, cap;
    tv       *k, *v;
    uint32_t *idx; /* open-addressing index of entry+1, built past a few entries */
    size_t    icap;
};

struct tns {
    tdict *attrs;
};

/* Why a value is undefined; builds jinja2's UndefinedError message. */
struct tundef {
    const char *hint; /* explicit message, or NULL */
    bool        has_obj;
    tv          obj;  /* the object the lookup was made on */
    tv          name; /* the attribute / key that was missing (string or other) */
};

struct tnode;
struct tframe;

/* How a frame slot is initialised when the frame is entered (jinja2's
 * idtracking load instructions). */
enum { ACT_UNDEFINED = 0, ACT_PARAM, ACT_RESOLVE, ACT_ALIAS };

/* The static layout of one jinja2 frame (template root, loop body, macro,
 * ...): one slot per name it defines, and how each starts. */
typedef struct tframe_info {
    int      nslots, cap;
    int     *names;      /* name id of each slot */
    uint8_t *act;        /* ACT_* */
    int     *alias_hops; /* ACT_ALIAS: frames up from this one (>= 1) */
    int     *alias_slot;
} tframe_info;

typedef enum {
    FN_GLOBAL, /* id: GL_* */
    FN_METHOD, /* id: method id, self: receiver */
    FN_MACRO,
    FN_LOOP_CYCLE,
    FN_LOOP_CHANGED,
    FN_JOINER,
    FN_CYCLER_NEXT,
} fn_kind;

struct tfunc {
    fn_kind        kind;
    int            id;
    tv             self;
    const struct tnode *macro; /* FN_MACRO: the macro (or call-block caller) node */
    struct tframe *closure;    /* FN_MACRO: frame it was defined in */
    tv             caller;     /* FN_MACRO caller passed from a call block (or undef) */
    tloop         *loop;       /* loop.cycle / loop.changed */
    tv            *state;      /* joiner/cycler state */
    const char    *mname;      /* FN_METHOD: the Python method name (for repr) */
};

struct tloop {
    tlist *items;
    size_t index0;
    tv     last_changed;
    bool   has_changed;
    int    depth0;
};

/* ---------------------------------------------------------------- AST */

typedef enum {
    /* expressions */
    N_CONST,
    N_NAME,
    N_GETATTR,
    N_GETITEM,
    N_SLICE,
    N_CALL,
    N_FILTER,
    N_TEST,
    N_NOT,
    N_NEG,
    N_POS,
    N_BINOP,
    N_AND,
    N_OR,
    N_COMPARE,
    N_CONCAT,
    N_COND,
    N_LIST,
    N_TUPLE,
    N_DICT,
    N_NSREF, /* assignment target ns.attr */
    /* statements */
    S_DATA,
    S_OUTPUT,
    S_IF,
    S_FOR,
    S_SET,
    S_SETBLOCK,
    S_MACRO,
    S_CALLBLOCK,
    S_FILTERBLOCK,
    S_WITH,
    S_BREAK,
    S_CONTINUE,
    S_BODY,       /* a plain statement list (macro bodies) */
    S_GENERATION, /* transformers' {% generation %}: a call block rendering its body */
} node_kind;

/* binary operators (N_BINOP op) and compare operators (N_COMPARE ops) */
enum { OP_ADD, OP_SUB, OP_MUL, OP_DIV, OP_FLOORDIV, OP_MOD, OP_POW };
enum { CMP_EQ, CMP_NE, CMP_LT, CMP_LE, CMP_GT, CMP_GE, CMP_IN, CMP_NOTIN };

typedef struct tnode tnode;
struct tnode {
    uint8_t kind;
    uint8_t op;
    int     line;
    int     name;  /* N_NAME/S_MACRO: interned name id; N_FILTER/N_TEST: builtin id;
                      N_NSREF: ns name id */
    tnode  *a, *b, *c;
    tnode **items; /* args, list items, statement body ... */
    int     nitems;
    tnode **items2; /* kwargs values, dict values, else body, defaults ... */
    int     nitems2;
    int    *kwnames; /* N_CALL/N_FILTER/N_TEST: kwarg name ids (parallel to items2) */
    uint8_t *ops;    /* N_COMPARE: operator per operand (items) */
    tv      val;     /* N_CONST, S_DATA text, N_GETATTR/N_NSREF attribute name */
    /* variable resolution, filled by the scope pass (scope.c):
     * N_NAME / N_NSREF: the slot `hops` frames up (hops -1: look the name
     * up in the render context when used) */
    int hops, slot;
    /* frames this statement owns: S_FOR body/test/else, S_MACRO, S_CALLBLOCK,
     * S_SETBLOCK, S_FILTERBLOCK, S_WITH, S_GENERATION (fr only) */
    tframe_info *fr, *fr2, *fr3;
    int loop_slot;                              /* S_FOR: slot of `loop`, or -1 */
    int caller_slot, varargs_slot, kwargs_slot; /* S_MACRO / S_CALLBLOCK: -1 when unused */
};

/* ---------------------------------------------------------------- template */

typedef struct {
    tstr    **names; /* interned identifiers; id = index */
    int       n, cap;
    int32_t  *hash;  /* open addressing over ids (-1 empty) */
    int       hcap;
} tm_names;

typedef struct ag_tmpl ag_tmpl;
struct ag_tmpl {
    tm_arena arena;
    tm_err   err; /* used while parsing only */
    tm_names names;
    tnode  **body;
    int      nbody;
    tframe_info *root; /* the top-level frame */
};

/* The scope pass: jinja2's static symbol analysis over the parsed body. */
void tm_scope_analyze(ag_tmpl *T);

/* Names interned first, in this order, so their ids are constants. */
enum {
    NM_LOOP,
    NM_VARARGS,
    NM_KWARGS,
    NM_CALLER,
    NM_RANGE,
    NM_NAMESPACE,
    NM_RAISE_EXCEPTION,
    NM_STRFTIME_NOW,
    NM_DICT,
    NM_JOINER,
    NM_CYCLER,
    NM_COUNT_FIXED
};
/* global function ids (FN_GLOBAL) */
enum { GL_RANGE, GL_NAMESPACE, GL_RAISE_EXCEPTION, GL_STRFTIME_NOW, GL_DICT, GL_JOINER, GL_CYCLER };

int tm_names_find(const tm_names *nm, const char *s, size_t n); /* id or -1 */

/* ---------------------------------------------------------------- lexer */

typedef enum {
    T_EOF,
    T_DATA,
    T_VAR_BEGIN,
    T_VAR_END,
    T_BLOCK_BEGIN,
    T_BLOCK_END,
    T_NAME,
    T_STRING,
    T_INT,
    T_FLOAT,
    T_OP,
} tok_type;

enum {
    TO_ADD,
    TO_SUB,
    TO_DIV,
    TO_FLOORDIV,
    TO_MUL,
    TO_MOD,
    TO_POW,
    TO_TILDE,
    TO_LBRACKET,
    TO_RBRACKET,
    TO_LPAREN,
    TO_RPAREN,
    TO_LBRACE,
    TO_RBRACE,
    TO_EQ,
    TO_NE,
    TO_GT,
    TO_GTEQ,
    TO_LT,
    TO_LTEQ,
    TO_ASSIGN,
    TO_DOT,
    TO_COLON,
    TO_PIPE,
    TO_COMMA,
    TO_SEMICOLON,
};

typedef struct {
    uint8_t     type;
    uint8_t     op;
    int         line;
    const char *s; /* DATA, NAME, STRING (decoded, arena) */
    size_t      n;
    int64_t     i;
    double      d;
} tm_tok;

/* Tokenizes src (already validated UTF-8) into an arena array ending with T_EOF. */
void tm_lex(tm_arena *a, tm_err *e, const char *src, size_t len, tm_tok **out, int *n);

/* ---------------------------------------------------------------- helpers shared by modules */

bool     tm_py_isspace(uint32_t cp);
uint32_t tm_utf8_next(const char *s, size_t n, size_t *i); /* decodes at *i, advances */

/* builtin filter/test lookup by name (parse-time check), -1 if unknown;
 * unsupported_out set when jinja2 knows the name but we do not implement it */
int tm_filter_id(const char *s, size_t n, bool *unsupported);
int tm_test_id(const char *s, size_t n);
const char *tm_filter_name(int id);
const char *tm_test_name(int id);

#endif
