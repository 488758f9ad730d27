/* Prompt GEMM on Intel AMX tiles (see matmul_amx.c for the arithmetic).
 *
 * Y[n_tok][n_out] = X[n_tok][n_in] · W[n_out][n_in]^T for the weight types
 * ag_amx_supports(), on CPUs where ag_amx_available(). A token's result is
 * bit-identical whatever else is in the call. For Q4_K and Q6_K it is also
 * bit-identical to ag_matmul()'s (the dot kernels', scalar or AVX-512); for
 * the other types it differs in float summation order and activation
 * blocking. */
#ifndef AG_BACKEND_CPU_MATMUL_AMX_H
#define AG_BACKEND_CPU_MATMUL_AMX_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "backend/cpu/quant.h"
#include "base/status.h"
#include "base/threadpool.h"

/* CPU has AMX-INT8 + AVX-512BW/VL and the OS granted tile state; false when
 * the environment sets AUGUR_AMX=0, or while the active ISA level is below
 * AVX-512 (ag_cpu_isa_set, AUGUR_CPU_ISA). Thread-safe, probes once. */
bool ag_amx_available(void);
/* An AMX kernel exists for this weight type. */
bool ag_amx_supports(uint32_t w_type);
/* Scratch bytes ag_matmul_amx needs (0 for invalid sizes). */
size_t ag_amx_scratch_size(int n_threads, int64_t n_in, int64_t n_tok);
/* The product; scratch from ag_amx_scratch_size(ag_threadpool_size(pool), ...).
 * packed: NULL, or for the K-quants the weights laid out by ag_amx_pack
 * (then w is not read and no panel is unpacked per call: a decode batch
 * of 16 tokens otherwise spends more time unpacking than multiplying).
 * Arguments are assumed checked by the caller (matmul.c); returns
 * AG_ERR_UNSUPPORTED without AMX or for other types. */
ag_status ag_matmul_amx(ag_threadpool *pool, uint32_t w_type, const void *w, const void *packed, int64_t n_out,
                        int64_t n_in, const float *x, int64_t ldx, int64_t n_tok, float *y, int64_t ldy,
                        void *scratch, size_t scratch_size);

/* Whether ag_matmul_amx reads the tile-ready copy (below) for n_tok tokens
 * of w_type: K-quants past one tile of 16 tokens (a window reads the
 * weights' own blocks), so a caller makes the copy only then. */
bool ag_amx_reads_packed(uint32_t w_type, int64_t n_tok);

/* Bytes of the AMX-ready copy of an n_out x n_in weight (int8 values and
 * integer scales, ~1.3 bytes per weight); 0 where the type has none (only
 * Q4_K and Q6_K do). */
size_t ag_amx_packed_size(uint32_t w_type, int64_t n_out, int64_t n_in);
/* Writes that copy to dst (ag_amx_packed_size bytes), on the pool. */
ag_status ag_amx_pack(ag_threadpool *pool, uint32_t w_type, const void *w, int64_t n_out, int64_t n_in, void *dst);

#endif
