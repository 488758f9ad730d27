/* Writes the record fuzzer's seed corpus (fuzz/seeds/cache_record/): real
 * records from the prefix cache's writer, for a few KV layouts.
 *   cc -std=c11 -D_GNU_SOURCE -Isrc fuzz/gen_cache_seeds.c build/libaugur.a -lxxhash -lm -lpthread \
 *      -o build/gen_cache_seeds
 *   build/gen_cache_seeds fuzz/seeds/cache_record */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cache/cache.h"

static void one(const char *dir, ag_kv_dtype dt, int bs, int nl, int nh, int dk, int dv, uint64_t ns) {
    ag_kv_params kp = ag_kv_default_params();
    kp.n_layers = nl;
    kp.n_kv_heads = nh;
    kp.head_dim_k = dk;
    kp.head_dim_v = dv;
    kp.block_size = bs;
    kp.dtype = dt;
    kp.budget_bytes = (size_t)1 << 20;
    ag_kv *kv = NULL;
    ag_cache *c = NULL;
    ag_cache_params cp = ag_cache_default_params();
    cp.model_fingerprint = 0x1234;
    cp.tok_fingerprint = 0x5678;
    cp.disk_dir = dir;
    cp.disk_sync = false;
    /* two full blocks and a partial third (3 tokens): records of both kinds */
    const int n = 2 * bs + 3;
    int32_t   seq, tokens[3 * 256];
    for (int i = 0; i < n; i++) tokens[i] = (i * 37 + 1) % 1000;
    if (ag_kv_init(&kp, &kv) || ag_cache_new(kv, &cp, &c) || ag_kv_seq_new(kv, &seq) ||
        ag_kv_seq_reserve(kv, seq, n)) {
        fprintf(stderr, "%s\n", ag_error_message());
        exit(1);
    }
    float k[64 * 64], v[64 * 64];
    for (int i = 0; i < nh * dk; i++) k[i] = (float)i * 0.25f;
    for (int i = 0; i < nh * dv; i++) v[i] = (float)-i * 0.5f;
    for (int p = 0; p < n; p++)
        for (int l = 0; l < nl; l++) ag_kv_write(kv, l, seq, p, k, v);
    ag_kv_seq_commit(kv, seq, n);
    ag_cache_publish(c, seq, tokens, n, ns);
    ag_cache_flush(c);
    ag_cache_free(c);
    ag_kv_free(kv);
}

/* Each layout is written in a directory of its own (a cache drops records
 * of other layouts), then moved into the corpus. */
typedef struct {
    const char *from, *to;
} move_ctx;

static bool move_fn(void *user, const ag_cache_dir_entry *e) {
    move_ctx *m = user;
    char      a[4096], b[4096];
    snprintf(a, sizeof a, "%s/%s", m->from, e->name);
    snprintf(b, sizeof b, "%s/%s", m->to, e->name);
    if (rename(a, b) != 0) exit(1);
    return true;
}

int main(int argc, char **argv) {
    if (argc < 2) return 2;
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmpdir", argv[1]);
    one(tmp, AG_KV_F16, 8, 2, 2, 3, 5, 0);
    move_ctx m = {tmp, argv[1]};
    if (ag_cache_dir_list(tmp, move_fn, &m)) return 1;
    one(tmp, AG_KV_F32, 16, 1, 1, 4, 4, 42);
    if (ag_cache_dir_list(tmp, move_fn, &m)) return 1;
    return remove(tmp) != 0;
}
