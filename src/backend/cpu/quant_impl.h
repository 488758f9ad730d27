/* Internal to src/backend/cpu: block layouts and the per-ISA kernel table.
 *
 * The weight blocks are byte-for-byte ggml's (GGUF stores them that way).
 * They are declared packed so that any byte address is a valid block address:
 * GGUF's alignment is a file field, so a hostile file can place a tensor at an
 * odd offset, and we must not turn that into undefined behaviour (x86 loads
 * are fine unaligned; packed makes the compiler emit them as such). */
#ifndef AG_BACKEND_CPU_QUANT_IMPL_H
#define AG_BACKEND_CPU_QUANT_IMPL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "backend/cpu/quant.h"

#define AG_QK 32   /* elements per block of the legacy types */
#define AG_QK_K 256 /* elements per K-quant super-block */

#define AG_PACKED __attribute__((packed))

typedef struct AG_PACKED {
    uint16_t d; /* fp16 scale */
    uint8_t  qs[AG_QK / 2]; /* element j in low nibble of qs[j], j+16 in the high nibble */
} ag_block_q4_0;

typedef struct AG_PACKED {
    uint16_t d, m; /* fp16 scale and minimum: x = d*q + m */
    uint8_t  qs[AG_QK / 2];
} ag_block_q4_1;

typedef struct AG_PACKED {
    uint16_t d;
    uint8_t  qh[4]; /* bit j (little-endian u32) is bit 4 of element j */
    uint8_t  qs[AG_QK / 2];
} ag_block_q5_0;

typedef struct AG_PACKED {
    uint16_t d, m;
    uint8_t  qh[4];
    uint8_t  qs[AG_QK / 2];
} ag_block_q5_1;

typedef struct AG_PACKED {
    uint16_t d;
    int8_t   qs[AG_QK];
} ag_block_q8_0;

typedef struct AG_PACKED {
    uint8_t  scales[AG_QK_K / 16]; /* low nibble: scale, high nibble: min, per 16 elements */
    uint8_t  qs[AG_QK_K / 4];
    uint16_t d, dmin;
} ag_block_q2_K;

typedef struct AG_PACKED {
    uint8_t  hmask[AG_QK_K / 8];
    uint8_t  qs[AG_QK_K / 4];
    uint8_t  scales[12]; /* 16 6-bit signed scales (bias 32) */
    uint16_t d;
} ag_block_q3_K;

typedef struct AG_PACKED {
    uint16_t d, dmin;
    uint8_t  scales[12]; /* 8 6-bit scales and 8 6-bit mins, see ag_k4_scale_min */
    uint8_t  qs[AG_QK_K / 2];
} ag_block_q4_K;

typedef struct AG_PACKED {
    uint16_t d, dmin;
    uint8_t  scales[12];
    uint8_t  qh[AG_QK_K / 8];
    uint8_t  qs[AG_QK_K / 2];
} ag_block_q5_K;

typedef struct AG_PACKED {
    uint8_t  ql[AG_QK_K / 2];
    uint8_t  qh[AG_QK_K / 4];
    int8_t   scales[AG_QK_K / 16];
    uint16_t d;
} ag_block_q6_K;

/* MXFP4 (OCP microscaling FP4, gpt-oss's expert weights): 32 E2M1 values
 * sharing one E8M0 exponent. ggml keeps the values doubled (integers
 * ag_mxfp4_values) and the scale halved (ag_e8m0_half): x = v * 2^(e-128). */
typedef struct AG_PACKED {
    uint8_t e;              /* E8M0 exponent */
    uint8_t qs[AG_QK / 2];  /* element j in low nibble of qs[j], j+16 in the high nibble */
} ag_block_mxfp4;

/* The 16 E2M1 codes, doubled: 0, 0.5, 1, 1.5, 2, 3, 4, 6 and their negatives. */
static const int8_t ag_mxfp4_values[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

/* 2^(e-128), exactly (ggml's GGML_E8M0_TO_FP32_HALF): subnormal for e < 2. */
static inline float ag_e8m0_half(uint8_t e) {
    uint32_t bits = e < 2 ? 0x00200000u << e : (uint32_t)(e - 1) << 23;
    float    f;
    memcpy(&f, &bits, 4);
    return f;
}

/* Q8_K, ggml's layout: the activation format for the K-quant dots. */
typedef struct AG_PACKED {
    float   d;
    int8_t  qs[AG_QK_K];
    int16_t bsums[AG_QK_K / 16]; /* sum of each 16 consecutive qs */
} ag_block_q8_K;

/* Q8A: our activation format for the 32-element weight types. Like ggml's
 * original Q8_1 (float d and s): x ≈ d*qs, s = d*Σqs. A float scale (not
 * fp16) keeps activation error at the int8 rounding alone; s carries the
 * block sum that the offset types (Q4_1, Q5_1) need. */
typedef struct AG_PACKED {
    float  d;
    float  s;
    int8_t qs[AG_QK];
} ag_block_q8a;

_Static_assert(sizeof(ag_block_q4_0) == 18, "q4_0");
_Static_assert(sizeof(ag_block_q4_1) == 20, "q4_1");
_Static_assert(sizeof(ag_block_q5_0) == 22, "q5_0");
_Static_assert(sizeof(ag_block_q5_1) == 24, "q5_1");
_Static_assert(sizeof(ag_block_q8_0) == 34, "q8_0");
_Static_assert(sizeof(ag_block_q2_K) == 84, "q2_K");
_Static_assert(sizeof(ag_block_q3_K) == 110, "q3_K");
_Static_assert(sizeof(ag_block_q4_K) == 144, "q4_K");
_Static_assert(sizeof(ag_block_q5_K) == 176, "q5_K");
_Static_assert(sizeof(ag_block_q6_K) == 210, "q6_K");
_Static_assert(sizeof(ag_block_q8_K) == 292, "q8_K");
_Static_assert(sizeof(ag_block_mxfp4) == 17, "mxfp4");
_Static_assert(sizeof(ag_block_q8a) == 40, "q8a");

/* The 6-bit scale and min of sub-block j (0..7) of a Q4_K/Q5_K block:
 * bytes 0..3 hold scales 0..3 (low 6 bits) and the top 2 bits of scales
 * 4..7; bytes 4..7 the same for the mins; bytes 8..11 the low 4 bits of
 * scales 4..7 (low nibble) and mins 4..7 (high nibble). */
static inline void ag_k4_scale_min(int j, const uint8_t *q, uint8_t *sc, uint8_t *m) {
    if (j < 4) {
        *sc = q[j] & 63;
        *m  = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        *m  = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

/* The 16 signed scales (-32..31) of a Q3_K block. */
static inline void ag_q3k_scales(const uint8_t *s, int8_t out[16]) {
    for (int k = 0; k < 16; k++) {
        int lo = k < 8 ? (s[k] & 0xF) : (s[k - 8] >> 4);
        int hi = (s[8 + (k & 3)] >> (2 * (k >> 2))) & 3;
        out[k] = (int8_t)((lo | (hi << 4)) - 32);
    }
}

/* The same unpacking done four bytes at a time, for the SIMD kernels:
 * out[0..7] = scales 0..7, out[8..15] = mins 0..7. Scales 0..3 are the low 6
 * bits of bytes 0..3; scales 4..7 take their low nibble from bytes 8..11 and
 * bits 4..5 from the top 2 bits of bytes 0..3; the mins likewise with bytes
 * 4..7 and the high nibbles of bytes 8..11. */
static inline void ag_k4_scales_unpack(const uint8_t *q, uint8_t out[16]) {
    const uint32_t M6 = 0x3F3F3F3Fu, M4 = 0x0F0F0F0Fu, M2 = 0x03030303u;
    uint32_t       u0, u1, u2, w[4];
    memcpy(&u0, q, 4);
    memcpy(&u1, q + 4, 4);
    memcpy(&u2, q + 8, 4);
    w[0] = u0 & M6;
    w[1] = (u2 & M4) | (((u0 >> 6) & M2) << 4);
    w[2] = u1 & M6;
    w[3] = ((u2 >> 4) & M4) | (((u1 >> 6) & M2) << 4);
    memcpy(out, w, 16);
}

/* ag_q3k_scales four bytes at a time, without the -32 bias (0..63). Scale k
 * takes its low nibble from byte k (k < 8, low) or k-8 (high nibble) and
 * bits 4..5 from byte 8 + k%4, shifted by 2*(k/4). */
static inline void ag_q3k_scales_unpack(const uint8_t *s, uint8_t out[16]) {
    const uint32_t M4 = 0x0F0F0F0Fu, M2 = 0x03030303u;
    uint32_t       u0, u1, u2, w[4];
    memcpy(&u0, s, 4);
    memcpy(&u1, s + 4, 4);
    memcpy(&u2, s + 8, 4);
    w[0] = (u0 & M4) | ((u2 & M2) << 4);
    w[1] = (u1 & M4) | (((u2 >> 2) & M2) << 4);
    w[2] = ((u0 >> 4) & M4) | (((u2 >> 4) & M2) << 4);
    w[3] = ((u1 >> 4) & M4) | (((u2 >> 6) & M2) << 4);
    memcpy(out, w, 16);
}

/* The K-quant result (Q4_K, Q6_K). The scalar, AVX2 and AVX-512 dot kernels
 * and the AMX tiles (matmul_amx.c) all compute exactly this, bit for bit, so a
 * token's logits do not depend on which of them ran it: a decode batch of
 * 16+ sequences can then go to the AMX tiles (far less work per token) and
 * a request's greedy output stays the one it has alone. Per super-block s
 * the kernel finds the exact integers isum = Σ_j sc_j (q_j · x_j) and (Q4_K)
 * msum = Σ_j m_j Σx_j, then folds them into accumulator s % 4 with two
 * fmas; the row's result is (a0 + a2) + (a1 + a3). Four accumulators, not
 * one, so that the vector kernels fold four super-blocks at once. dy = the
 * activations' scale, d/dmin = the block's (Q6_K: dmin = msum = 0, which
 * leaves the accumulator unchanged). fmaf is exactly rounded everywhere. */
static inline void ag_kquant_fold(float acc[4], int64_t s, float dy, float d, float dmin, int32_t isum,
                                  int32_t msum) {
    float a = __builtin_fmaf(dy * d, (float)isum, acc[s & 3]);
    acc[s & 3] = __builtin_fmaf(-(dy * dmin), (float)msum, a);
}
static inline float ag_kquant_total(const float acc[4]) { return (acc[0] + acc[2]) + (acc[1] + acc[3]); }

/* Portable fp16 -> fp32 (exact, incl. subnormals, inf and NaN payloads). */
static inline float ag_fp16_to_fp32_portable(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t e = (h >> 10) & 0x1F, m = h & 0x3FF, bits;
    if (e == 0x1F) {
        bits = sign | 0x7F800000u | (m << 13);
    } else if (e != 0) {
        bits = sign | ((e + 112) << 23) | (m << 13);
    } else {
        /* zero or subnormal: m * 2^-24, exact in fp32 */
        float f = (float)m * 0x1p-24f;
        memcpy(&bits, &f, 4);
        bits |= sign;
    }
    float out;
    memcpy(&out, &bits, 4);
    return out;
}

/* One dot-product kernel: a weight row of n elements (n a multiple of the
 * type's block size) against nx (1..AG_DOT_MAX_NX) activation rows that lie
 * x_stride bytes apart, in the activation format of the weight type.
 * out[t] = Σ_i w[i] * x_t[i]. */
#define AG_DOT_MAX_NX 4
typedef void (*ag_dot_fn)(int64_t n, const void *w, const void *x, size_t x_stride, int nx,
                          float *out);
/* A GEMM micro-kernel: AG_GEMM_RM weight rows lying w_stride bytes apart
 * times nx (1..AG_DOT_MAX_NX) activation rows x_stride bytes apart;
 * y[t*ldy + r] = Σ_i w_r[i] * x_t[i]. Each unpacked weight block is reused
 * for all nx tokens and each activation block for all AG_GEMM_RM rows. NULL
 * in the table where an ISA has none (matmul then uses the dot kernel). */
#define AG_GEMM_RM 4
typedef void (*ag_gemm_fn)(int64_t n, const void *w, size_t w_stride, const void *x, size_t x_stride, int nx,
                           float *y, int64_t ldy);
/* Converts n floats to an activation row (n a multiple of the block size). */
typedef void (*ag_act_quant_fn)(const float *x, void *dst, int64_t n);

/* ---- token panels (the AVX2 prompt path) ----
 *
 * AG_PANEL_NT tokens' activation rows interleaved four bytes at a time, so
 * that one 32-byte load holds the same four elements of all eight tokens:
 * a kernel broadcasts four weight bytes against it and gets one int32 lane
 * per token, with no horizontal sums. The values (qs, d, bsums) are the
 * activation rows' own, moved (ag_panel_pack in quant.c), plus exact sums of
 * them, so a K-quant panel kernel can reproduce the dot kernels' result bit
 * for bit.
 * A panel row is n/block consecutive panel blocks. Tokens past the end of
 * the batch in the last panel are zero. Our own layout, never read from a
 * file, so not packed: the sizes are multiples of 32 and a panel buffer is
 * 64-byte aligned (matmul.c), which lets the kernels load it aligned. */
#define AG_PANEL_NT 8
typedef struct {
    float   d[AG_PANEL_NT];
    int16_t bsums[AG_QK_K / 32][AG_PANEL_NT][2]; /* [i][t]: token t's bsums 2i and 2i+1 */
    int16_t bpair[AG_QK_K / 64][AG_PANEL_NT][2]; /* [i][t]: Σqs of t's 32-element sub-blocks 2i, 2i+1 */
    int8_t  qs[AG_QK_K / 4][AG_PANEL_NT][4];     /* [c][t]: token t's elements 4c..4c+3 */
} ag_panel_q8k;

typedef struct {
    float   d[AG_PANEL_NT], s[AG_PANEL_NT]; /* each token's Q8A d and s */
    int32_t sum[AG_PANEL_NT];               /* Σqs of each token's block */
    int8_t  qs[AG_QK / 4][AG_PANEL_NT][4];
} ag_panel_q8a;

_Static_assert(sizeof(ag_panel_q8k) == 2464 && sizeof(ag_panel_q8k) % 32 == 0, "panel q8k");
_Static_assert(sizeof(ag_panel_q8a) == 352 && sizeof(ag_panel_q8a) % 32 == 0, "panel q8a");

/* Packs nt (1..AG_PANEL_NT) activation rows of n elements, x_stride bytes
 * apart, into one panel row at dst (zero tokens after nt). */
void ag_panel_pack(ag_act_format f, const void *x, size_t x_stride, int nt, int64_t n, void *dst);
/* Bytes of one panel row of n elements (0 for AG_ACT_F32 or a bad n). */
size_t ag_panel_row_bytes(ag_act_format f, int64_t n);

/* ---- window panels (decode rows of a verify window, Q4_K / Q6_K) ----
 *
 * The same idea as the token panels for a window of a few tokens: four
 * tokens per panel, so a window of 2..4 tokens fills a panel (an 8-token
 * panel would be half empty) and one of 5..8 takes two panels that share
 * each unpacked weight block. Two lane widths, one per kernel family:
 *  - 8 bytes (AVX2): qs[c][t][8], eight bytes of each of the four tokens
 *    per 32-byte vector, met by eight weight bytes broadcast (vpbroadcastq);
 *  - 16 bytes (AVX-512): qs16[g][t][16], 16 consecutive elements of each
 *    token per 64-byte vector, one token per 128-bit lane, met by a weight
 *    group's 16 bytes broadcast to the four lanes (a load, no shuffle).
 * Packed by ag_wpanel_pack from Q8_K rows (same values, plus exact sums);
 * tokens past the window are zero. 64-byte aligned in matmul.c, and the
 * size a multiple of 64, so every block's rows of 64 bytes are too. */
#define AG_WPANEL_NT 4
typedef struct {
    union {
        int8_t qs[AG_QK_K / 8][AG_WPANEL_NT][8];     /* 8-byte lanes: [c][t] token t's elements 8c..8c+7 */
        int8_t qs16[AG_QK_K / 16][AG_WPANEL_NT][16]; /* 16-byte lanes: [g][t] token t's elements 16g..16g+15 */
    };
    int16_t bsums[AG_QK_K / 32][AG_WPANEL_NT][2]; /* [i][t]: token t's bsums 2i and 2i+1 */
    int16_t bpair[AG_QK_K / 64][AG_WPANEL_NT][2]; /* [i][t]: Σqs of t's 32-element sub-blocks 2i, 2i+1 */
    float   d[AG_WPANEL_NT];
    float   pad[12]; /* to a multiple of 64 bytes */
} ag_wpanel_q8k;
_Static_assert(sizeof(ag_wpanel_q8k) == 1280 && sizeof(ag_wpanel_q8k) % 64 == 0, "wpanel q8k");

/* Packs nt (1..AG_WPANEL_NT) Q8_K rows of n elements, x_stride bytes apart,
 * into one window-panel row at dst (zero tokens after nt), in 16-byte
 * lanes (lanes16) or 8-byte lanes. */
void ag_wpanel_pack(const void *x, size_t x_stride, int nt, int64_t n, void *dst, bool lanes16);
/* Bytes of one window-panel row of n elements (0 for a bad n). */
size_t ag_wpanel_row_bytes(int64_t n);

/* A panel micro-kernel: nr (1..AG_GEMM_RM) weight rows w_stride bytes apart
 * times np (1..AG_PANEL_MAX_NP) panel rows xp_stride bytes apart, whose
 * first nt tokens are real: y[t*ldy + r] = Σ_i w_r[i] * x_t[i] for t < nt.
 * Each weight block is unpacked once for all np panels. A (row, token)
 * result depends on that row and token alone (never on nr, np, nt or the
 * token's lane); for Q4_K and Q6_K it is the dot kernels' result bit for
 * bit (ag_kquant_fold). NULL in the table where an ISA has none. */
#define AG_PANEL_MAX_NP 16
typedef void (*ag_panel_fn)(int64_t n, const void *w, size_t w_stride, int nr, const void *xp, size_t xp_stride,
                            int np, int64_t nt, float *y, int64_t ldy);

typedef struct {
    ag_dot_fn       dot[AG_TYPE_COUNT];
    ag_gemm_fn      gemm[AG_TYPE_COUNT];
    ag_panel_fn     panel[AG_TYPE_COUNT];
    ag_panel_fn     wpanel[AG_TYPE_COUNT]; /* the same on window panels (AG_WPANEL_NT tokens each) */
    bool            wpanel16;              /* the wpanel kernels read 16-byte lanes (ag_wpanel_pack) */
    ag_panel_fn     dpanel[AG_TYPE_COUNT]; /* decode rows on token panels (the dot kernels' bits), or NULL */
    ag_act_quant_fn quant_q8a;
    ag_act_quant_fn quant_q8k;
} ag_quant_kernels;

/* Fill the table entries the ISA implements; others are left as they are,
 * so a table starts as a copy of the scalar one and each level overrides. */
void ag_quant_kernels_scalar(ag_quant_kernels *k);
void ag_quant_kernels_avx2(ag_quant_kernels *k);
void ag_quant_kernels_avx512(ag_quant_kernels *k);
/* The AVX-512 VNNI token-panel kernel of Q4_K (dpanel), defined beside
 * the AVX2 panels whose machinery it shares. */
void ag_quant_panels_vnni(ag_quant_kernels *k);

/* The kernels for the active ISA (chosen once, see ag_cpu_isa_set). */
const ag_quant_kernels *ag_quant_kernels_active(void);

#endif
