/* cands_rows_k, and the split grid cands_split_k + cands_z_k (3, 5 or 32
 * slices a row, on 256 threads), from src/backend/cuda/sample_cands.cuh,
 * compiled unchanged on the CPU: a block's threads as pthreads,
 * __syncthreads as a barrier, warp votes, shuffles and matches through
 * per-warp barriers, shared memory as statics, atomics as host atomics.
 * Each row's output is compared with ag_top_cands_f32 (every field; sumexp
 * to 1e-9): rows of ties, -0.0 with +0.0, subnormals, NaN, +inf with
 * FLT_MAX, nothing finite, k of 1 to 257 against 256 or 257 finite values.
 * For kernel edits on a machine without a GPU (`make cuda-emu`, about 50 s
 * at dims up to 2049, argument: how many of the dims 7, 1000, 1025, 2049,
 * 151936 to run); the GPU's own check is scripts/gpu_test.sh. Exit status
 * 1 on a mismatch. */
#include "cuda_shim.h"
#include "backend/cuda/sample_pick.cuh"  /* the split grids' helpers (split_slice, last_slice_of_row) */
#include "backend/cuda/sample_cands.cuh" /* the kernels, as sample.cu compiles them */

static uint64_t st = 99;
static uint64_t xr() { st ^= st << 13; st ^= st >> 7; st ^= st << 17; return st; }
static float gs() { double u = (xr() >> 11) * 0x1p-53 + 1e-12, v = (xr() >> 11) * 0x1p-53; return (float)(sqrt(-2 * log(u)) * cos(6.2831853 * v)); }
int main(int argc, char **argv) {
    int dims[] = {7, 1000, 1025, 2049, 151936};
    int nd = argc > 1 ? atoi(argv[1]) : 7;
    long bad = 0, n = 0;
    for (int di = 0; di < nd; di++) {
        int dim = dims[di];
        const int R = 12;
        std::vector<float> x((size_t)R * dim);
        for (int r = 0; r < R; r++) {
            float *row = &x[(size_t)r * dim];
            for (int i = 0; i < dim; i++) {
                switch (r) {
                case 0: row[i] = gs() * 3; break;
                case 1: row[i] = 1.0f; break;
                case 2: row[i] = (float)(xr() % 4) * 0.25f; break;
                case 3: row[i] = (i % 3) ? -INFINITY : NAN; break;
                case 4: row[i] = (xr() % 600 == 0) ? (float)(xr() % 3) : -INFINITY; break;
                case 5: { int q = xr() % 7; float s[] = {0.0f, -0.0f, 1e-45f, -1e-45f, INFINITY, FLT_MAX, -FLT_MAX}; row[i] = s[q]; } break;
                case 6: row[i] = i < dim - 257 ? -INFINITY : 2.0f; break;
                case 7: row[i] = i < dim - 256 ? NAN : 2.0f; break;
                case 8: row[i] = gs() * 0.001f; break;
                case 9: row[i] = (i % 2) ? -0.0f : 0.0f; break;
                case 10: row[i] = -gs() * gs() * 50; break;
                default: row[i] = (xr() % 2) ? 7.0f : -INFINITY; break;
                }
            }
        }
        int ks[] = {1, 256, 40, 256, 255, 256, 256, 256, 2, 256, 257, 128};
        std::vector<int32_t> reqs(R), tok(R);
        std::vector<ag_cands> got(R), want(R);
        for (int pass = 0; pass < 2; pass++) { /* pass 1: no tokens given (at = the token reads as none) */
        for (int r = 0; r < R; r++) {
            const int    ats[] = {-1, 0, dim - 1, dim, (int)(xr() % (unsigned)dim), AG_CANDS_AT_MAX + 1,
                                  AG_CANDS_AT_TOKEN, AG_CANDS_AT_TOKEN, AG_CANDS_AT_MAX};
            ag_cands_req q = {ks[r], r % 2, ats[(r + pass) % 9]};
            tok[r] = r % 8 == 7 ? -2 : (int32_t)(xr() % (unsigned)dim); /* the pick's token, or "none finite" */
            reqs[r] = cands_req_word(&q);
            ag_cands_req h = q; /* the host names the token itself */
            if (h.at == AG_CANDS_AT_TOKEN) h.at = pass ? -1 : tok[r];
            ag_top_cands_f32(&x[(size_t)r * dim], dim, &h, &want[r]);
        }
        const int32_t *tk = pass ? (const int32_t *)nullptr : (const int32_t *)tok.data();
        /* split: 0, one block a row (cands_rows_k); else cands_split_k and cands_z_k
         * with S slices a row, on 256 threads (any multiple of 32 from
         * AG_CANDS_MAX up serves; fewer threads run faster here), with slices
         * of 0 to dim / S values (and 32 slices, the most, of dim 2049) */
        const int slices[] = {0, dim < 100 ? 5 : dim == 2049 ? 32 : 3};
        for (int split = 0; split < 2; split++) {
        const int S = slices[split];
        if (S == 0) {
            emu_launch(cands_rows_k, R, CANDS_THREADS, (const float *)x.data(), dim, (const int32_t *)reqs.data(), tk,
                       got.data());
        } else {
            if (S == 32 && pass) continue; /* the widest split once a dim: the emulation is slow */
            std::vector<uint32_t> sk((size_t)R * S * AG_CANDS_MAX, 0xdeadbeefu);
            std::vector<int32_t>  si((size_t)R * S * AG_CANDS_MAX, -7), snf((size_t)R * S, -7), cnt(R, 0);
            std::vector<double>   sz((size_t)R * S, -7.0);
            for (ag_cands &g : got) memset((void *)&g, 0x5a, sizeof g); /* what the kernels leave is seen */
            emu_launch(cands_split_k, R * S, 256, (const float *)x.data(), dim, S, (const int32_t *)reqs.data(), tk,
                       sk.data(), si.data(), snf.data(), cnt.data(), got.data());
            emu_launch(cands_z_k, R * S, 256, (const float *)x.data(), dim, S, (const int32_t *)reqs.data(), sz.data(),
                       cnt.data(), got.data());
            for (int r = 0; r < R; r++)
                if (cnt[r] != 0) { bad++; printf("MISMATCH dim %d row %d S %d: counter left at %d\n", dim, r, S, cnt[r]); }
        }
        for (int r = 0; r < R; r++) {
            n++;
            const ag_cands *g = &got[r], *w = &want[r];
            bool ok = g->n == w->n && g->n_finite == w->n_finite && memcmp(&g->max, &w->max, 4) == 0 &&
                      g->at == w->at && (w->at < 0 ? isnan(g->at_l) && isnan(w->at_l) : memcmp(&g->at_l, &w->at_l, 4) == 0);
            for (int i = 0; ok && i < w->n; i++) ok = g->c[i].id == w->c[i].id && memcmp(&g->c[i].l, &w->c[i].l, 4) == 0;
            if (r % 2) ok = ok && (w->n_finite == 0 ? g->sumexp == w->sumexp : fabs(g->sumexp - w->sumexp) <= 1e-9 * w->sumexp);
            else ok = ok && isnan(g->sumexp) && isnan(w->sumexp);
            if (!ok) { bad++; printf("MISMATCH dim %d row %d pass %d slices %d: n %d/%d nf %d/%d max %g/%g z %.17g/%.17g c0 %d/%d at %d/%d\n", dim, r, pass, S, g->n, w->n, g->n_finite, w->n_finite, g->max, w->max, g->sumexp, w->sumexp, g->c[0].id, w->c[0].id, g->at, w->at); }
        }
        }
        }
        printf("dim %d done\n", dim); fflush(stdout);
    }
    printf("rows %ld bad %ld\n", n, bad);
    return bad != 0;
}
