/* The CUDA backend: backend.h's op table on one NVIDIA GPU (cuda_backend.h).
 *
 * Memory: weights are copied to the device once at load, in their GGUF
 * types (prepare_weight); activations are the model's one device buffer;
 * the KV pool is device memory handed to kv.c through ag_kv_mem, so kv keeps
 * its bookkeeping on the host and the kernels read blocks in place.
 *
 * Kernels, and why:
 *  - decode rows (matmul rows [0, n_decode)): a GEMV per weight row, one warp
 *    per row, dequantizing 32-element units in registers. Each token's sum
 *    is formed in the same order whatever else is in the batch, so a
 *    verify window gives plain decoding's bits (the batch-invariance
 *    speculative decoding relies on);
 *  - prompt rows: dequantize the weight to BF16 (BF16 weights are used as
 *    they are), round the activations to BF16, and multiply on the tensor
 *    cores with cuBLAS (FP32 accumulation). Dequantize-then-GEMM rather than
 *    a fused quantized GEMM: prefill is compute-bound, the dequantization is
 *    one extra pass over the weight per matmul (a few % of a 512-token
 *    GEMM), and cuBLAS's Hopper kernels are hard to beat;
 *  - attention: one thread block per (token, head) over the paged KV: a pass
 *    for the softmax's max and sum, a pass that turns a chunk of scores
 *    into fp16-rounded weights (as the CPU and llama.cpp round) and sums V;
 *    the same kernel for prompt and decode rows (so far);
 *  - norms, RoPE, activations, residual adds: one small kernel each.
 *
 * Every CUDA call goes through CUDA_TRY (file:line, the call, the error
 * string) and becomes an ag_status; nothing aborts. Ops are issued on one
 * stream; download and sync wait for it.
 *
 * This file is the backend's core: the op table, memory, begin (the pass's
 * host arrays), recorded passes (graphs) and lifetime. The kernels live
 * one op family a file beside it (ops.cuh lists them and what each
 * exports); common.cuh and state.cuh hold what they share. */
#include "backend/cuda/ops.cuh"

/* norm_act.cu's add kernel: whether the kernels were built for PDL (its ptxVersion) */
__global__ void add_k(float *y, const float *x, size_t n);

/* ---- memory ---- */

static void *cu_alloc(ag_backend *be, size_t bytes) {
    void *p = NULL;
    if (cudaMalloc(&p, bytes ? bytes : 1) != cudaSuccess) {
        cudaGetLastError(); /* clear it: an allocation failure is not sticky */
        return NULL;
    }
    return p;
}
static void cu_free(ag_backend *be, void *p) {
    if (p) cudaFree(p);
}
/* Pinned host memory: a download into it is one DMA at full PCIe speed
 * (into pageable memory the driver copies through its own staging buffer). */
static void *pinned_alloc(size_t bytes) {
    void       *p = NULL;
    const char *e = getenv("AUGUR_CUDA_PINNED"); /* =0: pageable (malloc), for A/B */
    if (e && *e == '0') return NULL;
    /* portable: pinned for every device's context, whichever thread asks */
    if (cudaHostAlloc(&p, bytes ? bytes : 1, cudaHostAllocPortable) != cudaSuccess) {
        cudaGetLastError();
        return NULL;
    }
    return p;
}
static void pinned_free(void *p) {
    if (p) cudaFreeHost(p);
}
static ag_status cu_upload(ag_backend *be, void *dst, const void *src, size_t bytes) {
    prep_forget(st_of(be), dst, bytes);
    CUDA_TRY(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, st_of(be)->stream));
    CUDA_TRY(cudaStreamSynchronize(st_of(be)->stream)); /* src may be reused at once */
    return AG_OK;
}
static ag_status cu_download(ag_backend *be, void *dst, const void *src, size_t bytes) {
    CUDA_TRY(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, st_of(be)->stream));
    CUDA_TRY(cudaStreamSynchronize(st_of(be)->stream));
    return AG_OK;
}
static ag_status cu_copy(ag_backend *be, void *dst, const void *src, size_t bytes) {
    prep_forget(st_of(be), dst, bytes);
    if (bytes) CUDA_TRY(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, st_of(be)->stream));
    return AG_OK;
}
static ag_status cu_sync(ag_backend *be) {
    CUDA_TRY(cudaStreamSynchronize(st_of(be)->stream));
    CUDA_TRY(cudaGetLastError());
    return AG_OK;
}

static bool type_supported(uint32_t t) {
    int u, b;
    cq_geometry((int)t, &u, &b);
    return u > 0 || cq_is_float((int)t);
}

static ag_status cu_prepare_weight(ag_backend *be, ag_tensor *t) {
    cuda_state *s = st_of(be);
    if (!type_supported(t->type))
        return ag_errorf(AG_ERR_UNSUPPORTED,
                         "tensor '%s' has type %u, which the CUDA backend does not run (it runs F32, F16, BF16, Q4_0, "
                         "Q4_1, Q5_0, Q5_1, Q8_0, Q4_K and Q6_K)",
                         t->name ? t->name : "?", t->type);
    const size_t bytes = t->row_bytes * (size_t)t->ne[1];
    if ((t->type == CQ_Q4_K || t->type == CQ_Q6_K) && t->ne[0] > s->max_k) s->max_k = (int)t->ne[0];
    if (t->type == CQ_BF16 && t->ne[0] > s->max_k_bf16) s->max_k_bf16 = (int)t->ne[0];
    if (s->mmv_dp4a && (t->type == CQ_Q4_K || t->type == CQ_Q6_K)) s->prep_want |= XR_Q8;
    if (s->mmv_dp4a && t->type == CQ_BF16 && t->ne[0] % 8 == 0) s->prep_want |= XR_BF16;
    if (t->name && strstr(t->name, "attn_output") && t->ne[0] > s->max_att_out) s->max_att_out = (int)t->ne[0];
    for (size_t i = 0; i < s->n_w; i++)
        if (s->w[i].host == t->host && s->w[i].bytes == bytes) {
            t->data = s->w[i].dev;
            return AG_OK;
        }
    if (s->n_w == s->cap_w) {
        size_t       cap = s->cap_w ? 2 * s->cap_w : 256;
        weight_copy *w = (weight_copy *)realloc(s->w, cap * sizeof *w);
        if (!w) return ag_errorf(AG_ERR_NOMEM, "out of memory");
        s->w = w, s->cap_w = cap;
    }
    void *dev = NULL;
    CUDA_TRY(cudaMalloc(&dev, bytes));
    cudaError_t e = cudaMemcpy(dev, t->host, bytes, cudaMemcpyHostToDevice);
    if (e != cudaSuccess) {
        cudaFree(dev);
        return cuda_fail(__FILE__, __LINE__, "uploading a weight", e);
    }
    s->w[s->n_w].host = t->host;
    s->w[s->n_w].bytes = bytes;
    s->w[s->n_w++].dev = dev;
    s->weight_bytes += bytes;
    t->data = dev;
    return AG_OK;
}

/* KV pool memory (kv.h ag_kv_mem): 0 on success */
static void *kv_alloc(void *ctx, size_t bytes) {
    void *p = NULL;
    if (cudaMalloc(&p, bytes) != cudaSuccess || cudaMemset(p, 0, bytes) != cudaSuccess) {
        cudaGetLastError();
        if (p) cudaFree(p);
        size_t free_b = 0, total_b = 0;
        if (cudaMemGetInfo(&free_b, &total_b) == cudaSuccess) /* kv_init's error names the pool's size */
            AG_LOGE("CUDA: a KV pool of %.2f GiB does not fit in the GPU's %.2f GiB free (of %.2f GiB): "
                    "lower --ctx or --parallel (augur fit shows the plan)",
                    bytes / 1073741824.0, free_b / 1073741824.0, total_b / 1073741824.0);
        cudaGetLastError();
        return NULL;
    }
    return p;
}
static void kv_free(void *ctx, void *p) { cudaFree(p); }
static int  kv_copy(void *ctx, void *dst, const void *src, size_t n) {
    return cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToDevice, ((cuda_state *)ctx)->stream) != cudaSuccess;
}
static int kv_to_host(void *ctx, void *host, const void *src, size_t n) {
    cudaStream_t s = ((cuda_state *)ctx)->stream;
    return cudaMemcpyAsync(host, src, n, cudaMemcpyDeviceToHost, s) != cudaSuccess || cudaStreamSynchronize(s) != cudaSuccess;
}
static int kv_from_host(void *ctx, void *dst, const void *host, size_t n) {
    cudaStream_t s = ((cuda_state *)ctx)->stream;
    return cudaMemcpyAsync(dst, host, n, cudaMemcpyHostToDevice, s) != cudaSuccess || cudaStreamSynchronize(s) != cudaSuccess;
}
/* host buffers for copies to and from the GPU (the disk tier's staging, the
 * logits arrays: ag_kv_mem_host_alloc) */
static void *kv_host_alloc(void *ctx, size_t bytes) { return pinned_alloc(bytes); }
static void  kv_host_free(void *ctx, void *p) { pinned_free(p); }
static const ag_kv_mem *cu_kv_mem(ag_backend *be) { return &st_of(be)->kvmem; }

/* ---- begin: the pass's host arrays, once ---- */

/* Room for n rows of K int8 activations and their block scales. A regrown
 * buffer drops the recorded passes (they hold the old address). */
ag_status reserve_xq(cuda_state *s, int n, int K) {
    const size_t need = (size_t)n * (size_t)K;
    if (need <= s->cap_xq && need / 32 <= s->cap_xs) return AG_OK;
    graphs_clear(s);
    ag_status st = grow((void **)&s->d_xq, &s->cap_xq, need, sizeof(int8_t));
    if (!st) st = grow((void **)&s->d_xs, &s->cap_xs, need / 32, sizeof(float2));
    return st;
}

/* Room for the split-K decode attention of n decode rows: per row and head,
 * att_splits splits of hd_v sums plus (m, l); n_head * hd_v <= max_att_out
 * and hd_v >= 32 bound it. Counters are zeroed when (re)allocated; the
 * kernel leaves them zero. */
ag_status reserve_att_for(cuda_state *s, size_t need, size_t heads) {
    if (need <= s->cap_att_part && heads <= s->cap_att_cnt) return AG_OK;
    graphs_clear(s);
    ag_status st = grow((void **)&s->d_att_part, &s->cap_att_part, need, sizeof(float));
    if (!st && heads > s->cap_att_cnt) {
        st = grow((void **)&s->d_att_cnt, &s->cap_att_cnt, heads, sizeof(int));
        if (!st) CUDA_TRY(cudaMemsetAsync(s->d_att_cnt, 0, s->cap_att_cnt * sizeof(int), s->stream));
    }
    return st;
}
static ag_status reserve_att(cuda_state *s, int n) {
    if (!s->splitk_on || s->max_att_out <= 0 || n <= 0) return AG_OK;
    const size_t heads = (size_t)n * (size_t)(s->max_att_out / 32 + 1);
    return reserve_att_for(s, (size_t)n * s->att_splits * (size_t)s->max_att_out + heads * s->att_splits * 2, heads);
}

/* Room for n rows of K BF16 activations (decode rows of BF16 weights). */
ag_status reserve_xh(cuda_state *s, int n, int K) {
    const size_t need = (size_t)n * (size_t)K;
    if (need <= s->cap_xh) return AG_OK;
    graphs_clear(s);
    return grow((void **)&s->d_xh, &s->cap_xh, need, sizeof(__nv_bfloat16));
}

static ag_status cu_begin(ag_backend *be, ag_kv *kv, const ag_batch_layout *lay, const int32_t *tokens) {
    cuda_state *s = st_of(be);
    const int   n = lay->n;
    /* tables of the distinct sequences, concatenated; tok_table[i] = where
     * token i's starts. A sequence's tokens are contiguous in the engine's
     * batches, so "seen" is usually the previous token. */
    size_t n_table = 0;
    for (int i = 0; i < n; i++) {
        bool seen = i > 0 && lay->seq[i - 1] == lay->seq[i];
        for (int k = 0; k < i && !seen; k++) seen = lay->seq[k] == lay->seq[i];
        if (seen) continue;
        int32_t nb = 0;
        ag_kv_seq_blocks(kv, lay->seq[i], &nb);
        n_table += (size_t)nb;
    }
    /* tables after the draws and requests, which sit at fixed offsets; then the big tiles */
    size_t need = 9 * (size_t)n + 1 + n_table + (BTILE_MAX - 1) * ((size_t)n + 1);
    if (need > s->cap_pinned) {
        if (s->h_pinned) cudaFreeHost(s->h_pinned);
        s->h_pinned = NULL;
        s->cap_pinned = 0;
        CUDA_TRY(cudaMallocHost((void **)&s->h_pinned, (need + need / 4) * sizeof(int32_t)));
        s->cap_pinned = need + need / 4;
    }
    ag_status st = grow((void **)&s->d_ints, &s->cap_ints, need, sizeof(int32_t));
    if (!st && s->mmv_dp4a && s->max_k > 0 && lay->n_decode > 0) st = reserve_xq(s, lay->n_decode, s->max_k);
    if (!st && s->mmv_dp4a && s->max_k_bf16 > 0 && lay->n_decode > 0) /* (both halves: ffn_decode_glu) */
        st = reserve_xh(s, (s->glu_on ? 2 : 1) * lay->n_decode, s->max_k_bf16);
    if (!st && lay->n_decode > 0) st = reserve_att(s, lay->n_decode < n ? lay->n_decode : n);
    if (!st && 2 * (size_t)n * ROPE_MAX_HALF > s->cap_rope) {
        graphs_clear(s);
        st = grow((void **)&s->d_rope, &s->cap_rope, 2 * (size_t)n * ROPE_MAX_HALF, sizeof(float2));
    }
    s->n_rope_sets = 0;
    if (!st) st = reserve_argmax(s, n);
    if (st) return st;
    /* split-K attention's grid: enough splits for the longest decode row
     * (a row's split count is its own, ceil(len / att_min) at most; the
     * grid only bounds it, so the bits do not depend on it), rounded up to
     * a power of 2 so a growing context re-records a graph at most 5 times;
     * 16 splits of 1-32 positions cost 64 short rows 32 us a layer */
    {
        const int n_dec = lay->n_decode < n ? lay->n_decode : n;
        int       max_len = 1;
        for (int i = 0; i < n_dec; i++) max_len = lay->pos[i] + 1 > max_len ? lay->pos[i] + 1 : max_len;
        const int want = (max_len + s->att_min - 1) / s->att_min;
        int       z = 1;
        while (z < want && z < s->att_splits) z *= 2;
        s->att_z = z < s->att_splits && s->att_fit ? z : s->att_splits;
    }
    int32_t *h = s->h_pinned;
    int32_t *h_tok = h, *h_pos = h + n, *h_slot = h + 2 * n, *h_tt = h + 3 * n, *h_tiles = h + 4 * n,
            *h_draws = h + 5 * n + 1, *h_reqs = h + 8 * n + 1, *h_tab = h + 9 * n + 1;
    /* the pick op's draws (3 words an output row: u's low and high halves,
     * 1/T's bits), uploaded with the rest so a replayed pass reads this
     * pass's draws */
    for (int k = 0; lay->pick && k < lay->n_out && k < n; k++) {
        int32_t w[2];
        memcpy(w, &lay->pick[k].u, sizeof w);
        h_draws[3 * k] = w[0], h_draws[3 * k + 1] = w[1];
        memcpy(&h_draws[3 * k + 2], &lay->pick[k].inv_temp, sizeof(int32_t));
    }
    /* likewise the cands op's requests, a word an output row */
    for (int k = 0; lay->cands_req && k < lay->n_out && k < n; k++) h_reqs[k] = cands_req_word(&lay->cands_req[k]);
    /* prompt rows [n_decode, n) in tiles: consecutive rows of one sequence, at most ATT_TQ */
    int n_tiles = 0;
    for (int i = lay->n_decode > 0 && lay->n_decode <= n ? lay->n_decode : (lay->n_decode > n ? n : 0); i < n;) {
        h_tiles[n_tiles++] = i;
        int k = i + 1;
        while (k < n && k - i < ATT_TQ && lay->seq[k] == lay->seq[i]) k++;
        i = k;
    }
    h_tiles[n_tiles] = n;
    /* the same runs in tiles of up to r ATT_TQ rows, after the tables */
    int32_t *h_btiles = h_tab + n_table;
    for (int r = 2; r <= BTILE_MAX; r++) {
        int32_t *bt = h_btiles + (size_t)(r - 2) * ((size_t)n + 1);
        int      nb = 0;
        for (int i = 0; i < n_tiles;) {
            bt[nb++] = h_tiles[i];
            int k = i + 1;
            while (k < n_tiles && k - i < r && lay->seq[h_tiles[k]] == lay->seq[h_tiles[i]]) k++;
            i = k;
        }
        bt[nb] = n;
        s->n_btiles[r - 2] = nb;
        s->d_btiles[r - 2] = s->d_ints + 9 * n + 1 + n_table + (size_t)(r - 2) * ((size_t)n + 1);
    }
    const ag_kv_layout *L = ag_kv_get_layout(kv);
    size_t used = 0;
    for (int i = 0; i < n; i++) {
        h_tok[i] = tokens[i];
        h_pos[i] = lay->pos[i];
        int32_t block, off;
        if ((st = ag_kv_slot(kv, lay->seq[i], lay->pos[i], &block, &off))) return st;
        h_slot[i] = block * L->block_size + off;
        int first = i > 0 && lay->seq[i - 1] == lay->seq[i] ? i - 1 : i;
        for (int k = 0; k < i && first == i; k++)
            if (lay->seq[k] == lay->seq[i]) first = k;
        if (first != i) {
            h_tt[i] = h_tt[first];
            continue;
        }
        int32_t        nb = 0;
        const int32_t *t = ag_kv_seq_blocks(kv, lay->seq[i], &nb);
        h_tt[i] = (int32_t)used;
        memcpy(h_tab + used, t, sizeof(int32_t) * (size_t)nb);
        used += (size_t)nb;
    }
    if (used != n_table) return ag_errorf(AG_ERR_INTERNAL, "CUDA begin: block tables %zu != %zu", used, n_table);
    CUDA_TRY(cudaMemcpyAsync(s->d_ints, h, need * sizeof(int32_t), cudaMemcpyHostToDevice, s->stream));
    s->n = n;
    s->pass_n_decode = lay->n_decode < 0 ? 0 : lay->n_decode < n ? lay->n_decode : n;
    s->prep_x = NULL;
    s->pp_x = NULL;
    s->h_tokens = tokens;
    s->h_pos = lay->pos;
    s->d_tokens = s->d_ints;
    s->d_pos = s->d_ints + n;
    s->d_slot = s->d_ints + 2 * n;
    s->d_tok_table = s->d_ints + 3 * n;
    s->d_tiles = s->d_ints + 4 * n;
    s->n_tiles = n_tiles;
    s->d_draws = s->d_ints + 5 * n + 1;
    s->d_cand_reqs = s->d_ints + 8 * n + 1;
    s->d_tables = s->d_ints + 9 * n + 1;
    return upload_edits(s, lay);
}

/* The device copy of a host int array given to an op of this pass. */
const int32_t *pass_ints(cuda_state *s, const int32_t *host, int n) {
    if (n == s->n && host == s->h_tokens) return s->d_tokens;
    if (n == s->n && host == s->h_pos) return s->d_pos;
    return NULL;
}

static ag_status cu_device_memory(ag_backend *be, uint64_t *free_bytes, uint64_t *total_bytes) {
    size_t f = 0, t = 0;
    CUDA_TRY(cudaMemGetInfo(&f, &t));
    *free_bytes = f, *total_bytes = t;
    return AG_OK;
}

/* ==== matmul.cu (its own file once the split reaches it) ==== */

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
        ag_status st = lazy_need(s, x, elems);
        if (st || (st = grow((void **)&s->d_xbf, &s->cap_xbf, elems, sizeof(__nv_bfloat16)))) return st;
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

/* The F32 prompt-row GEMM y = xbf · wbᵀ, or, with deferral on, its operands
 * kept in s->defer for the next op (see cuda_state.defer). */
ag_status gemm_bf16_out(cuda_state *s, const __nv_bfloat16 *wb, const __nv_bfloat16 *xbf, int K, int n_out,
                        int n, float *y) {
    if (!(s->defer_mode & 1) || n <= 0) return gemm_bf16(s, wb, xbf, K, n_out, n, y, CUDA_R_32F);
    s->defer.wb = wb, s->defer.xbf = xbf, s->defer.K = K, s->defer.n_out = n_out, s->defer.rows = n, s->defer.y = y;
    return AG_OK;
}

/* Launches a held-back GEMM as it was (into its y); nothing when none is. */
ag_status defer_flush(cuda_state *s) {
    if (!s->defer.y) return AG_OK;
    float *y = s->defer.y;
    s->defer.y = NULL;
    return gemm_bf16(s, s->defer.wb, s->defer.xbf, s->defer.K, s->defer.n_out, s->defer.rows, y, CUDA_R_32F);
}

/* The held-back GEMM's first row within o[.][dim] when it is exactly o's
 * rows [r0, r0 + rows) up to the last of `total` elements (its prompt
 * rows), else -1. */
long defer_row0(const cuda_state *s, const float *o, size_t total, int dim) {
    if (!s->defer.y || s->defer.n_out != dim || total % (size_t)dim) return -1;
    const long r0 = (long)(total / (size_t)dim) - s->defer.rows;
    return r0 >= 0 && s->defer.y == o + (size_t)r0 * dim ? r0 : -1;
}

/* With the held-back GEMM over o's rows [r0, ..): those rows of x get
 * x + acc from the GEMM itself (beta 1); the caller then adds o's rows
 * [0, r0) only. */
ag_status defer_into(cuda_state *s, float *x, long r0, int dim) {
    float *xr = x + (size_t)r0 * dim;
    s->defer.y = NULL;
    prep_forget(s, xr, (size_t)s->defer.rows * dim * sizeof(float));
    return gemm_bf16(s, s->defer.wb, s->defer.xbf, s->defer.K, dim, s->defer.rows, xr, CUDA_R_32F, 1.0f);
}

/* Prompt rows on the tensor cores. Quantized and BF16 weights: BF16
 * operands (the weight dequantized, the activations rounded). F32 and F16
 * weights keep their precision: FP32 operands, full FP32 for F32 weights
 * (small models: tiny cost) and TF32 for F16 (10 mantissa bits, like F16).
 * x_ready: as prompt_x_bf16's. hold: the BF16 GEMM may be held back
 * (gemm_bf16_out; a single weight's matmul only). */
static ag_status matmul_prompt(cuda_state *s, const ag_tensor *w, const float *x, int n, float *y, int *x_ready,
                               bool hold = false) {
    if (n <= 0) return AG_OK;
    const int   K = (int)w->ne[0], n_out = (int)w->ne[1];
    const float one = 1.0f, zero = 0.0f;
    ag_status   st;
    if (w->type == CQ_F32 || w->type == CQ_F16) {
        if ((st = lazy_need(s, x, (size_t)n * K))) return st;
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
    return hold ? gemm_bf16_out(s, wb, xbf, K, n_out, n, y) : gemm_bf16(s, wb, xbf, K, n_out, n, y, CUDA_R_32F);
}

static ag_status matmul_rows(cuda_state *s, const ag_tensor *w, const float *x, int n, int n_decode, float *y,
                             int *x_ready, bool hold = false) {
    if (n_decode < 0 || n_decode > n) n_decode = n;
    prep_forget(s, y, (size_t)n * w->ne[1] * sizeof(float));
    ag_status st = matmul_decode(s, w, x, n_decode, y, x_ready);
    if (!st)
        st = matmul_prompt(s, w, x + (size_t)n_decode * w->ne[0], n - n_decode, y + (size_t)n_decode * w->ne[1],
                           x_ready, hold);
    if (st) return ag_errorf(st, "matmul with '%s': %s", w->name ? w->name : "?", ag_error_message());
    return AG_OK;
}

ag_status cu_matmul(ag_backend *be, const ag_tensor *w, const float *x, int n, int n_decode, float *y) {
    int x_ready = 0;
    return matmul_rows(st_of(be), w, x, n, n_decode, y, &x_ready, true);
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

/* ---- recorded passes (CUDA graphs) ---- */

/* The model's key of a recorded pass, with what else shapes its launches:
 * the split-K attention's grid (begin). */
static uint64_t graph_key(const cuda_state *s, uint64_t key) {
    return key ^ ((uint64_t)s->att_z * 0x9E3779B97F4A7C15ull);
}

static graph_entry *graph_find(cuda_state *s, uint64_t key) {
    for (int i = 0; i < s->n_graphs; i++)
        if (s->graphs[i].key == key && s->graphs[i].ints == s->d_ints) return &s->graphs[i];
    return NULL;
}

void graphs_clear(cuda_state *s) {
    for (int i = 0; i < s->n_graphs; i++)
        if (s->graphs[i].exec) cudaGraphExecDestroy(s->graphs[i].exec);
    s->n_graphs = 0;
}

static ag_status cu_graph_begin(ag_backend *be, uint64_t key, int *state) {
    cuda_state *s = st_of(be);
    *state = AG_GRAPH_OFF;
    if (!s->graphs_on) return AG_OK;
    key = graph_key(s, key);
    graph_entry *e = graph_find(s, key);
    if (e) {
        if (e->exec) {
            CUDA_TRY(cudaGraphLaunch(e->exec, s->stream));
            *state = AG_GRAPH_REPLAYED;
        }
        return AG_OK;
    }
    if (s->n_graphs == (int)(sizeof s->graphs / sizeof s->graphs[0])) graphs_clear(s);
    CUDA_TRY(cudaStreamBeginCapture(s->stream, cudaStreamCaptureModeThreadLocal));
    *state = AG_GRAPH_RECORDING;
    return AG_OK;
}

static ag_status cu_graph_end(ag_backend *be, uint64_t key, bool discard) {
    cuda_state     *s = st_of(be);
    cudaGraph_t     g = NULL;
    cudaGraphExec_t ex = NULL;
    cudaError_t     e = cudaStreamEndCapture(s->stream, &g);
    key = graph_key(s, key);
    if (e == cudaSuccess && !discard) e = cudaGraphInstantiate(&ex, g, 0);
    if (g) cudaGraphDestroy(g);
    graph_entry *slot = &s->graphs[s->n_graphs++];
    slot->key = key, slot->ints = s->d_ints, slot->exec = e == cudaSuccess && !discard ? ex : NULL;
    if (e != cudaSuccess) {
        cudaGetLastError();
        return cuda_fail(__FILE__, __LINE__, "recording a decode pass", e);
    }
    if (discard) return ag_errorf(AG_ERR_INTERNAL, "recording discarded");
    CUDA_TRY(cudaGraphLaunch(ex, s->stream));
    return AG_OK;
}

/* ---- lifetime ---- */

static void cu_destroy(ag_backend *be) {
    cuda_state *s = st_of(be);
    if (s) {
        cudaSetDevice(s->device);
        if (s->stream) cudaStreamSynchronize(s->stream);
        graphs_clear(s);
        for (size_t i = 0; i < s->n_w; i++) cudaFree(s->w[i].dev);
        free(s->w);
        cudaFree(s->d_ints);
        if (s->h_pinned) cudaFreeHost(s->h_pinned);
        cudaFree(s->d_edits);
        if (s->h_edits) cudaFreeHost(s->h_edits);
        cudaFree(s->d_masks);
        if (s->h_masks) cudaFreeHost(s->h_masks);
        cudaFree(s->d_wbf);
        cudaFree(s->d_xbf);
        cudaFree(s->d_wf);
        cudaFree(s->d_xq);
        cudaFree(s->d_xs);
        cudaFree(s->d_xh);
        cudaFree(s->d_att_part);
        cudaFree(s->d_att_cnt);
        cudaFree(s->d_am_v);
        cudaFree(s->d_am_i);
        cudaFree(s->d_am_cnt);
        cudaFree(s->d_rope);
        cudaFree(s->d_cs_key);
        cudaFree(s->d_cs_id);
        cudaFree(s->d_cs_nf);
        cudaFree(s->d_split_cnt);
        cudaFree(s->d_split_sum);
        cudaFree(s->d_sp_part);
        cudaFree(s->d_sp_slice_m);
        cudaFree(s->d_sp_m);
        if (s->blas) cublasDestroy(s->blas);
        if (s->stream) cudaStreamDestroy(s->stream);
        free(s);
    }
    free(be);
}

/* An op that first launches a held-back GEMM (cuda_state.defer), so that
 * it never sees the GEMM's output unwritten: every op but the residual
 * adds, which may take the GEMM in (cu_add_rmsnorm, cu_add), and destroy.
 * (An op's failure to launch it is its error; free and alloc, which report
 * none, leave it in the stream's error state.) */
static ag_status pending_flush(cuda_state *s) {
    const ag_status st = defer_flush(s);
    return st ? st : lazy_flush(s);
}
template <auto F>
struct flush_first;
template <typename R, typename... A, R (*F)(ag_backend *, A...)>
struct flush_first<F> {
    static R call(ag_backend *be, A... a) {
        const ag_status st = pending_flush(st_of(be));
        if constexpr (std::is_same<R, ag_status>::value) {
            if (st) return st;
        } else {
            (void)st;
        }
        return F(be, a...);
    }
};
#define FLUSHED(f) flush_first<f>::call

/* The GEMM ops, which read a lazy norm's rows (cuda_state.lazy) as their
 * BF16 copy: a held-back GEMM is launched first; a lazy norm over exactly
 * this op's prompt rows of x is dropped after it (its F32 rows, unread,
 * stay unwritten; a path that read them wrote them first, lazy_need); one
 * over other rows is written first. */
static ag_status lazy_take(cuda_state *s, const float *x, int n, int n_decode, int K) {
    ag_status st = defer_flush(s);
    if (st || !s->lazy.out) return st;
    if (n_decode < 0 || n_decode > n) n_decode = n;
    const bool mine = s->lazy.out == x + (size_t)n_decode * K && s->lazy.rows == n - n_decode && s->lazy.dim == K;
    return mine ? AG_OK : lazy_flush(s);
}
static ag_status cu_matmul_op(ag_backend *be, const ag_tensor *w, const float *x, int n, int n_decode, float *y) {
    cuda_state *s = st_of(be);
    ag_status   st = lazy_take(s, x, n, n_decode, (int)w->ne[0]);
    if (!st) st = cu_matmul(be, w, x, n, n_decode, y);
    s->lazy.out = NULL;
    return st;
}
static ag_status cu_matmul_multi_op(ag_backend *be, const ag_tensor *const *w, int n_w, const float *x, int n,
                                    int n_decode, float *const *y) {
    cuda_state *s = st_of(be);
    ag_status   st = n_w > 0 ? lazy_take(s, x, n, n_decode, (int)w[0]->ne[0]) : pending_flush(s);
    if (!st) st = cu_matmul_multi(be, w, n_w, x, n, n_decode, y);
    s->lazy.out = NULL;
    return st;
}
static ag_status cu_ffn_op(ag_backend *be, const ag_tensor *gw, const ag_tensor *uw, const ag_tensor *dw,
                           const float *h, int n, int n_decode, bool gelu, float *gate, float *up, float *o) {
    cuda_state *s = st_of(be);
    ag_status   st = lazy_take(s, h, n, n_decode, (int)gw->ne[0]);
    if (!st) st = cu_ffn(be, gw, uw, dw, h, n, n_decode, gelu, gate, up, o);
    s->lazy.out = NULL;
    return st;
}

static ag_backend_ops make_ops(void) {
    ag_backend_ops o;
    memset(&o, 0, sizeof o);
    o.name = "cuda";
    o.host_memory = false;
    o.alloc = FLUSHED(cu_alloc);
    o.free = FLUSHED(cu_free);
    o.upload = FLUSHED(cu_upload);
    o.download = FLUSHED(cu_download);
    o.copy = FLUSHED(cu_copy);
    o.prepare_weight = FLUSHED(cu_prepare_weight);
    o.kv_mem = cu_kv_mem; /* reads no device memory */
    o.sync = FLUSHED(cu_sync);
    o.destroy = cu_destroy; /* drops a held-back GEMM with the state */
    o.begin = FLUSHED(cu_begin);
    o.graph_begin = FLUSHED(cu_graph_begin);
    o.graph_end = FLUSHED(cu_graph_end);
    o.matmul = cu_matmul_op;             /* lazy_take */
    o.matmul_multi = cu_matmul_multi_op; /* likewise */
    o.get_rows = FLUSHED(cu_get_rows);
    o.rmsnorm = FLUSHED(cu_rmsnorm);
    o.add_rmsnorm = cu_add_rmsnorm; /* takes the held-back GEMM in, or flushes */
    o.rope = FLUSHED(cu_rope);
    o.add_bias = FLUSHED(cu_add_bias);
    o.add = cu_add; /* likewise */
    o.scale = FLUSHED(cu_scale);
    o.silu_mul = FLUSHED(cu_silu_mul);
    o.gelu_mul = FLUSHED(cu_gelu_mul);
    o.ffn = cu_ffn_op; /* likewise */
    o.kv_store = FLUSHED(cu_kv_store);
    o.rope_kv_store = FLUSHED(cu_rope_kv_store);
    o.argmax = FLUSHED(cu_argmax);
    o.device_memory = FLUSHED(cu_device_memory);
    o.attention = FLUSHED(cu_attention);
    return o;
}
/* The op tables with and without the pick op (AUGUR_CUDA_PICK=0: off),
 * the cands op (AUGUR_CUDA_CANDS=0: off) and the edit and mask ops
 * (AUGUR_CUDA_EDIT=0: both off), indexed by pick + 2 * cands + 4 * edit.
 * Without them the rows that want a picked token or candidates, or that a
 * sampler's bias or penalties edit or a structured output masks, are
 * copied to the host (for A/B and as a fallback). */
static ag_backend_ops make_ops_with(int which) {
    ag_backend_ops o = make_ops();
    if (which & 1) o.pick = FLUSHED(cu_pick);
    if (which & 2) o.cands = FLUSHED(cu_cands);
    if (which & 4) o.edit = FLUSHED(cu_edit), o.mask = FLUSHED(cu_mask);
    return o;
}
static const ag_backend_ops cuda_ops_variants[8] = {make_ops_with(0), make_ops_with(1), make_ops_with(2),
                                                    make_ops_with(3), make_ops_with(4), make_ops_with(5),
                                                    make_ops_with(6), make_ops_with(7)};

extern "C" int ag_cuda_device_count(void) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return n;
}

extern "C" ag_status ag_cuda_backend_new(int index, int decode_rows_hint, ag_backend **out) {
    *out = NULL;
    ag_backend *be = (ag_backend *)calloc(1, sizeof *be);
    cuda_state *s = (cuda_state *)calloc(1, sizeof *s);
    if (!be || !s) {
        free(be);
        free(s);
        return ag_errorf(AG_ERR_NOMEM, "out of memory");
    }
    const char *pick = getenv("AUGUR_CUDA_PICK"), *cands = getenv("AUGUR_CUDA_CANDS"), *edit = getenv("AUGUR_CUDA_EDIT");
    be->ops = &cuda_ops_variants[!(pick && *pick == '0') + 2 * !(cands && *cands == '0') + 4 * !(edit && *edit == '0')];
    be->impl = s;
    s->device = index;
    s->kvmem.ctx = s;
    s->kvmem.alloc = kv_alloc;
    s->kvmem.free = kv_free;
    s->kvmem.copy = kv_copy;
    s->kvmem.to_host = kv_to_host;
    s->kvmem.from_host = kv_from_host;
    s->kvmem.host_alloc = kv_host_alloc;
    s->kvmem.host_free = kv_host_free;
    ag_status      st = AG_OK;
    cudaDeviceProp prop;
    cudaError_t    e = cudaSetDevice(index);
    if (e == cudaSuccess) e = cudaGetDeviceProperties(&prop, index);
    if (e == cudaSuccess) e = cudaStreamCreateWithFlags(&s->stream, cudaStreamNonBlocking);
    if (e != cudaSuccess) st = cuda_fail(__FILE__, __LINE__, "opening the GPU", e);
    if (!st) {
        cublasStatus_t b = cublasCreate(&s->blas);
        if (b == CUBLAS_STATUS_SUCCESS) b = cublasSetStream(s->blas, s->stream);
        if (b != CUBLAS_STATUS_SUCCESS) st = blas_fail(__FILE__, __LINE__, "cublasCreate", b);
    }
    if (st) {
        cu_destroy(be);
        return st;
    }
    s->sm_count = prop.multiProcessorCount;
    const char *ssplit = getenv("AUGUR_CUDA_SAMPLE_SPLIT");
    s->sample_split = !(ssplit && *ssplit == '0');
    {
        const size_t slots = (size_t)SPLIT_BLOCKS * AG_CANDS_MAX, rows = SPLIT_BLOCKS / 2;
        e = cudaMalloc((void **)&s->d_cs_key, slots * sizeof(uint32_t));
        if (e == cudaSuccess) e = cudaMalloc((void **)&s->d_cs_id, slots * sizeof(int32_t));
        if (e == cudaSuccess) e = cudaMalloc((void **)&s->d_cs_nf, SPLIT_BLOCKS * sizeof(int));
        if (e == cudaSuccess) e = cudaMalloc((void **)&s->d_split_sum, SPLIT_BLOCKS * sizeof(double));
        if (e == cudaSuccess) e = cudaMalloc((void **)&s->d_sp_part, SPLIT_BLOCKS * PICK_SPLIT_THREADS * sizeof(double));
        if (e == cudaSuccess) e = cudaMalloc((void **)&s->d_sp_slice_m, SPLIT_BLOCKS * sizeof(float));
        if (e == cudaSuccess) e = cudaMalloc((void **)&s->d_sp_m, rows * sizeof(float));
        if (e == cudaSuccess) e = cudaMalloc((void **)&s->d_split_cnt, rows * sizeof(int));
        if (e == cudaSuccess) e = cudaMemset(s->d_split_cnt, 0, rows * sizeof(int));
        if (e != cudaSuccess) {
            ag_status fail = cuda_fail(__FILE__, __LINE__, "the sampling ops' scratch", e);
            cu_destroy(be);
            return fail;
        }
    }
    const char *gr = getenv("AUGUR_CUDA_GRAPHS");
    s->graphs_on = !(gr && *gr == '0');
    const char *mmv = getenv("AUGUR_CUDA_MMV");
    s->mmv_dp4a = !(mmv && !strcmp(mmv, "fp32"));
    /* decode_rows_hint picks no kernel: every batch has mmq's bits (mmqv up to MMQV_FEW rows a matmul) */
    const char *fa = getenv("AUGUR_CUDA_FA");
    s->fa_on = !(fa && *fa == '0');
    s->fa_per_head = fa && !strcmp(fa, "head");
    s->fa_one_pass = !(fa && !strcmp(fa, "2pass"));
    const char *rv = getenv("AUGUR_CUDA_ROPE_VEC");
    s->rope_vec_on = !(rv && *rv == '0');
    const char *wgv = getenv("AUGUR_CUDA_WG_VAR");
    /* the default: attention_wgp_k with four buffers (389 vs 414 us a layer of
     * the 8B at 4096 rows, H100); AUGUR_CUDA_WG_VAR=0 gives attention_wg_k */
    s->wg_var = wgv && *wgv ? atoi(wgv) : WG_PROD | WG_DEEP;
    if (!wg_var_built(s->wg_var)) s->wg_var = WG_PROD | WG_DEEP;
#if defined(AUGUR_SM90A)
    /* the default on an H100/H200 (fa1 with AUGUR_CUDA_FA=1, or one of the others) */
    s->fa_wg = (!fa || !*fa || !strcmp(fa, "wg")) && prop.major == 9 && prop.minor == 0;
#else
    s->fa_wg = false;
#endif
    const char *far = getenv("AUGUR_CUDA_FA_ROWS");
    s->fa_rows = far && atoi(far) >= 1 && atoi(far) <= FA_ROWS_MAX ? atoi(far) : FA_ROWS_MAX;
    const char *amsplit = getenv("AUGUR_CUDA_ARGMAX_SPLIT");
    s->argmax_split = !(amsplit && *amsplit == '0');
    const char *pair = getenv("AUGUR_CUDA_PAIR");
    s->pair_mode = pair && *pair ? (*pair == '0' ? 0 : *pair == '2' ? 2 : 1) : 1;
    const char *prep = getenv("AUGUR_CUDA_PREP");
    s->prep_on = !(prep && *prep == '0');
    const char *ffn16 = getenv("AUGUR_CUDA_FFN16");
    s->ffn16_on = !(ffn16 && *ffn16 == '0');
    const char *fuse = getenv("AUGUR_CUDA_FUSE");
    s->fuse_on = !(fuse && *fuse == '0');
    const char *sk = getenv("AUGUR_CUDA_SPLITK");
    s->splitk_on = !(sk && *sk == '0');
    const char *nsp = getenv("AUGUR_CUDA_ATT_SPLITS");
    s->att_splits = nsp && atoi(nsp) >= 1 && atoi(nsp) <= 64 ? atoi(nsp) : 16;
    const char *amin = getenv("AUGUR_CUDA_ATT_MIN");
    s->att_min = amin && atoi(amin) >= 1 ? atoi(amin) : 32;
    const char *afit = getenv("AUGUR_CUDA_ATT_FIT");
    s->att_fit = !(afit && *afit == '0');
    const char *grp = getenv("AUGUR_CUDA_GROUP");
    s->group_on = !(grp && *grp == '0');
    const char *dfr = getenv("AUGUR_CUDA_DEFER");
    s->defer_mode = dfr ? atoi(dfr) & 3 : 0;
    const char *mtile = getenv("AUGUR_CUDA_MMT_TILE");
    s->mmt_tile = mtile && *mtile && atoi(mtile) >= 0 && atoi(mtile) <= 4 ? atoi(mtile) : -1;
    const char *qtile = getenv("AUGUR_CUDA_MMQ_TILE");
    s->mmq_tile = qtile ? atoi(qtile) : 0;
    const char *glu = getenv("AUGUR_CUDA_GLU");
    s->glu_on = !(glu && *glu == '0');
    const char *lean = getenv("AUGUR_CUDA_MMT_LEAN");
    s->mmt_lean = !(lean && *lean == '0');
    const char *split = getenv("AUGUR_CUDA_MMV_SPLIT");
    s->mmv_split_on = !(split && *split == '0');
    const char *pdl = getenv("AUGUR_CUDA_PDL"); /* programmatic dependent launch: Hopper and later */
    cudaFuncAttributes kattr; /* and only where the kernels were built for it (their waits compiled in) */
    s->pdl_on = !(pdl && *pdl == '0') && prop.major >= 9 && cudaFuncGetAttributes(&kattr, add_k) == cudaSuccess &&
                kattr.ptxVersion >= 90;
    const char *stage = getenv("AUGUR_CUDA_STAGE"); /* bulk copies (cp.async.bulk): Hopper and later, as PDL */
    const int   stage_asked = stage && *stage == '0' ? 0 : stage && *stage == '2' ? 2 : 1;
    s->stage_mode = prop.major >= 9 && kattr.ptxVersion >= 90 ? stage_asked : 0;
    AG_LOGI("CUDA: %s, %d SMs, %.1f GiB, compute capability %d.%d, kernels launched early (PDL): %s", prop.name,
            prop.multiProcessorCount, prop.totalGlobalMem / 1073741824.0, prop.major, prop.minor,
            s->pdl_on ? "on" : "off");
    *out = be;
    return AG_OK;
}
