/* CPU implementations of the elementwise and normalisation ops of
 * backend.h (see there for the contracts). Single-threaded; pure functions
 * of their arguments. */
#ifndef AG_BACKEND_CPU_OPS_H
#define AG_BACKEND_CPU_OPS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

void ag_cpu_rmsnorm(const float *x, const float *w, int n, int dim, float eps, float *out);
void ag_cpu_layernorm(const float *x, const float *w, const float *b, int n, int dim, float eps, float *out);
void ag_cpu_rope(float *x, int n, int n_head, int head_dim, int rope_dim, const int32_t *pos, float base,
                 float freq_scale, bool neox);
/* backend.h's rope_freqs: pair i turns by pos · freq[i], scaled by mscale. */
void ag_cpu_rope_freqs(float *x, int n, int n_head, int head_dim, int rope_dim, const int32_t *pos, const float *freq,
                       float mscale, bool neox);
void ag_cpu_add_bias(float *x, const float *b, int n, int dim);
/* out[i] = the lowest index among row i's largest values (+inf and FLT_MAX
 * alike, NaN skipped), -2 when no value of the row is finite; n rows of dim. */
void ag_cpu_argmax_rows(const float *x, int n, int dim, int32_t *out);
void ag_cpu_add(float *y, const float *x, size_t n);
void ag_cpu_scale(float *x, float s, size_t n);
void ag_cpu_silu_mul(float *gate, const float *up, size_t n);
void ag_cpu_gelu_mul(float *gate, const float *up, size_t n);

#endif
