/* CPU reference ops that are not matrix products: norms, rotary embedding,
 * activations, elementwise arithmetic. Written as plain loops the compiler
 * vectorises; they are a small share of a step next to the matmuls. */
#include "backend/cpu/cpu_ops.h"

#include <math.h>
#include <pthread.h>
#include <string.h>

#include "backend/cpu/quant.h"
#include "base/argmax.h"

void ag_cpu_rmsnorm(const float *x, const float *w, int n, int dim, float eps, float *out) {
    for (int r = 0; r < n; r++) {
        const float *xr = x + (size_t)r * dim;
        float *o = out + (size_t)r * dim;
        double ss = 0;
        for (int i = 0; i < dim; i++) ss += (double)xr[i] * xr[i];
        float s = (float)(1.0 / sqrt(ss / dim + eps));
        if (w)
            for (int i = 0; i < dim; i++) o[i] = xr[i] * s * w[i];
        else
            for (int i = 0; i < dim; i++) o[i] = xr[i] * s;
    }
}

void ag_cpu_layernorm(const float *x, const float *w, const float *b, int n, int dim, float eps, float *out) {
    for (int r = 0; r < n; r++) {
        const float *xr = x + (size_t)r * dim;
        float       *o = out + (size_t)r * dim;
        double       sum = 0;
        for (int i = 0; i < dim; i++) sum += xr[i];
        const float mean = (float)(sum / dim);
        double      ss = 0;
        for (int i = 0; i < dim; i++) ss += (double)(xr[i] - mean) * (xr[i] - mean);
        const float s = (float)(1.0 / sqrt(ss / dim + eps));
        for (int i = 0; i < dim; i++) {
            float v = (xr[i] - mean) * s;
            if (w) v *= w[i];
            if (b) v += b[i];
            o[i] = v;
        }
    }
}

void ag_cpu_rope(float *x, int n, int n_head, int head_dim, int rope_dim, const int32_t *pos, float base,
                 float freq_scale, bool neox) {
    const int half = rope_dim / 2;
    float cs[512], sn[512]; /* rope_dim <= head_dim <= 1024 */
    double inv_freq[512];   /* base^(-2i/rope_dim): the same for every token, pow is costly */
    for (int i = 0; i < half; i++) inv_freq[i] = pow((double)base, -2.0 * i / rope_dim);
    for (int t = 0; t < n; t++) {
        for (int i = 0; i < half; i++) {
            /* theta_i = pos * freq_scale * base^(-2i/rope_dim) */
            double theta = (double)pos[t] * freq_scale * inv_freq[i];
            cs[i] = (float)cos(theta);
            sn[i] = (float)sin(theta);
        }
        for (int hd = 0; hd < n_head; hd++) {
            float *v = x + ((size_t)t * n_head + hd) * head_dim;
            if (neox) {
                for (int i = 0; i < half; i++) {
                    float a = v[i], b = v[i + half];
                    v[i] = a * cs[i] - b * sn[i];
                    v[i + half] = a * sn[i] + b * cs[i];
                }
            } else {
                for (int i = 0; i < half; i++) {
                    float a = v[2 * i], b = v[2 * i + 1];
                    v[2 * i] = a * cs[i] - b * sn[i];
                    v[2 * i + 1] = a * sn[i] + b * cs[i];
                }
            }
        }
    }
}

void ag_cpu_rope_freqs(float *x, int n, int n_head, int head_dim, int rope_dim, const int32_t *pos, const float *freq,
                       float mscale, bool neox) {
    const int half = rope_dim / 2;
    float     cs[512], sn[512]; /* rope_dim <= head_dim <= 1024 */
    for (int t = 0; t < n; t++) {
        for (int i = 0; i < half; i++) {
            const double theta = (double)pos[t] * freq[i];
            cs[i] = (float)(cos(theta) * mscale);
            sn[i] = (float)(sin(theta) * mscale);
        }
        for (int hd = 0; hd < n_head; hd++) {
            float *v = x + ((size_t)t * n_head + hd) * head_dim;
            for (int i = 0; i < half; i++) {
                const int ia = neox ? i : 2 * i, ib = neox ? i + half : 2 * i + 1;
                const float a = v[ia], b = v[ib];
                v[ia] = a * cs[i] - b * sn[i];
                v[ib] = a * sn[i] + b * cs[i];
            }
        }
    }
}

void ag_cpu_add_bias(float *x, const float *b, int n, int dim) {
    for (int r = 0; r < n; r++)
        for (int i = 0; i < dim; i++) x[(size_t)r * dim + i] += b[i];
}

void ag_cpu_add(float *y, const float *x, size_t n) {
    for (size_t i = 0; i < n; i++) y[i] += x[i];
}

void ag_cpu_scale(float *x, float s, size_t n) {
    for (size_t i = 0; i < n; i++) x[i] *= s;
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>

/* e^x for 8 floats (Cephes' expf: Cody-Waite reduction by ln 2, degree-6
 * polynomial; within 2 ulp of expf over the clamped range [-87.3, 88.7],
 * which covers every x where silu needs it). */
__attribute__((target("avx2,fma"))) static inline __m256 exp8(__m256 x) {
    x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.3f)), _mm256_set1_ps(88.7f));
    __m256 fx = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(0.693359375f), x);
    x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(-2.12194440e-4f), x);
    __m256 y = _mm256_set1_ps(1.9875691500e-4f);
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.3981999507e-3f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(8.3334519073e-3f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(4.1665795894e-2f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.6666665459e-1f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(5.0000001201e-1f));
    y = _mm256_fmadd_ps(y, _mm256_mul_ps(x, x), _mm256_add_ps(x, _mm256_set1_ps(1.0f)));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(fx), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(y, _mm256_castsi256_ps(e));
}

__attribute__((target("avx2,fma"))) static inline __m256 silu_mul8(__m256 g, __m256 u) {
    __m256 e = exp8(_mm256_sub_ps(_mm256_setzero_ps(), g));
    return _mm256_mul_ps(_mm256_div_ps(g, _mm256_add_ps(_mm256_set1_ps(1.0f), e)), u);
}

/* Every element, the last n % 8 included, goes through the same lane-wise
 * arithmetic: an element's result must not depend on where it sits in the
 * array. The array is n_tok rows of n_ff, so a scalar (expf) tail would
 * round a token's last few elements differently depending on how many
 * tokens share the call (e.g. stories260K, n_ff 172), and a prompt's logits
 * would change with its chunking. */
__attribute__((target("avx2,fma"))) static void silu_mul_avx2(float *gate, const float *up, size_t n) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(gate + i, silu_mul8(_mm256_loadu_ps(gate + i), _mm256_loadu_ps(up + i)));
    if (i < n) {
        float g[8] = {0}, u[8] = {0};
        memcpy(g, gate + i, sizeof(float) * (n - i));
        memcpy(u, up + i, sizeof(float) * (n - i));
        _mm256_storeu_ps(g, silu_mul8(_mm256_loadu_ps(g), _mm256_loadu_ps(u)));
        memcpy(gate + i, g, sizeof(float) * (n - i));
    }
}
#endif

void ag_cpu_silu_mul(float *gate, const float *up, size_t n) {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    if (ag_cpu_isa_active() >= AG_CPU_ISA_AVX2) {
        silu_mul_avx2(gate, up, n);
        return;
    }
#endif
    for (size_t i = 0; i < n; i++) {
        float g = gate[i];
        gate[i] = g / (1.0f + expf(-g)) * up[i];
    }
}

/* GELU (tanh form) as the reference computes it: llama.cpp's CPU backend
 * looks GELU up in a table indexed by the fp16 value of x, holding fp16
 * results, with exact limits beyond |x| >= 10. We do the same (which is also
 * far faster than tanhf): the difference from exact GELU is ~1e-3 relative,
 * and in a quantized model such perturbations flip int8 roundings downstream
 * and add up (see tests/py/test_parity.py). */
static float     g_gelu_table[65536]; /* gelu(fp16 x) rounded to fp16, as float */
static pthread_once_t g_gelu_once = PTHREAD_ONCE_INIT;

static void gelu_table_init(void) {
    const float k = 0.7978845608028654f; /* sqrt(2/pi) */
    for (uint32_t h = 0; h < 65536; h++) {
        float x = ag_fp16_to_fp32((uint16_t)h);
        float y = 0.5f * x * (1.0f + tanhf(k * x * (1.0f + 0.044715f * x * x)));
        g_gelu_table[h] = ag_fp16_to_fp32(ag_fp32_to_fp16(y));
    }
}

void ag_cpu_gelu_mul(float *gate, const float *up, size_t n) {
    pthread_once(&g_gelu_once, gelu_table_init);
    uint16_t h[256];
    for (size_t i0 = 0; i0 < n; i0 += 256) {
        size_t m = n - i0 < 256 ? n - i0 : 256;
        ag_fp32_to_fp16_row(gate + i0, h, (int64_t)m);
        for (size_t j = 0; j < m; j++) {
            float g = gate[i0 + j];
            float y = g <= -10.0f ? 0.0f : g >= 10.0f ? g : g_gelu_table[h[j]];
            gate[i0 + j] = y * up[i0 + j];
        }
    }
}

void ag_cpu_argmax_rows(const float *x, int n, int dim, int32_t *out) {
    for (int r = 0; r < n; r++) {
        const int32_t i = ag_argmax_f32(x + (size_t)r * dim, dim);
        out[r] = i < 0 ? -2 : i;
    }
}
