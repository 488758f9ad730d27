/* The argmax and pick kernels, a header so that the CPU emulation (tests/emu/pick_emu.cpp and cands_emu.cpp,
 * make cuda-emu) compiles the same text: included by sample.cu only, and
 * by the emulation under cuda_shim.h. It includes nothing itself. */
#ifndef AG_CUDA_SAMPLE_PICK_CUH
#define AG_CUDA_SAMPLE_PICK_CUH

/* ---- argmax of output rows (greedy sampling without copying the rows back) ---- */

/* (value, index) pairs: the larger value, the lower index among equals */
static __device__ __forceinline__ void argmax_take(float &bv, int &bi, float v, int i) {
    if (v > bv || (v == bv && i < bi)) bv = v, bi = i;
}

/* The argmax of row[lo, hi) as this thread sees it, then its block's:
 * each thread scans its elements in increasing order (so its first maximum
 * wins; +inf counts as FLT_MAX, NaN is skipped: both compare false against
 * the running best), then the warps and the block merge by (value, index).
 * aligned: row and lo allow float4 loads (hi - lo a multiple of 4 but at
 * the row's end). Thread 0 gets the block's pair; (-inf, INT_MAX) when
 * nothing is finite. */
static __device__ __forceinline__ void argmax_block(const float *__restrict__ row, int lo, int hi, bool aligned,
                                                    float *bvp, int *bip) {
    __shared__ float sv[32];
    __shared__ int   si[32];
    float            bv = -INFINITY;
    int              bi = INT_MAX;
    if (aligned) {
        const float4 *r4 = (const float4 *)row;
        for (int j = lo / 4 + threadIdx.x; j < hi / 4; j += blockDim.x) {
            const float4 v = r4[j];
            const float  a[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
            for (int k = 0; k < 4; k++) {
                const float c = a[k] > FLT_MAX ? FLT_MAX : a[k];
                if (c > bv) bv = c, bi = 4 * j + k;
            }
        }
    } else {
        for (int i = lo + threadIdx.x; i < hi; i += blockDim.x) {
            const float c = row[i] > FLT_MAX ? FLT_MAX : row[i];
            if (c > bv) bv = c, bi = i;
        }
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) argmax_take(bv, bi, __shfl_xor_sync(0xffffffffu, bv, o), __shfl_xor_sync(0xffffffffu, bi, o));
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) sv[warp] = bv, si[warp] = bi;
    __syncthreads();
    if (threadIdx.x == 0)
        for (int w = 1; w < (int)(blockDim.x >> 5); w++) argmax_take(bv, bi, sv[w], si[w]);
    *bvp = bv, *bip = bi;
}

/* out[blockIdx.x] = the lowest index among the row's largest values, -2
 * when no value is finite: the CPU sampler's greedy rule. One block a row. */
__global__ void argmax_rows_k(const float *__restrict__ x, int dim, int32_t *__restrict__ out) {
    pdl_entry();
    float bv;
    int   bi;
    argmax_block(x + (size_t)blockIdx.x * dim, 0, dim, (dim & 3) == 0, &bv, &bi);
    if (threadIdx.x == 0) out[blockIdx.x] = bv > -INFINITY ? bi : -2;
}

/* A logit's weight in ag_pick_f32: the sampler's sanitize (NaN -> -inf,
 * +inf -> FLT_MAX), then expf((l - m) * inv_t) in double. */
static __device__ __forceinline__ double pick_weight(float l, float m, float inv_t) {
    l = !(l > -INFINITY) ? -INFINITY : l > FLT_MAX ? FLT_MAX : l;
    return (double)expf(__fmul_rn(l - m, inv_t));
}

/* Among the sums w[0, n) following a running sum cum: the first with a
 * weight whose running sum passes target, or the last with a weight
 * (rounding left the target at the end); *base = the running sum before
 * it. (One thread.) */
static __device__ int pick_owner(const double *w, int n, double target, double cum, double *base) {
    int own = -1, last = 0;
    *base = cum;
    for (int t = 0; t < n; t++) {
        if (w[t] <= 0.0) continue;
        last = t;
        if (own < 0 && target < cum + w[t]) own = t, *base = cum;
        cum += w[t];
    }
    if (own < 0) own = last, *base = cum - w[last];
    return own;
}

/* row[c0, c1) scanned as the CPU scans a row, from the running sum cum:
 * the first id whose running sum passes target, or the last with a
 * weight; -1 when none has one. */
static __device__ int32_t pick_scan(const float *row, int c0, int c1, float m, float inv_t, double cum,
                                    double target) {
    int32_t pick = -1;
    for (int i = c0; i < c1; i++) {
        const double w = pick_weight(row[i], m, inv_t);
        if (w <= 0.0) continue;
        pick = i;
        cum += w;
        if (target < cum) break;
    }
    return pick;
}

/* out[blockIdx.x] = ag_pick_f32 of the row with its draw (draws: u's low
 * and high words, 1/T's bits), -2 when no value is finite. One block of
 * 1024 threads a row: the max (argmax_block), each thread's weights over a
 * contiguous slice of ids summed in id order, the slices' sums in order by
 * one thread, which finds the slice where u times the total falls; that
 * slice's thread scans it as the CPU scans the row. The weights' sum is
 * associated differently from the CPU's (and expf may differ in the last
 * bit), so the token can differ only where u times the sum lies within
 * rounding of a boundary. For many rows; few rows take pick_max_k and
 * pick_split_k. */
__global__ void __launch_bounds__(1024) pick_rows_k(const float *__restrict__ x, int dim,
                                                    const int32_t *__restrict__ draws, int32_t *__restrict__ out) {
    pdl_entry();
    __shared__ double part[1024];
    __shared__ float  s_m;
    __shared__ double s_target, s_base;
    __shared__ int    s_owner;
    const float      *row = x + (size_t)blockIdx.x * dim;
    float             bv;
    int               bi;
    argmax_block(row, 0, dim, (dim & 3) == 0, &bv, &bi);
    if (threadIdx.x == 0) s_m = bv;
    __syncthreads();
    const float m = s_m;
    if (!(m > -INFINITY)) {
        if (threadIdx.x == 0) out[blockIdx.x] = -2;
        return;
    }
    const int32_t *d = draws + 3 * blockIdx.x;
    const double   u = __hiloint2double(d[1], d[0]);
    const float    inv_t = __int_as_float(d[2]);
    const int      per = (dim + (int)blockDim.x - 1) / (int)blockDim.x;
    const int      c0 = min(dim, (int)threadIdx.x * per), c1 = min(dim, c0 + per);
    double         sum = 0.0;
    for (int i = c0; i < c1; i++) sum += pick_weight(row[i], m, inv_t);
    part[threadIdx.x] = sum;
    __syncthreads();
    if (threadIdx.x == 0) {
        double total = 0.0;
        for (int t = 0; t < (int)blockDim.x; t++) total += part[t];
        s_target = u * total;
        double base;
        s_owner = pick_owner(part, (int)blockDim.x, s_target, 0.0, &base);
        s_base = base;
    }
    __syncthreads();
    if ((int)threadIdx.x == s_owner) out[blockIdx.x] = pick_scan(row, c0, c1, m, inv_t, s_base, s_target);
}

/* Row r's slice [lo, hi) of a split grid (pick_max_k, pick_split_k,
 * cands_split_k, cands_z_k): blocks r * S .. r * S + S - 1 are row r's S
 * slices, in id order; a slice's length a multiple of 4 when the row allows
 * float4 loads (aligned). */
static __device__ __forceinline__ void slice_range(int dim, int S, bool aligned, int j, int &lo, int &hi) {
    const int per0 = (dim + S - 1) / S, per = aligned ? (per0 + 3) & ~3 : per0;
    lo = min(dim, j * per), hi = min(dim, lo + per);
}
static __device__ __forceinline__ void split_slice(int dim, int S, bool aligned, int &r, int &lo, int &hi) {
    r = (int)blockIdx.x / S;
    slice_range(dim, S, aligned, (int)blockIdx.x % S, lo, hi);
}

/* Whether this block is the last of its row's S to get here (after its
 * threads' global writes, which the last block then sees): the counter
 * cnt[r] is reset by that block, so the next pass (or graph replay) finds
 * it zero. Every thread gets it. */
static __device__ bool last_slice_of_row(int *cnt, int r, int S) {
    __shared__ bool s_last;
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
        s_last = atomicAdd(&cnt[r], 1) == S - 1;
        if (s_last) cnt[r] = 0;
    }
    __syncthreads();
    if (s_last) __threadfence();
    return s_last;
}

/* The first step of a split pick (few rows: one block over a 128k-row reads
 * it at one SM's pace): each slice's max (argmax_block's value: +inf as
 * FLT_MAX) into sc_m, and the row's last slice writes the row's max to
 * m_out[r] (-inf when nothing is finite). */
__global__ void __launch_bounds__(1024) pick_max_k(const float *__restrict__ x, int dim, int S, float *sc_m, int *cnt,
                                                   float *m_out) {
    pdl_entry();
    const bool aligned = (dim & 3) == 0;
    int        r, lo, hi;
    split_slice(dim, S, aligned, r, lo, hi);
    float bv;
    int   bi;
    argmax_block(x + (size_t)r * dim, lo, hi, aligned, &bv, &bi);
    if (threadIdx.x == 0) sc_m[blockIdx.x] = bv;
    if (!last_slice_of_row(cnt, r, S) || threadIdx.x != 0) return;
    float m = -INFINITY;
    for (int s = 0; s < S; s++) m = fmaxf(m, __ldcg(&sc_m[r * S + s]));
    m_out[r] = m;
}

/* The second step: ag_pick_f32 of row r with its draw, as pick_rows_k, the
 * row cut into S slices of a block each (m: pick_max_k's maxima). Each
 * thread sums its contiguous run of the slice's weights in id order (into
 * sc_part, blockDim.x a slice), the slice's thread 0 their sum in thread
 * order (sc_tot); the row's last slice finds the slice where u times the
 * total falls (the slices' sums in order), in it the thread, and scans that
 * thread's run as the CPU scans the row. Same token as pick_rows_k but
 * where u times the sum lies within rounding of a boundary. */
__global__ void __launch_bounds__(1024) pick_split_k(const float *__restrict__ x, int dim, int S,
                                                     const int32_t *__restrict__ draws, const float *m_in,
                                                     double *sc_part, double *sc_tot, int *cnt,
                                                     int32_t *__restrict__ out) {
    pdl_entry();
    __shared__ double part[1024];
    __shared__ double s_target, s_base;
    __shared__ int    s_owner;
    int               r, lo, hi;
    split_slice(dim, S, (dim & 3) == 0, r, lo, hi);
    const float *row = x + (size_t)r * dim;
    const float  m = m_in[r];
    const int    T = (int)blockDim.x, tid = (int)threadIdx.x;
    if (!(m > -INFINITY)) { /* the whole row's blocks alike */
        if ((int)blockIdx.x == r * S && tid == 0) out[r] = -2;
        return;
    }
    const int32_t *d = draws + 3 * r;
    const double   u = __hiloint2double(d[1], d[0]);
    const float    inv_t = __int_as_float(d[2]);
    /* thread t's run of slice [a, b) */
    auto run = [&](int a, int b, int t, int &c0, int &c1) {
        const int per = (b - a + T - 1) / T;
        c0 = min(b, a + t * per), c1 = min(b, c0 + per);
    };
    int c0, c1;
    run(lo, hi, tid, c0, c1);
    double sum = 0.0;
    for (int i = c0; i < c1; i++) sum += pick_weight(row[i], m, inv_t);
    part[tid] = sum;
    sc_part[(size_t)blockIdx.x * T + tid] = sum;
    __syncthreads();
    if (tid == 0) {
        double tot = 0.0;
        for (int t = 0; t < T; t++) tot += part[t];
        sc_tot[blockIdx.x] = tot;
    }
    if (!last_slice_of_row(cnt, r, S)) return;
    /* the slice where u times the row's total falls, then its thread */
    for (int s = tid; s < S; s += T) part[s] = __ldcg(&sc_tot[r * S + s]);
    __syncthreads();
    if (tid == 0) {
        double total = 0.0;
        for (int s = 0; s < S; s++) total += part[s];
        s_target = u * total;
        double base;
        s_owner = pick_owner(part, S, s_target, 0.0, &base);
        s_base = base;
    }
    __syncthreads();
    const int    slice = s_owner;
    const double slice_base = s_base;
    __syncthreads();
    part[tid] = __ldcg(&sc_part[(size_t)(r * S + slice) * T + tid]);
    __syncthreads();
    if (tid == 0) {
        double base;
        s_owner = pick_owner(part, T, s_target, slice_base, &base);
        s_base = base;
    }
    __syncthreads();
    if (tid != s_owner) return;
    int slo, shi;
    slice_range(dim, S, (dim & 3) == 0, slice, slo, shi);
    run(slo, shi, tid, c0, c1);
    out[r] = pick_scan(row, c0, c1, m, inv_t, s_base, s_target);
}

/* ---- end of the pick kernel (make cuda-emu runs the code above, from the argmax's start, on the CPU) ---- */

#endif
