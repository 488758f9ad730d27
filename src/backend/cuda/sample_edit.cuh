/* The edit and mask kernels, a header so that the CPU emulation (tests/emu/edit_emu.cpp,
 * make cuda-emu) compiles the same text: included by sample.cu only, and
 * by the emulation under cuda_shim.h. It includes nothing itself. */
#ifndef AG_CUDA_SAMPLE_EDIT_CUH
#define AG_CUDA_SAMPLE_EDIT_CUH

/* ---- the samplers' edits of output rows (logit bias and penalties where the logits are) ---- */

/* One edit as uploaded: the output row it edits and the sampler's edit. */
typedef struct {
    int32_t       row;
    ag_logit_edit e;
} edit_rec;
#define EDIT_HEAD 2     /* int32 words before the records: the count, padding */
#define EDIT_BLOCKS 64  /* the edit kernel's grid (fixed: a recorded pass replays any count) */
#define EDIT_THREADS 256

/* The sampler's sanitize (base/argmax.h): NaN -> -inf, +inf -> FLT_MAX. */
static __device__ __forceinline__ float edit_sanitize(float l) {
    return !(l > -INFINITY) ? -INFINITY : l > FLT_MAX ? FLT_MAX : l;
}

/* ag_logit_edit_apply (base/argmax.h), each operation rounded on its own
 * as on the host (the __f*_rn intrinsics are never contracted). */
static __device__ __forceinline__ float edit_apply(float l, const ag_logit_edit &e) {
    l = edit_sanitize(l);
    if (e.flags & AG_EDIT_BAN) l = -INFINITY;
    else if (e.flags & AG_EDIT_BIAS) l = edit_sanitize(__fadd_rn(l, e.bias));
    if (e.flags & AG_EDIT_PENALTY) {
        if (e.rep != 1.0f) l = l > 0.0f ? __fdiv_rn(l, e.rep) : __fmul_rn(l, e.rep);
        l = edit_sanitize(__fsub_rn(l, e.sub));
    }
    return l;
}

/* Applies the uploaded edits (buf: the count, padding, edit_rec[count])
 * to x[n_rows][dim] in place; a row holds a token once, so no two threads
 * write one value. Grid-stride over the records. */
__global__ void edit_rows_k(float *__restrict__ x, int n_rows, int dim, const int32_t *__restrict__ buf) {
    pdl_entry();
    const int       n = buf[0];
    const edit_rec *r = (const edit_rec *)(buf + EDIT_HEAD);
    for (int i = (int)(blockIdx.x * blockDim.x + threadIdx.x); i < n; i += (int)(gridDim.x * blockDim.x)) {
        const edit_rec q = r[i];
        if (q.row < 0 || q.row >= n_rows || q.e.id < 0 || q.e.id >= dim) continue;
        float *l = x + (size_t)q.row * dim + q.e.id;
        *l = edit_apply(*l, q.e);
    }
}
/* Sets x[row][i] = -inf for each token i that the row's bitmap leaves out
 * (buf: a word per row, 0 for none, else 1 + the slot of its bitmap among
 * the bitmaps of `words` words that follow); a block per slice of
 * MASK_WORDS words of a row (n_rows * S blocks). */
#define MASK_WORDS 1024
__global__ void mask_rows_k(float *__restrict__ x, int n_rows, int S, int dim, int words,
                            const uint32_t *__restrict__ buf) {
    pdl_entry();
    const int row = (int)blockIdx.x / S, slice = (int)blockIdx.x % S;
    if (!buf[row]) return;
    const uint32_t *bits = buf + n_rows + (size_t)(buf[row] - 1) * words;
    const int       w1 = min(words, (slice + 1) * MASK_WORDS);
    for (int w = slice * MASK_WORDS + (int)threadIdx.x; w < w1; w += (int)blockDim.x) {
        const uint32_t a = bits[w];
        if (a == 0xFFFFFFFFu) continue;
        for (int b = 0; b < 32 && w * 32 + b < dim; b++)
            if (!(a >> b & 1u)) x[(size_t)row * dim + w * 32 + b] = -INFINITY;
    }
}
/* ---- end of the edit kernel (make cuda-emu runs it on the CPU) ---- */

#endif
