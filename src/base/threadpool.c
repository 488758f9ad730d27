/* Thread pool: a generation counter publishes each job; workers spin on it
 * for a while, then sleep on it with futex.
 *
 * Joining: a job's `state` word holds (gen << 32) | closed-bit | count of
 * workers inside. A worker enters with a CAS that only succeeds while the
 * word still names its gen and is open, and leaves with a decrement. The
 * caller, once every task is claimed, waits for the count to drop to zero
 * and closes the word. So the caller never waits for a worker that is
 * asleep or descheduled and has not started (it just does the tasks
 * itself), and a late worker can never touch a finished job: what matters
 * on a shared 2-core box, and after idle periods when waking costs ~50 us.
 *
 * Sleeps are announced first (sleepers / caller_sleeping, seq_cst), so the
 * other side knows whether a wake-up syscall is needed; with both sides
 * seq_cst one of them always sees the other, and futex_wait re-checks the
 * word in the kernel: no lost wake-ups. */
#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <stdalign.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "base/threadpool.h"
#include "base/switches.h"

struct ag_threadpool {
    int        n_threads; /* incl. the caller */
    int        spin_us;
    pthread_t *threads;   /* n_threads - 1 workers */
    int        n_started;

    pthread_mutex_t run_lock; /* one run at a time; free waits on it too */

    /* the current job: written by the caller before gen is bumped */
    ag_task_fn fn;
    void      *ctx;
    int64_t    n_tasks;

    alignas(64) _Atomic int64_t next; /* next unclaimed task */
    alignas(64) _Atomic uint32_t gen; /* futex word: bumped per job (and on stop) */
    _Atomic int                  sleepers;
    _Atomic int                  stop;
    alignas(64) _Atomic uint64_t state; /* (gen << 32) | AG_CLOSED | workers inside */
    _Atomic uint32_t             left;  /* futex word: bumped when a worker leaves while the caller sleeps */
    _Atomic int                  caller_sleeping;
};

#define AG_CLOSED 0x80000000u

static _Thread_local int tl_in_task;   /* nested runs go inline */
static _Thread_local int tl_thread_ix; /* this thread's index in its pool */

static void futex_wait(void *addr, uint32_t val) {
    syscall(SYS_futex, addr, FUTEX_WAIT_PRIVATE, val, NULL, NULL, 0);
}
static void futex_wake(void *addr, int n) { syscall(SYS_futex, addr, FUTEX_WAKE_PRIVATE, n, NULL, NULL, 0); }

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* Spins up to spin_ns for *word != val; returns 1 if it changed. */
static int spin_until_change(_Atomic uint32_t *word, uint32_t val, int64_t spin_ns) {
    if (spin_ns <= 0) return atomic_load_explicit(word, memory_order_acquire) != val;
    int64_t deadline = 0;
    for (unsigned i = 0;; i++) {
        if (atomic_load_explicit(word, memory_order_acquire) != val) return 1;
        cpu_relax();
        if ((i & 63) == 63) {
            int64_t t = now_ns();
            if (!deadline) deadline = t + spin_ns;
            else if (t >= deadline) return 0;
        }
    }
}

static void run_tasks(ag_threadpool *p, int thread) {
    int64_t n = p->n_tasks;
    for (;;) {
        int64_t i = atomic_fetch_add_explicit(&p->next, 1, memory_order_relaxed);
        if (i >= n) break;
        p->fn(p->ctx, i, thread);
    }
}

typedef struct {
    ag_threadpool *pool;
    int            index;
} worker_arg;

static void *worker_main(void *arg_) {
    worker_arg     *arg = arg_;
    ag_threadpool *p = arg->pool;
    int            index = arg->index;
    free(arg);
    tl_thread_ix = index;
    uint32_t seen = 0; /* gen starts at 0 and workers start before any run */
    const int64_t spin_ns = (int64_t)p->spin_us * 1000;
    for (;;) {
        if (!spin_until_change(&p->gen, seen, spin_ns)) {
            atomic_fetch_add(&p->sleepers, 1);
            while (atomic_load(&p->gen) == seen) futex_wait(&p->gen, seen);
            atomic_fetch_sub(&p->sleepers, 1);
        }
        seen = atomic_load_explicit(&p->gen, memory_order_acquire);
        if (atomic_load(&p->stop)) break;
        /* join job `seen` if it is still open */
        uint64_t st = atomic_load(&p->state);
        int      joined = 0;
        while ((uint32_t)(st >> 32) == seen && !(st & AG_CLOSED))
            if (atomic_compare_exchange_weak(&p->state, &st, st + 1)) {
                joined = 1;
                break;
            }
        if (!joined) continue;
        tl_in_task = 1;
        run_tasks(p, index);
        tl_in_task = 0;
        atomic_fetch_sub(&p->state, 1);
        if (atomic_load(&p->caller_sleeping)) {
            atomic_fetch_add(&p->left, 1);
            futex_wake(&p->left, 1);
        }
    }
    return NULL;
}

static int default_threads(void) {
    const long v = ag_switch_int("AUGUR_THREADS", 1, 1024, 0);
    if (v) {
        return (int)v;
    }
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 && n <= 1024 ? (int)n : 1;
}

ag_threadpool_params ag_threadpool_default_params(void) {
    ag_threadpool_params p = {.n_threads = 0, .spin_us = -1};
    return p;
}

ag_status ag_threadpool_create(const ag_threadpool_params *params, ag_threadpool **out) {
    *out = NULL;
    ag_threadpool_params prm = params ? *params : ag_threadpool_default_params();
    if (prm.n_threads <= 0) prm.n_threads = default_threads();
    if (prm.n_threads > 1024) return ag_errorf(AG_ERR_INVALID, "thread pool: %d threads is too many", prm.n_threads);
    if (prm.spin_us < 0) prm.spin_us = 100;

    ag_threadpool *p = aligned_alloc(64, (sizeof *p + 63) / 64 * 64);
    if (!p) return ag_errorf(AG_ERR_NOMEM, "thread pool: out of memory");
    memset(p, 0, sizeof *p);
    p->n_threads = prm.n_threads;
    p->spin_us = prm.spin_us;
    atomic_init(&p->next, 0);
    atomic_init(&p->gen, 0);
    atomic_init(&p->sleepers, 0);
    atomic_init(&p->stop, 0);
    atomic_init(&p->state, AG_CLOSED);
    atomic_init(&p->left, 0);
    atomic_init(&p->caller_sleeping, 0);
    pthread_mutex_init(&p->run_lock, NULL);
    if (p->n_threads > 1) {
        p->threads = calloc((size_t)p->n_threads - 1, sizeof *p->threads);
        if (!p->threads) {
            ag_threadpool_free(p);
            return ag_errorf(AG_ERR_NOMEM, "thread pool: out of memory");
        }
        for (int i = 1; i < p->n_threads; i++) {
            worker_arg *a = malloc(sizeof *a);
            if (a) a->pool = p, a->index = i;
            int rc = a ? pthread_create(&p->threads[i - 1], NULL, worker_main, a) : ENOMEM;
            if (rc != 0) {
                free(a);
                ag_threadpool_free(p);
                return ag_errorf(AG_ERR_NOMEM, "thread pool: cannot start thread %d: %s", i, strerror(rc));
            }
            p->n_started++;
        }
    }
    *out = p;
    return AG_OK;
}

void ag_threadpool_free(ag_threadpool *p) {
    if (!p) return;
    pthread_mutex_lock(&p->run_lock);
    atomic_store(&p->stop, 1);
    atomic_fetch_add(&p->gen, 1);
    futex_wake(&p->gen, INT_MAX);
    pthread_mutex_unlock(&p->run_lock);
    for (int i = 0; i < p->n_started; i++) pthread_join(p->threads[i], NULL);
    pthread_mutex_destroy(&p->run_lock);
    free(p->threads);
    free(p);
}

int ag_threadpool_size(const ag_threadpool *p) { return p ? p->n_threads : 1; }

void ag_threadpool_run(ag_threadpool *p, int64_t n_tasks, ag_task_fn fn, void *ctx) {
    if (n_tasks <= 0 || !fn) return;
    if (!p || p->n_threads <= 1 || n_tasks == 1 || tl_in_task) {
        int self = tl_in_task ? tl_thread_ix : 0;
        int was = tl_in_task;
        tl_in_task = 1;
        for (int64_t i = 0; i < n_tasks; i++) fn(ctx, i, self);
        tl_in_task = was;
        return;
    }
    pthread_mutex_lock(&p->run_lock);
    p->fn = fn;
    p->ctx = ctx;
    p->n_tasks = n_tasks;
    atomic_store_explicit(&p->next, 0, memory_order_relaxed);
    uint32_t g = atomic_load(&p->gen) + 1;
    atomic_store(&p->state, (uint64_t)g << 32); /* open, nobody inside */
    atomic_store(&p->gen, g);                   /* publishes the job (seq_cst orders the fields above) */
    if (atomic_load(&p->sleepers) > 0) futex_wake(&p->gen, INT_MAX);

    int saved_ix = tl_thread_ix;
    tl_in_task = 1;
    tl_thread_ix = 0;
    run_tasks(p, 0); /* returns once every task is claimed */
    tl_in_task = 0;
    tl_thread_ix = saved_ix;

    /* wait for the workers inside to finish their tasks, then close */
    int64_t deadline = 0;
    for (unsigned i = 0;; i++) {
        uint64_t st = atomic_load(&p->state);
        if ((st & 0x7FFFFFFFu) == 0) {
            if (atomic_compare_exchange_strong(&p->state, &st, st | AG_CLOSED)) break;
            continue; /* a worker joined meanwhile (and will find no task) */
        }
        cpu_relax();
        if ((i & 63) != 63) continue;
        int64_t t = now_ns();
        if (!deadline) deadline = t + (int64_t)p->spin_us * 1000;
        else if (t >= deadline) {
            atomic_store(&p->caller_sleeping, 1);
            uint32_t w = atomic_load(&p->left);
            if (atomic_load(&p->state) & 0x7FFFFFFFu) futex_wait(&p->left, w);
            atomic_store(&p->caller_sleeping, 0);
        }
    }
    pthread_mutex_unlock(&p->run_lock);
}
