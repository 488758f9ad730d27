/* The prefix cache's start-up scan (build: make bench).
 *
 *   build/bench/cache_scan_bench [N_RECORDS] [DIR]      (default 100000, a temp dir)
 *
 * Writes N records of a tiny KV layout (1000-block chains, no fsync) through
 * the cache's own writer, then times what a restart does: a new cache over
 * the directory, its header-only scan (on the background thread) and the
 * merge into the index, until the first lookup can use every record. Also
 * reports the index's heap. The directory is removed afterwards unless given.
 * What the scan costs per record is the open/pread/fstat/close of one small
 * header, so the figure scales with the file system, not with record size. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/log.h"
#include "cache/cache.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static ag_kv *make_kv(int32_t blocks) {
    ag_kv_params p = ag_kv_default_params();
    p.n_layers = 1;
    p.n_kv_heads = 1;
    p.head_dim_k = p.head_dim_v = 4;
    p.block_size = 16;
    p.max_seqs = 4;
    p.budget_bytes = (size_t)blocks * 256;
    ag_kv *kv = NULL;
    if (ag_kv_init(&p, &kv)) {
        fprintf(stderr, "%s\n", ag_error_message());
        exit(1);
    }
    return kv;
}

static ag_cache *make_cache(ag_kv *kv, const char *dir) {
    ag_cache_params cp = ag_cache_default_params();
    cp.disk_dir = dir;
    cp.disk_sync = false;
    cp.disk_max_bytes = (uint64_t)1 << 40;
    ag_cache *c = NULL;
    if (ag_cache_new(kv, &cp, &c)) {
        fprintf(stderr, "%s\n", ag_error_message());
        exit(1);
    }
    return c;
}

int main(int argc, char **argv) {
    int  n = argc > 1 ? atoi(argv[1]) : 100000;
    char dir[512];
    bool own = argc <= 2;
    if (own) {
        snprintf(dir, sizeof dir, "/tmp/augur-scan-bench-XXXXXX");
        if (!mkdtemp(dir)) return 1;
    } else {
        snprintf(dir, sizeof dir, "%s", argv[2]);
    }
    ag_log_set_level(AG_LOG_WARN);
    enum { CHAIN = 1000, BS = 16 };
    int32_t *tok = malloc(sizeof(int32_t) * CHAIN * BS);
    double   t0 = now_s();
    {
        ag_kv    *kv = make_kv(2 * CHAIN + 8);
        ag_cache *c = make_cache(kv, dir);
        for (int done = 0, chain = 0; done < n; chain++) {
            int blocks = n - done < CHAIN ? n - done : CHAIN;
            for (int i = 0; i < blocks * BS; i++) tok[i] = (chain * 7919 + i * 31) % 30000;
            tok[0] = chain; /* distinct chains */
            int32_t s;
            ag_kv_seq_new(kv, &s);
            ag_kv_seq_reserve(kv, s, blocks * BS);
            ag_kv_seq_commit(kv, s, blocks * BS);
            ag_cache_publish(c, s, tok, blocks * BS, 0);
            ag_kv_seq_free(kv, s);
            ag_cache_flush(c);
            ag_cache_evict(c, 1 << 30);
            done += blocks;
        }
        ag_cache_free(c);
        ag_kv_free(kv);
    }
    double t1 = now_s();
    ag_kv    *kv = make_kv(64);
    ag_cache *c = make_cache(kv, dir);
    ag_cache_flush(c); /* waits for the scan and merges it */
    double         t2 = now_s();
    ag_cache_stats st;
    ag_cache_get_stats(c, &st);
    printf("records written: %d in %.2f s (%.0f/s, no fsync)\n", n, t1 - t0, n / (t1 - t0));
    printf("restart: scan %.3f s + merge = %.3f s until usable; %llu records indexed, %llu dropped\n",
           st.scan_ns / 1e9, t2 - t1, (unsigned long long)st.records_on_disk,
           (unsigned long long)st.dropped_records);
    printf("index: %zu bytes (%.0f per record)\n", st.index_bytes, (double)st.index_bytes / (n ? n : 1));
    ag_cache_free(c);
    ag_kv_free(kv);
    free(tok);
    if (own) {
        uint64_t nf = 0;
        ag_cache_dir_clear(dir, &nf, NULL);
        rmdir(dir);
    }
    return 0;
}
