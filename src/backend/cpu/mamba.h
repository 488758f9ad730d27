/* The Mamba-2 mixer on the CPU (backend.h mamba2). */
#ifndef AG_CPU_MAMBA_H
#define AG_CPU_MAMBA_H

#include "backend/backend.h"
#include "base/threadpool.h"

ag_status ag_cpu_mamba2(ag_threadpool *pool, const ag_ssm_shape *sh, const float *zx, const ag_ssm_run *runs,
                        int n_runs, float *y);

#endif
