/* Helpers shared by the quantized-kernel tests: a seeded generator and
 * random but valid weight rows of any type. Header-only (static), included
 * after cmocka.h by each test program. */
#ifndef AG_TESTS_QUANT_TESTUTIL_H
#define AG_TESTS_QUANT_TESTUTIL_H

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/quant.h"

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static uint64_t rnd(void) {
    /* splitmix64 */
    uint64_t z = (rng_state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
static double urand(void) { return (double)(rnd() >> 11) * 0x1p-53; }
static float  frand(float lo, float hi) { return lo + (hi - lo) * (float)urand(); }
static float  nrand(void) {
    double u = urand() + 1e-300, v = urand();
    return (float)(sqrt(-2 * log(u)) * cos(6.283185307179586 * v));
}

static int scale_offsets(uint32_t t, int off[2]) {
    switch (t) {
    case AG_TYPE_Q4_0: case AG_TYPE_Q5_0: case AG_TYPE_Q8_0: off[0] = 0; return 1;
    case AG_TYPE_Q4_1: case AG_TYPE_Q5_1: case AG_TYPE_Q4_K: case AG_TYPE_Q5_K: off[0] = 0, off[1] = 2; return 2;
    case AG_TYPE_Q2_K: off[0] = 80, off[1] = 82; return 2;
    case AG_TYPE_Q3_K: off[0] = 108; return 1;
    case AG_TYPE_Q6_K: off[0] = 208; return 1;
    }
    return 0;
}

/* A random but valid weight row of n elements (random quant bits, finite
 * scales of either sign). Returns a malloc'd buffer. */
static uint8_t *random_weights(uint32_t t, int64_t n, size_t *bytes_out) {
    size_t   bytes = ag_quant_row_bytes(t, n);
    uint8_t *w = malloc(bytes + 1);
    assert_non_null(w);
    if (t == AG_TYPE_F32) {
        for (int64_t i = 0; i < n; i++) {
            float f = nrand() * 0.1f;
            memcpy(w + 4 * i, &f, 4);
        }
    } else if (t == AG_TYPE_F16 || t == AG_TYPE_BF16) {
        for (int64_t i = 0; i < n; i++) {
            float    f = nrand() * 0.1f;
            uint16_t h = t == AG_TYPE_F16 ? ag_fp32_to_fp16(f) : ag_fp32_to_bf16(f);
            memcpy(w + 2 * i, &h, 2);
        }
    } else {
        for (size_t i = 0; i < bytes; i++) w[i] = (uint8_t)rnd();
        uint32_t be, bb;
        ag_quant_block(t, &be, &bb);
        int off[2], k = scale_offsets(t, off);
        for (size_t b = 0; b < bytes / bb; b++)
            for (int j = 0; j < k; j++) {
                float    s = frand(0.001f, 0.05f) * (rnd() & 1 ? -1.0f : 1.0f);
                uint16_t h = ag_fp32_to_fp16(s);
                memcpy(w + b * bb + off[j], &h, 2);
            }
        if (t == AG_TYPE_MXFP4) /* the E8M0 byte: scales 2^-11 .. 2^-6, so |w| <= 0.19 */
            for (size_t b = 0; b < bytes / bb; b++) w[b * bb] = (uint8_t)(117 + rnd() % 6);
    }
    if (bytes_out) *bytes_out = bytes;
    return w;
}

#endif
