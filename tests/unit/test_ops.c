/* Elementwise CPU ops against double-precision references. */
#include <float.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "backend/cpu/cpu_ops.h"
#include "backend/cpu/quant.h"

/* silu(g) * u on every ISA level, over [-100, 100] and the extremes: within
 * 4 float ulps (relative 5e-7) of the exact value, or 1e-35 absolute where
 * the result underflows. */
static void silu_mul_accuracy(void **state) {
    enum { N = 40007 };
    float *g = malloc(sizeof(float) * N), *u = malloc(sizeof(float) * N), *o = malloc(sizeof(float) * N);
    ag_cpu_isa levels[] = {AG_CPU_ISA_SCALAR, AG_CPU_ISA_AVX2, AG_CPU_ISA_AVX512};
    for (size_t l = 0; l < 3; l++) {
        if (ag_cpu_isa_set(levels[l]) != AG_OK) continue;
        for (int i = 0; i < N; i++) {
            g[i] = -100.0f + 200.0f * (float)i / (N - 1);
            u[i] = 1.0f + (float)(i % 7) * 0.25f;
            o[i] = g[i];
        }
        g[0] = -FLT_MAX, g[1] = FLT_MAX, g[2] = 0.0f, g[3] = -0.0f, g[4] = 1e-30f;
        for (int i = 0; i < 5; i++) o[i] = g[i], u[i] = 1.0f;
        ag_cpu_silu_mul(o, u, N);
        for (int i = 0; i < N; i++) {
            double x = g[i], ref = x / (1.0 + exp(-x)) * u[i];
            if (!isfinite(ref)) ref = x > 0 ? x * u[i] : 0.0;
            double err = fabs(o[i] - ref);
            if (!(err <= 5e-7 * fabs(ref) || err <= 1e-35))
                fail_msg("isa %s: silu(%.9g)*%g = %.9g, want %.9g", ag_cpu_isa_name(levels[l]), g[i], u[i], o[i], ref);
        }
    }
    assert_int_equal(ag_cpu_isa_set(ag_cpu_isa_best()), AG_OK);
    free(g), free(u), free(o);
}

/* An element's result does not depend on the length of the call or its
 * place in it: the model calls silu_mul on n_tok rows of n_ff at once, and
 * a token's activations must be the same whatever batch it is in (a
 * prompt's logits must not change with its chunking). n_ff = 172
 * (stories260K) leaves a tail of 4 when n_tok is odd. */
static void silu_mul_position_invariant(void **state) {
    enum { N = 172 * 7 };
    float *g = malloc(sizeof(float) * N), *u = malloc(sizeof(float) * N), *all = malloc(sizeof(float) * N);
    float  part[N];
    ag_cpu_isa levels[] = {AG_CPU_ISA_SCALAR, AG_CPU_ISA_AVX2, AG_CPU_ISA_AVX512};
    for (int i = 0; i < N; i++) g[i] = -12.0f + 24.0f * (float)((i * 7919) % N) / N, u[i] = 0.5f + (float)(i % 5) * 0.3f;
    for (size_t l = 0; l < 3; l++) {
        if (ag_cpu_isa_set(levels[l]) != AG_OK) continue;
        memcpy(all, g, sizeof(float) * N);
        ag_cpu_silu_mul(all, u, N);
        for (int rows = 1; rows <= 7; rows++) /* the first `rows` rows of 172 */
            for (int start = 0; start + 172 * rows <= N; start += 172) {
                int n = 172 * rows;
                memcpy(part, g + start, sizeof(float) * n);
                ag_cpu_silu_mul(part, u + start, (size_t)n);
                if (memcmp(part, all + start, sizeof(float) * n))
                    fail_msg("isa %s: silu_mul of %d rows at row %d differs from the whole call",
                             ag_cpu_isa_name(levels[l]), rows, start / 172);
            }
        for (int i = 0; i < N; i += 13) { /* alone */
            float one = g[i];
            ag_cpu_silu_mul(&one, u + i, 1);
            if (memcmp(&one, all + i, sizeof one)) fail_msg("isa %s: element %d alone differs", ag_cpu_isa_name(levels[l]), i);
        }
    }
    assert_int_equal(ag_cpu_isa_set(ag_cpu_isa_best()), AG_OK);
    free(g), free(u), free(all);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(silu_mul_accuracy), cmocka_unit_test(silu_mul_position_invariant)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
