/* The sampling ops on the output rows: argmax, pick, cands, edit and
 * mask (the kernels: sample_pick.cuh, sample_cands.cuh, sample_edit.cuh,
 * which the CPU emulation compiles too). */
#include "backend/cuda/ops.cuh"

#include "backend/cuda/sample_pick.cuh"

/* As argmax_rows_k with a row cut into gridDim.y slices, one block each (a
 * lone 128k-row on one SM took as long as copying it to the host): each
 * slice's (value, index) goes to pv/pi, and the last slice of the row to
 * finish merges them (cnt: a counter per row, reset by that block). The
 * merge by (value, index) gives the single block's answer. The default
 * (AUGUR_CUDA_ARGMAX_SPLIT=0: one block a row): 8B batch 1 +0.3-0.5%. */
__global__ void argmax_split_k(const float *__restrict__ x, int dim, float *__restrict__ pv, int *__restrict__ pi,
                               int *__restrict__ cnt, int32_t *__restrict__ out) {
    pdl_entry();
    __shared__ bool last;
    const int       r = blockIdx.x, S = gridDim.y, sl = blockIdx.y;
    const bool      aligned = (dim & 3) == 0;
    const int       per = aligned ? ((dim + S - 1) / S + 3) & ~3 : (dim + S - 1) / S;
    const int       lo = min(dim, sl * per), hi = min(dim, lo + per);
    float           bv;
    int             bi;
    argmax_block(x + (size_t)r * dim, lo, hi, aligned, &bv, &bi);
    if (threadIdx.x == 0) {
        pv[(size_t)r * S + sl] = bv, pi[(size_t)r * S + sl] = bi;
        __threadfence();
        last = atomicAdd(&cnt[r], 1) == S - 1;
        if (last) cnt[r] = 0; /* ready for the next pass (or graph replay) */
    }
    __syncthreads();
    if (!last || threadIdx.x != 0) return;
    __threadfence();
    float v = -INFINITY;
    int   i = INT_MAX;
    for (int k = 0; k < S; k++) argmax_take(v, i, __ldcg(&pv[(size_t)r * S + k]), __ldcg(&pi[(size_t)r * S + k]));
    out[r] = v > -INFINITY ? i : -2;
}

#include "backend/cuda/sample_cands.cuh"
#include "backend/cuda/sample_edit.cuh"

/* Room for argmax_split_k's partials and counters of n rows (counters
 * zeroed when (re)allocated; the kernel leaves them zero). A regrown
 * buffer drops the recorded passes. */
ag_status reserve_argmax(cuda_state *s, int n) {
    if (!s->smp.argmax_split || (size_t)n <= s->smp.cap_am_rows) return AG_OK;
    graphs_clear(s);
    size_t    cap_v = s->smp.cap_am_rows * ARGMAX_SLICES, cap_i = cap_v, cap_c = s->smp.cap_am_rows;
    ag_status st = grow((void **)&s->smp.d_am_v, &cap_v, (size_t)n * ARGMAX_SLICES, sizeof(float));
    if (!st) st = grow((void **)&s->smp.d_am_i, &cap_i, (size_t)n * ARGMAX_SLICES, sizeof(int));
    if (!st) st = grow((void **)&s->smp.d_am_cnt, &cap_c, (size_t)n, sizeof(int));
    if (st) return st;
    CUDA_TRY(cudaMemsetAsync(s->smp.d_am_cnt, 0, (size_t)n * sizeof(int), s->stream));
    s->smp.cap_am_rows = (size_t)n;
    return AG_OK;
}

ag_status cu_argmax(ag_backend *be, const float *x, int n, int dim, int32_t *out) {
    cuda_state *s = st_of(be);
    if (n <= 0) return AG_OK;
    if (s->smp.argmax_split) {
        if ((size_t)n > s->smp.cap_am_rows) { /* begin reserves for the pass; other callers (the harness) grow here */
            cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
            CUDA_TRY(cudaStreamIsCapturing(s->stream, &cs));
            if (cs != cudaStreamCaptureStatusNone)
                return ag_errorf(AG_ERR_INVALID, "CUDA argmax: scratch for %d rows not reserved (see begin)", n);
            ag_status st = reserve_argmax(s, n);
            if (st) return st;
        }
        launch_k(s, argmax_split_k, dim3((unsigned)n, ARGMAX_SLICES), 512, 0, x, dim, s->smp.d_am_v, s->smp.d_am_i,
                 s->smp.d_am_cnt, out);
    } else {
        launch_k(s, argmax_rows_k, (unsigned)n, 1024, 0, x, dim, out);
    }
    LAUNCHED();
    return AG_OK;
}

/* Whether output rows row0..row0+n of this pass have their per-row inputs
 * (`per_row`: the layout's draws or requests, uploaded by begin). */
static bool out_rows_ok(const cuda_state *s, const ag_batch_layout *lay, const void *per_row, int row0, int n) {
    return lay && per_row && row0 >= 0 && row0 + n <= lay->n_out && row0 + n <= s->n;
}

/* Slices a row of the pick or cands op's n rows of dim values is cut into
 * (the split grids; 1: a block a row): about two blocks an SM, each of
 * SPLIT_MIN_SLICE values or more. H200, 8B (128k-rows), default sampling at
 * batch 1: one block a row took ~0.6 ms for the candidates. */
static int split_slices(const cuda_state *s, int n, int dim) {
    if (!s->smp.sample_split) return 1;
    int S = (2 * s->sm_count + n - 1) / n;
    if (S > SPLIT_MAX_SLICES) S = SPLIT_MAX_SLICES;
    if (S > dim / SPLIT_MIN_SLICE) S = dim / SPLIT_MIN_SLICE;
    if (n * S > SPLIT_BLOCKS) S = SPLIT_BLOCKS / n;
    return S >= 2 ? S : 1;
}

/* The pick op (backend.h): one pick_rows_k block a row, or for few rows
 * pick_max_k and pick_split_k over slices of each (split_slices), the
 * draws from begin's upload (so a replayed pass uses its own). */
ag_status cu_pick(ag_backend *be, const float *x, int n, int dim, const ag_batch_layout *lay, int row0,
                  int32_t *out) {
    cuda_state *s = st_of(be);
    if (n <= 0) return AG_OK;
    if (!out_rows_ok(s, lay, lay ? lay->pick : NULL, row0, n))
        return ag_errorf(AG_ERR_INVALID, "CUDA pick: rows %d..%d have no draws", row0, row0 + n);
    const int32_t *draws = (const int32_t *)s->d_draws + 3 * row0;
    const int      S = split_slices(s, n, dim);
    if (S == 1) {
        launch_k(s, pick_rows_k, (unsigned)n, 1024, 0, x, dim, draws, out);
    } else {
        launch_k(s, pick_max_k, (unsigned)(n * S), PICK_SPLIT_THREADS, 0, x, dim, S, s->smp.d_sp_slice_m,
                 s->smp.d_split_cnt, s->smp.d_sp_m);
        LAUNCHED();
        launch_k(s, pick_split_k, (unsigned)(n * S), PICK_SPLIT_THREADS, 0, x, dim, S, draws,
                 (const float *)s->smp.d_sp_m, s->smp.d_sp_part, s->smp.d_split_sum, s->smp.d_split_cnt, out);
    }
    LAUNCHED();
    return AG_OK;
}

/* The cands op (backend.h): one cands_rows_k block a row, or for few rows
 * cands_split_k and cands_z_k over slices of each (split_slices), the
 * requests from begin's upload (so a replayed pass uses its own). */
ag_status cu_cands(ag_backend *be, const float *x, int n, int dim, const ag_batch_layout *lay, int row0,
                   const int32_t *tok, ag_cands *out) {
    cuda_state *s = st_of(be);
    if (n <= 0) return AG_OK;
    if (!out_rows_ok(s, lay, lay ? lay->cands_req : NULL, row0, n))
        return ag_errorf(AG_ERR_INVALID, "CUDA cands: rows %d..%d have no requests", row0, row0 + n);
    const int32_t *reqs = (const int32_t *)s->d_cand_reqs + row0;
    const int      S = split_slices(s, n, dim);
    if (S == 1) {
        launch_k(s, cands_rows_k, (unsigned)n, CANDS_THREADS, 0, x, dim, reqs, tok, out);
    } else {
        launch_k(s, cands_split_k, (unsigned)(n * S), CANDS_THREADS, 0, x, dim, S, reqs, tok, s->smp.d_cs_key,
                 s->smp.d_cs_id, s->smp.d_cs_nf, s->smp.d_split_cnt, out);
        LAUNCHED();
        /* launched whether or not a row wants z (its blocks return at once):
         * a recorded pass is replayed for other requests of the same kinds */
        launch_k(s, cands_z_k, (unsigned)(n * S), CANDS_THREADS, 0, x, dim, S, reqs, s->smp.d_split_sum,
                 s->smp.d_split_cnt, out);
    }
    LAUNCHED();
    return AG_OK;
}

/* Room for `words` 4-byte words in a pinned staging buffer (*h, *cap_h)
 * and its device copy (*d, *cap_d), both grown by a quarter over the need;
 * a regrown device buffer drops the recorded passes, which read the old
 * one. */
static ag_status reserve_staged(cuda_state *s, void **h, size_t *cap_h, void **d, size_t *cap_d, size_t words) {
    if (words > *cap_h) {
        if (*h) cudaFreeHost(*h);
        *h = NULL;
        *cap_h = 0;
        CUDA_TRY(cudaMallocHost(h, (words + words / 4) * sizeof(uint32_t)));
        *cap_h = words + words / 4;
    }
    if (words <= *cap_d) return AG_OK;
    graphs_clear(s);
    return grow(d, cap_d, words, sizeof(uint32_t));
}

/* Uploads the pass's masks (lay->allow) for the mask op: a word per output
 * row (0: none, else 1 + its bitmap's slot), then the masked rows'
 * bitmaps only; and its edits (lay->edits by output row) for the edit op:
 * the count, padding and one edit_rec each. Each through its pinned
 * staging buffer (the previous pass's copy is done: every pass ends in a
 * sync). Nothing for a pass without them. */
ag_status upload_edits(cuda_state *s, const ag_batch_layout *lay) {
    ag_status st;
    if (lay->allow && lay->n_out > 0) {
        size_t n_masked = 0;
        for (int k = 0; k < lay->n_out; k++) n_masked += lay->allow[k] != NULL;
        const size_t words = (size_t)lay->n_out + n_masked * (size_t)lay->allow_words;
        if ((st = reserve_staged(s, (void **)&s->smp.h_masks, &s->smp.cap_h_masks, (void **)&s->smp.d_masks,
                                 &s->smp.cap_masks, words)))
            return st;
        uint32_t slot = 0;
        for (int k = 0; k < lay->n_out; k++) {
            s->smp.h_masks[k] = lay->allow[k] ? ++slot : 0;
            if (lay->allow[k])
                memcpy(s->smp.h_masks + lay->n_out + (size_t)(slot - 1) * lay->allow_words, lay->allow[k],
                       sizeof(uint32_t) * (size_t)lay->allow_words);
        }
        CUDA_TRY(cudaMemcpyAsync(s->smp.d_masks, s->smp.h_masks, words * sizeof(uint32_t), cudaMemcpyHostToDevice,
                                 s->stream));
    }
    if (!lay->edits || !lay->edit_start || lay->n_out <= 0) return AG_OK;
    const int32_t total = lay->edit_start[lay->n_out];
    const size_t  words = EDIT_HEAD + (size_t)total * (sizeof(edit_rec) / sizeof(int32_t));
    if ((st = reserve_staged(s, (void **)&s->smp.h_edits, &s->smp.cap_h_edits, (void **)&s->smp.d_edits,
                             &s->smp.cap_edits, words)))
        return st;
    s->smp.h_edits[0] = total, s->smp.h_edits[1] = 0;
    edit_rec *r = (edit_rec *)(s->smp.h_edits + EDIT_HEAD);
    for (int k = 0; k < lay->n_out; k++)
        for (int32_t i = lay->edit_start[k]; i < lay->edit_start[k + 1]; i++) *r++ = edit_rec{k, lay->edits[i]};
    CUDA_TRY(cudaMemcpyAsync(s->smp.d_edits, s->smp.h_edits, words * sizeof(int32_t), cudaMemcpyHostToDevice,
                             s->stream));
    return AG_OK;
}

/* The edit op (backend.h): edit_rows_k over the records begin uploaded. */
ag_status cu_edit(ag_backend *be, float *x, int n, int dim, const ag_batch_layout *lay) {
    cuda_state *s = st_of(be);
    if (n <= 0) return AG_OK;
    if (!lay || !lay->edits || !lay->edit_start || !s->smp.d_edits)
        return ag_errorf(AG_ERR_INVALID, "CUDA edit: the pass has no edits");
    launch_k(s, edit_rows_k, EDIT_BLOCKS, EDIT_THREADS, 0, x, n, dim, (const int32_t *)s->smp.d_edits);
    LAUNCHED();
    return AG_OK;
}

/* The mask op (backend.h): mask_rows_k over the bitmaps begin uploaded. */
ag_status cu_mask(ag_backend *be, float *x, int n, int dim, const ag_batch_layout *lay) {
    cuda_state *s = st_of(be);
    if (n <= 0) return AG_OK;
    if (!lay || !lay->allow || !s->smp.d_masks || lay->n_out != n || lay->allow_words != (dim + 31) / 32)
        return ag_errorf(AG_ERR_INVALID, "CUDA mask: the pass has no masks for %d rows of %d", n, dim);
    const int words = lay->allow_words, S = (words + MASK_WORDS - 1) / MASK_WORDS;
    launch_k(s, mask_rows_k, (unsigned)(n * S), 256, 0, x, n, S, dim, words, (const uint32_t *)s->smp.d_masks);
    LAUNCHED();
    return AG_OK;
}

