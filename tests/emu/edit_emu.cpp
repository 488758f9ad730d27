/* edit_rows_k (src/backend/cuda/sample_edit.cuh) compiled unchanged on the
 * CPU under cuda_shim.h: output rows edited by the samplers' edits
 * (ag_logit_edit: bias, ban, repetition / frequency / presence penalties)
 * against ag_logit_edit_apply on the host, bit for bit. Raw values: random,
 * NaN, +-inf, +-FLT_MAX, +-0, tiny; edits: every flag combination, a
 * repetition penalty of 1 (skipped) and others, biases and subtrahends that
 * overflow. Grids smaller and larger than the records (grid-stride), no
 * records, and records past the pass's rows (skipped). mask_rows_k too:
 * rows with a bitmap (random; mostly allowed) and without. Exit status 1
 * on a mismatch (`make cuda-emu`). */
#include "cuda_shim.h"
#include "backend/cuda/sample_edit.cuh" /* the kernels, as sample.cu compiles them */

static uint64_t st = 11;
static uint64_t xr() { st ^= st << 13; st ^= st >> 7; st ^= st << 17; return st; }
static float uni() { return (float)((xr() >> 11) * 0x1p-53); }

static float raw_value() {
    static const float special[] = {NAN, INFINITY, -INFINITY, FLT_MAX, -FLT_MAX, 0.0f, -0.0f, 1e-38f, -3e38f, 3e38f};
    if (xr() % 4 == 0) return special[xr() % 10];
    return (uni() - 0.5f) * 40.0f;
}

static ag_logit_edit random_edit(int32_t id) {
    static const float reps[] = {1.0f, 1.3f, 0.7f, 1e-30f, 3e30f};
    static const float vals[] = {0.5f, -2.25f, 3e38f, -3e38f, 1e-3f, 0.0f, -0.0f, 7.0f};
    ag_logit_edit e = {id, (uint32_t)(xr() % 8), vals[xr() % 8] * (uni() + 0.5f), reps[xr() % 5],
                       vals[xr() % 8] * (uni() + 0.5f)};
    return e;
}

int main(int argc, char **argv) {
    (void)argc, (void)argv;
    const int dims[] = {7, 300, 4099};
    long bad = 0, edits = 0;
    for (int di = 0; di < 3; di++)
        for (int grid = 1; grid <= 3; grid += 2) {
            const int dim = dims[di], R = 5, n_rows = 4; /* row 4's records lie past the pass's rows */
            std::vector<float> x((size_t)R * dim), want;
            for (float &v : x) v = raw_value();
            want = x;
            std::vector<int32_t> buf(EDIT_HEAD);
            int32_t n = 0;
            for (int r = 0; r < R; r++) {
                std::vector<int32_t> ids;
                for (int i = 0; i < dim; i++) /* each token at most once a row */
                    if (xr() % 3 == 0 || dim == 7) ids.push_back(i);
                for (int32_t id : ids) {
                    edit_rec q = {r, random_edit(id)};
                    const int32_t *w = (const int32_t *)&q;
                    buf.insert(buf.end(), w, w + sizeof q / sizeof(int32_t));
                    if (r < n_rows) want[(size_t)r * dim + id] = ag_logit_edit_apply(x[(size_t)r * dim + id], &q.e);
                    n++;
                }
            }
            buf[0] = n, buf[1] = 0;
            edits += n;
            /* no records: nothing changes */
            std::vector<float> y = x;
            std::vector<int32_t> none(EDIT_HEAD, 0);
            emu_launch(edit_rows_k, grid, 64, y.data(), n_rows, dim, (const int32_t *)none.data());
            if (memcmp(y.data(), x.data(), sizeof(float) * x.size())) { bad++; printf("MISMATCH dim %d: no records changed the rows\n", dim); }
            emu_launch(edit_rows_k, grid, 64, x.data(), n_rows, dim, (const int32_t *)buf.data());
            for (size_t i = 0; i < x.size(); i++)
                if (memcmp(&x[i], &want[i], sizeof(float))) {
                    bad++;
                    printf("MISMATCH dim %d grid %d row %zu id %zu: %a, want %a\n", dim, grid, i / dim, i % dim, x[i], want[i]);
                }
        }
    /* mask_rows_k: rows with a bitmap get -inf where it has no bit (the
     * last word partly past the row), rows without keep their values */
    long masked = 0;
    const int mdims[] = {7, 300, 4099, 70001}; /* (70001: three slices of MASK_WORDS words) */
    for (int di = 0; di < 4; di++) {
        const int dim = mdims[di], R = 3, words = (dim + 31) / 32, S = (words + MASK_WORDS - 1) / MASK_WORDS;
        std::vector<float>    x((size_t)R * dim), want;
        std::vector<uint32_t> buf((size_t)R + 2 * (size_t)words, 0);
        for (float &v : x) v = raw_value();
        want = x;
        buf[0] = 2, buf[2] = 1; /* row 1: none; row 2's bitmap first, row 0's second */
        for (int r = 0; r < R; r += 2)
            for (int w = 0; w < words; w++) {
                const uint32_t a = r == 0 ? (uint32_t)xr() : (w % 3 ? 0xFFFFFFFFu : 0x80000001u);
                buf[(size_t)R + (size_t)(buf[r] - 1) * words + w] = a;
                for (int b = 0; b < 32 && w * 32 + b < dim; b++)
                    if (!(a >> b & 1u)) want[(size_t)r * dim + w * 32 + b] = -INFINITY, masked++;
            }
        emu_launch(mask_rows_k, R * S, 64, x.data(), R, S, dim, words, (const uint32_t *)buf.data());
        for (size_t i = 0; i < x.size(); i++)
            if (memcmp(&x[i], &want[i], sizeof(float))) {
                bad++;
                printf("MISMATCH mask dim %d row %zu id %zu: %a, want %a\n", dim, i / dim, i % dim, x[i], want[i]);
            }
    }
    printf("edits %ld masked %ld bad %ld\n", edits, masked, bad);
    return bad != 0;
}
