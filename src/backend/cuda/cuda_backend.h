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
/* Creates the backend on device `index`. decode_rows_hint (ag_model_params')
 * is not used: Q4_K/Q6_K decode rows take the few-row GEMVs (mmqv, up to
 * MMQV_FEW rows) or the tensor-core kernels (mmq) by each matmul's row
 * count, both with mmq's bits, so a row's result never depends on its
 * batch or on the hint. */
ag_status ag_cuda_backend_new(int index, int decode_rows_hint, ag_backend **out);

#ifdef __cplusplus
}
#endif
#endif
