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
    const char *e = ag_switch_text("AUGUR_CUDA_PINNED"); /* =0: pageable (malloc), for A/B */
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
                         "Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q6_K and MXFP4)",
                         t->name ? t->name : "?", t->type);
    /* every matrix of a stack (ne[2] > 1: the experts' matrices, which the
     * moe op reads through ag_moe_expert_view: data + e * row_bytes * ne[1],
     * so the whole stack must be on the device, in one piece) */
    const size_t n_mat = t->ne[2] > 1 ? (size_t)t->ne[2] : 1;
    const size_t bytes = t->row_bytes * (size_t)t->ne[1] * n_mat;
    /* a stack of experts means the moe op will run, whose routing needs the
     * host inside the pass: such a model's passes are never recorded
     * (cu_graph_begin, moe.cu) */
    if (n_mat > 1) s->moe.host_routed = true;
    if ((t->type == CQ_Q4_K || t->type == CQ_Q6_K) && t->ne[0] > s->max_k) s->max_k = (int)t->ne[0];
    if (t->type == CQ_BF16 && t->ne[0] > s->max_k_bf16) s->max_k_bf16 = (int)t->ne[0];
    if (s->mmv_dp4a && (t->type == CQ_Q4_K || t->type == CQ_Q6_K)) s->prep_want |= XR_Q8;
    if (s->mmv_dp4a && t->type == CQ_BF16 && t->ne[0] % 8 == 0) s->prep_want |= XR_BF16;
    if (t->name && strstr(t->name, "attn_output") && t->ne[0] > s->att.max_att_out) s->att.max_att_out = (int)t->ne[0];
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
    /* zeroed on the backend's stream: s->stream is non-blocking, so a
     * cudaMemset on the legacy stream would not be ordered with the kernels
     * that later write this memory (a state snapshot ring made mid-pass) */
    if (cudaMalloc(&p, bytes) != cudaSuccess ||
        cudaMemsetAsync(p, 0, bytes, ((cuda_state *)ctx)->stream) != cudaSuccess) {
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
    if (need <= s->att.cap_att_part && heads <= s->att.cap_att_cnt) return AG_OK;
    graphs_clear(s);
    ag_status st = grow((void **)&s->att.d_att_part, &s->att.cap_att_part, need, sizeof(float));
    if (!st && heads > s->att.cap_att_cnt) {
        st = grow((void **)&s->att.d_att_cnt, &s->att.cap_att_cnt, heads, sizeof(int));
        if (!st) CUDA_TRY(cudaMemsetAsync(s->att.d_att_cnt, 0, s->att.cap_att_cnt * sizeof(int), s->stream));
    }
    return st;
}
static ag_status reserve_att(cuda_state *s, int n) {
    if (!s->att.splitk_on || s->att.max_att_out <= 0 || n <= 0) return AG_OK;
    const size_t heads = (size_t)n * (size_t)(s->att.max_att_out / 32 + 1);
    return reserve_att_for(s,
                           (size_t)n * s->att.att_splits * (size_t)s->att.max_att_out + heads * s->att.att_splits * 2,
                           heads);
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
    /* a sliding-window ring (kv.h): a second table per sequence, and a ring slot per token */
    const bool ring = ag_kv_get_layout(kv)->n_ring_layers > 0;
    int        ring_layer = -1;
    for (int l = 0; ring && l < ag_kv_get_layout(kv)->n_layers && ring_layer < 0; l++)
        if (ag_kv_layer_ring(kv, l)) ring_layer = l;
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
        n_table += (size_t)nb * (ring ? 2 : 1);
    }
    /* tables after the draws, requests and ring slots, which sit at fixed offsets; then the big tiles */
    size_t need = 11 * (size_t)n + 1 + n_table + (BTILE_MAX - 1) * ((size_t)n + 1);
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
    if (!st && 2 * (size_t)n * ROPE_MAX_HALF > s->rope.cap_rope) {
        graphs_clear(s);
        st = grow((void **)&s->rope.d_rope, &s->rope.cap_rope, 2 * (size_t)n * ROPE_MAX_HALF, sizeof(float2));
    }
    s->rope.n_rope_sets = 0;
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
        const int want = (max_len + s->att.att_min - 1) / s->att.att_min;
        int       z = 1;
        while (z < want && z < s->att.att_splits) z *= 2;
        s->att.att_z = z < s->att.att_splits && s->att.att_fit ? z : s->att.att_splits;
    }
    int32_t *h = s->h_pinned;
    int32_t *h_tok = h, *h_pos = h + n, *h_slot = h + 2 * n, *h_tt = h + 3 * n, *h_tiles = h + 4 * n,
            *h_draws = h + 5 * n + 1, *h_reqs = h + 8 * n + 1, *h_rslot = h + 9 * n + 1, *h_rtt = h + 10 * n + 1,
            *h_tab = h + 11 * n + 1;
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
        s->d_btiles[r - 2] = s->d_ints + 11 * n + 1 + n_table + (size_t)(r - 2) * ((size_t)n + 1);
    }
    const ag_kv_layout *L = ag_kv_get_layout(kv);
    size_t used = 0;
    for (int i = 0; i < n; i++) {
        h_tok[i] = tokens[i];
        h_pos[i] = lay->pos[i];
        int32_t block, off;
        if ((st = ag_kv_slot(kv, lay->seq[i], lay->pos[i], &block, &off))) return st;
        h_slot[i] = block * L->block_size + off;
        h_rslot[i] = h_slot[i];
        if (ring) {
            if ((st = ag_kv_layer_slot(kv, lay->seq[i], ring_layer, lay->pos[i], &block, &off))) return st;
            h_rslot[i] = block * L->block_size + off;
        }
        int first = i > 0 && lay->seq[i - 1] == lay->seq[i] ? i - 1 : i;
        for (int k = 0; k < i && first == i; k++)
            if (lay->seq[k] == lay->seq[i]) first = k;
        if (first != i) {
            h_tt[i] = h_tt[first];
            h_rtt[i] = h_rtt[first];
            continue;
        }
        int32_t        nb = 0;
        const int32_t *t = ag_kv_seq_blocks(kv, lay->seq[i], &nb);
        h_tt[i] = h_rtt[i] = (int32_t)used;
        memcpy(h_tab + used, t, sizeof(int32_t) * (size_t)nb);
        used += (size_t)nb;
        if (ring) {
            /* entries the ring recycled (-1) are never in a row's window, but a
             * prompt tile stages whole chunks (the masked positions before
             * the window start included): point them at a live block */
            int32_t        rn = 0, rfirst = 0;
            const int32_t *rt = ag_kv_seq_ring_blocks(kv, lay->seq[i], &rn, &rfirst);
            h_rtt[i] = (int32_t)used;
            for (int32_t j = 0; j < nb; j++) h_tab[used + j] = rt && j < rn && rt[j] >= 0 ? rt[j] : rt && rfirst < rn ? rt[rfirst] : 0;
            used += (size_t)nb;
        }
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
    s->d_tables = s->d_ints + 11 * n + 1;
    s->d_slot_main = s->d_slot, s->d_tt_main = s->d_tok_table;
    s->d_slot_ring = s->d_ints + 9 * n + 1, s->d_tt_ring = s->d_ints + 10 * n + 1;
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

/* ---- recorded passes (CUDA graphs) ---- */

/* The model's key of a recorded pass, with what else shapes its launches:
 * the split-K attention's grid (begin). */
static uint64_t graph_key(const cuda_state *s, uint64_t key) {
    return key ^ ((uint64_t)s->att.att_z * 0x9E3779B97F4A7C15ull);
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
    /* (host_routed: the moe op downloads the router's logits and waits for
     * them in the middle of the pass, which a stream capture cannot hold;
     * off rather than a failed recording per key, see moe.cu) */
    if (!s->graphs_on || s->moe.host_routed) return AG_OK;
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
        ssm_free(s);
        for (size_t i = 0; i < s->n_w; i++) cudaFree(s->w[i].dev);
        free(s->w);
        cudaFree(s->d_ints);
        if (s->h_pinned) cudaFreeHost(s->h_pinned);
        cudaFree(s->smp.d_edits);
        if (s->smp.h_edits) cudaFreeHost(s->smp.h_edits);
        cudaFree(s->smp.d_masks);
        if (s->smp.h_masks) cudaFreeHost(s->smp.h_masks);
        cudaFree(s->d_wbf);
        cudaFree(s->d_xbf);
        cudaFree(s->d_wf);
        cudaFree(s->d_xq);
        cudaFree(s->d_xs);
        cudaFree(s->d_xh);
        cudaFree(s->att.d_att_part);
        cudaFree(s->att.d_att_cnt);
        cudaFree(s->smp.d_am_v);
        cudaFree(s->smp.d_am_i);
        cudaFree(s->smp.d_am_cnt);
        cudaFree(s->rope.d_rope);
        cudaFree(s->smp.d_cs_key);
        cudaFree(s->smp.d_cs_id);
        cudaFree(s->smp.d_cs_nf);
        cudaFree(s->smp.d_split_cnt);
        cudaFree(s->smp.d_split_sum);
        cudaFree(s->smp.d_sp_part);
        cudaFree(s->smp.d_sp_slice_m);
        cudaFree(s->smp.d_sp_m);
        moe_free(s);
        if (s->blas) cublasDestroy(s->blas);
        if (s->stream) cudaStreamDestroy(s->stream);
        free(s);
    }
    free(be);
}

static ag_backend_ops make_ops(void) {
    ag_backend_ops o;
    memset(&o, 0, sizeof o);
    o.name = "cuda";
    o.host_memory = false;
    o.alloc = cu_alloc;
    o.free = cu_free;
    o.upload = cu_upload;
    o.download = cu_download;
    o.copy = cu_copy;
    o.prepare_weight = cu_prepare_weight;
    o.kv_mem = cu_kv_mem;
    o.sync = cu_sync;
    o.destroy = cu_destroy;
    o.begin = cu_begin;
    o.graph_begin = cu_graph_begin;
    o.graph_end = cu_graph_end;
    o.matmul = cu_matmul;
    o.matmul_multi = cu_matmul_multi;
    o.get_rows = cu_get_rows;
    o.rmsnorm = cu_rmsnorm;
    o.add_rmsnorm = cu_add_rmsnorm;
    o.rope = cu_rope;
    o.add_bias = cu_add_bias;
    o.add = cu_add;
    o.scale = cu_scale;
    o.silu_mul = cu_silu_mul;
    o.gelu_mul = cu_gelu_mul;
    o.ffn = cu_ffn;
    o.moe = cu_moe;
    o.kv_store = cu_kv_store;
    o.rope_kv_store = cu_rope_kv_store;
    o.argmax = cu_argmax;
    o.device_memory = cu_device_memory;
    o.attention = cu_attention;
    o.attn_sinks = true;
    o.mamba2 = cu_mamba2;
    o.rope_freqs = cu_rope_freqs;
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
    if (which & 1) o.pick = cu_pick;
    if (which & 2) o.cands = cu_cands;
    if (which & 4) o.edit = cu_edit, o.mask = cu_mask;
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
    const char *pick = ag_switch_text("AUGUR_CUDA_PICK"), *cands = ag_switch_text("AUGUR_CUDA_CANDS"), *edit = ag_switch_text("AUGUR_CUDA_EDIT");
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
    const char *ssplit = ag_switch_text("AUGUR_CUDA_SAMPLE_SPLIT");
    s->smp.sample_split = !(ssplit && *ssplit == '0');
    {
        const size_t slots = (size_t)SPLIT_BLOCKS * AG_CANDS_MAX, rows = SPLIT_BLOCKS / 2;
        e = cudaMalloc((void **)&s->smp.d_cs_key, slots * sizeof(uint32_t));
        if (e == cudaSuccess) e = cudaMalloc((void **)&s->smp.d_cs_id, slots * sizeof(int32_t));
        if (e == cudaSuccess) e = cudaMalloc((void **)&s->smp.d_cs_nf, SPLIT_BLOCKS * sizeof(int));
        if (e == cudaSuccess) e = cudaMalloc((void **)&s->smp.d_split_sum, SPLIT_BLOCKS * sizeof(double));
        if (e == cudaSuccess)
            e = cudaMalloc((void **)&s->smp.d_sp_part, SPLIT_BLOCKS * PICK_SPLIT_THREADS * sizeof(double));
        if (e == cudaSuccess) e = cudaMalloc((void **)&s->smp.d_sp_slice_m, SPLIT_BLOCKS * sizeof(float));
        if (e == cudaSuccess) e = cudaMalloc((void **)&s->smp.d_sp_m, rows * sizeof(float));
        if (e == cudaSuccess) e = cudaMalloc((void **)&s->smp.d_split_cnt, rows * sizeof(int));
        if (e == cudaSuccess) e = cudaMemset(s->smp.d_split_cnt, 0, rows * sizeof(int));
        if (e != cudaSuccess) {
            ag_status fail = cuda_fail(__FILE__, __LINE__, "the sampling ops' scratch", e);
            cu_destroy(be);
            return fail;
        }
    }
    const char *gr = ag_switch_text("AUGUR_CUDA_GRAPHS");
    s->graphs_on = !(gr && *gr == '0');
    const char *mmv = ag_switch_text("AUGUR_CUDA_MMV");
    s->mmv_dp4a = !(mmv && !strcmp(mmv, "fp32"));
    /* decode_rows_hint picks no kernel: every batch has mmq's bits (mmqv up to MMQV_FEW rows a matmul) */
    const char *fa = ag_switch_text("AUGUR_CUDA_FA");
    s->fa_on = !(fa && *fa == '0');
    s->fa_per_head = fa && !strcmp(fa, "head");
    s->fa_one_pass = !(fa && !strcmp(fa, "2pass"));
    const char *rv = ag_switch_text("AUGUR_CUDA_ROPE_VEC");
    s->rope_vec_on = !(rv && *rv == '0');
    const char *wgv = ag_switch_text("AUGUR_CUDA_WG_VAR");
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
    const char *far = ag_switch_text("AUGUR_CUDA_FA_ROWS");
    s->fa_rows = far && atoi(far) >= 1 && atoi(far) <= FA_ROWS_MAX ? atoi(far) : FA_ROWS_MAX;
    const char *amsplit = ag_switch_text("AUGUR_CUDA_ARGMAX_SPLIT");
    s->smp.argmax_split = !(amsplit && *amsplit == '0');
    const char *pair = ag_switch_text("AUGUR_CUDA_PAIR");
    s->pair_mode = pair && *pair ? (*pair == '0' ? 0 : *pair == '2' ? 2 : 1) : 1;
    const char *prep = ag_switch_text("AUGUR_CUDA_PREP");
    s->prep_on = !(prep && *prep == '0');
    const char *ffn16 = ag_switch_text("AUGUR_CUDA_FFN16");
    s->ffn16_on = !(ffn16 && *ffn16 == '0');
    const char *fuse = ag_switch_text("AUGUR_CUDA_FUSE");
    s->fuse_on = !(fuse && *fuse == '0');
    const char *sk = ag_switch_text("AUGUR_CUDA_SPLITK");
    s->att.splitk_on = !(sk && *sk == '0');
    const char *nsp = ag_switch_text("AUGUR_CUDA_ATT_SPLITS");
    s->att.att_splits = nsp && atoi(nsp) >= 1 && atoi(nsp) <= 64 ? atoi(nsp) : 16;
    const char *amin = ag_switch_text("AUGUR_CUDA_ATT_MIN");
    s->att.att_min = amin && atoi(amin) >= 1 ? atoi(amin) : 32;
    const char *afit = ag_switch_text("AUGUR_CUDA_ATT_FIT");
    s->att.att_fit = !(afit && *afit == '0');
    const char *grp = ag_switch_text("AUGUR_CUDA_GROUP");
    s->group_on = !(grp && *grp == '0');
    const char *mtile = ag_switch_text("AUGUR_CUDA_MMT_TILE");
    s->mmt_tile = mtile && *mtile && atoi(mtile) >= 0 && atoi(mtile) <= 4 ? atoi(mtile) : -1;
    const char *qtile = ag_switch_text("AUGUR_CUDA_MMQ_TILE");
    s->mmq_tile = qtile ? atoi(qtile) : 0;
    const char *glu = ag_switch_text("AUGUR_CUDA_GLU");
    s->glu_on = !(glu && *glu == '0');
    const char *lean = ag_switch_text("AUGUR_CUDA_MMT_LEAN");
    s->mmt_lean = !(lean && *lean == '0');
    const char *split = ag_switch_text("AUGUR_CUDA_MMV_SPLIT");
    s->mmv_split_on = !(split && *split == '0');
    const char *pdl = ag_switch_text("AUGUR_CUDA_PDL"); /* programmatic dependent launch: Hopper and later */
    cudaFuncAttributes kattr; /* and only where the kernels were built for it (their waits compiled in) */
    s->pdl_on = !(pdl && *pdl == '0') && prop.major >= 9 && cudaFuncGetAttributes(&kattr, add_k) == cudaSuccess &&
                kattr.ptxVersion >= 90;
    const char *stage = ag_switch_text("AUGUR_CUDA_STAGE"); /* bulk copies (cp.async.bulk): Hopper and later, as PDL */
    const int   stage_asked = stage && *stage == '0' ? 0 : stage && *stage == '2' ? 2 : 1;
    s->stage_mode = prop.major >= 9 && kattr.ptxVersion >= 90 ? stage_asked : 0;
    AG_LOGI("CUDA: %s, %d SMs, %.1f GiB, compute capability %d.%d, kernels launched early (PDL): %s", prop.name,
            prop.multiProcessorCount, prop.totalGlobalMem / 1073741824.0, prop.major, prop.minor,
            s->pdl_on ? "on" : "off");
    *out = be;
    return AG_OK;
}
