/* Communicators: the collectives tensor parallelism needs between the N
 * shards (ranks) of one model in one process (docs/design-notes.md, "Tensor
 * parallelism").
 *
 * One host thread drives every rank in lockstep: a collective takes all N
 * ranks' buffers in one call (as NCCL's grouped calls, ncclGroupStart, one
 * ncclAllReduce per rank, ncclGroupEnd, do from one thread), so the CPU
 * implementation here and a device one (NCCL, later) have the same shape.
 * Buffers are in each rank's own backend memory (host memory for the CPU).
 *
 * Determinism: a communicator's all-reduce adds in a fixed order that does
 * not change from call to call or run to run, and leaves the same bits in
 * every rank's buffer (so the replicated residual streams never drift
 * apart). The CPU one adds in rank order: ((b0 + b1) + b2) + ... */
#ifndef AG_BASE_COMM_H
#define AG_BASE_COMM_H

#include <stddef.h>

#include "base/status.h"

#define AG_COMM_MAX_RANKS 16

typedef struct ag_comm ag_comm;

typedef struct {
    const char *name;
    /* buf[r][0..n) for every rank r (rank r's memory) becomes the
     * elementwise sum over the ranks, the same bits in each. */
    ag_status (*all_reduce_sum)(ag_comm *, float *const *buf, size_t n);
    /* recv (host memory, sum of bytes[] long) = rank 0's send[0] (bytes[0]
     * bytes), then rank 1's, ..., in rank order. A rank may send 0 bytes
     * (its send may then be NULL). */
    ag_status (*gather)(ag_comm *, const void *const *send, const size_t *bytes, void *recv);
    void (*destroy)(ag_comm *);
} ag_comm_ops;

struct ag_comm {
    const ag_comm_ops *ops;
    int                n_ranks;
    void              *impl;
};

/* The in-process communicator over n_ranks (1..AG_COMM_MAX_RANKS) ranks in
 * host memory: a sum in rank order, then copies. Free with ag_comm_free. */
ag_status ag_comm_cpu_new(int n_ranks, ag_comm **out);
void      ag_comm_free(ag_comm *c); /* NULL-safe */

/* The NCCL communicator over the GPUs devices[0..n_ranks) (one rank each),
 * its collectives issued on streams[r] (each rank's cudaStream_t, e.g. its
 * backend's), so they order with the ops on them; the all-reduce is one
 * NCCL group from this one thread, the gather device-to-host copies.
 * AG_ERR_UNSUPPORTED in a build without NCCL (make CUDA=1 with NCCL found:
 * src/backend/cuda/comm_nccl.cu). */
ag_status ag_comm_nccl_new(int n_ranks, const int *devices, void *const *streams, ag_comm **out);

#endif
