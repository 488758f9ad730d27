/* Recurrent state slots and their snapshot rings (see state.h). */
#include "kv/state.h"

#include "kv/kv.h" /* ag_kv_mem */

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    float  *cur;  /* [seq_floats]: every layer's conv then SSM state */
    float  *ring; /* [max_snap][seq_floats], allocated at the first snapshot */
    int32_t len;  /* positions consumed */
    int32_t lo, hi; /* the ring holds every length in [lo, hi] (empty: lo > hi); hi <= len */
} state_seq;

struct ag_state {
    const ag_kv_mem *mem; /* NULL: host memory */
    float           *zeros; /* with mem: seq_floats zeros, what a reset copies */
    int32_t    n_layers, max_seqs, max_snap;
    int        snap_last;
    size_t     conv_floats, ssm_floats, layer_floats, seq_floats;
    size_t     ring_bytes; /* rings allocated so far */
    state_seq *seqs;
};

/* Zero-filled floats in the state's memory. */
static float *s_alloc(const ag_state *s, size_t floats) {
    return s->mem ? s->mem->alloc(s->mem->ctx, floats * sizeof(float)) : calloc(floats, sizeof(float));
}
static void s_free(const ag_state *s, float *p) {
    if (!p) return;
    if (s->mem) s->mem->free(s->mem->ctx, p);
    else free(p);
}
/* One sequence's whole state (seq_floats) from src to dst. A device copy
 * is queued on the backend's stream, ordered with its kernels; a failure
 * to queue it is a device fault, which the backend reports at its next
 * sync, as it does its kernels' (hence no status here). */
static void s_copy(const ag_state *s, float *dst, const float *src) {
    const size_t bytes = s->seq_floats * sizeof(float);
    if (s->mem) (void)s->mem->copy(s->mem->ctx, dst, src, bytes);
    else memcpy(dst, src, bytes);
}

ag_status ag_state_new(int32_t n_layers, size_t conv_floats, size_t ssm_floats, int32_t max_seqs, int32_t max_snap,
                       const ag_kv_mem *mem, ag_state **out) {
    *out = NULL;
    if (n_layers < 1 || max_seqs < 1 || max_snap < 0)
        return ag_errorf(AG_ERR_INVALID, "state: %d layers, %d sequences, %d snapshots", n_layers, max_seqs, max_snap);
    ag_state *s = calloc(1, sizeof *s);
    if (!s) return ag_errorf(AG_ERR_NOMEM, "state: out of memory");
    s->mem = mem;
    s->n_layers = n_layers;
    s->max_seqs = max_seqs;
    s->max_snap = max_snap;
    s->snap_last = 1;
    s->conv_floats = conv_floats;
    s->ssm_floats = ssm_floats;
    s->layer_floats = conv_floats + ssm_floats;
    s->seq_floats = s->layer_floats * (size_t)n_layers;
    s->seqs = calloc((size_t)max_seqs, sizeof *s->seqs);
    if (!s->seqs) goto nomem;
    for (int32_t i = 0; i < max_seqs; i++)
        if (!(s->seqs[i].cur = s_alloc(s, s->seq_floats))) goto nomem;
    if (mem && !(s->zeros = s_alloc(s, s->seq_floats))) goto nomem;
    *out = s;
    return AG_OK;
nomem:
    ag_state_free(s);
    return ag_errorf(AG_ERR_NOMEM, "state: cannot allocate %d sequences' recurrent state (%zu bytes each)", max_seqs,
                     (size_t)n_layers * (conv_floats + ssm_floats) * sizeof(float));
}

void ag_state_free(ag_state *s) {
    if (!s) return;
    for (int32_t i = 0; s->seqs && i < s->max_seqs; i++) {
        s_free(s, s->seqs[i].cur);
        s_free(s, s->seqs[i].ring);
    }
    s_free(s, s->zeros);
    free(s->seqs);
    free(s);
}

size_t ag_state_seq_floats(const ag_state *s) { return s->seq_floats; }

size_t ag_state_bytes(const ag_state *s) {
    return s->seq_floats * sizeof(float) * (size_t)s->max_seqs + s->ring_bytes;
}

float *ag_state_layer(ag_state *s, int32_t seq, int32_t layer) {
    return s->seqs[seq].cur + (size_t)layer * s->layer_floats;
}

int32_t ag_state_len(const ag_state *s, int32_t seq) { return s->seqs[seq].len; }

int  ag_state_snap_last(const ag_state *s) { return s->snap_last; }
void ag_state_set_snap_last(ag_state *s, int on) { s->snap_last = on != 0; }

void ag_state_reset(ag_state *s, int32_t seq) {
    state_seq *q = &s->seqs[seq];
    if (s->mem) s_copy(s, q->cur, s->zeros);
    else memset(q->cur, 0, s->seq_floats * sizeof(float));
    q->len = q->lo = 0;
    q->hi = -1;
}

void ag_state_copy(ag_state *s, int32_t dst, int32_t src) {
    if (dst == src) return;
    state_seq *d = &s->seqs[dst], *q = &s->seqs[src];
    s_copy(s, d->cur, q->cur);
    d->len = d->lo = q->len;
    d->hi = q->len - 1;
}

ag_status ag_state_check(const ag_state *s, int32_t seq, int32_t pos0) {
    if (pos0 != s->seqs[seq].len)
        return ag_errorf(AG_ERR_INVALID,
                         "recurrent state of sequence %d is at position %d; a batch cannot start it at %d "
                         "(a recurrent layer's state cannot skip or repeat positions)",
                         seq, s->seqs[seq].len, pos0);
    return AG_OK;
}

float *ag_state_snap_slot(ag_state *s, int32_t seq, int32_t layer, int32_t pos) {
    if (s->max_snap < 1) return NULL;
    state_seq *q = &s->seqs[seq];
    if (!q->ring) {
        const size_t bytes = (size_t)s->max_snap * s->seq_floats * sizeof(float);
        if (!(q->ring = s_alloc(s, (size_t)s->max_snap * s->seq_floats))) return NULL;
        s->ring_bytes += bytes;
    }
    const int32_t len = pos + 1;
    return q->ring + (size_t)(len % s->max_snap) * s->seq_floats + (size_t)layer * s->layer_floats;
}

void ag_state_advance(ag_state *s, int32_t seq, int32_t new_len, int32_t first, int32_t last) {
    state_seq *q = &s->seqs[seq];
    if (!q->ring || first > last) { /* nothing recorded: nothing before new_len can be restored */
        q->lo = new_len;
        q->hi = new_len - 1;
    } else {
        if (!(q->lo <= q->hi && first == q->hi + 1)) q->lo = first; /* (else it extends what is held) */
        q->hi = last;
        if (q->lo < last - s->max_snap + 1) q->lo = last - s->max_snap + 1;
    }
    q->len = new_len;
}

int32_t ag_state_trim_limit(const ag_state *s, int32_t seq) {
    const state_seq *q = &s->seqs[seq];
    /* every length from len - 1 down to lo must be held */
    return q->lo <= q->hi && q->hi >= q->len - 1 ? q->len - q->lo : 0;
}

ag_status ag_state_trim(ag_state *s, int32_t seq, int32_t n) {
    if (n == 0) return AG_OK;
    if (n < 0 || n > ag_state_trim_limit(s, seq))
        return ag_errorf(AG_ERR_UNSUPPORTED,
                         "recurrent state of sequence %d cannot drop %d positions (it holds snapshots of the last %d)",
                         seq, n, ag_state_trim_limit(s, seq));
    state_seq    *q = &s->seqs[seq];
    const int32_t to = q->len - n;
    s_copy(s, q->cur, q->ring + (size_t)(to % s->max_snap) * s->seq_floats);
    q->len = to;
    if (q->hi > to) q->hi = to;
    return AG_OK;
}

ag_status ag_state_to_host(const ag_state *s, int32_t seq, void *host) {
    const size_t bytes = s->seq_floats * sizeof(float);
    if (!s->mem) memcpy(host, s->seqs[seq].cur, bytes);
    else if (s->mem->to_host(s->mem->ctx, host, s->seqs[seq].cur, bytes))
        return ag_errorf(AG_ERR_IO, "state: copying sequence %d's recurrent state to the host failed", seq);
    return AG_OK;
}

ag_status ag_state_from_host(ag_state *s, int32_t seq, const void *host) {
    const size_t bytes = s->seq_floats * sizeof(float);
    if (!s->mem) memcpy(s->seqs[seq].cur, host, bytes);
    else if (s->mem->from_host(s->mem->ctx, s->seqs[seq].cur, host, bytes))
        return ag_errorf(AG_ERR_IO, "state: copying sequence %d's recurrent state from the host failed", seq);
    return AG_OK;
}
