/* RMS norms (with the residual add), element-wise ops, activation
 * products, and the feed-forward block (ffn). */
#include "backend/cuda/ops.cuh"

/* ---- small ops ---- */

/* One block per row. Rows of dim % 4 == 0 are read as float4 with a thread
 * per float4 (up to 1024): the first version's 256 threads each walked 16
 * dependent loads, 14 us a call at dim 4096 (17% of an 8B decode step). */
/* Row blockIdx.x of out = x / rms(x) · w; with ADD, x += o first (stored
 * back), in the same pass. The sum of squares is the same loop over the
 * same values either way, so add_rmsnorm gives add's and rmsnorm's bits.
 * PREP (dim % 32 == 0): rows below prep_rows are also left in the formats
 * fmt (prep_store4), and, when pb is not NULL, the rows from prep_rows on
 * (prompt rows) as BF16 in pb (from its start), f32_to_bf16's rounding. */
template <bool ADD, bool PREP>
__global__ void rmsnorm_k(float *__restrict__ x, const float *__restrict__ o, const float *__restrict__ w, int dim,
                          float eps, float *__restrict__ out, int prep_rows, int fmt, int8_t *__restrict__ xq,
                          float2 *__restrict__ xs, __nv_bfloat16 *__restrict__ xh, __nv_bfloat16 *__restrict__ pb) {
    pdl_entry();
    __shared__ float red[32];
    const bool   add = ADD;
    float       *xr = x + (size_t)blockIdx.x * dim;
    const float *orow = add ? o + (size_t)blockIdx.x * dim : nullptr;
    float       *res = out + (size_t)blockIdx.x * dim;
    float        ss = 0.0f;
    if ((dim & 3) == 0) {
        float4      *x4 = (float4 *)xr;
        const int    n4 = dim >> 2;
        for (int i = threadIdx.x; i < n4; i += blockDim.x) {
            float4 v = x4[i];
            if (add) {
                const float4 a = ((const float4 *)orow)[i];
                v.x += a.x, v.y += a.y, v.z += a.z, v.w += a.w;
                x4[i] = v;
            }
            ss = fmaf(v.x, v.x, ss), ss = fmaf(v.y, v.y, ss), ss = fmaf(v.z, v.z, ss), ss = fmaf(v.w, v.w, ss);
        }
        ss = block_sum(ss, red);
        const float sc = rsqrtf(ss / dim + eps);
        for (int i = threadIdx.x; i < n4; i += blockDim.x) { /* x4[i]: this thread's own store above */
            float4 v = x4[i];
            v.x *= sc, v.y *= sc, v.z *= sc, v.w *= sc;
            if (w) {
                const float4 g = ((const float4 *)w)[i];
                v.x *= g.x, v.y *= g.y, v.z *= g.z, v.w *= g.w;
            }
            ((float4 *)res)[i] = v;
            if (PREP && (int)blockIdx.x < prep_rows) prep_store4(v, (size_t)blockIdx.x * dim + 4 * (size_t)i, fmt, xq, xs, xh);
            else if (PREP && pb) store_bf16x4(pb + (size_t)((int)blockIdx.x - prep_rows) * dim + 4 * (size_t)i, v);
        }
        return;
    }
    for (int i = threadIdx.x; i < dim; i += blockDim.x) {
        if (add) xr[i] += orow[i];
        ss = fmaf(xr[i], xr[i], ss);
    }
    ss = block_sum(ss, red);
    const float sc = rsqrtf(ss / dim + eps);
    for (int i = threadIdx.x; i < dim; i += blockDim.x) res[i] = w ? xr[i] * sc * w[i] : xr[i] * sc;
}

/* rmsnorm_k, with the decode rows' formats where prep_formats says so, and
 * the prompt rows also as BF16 for the next prompt GEMM (pp_x, as
 * silu_mul leaves them) when the norm is over the pass's rows. */
template <bool ADD>
static ag_status launch_rmsnorm(cuda_state *s, float *x, const float *o, const float *w, int n, int dim, float eps,
                                float *out) {
    const int      fmt = prep_formats(s, n, dim);
    const unsigned th = threads_for(dim % 4 == 0 ? dim / 4 : dim);
    const int      n_dec = s->pass_n_decode;
    const size_t   n_pp = n == s->n && n > n_dec && dim % 4 == 0 ? (size_t)(n - n_dec) * dim : 0;
    __nv_bfloat16 *pb = pp_reserve(s, n_pp);
    if (ADD) prep_forget(s, x, (size_t)n * dim * sizeof(float));
    if (fmt || pb)
        launch_k(s, rmsnorm_k<ADD, true>, (unsigned)n, th, 0, x, o, w, dim, eps, out, n_dec, fmt, s->d_xq, s->d_xs,
                 s->d_xh, pb);
    else
        launch_k(s, rmsnorm_k<ADD, false>, (unsigned)n, th, 0, x, o, w, dim, eps, out, 0, 0, nullptr, nullptr,
                 nullptr, nullptr);
    LAUNCHED();
    prep_made(s, out, n, dim, fmt);
    if (pb) pp_made(s, out + (size_t)n_dec * dim, n_pp);
    return AG_OK;
}

ag_status cu_rmsnorm(ag_backend *be, const float *x, const float *w, int n, int dim, float eps, float *out) {
    if (n <= 0) return AG_OK;
    return launch_rmsnorm<false>(st_of(be), (float *)x, nullptr, w, n, dim, eps, out); /* x is only read without ADD */
}

__global__ void add_bias_k(float *x, const float *b, int n, int dim) {
    pdl_entry();
    const size_t total = (size_t)n * dim;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x)
        x[i] += b[i % dim];
}
__global__ void add_k(float *y, const float *x, size_t n) {
    pdl_entry();
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) y[i] += x[i];
}
__global__ void scale_k(float *x, float s, size_t n) {
    pdl_entry();
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) x[i] *= s;
}
__global__ void silu_mul_k(float *g, const float *u, size_t n) {
    pdl_entry();
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        g[i] = silu_times(g[i], u[i]);
}
/* silu_mul_k a float4 per thread (n % 32 == 0), the first n_prep elements
 * also left in the formats fmt (prep_store4: a lane group is a 32-block). */
__global__ void silu_mul_prep_k(float *g, const float *u, size_t n, size_t n_prep, int fmt, int8_t *__restrict__ xq,
                                float2 *__restrict__ xs, __nv_bfloat16 *__restrict__ xh, __nv_bfloat16 *__restrict__ pb) {
    pdl_entry();
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n / 4; i += (size_t)gridDim.x * blockDim.x) {
        float4       v = ((float4 *)g)[i];
        const float4 a = ((const float4 *)u)[i];
        v.x = silu_times(v.x, a.x), v.y = silu_times(v.y, a.y), v.z = silu_times(v.z, a.z), v.w = silu_times(v.w, a.w);
        ((float4 *)g)[i] = v;
        if (4 * i < n_prep) prep_store4(v, 4 * i, fmt, xq, xs, xh);
        else if (pb) store_bf16x4(pb + (4 * i - n_prep), v); /* a prompt row (from element n_prep) */
    }
}
__global__ void gelu_mul_k(float *g, const float *u, size_t n) {
    pdl_entry();
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        g[i] = gelu_f16(g[i]) * u[i];
}
/* g = act(g) * u over n8 groups of 8 BF16 values, in place, computed in
 * F32 and rounded once: the feed-forward block's prompt rows (cu_ffn). */
template <bool GELU>
__global__ void glu_bf16_k(__nv_bfloat16 *__restrict__ g, const __nv_bfloat16 *__restrict__ u, size_t n8) {
    pdl_entry();
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n8; i += (size_t)gridDim.x * blockDim.x) {
        uint4                  gv = ((const uint4 *)g)[i];
        const uint4            uv = ((const uint4 *)u)[i];
        __nv_bfloat162        *gp = (__nv_bfloat162 *)&gv;
        const __nv_bfloat162 *up = (const __nv_bfloat162 *)&uv;
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const float2 a = __bfloat1622float2(gp[j]), b = __bfloat1622float2(up[j]);
            gp[j] = __floats2bfloat162_rn(act_times<GELU>(a.x, b.x), act_times<GELU>(a.y, b.y));
        }
        ((uint4 *)g)[i] = gv;
    }
}

ag_status cu_add_bias(ag_backend *be, float *x, const float *b, int n, int dim) {
    if (n <= 0) return AG_OK;
    prep_forget(st_of(be), x, (size_t)n * dim * sizeof(float));
    launch_k(st_of(be), add_bias_k, grid_for((size_t)n * dim, 256), 256, 0, x, b, n, dim);
    LAUNCHED();
    return AG_OK;
}
ag_status cu_add_rmsnorm(ag_backend *be, float *x, const float *o, const float *w, int n, int dim, float eps,
                         float *out) {
    if (n <= 0) return AG_OK;
    cuda_state *s = st_of(be);
    if (!s->fuse_on) { /* AUGUR_CUDA_FUSE=0, for A/B: two launches, the same bits */
        const ag_status st = cu_add(be, x, o, (size_t)n * dim);
        return st ? st : cu_rmsnorm(be, x, w, n, dim, eps, out);
    }
    return launch_rmsnorm<true>(s, x, o, w, n, dim, eps, out);
}
ag_status cu_add(ag_backend *be, float *y, const float *x, size_t n) {
    if (!n) return AG_OK;
    cuda_state *s = st_of(be);
    prep_forget(s, y, n * sizeof(float));
    launch_k(s, add_k, grid_for(n, 256), 256, 0, y, x, n);
    LAUNCHED();
    return AG_OK;
}
ag_status cu_scale(ag_backend *be, float *x, float s, size_t n) {
    if (!n) return AG_OK;
    prep_forget(st_of(be), x, n * sizeof(float));
    launch_k(st_of(be), scale_k, grid_for(n, 256), 256, 0, x, s, n);
    LAUNCHED();
    return AG_OK;
}
/* n elements of gate rows: as rows of the pass (n = pass rows x n_ff),
 * the decode rows' formats are left for ffn_down where prep_formats says so. */
ag_status cu_silu_mul(ag_backend *be, float *g, const float *u, size_t n) {
    if (!n) return AG_OK;
    cuda_state *s = st_of(be);
    const int   dim = s->n > 0 && n % (size_t)s->n == 0 && n / (size_t)s->n <= (size_t)INT32_MAX ? (int)(n / (size_t)s->n) : 0;
    const int   fmt = dim ? prep_formats(s, s->n, dim) : 0;
    /* the prompt rows' BF16 copy for the next GEMM (pp_x), when there are some */
    const size_t   n_dec = (size_t)s->pass_n_decode * (size_t)dim, n_pp = dim && dim % 4 == 0 ? n - n_dec : 0;
    __nv_bfloat16 *pb = pp_reserve(s, n_pp);
    if (fmt || pb)
        launch_k(s, silu_mul_prep_k, grid_for(n / 4, 256), 256, 0, g, u, n, n_dec, fmt, s->d_xq, s->d_xs, s->d_xh, pb);
    else
        launch_k(s, silu_mul_k, grid_for(n, 256), 256, 0, g, u, n);
    LAUNCHED();
    if (fmt) prep_made(s, g, s->n, dim, fmt);
    else prep_forget(s, g, n * sizeof(float));
    if (pb) pp_made(s, g + n_dec, n_pp);
    return AG_OK;
}
ag_status cu_gelu_mul(ag_backend *be, float *g, const float *u, size_t n) {
    if (!n) return AG_OK;
    prep_forget(st_of(be), g, n * sizeof(float));
    launch_k(st_of(be), gelu_mul_k, grid_for(n, 256), 256, 0, g, u, n);
    LAUNCHED();
    return AG_OK;
}

/* The feed-forward block (ag_backend_ops.ffn). Decode rows: the three ops
 * (their bits). Prompt rows of quantized or BF16 weights: the gate and up
 * GEMMs write BF16 (over the first half of gate's and up's rows), the
 * activation reads and writes BF16 in place, and the down GEMM reads that
 * as its operand. At 4096 rows of an 8B that skips writing and reading
 * 470 MB of F32 products a layer (AUGUR_CUDA_FFN16=0: the three ops). */
ag_status cu_ffn(ag_backend *be, const ag_tensor *gw, const ag_tensor *uw, const ag_tensor *dw, const float *h,
                 int n, int n_decode, bool gelu, float *gate, float *up, float *o) {
    cuda_state *s = st_of(be);
    if (n_decode < 0 || n_decode > n) n_decode = n;
    const int        K = (int)gw->ne[0], n_ff = (int)gw->ne[1], n_out = (int)dw->ne[1], n_pp = n - n_decode;
    const ag_tensor *gu_w[2] = {gw, uw};
    float *const     gu[2] = {gate, up};
    const bool       bf16_ok = gw->type != CQ_F32 && gw->type != CQ_F16 && uw->type != CQ_F32 && uw->type != CQ_F16 &&
                         dw->type != CQ_F32 && dw->type != CQ_F16;
    ag_status        st;
    bool             fused;
    if ((st = ffn_decode_glu(be, gw, uw, dw, h, n, n_decode, gelu, gate, o, &fused)) || fused) return st;
    if (!s->ffn16_on || n_pp <= 0 || !bf16_ok || n_ff % 8 || uw->ne[1] != n_ff || dw->ne[0] != n_ff ||
        (((uintptr_t)gate | (uintptr_t)up) & 15)) { /* (glu_bf16_k's 16-byte loads) */
        if ((st = cu_matmul_multi(be, gu_w, 2, h, n, n_decode, gu))) return st;
        st = gelu ? cu_gelu_mul(be, gate, up, (size_t)n * n_ff) : cu_silu_mul(be, gate, up, (size_t)n * n_ff);
        return st ? st : cu_matmul(be, dw, gate, n, n_decode, o);
    }
    prep_forget(s, gate, (size_t)n * n_ff * sizeof(float));
    prep_forget(s, up, (size_t)n * n_ff * sizeof(float));
    if (n_decode > 0) { /* the decode rows' kernels, bit for bit (down converts its input itself) */
        if ((st = cu_matmul_multi(be, gu_w, 2, h, n_decode, n_decode, gu))) return st;
        const size_t e = (size_t)n_decode * n_ff;
        if (gelu) launch_k(s, gelu_mul_k, grid_for(e, 256), 256, 0, gate, (const float *)up, e);
        else launch_k(s, silu_mul_k, grid_for(e, 256), 256, 0, gate, (const float *)up, e);
        LAUNCHED();
        prep_forget(s, gate, e * sizeof(float));
        if ((st = cu_matmul(be, dw, gate, n_decode, n_decode, o))) return st;
    }
    prep_forget(s, o, (size_t)n * n_out * sizeof(float));
    __nv_bfloat16       *gb = (__nv_bfloat16 *)(gate + (size_t)n_decode * n_ff),
                  *ub = (__nv_bfloat16 *)(up + (size_t)n_decode * n_ff);
    const __nv_bfloat16 *xbf, *wb;
    int                  x_ready = 0;
    if ((st = prompt_x_bf16(s, h + (size_t)n_decode * K, K, n_pp, &x_ready, &xbf))) return st;
    if ((st = prompt_weight_bf16(s, gw, &wb)) || (st = gemm_bf16(s, wb, xbf, K, n_ff, n_pp, gb, CUDA_R_16BF)))
        return ag_errorf(st, "ffn with '%s': %s", gw->name ? gw->name : "?", ag_error_message());
    if ((st = prompt_weight_bf16(s, uw, &wb)) || (st = gemm_bf16(s, wb, xbf, K, n_ff, n_pp, ub, CUDA_R_16BF)))
        return ag_errorf(st, "ffn with '%s': %s", uw->name ? uw->name : "?", ag_error_message());
    const size_t n8 = (size_t)n_pp * n_ff / 8;
    if (gelu) launch_k(s, glu_bf16_k<true>, grid_for(n8, 256), 256, 0, gb, (const __nv_bfloat16 *)ub, n8);
    else launch_k(s, glu_bf16_k<false>, grid_for(n8, 256), 256, 0, gb, (const __nv_bfloat16 *)ub, n8);
    LAUNCHED();
    if ((st = prompt_weight_bf16(s, dw, &wb)) ||
        (st = gemm_bf16(s, wb, gb, n_ff, n_out, n_pp, o + (size_t)n_decode * n_out, CUDA_R_32F)))
        return ag_errorf(st, "ffn with '%s': %s", dw->name ? dw->name : "?", ag_error_message());
    return AG_OK;
}

