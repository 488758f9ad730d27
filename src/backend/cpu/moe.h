/* The CPU backend's mixture-of-experts feed-forward (backend.h's moe op):
 * routing on the host, then each chosen expert's matrices over the group of
 * rows that chose it, through the backend's own matmul kernels. */
#ifndef AG_BACKEND_CPU_MOE_H
#define AG_BACKEND_CPU_MOE_H

#include "backend/backend.h"

/* The op's buffers, grown to the largest batch and kept (one per backend). */
typedef struct ag_cpu_moe ag_cpu_moe;

/* backend.h's moe op on `be` (a host-memory backend whose matmul,
 * matmul_multi and silu_mul it calls), with *scratch as its buffers
 * (created or grown here; freed by ag_cpu_moe_free). */
ag_status ag_cpu_moe_run(ag_backend *be, ag_cpu_moe **scratch, const ag_moe_weights *w, const float *h, int n,
                         int n_decode, float *o);
void      ag_cpu_moe_free(ag_cpu_moe *s); /* NULL-safe */

#endif
