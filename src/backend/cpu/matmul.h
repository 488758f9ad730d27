/* CPU matrix multiplication with quantized weights:
 *
 *     Y[n_tok][n_out] = X[n_tok][n_in] · W[n_out][n_in]^T
 *
 * W is a weight tensor as GGUF stores it: n_out rows of n_in elements
 * (ne[0] = n_in contiguous), in any type with ag_quant_dot_supported(),
 * rows packed back to back (ag_quant_row_bytes(type, n_in) bytes each).
 * X and Y are float32, row-major with leading dimensions ldx and ldy (in
 * floats), so callers can read from and write into slices of wider buffers.
 *
 * X is quantized once per call to the weight type's activation format (see
 * quant.h), then every weight row is multiplied with up to 4 tokens at a time
 * (each weight block is loaded and unpacked once per 4 tokens; Q4_K / Q6_K
 * windows of a few tokens: once for all, ag_matmul_decode_panel_min), rows
 * split across the thread pool. With n_tok == 1 (decode) this is a matvec that
 * streams the weights once. Results are the quantized dot products of
 * quant.h (the same numbers as ag_vec_dot, up to float summation order).
 *
 * Thread-safety: calls are independent; a pool serializes concurrent runs.
 * Nothing is kept between calls. Never aborts on bad input. */
#ifndef AG_BACKEND_CPU_MATMUL_H
#define AG_BACKEND_CPU_MATMUL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "backend/cpu/quant.h"
#include "base/status.h"
#include "base/threadpool.h"

/* Scratch bytes ag_matmul needs for (w_type, n_in, n_tok): the quantized
 * activations (0 for F32/F16/BF16 weights, which use X as is). 0 also for
 * invalid arguments. */
size_t ag_matmul_scratch_size(uint32_t w_type, int64_t n_in, int64_t n_tok);

/* Y = X · W^T as above. `pool` may be NULL (single-threaded). `scratch` is
 * caller-owned memory of scratch_size bytes used during the call (e.g. from
 * a per-step arena); if it is NULL or smaller than ag_matmul_scratch_size(),
 * the call allocates (and frees) its own, and may fail with AG_ERR_NOMEM.
 * n_tok == 0 or n_out == 0 is a no-op. Y must not overlap X or W.
 * Errors: AG_ERR_UNSUPPORTED (type), AG_ERR_INVALID (n_in not a positive
 * multiple of the block size, negative sizes, ldx < n_in, ldy < n_out, NULL
 * pointers), AG_ERR_NOMEM. */
ag_status ag_matmul(ag_threadpool *pool, uint32_t w_type, const void *w, int64_t n_out, int64_t n_in,
                    const float *x, int64_t ldx, int64_t n_tok, float *y, int64_t ldy, void *scratch,
                    size_t scratch_size);

/* The same in two steps, so that several weight matrices that read the same
 * X (Q/K/V, gate/up) share one quantization:
 *
 * ag_matmul_quantize_x() converts X into `xq` (n_tok rows of
 * ag_act_row_bytes(fmt, n_in) bytes, caller-owned, xq_size bytes),
 * splitting rows across the pool. ag_matmul_xq() then multiplies W (whose
 * ag_quant_act_format must be `fmt`) with it; for AG_ACT_F32 the quantized
 * form is a plain copy, and ag_matmul() is the cheaper call. */
ag_status ag_matmul_quantize_x(ag_threadpool *pool, ag_act_format fmt, const float *x, int64_t ldx,
                               int64_t n_tok, int64_t n_in, void *xq, size_t xq_size);
/* Prompt rows: the same product through the batched kernels (AMX tiles
 * where the CPU has them, else AVX-512 VNNI tiles or AVX2 token panels,
 * else the dot kernels).
 * A token's result depends only on its own X row, never on n_tok or its
 * place in the batch; but it differs (float summation order, activation
 * blocking) from ag_matmul()'s, which decode and verify rows use. The model
 * keeps the two apart so that the KV of a prompt is the same however the
 * prompt was chunked, and a decoded token's logits the same whatever else
 * was decoding (see ag_batch.n_prompt). Errors as ag_matmul(). */
size_t    ag_matmul_prompt_scratch_size(ag_threadpool *pool, uint32_t w_type, int64_t n_in, int64_t n_tok);
/* packed: NULL, or the weight's ag_amx_pack copy (matmul_amx.h), used by
 * the AMX path for Q4_K / Q6_K instead of unpacking w per call. */
ag_status ag_matmul_prompt(ag_threadpool *pool, uint32_t w_type, const void *w, const void *packed, int64_t n_out,
                           int64_t n_in, const float *x, int64_t ldx, int64_t n_tok, float *y, int64_t ldy,
                           void *scratch, size_t scratch_size);

/* Which kernels ag_matmul_prompt runs for w_type at the active ISA, for
 * reports: "amx", "panel" (token panels), "tile" (GEMM tiles) or "dot". */
const char *ag_matmul_prompt_kernel(uint32_t w_type);

/* Q4_K and Q6_K are the exception to the split above: their AMX tiles
 * compute the dot kernels' arithmetic bit for bit (ag_kquant_fold), so
 * decode rows of these types may take ag_matmul_prompt's AMX path too, and
 * do from ag_matmul_amx_decode_min(type) rows on: a verify window or a
 * small batch (one tile of at most 16 tokens) reads the weights' own blocks
 * once (matmul_amx.c, window_task), a larger batch the tile-ready copy.
 * 8960x1536 Q4_K, cold, 2 threads of an AMX Xeon, ms (n = 1: 0.43-0.45):
 * dot kernels n = 5 / 8 / 12 1.15 / 1.60 / 2.40, AMX window 1.0-1.07 for
 * every n up to 12; Q6_K dot n = 7 / 8 / 12 1.27-1.45 / 1.37-1.59 /
 * 2.1-2.4, AMX window (scales folded into the weights, window_panel_q6)
 * 1.2-1.6 for every n; bench/RESULTS.md, 2026-12-05. True when n_decode rows of
 * w_type should: AMX present (the dot kernels of every ISA level are
 * canonical). */
#define AG_MATMUL_AMX_MIN_TOK     4 /* Q4_K (window_panel, T = 1: 4 rows 0.52 / 0.64 ms min / median against the dot kernels' 0.68 / 0.74) */
#define AG_MATMUL_AMX_MIN_TOK_Q6K 8
/* The minimum for w_type, or AUGUR_AMX_DECODE_MIN (a positive integer, any
 * type; A/B). */
int  ag_matmul_amx_decode_min(uint32_t w_type);
bool ag_matmul_decode_on_amx(uint32_t w_type, int64_t n_decode);

/* Without AMX (or below its minimum): ag_matmul and ag_matmul_multi run a
 * verify window of Q4_K / Q6_K decode rows through panel kernels whose
 * bits are the dot kernels': on the AVX2 level the window panels
 * (ag_wpanel_q8k; Q4_K from 3 rows, Q6_K from 7), on the AVX-512 level the
 * VNNI window panels (Q4_K from 3, Q6_K from 4), or where the CPU has AMX
 * the VNNI token panels below the tiles (Q4_K from 5; Q6_K stays on the
 * dot kernels). The fewest decode rows of w_type that do at the active
 * ISA, 0 for never (for reports; the callers need do nothing), and the
 * kernels' name ("window panels", "vnni window panels", "vnni panels"). */
int         ag_matmul_decode_panel_min(uint32_t w_type);
const char *ag_matmul_decode_panel_name(uint32_t w_type);

/* Decode rows against several weight matrices that read the same X (Q/K/V,
 * gate/up): X is quantized once per activation format and all the rows go
 * through one pool run, saving dispatches that dominate small decode
 * steps. Each part's Y is bit-identical to ag_matmul(part). At most
 * AG_MATMUL_MAX_PARTS parts; scratch as ag_matmul (sized by
 * ag_matmul_multi_scratch_size; allocated if short). Errors as ag_matmul. */
#define AG_MATMUL_MAX_PARTS 4
typedef struct {
    uint32_t    w_type;
    const void *w;
    int64_t     n_out;
    float      *y;
    int64_t     ldy;
} ag_matmul_part;
size_t    ag_matmul_multi_scratch_size(const ag_matmul_part *parts, int n_parts, int64_t n_in, int64_t n_tok);
ag_status ag_matmul_multi(ag_threadpool *pool, const ag_matmul_part *parts, int n_parts, int64_t n_in,
                          const float *x, int64_t ldx, int64_t n_tok, void *scratch, size_t scratch_size);

ag_status ag_matmul_xq(ag_threadpool *pool, uint32_t w_type, const void *w, int64_t n_out, int64_t n_in,
                       const void *xq, int64_t n_tok, float *y, int64_t ldy);

#endif
