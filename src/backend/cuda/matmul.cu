/* The matmul ops: decode rows to the GEMV families (mmv.cu, mmt.cu,
 * mmq.cu) on activations converted once (to int8 per 32, to BF16) or left
 * converted by their producer (prep_*), prompt rows to cuBLAS on BF16
 * operands (weights dequantized here); get_rows. */
#include "backend/cuda/ops.cuh"

/* ---- K-quant decode rows' activations as int8 (dp4a) ----
 *
 * The fp32-activation kernels above spend most of their instructions
 * turning nibbles into floats (8 conversions and 8 FMAs per 8 weights and
 * token). The Q4_K/Q6_K decode-row kernels (mmqv and mmq below) take the
 * activations as int8 per 32 elements instead, as the CPU's K-quant
 * kernels (Q8_K) and llama.cpp's MMVQ (Q8_1) do: exact int32 sums (dp4a,
 * or the tensor cores' s8 mma), the scales applied per sub-block. (The
 * dp4a GEMVs that once took them at every batch were retired: mmqv is
 * faster at 1-2 rows and has mmq's bits; docs/design-notes.md.)
 * AUGUR_CUDA_MMV=fp32 selects the fp32 kernels (an A/B switch). */

/* Decode rows' activations as int8 per 32 elements: q = round(x / d) with
 * d = max|x| / 127 over the block, xs = (d, d * Σ q). One warp per block;
 * x is [n_blocks32 * 32] (rows of K % 32 == 0 lie back to back). */
__global__ void quantize_q8_32(const float *__restrict__ x, int n_blocks32, int8_t *__restrict__ xq,
                               float2 *__restrict__ xs) {
    pdl_entry();
    const int lane = threadIdx.x & 31, blk = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (blk >= n_blocks32) return;
    const float v = x[(size_t)blk * 32 + lane];
    float       amax = fabsf(v);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    const float d = amax / 127.0f;
    const int   q = amax == 0.0f ? 0 : __float2int_rn(v / d);
    xq[(size_t)blk * 32 + lane] = (int8_t)q;
    int sum = q;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    if (lane == 0) xs[blk] = make_float2(d, __fmul_rn(d, (float)sum));
}

/* ---- dequantization (get_rows, prompt GEMM) ---- */

/* A unit's 32 values to 32 consecutive outputs in 16-byte stores: o is a
 * row of K (a multiple of 32) outputs in a backend buffer (256-byte
 * aligned), so 64-byte aligned. One 2-byte store per value made the prompt
 * GEMM's weight dequantization store-bound. */
static __device__ __forceinline__ void store_unit(__nv_bfloat16 *o, const float w[32]) {
#pragma unroll
    for (int i = 0; i < 4; i++) {
        uint4          v;
        __nv_bfloat162 p[4];
#pragma unroll
        for (int j = 0; j < 4; j++) p[j] = __floats2bfloat162_rn(w[8 * i + 2 * j], w[8 * i + 2 * j + 1]);
        memcpy(&v, p, sizeof v);
        ((uint4 *)o)[i] = v;
    }
}
static __device__ __forceinline__ void store_unit(float *o, const float w[32]) {
#pragma unroll
    for (int i = 0; i < 8; i++) ((float4 *)o)[i] = make_float4(w[4 * i], w[4 * i + 1], w[4 * i + 2], w[4 * i + 3]);
}

/* out[r][k] for rows ids[r] (or r when ids is NULL), as float or bf16. One
 * block per row (a vocabulary has more rows than grid.y allows); its
 * threads take the row's units (quantized) or elements (float types). */
template <int TYPE, typename OUT>
__global__ void dequant_rows(const uint8_t *__restrict__ W, size_t row_bytes, int K, const int32_t *__restrict__ ids,
                             OUT *__restrict__ out) {
    pdl_entry();
    const int      r = blockIdx.x;
    const uint8_t *wr = W + (size_t)(ids ? ids[r] : r) * row_bytes;
    OUT           *o = out + (size_t)r * K;
    if (cq_is_float(TYPE)) {
        for (int k = threadIdx.x; k < K; k += blockDim.x) o[k] = (OUT)cq_load<TYPE>(wr, k);
    } else {
        for (int u = threadIdx.x; u < K / 32; u += blockDim.x) {
            float w[32];
            decode_unit<TYPE>(wr, u, w);
            store_unit(o + (size_t)u * 32, w);
        }
    }
}

template <typename OUT>
static ag_status launch_dequant(const cuda_state *s, uint32_t type, const void *W, size_t row_bytes, int K,
                                const int32_t *ids, int n_rows, OUT *out) {
    if (n_rows <= 0) return AG_OK;
    const uint8_t *w = (const uint8_t *)W;
#define DQ(T) launch_k(s, dequant_rows<T, OUT>, (unsigned)n_rows, 128, 0, w, row_bytes, K, ids, out)
    switch (type) {
    case CQ_F32: DQ(CQ_F32); break;
    case CQ_F16: DQ(CQ_F16); break;
    case CQ_BF16: DQ(CQ_BF16); break;
    case CQ_Q4_0: DQ(CQ_Q4_0); break;
    case CQ_Q4_1: DQ(CQ_Q4_1); break;
    case CQ_Q5_0: DQ(CQ_Q5_0); break;
    case CQ_Q5_1: DQ(CQ_Q5_1); break;
    case CQ_Q8_0: DQ(CQ_Q8_0); break;
    case CQ_Q4_K: DQ(CQ_Q4_K); break;
    case CQ_Q6_K: DQ(CQ_Q6_K); break;
    case CQ_MXFP4: DQ(CQ_MXFP4); break;
    default: return ag_errorf(AG_ERR_UNSUPPORTED, "CUDA: weight type %u", type);
    }
#undef DQ
    LAUNCHED();
    return AG_OK;
}

__global__ void f32_to_bf16(const float *__restrict__ x, size_t n, __nv_bfloat16 *__restrict__ o) {
    pdl_entry();
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        o[i] = __float2bfloat16_rn(x[i]);
}

/* f32_to_bf16 four at a time (n % 4 == 0, 16-byte aligned): the same
 * rounding, so the same bits, at ~2.5x the scalar kernel's 1.1 TB/s (ncu,
 * an 8B's 4096-row prompt, H100). */
__global__ void f32_to_bf16_4(const float *__restrict__ x, size_t n, __nv_bfloat16 *__restrict__ o) {
    pdl_entry();
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n / 4; i += (size_t)gridDim.x * blockDim.x) {
        store_bf16x4(o + 4 * i, ((const float4 *)x)[i]);
    }
}

/* ---- matmul ---- */

/* An op is about to write [p, p + bytes): prepared activations it
 * overlaps are stale. */
void prep_forget(cuda_state *s, const void *p, size_t bytes) {
    if (!bytes) return;
    if (s->pp_x) {
        const char *a = (const char *)s->pp_x, *b = a + s->pp_elems * sizeof(float);
        if ((const char *)p < b && (const char *)p + bytes > a) s->pp_x = NULL;
    }
    if (!s->prep_x) return;
    const char *a = (const char *)s->prep_x, *b = a + (size_t)s->prep_rows * s->prep_dim * sizeof(float);
    if ((const char *)p < b && (const char *)p + bytes > a) s->prep_x = NULL;
}

/* The formats a producer writing n rows of dim floats (the pass's rows, so
 * its decode rows come first) should also leave, 0: none. Only rows of the
 * whole pass (not per-head norms), dims of whole 32-blocks, within what
 * begin reserved. */
int prep_formats(const cuda_state *s, int n, int dim) {
    if (!s->prep_on || !s->prep_want || n != s->n || s->pass_n_decode <= 0 || dim % 32) return 0;
    const size_t need = (size_t)s->pass_n_decode * (size_t)dim;
    int          f = s->prep_want;
    if ((f & XR_Q8) && (need > s->cap_xq || need / 32 > s->cap_xs)) f &= ~XR_Q8;
    if ((f & XR_BF16) && need > s->cap_xh) f &= ~XR_BF16;
    return f;
}

/* After a producer's launch: out's first pass_n_decode rows are prepared
 * in fmt (or, fmt 0, out was merely written). */
void prep_made(cuda_state *s, const float *out, int n, int dim, int fmt) {
    if (!fmt) {
        prep_forget(s, out, (size_t)n * dim * sizeof(float));
        return;
    }
    s->prep_x = out;
    s->prep_rows = s->pass_n_decode;
    s->prep_dim = dim;
    s->prep_fmt = fmt;
    s->prep_h = s->d_xh;
}

/* Room in d_xbf for a producer's BF16 copy of elems prompt-row values (the
 * next GEMM's operand, pp_x): d_xbf, or NULL (copies off, nothing to copy,
 * or no memory: the GEMM converts them itself). */
__nv_bfloat16 *pp_reserve(cuda_state *s, size_t elems) {
    if (!s->prep_on || !elems) return NULL;
    return grow((void **)&s->d_xbf, &s->cap_xbf, elems, sizeof(__nv_bfloat16)) ? NULL : s->d_xbf;
}
/* After the producer's launch: d_xbf holds x[0..elems) as BF16. */
void pp_made(cuda_state *s, const float *x, size_t elems) {
    s->pp_x = x;
    s->pp_elems = elems;
}

/* Whether decode rows of this weight read the activations quantized by
 * quantize_q8_32: Q4_K and Q6_K, through mmqv (up to MMQV_FEW rows) or
 * mmq_q4k / mmq_q6k (more). */
bool uses_dp4a(const cuda_state *s, const ag_tensor *w) {
    return s->mmv_dp4a && (w->type == CQ_Q4_K || w->type == CQ_Q6_K);
}

/* Whether decode rows of this weight go through mmt_bf16 (and so read the
 * activations rounded to BF16). The choice depends on the weight alone, so
 * a row's kernel never depends on the batch. */
bool uses_mmt(const cuda_state *s, const ag_tensor *w) {
    return s->mmv_dp4a && w->type == CQ_BF16 && w->ne[0] % 8 == 0;
}

/* Decode rows of one weight. *x_ready: the formats of x already in
 * d_xq/d_xs or d_xh (matmul_multi prepares a shared x once); updated. */
/* The formats of x's n rows of K its producer left (prep_x), 0: none. */
int prep_ready(const cuda_state *s, const float *x, int n, int K) {
    return s->prep_x == x && n <= s->prep_rows && K == s->prep_dim ? s->prep_fmt : 0;
}
/* Where x's n rows of K are as BF16 once XR_BF16 is ready for them: their
 * producer's copy (prep_h), else d_xh (converted there by the caller). */
const __nv_bfloat16 *xh_of(const cuda_state *s, const float *x, int n, int K) {
    return prep_ready(s, x, n, K) & XR_BF16 ? s->prep_h : s->d_xh;
}
/* Converts x's n rows of K into d_xh as BF16 (for the mmt kernels). */
ag_status to_bf16(cuda_state *s, const float *x, int n, int K) {
    ag_status st = reserve_xh(s, n, K);
    if (st) return st;
    s->prep_x = NULL; /* the buffer now holds x */
    launch_k(s, f32_to_bf16, grid_for((size_t)K * n, 256), 256, 0, x, (size_t)K * n, s->d_xh);
    LAUNCHED();
    return AG_OK;
}

/* x's n rows of K as int8 per 32 in d_xq/d_xs, unless *x_ready says they
 * are there already (a matmul_multi's earlier weight, or their producer). */
static ag_status ensure_q8(cuda_state *s, const float *x, int n, int K, int *x_ready) {
    *x_ready |= prep_ready(s, x, n, K);
    if (*x_ready & XR_Q8) return AG_OK;
    ag_status st = reserve_xq(s, n, K);
    if (st) return st;
    s->prep_x = NULL; /* the buffers now hold x */
    const int n_blocks32 = n * (K / 32);
    launch_k(s, quantize_q8_32, (unsigned)((n_blocks32 + 7) / 8), 256, 0, x, n_blocks32, s->d_xq, s->d_xs);
    LAUNCHED();
    *x_ready |= XR_Q8;
    return AG_OK;
}

static ag_status matmul_decode(cuda_state *s, const ag_tensor *w, const float *x, int n, float *y, int *x_ready) {
    if (n <= 0) return AG_OK;
    const int K = (int)w->ne[0];
    *x_ready |= prep_ready(s, x, n, K);
    if (uses_mmt(s, w)) {
        if (!(*x_ready & XR_BF16)) {
            ag_status st = to_bf16(s, x, n, K);
            if (st) return st;
            *x_ready |= XR_BF16;
        }
        const __nv_bfloat16 *xh = xh_of(s, x, n, K);
        if (n <= 16 || s->mmt_tile == 1) {
            launch_mmt_group(s, &w, 1, K, xh, n, &y);
        } else {
            ag_status st = launch_mmt_tiles(s, w, xh, n, y);
            if (st) return st;
        }
        LAUNCHED();
        return AG_OK;
    }
    if (uses_dp4a(s, w)) {
        ag_status st = ensure_q8(s, x, n, K, x_ready);
        if (st) return st;
        return launch_mmq(s, w, n, y);
    }
    return launch_mmv(s, w, x, n, y);
}

/* w as the BF16 operand of a prompt GEMM: the weight itself, or (other
 * types) dequantized into d_wbf, which the next call rewrites. */
ag_status prompt_weight_bf16(cuda_state *s, const ag_tensor *w, const __nv_bfloat16 **wb) {
    if (w->type == CQ_BF16) {
        *wb = (const __nv_bfloat16 *)w->data;
        return AG_OK;
    }
    const int K = (int)w->ne[0], n_out = (int)w->ne[1];
    ag_status st;
    if ((st = grow((void **)&s->d_wbf, &s->cap_wbf, (size_t)K * n_out, sizeof(__nv_bfloat16)))) return st;
    if ((st = launch_dequant(s, w->type, w->data, w->row_bytes, K, (const int32_t *)NULL, n_out, s->d_wbf))) return st;
    *wb = s->d_wbf;
    return AG_OK;
}

/* x's n prompt rows of K as the BF16 operand of a prompt GEMM (in d_xbf):
 * where their producer left them (pp_x), or converted here.
 * *x_ready: XR_PROMPT_BF16 when d_xbf holds x already (an earlier weight
 * of the same matmul_multi); set once it does. */
ag_status prompt_x_bf16(cuda_state *s, const float *x, int K, int n, int *x_ready, const __nv_bfloat16 **out) {
    if (*x_ready & XR_PROMPT_BF16) {
        *out = s->pp_xbf_now;
        return AG_OK;
    }
    const size_t   elems = (size_t)K * n;
    __nv_bfloat16 *xbf;
    if (s->pp_x && x >= s->pp_x && (size_t)(x - s->pp_x) % (size_t)K == 0 &&
        (size_t)(x - s->pp_x) + elems <= s->pp_elems) {
        xbf = s->d_xbf + (x - s->pp_x); /* its producer left these rows in d_xbf (pp_x) */
    } else {
        s->pp_x = NULL; /* d_xbf is rewritten */
        ag_status st = grow((void **)&s->d_xbf, &s->cap_xbf, elems, sizeof(__nv_bfloat16));
        if (st) return st;
        xbf = s->d_xbf;
        if (elems % 4 == 0 && ((uintptr_t)x & 15) == 0)
            launch_k(s, f32_to_bf16_4, grid_for(elems / 4, 256), 256, 0, x, elems, xbf);
        else
            launch_k(s, f32_to_bf16, grid_for(elems, 256), 256, 0, x, elems, xbf);
        LAUNCHED();
    }
    s->pp_x = NULL; /* used once (what the weights of a matmul_multi share goes by x_ready) */
    *x_ready |= XR_PROMPT_BF16;
    *out = s->pp_xbf_now = xbf;
    return AG_OK;
}

/* y[n][n_out] (F32 or BF16, yt) = xbf[n][K] · wbᵀ (+ y with beta 1), FP32 accumulation. */
ag_status gemm_bf16(cuda_state *s, const __nv_bfloat16 *wb, const __nv_bfloat16 *xbf, int K, int n_out, int n,
                    void *y, cudaDataType yt, float beta) {
    const float one = 1.0f;
    /* column-major view: Yᵀ[n_out][n] = (W as K x n_out)ᵀ · (X as K x n) */
    BLAS_TRY(cublasGemmEx(s->blas, CUBLAS_OP_T, CUBLAS_OP_N, n_out, n, K, &one, wb, CUDA_R_16BF, K, xbf, CUDA_R_16BF,
                          K, &beta, y, yt, n_out, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    return AG_OK;
}

/* Prompt rows on the tensor cores. Quantized and BF16 weights: BF16
 * operands (the weight dequantized, the activations rounded). F32 and F16
 * weights keep their precision: FP32 operands, full FP32 for F32 weights
 * (small models: tiny cost) and TF32 for F16 (10 mantissa bits, like F16).
 * x_ready: as prompt_x_bf16's. */
static ag_status matmul_prompt(cuda_state *s, const ag_tensor *w, const float *x, int n, float *y, int *x_ready) {
    if (n <= 0) return AG_OK;
    const int   K = (int)w->ne[0], n_out = (int)w->ne[1];
    const float one = 1.0f, zero = 0.0f;
    ag_status   st;
    if (w->type == CQ_F32 || w->type == CQ_F16) {
        const float *wf = (const float *)w->data;
        if (w->type == CQ_F16) {
            if ((st = grow((void **)&s->d_wf, &s->cap_wf, (size_t)K * n_out, sizeof(float)))) return st;
            if ((st = launch_dequant(s, w->type, w->data, w->row_bytes, K, (const int32_t *)NULL, n_out, s->d_wf)))
                return st;
            wf = s->d_wf;
        }
        BLAS_TRY(cublasGemmEx(s->blas, CUBLAS_OP_T, CUBLAS_OP_N, n_out, n, K, &one, wf, CUDA_R_32F, K, x, CUDA_R_32F, K,
                              &zero, y, CUDA_R_32F, n_out,
                              w->type == CQ_F32 ? CUBLAS_COMPUTE_32F : CUBLAS_COMPUTE_32F_FAST_TF32,
                              CUBLAS_GEMM_DEFAULT));
        return AG_OK;
    }
    const __nv_bfloat16 *wb, *xbf;
    if ((st = prompt_weight_bf16(s, w, &wb)) || (st = prompt_x_bf16(s, x, K, n, x_ready, &xbf))) return st;
    return gemm_bf16(s, wb, xbf, K, n_out, n, y, CUDA_R_32F);
}

static ag_status matmul_rows(cuda_state *s, const ag_tensor *w, const float *x, int n, int n_decode, float *y,
                             int *x_ready) {
    if (n_decode < 0 || n_decode > n) n_decode = n;
    prep_forget(s, y, (size_t)n * w->ne[1] * sizeof(float));
    ag_status st = matmul_decode(s, w, x, n_decode, y, x_ready);
    if (!st)
        st = matmul_prompt(s, w, x + (size_t)n_decode * w->ne[0], n - n_decode, y + (size_t)n_decode * w->ne[1],
                           x_ready);
    if (st) return ag_errorf(st, "matmul with '%s': %s", w->name ? w->name : "?", ag_error_message());
    return AG_OK;
}

ag_status cu_matmul(ag_backend *be, const ag_tensor *w, const float *x, int n, int n_decode, float *y) {
    int x_ready = 0;
    return matmul_rows(st_of(be), w, x, n, n_decode, y, &x_ready);
}

/* The prompt rows of w[0..n_g) over x's rows [n_decode, n), weight by weight. */
static ag_status matmul_group_prompt(cuda_state *s, const ag_tensor *const *w, int n_g, const float *x, int n,
                                     int n_decode, float *const *y, int *x_ready) {
    const int K = (int)w[0]->ne[0];
    for (int i = 0; i < n_g; i++) {
        ag_status st = matmul_prompt(s, w[i], x + (size_t)n_decode * K, n - n_decode,
                                     y[i] + (size_t)n_decode * w[i]->ne[1], x_ready);
        if (st) return ag_errorf(st, "matmul with '%s': %s", w[i]->name ? w[i]->name : "?", ag_error_message());
    }
    return AG_OK;
}

/* w[0..n_g) (mmqv_group_len) over x: the decode rows in one mmqv launch,
 * then each weight's prompt rows. */
static ag_status matmul_group_mmqv(cuda_state *s, const ag_tensor *const *w, int n_g, const float *x, int n,
                                   int n_decode, float *const *y, int *x_ready) {
    const int K = (int)w[0]->ne[0];
    for (int i = 0; i < n_g; i++) prep_forget(s, y[i], (size_t)n * w[i]->ne[1] * sizeof(float));
    ag_status st = ensure_q8(s, x, n_decode, K, x_ready);
    if (st || (st = launch_mmqv(s, w, n_g, K, n_decode, y))) return st;
    return matmul_group_prompt(s, w, n_g, x, n, n_decode, y, x_ready);
}

ag_status cu_matmul_multi(ag_backend *be, const ag_tensor *const *w, int n_w, const float *x, int n,
                          int n_decode, float *const *y) {
    cuda_state *s = st_of(be);
    int         x_ready = 0;
    if (n_decode < 0 || n_decode > n) n_decode = n;
    bool group = s->group_on && n_decode > 0 && (n_decode <= 16 || s->mmt_tile == 1) && n_w > 1 &&
                 n_w <= MMT_GROUP_MAX;
    for (int i = 0; group && i < n_w; i++) group = uses_mmt(s, w[i]) && w[i]->ne[0] == w[0]->ne[0];
    if (group) { /* the decode rows of all in one launch, then each weight's prompt rows */
        const int K = (int)w[0]->ne[0];
        for (int i = 0; i < n_w; i++) prep_forget(s, y[i], (size_t)n * w[i]->ne[1] * sizeof(float));
        ag_status st;
        if (!(prep_ready(s, x, n_decode, K) & XR_BF16) && (st = to_bf16(s, x, n_decode, K))) return st;
        launch_mmt_group(s, w, n_w, K, xh_of(s, x, n_decode, K), n_decode, y);
        LAUNCHED();
        for (int i = 0; i < n_w; i++) {
            st = matmul_prompt(s, w[i], x + (size_t)n_decode * K, n - n_decode, y[i] + (size_t)n_decode * w[i]->ne[1],
                               &x_ready);
            if (st) return ag_errorf(st, "matmul with '%s': %s", w[i]->name ? w[i]->name : "?", ag_error_message());
        }
        return AG_OK;
    }
    for (int i = 0; i < n_w; i++) {
        ag_status st;
        const int n_g = mmqv_group_len(s, w + i, n_w - i, n_decode);
        if (n_g) { /* their decode rows in one launch */
            if ((st = matmul_group_mmqv(s, w + i, n_g, x, n, n_decode, y + i, &x_ready))) return st;
            i += n_g - 1;
            continue;
        }
        if ((st = matmul_rows(s, w[i], x, n, n_decode, y[i], &x_ready))) return st;
    }
    return AG_OK;
}

ag_status cu_get_rows(ag_backend *be, const ag_tensor *w, const int32_t *ids, int n, float *out) {
    cuda_state    *s = st_of(be);
    const int32_t *d_ids = pass_ints(s, ids, n);
    if (!d_ids) return ag_errorf(AG_ERR_INVALID, "CUDA get_rows: ids must be the pass's tokens (see begin)");
    prep_forget(s, out, (size_t)n * w->ne[0] * sizeof(float));
    return launch_dequant(s, w->type, w->data, w->row_bytes, (int)w->ne[0], d_ids, n, out);
}

