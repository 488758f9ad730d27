/* The Mamba-2 mixer (cu_mamba2, backend.h's mamba2 op; granitehybrid's
 * recurrent layers), the CPU's src/backend/cpu/mamba.c on the GPU, in
 * three kernels a call:
 *
 *   ssm_conv_k  a thread per (run, conv channel) walks the run's rows in
 *               order: the causal depthwise conv over the channel's column
 *               of the conv state and the new xBC value (+ bias, SiLU) into
 *               xc[row], the column shifted, and copied into each row's
 *               snapshot (the channels are independent: no barrier);
 *   ssm_scan_k  a block per (run, head, 32 of the head's state rows), 8
 *               lanes a state row of d_state floats, walking the run's rows
 *               in order: s = s dA + B x dt, y = Σ s C + x D, the state
 *               row into each row's snapshot;
 *   ssm_norm_k  a block per (row, group): y *= SiLU(z), then the group's
 *               RMSNorm times its gain.
 *
 * Simplicity over speed (a decode step reads and writes each state once
 * per layer; a prompt chunk walks its rows serially per state row).
 *
 * Arithmetic: the CPU's operations in the CPU's order, with products and
 * sums rounded one by one (__fmul_rn / __fadd_rn: no FMA contraction, as
 * the CPU's -std=c11 build has none), so the only differences are expf
 * and log1pf (CUDA's within 2 ulp of glibc's) and the RMSNorm's sum of
 * squares, which is a double on both sides but summed in another order
 * (the float scale made from it almost always the same). The scan's eight
 * lanes are the CPU's eight partial sums (lane j: k = j mod 8) and the
 * shuffles xor 4, 1, 2 add them in its tree ((0+4)+(1+5))+((2+6)+(3+7));
 * lane 0 adds the d_state % 8 tail serially, as the CPU does. The harness
 * (test_backend_ops mamba2_runs) holds the CUDA op to the CPU's within
 * 1e-5 relative error (every state float, every output).
 *
 * The op's per-call arguments (each run's rows, state and snapshot
 * pointers) are staged in a pinned arena and copied to a device arena at
 * the same offset; the arenas are reused from the start only after a
 * stream sync, so no copy or kernel still reads a region when it is
 * rewritten. Not recordable in a CUDA graph (the pointers move with the
 * positions): the model records no passes of a model with recurrent
 * layers, and the op refuses to run while the stream is captured. */
#include "backend/cuda/ops.cuh"
#include "backend/cuda/mamba_kernels.cuh"

/* mamba.cu's scratch (cuda_state.ssm) */
typedef struct {
    unsigned char *h_desc, *d_desc; /* pinned / device arenas of the calls' arguments, the same offsets */
    size_t         cap_desc, used;
    float         *d_xc; /* [rows][C]: the conv outputs, by batch row */
    size_t         cap_xc;
} cuda_ssm_scratch;

void ssm_free(cuda_state *s) {
    cuda_ssm_scratch *m = (cuda_ssm_scratch *)s->ssm;
    if (!m) return;
    if (m->h_desc) cudaFreeHost(m->h_desc);
    cudaFree(m->d_desc);
    cudaFree(m->d_xc);
    free(m);
    s->ssm = NULL;
}

/* Room for `bytes` of arguments at m->used in both arenas: from the start
 * after a sync when they are full (nothing then reads them any more). */
static ag_status ssm_desc_room(cuda_state *s, cuda_ssm_scratch *m, size_t bytes) {
    if (m->used + bytes <= m->cap_desc) return AG_OK;
    CUDA_TRY(cudaStreamSynchronize(s->stream));
    m->used = 0;
    if (bytes <= m->cap_desc) return AG_OK;
    if (m->h_desc) cudaFreeHost(m->h_desc);
    cudaFree(m->d_desc);
    m->h_desc = NULL, m->d_desc = NULL, m->cap_desc = 0;
    const size_t cap = bytes * 4 > ((size_t)64 << 10) ? bytes * 4 : ((size_t)64 << 10);
    CUDA_TRY(cudaMallocHost((void **)&m->h_desc, cap));
    CUDA_TRY(cudaMalloc((void **)&m->d_desc, cap));
    m->cap_desc = cap;
    return AG_OK;
}

ag_status cu_mamba2(ag_backend *be, const ag_ssm_shape *sh, const float *zx, const ag_ssm_run *runs, int n_runs,
                    float *y) {
    cuda_state *s = st_of(be);
    if (n_runs < 1) return AG_OK;
    const int d_inner = sh->d_inner, ds = sh->d_state, nh = sh->n_head, ng = sh->n_group, K = sh->d_conv;
    if (d_inner < 1 || ds < 1 || nh < 1 || ng < 1 || K < 1 || d_inner % nh || nh % ng || d_inner % ng)
        return ag_errorf(AG_ERR_INVALID, "CUDA mamba2: d_inner %d, d_state %d, %d heads, %d groups, d_conv %d", d_inner,
                         ds, nh, ng, K);
    cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    CUDA_TRY(cudaStreamIsCapturing(s->stream, &cs));
    if (cs != cudaStreamCaptureStatusNone)
        return ag_errorf(AG_ERR_INVALID, "CUDA mamba2: cannot be recorded in a graph (its arguments move each step)");
    int total = 0, max_row = -1;
    for (int i = 0; i < n_runs; i++) {
        if (runs[i].n_rows < 0 || (runs[i].n_rows > 0 && !runs[i].state))
            return ag_errorf(AG_ERR_INVALID, "CUDA mamba2: run %d has %d rows and no state", i, runs[i].n_rows);
        total += runs[i].n_rows;
        for (int t = 0; t < runs[i].n_rows; t++) max_row = runs[i].rows[t] > max_row ? runs[i].rows[t] : max_row;
    }
    if (total == 0) return AG_OK;
    const int    C = d_inner + 2 * ng * ds;
    const size_t proj = (size_t)2 * d_inner + 2 * (size_t)ng * ds + nh, conv_floats = (size_t)(K - 1) * C;
    prep_forget(s, y, (size_t)(max_row + 1) * d_inner * sizeof(float));
    if (!s->ssm && !(s->ssm = calloc(1, sizeof(cuda_ssm_scratch))))
        return ag_errorf(AG_ERR_NOMEM, "CUDA mamba2: out of memory");
    cuda_ssm_scratch *m = (cuda_ssm_scratch *)s->ssm;
    ag_status         st = grow((void **)&m->d_xc, &m->cap_xc, (size_t)(max_row + 1) * C, sizeof(float));
    if (st) return st;
    /* the arguments: runs, then a snapshot pointer and a row a run's row */
    const size_t runs_b = sizeof(ssm_run_d) * (size_t)n_runs, snaps_b = sizeof(float *) * (size_t)total,
                 rows_b = sizeof(int32_t) * (size_t)total, bytes = (runs_b + snaps_b + rows_b + 255) & ~(size_t)255;
    if ((st = ssm_desc_room(s, m, bytes))) return st;
    unsigned char *h = m->h_desc + m->used, *d = m->d_desc + m->used;
    m->used += bytes;
    ssm_run_d *hr = (ssm_run_d *)h;
    float    **hs = (float **)(h + runs_b);
    int32_t   *hw = (int32_t *)(h + runs_b + snaps_b);
    for (int i = 0, at = 0; i < n_runs; i++) {
        hr[i].state = runs[i].state;
        hr[i].row0 = at;
        hr[i].n_rows = runs[i].n_rows;
        for (int t = 0; t < runs[i].n_rows; t++, at++) {
            hw[at] = runs[i].rows[t];
            hs[at] = runs[i].snap ? runs[i].snap[t] : NULL;
        }
    }
    CUDA_TRY(cudaMemcpyAsync(d, h, runs_b + snaps_b + rows_b, cudaMemcpyHostToDevice, s->stream));
    const ssm_run_d *d_runs = (const ssm_run_d *)d;
    float *const    *d_snaps = (float *const *)(d + runs_b);
    const int32_t   *d_rows = (const int32_t *)(d + runs_b + snaps_b);
    const int        hd = d_inner / nh;
    CUDA_TRY(launch_k(s, ssm_conv_k, dim3((unsigned)n_runs, (unsigned)((C + 127) / 128)), 128, 0, d_runs, d_rows,
                      d_snaps, zx, sh->conv_w, sh->conv_b, C, K, d_inner, proj, m->d_xc));
    const int        nz = (hd + SSM_SCAN_THREADS / 8 - 1) / (SSM_SCAN_THREADS / 8); /* blocks a head */
    CUDA_TRY(launch_k(s, ssm_scan_k, dim3((unsigned)n_runs, (unsigned)(nh * nz)),
                      SSM_SCAN_THREADS, 0, d_runs, d_rows, d_snaps, zx, (const float *)m->d_xc, sh->dt_b, sh->a, sh->d,
                      d_inner, ds, nh, ng, C, proj, conv_floats, y));
    CUDA_TRY(launch_k(s, ssm_norm_k, dim3((unsigned)total, (unsigned)ng), SSM_NORM_THREADS, 0, d_rows, zx, sh->norm_w,
                      d_inner, ng, proj, sh->eps, y));
    LAUNCHED();
    return AG_OK;
}
