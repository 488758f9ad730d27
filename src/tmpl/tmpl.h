/* Chat templates: a Jinja-subset interpreter whose output is byte-identical
 * to Python's jinja2 as Hugging Face transformers sets it up for
 * apply_chat_template:
 *
 *   ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
 *                                 extensions=[loopcontrols])
 *   filters["tojson"] = json.dumps(x, ensure_ascii=False, indent=None,
 *                                  separators=None, sort_keys=False)
 *   globals: raise_exception(msg), strftime_now(fmt), plus jinja2's
 *            range, namespace, dict, joiner
 *
 * Templates are untrusted input: parsing and rendering never crash, and every
 * resource (output size, memory, loop iterations, nesting) has a limit that
 * fails with a clear error.
 *
 * Supported: all statements chat templates use (if/elif/else, for with loop
 * variables, loop filtering, unpacking and else, set and block set,
 * namespaces, macro/call/caller, break/continue, filter blocks, with, raw,
 * comments, transformers' {% generation %}), the expression language with
 * Python value semantics (int/float/str/list/tuple/dict printing and errors as
 * CPython, Markup, lazy generators), jinja2's static variable scoping, its
 * filters and tests, and the Python str/dict/list methods templates call.
 *
 * Unknown filters and tests fail as in jinja2 3.x: when the template is
 * parsed, except inside an if statement (its tests and branches) or a
 * conditional expression, where they fail only if evaluated ("No filter named
 * 'from_json' found."), so a branch that never runs may use filters the
 * environment lacks.
 *
 * Not supported (fails with "unsupported: ..."): extends/block/include/
 * import/from, recursive loops, star-args in calls, cycler(), \N{...}
 * escapes, non-ASCII identifiers, integers beyond 64 bits; when called (like
 * any filter, they may appear where they never run): the filters random and
 * urlize, pprint of a value whose repr is longer than pprint's 80-column
 * line. Approximations: Unicode case mapping uses utf8proc's tables (plus the
 * common full mappings of ß and İ), as do \w and \d in wordwrap's word
 * splitting; a generator iterated by a for loop is consumed whole before the
 * loop starts.
 *
 * Memory: every value made during a render lives until the render ends, so
 * a template that grows a string or list in a loop uses memory quadratic in
 * the iterations (bounded by ag_tmpl_params.max_memory). */
#ifndef AG_TMPL_H
#define AG_TMPL_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/buf.h"
#include "base/status.h"

typedef struct ag_tmpl ag_tmpl;

/* Compiles a template from `len` bytes of UTF-8 source. On success *out owns
 * everything it needs (the source is not referenced afterwards); free it with
 * ag_tmpl_free(). Failure: AG_ERR_TEMPLATE (syntax error, unknown filter or
 * test outside an if / conditional expression: the message names the line,
 * like "template line 3: ...") or
 * AG_ERR_UNSUPPORTED (a construct this interpreter does not implement, named
 * in the message); *out is left NULL. */
ag_status ag_tmpl_parse(const char *src, size_t len, ag_tmpl **out);
void      ag_tmpl_free(ag_tmpl *t); /* NULL-safe */

typedef struct {
    size_t   max_output;  /* bytes of output (and of any captured block); default 16 MiB */
    size_t   max_memory;  /* bytes of values made during one render; default 256 MiB */
    uint64_t max_steps;   /* loop iterations + macro calls + items filtered; default 10M */
    int      max_depth;   /* nested macro/caller calls; default 200 */
    int64_t  now;         /* strftime_now() time as a Unix time; -1: the clock (default) */
} ag_tmpl_params;

ag_tmpl_params ag_tmpl_default_params(void);

/* Renders with `context` (a JSON object: its keys become template variables,
 * in the object's key order) and appends the output to `out`. The template is
 * only read, so one ag_tmpl may render on several threads at once. `params`
 * may be NULL for the defaults.
 *
 * Errors leave `out` with whatever it had before plus possibly a partial
 * rendering (callers that need all-or-nothing render into a fresh buffer):
 *  - raise_exception(msg) in the template: AG_ERR_TEMPLATE, and
 *    ag_error_message() is exactly msg (as str(TemplateError) in Python);
 *  - any other runtime error (undefined value used, type error, limits):
 *    AG_ERR_TEMPLATE (AG_ERR_RANGE for limits), the message names the line:
 *    "template line 12: 'foo' is undefined". */
ag_status ag_tmpl_render(const ag_tmpl *t, const json_t *context, const ag_tmpl_params *params, ag_buf *out);

/* Same with the context given as JSON text. AG_ERR_FORMAT if it does not
 * parse or is not an object. */
ag_status ag_tmpl_render_json(const ag_tmpl *t, const char *context_json, size_t len, const ag_tmpl_params *params,
                              ag_buf *out);

/* The context transformers' apply_chat_template builds: messages (a JSON
 * array), tools (array, or NULL: the variable is None), add_generation_prompt,
 * bos_token / eos_token (NULL: left undefined), plus every key of `extra`
 * (a JSON object or NULL; its keys override the others). Borrowed inputs;
 * the result is a new reference the caller must json_decref(). NULL on OOM. */
json_t *ag_tmpl_chat_context(const json_t *messages, const json_t *tools, bool add_generation_prompt,
                             const char *bos_token, const char *eos_token, const json_t *extra);

/* Whether `name` appears in the template as an identifier (a variable it reads
 * or sets, a macro, a keyword argument), e.g. "tools" or "enable_thinking",
 * so callers can tell which options a template may honour. */
bool ag_tmpl_uses_variable(const ag_tmpl *t, const char *name);

#endif
