/* The NCCL communicator (base/comm.h) for tensor parallelism over the GPUs
 * of one host (issue 49). Built only when the build finds NCCL
 * (AUGUR_NCCL: `make CUDA=1` with nccl.h beside the CUDA toolkit or under
 * NCCL_HOME); otherwise this file is empty and base/comm.c's
 * ag_comm_nccl_new says the build has none.
 *
 * One host thread drives every rank (comm.h): the all-reduce is one NCCL
 * group, one in-place ncclAllReduce per rank on that rank's stream, so it
 * runs after the ops already issued on each stream and before the ones
 * issued after it, with no host synchronisation. NCCL picks its own
 * reduction order (ring or tree): deterministic for a fixed rank count and
 * topology (and NCCL version and NCCL_ALGO/NCCL_PROTO), not the CPU
 * communicator's rank order, so GPU and CPU --tp logits agree within
 * rounding. The gather copies each rank's bytes to the host on its stream
 * and waits for all of them. Not run yet: no multi-GPU machine has been
 * lent (see docs/design-notes.md, "Tensor parallelism"). */
#ifdef AUGUR_NCCL

#include <cuda_runtime.h>
#include <nccl.h>

#include <stdlib.h>

extern "C" {
#include "base/comm.h"
}

struct nccl_impl {
    int          n;
    int          dev[AG_COMM_MAX_RANKS];
    ncclComm_t   comm[AG_COMM_MAX_RANKS];
    cudaStream_t stream[AG_COMM_MAX_RANKS];
};

static ag_status nccl_fail(ncclResult_t r, const char *what) {
    return ag_errorf(AG_ERR_INTERNAL, "nccl: %s: %s", what, ncclGetErrorString(r));
}

static ag_status nccl_all_reduce_sum(ag_comm *c, float *const *buf, size_t n) {
    nccl_impl   *s = (nccl_impl *)c->impl;
    ncclResult_t r = ncclGroupStart();
    if (r != ncclSuccess) return nccl_fail(r, "ncclGroupStart");
    ncclResult_t first = ncclSuccess;
    for (int k = 0; k < s->n; k++) {
        r = ncclAllReduce(buf[k], buf[k], n, ncclFloat, ncclSum, s->comm[k], s->stream[k]);
        if (r != ncclSuccess && first == ncclSuccess) first = r;
    }
    r = ncclGroupEnd(); /* (always: a group left open would swallow later calls) */
    if (first != ncclSuccess) return nccl_fail(first, "ncclAllReduce");
    return r == ncclSuccess ? AG_OK : nccl_fail(r, "ncclGroupEnd");
}

static ag_status nccl_gather(ag_comm *c, const void *const *send, const size_t *bytes, void *recv) {
    nccl_impl *s = (nccl_impl *)c->impl;
    char      *p = (char *)recv;
    for (int k = 0; k < s->n; k++) {
        if (bytes[k]) {
            cudaError_t e = cudaSetDevice(s->dev[k]);
            if (e == cudaSuccess) e = cudaMemcpyAsync(p, send[k], bytes[k], cudaMemcpyDeviceToHost, s->stream[k]);
            if (e != cudaSuccess)
                return ag_errorf(AG_ERR_INTERNAL, "nccl gather: rank %d: %s", k, cudaGetErrorString(e));
        }
        p += bytes[k];
    }
    for (int k = 0; k < s->n; k++) {
        cudaError_t e = cudaSetDevice(s->dev[k]);
        if (e == cudaSuccess) e = cudaStreamSynchronize(s->stream[k]);
        if (e != cudaSuccess) return ag_errorf(AG_ERR_INTERNAL, "nccl gather: rank %d: %s", k, cudaGetErrorString(e));
    }
    return AG_OK;
}

static void nccl_destroy(ag_comm *c) {
    nccl_impl *s = (nccl_impl *)c->impl;
    for (int k = 0; s && k < s->n; k++)
        if (s->comm[k]) ncclCommDestroy(s->comm[k]);
    free(s);
    free(c);
}

static const ag_comm_ops nccl_ops = {
    "nccl",
    nccl_all_reduce_sum,
    nccl_gather,
    nccl_destroy,
};

extern "C" ag_status ag_comm_nccl_new(int n_ranks, const int *devices, void *const *streams, ag_comm **out) {
    *out = NULL;
    if (n_ranks < 1 || n_ranks > AG_COMM_MAX_RANKS)
        return ag_errorf(AG_ERR_INVALID, "nccl: %d ranks: 1 to %d are supported", n_ranks, AG_COMM_MAX_RANKS);
    ag_comm   *c = (ag_comm *)calloc(1, sizeof *c);
    nccl_impl *s = (nccl_impl *)calloc(1, sizeof *s);
    if (!c || !s) {
        free(c);
        free(s);
        return ag_errorf(AG_ERR_NOMEM, "out of memory");
    }
    for (int k = 0; k < n_ranks; k++) s->dev[k] = devices[k], s->stream[k] = (cudaStream_t)streams[k];
    ncclResult_t r = ncclCommInitAll(s->comm, n_ranks, s->dev);
    if (r != ncclSuccess) {
        free(s);
        free(c);
        return nccl_fail(r, "ncclCommInitAll");
    }
    s->n = n_ranks;
    c->ops = &nccl_ops;
    c->n_ranks = n_ranks;
    c->impl = s;
    *out = c;
    return AG_OK;
}

#endif /* AUGUR_NCCL */
