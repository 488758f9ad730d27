/* Choosing a backend (backend.h): the one place that knows which backends
 * this build has. The CUDA backend exists only in `make CUDA=1` builds
 * (AUGUR_CUDA defined); elsewhere asking for it is a clear error. */
#include <string.h>

#include "backend/backend.h"
#ifdef AUGUR_CUDA
#include "backend/cuda/cuda_backend.h"
#endif

bool ag_device_parse(const char *s, ag_device *out) {
    if (!s) return false;
    if (!strcmp(s, "auto")) *out = AG_DEVICE_AUTO;
    else if (!strcmp(s, "cpu")) *out = AG_DEVICE_CPU;
    else if (!strcmp(s, "cuda") || !strcmp(s, "gpu")) *out = AG_DEVICE_CUDA;
    else return false;
    return true;
}

const char *ag_device_name(ag_device d) {
    switch (d) {
    case AG_DEVICE_CPU: return "cpu";
    case AG_DEVICE_CUDA: return "cuda";
    default: return "auto";
    }
}

bool ag_cuda_available(void) {
#ifdef AUGUR_CUDA
    return ag_cuda_device_count() > 0;
#else
    return false;
#endif
}

ag_tensor ag_moe_expert_view(const ag_tensor *stack, int e) {
    ag_tensor    v = *stack;
    const size_t mat = stack->row_bytes * (size_t)stack->ne[1];
    v.ne[2] = 1;
    v.data = (const char *)stack->data + (size_t)e * mat;
    v.host = stack->host ? (const char *)stack->host + (size_t)e * mat : NULL;
    return v;
}

ag_status ag_backend_new(ag_device dev, const ag_cpu_params *cpu, int decode_rows_hint, ag_backend **out) {
    *out = NULL;
    if (dev == AG_DEVICE_AUTO) dev = ag_cuda_available() ? AG_DEVICE_CUDA : AG_DEVICE_CPU;
    if (dev == AG_DEVICE_CPU) return ag_cpu_backend_new(cpu, out);
#ifdef AUGUR_CUDA
    if (!ag_cuda_available()) return ag_errorf(AG_ERR_UNSUPPORTED, "--device cuda: no CUDA GPU is visible");
    return ag_cuda_backend_new(0, decode_rows_hint, out);
#else
    (void)decode_rows_hint;
    return ag_errorf(AG_ERR_UNSUPPORTED, "--device cuda: this build has no CUDA backend (build with `make CUDA=1`)");
#endif
}

ag_status ag_backend_add_rmsnorm(ag_backend *be, float *x, const float *o, const float *w, int n, int dim, float eps,
                                 float *out) {
    const ag_backend_ops *op = be->ops;
    if (op->add_rmsnorm) return op->add_rmsnorm(be, x, o, w, n, dim, eps, out);
    const ag_status st = op->add(be, x, o, (size_t)n * dim);
    return st ? st : op->rmsnorm(be, x, w, n, dim, eps, out);
}
