/* Device-side decoding of GGUF weight blocks, shared by the CUDA kernels.
 *
 * The quantized types are read in units of 32 consecutive elements ("a
 * unit"): a whole block of the 32-element types, one 32-element sub-block of
 * a 256-element K-quant block. The float types (F32, F16, BF16) are read
 * element by element (cq_load), since their rows may be any length. decode_unit() writes the unit's 32 floats in
 * element order, computed as ggml's dequantize_row_* computes them (same
 * float operations), so a dequantized weight equals the CPU's
 * ag_dequant_row bit for bit.
 *
 * Blocks are byte-packed at even sizes (18, 20, 22, 34, 144, 210 bytes;
 * MXFP4's 17: byte loads only), so reads are 1- or 2-byte loads; the GEMV kernels' bandwidth comes from many
 * lanes reading consecutive blocks at once. */
#ifndef AG_CUDA_QUANT_CUH
#define AG_CUDA_QUANT_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

/* ggml type ids (gguf/gguf.h ag_tensor_type) of the types decoded here */
enum {
    CQ_F32 = 0,
    CQ_F16 = 1,
    CQ_Q4_0 = 2,
    CQ_Q4_1 = 3,
    CQ_Q5_0 = 6,
    CQ_Q5_1 = 7,
    CQ_Q8_0 = 8,
    CQ_Q4_K = 12,
    CQ_Q6_K = 14,
    CQ_BF16 = 30,
    CQ_MXFP4 = 39,
};

static __device__ __forceinline__ float cq_h2f(const uint8_t *p) {
    return __half2float(__ushort_as_half(*(const uint16_t *)p));
}


/* Q4_K: the 6-bit scale and min of sub-block j (ggml's get_scale_min_k4),
 * from the 12 scale bytes held in three words (no array, so nothing goes
 * to local memory for a run-time j). */
static __device__ __forceinline__ uint32_t cq_byte(int j, uint32_t w0, uint32_t w1, uint32_t w2) {
    const uint32_t w = j < 4 ? w0 : j < 8 ? w1 : w2;
    return (w >> (8 * (j & 3))) & 0xFF;
}
static __device__ __forceinline__ void cq_k4_scale_min_w(int j, uint32_t w0, uint32_t w1, uint32_t w2, float *sc,
                                                         float *mn) {
    uint32_t d, m;
    if (j < 4) {
        d = cq_byte(j, w0, w1, w2) & 63;
        m = cq_byte(j + 4, w0, w1, w2) & 63;
    } else {
        d = (cq_byte(j + 4, w0, w1, w2) & 0xF) | ((cq_byte(j - 4, w0, w1, w2) >> 6) << 4);
        m = (cq_byte(j + 4, w0, w1, w2) >> 4) | ((cq_byte(j, w0, w1, w2) >> 6) << 4);
    }
    *sc = (float)d;
    *mn = (float)m;
}

/* MXFP4 (gpt-oss's experts; ggml's layout, cpu/quant_impl.h): code q's
 * value doubled, as ggml's table kvalues_mxfp4 {0, 1, 2, 3, 4, 6, 8, 12}
 * and negatives, from the nibbles of a constant (no __constant__ table:
 * see common.cuh); code 8 is 0, as in the table. */
static __device__ __forceinline__ int cq_mxfp4_val(uint32_t q) {
    const int v = (int)((0xC8643210u >> (4 * (q & 7))) & 0xF);
    return q & 8 ? -v : v;
}
/* ggml's GGML_E8M0_TO_FP32_HALF: 2^(e-128) exactly, subnormal for e < 2
 * (cpu/quant_impl.h ag_e8m0_half) */
static __device__ __forceinline__ float cq_e8m0_half(uint32_t e) {
    return __uint_as_float(e < 2 ? 0x00200000u << e : (e - 1) << 23);
}

/* Units per block and bytes per block of a quantized type; 0 units for
 * the float types and unsupported ones. */
static __host__ __device__ inline void cq_geometry(int type, int *units_per_block, int *block_bytes) {
    int u = 0, b = 0;
    switch (type) {
    case CQ_Q4_0: u = 1, b = 18; break;
    case CQ_Q4_1: u = 1, b = 20; break;
    case CQ_Q5_0: u = 1, b = 22; break;
    case CQ_Q5_1: u = 1, b = 24; break;
    case CQ_Q8_0: u = 1, b = 34; break;
    case CQ_Q4_K: u = 8, b = 144; break;
    case CQ_Q6_K: u = 8, b = 210; break;
    case CQ_MXFP4: u = 1, b = 17; break;
    default: break;
    }
    *units_per_block = u;
    *block_bytes = b;
}

/* Element k of a row of a float type (F32, F16, BF16); any row length. */
template <int TYPE>
static __device__ __forceinline__ float cq_load(const uint8_t *row, int64_t k) {
    if (TYPE == CQ_F32) return ((const float *)row)[k];
    if (TYPE == CQ_F16) return __half2float(((const __half *)row)[k]);
    return __bfloat162float(((const __nv_bfloat16 *)row)[k]);
}

static __host__ __device__ inline bool cq_is_float(int type) {
    return type == CQ_F32 || type == CQ_F16 || type == CQ_BF16;
}

/* The 32 floats of unit `u` (0-based, counted from the start of the row)
 * of a row of `type` at `row`. TYPE is a template parameter so each kernel
 * instance has one straight-line decoder. */
template <int TYPE>
static __device__ __forceinline__ void decode_unit(const uint8_t *row, int u, float out[32]) {
    if (TYPE == CQ_Q4_0) {
        const uint8_t *b = row + (size_t)u * 18;
        float d = cq_h2f(b);
#pragma unroll
        for (int j = 0; j < 16; j++) {
            uint8_t q = b[2 + j];
            out[j] = (float)((int)(q & 0xF) - 8) * d;
            out[j + 16] = (float)((int)(q >> 4) - 8) * d;
        }
    } else if (TYPE == CQ_Q4_1) {
        const uint8_t *b = row + (size_t)u * 20;
        float d = cq_h2f(b), m = cq_h2f(b + 2);
#pragma unroll
        for (int j = 0; j < 16; j++) {
            uint8_t q = b[4 + j];
            out[j] = (float)(q & 0xF) * d + m;
            out[j + 16] = (float)(q >> 4) * d + m;
        }
    } else if (TYPE == CQ_Q5_0) {
        const uint8_t *b = row + (size_t)u * 22;
        float d = cq_h2f(b);
        uint32_t qh = (uint32_t)b[2] | ((uint32_t)b[3] << 8) | ((uint32_t)b[4] << 16) | ((uint32_t)b[5] << 24);
#pragma unroll
        for (int j = 0; j < 16; j++) {
            uint8_t q = b[6 + j];
            int x0 = (int)((q & 0xF) | (((qh >> j) & 1) << 4)) - 16;
            int x1 = (int)((q >> 4) | (((qh >> (j + 16)) & 1) << 4)) - 16;
            out[j] = (float)x0 * d;
            out[j + 16] = (float)x1 * d;
        }
    } else if (TYPE == CQ_Q5_1) {
        const uint8_t *b = row + (size_t)u * 24;
        float d = cq_h2f(b), m = cq_h2f(b + 2);
        uint32_t qh = (uint32_t)b[4] | ((uint32_t)b[5] << 8) | ((uint32_t)b[6] << 16) | ((uint32_t)b[7] << 24);
#pragma unroll
        for (int j = 0; j < 16; j++) {
            uint8_t q = b[8 + j];
            out[j] = (float)((q & 0xF) | (((qh >> j) & 1) << 4)) * d + m;
            out[j + 16] = (float)((q >> 4) | (((qh >> (j + 16)) & 1) << 4)) * d + m;
        }
    } else if (TYPE == CQ_Q8_0) {
        const uint8_t *b = row + (size_t)u * 34;
        float d = cq_h2f(b);
#pragma unroll
        for (int j = 0; j < 32; j++) out[j] = (float)(int8_t)b[2 + j] * d;
    } else if (TYPE == CQ_Q4_K) {
        /* 144-byte blocks in rows of 144 * K/256 bytes from a 256-aligned
         * base: every block is 16-byte aligned, so d/dmin, the scales and
         * the unit's 32 quant bytes come in 4- and 16-byte loads */
        const uint8_t *b = row + (size_t)(u >> 3) * 144;
        const int      s = u & 7; /* sub-block: pair s/2 of qs, low nibble for even s */
        const uint32_t dd = __ldg((const uint32_t *)b);
        const float    d = __half2float(__ushort_as_half((uint16_t)(dd & 0xFFFF)));
        const float    dmin = __half2float(__ushort_as_half((uint16_t)(dd >> 16)));
        const uint32_t w0 = __ldg((const uint32_t *)(b + 4)), w1 = __ldg((const uint32_t *)(b + 8)),
                       w2 = __ldg((const uint32_t *)(b + 12));
        float sc, mn;
        cq_k4_scale_min_w(s, w0, w1, w2, &sc, &mn);
        const float  d1 = d * sc, m1 = dmin * mn;
        const uint4 *qv = (const uint4 *)(b + 16 + 32 * (s >> 1));
        const uint4  q0 = __ldg(qv), q1 = __ldg(qv + 1);
        const uint32_t qw[8] = {q0.x, q0.y, q0.z, q0.w, q1.x, q1.y, q1.z, q1.w};
        const int      shift = (s & 1) * 4;
#pragma unroll
        for (int l = 0; l < 32; l++) out[l] = d1 * (float)((qw[l >> 2] >> (8 * (l & 3) + shift)) & 0xF) - m1;
    } else if (TYPE == CQ_Q6_K) {
        const uint8_t *b = row + (size_t)(u >> 3) * 210;
        int s = u & 7, h = s >> 2, g = s & 3;
        const uint8_t *ql = b + h * 64 + (g & 1) * 32;
        const uint8_t *qh = b + 128 + h * 32;
        const int8_t  *sc = (const int8_t *)(b + 192) + h * 8 + 2 * g;
        float d = cq_h2f(b + 208);
        int lshift = (g >> 1) * 4, hshift = 2 * g;
#pragma unroll
        for (int l = 0; l < 32; l++) {
            int q = (int)(((ql[l] >> lshift) & 0xF) | (((qh[l] >> hshift) & 3) << 4)) - 32;
            out[l] = d * (float)sc[l >> 4] * (float)q;
        }
    } else if (TYPE == CQ_MXFP4) {
        /* 17-byte blocks (odd: byte loads only), the CPU's dq_mxfp4:
         * d * value, the same float product */
        const uint8_t *b = row + (size_t)u * 17;
        const float    d = cq_e8m0_half(b[0]);
#pragma unroll
        for (int j = 0; j < 16; j++) {
            const uint32_t q = b[1 + j];
            out[j] = d * (float)cq_mxfp4_val(q & 0xF);
            out[j + 16] = d * (float)cq_mxfp4_val(q >> 4);
        }
    }
}

#endif
