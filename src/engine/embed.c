/* The embedding engine (see embed.h): a queue of requests, one thread that
 * packs their inputs into ag_model_embed passes. */
#include "engine/embed.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct emb_req {
    const int32_t *const *seqs;
    const size_t         *lens;
    int                   n;
    float                *out;
    int                   next;  /* inputs handed to passes */
    int                   done;  /* inputs whose vectors are written */
    ag_status             st;
    char                  msg[256];
    bool                  finished;
    pthread_cond_t        cv;
    struct emb_req       *link;  /* queue order */
} emb_req;

struct ag_embedder {
    ag_model         *m;
    int               n_batch, max_queue, n_embd;
    pthread_t         thread;
    bool              started;
    pthread_mutex_t   mu;
    pthread_cond_t    work; /* the thread waits for requests */
    emb_req          *head, *tail;
    int               n_queued;
    bool              stopping;
    ag_embedder_stats stats;
    /* the pass being built (engine thread only) */
    int32_t *tok;
    int32_t *start;
    emb_req **owner; /* [input of the pass] its request */
    int      *index; /* [input of the pass] its index in that request */
    int       cap_in;
};

static void finish(emb_req *r, ag_status st, const char *msg) {
    if (st && !r->st) {
        r->st = st;
        snprintf(r->msg, sizeof r->msg, "%s", msg);
    }
    r->finished = true;
    pthread_cond_signal(&r->cv);
}

/* Unlinks finished requests (under mu). */
static void drop_finished(ag_embedder *e) {
    emb_req **pp = &e->head;
    e->tail = NULL;
    while (*pp) {
        if ((*pp)->finished) {
            *pp = (*pp)->link;
            e->n_queued--;
        } else {
            e->tail = *pp;
            pp = &(*pp)->link;
        }
    }
}

static bool grow_pass(ag_embedder *e, int n_in) {
    if (n_in < e->cap_in) return true;
    int cap = e->cap_in ? e->cap_in * 2 : 256;
    while (cap <= n_in) cap *= 2;
    int32_t *start = realloc(e->start, sizeof *start * ((size_t)cap + 1));
    if (start) e->start = start;
    emb_req **owner = realloc(e->owner, sizeof *owner * (size_t)cap);
    if (owner) e->owner = owner;
    int *index = realloc(e->index, sizeof *index * (size_t)cap);
    if (index) e->index = index;
    if (!start || !owner || !index) return false;
    e->cap_in = cap;
    return true;
}

static void *loop(void *arg) {
    ag_embedder *e = arg;
    float       *vec = NULL;
    size_t       vec_cap = 0;
    pthread_mutex_lock(&e->mu);
    for (;;) {
        while (!e->stopping && !e->head) pthread_cond_wait(&e->work, &e->mu);
        if (e->stopping) break;
        /* the pass: one input of each request in turn, until n_batch tokens */
        int  n_in = 0, n_tok = 0;
        bool added = true, oom = false;
        while (added && !oom) {
            added = false;
            for (emb_req *r = e->head; r; r = r->link) {
                if (r->next >= r->n) continue;
                const int len = (int)r->lens[r->next];
                if (n_in > 0 && n_tok + len > e->n_batch) continue;
                if (!grow_pass(e, n_in)) {
                    oom = true;
                    break;
                }
                e->owner[n_in] = r;
                e->index[n_in] = r->next++;
                n_tok += len;
                n_in++;
                added = true;
            }
        }
        if (oom || n_in == 0) { /* (n_in 0 cannot happen: a waiting request has inputs left) */
            for (emb_req *r = e->head; r; r = r->link) finish(r, AG_ERR_NOMEM, "out of memory building an embedding pass");
            drop_finished(e);
            continue;
        }
        pthread_mutex_unlock(&e->mu);
        /* outside the lock: callers block on their own requests, which the
         * pass's inputs keep alive */
        ag_status st = AG_OK;
        int32_t  *tok = realloc(e->tok, sizeof *tok * (size_t)n_tok);
        if (tok) e->tok = tok;
        if ((size_t)n_in * e->n_embd > vec_cap) {
            float *v = realloc(vec, sizeof *v * (size_t)n_in * e->n_embd);
            if (v) vec = v, vec_cap = (size_t)n_in * e->n_embd;
            else st = ag_errorf(AG_ERR_NOMEM, "out of memory for %d embeddings", n_in);
        }
        if (!tok) st = ag_errorf(AG_ERR_NOMEM, "out of memory for a pass of %d tokens", n_tok);
        int shared = 0;
        if (!st) {
            int at = 0;
            e->start[0] = 0;
            for (int i = 0; i < n_in; i++) {
                const emb_req *r = e->owner[i];
                const size_t   len = r->lens[e->index[i]];
                memcpy(e->tok + at, r->seqs[e->index[i]], sizeof *e->tok * len);
                at += (int)len;
                e->start[i + 1] = at;
                shared |= r != e->owner[0];
            }
            st = ag_model_embed(e->m, e->tok, e->start, n_in, vec);
        }
        char msg[256] = "";
        if (st) snprintf(msg, sizeof msg, "%s", ag_error_message());
        for (int i = 0; !st && i < n_in; i++)
            memcpy(e->owner[i]->out + (size_t)e->index[i] * e->n_embd, vec + (size_t)i * e->n_embd,
                   sizeof *vec * e->n_embd);
        pthread_mutex_lock(&e->mu);
        e->stats.passes++;
        e->stats.shared_passes += shared;
        e->stats.inputs += (uint64_t)n_in;
        e->stats.tokens += (uint64_t)n_tok;
        for (int i = 0; i < n_in; i++) {
            emb_req *r = e->owner[i];
            r->done++;
            if (st) finish(r, st, msg);
            else if (r->done == r->n) finish(r, AG_OK, "");
        }
        /* a failed request's other inputs are not run: it is over */
        drop_finished(e);
    }
    for (emb_req *r = e->head; r; r = r->link) finish(r, AG_ERR_STOPPED, "the embedding engine is shutting down");
    e->head = e->tail = NULL;
    e->n_queued = 0;
    pthread_mutex_unlock(&e->mu);
    free(vec);
    return NULL;
}

ag_status ag_embedder_new(ag_model *m, const ag_embedder_params *p, ag_embedder **out) {
    *out = NULL;
    if (!ag_model_is_encoder(m)) return ag_errorf(AG_ERR_UNSUPPORTED, "the embedding engine needs an embedding model");
    const ag_model_config *c = ag_model_config_of(m);
    ag_embedder           *e = calloc(1, sizeof *e);
    if (!e) return ag_errorf(AG_ERR_NOMEM, "out of memory");
    e->m = m;
    e->n_embd = c->n_embd;
    e->n_batch = p && p->n_batch > 0 ? p->n_batch : 4096;
    if (e->n_batch < c->n_ctx_train) e->n_batch = c->n_ctx_train;
    e->max_queue = p && p->max_queue > 0 ? p->max_queue : 256;
    pthread_mutex_init(&e->mu, NULL);
    pthread_cond_init(&e->work, NULL);
    if (pthread_create(&e->thread, NULL, loop, e)) {
        ag_embedder_free(e);
        return ag_errorf(AG_ERR_NOMEM, "cannot start the embedding thread");
    }
    e->started = true;
    *out = e;
    return AG_OK;
}

void ag_embedder_free(ag_embedder *e) {
    if (!e) return;
    if (e->started) {
        pthread_mutex_lock(&e->mu);
        e->stopping = true;
        pthread_cond_signal(&e->work);
        pthread_mutex_unlock(&e->mu);
        pthread_join(e->thread, NULL);
    }
    pthread_mutex_destroy(&e->mu);
    pthread_cond_destroy(&e->work);
    free(e->tok);
    free(e->start);
    free(e->owner);
    free(e->index);
    free(e);
}

ag_status ag_embedder_run(ag_embedder *e, const int32_t *const *seqs, const size_t *lens, int n, float *out) {
    const ag_model_config *c = ag_model_config_of(e->m);
    if (n < 1) return ag_errorf(AG_ERR_INVALID, "embed: no inputs");
    for (int i = 0; i < n; i++) {
        if (lens[i] < 1) return ag_errorf(AG_ERR_INVALID, "input %d is empty", i);
        if (lens[i] > (size_t)c->n_ctx_train)
            return ag_errorf(AG_ERR_INVALID, "input %d has %zu tokens; the model's maximum context length is %d tokens",
                             i, lens[i], c->n_ctx_train);
        for (size_t k = 0; k < lens[i]; k++)
            if (seqs[i][k] < 0 || seqs[i][k] >= c->n_vocab)
                return ag_errorf(AG_ERR_INVALID, "input %d: token %zu is not a token id in [0, %d)", i, k, c->n_vocab);
    }
    emb_req r = {.seqs = seqs, .lens = lens, .n = n, .out = out};
    pthread_cond_init(&r.cv, NULL);
    pthread_mutex_lock(&e->mu);
    ag_status st = AG_OK;
    if (e->stopping) {
        st = ag_errorf(AG_ERR_STOPPED, "the embedding engine is shutting down");
    } else if (e->n_queued >= e->max_queue) {
        st = ag_errorf(AG_ERR_BUSY, "%d embedding requests are waiting; try again later", e->n_queued);
    } else {
        if (e->tail) e->tail->link = &r;
        else e->head = &r;
        e->tail = &r;
        e->n_queued++;
        e->stats.requests++;
        pthread_cond_signal(&e->work);
        while (!r.finished) pthread_cond_wait(&r.cv, &e->mu);
        if (r.st) st = ag_errorf(r.st, "%s", r.msg);
    }
    pthread_mutex_unlock(&e->mu);
    pthread_cond_destroy(&r.cv);
    return st;
}

void ag_embedder_get_stats(ag_embedder *e, ag_embedder_stats *out) {
    pthread_mutex_lock(&e->mu);
    *out = e->stats;
    pthread_mutex_unlock(&e->mu);
}
