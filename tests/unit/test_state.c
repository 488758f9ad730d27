/* Unit tests for src/kv/state: the recurrent state slots as the paged KV
 * keeps them in step with its sequences (new, fork, trim by snapshot,
 * adopt refused, swap). The "model" here writes a known value (the length
 * reached) into every float of a layer's state and its snapshot, as the
 * model's decode rows do, so every restore is checked against what the
 * test knows it wrote. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "kv/kv.h"
#include "kv/state.h"

enum { NL = 2, CONV = 3, SSM = 5, SNAP = 4 };

/* A stand-in device memory (host bytes behind the ag_kv_mem hooks, as a
 * GPU's pool would be reached): the second group runs every test with the
 * state (and the pool) there and checks that its copies went through the
 * hooks. */
static int g_copies, g_to_host, g_from_host;
static void *sd_alloc(void *ctx, size_t bytes) { return calloc(1, bytes); }
static void  sd_free(void *ctx, void *p) { free(p); }
static int   sd_copy(void *ctx, void *dst, const void *src, size_t n) {
    g_copies++;
    memcpy(dst, src, n);
    return 0;
}
static int sd_to_host(void *ctx, void *host, const void *src, size_t n) {
    g_to_host++;
    memcpy(host, src, n);
    return 0;
}
static int sd_from_host(void *ctx, void *dst, const void *host, size_t n) {
    g_from_host++;
    memcpy(dst, host, n);
    return 0;
}
static const ag_kv_mem k_stand_in = {NULL, sd_alloc, sd_free, sd_copy, sd_to_host, sd_from_host, NULL, NULL};
static const ag_kv_mem *g_mem;
static int              use_host(void **unused) {
    (void)unused;
    g_mem = NULL;
    return 0;
}
static int use_stand_in(void **unused) {
    (void)unused;
    g_mem = &k_stand_in;
    return 0;
}

static ag_kv *make_kv(void) {
    ag_kv_params p = ag_kv_default_params();
    p.n_layers = 1;
    p.n_kv_heads = 1;
    p.head_dim_k = p.head_dim_v = 4;
    p.block_size = 8;
    p.dtype = AG_KV_F32;
    p.max_seqs = 4;
    p.budget_bytes = 1 << 16;
    p.state_layers = NL;
    p.state_conv_floats = CONV;
    p.state_ssm_floats = SSM;
    p.state_snapshots = SNAP;
    p.mem = g_mem;
    ag_kv *kv = NULL;
    assert_int_equal(ag_kv_init(&p, &kv), AG_OK);
    assert_non_null(ag_kv_state(kv));
    return kv;
}

/* n positions through seq as a pass would: decode rows snapshot each. */
static void step(ag_kv *kv, int32_t seq, int n, int decode) {
    ag_state *st = ag_kv_state(kv);
    int32_t   len = ag_kv_seq_len(kv, seq);
    assert_int_equal(ag_state_check(st, seq, len), AG_OK);
    assert_int_equal(ag_kv_seq_reserve(kv, seq, n), AG_OK);
    for (int t = 0; t < n; t++)
        for (int l = 0; l < NL; l++) {
            float *cur = ag_state_layer(st, seq, l);
            for (int i = 0; i < CONV + SSM; i++) cur[i] = (float)(len + t + 1) + 0.5f * l + 0.01f * seq;
            const int last = t == n - 1 && !ag_state_snap_last(st);
            float    *snap = decode && !last ? ag_state_snap_slot(st, seq, l, len + t) : NULL;
            if (snap) memcpy(snap, cur, sizeof(float) * (CONV + SSM));
        }
    ag_state_advance(st, seq, len + n, len + 1, decode ? len + n - (ag_state_snap_last(st) ? 0 : 1) : len);
    assert_int_equal(ag_kv_seq_commit(kv, seq, len + n), AG_OK);
}

static void expect(ag_kv *kv, int32_t seq, int32_t len, int32_t as_seq) {
    ag_state *st = ag_kv_state(kv);
    assert_int_equal(ag_state_len(st, seq), len);
    assert_int_equal(ag_kv_seq_len(kv, seq), len);
    for (int l = 0; l < NL; l++)
        for (int i = 0; i < CONV + SSM; i++)
            assert_float_equal(ag_state_layer(st, seq, l)[i], len == 0 ? 0.0f : len + 0.5f * l + 0.01f * as_seq,
                               1e-6);
}

static void prompt_rows_cannot_trim_decode_rows_can(void **unused) {
    (void)unused;
    ag_kv  *kv = make_kv();
    int32_t s;
    assert_int_equal(ag_kv_seq_new(kv, &s), AG_OK);
    expect(kv, s, 0, s);
    step(kv, s, 10, 0); /* a prompt chunk: nothing to restore */
    assert_int_equal(ag_kv_state_trim_limit(kv, s), 0);
    assert_true(ag_kv_trimmable(kv, s, 0));
    assert_false(ag_kv_trimmable(kv, s, 1));
    assert_int_equal(ag_kv_trim(kv, s, 1), AG_ERR_UNSUPPORTED);
    expect(kv, s, 10, s);
    step(kv, s, 3, 1); /* a verify window of 3: lengths 11..13 held */
    assert_int_equal(ag_kv_state_trim_limit(kv, s), 2);
    assert_false(ag_kv_trimmable(kv, s, 3));
    assert_int_equal(ag_kv_trim(kv, s, 2), AG_OK);
    expect(kv, s, 11, s);
    /* one-token steps (a draft model's) keep adding to the ring, at most SNAP lengths */
    for (int i = 0; i < 6; i++) step(kv, s, 1, 1);
    assert_int_equal(ag_kv_state_trim_limit(kv, s), SNAP - 1);
    assert_int_equal(ag_kv_trim(kv, s, SNAP - 1), AG_OK);
    expect(kv, s, 17 - (SNAP - 1), s);
    assert_int_equal(ag_kv_state_trim_limit(kv, s), 0);
    ag_kv_free(kv);
}

/* The engine's target: no snapshot of a pass's last row (a verify trim
 * never returns to it), so one-token steps hold nothing and a window of
 * d + 1 rows can drop d. */
static void without_last_row_snapshots(void **unused) {
    (void)unused;
    ag_kv  *kv = make_kv();
    int32_t s;
    ag_state_set_snap_last(ag_kv_state(kv), 0);
    assert_int_equal(ag_kv_seq_new(kv, &s), AG_OK);
    step(kv, s, 6, 0);
    step(kv, s, 1, 1);
    step(kv, s, 1, 1);
    assert_int_equal(ag_kv_state_trim_limit(kv, s), 0);
    step(kv, s, 4, 1); /* lengths 9..11 recorded, 12 is the current state */
    assert_int_equal(ag_kv_state_trim_limit(kv, s), 3);
    assert_int_equal(ag_kv_trim(kv, s, 1), AG_OK);
    expect(kv, s, 11, s);
    assert_int_equal(ag_kv_trim(kv, s, 2), AG_OK);
    expect(kv, s, 9, s);
    assert_int_equal(ag_kv_state_trim_limit(kv, s), 0);
    step(kv, s, 2, 1); /* 10 recorded; 9, restored from the ring, is still there */
    assert_int_equal(ag_kv_state_trim_limit(kv, s), 2);
    assert_int_equal(ag_kv_trim(kv, s, 2), AG_OK);
    expect(kv, s, 9, s);
    ag_kv_free(kv);
}

static void fork_copies_whole_state_only(void **unused) {
    (void)unused;
    ag_kv  *kv = make_kv();
    int32_t a, b;
    const int copies = g_copies;
    assert_int_equal(ag_kv_seq_new(kv, &a), AG_OK);
    assert_int_equal(ag_kv_seq_new(kv, &b), AG_OK);
    step(kv, a, 9, 0);
    step(kv, a, 2, 1);
    assert_int_equal(ag_kv_fork(kv, b, a, 5), AG_ERR_UNSUPPORTED); /* a state is only its last position's */
    assert_int_equal(ag_kv_fork(kv, b, a, 11), AG_OK);
    expect(kv, b, 11, a);
    assert_int_equal(ag_kv_state_trim_limit(kv, b), 0); /* the copy has no snapshots */
    step(kv, b, 1, 1);                                   /* b's state moves on alone */
    expect(kv, a, 11, a);
    assert_int_equal(ag_kv_fork(kv, b, a, 0), AG_OK);
    expect(kv, b, 0, b);
    assert_int_equal(ag_kv_seq_clear(kv, a), AG_OK);
    expect(kv, a, 0, a);
    if (g_mem) assert_true(g_copies >= copies + 5); /* resets (from the zeros), the fork's copy */
    ag_kv_free(kv);
}

static void adopt_refused_and_swap_carries_state(void **unused) {
    (void)unused;
    ag_kv  *kv = make_kv();
    int32_t a, b;
    assert_int_equal(ag_kv_seq_new(kv, &a), AG_OK);
    assert_int_equal(ag_kv_seq_new(kv, &b), AG_OK);
    step(kv, a, 12, 0);
    int32_t        nb;
    const int32_t *bl = ag_kv_seq_blocks(kv, a, &nb);
    assert_int_equal(ag_kv_seq_adopt(kv, b, bl, 1, 8), AG_ERR_UNSUPPORTED);
    const size_t bytes = ag_kv_swap_bytes(kv, 12);
    void        *buf = malloc(bytes);
    int32_t      len;
    const int to_host = g_to_host, from_host = g_from_host;
    assert_int_equal(ag_kv_seq_swap_out(kv, a, buf, bytes, &len), AG_OK);
    if (g_mem) assert_true(g_to_host > to_host);
    assert_int_equal(len, 12);
    assert_int_equal(ag_kv_seq_free(kv, a), AG_OK);
    assert_int_equal(ag_kv_seq_new(kv, &a), AG_OK);
    expect(kv, a, 0, a);
    assert_int_equal(ag_kv_seq_swap_in(kv, a, len, buf, bytes), AG_OK);
    if (g_mem) assert_true(g_from_host > from_host);
    expect(kv, a, 12, a);
    assert_int_equal(ag_state_check(ag_kv_state(kv), a, 11), AG_ERR_INVALID); /* no repeating a position */
    free(buf);
    ag_kv_free(kv);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(prompt_rows_cannot_trim_decode_rows_can),
        cmocka_unit_test(without_last_row_snapshots),
        cmocka_unit_test(fork_copies_whole_state_only),
        cmocka_unit_test(adopt_refused_and_swap_carries_state),
    };
    return cmocka_run_group_tests_name("host memory", tests, use_host, NULL) |
           cmocka_run_group_tests_name("stand-in device memory", tests, use_stand_in, NULL);
}
