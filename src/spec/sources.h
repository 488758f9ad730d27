/* spec/sources.h: turning a user's `--draft` choice into a draft factory.
 *
 * "ngram" is prompt lookup (ngram.h); anything else is the path of a draft
 * model GGUF (draft_model.h), which must share the target's vocabulary; its
 * sequences' sources let prompt lookup draft first (combined.h) unless
 * AUGUR_DRAFT_LOOKUP=0. The
 * setup owns whatever the factory needs for the engine's lifetime (a draft
 * model's weights and KV pool). */
#ifndef AG_SPEC_SOURCES_H
#define AG_SPEC_SOURCES_H

#include "model/model.h"
#include "spec/spec.h"
#include "tok/tok.h"

typedef struct ag_draft_setup ag_draft_setup;

typedef struct {
    const char *draft;      /* "ngram" or a GGUF path */
    int         n_parallel; /* sequences the engine runs at once (draft KV sequences) */
    int         n_ctx;      /* tokens per sequence, as the engine runs them (ag_engine_resolve_ctx) */
    int         n_threads;  /* CPU threads for a draft model (0 = all cores) */
} ag_draft_setup_params;

/* Opens the source named by p->draft for a target model and its tokenizer
 * (both borrowed; they must outlive the setup). Errors name the cause: an
 * unreadable or unsupported draft model, or one whose vocabulary differs
 * from the target's (AG_ERR_FORMAT). */
ag_status ag_draft_setup_open(const ag_draft_setup_params *p, ag_model *target, const ag_tok *target_tok,
                              ag_draft_setup **out);

/* The factory to put in ag_engine_params.draft; borrowed, lives as long as
 * the setup. */
const ag_draft_factory *ag_draft_setup_factory(const ag_draft_setup *s);

/* Frees the setup (after the engine that used its factory). NULL-safe. */
void ag_draft_setup_close(ag_draft_setup *s);

#endif
