/* The greedy sampling rule over a row of floats, in one place: the sampler
 * uses it on the host, the CPU backend for its argmax op (the CUDA kernel
 * argmax_rows_k implements the same rule). */
#ifndef AG_BASE_ARGMAX_H
#define AG_BASE_ARGMAX_H

#include <stdint.h>

/* The lowest index among x[0..n)'s largest values, +inf and FLT_MAX counted
 * alike, NaN skipped; -1 when no value is finite (or n <= 0). */
int32_t ag_argmax_f32(const float *x, int32_t n);

#endif
