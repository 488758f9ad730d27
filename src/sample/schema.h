/* Structured output: a JSON schema compiled into a pushdown automaton that
 * recognises, byte by byte, exactly the JSON texts the output may be, and
 * the per-token logit mask that keeps a sampler inside it. Serves OpenAI's
 * response_format {"type": "json_schema"} and {"type": "json_object"} (the
 * schema {"type": "object"}) and forced tool calls (one of several literal
 * prefixes, that function's arguments schema, a literal suffix).
 *
 * THE LANGUAGE (what a compiled schema accepts; every text it accepts
 * validates against the schema):
 *   - objects with "properties": the listed properties only, in schema
 *     order, each once; "required" ones always, the others may be skipped.
 *     Objects without "properties" take any keys: values of
 *     "additionalProperties" when it is a schema, any JSON when it is
 *     absent or true, none ({} only) when it is false.
 *   - arrays: "items" (one schema), "minItems", "maxItems".
 *   - strings: "minLength", "maxLength" (in code points; an escape is one;
 *     \u escapes of surrogates are not produced).
 *   - numbers and integers: "minimum", "maximum", "exclusiveMinimum",
 *     "exclusiveMaximum" (2020-12 numbers or draft-4 booleans), enforced
 *     exactly: a digit is allowed only if the number can still end in
 *     range. At most 15 integer digits and 15 fraction digits; exponents
 *     only for unbounded numbers (3 digits).
 *   - booleans, null, "enum", "const" (the values' compact JSON text, as
 *     jansson writes it; enum values of another type than "type" are
 *     dropped), "type" as a list.
 *   - "anyOf" (and "type" lists): the alternative is chosen by the value's
 *     first byte ('{', '[', '"', digit or '-', 't', 'f', 'n'). When several
 *     alternatives start alike, enum/const ones are merged; otherwise the
 *     first one is used (the output is valid, but only that alternative
 *     can be produced). "allOf" with one schema.
 *   - "$ref" to any local JSON pointer ("#", "#/$defs/x", "#/definitions/x",
 *     ...), recursion included (a cycle must pass through an object or
 *     array).
 *   - Annotations are ignored: title, description, default, examples,
 *     $comment, $schema, $id, deprecated, readOnly, writeOnly, format,
 *     uniqueItems false, and $defs / definitions themselves.
 *   Anything else (pattern, patternProperties, oneOf, not, if, prefixItems,
 *   minProperties, multipleOf, ...) fails to compile with a message naming
 *   the keyword and the JSON pointer of the schema that holds it.
 *
 * Whitespace: up to AG_SCHEMA_MAX_WS bytes in a row between tokens (and
 * before a bare value); none after the value: the output ends where the
 * value does. Nesting: at most AG_SCHEMA_MAX_DEPTH open containers.
 *
 * COST: per decode step, a string position costs one pass over a per-token
 * table (tokens that are plain string text are accepted by their length
 * alone) plus a walk of a trie of the other tokens; every other position
 * walks the trie of the whole vocabulary with the automaton, so a shared
 * prefix is checked once and a rejected one prunes its whole subtree. */
#ifndef AG_SAMPLE_SCHEMA_H
#define AG_SAMPLE_SCHEMA_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/status.h"
#include "tok/tok.h"

#define AG_SCHEMA_MAX_DEPTH 48
#define AG_SCHEMA_MAX_WS    24
#define AG_SCHEMA_MAX_CALLS 64 /* forced tool call alternatives */
#define AG_SCHEMA_MAX_ALTS  (AG_SCHEMA_MAX_CALLS + 1) /* calls + a bare value */

typedef struct ag_schema         ag_schema;         /* compiled; immutable; reference counted */
typedef struct ag_schema_vocab   ag_schema_vocab;   /* per-tokenizer tables for the mask */
typedef struct ag_schema_matcher ag_schema_matcher; /* one output's position in a schema */

/* Compiles a JSON schema (an object or a boolean true). AG_ERR_UNSUPPORTED
 * for a keyword outside the language above ("unsupported JSON schema keyword
 * 'pattern' at /properties/x"), AG_ERR_INVALID for a malformed or
 * unsatisfiable schema, AG_ERR_NOMEM; the message names the place. *out has
 * one reference (ag_schema_unref). schema is borrowed for the call. */
ag_status ag_schema_compile(const json_t *schema, ag_schema **out);

/* A forced tool call: the output is prefixes[i] + a value of schemas[i] +
 * suffix, for one i in [0, n) (1 <= n <= AG_SCHEMA_MAX_CALLS). No prefix
 * may be a prefix of another (each ends with its function's quoted name
 * and more); a NULL schema means {"type": "object"}. No whitespace is
 * allowed around the value. Errors as ag_schema_compile; with n > 1 the
 * message starts with "schema i: " for the schema at fault. */
ag_status ag_schema_compile_calls(const char *const *prefixes, const json_t *const *schemas, int n,
                                  const char *suffix, ag_schema **out);

/* One alternative of an output: a literal prefix, a value of `schema`
 * (NULL: {"type": "object"}; none when `literal`), a literal suffix. */
typedef struct {
    const char   *prefix; /* NULL or "": none */
    const json_t *schema;
    const char   *suffix; /* NULL or "": none */
    bool          literal; /* no value: the output is prefix + suffix */
} ag_schema_alt;

/* The output is one of n alternatives (1 <= n <= AG_SCHEMA_MAX_ALTS). The
 * alternative is decided by the prefixes as they are read, so no prefix
 * may be a prefix of another; at most one may be empty (a bare value, e.g.
 * "either call a tool or answer with a value of this schema"), and then no
 * other may start with a byte a value can start with (whitespace, '{',
 * '[', '"', '-', a digit, 't', 'f', 'n'). Whitespace may precede a value
 * only in an alternative with neither prefix nor suffix. Errors as
 * ag_schema_compile_calls. */
ag_status ag_schema_compile_alts(const ag_schema_alt *alts, int n, ag_schema **out);

/* The output is exactly `text` (non-empty): a scripted output, for tests
 * of what consumes generated text. */
ag_status ag_schema_compile_literal(const char *text, ag_schema **out);

/* Takes one more reference; returns s. Thread-safe (atomic count). */
ag_schema *ag_schema_ref(ag_schema *s);
/* Drops one reference, freeing the schema with the last. NULL-safe. */
void ag_schema_unref(ag_schema *s);

/* Builds the mask's tables for tok (two byte tries of its tokens and each
 * token's length as plain string text): O(vocab log vocab), done once per
 * tokenizer. tok must outlive *out. */
ag_status ag_schema_vocab_new(const ag_tok *tok, ag_schema_vocab **out);
void      ag_schema_vocab_free(ag_schema_vocab *v); /* NULL-safe */

/* A matcher at the start of the output: takes a reference to s; borrows v,
 * which must outlive it (NULL: a matcher that can feed but not mask). */
ag_status ag_schema_matcher_new(ag_schema *s, const ag_schema_vocab *v, ag_schema_matcher **out);
void      ag_schema_matcher_free(ag_schema_matcher *m); /* NULL-safe */

/* Feeds n output bytes; false if they cannot continue an accepted text (the
 * matcher is then unusable). Bytes may split a UTF-8 character or a number
 * anywhere (as tokens do). */
bool ag_schema_feed(ag_schema_matcher *m, const char *bytes, size_t n);
/* Remembers the matcher's position (one at a time), and goes back to it:
 * to mask positions ahead (a speculative window's drafts fed in turn),
 * then return. A failed feed may leave the position anywhere: restore. */
void ag_schema_matcher_save(ag_schema_matcher *m);
void ag_schema_matcher_restore(ag_schema_matcher *m);
/* The output may end here (end-of-generation tokens pass the mask). */
bool ag_schema_can_end(const ag_schema_matcher *m);
/* The output is complete and no byte can follow: the caller stops. */
bool ag_schema_done(const ag_schema_matcher *m);

/* Sets logits[id] = -inf for every token that cannot come next: tokens whose
 * bytes (ag_tok_piece) the matcher would reject, tokens with no bytes,
 * control / unknown / unused tokens; end-of-generation tokens unless
 * ag_schema_can_end. logits has the vocabulary's size; entries already
 * -inf are left alone. Does not change the matcher's position. The
 * matcher must have been made with a vocabulary. */
void ag_schema_mask(ag_schema_matcher *m, float *logits);

/* The same mask as a bitmap of the tokens that may come next, bits[(n +
 * 31) / 32] for a vocabulary of n (token i: bit i % 32 of word i / 32; ids
 * past the matcher's vocabulary set, as ag_schema_mask leaves them). */
void ag_schema_allowed_bits(ag_schema_matcher *m, uint32_t *bits, int32_t n);

#endif
