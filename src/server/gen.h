/* Generations (gen.c): one HTTP request's engine requests and the queue
 * their events arrive on. */
#ifndef AG_SERVER_GEN_H
#define AG_SERVER_GEN_H

#include <stdbool.h>
#include <stddef.h>

#include "server/server_impl.h"

/* One engine event, copied out of the engine thread. */
typedef struct srv_event {
    struct srv_event *next;
    int               choice; /* absolute choice index within the HTTP request */
    int               prompt_pos; /* > 0: the score of this prompt token (ag_gen_event.prompt_pos) */
    int32_t           token;
    bool              has_sample;
    float             logprob;
    int               n_top;
    ag_token_logprob  top[AG_SAMPLE_MAX_LOGPROBS];
    ag_finish         finish;
    int               stop_index; /* ag_gen_event.stop_index */
    char             *error;
    size_t            len;
    char              text[]; /* len bytes + NUL */
} srv_event;

/* A generation: one HTTP request's engine requests (one per prompt) and the
 * queue their events arrive on. Reference-counted between the connection
 * (one reference) and each submitted engine request (one until its last
 * final event). */
srv_gen *srv_gen_new(ag_server *s, int n_subs);
/* Submits sub-request `sub` (its choices are numbered from choice_base).
 * Sets r->cb and r->user. Errors are the engine's, or AG_ERR_STOPPED
 * "the server is shutting down" once the server stops. */
ag_status srv_gen_submit(srv_gen *g, int sub, ag_gen_request *r, int choice_base);
/* Pops the next event (caller frees it with free()), waiting up to
 * timeout_ms; NULL on timeout or when every choice has finished and the
 * queue is empty (see srv_gen_finished). */
srv_event *srv_gen_next(srv_gen *g, int timeout_ms);
bool       srv_gen_finished(srv_gen *g); /* all finals seen and queue empty */
void       srv_gen_cancel(srv_gen *g);
/* Usage over all sub-requests (from their latest events). */
void srv_gen_usage(srv_gen *g, int *n_prompt, int *n_cached, int *n_generated);
/* Speculative decoding over all prompts and choices: draft tokens verified and accepted. */
void srv_gen_spec_usage(srv_gen *g, int *n_drafted, int *n_accepted);
/* Drops the connection's reference; cancels whatever still runs. */
void srv_gen_release(srv_gen *g);
/* Cancels every live generation (shutdown). */
void srv_gen_cancel_all(ag_server *s);

/* Engine calls under the read lock; false once the engine is detached. */
bool srv_engine_stats(ag_server *s, ag_engine_stats *st);

#endif
