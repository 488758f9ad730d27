/* The CUDA backend (make CUDA=1): backend.h's op table on an NVIDIA GPU.
 * Weights are uploaded once at load in their GGUF types; activations and the
 * KV pool live in device memory; every op runs on one stream. Only
 * src/backend/backend.c calls these. */
#ifndef AG_CUDA_BACKEND_H
#define AG_CUDA_BACKEND_H

#include "backend/backend.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Number of usable CUDA devices (0 when the driver or a GPU is missing; never fails). */
int ag_cuda_device_count(void);
/* Creates the backend on device `index`. decode_rows_hint (ag_model_params'):
 * 1 selects the K-quant GEMVs for decode rows (fastest for one row), else
 * the tensor-core kernels (far faster from 2 rows on); AUGUR_CUDA_MMQ=0/1
 * overrides. Either way one kernel family serves every batch size. */
ag_status ag_cuda_backend_new(int index, int decode_rows_hint, ag_backend **out);

#ifdef __cplusplus
}
#endif
#endif
