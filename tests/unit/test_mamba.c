/* Unit tests for the CPU mamba2 op (backend/cpu/mamba.c): against a
 * double-precision reference written from the definition (conv over the
 * state and the row, SiLU, the scan with softplus dt and the per-head
 * decay, D skip, the SiLU(z) gate, the grouped RMSNorm), over two sequences
 * whose rows interleave in the batch; a sequence's rows one call at a time
 * give the bits of one call over all of them (the state carries exactly);
 * snapshots hold the state after their row. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "backend/cpu/mamba.h"

enum { K = 4, DI = 32, DS = 16, NH = 4, NG = 2, C = DI + 2 * NG * DS, P = 2 * DI + 2 * NG * DS + NH };
enum { STATE = (K - 1) * C + DI * DS };

static uint64_t g_rng = 12345;
static float    frand(void) {
    g_rng = g_rng * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((g_rng >> 40) * 0x1p-24) * 2.0f - 1.0f;
}

static float w_conv[C * K], w_conv_b[C], w_dt_b[NH], w_a[NH], w_d[NH], w_norm[DI];

static ag_ssm_shape shape(void) {
    for (int i = 0; i < C * K; i++) w_conv[i] = frand();
    for (int i = 0; i < C; i++) w_conv_b[i] = 0.1f * frand();
    for (int h = 0; h < NH; h++) w_dt_b[h] = frand(), w_a[h] = -1.0f - frand(), w_d[h] = 1.0f + 0.5f * frand();
    for (int i = 0; i < DI; i++) w_norm[i] = 1.0f + 0.1f * frand();
    return (ag_ssm_shape){.conv_w = w_conv, .conv_b = w_conv_b, .dt_b = w_dt_b, .a = w_a, .d = w_d,
                          .norm_w = w_norm, .d_conv = K, .d_inner = DI, .d_state = DS, .n_head = NH,
                          .n_group = NG, .eps = 1e-6f};
}

static double dsilu(double x) { return x / (1 + exp(-x)); }

/* One row through a double state (conv [K-1][C], ssm [DI][DS]). */
static void ref_row(const float *zx, double *conv, double *ssm, double *y) {
    double xc[C];
    for (int c = 0; c < C; c++) {
        double s = w_conv_b[c];
        for (int k = 0; k < K - 1; k++) s += conv[k * C + c] * w_conv[c * K + k];
        s += zx[DI + c] * w_conv[c * K + K - 1];
        xc[c] = dsilu(s);
    }
    memmove(conv, conv + C, sizeof(double) * (K - 2) * C);
    for (int c = 0; c < C; c++) conv[(K - 2) * C + c] = zx[DI + c];
    const int hd = DI / NH;
    for (int h = 0; h < NH; h++) {
        const double dt = zx[2 * DI + 2 * NG * DS + h] + w_dt_b[h], sp = dt <= 20 ? log1p(exp(dt)) : dt;
        const double dA = exp(sp * w_a[h]);
        const int    g = h / (NH / NG);
        for (int i = 0; i < hd; i++) {
            const int ii = h * hd + i;
            double    sum = 0;
            for (int k = 0; k < DS; k++) {
                ssm[ii * DS + k] = ssm[ii * DS + k] * dA + xc[DI + g * DS + k] * xc[ii] * sp;
                sum += ssm[ii * DS + k] * xc[DI + NG * DS + g * DS + k];
            }
            y[ii] = (sum + xc[ii] * w_d[h]) * dsilu(zx[ii]);
        }
    }
    for (int g = 0; g < NG; g++) {
        double ss = 0;
        const int gs = DI / NG;
        for (int c = 0; c < gs; c++) ss += y[g * gs + c] * y[g * gs + c];
        const double sc = 1 / sqrt(ss / gs + 1e-6);
        for (int c = 0; c < gs; c++) y[g * gs + c] *= sc * w_norm[g * gs + c];
    }
}

static void matches_reference_and_carries_state(void **unused) {
    (void)unused;
    const ag_ssm_shape sh = shape();
    enum { N = 8 };
    float zx[N * P];
    for (int i = 0; i < N * P; i++) zx[i] = frand();
    /* rows 0,2,3,5,7 are sequence A's, 1,4,6 sequence B's */
    const int32_t ra[] = {0, 2, 3, 5, 7}, rb[] = {1, 4, 6};
    float *sa = calloc(STATE, sizeof(float)), *sb = calloc(STATE, sizeof(float));
    float *snaps = calloc(5 * STATE, sizeof(float));
    float *snap_a[5] = {NULL, snaps, NULL, snaps + 3 * STATE, snaps + 4 * STATE};
    ag_ssm_run runs[2] = {{ra, 5, sa, snap_a}, {rb, 3, sb, NULL}};
    float y[N * DI];
    assert_int_equal(ag_cpu_mamba2(NULL, &sh, zx, runs, 2, y), AG_OK);
    /* the reference, sequence by sequence */
    double conv_a[(K - 1) * C] = {0}, ssm_a[DI * DS] = {0}, conv_b[(K - 1) * C] = {0}, ssm_b[DI * DS] = {0};
    for (int s = 0; s < 2; s++) {
        const int32_t *rows = s ? rb : ra;
        for (int t = 0; t < (s ? 3 : 5); t++) {
            double yr[DI];
            ref_row(zx + rows[t] * P, s ? conv_b : conv_a, s ? ssm_b : ssm_a, yr);
            for (int i = 0; i < DI; i++) assert_true(fabs(yr[i] - y[rows[t] * DI + i]) < 1e-4 * (1 + fabs(yr[i])));
            if (!s && snap_a[t]) /* the snapshot is the state after this row */
                for (int i = 0; i < DI * DS; i++)
                    assert_true(fabs(snap_a[t][(K - 1) * C + i] - ssm_a[i]) < 1e-4 * (1 + fabs(ssm_a[i])));
        }
    }
    for (int i = 0; i < DI * DS; i++) assert_true(fabs(sa[(K - 1) * C + i] - ssm_a[i]) < 1e-4 * (1 + fabs(ssm_a[i])));
    /* A's rows one call each, through a fresh state: the same bits */
    float *s1 = calloc(STATE, sizeof(float));
    for (int t = 0; t < 5; t++) {
        float         y1[N * DI];
        ag_ssm_run    one = {&ra[t], 1, s1, NULL};
        assert_int_equal(ag_cpu_mamba2(NULL, &sh, zx, &one, 1, y1), AG_OK);
        assert_memory_equal(y1 + ra[t] * DI, y + ra[t] * DI, sizeof(float) * DI);
    }
    assert_memory_equal(s1, sa, sizeof(float) * STATE);
    assert_memory_equal(snap_a[4], sa, sizeof(float) * STATE);
    free(sa);
    free(sb);
    free(s1);
    free(snaps);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(matches_reference_and_carries_state)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
