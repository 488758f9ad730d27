/* argmax_rows_k and pick_rows_k (src/backend/cuda/sample_pick.cuh) compiled
 * unchanged on the CPU under cuda_shim.h, one 1024-thread block a row: each
 * row's argmax against ag_argmax_f32 (exactly) and each row's picked token
 * against ag_pick_f32 with the same draw, also through the split grid
 * (pick_max_k, pick_split_k: 3 or 5 and 32 slices a row). The kernels sum the weights in
 * another association, so a draw within 1e-9 (relative) of a boundary of
 * the row's cumulative weights is redrawn, as the harness does. Rows of 7,
 * 1000, 1024 (float4 loads), 4099 and 50001 values: random, ties, NaN, +inf
 * beside FLT_MAX, -inf, nothing finite, one finite value. Exit status 1 on
 * a mismatch (`make cuda-emu`). */
#include "cuda_shim.h"
#include "backend/cuda/sample_pick.cuh" /* the kernels, as sample.cu compiles them */

static uint64_t st = 7;
static uint64_t xr() { st ^= st << 13; st ^= st >> 7; st ^= st << 17; return st; }
static float gs() { double u = (xr() >> 11) * 0x1p-53 + 1e-12, v = (xr() >> 11) * 0x1p-53; return (float)(sqrt(-2 * log(u)) * cos(6.2831853 * v)); }

/* Whether u times the row's total weight lies within 1e-9 of a boundary. */
static bool near_boundary(const float *row, int dim, float inv_t, double u) {
    float m = -INFINITY;
    for (int i = 0; i < dim; i++) m = ag_logit_sanitize(row[i]) > m ? ag_logit_sanitize(row[i]) : m;
    if (!(m > -INFINITY)) return false;
    double sum = 0, cum = 0, near = INFINITY;
    for (int i = 0; i < dim; i++) sum += (double)expf((ag_logit_sanitize(row[i]) - m) * inv_t);
    for (int i = 0; i < dim; i++) {
        cum += (double)expf((ag_logit_sanitize(row[i]) - m) * inv_t);
        near = fmin(near, fabs(cum - u * sum));
    }
    return near <= 1e-9 * sum;
}

int main(int argc, char **argv) {
    const int dims[] = {7, 1000, 1024, 4099, 50001};
    const int nd = argc > 1 && atoi(argv[1]) < 5 ? atoi(argv[1]) : 5;
    long bad = 0, n = 0;
    for (int di = 0; di < nd; di++) {
        const int dim = dims[di], R = 8;
        std::vector<float> x((size_t)R * dim);
        std::vector<int32_t> draws(3 * R), got_a(R), got_p(R);
        for (int r = 0; r < R; r++) {
            float *row = &x[(size_t)r * dim];
            for (int i = 0; i < dim; i++) {
                switch (r) {
                case 1: row[i] = (float)(xr() % 5) * 0.5f; break;                   /* ties */
                case 2: row[i] = i == dim / 3 ? 1.0f : NAN; break;                  /* one finite value */
                case 3: row[i] = (i % 3) ? -INFINITY : NAN; break;                  /* nothing finite */
                case 4: row[i] = i == 1 ? INFINITY : i == dim - 1 ? FLT_MAX : gs(); break;
                case 5: row[i] = (i % 2) ? -INFINITY : gs() * 0.1f; break;
                default: row[i] = gs() * 3; break;
                }
            }
            const float inv_t[] = {1.0f, 0.5f, 2.0f, 1.3f};
            double u;
            do u = (double)(xr() >> 11) * 0x1p-53;
            while (near_boundary(row, dim, inv_t[r % 4], u));
            int32_t w[2];
            memcpy(w, &u, sizeof w);
            draws[3 * r] = w[0], draws[3 * r + 1] = w[1];
            memcpy(&draws[3 * r + 2], &inv_t[r % 4], 4);
        }
        emu_launch(argmax_rows_k, R, 1024, (const float *)x.data(), dim, got_a.data());
        emu_launch(pick_rows_k, R, 1024, (const float *)x.data(), dim, (const int32_t *)draws.data(), got_p.data());
        /* split: 0, one block a row (pick_rows_k); else pick_max_k and pick_split_k with S slices
         * a row on 256 threads (empty slices at dim 7) */
        const int slices[] = {0, dim < 100 ? 5 : 3, 32};
        for (int split = 0; split < 3; split++) {
        const int S = slices[split];
        if (S) {
            std::vector<float>  sm((size_t)R * S, NAN), m(R, NAN);
            std::vector<double> part((size_t)R * S * 256, NAN), tot((size_t)R * S, NAN);
            std::vector<int>    cnt(R, 0);
            std::fill(got_p.begin(), got_p.end(), -99);
            emu_launch(pick_max_k, R * S, 256, (const float *)x.data(), dim, S, sm.data(), cnt.data(), m.data());
            emu_launch(pick_split_k, R * S, 256, (const float *)x.data(), dim, S, (const int32_t *)draws.data(),
                       (const float *)m.data(), part.data(), tot.data(), cnt.data(), got_p.data());
            for (int r = 0; r < R; r++)
                if (cnt[r] != 0) { bad++; printf("MISMATCH dim %d row %d S %d: counter left at %d\n", dim, r, S, cnt[r]); }
        }
        for (int r = 0; r < R; r++) {
            const float *row = &x[(size_t)r * dim];
            double u;
            float  it;
            memcpy(&u, &draws[3 * r], 8);
            memcpy(&it, &draws[3 * r + 2], 4);
            int32_t wa = ag_argmax_f32(row, dim), wp = ag_pick_f32(row, dim, it, u);
            wa = wa < 0 ? -2 : wa, wp = wp < 0 ? -2 : wp;
            n++;
            if (got_a[r] != wa || got_p[r] != wp) {
                bad++;
                printf("MISMATCH dim %d row %d slices %d: argmax %d/%d pick %d/%d\n", dim, r, S, got_a[r], wa, got_p[r], wp);
            }
        }
        }
        printf("dim %d done\n", dim);
        fflush(stdout);
    }
    printf("rows %ld bad %ld\n", n, bad);
    return bad != 0;
}
