/* The Mamba-2 mixer's kernels (mamba.cu launches them; see it for the
 * design and the arithmetic). A header so that tests/emu/mamba_emu.cpp
 * compiles them unchanged on the CPU (cuda_shim.h) and holds them to the
 * CPU op bit for bit. */
#ifndef AG_CUDA_MAMBA_KERNELS_CUH
#define AG_CUDA_MAMBA_KERNELS_CUH

typedef struct {
    float *state; /* the run's layer state: conv [d_conv - 1][C], then SSM [n_head][head_dim][d_state] */
    int    row0;  /* the run's first entry in rows[] and snaps[] */
    int    n_rows;
} ssm_run_d;

static __device__ __forceinline__ float ssm_silu(float x) { return __fdiv_rn(x, __fadd_rn(1.0f, expf(-x))); }

__global__ void __launch_bounds__(128)
    ssm_conv_k(const ssm_run_d *__restrict__ runs, const int32_t *__restrict__ rows, float *const *__restrict__ snaps,
               const float *__restrict__ zx, const float *__restrict__ conv_w, const float *__restrict__ conv_b, int C,
               int K, int d_inner, size_t proj, float *__restrict__ xc) {
    pdl_entry();
    const int c = blockIdx.y * blockDim.x + threadIdx.x;
    if (c >= C) return;
    const ssm_run_d run = runs[blockIdx.x];
    float          *conv = run.state; /* [K - 1][C]: column c is this thread's alone */
    const float    *w = conv_w + (size_t)c * K;
    for (int t = 0; t < run.n_rows; t++) {
        const int   r = rows[run.row0 + t];
        const float xbc = zx[(size_t)r * proj + d_inner + c];
        float       s = 0.0f;
        for (int k = 0; k < K - 1; k++) s = __fadd_rn(s, __fmul_rn(conv[(size_t)k * C + c], w[k]));
        s = __fadd_rn(s, __fmul_rn(xbc, w[K - 1]));
        xc[(size_t)r * C + c] = ssm_silu(__fadd_rn(s, conv_b[c]));
        if (K > 1) { /* the oldest value leaves, xBC becomes the newest */
            for (int k = 0; k < K - 2; k++) conv[(size_t)k * C + c] = conv[(size_t)(k + 1) * C + c];
            conv[(size_t)(K - 2) * C + c] = xbc;
        }
        float *snap = snaps[run.row0 + t];
        if (snap)
            for (int k = 0; k < K - 1; k++) snap[(size_t)k * C + c] = conv[(size_t)k * C + c];
    }
}

#define SSM_SCAN_THREADS 256 /* 8 lanes a state row: 32 state rows a block */

__global__ void __launch_bounds__(SSM_SCAN_THREADS)
    ssm_scan_k(const ssm_run_d *__restrict__ runs, const int32_t *__restrict__ rows, float *const *__restrict__ snaps,
               const float *__restrict__ zx, const float *__restrict__ xc, const float *__restrict__ dt_b,
               const float *__restrict__ a, const float *__restrict__ dskip, int d_inner, int ds, int n_head,
               int n_group, int C, size_t proj, size_t conv_floats, float *__restrict__ y) {
    pdl_entry();
    const ssm_run_d run = runs[blockIdx.x];
    const int       hd = d_inner / n_head, nz = (hd + SSM_SCAN_THREADS / 8 - 1) / (SSM_SCAN_THREADS / 8);
    const int       h = blockIdx.y / nz, j = threadIdx.x & 7; /* grid y: (head, 32 of its state rows) */
    const int       i = (blockIdx.y % nz) * (SSM_SCAN_THREADS / 8) + (threadIdx.x >> 3);
    const bool      on = i < hd; /* (off lanes still join the shuffles) */
    const int       ii = h * hd + i, g = h / (n_head / n_group), k8 = ds & ~7;
    float          *st = run.state + conv_floats + (size_t)ii * ds; /* this state row (read only when on) */
    for (int t = 0; t < run.n_rows; t++) {
        const int   r = rows[run.row0 + t];
        const float dt = __fadd_rn(zx[(size_t)r * proj + 2 * (size_t)d_inner + 2 * (size_t)n_group * ds + h], dt_b[h]);
        const float sp = dt <= 20.0f ? log1pf(expf(dt)) : dt; /* softplus */
        const float dA = expf(__fmul_rn(sp, a[h]));
        const float *xr = xc + (size_t)r * C;
        const float *B = xr + d_inner + (size_t)g * ds, *Cm = xr + d_inner + (size_t)n_group * ds + (size_t)g * ds;
        const float  x = on ? xr[ii] : 0.0f, x_dt = __fmul_rn(x, sp);
        float        acc = 0.0f;
        if (on)
            for (int k = j; k < k8; k += 8) {
                const float v = __fadd_rn(__fmul_rn(st[k], dA), __fmul_rn(B[k], x_dt));
                st[k] = v;
                acc = __fadd_rn(acc, __fmul_rn(v, Cm[k]));
            }
        /* the CPU's tree of its eight partial sums, into lane j = 0 */
        acc = __fadd_rn(acc, __shfl_xor_sync(0xffffffffu, acc, 4));
        acc = __fadd_rn(acc, __shfl_xor_sync(0xffffffffu, acc, 1));
        acc = __fadd_rn(acc, __shfl_xor_sync(0xffffffffu, acc, 2));
        float *snap = snaps[run.row0 + t];
        if (!on) continue;
        if (j == 0) { /* the tail, serially, then the D skip */
            float sum = acc;
            for (int k = k8; k < ds; k++) {
                const float v = __fadd_rn(__fmul_rn(st[k], dA), __fmul_rn(B[k], x_dt));
                st[k] = v;
                sum = __fadd_rn(sum, __fmul_rn(v, Cm[k]));
                if (snap) snap[conv_floats + (size_t)ii * ds + k] = v;
            }
            y[(size_t)r * d_inner + ii] = __fadd_rn(sum, __fmul_rn(x, dskip[h]));
        }
        if (snap) /* the values this lane wrote */
            for (int k = j; k < k8; k += 8) snap[conv_floats + (size_t)ii * ds + k] = st[k];
    }
}

#define SSM_NORM_THREADS 256

__global__ void __launch_bounds__(SSM_NORM_THREADS)
    ssm_norm_k(const int32_t *__restrict__ rows, const float *__restrict__ zx, const float *__restrict__ norm_w,
               int d_inner, int n_group, size_t proj, float eps, float *__restrict__ y) {
    pdl_entry();
    __shared__ double red[SSM_NORM_THREADS / 32];
    __shared__ float  scale_s;
    const int    r = rows[blockIdx.x], g = blockIdx.y, gs = d_inner / n_group;
    float       *yg = y + (size_t)r * d_inner + (size_t)g * gs;
    const float *z = zx + (size_t)r * proj + (size_t)g * gs;
    double       ss = 0.0;
    for (int c = threadIdx.x; c < gs; c += blockDim.x) {
        const float v = __fmul_rn(yg[c], ssm_silu(z[c]));
        yg[c] = v;
        ss = __dadd_rn(ss, __dmul_rn((double)v, (double)v)); /* (exact: a float's square fits a double) */
    }
    for (int o = 16; o > 0; o >>= 1) ss = __dadd_rn(ss, __shfl_xor_sync(0xffffffffu, ss, o));
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = ss;
    __syncthreads();
    if (threadIdx.x == 0) {
        double tot = 0.0;
        for (int w = 0; w < SSM_NORM_THREADS / 32; w++) tot = __dadd_rn(tot, red[w]);
        scale_s = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn((float)(tot / gs), eps)));
    }
    __syncthreads();
    const float scale = scale_s;
    for (int c = threadIdx.x; c < gs; c += blockDim.x)
        yg[c] = __fmul_rn(__fmul_rn(yg[c], scale), norm_w[(size_t)g * gs + c]);
}

#endif
