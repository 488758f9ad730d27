/* Prompt GEMM on Intel AMX (AMX-INT8 tiles), for the weight types whose
 * blocks hold int8-able values: Q4_0, Q4_1, Q5_0, Q8_0, Q4_K, Q6_K.
 *
 * Arithmetic. Activations are quantized as the dot kernels do: per 32
 * elements for the legacy types (Q8A: float d, s = d*Σq), per 256 for the
 * K-quants (Q8_K). The legacy types: a weight "group" is 32 elements sharing
 * one float scale ws (d) and, for Q4_1, one offset mw (m). For each (row r,
 * token t) and group g, in group order:
 *
 *     acc = fma(ws[g][r] * xd[g][t], (float)isum[g][r][t], acc)
 *     acc = fma(mw[g][r], xs[g][t], acc)            (Q4_1)
 *
 * where isum is the exact int32 dot of the group's int8 weights and int8
 * activations (one TDPBSSD). That order differs from the dot kernels', so
 * for these types prompt and decode rows are kept apart (see ag_batch).
 * The K-quants (Q4_K, Q6_K; groups of 32 / 16) compute the canonical
 * arithmetic of ag_kquant_fold (quant_impl.h) in kquant_tile: bit for bit
 * what the scalar, AVX2 and AVX-512 dot kernels compute, so decode batches of
 * these types run here too (ag_matmul_decode_on_amx). Either way a token's
 * result depends only on its own activations, never on which other tokens
 * share the call or where it sits in the batch: the model relies on that
 * (prompt KV must not depend on how a prompt was chunked).
 *
 * Layout. C = A·B with A = 16 weight rows × K bytes (a panel, unpacked once
 * per task into [group block][row][32] int8, so a tile load has stride 32)
 * and B = activations in the VNNI layout (K/4 rows × 16 tokens × 4 bytes),
 * repacked once per call. C[r][t] lands in int32 tile rows = weight rows;
 * the float accumulators hold one weight row × 16 tokens each and are
 * transposed once per (panel, token tile) on the way out.
 *
 * AMX needs the OS's permission (arch_prctl ARCH_REQ_XCOMP_PERM) and a tile
 * configuration per thread; every task loads its configuration and releases
 * the tiles at its end. AUGUR_AMX=0 turns the path off (A/B, tests). */
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/matmul_amx.h"
#include "backend/cpu/quant_impl.h"
#include "base/switches.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))

#include <cpuid.h>
#include <pthread.h>
#include <sys/syscall.h>
#include <unistd.h>

#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA  18

static int             amx_ok;
static pthread_once_t  amx_once = PTHREAD_ONCE_INIT;

static void amx_probe(void) {
    if (ag_switch_off("AUGUR_AMX")) return;
    unsigned a, b, c, d;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return;
    /* EDX bit 24: AMX-TILE, bit 25: AMX-INT8; AVX-512 F/BW/VL and VNNI (ECX bit 11) for the rest */
    if (!(d & (1u << 24)) || !(d & (1u << 25))) return;
    if (!(b & (1u << 30)) || !(b & (1u << 31)) || !(b & (1u << 16)) || !(c & (1u << 11))) return; /* + VNNI */
    if (syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) != 0) return;
    amx_ok = 1;
}

bool ag_amx_available(void) {
    pthread_once(&amx_once, amx_probe);
    /* the path runs AVX-512 code around the tiles: a level forced below it
     * (AUGUR_CPU_ISA=avx2|scalar) wants none of that */
    return amx_ok && ag_cpu_isa_active() == AG_CPU_ISA_AVX512;
}

#else

bool ag_amx_available(void) { return false; }

#endif

bool ag_amx_supports(uint32_t w_type) {
    switch (w_type) {
    case AG_TYPE_Q4_0:
    case AG_TYPE_Q4_1:
    case AG_TYPE_Q5_0:
    case AG_TYPE_Q8_0:
    case AG_TYPE_Q4_K:
    case AG_TYPE_Q6_K: return true;
    default: return false;
    }
}

#define TILE     16  /* weight rows per panel, tokens per tile */
#define BLK      32  /* elements per activation block */
#define BT_BYTES 512 /* one block of 16 tokens in VNNI layout: 8 rows x 64 bytes */

/* Activations of one token tile: nb blocks of BT_BYTES, then xd[nb][16], xs[nb][16]. */
static size_t act_tile_bytes(int64_t n_in) {
    int64_t nb = n_in / BLK;
    return (size_t)nb * (BT_BYTES + 2 * TILE * sizeof(float));
}
/* A legacy-type weight panel: nb blocks of 16 rows x 32 int8, then
 * ws[nb][16], mw[nb][16]; sized for up to 2*nb groups, which also covers a
 * K-quant panel (kpanel_bytes) in the per-thread buffer. */
static size_t panel_bytes(int64_t n_in) {
    int64_t nb = n_in / BLK;
    return (size_t)nb * (TILE * BLK) + (size_t)(2 * nb) * 2 * TILE * sizeof(float);
}

/* The K-quant panel (see kquant_tile): q as above, then the sub-block
 * scales sc[ng][16] (int32), for Q4_K the mins mn[nb][16] (float), then the
 * super-blocks' d dd[nsb][16] and, for Q4_K, dmin dm[nsb][16] (float). */
typedef struct {
    const int8_t  *q;
    const int32_t *sc;
    const float   *mn, *dd, *dm;
} kpanel;
static size_t kpanel_bytes(uint32_t type, int64_t n_in) {
    const int64_t nb = n_in / BLK, nsb = n_in / 256;
    if (type == AG_TYPE_Q6_K) return (size_t)nb * TILE * BLK + (size_t)(2 * nb + nsb) * TILE * 4;
    return (size_t)nb * TILE * BLK + (size_t)(2 * nb + 2 * nsb) * TILE * 4;
}
static kpanel kpanel_at(uint32_t type, const uint8_t *base, int64_t n_in) {
    const int64_t nb = n_in / BLK, nsb = n_in / 256, ng = type == AG_TYPE_Q6_K ? 2 * nb : nb;
    kpanel k;
    k.q = (const int8_t *)base;
    k.sc = (const int32_t *)(base + (size_t)nb * TILE * BLK);
    const float *f = (const float *)(k.sc + ng * TILE);
    if (type == AG_TYPE_Q6_K) {
        k.mn = k.dm = NULL;
        k.dd = f;
    } else {
        k.mn = f;
        k.dd = f + nb * TILE;
        k.dm = k.dd + nsb * TILE;
    }
    return k;
}
static bool is_kquant(uint32_t type) { return type == AG_TYPE_Q4_K || type == AG_TYPE_Q6_K; }

/* One token's activations before the relayout: Q8A, or Q8_K (292 bytes per
 * 256 elements vs 40 per 32) where n_in allows. */
static size_t act_row_bytes(int64_t n_in) {
    size_t a = (size_t)(n_in / BLK) * sizeof(ag_block_q8a), k = (size_t)(n_in / 256) * sizeof(ag_block_q8_K);
    return a > k ? a : k;
}

static size_t round64(size_t b) { return (b + 63) & ~(size_t)63; }

/* The scratch layout ag_matmul_amx uses, in one place so the size and the
 * layout cannot disagree: the token tiles from a 64-byte aligned base, then
 * one 64-byte aligned slot per thread (its panel and one activation row).
 * (The size used to add a fixed 256 bytes for all the alignment, which 16
 * threads' slot rounding overran: a heap overflow on a 16-core AMX machine
 * at n_in = 896.) */
static size_t amx_tiles_bytes(int64_t n_in, int64_t n_tok) {
    return round64((size_t)((n_tok + TILE - 1) / TILE) * act_tile_bytes(n_in));
}
/* A window (one token tile) also keeps its tokens' int8 rows in plain
 * row-major order (the transposed Q4_K window's A tiles): TILE rows of
 * n_in bytes after the tile. Two tiles (n_tok > TILE) take more than one
 * tile and these rows, so the size grows with n_tok. */
static size_t amx_rows_bytes(int64_t n_in, int64_t n_tok) { return n_tok <= TILE ? round64((size_t)TILE * n_in) : 0; }
static size_t amx_thread_bytes(int64_t n_in) { return round64(panel_bytes(n_in) + act_row_bytes(n_in)); }

size_t ag_amx_scratch_size(int n_threads, int64_t n_in, int64_t n_tok) {
    if (n_in <= 0 || n_in % BLK || n_tok < 0 || n_threads < 1) return 0;
    return 63 /* aligning the base */ + amx_tiles_bytes(n_in, n_tok) + amx_rows_bytes(n_in, n_tok) +
           (size_t)n_threads * amx_thread_bytes(n_in);
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("amx-tile,amx-int8,avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c"))), \
                             apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("amx-tile,amx-int8,avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")
#endif

#include "backend/cpu/quant_x86.h"

typedef struct __attribute__((packed, aligned(64))) {
    uint8_t  palette, start_row;
    uint8_t  reserved[14];
    uint16_t colsb[16];
    uint8_t  rows[16];
} tile_config;

/* ldtilecfg with the whole 64-byte configuration as its memory operand.
 * GCC 12's _tile_loadconfig names only the first 8 bytes ("m" of a
 * pointer), so the compiler may drop the stores of colsb / rows before it
 * as dead (seen when this file was built with -mamx-tile: every later tile
 * instruction faulted). */
AI void tile_config_load(const tile_config *c) { __asm__ volatile("ldtilecfg %0" ::"m"(*c)); }

/* Tiles: 0,1,6 = C (16x16 int32); 2,4 = A (16 weight rows x K bytes);
 * 3,5 = B (K/4 rows x 64 bytes). K = 32, or 16 for Q6_K's groups. */
static void load_tiles(int k) {
    tile_config c;
    memset(&c, 0, sizeof c);
    c.palette = 1;
    c.colsb[0] = c.colsb[1] = c.colsb[6] = 64, c.rows[0] = c.rows[1] = c.rows[6] = 16;
    c.colsb[2] = c.colsb[4] = (uint16_t)k, c.rows[2] = c.rows[4] = 16;
    c.colsb[3] = c.colsb[5] = 64, c.rows[3] = c.rows[5] = (uint8_t)(k / 4);
    tile_config_load(&c);
}

/* 16 nibble bytes -> 32 bytes: low nibbles (elements 0..15), then high. */
AI __m256i nib32(const uint8_t *qs) {
    __m128i v = _mm_loadu_si128((const __m128i *)qs), m = _mm_set1_epi8(0xF);
    return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(v, 4), m), _mm_and_si128(v, m));
}
/* 32 bits -> 32 bytes, 0x10 where the bit is set. */
AI __m256i bit4_32(const uint8_t *qh) {
    uint32_t h;
    memcpy(&h, qh, 4);
    return _mm256_maskz_mov_epi8((__mmask32)h, _mm256_set1_epi8(0x10));
}
AI void store32(int8_t *dst, __m256i v) { _mm256_storeu_si256((__m256i *)dst, v); }

/* Unpacks weight row r (0..15) of a panel: groups' int8 values into
 * q[b][r][32], scales into ws[g*16 + r], offsets into mw[g*16 + r]. */
static void unpack_row(uint32_t type, const uint8_t *row, int64_t n_in, int r, int8_t *q, float *ws, float *mw) {
    const int64_t nb = n_in / BLK;
#define QDST(b) (q + ((size_t)(b) * TILE + r) * BLK)
    switch (type) {
    case AG_TYPE_Q4_0: {
        const ag_block_q4_0 *x = (const ag_block_q4_0 *)row;
        for (int64_t b = 0; b < nb; b++) {
            store32(QDST(b), _mm256_sub_epi8(nib32(x[b].qs), _mm256_set1_epi8(8)));
            ws[b * TILE + r] = f16(x[b].d);
        }
        break;
    }
    case AG_TYPE_Q4_1: {
        const ag_block_q4_1 *x = (const ag_block_q4_1 *)row;
        for (int64_t b = 0; b < nb; b++) {
            store32(QDST(b), nib32(x[b].qs));
            ws[b * TILE + r] = f16(x[b].d);
            mw[b * TILE + r] = f16(x[b].m);
        }
        break;
    }
    case AG_TYPE_Q5_0: {
        const ag_block_q5_0 *x = (const ag_block_q5_0 *)row;
        for (int64_t b = 0; b < nb; b++) {
            __m256i v = _mm256_or_si256(nib32(x[b].qs), bit4_32(x[b].qh));
            store32(QDST(b), _mm256_sub_epi8(v, _mm256_set1_epi8(16)));
            ws[b * TILE + r] = f16(x[b].d);
        }
        break;
    }
    case AG_TYPE_Q8_0: {
        const ag_block_q8_0 *x = (const ag_block_q8_0 *)row;
        for (int64_t b = 0; b < nb; b++) {
            store32(QDST(b), _mm256_loadu_si256((const __m256i *)x[b].qs));
            ws[b * TILE + r] = f16(x[b].d);
        }
        break;
    }
    }
#undef QDST
}

/* Unpacks weight row r (0..15, or a zero row past n_out when row is NULL)
 * of a K-quant panel at base (layout: kpanel_at). */
static void unpack_kquant_row(uint32_t type, const uint8_t *row, int64_t n_in, int r, uint8_t *base) {
    const int64_t nb = n_in / BLK, nsb = n_in / 256;
    const kpanel  k = kpanel_at(type, base, n_in);
    int8_t       *q = (int8_t *)k.q;
    int32_t      *sc = (int32_t *)k.sc;
    float        *mn = (float *)k.mn, *dd = (float *)k.dd, *dm = (float *)k.dm;
#define QDST(b) (q + ((size_t)(b) * TILE + r) * BLK)
    if (!row) {
        for (int64_t b = 0; b < nb; b++) memset(QDST(b), 0, BLK);
        for (int64_t g = 0; g < (type == AG_TYPE_Q6_K ? 2 * nb : nb); g++) sc[g * TILE + r] = 0;
        for (int64_t b = 0; mn && b < nb; b++) mn[b * TILE + r] = 0.0f;
        for (int64_t s = 0; s < nsb; s++) {
            dd[s * TILE + r] = 0.0f;
            if (dm) dm[s * TILE + r] = 0.0f;
        }
        return;
    }
    if (type == AG_TYPE_Q4_K) {
        const ag_block_q4_K *x = (const ag_block_q4_K *)row;
        const __m256i        m4 = _mm256_set1_epi8(0xF);
        for (int64_t s = 0; s < nsb; s++) {
            uint8_t sm[16];
            ag_k4_scales_unpack(x[s].scales, sm);
            for (int c = 0; c < 4; c++) {
                __m256i v = _mm256_loadu_si256((const __m256i *)(x[s].qs + 32 * c));
                int64_t b = 8 * s + 2 * c;
                store32(QDST(b), _mm256_and_si256(v, m4));
                store32(QDST(b + 1), _mm256_and_si256(_mm256_srli_epi16(v, 4), m4));
            }
            for (int j = 0; j < 8; j++) {
                sc[(8 * s + j) * TILE + r] = sm[j];
                mn[(8 * s + j) * TILE + r] = (float)sm[8 + j];
            }
            dd[s * TILE + r] = f16(x[s].d);
            dm[s * TILE + r] = f16(x[s].dmin);
        }
    } else {
        const ag_block_q6_K *x = (const ag_block_q6_K *)row;
        const __m256i        o = _mm256_set1_epi8(32);
        for (int64_t s = 0; s < nsb; s++) {
            for (int h = 0; h < 2; h++) {
                __m256i v[4];
                q6k_unpack_half(x[s].ql + 64 * h, x[s].qh + 32 * h, v);
                for (int c = 0; c < 4; c++) store32(QDST(8 * s + 4 * h + c), _mm256_sub_epi8(v[c], o));
            }
            /* group g (16 elements) of the super-block has scale g */
            for (int g = 0; g < 16; g++) sc[(16 * s + g) * TILE + r] = x[s].scales[g];
            dd[s * TILE + r] = f16(x[s].d);
        }
    }
#undef QDST
}

/* Zeroes row r of a legacy-type panel (rows past n_out). */
static void zero_row(int64_t nb, int r, int8_t *q, float *ws, float *mw) {
    for (int64_t b = 0; b < nb; b++) {
        memset(q + ((size_t)b * TILE + r) * BLK, 0, BLK);
        ws[b * TILE + r] = mw[b * TILE + r] = 0.0f;
    }
}

/* 16x16 float transpose in registers. */
AI void transpose16(__m512 r[16]) {
    __m512 t[16];
    for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int i = 0; i < 16; i += 4) {
        r[i] = _mm512_shuffle_ps(t[i], t[i + 2], 0x44);
        r[i + 1] = _mm512_shuffle_ps(t[i], t[i + 2], 0xEE);
        r[i + 2] = _mm512_shuffle_ps(t[i + 1], t[i + 3], 0x44);
        r[i + 3] = _mm512_shuffle_ps(t[i + 1], t[i + 3], 0xEE);
    }
    for (int i = 0; i < 4; i++) {
        t[i] = _mm512_shuffle_f32x4(r[i], r[i + 4], 0x88);
        t[i + 4] = _mm512_shuffle_f32x4(r[i], r[i + 4], 0xDD);
        t[i + 8] = _mm512_shuffle_f32x4(r[i + 8], r[i + 12], 0x88);
        t[i + 12] = _mm512_shuffle_f32x4(r[i + 8], r[i + 12], 0xDD);
    }
    for (int i = 0; i < 4; i++) {
        r[i] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0x88);
        r[i + 8] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0xDD);
        r[i + 4] = _mm512_shuffle_f32x4(t[i + 4], t[i + 12], 0x88);
        r[i + 12] = _mm512_shuffle_f32x4(t[i + 4], t[i + 12], 0xDD);
    }
}

/* acc[r] += (ws[r] * xd) * c[r] (+ mw[r] * xs) for the 16 rows of a C tile. */
AI void post_group(__m512 acc[16], const int32_t c[16][16], const float *ws, const float *mw, __m512 xd, __m512 xs,
                   const int has_min) {
#pragma GCC unroll 16
    for (int r = 0; r < 16; r++) {
        __m512 p = _mm512_cvtepi32_ps(_mm512_load_si512(c[r]));
        acc[r] = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_set1_ps(ws[r]), xd), p, acc[r]);
        if (has_min) acc[r] = _mm512_fmadd_ps(_mm512_set1_ps(mw[r]), xs, acc[r]);
    }
}

/* Loads group g's weight (A) and activation (B) tiles and issues its
 * product into C; QA(g) / BB(g) are defined by the function using it. */
#define ISSUE(g, A, B, C)           \
    do {                            \
        _tile_loadd(A, QA(g), BLK); \
        _tile_loadd(B, BB(g), 64);  \
        _tile_zero(C);              \
        _tile_dpbssd(C, A, B);      \
    } while (0)

/* One token tile against the panel: acc[r] = row r's results for the tile's
 * 16 tokens. Each group is one TDPBSSD. Three groups are in flight: when
 * group g's C tile is stored, its A/B tiles are free and group g+2 is
 * loaded and issued into them, so every product has two groups' vector
 * work (convert, scale, accumulate) to finish in. Tiles: C 0,1,6 in turn;
 * A/B 2,3 for even groups and 4,5 for odd ones. */
AI void token_tile(__m512 acc[16], const int8_t *q, const float *ws, const float *mw, const uint8_t *tile,
                   const int64_t nb, const int HAS_MIN) {
    const float  *xd = (const float *)(tile + (size_t)nb * BT_BYTES), *xs = xd + nb * TILE;
    _Alignas(64) int32_t c[2][16][16];
#pragma GCC unroll 16
    for (int r = 0; r < 16; r++) acc[r] = _mm512_setzero_ps();
#define QA(g) (q + (size_t)(g) * TILE * BLK)
#define BB(g) (tile + (size_t)(g) * BT_BYTES)
    /* drain group g from tile C, then reuse its A/B tiles for group g+2 into CN */
#define STEP(g, C, A, B, CN)                                                                               \
    do {                                                                                                   \
        _tile_stored(C, c[(g) & 1], 64);                                                                   \
        if ((g) + 2 < nb) ISSUE((g) + 2, A, B, CN);                                                        \
        post_group(acc, c[(g) & 1], ws + (g) * TILE, mw + (g) * TILE, _mm512_loadu_ps(xd + (g) * TILE),    \
                   HAS_MIN ? _mm512_loadu_ps(xs + (g) * TILE) : _mm512_setzero_ps(), HAS_MIN);              \
    } while (0)
    ISSUE(0, 2, 3, 0);
    if (nb > 1) ISSUE(1, 4, 5, 1);
    for (int64_t g = 0; g < nb; g += 6) {
        STEP(g, 0, 2, 3, 6);
        if (g + 1 >= nb) break;
        STEP(g + 1, 1, 4, 5, 0);
        if (g + 2 >= nb) break;
        STEP(g + 2, 6, 2, 3, 1);
        if (g + 3 >= nb) break;
        STEP(g + 3, 0, 4, 5, 6);
        if (g + 4 >= nb) break;
        STEP(g + 4, 1, 2, 3, 0);
        if (g + 5 >= nb) break;
        STEP(g + 5, 6, 4, 5, 1);
    }
#undef QA
#undef BB
#undef STEP
}

/* One token tile against a K-quant panel, in ag_kquant_fold's arithmetic:
 * per super-block the exact integers isum = Σ_g sc_g · C_g (int32 multiply
 * and add of the groups' C tiles) and, for Q4_K, msum = Σ_g m_g · bsum_g
 * (float, exact: integers below 2^24), folded with two fmas per (row,
 * token) into accumulator s % 4; out[r] = (a0 + a2) + (a1 + a3). Bit for
 * bit the dot kernels' result. Activations: xd = the super-block's d (per
 * 32-block), xs = the 32-block's Σx (exact). Tiles as in token_tile, two
 * groups in flight. */
#ifndef AMX_PF_GROUPS
#define AMX_PF_GROUPS 4
#endif
AI void kquant_tile(__m512 out[16], const kpanel *k, const uint8_t *tile, const int64_t nb, const int Q6, int pf) {
    const int8_t *q = k->q;
    const int64_t ng = Q6 ? 2 * nb : nb, gps = Q6 ? 16 : 8; /* groups per super-block */
    const float  *xd = (const float *)(tile + (size_t)nb * BT_BYTES), *xs = xd + nb * TILE;
    _Alignas(64) int32_t c[2][16][16];
    __m512i              isum[16];
    __m512               msum[16], acc[4][16];
#pragma GCC unroll 16
    for (int r = 0; r < 16; r++) {
        acc[0][r] = acc[1][r] = acc[2][r] = acc[3][r] = msum[r] = _mm512_setzero_ps();
        isum[r] = _mm512_setzero_si512();
    }
#define QA(g) (Q6 ? q + (size_t)((g) >> 1) * TILE * BLK + ((g) & 1) * 16 : q + (size_t)(g) * TILE * BLK)
#define BB(g) (Q6 ? tile + (size_t)((g) >> 1) * BT_BYTES + ((g) & 1) * 256 : tile + (size_t)(g) * BT_BYTES)
    ISSUE(0, 2, 3, 0);
    if (ng > 1) ISSUE(1, 4, 5, 1);
    for (int64_t g = 0; g < ng; g++) {
        const int64_t gs = g % gps;
        int32_t (*cb)[16] = c[g & 1];
        /* drain C(g), then reuse its A/B and C tiles for group g+2 */
        if (g & 1) {
            _tile_stored(1, cb, 64);
            if (g + 2 < ng) ISSUE(g + 2, 4, 5, 1);
        } else {
            _tile_stored(0, cb, 64);
            if (g + 2 < ng) ISSUE(g + 2, 2, 3, 0);
        }
        /* the panel streams from memory once per call when there is one
         * token tile (a decode batch): prefetch a few groups ahead, or every
         * tile load waits for DRAM. pf: only for a task's first token tile
         * (the panel is then in cache for the others) */
        if (pf && g + AMX_PF_GROUPS < ng) {
            /* the 32-byte rows of block (g+PF) (Q6_K: two groups per block) */
            const char *pa = (const char *)(q + (size_t)((g + AMX_PF_GROUPS) >> (Q6 ? 1 : 0)) * TILE * BLK);
            if (!Q6 || !(g & 1))
                for (int l = 0; l < TILE * BLK; l += 64) _mm_prefetch(pa + l, _MM_HINT_T0);
            _mm_prefetch((const char *)(k->sc + (g + AMX_PF_GROUPS) * TILE), _MM_HINT_T0);
            if (!Q6) _mm_prefetch((const char *)(k->mn + (g + AMX_PF_GROUPS) * TILE), _MM_HINT_T0);
        }
        const int32_t *scg = k->sc + g * TILE;
        if (gs == 0) {
#pragma GCC unroll 16
            for (int r = 0; r < 16; r++) isum[r] = _mm512_mullo_epi32(_mm512_load_si512(cb[r]), _mm512_set1_epi32(scg[r]));
        } else {
#pragma GCC unroll 16
            for (int r = 0; r < 16; r++)
                isum[r] = _mm512_add_epi32(isum[r], _mm512_mullo_epi32(_mm512_load_si512(cb[r]), _mm512_set1_epi32(scg[r])));
        }
        if (!Q6) {
            const __m512 bs = _mm512_loadu_ps(xs + g * TILE);
            const float *mng = k->mn + g * TILE;
            if (gs == 0) {
#pragma GCC unroll 16
                for (int r = 0; r < 16; r++) msum[r] = _mm512_mul_ps(_mm512_set1_ps(mng[r]), bs);
            } else {
#pragma GCC unroll 16
                for (int r = 0; r < 16; r++) msum[r] = _mm512_fmadd_ps(_mm512_set1_ps(mng[r]), bs, msum[r]);
            }
        }
        if (gs == gps - 1) {
            const int64_t s = g / gps;
            const int     a = (int)(s & 3);
            const __m512  dy = _mm512_loadu_ps(xd + s * 8 * TILE); /* any 32-block of the super-block */
            const float  *dds = k->dd + s * TILE;
#pragma GCC unroll 16
            for (int r = 0; r < 16; r++) {
                acc[a][r] = _mm512_fmadd_ps(_mm512_mul_ps(dy, _mm512_set1_ps(dds[r])), _mm512_cvtepi32_ps(isum[r]), acc[a][r]);
                if (!Q6)
                    acc[a][r] = _mm512_fnmadd_ps(_mm512_mul_ps(dy, _mm512_set1_ps(k->dm[s * TILE + r])), msum[r], acc[a][r]);
            }
        }
    }
#pragma GCC unroll 16
    for (int r = 0; r < 16; r++)
        out[r] = _mm512_add_ps(_mm512_add_ps(acc[0][r], acc[2][r]), _mm512_add_ps(acc[1][r], acc[3][r]));
#undef QA
#undef BB
}

typedef struct {
    uint32_t       type;
    const uint8_t *w;
    size_t         w_row_bytes;
    int64_t        n_out, n_in, n_tok;
    const float   *x;
    int64_t        ldx;
    float         *y;
    int64_t        ldy;
    uint8_t       *act;       /* token tiles, act_tile_bytes each */
    int8_t        *xrows;     /* a T-mode Q4_K window's tokens' int8 rows, n_in bytes apart, or NULL */
    const uint8_t *packed;    /* K-quants: the weights as panels (ag_amx_pack), or NULL */
    uint8_t       *per_thread; /* panel + one Q8A row, per thread */
    size_t         per_thread_bytes;
    int64_t        n_panels, tiles_per_task, n_tiles;
} amx_job;

/* Quantizes token tile `task` and lays it out for the B tiles. The
 * K-quants take Q8_K activations (one scale per 256), the others Q8A (one
 * per 32), as the dot kernels and llama.cpp do: a finer blocking would be
 * more accurate, but on a Qwen2.5 attention-sink token (a few channels
 * ~1e3 times the rest) it moved the logits far from llama.cpp's (KL 4 at
 * position 0) while matching exact arithmetic better. */
static void act_task(void *ctx, int64_t task, int thread) {
    const amx_job *j = ctx;
    const int64_t  nb = j->n_in / BLK;
    const int      kq = j->type == AG_TYPE_Q4_K || j->type == AG_TYPE_Q6_K;
    uint8_t       *tile = j->act + (size_t)task * act_tile_bytes(j->n_in);
    float         *xd = (float *)(tile + (size_t)nb * BT_BYTES), *xs = xd + nb * TILE;
    void          *row = j->per_thread + (size_t)thread * j->per_thread_bytes + panel_bytes(j->n_in);
    memset(tile, 0, act_tile_bytes(j->n_in));
    for (int t = 0; t < TILE; t++) {
        int64_t tok = task * TILE + t;
        if (tok >= j->n_tok) break;
        ag_quantize_act_row(kq ? AG_ACT_Q8K : AG_ACT_Q8A, j->x + tok * j->ldx, row, j->n_in);
        for (int64_t b = 0; b < nb; b++) {
            const int8_t *qs;
            if (kq) {
                const ag_block_q8_K *k = (const ag_block_q8_K *)row + b / 8;
                int                  sub = (int)(b % 8);
                qs = k->qs + 32 * sub;
                xd[b * TILE + t] = k->d;
                xs[b * TILE + t] = (float)(k->bsums[2 * sub] + k->bsums[2 * sub + 1]); /* exact */
                if (j->xrows) memcpy(j->xrows + tok * j->n_in + b * BLK, qs, BLK);
            } else {
                const ag_block_q8a *a = (const ag_block_q8a *)row + b;
                qs = a->qs;
                xd[b * TILE + t] = a->d;
                xs[b * TILE + t] = a->s;
            }
            uint8_t *bt = tile + (size_t)b * BT_BYTES + 4 * t;
            for (int k = 0; k < 8; k++) memcpy(bt + 64 * k, qs + 4 * k, 4);
        }
    }
}

static void mm_task(void *ctx, int64_t task, int thread) {
    const amx_job *j = ctx;
    const int64_t  nb = j->n_in / BLK, p = task % j->n_panels, tt0 = task / j->n_panels * j->tiles_per_task;
    const int      q6 = j->type == AG_TYPE_Q6_K;
    const int      has_min = j->type == AG_TYPE_Q4_1; /* legacy types; Q4_K's mins are kquant_tile's */
    uint8_t       *buf = j->per_thread + (size_t)thread * j->per_thread_bytes;
    int8_t        *q = (int8_t *)buf; /* legacy types' panel: q, ws[nb][16], mw[nb][16] */
    float         *ws = (float *)(buf + (size_t)nb * TILE * BLK), *mw = ws + nb * TILE;
    const int64_t  row0 = p * TILE;
    const int      rows = (int)(j->n_out - row0 < TILE ? j->n_out - row0 : TILE);

    const int kq = is_kquant(j->type);
    kpanel    kp = {0};
    if (kq && j->packed) {
        kp = kpanel_at(j->type, j->packed + (size_t)p * kpanel_bytes(j->type, j->n_in), j->n_in);
    } else if (kq) {
        for (int r = 0; r < TILE; r++)
            unpack_kquant_row(j->type, r < rows ? j->w + (size_t)(row0 + r) * j->w_row_bytes : NULL, j->n_in, r, buf);
        kp = kpanel_at(j->type, buf, j->n_in);
    } else {
        for (int r = 0; r < TILE; r++) {
            if (r < rows) unpack_row(j->type, j->w + (size_t)(row0 + r) * j->w_row_bytes, j->n_in, r, q, ws, mw);
            else zero_row(nb, r, q, ws, mw);
        }
        if (!has_min) memset(mw, 0, sizeof(float) * (size_t)nb * TILE);
    }

    load_tiles(q6 ? 16 : 32);
    int64_t tt1 = tt0 + j->tiles_per_task;
    if (tt1 > j->n_tiles) tt1 = j->n_tiles;
    for (int64_t tt = tt0; tt < tt1; tt++) {
        const uint8_t *tile = j->act + (size_t)tt * act_tile_bytes(j->n_in);
        __m512         acc[16];
        if (q6) kquant_tile(acc, &kp, tile, nb, 1, tt == tt0);
        else if (kq) kquant_tile(acc, &kp, tile, nb, 0, tt == tt0);
        else if (has_min) token_tile(acc, q, ws, mw, tile, nb, 1);
        else token_tile(acc, q, ws, mw, tile, nb, 0);
        /* acc[r] holds row r for 16 tokens; write token rows */
        transpose16(acc);
        const __mmask16 rm = (__mmask16)((1u << rows) - 1);
        for (int t = 0; t < TILE; t++) {
            int64_t tok = tt * TILE + t;
            if (tok >= j->n_tok) break;
            _mm512_mask_storeu_ps(j->y + tok * j->ldy + row0, rm, acc[t]);
        }
    }
    _tile_release();
}

/* ---- decode windows: one token tile against the K-quant blocks as stored ----
 *
 * A verify window (or a small decode batch) of at most 16 rows reads each
 * weight once, from its Q4_K / Q6_K blocks: no tile-ready copy (~1.3
 * bytes a weight, 2.3x Q4_K's bytes) streams from memory. Per task, a few
 * consecutive 16-row panels; per super-block, the 16 rows' blocks are
 * unpacked into a small double-buffered slot while the tiles work on the
 * other slot. The arithmetic is kquant_tile's, ag_kquant_fold's bits.
 *
 * Q4_K (window_panel): int8 values, the scales of all 16 rows at once by
 * gathers. What it costs is the vector work per group (a C tile of 16 rows
 * x 16 tokens times the rows' scales), so it is kept to that: the mins'
 * sums (msum) come once per super-block from int16 pairs (vpdpwssd over
 * the tokens' 32-block sums), not per group, and isum stays in 16
 * registers. Four C tiles rotate so a group's C is read one step after its
 * store. Q6_K (window_panel_q6, below): the scales go into the weights. */
typedef struct {
    /* [slot][plane 0..3][row][64]: plane 2j + h holds the nibbles h (0 low,
     * 1 high) of the row's qs bytes 64j..64j+63, that is groups 4j + h
     * (bytes 0..31) and 4j + 2 + h (32..63) */
    _Alignas(64) int8_t q[2][4 * TILE * 64];
    _Alignas(64) int32_t sc[2][8][TILE];  /* [slot][group][row] */
    _Alignas(64) int32_t mp[2][4][TILE];  /* Q4_K mins as int16 pairs: groups 2i | 2i+1 << 16 */
    _Alignas(64) float dd[2][TILE], dm[2][TILE];
} wslot;

/* The byte offsets of a panel's 16 rows, row_bytes apart: the gathers' index. */
AI __m512i row_offsets(size_t row_bytes) {
    return _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                              _mm512_set1_epi32((int)row_bytes));
}

/* Q4_K super-block s of the rows (`rows` of them real, row_bytes apart
 * from w) into slot b. Rows past `rows` read nothing and get zero scales,
 * mins, d and dmin, so whatever values they hold contribute 0. */
AI void window_unpack(const uint8_t *w, size_t row_bytes, int rows, int64_t s, wslot *ws, int b, int with_q) {
    const __mmask16 rm = (__mmask16)((1u << rows) - 1);
    const __m512i   idx = row_offsets(row_bytes);
    const __m512i   z = _mm512_setzero_si512(), FF = _mm512_set1_epi32(0xFF);
    const uint8_t *base = w + (size_t)s * sizeof(ag_block_q4_K);
    const __m512i  m4 = _mm512_set1_epi8(0xF);
    int8_t        *q = ws->q[b];
    for (int r = 0; with_q && r < rows; r++) {
        const uint8_t *qs = ((const ag_block_q4_K *)(base + (size_t)r * row_bytes))->qs;
        for (int j = 0; j < 2; j++) {
            const __m512i v = _mm512_loadu_si512(qs + 64 * j);
            _mm512_store_si512(q + ((2 * j) * TILE + r) * 64, _mm512_and_si512(v, m4));
            _mm512_store_si512(q + ((2 * j + 1) * TILE + r) * 64, _mm512_and_si512(_mm512_srli_epi16(v, 4), m4));
        }
    }
    const __m512i ud = _mm512_mask_i32gather_epi32(z, rm, idx, base, 1);
    const __m512i u0 = _mm512_mask_i32gather_epi32(z, rm, idx, base + 4, 1);
    const __m512i u1 = _mm512_mask_i32gather_epi32(z, rm, idx, base + 8, 1);
    const __m512i u2 = _mm512_mask_i32gather_epi32(z, rm, idx, base + 12, 1);
    const __m512i M6 = _mm512_set1_epi32(0x3F3F3F3F), M4 = _mm512_set1_epi32(0x0F0F0F0F),
                  M2 = _mm512_set1_epi32(0x03030303);
    /* ag_k4_scales_unpack in 16 lanes: w0 = scales 0-3, w1 = 4-7, w2 = mins 0-3, w3 = mins 4-7 */
    const __m512i w0 = _mm512_and_si512(u0, M6),
                  w1 = _mm512_or_si512(_mm512_and_si512(u2, M4),
                                       _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(u0, 6), M2), 4)),
                  w2 = _mm512_and_si512(u1, M6),
                  w3 = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(u2, 4), M4),
                                       _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(u1, 6), M2), 4));
    for (int j = 0; j < 4; j++) {
        _mm512_store_si512(ws->sc[b][j], _mm512_and_si512(_mm512_srli_epi32(w0, 8 * j), FF));
        _mm512_store_si512(ws->sc[b][4 + j], _mm512_and_si512(_mm512_srli_epi32(w1, 8 * j), FF));
    }
    /* bytes (m0, m1, m2, m3) -> int16 pairs (m0, m1) and (m2, m3) */
    const __m512i b0 = _mm512_set1_epi32(0xFF), b2 = _mm512_set1_epi32(0xFF0000);
    _mm512_store_si512(ws->mp[b][0], _mm512_or_si512(_mm512_and_si512(w2, b0), _mm512_and_si512(_mm512_slli_epi32(w2, 8), b2)));
    _mm512_store_si512(ws->mp[b][1], _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(w2, 16), b0), _mm512_and_si512(_mm512_srli_epi32(w2, 8), b2)));
    _mm512_store_si512(ws->mp[b][2], _mm512_or_si512(_mm512_and_si512(w3, b0), _mm512_and_si512(_mm512_slli_epi32(w3, 8), b2)));
    _mm512_store_si512(ws->mp[b][3], _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(w3, 16), b0), _mm512_and_si512(_mm512_srli_epi32(w3, 8), b2)));
    _mm512_store_ps(ws->dd[b], _mm512_cvtph_ps(_mm512_cvtepi32_epi16(ud)));
    _mm512_store_ps(ws->dm[b], _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(ud, 16))));
}

/* Tiles of the Q4_K window kernel: C 0..3 in turn (lanes x 64 bytes), A
 * 4/5 (lanes x 32 bytes) and B 6/7 (8 x 64 bytes) for even / odd groups
 * (K = 32). lanes: 16 weight rows, or with window_panel's T mode the
 * window's tokens. */
static void load_window_tiles(int lanes) {
    tile_config c;
    memset(&c, 0, sizeof c);
    c.palette = 1;
    for (int i = 0; i < 4; i++) c.colsb[i] = 64, c.rows[i] = (uint8_t)lanes;
    c.colsb[4] = c.colsb[5] = 32, c.rows[4] = c.rows[5] = (uint8_t)lanes;
    c.colsb[6] = c.colsb[7] = 64, c.rows[6] = c.rows[7] = 8;
    tile_config_load(&c);
}

/* The fold of super-block s (kquant_tile's arithmetic) into acc[s % 4]:
 * msum per row from the mins' pairs and the tokens' 32-block sums as int16
 * pairs (exact: |msum| < 2^31, and the float it becomes is the one the
 * other kernels accumulate exactly in float). */
AI void window_fold(int64_t s, const int Q6, const float *dd, const float *dm, const int32_t (*mp)[TILE], const float *xd,
                    const float *xs, const __m512i isum[16], __m512 acc[4][16]) {
    const int    a = (int)(s & 3);
    const __m512 dy = _mm512_loadu_ps(xd + s * 8 * TILE);
    __m512i      bp[4];
    if (!Q6)
        for (int i = 0; i < 4; i++) { /* tokens' sums of 32-blocks 8s + 2i and 8s + 2i + 1, as int16 pairs */
            const __m512i e = _mm512_cvtps_epi32(_mm512_loadu_ps(xs + (8 * s + 2 * i) * TILE));
            const __m512i o = _mm512_cvtps_epi32(_mm512_loadu_ps(xs + (8 * s + 2 * i + 1) * TILE));
            bp[i] = _mm512_or_si512(_mm512_and_si512(e, _mm512_set1_epi32(0xFFFF)), _mm512_slli_epi32(o, 16));
        }
#pragma GCC unroll 16
    for (int r = 0; r < 16; r++) {
        acc[a][r] = _mm512_fmadd_ps(_mm512_mul_ps(dy, _mm512_set1_ps(dd[r])), _mm512_cvtepi32_ps(isum[r]), acc[a][r]);
        if (!Q6) {
            __m512i m = _mm512_setzero_si512();
            for (int i = 0; i < 4; i++) m = _mm512_dpwssd_epi32(m, bp[i], _mm512_set1_epi32(mp[i][r]));
            acc[a][r] = _mm512_fnmadd_ps(_mm512_mul_ps(dy, _mm512_set1_ps(dm[r])), _mm512_cvtepi32_ps(m), acc[a][r]);
        }
    }
}

/* ---- Q4_K windows with the tokens as the A tiles ----
 *
 * window_panel (T = 0) computes C = 16 weight rows x 16 token lanes per
 * group, whatever the window's size: a 9-row verify window paid for 16
 * tokens in every tile product, C store and scaling. With T = 1 the roles
 * swap: A = the window's n tokens (their int8 rows, j->xrows), B = the
 * group's 32 weights of the 16 rows in VNNI order (B[k / 4][4 r + k % 4]
 * = q_r[k], window_unpack_t), C = n tokens x 16 rows, so a tile product,
 * its C store and the scaling (one vpmulld a token: the 16 rows' scales
 * are one vector) cost n rows, not 16. The fold is window_fold's with
 * rows and tokens swapped (products commute), so the bits are the same. */
typedef struct {
    _Alignas(64) uint8_t b[2][8][8][64]; /* [slot][group][k / 4][4 r + k % 4] */
} wslot_t;

/* Windows of up to this many tokens take window_panel's T mode: its cost
 * grows with the tokens, the 16-lane mode's does not. `quant_bench --window` Q4_K
 * 8960x1536, one thread, weights in cache, best of 6 alternated (ms):
 * 16 lanes 1.17-1.32 at every n; T mode 0.72 (1 token), 0.93
 * (5), 1.12 (8), 1.22 (9, 10), 1.28 / 1.36 at 11 / 12. Cold, 2 threads,
 * 8 alternated rounds, min / median: 16 lanes 0.66-0.71 / 0.73-0.84
 * at every n; T mode at 4 tokens 0.52 / 0.64, 8: 0.61 / 0.84, 9:
 * 0.68 / 0.89 (2026-12-05, the AMX Xeon). So up to 8. */
#define WINDOW_T_MAX_TOK 8

/* Super-block s's weights of the rows into slot bs (rows past `rows` read
 * zeros). Per 32-byte chunk c of qs: Z_p = [row p | row p + 8] (8 dwords
 * each), an 8 x 8 dword transpose in both 256-bit halves at once
 * (unpack 32, unpack 64), then one two-source permute a pair of outputs
 * joins rows 0-3 / 4-7 / 8-11 / 12-15: O_k = dword k of the 16 rows, the
 * B rows of groups 2c (low nibbles) and 2c + 1 (high). */
AI void window_unpack_t(const uint8_t *w, size_t row_bytes, int rows, int64_t s, wslot_t *wt, int bs) {
    static const _Alignas(64) uint8_t zeros[128];
    const __m512i m4 = _mm512_set1_epi8(0xF);
    const __m512i lo_idx = _mm512_set_epi64(13, 12, 5, 4, 9, 8, 1, 0), hi_idx = _mm512_set_epi64(15, 14, 7, 6, 11, 10, 3, 2);
    const uint8_t *src[16];
    for (int r = 0; r < 16; r++)
        src[r] = r < rows ? w + (size_t)r * row_bytes + (size_t)s * sizeof(ag_block_q4_K) + offsetof(ag_block_q4_K, qs)
                          : zeros;
#pragma GCC unroll 4
    for (int c = 0; c < 4; c++) {
        __m512i z[8], t[8], u[8];
#pragma GCC unroll 8
        for (int p = 0; p < 8; p++)
            z[p] = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(src[p] + 32 * c))),
                                      _mm256_loadu_si256((const __m256i *)(src[p + 8] + 32 * c)), 1);
#pragma GCC unroll 4
        for (int p = 0; p < 8; p += 2) {
            t[p] = _mm512_unpacklo_epi32(z[p], z[p + 1]);     /* dwords 0, 1 | 4, 5 of rows p, p + 1 */
            t[p + 1] = _mm512_unpackhi_epi32(z[p], z[p + 1]); /* 2, 3 | 6, 7 */
        }
#pragma GCC unroll 2
        for (int h = 0; h < 8; h += 4) { /* rows h..h+3 (and + 8): u[h + k] = dword k | k + 4 */
            u[h] = _mm512_unpacklo_epi64(t[h], t[h + 2]);
            u[h + 1] = _mm512_unpackhi_epi64(t[h], t[h + 2]);
            u[h + 2] = _mm512_unpacklo_epi64(t[h + 1], t[h + 3]);
            u[h + 3] = _mm512_unpackhi_epi64(t[h + 1], t[h + 3]);
        }
#pragma GCC unroll 4
        for (int k = 0; k < 4; k++) {
            const __m512i o[2] = {_mm512_permutex2var_epi64(u[k], lo_idx, u[4 + k]),  /* dword k of rows 0..15 */
                                  _mm512_permutex2var_epi64(u[k], hi_idx, u[4 + k])}; /* dword k + 4 */
#pragma GCC unroll 2
            for (int e = 0; e < 2; e++) {
                _mm512_store_si512(wt->b[bs][2 * c][k + 4 * e], _mm512_and_si512(o[e], m4));
                _mm512_store_si512(wt->b[bs][2 * c + 1][k + 4 * e], _mm512_and_si512(_mm512_srli_epi32(o[e], 4), m4));
            }
        }
    }
}

/* window_fold with tokens and rows swapped: isum[t] and acc[.][t] hold
 * token t's 16 rows; dy_t dd_r and the msum integers are the same
 * products (they commute), so every element gets window_fold's bits. */
AI void window_fold_t(int64_t s, const float *dd, const float *dm, const int32_t (*mp)[TILE], const float *xd,
                      const float *xs, int n, const __m512i isum[16], __m512 acc[4][16]) {
    const int    a = (int)(s & 3);
    const __m512 ddv = _mm512_load_ps(dd), dmv = _mm512_load_ps(dm);
    __m512i      mpv[4];
    for (int i = 0; i < 4; i++) mpv[i] = _mm512_load_si512(mp[i]);
    for (int t = 0; t < n; t++) {
        const __m512 dy = _mm512_set1_ps(xd[s * 8 * TILE + t]);
        acc[a][t] = _mm512_fmadd_ps(_mm512_mul_ps(dy, ddv), _mm512_cvtepi32_ps(isum[t]), acc[a][t]);
        __m512i m = _mm512_setzero_si512();
        for (int i = 0; i < 4; i++) { /* token t's sums of 32-blocks 8s + 2i, 8s + 2i + 1 as an int16 pair */
            const int e = (int)xs[(8 * s + 2 * i) * TILE + t], o = (int)xs[(8 * s + 2 * i + 1) * TILE + t];
            m = _mm512_dpwssd_epi32(m, _mm512_set1_epi32((e & 0xFFFF) | (int)((uint32_t)o << 16)), mpv[i]);
        }
        acc[a][t] = _mm512_fnmadd_ps(_mm512_mul_ps(dy, dmv), _mm512_cvtepi32_ps(m), acc[a][t]);
    }
}

/* One 16-row Q4_K panel (`rows` of them real, row_bytes apart from w)
 * against the token tile. T = 0: out[r] = row r for the tile's 16
 * tokens. T = 1 (the roles swapped, see above; wt and the tokens' rows xr,
 * n_in bytes apart): out[t] = token t's 16 rows, t < n. next: the panel
 * the task does after this one (prefetched), or NULL. */
AI void window_panel(__m512 out[16], const uint8_t *w, size_t row_bytes, int rows, int64_t nsb, const uint8_t *tile,
                     wslot *ws, const uint8_t *next, const int T, const int8_t *xr, int64_t n_in, int n, wslot_t *wt) {
    const int     gps = 8; /* groups per super-block */
    const size_t  bsz = sizeof(ag_block_q4_K);
    const int64_t ng = nsb * gps, nb = nsb * 8;
    const int     lanes = T ? n : 16; /* the C rows: tokens (T) or weight rows */
    const float  *xd = (const float *)(tile + (size_t)nb * BT_BYTES), *xs = xd + nb * TILE;
    _Alignas(64) int32_t c[2][16][16];
    __m512i              isum[16];
    __m512               acc[4][16];
#pragma GCC unroll 16
    for (int r = 0; r < 16; r++) {
        acc[0][r] = acc[1][r] = acc[2][r] = acc[3][r] = _mm512_setzero_ps();
        isum[r] = _mm512_setzero_si512(); /* set by each super-block's first group; this quiets -Wmaybe-uninitialized */
    }
    /* group g's A tile and its row stride, B tile; T: the tokens' rows and
     * the weights in VNNI order */
#define WA(g)                                                                                                   \
    (T ? (const void *)(xr + (size_t)(g) * 32)                                                                  \
       : (const void *)(ws->q[((g) / 8) & 1] + (size_t)((((g) % 8) >> 2) * 2 + ((g) & 1)) * TILE * 64 +         \
                        (((g) >> 1) & 1) * 32))
#define WAS    (T ? (int)n_in : 64)
#define WB(g)  (T ? (const void *)wt->b[((g) / 8) & 1][(g) % 8][0] : (const void *)(tile + (size_t)(g) * BT_BYTES))
#define WISSUE(g, A, B, C)                               \
    do {                                                 \
        _tile_loadd(A, WA(g), WAS);                      \
        _tile_loadd(B, WB(g), 64);                       \
        _tile_zero(C);                                   \
        if (T) _tile_dpbsud(C, A, B); /* s8 x u8 */      \
        else _tile_dpbssd(C, A, B);                      \
    } while (0)
    /* C's lane i (a weight row, or with T a token) times its group's scales, into isum */
#define WSCALE(first, gp)                                                                                        \
    do {                                                                                                         \
        const int32_t *scg = ws->sc[((gp) / gps) & 1][(gp) % gps];                                               \
        const __m512i  scv = _mm512_load_si512(scg);                                                             \
        _Pragma("GCC unroll 16") for (int i = 0; i < lanes; i++) {                                               \
            const __m512i p = _mm512_mullo_epi32(_mm512_load_si512(c[(gp) & 1][i]), T ? scv : _mm512_set1_epi32(scg[i])); \
            isum[i] = (first) ? p : _mm512_add_epi32(isum[i], p);                                                \
        }                                                                                                        \
    } while (0)
#define WFOLD(sp)                                                                                                     \
    do {                                                                                                              \
        const int b_ = (int)((sp) & 1);                                                                               \
        if (T) window_fold_t(sp, ws->dd[b_], ws->dm[b_], ws->mp[b_], xd, xs, n, isum, acc);                           \
        else window_fold(sp, 0, ws->dd[b_], ws->dm[b_], ws->mp[b_], xd, xs, isum, acc);                               \
    } while (0)
    window_unpack(w, row_bytes, rows, 0, ws, 0, !T);
    if (T) window_unpack_t(w, row_bytes, rows, 0, wt, 0);
    WISSUE(0, 4, 6, 0);
    if (ng > 1) WISSUE(1, 5, 7, 1);
    for (int64_t g = 0; g < ng; g++) {
        /* store C(g); issue g + 2 into g's A/B tiles and C((g + 2) % 4) */
        switch (g & 3) {
        case 0: _tile_stored(0, c[0], 64); if (g + 2 < ng) WISSUE(g + 2, 4, 6, 2); break;
        case 1: _tile_stored(1, c[1], 64); if (g + 2 < ng) WISSUE(g + 2, 5, 7, 3); break;
        case 2: _tile_stored(2, c[0], 64); if (g + 2 < ng) WISSUE(g + 2, 4, 6, 0); break;
        default: _tile_stored(3, c[1], 64); if (g + 2 < ng) WISSUE(g + 2, 5, 7, 1); break;
        }
        /* group g - 1, stored a step ago (a tile store read back at once stalls) */
        if (g > 0) {
            const int64_t gp = g - 1;
            WSCALE(gp % gps == 0, gp);
            if (gp % gps == gps - 1) WFOLD(gp / gps);
        }
        const int64_t gs = g % gps, s = g / gps;
        /* super-block s + 1 into the slot s - 1 used: its last group was
         * issued two steps ago and folded just now */
        if (gs == 0 && s + 1 < nsb) {
            window_unpack(w, row_bytes, rows, s + 1, ws, (int)((s + 1) & 1), !T);
            if (T) window_unpack_t(w, row_bytes, rows, s + 1, wt, (int)((s + 1) & 1));
        }
        if (gs == 1) { /* prefetch super-block s + 2 of the rows, or the next panel's first */
            const uint8_t *pf = s + 2 < nsb ? w + (size_t)(s + 2) * bsz : next ? next + (size_t)(s + 2 - nsb) * bsz : NULL;
            for (int r = 0; pf && r < 16; r++)
                for (size_t l = 0; l < bsz + 63; l += 64) _mm_prefetch((const char *)pf + (size_t)r * row_bytes + l, _MM_HINT_T0);
        }
    }
    WSCALE((ng - 1) % gps == 0, ng - 1);
    WFOLD(nsb - 1);
#pragma GCC unroll 16
    for (int i = 0; i < lanes; i++)
        out[i] = _mm512_add_ps(_mm512_add_ps(acc[0][i], acc[2][i]), _mm512_add_ps(acc[1][i], acc[3][i]));
#undef WA
#undef WAS
#undef WB
#undef WISSUE
#undef WSCALE
#undef WFOLD
}

/* ---- Q6_K windows on whole super-blocks: the scale folded into the weights ----
 *
 * Q6_K's groups are 16 elements: window_panel's way would spend 16 tile
 * products of K = 16 (a quarter of a tile's depth) and 16 C-tile scalings
 * per super-block (it did, until 2026-12-05: 1.8-2.6 ms against 1.3 for
 * `quant_bench --window` Q6_K 8960x1536 on 2 threads of the AMX Xeon,
 * alternated). Here each weight is multiplied by its group's scale while
 * unpacking: w = sc * (q - 32), |w| <= 4096, split into a low byte (w &
 * 0xFF, unsigned) and a high byte (w >> 8, signed, -16..16). Then isum =
 * Σ lo·x + 256 Σ hi·x is the same exact integer Σ_g sc_g (q_g · x_g) that
 * ag_kquant_fold takes (the bits of every other kernel), from 4 + 4 tile
 * products of K = 64 (TDPBUSD for the low bytes, TDPBSSD for the high) and
 * one C read per super-block. */
typedef struct {
    _Alignas(64) uint8_t lo[2][4][TILE][64]; /* [slot][K chunk][row][64]: elements 64c.. of the super-block */
    _Alignas(64) int8_t hi[2][4][TILE][64];
    _Alignas(64) float dd[2][TILE];
} wslot6;

/* Super-block s of the rows (`rows` real, row_bytes apart from w) into
 * slot b; rows past `rows` keep what they hold and get d = 0. */
AI void window_unpack_q6(const uint8_t *w, size_t row_bytes, int rows, int64_t s, wslot6 *ws, int b) {
    const uint8_t *base = w + (size_t)s * sizeof(ag_block_q6_K);
    const __m512i  m4 = _mm512_set1_epi8(0xF), m30 = _mm512_set1_epi8(0x30), lo8 = _mm512_set1_epi16(0xFF),
                  hi8 = _mm512_set1_epi16((short)0xFF00), k32 = _mm512_set1_epi16(32);
    /* the qh shifts of chunks 0/2 (words 0-15: 0, 16-31: 2) and 1/3 (4, 6) */
    const __m512i sh_even = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(2), 1);
    const __m512i sh_odd = _mm512_add_epi16(sh_even, _mm512_set1_epi16(4));
    /* chunk c's scale words: group 4c + lane, 8 words a lane */
    const __m512i lane_grp = _mm512_set_epi16(3, 3, 3, 3, 3, 3, 3, 3, 2, 2, 2, 2, 2, 2, 2, 2, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0,
                                              0, 0, 0, 0, 0, 0);
    for (int r = 0; r < rows; r++) {
        const ag_block_q6_K *x = (const ag_block_q6_K *)(base + (size_t)r * row_bytes);
        const __m512i        sc = _mm512_castsi256_si512(_mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)x->scales)));
        for (int h = 0; h < 2; h++) {
            const __m512i L = _mm512_loadu_si512(x->ql + 64 * h);
            const __m512i H = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(x->qh + 32 * h)));
            for (int o = 0; o < 2; o++) { /* chunk c = 2h + o: elements 128h + 64o .. + 63 */
                const int     c = 2 * h + o;
                const __m512i nib = o ? _mm512_and_si512(_mm512_srli_epi16(L, 4), m4) : _mm512_and_si512(L, m4);
                const __m512i hb = _mm512_slli_epi16(_mm512_srlv_epi16(H, o ? sh_odd : sh_even), 4);
                const __m512i q = _mm512_ternarylogic_epi32(nib, hb, m30, 0xF8); /* nib | (hb & 0x30): 0..63 */
                const __m512i scv = _mm512_permutexvar_epi16(_mm512_add_epi16(lane_grp, _mm512_set1_epi16((short)(4 * c))), sc);
                const __m512i pe = _mm512_mullo_epi16(_mm512_sub_epi16(_mm512_and_si512(q, lo8), k32), scv);
                const __m512i po = _mm512_mullo_epi16(_mm512_sub_epi16(_mm512_srli_epi16(q, 8), k32), scv);
                /* low bytes (pe & 0xFF) | (po << 8); high bytes (pe >> 8 & 0xFF) | (po & 0xFF00)
                 * (ternary logic 0xEA: (a & b) | c; 0xF8: a | (b & c)) */
                _mm512_store_si512(ws->lo[b][c][r], _mm512_ternarylogic_epi32(pe, lo8, _mm512_slli_epi16(po, 8), 0xEA));
                _mm512_store_si512(ws->hi[b][c][r], _mm512_ternarylogic_epi32(po, hi8, _mm512_srli_epi16(pe, 8), 0xEA));
            }
        }
    }
    const __mmask16 rm = (__mmask16)((1u << rows) - 1);
    const __m512i   idx = row_offsets(row_bytes);
    /* d is the block's last two bytes: gather the dword ending there */
    const __m512i ud = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), rm, idx, base + sizeof(ag_block_q6_K) - 4, 1);
    _mm512_store_ps(ws->dd[b], _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(ud, 16))));
}

/* Tiles of the Q6_K window: C 0/1 (low, high bytes) for even super-blocks,
 * 2/3 for odd ones; A 4 (low), 5 (high); B 6. All 16 rows x 64 bytes. */
static void load_window_q6_tiles(void) {
    tile_config c;
    memset(&c, 0, sizeof c);
    c.palette = 1;
    for (int i = 0; i < 7; i++) c.colsb[i] = 64, c.rows[i] = 16;
    tile_config_load(&c);
}

/* One 16-row Q6_K panel against the token tile (window_panel's contract). */
AI void window_panel_q6(__m512 out[16], const uint8_t *w, size_t row_bytes, int rows, int64_t nsb, const uint8_t *tile,
                        wslot6 *ws, const uint8_t *next) {
    const size_t bsz = sizeof(ag_block_q6_K);
    const float *xd = (const float *)(tile + (size_t)nsb * 8 * BT_BYTES);
    _Alignas(64) int32_t c[2][16][16];
    __m512               acc[4][16];
    __m512i              isum[16];
#pragma GCC unroll 16
    for (int r = 0; r < 16; r++) acc[0][r] = acc[1][r] = acc[2][r] = acc[3][r] = _mm512_setzero_ps();
    /* super-block s's products into C tiles cl (low bytes) and ch (high) */
#define W6ISSUE(s, cl, ch)                                                                        \
    do {                                                                                         \
        _tile_zero(cl);                                                                          \
        _tile_zero(ch);                                                                          \
        for (int k = 0; k < 4; k++) {                                                            \
            _tile_loadd(6, tile + ((size_t)(s) * 8 + 2 * k) * BT_BYTES, 64);                     \
            _tile_loadd(4, ws->lo[(s) & 1][k], 64);                                              \
            _tile_dpbusd(cl, 4, 6);                                                              \
            _tile_loadd(5, ws->hi[(s) & 1][k], 64);                                              \
            _tile_dpbssd(ch, 5, 6);                                                              \
        }                                                                                        \
    } while (0)
    window_unpack_q6(w, row_bytes, rows, 0, ws, 0);
    for (int64_t s = 0; s <= nsb; s++) {
        if (s < nsb) {
            if (s & 1) W6ISSUE(s, 2, 3);
            else W6ISSUE(s, 0, 1);
        }
        if (s > 0) { /* super-block s - 1: its products were issued a step ago */
            const int64_t sp = s - 1;
            if (sp & 1) {
                _tile_stored(2, c[0], 64);
                _tile_stored(3, c[1], 64);
            } else {
                _tile_stored(0, c[0], 64);
                _tile_stored(1, c[1], 64);
            }
#pragma GCC unroll 16
            for (int r = 0; r < 16; r++)
                isum[r] = _mm512_add_epi32(_mm512_load_si512(c[0][r]), _mm512_slli_epi32(_mm512_load_si512(c[1][r]), 8));
            window_fold(sp, 1, ws->dd[sp & 1], NULL, NULL, xd, NULL, isum, acc);
        }
        if (s + 1 < nsb) window_unpack_q6(w, row_bytes, rows, s + 1, ws, (int)((s + 1) & 1));
        { /* prefetch super-block s + 2 of the rows, or of the next panel */
            const int64_t  ps = s + 2;
            const uint8_t *pf = ps < nsb ? w + (size_t)ps * bsz : next && ps - nsb < nsb ? next + (size_t)(ps - nsb) * bsz : NULL;
            for (int r = 0; pf && r < 16; r++)
                for (size_t l = 0; l < bsz + 63; l += 64) _mm_prefetch((const char *)pf + (size_t)r * row_bytes + l, _MM_HINT_T0);
        }
    }
#undef W6ISSUE
#pragma GCC unroll 16
    for (int r = 0; r < 16; r++)
        out[r] = _mm512_add_ps(_mm512_add_ps(acc[0][r], acc[2][r]), _mm512_add_ps(acc[1][r], acc[3][r]));
}

static bool amx_window_t_on(void);

/* Task: panels [task * ppt, (task + 1) * ppt) of a window call (one token
 * tile; ppt in j->tiles_per_task). */
static void window_task(void *ctx, int64_t task, int thread) {
    const amx_job *j = ctx;
    const int64_t  nsb = j->n_in / 256, p0 = task * j->tiles_per_task;
    const int64_t  p1 = p0 + j->tiles_per_task < j->n_panels ? p0 + j->tiles_per_task : j->n_panels;
    const int      q6 = j->type == AG_TYPE_Q6_K, tr = j->xrows != NULL; /* set for T-mode windows alone */
    wslot          ws;
    wslot6         ws6;
    wslot_t        wt;
    if (q6) load_window_q6_tiles();
    else load_window_tiles(tr ? (int)j->n_tok : 16);
    for (int64_t p = p0; p < p1; p++) {
        const int64_t  row0 = p * TILE;
        const int      rows = (int)(j->n_out - row0 < TILE ? j->n_out - row0 : TILE);
        const uint8_t *w = j->w + (size_t)row0 * j->w_row_bytes, *next = p + 1 < p1 ? w + TILE * j->w_row_bytes : NULL;
        if (rows < TILE) { /* rows past n_out: defined values (scaled by 0) */
            if (q6) memset(ws6.lo, 0, sizeof ws6.lo), memset(ws6.hi, 0, sizeof ws6.hi);
            else memset(ws.q, 0, sizeof ws.q);
        }
        __m512          acc[16];
        const __mmask16 rm = (__mmask16)((1u << rows) - 1);
        if (tr) { /* acc[t]: token t's rows */
            window_panel(acc, w, j->w_row_bytes, rows, nsb, j->act, &ws, next, 1, j->xrows, j->n_in, (int)j->n_tok, &wt);
            for (int64_t t = 0; t < j->n_tok; t++) _mm512_mask_storeu_ps(j->y + t * j->ldy + row0, rm, acc[t]);
            continue;
        }
        if (q6) window_panel_q6(acc, w, j->w_row_bytes, rows, nsb, j->act, &ws6, next);
        else window_panel(acc, w, j->w_row_bytes, rows, nsb, j->act, &ws, next, 0, NULL, 0, 16, &wt);
        transpose16(acc);
        for (int64_t t = 0; t < j->n_tok; t++) _mm512_mask_storeu_ps(j->y + t * j->ldy + row0, rm, acc[t]);
    }
    _tile_release();
}

typedef struct {
    uint32_t       type;
    const uint8_t *w;
    size_t         w_row_bytes;
    int64_t        n_out, n_in;
    uint8_t       *dst;
} pack_job;

static void pack_task(void *ctx, int64_t p, int thread) {
    const pack_job *j = ctx;
    uint8_t        *base = j->dst + (size_t)p * kpanel_bytes(j->type, j->n_in);
    for (int r = 0; r < TILE; r++) {
        int64_t row = p * TILE + r;
        unpack_kquant_row(j->type, row < j->n_out ? j->w + (size_t)row * j->w_row_bytes : NULL, j->n_in, r, base);
    }
}

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

/* Whether the A/B switch `name` is on: off only when it is set to 0; read
 * once into *state (0 unknown, 1 on, 2 off). */
static bool switch_on(const char *name, _Atomic int *state) {
    if (!*state) *state = ag_switch_off(name) ? 2 : 1;
    return *state == 1;
}

/* AUGUR_AMX_WINDOW=0: windows take the tile-ready copy too (A/B). */
static bool amx_window_on(void) {
    static _Atomic int state;
    return switch_on("AUGUR_AMX_WINDOW", &state);
}

/* AUGUR_AMX_WINDOW_T=0: Q4_K windows take window_panel (16 token lanes
 * whatever the window) instead of its T mode (A/B; the same bits). */
static bool amx_window_t_on(void) {
    static _Atomic int state;
    return switch_on("AUGUR_AMX_WINDOW_T", &state);
}

/* One token tile of a K-quant is a window (window_task): the weights' own blocks. */
static bool amx_is_window(uint32_t w_type, int64_t n_tok) { return is_kquant(w_type) && n_tok <= TILE && amx_window_on(); }

bool ag_amx_reads_packed(uint32_t w_type, int64_t n_tok) { return is_kquant(w_type) && !amx_is_window(w_type, n_tok); }

size_t ag_amx_packed_size(uint32_t w_type, int64_t n_out, int64_t n_in) {
    if (!is_kquant(w_type) || n_out <= 0 || n_in <= 0 || n_in % 256) return 0;
    return (size_t)((n_out + TILE - 1) / TILE) * kpanel_bytes(w_type, n_in);
}

ag_status ag_amx_pack(ag_threadpool *pool, uint32_t w_type, const void *w, int64_t n_out, int64_t n_in, void *dst) {
    if (!ag_amx_available() || !ag_amx_packed_size(w_type, n_out, n_in) || !w || !dst)
        return ag_errorf(AG_ERR_INVALID, "matmul: cannot pack this weight for AMX");
    pack_job j = {w_type, w, ag_quant_row_bytes(w_type, n_in), n_out, n_in, dst};
    ag_threadpool_run(pool, (n_out + TILE - 1) / TILE, pack_task, &j);
    return AG_OK;
}

ag_status ag_matmul_amx(ag_threadpool *pool, uint32_t w_type, const void *w, const void *packed, int64_t n_out,
                        int64_t n_in, const float *x, int64_t ldx, int64_t n_tok, float *y, int64_t ldy,
                        void *scratch, size_t scratch_size) {
    if (!ag_amx_available() || !ag_amx_supports(w_type))
        return ag_errorf(AG_ERR_UNSUPPORTED, "matmul: no AMX kernel for this type or CPU");
    if (n_out <= 0 || n_tok <= 0) return AG_OK;
    int     threads = ag_threadpool_size(pool);
    size_t  need = ag_amx_scratch_size(threads, n_in, n_tok);
    if (need == 0 || !scratch || scratch_size < need)
        return ag_errorf(AG_ERR_INVALID, "matmul: AMX scratch of %zu bytes is too small", scratch_size);
    amx_job j = {0};
    j.type = w_type;
    j.w = w;
    j.packed = is_kquant(w_type) ? packed : NULL;
    j.w_row_bytes = ag_quant_row_bytes(w_type, n_in);
    j.n_out = n_out, j.n_in = n_in, j.n_tok = n_tok;
    j.x = x, j.ldx = ldx, j.y = y, j.ldy = ldy;
    uint8_t *base = (uint8_t *)(((uintptr_t)scratch + 63) & ~(uintptr_t)63);
    j.n_tiles = (n_tok + TILE - 1) / TILE;
    j.act = base;
    j.per_thread_bytes = amx_thread_bytes(n_in);
    /* the tokens' int8 rows only for a window that reads them (Q4_K, T mode) */
    const bool t_mode = w_type == AG_TYPE_Q4_K && n_tok <= WINDOW_T_MAX_TOK && amx_is_window(w_type, n_tok) &&
                        amx_window_t_on();
    j.xrows = t_mode ? (int8_t *)(base + amx_tiles_bytes(n_in, n_tok)) : NULL;
    j.per_thread = base + amx_tiles_bytes(n_in, n_tok) + amx_rows_bytes(n_in, n_tok);
    ag_threadpool_run(pool, j.n_tiles, act_task, &j);

    j.n_panels = (n_out + TILE - 1) / TILE;
    if (amx_is_window(w_type, n_tok)) {
        /* a window: the blocks as stored, a few consecutive panels a task */
        j.tiles_per_task = j.n_panels / (8 * threads) > 1 ? j.n_panels / (8 * threads) : 1;
        ag_threadpool_run(pool, (j.n_panels + j.tiles_per_task - 1) / j.tiles_per_task, window_task, &j);
        return AG_OK;
    }
    /* tokens per task: enough tiles to amortize unpacking the panel, few
     * enough that the tasks still spread over the threads */
    j.tiles_per_task = j.n_tiles;
    while (j.tiles_per_task > 4 && j.n_panels * ((j.n_tiles + j.tiles_per_task - 1) / j.tiles_per_task) < 4 * threads)
        j.tiles_per_task = (j.tiles_per_task + 1) / 2;
    if (j.tiles_per_task > 16) j.tiles_per_task = 16;
    int64_t n_chunks = (j.n_tiles + j.tiles_per_task - 1) / j.tiles_per_task;
    ag_threadpool_run(pool, j.n_panels * n_chunks, mm_task, &j);
    return AG_OK;
}

#else

bool ag_amx_reads_packed(uint32_t w_type, int64_t n_tok) { return false; }

size_t ag_amx_packed_size(uint32_t w_type, int64_t n_out, int64_t n_in) { return 0; }

ag_status ag_amx_pack(ag_threadpool *pool, uint32_t w_type, const void *w, int64_t n_out, int64_t n_in, void *dst) {
    return ag_errorf(AG_ERR_UNSUPPORTED, "matmul: AMX is not available on this platform");
}

ag_status ag_matmul_amx(ag_threadpool *pool, uint32_t w_type, const void *w, const void *packed, int64_t n_out,
                        int64_t n_in, const float *x, int64_t ldx, int64_t n_tok, float *y, int64_t ldy,
                        void *scratch, size_t scratch_size) {
    return ag_errorf(AG_ERR_UNSUPPORTED, "matmul: AMX is not available on this platform");
}

#endif
