/* A fixed pool of worker threads for data-parallel loops (matmul rows,
 * attention heads, activation quantization).
 *
 * ag_threadpool_run() hands out task indices 0..n_tasks-1 to the calling
 * thread and the workers (dynamically, so uneven tasks balance) and returns
 * when all are done. The caller counts as thread 0 and works too, so a pool
 * of n threads starts n-1 workers.
 *
 * Latency: a decode step is ~1 ms and makes a few hundred runs, so dispatch
 * must cost microseconds. Idle workers spin for `spin_us` after each job
 * (a new job is seen within ~100 ns), then sleep on a futex (the next run
 * pays one wake-up syscall). */
#ifndef AG_BASE_THREADPOOL_H
#define AG_BASE_THREADPOOL_H

#include <stdint.h>

#include "base/status.h"

typedef struct ag_threadpool ag_threadpool;

typedef struct {
    int n_threads; /* total threads incl. the caller; <= 0: AUGUR_THREADS, else online CPUs */
    int spin_us;   /* how long idle threads spin before sleeping; < 0: default (100) */
} ag_threadpool_params;

ag_threadpool_params ag_threadpool_default_params(void);

/* Starts the workers. `params` may be NULL (defaults). On failure nothing is
 * left running and *out is NULL. */
ag_status ag_threadpool_create(const ag_threadpool_params *params, ag_threadpool **out);

/* Stops and joins the workers. NULL-safe. Must not be called from a task;
 * waits for a run in progress on another thread to finish first. */
void ag_threadpool_free(ag_threadpool *pool);

/* Threads that take part in a run (1 for a NULL pool). */
int ag_threadpool_size(const ag_threadpool *pool);

/* One task: `task` in [0, n_tasks), `thread` in [0, size) identifies the
 * executing thread (stable for the duration of the call: use it to index
 * per-thread scratch). */
typedef void (*ag_task_fn)(void *ctx, int64_t task, int thread);

/* Runs fn(ctx, i, thread) once for every i in [0, n_tasks) and returns when
 * all have finished; their writes are visible to the caller. Each task runs
 * exactly once, in no particular order or thread. `ctx` is borrowed for the
 * call.
 *
 * A NULL pool, a 1-thread pool, or n_tasks == 1 runs inline on the caller.
 * A run started from inside a task (nested) also runs inline, on that task's
 * thread, with that thread's index. Runs from several threads on one pool
 * are serialized. Cannot fail. */
void ag_threadpool_run(ag_threadpool *pool, int64_t n_tasks, ag_task_fn fn, void *ctx);

#endif
