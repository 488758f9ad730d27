/* JSON mode (OpenAI's response_format {"type": "json_object"}): a byte-level
 * recognizer of one JSON object (RFC 8259), fed the output as it is
 * generated, and the logit mask that keeps a sampler on it.
 *
 * The recognizer accepts exactly the prefixes of `ws* object ws*`; it is a
 * small value (copied freely), so the mask can try every vocabulary token
 * on a copy. Limits that keep a greedy model from looping: at most
 * AG_JSON_MAX_WS consecutive whitespace bytes, nesting at most
 * AG_JSON_MAX_DEPTH. Strings must be valid UTF-8 (checked as bytes arrive,
 * so a character may span tokens). */
#ifndef AG_SAMPLE_JSON_H
#define AG_SAMPLE_JSON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tok/tok.h"

#define AG_JSON_MAX_DEPTH 48
#define AG_JSON_MAX_WS    24

typedef struct {
    uint8_t mode;      /* what the next byte may be (json.c) */
    uint8_t depth;     /* open containers */
    uint8_t ws;        /* consecutive whitespace bytes */
    uint8_t lit;       /* literal: index into the expected word; \u escape: hex digits seen */
    uint8_t utf8_left; /* continuation bytes still due in a string */
    uint8_t utf8_min;  /* lower bound of the next continuation byte (overlong/surrogate checks) */
    uint8_t utf8_max;
    uint8_t word;      /* which literal: 0 true, 1 false, 2 null */
    uint8_t key;       /* the open string is an object key */
    uint8_t stack[AG_JSON_MAX_DEPTH]; /* '{' or '[' */
    /* Optional literal text around the object (ag_json_init_wrapped):
     * one of n_pre prefixes, then the object, then the suffix. Borrowed. */
    const char *const *pre;
    const char        *suf;
    uint32_t           pre_alive; /* bit i: prefix i still matches */
    uint16_t           n_pre, pos, suf_len, suf_pos;
    uint8_t            in_object; /* past the prefix */
} ag_json_state;

#define AG_JSON_MAX_PREFIXES 32

/* A recognizer at the start of the output. */
void ag_json_init(ag_json_state *s);
/* One of the n_pre (1..AG_JSON_MAX_PREFIXES, none a prefix of another)
 * NUL-terminated prefixes, a JSON object, then suf exactly (no whitespace
 * of its own around the object): a forced tool call such as
 * `<tool_call>\n{"name": "f", "arguments": ` + object + `}\n</tool_call>`.
 * The strings must outlive s and its copies. */
void ag_json_init_wrapped(ag_json_state *s, const char *const *pre, int n_pre, const char *suf);
/* Feeds n bytes; false (and s is then unusable) if they cannot continue a
 * JSON object. */
bool ag_json_feed(ag_json_state *s, const char *bytes, size_t n);
/* A whole object has been read (and the suffix, when wrapped; a bare
 * object may be followed by whitespace only). */
bool ag_json_done(const ag_json_state *s);

/* Sets logits[id] = -inf for every token that cannot come next: tokens whose
 * bytes (ag_tok_piece) the recognizer rejects, tokens with no bytes, control
 * tokens; end-of-generation tokens only once the object is done, and then
 * nothing else. logits has ag_tok_n_vocab(tok) entries. */
void ag_json_mask(const ag_json_state *s, const ag_tok *tok, float *logits);

#endif
