/* The server's state (struct ag_server), which every file of server/ reads;
 * each file's functions are in its own header (reply.h, gen.h, job.h, ...). */
#ifndef AG_SERVER_IMPL_H
#define AG_SERVER_IMPL_H

#include <jansson.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>
#include <time.h>

#include "base/buf.h"
#include "engine/embed.h"
#include "sample/schema.h"
#include "server/server.h"

struct MHD_Daemon;
struct MHD_Connection;
typedef struct srv_gen srv_gen;
typedef struct srv_event srv_event;
typedef struct srv_stored srv_stored;
struct srv_conn;

/* Status codes counted for /metrics. */
enum { SRV_CODE_SLOTS = 14 };
extern const int srv_codes[SRV_CODE_SLOTS];

/* Most tokens of one embedding pass (inputs of concurrent requests share it). */
#define SRV_EMB_PASS_TOKENS 4096

struct ag_server {
    ag_server_params p;
    char             model_id[256];
    char             fingerprint[40];
    time_t           started;
    struct MHD_Daemon *daemon;
    int              port;

    /* The engine pointer is read under the read lock by connection threads
     * and cleared under the write lock by ag_server_stop: after that no
     * thread can reach the engine. */
    pthread_rwlock_t eng_lock;
    ag_engine       *eng;
    int              n_ctx, n_parallel, n_vocab;

    ag_model        *model;
    ag_embedder     *emb; /* an embedding model's engine (embeddings.c); NULL for a generative model */
    const ag_tok    *tok;
    const ag_chat   *chat;
    ag_tool_format   tool_format;
    bool             tmpl_has_tools; /* the template renders `tools` itself */
    bool             thinks;         /* the template's model thinks in <think> tags (reasoning.c) */
    bool             harmony;        /* the template writes gpt-oss's harmony format (harmony.c) */

    /* Stored responses of /v1/responses (responses.c), oldest first. */
    pthread_mutex_t  resp_mu;
    struct srv_stored *resp_oldest, *resp_newest;
    size_t           resp_count, resp_bytes;

    atomic_bool      stopping;
    pthread_mutex_t  gens_mu; /* guards the list of live generations */
    srv_gen         *gens;

    /* Open connections, for the request deadline and the readers' share of
     * the slots (conns.c). */
    pthread_mutex_t  conns_mu;
    pthread_cond_t   conns_cv; /* the watchdog waits for the next deadline */
    struct srv_conn *conns;
    int              n_reading;   /* connections waiting for a request */
    int              max_reading; /* at most this many: the rest of the slots are for answered requests */
    pthread_t        conns_watchdog;
    bool             conns_init, watchdog_started, conns_stop;
    atomic_uint_least64_t conn_timeouts;  /* closed: a request not in by its deadline */
    atomic_uint_least64_t conn_evictions; /* closed: the readers' share was full */

    atomic_uint_least64_t http_count[SRV_CODE_SLOTS + 1]; /* last: other codes */
    atomic_uint_least64_t client_cancels;
    atomic_uint_least64_t completions_ok;
};

#endif
