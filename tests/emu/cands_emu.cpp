/* cands_rows_k (src/backend/cuda/cuda_backend.cu) compiled unchanged on the
 * CPU: one block's 1024 threads as pthreads, __syncthreads as a barrier,
 * warp votes, shuffles and matches through per-warp barriers, shared
 * memory as statics, atomics as host atomics. Each row's output is compared
 * with ag_top_cands_f32 (every field; sumexp to 1e-9): rows of ties, -0.0
 * with +0.0, subnormals, NaN, +inf with FLT_MAX, nothing finite, k of 1 to
 * 257 against 256 or 257 finite values. For kernel edits on a machine
 * without a GPU (`make cuda-emu`, about 25 s at dims up to 2049, argument:
 * how many of the dims 7, 1000, 1025, 2049, 151936 to run); the GPU's own
 * check is scripts/gpu_test.sh. Exit status 1 on a mismatch. */
#include "cuda_shim.h"
#include "cands_kernel.inc" /* the kernel, cut from cuda_backend.cu by make cuda-emu */

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
        emu_launch(cands_rows_k, R, CANDS_THREADS, (const float *)x.data(), dim, (const int32_t *)reqs.data(),
                   pass ? (const int32_t *)nullptr : (const int32_t *)tok.data(), got.data());
        for (int r = 0; r < R; r++) {
            n++;
            const ag_cands *g = &got[r], *w = &want[r];
            bool ok = g->n == w->n && g->n_finite == w->n_finite && memcmp(&g->max, &w->max, 4) == 0 &&
                      g->at == w->at && (w->at < 0 ? isnan(g->at_l) && isnan(w->at_l) : memcmp(&g->at_l, &w->at_l, 4) == 0);
            for (int i = 0; ok && i < w->n; i++) ok = g->c[i].id == w->c[i].id && memcmp(&g->c[i].l, &w->c[i].l, 4) == 0;
            if (r % 2) ok = ok && (w->n_finite == 0 ? g->sumexp == w->sumexp : fabs(g->sumexp - w->sumexp) <= 1e-9 * w->sumexp);
            else ok = ok && isnan(g->sumexp) && isnan(w->sumexp);
            if (!ok) { bad++; printf("MISMATCH dim %d row %d pass %d: n %d/%d nf %d/%d max %g/%g z %.17g/%.17g c0 %d/%d at %d/%d\n", dim, r, pass, g->n, w->n, g->n_finite, w->n_finite, g->max, w->max, g->sumexp, w->sumexp, g->c[0].id, w->c[0].id, g->at, w->at); }
        }
        }
        printf("dim %d done\n", dim); fflush(stdout);
    }
    printf("rows %ld bad %ld\n", n, bad);
    return bad != 0;
}
