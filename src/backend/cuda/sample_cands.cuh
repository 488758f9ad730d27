/* The candidates kernels (and cands_req_word, their requests' encoding),
 * a header so that the CPU emulation (tests/emu/cands_emu.cpp, after
 * sample_pick.cuh; make cuda-emu) compiles the same text: included by
 * sample.cu only, and by the emulation under cuda_shim.h. It includes
 * nothing itself. */
#ifndef AG_CUDA_SAMPLE_CANDS_CUH
#define AG_CUDA_SAMPLE_CANDS_CUH

/* ---- a row's best candidates (top-k sampling without copying the rows back) ---- */

/* A cands request as one word for the device: k - 1 in bits 0-7 (k clamped
 * to [1, AG_CANDS_MAX] as ag_top_cands_f32 clamps it), want_z in bit 8,
 * at + 1 in bits 9-31 (0: none; an id past AG_CANDS_AT_MAX reads as none,
 * as on the host; all ones: AG_CANDS_AT_TOKEN). */
#define CANDS_AT1_TOKEN 0x7fffffu
int32_t cands_req_word(const ag_cands_req *q) {
    const int32_t  k = q->k < 1 ? 1 : q->k > AG_CANDS_MAX ? AG_CANDS_MAX : q->k;
    const uint32_t at1 = q->at == AG_CANDS_AT_TOKEN                 ? CANDS_AT1_TOKEN
                         : q->at >= 0 && q->at <= AG_CANDS_AT_MAX ? (uint32_t)q->at + 1u
                                                                   : 0u;
    return (int32_t)((uint32_t)(k - 1) | (q->want_z ? 1u << 8 : 0u) | at1 << 9);
}

/* The sampler's sanitize (base/argmax.h): NaN -> -inf, +inf -> FLT_MAX. */
static __device__ __forceinline__ float cand_sanitize(float l) {
    return !(l > -INFINITY) ? -INFINITY : l > FLT_MAX ? FLT_MAX : l;
}

/* A finite value as an unsigned key in the value's order; -0.0 keyed as
 * +0.0, since the two compare equal and so tie by id. */
static __device__ __forceinline__ uint32_t cand_key(float l) {
    const uint32_t f = __float_as_uint(l == 0.0f ? 0.0f : l);
    return (f & 0x80000000u) ? ~f : f | 0x80000000u;
}

/* The sampler's total order on (key, id): larger key, then lower id. */
static __device__ __forceinline__ bool cand_before(uint32_t ka, int ia, uint32_t kb, int ib) {
    return ka > kb || (ka == kb && ia < ib);
}

/* Sums over the block, the same order every run (a fixed shuffle tree,
 * then the warps in order); every thread gets the result.
 * sh: 32 words of shared scratch, free again on return. */
template <typename T> static __device__ __forceinline__ T cand_block_sum(T v, T *sh) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if ((threadIdx.x & 31) == 0) sh[threadIdx.x >> 5] = v;
    __syncthreads();
    T t = 0;
    for (int w = 0; w < (int)(blockDim.x >> 5); w++) t += sh[w];
    __syncthreads();
    return t;
}

#define CANDS_THREADS 1024

/* A row's request decoded (cands_req_word): k, want_z and at (-1: none;
 * AG_CANDS_AT_TOKEN names t, the row's token, or none when t is -1). */
struct cand_req {
    int  k, at;
    bool want_z;
};
static __device__ __forceinline__ cand_req cand_req_decode(uint32_t req, int t, int dim) {
    cand_req q;
    q.k = (int)(req & 0xffu) + 1;
    q.want_z = (req >> 8) & 1u;
    /* the host too ignores a token past AG_CANDS_AT_MAX */
    const int at1 = (req >> 9) == CANDS_AT1_TOKEN ? (t >= 0 && t <= AG_CANDS_AT_MAX ? t + 1 : 0) : (int)(req >> 9);
    q.at = at1 - 1 >= 0 && at1 - 1 < dim ? at1 - 1 : -1;
    return q;
}

/* The entries a selection reads, in id order: entry i's key and id, false
 * when it is no candidate. A row's slice [lo, lo + n): -inf (and NaN) are
 * none. */
struct cand_row_src {
    const float *row;
    int          lo;
    __device__ __forceinline__ bool operator()(int i, uint32_t &key, int &id) const {
        const float l = cand_sanitize(row[lo + i]);
        key = cand_key(l), id = lo + i;
        return l != -INFINITY;
    }
};
/* The slices' best, slice after slice (cands_split_k): key 0 (no finite
 * value's) marks an empty slot. Each slice's entries are sorted by (key
 * desc, id asc) and the slices' ids ascend, so the entries of any one key
 * come in id order, as a selection's ties need. Written by other blocks of
 * the grid: read past L1. */
struct cand_union_src {
    const uint32_t *key;
    const int32_t  *id;
    __device__ __forceinline__ bool operator()(int i, uint32_t &k, int &d) const {
        k = __ldcg(key + i), d = __ldcg(id + i);
        return k != 0u;
    }
};

/* How many of src's n entries are candidates; every thread gets it. */
template <typename Src> static __device__ int cands_count(const Src &src, int n) {
    __shared__ int sh[32];
    int            c = 0;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        uint32_t key;
        int      id;
        c += src(i, key, id);
    }
    return cand_block_sum(c, sh);
}

/* s_key/s_id[0, kc) = the kc best of src's n entries (0 < kc <= the
 * candidates among them, kc <= AG_CANDS_MAX) by (key desc, id asc), ties
 * keeping the lowest ids, as ag_top_cands_f32's order does. Every thread of
 * the block calls it (blockDim.x >= AG_CANDS_MAX, whole warps):
 *  1. radix select, 8 bits a round from the top: the key T of the kc-th best
 *     and r, how many of the kc have key T (histograms of integer counts, the
 *     same every run; a warp's lanes that fall in one bin add once, as
 *     logits crowd a few bins of the first round);
 *  2. in id order, chunk by chunk: keys above T take slots by an atomic
 *     counter (any order), keys equal to T the next slots by their rank in
 *     id order while fewer than r are taken (a block-wide ballot scan);
 *  3. a bitonic sort of the slots by (key desc, id asc). */
template <typename Src>
static __device__ void cands_select(const Src &src, int n, int kc, uint32_t *s_key, int32_t *s_id) {
    __shared__ uint32_t hist[256];
    __shared__ int      sh_i[32];
    __shared__ uint32_t s_prefix;
    __shared__ int      s_rank, s_gt;
    const int           tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    uint32_t            prefix = 0;
    int                 r = kc; /* the rank sought among the keys that match the prefix */
    for (int shift = 24; shift >= 0; shift -= 8) {
        for (int b = tid; b < 256; b += blockDim.x) hist[b] = 0;
        __syncthreads();
        const uint32_t high = shift == 24 ? 0u : 0xffffffffu << (shift + 8);
        for (int c0 = 0; c0 < n; c0 += blockDim.x) { /* whole warps each step, for the match */
            const int i = c0 + tid;
            uint32_t  key = 0;
            int       id;
            const bool     take = i < n && src(i, key, id) && (key & high) == prefix;
            const uint32_t bin = take ? (key >> shift) & 255u : 256u + lane; /* lanes not taking: alone */
            const unsigned peers = __match_any_sync(0xffffffffu, bin);
            if (take && lane == __ffs(peers) - 1) atomicAdd(&hist[bin], (uint32_t)__popc(peers));
        }
        __syncthreads();
        if (tid == 0) {
            int rr = r, b = 255;
            for (; b > 0 && (int)hist[b] < rr; b--) rr -= (int)hist[b];
            s_prefix = prefix | ((uint32_t)b << shift), s_rank = rr;
        }
        __syncthreads();
        prefix = s_prefix, r = s_rank;
    }
    const uint32_t T = prefix;
    const int      n_gt = kc - r;

    if (tid == 0) s_gt = 0;
    __syncthreads();
    int ties = 0; /* ties seen in earlier chunks: the same in every thread */
    for (int c0 = 0; c0 < n; c0 += blockDim.x) {
        const int i = c0 + tid;
        bool      tie = false;
        uint32_t  key;
        int       id;
        if (i < n && src(i, key, id)) {
            if (key > T) {
                const int slot = atomicAdd(&s_gt, 1);
                s_key[slot] = key, s_id[slot] = id;
            } else {
                tie = key == T;
            }
        }
        const unsigned bal = __ballot_sync(0xffffffffu, tie);
        if (lane == 0) sh_i[warp] = __popc(bal);
        __syncthreads();
        int before = ties + __popc(bal & ((1u << lane) - 1u)), total = 0;
        for (int w = 0; w < (int)(blockDim.x >> 5); w++) {
            before += w < warp ? sh_i[w] : 0;
            total += sh_i[w];
        }
        if (tie && before < r) s_key[n_gt + before] = T, s_id[n_gt + before] = id;
        ties += total;
        const bool done = ties >= r && s_gt == n_gt; /* read before the barrier: no atomics until after it */
        __syncthreads();
        if (done) break;
    }

    for (int i = tid; i < AG_CANDS_MAX; i += blockDim.x)
        if (i >= kc) s_key[i] = 0u, s_id[i] = INT_MAX; /* below every finite key */
    __syncthreads();
    for (int size = 2; size <= AG_CANDS_MAX; size <<= 1)
        for (int stride = size >> 1; stride > 0; stride >>= 1) {
            const int i = tid, j = tid ^ stride;
            if (i < AG_CANDS_MAX && j > i) {
                const bool swap = (i & size) == 0 ? cand_before(s_key[j], s_id[j], s_key[i], s_id[i])
                                                  : cand_before(s_key[i], s_id[i], s_key[j], s_id[j]);
                if (swap) {
                    const uint32_t tk = s_key[i];
                    const int32_t  ti = s_id[i];
                    s_key[i] = s_key[j], s_id[i] = s_id[j];
                    s_key[j] = tk, s_id[j] = ti;
                }
            }
            __syncthreads();
        }
}

/* Writes a row's result but its sum: at and at_l, the count of finite
 * values, and the kc best (s_id, their values read back from the row, so
 * their bits, -0.0 too, are the host's); sumexp NaN when z is not wanted, 0
 * when nothing is finite, else left to the caller. */
static __device__ void cands_write(ag_cands *o, const float *row, const cand_req &q, int nf, int kc,
                                   const int32_t *s_id) {
    for (int i = threadIdx.x; i < kc; i += blockDim.x) {
        o->c[i].id = s_id[i];
        o->c[i].l = cand_sanitize(row[s_id[i]]);
    }
    if (threadIdx.x == 0) {
        o->at = q.at, o->pad_ = 0;
        o->at_l = q.at >= 0 ? cand_sanitize(row[q.at]) : __int_as_float(0x7fc00000);
        o->n = kc, o->n_finite = nf;
        o->max = kc > 0 ? cand_sanitize(row[s_id[0]]) : -INFINITY;
        if (!q.want_z) o->sumexp = __longlong_as_double(0x7ff8000000000000ll);
        else if (kc == 0) o->sumexp = 0.0;
    }
}

/* This thread's part of sum (double)expf(l - m) over row[lo, hi). */
static __device__ __forceinline__ double cands_z_part(const float *row, int lo, int hi, float m) {
    double z = 0.0;
    for (int i = lo + (int)threadIdx.x; i < hi; i += blockDim.x) z += (double)expf(cand_sanitize(row[i]) - m);
    return z;
}

/* out[blockIdx.x] = ag_top_cands_f32 of the row for its request (reqs: a
 * word each, cands_req_word; AG_CANDS_AT_TOKEN names tok[blockIdx.x], or
 * none without tok). One block a row: the finite values' count, the
 * selection (cands_select), and for want_z the sum of (double)expf(l - max)
 * over the row, summed in a fixed order other than the host's; CUDA's expf
 * is within 2 ulp of the host's, so the sum agrees to about 1e-7 relative.
 * For many rows; few rows take cands_split_k. */
__global__ void __launch_bounds__(CANDS_THREADS) cands_rows_k(const float *__restrict__ x, int dim,
                                                              const int32_t *__restrict__ reqs,
                                                              const int32_t *__restrict__ tok,
                                                              ag_cands *__restrict__ out) {
    pdl_entry();
    __shared__ uint32_t s_key[AG_CANDS_MAX];
    __shared__ int32_t  s_id[AG_CANDS_MAX];
    __shared__ double   sh_d[32];
    const float        *row = x + (size_t)blockIdx.x * dim;
    ag_cands           *o = out + blockIdx.x;
    const cand_req      q = cand_req_decode((uint32_t)reqs[blockIdx.x], tok ? tok[blockIdx.x] : -1, dim);
    const cand_row_src  src = {row, 0};
    const int           nf = cands_count(src, dim);
    const int           kc = min(q.k, nf);
    if (kc > 0) cands_select(src, dim, kc, s_key, s_id);
    cands_write(o, row, q, nf, kc, s_id);
    if (!q.want_z || kc == 0) return;
    const double z = cand_block_sum(cands_z_part(row, 0, dim, cand_sanitize(row[s_id[0]])), sh_d);
    if (threadIdx.x == 0) o->sumexp = z;
}

/* As cands_rows_k for few rows, each row cut into S slices of a block each
 * (one block over a 152k-row reads it at one SM's pace, which at batch 1
 * took longer than copying the row to the host): each slice selects its own
 * best (kc_j = min(k, its finite values)) into the scratch (sc_key/sc_id:
 * AG_CANDS_MAX entries a slice, row r's at r * S * AG_CANDS_MAX, slice j's
 * k of them at j * k; sc_nf: a count a slice), and the row's last slice to
 * finish selects the row's best among the slices' (a value among the row's
 * k best is among its slice's k best) and writes the result. The sum z
 * needs the row's max: cands_z_k, launched next, adds it. Same result as
 * cands_rows_k, z summed in another fixed order. */
__global__ void __launch_bounds__(CANDS_THREADS) cands_split_k(const float *__restrict__ x, int dim, int S,
                                                               const int32_t *__restrict__ reqs,
                                                               const int32_t *__restrict__ tok, uint32_t *sc_key,
                                                               int32_t *sc_id, int *sc_nf, int *cnt,
                                                               ag_cands *__restrict__ out) {
    pdl_entry();
    __shared__ uint32_t s_key[AG_CANDS_MAX];
    __shared__ int32_t  s_id[AG_CANDS_MAX];
    int                 r, lo, hi;
    split_slice(dim, S, false, r, lo, hi);
    const float       *row = x + (size_t)r * dim;
    const cand_req     q = cand_req_decode((uint32_t)reqs[r], tok ? tok[r] : -1, dim);
    const int          k = q.k;
    const cand_row_src src = {row, lo};
    const int          nf = cands_count(src, hi - lo);
    const int          kc = min(k, nf);
    if (kc > 0) cands_select(src, hi - lo, kc, s_key, s_id);
    uint32_t *gk = sc_key + (size_t)r * S * AG_CANDS_MAX;
    int32_t  *gi = sc_id + (size_t)r * S * AG_CANDS_MAX;
    const int j = (int)blockIdx.x - r * S;
    for (int i = threadIdx.x; i < k; i += blockDim.x) {
        gk[j * k + i] = i < kc ? s_key[i] : 0u;
        gi[j * k + i] = i < kc ? s_id[i] : 0;
    }
    if (threadIdx.x == 0) sc_nf[blockIdx.x] = nf;
    if (!last_slice_of_row(cnt, r, S)) return;
    int nf_row = 0;
    for (int s = 0; s < S; s++) nf_row += __ldcg(&sc_nf[r * S + s]);
    const int            kc_row = min(k, nf_row);
    const cand_union_src u = {gk, gi};
    if (kc_row > 0) cands_select(u, S * k, kc_row, s_key, s_id);
    cands_write(out + r, row, q, nf_row, kc_row, s_id);
}

/* The sums z of cands_split_k's rows that want them (the grid's slices
 * again): each slice sums (double)expf(l - max) over its values (max: the
 * row's result), into sc_z; the row's last slice adds the slices' sums in
 * slice order. */
__global__ void __launch_bounds__(CANDS_THREADS) cands_z_k(const float *__restrict__ x, int dim, int S,
                                                           const int32_t *__restrict__ reqs, double *sc_z,
                                                           int *cnt, ag_cands *__restrict__ out) {
    pdl_entry();
    __shared__ double sh_d[32];
    int               r, lo, hi;
    split_slice(dim, S, false, r, lo, hi);
    ag_cands *o = out + r;
    if (!cand_req_decode((uint32_t)reqs[r], -1, dim).want_z || o->n == 0) return; /* the whole row's blocks alike */
    const double z = cand_block_sum(cands_z_part(x + (size_t)r * dim, lo, hi, o->max), sh_d);
    if (threadIdx.x == 0) sc_z[blockIdx.x] = z;
    if (!last_slice_of_row(cnt, r, S) || threadIdx.x != 0) return;
    double t = 0.0;
    for (int s = 0; s < S; s++) t += __ldcg(&sc_z[r * S + s]);
    o->sumexp = t;
}
/* ---- end of the candidates kernel (make cuda-emu runs the code above on the CPU) ---- */

#endif
