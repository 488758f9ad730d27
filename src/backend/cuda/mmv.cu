/* Decode rows (matmul rows [0, n_decode)) on fp32 GEMVs: a warp per
 * weight row, the weight dequantized in registers. Every type but the
 * tensor-core ones (BF16: mmt.cu, Q4_K/Q6_K: mmq.cu), MXFP4 included, and
 * all of them with AUGUR_CUDA_MMV=fp32. */
#include "backend/cuda/ops.cuh"

/* ---- matmul: decode rows (GEMV) ---- */

#define MMV_WARPS 4 /* rows per thread block */
#define MMV_TOK 8   /* most tokens per thread block */

/* Every GEMV kernel is instantiated for NT = 1, 2, 4 and 8 tokens per
 * thread block (mmv_for picks the smallest that holds the batch), so a
 * batch-1 decode does not carry registers for eight tokens. A token's sum is
 * built by the same operations, in the same order, whatever NT and the other
 * tokens are (batch invariance; test_backend_ops and gpu_test.sh check decode
 * rows in chunks of 7 against chunks of 1 bit for bit). Products that must
 * not be contracted differently between instantiations use __fmul_rn /
 * __fadd_rn, which nvcc never fuses.
 *
 * Bandwidth comes from bytes in flight: each kernel loads the raw bytes of
 * several blocks (MMV_U) into registers before it decodes any of them, so
 * a warp keeps ~1-2 KB of loads outstanding (the first version had 144 B:
 * 11% of the roofline on Q4_K). */

/* The GEMV kernels' last step: each token's lane partials summed across the
 * warp (a fixed order) and written by lane 0. */
template <int NT>
static __device__ __forceinline__ void mmv_store(const float acc[NT], int nt, int lane, int tok0, int n_out, int row,
                                                 float *__restrict__ y) {
#pragma unroll
    for (int t = 0; t < NT; t++) {
        if (t >= nt) break;
        float v = warp_sum(acc[t]);
        if (lane == 0) y[(size_t)(tok0 + t) * n_out + row] = v;
    }
}

/* y[t][row] = Σ_k W[row][k] x[t][k] for the block's rows and tokens. One warp
 * per row; lane l takes units l, l+32, ... (the legacy 32-element types:
 * small models only, so no load batching). */
template <int TYPE, int NT>
__global__ void mmv_quant(const uint8_t *__restrict__ W, size_t row_bytes, int K, int n_out,
                          const float *__restrict__ x, int n_tok, float *__restrict__ y) {
    pdl_entry();
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int row = blockIdx.x * MMV_WARPS + warp, tok0 = blockIdx.y * NT;
    if (row >= n_out) return;
    const int      nt = min(NT, n_tok - tok0);
    const uint8_t *wr = W + (size_t)row * row_bytes;
    float          acc[NT];
#pragma unroll
    for (int t = 0; t < NT; t++) acc[t] = 0.0f;
    const int units = K / 32;
    for (int u = lane; u < units; u += 32) {
        float w[32];
        decode_unit<TYPE>(wr, u, w);
#pragma unroll
        for (int t = 0; t < NT; t++) {
            if (t >= nt) break;
            const float4 *xp = (const float4 *)(x + (size_t)(tok0 + t) * K + (size_t)u * 32);
            float         p = 0.0f;
#pragma unroll
            for (int i = 0; i < 8; i++) {
                float4 v = __ldg(xp + i);
                p = fmaf(w[4 * i], v.x, p);
                p = fmaf(w[4 * i + 1], v.y, p);
                p = fmaf(w[4 * i + 2], v.z, p);
                p = fmaf(w[4 * i + 3], v.w, p);
            }
            acc[t] = __fadd_rn(acc[t], p);
        }
    }
    mmv_store<NT>(acc, nt, lane, tok0, n_out, row, y);
}

/* Activations as the block kernels read them (fp32). */
struct act_f32 {
    const float *__restrict__ x;
};

/* The loop of the GEMVs over 256-element K-quant blocks, one warp per row:
 * KIND::U blocks' raw bytes loaded (KIND::load) before any is decoded
 * (KIND::apply), then the tail one block at a time. */
template <class KIND, int NT, class ACT>
static __device__ __forceinline__ void mmv_kblocks(const uint8_t *__restrict__ W, size_t row_bytes, int K, int n_out,
                                                   const ACT act, int n_tok, float *__restrict__ y) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int row = blockIdx.x * MMV_WARPS + warp, tok0 = blockIdx.y * NT;
    const int      nt = min(NT, n_tok - tok0), nb = K / 256;
    const uint8_t *wr = W + (size_t)min(row, n_out - 1) * row_bytes;
    int            b = 0;
    if (lane == 0 && row < n_out && b < nb)
        prefetch_l2(wr, (size_t)min(PDL_PF_MUL * KIND::U, nb) * (row_bytes / nb));
    pdl_entry();
    if (row >= n_out) return;
    float acc[NT];
#pragma unroll
    for (int t = 0; t < NT; t++) acc[t] = 0.0f;
    for (; b + KIND::U <= nb; b += KIND::U) {
        typename KIND::raw r[KIND::U];
#pragma unroll
        for (int u = 0; u < KIND::U; u++) r[u] = KIND::load(wr, b + u, lane);
#pragma unroll
        for (int u = 0; u < KIND::U; u++) KIND::template apply<NT>(r[u], b + u, lane, act, K, tok0, nt, acc);
    }
    for (; b < nb; b++) KIND::template apply<NT>(KIND::load(wr, b, lane), b, lane, act, K, tok0, nt, acc);
    mmv_store<NT>(acc, nt, lane, tok0, n_out, row, y);
}

/* Q4_K with the warp on one 256-element block at a time: lane l holds
 * bytes 4l..4l+3 of the block's 128 quant bytes (one coalesced 128-byte
 * load per warp), i.e. 4 low-nibble elements of sub-block 2(l/8) and the 4
 * high-nibble elements of sub-block 2(l/8)+1, and folds the block's scale
 * and min in per sub-block: d*sc*Σ q·x - dmin*m*Σ x. The header (d, dmin,
 * the 12 scale bytes) is one 16-byte broadcast load; MMV_U4 blocks' raw
 * bytes are loaded before any is decoded. */
#define MMV_U4 8
struct q4k_raw {
    uint4    head;
    uint32_t q;
};
static __device__ __forceinline__ q4k_raw q4k_load(const uint8_t *wr, int b, int lane) {
    const uint8_t *blk = wr + (size_t)b * 144;
    return q4k_raw{__ldg((const uint4 *)blk), __ldg((const uint32_t *)(blk + 16) + lane)};
}
template <int NT>
static __device__ __forceinline__ void q4k_block(const q4k_raw r, int b, int lane, const float *__restrict__ x, int K,
                                                 int tok0, int nt, float acc[NT]) {
    const int   pair = lane >> 3, e0 = pair * 64 + 4 * (lane & 7); /* element of the low nibbles */
    const float d = __half2float(__ushort_as_half((uint16_t)(r.head.x & 0xFFFF)));
    const float dmin = __half2float(__ushort_as_half((uint16_t)(r.head.x >> 16)));
    float       sc0, mn0, sc1, mn1;
    cq_k4_scale_min_w(2 * pair, r.head.y, r.head.z, r.head.w, &sc0, &mn0);
    cq_k4_scale_min_w(2 * pair + 1, r.head.y, r.head.z, r.head.w, &sc1, &mn1);
    const float a0 = __fmul_rn(d, sc0), b0 = __fmul_rn(dmin, mn0), a1 = __fmul_rn(d, sc1), b1 = __fmul_rn(dmin, mn1);
#pragma unroll
    for (int t = 0; t < NT; t++) {
        if (t >= nt) break;
        const float *xr = x + (size_t)(tok0 + t) * K + (size_t)b * 256 + e0;
        const float4 xl = __ldg((const float4 *)xr), xh = __ldg((const float4 *)(xr + 32));
        const float  lx[4] = {xl.x, xl.y, xl.z, xl.w}, hx[4] = {xh.x, xh.y, xh.z, xh.w};
        float        ql = 0.0f, qh = 0.0f, sl = 0.0f, sh = 0.0f;
#pragma unroll
        for (int k = 0; k < 4; k++) {
            ql = fmaf((float)((r.q >> (8 * k)) & 0xF), lx[k], ql);
            qh = fmaf((float)((r.q >> (8 * k + 4)) & 0xF), hx[k], qh);
            sl = __fadd_rn(sl, lx[k]);
            sh = __fadd_rn(sh, hx[k]);
        }
        const float lo = __fsub_rn(__fmul_rn(a0, ql), __fmul_rn(b0, sl));
        const float hi = __fsub_rn(__fmul_rn(a1, qh), __fmul_rn(b1, sh));
        acc[t] = __fadd_rn(acc[t], __fadd_rn(lo, hi));
    }
}
struct q4k_kind {
    typedef q4k_raw raw;
    static const int U = MMV_U4;
    static __device__ __forceinline__ raw load(const uint8_t *wr, int b, int lane) { return q4k_load(wr, b, lane); }
    template <int NT>
    static __device__ __forceinline__ void apply(const raw r, int b, int lane, const act_f32 a, int K, int tok0, int nt,
                                                 float acc[NT]) {
        q4k_block<NT>(r, b, lane, a.x, K, tok0, nt, acc);
    }
};
template <int NT>
__global__ void mmv_q4k(const uint8_t *__restrict__ W, size_t row_bytes, int K, int n_out, const float *__restrict__ x,
                        int n_tok, float *__restrict__ y) {
    mmv_kblocks<q4k_kind, NT>(W, row_bytes, K, n_out, act_f32{x}, n_tok, y);
}

/* Q6_K the same way: lane l takes half h = l/16 of a block and positions
 * i = 2(l%16), i+1 of its four 32-element groups (8 elements): 2-byte loads
 * of ql and qh (blocks are 210 bytes, 2-byte aligned), one coalesced
 * 64-byte read per warp and array; MMV_U6 blocks loaded ahead. */
#define MMV_U6 4
struct q6k_raw {
    uint32_t l0, l1, hb, sc, d;
};
static __device__ __forceinline__ q6k_raw q6k_load(const uint8_t *wr, int b, int lane) {
    const int      h = lane >> 4, i = 2 * (lane & 15);
    const uint8_t *blk = wr + (size_t)b * 210;
    const uint8_t *sc = blk + 192 + h * 8 + (i >> 4);
    q6k_raw        r;
    r.l0 = __ldg((const uint16_t *)(blk + h * 64 + i));      /* groups 0, 2 (low, high nibble) */
    r.l1 = __ldg((const uint16_t *)(blk + h * 64 + 32 + i)); /* groups 1, 3 */
    r.hb = __ldg((const uint16_t *)(blk + 128 + h * 32 + i));
    r.sc = (uint32_t)__ldg(sc) | (uint32_t)__ldg(sc + 2) << 8 | (uint32_t)__ldg(sc + 4) << 16 |
           (uint32_t)__ldg(sc + 6) << 24;
    r.d = __ldg((const uint16_t *)(blk + 208));
    return r;
}
template <int NT>
static __device__ __forceinline__ void q6k_block(const q6k_raw r, int b, int lane, const float *__restrict__ x, int K,
                                                 int tok0, int nt, float acc[NT]) {
    const int   h = lane >> 4, i = 2 * (lane & 15);
    const float d = __half2float(__ushort_as_half((uint16_t)r.d));
    float       s[4];
#pragma unroll
    for (int g = 0; g < 4; g++) s[g] = __fmul_rn(d, (float)(int8_t)(r.sc >> (8 * g)));
#pragma unroll
    for (int t = 0; t < NT; t++) {
        if (t >= nt) break;
        const float *xr = x + (size_t)(tok0 + t) * K + (size_t)b * 256 + h * 128 + i;
        float        part = 0.0f;
#pragma unroll
        for (int g = 0; g < 4; g++) {
            const uint32_t lq = g & 1 ? r.l1 : r.l0;
            const int      nib = (g >> 1) * 4;
            const float2   xv = __ldg((const float2 *)(xr + 32 * g));
            const int q0 = (int)(((lq >> nib) & 0xF) | (((r.hb >> (2 * g)) & 3) << 4)) - 32;
            const int q1 = (int)(((lq >> (8 + nib)) & 0xF) | (((r.hb >> (8 + 2 * g)) & 3) << 4)) - 32;
            part = fmaf(s[g], fmaf((float)q0, xv.x, __fmul_rn((float)q1, xv.y)), part);
        }
        acc[t] = __fadd_rn(acc[t], part);
    }
}
struct q6k_kind {
    typedef q6k_raw raw;
    static const int U = MMV_U6;
    static __device__ __forceinline__ raw load(const uint8_t *wr, int b, int lane) { return q6k_load(wr, b, lane); }
    template <int NT>
    static __device__ __forceinline__ void apply(const raw r, int b, int lane, const act_f32 a, int K, int tok0, int nt,
                                                 float acc[NT]) {
        q6k_block<NT>(r, b, lane, a.x, K, tok0, nt, acc);
    }
};
template <int NT>
__global__ void mmv_q6k(const uint8_t *__restrict__ W, size_t row_bytes, int K, int n_out, const float *__restrict__ x,
                        int n_tok, float *__restrict__ y) {
    mmv_kblocks<q6k_kind, NT>(W, row_bytes, K, n_out, act_f32{x}, n_tok, y);
}

/* F16/BF16 rows with K % 8 == 0: 16-byte loads of 8 halves per lane (a warp
 * reads 512 contiguous bytes), MMV_UH of them in flight per lane. */
#define MMV_UH 4
template <int TYPE, int NT>
static __device__ __forceinline__ void half8_chunk(const uint4 raw, int k8, const float *__restrict__ x, int K, int tok0,
                                                   int nt, float acc[NT]) {
    float          w[8];
    const uint32_t r[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
    for (int i = 0; i < 4; i++) {
        float2 f;
        if (TYPE == CQ_F16) f = __half22float2(*(const __half2 *)&r[i]);
        else f = __bfloat1622float2(*(const __nv_bfloat162 *)&r[i]);
        w[2 * i] = f.x, w[2 * i + 1] = f.y;
    }
#pragma unroll
    for (int t = 0; t < NT; t++) {
        if (t >= nt) break;
        const float4 *xp = (const float4 *)(x + (size_t)(tok0 + t) * K) + 2 * k8;
        const float4  a = __ldg(xp), b = __ldg(xp + 1);
        float         p = 0.0f;
        p = fmaf(w[0], a.x, p), p = fmaf(w[1], a.y, p), p = fmaf(w[2], a.z, p), p = fmaf(w[3], a.w, p);
        p = fmaf(w[4], b.x, p), p = fmaf(w[5], b.y, p), p = fmaf(w[6], b.z, p), p = fmaf(w[7], b.w, p);
        acc[t] = __fadd_rn(acc[t], p);
    }
}

/* The float types: F16/BF16 through half8_chunk when K % 8 == 0, else (and
 * for F32) element by element (any K). */
template <int TYPE, int NT>
__global__ void mmv_float(const uint8_t *__restrict__ W, size_t row_bytes, int K, int n_out,
                          const float *__restrict__ x, int n_tok, float *__restrict__ y) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int row = blockIdx.x * MMV_WARPS + warp, tok0 = blockIdx.y * NT;
    pdl_entry();
    if (row >= n_out) return;
    const int      nt = min(NT, n_tok - tok0);
    const uint8_t *wr = W + (size_t)row * row_bytes;
    float          acc[NT];
#pragma unroll
    for (int t = 0; t < NT; t++) acc[t] = 0.0f;
    if (TYPE != CQ_F32 && K % 8 == 0) {
        const uint4 *wv = (const uint4 *)wr;
        const int    n8 = K / 8;
        int          k8 = lane;
        for (; k8 + 32 * (MMV_UH - 1) < n8; k8 += 32 * MMV_UH) {
            uint4 raw[MMV_UH];
#pragma unroll
            for (int u = 0; u < MMV_UH; u++) raw[u] = __ldg(wv + k8 + 32 * u);
#pragma unroll
            for (int u = 0; u < MMV_UH; u++) half8_chunk<TYPE, NT>(raw[u], k8 + 32 * u, x, K, tok0, nt, acc);
        }
        for (; k8 < n8; k8 += 32) half8_chunk<TYPE, NT>(__ldg(wv + k8), k8, x, K, tok0, nt, acc);
    } else {
        for (int k = lane; k < K; k += 32) {
            float w = cq_load<TYPE>(wr, k);
#pragma unroll
            for (int t = 0; t < NT; t++) {
                if (t >= nt) break;
                acc[t] = fmaf(w, __ldg(x + (size_t)(tok0 + t) * K + k), acc[t]);
            }
        }
    }
    mmv_store<NT>(acc, nt, lane, tok0, n_out, row, y);
}

typedef void (*mmv_kernel)(const uint8_t *, size_t, int, int, const float *, int, float *);

template <int NT>
static mmv_kernel mmv_for_nt(uint32_t type) {
    switch (type) {
    case CQ_F32: return mmv_float<CQ_F32, NT>;
    case CQ_F16: return mmv_float<CQ_F16, NT>;
    case CQ_BF16: return mmv_float<CQ_BF16, NT>;
    case CQ_Q4_0: return mmv_quant<CQ_Q4_0, NT>;
    case CQ_Q4_1: return mmv_quant<CQ_Q4_1, NT>;
    case CQ_Q5_0: return mmv_quant<CQ_Q5_0, NT>;
    case CQ_Q5_1: return mmv_quant<CQ_Q5_1, NT>;
    case CQ_Q8_0: return mmv_quant<CQ_Q8_0, NT>;
    case CQ_Q4_K: return mmv_q4k<NT>;
    case CQ_Q6_K: return mmv_q6k<NT>;
    /* MXFP4 (gpt-oss's experts): the legacy-type GEMV, decode_unit's
     * decoder; correct but not tuned (no loads ahead, fp32 activations) */
    case CQ_MXFP4: return mmv_quant<CQ_MXFP4, NT>;
    default: return NULL;
    }
}

/* The GEMV for a weight type and a batch of n_tok decode rows, and in *nt
 * the tokens each thread block takes. */
static mmv_kernel mmv_for(uint32_t type, int n_tok, int *nt) {
    *nt = n_tok <= 1 ? 1 : n_tok <= 2 ? 2 : n_tok <= 4 ? 4 : 8;
    switch (*nt) {
    case 1: return mmv_for_nt<1>(type);
    case 2: return mmv_for_nt<2>(type);
    case 4: return mmv_for_nt<4>(type);
    default: return mmv_for_nt<8>(type);
    }
}

/* Decode rows [0, n) of w over x (F32) on the GEMV for its type. */
ag_status launch_mmv(cuda_state *s, const ag_tensor *w, const float *x, int n, float *y) {
    const int  K = (int)w->ne[0], n_out = (int)w->ne[1];
    int        nt;
    mmv_kernel k = mmv_for(w->type, n, &nt);
    if (!k) return ag_errorf(AG_ERR_UNSUPPORTED, "CUDA: weight type %u", w->type);
    dim3 grid((unsigned)((n_out + MMV_WARPS - 1) / MMV_WARPS), (unsigned)((n + nt - 1) / nt));
    launch_k(s, k, grid, 32 * MMV_WARPS, 0, (const uint8_t *)w->data, w->row_bytes, K, n_out, x, n, y);
    LAUNCHED();
    return AG_OK;
}
