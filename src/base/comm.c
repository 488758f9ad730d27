/* The in-process CPU communicator (comm.h). */
#include "base/comm.h"

#include <stdlib.h>
#include <string.h>

static ag_status cpu_all_reduce_sum(ag_comm *c, float *const *buf, size_t n) {
    if (c->n_ranks == 1) return AG_OK;
    /* rank 0's buffer accumulates, strictly in rank order per element: the
     * order a ring or tree all-reduce would not keep, but one that never
     * changes with the batch or the run */
    float *acc = buf[0];
    for (int r = 1; r < c->n_ranks; r++) {
        const float *b = buf[r];
        for (size_t i = 0; i < n; i++) acc[i] += b[i];
    }
    for (int r = 1; r < c->n_ranks; r++)
        if (buf[r] != acc) memcpy(buf[r], acc, n * sizeof(float));
    return AG_OK;
}

static ag_status cpu_gather(ag_comm *c, const void *const *send, const size_t *bytes, void *recv) {
    char *p = recv;
    for (int r = 0; r < c->n_ranks; r++) {
        if (bytes[r] && p != send[r]) memmove(p, send[r], bytes[r]);
        p += bytes[r];
    }
    return AG_OK;
}

static void cpu_destroy(ag_comm *c) { free(c); }

static const ag_comm_ops cpu_comm_ops = {
    .name = "cpu",
    .all_reduce_sum = cpu_all_reduce_sum,
    .gather = cpu_gather,
    .destroy = cpu_destroy,
};

ag_status ag_comm_cpu_new(int n_ranks, ag_comm **out) {
    *out = NULL;
    if (n_ranks < 1 || n_ranks > AG_COMM_MAX_RANKS)
        return ag_errorf(AG_ERR_INVALID, "a communicator of %d ranks: 1 to %d are supported", n_ranks,
                         AG_COMM_MAX_RANKS);
    ag_comm *c = calloc(1, sizeof *c);
    if (!c) return ag_errorf(AG_ERR_NOMEM, "out of memory");
    c->ops = &cpu_comm_ops;
    c->n_ranks = n_ranks;
    *out = c;
    return AG_OK;
}

#ifndef AUGUR_NCCL
ag_status ag_comm_nccl_new(int n_ranks, const int *devices, void *const *streams, ag_comm **out) {
    *out = NULL;
    return ag_errorf(AG_ERR_UNSUPPORTED, "this build has no NCCL (make CUDA=1 with NCCL installed): %d GPU ranks",
                     n_ranks);
}
#endif

void ag_comm_free(ag_comm *c) {
    if (c) c->ops->destroy(c);
}
