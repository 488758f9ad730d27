/* Quantized weight formats on the CPU: dequantization, activation
 * quantization, and dot products that work block by block without ever
 * dequantizing a weight matrix.
 *
 * Weight types are ggml's (ag_tensor_type from gguf/gguf.h, which GGUF
 * stores): F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, MXFP4, Q2_K, Q3_K,
 * Q4_K, Q5_K, Q6_K, plus Q8_K (an activation format). A row of n elements of a
 * type with block size B (1 for F32/F16/BF16, 32 for Q4_0..Q8_0 and MXFP4, 256 for the
 * K-quants) is n/B consecutive blocks; n must be a multiple of B.
 *
 * A dot product pairs a weight row with an activation row in the activation
 * format its weight type asks for (ag_quant_act_format):
 *   F32/F16/BF16 weights           -> AG_ACT_F32 (plain floats)
 *   Q4_0/Q4_1/Q5_0/Q5_1/Q8_0/MXFP4 -> AG_ACT_Q8A (32-element int8 blocks
 *                                     with a float scale and block sum)
 *   Q2_K..Q6_K                     -> AG_ACT_Q8K (ggml's Q8_K)
 * so a matmul quantizes its activations once and reuses them for every
 * weight row (see matmul.h).
 *
 * Kernels exist per instruction set (portable scalar, AVX2+FMA+F16C,
 * AVX-512 F/BW/VL/VNNI); the best one the CPU supports is chosen at first
 * use, or the one named by AUGUR_CPU_ISA=scalar|avx2|avx512 (clamped to
 * what the CPU has). Results of different ISAs agree to float rounding: the
 * integer part of every block product is exact in all of them.
 *
 * All functions are thread-safe and allocate nothing. Nothing aborts on bad
 * input: an unknown or unsupported type gives AG_ERR_UNSUPPORTED, a bad
 * length AG_ERR_INVALID. Weight/activation pointers may have any alignment. */
#ifndef AG_BACKEND_CPU_QUANT_H
#define AG_BACKEND_CPU_QUANT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/status.h"
#include "gguf/gguf.h"

/* ---- fp16 / bf16 ---- */

/* Exact fp16 -> fp32 (subnormals, inf, NaN kept). Portable C. */
float ag_fp16_to_fp32(uint16_t h);
/* fp32 -> fp16, round to nearest even; overflow gives inf, NaN stays NaN. */
uint16_t ag_fp32_to_fp16(float f);
/* Row versions (src and dst must not overlap): F16C when the active ISA is
 * not scalar and the CPU has it, with results identical to the scalar ones
 * (tested exhaustively for fp16 -> fp32). */
void ag_fp16_to_fp32_row(const uint16_t *src, float *dst, int64_t n);
void ag_fp32_to_fp16_row(const float *src, uint16_t *dst, int64_t n);

/* bf16 is the top half of an fp32: widening is exact. Narrowing rounds to
 * nearest even and turns NaN into a quiet NaN (as ggml does). */
float    ag_bf16_to_fp32(uint16_t h);
uint16_t ag_fp32_to_bf16(float f);
void     ag_bf16_to_fp32_row(const uint16_t *src, float *dst, int64_t n);
void     ag_fp32_to_bf16_row(const float *src, uint16_t *dst, int64_t n);

/* ---- types ---- */

/* True for the types ag_dequant_row handles (listed above, Q8_K included). */
bool ag_quant_supported(uint32_t type);
/* True for the weight types ag_vec_dot / ag_matmul handle (all of the
 * above except Q8_K, which is only an activation format). */
bool ag_quant_dot_supported(uint32_t type);
/* Elements and bytes per block; AG_ERR_UNSUPPORTED for other types. */
ag_status ag_quant_block(uint32_t type, uint32_t *block_elems, uint32_t *block_bytes);
/* Bytes of a row of n elements; 0 if the type is unsupported, n <= 0, or n
 * is not a multiple of the block size. */
size_t ag_quant_row_bytes(uint32_t type, int64_t n);

/* Expands n elements (n/B blocks) of `type` at src into n floats at dst.
 * Results equal gguf-py's gguf.quants.dequantize bit for bit (same
 * operations in the same float32 order; tested on random and real blocks).
 * Returns AG_ERR_UNSUPPORTED for other types, AG_ERR_INVALID when n is not
 * a positive multiple of the block size or a pointer is NULL. */
ag_status ag_dequant_row(uint32_t type, const void *src, float *dst, int64_t n);

/* ---- activations ---- */

typedef enum {
    AG_ACT_F32 = 0, /* plain floats */
    AG_ACT_Q8A = 1, /* 32-element blocks: float d, float s = d*Σq, int8 q[32] (40 bytes) */
    AG_ACT_Q8K = 2, /* ggml's Q8_K: float d, int8 q[256], int16 bsums[16] (292 bytes) */
} ag_act_format;

/* The activation format a weight type's dot product takes. */
ag_status ag_quant_act_format(uint32_t w_type, ag_act_format *out);
/* Bytes of an activation row of n elements; 0 when n <= 0 or not a multiple
 * of the format's block size (32 for Q8A, 256 for Q8K). */
size_t ag_act_row_bytes(ag_act_format f, int64_t n);
/* Quantizes n floats into an activation row at dst (ag_act_row_bytes(f, n)
 * bytes, caller-owned). Per block: d = max|x|/127, q = round-to-nearest-even
 * (x/d), so |x - d*q| <= d/2. AG_ACT_F32 copies. Non-finite input gives
 * unspecified (but memory-safe) values. */
ag_status ag_quantize_act_row(ag_act_format f, const float *x, void *dst, int64_t n);

/* ---- dot products ---- */

/* *out = Σ_i w[i] * x[i] over n elements: w a weight row of w_type, x an
 * activation row in ag_quant_act_format(w_type). Uses the active ISA. */
ag_status ag_vec_dot(uint32_t w_type, int64_t n, const void *w, const void *x, float *out);

/* ---- instruction set ---- */

typedef enum {
    AG_CPU_ISA_SCALAR = 0, /* portable C */
    AG_CPU_ISA_AVX2 = 1,   /* AVX2 + FMA + F16C */
    AG_CPU_ISA_AVX512 = 2, /* AVX-512 F/BW/VL/VNNI on top of AVX2 */
} ag_cpu_isa;

/* The best ISA this CPU (and build) supports. */
ag_cpu_isa ag_cpu_isa_best(void);
/* The ISA the kernels use now. */
ag_cpu_isa ag_cpu_isa_active(void);
/* Switches the kernels (tests, benchmarks). AG_ERR_UNSUPPORTED if the CPU
 * lacks `isa`. Calls running concurrently finish with the old kernels. */
ag_status   ag_cpu_isa_set(ag_cpu_isa isa);
const char *ag_cpu_isa_name(ag_cpu_isa isa); /* "scalar", "avx2", "avx512" */

#endif
