/* Recurrent state slots (Mamba-2 layers of a hybrid model): per sequence id,
 * each recurrent layer's conv state [d_conv-1][conv channels] and SSM state
 * [heads][head_dim][d_state], beside the paged KV in its memory (host,
 * or a device's through ag_kv_params.mem: then only the backend's kernels
 * touch the floats, and copies go through the mem hooks) (an ag_kv
 * made with ag_kv_params.state_layers > 0 owns one; kv.c keeps it in step
 * with its sequences: new/clear reset, fork copies, trim restores,
 * swap carries it).
 *
 * A recurrent state cannot drop positions: it is only the state after the
 * last one. Trims are answered by snapshots: after each decode row (a
 * one-token step, or a row of a verify window; the last row of a pass only
 * where ag_state_snap_last) the model records the state it reached at that
 * length into a ring of `max_snap` entries per sequence, so
 * ag_state_trim_limit(seq) = len - the oldest length the ring holds
 * contiguously up to len - 1 (0 after a prompt chunk). Prompt rows record
 * nothing: a prefill is never rolled back.
 *
 * Threading: as the ag_kv that owns it (the engine thread). */
#ifndef AG_KV_STATE_H
#define AG_KV_STATE_H

#include <stddef.h>
#include <stdint.h>

#include "base/status.h"

typedef struct ag_state ag_state;
struct ag_kv_mem;

/* n_layers recurrent layers, each conv_floats + ssm_floats floats per
 * sequence; max_seqs ids; max_snap snapshot lengths per sequence (0: none,
 * every trim but 0 refused). mem: where the floats live (kv.h ag_kv_mem,
 * borrowed, must outlive the state), NULL for host memory. */
ag_status ag_state_new(int32_t n_layers, size_t conv_floats, size_t ssm_floats, int32_t max_seqs, int32_t max_snap,
                       const struct ag_kv_mem *mem, ag_state **out);
void      ag_state_free(ag_state *s); /* NULL-safe */

/* Floats of one sequence's state, all layers (what swap carries). */
size_t ag_state_seq_floats(const ag_state *s);
/* Bytes held now: the slots and the snapshot rings allocated so far. */
size_t ag_state_bytes(const ag_state *s);

/* Layer `layer` (0-based among the recurrent layers) of sequence `seq`: its
 * conv state (conv_floats) followed by its SSM state (ssm_floats). Borrowed,
 * valid for the state's life; in the state's memory (a device address
 * with a device mem). */
float *ag_state_layer(ag_state *s, int32_t seq, int32_t layer);

/* A sequence's whole state (ag_state_seq_floats floats, every layer) to or
 * from host memory (swap): through the mem hooks for a device state. */
ag_status ag_state_to_host(const ag_state *s, int32_t seq, void *host);
ag_status ag_state_from_host(ag_state *s, int32_t seq, const void *host);

/* The length the state is at (the positions it has consumed). */
int32_t ag_state_len(const ag_state *s, int32_t seq);

/* Zeroes a sequence's state (length 0, no snapshots). */
void ag_state_reset(ag_state *s, int32_t seq);
/* dst becomes a copy of src (state and length; dst's snapshots dropped). */
void ag_state_copy(ag_state *s, int32_t dst, int32_t src);

/* A forward pass starts consuming positions [pos0, pos0 + n) of seq: pos0
 * must equal ag_state_len (a recurrent state cannot skip or repeat
 * positions); AG_ERR_INVALID otherwise. Records nothing. */
ag_status ag_state_check(const ag_state *s, int32_t seq, int32_t pos0);

/* Where the model writes layer `layer`'s state reached after consuming
 * position pos (length pos + 1), for a decode row: a ring entry of seq
 * (allocated on first use; NULL when max_snap is 0 or memory ran out: that
 * length is then not restorable). ag_state_advance then marks it held. */
float *ag_state_snap_slot(ag_state *s, int32_t seq, int32_t layer, int32_t pos);

/* After a pass: seq consumed up to new_len, and every layer's snapshots of
 * lengths [first, last] were written (first > last: none, as after a
 * prompt chunk: then nothing before new_len can be restored). A range that
 * continues the one held extends it; the ring keeps the last max_snap. */
void ag_state_advance(ag_state *s, int32_t seq, int32_t new_len, int32_t first, int32_t last);

/* Whether the model also records the state reached after a sequence's last
 * row of a pass (needed only to roll back across passes: a draft model's
 * one-token steps; a verify window's trim never goes back to the state it
 * ended at). Set by ag_kv_params.state_snap_last. */
int  ag_state_snap_last(const ag_state *s);
void ag_state_set_snap_last(ag_state *s, int on);

/* How many trailing positions the state can drop now (restoring a
 * snapshot): 0 when none is held. */
int32_t ag_state_trim_limit(const ag_state *s, int32_t seq);

/* Drops the last n positions: the snapshot of length len - n becomes the
 * state. AG_ERR_UNSUPPORTED when n > ag_state_trim_limit. */
ag_status ag_state_trim(ag_state *s, int32_t seq, int32_t n);

#endif
