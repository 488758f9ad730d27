/* Prompt-row attention on wgmma (sm_90a): attention_wg_k and
 * attention_wgp_k, the default on a CC 9.0 GPU. */
#include "backend/cuda/ops.cuh"
#include "backend/cuda/attn_mma.cuh"

/* ---- prompt attention on wgmma (sm_90a; AUGUR_CUDA_FA=wg) ----
 *
 * FlashAttention-3's MMA layout; attention_wg_k without its producer/
 * consumer warp specialization (attention_wgp_k, below, has it): a
 * warpgroup (4 warps) per 64 query rows of one query head, WG_HEADS query
 * heads of one KV head a block sharing the K/V chunks (64 positions,
 * staged by cp.async three buffers deep, WG_DEEP four; a group of odd
 * size repeats its last head). S = Q·Kᵀ by m64n64k16 wgmma with both operands in
 * shared memory; the online softmax of attention_fa1_k on S's accumulators
 * (an m64nN accumulator is, per warp, mma.sync's m16n8 C layout for rows
 * 16w ..); O += P·V by wgmma with P in registers (eight consecutive
 * accumulators packed to fp16 pairs are the next k16 step's A registers)
 * and V row-major as an N-major B. Operands live in 128B-swizzled panels:
 * [64 rows][64 halves] of 128-byte rows, the 16-byte chunk c of row r at
 * r·128 + 16 (c ^ r % 8), a head dim of 128 in two panels 8 KB apart.
 * The facts behind the descriptors and fences: docs/design-notes.md.
 * The default for prompt rows on a CC 9.0 GPU in an sm_90a build
 * (AUGUR_CUDA_FA=1: attention_fa1_k): 8B BF16 prefill of 4096 tokens
 * 35.4k -> 37.7k tok/s on an H200, 34.8k -> 37.0k on an H100 (2026-12-06). */

#if defined(AUGUR_SM90A)
/* Byte offset of 16-byte chunk d8 (halves 8 d8 ..) of row r in a [rows][HD]
 * fp16 operand of 128B-swizzled panels of `panel` bytes (rows x 128). */
static __device__ __forceinline__ uint32_t wg_swz(int r, int d8, int panel = WG_PANEL) {
    return (uint32_t)((d8 >> 3) * panel + r * 128 + (((d8 & 7) ^ (r & 7)) << 4));
}

/* A shared-memory matrix descriptor for 128B swizzle: start address,
 * leading and stride byte offsets (bits 0-13, 16-29, 32-45, each >> 4),
 * base offset 0 (panels 1024-byte aligned), layout 1 (128B) at bits 62-63.
 * Kept as its two words: the low one (address, LBO) takes the offsets of
 * k-steps and buffers by a 32-bit add (an address below 256 KB never
 * carries out of its 14 bits), the high one (SBO, layout) is constant;
 * 64-bit adds cost three instructions each, twelve times a chunk. */
static __device__ __forceinline__ uint32_t wg_desc_lo(uint32_t saddr, uint32_t lbo) {
    return ((saddr & 0x3FFFF) >> 4) | ((lbo & 0x3FFFF) >> 4) << 16;
}
static __device__ __forceinline__ uint32_t wg_desc_hi(uint32_t sbo) { return ((sbo & 0x3FFFF) >> 4) | 1u << 30; }
static __device__ __forceinline__ uint64_t wg_desc(uint32_t lo, uint32_t hi) { return (uint64_t)hi << 32 | lo; }

static __device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
static __device__ __forceinline__ void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
static __device__ __forceinline__ void wg_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
/* Generic-proxy shared stores (st.shared, cp.async) made visible to wgmma
 * (the async proxy); a barrier must follow before another thread's wgmma. */
static __device__ __forceinline__ void fence_proxy_async() {
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
/* Pins accumulator registers after a wait: the compiler may not move
 * their reads above it (the asm statements keep their order). */
template <int N>
static __device__ __forceinline__ void wg_hold(float (&d)[N]) {
#pragma unroll
    for (int i = 0; i < N; i++) asm volatile("" : "+f"(d[i])::"memory");
}

/* The wgmma wrappers' accumulator operands: the register list of the
 * instruction text (%0 ..) and the matching "+f" constraints, for the 32
 * floats of an m64n64 accumulator and the 64 of an m64n128 one. */
#define WG_R32 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
               "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
#define WG_R64 WG_R32 ", %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
               "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
#define WG_D8(i)                                                                                                  \
    "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), "+f"(d[i + 6]), \
        "+f"(d[i + 7])
#define WG_D32 WG_D8(0), WG_D8(8), WG_D8(16), WG_D8(24)
#define WG_D64 WG_D32, WG_D8(32), WG_D8(40), WG_D8(48), WG_D8(56)

/* D (+)= A·B, m64nNk16, A and B from shared memory (descriptors da, db;
 * both K-major): D = A·B when acc is 0. Asynchronous: commit, then wait
 * before reading d. */
static __device__ __forceinline__ void wgmma_m64n64_ss(float (&d)[32], uint64_t da, uint64_t db, int acc) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 {" WG_R32 "}, %32, %33, p, 1, 1, 0, 0;\n}\n"
                 : WG_D32
                 : "l"(da), "l"(db), "r"(acc));
}
static __device__ __forceinline__ void wgmma_m64n128_ss(float (&d)[64], uint64_t da, uint64_t db, int acc) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 {" WG_R64 "}, %64, %65, p, 1, 1, 0, 0;\n}\n"
                 : WG_D64
                 : "l"(da), "l"(db), "r"(acc));
}

/* D += A·B, m64nNk16, A from registers (the warp's 16 rows as an mma.sync
 * m16k16 A fragment), B from shared memory N-major (descriptor db,
 * trans-b). Asynchronous: commit, then wait before reading d. */
static __device__ __forceinline__ void wgmma_m64n64_rs(float (&d)[32], const uint32_t (&a)[4], uint64_t db) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 {" WG_R32 "}, {%32, %33, %34, %35}, %36, p, 1, 1, 1;\n}\n"
                 : WG_D32
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db));
}
static __device__ __forceinline__ void wgmma_m64n128_rs(float (&d)[64], const uint32_t (&a)[4], uint64_t db) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 {" WG_R64 "}, {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"
                 : WG_D64
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db));
}
#undef WG_D64
#undef WG_D32
#undef WG_D8
#undef WG_R64
#undef WG_R32

/* O += P·V over one chunk of TK positions: TK / 16 k16 steps, P's A
 * registers pa[j], V's swizzled panels by descriptor words dv, hi (their
 * address, LBO the next 64-dim panel; a descriptor's address field is the
 * byte address >> 4, so an offset adds). N = HD. */
template <int HD, int TK>
static __device__ __forceinline__ void wg_pv(float (&o)[HD / 2], const uint32_t (&pa)[TK / 16][4], uint32_t dv,
                                             uint32_t hi) {
#pragma unroll
    for (int j = 0; j < TK / 16; j++) {
        const uint64_t db = wg_desc(dv + (2048 * j >> 4), hi); /* 16 positions of 128 B a k16 step */
        if constexpr (HD == 128) wgmma_m64n128_rs(o, pa[j], db);
        else wgmma_m64n64_rs(o, pa[j], db);
    }
}

/* 16 bytes global -> shared (a shared-window address), asynchronously;
 * src_bytes 0: zeros */
static __device__ __forceinline__ void cp_async16_s(uint32_t dst, const void *src, int src_bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes) : "memory");
}

/* Stages chunks of K and V positions (TK c .., zeros past c_hi) of one KV
 * head into swizzled panels by cp.async; the caller commits. The block's
 * 128 NH threads take TPR = 128 NH / TK a position (one block-table read
 * a thread: a read per 16 bytes stalled each thread's issue on eight
 * dependent loads); thread i copies chunks i % TPR, + TPR, ... of
 * position i / TPR's K and V rows, so that a row's threads copy
 * contiguous bytes an instruction (whole 32-byte sectors: a run of chunks
 * a thread left 48% excess sectors by ncu and was 3% slower a forward).
 * What does not change from chunk to chunk (the head's rows, this
 * thread's columns and swizzled offsets) is computed once: recomputed in
 * 64-bit arithmetic it was ~60 of the loop's ~470 instructions a warp. */
template <int HD, int NH, int TK>
struct wg_stager {
    static constexpr int TPR = 128 * NH / TK, Q8 = HD / 8 / TPR; /* threads a row, 16-byte chunks a thread */
    static_assert(TPR >= 1 && Q8 >= 1, "a row's chunks over its threads");
    const int32_t *table;
    const uint8_t *kb, *vb; /* KV head kvh's rows in block 0, plus this thread's first column */
    size_t         block_bytes;
    uint32_t       rk, rv, so[Q8]; /* row strides; the thread's offsets in a panel pair */
    int            j, shift, mask;

    /* tid: the thread's index among the 128 NH that stage */
    __device__ __forceinline__ wg_stager(const kv_geom &g_, const int32_t *__restrict__ tab, int kvh, int tid) {
        const int q = tid % TPR;
        j = tid / TPR;
        table = tab, block_bytes = g_.block_bytes, shift = g_.block_shift, mask = g_.block_mask;
        rk = (uint32_t)g_.row_bytes_k, rv = (uint32_t)g_.row_bytes_v;
        kb = g_.k0 + kvh * g_.head_stride_k + 16 * q;
        vb = g_.k0 + g_.v_off + kvh * g_.head_stride_v + 16 * q;
#pragma unroll
        for (int k = 0; k < Q8; k++) so[k] = wg_swz(j, q + TPR * k, TK * 128);
    }
    /* chunk c into the K and V buffers at shared addresses kdst, vdst */
    __device__ __forceinline__ void stage(int c, int c_hi, uint32_t kdst, uint32_t vdst) const {
        const int      p = c * TK + j, pc = min(p, c_hi), n = p <= c_hi ? 16 : 0;
        const size_t   bo = (size_t)table[pc >> shift] * block_bytes;
        const uint32_t off = (uint32_t)(pc & mask);
        const uint8_t *kr = kb + bo + off * rk, *vr = vb + bo + off * rv;
#pragma unroll
        for (int k = 0; k < Q8; k++) {
            cp_async16_s(kdst + so[k], kr + 16 * TPR * k, n);
            cp_async16_s(vdst + so[k], vr + 16 * TPR * k, n);
        }
    }
};
#endif

#if defined(AUGUR_SM90A)
/* S = Q·Kᵀ for one chunk of TK positions: HD / 16 k16 steps of m64nTKk16
 * over the Q and K panels of descriptor words dq, dk, hi (a step is +32 bytes
 * inside a 64-dim panel; the next panel is 64 rows x 128 B on for Q, TK
 * rows for K). */
template <int HD, int TK>
static __device__ __forceinline__ void wg_scores(float (&s)[TK / 2], uint32_t dq, uint32_t dk, uint32_t hi) {
#pragma unroll
    for (int kk = 0; kk < HD / 16; kk++) {
        const uint32_t qo = ((kk >> 2) * WG_PANEL + (kk & 3) * 32) >> 4, ko = ((kk >> 2) * TK * 128 + (kk & 3) * 32) >> 4;
        if constexpr (TK == 128) wgmma_m64n128_ss(s, wg_desc(dq + qo, hi), wg_desc(dk + ko, hi), kk > 0);
        else wgmma_m64n64_ss(s, wg_desc(dq + qo, hi), wg_desc(dk + ko, hi), kk > 0);
    }
}

/* O's rows times alpha (rows g, g + 8: accumulators 4i, 4i + 1 and
 * 4i + 2, 4i + 3). SKIP (WG_SKIP): not when every alpha of the warp is 1
 * (no row's max rose: the product would give O's bits again), a vote
 * making the branch warp-uniform; most chunks past the first few. */
template <int HD, bool SKIP>
static __device__ __forceinline__ void wg_rescale(float (&o)[HD / 2], const float (&alpha)[2]) {
    if (SKIP && __all_sync(0xffffffffu, alpha[0] == 1.0f && alpha[1] == 1.0f)) return;
#pragma unroll
    for (int i = 0; i < HD / 8; i++) {
        o[4 * i] *= alpha[0], o[4 * i + 1] *= alpha[0];
        o[4 * i + 2] *= alpha[1], o[4 * i + 3] *= alpha[1];
    }
}

/* The weights s as P·V's A registers: positions 16j .. are accumulator
 * tiles 2j and 2j + 1, eight consecutive floats as four fp16 pairs. */
template <int TK>
static __device__ __forceinline__ void wg_pack(const float (&s)[TK / 2], uint32_t (&pa)[TK / 16][4]) {
#pragma unroll
    for (int j = 0; j < TK / 16; j++)
#pragma unroll
        for (int r = 0; r < 4; r++) pa[j][r] = pack_half2(s[8 * j + 2 * r], s[8 * j + 2 * r + 1]);
}

/* Waits for chunk c's K/V (with NB buffers the cp.async groups of chunks
 * c .. c + NB - 3 are in flight: all but the last NB - 3 must land) and
 * makes it visible to wgmma; past its barrier every warpgroup is done with
 * chunk c - 2's buffers. */
template <int NB>
static __device__ __forceinline__ void wg_chunk_ready() {
    cp_async_wait<NB - 3>();
    fence_proxy_async(); /* this thread's cp.async bytes, for wgmma */
    __syncthreads();     /* ... and every thread's */
}

/* The online softmax of attention_fa1_k on a warpgroup's S accumulators of
 * chunk c (s[4i + e]: position tile i, rows g / g + 8 as e / 2), in log2
 * units: without a softcap the raw scores stay as they are and the scale
 * sp > 0 goes into each weight's exponent (2^(s sp - M), one FFMA; the
 * row max of s sp is sp times the max of s); with one, s becomes
 * cp tanh(s sp) first. Positions outside [lo, hi] are masked (-inf) only in
 * an edge chunk (a block-uniform branch: the mask's compares and selects
 * were a third of the loop's instructions). Updates each row's running max
 * M and this lane's part of its sum L; s becomes the unnormalized weights,
 * alpha the factors that rescale O to the new max. */
template <bool SOFTCAP, int TK>
static __device__ __forceinline__ void wg_softmax(float (&s)[TK / 2], int c, int t, float sp, float cp, bool edge,
                                                  const int (&lo)[2], const int (&hi)[2], float (&M)[2], float (&L)[2],
                                                  float (&alpha)[2]) {
    if (SOFTCAP)
#pragma unroll
        for (int i = 0; i < TK / 2; i++) s[i] = cp * tanhf(s[i] * sp);
    if (edge)
#pragma unroll
        for (int i = 0; i < TK / 8; i++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int hr = e >> 1, p = c * TK + 8 * i + 2 * t + (e & 1);
                if (p < lo[hr] || p > hi[hr]) s[4 * i + e] = -INFINITY;
            }
    const float f = SOFTCAP ? 1.0f : sp; /* s to log2 units */
#pragma unroll
    for (int hr = 0; hr < 2; hr++) {
        float m = -INFINITY;
#pragma unroll
        for (int i = 0; i < TK / 8; i++) m = fmaxf(m, fmaxf(s[4 * i + 2 * hr], s[4 * i + 2 * hr + 1]));
        m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 1));
        m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 2));
        const float m_new = fmaxf(M[hr], m * f); /* -inf stays -inf */
        /* nothing visible yet (m_new -inf): weights 0, nothing to rescale */
        alpha[hr] = m_new == -INFINITY ? 1.0f : fast_exp2(M[hr] - m_new);
        const float base = m_new == -INFINITY ? 0.0f : -m_new;
        float       l = 0.0f;
#pragma unroll
        for (int i = 0; i < TK / 8; i++)
#pragma unroll
            for (int e = 2 * hr; e < 2 * hr + 2; e++) {
                const float wt = fast_exp2(fmaf(s[4 * i + e], f, base)); /* masked: 2^-inf = 0 */
                s[4 * i + e] = wt;
                l += wt;
            }
        L[hr] = L[hr] * alpha[hr] + l;
        M[hr] = m_new;
    }
}
#endif

#if defined(AUGUR_SM90A)
/* The warpgroup's 64 Q rows (T0 .. T0 + NT - 1 of head h; rows past NT:
 * zeros) into its swizzled operand qw, rounded to fp16; tw is the thread's
 * index in the warpgroup. Every load first, then the stores (a load, pack
 * and store at a time left each thread waiting on eight loads in turn: 6%
 * of the kernel's samples). The caller fences and syncs. */
template <int HD>
static __device__ __forceinline__ void wg_load_q(unsigned char *qw, const float *__restrict__ q, int T0, int NT,
                                                 int n_head, int h, int tw) {
    constexpr int QI = WG_ROWS * (HD / 8) / 128; /* 16-byte chunks a thread */
    float4        qa[QI][2];
#pragma unroll
    for (int i = 0; i < QI; i++) {
        const int e = tw + 128 * i, r = e / (HD / 8), d8 = e % (HD / 8);
        if (r < NT) {
            const float4 *src = (const float4 *)(q + ((size_t)(T0 + r) * n_head + h) * HD + 8 * d8);
            qa[i][0] = src[0], qa[i][1] = src[1];
        } else qa[i][0] = qa[i][1] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
#pragma unroll
    for (int i = 0; i < QI; i++) {
        const int    e = tw + 128 * i, r = e / (HD / 8), d8 = e % (HD / 8);
        const float4 a = qa[i][0], b = qa[i][1];
        *(uint4 *)(qw + wg_swz(r, d8)) =
            make_uint4(pack_half2(a.x, a.y), pack_half2(a.z, a.w), pack_half2(b.x, b.y), pack_half2(b.z, b.w));
    }
}

/* Each of the tile's 64 rows' visible positions [row_lo, row_hi] into
 * shared memory (rows past NT: none, hi -1), by the block's first 64
 * threads; the caller's barrier publishes them. */
static __device__ __forceinline__ void wg_row_ranges(int *row_lo, int *row_hi, const int32_t *__restrict__ pos, int T0,
                                                     int NT, int window) {
    if (threadIdx.x < WG_ROWS) {
        const int r = threadIdx.x, rh = r < NT ? pos[T0 + r] : -1;
        row_hi[r] = rh;
        row_lo[r] = r < NT && window > 0 ? max(0, rh - window + 1) : 0;
    }
}

/* attention_wg_k's and attention_wgp_k's shapes for head dim HD and
 * variant bits VAR: NH query heads (warpgroups computing) a block, TK
 * positions a chunk, NB K/V buffers, OP and OPK bytes of a Q operand
 * [64][HD] and of a K or V buffer [TK][HD] (swizzled panels). */
template <int HD, int VAR>
struct wg_cfg {
    static constexpr bool SKIP = VAR & WG_SKIP;
    static constexpr int  NH = WG_HEADS, TK = VAR & WG_N128 ? 128 : ATT_TK, NB = VAR & WG_DEEP ? 4 : 3;
    static constexpr int  OP = WG_PANEL * (HD / 64), OPK = TK * 128 * (HD / 64);
    static_assert(!(VAR & WG_DEEP) || TK == ATT_TK, "four buffers of 128 positions do not fit");
};
/* Where the kernels' dynamic shared memory goes (attention_wg_smem sizes
 * it): NH Q operands, NB K and NB V buffers, the rows' ranges; the panels
 * 1024-byte aligned (the swizzle pattern repeats every 1024 bytes). What
 * follows row_hi (attention_wgp_k's mbarriers) is the caller's. */
struct wg_smem {
    unsigned char *qs, *kbuf, *vbuf;
    int           *row_lo, *row_hi;
};
template <class C>
static __device__ __forceinline__ wg_smem wg_smem_of(unsigned char *smem_raw) {
    wg_smem m;
    m.qs = (unsigned char *)(((uintptr_t)smem_raw + 1023) & ~(uintptr_t)1023);
    m.kbuf = m.qs + C::NH * C::OP;
    m.vbuf = m.kbuf + C::NB * C::OPK;
    m.row_lo = (int *)(m.vbuf + C::NB * C::OPK);
    m.row_hi = m.row_lo + WG_ROWS;
    return m;
}

/* The positions a tile's rows see: chunks ch0 .. ch1 of TK positions, the
 * last position c_hi, and the range [all_lo, all_hi] every row sees (a
 * chunk inside it needs no mask). */
struct wg_span {
    int ch0, ch1, c_hi, all_lo, all_hi;
};
/* wg_span of the NT rows' ranges row_lo/row_hi (shared memory, after the
 * barrier that published them). The same in every thread, but taken from
 * lane 0 so that ptxas sees the chunk loop's counter, and the buffers and
 * descriptors it selects, as warp-uniform (uniform registers). */
template <int TK>
static __device__ __forceinline__ wg_span wg_chunks(const int *row_lo, const int *row_hi, int NT) {
    int c_lo = INT_MAX, c_hi = -1, all_lo = 0, all_hi = INT_MAX;
    for (int r = 0; r < NT; r++) {
        c_lo = min(c_lo, row_lo[r]), c_hi = max(c_hi, row_hi[r]);
        all_lo = max(all_lo, row_lo[r]), all_hi = min(all_hi, row_hi[r]);
    }
    return {__shfl_sync(0xffffffffu, c_lo / TK, 0), __shfl_sync(0xffffffffu, c_hi / TK, 0), c_hi,
            __shfl_sync(0xffffffffu, all_lo, 0), __shfl_sync(0xffffffffu, all_hi, 0)};
}

/* After the chunk loop: waits for the next-to-last chunk's P·V, then adds
 * the last chunk's (weights s, rescale alpha, V at descriptor words dv,
 * dhi) and waits for it: O is final (unnormalized). */
template <int HD, int TK, bool SKIP>
static __device__ __forceinline__ void wg_last_pv(float (&o)[HD / 2], const float (&s)[TK / 2],
                                                  uint32_t (&pa)[TK / 16][4], const float (&alpha)[2], uint32_t dv,
                                                  uint32_t dhi) {
    wg_wait<0>();
    wg_hold(o);
    wg_pack<TK>(s, pa);
    wg_rescale<HD, SKIP>(o, alpha);
    wg_fence();
    wg_pv<HD, TK>(o, pa, dv, dhi);
    wg_commit();
    wg_wait<0>();
    wg_hold(o);
}
#endif

/* VAR: the variants, bits WG_SKIP, WG_DEEP, WG_N128 (AUGUR_CUDA_WG_VAR) */
template <bool SOFTCAP, int HD, int VAR>
__global__ void __launch_bounds__(128 * WG_HEADS, 1)
    attention_wg_k(kv_geom g_, const int32_t *__restrict__ pos, const int32_t *__restrict__ tok_table,
                   const int32_t *__restrict__ tables, const int32_t *__restrict__ tiles, int n_head, int n_kv,
                   float scale, int window, float softcap, const float *__restrict__ q, float *__restrict__ out,
                   __nv_bfloat16 *__restrict__ ob, int n_dec, const float *__restrict__ sinks) {
#if defined(AUGUR_SM90A) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
    using C = wg_cfg<HD, VAR>;
    constexpr bool SKIP = C::SKIP;
    constexpr int  NH = C::NH, TK = C::TK, NB = C::NB, OP = C::OP, OPK = C::OPK;
    pdl_entry();
    extern __shared__ __align__(16) unsigned char smem_raw[];
    const wg_smem  sm = wg_smem_of<C>(smem_raw);
    unsigned char *qs = sm.qs, *kbuf = sm.kbuf, *vbuf = sm.vbuf;
    int           *row_lo = sm.row_lo, *row_hi = sm.row_hi;
    const int      tile = gridDim.x - 1 - blockIdx.x; /* the last (longest) tiles first */
    const int      T0 = tiles[tile], NT = tiles[tile + 1] - T0;
    const int      kvh = blockIdx.y, G = n_head / n_kv;
    /* the warpgroup, from lane 0: ptxas then knows it is warp-uniform and
     * keeps the descriptors derived from it in uniform registers */
    const int      wg = __shfl_sync(0xffffffffu, (int)threadIdx.x >> 7, 0), tw = threadIdx.x & 127;
    const int      gh = blockIdx.z * NH + wg;                      /* the warpgroup's head in the group */
    const bool     active = gh < G; /* past an odd group: repeats the last head, stores nothing */
    const int      h = kvh * G + min(gh, G - 1);
    const int      lane = threadIdx.x & 31, w = tw >> 5, g = lane >> 2, t = lane & 3;
    const int32_t *table = tables + tok_table[T0];
    wg_row_ranges(row_lo, row_hi, pos, T0, NT, window);
    wg_load_q<HD>(qs + wg * OP, q, T0, NT, n_head, h, tw);
    fence_proxy_async();
    __syncthreads();
    const wg_span sp_ = wg_chunks<TK>(row_lo, row_hi, NT);
    const int     ch0 = sp_.ch0, ch1 = sp_.ch1, c_hi = sp_.c_hi, all_lo = sp_.all_lo, all_hi = sp_.all_hi;
    int lo[2], hi[2];
#pragma unroll
    for (int hr = 0; hr < 2; hr++) lo[hr] = row_lo[16 * w + g + 8 * hr], hi[hr] = row_hi[16 * w + g + 8 * hr];
    const uint32_t ks = (uint32_t)__cvta_generic_to_shared(kbuf), vs = (uint32_t)__cvta_generic_to_shared(vbuf);
    const uint32_t dq = wg_desc_lo((uint32_t)__cvta_generic_to_shared(qs + wg * OP), 16), dk = wg_desc_lo(ks, 16),
                   dv = wg_desc_lo(vs, TK * 128), dhi = wg_desc_hi(1024); /* buffer at byte b: + b / 16 */
    const wg_stager<HD, NH, TK> st(g_, table, kvh, threadIdx.x);
    const float    LOG2E = 1.4426950408889634f;
    const float    sp = SOFTCAP ? scale / softcap : scale * LOG2E, cp = softcap * LOG2E;
    float M[2] = {-INFINITY, -INFINITY}, L[2] = {0.0f, 0.0f};
    float o[HD / 2];
#pragma unroll
    for (int i = 0; i < HD / 2; i++) o[i] = 0.0f;
    uint32_t pa[TK / 16][4]; /* P of the chunk whose P·V is issued, as A registers */
    float    s[TK / 2], alpha[2];
    /* FlashAttention-3's overlap inside a warpgroup: chunk c's S = Q·Kᵀ and
     * chunk c - 1's O += P·V are issued together and the softmax of c runs
     * while P·V is on the tensor cores; P·V is waited for at the next
     * chunk's top, where the weights are packed into pa and O is rescaled.
     * Two things ptxas does shape this: it schedules a wait ahead of
     * independent work in its basic block (a wait after the softmax made
     * the exponentials wait for P·V), and it does not see that an in-flight
     * wgmma still reads its A registers (packing the next P during P·V
     * reused them). Chunk c + 1 (WG_DEEP: c + 2) loads meanwhile: NB = 3
     * (4) K/V buffers (c + 1 (and c + 2) load, K of c and V of c - 1 are
     * read). No wgmma or wait sits under a
     * branch ptxas cannot prove uniform (it would serialize them all): the
     * first chunk is peeled, and the idle warpgroup of an odd group repeats
     * the last head without storing it. */
    /* byte offsets of the buffers of chunk c, of chunk c - 1 and of the
     * chunk loading next (c + NB - 2, into the buffers of c - 2), rotating */
    const auto next_buf = [](uint32_t b) { return b + OPK == NB * OPK ? 0u : b + OPK; };
    uint32_t   cur = 0, prv = 0, nxt = (NB - 2) * OPK;
    st.stage(ch0, c_hi, ks, vs);
    cp_async_commit();
    if (NB == 4) { /* chunk ch0 + 1 too (an empty group past ch1): one group a chunk */
        if (ch0 < ch1) st.stage(ch0 + 1, c_hi, ks + OPK, vs + OPK);
        cp_async_commit();
    }
    wg_chunk_ready<NB>();
    wg_fence();
    wg_scores<HD, TK>(s, dq, dk, dhi);
    wg_commit();
    if (ch0 + NB - 2 <= ch1) st.stage(ch0 + NB - 2, c_hi, ks + nxt, vs + nxt); /* while the tensor cores run */
    cp_async_commit(); /* possibly empty: one group a chunk keeps wg_chunk_ready's count */
    wg_wait<0>();
    wg_hold(s);
    wg_softmax<SOFTCAP, TK>(s, ch0, t, sp, cp, ch0 * TK < all_lo || ch0 * TK + TK - 1 > all_hi, lo, hi, M, L, alpha);
    for (int c = ch0 + 1; c <= ch1; c++) {
        prv = cur, cur = next_buf(cur), nxt = next_buf(nxt);
        wg_wait<0>(); /* chunk c - 2's P·V: O and pa free; before the barrier, so its V buffer is too */
        wg_hold(o);
        wg_chunk_ready<NB>();
        wg_pack<TK>(s, pa); /* chunk c - 1's weights */
        wg_rescale<HD, SKIP>(o, alpha);
        wg_fence(); /* O rescaled, P packed (registers) before wgmma reads or writes them */
        wg_scores<HD, TK>(s, dq, dk + (cur >> 4), dhi);
        wg_commit();
        wg_pv<HD, TK>(o, pa, dv + (prv >> 4), dhi);
        wg_commit();
        if (c + NB - 2 <= ch1) st.stage(c + NB - 2, c_hi, ks + nxt, vs + nxt); /* while the tensor cores run */
        cp_async_commit();
        wg_wait<1>(); /* S is done, P·V may still run */
        wg_hold(s);
        wg_softmax<SOFTCAP, TK>(s, c, t, sp, cp, c * TK < all_lo || c * TK + TK - 1 > all_hi, lo, hi, M, L, alpha);
    }
    wg_last_pv<HD, TK, SKIP>(o, s, pa, alpha, dv + (cur >> 4), dhi);
    if (!active) return; /* the repeated head */
    fa_store_rows<HD>([&](int i, int e) { return o[4 * i + e]; }, L, M, sinks ? sinks[h] * LOG2E : -INFINITY, g, t,
                      T0 + 16 * w, NT - 16 * w, n_head, h, out, ob, n_dec);
#endif
}

#if defined(AUGUR_SM90A)
/* mbarriers in shared memory (shared-window addresses) for attention_wgp_k */
static __device__ __forceinline__ void mbar_init(uint32_t b, int count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(b), "r"(count) : "memory");
}
static __device__ __forceinline__ void mbar_arrive(uint32_t b) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(b) : "memory");
}
/* Named barrier id (1..15; 0 is __syncthreads') of `count` threads:
 * sync waits for the count, arrive adds to it without waiting. */
static __device__ __forceinline__ void named_bar_sync(int id, int count) {
    asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(count) : "memory");
}
static __device__ __forceinline__ void named_bar_arrive(int id, int count) {
    asm volatile("bar.arrive %0, %1;" ::"r"(id), "r"(count) : "memory");
}
/* until the phase of parity `parity` has completed */
static __device__ __forceinline__ void mbar_wait(uint32_t b, uint32_t parity) {
    asm volatile("{\n.reg .pred p;\nWG_MBAR_WAIT:\n"
                 "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
                 "@!p bra WG_MBAR_WAIT;\n}\n" ::"r"(b),
                 "r"(parity)
                 : "memory");
}
#endif

/* attention_wg_k with FlashAttention-3's warp specialization (variant
 * WG_PROD): a third warpgroup, the producer, stages the K/V chunks (all of
 * wg_stager's address arithmetic and cp.async waits), and the two consumer
 * warpgroups only compute, without a block barrier a chunk. Buffers are
 * handed over by mbarriers: full[b] (the producer's 128 threads arrive
 * once their copies of chunk i landed and were fenced for wgmma; the
 * producer signals chunk i - 1 after issuing chunk i's copies, so loads
 * stay in flight) and empty[b] (the consumers' 256 threads arrive when
 * their P·V of the chunk is done; the producer waits for it before
 * refilling b). A warpgroup's own chunk loop is attention_wg_k's. */
template <bool SOFTCAP, int HD, int VAR>
__global__ void __launch_bounds__(128 * (WG_HEADS + 1), 1)
    attention_wgp_k(kv_geom g_, const int32_t *__restrict__ pos, const int32_t *__restrict__ tok_table,
                    const int32_t *__restrict__ tables, const int32_t *__restrict__ tiles, int n_head, int n_kv,
                    float scale, int window, float softcap, const float *__restrict__ q, float *__restrict__ out,
                    __nv_bfloat16 *__restrict__ ob, int n_dec, const float *__restrict__ sinks) {
#if defined(AUGUR_SM90A) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
    using C = wg_cfg<HD, VAR>;
    constexpr bool SKIP = C::SKIP, PING = VAR & WG_PING;
    constexpr int  NH = C::NH, TK = C::TK, NB = C::NB, OP = C::OP, OPK = C::OPK; /* NH consumer warpgroups */
    static_assert(!PING || NH == 2, "turns between two consumer warpgroups");
    pdl_entry();
    extern __shared__ __align__(16) unsigned char smem_raw[];
    const wg_smem  sm = wg_smem_of<C>(smem_raw);
    unsigned char *qs = sm.qs, *kbuf = sm.kbuf, *vbuf = sm.vbuf;
    int           *row_lo = sm.row_lo, *row_hi = sm.row_hi;
    const uint32_t full0 = (uint32_t)__cvta_generic_to_shared(row_hi + WG_ROWS), empty0 = full0 + 8 * NB; /* [NB] each */
    const int      tile = gridDim.x - 1 - blockIdx.x; /* the last (longest) tiles first */
    const int      T0 = tiles[tile], NT = tiles[tile + 1] - T0;
    const int      kvh = blockIdx.y, G = n_head / n_kv;
    const int      wg = __shfl_sync(0xffffffffu, (int)threadIdx.x >> 7, 0), tw = threadIdx.x & 127;
    const bool     producer = wg == NH;
    const int      gh = blockIdx.z * NH + wg;
    const bool     active = gh < G; /* past an odd group: repeats the last head, stores nothing */
    const int      h = kvh * G + min(gh, G - 1);
    const int      lane = threadIdx.x & 31, w = tw >> 5, g = lane >> 2, t = lane & 3;
    const int32_t *table = tables + tok_table[T0];
    wg_row_ranges(row_lo, row_hi, pos, T0, NT, window);
    if (threadIdx.x == 0)
        for (int b = 0; b < NB; b++) mbar_init(full0 + 8 * b, 128), mbar_init(empty0 + 8 * b, 128 * NH);
    if (!producer) {
        wg_load_q<HD>(qs + wg * OP, q, T0, NT, n_head, h, tw);
        fence_proxy_async();
    }
    __syncthreads(); /* the rows' ranges, Q, the mbarriers' initialization */
    const wg_span sp_ = wg_chunks<TK>(row_lo, row_hi, NT);
    const int     ch0 = sp_.ch0, ch1 = sp_.ch1, c_hi = sp_.c_hi, all_lo = sp_.all_lo, all_hi = sp_.all_hi;
    const uint32_t ks = (uint32_t)__cvta_generic_to_shared(kbuf), vs = (uint32_t)__cvta_generic_to_shared(vbuf);
    /* 128-position chunks (WG_N128) need more registers than a 384-thread
     * block gives each thread (168): the producer hands most of its own to
     * the consumers (128 x 40 + 256 x 232 = 64512 of 65536) */
    constexpr bool REBALANCE = TK == 128;
    if (producer) {
        if (REBALANCE) asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n" ::: "memory");
        const wg_stager<HD, 1, TK> st(g_, table, kvh, tw);
        /* chunk i's buffer, chunk i - 1's, and the parity of empty[b]'s phase
         * to wait for: 0 for the first release of b (needed from i = NB on;
         * 1 before, when nothing is waited for), flipping at each wrap */
        uint32_t b = 0, bp = 0, ph = 1;
        for (int i = 0; i <= ch1 - ch0; i++) {
            if (i >= NB) mbar_wait(empty0 + 8 * b, ph); /* chunk i - NB's P·V done in both consumers */
            st.stage(ch0 + i, c_hi, ks + b * OPK, vs + b * OPK);
            cp_async_commit();
            if (i > 0) { /* chunk i - 1 landed: fenced for wgmma, handed over */
                cp_async_wait<1>();
                fence_proxy_async();
                mbar_arrive(full0 + 8 * bp);
            }
            bp = b;
            if (++b == NB) b = 0, ph ^= 1u;
        }
        cp_async_wait<0>();
        fence_proxy_async();
        mbar_arrive(full0 + 8 * bp);
        return;
    }
    if (REBALANCE) asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n" ::: "memory");
    int lo[2], hi[2];
#pragma unroll
    for (int hr = 0; hr < 2; hr++) lo[hr] = row_lo[16 * w + g + 8 * hr], hi[hr] = row_hi[16 * w + g + 8 * hr];
    const uint32_t dq = wg_desc_lo((uint32_t)__cvta_generic_to_shared(qs + wg * OP), 16), dk = wg_desc_lo(ks, 16),
                   dv = wg_desc_lo(vs, TK * 128), dhi = wg_desc_hi(1024);
    const float    LOG2E = 1.4426950408889634f;
    const float    sp = SOFTCAP ? scale / softcap : scale * LOG2E, cp = softcap * LOG2E;
    float M[2] = {-INFINITY, -INFINITY}, L[2] = {0.0f, 0.0f};
    float o[HD / 2];
#pragma unroll
    for (int i = 0; i < HD / 2; i++) o[i] = 0.0f;
    uint32_t pa[TK / 16][4];
    float    s[TK / 2], alpha[2];
    /* buffer indices of chunks i, i - 1 and i - 2, and full's parity at cur */
    uint32_t cur = 0, prv = 0, old = 0, ph = 0;
    mbar_wait(full0, 0);
    fence_proxy_async();
    wg_fence();
    wg_scores<HD, TK>(s, dq, dk, dhi);
    wg_commit();
    wg_wait<0>();
    wg_hold(s);
    wg_softmax<SOFTCAP, TK>(s, ch0, t, sp, cp, ch0 * TK < all_lo || ch0 * TK + TK - 1 > all_hi, lo, hi, M, L, alpha);
    /* PING (FlashAttention-3's ping-pong): in the loop the two consumers
     * issue their wgmmas in turns, by named barriers 1 (consumer 0's turn)
     * and 2 (consumer 1's), so that one's softmax runs while the other's
     * wgmmas hold the tensor cores. Consumer 1 lets consumer 0 go first and
     * gives the turn back after each issue but its last: every sync has
     * its arrival (no barrier is left half-arrived at exit). */
    if (PING && wg == 1 && ch1 > ch0) named_bar_arrive(1, 256);
    for (int c = ch0 + 1; c <= ch1; c++) {
        old = prv, prv = cur;
        if (++cur == NB) cur = 0, ph ^= 1u;
        wg_wait<0>(); /* chunk c - 2's P·V: O and pa free, and its buffers */
        wg_hold(o);
        if (c - ch0 >= 2) mbar_arrive(empty0 + 8 * old);
        mbar_wait(full0 + 8 * cur, ph);
        fence_proxy_async();
        wg_pack<TK>(s, pa); /* chunk c - 1's weights */
        wg_rescale<HD, SKIP>(o, alpha);
        /* WG_PIN: without this hold the compiler sinks the rescale's
         * multiplies past wg_fence (which does not name O) to just before
         * P·V, and ptxas then injects a warpgroup.arrive there (its info
         * C7519, in every attention_wgp_k, none in attention_wg_k); with
         * it the multiplies precede the fence and nothing is injected.
         * Which schedule is faster is the variant's question. */
        if (VAR & WG_PIN) wg_hold(o);
        if (PING) named_bar_sync(1 + wg, 256); /* this consumer's turn */
        wg_fence();
        wg_scores<HD, TK>(s, dq, dk + (cur * OPK >> 4), dhi);
        wg_commit();
        wg_pv<HD, TK>(o, pa, dv + (prv * OPK >> 4), dhi);
        wg_commit();
        if (PING && (wg == 0 || c < ch1)) named_bar_arrive(2 - wg, 256); /* the other's turn */
        wg_wait<1>(); /* S is done, P·V may still run */
        wg_hold(s);
        wg_softmax<SOFTCAP, TK>(s, c, t, sp, cp, c * TK < all_lo || c * TK + TK - 1 > all_hi, lo, hi, M, L, alpha);
    }
    wg_last_pv<HD, TK, SKIP>(o, s, pa, alpha, dv + (cur * OPK >> 4), dhi);
    if (!active) return; /* the repeated head */
    fa_store_rows<HD>([&](int i, int e) { return o[4 * i + e]; }, L, M, sinks ? sinks[h] * LOG2E : -INFINITY, g, t,
                      T0 + 16 * w, NT - 16 * w, n_head, h, out, ob, n_dec);
#endif
}

/* Dynamic shared memory attention_wg_k needs: WG_HEADS Q operands, nb K
 * and nb V buffers of tk positions, the rows' ranges, and 1024 bytes to
 * align the panels. */
static size_t attention_wg_smem(int hd, int tk, int nb) {
    return 1024 + ((size_t)WG_HEADS * WG_PANEL + 2 * (size_t)nb * tk * 128) * (hd / 64) + sizeof(int) * 2 * WG_ROWS +
           2 * sizeof(uint64_t) * nb; /* attention_wgp_k's mbarriers */
}

/* attention_wg_k for variant bits v (WG_SKIP | WG_DEEP, or WG_N128 with
 * or without WG_SKIP), attention_wgp_k for WG_PROD (with WG_DEEP or not,
 * WG_PROD | WG_DEEP | WG_PING and WG_PROD | WG_DEEP | WG_PIN); anything
 * else: 0 */
template <bool SOFTCAP, int HD>
static decltype(&attention_wg_k<SOFTCAP, HD, 0>) wg_kernel_for(int v) {
    switch (v) {
    case WG_SKIP: return attention_wg_k<SOFTCAP, HD, WG_SKIP>;
    case WG_DEEP: return attention_wg_k<SOFTCAP, HD, WG_DEEP>;
    case WG_SKIP | WG_DEEP: return attention_wg_k<SOFTCAP, HD, WG_SKIP | WG_DEEP>;
    case WG_N128: return attention_wg_k<SOFTCAP, HD, WG_N128>;
    case WG_N128 | WG_SKIP: return attention_wg_k<SOFTCAP, HD, WG_N128 | WG_SKIP>;
    case WG_PROD: return attention_wgp_k<SOFTCAP, HD, 0>;
    case WG_PROD | WG_DEEP: return attention_wgp_k<SOFTCAP, HD, WG_DEEP>;
    case WG_PROD | WG_DEEP | WG_PING: return attention_wgp_k<SOFTCAP, HD, WG_DEEP | WG_PING>;
    case WG_PROD | WG_DEEP | WG_PIN: return attention_wgp_k<SOFTCAP, HD, WG_DEEP | WG_PIN>;
    case WG_PROD | WG_N128: return attention_wgp_k<SOFTCAP, HD, WG_N128>;
    default: return attention_wg_k<SOFTCAP, HD, 0>;
    }
}
/* Whether variant bits v name a built kernel (wg_kernel_for's cases: the
 * one list of them) */
bool wg_var_built(int v) { return v == 0 || wg_kernel_for<false, 64>(v) != attention_wg_k<false, 64, 0>; }

/* attention_wg_k or attention_wgp_k (s->wg_var) over the pass's prompt
 * rows in 64-row tiles (begin's last tiles list), WG_HEADS query heads a
 * block, head dim HD. */
template <int HD>
static ag_status launch_attention_wg_hd(cuda_state *s, const kv_geom &g, const ag_attn_shape *sh, const float *q,
                                        float *out) {
    const bool   softcap = sh->softcap > 0.0f;
    const int    G = sh->n_head / sh->n_head_kv;
    const int    n_dec = s->pass_n_decode;
    const size_t n_pp = (size_t)(s->n - n_dec) * sh->n_head * HD;
    const int    v = s->wg_var;
    auto         k = softcap ? wg_kernel_for<true, HD>(v) : wg_kernel_for<false, HD>(v);
    const size_t shm = attention_wg_smem(HD, v & WG_N128 ? 128 : ATT_TK, v & WG_DEEP ? 4 : 3);
    __nv_bfloat16 *ob = pp_reserve(s, n_pp);
    CUDA_TRY(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)shm));
    /* all of the SM's 228 KB as shared memory (a hint; a block takes 113-161 KB) */
    CUDA_TRY(cudaFuncSetAttribute(k, cudaFuncAttributePreferredSharedMemoryCarveout, 100));
    launch_k(s, k, dim3((unsigned)s->n_btiles[BTILE_MAX - 2], (unsigned)sh->n_head_kv, (unsigned)((G + WG_HEADS - 1) / WG_HEADS)),
             128 * (WG_HEADS + (v & WG_PROD ? 1 : 0)), shm, g, s->d_pos, s->d_tok_table, s->d_tables, s->d_btiles[BTILE_MAX - 2], sh->n_head,
             sh->n_head_kv, sh->scale, sh->window, sh->softcap, q, out, ob, n_dec, sh->sinks);
    LAUNCHED();
    if (ob) pp_made(s, out + (size_t)n_dec * sh->n_head * HD, n_pp);
    return AG_OK;
}

ag_status launch_attention_wg(cuda_state *s, const kv_geom &g, const ag_attn_shape *sh, const float *q, float *out) {
    return sh->head_dim_k == 64 ? launch_attention_wg_hd<64>(s, g, sh, q, out) : launch_attention_wg_hd<128>(s, g, sh, q, out);
}
