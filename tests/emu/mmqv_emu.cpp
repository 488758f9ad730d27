/* mmqv (src/backend/cuda/mmqv.cuh: few decode rows of Q4_K / Q6_K
 * with mmq's bits) compiled unchanged on the CPU under cuda_shim.h, against
 * mmq's arithmetic written out here from mmq_q4k_block, mmq_q6k_block,
 * mmq_lane and mmt_finish: the K split into ks slices of ceil(nb / ks)
 * whole blocks, each slice's serial chain of __fmul_rn / __fsub_rn /
 * __fadd_rn from 0.0f, exact integer sums, the slices added in order.
 * Every output must be equal bit for bit: Q4_K and Q6_K, nb = 1 .. 56
 * blocks a row (slices short and empty), 4, 8 and 16 slices over 1, 2 or
 * 4 warps a row, 1 and 2 tokens a block (MMQV_NT_MAX; and batches wider
 * than a block), rows read from global memory or staged, rows past the last
 * block's, and launches of three weights of different types and splits.
 * On the GPU, test_backend_ops holds the kernel to mmq itself; this runs
 * where there is no GPU (`make cuda-emu`). Exit status 1 on a mismatch. */
#include <algorithm>
#include <type_traits>

#include "cuda_shim.h"

/* the CUDA pieces mmqv uses beyond the shim's */
struct uint2 { uint32_t x, y; };
struct uint4 { uint32_t x, y, z, w; };
struct int4 { int x, y, z, w; };
struct float2 { float x, y; };
struct __half { uint16_t b; };
#define __align__(n) __attribute__((aligned(n)))
#define PDL_PF_MUL 1
static inline float2 make_float2(float x, float y) { return float2{x, y}; }
static inline __half __ushort_as_half(uint16_t v) { return __half{v}; }
static inline float __half2float(__half h) { /* exact: every half is a float */
    const uint32_t s = (uint32_t)(h.b >> 15) << 31, e = (h.b >> 10) & 31, m = h.b & 1023;
    uint32_t       f;
    if (e == 31) f = s | 0x7F800000u | m << 13;
    else if (e) f = s | (e + 112) << 23 | m << 13;
    else if (!m) f = s;
    else { /* subnormal: m 2^-24 */
        float v = (float)m * 0x1p-24f;
        return s ? -v : v;
    }
    float r;
    memcpy(&r, &f, 4);
    return r;
}
template <typename T> static inline T __ldg(const T *p) { return *p; }
template <bool ST, class T> static inline T wld(const T *p) { return *p; }
static inline int __dp4a(int a, int b, int c) {
    for (int i = 0; i < 4; i++) c += (int)(int8_t)(a >> (8 * i)) * (int)(int8_t)(b >> (8 * i));
    return c;
}
static inline uint32_t __vsubss4(uint32_t a, uint32_t b) {
    uint32_t r = 0;
    for (int i = 0; i < 4; i++) {
        int v = (int)(int8_t)(a >> (8 * i)) - (int)(int8_t)(b >> (8 * i));
        v = v < -128 ? -128 : v > 127 ? 127 : v;
        r |= (uint32_t)(uint8_t)v << (8 * i);
    }
    return r;
}
static inline uint32_t __funnelshift_r(uint32_t lo, uint32_t hi, uint32_t sh) {
    return (uint32_t)((((uint64_t)hi << 32) | lo) >> (sh & 31));
}
static inline void __syncwarp() { wsync(); }
static inline void prefetch_l2(const void *, size_t) {}
/* staging: the block's rows copied into "shared memory" by thread 0 (stage_rows' contract: every thread calls it) */
static __attribute__((aligned(128))) uint8_t g_stage[64 * 1024];
static inline void stage_wait(uint64_t *) {}
static const uint8_t *mmqv_stage(const uint8_t *W, size_t row_bytes, int n_out, int bx, int rpb, int r_in, uint64_t *) {
    const int row0 = bx * rpb, rows = min(rpb, n_out - row0);
    if (threadIdx.x == 0) memcpy(g_stage, W + (size_t)row0 * row_bytes, (size_t)rows * row_bytes);
    __syncthreads();
    return g_stage + (size_t)min(r_in, rows - 1) * row_bytes;
}

#include "backend/cuda/mmqv.cuh" /* the kernel, as mmq.cu compiles it */

static uint64_t st = 11;
static uint64_t xr() { st ^= st << 13; st ^= st >> 7; st ^= st << 17; return st; }
static uint16_t rand_half(float lo, float hi) { /* a finite half in [lo, hi) (truncated) */
    float    v = lo + (hi - lo) * (float)((xr() >> 40) * 0x1p-24);
    uint32_t f;
    memcpy(&f, &v, 4);
    const int e = (int)((f >> 23) & 255) - 127;
    if (e < -14) return (uint16_t)(f >> 16 & 0x8000); /* (tiny: zero) */
    return (uint16_t)((f >> 16 & 0x8000) | (uint32_t)(e + 15) << 10 | (f >> 13 & 1023));
}

/* mmq's output for one row and token (the reference) */
static float ref_mmq(const uint8_t *row, bool q6, int K, int ks, const int8_t *xq, const float2 *xs) {
    const int nb = K / 256, per = (nb + ks - 1) / ks;
    float     y = 0.0f;
    for (int s = 0; s < ks; s++) {
        float c = 0.0f;
        for (int b = std::min(nb, s * per); b < std::min(nb, s * per + per); b++) {
            if (!q6) {
                const uint8_t *blk = row + (size_t)b * 144, *sc = blk + 4;
                uint16_t       dh, mh;
                memcpy(&dh, blk, 2), memcpy(&mh, blk + 2, 2);
                for (int sb = 0; sb < 8; sb++) { /* ggml's get_scale_min_k4 */
                    const int d6 = sb < 4 ? sc[sb] & 63 : (sc[sb + 4] & 0xF) | ((sc[sb - 4] >> 6) << 4);
                    const int m6 = sb < 4 ? sc[sb + 4] & 63 : (sc[sb + 4] >> 4) | ((sc[sb] >> 6) << 4);
                    int       isum = 0;
                    for (int e = 0; e < 32; e++) {
                        const uint8_t qb = blk[16 + 32 * (sb / 2) + e];
                        isum += (sb & 1 ? qb >> 4 : qb & 15) * xq[256 * b + 32 * sb + e];
                    }
                    const float  a = __fmul_rn(__half2float(__half{dh}), (float)d6);
                    const float  m = __fmul_rn(__half2float(__half{mh}), (float)m6);
                    const float2 xe = xs[8 * b + sb];
                    c = __fadd_rn(c, __fsub_rn(__fmul_rn(__fmul_rn(a, xe.x), (float)isum), __fmul_rn(m, xe.y)));
                }
            } else {
                const uint8_t *blk = row + (size_t)b * 210;
                uint16_t       dh;
                memcpy(&dh, blk + 208, 2);
                const float d = __half2float(__half{dh});
                for (int gi = 0; gi < 16; gi++) { /* element 16 gi + e: half h, quadrant gq, position l */
                    int isum = 0;
                    for (int e = 0; e < 16; e++) {
                        const int el = 16 * gi + e, h = el / 128, gq = (el % 128) / 32, l = el % 32;
                        const int lo = (blk[64 * h + 32 * (gq & 1) + l] >> (4 * (gq >> 1))) & 15;
                        const int hi = (blk[128 + 32 * h + l] >> (2 * gq)) & 3;
                        isum += ((lo | hi << 4) - 32) * xq[256 * b + el];
                    }
                    const float sw = __fmul_rn(d, (float)(int8_t)blk[192 + gi]);
                    c = __fadd_rn(c, __fmul_rn(__fmul_rn(sw, xs[8 * b + gi / 2].x), (float)isum));
                }
            }
        }
        y = s == 0 ? c : __fadd_rn(y, c);
    }
    return y;
}

struct weight {
    std::vector<uint8_t> bytes;
    size_t               row_bytes;
    int                  n_out, ks, ws;
    bool                 q6;
};
static weight make_weight(bool q6, int K, int n_out, int ks, int ws) {
    weight w;
    w.q6 = q6, w.n_out = n_out, w.ks = ks, w.ws = ws;
    const int nb = K / 256, bb = q6 ? 210 : 144;
    w.row_bytes = (size_t)nb * bb;
    w.bytes.resize(w.row_bytes * n_out + 16);
    for (size_t i = 0; i < w.bytes.size(); i++) w.bytes[i] = (uint8_t)xr();
    for (size_t b = 0; b < (size_t)nb * n_out; b++) { /* finite scales: d, dmin (Q4_K) or d (Q6_K) */
        uint8_t *blk = &w.bytes[b * bb];
        uint16_t h = rand_half(-0.02f, 0.05f);
        memcpy(blk + (q6 ? 208 : 0), &h, 2);
        if (!q6) h = rand_half(0.0f, 0.02f), memcpy(blk + 2, &h, 2);
    }
    return w;
}

static long g_bad, g_n;

/* One launch of the parts w[0..n_w) over n_tok tokens, NT a block, against ref_mmq. */
template <int NT, bool ST>
static void run(const std::vector<weight *> &w, int K, int n_tok) {
    std::vector<int8_t> xq((size_t)n_tok * K);
    std::vector<float2> xs((size_t)n_tok * (K / 32));
    for (size_t i = 0; i < xq.size(); i++) xq[i] = (int8_t)((int)(xr() % 255) - 127);
    for (size_t i = 0; i < xs.size(); i++) {
        const float d = (float)((xr() >> 40) * 0x1p-24) * 0.03f;
        int         s = 0;
        for (int e = 0; e < 32; e++) s += xq[32 * i + e];
        xs[i] = float2{d, __fmul_rn(d, (float)s)};
    }
    mmqv_group g;
    memset(&g, 0, sizeof g);
    g.n = (int)w.size();
    std::vector<std::vector<float>> y(w.size());
    for (int i = 0; i < g.n; i++) {
        y[i].assign((size_t)n_tok * w[i]->n_out, NAN);
        const int rows = MMQV_WARPS / w[i]->ws;
        g.W[i] = w[i]->bytes.data(), g.y[i] = y[i].data(), g.row_bytes[i] = w[i]->row_bytes;
        g.n_out[i] = w[i]->n_out, g.q6[i] = w[i]->q6, g.ks[i] = w[i]->ks, g.ws[i] = w[i]->ws;
        g.blk0[i + 1] = g.blk0[i] + (w[i]->n_out + rows - 1) / rows;
    }
    void (*k)(const mmqv_group, int, const int8_t *, const float2 *, int) = mmqv<NT, ST>;
    emu_launch_xy(k, g.blk0[g.n], (n_tok + NT - 1) / NT, 32 * MMQV_WARPS, (const mmqv_group)g, K,
                  (const int8_t *)xq.data(), (const float2 *)xs.data(), n_tok);
    for (int i = 0; i < g.n; i++)
        for (int t = 0; t < n_tok; t++)
            for (int r = 0; r < w[i]->n_out; r++) {
                const float want = ref_mmq(w[i]->bytes.data() + r * w[i]->row_bytes, w[i]->q6, K, w[i]->ks,
                                           &xq[(size_t)t * K], &xs[(size_t)t * (K / 32)]);
                const float got = y[i][(size_t)t * w[i]->n_out + r];
                g_n++;
                if (memcmp(&want, &got, 4)) {
                    if (g_bad++ < 10)
                        fprintf(stderr, "mmqv<%d,%d> %s K=%d ks=%d ws=%d part %d/%d: row %d token %d: %.9g, mmq %.9g\n",
                                NT, (int)ST, w[i]->q6 ? "Q6_K" : "Q4_K", K, w[i]->ks, w[i]->ws, i, g.n, r, t, got,
                                want);
                }
            }
}

template <int NT>
static void run_nt(const std::vector<weight *> &w, int K, int n_tok, bool staged) {
    if (staged) run<NT, true>(w, K, n_tok);
    else run<NT, false>(w, K, n_tok);
}
static void run_any(const std::vector<weight *> &w, int K, int nt, int n_tok, bool staged) {
    if (nt == 1) run_nt<1>(w, K, n_tok, staged);
    else run_nt<2>(w, K, n_tok, staged);
}

int main() {
    static const int nbs[] = {1, 2, 5, 11, 16, 18, 56}, kss[] = {4, 8, 16};
    int case_i = 0;
    for (int q6 = 0; q6 < 2; q6++)
        for (int nb : nbs)
            for (int ks : kss)
                for (int ws = 1; ws <= ks / 4 && ws <= 4; ws *= 2) {
                    const int n_out = 5 + (case_i % 3) * 2; /* 5, 7, 9: a last block short of rows */
                    weight    w = make_weight(q6, 256 * nb, n_out, ks, ws);
                    /* every (type, staged, tokens a block, batch of 1 .. nt + 1) occurs */
                    const int nt = 1 + (case_i / 2) % 2, n_tok = case_i % 3 == 2 ? nt + 1 : 1 + (case_i / 4) % nt;
                    /* staged where the real launch may stage (16-byte rows) */
                    const bool staged = w.row_bytes % 16 == 0 && case_i % 2;
                    run_any({&w}, 256 * nb, nt, n_tok, staged);
                    case_i++;
                }
    /* three weights in one launch: q/k/v-like (Q4_K split over 4 warps, Q6_K v) and two others */
    for (int nb : {5, 16, 18}) {
        weight a = make_weight(false, 256 * nb, 9, 8, 1), b = make_weight(false, 256 * nb, 6, 16, 4),
               c = make_weight(true, 256 * nb, 7, 4, 1);
        run_any({&a, &b, &c}, 256 * nb, 1, 1, nb == 16);
        run_any({&a, &b, &c}, 256 * nb, 2, 2, false);
        run_any({&a, &b, &c}, 256 * nb, 2, 3, nb == 16); /* and a second block of one token */
        weight d = make_weight(true, 256 * nb, 3, 16, 2), e = make_weight(false, 256 * nb, 10, 4, 1);
        run_any({&d, &e}, 256 * nb, 2, 2, false);
    }
    printf("mmqv_emu: %ld of %ld outputs differ from mmq's arithmetic (%d cases)\n", g_bad, g_n, case_i + 9);
    return g_bad ? 1 : 0;
}
