/* Unit tests for src/cache: the prefix cache (memory tier and disk tier).
 *
 * The "model" here is a stand-in that makes wrong reuse visible: the KV of
 * position p is a known function of ALL the tokens 0..p (a hash of the
 * prefix), written as F16-exact integers. So a sequence that adopted a block
 * computed after a different prefix, or restored the wrong record, reads
 * back values that differ from what a full "prefill" of its own tokens
 * writes. Every check compares against that function, never against earlier
 * output of the cache. The last test runs the real forward pass of
 * stories260K and compares logits bit for bit. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>
#include <xxhash.h>

#include "base/log.h"
#include "cache/cache.h"
#include "kv/kv.h"
#include "model/model.h"
#include "model_testutil.h"

enum { NL = 2, NH = 2, DK = 3, DV = 5, BS = 8 };

static ag_kv *make_kv_mem(int32_t n_blocks, int32_t dv, const ag_kv_mem *mem) {
    ag_kv_params p = ag_kv_default_params();
    p.mem = mem;
    p.n_layers = NL;
    p.n_kv_heads = NH;
    p.head_dim_k = DK;
    p.head_dim_v = dv;
    p.block_size = BS;
    p.dtype = AG_KV_F16;
    p.max_seqs = 16;
    size_t kr = ((size_t)NH * BS * DK * 2 + 63) / 64 * 64;
    size_t vr = ((size_t)NH * BS * dv * 2 + 63) / 64 * 64;
    p.budget_bytes = (size_t)n_blocks * NL * (kr + vr);
    ag_kv *kv = NULL;
    assert_int_equal(ag_kv_init(&p, &kv), AG_OK);
    ag_kv_stats st;
    ag_kv_get_stats(kv, &st);
    assert_int_equal(st.n_blocks, n_blocks);
    return kv;
}

static ag_kv *make_kv_shape(int32_t n_blocks, int32_t dv) { return make_kv_mem(n_blocks, dv, NULL); }
static ag_kv *make_kv(int32_t n_blocks) { return make_kv_shape(n_blocks, DV); }

/* The stand-in model: position p's stamp hashes tokens[0..p]. */
static uint32_t stamp_of(const int32_t *tokens, int32_t p) {
    uint64_t h = 1469598103934665603ull;
    for (int32_t i = 0; i <= p; i++) h = (h ^ (uint32_t)tokens[i]) * 1099511628211ull;
    return (uint32_t)(h ^ (h >> 32));
}

static float val(uint32_t stamp, int layer, int kvsel, int head, int d) {
    uint64_t x = (uint64_t)stamp * 7919u + (uint64_t)layer * 131u + (uint64_t)kvsel * 37u + (uint64_t)head * 11u +
                 (uint64_t)d * 3u;
    return (float)(int64_t)(x % 2039u) - 1019.0f;
}

static void fill(uint32_t stamp, int layer, float *k, float *v) {
    for (int h = 0; h < NH; h++) {
        for (int d = 0; d < DK; d++) k[h * DK + d] = val(stamp, layer, 0, h, d);
        for (int d = 0; d < DV; d++) v[h * DV + d] = val(stamp, layer, 1, h, d);
    }
}

/* "Prefills" positions [len, n) of seq from tokens. */
static void prefill(ag_kv *kv, int32_t seq, const int32_t *tokens, int32_t n) {
    int32_t len = ag_kv_seq_len(kv, seq);
    assert_true(len >= 0 && len <= n);
    if (len == n) return;
    assert_int_equal(ag_kv_seq_reserve(kv, seq, n - len), AG_OK);
    float k[NH * DK], v[NH * DV];
    for (int32_t p = len; p < n; p++)
        for (int l = 0; l < NL; l++) {
            fill(stamp_of(tokens, p), l, k, v);
            assert_int_equal(ag_kv_write(kv, l, seq, p, k, v), AG_OK);
        }
    assert_int_equal(ag_kv_seq_commit(kv, seq, n), AG_OK);
}

/* seq's positions [0, n) hold exactly what a prefill of tokens writes. */
static void check_seq(const ag_kv *kv, int32_t seq, const int32_t *tokens, int32_t n) {
    float k[NH * DK], v[NH * DV], ek[NH * DK], ev[NH * DV];
    for (int32_t p = 0; p < n; p++)
        for (int l = 0; l < NL; l++) {
            fill(stamp_of(tokens, p), l, ek, ev);
            assert_int_equal(ag_kv_read(kv, l, seq, p, k, v), AG_OK);
            assert_memory_equal(k, ek, sizeof k);
            assert_memory_equal(v, ev, sizeof v);
        }
}

static int32_t new_seq(ag_kv *kv) {
    int32_t s;
    assert_int_equal(ag_kv_seq_new(kv, &s), AG_OK);
    return s;
}

/* Prefills tokens in a fresh sequence (after what the cache has of them),
 * publishes them, frees the sequence. */
static void serve_prompt(ag_cache *c, ag_kv *kv, const int32_t *tokens, int32_t n, uint64_t ns) {
    int32_t s = new_seq(kv);
    int32_t got = ag_cache_lookup(c, s, tokens, n, n - 1, ns);
    assert_true(got >= 0 && got < n);
    check_seq(kv, s, tokens, got);
    prefill(kv, s, tokens, n);
    check_seq(kv, s, tokens, n);
    ag_cache_publish(c, s, tokens, n, ns);
    assert_int_equal(ag_kv_seq_free(kv, s), AG_OK);
}

static void make_tokens(int32_t *t, int32_t n, uint32_t seed) {
    for (int32_t i = 0; i < n; i++) {
        seed = seed * 1664525u + 1013904223u;
        t[i] = (int32_t)(seed >> 8) % 5000;
    }
}

static int32_t kv_used(const ag_kv *kv) {
    ag_kv_stats st;
    ag_kv_get_stats(kv, &st);
    return st.blocks_used;
}

static ag_cache *mem_cache(ag_kv *kv) {
    ag_cache_params p = ag_cache_default_params();
    p.model_fingerprint = 11;
    p.tok_fingerprint = 22;
    ag_cache *c = NULL;
    assert_int_equal(ag_cache_new(kv, &p, &c), AG_OK);
    return c;
}

static ag_cache_stats stats(const ag_cache *c) {
    ag_cache_stats s;
    ag_cache_get_stats(c, &s);
    return s;
}

/* ---- memory tier -------------------------------------------------------- */

static void publish_then_lookup_shares_the_bytes(void **state) {
    ag_kv    *kv = make_kv(32);
    ag_cache *c = mem_cache(kv);
    int32_t   t[40];
    make_tokens(t, 40, 1);
    int32_t a = new_seq(kv);
    assert_int_equal(ag_cache_lookup(c, a, t, 40, 39, 0), 0); /* cold */
    prefill(kv, a, t, 40);
    assert_int_equal(ag_cache_publish(c, a, t, 40, 0), 40);
    assert_int_equal(ag_cache_publish(c, a, t, 40, 0), 40); /* twice: harmless */
    assert_int_equal(stats(c).blocks_published, 5);
    assert_int_equal(stats(c).memory_blocks, 5);
    assert_int_equal(ag_cache_reclaimable(c), 0); /* a still holds them */

    /* another sequence adopts 4 whole blocks and 7 positions of the fifth:
     * max_len 39 leaves one to compute */
    int32_t b = new_seq(kv);
    assert_int_equal(ag_cache_lookup(c, b, t, 40, 39, 0), 39);
    assert_int_equal(ag_kv_seq_len(kv, b), 39);
    int32_t        na, nb;
    const int32_t *ta = ag_kv_seq_blocks(kv, a, &na);
    int32_t        a_blocks[5];
    memcpy(a_blocks, ta, sizeof a_blocks);
    const int32_t *tb = ag_kv_seq_blocks(kv, b, &nb);
    assert_int_equal(nb, 5);
    assert_memory_equal(tb, a_blocks, 5 * sizeof(int32_t)); /* shared, not copied */
    check_seq(kv, b, t, 39);
    /* the last position is written into a copy of the shared fifth block */
    ag_kv_stats ks0, ks1;
    ag_kv_get_stats(kv, &ks0);
    prefill(kv, b, t, 40);
    ag_kv_get_stats(kv, &ks1);
    assert_int_equal(ks1.cow_copies, ks0.cow_copies + 1);
    tb = ag_kv_seq_blocks(kv, b, &nb);
    assert_int_not_equal(tb[4], a_blocks[4]);
    check_seq(kv, b, t, 40);
    check_seq(kv, a, t, 40); /* the original is untouched */
    /* whole blocks (max_len on a boundary): the rest goes into a fresh block, no copy */
    int32_t e = new_seq(kv);
    assert_int_equal(ag_cache_lookup(c, e, t, 40, 32, 0), 32);
    ag_kv_get_stats(kv, &ks0);
    prefill(kv, e, t, 40);
    ag_kv_get_stats(kv, &ks1);
    assert_int_equal(ks1.cow_copies, ks0.cow_copies);
    check_seq(kv, e, t, 40);
    /* max_len = the whole prompt: all 5 */
    int32_t d = new_seq(kv);
    assert_int_equal(ag_cache_lookup(c, d, t, 40, 40, 0), 40);
    check_seq(kv, d, t, 40);
    /* a prompt shorter than a block adopts what it has of block 0 */
    assert_int_equal(ag_cache_lookup(c, d, t, 7, 7, 0), 7);
    assert_int_equal(ag_kv_seq_len(kv, d), 7);
    check_seq(kv, d, t, 7);
    /* a prompt that diverges inside block i adopts i * BS + the common run */
    int32_t u[40];
    memcpy(u, t, sizeof u);
    u[3] ^= 1; /* in block 0 */
    assert_int_equal(ag_cache_lookup(c, d, u, 40, 39, 0), 3);
    check_seq(kv, d, u, 3);
    u[3] ^= 1;
    u[20] ^= 1; /* in block 2 */
    assert_int_equal(ag_cache_lookup(c, d, u, 40, 39, 0), 20);
    check_seq(kv, d, u, 20);
    u[16] ^= 1; /* the first token of block 2 */
    assert_int_equal(ag_cache_lookup(c, d, u, 40, 39, 0), 16);
    check_seq(kv, d, u, 16);

    ag_cache_stats s = stats(c);
    assert_int_equal(s.lookups, 8);
    assert_int_equal(s.hits, 7);
    assert_int_equal(s.misses, 1);
    assert_int_equal(s.tokens_from_memory, 39 + 32 + 40 + 7 + 3 + 20 + 16);
    assert_int_equal(s.tokens_from_disk, 0);

    /* the sequences go; the cache keeps the blocks (not the copy), and they
     * are reclaimable */
    ag_kv_seq_free(kv, a);
    ag_kv_seq_free(kv, b);
    ag_kv_seq_free(kv, d);
    ag_kv_seq_free(kv, e);
    assert_int_equal(kv_used(kv), 5);
    assert_int_equal(ag_cache_reclaimable(c), 5);
    ag_cache_free(c);
    assert_int_equal(kv_used(kv), 0);
    ag_kv_free(kv);
}

/* Only positions [0, n_tokens) are published, the last block in part: a
 * sequence that decoded past its prompt publishes its prompt's positions,
 * and an adopter gets no position past them. A full block that starts
 * with a partial one's tokens makes it redundant: it is dropped. */
static void publish_only_prompt_positions(void **state) {
    ag_kv    *kv = make_kv(32);
    ag_cache *c = mem_cache(kv);
    int32_t   t[40];
    make_tokens(t, 40, 2);
    int32_t a = new_seq(kv);
    prefill(kv, a, t, 40);                               /* 21 prompt tokens + 19 "decoded" */
    assert_int_equal(ag_cache_publish(c, a, t, 21, 0), 21); /* blocks 0, 1 and 5 tokens of block 2 */
    assert_int_equal(stats(c).blocks_published, 3);
    int32_t b = new_seq(kv);
    assert_int_equal(ag_cache_lookup(c, b, t, 40, 40, 0), 21);
    check_seq(kv, b, t, 21);
    /* a sequence shorter than the tokens given */
    int32_t e = new_seq(kv);
    prefill(kv, e, t, 30);
    assert_int_equal(ag_cache_publish(c, e, t, 40, 0), 30); /* blocks 0-2 and 6 tokens of block 3 */
    ag_cache_stats st = stats(c);
    assert_int_equal(st.blocks_published, 5);
    assert_int_equal(st.partials_superseded, 1); /* the 5 tokens of block 2: block 2 holds them */
    assert_int_equal(st.memory_blocks, 4);
    assert_int_equal(ag_cache_lookup(c, b, t, 40, 40, 0), 30);
    check_seq(kv, b, t, 30);
    assert_int_equal(ag_cache_publish(c, e, t, 0, 0), 0);
    assert_int_equal(ag_cache_publish(c, 15, t, 40, 0), 0); /* not live */
    assert_int_equal(ag_cache_lookup(c, 15, t, 40, 40, 0), 0);
    ag_cache_free(c);
    ag_kv_free(kv);
}

static void shared_system_prompt_across_conversations(void **state) {
    ag_kv    *kv = make_kv(32);
    ag_cache *c = mem_cache(kv);
    int32_t   c1[45], c2[45];
    make_tokens(c1, 45, 3);
    memcpy(c2, c1, sizeof c2);
    make_tokens(c2 + 24, 21, 4); /* same 24-token system prompt, then different */
    serve_prompt(c, kv, c1, 45, 0);
    assert_int_equal(stats(c).blocks_published, 6); /* 5 full blocks, 5 tokens of the sixth */
    int32_t s = new_seq(kv);
    assert_int_equal(ag_cache_lookup(c, s, c2, 45, 44, 0), 24); /* the system prompt's 3 blocks */
    int32_t n;
    const int32_t *t2 = ag_kv_seq_blocks(kv, s, &n);
    int32_t        shared[3];
    memcpy(shared, t2, sizeof shared);
    prefill(kv, s, c2, 45);
    check_seq(kv, s, c2, 45);
    ag_cache_publish(c, s, c2, 45, 0);
    ag_kv_seq_free(kv, s);
    ag_cache_stats st = stats(c);
    assert_int_equal(st.blocks_published, 6 + 3);
    assert_int_equal(st.memory_blocks, 9);
    assert_int_equal(kv_used(kv), 9); /* the 3 system blocks exist once */
    /* the first conversation's next turn finds all of it, its last 5 tokens
     * in the partial block */
    int32_t next[60];
    memcpy(next, c1, sizeof c1);
    make_tokens(next + 45, 15, 5);
    s = new_seq(kv);
    assert_int_equal(ag_cache_lookup(c, s, next, 60, 59, 0), 45);
    const int32_t *t1 = ag_kv_seq_blocks(kv, s, &n);
    assert_memory_equal(t1, shared, sizeof shared);
    check_seq(kv, s, next, 45);
    ag_kv_seq_free(kv, s);
    ag_cache_free(c);
    ag_kv_free(kv);
}

static void namespaces_isolate(void **state) {
    ag_kv    *kv = make_kv(32);
    ag_cache *c = mem_cache(kv);
    uint64_t  ns1 = ag_cache_namespace("tenant-1", 8), ns2 = ag_cache_namespace("tenant-2", 8);
    assert_int_equal(ag_cache_namespace("", 0), 0);
    assert_true(ns1 != 0 && ns2 != 0 && ns1 != ns2);
    int32_t t[33];
    make_tokens(t, 33, 6);
    serve_prompt(c, kv, t, 33, ns1);
    int32_t s = new_seq(kv);
    assert_int_equal(ag_cache_lookup(c, s, t, 33, 32, ns2), 0);
    assert_int_equal(ag_cache_lookup(c, s, t, 33, 32, 0), 0);
    assert_int_equal(ag_cache_lookup(c, s, t, 33, 32, ns1), 32);
    /* the same tokens in another namespace are separate blocks */
    ag_kv_seq_free(kv, s);
    serve_prompt(c, kv, t, 33, ns2);
    assert_int_equal(stats(c).memory_blocks, 10); /* 4 full blocks and a 1-token one each */
    ag_cache_free(c);
    ag_kv_free(kv);
}

/* With 4-bit keys most blocks collide with some other block; every match
 * must still be exact, because tokens, namespace and parent are compared. */
static void colliding_keys_never_give_wrong_kv(void **state) {
    enum { NP = 40, LEN = 4 * BS + 5 };
    ag_kv          *kv = make_kv(NP * 6 + 8);
    ag_cache_params p = ag_cache_default_params();
    p.key_bits = 4;
    ag_cache *c = NULL;
    assert_int_equal(ag_cache_new(kv, &p, &c), AG_OK);
    static int32_t t[NP][LEN];
    for (int i = 0; i < NP; i++) {
        make_tokens(t[i], LEN, 100 + (uint32_t)i);
        if (i % 3 == 1) memcpy(t[i], t[i - 1], 2 * BS * sizeof(int32_t)); /* shared prefixes too */
        if (i % 3 == 2) memcpy(t[i], t[i - 1], (2 * BS + 3) * sizeof(int32_t)); /* diverging mid-block */
        t[i][0] = i % 4;                                                   /* few distinct first blocks */
        if (i % 3 != 0) t[i][0] = t[i - 1][0];
    }
    int short_publishes = 0, mid_block = 0;
    for (int i = 0; i < NP; i++) {
        int32_t s = new_seq(kv);
        int32_t got = ag_cache_lookup(c, s, t[i], LEN, LEN - 1, 0);
        check_seq(kv, s, t[i], got); /* whatever was adopted is this prompt's KV */
        mid_block += got % BS != 0;
        prefill(kv, s, t[i], LEN);
        short_publishes += ag_cache_publish(c, s, t[i], LEN, 0) < 4 * BS;
        ag_kv_seq_free(kv, s);
    }
    assert_true(short_publishes > 0); /* collisions did happen */
    assert_true(mid_block > 0);
    int full = 0, all_but_one = 0;
    for (int i = 0; i < NP; i++) {
        int32_t s = new_seq(kv);
        int32_t got = ag_cache_lookup(c, s, t[i], LEN, LEN - 1, 0);
        check_seq(kv, s, t[i], got);
        full += got >= 4 * BS;
        all_but_one += got == LEN - 1; /* the partial last block too */
        ag_kv_seq_free(kv, s);
    }
    assert_true(full > 0);
    assert_true(all_but_one > 0);
    ag_cache_free(c);
    ag_kv_free(kv);
}

/* Least recently used leaf first, never a block a sequence holds. Each
 * prompt here ends in a partial block (1 token), a leaf like any other. */
static void eviction_is_lru_by_leaf_and_spares_held_blocks(void **state) {
    ag_kv    *kv = make_kv(32);
    ag_cache *c = mem_cache(kv);
    int32_t   a[17], b[17], x[25];
    make_tokens(a, 17, 10);
    make_tokens(b, 17, 11);
    make_tokens(x, 25, 12);
    serve_prompt(c, kv, a, 17, 0); /* 2 full blocks and a partial one each */
    serve_prompt(c, kv, b, 17, 0);
    serve_prompt(c, kv, x, 25, 0); /* 3 + 1 */
    assert_int_equal(ag_cache_reclaimable(c), 10);
    /* a is used again: b is now the least recently used prompt */
    int32_t s = new_seq(kv);
    assert_int_equal(ag_cache_lookup(c, s, a, 17, 17, 0), 17);
    ag_kv_seq_free(kv, s);
    /* x is held by a running sequence */
    int32_t hold = new_seq(kv);
    assert_int_equal(ag_cache_lookup(c, hold, x, 25, 25, 0), 25);
    assert_int_equal(ag_cache_reclaimable(c), 6);
    int32_t used = kv_used(kv);
    assert_int_equal(ag_cache_evict(c, 1), 1); /* b's leaf: its partial block */
    assert_int_equal(kv_used(kv), used - 1);
    assert_int_equal(stats(c).evictions_memory, 1);
    s = new_seq(kv);
    assert_int_equal(ag_cache_lookup(c, s, b, 17, 17, 0), 16); /* b's full blocks stayed */
    assert_int_equal(ag_cache_lookup(c, s, a, 17, 17, 0), 17);
    ag_kv_seq_free(kv, s);
    /* now b (touched before a) goes first again, then a; x never */
    assert_int_equal(ag_cache_evict(c, 1), 1);
    s = new_seq(kv);
    assert_int_equal(ag_cache_lookup(c, s, b, 17, 17, 0), 8);
    assert_int_equal(ag_cache_lookup(c, s, a, 17, 17, 0), 17);
    ag_kv_seq_free(kv, s);
    assert_int_equal(ag_cache_evict(c, 100), 4); /* b's first block, a's three, leaf first; x is held */
    assert_int_equal(ag_cache_reclaimable(c), 0);
    assert_int_equal(stats(c).memory_blocks, 4);
    check_seq(kv, hold, x, 25);
    /* once x's holder is gone, x goes leaf first */
    ag_kv_seq_free(kv, hold);
    assert_int_equal(ag_cache_reclaimable(c), 4);
    assert_int_equal(ag_cache_evict(c, 1), 1);
    s = new_seq(kv);
    assert_int_equal(ag_cache_lookup(c, s, x, 25, 25, 0), 24);
    ag_kv_seq_free(kv, s);
    assert_int_equal(ag_cache_evict(c, 5), 3);
    assert_int_equal(kv_used(kv), 0);
    assert_int_equal(stats(c).index_nodes, 0);
    ag_cache_free(c);
    ag_kv_free(kv);
}

/* The same prompt again adopts all of it but its last token, the last
 * block's positions shared (copy-on-write at the first write), and once
 * the sequences end and the cache is gone, every block is back. */
static void same_prompt_again_adopts_all_but_one_token(void **state) {
    ag_kv    *kv = make_kv(32);
    ag_cache *c = mem_cache(kv);
    int32_t   t[45];
    make_tokens(t, 45, 13);
    serve_prompt(c, kv, t, 45, 0); /* 5 full blocks, 5 tokens of the sixth */
    assert_int_equal(stats(c).memory_blocks, 6);
    assert_int_equal(kv_used(kv), 6);
    ag_kv_stats ks0, ks1;
    int32_t     s[3];
    for (int i = 0; i < 3; i++) { /* three requests at once */
        s[i] = new_seq(kv);
        assert_int_equal(ag_cache_lookup(c, s[i], t, 45, 44, 0), 44);
        check_seq(kv, s[i], t, 44);
    }
    assert_int_equal(kv_used(kv), 6); /* all shared */
    ag_kv_get_stats(kv, &ks0);
    for (int i = 0; i < 3; i++) {
        prefill(kv, s[i], t, 45); /* the last prompt token */
        check_seq(kv, s[i], t, 45);
    }
    ag_kv_get_stats(kv, &ks1);
    assert_int_equal(ks1.cow_copies, ks0.cow_copies + 3);
    assert_int_equal(kv_used(kv), 6 + 3);
    /* publishing again keeps the cached partial block, not a copy */
    assert_int_equal(ag_cache_publish(c, s[0], t, 45, 0), 45);
    assert_int_equal(stats(c).blocks_published, 6);
    for (int i = 0; i < 3; i++) ag_kv_seq_free(kv, s[i]);
    assert_int_equal(kv_used(kv), 6);
    assert_int_equal(ag_cache_reclaimable(c), 6);
    ag_cache_free(c);
    assert_int_equal(kv_used(kv), 0);
    ag_kv_free(kv);
}

/* Under one parent, the continuation that shares the longest run with the
 * prompt wins, partial or full; a partial block whose tokens start a
 * longer sibling's is redundant: dropped when that sibling is published,
 * never indexed after it. */
static void siblings_pick_the_longest_common_run(void **state) {
    ag_kv    *kv = make_kv(32);
    ag_cache *c = mem_cache(kv);
    int32_t   p1[21], p2[22], q[30];
    make_tokens(p1, 21, 14);
    memcpy(p2, p1, 18 * sizeof(int32_t)); /* 2 blocks + 2 tokens in common */
    make_tokens(p2 + 18, 4, 15);
    serve_prompt(c, kv, p1, 21, 0); /* tail of 5 */
    serve_prompt(c, kv, p2, 22, 0); /* tail of 6, the same first 2 */
    assert_int_equal(stats(c).memory_blocks, 4);
    int32_t s = new_seq(kv);
    memcpy(q, p2, sizeof p2);
    make_tokens(q + 22, 8, 16);
    q[21] ^= 1; /* 5 of p2's tail */
    assert_int_equal(ag_cache_lookup(c, s, q, 30, 29, 0), 21);
    check_seq(kv, s, q, 21);
    memcpy(q, p1, sizeof p1);
    make_tokens(q + 21, 9, 17); /* all 5 of p1's tail */
    assert_int_equal(ag_cache_lookup(c, s, q, 30, 29, 0), 21);
    check_seq(kv, s, q, 21);
    q[19] ^= 1; /* 3 of p1's tail, 2 of p2's */
    assert_int_equal(ag_cache_lookup(c, s, q, 30, 29, 0), 19);
    check_seq(kv, s, q, 19);
    assert_int_equal(ag_cache_lookup(c, s, q, 18, 17, 0), 17); /* a prompt that ends inside both */
    check_seq(kv, s, q, 17);
    /* a shorter tail that starts p2's is covered: not indexed */
    assert_int_equal(ag_cache_lookup(c, s, p2, 20, 20, 0), 20);
    prefill(kv, s, p2, 20);
    assert_int_equal(ag_cache_publish(c, s, p2, 20, 0), 20);
    ag_cache_stats st = stats(c);
    assert_int_equal(st.blocks_published, 4);
    assert_int_equal(st.partials_superseded, 1);
    assert_int_equal(st.memory_blocks, 4);
    ag_kv_seq_free(kv, s);
    /* a full block that starts with p1's tail drops it, block and all */
    int32_t f[24];
    memcpy(f, p1, sizeof p1);
    make_tokens(f + 21, 3, 18);
    int32_t used = kv_used(kv);
    serve_prompt(c, kv, f, 24, 0);
    st = stats(c);
    assert_int_equal(st.partials_superseded, 2);
    assert_int_equal(st.memory_blocks, 4);
    assert_int_equal(kv_used(kv), used); /* one block in, one out */
    s = new_seq(kv);
    memcpy(q, p1, sizeof p1);
    make_tokens(q + 21, 9, 19);
    assert_int_equal(ag_cache_lookup(c, s, q, 30, 29, 0), 21); /* p1's 5, now from the full block */
    check_seq(kv, s, q, 21);
    ag_kv_seq_free(kv, s);
    ag_cache_free(c);
    assert_int_equal(kv_used(kv), 0);
    ag_kv_free(kv);
}

/* ---- disk tier ---------------------------------------------------------- */

static char g_tmp[256];

static int disk_setup(void **state) {
    snprintf(g_tmp, sizeof g_tmp, "/tmp/augur-test-cache-XXXXXX");
    if (!mkdtemp(g_tmp)) return -1;
    return 0;
}

static void rm_rf(const char *path) {
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", path);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", path);
}

static int disk_teardown(void **state) {
    rm_rf(g_tmp);
    return 0;
}

static void subdir(char *out, size_t n, const char *name) {
    snprintf(out, n, "%s/%s", g_tmp, name);
    rm_rf(out);
}

static atomic_int g_notified;
static void       on_notify(void *user) { atomic_fetch_add(&g_notified, 1); }

static ag_cache *disk_cache_fp(ag_kv *kv, const char *dir, uint64_t cap, uint64_t model_fp, uint64_t tok_fp) {
    ag_cache_params p = ag_cache_default_params();
    p.model_fingerprint = model_fp;
    p.tok_fingerprint = tok_fp;
    p.disk_dir = dir;
    p.disk_max_bytes = cap;
    p.disk_sync = false; /* tmpfs or not, the tests do not need durability */
    p.notify = on_notify;
    ag_cache *c = NULL;
    assert_int_equal(ag_cache_new(kv, &p, &c), AG_OK);
    return c;
}

static ag_cache *disk_cache(ag_kv *kv, const char *dir, uint64_t cap) {
    return disk_cache_fp(kv, dir, cap, 11, 22);
}

/* A disk cache whose pause after a full disk is 50 ms (10 s by default). */
static ag_cache *short_pause_cache(ag_kv *kv, const char *dir, uint64_t cap) {
    ag_cache_params p = ag_cache_default_params();
    p.model_fingerprint = 11;
    p.tok_fingerprint = 22;
    p.disk_dir = dir;
    p.disk_max_bytes = cap;
    p.disk_sync = false;
    p.notify = on_notify;
    p.space_retry_ms = 50;
    ag_cache *c = NULL;
    assert_int_equal(ag_cache_new(kv, &p, &c), AG_OK);
    return c;
}

/* Waits (up to 10 s) for notify to have fired since g_notified was zeroed:
 * the writer drained its queue (or a pause ended). */
static bool wait_notified(void) {
    for (int i = 0; i < 10000 && atomic_load(&g_notified) == 0; i++) usleep(1000);
    return atomic_load(&g_notified) > 0;
}

static int count_files(const char *dir, const char *suffix) {
    DIR *d = opendir(dir);
    if (!d) return -1;
    int            n = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        size_t l = strlen(e->d_name), sl = strlen(suffix);
        if (e->d_name[0] != '.' && l >= sl && strcmp(e->d_name + l - sl, suffix) == 0) n++;
    }
    closedir(d);
    return n;
}

/* The record file of block i of a prompt, found by its header (its tokens
 * are a prefix of the prompt's there: the prompt must go on for a full
 * block or end where a partial record ends). */
typedef struct {
    const int32_t *tokens;
    uint32_t       index;
    char           name[64];
} find_ctx;

static bool find_fn(void *user, const ag_cache_dir_entry *e) {
    find_ctx *f = user;
    if (!e->record || e->record->block_index != f->index) return true;
    if (memcmp(e->record->tokens, f->tokens + (size_t)f->index * BS, e->record->n_tokens * sizeof(int32_t)) != 0)
        return true;
    snprintf(f->name, sizeof f->name, "%s", e->name);
    return false;
}

static void record_path(const char *dir, const int32_t *tokens, uint32_t index, char *out, size_t n) {
    find_ctx f = {tokens, index, ""};
    assert_int_equal(ag_cache_dir_list(dir, find_fn, &f), AG_OK);
    assert_true(f.name[0] != '\0');
    snprintf(out, n, "%s/%s", dir, f.name);
}

static void copy_out_block(const ag_kv *kv, int32_t block, uint8_t *out) {
    size_t cb = ag_kv_block_bytes(kv);
    for (int l = 0; l < NL; l++) assert_int_equal(ag_kv_block_copy_out(kv, block, l, out + l * cb, cb), AG_OK);
}

/* The record size of the test layout. */
static size_t record_bytes(const ag_kv *kv) { return AG_CACHE_RECORD_HEADER_BYTES(BS) + NL * ag_kv_block_bytes(kv); }

/* Written, then restored by a new cache over the directory (a restart):
 * the same prompt adopts all but its last token, 5 full blocks and 4 of
 * the 5 tokens of the partial sixth, bytes identical to what was written. */
static void disk_restart_restores_identical_bytes(void **state) {
    char dir[300];
    subdir(dir, sizeof dir, "restart");
    int32_t t[45];
    make_tokens(t, 45, 20);
    size_t   cb = 0;
    uint8_t *before = NULL;
    {
        ag_kv    *kv = make_kv(32);
        ag_cache *c = disk_cache(kv, dir, 0);
        int32_t   s = new_seq(kv);
        prefill(kv, s, t, 45);
        assert_int_equal(ag_cache_publish(c, s, t, 45, 7), 45);
        cb = ag_kv_block_bytes(kv);
        before = malloc(6 * NL * cb);
        int32_t        n;
        const int32_t *tb = ag_kv_seq_blocks(kv, s, &n);
        for (int i = 0; i < 6; i++) copy_out_block(kv, tb[i], before + (size_t)i * NL * cb);
        ag_kv_seq_free(kv, s);
        atomic_store(&g_notified, 0);
        while (ag_cache_idle(c, 1)) { /* one record per call */
        }
        ag_cache_flush(c);
        ag_cache_stats st = stats(c);
        assert_true(st.disk_enabled && st.disk_writable && st.scan_done);
        assert_int_equal(st.records_written, 6);
        assert_int_equal(st.records_on_disk, 6);
        assert_int_equal(st.bytes_written, 6 * record_bytes(kv));
        assert_int_equal(st.disk_bytes, st.bytes_written);
        assert_true(atomic_load(&g_notified) >= 1);
        assert_int_equal(count_files(dir, ".agkv"), 6);
        assert_int_equal(count_files(dir, ".tmp"), 0);
        /* idle again: nothing is written twice */
        assert_false(ag_cache_idle(c, SIZE_MAX));
        ag_cache_flush(c);
        assert_int_equal(stats(c).records_written, 6);
        ag_cache_free(c);
        ag_kv_free(kv);
    }
    /* a new process: a new kv and cache over the same directory */
    ag_kv    *kv = make_kv(32);
    ag_cache *c = disk_cache(kv, dir, 0);
    ag_cache_flush(c); /* waits for the background scan */
    ag_cache_stats st = stats(c);
    assert_int_equal(st.records_on_disk, 6);
    assert_int_equal(st.dropped_records, 0);
    assert_int_equal(st.memory_blocks, 0);
    int32_t s = new_seq(kv);
    assert_int_equal(ag_cache_lookup(c, s, t, 45, 44, 0), 0); /* another namespace */
    assert_int_equal(ag_cache_lookup(c, s, t, 45, 44, 7), 44);
    check_seq(kv, s, t, 44);
    int32_t        n;
    const int32_t *tb = ag_kv_seq_blocks(kv, s, &n);
    assert_int_equal(n, 6);
    uint8_t *after = malloc(NL * cb);
    for (int i = 0; i < 6; i++) {
        copy_out_block(kv, tb[i], after);
        assert_memory_equal(after, before + (size_t)i * NL * cb, NL * cb);
    }
    st = stats(c);
    assert_int_equal(st.tokens_from_disk, 44);
    assert_int_equal(st.bytes_read, 6 * record_bytes(kv));
    assert_int_equal(st.memory_blocks, 6);
    /* the last prompt token goes into a copy of the restored partial block */
    ag_kv_stats ks0, ks1;
    ag_kv_get_stats(kv, &ks0);
    prefill(kv, s, t, 45);
    ag_kv_get_stats(kv, &ks1);
    assert_int_equal(ks1.cow_copies, ks0.cow_copies + 1);
    check_seq(kv, s, t, 45);
    ag_kv_seq_free(kv, s);
    /* now from memory */
    s = new_seq(kv);
    assert_int_equal(ag_cache_lookup(c, s, t, 45, 44, 7), 44);
    check_seq(kv, s, t, 44);
    assert_int_equal(stats(c).tokens_from_memory, 44);
    ag_kv_seq_free(kv, s);
    /* evicted from memory, still restorable from disk; never rewritten */
    assert_int_equal(ag_cache_evict(c, 100), 6);
    s = new_seq(kv);
    assert_int_equal(ag_cache_lookup(c, s, t, 45, 44, 7), 44);
    check_seq(kv, s, t, 44);
    ag_kv_seq_free(kv, s);
    ag_cache_flush(c);
    assert_int_equal(stats(c).records_written, 0);
    assert_int_equal(stats(c).tokens_from_disk, 88);
    /* nothing leaks: what is left is the memory tier's */
    assert_int_equal(kv_used(kv), stats(c).memory_blocks);
    free(before);
    free(after);
    ag_cache_free(c);
    ag_kv_free(kv);
}

/* A prompt written to the disk tier by a cache that is then closed. */
static void store_prompt(const char *dir, const int32_t *t, int32_t n) {
    ag_kv    *kv = make_kv(32);
    ag_cache *c = disk_cache(kv, dir, 0);
    serve_prompt(c, kv, t, n, 0);
    ag_cache_flush(c);
    ag_cache_free(c);
    ag_kv_free(kv);
}

/* A pool in "device" memory (host memory behind the ag_kv_mem hooks, so
 * nothing may touch it directly) whose memory offers pinned host buffers:
 * the disk tier's restores stage through them, every one handed back. */
static atomic_int g_host_allocs, g_host_frees;
static void      *fake_alloc(void *ctx, size_t n) { return calloc(1, n); }
static void       fake_free(void *ctx, void *p) { free(p); }
static int        fake_copy(void *ctx, void *d, const void *s, size_t n) { return memcpy(d, s, n), 0; }
static void      *fake_host_alloc(void *ctx, size_t n) {
    atomic_fetch_add(&g_host_allocs, 1);
    return malloc(n);
}
static void fake_host_free(void *ctx, void *p) {
    atomic_fetch_add(&g_host_frees, 1);
    free(p);
}

static void disk_restore_stages_in_pinned_buffers(void **state) {
    static const ag_kv_mem mem = {NULL, fake_alloc, fake_free, fake_copy, fake_copy, fake_copy, fake_host_alloc,
                                  fake_host_free};
    char dir[300];
    subdir(dir, sizeof dir, "pinned");
    int32_t t[45];
    make_tokens(t, 45, 21);
    store_prompt(dir, t, 45); /* 5 full blocks and a partial one, on disk */
    atomic_store(&g_host_allocs, 0);
    atomic_store(&g_host_frees, 0);
    ag_kv *kv = make_kv_mem(32, DV, &mem);
    assert_false(ag_kv_host_visible(kv));
    ag_cache *c = disk_cache(kv, dir, 0);
    ag_cache_flush(c);
    int32_t s = new_seq(kv);
    assert_int_equal(ag_cache_lookup(c, s, t, 45, 44, 0), 44);
    check_seq(kv, s, t, 44);
    assert_int_equal(stats(c).tokens_from_disk, 44);
    assert_true(atomic_load(&g_host_allocs) >= 1);
    ag_kv_seq_free(kv, s);
    ag_cache_free(c);
    assert_int_equal(atomic_load(&g_host_frees), atomic_load(&g_host_allocs));
    ag_kv_free(kv);
    rm_rf(dir);
}

/* A lookup that needs more blocks than the pool has free takes reclaimable
 * ones, and stops where none are left. */
static void disk_restore_under_pool_pressure(void **state) {
    char dir[300];
    subdir(dir, sizeof dir, "pressure");
    int32_t t[49];
    make_tokens(t, 49, 21);
    {
        ag_kv    *kv = make_kv(16);
        ag_cache *c = disk_cache(kv, dir, 0);
        serve_prompt(c, kv, t, 49, 0); /* 6 blocks and 1 token */
        ag_cache_flush(c);
        ag_cache_free(c);
        ag_kv_free(kv);
    }
    ag_kv    *kv = make_kv(8);
    ag_cache *c = disk_cache(kv, dir, 0);
    ag_cache_flush(c);
    int32_t other[17];
    make_tokens(other, 17, 22);
    serve_prompt(c, kv, other, 17, 0); /* 3 reclaimable blocks (the last holds 1 token) */
    int32_t hog = new_seq(kv);
    assert_int_equal(ag_kv_seq_reserve(kv, hog, 2 * BS), AG_OK); /* 2 blocks held; 3 free */
    int32_t s = new_seq(kv);
    assert_int_equal(ag_cache_lookup(c, s, t, 49, 48, 0), 48); /* 3 free + 3 evicted */
    check_seq(kv, s, t, 48);
    assert_int_equal(stats(c).evictions_memory, 3);
    ag_kv_seq_free(kv, s);
    ag_cache_evict(c, 100);
    assert_int_equal(ag_kv_seq_reserve(kv, hog, 5 * BS), AG_OK); /* 5 held, 3 free */
    s = new_seq(kv);
    assert_int_equal(ag_cache_lookup(c, s, t, 49, 48, 0), 24); /* stops when the pool is empty */
    check_seq(kv, s, t, 24);
    ag_kv_seq_free(kv, s);
    ag_kv_seq_free(kv, hog);
    ag_cache_free(c);
    ag_kv_free(kv);
}

static void write_file(const char *path, const void *data, size_t n) {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(data, 1, n, f), n);
    fclose(f);
}

static uint8_t *read_file(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    *n = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *b = malloc(*n);
    assert_int_equal(fread(b, 1, *n, f), *n);
    fclose(f);
    return b;
}

static void flip_byte(const char *path, size_t off) {
    size_t   n;
    uint8_t *b = read_file(path, &n);
    assert_true(off < n);
    b[off] ^= 0x40;
    write_file(path, b, n);
    free(b);
}

static bool exists(const char *path) { return access(path, F_OK) == 0; }

/* Writes one prompt's records with the given identity / layout into dir. */
static void write_prompt(const char *dir, const int32_t *t, int32_t n, uint64_t model_fp, uint64_t tok_fp, int32_t dv) {
    ag_kv    *kv = make_kv_shape(16, dv);
    ag_cache *c = disk_cache_fp(kv, dir, 0, model_fp, tok_fp);
    int32_t   s = new_seq(kv);
    /* (values do not matter here; a dv other than DV cannot use prefill) */
    assert_int_equal(ag_kv_seq_reserve(kv, s, n), AG_OK);
    assert_int_equal(ag_kv_seq_commit(kv, s, n), AG_OK);
    ag_cache_publish(c, s, t, n, 0);
    ag_kv_seq_free(kv, s);
    ag_cache_flush(c);
    ag_cache_free(c);
    ag_kv_free(kv);
}

static void move_all(const char *from, const char *to) {
    char cmd[800];
    snprintf(cmd, sizeof cmd, "mv '%s'/*.agkv '%s'/", from, to);
    assert_int_equal(system(cmd), 0);
}

static void disk_scan_drops_bad_records(void **state) {
    char dir[300], other[300];
    subdir(dir, sizeof dir, "scan");
    subdir(other, sizeof other, "scan-other");
    int32_t t[65];
    make_tokens(t, 65, 30);
    {
        ag_kv    *kv = make_kv(16);
        ag_cache *c = disk_cache(kv, dir, 0);
        serve_prompt(c, kv, t, 65, 0); /* 9 records: 8 full blocks, 1 token */
        ag_cache_flush(c);
        assert_int_equal(stats(c).records_on_disk, 9);
        ag_cache_free(c);
        ag_kv_free(kv);
    }
    char p[400];
    /* block 7: corrupt header (a token id) */
    record_path(dir, t, 7, p, sizeof p);
    flip_byte(p, 136 + 4 * 3);
    char corrupt[400];
    snprintf(corrupt, sizeof corrupt, "%s", p);
    /* block 6: truncated */
    record_path(dir, t, 6, p, sizeof p);
    char truncated[400];
    snprintf(truncated, sizeof truncated, "%s", p);
    assert_int_equal(truncate(p, 300), 0);
    /* block 5: renamed to another key's name */
    record_path(dir, t, 5, p, sizeof p);
    char misnamed[400];
    snprintf(misnamed, sizeof misnamed, "%s/0123456789abcdef0123456789abcdef.agkv", dir);
    assert_int_equal(rename(p, misnamed), 0);
    /* records of another model, another tokenizer, another layout (3 each:
     * 2 full blocks, 1 token) */
    int32_t u[17];
    make_tokens(u, 17, 31);
    write_prompt(other, u, 17, 99, 22, DV);
    move_all(other, dir);
    make_tokens(u, 17, 32);
    write_prompt(other, u, 17, 11, 98, DV);
    move_all(other, dir);
    make_tokens(u, 17, 33);
    write_prompt(other, u, 17, 11, 22, DV + 1);
    move_all(other, dir);
    /* leftovers: a temp file of a dead writer and a stray file that is not ours */
    char tmp[400], keep[400], live[400];
    snprintf(tmp, sizeof tmp, "%s/0123456789abcdef0123456789abcdef.999999999-3.tmp", dir);
    write_file(tmp, "partial", 7);
    snprintf(live, sizeof live, "%s/0123456789abcdef0123456789abcdef.%ld-4.tmp", dir, (long)getppid());
    write_file(live, "in progress", 11);
    snprintf(keep, sizeof keep, "%s/notes.txt", dir);
    write_file(keep, "mine", 4);
    assert_int_equal(count_files(dir, ".agkv"), 9 + 9);

    ag_kv    *kv = make_kv(16);
    ag_cache *c = disk_cache(kv, dir, 0);
    ag_cache_flush(c);
    ag_cache_stats st = stats(c);
    /* corrupt, truncated, misnamed, 3 + 3 + 3 foreign, 1 temp file */
    assert_int_equal(st.dropped_records, 3 + 9 + 1);
    assert_int_equal(st.records_on_disk, 6);
    assert_false(exists(corrupt));
    assert_false(exists(truncated));
    assert_false(exists(misnamed));
    assert_false(exists(tmp));
    assert_true(exists(live)); /* its writer (our parent process) is alive */
    assert_true(exists(keep));
    assert_int_equal(count_files(dir, ".agkv"), 6);
    int32_t s = new_seq(kv);
    assert_int_equal(ag_cache_lookup(c, s, t, 65, 64, 0), 40); /* blocks 0..4 */
    check_seq(kv, s, t, 40);
    ag_kv_seq_free(kv, s);
    ag_cache_free(c);
    /* an hour-old temp file goes even if its pid is alive */
    struct timespec ts[2] = {{0, UTIME_OMIT}, {time(NULL) - 7200, 0}};
    assert_int_equal(utimensat(AT_FDCWD, live, ts, 0), 0);
    c = disk_cache(kv, dir, 0);
    ag_cache_flush(c);
    assert_false(exists(live));
    assert_int_equal(stats(c).dropped_records, 1);
    ag_cache_free(c);
    ag_kv_free(kv);
}

static void disk_failed_restore_deletes_and_falls_back(void **state) {
    char dir[300];
    subdir(dir, sizeof dir, "badrestore");
    int32_t t[33];
    make_tokens(t, 33, 40);
    {
        ag_kv    *kv = make_kv(16);
        ag_cache *c = disk_cache(kv, dir, 0);
        serve_prompt(c, kv, t, 33, 0);
        ag_cache_flush(c);
        ag_cache_free(c);
        ag_kv_free(kv);
    }
    char p1[400], p2[400];
    record_path(dir, t, 1, p1, sizeof p1);
    record_path(dir, t, 2, p2, sizeof p2);
    size_t n;
    free(read_file(p1, &n));
    flip_byte(p1, n - 5); /* payload: the scan cannot see it */
    ag_kv    *kv = make_kv(16);
    ag_cache *c = disk_cache(kv, dir, 0);
    ag_cache_flush(c);
    assert_int_equal(stats(c).records_on_disk, 5); /* 4 full blocks, 1 token */
    int32_t used = kv_used(kv);
    int32_t s = new_seq(kv);
    assert_int_equal(ag_cache_lookup(c, s, t, 33, 32, 0), 8); /* block 0, then the bad one stops it */
    check_seq(kv, s, t, 8);
    ag_cache_stats st = stats(c);
    assert_int_equal(st.restore_failures, 1);
    assert_int_equal(st.dropped_records, 1);
    assert_int_equal(st.records_on_disk, 4);
    assert_false(exists(p1));
    assert_true(exists(p2));
    assert_int_equal(kv_used(kv), used + 1); /* the failed block went back to the pool */
    /* the engine prefills the rest and publishes: the record comes back */
    prefill(kv, s, t, 33);
    ag_cache_publish(c, s, t, 33, 0);
    ag_kv_seq_free(kv, s);
    ag_cache_flush(c);
    assert_true(exists(p1));
    assert_int_equal(stats(c).records_written, 1); /* only the missing one */
    ag_cache_free(c);
    /* a record that vanished (another process evicted it) is a quiet miss;
     * a truncated one (cut after the scan) is dropped like a corrupt one */
    {
        ag_kv    *kv2 = make_kv(16);
        ag_cache *c2 = disk_cache(kv2, dir, 0);
        ag_cache_flush(c2);
        assert_int_equal(stats(c2).records_on_disk, 5);
        assert_int_equal(unlink(p2), 0);
        int32_t s2 = new_seq(kv2);
        assert_int_equal(ag_cache_lookup(c2, s2, t, 33, 32, 0), 16);
        check_seq(kv2, s2, t, 16);
        st = stats(c2);
        assert_int_equal(st.dropped_records, 0);
        assert_int_equal(st.restore_failures, 1);
        assert_int_equal(st.records_on_disk, 4);
        ag_kv_seq_free(kv2, s2);
        assert_int_equal(ag_cache_evict(c2, 100), 2);
        record_path(dir, t, 0, p1, sizeof p1);
        assert_int_equal(truncate(p1, 500), 0);
        s2 = new_seq(kv2);
        assert_int_equal(ag_cache_lookup(c2, s2, t, 33, 32, 0), 0);
        assert_false(exists(p1));
        st = stats(c2);
        assert_int_equal(st.dropped_records, 1);
        assert_int_equal(st.restore_failures, 2);
        ag_kv_seq_free(kv2, s2);
        ag_cache_free(c2);
        ag_kv_free(kv2);
    }
    ag_kv_free(kv);
}

static void disk_byte_cap_evicts_lru_leaves(void **state) {
    char dir[300];
    subdir(dir, sizeof dir, "cap");
    int32_t a[25], b[25];
    make_tokens(a, 25, 50);
    make_tokens(b, 25, 51);
    size_t rec = 0;
    {
        ag_kv *kv = make_kv(16);
        rec = record_bytes(kv);
        ag_cache *c = disk_cache(kv, dir, 3 * rec + 10);
        serve_prompt(c, kv, a, 25, 0); /* 3 blocks and 1 token */
        /* written before b's: records that finish writing at once (the
         * flush helps the writer) enter the LRU order as they finish */
        ag_cache_flush(c);
        serve_prompt(c, kv, b, 25, 0); /* 4 more */
        ag_cache_flush(c);
        ag_cache_stats st = stats(c);
        assert_int_equal(st.disk_max_bytes, 3 * rec + 10);
        /* a's 3 full blocks, then b's, which are more recent: a's go to
         * make room; each prompt's last record, older than the blocks
         * before it, is not written at all */
        assert_int_equal(st.records_written, 6);
        assert_int_equal(st.records_skipped, 2);
        assert_int_equal(st.records_on_disk, 3);
        assert_int_equal(st.evictions_disk, 3);
        assert_true(st.disk_bytes <= 3 * rec + 10);
        assert_int_equal(st.queued_bytes, 0);
        assert_int_equal(count_files(dir, ".agkv"), 3);
        /* the cap chose them: they are not written back */
        assert_false(ag_cache_idle(c, SIZE_MAX));
        ag_cache_flush(c);
        assert_int_equal(stats(c).records_written, 6);
        ag_cache_free(c);
        ag_kv_free(kv);
    }
    /* what stayed is b's full blocks (its partial leaf went first); a
     * restart with a smaller cap drops b's leaf first */
    ag_kv    *kv = make_kv(16);
    ag_cache *c = disk_cache(kv, dir, 2 * rec);
    ag_cache_flush(c);
    ag_cache_stats st = stats(c);
    assert_int_equal(st.records_on_disk, 2);
    assert_int_equal(st.evictions_disk, 1);
    int32_t s = new_seq(kv);
    assert_int_equal(ag_cache_lookup(c, s, a, 25, 24, 0), 0);
    assert_int_equal(ag_cache_lookup(c, s, b, 25, 24, 0), 16);
    check_seq(kv, s, b, 16);
    ag_kv_seq_free(kv, s);
    ag_cache_free(c);
    ag_kv_free(kv);
}

/* Bytes of the record files and temp files in dir (files that vanish
 * while it looks are skipped). */
static uint64_t dir_record_bytes(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return 0;
    uint64_t       n = 0;
    struct dirent *e;
    struct stat    st;
    while ((e = readdir(d))) {
        size_t l = strlen(e->d_name);
        bool   ours = (l > 5 && !strcmp(e->d_name + l - 5, ".agkv")) || (l > 4 && !strcmp(e->d_name + l - 4, ".tmp"));
        if (ours && fstatat(dirfd(d), e->d_name, &st, 0) == 0) n += (uint64_t)st.st_size;
    }
    closedir(d);
    return n;
}

typedef struct {
    const char   *dir;
    atomic_bool   stop;
    atomic_ullong peak;
} dir_sampler;

static void *sample_dir(void *arg) {
    dir_sampler *s = arg;
    while (!atomic_load(&s->stop)) {
        uint64_t b = dir_record_bytes(s->dir);
        if (b > atomic_load(&s->peak)) atomic_store(&s->peak, b);
    }
    return NULL;
}

/* The cap is a hard bound: records queued for the writer count against it
 * as if written, so the directory never holds more than the cap, not even
 * while a prompt many times the cap is written (issue 51: with
 * --kv-disk-max 2M one prompt peaked at 26-38 MiB on disk, the write queue
 * of up to 64 MiB being outside the count). A thread samples the directory
 * all along; and the prompt's first blocks are what stays (its deeper
 * blocks count as less recently used). */
static void disk_cap_counts_queued_writes(void **state) {
    char dir[300];
    subdir(dir, sizeof dir, "hardcap");
    ag_kv   *kv = make_kv(32);
    size_t   rec = record_bytes(kv);
    uint64_t cap = 3 * rec + rec / 2;
    ag_cache *c = disk_cache(kv, dir, cap);
    ag_cache_flush(c); /* (the scan merged) */
    dir_sampler smp = {.dir = dir};
    pthread_t   th;
    assert_int_equal(pthread_create(&th, NULL, sample_dir, &smp), 0);
    int32_t t[161];
    make_tokens(t, 161, 57);
    serve_prompt(c, kv, t, 161, 0); /* 20 blocks and 1 token: 21 records */
    atomic_store(&g_notified, 0);
    /* no byte limit per call: whatever may be written goes to the writer at once */
    while (ag_cache_idle(c, SIZE_MAX)) {
    }
    assert_true(wait_notified());
    /* what the writer wrote, before any later call could delete some */
    assert_true(count_files(dir, ".agkv") <= 3);
    ag_cache_flush(c);
    atomic_store(&smp.stop, true);
    pthread_join(th, NULL);
    /* the written records are there now, whether or not a loaded machine
     * let the sampler run while they were written */
    const uint64_t now_b = dir_record_bytes(dir);
    if (now_b > atomic_load(&smp.peak)) atomic_store(&smp.peak, now_b);
    assert_true(atomic_load(&smp.peak) > 0);
    assert_true(atomic_load(&smp.peak) <= cap);
    ag_cache_stats st = stats(c);
    assert_int_equal(st.records_on_disk, 3);
    assert_int_equal(st.records_written, 3);
    assert_int_equal(st.records_skipped, 18);
    assert_int_equal(st.evictions_disk, 0);
    assert_int_equal(st.queued_bytes, 0);
    ag_cache_free(c);
    ag_kv_free(kv);
    /* the first three blocks are on disk */
    kv = make_kv(32);
    c = disk_cache(kv, dir, cap);
    ag_cache_flush(c);
    int32_t s = new_seq(kv);
    assert_int_equal(ag_cache_lookup(c, s, t, 161, 160, 0), 3 * BS);
    check_seq(kv, s, t, 3 * BS);
    ag_kv_seq_free(kv, s);
    ag_cache_free(c);
    ag_kv_free(kv);
}

static void disk_two_caches_share_a_directory(void **state) {
    char dir[300];
    subdir(dir, sizeof dir, "shared");
    int32_t a[33], b[33];
    make_tokens(a, 33, 60);
    memcpy(b, a, 16 * sizeof(int32_t));
    make_tokens(b + 16, 17, 61);
    ag_kv    *kv1 = make_kv(16), *kv2 = make_kv(16);
    ag_cache *c1 = disk_cache(kv1, dir, 0), *c2 = disk_cache(kv2, dir, 0);
    ag_cache_flush(c1);
    ag_cache_flush(c2);
    serve_prompt(c1, kv1, a, 33, 0);
    serve_prompt(c2, kv2, b, 33, 0);
    /* both write at once; the shared blocks land once */
    while (ag_cache_idle(c1, 1) | ag_cache_idle(c2, 1)) {
    }
    ag_cache_flush(c1);
    ag_cache_flush(c2);
    ag_cache_stats s1 = stats(c1), s2 = stats(c2);
    /* (both may write a shared block at the same moment: the second rename
     * replaces the first with identical content); 4 full blocks and 1
     * token each, 2 blocks in common */
    assert_true(s1.records_written + s2.records_written >= 8 && s1.records_written + s2.records_written <= 10);
    assert_int_equal(count_files(dir, ".agkv"), 8);
    assert_int_equal(count_files(dir, ".tmp"), 0);
    ag_cache_free(c1);
    ag_cache_free(c2);
    ag_kv_free(kv1);
    ag_kv_free(kv2);
    ag_kv    *kv = make_kv(16);
    ag_cache *c = disk_cache(kv, dir, 0);
    ag_cache_flush(c);
    assert_int_equal(stats(c).dropped_records, 0);
    int32_t s = new_seq(kv);
    assert_int_equal(ag_cache_lookup(c, s, a, 33, 33, 0), 33);
    check_seq(kv, s, a, 33);
    assert_int_equal(ag_cache_lookup(c, s, b, 33, 33, 0), 33);
    check_seq(kv, s, b, 33);
    ag_kv_seq_free(kv, s);
    ag_cache_free(c);
    ag_kv_free(kv);
}

/* A directory that cannot exist (a file sits where its parent should be):
 * the disk tier is off, the memory tier serves, nothing fails. */
static void disk_dir_impossible_turns_tier_off(void **state) {
    char file[300], dir[400];
    subdir(file, sizeof file, "a-file");
    write_file(file, "x", 1);
    snprintf(dir, sizeof dir, "%s/kv", file);
    ag_kv    *kv = make_kv(16);
    ag_cache *c = disk_cache(kv, dir, 0);
    ag_cache_stats st = stats(c);
    assert_false(st.disk_enabled);
    assert_false(st.disk_writable);
    int32_t t[17];
    make_tokens(t, 17, 70);
    serve_prompt(c, kv, t, 17, 0);
    assert_false(ag_cache_idle(c, SIZE_MAX));
    ag_cache_flush(c);
    int32_t s = new_seq(kv);
    assert_int_equal(ag_cache_lookup(c, s, t, 17, 16, 0), 16);
    ag_kv_seq_free(kv, s);
    ag_cache_free(c);
    ag_kv_free(kv);
}

/* In a child process, so that the file size limit (and its signal) stay
 * there: while the limit is low every write fails with EFBIG, as on a full
 * disk. Writing pauses (it is not turned off: issue 51, a full disk used to
 * stop writing for the rest of the server's life), serving goes on from
 * memory and from what is already on disk, and once the limit is lifted
 * the records are written after the pause. Exit status 0 = pass. */
static int full_disk_child(const char *dir, const int32_t *t, int32_t n) {
    signal(SIGXFSZ, SIG_IGN);
    struct rlimit rl;
    if (getrlimit(RLIMIT_FSIZE, &rl) != 0) return 10;
    rlim_t        was = rl.rlim_cur;
    rl.rlim_cur = 100;
    ag_kv    *kv = make_kv(16);
    ag_cache *c = short_pause_cache(kv, dir, 0);
    ag_cache_flush(c);
    ag_cache_stats st = stats(c);
    if (!st.disk_enabled || !st.disk_writable || st.records_on_disk != 3) return 11;
    if (setrlimit(RLIMIT_FSIZE, &rl) != 0) return 10;
    int32_t u[25];
    make_tokens(u, 25, 81);
    serve_prompt(c, kv, u, 25, 0);
    ag_cache_flush(c);
    st = stats(c);
    if (!st.disk_writable || !st.disk_paused || st.records_written != 0 || st.write_failures < 1 ||
        st.space_pauses != 1)
        return 12;
    if (count_files(dir, ".tmp") != 0) return 13;
    /* still serving: u from memory, t from disk */
    int32_t s = new_seq(kv);
    if (ag_cache_lookup(c, s, u, 25, 24, 0) != 24) return 14;
    if (ag_cache_lookup(c, s, t, n, n - 1, 0) != 16) return 15;
    ag_kv_seq_free(kv, s);
    if (ag_cache_idle(c, SIZE_MAX)) return 16; /* paused: nothing is copied out */
    /* the limit goes away; after the pause u's records are written */
    rl.rlim_cur = was;
    if (setrlimit(RLIMIT_FSIZE, &rl) != 0) return 10;
    for (int i = 0; i < 5000 && stats(c).records_written < 4; i++) {
        ag_cache_idle(c, SIZE_MAX);
        usleep(1000);
    }
    ag_cache_flush(c);
    st = stats(c);
    if (st.records_written != 4 || st.disk_paused || st.space_pauses != 1 || st.records_on_disk != 7) return 17;
    if (count_files(dir, ".agkv") != 7 || count_files(dir, ".tmp") != 0) return 18;
    ag_cache_free(c);
    ag_kv_free(kv);
    return 0;
}

static int run_child(int (*fn)(const char *, const int32_t *, int32_t), const char *dir, const int32_t *t,
                     int32_t n) {
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) _exit(fn(dir, t, n));
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status));
    return WEXITSTATUS(status);
}

static void disk_full_pauses_writing_then_resumes(void **state) {
    char dir[300];
    subdir(dir, sizeof dir, "full");
    int32_t t[17];
    make_tokens(t, 17, 80);
    {
        ag_kv    *kv = make_kv(16);
        ag_cache *c = disk_cache(kv, dir, 0);
        serve_prompt(c, kv, t, 17, 0);
        ag_cache_flush(c);
        ag_cache_free(c);
        ag_kv_free(kv);
    }
    assert_int_equal(run_child(full_disk_child, dir, t, 17), 0);
    assert_int_equal(count_files(dir, ".agkv"), 7);
}

/* How many of the prompt's blocks, from block 0 on, have a record in dir.
 * (Writes that fail for a full disk leave a hole where the flush, which
 * helps the writer, wrote the record after a failed one.) */
static int32_t blocks_in_a_row(const char *dir, const int32_t *tokens) {
    for (uint32_t i = 0;; i++) {
        find_ctx f = {tokens, i, ""};
        if (ag_cache_dir_list(dir, find_fn, &f) != AG_OK || !f.name[0]) return (int32_t)i;
    }
}

/* Real read-only and really full file systems: a private mount namespace
 * with a tmpfs. Needs CAP_SYS_ADMIN (root in most CI containers); skipped
 * where unshare is refused. */
static int ns_child(const char *dir, const int32_t *t, int32_t n) {
    if (unshare(CLONE_NEWNS) != 0) return 77;
    if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) != 0) return 77;
    if (mount("augur-test", dir, "tmpfs", 0, "size=64k") != 0) return 77;
    /* 1. full: a 64 KiB tmpfs holds a few records (a page each), then
     * ENOSPC. Writing pauses; the cap in force drops to half of what the
     * records and the free space hold, the least recently used records go
     * at once, so the disk does not stay full; after the pause writing
     * resumes under that cap (issue 51). */
    ag_kv    *kv = make_kv(64);
    ag_cache *c = short_pause_cache(kv, dir, (uint64_t)1 << 30);
    ag_cache_flush(c);
    int32_t big[401];
    make_tokens(big, 401, 90);
    serve_prompt(c, kv, big, 401, 0); /* 50 blocks and 1 token: 51 records */
    ag_cache_flush(c);
    ag_cache_stats st = stats(c);
    if (!st.disk_writable || !st.disk_paused || st.write_failures < 1 || st.space_pauses != 1 ||
        st.records_written < 1 || st.records_written >= 51)
        return 20;
    if (count_files(dir, ".tmp") != 0) return 21;
    if (st.disk_max_bytes >= 64 * 1024 || st.disk_bytes > st.disk_max_bytes || st.evictions_disk < 1) return 27;
    struct statvfs vfs;
    if (statvfs(dir, &vfs) != 0 || (uint64_t)vfs.f_bavail * vfs.f_frsize < 16 * 1024) return 28; /* not left full */
    int32_t s = new_seq(kv);
    if (ag_cache_lookup(c, s, big, 401, 400, 0) != 400) return 22; /* memory */
    ag_kv_seq_free(kv, s);
    /* after the pause, a new prompt is written (older records make room) */
    usleep(100 * 1000);
    uint64_t written = st.records_written;
    serve_prompt(c, kv, t, n, 0);
    for (int i = 0; i < 5000 && stats(c).records_written < written + 3; i++) {
        ag_cache_idle(c, SIZE_MAX);
        usleep(1000);
    }
    ag_cache_flush(c);
    st = stats(c);
    /* (a record of big that waited through the pause may go in too, when
     * the cap recomputed at the end of the pause holds one more) */
    if (st.records_written < written + 3 || st.disk_paused || st.space_pauses != 1) return 29;
    if (count_files(dir, ".tmp") != 0) return 21;
    uint64_t on_disk = st.records_on_disk;
    int32_t  prefix = blocks_in_a_row(dir, big);
    if (prefix > 50) prefix = 50; /* (the 51st record holds 1 token, past max_len 400) */
    ag_cache_free(c);
    /* 2. read-only: the records are restored, nothing is written */
    if (mount(NULL, dir, NULL, MS_REMOUNT | MS_RDONLY, NULL) != 0) return 23;
    c = disk_cache(kv, dir, 0);
    ag_cache_flush(c);
    st = stats(c);
    if (!st.disk_enabled || st.disk_writable || st.records_on_disk != on_disk) return 24;
    s = new_seq(kv);
    if (prefix < 1 || ag_cache_lookup(c, s, big, 401, 400, 0) != prefix * BS) return 25;
    check_seq(kv, s, big, prefix * BS);
    if (ag_cache_lookup(c, s, t, n, n - 1, 0) != n - 1) return 30; /* written after the pause */
    check_seq(kv, s, t, n - 1);
    ag_kv_seq_free(kv, s);
    int32_t other[17];
    make_tokens(other, 17, 92);
    serve_prompt(c, kv, other, 17, 0);
    ag_cache_flush(c);
    if (stats(c).records_written != 0) return 26;
    ag_cache_free(c);
    ag_kv_free(kv);
    return 0;
}

static void disk_real_full_and_read_only_filesystems(void **state) {
    char dir[300];
    subdir(dir, sizeof dir, "tmpfs");
    assert_int_equal(mkdir(dir, 0755), 0);
    int32_t t[17];
    make_tokens(t, 17, 91);
    int rc = run_child(ns_child, dir, t, 17);
    if (rc == 77) skip();
    assert_int_equal(rc, 0);
}

/* ---- records -------------------------------------------------------------- */

static void record_parse_checks_everything(void **state) {
    char dir[300];
    subdir(dir, sizeof dir, "parse");
    int32_t t[9];
    make_tokens(t, 9, 100);
    ag_kv    *kv = make_kv(16);
    ag_cache *c = disk_cache(kv, dir, 0);
    serve_prompt(c, kv, t, 9, 3);
    ag_cache_flush(c);
    ag_cache_free(c);
    char p[400];
    record_path(dir, t, 0, p, sizeof p);
    size_t   n;
    uint8_t *b = read_file(p, &n);
    ag_cache_record r;
    assert_int_equal(ag_cache_record_parse(b, n, &r), AG_OK);
    assert_int_equal(r.version, AG_CACHE_RECORD_VERSION);
    assert_int_equal(r.block_size, BS);
    assert_int_equal(r.n_layers, NL);
    assert_int_equal(r.n_kv_heads, NH);
    assert_int_equal(r.head_dim_k, DK);
    assert_int_equal(r.head_dim_v, DV);
    assert_int_equal(r.dtype, AG_KV_F16);
    assert_int_equal(r.model_fingerprint, 11);
    assert_int_equal(r.tok_fingerprint, 22);
    assert_int_equal(r.ns, 3);
    assert_int_equal(r.block_index, 0);
    assert_true(r.parent.lo == 0 && r.parent.hi == 0);
    assert_memory_equal(r.tokens, t, BS * sizeof(int32_t));
    assert_int_equal(r.payload_bytes, NL * ag_kv_block_bytes(kv));
    assert_int_equal(n, r.header_bytes + r.payload_bytes);
    assert_int_equal(ag_cache_payload_hash(b + r.header_bytes, r.payload_bytes), r.payload_hash);
    char name[40];
    ag_cache_key_name(r.key, name);
    assert_non_null(strstr(p, name));
    /* every header byte matters; a short buffer is refused */
    for (size_t i = 0; i < r.header_bytes; i++) {
        b[i] ^= 1;
        assert_int_equal(ag_cache_record_parse(b, n, &r), AG_ERR_FORMAT);
        b[i] ^= 1;
    }
    for (size_t k = 0; k < AG_CACHE_RECORD_HEADER_BYTES(BS); k++)
        assert_int_equal(ag_cache_record_parse(b, k, &r), AG_ERR_FORMAT);
    assert_int_equal(ag_cache_record_parse(NULL, 0, &r), AG_ERR_FORMAT);
    free(b);
    /* the prompt's 9th token: a partial record of block 1, parent block 0 */
    record_path(dir, t, 1, p, sizeof p);
    b = read_file(p, &n);
    assert_int_equal(ag_cache_record_parse(b, n, &r), AG_OK);
    assert_int_equal(r.block_index, 1);
    assert_int_equal(r.n_tokens, 1);
    assert_int_equal(r.tokens[0], t[8]);
    for (int i = 1; i < BS; i++) assert_int_equal(r.tokens[i], 0);
    char parent_name[40];
    ag_cache_key_name(r.parent, parent_name);
    assert_string_equal(parent_name, name); /* block 0's key */
    assert_int_equal(n, r.header_bytes + r.payload_bytes); /* a whole block's payload */
    free(b);
    ag_kv_free(kv);
}

/* Writes the blocks of tokens[0..n) to dir, through a cache of its own. */
static void put32le(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}

/* Sets the 32-bit header field at off of a record file and seals the
 * header again (its checksum), as a writer would: what is tested is the
 * check behind the checksum. */
static void set_field(const char *path, size_t off, uint32_t v) {
    size_t   n;
    uint8_t *b = read_file(path, &n);
    size_t   hb = AG_CACHE_RECORD_HEADER_BYTES(BS);
    assert_true(n >= hb);
    put32le(b + off, v);
    uint64_t h = XXH3_64bits(b, hb - 8);
    for (int i = 0; i < 8; i++) b[hb - 8 + i] = (uint8_t)(h >> (8 * i));
    write_file(path, b, n);
    free(b);
}

/* Partial records are checked like full ones: a token count of 0 or past
 * the block, a truncated payload, an old format version are dropped at the
 * scan; a bad payload, found at restore, ends the prefix at the full blocks
 * before it. */
static void disk_partial_records_are_checked(void **state) {
    char dir[300];
    subdir(dir, sizeof dir, "partial");
    int32_t t[5][45];
    for (int i = 0; i < 5; i++) {
        make_tokens(t[i], 45, 160 + (uint32_t)i);
        store_prompt(dir, t[i], i < 4 ? 45 : 8); /* 5 full blocks + 5 tokens; the last: 1 block */
    }
    char p[400];
    record_path(dir, t[0], 5, p, sizeof p);
    set_field(p, 128, 0);
    record_path(dir, t[1], 5, p, sizeof p);
    set_field(p, 128, BS + 1);
    record_path(dir, t[2], 5, p, sizeof p);
    size_t n;
    free(read_file(p, &n));
    assert_int_equal(truncate(p, (off_t)n - 10), 0);
    char p4[400];
    record_path(dir, t[3], 5, p4, sizeof p4);
    flip_byte(p4, n - 7);
    record_path(dir, t[4], 0, p, sizeof p);
    set_field(p, 8, 1); /* a version 1 record */
    assert_int_equal(count_files(dir, ".agkv"), 4 * 6 + 1);

    ag_kv    *kv = make_kv(32);
    ag_cache *c = disk_cache(kv, dir, 0);
    ag_cache_flush(c);
    ag_cache_stats st = stats(c);
    assert_int_equal(st.dropped_records, 4);
    assert_int_equal(st.records_on_disk, 4 * 6 + 1 - 4);
    int32_t s = new_seq(kv);
    for (int i = 0; i < 4; i++) {
        assert_int_equal(ag_cache_lookup(c, s, t[i], 45, 44, 0), 40);
        check_seq(kv, s, t[i], 40);
    }
    assert_int_equal(ag_cache_lookup(c, s, t[4], 8, 8, 0), 0);
    st = stats(c);
    assert_int_equal(st.restore_failures, 1);
    assert_int_equal(st.dropped_records, 5);
    assert_false(exists(p4));
    /* the prompt computed again, its partial block is written again */
    prefill(kv, s, t[3], 45);
    assert_int_equal(ag_cache_publish(c, s, t[3], 45, 0), 45);
    ag_kv_seq_free(kv, s);
    ag_cache_flush(c);
    assert_true(exists(p4));
    assert_int_equal(stats(c).records_written, 1);
    ag_cache_free(c);
    ag_kv_free(kv);
}

/* Write-behind is bounded per call, and the writer says when to call again. */
static void write_behind_is_bounded(void **state) {
    char dir[300];
    subdir(dir, sizeof dir, "bounded");
    ag_kv          *kv = make_kv(32);
    ag_cache_params p = ag_cache_default_params();
    p.disk_dir = dir;
    p.disk_sync = false;
    p.background_scan = false;
    size_t rec = record_bytes(kv);
    p.write_queue_bytes = 3 * rec;
    p.notify = on_notify;
    ag_cache *c = NULL;
    assert_int_equal(ag_cache_new(kv, &p, &c), AG_OK);
    assert_true(stats(c).scan_done);
    int32_t t[81];
    make_tokens(t, 81, 110);
    serve_prompt(c, kv, t, 81, 0); /* 10 blocks and 1 token */
    atomic_store(&g_notified, 0);
    int calls = 0;
    for (int guard = 0; guard < 100000 && stats(c).records_written < 11; guard++) {
        ag_cache_idle(c, 2 * rec); /* at most 2 per call, 3 waiting at most */
        calls++;
        if (calls > 50) usleep(1000);
    }
    assert_int_equal(stats(c).records_written, 11);
    assert_true(calls >= 4);
    assert_true(atomic_load(&g_notified) >= 1);
    ag_cache_flush(c);
    assert_int_equal(stats(c).records_on_disk, 11);
    ag_cache_free(c);
    ag_kv_free(kv);
}

/* ---- streamed restores ---------------------------------------------------- */

/* A cache over dir whose reader sleeps delay_us before each record and may
 * hold at most staging_records read records the engine has not taken. */
static ag_cache *slow_disk_cache(ag_kv *kv, const char *dir, uint32_t delay_us, int staging_records) {
    ag_cache_params p = ag_cache_default_params();
    p.model_fingerprint = 11;
    p.tok_fingerprint = 22;
    p.disk_dir = dir;
    p.disk_sync = false;
    p.background_scan = false;
    p.notify = on_notify;
    p.read_delay_us = delay_us;
    p.read_staging_bytes = (size_t)staging_records * record_bytes(kv);
    ag_cache *c = NULL;
    assert_int_equal(ag_cache_new(kv, &p, &c), AG_OK);
    return c;
}

/* Polls r until it is over (the engine's loop, without the engine). */
static int32_t poll_until_done(ag_cache *c, ag_cache_restore *r) {
    int32_t len = -1;
    for (int guard = 0; guard < 20000; guard++) {
        if (ag_cache_restore_poll(c, r, &len)) return len;
        usleep(1000);
    }
    fail_msg("the restore never finished");
    return -1;
}

/* While the reader works through a slow restore, the caller's thread is
 * free: lookup_start returns before any record is read, other sequences
 * are prefilled, published and adopted meanwhile, the reader never runs
 * more than the staging budget ahead of the caller, and the restored prefix
 * holds the right bytes. */
static void disk_restore_streams_while_the_caller_works(void **state) {
    char dir[300];
    subdir(dir, sizeof dir, "stream");
    int32_t t[81], o[41];
    make_tokens(t, 81, 130);
    make_tokens(o, 41, 131);
    store_prompt(dir, t, 81); /* 11 records: 10 full blocks, 1 token */
    ag_kv    *kv = make_kv(32);
    const uint32_t delay_us = 20000;
    ag_cache *c = slow_disk_cache(kv, dir, delay_us, 2);
    const size_t rec = record_bytes(kv);
    assert_int_equal(stats(c).records_on_disk, 11);
    int32_t           s = new_seq(kv);
    ag_cache_restore *r = NULL;
    atomic_store(&g_notified, 0);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    assert_int_equal(ag_cache_lookup_start(c, s, t, 81, 80, 0, &r), 0);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    assert_non_null(r);
    double start_ms = (t1.tv_sec - t0.tv_sec) * 1e3 + (t1.tv_nsec - t0.tv_nsec) / 1e6;
    assert_true(start_ms < delay_us / 1000.0); /* it did not wait for a record */
    assert_int_equal(ag_kv_seq_len(kv, s), 0);
    assert_int_equal(stats(c).restores_pending, 1);
    int32_t len = -1;
    assert_false(ag_cache_restore_poll(c, r, &len)); /* the first record is still sleeping */

    /* the caller's other work goes on meanwhile */
    serve_prompt(c, kv, o, 41, 0);
    int32_t s2 = new_seq(kv);
    assert_int_equal(ag_cache_lookup(c, s2, o, 41, 40, 0), 40); /* from memory: no wait behind the reader */
    check_seq(kv, s2, o, 40);
    ag_kv_seq_free(kv, s2);

    /* the reader stops at the staging budget (2 records) until they are taken */
    usleep(8 * delay_us);
    assert_true(stats(c).bytes_read <= 2 * rec);
    assert_true(stats(c).bytes_read >= 1 * rec);
    assert_true(atomic_load(&g_notified) >= 1);

    len = poll_until_done(c, r);
    assert_int_equal(len, 80);
    assert_int_equal(ag_kv_seq_len(kv, s), 80);
    check_seq(kv, s, t, 80);
    ag_cache_stats st = stats(c);
    assert_int_equal(st.restores_pending, 0);
    assert_int_equal(st.tokens_from_disk, 80);
    assert_int_equal(st.bytes_read, 10 * rec);
    assert_true(st.restore_ns >= 10ull * delay_us * 1000);
    assert_int_equal(st.memory_blocks, 10 + 6);
    ag_kv_seq_free(kv, s);
    ag_cache_free(c);
    ag_kv_free(kv);
}

/* A restore abandoned half-way (its client hung up) gives back every block
 * a sequence would hold and all staging, whether the reader is in the
 * middle of a record or not; the blocks already copied in stay in the
 * memory tier, reclaimable; later restores work. */
static void disk_restore_cancel_gives_everything_back(void **state) {
    char dir[300];
    subdir(dir, sizeof dir, "cancel");
    int32_t t[81];
    make_tokens(t, 81, 140);
    store_prompt(dir, t, 81);
    ag_kv    *kv = make_kv(32);
    const uint32_t delay_us = 20000;
    ag_cache *c = slow_disk_cache(kv, dir, delay_us, 3);
    /* blocks 0-1 come back to memory first: the restore below then holds
     * memory blocks as well as reading records */
    int32_t s = new_seq(kv);
    assert_int_equal(ag_cache_lookup(c, s, t, 17, 16, 0), 16);
    ag_kv_seq_free(kv, s);
    assert_int_equal(kv_used(kv), 2);

    s = new_seq(kv);
    ag_cache_restore *r = NULL;
    assert_int_equal(ag_cache_lookup_start(c, s, t, 81, 80, 0, &r), 0);
    assert_non_null(r);
    const size_t rec = record_bytes(kv), read_before = stats(c).bytes_read;
    for (int guard = 0; guard < 5000 && stats(c).bytes_read < read_before + 2 * rec; guard++) usleep(1000);
    int32_t len;
    assert_false(ag_cache_restore_poll(c, r, &len)); /* 2 or 3 of 8 records read: copied in */
    int32_t copied = stats(c).memory_blocks - 2;
    assert_true(copied >= 2 && copied < 8);
    assert_int_equal(ag_cache_reclaimable(c), 0); /* the restore holds every one of them */
    ag_cache_restore_cancel(c, r);
    ag_cache_stats st = stats(c);
    assert_int_equal(st.restores_pending, 0);
    assert_int_equal(st.restores_cancelled, 1);
    assert_int_equal(ag_kv_seq_len(kv, s), 0);
    /* nothing is held but by the memory tier, and all of that is reclaimable */
    assert_int_equal(kv_used(kv), st.memory_blocks);
    assert_int_equal(ag_cache_reclaimable(c), st.memory_blocks);

    /* cancelled while the reader sleeps before its first record */
    int32_t u[81];
    memcpy(u, t, sizeof u);
    ag_cache_evict(c, 100);
    assert_int_equal(kv_used(kv), 0);
    r = NULL;
    assert_int_equal(ag_cache_lookup_start(c, s, u, 81, 80, 0, &r), 0);
    assert_non_null(r);
    ag_cache_restore_cancel(c, r);
    assert_int_equal(kv_used(kv), 0);

    /* the reader moved on: a restore of the whole prompt works */
    assert_int_equal(ag_cache_lookup(c, s, t, 81, 80, 0), 80);
    check_seq(kv, s, t, 80);
    assert_int_equal(stats(c).restores_cancelled, 2);
    ag_kv_seq_free(kv, s);
    ag_cache_free(c);
    ag_kv_free(kv);
}

/* Two requests restoring the same prefix at once end up sharing the same
 * kv blocks (the second one's copies are dropped), both with the right
 * bytes. */
static void concurrent_restores_share_blocks(void **state) {
    char dir[300];
    subdir(dir, sizeof dir, "concurrent");
    int32_t t[49];
    make_tokens(t, 49, 150);
    store_prompt(dir, t, 49); /* 7 records: 6 full blocks, 1 token */
    ag_kv            *kv = make_kv(32);
    ag_cache         *c = slow_disk_cache(kv, dir, 2000, 4);
    int32_t           a = new_seq(kv), b = new_seq(kv);
    ag_cache_restore *ra = NULL, *rb = NULL;
    assert_int_equal(ag_cache_lookup_start(c, a, t, 49, 48, 0, &ra), 0);
    assert_int_equal(ag_cache_lookup_start(c, b, t, 49, 48, 0, &rb), 0);
    assert_non_null(ra);
    assert_non_null(rb);
    assert_int_equal(stats(c).restores_pending, 2);
    assert_int_equal(poll_until_done(c, ra), 48);
    assert_int_equal(poll_until_done(c, rb), 48);
    check_seq(kv, a, t, 48);
    check_seq(kv, b, t, 48);
    int32_t        na, nb;
    const int32_t *ta = ag_kv_seq_blocks(kv, a, &na), *tb = ag_kv_seq_blocks(kv, b, &nb);
    assert_int_equal(na, 6);
    assert_int_equal(nb, 6);
    assert_memory_equal(ta, tb, 6 * sizeof(int32_t));
    assert_int_equal(kv_used(kv), 6);
    ag_cache_stats st = stats(c);
    assert_int_equal(st.tokens_from_disk, 96);
    assert_int_equal(st.hits, 2);
    ag_kv_seq_free(kv, a);
    ag_kv_seq_free(kv, b);
    ag_cache_free(c);
    ag_kv_free(kv);
}

/* ---- a real model -------------------------------------------------------- */

static void model_prefix_reuse_gives_identical_logits(void **state) {
    char path[4096];
    stories_path(path, sizeof path);
    ag_model *m = NULL, *m2 = NULL;
    if (load_model_2t(path, &m, NULL)) skip();
    assert_int_equal(load_model_2t(path, &m2, NULL), 0);
    uint64_t fp = ag_model_fingerprint(m);
    assert_true(fp != 0);
    assert_int_equal(fp, ag_model_fingerprint(m2)); /* stable across loads */
    ag_model_free(m2);
    const int nv = ag_model_config_of(m)->n_vocab;
    static const int32_t toks[] = {1,   403, 407, 261, 378, 418, 268, 300, 263, 432, 270, 315, 280, 260, 343,
                                   443, 300, 362, 430, 272, 336, 279, 282, 316, 300, 263, 432, 270, 315, 280,
                                   260, 343, 443, 300, 362, 430, 272, 336, 279, 282, 316, 300, 263, 432, 270};
    const int n = (int)(sizeof toks / sizeof toks[0]);
    char      dir[300];
    subdir(dir, sizeof dir, "model");
    float *cold = malloc(sizeof(float) * nv), *warm = malloc(sizeof(float) * nv);
    for (int round = 0; round < 2; round++) { /* 0: memory tier, 1: after a "restart" (disk) */
        ag_kv_params kp = ag_kv_default_params();
        ag_model_kv_shape(m, &kp.n_layers, &kp.n_kv_heads, &kp.head_dim_k, &kp.head_dim_v);
        kp.block_size = 8;
        kp.max_seqs = 4;
        kp.budget_bytes = (size_t)4 << 20;
        ag_kv *kv = NULL;
        assert_int_equal(ag_kv_init(&kp, &kv), AG_OK);
        ag_cache_params cp = ag_cache_default_params();
        cp.model_fingerprint = fp;
        cp.disk_dir = dir;
        cp.disk_sync = false;
        ag_cache *c = NULL;
        assert_int_equal(ag_cache_new(kv, &cp, &c), AG_OK);
        ag_cache_flush(c);
        int32_t pos[64], seqs[64];
        for (int pass = round; pass < 2; pass++) { /* pass 0 cold, pass 1 warm */
            int32_t s;
            assert_int_equal(ag_kv_seq_new(kv, &s), AG_OK);
            /* warm: 5 full blocks and 4 of the 5 tokens of the partial
             * sixth; the last token is computed, in a copy of that block */
            int32_t from = ag_cache_lookup(c, s, toks, n, n - 1, 0);
            assert_int_equal(from, pass == 0 ? 0 : n - 1);
            int k = n - from;
            for (int i = 0; i < k; i++) {
                pos[i] = from + i;
                seqs[i] = s;
            }
            ag_batch b = {.n = k, .token = toks + from, .pos = pos, .seq = seqs, .want_logits = NULL, .n_prompt = k};
            assert_int_equal(ag_kv_seq_reserve(kv, s, k), AG_OK);
            assert_int_equal(ag_model_forward(m, kv, &b, pass == 0 ? cold : warm), AG_OK);
            assert_int_equal(ag_kv_seq_commit(kv, s, n), AG_OK);
            ag_cache_publish(c, s, toks, n, 0);
            ag_kv_seq_free(kv, s);
        }
        assert_memory_equal(warm, cold, sizeof(float) * nv); /* bit for bit */
        if (round == 1) assert_int_equal(stats(c).tokens_from_disk, n - 1);
        ag_cache_flush(c);
        ag_cache_free(c);
        ag_kv_free(kv);
    }
    free(cold);
    free(warm);
    ag_model_free(m);
}


/* ---- a kv with a sliding-window ring (kv.h) ---- */

/* Layers 0 and 2 windowed (RW positions), 1 global. */
enum { RL = 3, RW = 20 };
static const int32_t k_rwin[RL] = {RW, 0, RW};

static ag_kv *make_ring_kv(void) {
    ag_kv_params p = ag_kv_default_params();
    p.n_layers = RL;
    p.n_kv_heads = NH;
    p.head_dim_k = DK;
    p.head_dim_v = DV;
    p.block_size = BS;
    p.dtype = AG_KV_F16;
    p.max_seqs = 8;
    p.layer_window = k_rwin;
    p.ring = true;
    p.ring_slack = 0;
    p.ring_step = BS;
    p.ring_blocks = 64;
    p.budget_bytes = (size_t)1 << 20;
    ag_kv *kv = NULL;
    assert_int_equal(ag_kv_init(&p, &kv), AG_OK);
    assert_int_equal(ag_kv_get_layout(kv)->n_ring_layers, 2);
    return kv;
}

/* Prefills [len, n) of seq a block at a time, publishing the whole blocks
 * after each (as the engine does for a ring model) when publish is set. */
static void ring_prefill(ag_kv *kv, ag_cache *c, int32_t seq, const int32_t *tokens, int32_t n, bool publish) {
    float k[NH * DK], v[NH * DV];
    for (int32_t len = ag_kv_seq_len(kv, seq); len < n;) {
        int32_t step = n - len < BS ? n - len : BS;
        assert_int_equal(ag_kv_seq_reserve(kv, seq, step), AG_OK);
        for (int32_t p = len; p < len + step; p++)
            for (int l = 0; l < RL; l++) {
                fill(stamp_of(tokens, p), l, k, v);
                assert_int_equal(ag_kv_write(kv, l, seq, p, k, v), AG_OK);
            }
        len += step;
        assert_int_equal(ag_kv_seq_commit(kv, seq, len), AG_OK);
        if (publish) ag_cache_publish(c, seq, tokens, len - len % BS, 0);
    }
}

/* What a query at len reads of seq: every position of the global layer,
 * the window before len of the windowed ones. */
static void ring_check_seq(const ag_kv *kv, int32_t seq, const int32_t *tokens) {
    const int32_t len = ag_kv_seq_len(kv, seq);
    float k[NH * DK], v[NH * DV], ek[NH * DK], ev[NH * DV];
    for (int32_t p = 0; p < len; p++)
        for (int l = 0; l < RL; l++) {
            if (l != 1 && p < len - RW + 1) continue;
            fill(stamp_of(tokens, p), l, ek, ev);
            assert_int_equal(ag_kv_read(kv, l, seq, p, k, v), AG_OK);
            for (int i = 0; i < NH * DK; i++) assert_true(k[i] == ek[i]);
            for (int i = 0; i < NH * DV; i++) assert_true(v[i] == ev[i]);
        }
}

static void ring_lookup_resumes_only_where_the_window_is_cached(void **state) {
    (void)state;
    ag_kv    *kv = make_ring_kv();
    ag_cache *c = mem_cache(kv);
    int32_t   a[64], b[64], s;
    for (int i = 0; i < 64; i++) a[i] = b[i] = 100 + i;
    for (int i = 30; i < 64; i++) b[i] = 900 + i; /* b shares a's first 30 tokens */

    /* published chunk by chunk: every block keeps its ring block in the cache */
    assert_int_equal(ag_kv_seq_new(kv, &s), AG_OK);
    ring_prefill(kv, c, s, a, 64, true);
    assert_int_equal(ag_kv_seq_free(kv, s), AG_OK);
    assert_int_equal(ag_kv_seq_new(kv, &s), AG_OK);
    assert_int_equal(ag_cache_lookup(c, s, b, 64, 63, 0), 30); /* mid-block: its window is all there */
    ring_check_seq(kv, s, b);
    ring_prefill(kv, c, s, b, 64, false);
    ring_check_seq(kv, s, b);
    assert_int_equal(ag_kv_seq_free(kv, s), AG_OK);
    ag_cache_free(c);

    /* published only at the end: the ring kept the last blocks' alone */
    c = mem_cache(kv);
    assert_int_equal(ag_kv_seq_new(kv, &s), AG_OK);
    ring_prefill(kv, c, s, a, 64, false);
    ag_cache_publish(c, s, a, 64, 0);
    int32_t rn, first;
    ag_kv_seq_ring_blocks(kv, s, &rn, &first);
    assert_true(first > 1);
    assert_int_equal(ag_kv_seq_free(kv, s), AG_OK);
    /* b's 30 shared tokens need the ring blocks of [11, 30): gone, and so
     * are those of every shorter prefix: nothing is adopted (rather than a
     * prefix that the ring could not resume) */
    assert_int_equal(ag_kv_seq_new(kv, &s), AG_OK);
    assert_int_equal(ag_cache_lookup(c, s, b, 64, 63, 0), 0);
    assert_int_equal(ag_kv_seq_len(kv, s), 0);
    /* a itself: its last 63 positions' window is cached */
    assert_int_equal(ag_cache_lookup(c, s, a, 64, 63, 0), 63);
    ring_check_seq(kv, s, a);
    /* a prompt that leaves a where its window's ring blocks are cached
     * resumes there (inside a block); one that leaves it earlier, where the
     * window reaches blocks the ring had let go, resumes nowhere */
    int32_t x[64];
    memcpy(x, a, sizeof x);
    x[55] = 7;
    assert_int_equal(ag_cache_lookup(c, s, x, 64, 63, 0), 55);
    ring_check_seq(kv, s, x);
    memcpy(x, a, sizeof x);
    x[50] = 7; /* its window [31, 50) starts in block 3: gone */
    assert_int_equal(ag_cache_lookup(c, s, x, 64, 63, 0), 0);
    assert_int_equal(ag_kv_seq_free(kv, s), AG_OK);
    ag_cache_free(c);

    /* a longer match that cannot be resumed loses to a shorter one that
     * can: a 60-token prompt published chunk by chunk, then decoded on (the
     * ring moves on), then its trailing partial block published, without its
     * ring block (gone by then) */
    c = mem_cache(kv);
    assert_int_equal(ag_kv_seq_new(kv, &s), AG_OK);
    int32_t y[100];
    for (int i = 0; i < 100; i++) y[i] = 300 + i;
    ring_prefill(kv, c, s, y, 60, true);
    ring_prefill(kv, c, s, y, 100, false);
    ag_cache_publish(c, s, y, 60, 0);
    assert_int_equal(ag_kv_seq_free(kv, s), AG_OK);
    assert_int_equal(ag_kv_seq_new(kv, &s), AG_OK);
    assert_int_equal(ag_cache_lookup(c, s, y, 60, 59, 0), 56); /* not 59: block 7's ring is not cached */
    ring_check_seq(kv, s, y);
    assert_int_equal(ag_kv_seq_free(kv, s), AG_OK);
    ag_cache_free(c);
    ag_kv_stats st;
    ag_kv_get_stats(kv, &st);
    assert_int_equal(st.blocks_free, st.n_blocks);
    assert_int_equal(st.ring_blocks_free, st.ring_blocks);
    ag_kv_free(kv);
}

/* ---- the host tier ------------------------------------------------------ */

/* A cache with a host tier of host_blocks blocks (and a disk tier in dir,
 * when not NULL; the scan done before it returns). */
static ag_cache *host_cache(ag_kv *kv, const char *dir, int32_t host_blocks, int read_threads) {
    ag_cache_params p = ag_cache_default_params();
    p.model_fingerprint = 11;
    p.tok_fingerprint = 22;
    p.disk_dir = dir;
    p.disk_sync = false;
    p.background_scan = false;
    p.notify = on_notify;
    p.host_max_bytes = (uint64_t)host_blocks * NL * ag_kv_block_bytes(kv) + 7; /* (rounded down to blocks) */
    if (read_threads) p.read_threads = read_threads;
    ag_cache *c = NULL;
    assert_int_equal(ag_cache_new(kv, &p, &c), AG_OK);
    return c;
}

/* Blocks evicted from the pool go to the host tier (through the kv's host
 * allocations: pinned ones on a GPU), and a lookup copies them back: the
 * bytes of a prefill, counted as host hits, with no disk at all. */
static void host_tier_restores_identical_bytes(void **state) {
    static const ag_kv_mem mem = {NULL, fake_alloc, fake_free, fake_copy, fake_copy, fake_copy, fake_host_alloc,
                                  fake_host_free};
    atomic_store(&g_host_allocs, 0);
    atomic_store(&g_host_frees, 0);
    ag_kv    *kv = make_kv_mem(8, DV, &mem); /* "device" memory: only the hooks touch it */
    ag_cache *c = host_cache(kv, NULL, 16, 0);
    const size_t cb = ag_kv_block_bytes(kv);
    int32_t   t[45];
    make_tokens(t, 45, 40);
    int32_t s = new_seq(kv);
    prefill(kv, s, t, 45);
    assert_int_equal(ag_cache_publish(c, s, t, 45, 0), 45);
    uint8_t       *before = malloc(6 * NL * cb), *after = malloc(NL * cb);
    int32_t        n;
    const int32_t *tb = ag_kv_seq_blocks(kv, s, &n);
    for (int i = 0; i < 6; i++) copy_out_block(kv, tb[i], before + (size_t)i * NL * cb);
    ag_kv_seq_free(kv, s);
    ag_cache_stats st = stats(c);
    assert_int_equal(st.host_max_bytes, 16 * NL * cb);
    assert_int_equal(st.host_blocks, 0);
    /* the pool lets them go: into the host tier */
    assert_int_equal(ag_cache_evict(c, 100), 6);
    assert_int_equal(kv_used(kv), 0);
    st = stats(c);
    assert_int_equal(st.memory_blocks, 0);
    assert_int_equal(st.host_blocks, 6);
    assert_int_equal(st.host_bytes, 6 * NL * cb);
    assert_true(atomic_load(&g_host_allocs) >= 1);
    /* and back */
    s = new_seq(kv);
    assert_int_equal(ag_cache_lookup(c, s, t, 45, 44, 0), 44);
    check_seq(kv, s, t, 44);
    tb = ag_kv_seq_blocks(kv, s, &n);
    assert_int_equal(n, 6);
    for (int i = 0; i < 6; i++) {
        copy_out_block(kv, tb[i], after);
        assert_memory_equal(after, before + (size_t)i * NL * cb, NL * cb);
    }
    st = stats(c);
    assert_int_equal(st.tokens_from_host, 44);
    assert_int_equal(st.tokens_from_memory, 0);
    assert_int_equal(st.hits_host, 1);
    assert_int_equal(st.hits_memory, 0);
    assert_int_equal(st.hits_disk, 0);
    assert_int_equal(st.host_blocks, 0); /* a block is in the pool or the host tier, not both */
    assert_int_equal(st.memory_blocks, 6);
    ag_kv_seq_free(kv, s);
    /* again: now from the pool */
    s = new_seq(kv);
    assert_int_equal(ag_cache_lookup(c, s, t, 45, 44, 0), 44);
    check_seq(kv, s, t, 44);
    st = stats(c);
    assert_int_equal(st.hits_memory, 1);
    assert_int_equal(st.tokens_from_memory, 44);
    ag_kv_seq_free(kv, s);
    free(before);
    free(after);
    ag_cache_free(c);
    assert_int_equal(atomic_load(&g_host_frees), atomic_load(&g_host_allocs));
    ag_kv_free(kv);
}

/* A host tier smaller than what the pool lets go keeps to its bound: its
 * least recently evicted blocks go on to the disk (queued as they leave,
 * not written before), the rest stay in host memory; a lookup then takes
 * both (host and disk hits), and a restart, with no host tier left,
 * restores everything from the disk. A pool evicting into a full host tier
 * with the disk off loses the oldest blocks, as the pool alone did. */
static void host_tier_cascades_to_disk_within_its_bound(void **state) {
    char dir[300];
    subdir(dir, sizeof dir, "host-cascade");
    int32_t t[45];
    make_tokens(t, 45, 41);
    {
        ag_kv    *kv = make_kv(8);
        ag_cache *c = host_cache(kv, dir, 3, 0);
        const size_t cb = ag_kv_block_bytes(kv);
        int32_t s = new_seq(kv);
        prefill(kv, s, t, 45);
        ag_cache_publish(c, s, t, 45, 0);
        ag_kv_seq_free(kv, s);
        assert_int_equal(stats(c).records_written, 0); /* (no idle call: nothing written behind yet) */
        assert_int_equal(ag_cache_evict(c, 100), 6);
        ag_cache_stats st = stats(c);
        assert_int_equal(st.host_blocks, 3);
        assert_true(st.host_bytes <= st.host_max_bytes);
        assert_int_equal(st.host_max_bytes, 3 * NL * cb);
        assert_int_equal(st.evictions_host, 3);
        assert_int_equal(st.host_to_disk, 3);
        /* the pool evicted leaves first (blocks 5, 4, 3), which the host tier then let go to the
         * writer; a flush writes them, and the other three from their host slots */
        ag_cache_flush(c);
        st = stats(c);
        assert_int_equal(st.records_written, 6);
        assert_int_equal(st.host_blocks, 3);
        s = new_seq(kv);
        assert_int_equal(ag_cache_lookup(c, s, t, 45, 44, 0), 44);
        check_seq(kv, s, t, 44);
        st = stats(c);
        assert_int_equal(st.tokens_from_host, 24);
        assert_int_equal(st.tokens_from_disk, 20);
        assert_int_equal(st.hits_host, 1);
        assert_int_equal(st.hits_disk, 1);
        assert_int_equal(st.host_blocks, 0);
        ag_kv_seq_free(kv, s);
        /* evicted again: all on disk, so the host tier's overflow is just dropped */
        assert_int_equal(ag_cache_evict(c, 100), 6);
        st = stats(c);
        assert_int_equal(st.host_blocks, 3);
        assert_int_equal(st.host_to_disk, 3);
        ag_cache_flush(c);
        st = stats(c);
        assert_int_equal(st.records_on_disk, 6);
        assert_int_equal(st.records_written, 6);
        ag_cache_free(c);
        ag_kv_free(kv);
    }
    /* a restart: the host tier is gone, the disk serves */
    {
        ag_kv    *kv = make_kv(8);
        ag_cache *c = host_cache(kv, dir, 3, 0);
        assert_int_equal(stats(c).host_blocks, 0);
        int32_t s = new_seq(kv);
        assert_int_equal(ag_cache_lookup(c, s, t, 45, 44, 0), 44);
        check_seq(kv, s, t, 44);
        assert_int_equal(stats(c).tokens_from_disk, 44);
        ag_kv_seq_free(kv, s);
        ag_cache_free(c);
        ag_kv_free(kv);
    }
    /* a corrupt record is still dropped: the prefix ends before it */
    {
        char path[600];
        record_path(dir, t, 3, path, sizeof path);
        flip_byte(path, AG_CACHE_RECORD_HEADER_BYTES(BS) + 5); /* its payload */
        ag_kv    *kv = make_kv(8);
        ag_cache *c = host_cache(kv, dir, 3, 0);
        int32_t   s = new_seq(kv);
        assert_int_equal(ag_cache_lookup(c, s, t, 45, 44, 0), 3 * BS);
        check_seq(kv, s, t, 3 * BS);
        assert_int_equal(stats(c).dropped_records, 1);
        assert_false(exists(path));
        ag_kv_seq_free(kv, s);
        ag_cache_free(c);
        ag_kv_free(kv);
    }
    /* no disk: the host tier's oldest blocks are lost, the rest still hit */
    {
        ag_kv    *kv = make_kv(8);
        ag_cache *c = host_cache(kv, NULL, 3, 0);
        serve_prompt(c, kv, t, 45, 0);
        assert_int_equal(ag_cache_evict(c, 100), 6);
        ag_cache_stats st = stats(c);
        assert_int_equal(st.host_blocks, 3);
        assert_int_equal(st.host_to_disk, 0);
        assert_int_equal(st.index_nodes, 3);
        int32_t s = new_seq(kv);
        assert_int_equal(ag_cache_lookup(c, s, t, 45, 44, 0), 3 * BS);
        check_seq(kv, s, t, 3 * BS);
        ag_kv_seq_free(kv, s);
        /* a pool too small for a lookup's blocks: it copies in what it can */
        ag_cache_free(c);
        ag_kv_free(kv);
    }
    rm_rf(dir);
}

/* Restores read by 8 threads at once (through a staging window of 3
 * records) give the bytes one reader gives, the bytes that were written. */
static void parallel_readers_restore_the_same_bytes(void **state) {
    char dir[300];
    subdir(dir, sizeof dir, "parallel-read");
    enum { N = 200 }; /* 25 blocks */
    int32_t t[N];
    make_tokens(t, N, 42);
    {
        ag_kv    *kv = make_kv(40);
        ag_cache *c = disk_cache(kv, dir, 0);
        serve_prompt(c, kv, t, N, 0);
        ag_cache_flush(c);
        ag_cache_free(c);
        ag_kv_free(kv);
    }
    uint8_t *got[2];
    size_t   cb = 0;
    for (int k = 0; k < 2; k++) {
        ag_kv          *kv = make_kv(40);
        ag_cache_params p = ag_cache_default_params();
        p.model_fingerprint = 11;
        p.tok_fingerprint = 22;
        p.disk_dir = dir;
        p.disk_sync = false;
        p.background_scan = false;
        p.read_threads = k == 0 ? 1 : 8;
        p.read_staging_bytes = 3 * record_bytes(kv);
        ag_cache *c = NULL;
        assert_int_equal(ag_cache_new(kv, &p, &c), AG_OK);
        cb = ag_kv_block_bytes(kv);
        int32_t s = new_seq(kv);
        assert_int_equal(ag_cache_lookup(c, s, t, N, N - 1, 0), N - 1);
        check_seq(kv, s, t, N - 1);
        int32_t        n;
        const int32_t *tb = ag_kv_seq_blocks(kv, s, &n);
        assert_int_equal(n, 25);
        got[k] = malloc(25 * NL * cb);
        for (int i = 0; i < 25; i++) copy_out_block(kv, tb[i], got[k] + (size_t)i * NL * cb);
        assert_int_equal(stats(c).tokens_from_disk, N - 1);
        ag_kv_seq_free(kv, s);
        ag_cache_free(c);
        ag_kv_free(kv);
    }
    assert_memory_equal(got[0], got[1], 25 * NL * cb);
    free(got[0]);
    free(got[1]);
    rm_rf(dir);
}

/* A sliding-window kv's blocks move to the host tier with their ring
 * blocks' layers, and come back with them: the window is resumed. */
static void host_tier_keeps_the_ring_layers(void **state) {
    (void)state;
    ag_kv          *kv = make_ring_kv();
    ag_cache_params p = ag_cache_default_params();
    p.model_fingerprint = 11;
    p.tok_fingerprint = 22;
    p.host_max_bytes = (uint64_t)64 * RL * ag_kv_block_bytes(kv);
    ag_cache *c = NULL;
    assert_int_equal(ag_cache_new(kv, &p, &c), AG_OK);
    int32_t a[64], b[64], s;
    for (int i = 0; i < 64; i++) a[i] = b[i] = 100 + i;
    for (int i = 30; i < 64; i++) b[i] = 900 + i;
    assert_int_equal(ag_kv_seq_new(kv, &s), AG_OK);
    ring_prefill(kv, c, s, a, 64, true);
    assert_int_equal(ag_kv_seq_free(kv, s), AG_OK);
    assert_int_equal(ag_cache_evict(c, 100), 8);
    assert_int_equal(stats(c).host_blocks, 8);
    ag_kv_stats ks;
    ag_kv_get_stats(kv, &ks);
    assert_int_equal(ks.ring_blocks_free, ks.ring_blocks);
    assert_int_equal(ag_kv_seq_new(kv, &s), AG_OK);
    assert_int_equal(ag_cache_lookup(c, s, b, 64, 63, 0), 30);
    ring_check_seq(kv, s, b);
    ring_prefill(kv, c, s, b, 64, false);
    ring_check_seq(kv, s, b);
    assert_int_equal(ag_kv_seq_free(kv, s), AG_OK);
    assert_int_equal(stats(c).tokens_from_host, 30);
    ag_cache_free(c);
    ag_kv_get_stats(kv, &ks);
    assert_int_equal(ks.blocks_free, ks.n_blocks);
    assert_int_equal(ks.ring_blocks_free, ks.ring_blocks);
    ag_kv_free(kv);
}

int main(void) {
    ag_log_set_level(getenv("DBG") ? AG_LOG_DEBUG : AG_LOG_ERROR); /* the drops and failures below are meant to warn */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(publish_then_lookup_shares_the_bytes),
        cmocka_unit_test(publish_only_prompt_positions),
        cmocka_unit_test(shared_system_prompt_across_conversations),
        cmocka_unit_test(namespaces_isolate),
        cmocka_unit_test(colliding_keys_never_give_wrong_kv),
        cmocka_unit_test(eviction_is_lru_by_leaf_and_spares_held_blocks),
        cmocka_unit_test(same_prompt_again_adopts_all_but_one_token),
        cmocka_unit_test(siblings_pick_the_longest_common_run),
        cmocka_unit_test(disk_restart_restores_identical_bytes),
        cmocka_unit_test(disk_restore_stages_in_pinned_buffers),
        cmocka_unit_test(disk_restore_under_pool_pressure),
        cmocka_unit_test(disk_scan_drops_bad_records),
        cmocka_unit_test(disk_failed_restore_deletes_and_falls_back),
        cmocka_unit_test(disk_byte_cap_evicts_lru_leaves),
        cmocka_unit_test(disk_cap_counts_queued_writes),
        cmocka_unit_test(disk_two_caches_share_a_directory),
        cmocka_unit_test(disk_dir_impossible_turns_tier_off),
        cmocka_unit_test(disk_full_pauses_writing_then_resumes),
        cmocka_unit_test(disk_real_full_and_read_only_filesystems),
        cmocka_unit_test(record_parse_checks_everything),
        cmocka_unit_test(disk_partial_records_are_checked),
        cmocka_unit_test(write_behind_is_bounded),
        cmocka_unit_test(disk_restore_streams_while_the_caller_works),
        cmocka_unit_test(disk_restore_cancel_gives_everything_back),
        cmocka_unit_test(concurrent_restores_share_blocks),
        cmocka_unit_test(model_prefix_reuse_gives_identical_logits),
        cmocka_unit_test(ring_lookup_resumes_only_where_the_window_is_cached),
        cmocka_unit_test(host_tier_restores_identical_bytes),
        cmocka_unit_test(host_tier_cascades_to_disk_within_its_bound),
        cmocka_unit_test(parallel_readers_restore_the_same_bytes),
        cmocka_unit_test(host_tier_keeps_the_ring_layers),
    };
    return cmocka_run_group_tests(tests, disk_setup, disk_teardown);
}
