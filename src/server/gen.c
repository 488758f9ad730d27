/* Generations: the bridge between the engine thread and a connection.
 *
 * The engine callback runs on the engine thread and must never wait for a
 * client: it copies the event into the generation's queue (one malloc) and
 * signals the condition variable. The connection thread pops events at its
 * own pace. A reference count keeps the queue alive until both sides are
 * done, so a client that disconnects mid-stream can walk away while the
 * engine still delivers its cancellation events. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "server/gen.h"
#include "server/server_impl.h"

typedef struct {
    srv_gen *g;
    uint64_t id;
    bool     submitted;
    int      choice_base, n_choices, finals;
    int      n_prompt, n_cached, n_generated;
    int      n_drafted, n_accepted;
} gen_sub;

struct srv_gen {
    ag_server      *s;
    pthread_mutex_t mu;
    pthread_cond_t  cv;
    int             refs;
    srv_event      *head, *tail;
    int             n_subs;
    gen_sub        *subs;
    int             choices_open; /* submitted choices without a final event */
    bool            released;     /* the connection let go */
    srv_gen        *prev, *next;  /* server's live list (gens_mu) */
};

srv_gen *srv_gen_new(ag_server *s, int n_subs) {
    srv_gen *g = calloc(1, sizeof *g);
    if (!g) return NULL;
    g->subs = calloc((size_t)(n_subs > 0 ? n_subs : 1), sizeof *g->subs);
    if (!g->subs) {
        free(g);
        return NULL;
    }
    g->s = s;
    g->n_subs = n_subs;
    g->refs = 1;
    for (int i = 0; i < n_subs; i++) g->subs[i].g = g;
    pthread_mutex_init(&g->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&g->cv, &ca);
    pthread_condattr_destroy(&ca);
    pthread_mutex_lock(&s->gens_mu);
    g->next = s->gens;
    if (s->gens) s->gens->prev = g;
    s->gens = g;
    pthread_mutex_unlock(&s->gens_mu);
    return g;
}

static void gen_destroy(srv_gen *g) {
    ag_server *s = g->s;
    pthread_mutex_lock(&s->gens_mu);
    if (g->prev) g->prev->next = g->next;
    else if (s->gens == g) s->gens = g->next;
    if (g->next) g->next->prev = g->prev;
    pthread_mutex_unlock(&s->gens_mu);
    for (srv_event *e = g->head, *n; e; e = n) {
        n = e->next;
        free(e->error);
        free(e);
    }
    pthread_mutex_destroy(&g->mu);
    pthread_cond_destroy(&g->cv);
    free(g->subs);
    free(g);
}

/* Engine thread. */
static void on_event(void *user, const ag_gen_event *ev) {
    gen_sub *sub = user;
    srv_gen *g = sub->g;
    srv_event *e = NULL;
    size_t len = ev->text ? ev->len : 0;
    e = malloc(sizeof *e + len + 1);
    if (e) {
        memset(e, 0, sizeof *e);
        e->choice = sub->choice_base + ev->choice;
        e->prompt_pos = ev->prompt_pos;
        e->token = ev->token;
        e->finish = ev->finish;
        e->stop_index = ev->stop_index;
        if (ev->sample) {
            e->has_sample = true;
            e->logprob = ev->sample->logprob;
            e->n_top = ev->sample->n_top;
            if (e->n_top < 0) e->n_top = 0;
            if (e->n_top > AG_SAMPLE_MAX_LOGPROBS) e->n_top = AG_SAMPLE_MAX_LOGPROBS;
            memcpy(e->top, ev->sample->top, sizeof e->top[0] * (size_t)e->n_top);
        }
        if (ev->error) e->error = strdup(ev->error);
        e->len = len;
        if (len) memcpy(e->text, ev->text, len);
        e->text[len] = '\0';
    }
    bool destroy = false;
    pthread_mutex_lock(&g->mu);
    sub->n_prompt = ev->n_prompt;
    sub->n_cached = ev->n_cached;
    if (ev->n_generated > sub->n_generated) sub->n_generated = ev->n_generated;
    if (ev->n_drafted > sub->n_drafted) sub->n_drafted = ev->n_drafted;
    if (ev->n_accepted > sub->n_accepted) sub->n_accepted = ev->n_accepted;
    if (e && !g->released) {
        if (g->tail) g->tail->next = e;
        else g->head = e;
        g->tail = e;
        e = NULL;
    }
    if (ev->finish != AG_FINISH_NONE) {
        sub->finals++;
        g->choices_open--;
        if (sub->finals == sub->n_choices) destroy = --g->refs == 0;
    }
    pthread_cond_broadcast(&g->cv);
    pthread_mutex_unlock(&g->mu);
    if (e) {
        /* nobody listens any more (or out of memory above) */
        free(e->error);
        free(e);
    }
    if (destroy) gen_destroy(g);
}

ag_status srv_gen_submit(srv_gen *g, int si, ag_gen_request *r, int choice_base) {
    gen_sub *sub = &g->subs[si];
    sub->choice_base = choice_base;
    sub->n_choices = r->n_choices;
    r->cb = on_event;
    r->user = sub;
    ag_server *s = g->s;
    /* count the engine's reference before it can call back */
    pthread_mutex_lock(&g->mu);
    g->refs++;
    g->choices_open += r->n_choices;
    pthread_mutex_unlock(&g->mu);
    ag_status st;
    pthread_rwlock_rdlock(&s->eng_lock);
    if (!s->eng || atomic_load(&s->stopping)) st = ag_errorf(AG_ERR_STOPPED, "the server is shutting down");
    else st = ag_engine_submit(s->eng, r, &sub->id);
    pthread_rwlock_unlock(&s->eng_lock);
    pthread_mutex_lock(&g->mu);
    if (st) {
        g->refs--;
        g->choices_open -= r->n_choices;
    } else {
        sub->submitted = true;
    }
    pthread_mutex_unlock(&g->mu);
    return st;
}

srv_event *srv_gen_next(srv_gen *g, int timeout_ms) {
    pthread_mutex_lock(&g->mu);
    if (!g->head && g->choices_open > 0 && timeout_ms > 0) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        ts.tv_sec += timeout_ms / 1000;
        ts.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
        if (ts.tv_nsec >= 1000000000L) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000L;
        }
        while (!g->head && g->choices_open > 0)
            if (pthread_cond_timedwait(&g->cv, &g->mu, &ts) == ETIMEDOUT) break;
    }
    srv_event *e = g->head;
    if (e) {
        g->head = e->next;
        if (!g->head) g->tail = NULL;
        e->next = NULL;
    }
    pthread_mutex_unlock(&g->mu);
    return e;
}

bool srv_gen_finished(srv_gen *g) {
    pthread_mutex_lock(&g->mu);
    bool done = g->choices_open <= 0 && !g->head;
    pthread_mutex_unlock(&g->mu);
    return done;
}

/* Appends the engine ids of g's unfinished sub-requests (g->mu held). */
static void collect_ids(srv_gen *g, uint64_t **ids, size_t *n, size_t *cap) {
    for (int i = 0; i < g->n_subs; i++) {
        if (!g->subs[i].submitted || g->subs[i].finals >= g->subs[i].n_choices) continue;
        if (*n == *cap) {
            size_t nc = *cap ? *cap * 2 : 16;
            uint64_t *p = realloc(*ids, nc * sizeof *p);
            if (!p) return;
            *ids = p;
            *cap = nc;
        }
        (*ids)[(*n)++] = g->subs[i].id;
    }
}

static void cancel_ids(ag_server *s, const uint64_t *ids, size_t n) {
    if (!n) return;
    pthread_rwlock_rdlock(&s->eng_lock);
    if (s->eng)
        for (size_t i = 0; i < n; i++) ag_engine_cancel(s->eng, ids[i]);
    pthread_rwlock_unlock(&s->eng_lock);
}

void srv_gen_cancel(srv_gen *g) {
    uint64_t *ids = NULL;
    size_t n = 0, cap = 0;
    pthread_mutex_lock(&g->mu);
    collect_ids(g, &ids, &n, &cap);
    pthread_mutex_unlock(&g->mu);
    cancel_ids(g->s, ids, n);
    free(ids);
}

void srv_gen_usage(srv_gen *g, int *n_prompt, int *n_cached, int *n_generated) {
    int p = 0, c = 0, n = 0;
    pthread_mutex_lock(&g->mu);
    for (int i = 0; i < g->n_subs; i++) {
        p += g->subs[i].n_prompt;
        c += g->subs[i].n_cached;
        n += g->subs[i].n_generated;
    }
    pthread_mutex_unlock(&g->mu);
    *n_prompt = p;
    *n_cached = c;
    *n_generated = n;
}

void srv_gen_spec_usage(srv_gen *g, int *n_drafted, int *n_accepted) {
    int d = 0, a = 0;
    pthread_mutex_lock(&g->mu);
    for (int i = 0; i < g->n_subs; i++) {
        d += g->subs[i].n_drafted;
        a += g->subs[i].n_accepted;
    }
    pthread_mutex_unlock(&g->mu);
    *n_drafted = d;
    *n_accepted = a;
}

void srv_gen_release(srv_gen *g) {
    if (!g) return;
    pthread_mutex_lock(&g->mu);
    bool open = g->choices_open > 0;
    pthread_mutex_unlock(&g->mu);
    if (open) srv_gen_cancel(g);
    pthread_mutex_lock(&g->mu);
    g->released = true;
    for (srv_event *e = g->head, *n; e; e = n) {
        n = e->next;
        free(e->error);
        free(e);
    }
    g->head = g->tail = NULL;
    bool destroy = --g->refs == 0;
    pthread_mutex_unlock(&g->mu);
    if (destroy) gen_destroy(g);
}

void srv_gen_cancel_all(ag_server *s) {
    /* Collect ids under the list lock, cancel outside it. */
    uint64_t *ids = NULL;
    size_t n = 0, cap = 0;
    pthread_mutex_lock(&s->gens_mu);
    for (srv_gen *g = s->gens; g; g = g->next) {
        pthread_mutex_lock(&g->mu);
        collect_ids(g, &ids, &n, &cap);
        pthread_mutex_unlock(&g->mu);
    }
    pthread_mutex_unlock(&s->gens_mu);
    cancel_ids(s, ids, n);
    free(ids);
}

bool srv_engine_stats(ag_server *s, ag_engine_stats *st) {
    bool ok = false;
    pthread_rwlock_rdlock(&s->eng_lock);
    if (s->eng) {
        ag_engine_get_stats(s->eng, st);
        ok = true;
    }
    pthread_rwlock_unlock(&s->eng_lock);
    return ok;
}
