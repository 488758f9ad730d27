/* The mixture-of-experts feed-forward on the GPU (backend.h's moe op; the
 * CPU's, the reference, is cpu/moe.c, whose steps this follows).
 *
 * First version: routing on the host. The router's logits (one matmul,
 * plus its bias) are downloaded, each row's experts and weights chosen on
 * the host by the CPU op's own code (ag_moe_route_rows: the same selection
 * and weights from the same logits), grouped by ag_moe_plan (both in
 * cpu/moe.c; test_backend_ops runs the plan through the CPU's ops and gets
 * the CPU op's bits), and the gather lists uploaded: one download, one
 * stream sync and one upload per MoE layer. A later step can move the routing onto the device (a
 * top-k kernel and a device-side counting sort); then MoE passes could be
 * recorded too. Until then a pass with this op cannot be captured into a
 * CUDA graph (a sync inside a capture is an error), so the backend records
 * no passes of a model that has expert stacks (cuda_backend.cu:
 * prepare_weight sets moe.host_routed, cu_graph_begin then answers OFF);
 * and should a capture still reach this op, it fails, and the model runs
 * the pass unrecorded (model.c's fallback for a failed recording).
 *
 * Then, on the device:
 *  1. every (row, rank) entry's row of h gathered into xg, grouped by
 *     expert in ascending id, each expert's entries in batch order (the
 *     CPU's counting sort): decode rows (< n_decode) first, then prompt
 *     rows;
 *  2. per expert with entries, ascending id: matmul_multi (gate, up) over
 *     its c entries with their c_dec decode rows as decode rows, so a
 *     decode row keeps the decode kernels' bits and a prompt row the
 *     prompt path's, as in a plain matmul (the matmul contract: a row's
 *     result depends only on its x and its kind);
 *  3. the experts' gate/up biases, the activation (SiLU or gpt-oss's
 *     clamped SwiGLU), once over all entries;
 *  4. per expert: the down matmul, likewise; then the down biases;
 *  5. o[i] = Σ over row i's experts in ascending id of weight · y (one
 *     thread per element, a fixed order per row, no atomics): a row's bits
 *     depend only on its own h and its kind, never on the batch.
 *
 * The expert matrices are 2-D views of the stacks (ag_moe_expert_view:
 * data + e · row_bytes · ne[1]); prepare_weight uploads whole stacks. */
#include "backend/cuda/ops.cuh"

/* ---- kernels (each begins with pdl_entry: launch_k may start it early) ---- */

/* xg[j] = h[src[j]], rows of D: a block per entry. */
__global__ void moe_gather_k(const float *__restrict__ h, int D, const int32_t *__restrict__ src,
                             float *__restrict__ xg) {
    pdl_entry();
    const float *x = h + (size_t)src[blockIdx.x] * D;
    float       *o = xg + (size_t)blockIdx.x * D;
    for (int d = threadIdx.x; d < D; d += blockDim.x) o[d] = x[d];
}

/* x[j][:] += b[expert[j]][:] over n_ent entries of dim (the experts' biases:
 * the CPU's add_bias, one float add). */
__global__ void moe_bias_k(float *__restrict__ x, const float *__restrict__ b, const int32_t *__restrict__ expert,
                           int n_ent, int dim) {
    pdl_entry();
    const size_t total = (size_t)n_ent * dim;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x)
        x[i] += b[(size_t)expert[i / dim] * dim + i % dim];
}

/* g = act(g, u), n elements: SiLU-gate (silu_mul's expression), or gpt-oss's
 * clamped SwiGLU (cpu/moe.c swiglu_oai, ggml's swiglu_oai: the same float
 * operations) */
template <bool OAI>
__global__ void moe_act_k(float *__restrict__ g, const float *__restrict__ u, size_t n, float alpha, float limit) {
    pdl_entry();
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        if (OAI) {
            const float x = fminf(g[i], limit), y = fmaxf(fminf(u[i], limit), -limit);
            g[i] = __fmul_rn(__fdiv_rn(x, __fadd_rn(1.f, expf(__fmul_rn(alpha, -x)))), __fadd_rn(y, 1.f));
        } else {
            g[i] = silu_times(g[i], u[i]);
        }
    }
}

/* o[i][d] = Σ_k wts[i][k] · y[ent[i][k]][d], k ascending (row i's experts
 * in ascending id), from 0, one rounded product and one rounded add a term
 * (the CPU's out[d] += wt * y[d]): a block per row. */
__global__ void moe_combine_k(const float *__restrict__ y, const int32_t *__restrict__ ent,
                              const float *__restrict__ wts, int K, int D, float *__restrict__ o) {
    pdl_entry();
    const int32_t *e = ent + (size_t)blockIdx.x * K;
    const float   *w = wts + (size_t)blockIdx.x * K;
    for (int d = threadIdx.x; d < D; d += blockDim.x) {
        float acc = 0.0f;
        for (int k = 0; k < K; k++) acc = __fadd_rn(acc, __fmul_rn(w[k], y[(size_t)e[k] * D + d]));
        o[(size_t)blockIdx.x * D + d] = acc;
    }
}

/* ---- the op ---- */

void moe_free(cuda_state *s) {
    cuda_moe_state *m = &s->moe;
    cudaFree(m->d_logits);
    cudaFree(m->d_xg);
    cudaFree(m->d_g);
    cudaFree(m->d_u);
    cudaFree(m->d_y);
    cudaFree(m->d_wts);
    cudaFree(m->d_ints);
    if (m->h_buf) cudaFreeHost(m->h_buf);
    memset(m, 0, sizeof *m);
}

/* How many of an expert's c entries (their source rows src, decode rows
 * first: ag_moe_plan's order) are decode rows. */
static int expert_decode_rows(const int32_t *src, int c, int n_decode) {
    int k = 0;
    while (k < c && src[k] < n_decode) k++;
    return k;
}

/* The pinned host buffer of at least `bytes`. A buffer's last use is the
 * previous call's upload, which the stream may not have run yet: a new one
 * is made only after the stream is idle. (Kept as it is, the buffer is
 * safe to reuse without that wait: the download below is ordered after
 * that upload on the stream, and the host writes it only after waiting
 * for the download.) */
static ag_status moe_host(cuda_state *s, cuda_moe_state *m, size_t bytes) {
    if (bytes <= m->cap_h) return AG_OK;
    CUDA_TRY(cudaStreamSynchronize(s->stream));
    if (m->h_buf) cudaFreeHost(m->h_buf);
    m->h_buf = NULL;
    m->cap_h = 0;
    const size_t cap = bytes + bytes / 4;
    CUDA_TRY(cudaMallocHost(&m->h_buf, cap));
    m->cap_h = cap;
    return AG_OK;
}

ag_status cu_moe(ag_backend *be, const ag_moe_weights *w, const float *h, int n, int n_decode, float *o) {
    cuda_state     *s = st_of(be);
    cuda_moe_state *m = &s->moe;
    const int       E = w->n_expert, K = w->n_used, D = (int)w->gate_exps->ne[0], F = (int)w->gate_exps->ne[1];
    if (E < 1 || E > AG_MOE_MAX_EXPERTS || K < 1 || K > E || w->gate_inp->ne[1] != E || w->gate_exps->ne[2] != E ||
        w->up_exps->ne[2] != E || w->down_exps->ne[2] != E || w->down_exps->ne[0] != F || w->down_exps->ne[1] != D ||
        w->up_exps->ne[0] != D || w->up_exps->ne[1] != F)
        return ag_errorf(AG_ERR_INVALID, "moe: %d of %d experts do not fit the weights' shapes", K, E);
    if (n <= 0) return AG_OK;
    if (n_decode < 0 || n_decode > n) n_decode = n;
    {
        /* the host routing below cannot be recorded (see the top) */
        cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
        CUDA_TRY(cudaStreamIsCapturing(s->stream, &cs));
        if (cs != cudaStreamCaptureStatusNone)
            return ag_errorf(AG_ERR_UNSUPPORTED, "CUDA moe: routing runs on the host, a recorded pass cannot hold it");
    }
    const size_t N = (size_t)n, NK = N * (size_t)K;
    ag_status    st;
    if ((st = grow((void **)&m->d_logits, &m->cap_logits, N * E, sizeof(float))) ||
        (st = grow((void **)&m->d_xg, &m->cap_xg, NK * D, sizeof(float))) ||
        (st = grow((void **)&m->d_g, &m->cap_g, NK * F, sizeof(float))) ||
        (st = grow((void **)&m->d_u, &m->cap_u, NK * F, sizeof(float))) ||
        (st = grow((void **)&m->d_y, &m->cap_y, NK * D, sizeof(float))) ||
        (st = grow((void **)&m->d_wts, &m->cap_wts, NK, sizeof(float))) ||
        (st = grow((void **)&m->d_ints, &m->cap_ints, 3 * NK, sizeof(int32_t))))
        return st;

    /* 1. the router's logits, to the host */
    if ((st = cu_matmul(be, w->gate_inp, h, n, n_decode, m->d_logits))) return st;
    if (w->gate_inp_b && (st = cu_add_bias(be, m->d_logits, w->gate_inp_b, n, E))) return st;
    /* the host buffer: logits [N][E] floats; uploaded: src [NK], expert
     * [NK], ent [NK] ints, then ent_w [NK] floats; host only: sel [NK],
     * weights by rank [NK], start [E + 1], the plan's scratch [2 NK + E] */
    const size_t up_bytes = 3 * NK * sizeof(int32_t) + NK * sizeof(float);
    if ((st = moe_host(s, m, N * E * sizeof(float) + up_bytes + (4 * NK + 2 * (size_t)E + 1) * sizeof(int32_t))))
        return st;
    float   *lg = (float *)m->h_buf;
    int32_t *h_src = (int32_t *)(lg + N * E), *h_exp = h_src + NK, *h_ent = h_exp + NK;
    float   *h_wts = (float *)(h_ent + NK);
    int32_t *sel = (int32_t *)(h_wts + NK);
    float   *rw = (float *)(sel + NK);
    int32_t *start = (int32_t *)(rw + NK), *scratch = start + E + 1;
    CUDA_TRY(cudaMemcpyAsync(lg, m->d_logits, N * E * sizeof(float), cudaMemcpyDeviceToHost, s->stream));
    CUDA_TRY(cudaStreamSynchronize(s->stream));

    /* 2. routing, as the CPU's, and the entries grouped by expert */
    ag_moe_route_rows(w, lg, n, sel, rw);
    ag_moe_plan(n, K, E, sel, rw, start, h_src, h_exp, h_ent, h_wts, scratch);
    CUDA_TRY(cudaMemcpyAsync(m->d_ints, h_src, 3 * NK * sizeof(int32_t), cudaMemcpyHostToDevice, s->stream));
    CUDA_TRY(cudaMemcpyAsync(m->d_wts, h_wts, NK * sizeof(float), cudaMemcpyHostToDevice, s->stream));
    const int32_t *d_src = m->d_ints, *d_exp = m->d_ints + NK, *d_ent = m->d_ints + 2 * NK;

    /* 3. the entries' rows of h, grouped by expert */
    launch_k(s, moe_gather_k, dim3((unsigned)NK), threads_for(D), 0, h, D, d_src, m->d_xg);
    LAUNCHED();
    prep_forget(s, m->d_xg, NK * D * sizeof(float));

    /* 4. gate and up of each expert over its entries (decode rows first) */
    for (int e = 0; e < E; e++) {
        const int c = start[e + 1] - start[e];
        if (c == 0) continue;
        const int c_dec = expert_decode_rows(h_src + start[e], c, n_decode);
        const ag_tensor  gate = ag_moe_expert_view(w->gate_exps, e), up = ag_moe_expert_view(w->up_exps, e);
        const ag_tensor *gu_w[2] = {&gate, &up};
        float *const     gu[2] = {m->d_g + (size_t)start[e] * F, m->d_u + (size_t)start[e] * F};
        if ((st = cu_matmul_multi(be, gu_w, 2, m->d_xg + (size_t)start[e] * D, c, c_dec, gu))) return st;
    }
    const unsigned nb = grid_for(NK * F, 256);
    if (w->gate_b) launch_k(s, moe_bias_k, nb, 256, 0, m->d_g, w->gate_b, d_exp, (int)NK, F);
    if (w->up_b) launch_k(s, moe_bias_k, nb, 256, 0, m->d_u, w->up_b, d_exp, (int)NK, F);
    if (w->act == AG_MOE_ACT_SWIGLU_OAI)
        launch_k(s, moe_act_k<true>, nb, 256, 0, m->d_g, (const float *)m->d_u, NK * F, w->alpha, w->limit);
    else
        launch_k(s, moe_act_k<false>, nb, 256, 0, m->d_g, (const float *)m->d_u, NK * F, w->alpha, w->limit);
    LAUNCHED();
    prep_forget(s, m->d_g, NK * F * sizeof(float));
    prep_forget(s, m->d_u, NK * F * sizeof(float));

    /* 5. down of each expert */
    for (int e = 0; e < E; e++) {
        const int c = start[e + 1] - start[e];
        if (c == 0) continue;
        const int c_dec = expert_decode_rows(h_src + start[e], c, n_decode);
        const ag_tensor down = ag_moe_expert_view(w->down_exps, e);
        if ((st = cu_matmul(be, &down, m->d_g + (size_t)start[e] * F, c, c_dec, m->d_y + (size_t)start[e] * D)))
            return st;
    }
    if (w->down_b) {
        launch_k(s, moe_bias_k, grid_for(NK * D, 256), 256, 0, m->d_y, w->down_b, d_exp, (int)NK, D);
        LAUNCHED();
        prep_forget(s, m->d_y, NK * D * sizeof(float));
    }

    /* 6. each row's weighted sum, its experts in ascending id */
    launch_k(s, moe_combine_k, dim3((unsigned)n), threads_for(D), 0, (const float *)m->d_y, d_ent,
             (const float *)m->d_wts, K, D, o);
    LAUNCHED();
    prep_forget(s, o, N * D * sizeof(float));
    return AG_OK;
}
