/* Unit tests for src/kv: the paged KV cache.
 *
 * Values written are a known function of (stamp, layer, K/V, head, dim), so
 * every read is checked against what the test itself knows it wrote, never
 * against earlier output of the cache. The randomized test keeps a separate
 * model (per-sequence arrays of stamps) and compares the whole cache to it
 * after every operation. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "kv/kv.h"

/* The small odd shape used by most tests: odd head dims catch stride bugs. */
enum { NL = 2, NH = 2, DK = 3, DV = 5, BS = 8 };

static ag_kv *make_kv(ag_kv_dtype dt, int32_t n_blocks, int32_t max_seqs) {
    ag_kv_params p = ag_kv_default_params();
    p.n_layers = NL;
    p.n_kv_heads = NH;
    p.head_dim_k = DK;
    p.head_dim_v = DV;
    p.block_size = BS;
    p.dtype = dt;
    p.max_seqs = max_seqs;
    /* bytes per block computed independently of the cache: per layer,
     * K = NH*BS*DK elements and V = NH*BS*DV, each region rounded up to 64. */
    size_t es = dt == AG_KV_F32 ? 4 : 2;
    size_t kr = ((size_t)NH * BS * DK * es + 63) / 64 * 64;
    size_t vr = ((size_t)NH * BS * DV * es + 63) / 64 * 64;
    p.budget_bytes = (size_t)n_blocks * NL * (kr + vr) + 17; /* + slack that buys no block */
    ag_kv *kv = NULL;
    assert_int_equal(ag_kv_init(&p, &kv), AG_OK);
    ag_kv_stats st;
    ag_kv_get_stats(kv, &st);
    assert_int_equal(st.n_blocks, n_blocks);
    return kv;
}

/* Exactly representable in F16 as well as F32 (integers below 2048 in
 * magnitude) when mod <= 2039; mod picks the range. */
static float val(uint32_t stamp, int layer, int kvsel, int head, int d, uint32_t mod) {
    uint64_t x = (uint64_t)stamp * 7919u + (uint64_t)layer * 131u + (uint64_t)kvsel * 37u +
                 (uint64_t)head * 11u + (uint64_t)d * 3u;
    return (float)(int64_t)(x % mod) - (float)(mod / 2);
}

#define MOD16 2039u
#define MOD32 8388593u

static void fill_pos(uint32_t stamp, int layer, uint32_t mod, float *k, float *v) {
    for (int h = 0; h < NH; h++) {
        for (int d = 0; d < DK; d++) k[h * DK + d] = val(stamp, layer, 0, h, d, mod);
        for (int d = 0; d < DV; d++) v[h * DV + d] = val(stamp, layer, 1, h, d, mod);
    }
}

static void write_pos(ag_kv *kv, int32_t seq, int32_t pos, uint32_t stamp, uint32_t mod) {
    float k[NH * DK], v[NH * DV];
    for (int l = 0; l < NL; l++) {
        fill_pos(stamp, l, mod, k, v);
        assert_int_equal(ag_kv_write(kv, l, seq, pos, k, v), AG_OK);
    }
}

static void check_pos(const ag_kv *kv, int32_t seq, int32_t pos, uint32_t stamp, uint32_t mod) {
    float k[NH * DK], v[NH * DV], ek[NH * DK], ev[NH * DV];
    for (int l = 0; l < NL; l++) {
        fill_pos(stamp, l, mod, ek, ev);
        assert_int_equal(ag_kv_read(kv, l, seq, pos, k, v), AG_OK);
        assert_memory_equal(k, ek, sizeof k);
        assert_memory_equal(v, ev, sizeof v);
    }
}

/* Appends n positions with stamps first_stamp, first_stamp+1, ... */
static void append(ag_kv *kv, int32_t seq, int32_t n, uint32_t first_stamp, uint32_t mod) {
    int32_t len = ag_kv_seq_len(kv, seq);
    assert_int_equal(ag_kv_seq_reserve(kv, seq, n), AG_OK);
    for (int32_t i = 0; i < n; i++) write_pos(kv, seq, len + i, first_stamp + (uint32_t)i, mod);
    assert_int_equal(ag_kv_seq_commit(kv, seq, len + n), AG_OK);
}

static int32_t blocks_used(const ag_kv *kv) {
    ag_kv_stats st;
    ag_kv_get_stats(kv, &st);
    assert_int_equal(st.blocks_used + st.blocks_free, st.n_blocks);
    return st.blocks_used;
}

/* ---- parameters and layout ---------------------------------------------- */

static void params_are_validated(void **state) {
    ag_kv_params p = ag_kv_default_params();
    assert_int_equal(p.block_size, 16);
    p.n_layers = 2;
    p.n_kv_heads = 2;
    p.head_dim_k = p.head_dim_v = 64;
    ag_kv *kv = (ag_kv *)1;
    p.block_size = 12;
    assert_int_equal(ag_kv_init(&p, &kv), AG_ERR_INVALID);
    assert_null(kv);
    p.block_size = 4;
    assert_int_equal(ag_kv_init(&p, &kv), AG_ERR_INVALID);
    p.block_size = 512;
    assert_int_equal(ag_kv_init(&p, &kv), AG_ERR_INVALID);
    p.block_size = 256;
    p.dtype = AG_KV_Q8_0;
    assert_int_equal(ag_kv_init(&p, &kv), AG_ERR_UNSUPPORTED);
    p.dtype = AG_KV_F16;
    p.head_dim_v = 0;
    assert_int_equal(ag_kv_init(&p, &kv), AG_ERR_INVALID);
    p.head_dim_v = 64;
    p.budget_bytes = 1000; /* one block is 2*2*2*256*64*2 bytes */
    assert_int_equal(ag_kv_init(&p, &kv), AG_ERR_NOMEM);
    assert_non_null(strstr(ag_error_message(), "below one block"));
    int32_t win[2] = {0, -1};
    p.budget_bytes = (size_t)1 << 20;
    p.layer_window = win;
    assert_int_equal(ag_kv_init(&p, &kv), AG_ERR_INVALID);
    win[1] = 512;
    assert_int_equal(ag_kv_init(&p, &kv), AG_OK);
    assert_int_equal(ag_kv_layer_window(kv, 0), 0);
    assert_int_equal(ag_kv_layer_window(kv, 1), 512);
    /* block = 2 layers * 2 * (2 heads * 256 * 64 * 2 bytes) = 256 KiB; 1 MiB
     * holds 4 */
    ag_kv_stats st;
    ag_kv_get_stats(kv, &st);
    assert_int_equal(st.block_bytes, 262144);
    assert_int_equal(st.n_blocks, 4);
    assert_int_equal(st.pool_bytes, 4 * 262144);
    assert_int_equal(st.blocks_free, 4);
    ag_kv_free(kv);
    ag_kv_free(NULL);
}

static void layout_strides_match_spec(void **state) {
    ag_kv              *kv = make_kv(AG_KV_F32, 4, 2);
    const ag_kv_layout *L = ag_kv_get_layout(kv);
    assert_int_equal(L->block_size, 8);
    assert_int_equal(L->block_shift, 3);
    assert_int_equal(L->row_bytes_k, 12);
    assert_int_equal(L->row_bytes_v, 20);
    assert_int_equal(L->head_stride_k, 96);
    assert_int_equal(L->head_stride_v, 160);
    assert_int_equal(L->layer_stride, 192 + 320);
    assert_int_equal(L->block_bytes, 2 * 512);
    assert_int_equal(L->copy_bytes, 192 + 320);
    assert_int_equal(ag_kv_block_bytes(kv), 512);
    for (int32_t b = 0; b < 4; b++)
        for (int l = 0; l < NL; l++) {
            assert_int_equal((uintptr_t)ag_kv_block_k(kv, l, b) % 64, 0);
            assert_int_equal((uintptr_t)ag_kv_block_v(kv, l, b) % 64, 0);
        }
    assert_null(ag_kv_block_k(kv, NL, 0));
    assert_null(ag_kv_block_v(kv, 0, 4));
    assert_null(ag_kv_block_k(kv, -1, 0));
    ag_kv_free(kv);
}

/* ---- write/read --------------------------------------------------------- */

/* Positions written in uneven chunks across block boundaries read back
 * exactly, through ag_kv_read AND through the raw layout (block table, block
 * pointers and strides), which pins the documented storage order. */
static void write_read_across_blocks(void **state) {
    ag_kv  *kv = make_kv(AG_KV_F32, 16, 4);
    int32_t s;
    assert_int_equal(ag_kv_seq_new(kv, &s), AG_OK);
    assert_int_equal(s, 0);
    int32_t  chunks[] = {3, 5, 1, 11, 8, 2};
    uint32_t stamp = 100;
    int32_t  total = 0;
    for (size_t c = 0; c < sizeof chunks / sizeof *chunks; c++) {
        append(kv, s, chunks[c], stamp, MOD32);
        stamp += (uint32_t)chunks[c];
        total += chunks[c];
        assert_int_equal(ag_kv_seq_len(kv, s), total);
    }
    assert_int_equal(total, 30);
    int32_t        nb;
    const int32_t *tab = ag_kv_seq_blocks(kv, s, &nb);
    assert_int_equal(nb, 4); /* ceil(30 / 8) */
    assert_int_equal(blocks_used(kv), 4);
    const ag_kv_layout *L = ag_kv_get_layout(kv);
    for (int32_t p = 0; p < total; p++) {
        check_pos(kv, s, p, 100 + (uint32_t)p, MOD32);
        for (int l = 0; l < NL; l++) {
            const uint8_t *kb = ag_kv_block_k(kv, l, tab[p / BS]);
            const uint8_t *vb = ag_kv_block_v(kv, l, tab[p / BS]);
            for (int h = 0; h < NH; h++) {
                const float *kr =
                    (const float *)(kb + h * L->head_stride_k + (p % BS) * L->row_bytes_k);
                const float *vr =
                    (const float *)(vb + h * L->head_stride_v + (p % BS) * L->row_bytes_v);
                for (int d = 0; d < DK; d++) assert_true(kr[d] == val(100 + p, l, 0, h, d, MOD32));
                for (int d = 0; d < DV; d++) assert_true(vr[d] == val(100 + p, l, 1, h, d, MOD32));
            }
        }
    }
    float k[NH * DK];
    assert_int_equal(ag_kv_read(kv, 0, s, 30, k, NULL), AG_ERR_RANGE);
    assert_int_equal(ag_kv_read(kv, 0, s, -1, k, NULL), AG_ERR_RANGE);
    assert_int_equal(ag_kv_read(kv, NL, s, 0, k, NULL), AG_ERR_RANGE);
    assert_int_equal(ag_kv_read(kv, 0, 3, 0, k, NULL), AG_ERR_INVALID);
    ag_kv_free(kv);
}

/* The protocol is enforced: no write outside [len, reserved), no commit past
 * the reservation, no write into a block shared since the reserve. */
static void slot_protocol_is_enforced(void **state) {
    ag_kv  *kv = make_kv(AG_KV_F32, 8, 4);
    int32_t a, b, blk, off;
    assert_int_equal(ag_kv_seq_new(kv, &a), AG_OK);
    assert_int_equal(ag_kv_seq_new(kv, &b), AG_OK);
    assert_int_equal(ag_kv_slot(kv, a, 0, &blk, &off), AG_ERR_INVALID);
    assert_int_equal(ag_kv_seq_reserve(kv, a, 10), AG_OK);
    assert_int_equal(ag_kv_slot(kv, a, 9, &blk, &off), AG_OK);
    assert_int_equal(off, 1);
    assert_int_equal(ag_kv_slot(kv, a, 10, &blk, &off), AG_ERR_INVALID);
    assert_int_equal(ag_kv_seq_commit(kv, a, 11), AG_ERR_RANGE);
    for (int32_t p = 0; p < 10; p++) write_pos(kv, a, p, (uint32_t)p, MOD32);
    assert_int_equal(ag_kv_seq_commit(kv, a, 10), AG_OK);
    assert_int_equal(ag_kv_seq_commit(kv, a, 9), AG_ERR_RANGE); /* shrinking is trim's job */
    assert_int_equal(ag_kv_slot(kv, a, 9, &blk, &off), AG_ERR_INVALID);
    /* Reserve more, then fork: the tail block (positions 8..15) is shared
     * again, so the reservation no longer allows writes until re-reserved. */
    assert_int_equal(ag_kv_seq_reserve(kv, a, 3), AG_OK);
    assert_int_equal(ag_kv_fork(kv, b, a, 10), AG_OK);
    assert_int_equal(ag_kv_slot(kv, a, 10, &blk, &off), AG_ERR_INVALID);
    assert_non_null(strstr(ag_error_message(), "shared"));
    assert_int_equal(ag_kv_seq_reserve(kv, a, 3), AG_OK);
    assert_int_equal(ag_kv_slot(kv, a, 10, &blk, &off), AG_OK);
    assert_int_equal(ag_kv_block_refcount(kv, blk), 1);
    assert_int_equal(ag_kv_seq_reserve(kv, a, -1), AG_ERR_INVALID);
    assert_int_equal(ag_kv_seq_reserve(kv, 7, 1), AG_ERR_INVALID);
    ag_kv_free(kv);
}

/* ---- trim --------------------------------------------------------------- */

/* Trim then re-write gives exactly the bytes of never having gone further:
 * A goes to 30, trims 13, writes 9 more; B writes the same history directly. */
static void trim_then_rewrite_equals_straight_history(void **state) {
    for (int dt = 0; dt < 2; dt++) {
        ag_kv   *kv = make_kv(dt ? AG_KV_F16 : AG_KV_F32, 16, 4);
        uint32_t mod = dt ? MOD16 : MOD32;
        int32_t  a, b;
        assert_int_equal(ag_kv_seq_new(kv, &a), AG_OK);
        assert_int_equal(ag_kv_seq_new(kv, &b), AG_OK);
        append(kv, a, 30, 0, mod);
        assert_int_equal(blocks_used(kv), 4);
        assert_true(ag_kv_trimmable(kv, a, 13));
        assert_int_equal(ag_kv_trim(kv, a, 13), AG_OK);
        assert_int_equal(ag_kv_seq_len(kv, a), 17);
        assert_int_equal(blocks_used(kv), 3); /* 17 positions need 3 blocks */
        append(kv, a, 9, 1000, mod);
        append(kv, b, 17, 0, mod);
        append(kv, b, 9, 1000, mod);
        assert_int_equal(ag_kv_seq_len(kv, a), 26);
        const ag_kv_layout *L = ag_kv_get_layout(kv);
        int32_t             na, nb2;
        const int32_t      *ta = ag_kv_seq_blocks(kv, a, &na);
        const int32_t      *tb = ag_kv_seq_blocks(kv, b, &nb2);
        assert_int_equal(na, nb2);
        for (int32_t p = 0; p < 26; p++)
            for (int l = 0; l < NL; l++)
                for (int h = 0; h < NH; h++) {
                    size_t ko = h * L->head_stride_k + (p % BS) * L->row_bytes_k;
                    size_t vo = h * L->head_stride_v + (p % BS) * L->row_bytes_v;
                    assert_memory_equal((uint8_t *)ag_kv_block_k(kv, l, ta[p / BS]) + ko,
                                        (uint8_t *)ag_kv_block_k(kv, l, tb[p / BS]) + ko,
                                        L->row_bytes_k);
                    assert_memory_equal((uint8_t *)ag_kv_block_v(kv, l, ta[p / BS]) + vo,
                                        (uint8_t *)ag_kv_block_v(kv, l, tb[p / BS]) + vo,
                                        L->row_bytes_v);
                }
        for (int32_t p = 0; p < 26; p++)
            check_pos(kv, a, p, p < 17 ? (uint32_t)p : 1000u + (uint32_t)(p - 17), mod);
        ag_kv_free(kv);
    }
}

static void trim_across_blocks_frees_them(void **state) {
    ag_kv  *kv = make_kv(AG_KV_F32, 8, 4);
    int32_t a;
    assert_int_equal(ag_kv_seq_new(kv, &a), AG_OK);
    append(kv, a, 40, 0, MOD32); /* 5 blocks */
    assert_int_equal(blocks_used(kv), 5);
    assert_int_equal(ag_kv_trim(kv, a, 41), AG_ERR_RANGE);
    assert_false(ag_kv_trimmable(kv, a, 41));
    assert_false(ag_kv_trimmable(kv, a, -1));
    assert_true(ag_kv_can_trim(kv));
    assert_int_equal(ag_kv_trim(kv, a, 37), AG_OK); /* back to 3: one block */
    assert_int_equal(ag_kv_seq_len(kv, a), 3);
    assert_int_equal(blocks_used(kv), 1);
    for (int32_t p = 0; p < 3; p++) check_pos(kv, a, p, (uint32_t)p, MOD32);
    /* trim to 0 releases everything; an aborted reservation goes too */
    assert_int_equal(ag_kv_seq_reserve(kv, a, 20), AG_OK);
    assert_int_equal(blocks_used(kv), 3);
    assert_int_equal(ag_kv_trim(kv, a, 3), AG_OK);
    assert_int_equal(blocks_used(kv), 0);
    int32_t n;
    assert_null(ag_kv_seq_blocks(kv, a, &n));
    assert_int_equal(n, 0);
    /* trim at an exact block boundary keeps exactly the full blocks */
    append(kv, a, 24, 500, MOD32);
    assert_int_equal(ag_kv_trim(kv, a, 8), AG_OK);
    assert_int_equal(blocks_used(kv), 2);
    append(kv, a, 1, 900, MOD32);
    assert_int_equal(blocks_used(kv), 3);
    for (int32_t p = 0; p < 16; p++) check_pos(kv, a, p, 500 + (uint32_t)p, MOD32);
    check_pos(kv, a, 16, 900, MOD32);
    ag_kv_free(kv);
}

/* ---- fork --------------------------------------------------------------- */

/* Fork at 20 (inside block 2), then both sides continue differently. */
static void fork_divergent_continuations_are_isolated(void **state) {
    ag_kv  *kv = make_kv(AG_KV_F32, 16, 4);
    int32_t a, b;
    assert_int_equal(ag_kv_seq_new(kv, &a), AG_OK);
    assert_int_equal(ag_kv_seq_new(kv, &b), AG_OK);
    append(kv, a, 20, 0, MOD32);
    assert_int_equal(ag_kv_fork(kv, b, a, 20), AG_OK);
    assert_int_equal(blocks_used(kv), 3); /* sharing costs no block */
    int32_t        na, nb;
    const int32_t *ta = ag_kv_seq_blocks(kv, a, &na);
    const int32_t *tb = ag_kv_seq_blocks(kv, b, &nb);
    assert_int_equal(na, 3);
    assert_int_equal(nb, 3);
    for (int i = 0; i < 3; i++) {
        assert_int_equal(ta[i], tb[i]);
        assert_int_equal(ag_kv_block_refcount(kv, ta[i]), 2);
    }
    int32_t shared_tail = ta[2];
    append(kv, a, 12, 5000, MOD32); /* a: 20..31 */
    append(kv, b, 7, 9000, MOD32);  /* b: 20..26 */
    for (int32_t p = 0; p < 20; p++) {
        check_pos(kv, a, p, (uint32_t)p, MOD32);
        check_pos(kv, b, p, (uint32_t)p, MOD32);
    }
    for (int32_t p = 20; p < 32; p++) check_pos(kv, a, p, 5000 + (uint32_t)(p - 20), MOD32);
    for (int32_t p = 20; p < 27; p++) check_pos(kv, b, p, 9000 + (uint32_t)(p - 20), MOD32);
    /* The two full blocks stay shared; the tail was copied exactly once. */
    ta = ag_kv_seq_blocks(kv, a, &na);
    tb = ag_kv_seq_blocks(kv, b, &nb);
    assert_int_equal(ta[0], tb[0]);
    assert_int_equal(ta[1], tb[1]);
    assert_int_not_equal(ta[2], tb[2]);
    assert_true(ta[2] == shared_tail || tb[2] == shared_tail);
    ag_kv_stats st;
    ag_kv_get_stats(kv, &st);
    assert_int_equal(st.cow_copies, 1);
    assert_int_equal(st.blocks_shared, 2);
    assert_int_equal(st.blocks_used, 2 + 2 + 2); /* shared 0,1; a: 2,3; b: 2,3 */
    assert_int_equal(st.positions, 32 + 27);
    /* Freeing a leaves b intact and releases a's own blocks only. */
    assert_int_equal(ag_kv_seq_free(kv, a), AG_OK);
    assert_int_equal(blocks_used(kv), 4);
    for (int32_t p = 0; p < 20; p++) check_pos(kv, b, p, (uint32_t)p, MOD32);
    assert_int_equal(ag_kv_block_refcount(kv, tb[0]), 1);
    /* Bad forks */
    assert_int_equal(ag_kv_fork(kv, b, b, 1), AG_ERR_INVALID);
    assert_int_equal(ag_kv_fork(kv, a, b, 1), AG_ERR_INVALID); /* a is dead */
    int32_t c;
    assert_int_equal(ag_kv_seq_new(kv, &c), AG_OK);
    assert_int_equal(ag_kv_fork(kv, c, b, 28), AG_ERR_RANGE);
    ag_kv_free(kv);
}

/* Copy-on-write of a shared partial tail: the writer gets a private copy
 * holding the shared prefix, the original block keeps its bytes. */
static void cow_copies_shared_tail_before_write(void **state) {
    ag_kv  *kv = make_kv(AG_KV_F32, 8, 4);
    int32_t a, b;
    assert_int_equal(ag_kv_seq_new(kv, &a), AG_OK);
    assert_int_equal(ag_kv_seq_new(kv, &b), AG_OK);
    append(kv, a, 5, 0, MOD32);
    assert_int_equal(ag_kv_fork(kv, b, a, 5), AG_OK);
    int32_t  n;
    int32_t  orig = ag_kv_seq_blocks(kv, a, &n)[0];
    size_t   sz = ag_kv_block_bytes(kv);
    uint8_t *before = malloc(sz), *after = malloc(sz);
    assert_int_equal(ag_kv_block_copy_out(kv, orig, 1, before, sz), AG_OK);
    /* b writes first: it copies; a keeps the original block. */
    append(kv, b, 2, 777, MOD32);
    int32_t bnew = ag_kv_seq_blocks(kv, b, &n)[0];
    assert_int_not_equal(bnew, orig);
    assert_int_equal(ag_kv_seq_blocks(kv, a, &n)[0], orig);
    assert_int_equal(ag_kv_block_refcount(kv, orig), 1);
    assert_int_equal(ag_kv_block_refcount(kv, bnew), 1);
    assert_int_equal(ag_kv_block_copy_out(kv, orig, 1, after, sz), AG_OK);
    assert_memory_equal(before, after, sz);
    for (int32_t p = 0; p < 5; p++) check_pos(kv, b, p, (uint32_t)p, MOD32);
    check_pos(kv, b, 5, 777, MOD32);
    check_pos(kv, b, 6, 778, MOD32);
    /* a now owns its block alone: its next write copies nothing. */
    ag_kv_stats st;
    ag_kv_get_stats(kv, &st);
    assert_int_equal(st.cow_copies, 1);
    append(kv, a, 1, 333, MOD32);
    ag_kv_get_stats(kv, &st);
    assert_int_equal(st.cow_copies, 1);
    assert_int_equal(ag_kv_seq_blocks(kv, a, &n)[0], orig);
    check_pos(kv, a, 5, 333, MOD32);
    check_pos(kv, b, 5, 777, MOD32);
    free(before);
    free(after);
    ag_kv_free(kv);
}

/* Fork of a length inside a block: dst sees exactly len positions, writes
 * over src's later positions in its own copy, src is untouched. */
static void fork_len_inside_block(void **state) {
    ag_kv  *kv = make_kv(AG_KV_F16, 8, 4);
    int32_t a, b;
    assert_int_equal(ag_kv_seq_new(kv, &a), AG_OK);
    assert_int_equal(ag_kv_seq_new(kv, &b), AG_OK);
    append(kv, a, 20, 0, MOD16);
    append(kv, b, 3, 4444, MOD16); /* b had content: fork releases it */
    assert_int_equal(blocks_used(kv), 4);
    assert_int_equal(ag_kv_fork(kv, b, a, 13), AG_OK);
    assert_int_equal(ag_kv_seq_len(kv, b), 13);
    assert_int_equal(blocks_used(kv), 3);
    int32_t n;
    ag_kv_seq_blocks(kv, b, &n);
    assert_int_equal(n, 2);
    float k[NH * DK];
    assert_int_equal(ag_kv_read(kv, 0, b, 13, k, NULL), AG_ERR_RANGE);
    append(kv, b, 6, 8000, MOD16); /* b: 13..18, in its copy of block 1 */
    for (int32_t p = 0; p < 20; p++) check_pos(kv, a, p, (uint32_t)p, MOD16);
    for (int32_t p = 0; p < 13; p++) check_pos(kv, b, p, (uint32_t)p, MOD16);
    for (int32_t p = 13; p < 19; p++) check_pos(kv, b, p, 8000 + (uint32_t)(p - 13), MOD16);
    /* fork of 0 empties dst */
    assert_int_equal(ag_kv_fork(kv, b, a, 0), AG_OK);
    assert_int_equal(ag_kv_seq_len(kv, b), 0);
    assert_int_equal(blocks_used(kv), 3);
    ag_kv_free(kv);
}

/* ---- pool exhaustion and reuse ------------------------------------------ */

static void pool_exhaustion_then_reuse(void **state) {
    ag_kv  *kv = make_kv(AG_KV_F32, 4, 4);
    int32_t a, b;
    assert_int_equal(ag_kv_seq_new(kv, &a), AG_OK);
    assert_int_equal(ag_kv_seq_new(kv, &b), AG_OK);
    append(kv, a, 20, 0, MOD32); /* 3 blocks */
    /* b asks for 2 blocks, 1 free: refused whole, nothing taken */
    assert_int_equal(ag_kv_seq_reserve(kv, b, 9), AG_ERR_NOMEM);
    assert_string_equal(ag_error_message(), "KV cache full: need 2 blocks, 1 free");
    int32_t n;
    assert_null(ag_kv_seq_blocks(kv, b, &n));
    assert_int_equal(blocks_used(kv), 3);
    /* a asks past its tail: 4 more positions fit its block, 12 need 1 more */
    assert_int_equal(ag_kv_seq_reserve(kv, a, 12), AG_OK);
    assert_int_equal(ag_kv_seq_reserve(kv, b, 1), AG_ERR_NOMEM);
    assert_string_equal(ag_error_message(), "KV cache full: need 1 blocks, 0 free");
    int32_t blk;
    assert_int_equal(ag_kv_block_alloc(kv, &blk), AG_ERR_NOMEM);
    ag_kv_stats st;
    ag_kv_get_stats(kv, &st);
    assert_int_equal(st.nomem_errors, 3);
    assert_int_equal(st.blocks_free, 0);
    /* COW also needs a block: a fork onto a full pool, then a write into the
     * shared tail must be refused, not corrupt the other side. */
    int32_t c;
    assert_int_equal(ag_kv_seq_new(kv, &c), AG_OK);
    assert_int_equal(ag_kv_trim(kv, a, 0), AG_OK);        /* drop a's spare reservation: 3 used */
    assert_int_equal(ag_kv_block_alloc(kv, &blk), AG_OK); /* hold the last block */
    assert_int_equal(ag_kv_fork(kv, c, a, 20), AG_OK);
    assert_int_equal(ag_kv_seq_reserve(kv, c, 1), AG_ERR_NOMEM);
    assert_string_equal(ag_error_message(), "KV cache full: need 1 blocks, 0 free");
    assert_int_equal(ag_kv_block_unref(kv, blk), AG_OK);
    append(kv, c, 1, 55, MOD32); /* now the copy fits */
    for (int32_t p = 0; p < 20; p++) check_pos(kv, a, p, (uint32_t)p, MOD32);
    check_pos(kv, c, 20, 55, MOD32);
    /* free a: its private tail returns at once, shared blocks stay with c */
    assert_int_equal(ag_kv_seq_free(kv, a), AG_OK);
    assert_int_equal(blocks_used(kv), 3);
    assert_int_equal(ag_kv_seq_free(kv, c), AG_OK);
    assert_int_equal(blocks_used(kv), 0);
    assert_int_equal(ag_kv_seq_free(kv, c), AG_ERR_INVALID);
    append(kv, b, 32, 70, MOD32); /* the whole pool again */
    for (int32_t p = 0; p < 32; p++) check_pos(kv, b, p, 70 + (uint32_t)p, MOD32);
    ag_kv_free(kv);
}

static void sequence_ids_are_small_and_reused(void **state) {
    ag_kv  *kv = make_kv(AG_KV_F32, 4, 3);
    int32_t s[3], x;
    for (int i = 0; i < 3; i++) {
        assert_int_equal(ag_kv_seq_new(kv, &s[i]), AG_OK);
        assert_int_equal(s[i], i);
    }
    assert_int_equal(ag_kv_seq_new(kv, &x), AG_ERR_NOMEM);
    assert_int_equal(ag_kv_seq_free(kv, 1), AG_OK);
    assert_false(ag_kv_seq_live(kv, 1));
    assert_int_equal(ag_kv_seq_len(kv, 1), -1);
    assert_int_equal(ag_kv_seq_new(kv, &x), AG_OK);
    assert_int_equal(x, 1);
    assert_int_equal(ag_kv_seq_len(kv, 1), 0);
    assert_int_equal(ag_kv_seq_free(kv, 3), AG_ERR_INVALID);
    assert_int_equal(ag_kv_seq_free(kv, -1), AG_ERR_INVALID);
    ag_kv_free(kv);
}

/* ---- block hooks -------------------------------------------------------- */

/* A "cache" keeps blocks alive past their sequence and rebuilds a sequence
 * from them; writes to the rebuilt one copy, so the cached bytes never change.
 */
static void refcounts_with_adopt_and_unref(void **state) {
    ag_kv  *kv = make_kv(AG_KV_F32, 8, 4);
    int32_t a, c;
    assert_int_equal(ag_kv_seq_new(kv, &a), AG_OK);
    append(kv, a, 20, 0, MOD32);
    int32_t        n;
    const int32_t *t = ag_kv_seq_blocks(kv, a, &n);
    int32_t        held[3];
    memcpy(held, t, sizeof held);
    for (int i = 0; i < 3; i++) {
        assert_int_equal(ag_kv_block_ref(kv, held[i]), AG_OK);
        assert_int_equal(ag_kv_block_refcount(kv, held[i]), 2);
    }
    assert_int_equal(ag_kv_seq_free(kv, a), AG_OK);
    assert_int_equal(blocks_used(kv), 3);
    for (int i = 0; i < 3; i++) assert_int_equal(ag_kv_block_refcount(kv, held[i]), 1);

    size_t   sz = ag_kv_block_bytes(kv);
    uint8_t *before = malloc(sz), *after = malloc(sz);
    assert_int_equal(ag_kv_block_copy_out(kv, held[2], 0, before, sz), AG_OK);

    assert_int_equal(ag_kv_seq_new(kv, &c), AG_OK);
    assert_int_equal(ag_kv_seq_adopt(kv, c, held, 3, 25), AG_ERR_RANGE); /* 25 > 24 */
    assert_int_equal(ag_kv_seq_adopt(kv, c, held, 3, 16), AG_ERR_RANGE); /* fits in 2 */
    int32_t bad[2] = {held[0], 7};                                       /* 7 is free */
    assert_int_equal(ag_kv_seq_adopt(kv, c, bad, 2, 10), AG_ERR_INVALID);
    assert_int_equal(ag_kv_block_refcount(kv, held[0]), 1); /* failed adopt took nothing */
    assert_int_equal(ag_kv_seq_adopt(kv, c, held, 3, 18), AG_OK);
    assert_int_equal(ag_kv_seq_len(kv, c), 18);
    for (int i = 0; i < 3; i++) assert_int_equal(ag_kv_block_refcount(kv, held[i]), 2);
    for (int32_t p = 0; p < 18; p++) check_pos(kv, c, p, (uint32_t)p, MOD32);
    append(kv, c, 4, 600, MOD32); /* 18..21 into a copy of held[2] */
    assert_int_equal(ag_kv_block_copy_out(kv, held[2], 0, after, sz), AG_OK);
    assert_memory_equal(before, after, sz);
    assert_int_equal(ag_kv_block_refcount(kv, held[2]), 1);
    for (int32_t p = 18; p < 22; p++) check_pos(kv, c, p, 600 + (uint32_t)(p - 18), MOD32);

    /* The cache lets go: shared blocks stay with c, held[2] returns now. */
    for (int i = 0; i < 3; i++) assert_int_equal(ag_kv_block_unref(kv, held[i]), AG_OK);
    assert_int_equal(ag_kv_block_refcount(kv, held[2]), 0);
    assert_int_equal(ag_kv_block_unref(kv, held[2]), AG_ERR_INVALID);
    assert_int_equal(ag_kv_block_ref(kv, held[2]), AG_ERR_INVALID);
    assert_int_equal(ag_kv_block_ref(kv, 99), AG_ERR_INVALID);
    assert_int_equal(ag_kv_block_refcount(kv, 99), -1);
    assert_int_equal(blocks_used(kv), 3);
    for (int32_t p = 0; p < 18; p++) check_pos(kv, c, p, (uint32_t)p, MOD32);
    /* Adopting its own table (aliasing) is allowed and changes nothing. */
    t = ag_kv_seq_blocks(kv, c, &n);
    assert_int_equal(ag_kv_seq_adopt(kv, c, t, n, 22), AG_OK);
    assert_int_equal(blocks_used(kv), 3);
    for (int32_t p = 0; p < 22; p++)
        check_pos(kv, c, p, p < 18 ? (uint32_t)p : 600u + (uint32_t)(p - 18), MOD32);
    assert_int_equal(ag_kv_seq_free(kv, c), AG_OK);
    assert_int_equal(blocks_used(kv), 0);
    free(before);
    free(after);
    ag_kv_free(kv);
}

/* Persistence round trip: copy a sequence's blocks out layer by layer, then
 * into fresh blocks, adopt them and read the same values. The copy format
 * is pinned: K [head][block_size][head_dim_k], then V. */
static void block_copy_out_in_round_trip(void **state) {
    ag_kv  *kv = make_kv(AG_KV_F32, 8, 4);
    int32_t a, c;
    assert_int_equal(ag_kv_seq_new(kv, &a), AG_OK);
    append(kv, a, 11, 40, MOD32);
    int32_t        n;
    const int32_t *t = ag_kv_seq_blocks(kv, a, &n);
    assert_int_equal(n, 2);
    size_t sz = ag_kv_block_bytes(kv);
    assert_int_equal(sz, (size_t)NH * BS * (DK + DV) * 4);
    float *img = malloc((size_t)n * NL * sz);
    for (int32_t i = 0; i < n; i++)
        for (int l = 0; l < NL; l++)
            assert_int_equal(
                ag_kv_block_copy_out(kv, t[i], l, (uint8_t *)img + (i * NL + l) * sz, sz), AG_OK);
    for (int32_t p = 0; p < 11; p++)
        for (int l = 0; l < NL; l++) {
            const float *f = (const float *)((uint8_t *)img + ((p / BS) * NL + l) * sz);
            for (int h = 0; h < NH; h++) {
                for (int d = 0; d < DK; d++)
                    assert_true(f[(h * BS + p % BS) * DK + d] == val(40 + p, l, 0, h, d, MOD32));
                for (int d = 0; d < DV; d++)
                    assert_true(f[NH * BS * DK + (h * BS + p % BS) * DV + d] ==
                                val(40 + p, l, 1, h, d, MOD32));
            }
        }
    assert_int_equal(ag_kv_block_copy_out(kv, t[0], 0, img, sz - 1), AG_ERR_INVALID);
    assert_int_equal(ag_kv_block_copy_out(kv, t[0], NL, img, sz), AG_ERR_RANGE);
    assert_int_equal(ag_kv_block_copy_out(kv, 7, 0, img, sz), AG_ERR_INVALID);
    /* t[0] is held by a only: copy_in would be allowed; make it shared and it is
     * not */
    assert_int_equal(ag_kv_block_ref(kv, t[0]), AG_OK);
    assert_int_equal(ag_kv_block_copy_in(kv, t[0], 0, img, sz), AG_ERR_INVALID);
    assert_int_equal(ag_kv_block_unref(kv, t[0]), AG_OK);
    assert_int_equal(ag_kv_seq_free(kv, a), AG_OK);

    int32_t fresh[2];
    for (int32_t i = 0; i < 2; i++) {
        assert_int_equal(ag_kv_block_alloc(kv, &fresh[i]), AG_OK);
        for (int l = 0; l < NL; l++)
            assert_int_equal(
                ag_kv_block_copy_in(kv, fresh[i], l, (uint8_t *)img + (i * NL + l) * sz, sz),
                AG_OK);
    }
    assert_int_equal(ag_kv_seq_new(kv, &c), AG_OK);
    assert_int_equal(ag_kv_seq_adopt(kv, c, fresh, 2, 11), AG_OK);
    for (int32_t i = 0; i < 2; i++) assert_int_equal(ag_kv_block_unref(kv, fresh[i]), AG_OK);
    for (int32_t p = 0; p < 11; p++) check_pos(kv, c, p, 40 + (uint32_t)p, MOD32);
    append(kv, c, 3, 90, MOD32);
    check_pos(kv, c, 13, 92, MOD32);
    free(img);
    ag_kv_free(kv);
}

/* ---- F16 ---------------------------------------------------------------- */

static uint64_t rng_state;
static uint64_t rng(void) { /* splitmix64 */
    uint64_t z = (rng_state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
static int32_t rnd(int32_t n) { return n <= 0 ? 0 : (int32_t)(rng() % (uint64_t)n); }

/* Conversions against the compiler's own _Float16 (an independent
 * implementation of IEEE binary16 rounding) where available, and against
 * hand-checked constants always. */
static void f16_conversions(void **state) {
    struct {
        float    f;
        uint16_t h;
    } cases[] = {
        {0.0f, 0x0000},
        {-0.0f, 0x8000},
        {1.0f, 0x3c00},
        {-2.0f, 0xc000},
        {65504.0f, 0x7bff},
        {65519.0f, 0x7bff},
        {65520.0f, 0x7c00},
        {1e6f, 0x7c00},
        {0.1f, 0x2e66},
        {5.9604644775390625e-8f, 0x0001},  /* 2^-24, smallest subnormal */
        {2.98023223876953125e-8f, 0x0000}, /* 2^-25: tie, to even = 0 */
        {6.103515625e-5f, 0x0400},         /* 2^-14, smallest normal */
        {1.0009765625f, 0x3c01},
        {1.00048828125f, 0x3c00} /* tie to even */,
        {1.00146484375f, 0x3c02},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
        assert_int_equal(ag_kv_f32_to_f16(cases[i].f), cases[i].h);
    struct {
        uint16_t h;
        float    f;
    } back[] = {
        {0x3c00, 1.0f},       {0xc000, -2.0f},    {0x7bff, 65504.0f},        {0x0001, 0x1p-24f},
        {0x03ff, 0x3ffp-24f}, {0x0400, 0x1p-14f}, {0x3555, 0.333251953125f}, {0x8000, -0.0f},
    };
    for (size_t i = 0; i < sizeof back / sizeof *back; i++) {
        float got = ag_kv_f16_to_f32(back[i].h);
        assert_memory_equal(&got, &back[i].f, 4);
    }
    assert_true(isinf(ag_kv_f16_to_f32(0x7c00)));
    assert_true(isnan(ag_kv_f16_to_f32(ag_kv_f32_to_f16(NAN))));
    assert_true(isinf(ag_kv_f16_to_f32(ag_kv_f32_to_f16(-INFINITY))));
#ifdef __FLT16_MAX__
    for (uint32_t h = 0; h < 65536; h++) {
        _Float16 r;
        uint16_t hh = (uint16_t)h;
        memcpy(&r, &hh, 2);
        float want = (float)r, got = ag_kv_f16_to_f32(hh);
        if (isnan(want)) {
            assert_true(isnan(got));
            continue;
        }
        assert_memory_equal(&got, &want, 4);
        assert_int_equal(ag_kv_f32_to_f16(got), hh); /* every half survives a round trip */
    }
    rng_state = 12345;
    for (int i = 0; i < 2000000; i++) {
        uint32_t bits = (uint32_t)rng();
        if (i % 2) bits = (bits & 0x87ffffffu) | 0x30000000u; /* concentrate near the half range */
        float f;
        memcpy(&f, &bits, 4);
        _Float16 r = (_Float16)f;
        uint16_t want;
        memcpy(&want, &r, 2);
        uint16_t got = ag_kv_f32_to_f16(f);
        if (isnan(f)) {
            assert_true((got & 0x7c00) == 0x7c00 && (got & 0x3ff));
            continue;
        }
        if (got != want) fail_msg("f32 %a (0x%08x): got 0x%04x want 0x%04x", f, bits, got, want);
    }
#endif
}

/* Storage in F16 keeps values within half precision: relative error at most
 * 2^-11 in the normal range, absolute at most 2^-25 below it. */
static void f16_storage_round_trips(void **state) {
    ag_kv  *kv = make_kv(AG_KV_F16, 8, 2);
    int32_t s;
    assert_int_equal(ag_kv_seq_new(kv, &s), AG_OK);
    enum { N = 30 };
    static float wk[N][NL][NH * DK], wv[N][NL][NH * DV];
    rng_state = 99;
    assert_int_equal(ag_kv_seq_reserve(kv, s, N), AG_OK);
    for (int p = 0; p < N; p++)
        for (int l = 0; l < NL; l++) {
            for (int i = 0; i < NH * DK; i++)
                wk[p][l][i] =
                    (float)((double)(rnd(2000001) - 1000000) * pow(10.0, rnd(9) - 8) / 1e2);
            for (int i = 0; i < NH * DV; i++)
                wv[p][l][i] = (float)((double)(rnd(2000001) - 1000000) * 1e-6);
            assert_int_equal(ag_kv_write(kv, l, s, p, wk[p][l], wv[p][l]), AG_OK);
        }
    assert_int_equal(ag_kv_seq_commit(kv, s, N), AG_OK);
    const ag_kv_layout *L = ag_kv_get_layout(kv);
    assert_int_equal(L->row_bytes_k, DK * 2);
    int32_t        nb;
    const int32_t *t = ag_kv_seq_blocks(kv, s, &nb);
    for (int p = 0; p < N; p++)
        for (int l = 0; l < NL; l++) {
            float k[NH * DK], v[NH * DV];
            assert_int_equal(ag_kv_read(kv, l, s, p, k, v), AG_OK);
            for (int i = 0; i < NH * DK + NH * DV; i++) {
                float  x = i < NH * DK ? wk[p][l][i] : wv[p][l][i - NH * DK];
                float  r = i < NH * DK ? k[i] : v[i - NH * DK];
                double tol = fabs(x) >= 6.103515625e-5 ? fabs(x) * 0x1p-11 : 0x1p-25;
                if (fabs((double)r - x) > tol)
                    fail_msg("pos %d layer %d i %d: %g -> %g", p, l, i, x, r);
            }
            /* the raw halves sit where the layout says */
            const uint16_t *kr = (const uint16_t *)((uint8_t *)ag_kv_block_k(kv, l, t[p / BS]) +
                                                    L->head_stride_k + (p % BS) * L->row_bytes_k);
            assert_int_equal(kr[2], ag_kv_f32_to_f16(wk[p][l][DK + 2]));
        }
    ag_kv_free(kv);
}

/* ---- randomized model check --------------------------------------------- */

enum { RS = 6, RC = 6, RB = 28, MAXLEN = 120 };

typedef struct {
    bool     live;
    int32_t  len;
    uint32_t stamp[MAXLEN];
} mseq;

typedef struct { /* an outside holder, as the prefix cache will be */
    bool     used;
    int32_t  n, len;
    int32_t  blocks[MAXLEN / BS + 1];
    uint32_t stamp[MAXLEN];
} mentry;

typedef struct {
    ag_kv   *kv;
    uint32_t mod;
    uint32_t next_stamp;
    mseq     s[RS];
    mentry   c[RC];
    int      n_nomem;
} world;

static int32_t live_pick(world *w) {
    int32_t ids[RS], n = 0;
    for (int32_t i = 0; i < RS; i++)
        if (w->s[i].live) ids[n++] = i;
    return n ? ids[rnd(n)] : -1;
}

static int32_t seq_make(world *w) {
    int32_t   id;
    ag_status st = ag_kv_seq_new(w->kv, &id);
    if (st != AG_OK) {
        for (int32_t i = 0; i < RS; i++) assert_true(w->s[i].live);
        return -1;
    }
    assert_false(w->s[id].live);
    w->s[id].live = true;
    w->s[id].len = 0;
    return id;
}

/* Writes one position through the raw pointer path (slot + layout). */
static void raw_write(world *w, int32_t seq, int32_t pos, uint32_t stamp) {
    int32_t b, off;
    assert_int_equal(ag_kv_slot(w->kv, seq, pos, &b, &off), AG_OK);
    const ag_kv_layout *L = ag_kv_get_layout(w->kv);
    for (int l = 0; l < NL; l++)
        for (int h = 0; h < NH; h++)
            for (int kvsel = 0; kvsel < 2; kvsel++) {
                uint8_t *base = kvsel ? ag_kv_block_v(w->kv, l, b) : ag_kv_block_k(w->kv, l, b);
                size_t   hs = kvsel ? L->head_stride_v : L->head_stride_k;
                size_t   rb = kvsel ? L->row_bytes_v : L->row_bytes_k;
                int      dim = kvsel ? DV : DK;
                uint8_t *row = base + h * hs + (size_t)off * rb;
                for (int d = 0; d < dim; d++) {
                    float x = val(stamp, l, kvsel, h, d, w->mod);
                    if (L->dtype == AG_KV_F32) {
                        memcpy(row + d * 4, &x, 4);
                    } else {
                        uint16_t hx = ag_kv_f32_to_f16(x);
                        memcpy(row + d * 2, &hx, 2);
                    }
                }
            }
}

/* A block's image (copy format) holds the stamps at offsets [0, upto). */
static void check_block_image(world *w, int32_t block, const uint32_t *stamps, int32_t upto) {
    size_t  sz = ag_kv_block_bytes(w->kv);
    uint8_t buf[NH * BS * (DK + DV) * 4];
    assert_true(sz <= sizeof buf);
    bool f16 = ag_kv_get_layout(w->kv)->dtype == AG_KV_F16;
    for (int l = 0; l < NL; l++) {
        assert_int_equal(ag_kv_block_copy_out(w->kv, block, l, buf, sz), AG_OK);
        for (int32_t o = 0; o < upto; o++)
            for (int h = 0; h < NH; h++)
                for (int kvsel = 0; kvsel < 2; kvsel++) {
                    int    dim = kvsel ? DV : DK;
                    size_t first = kvsel ? (size_t)NH * BS * DK : 0;
                    for (int d = 0; d < dim; d++) {
                        size_t idx = first + ((size_t)h * BS + o) * dim + d;
                        float  got;
                        if (f16) {
                            uint16_t hx;
                            memcpy(&hx, buf + idx * 2, 2);
                            got = ag_kv_f16_to_f32(hx);
                        } else {
                            memcpy(&got, buf + idx * 4, 4);
                        }
                        if (got != val(stamps[o], l, kvsel, h, d, w->mod))
                            fail_msg("block %d layer %d offset %d: %g != %g", block, l, o, got,
                                     val(stamps[o], l, kvsel, h, d, w->mod));
                    }
                }
    }
}

/* The whole cache against the model: lengths, every stored value of every
 * live sequence and every held entry, and every block's refcount equal to
 * the number of table entries plus outside holds that name it. */
static void check_world(world *w) {
    int32_t count[RB];
    memset(count, 0, sizeof count);
    int64_t positions = 0;
    for (int32_t i = 0; i < RS; i++) {
        mseq *m = &w->s[i];
        assert_int_equal(ag_kv_seq_live(w->kv, i), m->live);
        if (!m->live) continue;
        assert_int_equal(ag_kv_seq_len(w->kv, i), m->len);
        positions += m->len;
        int32_t        nb;
        const int32_t *t = ag_kv_seq_blocks(w->kv, i, &nb);
        assert_true(nb >= (m->len + BS - 1) / BS);
        for (int32_t j = 0; j < nb; j++) count[t[j]]++;
        for (int32_t j = 0; j * BS < m->len; j++) {
            int32_t upto = m->len - j * BS < BS ? m->len - j * BS : BS;
            check_block_image(w, t[j], m->stamp + j * BS, upto);
        }
        if (m->len) check_pos(w->kv, i, m->len - 1, m->stamp[m->len - 1], w->mod);
    }
    for (int32_t e = 0; e < RC; e++) {
        mentry *c = &w->c[e];
        if (!c->used) continue;
        for (int32_t j = 0; j < c->n; j++) {
            count[c->blocks[j]]++;
            int32_t upto = c->len - j * BS < BS ? c->len - j * BS : BS;
            check_block_image(w, c->blocks[j], c->stamp + j * BS, upto);
        }
    }
    int32_t used = 0;
    for (int32_t b = 0; b < RB; b++) {
        assert_int_equal(ag_kv_block_refcount(w->kv, b), count[b]);
        used += count[b] > 0;
    }
    ag_kv_stats st;
    ag_kv_get_stats(w->kv, &st);
    assert_int_equal(st.blocks_used, used);
    assert_int_equal(st.blocks_free, RB - used);
    assert_int_equal(st.positions, positions);
}

/* Blocks a reserve of n_new needs, computed from the model's view: new
 * blocks past the table, plus a copy of every shared block from the tail on. */
static int32_t expected_need(world *w, int32_t seq, int32_t n_new) {
    int32_t        nb;
    const int32_t *t = ag_kv_seq_blocks(w->kv, seq, &nb);
    int32_t        len = w->s[seq].len;
    int32_t        last = (len + n_new - 1) / BS;
    int32_t        need = last + 1 > nb ? last + 1 - nb : 0;
    for (int32_t j = len / BS; j < nb; j++) need += ag_kv_block_refcount(w->kv, t[j]) > 1;
    return need;
}

static void op_append(world *w) {
    int32_t s = live_pick(w);
    if (s < 0) return;
    mseq   *m = &w->s[s];
    int32_t room = MAXLEN - m->len;
    if (room <= 0) return;
    int32_t     k = 1 + rnd(room < 20 ? room : 20);
    int32_t     need = expected_need(w, s, k);
    ag_kv_stats st;
    ag_kv_get_stats(w->kv, &st);
    ag_status r = ag_kv_seq_reserve(w->kv, s, k);
    if (need > st.blocks_free) {
        assert_int_equal(r, AG_ERR_NOMEM);
        char msg[96];
        snprintf(msg, sizeof msg, "KV cache full: need %d blocks, %d free", need, st.blocks_free);
        assert_string_equal(ag_error_message(), msg);
        w->n_nomem++;
        return;
    }
    assert_int_equal(r, AG_OK);
    /* Sometimes break the reservation by forking from this sequence before
     * writing; a write into a now-shared tail is refused until re-reserved. */
    if (rnd(8) == 0) {
        int32_t d = rnd(2) ? seq_make(w) : live_pick(w);
        if (d >= 0 && d != s) {
            assert_int_equal(ag_kv_fork(w->kv, d, s, m->len), AG_OK);
            w->s[d].len = m->len;
            memcpy(w->s[d].stamp, m->stamp, (size_t)m->len * sizeof *m->stamp);
            int32_t b, off;
            if (m->len % BS) {
                assert_int_equal(ag_kv_slot(w->kv, s, m->len, &b, &off), AG_ERR_INVALID);
                ag_kv_get_stats(w->kv, &st);
                r = ag_kv_seq_reserve(w->kv, s, k);
                if (st.blocks_free == 0) {
                    assert_int_equal(r, AG_ERR_NOMEM);
                    w->n_nomem++;
                    return;
                }
                assert_int_equal(r, AG_OK);
            }
            assert_int_equal(ag_kv_slot(w->kv, s, m->len, &b, &off), AG_OK);
        }
    }
    for (int32_t i = 0; i < k; i++) {
        uint32_t stamp = w->next_stamp++;
        if (rnd(2))
            raw_write(w, s, m->len + i, stamp);
        else
            write_pos(w->kv, s, m->len + i, stamp, w->mod);
        m->stamp[m->len + i] = stamp;
    }
    /* Usually commit all; sometimes only part (a failed or partial batch). */
    int32_t c = rnd(4) ? k : rnd(k + 1);
    assert_int_equal(ag_kv_seq_commit(w->kv, s, m->len + c), AG_OK);
    m->len += c;
}

static void op_trim(world *w) {
    int32_t s = live_pick(w);
    if (s < 0) return;
    int32_t len = w->s[s].len;
    int32_t n =
        rnd(3) ? rnd((len < 6 ? len : 6) + 1) : rnd(len + 1); /* mostly short, like rollbacks */
    assert_true(ag_kv_trimmable(w->kv, s, n));
    assert_int_equal(ag_kv_trim(w->kv, s, n), AG_OK);
    w->s[s].len -= n;
}

static void op_fork(world *w) {
    int32_t src = live_pick(w);
    if (src < 0) return;
    int32_t dst = rnd(2) ? seq_make(w) : live_pick(w);
    if (dst < 0) return;
    int32_t len = rnd(w->s[src].len + 1);
    if (dst == src) {
        assert_int_equal(ag_kv_fork(w->kv, dst, src, len), AG_ERR_INVALID);
        return;
    }
    assert_int_equal(ag_kv_fork(w->kv, dst, src, len), AG_OK);
    w->s[dst].len = len;
    memmove(w->s[dst].stamp, w->s[src].stamp, (size_t)len * sizeof(uint32_t));
}

static void op_free(world *w) {
    int32_t s = live_pick(w);
    if (s < 0) return;
    assert_int_equal(ag_kv_seq_free(w->kv, s), AG_OK);
    w->s[s].live = false;
}

static void op_hold(world *w) { /* the cache keeps a prefix of a sequence */
    int32_t s = live_pick(w);
    if (s < 0 || w->s[s].len == 0) return;
    int32_t e = rnd(RC);
    mentry *c = &w->c[e];
    if (c->used) return;
    int32_t        len = 1 + rnd(w->s[s].len);
    int32_t        nb;
    const int32_t *t = ag_kv_seq_blocks(w->kv, s, &nb);
    c->used = true;
    c->len = len;
    c->n = (len + BS - 1) / BS;
    for (int32_t j = 0; j < c->n; j++) {
        c->blocks[j] = t[j];
        assert_int_equal(ag_kv_block_ref(w->kv, t[j]), AG_OK);
    }
    memcpy(c->stamp, w->s[s].stamp, (size_t)len * sizeof(uint32_t));
}

static void op_release(world *w) {
    int32_t e = rnd(RC);
    mentry *c = &w->c[e];
    if (!c->used) return;
    for (int32_t j = 0; j < c->n; j++)
        assert_int_equal(ag_kv_block_unref(w->kv, c->blocks[j]), AG_OK);
    c->used = false;
}

static void op_adopt(world *w) {
    int32_t e = rnd(RC);
    mentry *c = &w->c[e];
    if (!c->used) return;
    int32_t s = rnd(2) ? seq_make(w) : live_pick(w);
    if (s < 0) return;
    assert_int_equal(ag_kv_seq_adopt(w->kv, s, c->blocks, c->n, c->len), AG_OK);
    w->s[s].len = c->len;
    memcpy(w->s[s].stamp, c->stamp, (size_t)c->len * sizeof(uint32_t));
}

static void randomized(ag_kv_dtype dt, uint64_t seed, int n_ops) {
    world *w = calloc(1, sizeof *w);
    w->kv = make_kv(dt, RB, RS);
    w->mod = dt == AG_KV_F16 ? MOD16 : MOD32;
    w->next_stamp = 1;
    rng_state = seed;
    int counts[7] = {0};
    for (int i = 0; i < n_ops; i++) {
        int op = rnd(100);
        if (op < 35)
            op_append(w), counts[0]++;
        else if (op < 55)
            op_trim(w), counts[1]++;
        else if (op < 67)
            op_fork(w), counts[2]++;
        else if (op < 75)
            op_free(w), counts[3]++;
        else if (op < 83)
            op_hold(w), counts[4]++;
        else if (op < 91)
            op_release(w), counts[5]++;
        else
            op_adopt(w), counts[6]++;
        if (rnd(5) == 0 || i == n_ops - 1) { /* seq_make may have run in any op */
            if (live_pick(w) < 0) seq_make(w);
        }
        check_world(w);
    }
    ag_kv_stats st;
    ag_kv_get_stats(w->kv, &st);
    /* The run must have exercised the interesting paths, not just appended. */
    assert_true(w->n_nomem > 0);
    assert_true(st.cow_copies > 0);
    assert_true(st.nomem_errors >= (uint64_t)w->n_nomem);
    /* Tear down through the API: all blocks come back. */
    for (int32_t e = 0; e < RC; e++)
        if (w->c[e].used)
            for (int32_t j = 0; j < w->c[e].n; j++)
                assert_int_equal(ag_kv_block_unref(w->kv, w->c[e].blocks[j]), AG_OK);
    for (int32_t s = 0; s < RS; s++)
        if (w->s[s].live) assert_int_equal(ag_kv_seq_free(w->kv, s), AG_OK);
    ag_kv_get_stats(w->kv, &st);
    assert_int_equal(st.blocks_free, RB);
    print_message("  seed %llu: %d nomem, %llu cow copies\n", (unsigned long long)seed, w->n_nomem,
                  (unsigned long long)st.cow_copies);
    ag_kv_free(w->kv);
    free(w);
}

static void randomized_f32(void **state) {
    for (uint64_t seed = 1; seed <= 3; seed++) randomized(AG_KV_F32, seed, 3000);
}

static void randomized_f16(void **state) {
    for (uint64_t seed = 11; seed <= 12; seed++) randomized(AG_KV_F16, seed, 3000);
}

/* The planning functions agree with what the pool really is once every
 * sequence has filled its context: ag_kv_layout_for's layout and count,
 * ag_kv_budget_for's budget (n_seqs full contexts, no more), and
 * ag_kv_memory_bytes against the stats of the filled cache. */
static void memory_plan_matches_a_full_pool(void **state) {
    (void)state;
    ag_kv_params p = ag_kv_default_params();
    p.n_layers = 3;
    p.n_kv_heads = 2;
    p.head_dim_k = 24;
    p.head_dim_v = 40;
    p.max_seqs = 3;
    const int32_t n_ctx = 100; /* not a multiple of the block size */
    ag_kv_layout  lay;
    assert_int_equal(ag_kv_layout_for(&p, &lay, NULL), AG_OK);
    p.budget_bytes = ag_kv_budget_for(&lay, p.max_seqs, n_ctx);
    int32_t n_blocks = 0;
    assert_int_equal(ag_kv_layout_for(&p, &lay, &n_blocks), AG_OK);
    assert_int_equal(n_blocks, p.max_seqs * ((n_ctx + lay.block_size - 1) / lay.block_size));
    size_t planned = 0;
    assert_int_equal(ag_kv_memory_bytes(&p, n_ctx, &planned), AG_OK);
    ag_kv *kv = NULL;
    assert_int_equal(ag_kv_init(&p, &kv), AG_OK);
    assert_memory_equal(ag_kv_get_layout(kv), &lay, sizeof lay);
    for (int i = 0; i < p.max_seqs; i++) {
        int32_t seq;
        assert_int_equal(ag_kv_seq_new(kv, &seq), AG_OK);
        assert_int_equal(ag_kv_seq_reserve(kv, seq, n_ctx), AG_OK);
        assert_int_equal(ag_kv_seq_commit(kv, seq, n_ctx), AG_OK);
    }
    ag_kv_stats st;
    ag_kv_get_stats(kv, &st);
    assert_int_equal(st.blocks_free, 0); /* the budget held exactly the contexts */
    assert_int_equal(st.n_blocks, n_blocks);
    assert_int_equal(st.pool_bytes + st.meta_bytes, planned);
    ag_kv_free(kv);
    p.head_dim_k = 0;
    assert_int_equal(ag_kv_layout_for(&p, &lay, NULL), AG_ERR_INVALID);
}


/* ---- the sliding-window ring ------------------------------------------- */

/* Three layers: 0 and 2 windowed (RW), 1 global, so the ring holds layers
 * 0 and 2 (indices 0 and 1 of its blocks) and the main pool layer 1. */
enum { RL = 3, RW = 20 };
static const int32_t k_rwin[RL] = {RW, 0, RW};

static ag_kv *make_ring_kv(int32_t main_blocks, int32_t ring_blocks, int32_t slack, int32_t max_seqs) {
    ag_kv_params p = ag_kv_default_params();
    p.n_layers = RL;
    p.n_kv_heads = NH;
    p.head_dim_k = DK;
    p.head_dim_v = DV;
    p.block_size = BS;
    p.dtype = AG_KV_F32;
    p.max_seqs = max_seqs;
    p.layer_window = k_rwin;
    p.ring = true;
    p.ring_slack = slack;
    p.ring_step = 8;
    p.ring_blocks = ring_blocks;
    size_t kr = ((size_t)NH * BS * DK * 4 + 63) / 64 * 64, vr = ((size_t)NH * BS * DV * 4 + 63) / 64 * 64;
    p.budget_bytes = (size_t)main_blocks * (kr + vr); /* the main pool: one layer a block */
    ag_kv *kv = NULL;
    assert_int_equal(ag_kv_init(&p, &kv), AG_OK);
    const ag_kv_layout *L = ag_kv_get_layout(kv);
    assert_int_equal(L->n_ring_layers, 2);
    assert_int_equal(L->ring_window, RW);
    assert_int_equal(L->block_bytes, kr + vr);
    assert_int_equal(L->ring_block_bytes, 2 * (kr + vr));
    ag_kv_stats st;
    ag_kv_get_stats(kv, &st);
    assert_int_equal(st.n_blocks, main_blocks);
    assert_int_equal(st.ring_blocks, ring_blocks);
    assert_true(ag_kv_layer_ring(kv, 0) && !ag_kv_layer_ring(kv, 1) && ag_kv_layer_ring(kv, 2));
    assert_false(ag_kv_can_trim(kv));
    return kv;
}

static void ring_write(ag_kv *kv, int32_t seq, int32_t pos, uint32_t stamp) {
    float k[NH * DK], v[NH * DV];
    for (int l = 0; l < RL; l++) {
        fill_pos(stamp, l, MOD32, k, v);
        assert_int_equal(ag_kv_write(kv, l, seq, pos, k, v), AG_OK);
    }
}

static void ring_append(ag_kv *kv, int32_t seq, int32_t n, const uint32_t *stamps) {
    int32_t len = ag_kv_seq_len(kv, seq);
    assert_int_equal(ag_kv_seq_reserve(kv, seq, n), AG_OK);
    for (int32_t i = 0; i < n; i++) ring_write(kv, seq, len + i, stamps[len + i]);
    assert_int_equal(ag_kv_seq_commit(kv, seq, len + n), AG_OK);
}

/* Every position of the global layer, and the window before len of the
 * windowed ones, read back as written; positions the ring let go cannot be
 * read from a windowed layer. */
static void ring_check(const ag_kv *kv, int32_t seq, const uint32_t *stamps) {
    const int32_t len = ag_kv_seq_len(kv, seq);
    float k[NH * DK], v[NH * DV], ek[NH * DK], ev[NH * DV];
    for (int32_t pos = 0; pos < len; pos++)
        for (int l = 0; l < RL; l++) {
            const bool in_window = l == 1 || pos >= len - RW + 1; /* what a query at len reads */
            if (!in_window && pos + RW + 8 + 2 * BS < len) { /* long gone */
                assert_int_equal(ag_kv_read(kv, l, seq, pos, k, v), AG_ERR_RANGE);
                continue;
            }
            if (!in_window) continue;
            fill_pos(stamps[pos], l, MOD32, ek, ev);
            assert_int_equal(ag_kv_read(kv, l, seq, pos, k, v), AG_OK);
            assert_memory_equal(k, ek, sizeof k);
            assert_memory_equal(v, ev, sizeof v);
        }
}

/* The trim limit computed here from what the ring holds (its first entry). */
static int32_t expected_limit(const ag_kv *kv, int32_t seq) {
    int32_t n, first;
    ag_kv_seq_ring_blocks(kv, seq, &n, &first);
    const int32_t len = ag_kv_seq_len(kv, seq);
    if (first == 0) return len;
    int32_t lim = len - (first * BS + RW - 1);
    return lim > 0 ? lim : 0;
}

static void ring_keeps_only_the_window(void **state) {
    (void)state;
    ag_kv *kv = make_ring_kv(64, 64, 0, 2);
    int32_t seq;
    assert_int_equal(ag_kv_seq_new(kv, &seq), AG_OK);
    uint32_t stamps[400];
    for (int i = 0; i < 400; i++) stamps[i] = 1000u + (uint32_t)i;
    for (int step = 0; step < 60; step++) {
        const int32_t before = ag_kv_seq_len(kv, seq);
        ring_append(kv, seq, 1 + step % 7, stamps);
        ring_check(kv, seq, stamps);
        int32_t n, first;
        const int32_t *rt = ag_kv_seq_ring_blocks(kv, seq, &n, &first);
        assert_non_null(rt);
        for (int32_t i = 0; i < n; i++) assert_true(i < first ? rt[i] == -1 : rt[i] >= 0);
        /* held: the window before the step's first position, rounded to blocks, and the step */
        assert_true((n - first) * BS <= RW + 7 + 2 * BS);
        ag_kv_stats st;
        ag_kv_get_stats(kv, &st);
        assert_int_equal(st.ring_blocks_free, 64 - (n - first));
        assert_int_equal(ag_kv_trim_limit(kv, seq), expected_limit(kv, seq));
        /* the step just taken can always be rolled back (no slack needed) */
        assert_true(ag_kv_trimmable(kv, seq, ag_kv_seq_len(kv, seq) - before));
    }
    /* an explicit recycle (a step's start) lets go of what a reserve would */
    {
        int32_t n0, f0, n1, f1;
        ag_kv_seq_ring_blocks(kv, seq, &n0, &f0);
        ag_kv_seq_recycle(kv, seq);
        ag_kv_seq_ring_blocks(kv, seq, &n1, &f1);
        const int32_t lo = ag_kv_seq_len(kv, seq) - RW + 1;
        assert_int_equal(n1, n0);
        assert_int_equal(f1, lo > 0 ? lo / BS : 0);
        assert_true(f1 >= f0);
        ring_check(kv, seq, stamps);
    }
    /* a trim past the limit is refused and changes nothing */
    const int32_t len = ag_kv_seq_len(kv, seq), lim = ag_kv_trim_limit(kv, seq);
    assert_true(lim < len);
    assert_false(ag_kv_trimmable(kv, seq, lim + 1));
    assert_int_equal(ag_kv_trim(kv, seq, lim + 1), AG_ERR_UNSUPPORTED);
    assert_int_equal(ag_kv_seq_len(kv, seq), len);
    ring_check(kv, seq, stamps);
    /* a trim within it, then new history over the dropped positions */
    assert_int_equal(ag_kv_trim(kv, seq, lim), AG_OK);
    for (int i = len - lim; i < 400; i++) stamps[i] = 50000u + (uint32_t)i;
    ring_check(kv, seq, stamps);
    ring_append(kv, seq, 6, stamps);
    ring_check(kv, seq, stamps);
    ag_kv_free(kv);
}

static void ring_slack_reaches_further_back(void **state) {
    (void)state;
    ag_kv *kv = make_ring_kv(64, 64, 12, 1);
    int32_t seq;
    assert_int_equal(ag_kv_seq_new(kv, &seq), AG_OK);
    uint32_t stamps[200];
    for (int i = 0; i < 200; i++) stamps[i] = 7u + (uint32_t)i;
    for (int step = 0; step < 40; step++) {
        ring_append(kv, seq, 3, stamps);
        /* with 12 positions of slack, 12 can always go, whatever the steps */
        assert_true(ag_kv_trimmable(kv, seq, 12 < ag_kv_seq_len(kv, seq) ? 12 : ag_kv_seq_len(kv, seq)));
    }
    assert_int_equal(ag_kv_trim(kv, seq, 12), AG_OK);
    for (int i = ag_kv_seq_len(kv, seq); i < 200; i++) stamps[i] = 90000u + (uint32_t)i;
    ring_append(kv, seq, 5, stamps);
    ring_check(kv, seq, stamps);
    ag_kv_free(kv);
}

static void ring_fork_adopt_swap(void **state) {
    (void)state;
    ag_kv *kv = make_ring_kv(128, 64, 0, 4);
    int32_t a, b, c;
    assert_int_equal(ag_kv_seq_new(kv, &a), AG_OK);
    assert_int_equal(ag_kv_seq_new(kv, &b), AG_OK);
    assert_int_equal(ag_kv_seq_new(kv, &c), AG_OK);
    uint32_t sa[200], sb[200];
    for (int i = 0; i < 200; i++) sa[i] = sb[i] = 300u + (uint32_t)i;
    for (int i = 0; i < 20; i++) ring_append(kv, a, 5, sa);
    assert_int_equal(ag_kv_seq_len(kv, a), 100);
    /* fork at the full length shares the window; a fork at a length whose window left the ring cannot be */
    assert_true(ag_kv_ring_covers(kv, a, 100));
    assert_false(ag_kv_ring_covers(kv, a, 50));
    assert_int_equal(ag_kv_fork(kv, b, a, 50), AG_ERR_UNSUPPORTED);
    assert_int_equal(ag_kv_fork(kv, b, a, 100), AG_OK);
    ring_check(kv, b, sb);
    /* the two continue apart: a copy-on-write of the shared ring tail */
    for (int i = 100; i < 200; i++) sb[i] = 7000u + (uint32_t)i;
    ring_append(kv, b, 9, sb);
    ring_append(kv, a, 9, sa);
    ring_check(kv, a, sa);
    ring_check(kv, b, sb);
    /* adopt: a's tables as the prefix cache would hand them */
    int32_t nb, rn, first;
    const int32_t *mt = ag_kv_seq_blocks(kv, a, &nb);
    const int32_t *rt = ag_kv_seq_ring_blocks(kv, a, &rn, &first);
    int32_t main_ids[64], ring_ids[64];
    memcpy(main_ids, mt, sizeof(int32_t) * (size_t)nb);
    memcpy(ring_ids, rt, sizeof(int32_t) * (size_t)rn);
    const int32_t len = ag_kv_seq_len(kv, a);
    assert_int_equal(ag_kv_seq_adopt_ring(kv, c, main_ids, ring_ids, nb, len), AG_OK);
    ring_check(kv, c, sa);
    const int32_t need = ag_kv_ring_first_needed(kv, len);
    assert_int_equal(need, (len - RW + 1) / BS);
    ring_ids[need] = -1; /* a hole in the window: not adoptable */
    assert_int_equal(ag_kv_seq_adopt_ring(kv, c, main_ids, ring_ids, nb, len), AG_ERR_UNSUPPORTED);
    assert_int_equal(ag_kv_seq_adopt(kv, c, main_ids, nb, len), AG_ERR_UNSUPPORTED);
    /* swap out and in: the history and the window come back */
    const size_t bytes = ag_kv_swap_bytes(kv, len);
    const ag_kv_layout *L = ag_kv_get_layout(kv);
    assert_int_equal(bytes, (size_t)nb * L->block_bytes + (size_t)(nb - need) * L->ring_block_bytes);
    void *buf = malloc(bytes);
    int32_t got;
    assert_int_equal(ag_kv_seq_swap_out(kv, a, buf, bytes, &got), AG_OK);
    assert_int_equal(got, len);
    assert_int_equal(ag_kv_seq_free(kv, a), AG_OK);
    assert_int_equal(ag_kv_seq_new(kv, &a), AG_OK);
    assert_int_equal(ag_kv_seq_swap_in(kv, a, len, buf, bytes), AG_OK);
    ring_check(kv, a, sa);
    ring_append(kv, a, 4, sa);
    ring_check(kv, a, sa);
    free(buf);
    /* everything back in the pools once the sequences go */
    for (int32_t s = 0; s < 4; s++)
        if (ag_kv_seq_live(kv, s)) assert_int_equal(ag_kv_seq_free(kv, s), AG_OK);
    ag_kv_stats st;
    ag_kv_get_stats(kv, &st);
    assert_int_equal(st.blocks_free, st.n_blocks);
    assert_int_equal(st.ring_blocks_free, st.ring_blocks);
    ag_kv_free(kv);
}

/* The hook the prefix cache installs: gives back the ring blocks it holds. */
typedef struct {
    ag_kv  *kv;
    int32_t held[64];
    int32_t n_held, calls;
} reclaim_state;

static int32_t reclaim_some(void *user, int32_t n) {
    reclaim_state *r = user;
    int32_t freed = 0;
    r->calls++;
    for (int32_t j = r->n_held - 1; j >= 0 && freed < n; j--) { /* only blocks no sequence holds */
        if (ag_kv_ring_block_refcount(r->kv, r->held[j]) != 1) continue;
        assert_int_equal(ag_kv_ring_block_unref(r->kv, r->held[j]), AG_OK);
        r->held[j] = r->held[--r->n_held];
        freed++;
    }
    return freed;
}

static void ring_pool_reclaims_from_holders(void **state) {
    (void)state;
    ag_kv *kv = make_ring_kv(64, 6, 0, 1);
    int32_t seq;
    assert_int_equal(ag_kv_seq_new(kv, &seq), AG_OK);
    uint32_t stamps[200];
    for (int i = 0; i < 200; i++) stamps[i] = 11u + (uint32_t)i;
    reclaim_state r = {.kv = kv};
    /* an outside holder keeps each ring block the sequence lets go */
    for (int step = 0; step < 12; step++) {
        int32_t n, first;
        const int32_t *rt = ag_kv_seq_ring_blocks(kv, seq, &n, &first);
        for (int32_t i = first; rt && i < n; i++) {
            bool have = false;
            for (int32_t j = 0; j < r.n_held; j++) have |= r.held[j] == rt[i];
            if (!have && r.n_held < 64) assert_int_equal(ag_kv_ring_block_ref(kv, rt[i]), AG_OK), r.held[r.n_held++] = rt[i];
        }
        ag_status st = ag_kv_seq_reserve(kv, seq, 8);
        if (st == AG_ERR_NOMEM) { /* no hook yet: refused, nothing changed; then the hook frees what it holds */
            assert_int_equal(r.calls, 0);
            ag_kv_set_ring_reclaim(kv, reclaim_some, &r);
            st = ag_kv_seq_reserve(kv, seq, 8);
            assert_true(r.calls > 0);
        }
        assert_int_equal(st, AG_OK);
        const int32_t len = ag_kv_seq_len(kv, seq);
        for (int32_t i = 0; i < 8; i++) ring_write(kv, seq, len + i, stamps[len + i]);
        assert_int_equal(ag_kv_seq_commit(kv, seq, len + 8), AG_OK);
        ring_check(kv, seq, stamps);
    }
    assert_true(r.calls > 0);
    while (r.n_held) assert_int_equal(ag_kv_ring_block_unref(kv, r.held[--r.n_held]), AG_OK);
    ag_kv_free(kv);
}

static void ring_memory_plan(void **state) {
    (void)state;
    ag_kv_params p = ag_kv_default_params();
    p.n_layers = RL;
    p.n_kv_heads = NH;
    p.head_dim_k = DK;
    p.head_dim_v = DV;
    p.block_size = BS;
    p.max_seqs = 3;
    p.layer_window = k_rwin;
    p.budget_bytes = 1 << 20;
    size_t off, on;
    assert_int_equal(ag_kv_memory_bytes(&p, 1000, &off), AG_OK);
    p.ring = true;
    assert_int_equal(ag_kv_memory_bytes(&p, 1000, &on), AG_OK);
    ag_kv *kv = NULL;
    assert_int_equal(ag_kv_init(&p, &kv), AG_OK);
    ag_kv_stats st;
    ag_kv_get_stats(kv, &st);
    /* the same budget buys a main pool of one layer a block, plus the ring's pool */
    const ag_kv_layout *L = ag_kv_get_layout(kv);
    assert_int_equal(st.ring_blocks, ag_kv_ring_blocks_for(&p, 3, p.ring_step) * 3 / 2);
    assert_int_equal(st.ring_pool_bytes, (size_t)st.ring_blocks * L->ring_block_bytes);
    assert_true(on > off); /* (same main budget: the ring pool comes on top) */
    ag_kv_free(kv);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(params_are_validated),
        cmocka_unit_test(layout_strides_match_spec),
        cmocka_unit_test(write_read_across_blocks),
        cmocka_unit_test(slot_protocol_is_enforced),
        cmocka_unit_test(trim_then_rewrite_equals_straight_history),
        cmocka_unit_test(trim_across_blocks_frees_them),
        cmocka_unit_test(fork_divergent_continuations_are_isolated),
        cmocka_unit_test(cow_copies_shared_tail_before_write),
        cmocka_unit_test(fork_len_inside_block),
        cmocka_unit_test(pool_exhaustion_then_reuse),
        cmocka_unit_test(sequence_ids_are_small_and_reused),
        cmocka_unit_test(refcounts_with_adopt_and_unref),
        cmocka_unit_test(block_copy_out_in_round_trip),
        cmocka_unit_test(f16_conversions),
        cmocka_unit_test(f16_storage_round_trips),
        cmocka_unit_test(randomized_f32),
        cmocka_unit_test(randomized_f16),
        cmocka_unit_test(memory_plan_matches_a_full_pool),
        cmocka_unit_test(ring_keeps_only_the_window),
        cmocka_unit_test(ring_slack_reaches_further_back),
        cmocka_unit_test(ring_fork_adopt_swap),
        cmocka_unit_test(ring_pool_reclaims_from_holders),
        cmocka_unit_test(ring_memory_plan),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
