/* mmqv's kernel, a header so that tests/emu/mmqv_emu.cpp compiles the same
 * text on the CPU (make cuda-emu): included by mmq.cu only (after
 * common.cuh and mmqv_stage), and by the emulation under cuda_shim.h. It
 * includes nothing itself. */
#ifndef AG_CUDA_MMQV_CUH
#define AG_CUDA_MMQV_CUH

/* ---- few decode rows of K-quants with mmq's bits (mmqv) ----
 *
 * Batch invariance asks that a row's bits never depend on its batch, so
 * the Q4_K/Q6_K decode rows of a process used to take one family for every
 * batch, chosen at creation: the dp4a GEMVs (fast at 1 row; since retired)
 * or mmq (fast from 8). A server has slots, so it took mmq even for one
 * stream (H200, 8B Q4_K_M, tok/s at 1 / 8 / 64 sequences: dp4a 250 / 626
 * / 799, mmq 203 / 1412 / 3510). mmqv computes, for every (row, token),
 * exactly the float operations mmq computes, in mmq's order, from the same
 * inputs: the few-row kernel can then follow the batch (matmul_decode:
 * rows <= MMQV_FEW here, more to mmq) and a row still has one bit pattern.
 *
 * WHAT MMQ COMPUTES for row r and token t (mmq_lane, mmq_q4k_block,
 * mmq_q6k_block, mmt_finish): the row's nb = K / 256 blocks cut into KS =
 * mmt_slices(n_out, mmq_target_warps()) slices (4, 8 or 16, by the row
 * count only) of per = ceil(nb / KS) whole blocks, slice s = blocks
 * [min(nb, s per), min(nb, s per + per)) (the last ones short or empty);
 * in each slice c = 0.0f, then block by block in order, unit by unit in
 * order,
 *   Q4_K (8 sub-blocks of 32): c = c + ((a xd) isum - m xsum), with
 *        a = d sc and m = dmin mn (half2float, cq_k4_scale_min_w), xd and
 *        xsum = quantize_q8_32's (d, d Σq) of the sub-block;
 *   Q6_K (16 groups of 16):    c = c + (sw xd) isum, sw = d (int8) scale,
 *        xd the d of the group's 32-element activation block;
 * every product and sum rounded alone (__fmul_rn / __fsub_rn / __fadd_rn)
 * and isum the exact int32 Σ q·xq of the unit (any order gives the same
 * int); then y = ((c_0 + c_1) + c_2) + ... + c_{KS-1}, empty slices too.
 *
 * MAPPING. A warp takes a row, four slices at a time (a "quad": slices
 * 4q .. 4q + 3): lane group gr = lane / 8 takes slice 4q + gr and walks it
 * block by block, so one warp load reads four slices' 128-byte pieces,
 * each coalesced over its 8 lanes. KS = 4 is one quad, 8 and 16 are two
 * and four; a weight of fewer than 2048 rows spreads its quads over ws =
 * KS / 4 warps (mmqv_ws, as the dp4a GEMVs spread theirs: the k/v
 * projections of an 8B have 1024 rows), else one warp walks them all.
 * Within a block, lane p of the group:
 *   Q4_K: quant bytes 16p .. 16p + 15 (the dp4a GEMVs' layout: half p % 2
 *         of sub-blocks 2(p / 2) and 2(p / 2) + 1, low and high nibbles),
 *         one 16-byte load, and the 16-byte header; 8 dp4a per token give
 *         the two half sums, one shuffle with lane p ^ 1 completes sub-block
 *         p's isum, and lane p forms sub-block p's term v_p;
 *   Q6_K: groups gi = 8(p / 4) + p % 4 and gi + 4 (quadrants c and c + 2
 *         of one 16-element run: the same 16 ql bytes, low and high
 *         nibbles, and 16 qh bytes), each 16 bytes at a 2-byte aligned
 *         offset (210-byte blocks) read as three aligned 8-byte loads and
 *         funnel-shifted; per token 8 dp4a for Σ q x and 8 for Σ 32 x (the
 *         6-bit weights stay unsigned), two terms, no shuffle.
 * The chain is serial, so the lanes leave their terms in shared memory and
 * every lane of a group reads its block's 8 (16) terms back and adds them
 * in unit order (the 8 lanes compute the same chain: no lane idles while
 * another does it). At the end of a quad each group's lane 0 writes its
 * slice's c; a lane per token then adds the KS slices in order.
 *
 * BYTES IN FLIGHT AND COUNTS. A warp step is 4 blocks: 576 B of Q4_K,
 * 840 B of Q6_K; MMQV_U = 2 steps are loaded before either is used (1152 /
 * 1680 B a warp, the dp4a GEMVs' 8 blocks), 64 registers at one token (8
 * blocks an SM). An H100 issues 0.28 warp instructions per byte of weight
 * at full DRAM speed (132 SMs x 4 schedulers x 1.755 GHz / 3.35 TB/s).
 * SASS of the main loop (sm_90a), warp instructions a byte, at 1 / 2 / 4
 * tokens: Q4_K 0.19 / 0.25 / 0.36, Q6_K 0.22 / 0.28 / 0.42 (the dp4a GEMVs
 * at one token: Q4_K 0.21, Q6_K 0.30). Each token adds 8 (Q4_K) or 16
 * (Q6_K) dp4a, its activation loads, its terms and its chain of 8 or 16
 * dependent adds; the weights' loads and unpacking are shared. One token
 * leaves a third of the issue slots free, two use about all of them at
 * full DRAM speed, four are issue-bound (about 1.4x the DRAM time), where
 * mmq costs at 4 rows what it costs at 1. Hence MMQV_FEW = 2: 1-2 decode
 * rows take mmqv, 3 and more mmq (the bits are the same either way).
 * Measured (H100, 8B Q4_K_M, tok/s): batch 2 mmqv 502-504, mmq 415; batch
 * 4 mmqv 662, mmq 803; so the switch that tuned it and the 4-token
 * kernel only it reached were retired. */
#define MMQV_WARPS  4 /* warps a block */
#define MMQV_U      2 /* steps (a block of each of a quad's 4 slices) loaded before any is used */
#define MMQV_PARTS  3 /* weights of one K in one launch (q/k/v, gate/up) */
#define MMQV_NT_MAX 2 /* the most tokens a block (the largest instantiation) */
#ifndef MMQV_FEW
#define MMQV_FEW 2 /* decode rows up to which a matmul takes mmqv (the rest: mmq) */
#endif
static_assert(MMQV_FEW >= 0 && MMQV_FEW <= MMQV_NT_MAX, "mmqv has kernels for up to MMQV_NT_MAX tokens a block");

/* Q4_K's 6-bit scale and min of sub-block j, the values cq_k4_scale_min_w
 * returns, without its branch on j (the lanes of a warp hold different j). */
static __device__ __forceinline__ void k4_scale_min_lane(int j, uint32_t w0, uint32_t w1, uint32_t w2, uint32_t *d,
                                                         uint32_t *m) {
    const int      sh = 8 * (j & 3);
    const uint32_t A = (w0 >> sh) & 0xFF, B = (w1 >> sh) & 0xFF, C = (w2 >> sh) & 0xFF;
    *d = j >= 4 ? (C & 0xF) | ((A >> 6) << 4) : A & 63;
    *m = j >= 4 ? (C >> 4) | ((B >> 6) << 4) : B & 63;
}

/* A block as lane p of its group holds it (MAPPING above). */
struct mmqv_q4 {
    uint4 head, q;
};
struct mmqv_q6 {
    uint32_t ql[4], qh[4], sc, d; /* sc: the two groups' scale bytes */
};

template <bool ST>
static __device__ __forceinline__ mmqv_q4 mmqv_q4_load(const uint8_t *blk, int p) {
    return mmqv_q4{wld<ST>((const uint4 *)blk), wld<ST>((const uint4 *)(blk + 16 + 16 * p))};
}

/* The 16 bytes at p (2-byte aligned) as 4 words: three aligned 8-byte
 * loads, then a word and a half-word shift. */
template <bool ST>
static __device__ __forceinline__ void mmqv_ld16_at2(const uint8_t *p, uint32_t (&o)[4]) {
    const int      s = (int)((uintptr_t)p & 7);
    const uint2   *q = (const uint2 *)(p - s);
    const uint2    v0 = wld<ST>(q), v1 = wld<ST>(q + 1), v2 = wld<ST>(q + 2);
    const uint32_t w[6] = {v0.x, v0.y, v1.x, v1.y, v2.x, v2.y};
    uint32_t       r[5];
#pragma unroll
    for (int i = 0; i < 5; i++) r[i] = s & 4 ? w[i + 1] : w[i];
#pragma unroll
    for (int i = 0; i < 4; i++) o[i] = __funnelshift_r(r[i], r[i + 1], 8 * (s & 2));
}

template <bool ST>
static __device__ __forceinline__ mmqv_q6 mmqv_q6_load(const uint8_t *blk, int p) {
    const int h = p >> 2, c = (p >> 1) & 1, q = p & 1, gi = 8 * h + 2 * c + q;
    mmqv_q6   r;
    mmqv_ld16_at2<ST>(blk + 64 * h + 32 * c + 16 * q, r.ql);
    mmqv_ld16_at2<ST>(blk + 128 + 32 * h + 16 * q, r.qh);
    r.sc = (uint32_t)wld<ST>(blk + 192 + gi) | (uint32_t)wld<ST>(blk + 196 + gi) << 8;
    r.d = wld<ST>((const uint16_t *)(blk + 208));
    return r;
}

/* Sub-block p's term of a block for each token, mmq_q4k_block's
 * operations: the block's int8 activations and scales of token t at xb +
 * xo[t] and sb + xo[t] / 32. Every lane of the warp must call it (a
 * shuffle). */
template <int NT>
static __device__ __forceinline__ void mmqv_q4_terms(const mmqv_q4 &r, int p, const int8_t *xb,
                                                     const float2 *sb, const int (&xo)[NT], float (&v)[NT]) {
    const int g = p >> 1, h = p & 1;
    uint32_t  sc, mn;
    k4_scale_min_lane(p, r.head.y, r.head.z, r.head.w, &sc, &mn);
    const float    a = __fmul_rn(__half2float(__ushort_as_half((uint16_t)(r.head.x & 0xFFFF))), (float)sc);
    const float    m = __fmul_rn(__half2float(__ushort_as_half((uint16_t)(r.head.x >> 16))), (float)mn);
    const uint32_t qw[4] = {r.q.x, r.q.y, r.q.z, r.q.w};
#pragma unroll
    for (int t = 0; t < NT; t++) {
        const int8_t *x = xb + xo[t] + 64 * g + 16 * h;
        const int4    xl = __ldg((const int4 *)x), xh = __ldg((const int4 *)(x + 32));
        const int     xlw[4] = {xl.x, xl.y, xl.z, xl.w}, xhw[4] = {xh.x, xh.y, xh.z, xh.w};
        int           il = 0, ih = 0;
#pragma unroll
        for (int k = 0; k < 4; k++) {
            il = __dp4a((int)(qw[k] & 0x0F0F0F0Fu), xlw[k], il);
            ih = __dp4a((int)((qw[k] >> 4) & 0x0F0F0F0Fu), xhw[k], ih);
        }
        /* lane p ^ 1 holds the sub-blocks' other halves: give it the half it lacks */
        const int    isum = (h ? ih : il) + __shfl_xor_sync(0xffffffffu, h ? il : ih, 1);
        const float2 xe = __ldg(sb + xo[t] / 32 + p);
        v[t] = __fsub_rn(__fmul_rn(__fmul_rn(a, xe.x), (float)isum), __fmul_rn(m, xe.y));
    }
}

/* Groups gi and gi + 4's terms of a block (v1, v2), mmq_q6k_block's
 * operations (arguments as mmqv_q4_terms'). The weights stay unsigned
 * (0..63): Σ (q - 32) x = Σ q x - Σ 32 x, both by dp4a (exact), which at 1-2
 * tokens costs fewer instructions than making them signed bytes. */
template <int NT>
static __device__ __forceinline__ void mmqv_q6_terms(const mmqv_q6 &r, int p, const int8_t *xb,
                                                     const float2 *sb, const int (&xo)[NT], float (&v1)[NT],
                                                     float (&v2)[NT]) {
    const int   h = p >> 2, c = (p >> 1) & 1, gi = 8 * h + 2 * c + (p & 1), u = gi >> 1;
    const float d = __half2float(__ushort_as_half((uint16_t)r.d));
    const float s1 = __fmul_rn(d, (float)(int8_t)(r.sc & 0xFF)), s2 = __fmul_rn(d, (float)(int8_t)(r.sc >> 8));
    int         w1[4], w2[4];
#pragma unroll
    for (int k = 0; k < 4; k++) { /* quadrant c: low nibbles, qh bits 2c; c + 2: high nibbles, bits 2c + 4 */
        w1[k] = (int)((r.ql[k] & 0x0F0F0F0Fu) | ((r.qh[k] << (4 - 2 * c)) & 0x30303030u));
        w2[k] = (int)(((r.ql[k] >> 4) & 0x0F0F0F0Fu) | ((r.qh[k] >> (2 * c)) & 0x30303030u));
    }
#pragma unroll
    for (int t = 0; t < NT; t++) {
        const int8_t *x = xb + xo[t] + 16 * gi;
        const int4    x1 = __ldg((const int4 *)x), x2 = __ldg((const int4 *)(x + 64));
        const int     x1w[4] = {x1.x, x1.y, x1.z, x1.w}, x2w[4] = {x2.x, x2.y, x2.z, x2.w};
        int           i1 = 0, i2 = 0, z1 = 0, z2 = 0;
#pragma unroll
        for (int k = 0; k < 4; k++) {
            i1 = __dp4a(w1[k], x1w[k], i1), i2 = __dp4a(w2[k], x2w[k], i2);
            z1 = __dp4a(0x20202020, x1w[k], z1), z2 = __dp4a(0x20202020, x2w[k], z2);
        }
        const float2 *s = sb + xo[t] / 32 + u;
        const float   xd1 = __ldg(&s[0].x), xd2 = __ldg(&s[2].x);
        v1[t] = __fmul_rn(__fmul_rn(s1, xd1), (float)(i1 - z1));
        v2[t] = __fmul_rn(__fmul_rn(s2, xd2), (float)(i2 - z2));
    }
}

/* The shared memory of an mmqv block: a step's terms per warp, [group][unit]
 * (Q4_K uses 32 of the 64), and the slices' sums, [row][token][slice]. */
template <int NT>
struct mmqv_smem {
    float    vb[MMQV_WARPS][MMQV_U][NT][4 * 16];
    float    part[MMQV_WARPS][NT][16];
    uint64_t stage_bar;
};

/* The decode rows [blockIdx.y NT, +NT) of one part of an mmqv launch
 * (bx: the block's index within the part): ks slices (mmt_slices), ws
 * warps a row (mmqv_ws). Every thread of the block must call it. */
template <int NT, bool ST, bool Q6>
static __device__ __forceinline__ void mmqv_rows(const uint8_t *__restrict__ W, size_t row_bytes, int K, int n_out,
                                                 int ks, int ws, const int8_t *__restrict__ xq,
                                                 const float2 *__restrict__ xs, int n_tok, float *__restrict__ y,
                                                 int bx, mmqv_smem<NT> &sm) {
    constexpr int BB = Q6 ? 210 : 144, V = Q6 ? 16 : 8; /* a block's bytes; its terms a group adds */
    const int     lane = threadIdx.x & 31, warp = threadIdx.x >> 5, gr = lane >> 3, p = lane & 7;
    const int     rpb = MMQV_WARPS / ws, r_in = warp / ws, sub = warp % ws;
    const int     row = bx * rpb + r_in, nb = K / 256, per = (nb + ks - 1) / ks;
    const int     nq = ks / (4 * ws), q0 = sub * nq; /* this warp's quads [q0, q0 + nq) */
    const int     tok0 = (int)blockIdx.y * NT, nt = min(NT, n_tok - tok0);
    const uint8_t *rowp = W + (size_t)min(row, n_out - 1) * row_bytes;
    if constexpr (ST) rowp = mmqv_stage(W, row_bytes, n_out, bx, rpb, r_in, &sm.stage_bar);
    else if (p == 0 && (4 * q0 + gr) * per < nb) { /* the group's first steps into L2 while the previous kernel ends */
        const int b0 = (4 * q0 + gr) * per;
        prefetch_l2(rowp + (size_t)b0 * BB, (size_t)min(PDL_PF_MUL * MMQV_U, min(per, nb - b0)) * BB);
    }
    pdl_entry();
    if (ws == 1 && row >= n_out) return;
    if constexpr (ST) stage_wait(&sm.stage_bar);
    float *const vw = &sm.vb[warp][0][0][0];
    int          xo[NT]; /* token tok0 + t's activations from token tok0's (tokens past the batch: computed, not stored) */
#pragma unroll
    for (int t = 0; t < NT; t++) xo[t] = (min(tok0 + t, n_tok - 1) - tok0) * K;
    xq += (size_t)tok0 * K, xs += (size_t)tok0 * (K / 32);
    for (int qi = 0; qi < nq; qi++) {
        const int s = 4 * (q0 + qi) + gr, b0 = s * per, len = min(per, nb - b0); /* len <= 0: an empty slice */
        float     c[NT];
#pragma unroll
        for (int t = 0; t < NT; t++) c[t] = 0.0f;
        /* steps j .. j + NU - 1 of the slices: their blocks loaded, their terms to vb, then added in order */
        auto steps = [&](int j, auto nu) {
            constexpr int NU = decltype(nu)::value;
            typename std::conditional<Q6, mmqv_q6, mmqv_q4>::type r[NU];
            bool has[NU];
            int  bl[NU]; /* the block read: a slice's missing blocks read the row's last, never added */
#pragma unroll
            for (int u = 0; u < NU; u++) {
                has[u] = j + u < len;
                bl[u] = min(b0 + j + u, nb - 1);
                if constexpr (Q6) r[u] = mmqv_q6_load<ST>(rowp + (size_t)bl[u] * BB, p);
                else r[u] = mmqv_q4_load<ST>(rowp + (size_t)bl[u] * BB, p);
            }
#pragma unroll
            for (int u = 0; u < NU; u++) {
                const int8_t *xu = xq + (size_t)bl[u] * 256;
                const float2 *su = xs + 8 * bl[u];
                float        *vu = vw + u * NT * 64 + gr * V;
                if constexpr (Q6) {
                    float v1[NT], v2[NT];
                    mmqv_q6_terms<NT>(r[u], p, xu, su, xo, v1, v2);
#pragma unroll /* group gi at 2 p' + (gi >> 2 & 1), p' = 4 (gi >> 3) + gi % 4: one 8-byte store */
                    for (int t = 0; t < NT; t++) *(float2 *)(vu + t * 64 + 2 * p) = make_float2(v1[t], v2[t]);
                } else {
                    float v[NT];
                    mmqv_q4_terms<NT>(r[u], p, xu, su, xo, v);
#pragma unroll
                    for (int t = 0; t < NT; t++) vu[t * 64 + p] = v[t];
                }
            }
            __syncwarp();
#pragma unroll
            for (int u = 0; u < NU; u++) {
                if (!has[u]) continue;
#pragma unroll
                for (int t = 0; t < NT; t++) {
                    const float4 *v4 = (const float4 *)(vw + u * NT * 64 + t * 64 + gr * V);
                    float         e[V];
#pragma unroll
                    for (int i = 0; i < V / 4; i++) {
                        const float4 f = v4[i];
                        e[4 * i] = f.x, e[4 * i + 1] = f.y, e[4 * i + 2] = f.z, e[4 * i + 3] = f.w;
                    }
#pragma unroll
                    for (int i = 0; i < V; i++) /* unit order (Q6_K: group i's slot, as stored above) */
                        c[t] = __fadd_rn(c[t], e[Q6 ? 8 * (i >> 3) + 2 * (i & 3) + ((i >> 2) & 1) : i]);
                }
            }
            __syncwarp(); /* (vb is rewritten by the next steps) */
        };
        int j = 0;
        for (; j + MMQV_U <= per; j += MMQV_U) steps(j, std::integral_constant<int, MMQV_U>());
        for (; j < per; j++) steps(j, std::integral_constant<int, 1>());
        if (p == 0)
#pragma unroll
            for (int t = 0; t < NT; t++) sm.part[r_in][t][s] = c[t];
    }
    if (ws == 1) __syncwarp();
    else __syncthreads();
    if (sub == 0 && lane < nt && row < n_out) { /* mmt_finish's sum: ((c_0 + c_1) + c_2) + ... */
        const float *pr = sm.part[r_in][lane];
        float        v = pr[0];
        for (int s = 1; s < ks; s++) v = __fadd_rn(v, pr[s]);
        y[(size_t)(tok0 + lane) * n_out + row] = v;
    }
}

/* Up to MMQV_PARTS Q4_K/Q6_K weights of one K over the same decode rows in
 * one launch: blocks [blk0[i], blk0[i + 1]) take weight i, with its own
 * type, slices and warps a row (each weight's bits are its own matmul's). */
struct mmqv_group {
    const uint8_t *W[MMQV_PARTS];
    float         *y[MMQV_PARTS];
    size_t         row_bytes[MMQV_PARTS];
    int            n_out[MMQV_PARTS], q6[MMQV_PARTS], ks[MMQV_PARTS], ws[MMQV_PARTS], blk0[MMQV_PARTS + 1], n;
};
template <int NT, bool ST>
static __device__ __forceinline__ void mmqv_body(const mmqv_group g, int K, const int8_t *__restrict__ xq,
                                                 const float2 *__restrict__ xs, int n_tok) {
    /* the part by constant indices (a run-time index would copy the parameters to local memory) */
    const int      bx = (int)blockIdx.x, i = g.n > 2 && bx >= g.blk0[2] ? 2 : g.n > 1 && bx >= g.blk0[1] ? 1 : 0;
    const uint8_t *W = i == 0 ? g.W[0] : i == 1 ? g.W[1] : g.W[2];
    float         *y = i == 0 ? g.y[0] : i == 1 ? g.y[1] : g.y[2];
    const size_t   rb = i == 0 ? g.row_bytes[0] : i == 1 ? g.row_bytes[1] : g.row_bytes[2];
    const int      n_out = i == 0 ? g.n_out[0] : i == 1 ? g.n_out[1] : g.n_out[2];
    const int      ks = i == 0 ? g.ks[0] : i == 1 ? g.ks[1] : g.ks[2];
    const int      ws = i == 0 ? g.ws[0] : i == 1 ? g.ws[1] : g.ws[2];
    const int      b = bx - (i == 0 ? 0 : i == 1 ? g.blk0[1] : g.blk0[2]);
    __shared__ __align__(16) mmqv_smem<NT> sm; /* (one for both types' code) */
    if (i == 0 ? g.q6[0] : i == 1 ? g.q6[1] : g.q6[2])
        mmqv_rows<NT, ST, true>(W, rb, K, n_out, ks, ws, xq, xs, n_tok, y, b, sm);
    else mmqv_rows<NT, ST, false>(W, rb, K, n_out, ks, ws, xq, xs, n_tok, y, b, sm);
}
/* Registers: left to itself ptxas gave the one-token kernel 56 and issued
 * a step's loads only after the previous step's arithmetic; held to 64 (8
 * blocks an SM, as the dp4a split kernels were) both steps' loads go out
 * first. Two tokens: 96 (at 64, and unbounded, it spilled). */
template <int NT, bool ST>
__global__ void __launch_bounds__(32 * MMQV_WARPS, NT == 1 ? 8 : 5)
    mmqv(const mmqv_group g, int K, const int8_t *__restrict__ xq, const float2 *__restrict__ xs, int n_tok) {
    static_assert(NT >= 1 && NT <= MMQV_NT_MAX, "mmqv: 1 or 2 tokens a block");
    mmqv_body<NT, ST>(g, K, xq, xs, n_tok);
}

/* ---- end of the mmqv kernel ---- */

#endif
