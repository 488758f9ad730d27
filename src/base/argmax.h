/* The sampler's two rules that need nothing but a row of floats, in one
 * place: the greedy rule (the sampler on the host, the CPU backend's argmax
 * op; the CUDA kernel argmax_rows_k implements it too) and the temperature
 * rule without truncation (the sampler on the host, the backends' pick op). */
#ifndef AG_BASE_ARGMAX_H
#define AG_BASE_ARGMAX_H

#include <float.h>
#include <math.h>
#include <stdint.h>

/* The sampler's view of a logit: NaN as -inf (never drawn), +inf as
 * FLT_MAX (so weights stay finite). */
static inline float ag_logit_sanitize(float l) {
    if (!(l > -INFINITY)) return -INFINITY; /* NaN too */
    return l == INFINITY ? FLT_MAX : l;
}

/* The lowest index among x[0..n)'s largest values, +inf and FLT_MAX counted
 * alike, NaN skipped; -1 when no value is finite (or n <= 0). */
int32_t ag_argmax_f32(const float *x, int32_t n);

/* The token the sampler draws from softmax(x / T) with its uniform u in
 * [0, 1), when nothing truncates the row: the values sanitized (NaN -> -inf,
 * +inf -> FLT_MAX), m their max, weights w_i = (double)expf((x_i - m) *
 * inv_temp) summed in index order, and the first index (with w_i > 0) at
 * which the running sum exceeds u times the total; the last index with a
 * weight if rounding leaves u times the total at the end. -1 when no value
 * is finite (or n <= 0). ag_sampler_sample gives the same token for such a
 * sampler and the same u (tests/unit/test_sample.c). */
int32_t ag_pick_f32(const float *x, int32_t n, float inv_temp, double u);

/* What a backend needs to draw a sampler's next token with ag_pick_f32: the
 * sampler's uniform u, taken from its RNG ahead (ag_sampler_draw_pick), and
 * 1/T. */
typedef struct {
    double u;
    float  inv_temp;
} ag_pick;

#endif
