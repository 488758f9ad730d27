/* Paged KV cache: a fixed pool of blocks, per-sequence block tables, trim
 * (speculative rollback), fork (copy-on-write prefix sharing) and block-level
 * hooks for the prefix cache (DESIGN.md, "Paged KV with trim and fork").
 *
 * Model. The pool holds n_blocks = budget_bytes / layout.block_bytes blocks,
 * allocated once at init and never grown. A block holds block_size
 * consecutive positions of ONE sequence prefix for EVERY layer: a block id
 * means the same positions in all layers. A sequence is a block table plus a
 * length: position p lives in block table[p / block_size] at offset
 * p % block_size. Blocks are reference counted; a block may be shared by
 * several sequences (after fork/adopt) and by outside holders (the prefix
 * cache, through ag_kv_block_ref). A shared block is never written: the write
 * path copies it first (copy-on-write), so sharers never disturb each other.
 * A block returns to the pool the moment its count drops to 0.
 *
 * Storage layout, chosen so that attention for one (layer, kv_head) reads
 * contiguous runs: within block b and layer l,
 *     K: [n_kv_heads][block_size][head_dim_k]   elements of `dtype`
 *     V: [n_kv_heads][block_size][head_dim_v]
 * ag_kv_block_k/_v give the base of each; ag_kv_layout gives the strides:
 *     K row of (head h, offset o) = ag_kv_block_k(kv, l, b)
 *                                   + h * head_stride_k + o * row_bytes_k
 * (bytes). Every K and V region starts 64-byte aligned.
 *
 * Length and reservation. Each sequence has a committed length `len` and a
 * writable end `reserved` >= len. Positions [0, len) are committed history;
 * positions [len, reserved) have exclusively owned storage ready for writing
 * (made by ag_kv_seq_reserve) but are not part of the history until
 * ag_kv_seq_commit. Fork, adopt and persistence see committed positions only.
 *
 * THE FORWARD-PASS PROTOCOL (one ragged batch):
 *   1. For each sequence s in the batch, its tokens must have positions
 *      len(s), len(s)+1, ..., len(s)+k(s)-1 (contiguous, starting at the
 *      committed length; to recompute a position, ag_kv_trim first).
 *      Call ag_kv_seq_reserve(kv, s, k(s)) once per sequence, BEFORE any
 *      write. On AG_ERR_NOMEM nothing changed; the batch can be shrunk or the
 *      scheduler can preempt.
 *   2. For each token (s, pos): ag_kv_slot(kv, s, pos, &block, &off) once;
 *      then in every layer write its K/V rows at that (block, off) for each
 *      kv head (directly through ag_kv_block_k/_v + layout strides, or with
 *      ag_kv_write). Slots stay valid until the next mutating call
 *      (reserve, commit, trim, fork, adopt, seq_free, block_ref/unref/alloc).
 *   3. Attention for the token at pos in layer l reads positions [0, pos]
 *      of its sequence (or [pos-W+1, pos] for a layer with sliding window W,
 *      see ag_kv_layer_window) through the table from ag_kv_seq_blocks,
 *      after this layer's rows for the batch have been written. Positions of
 *      the current batch (>= len) are readable although not yet committed.
 *   4. On success, ag_kv_seq_commit(kv, s, len(s) + k(s)) for each sequence.
 *      (On failure, skip it: the written-but-uncommitted positions are simply
 *      not history.) Speculative verify then ag_kv_trim's the rejected tail.
 *
 * Sliding-window layers and the ring. With params.ring (and a layer_window
 * with at least one windowed and one global layer), the windowed layers do
 * not live in the blocks above: they have a pool of their own (the RING
 * POOL, blocks of the same positions-per-block holding only those layers),
 * and each sequence a second table over it, indexed by the same logical
 * block (position / block_size). Entries of that table older than the
 * window are RECYCLED: at ag_kv_seq_reserve, every ring block whose
 * positions all lie below len - W + 1 - ring_slack (W: the largest window;
 * len: the committed length, i.e. the first position this reserve is for,
 * the oldest query that will ever read again) leaves the table (-1) and
 * returns to the ring pool unless someone else (the prefix cache) holds it.
 * So a sequence holds about W + slack + (tokens per step) positions of its
 * windowed layers, not its whole length. Block ids of the two pools are
 * distinct spaces: a windowed layer's K/V are at ag_kv_block_k(kv, layer,
 * ring block id), found through ag_kv_seq_layer_blocks / ag_kv_layer_slot;
 * the other calls that take a block id mean the main pool unless named
 * ag_kv_ring_*. Without a ring, every position of every layer is stored in
 * the main pool and a window only tells attention what to skip.
 *
 * What a ring can trim: a sequence whose ring entries start at logical block
 * rlo can go back to any length m with rlo * block_size <= max(0, m - W + 1),
 * the oldest position the query at m reads (ag_kv_trim_limit). Because
 * recycling happens at reserve, against the length BEFORE the step, a step
 * can always be rolled back to where it started (speculative verify: reserve
 * 1 + d, commit, trim the rejected tail), with no slack at all; ring_slack
 * lets rollbacks reach further back than the last reserve (a draft model's
 * own KV). Fork and adopt need the ring blocks of the window before their
 * length; swap keeps exactly those.
 *
 * Thread-safety: none inside. Every call is made from the one engine thread
 * that owns the cache. During a forward pass, worker threads may read block
 * memory and write rows into slots obtained in step 2 (distinct slots from
 * distinct threads), as long as the engine thread makes no mutating call
 * meanwhile. */
#ifndef AG_KV_H
#define AG_KV_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/status.h"

typedef struct ag_kv ag_kv;

typedef enum {
    AG_KV_F32 = 0,
    AG_KV_F16 = 1,  /* IEEE half, round-to-nearest-even on conversion */
    AG_KV_Q8_0 = 2, /* ggml's Q8_0: 32-element blocks of an f16 scale d and 32 int8, x = d * q */
    AG_KV_Q4_0 = 3, /* ggml's Q4_0: 32-element blocks of an f16 scale d and 16 bytes of nibbles,
                       x = d * (nibble - 8); element j in the low nibble of byte j, j + 16 in the high */
} ag_kv_dtype;
/* The quantized types need head dims that are multiples of this. */
#define AG_KV_QBLOCK 32

/* The name a flag spells (`--kv-type f16|f32|q8_0|q4_0`): "f32", "f16",
 * "q8_0", "q4_0"; "?" for anything else. Static storage. */
const char *ag_kv_dtype_name(ag_kv_dtype t);
/* Parses such a name; false (and *out untouched) for an unknown one. */
bool ag_kv_dtype_parse(const char *name, ag_kv_dtype *out);
/* Whether the type is one of the block-quantized ones. */
bool ag_kv_dtype_quantized(ag_kv_dtype t);
/* Bytes of one row of `dim` elements of type t; 0 for an unknown type or a
 * quantized type with dim not a multiple of AG_KV_QBLOCK. */
size_t ag_kv_row_bytes(ag_kv_dtype t, int64_t dim);
/* Converts n floats into a row of type t (n a multiple of AG_KV_QBLOCK for
 * the quantized types, which round as ggml's reference quantizers do: Q8_0
 * d = amax / 127, q = round-to-nearest-even(x / d); Q4_0 d = -max / 8 with
 * max the element of largest magnitude, q = min(15, trunc(x / d + 8.5))), and
 * back. The load of a quantized row is exact: d * q in float. Pure
 * functions of the row: a token's stored bits never depend on its batch. */
void ag_kv_store_row(ag_kv_dtype t, void *dst, const float *src, int64_t n);
void ag_kv_load_row(ag_kv_dtype t, float *dst, const void *src, int64_t n);

/* Where the block pool lives when it is not host memory (a GPU backend's
 * device memory; backend.h kv_mem). kv keeps all bookkeeping on the host and
 * moves block bytes only through these. Each returns 0 on success. */
typedef struct ag_kv_mem {
    void *ctx;
    void *(*alloc)(void *ctx, size_t bytes); /* zero-filled; NULL when out of memory */
    void (*free)(void *ctx, void *p);
    int (*copy)(void *ctx, void *dst, const void *src, size_t bytes);      /* device -> device */
    int (*to_host)(void *ctx, void *host, const void *src, size_t bytes);  /* device -> host, synchronous */
    int (*from_host)(void *ctx, void *dst, const void *host, size_t bytes); /* host -> device */
    /* Optional: host memory that copies to and from this memory move
     * fastest (pinned): see ag_kv_mem_host_alloc. NULL when out of it. */
    void *(*host_alloc)(void *ctx, size_t bytes);
    void (*host_free)(void *ctx, void *p);
} ag_kv_mem;

typedef struct {
    int32_t        n_layers;
    int32_t        n_kv_heads;
    int32_t        head_dim_k;
    int32_t        head_dim_v;
    int32_t        block_size;   /* positions per block, power of two in [8, 256]; 16 */
    ag_kv_dtype    dtype;        /* default AG_KV_F16 (what llama.cpp uses by default) */
    size_t         budget_bytes; /* n_blocks = budget / block_bytes; default 256 MiB */
    int32_t        max_seqs;     /* sequence ids are 0 .. max_seqs-1; default 64 */
    /* Optional [n_layers] sliding-window sizes (0 = global attention), or NULL
     * for all global. Copied at init. */
    const int32_t *layer_window;
    /* Keep the windowed layers in a ring (see above). Ignored (no ring)
     * unless layer_window has at least one windowed and one global layer. */
    bool           ring;
    int32_t        ring_slack;  /* positions kept beyond the window for trims; default 32 */
    int32_t        ring_step;   /* most positions reserved past the sequences' windows
                                   at once, all sequences together (a step's tokens:
                                   see ag_kv_seq_recycle), for the pool's size;
                                   default 512 */
    int32_t        ring_blocks; /* ring pool blocks; 0: 3/2 x (max_seqs windows and
                                   ring_step positions) (the half: the prefix
                                   cache's ring blocks) */
    /* NULL: the pool is host memory. Otherwise the pool is allocated with
     * mem->alloc and ag_kv_block_k/_v return device addresses, which only
     * the backend's kernels may touch (see ag_kv_host_visible). Borrowed:
     * must outlive the cache. */
    const ag_kv_mem *mem;
    /* Recurrent layers (a hybrid model's Mamba-2 layers, kv/state.h):
     * state_layers > 0 gives every sequence id a state slot of that many
     * layers, state_conv_floats + state_ssm_floats floats each, kept in
     * step with the sequence (new/clear reset it, fork copies it, trim
     * restores one of its last state_snapshots snapshots, swap carries
     * it). Default 0: none. */
    int32_t        state_layers;
    size_t         state_conv_floats, state_ssm_floats;
    int32_t        state_snapshots; /* default 8 */
    /* also snapshot each pass's last row (default true: rollbacks across
     * one-token passes, a draft model's); the engine's target says false
     * (its verify trims never need it: one state copy fewer per step) */
    bool           state_snap_last;
} ag_kv_params;

/* Stride facts of the pool, all in bytes unless named otherwise. */
typedef struct {
    ag_kv_dtype dtype;
    int32_t     n_layers, n_kv_heads, head_dim_k, head_dim_v;
    int32_t     block_size;
    int32_t     block_shift; /* log2(block_size): block = pos >> shift */
    size_t      row_bytes_k; /* one position of one head: head_dim_k elements */
    size_t      row_bytes_v;
    size_t      head_stride_k; /* = block_size * row_bytes_k */
    size_t      head_stride_v;
    size_t      layer_stride; /* distance between layer l and l+1 of one block (padded) */
    size_t      block_bytes;  /* one block, all layers, with padding: the pool unit */
    size_t      copy_bytes;   /* one block, one layer, K then V, no padding: see copy_out */
    /* The ring (0 when there is none): its window W, how many layers it
     * holds, and its pool's unit (those layers of one block). block_bytes
     * above then counts only the other layers. */
    int32_t     ring_window;
    int32_t     n_ring_layers;
    size_t      ring_block_bytes;
    /* Rotation of a quantized cache's rows (0: none), as llama.cpp's
     * default for -ctk/-ctv: the CPU attention stores K as H k and V as H v
     * (H: the orthonormal Walsh-Hadamard matrix, block-diagonal in blocks of
     * rot_k / rot_v), dots H q with H k (= q.k) and multiplies the output by
     * H again (H H = I), which spreads outliers across a block before it is
     * quantized. rot_k = the largest power of two dividing head_dim_k (at
     * most 512), rot_v = 64, each only for a head dim that is a multiple of
     * 64 and unless AUGUR_KV_ROTATE=0. Part of what the stored bits mean:
     * the prefix cache's records carry it (compute fingerprint). */
    int32_t     rot_k, rot_v;
} ag_kv_layout;

typedef struct {
    size_t   pool_bytes;  /* the one allocation for block storage (n_blocks *
                             block_bytes) */
    size_t   meta_bytes;  /* refcounts, free list, sequence tables (grows with
                             tables) */
    size_t   block_bytes; /* one block, all layers */
    int32_t  n_blocks;    /* pool capacity */
    int32_t  blocks_used; /* refcount > 0 */
    int32_t  blocks_free;
    int32_t  blocks_shared; /* refcount > 1 */
    int32_t  seqs_live;
    int32_t  max_seqs;
    int64_t  positions;    /* sum of committed lengths of live sequences */
    uint64_t cow_copies;   /* blocks copied because a shared block was about to be
                              written */
    uint64_t nomem_errors; /* reservations refused because the pool was full */
    /* the ring pool (zeros without a ring) */
    size_t   ring_pool_bytes;
    int32_t  ring_blocks;
    int32_t  ring_blocks_free;
    int64_t  ring_positions; /* windowed-layer positions the live sequences hold */
} ag_kv_stats;

/* Defaults for everything but the model shape (n_layers, n_kv_heads,
 * head_dim_k, head_dim_v stay 0 and must be set). */
ag_kv_params ag_kv_default_params(void);

/* Validates `p`'s shape and computes the layout ag_kv_init would give it,
 * and the pool's block count for its budget (0 if below one block; n_blocks
 * may be NULL), without allocating anything. Errors: ag_kv_init's
 * AG_ERR_INVALID and AG_ERR_UNSUPPORTED. */
ag_status ag_kv_layout_for(const ag_kv_params *p, ag_kv_layout *out, int32_t *n_blocks);

/* The budget (for ag_kv_params.budget_bytes) of a pool that holds n_seqs
 * sequences of n_ctx positions each, every one in blocks of its own. */
size_t ag_kv_budget_for(const ag_kv_layout *lay, int32_t n_seqs, int32_t n_ctx);

/* Every byte ag_kv_init(p) allocates (the pool, whose pages the OS commits
 * as blocks are first written, and the metadata), plus the block tables of
 * max_seqs sequences of max_len positions: what a cache in full use holds.
 * This is ag_kv_stats' pool_bytes + meta_bytes at that point. */
ag_status ag_kv_memory_bytes(const ag_kv_params *p, int32_t max_len, size_t *bytes);

/* Validates `p` and allocates the pool (one counted allocation; pages are
 * committed lazily by the OS as blocks are first written). On success *out
 * owns everything; free with ag_kv_free. Errors: AG_ERR_INVALID (bad shape,
 * block size not a power of two in [8, 256]), AG_ERR_UNSUPPORTED (dtype not
 * implemented), AG_ERR_NOMEM (budget below one block, or allocation failed). */
ag_status ag_kv_init(const ag_kv_params *p, ag_kv **out);

/* Releases the pool and all sequences. NULL-safe. Every pointer handed out
 * becomes invalid. */
void ag_kv_free(ag_kv *kv);

/* The layout; borrowed, valid until ag_kv_free. */
const ag_kv_layout *ag_kv_get_layout(const ag_kv *kv);

/* Whether block memory is host memory (ag_kv_block_k/_v may be read and
 * written by host code). False for a pool in device memory: use
 * ag_kv_block_copy_in/_out, which go through the ag_kv_mem hooks. */
bool ag_kv_host_visible(const ag_kv *kv);

/* A host buffer of `bytes` for copies to and from the memory `mem`
 * describes (NULL: host memory): pinned where mem offers it
 * (ag_kv_mem.host_alloc), else, or when that fails, malloc's; 16-byte
 * aligned; NULL when out of memory. The disk tier stages restores in them,
 * the engine receives its logits rows in them. Free with
 * ag_kv_mem_host_free (which knows which kind each one is). */
void *ag_kv_mem_host_alloc(const ag_kv_mem *mem, size_t bytes);
void  ag_kv_mem_host_free(const ag_kv_mem *mem, void *p); /* NULL-safe */
/* The same for the pool's memory. */
void *ag_kv_host_alloc(ag_kv *kv, size_t bytes);
void  ag_kv_host_free(ag_kv *kv, void *p);

/* Blocks free in the pool now; O(1) (a scheduler asks every step). */
int32_t ag_kv_free_blocks(const ag_kv *kv);

/* Fills *out with counters; O(n_blocks) (scans refcounts for `shared`). */
void ag_kv_get_stats(const ag_kv *kv, ag_kv_stats *out);

/* Sliding-window size of a layer (0 = global; also 0 for a bad layer). */
int32_t ag_kv_layer_window(const ag_kv *kv, int32_t layer);

/* Whether a layer lives in the ring pool (its block ids are ring ids). */
bool ag_kv_layer_ring(const ag_kv *kv, int32_t layer);

/* The distance in bytes between block b and b + 1 of one layer: the main
 * pool's block_bytes, or the ring's ring_block_bytes (device kernels
 * address blocks as ag_kv_block_k(kv, layer, 0) + id * this). */
size_t ag_kv_layer_block_stride(const ag_kv *kv, int32_t layer);

/* The ring pool's blocks that n_seqs sequences hold at most, their windows
 * and `step` positions reserved past them (all together), without the
 * prefix cache's share (0 without a ring). */
int32_t ag_kv_ring_blocks_for(const ag_kv_params *p, int32_t n_seqs, int32_t step);

/* Bytes of the ring pool ag_kv_init(p) allocates (0 without a ring). */
size_t ag_kv_ring_pool_bytes(const ag_kv_params *p);

/* Called when a ring reservation finds too few free ring blocks: should
 * free up to n ring blocks nobody but the callee holds (the prefix cache's)
 * and return how many it freed. One hook; NULL to remove it. */
typedef int32_t (*ag_kv_ring_reclaim_fn)(void *user, int32_t n);
void ag_kv_set_ring_reclaim(ag_kv *kv, ag_kv_ring_reclaim_fn fn, void *user);

/* ---- sequences ---------------------------------------------------------- */

/* Creates an empty sequence; *seq gets the lowest free id in [0, max_seqs).
 * AG_ERR_NOMEM when max_seqs sequences are live. */
ag_status ag_kv_seq_new(ag_kv *kv, int32_t *seq);

/* Ends a sequence: drops its reference on each of its blocks (blocks nobody
 * else holds return to the pool now) and frees the id for reuse.
 * AG_ERR_INVALID for an id that is not live. */
ag_status ag_kv_seq_free(ag_kv *kv, int32_t seq);

/* Whether `seq` is a live sequence id. */
bool ag_kv_seq_live(const ag_kv *kv, int32_t seq);

/* Committed length of a live sequence; -1 if `seq` is not live. */
int32_t ag_kv_seq_len(const ag_kv *kv, int32_t seq);

/* The sequence's block table: *n_blocks entries, covering the committed and
 * the reserved positions (entry i holds positions [i*bs, (i+1)*bs)).
 * Borrowed; invalidated by any mutating call on this cache. NULL (and
 * *n_blocks = 0) for a sequence that is not live or has no blocks. */
const int32_t *ag_kv_seq_blocks(const ag_kv *kv, int32_t seq, int32_t *n_blocks);

/* The table of `seq` that `layer` reads: ag_kv_seq_blocks' for a main-pool
 * layer, the ring table for a ring layer (same length and indexing; entries
 * before the ring's first are -1 and never within a query's window).
 * Borrowed as ag_kv_seq_blocks'. */
const int32_t *ag_kv_seq_layer_blocks(const ag_kv *kv, int32_t seq, int32_t layer, int32_t *n_blocks);

/* The ring table alone (NULL without a ring); *first gets the first entry
 * that is not -1 (entries [*first, *n_blocks) are ring block ids). */
const int32_t *ag_kv_seq_ring_blocks(const ag_kv *kv, int32_t seq, int32_t *n_blocks, int32_t *first);

/* Recycles what ag_kv_seq_reserve would before a step: the ring blocks
 * whose positions all lie below len - W + 1 - ring_slack (nothing without a
 * ring). A caller that runs many sequences calls it for each at the start
 * of a step (after every rollback of the last one), so that a sequence
 * left out of a step does not keep its last step's positions: the ring
 * pool's size (params.ring_step) counts on it. */
void ag_kv_seq_recycle(ag_kv *kv, int32_t seq);

/* Makes positions [len, len + n_new) writable: allocates the missing blocks
 * and copies (copy-on-write) any block of that range that is shared, so the
 * writes that follow touch only storage this sequence owns alone. Idempotent
 * and cumulative: the writable end becomes max(old end, len + n_new).
 * All-or-nothing: AG_ERR_NOMEM ("KV cache full: need N blocks, M free")
 * leaves the cache unchanged. AG_ERR_INVALID for a bad seq or n_new < 0. */
ag_status ag_kv_seq_reserve(ag_kv *kv, int32_t seq, int32_t n_new);

/* The blocks ag_kv_seq_reserve(kv, seq, n_new) would take from the pool
 * now: the missing ones plus a copy of each shared block in the range (0
 * when the range is already reserved and owned). -1 for a sequence that is
 * not live or n_new < 0. Lets a scheduler size a step to the free blocks
 * before it reserves anything. */
int32_t ag_kv_reserve_cost(const ag_kv *kv, int32_t seq, int32_t n_new);

/* Locates the storage of position `pos` for writing: *block (pool id) and
 * *offset (0..block_size-1). Requires len <= pos < reserved end and that the
 * block is owned by this sequence alone; otherwise AG_ERR_INVALID (which
 * means the protocol was broken: e.g. a fork or block_ref since the reserve
 * shared the tail again; reserve again to copy it). */
ag_status ag_kv_slot(const ag_kv *kv, int32_t seq, int32_t pos, int32_t *block, int32_t *offset);

/* ag_kv_slot for one layer: the ring block for a ring layer. */
ag_status ag_kv_layer_slot(const ag_kv *kv, int32_t seq, int32_t layer, int32_t pos, int32_t *block,
                           int32_t *offset);

/* Sets the committed length to new_len, which must lie in [len, reserved
 * end] (use ag_kv_trim to shorten). Positions [old len, new_len) become
 * history: the caller promises they were written. */
ag_status ag_kv_seq_commit(ag_kv *kv, int32_t seq, int32_t new_len);

/* ---- trim and fork ------------------------------------------------------ */

/* Whether this cache can always trim (every position stored): false with a
 * ring, whose trims are limited (ag_kv_trim_limit). */
bool ag_kv_can_trim(const ag_kv *kv);

/* How many positions ag_kv_trim(kv, seq, n) can drop now, i.e. how far back
 * a rollback can go: len without a ring, else len - (rlo * block_size + W -
 * 1) for a ring that starts at logical block rlo > 0 (never below 0); with
 * recurrent state, no more than ag_kv_state_trim_limit (its snapshots).
 * -1 for a sequence that is not live. */
int32_t ag_kv_trim_limit(const ag_kv *kv, int32_t seq);

/* Whether ag_kv_trim(kv, seq, n) would succeed now: seq live and
 * 0 <= n <= ag_kv_trim_limit. */
bool ag_kv_trimmable(const ag_kv *kv, int32_t seq, int32_t n);

/* Whether the sequence holds what a query at position m (< = len) reads of
 * its ring: the ring blocks of [max(0, m - W + 1), m). True without a ring.
 * (Fork and adopt at length m need it.) */
bool ag_kv_ring_covers(const ag_kv *kv, int32_t seq, int32_t m);

/* The first logical block whose ring entry a sequence of length len needs:
 * max(0, len - W + 1) / block_size (0 without a ring). */
int32_t ag_kv_ring_first_needed(const ag_kv *kv, int32_t len);

/* Drops the last n committed positions (speculative rollback) and any
 * reservation; blocks no longer covering a position are released (returned
 * to the pool if nobody else holds them). Afterwards the sequence is exactly
 * as if it had never gone past len - n: the next reserve/write/commit
 * overwrites the dropped positions. AG_ERR_RANGE if n < 0 or n > len,
 * AG_ERR_UNSUPPORTED if n > ag_kv_trim_limit (a ring no longer holds
 * what the shorter sequence needs). */
ag_status ag_kv_trim(ag_kv *kv, int32_t seq, int32_t n);

/* The recurrent state slots (kv/state.h) of a cache made with
 * state_layers > 0, else NULL. Borrowed. */
struct ag_state *ag_kv_state(ag_kv *kv);
/* How many trailing positions seq's recurrent state can drop now (its
 * snapshots); INT32_MAX for a cache without recurrent state. The one hook
 * ag_kv_trimmable / ag_kv_trim consult (a ring's own limit is the other). */
int32_t ag_kv_state_trim_limit(const ag_kv *kv, int32_t seq);

/* Empties a live sequence (all blocks released, len 0); always supported. */
ag_status ag_kv_seq_clear(ag_kv *kv, int32_t seq);

/* dst becomes a copy of src's first len committed positions. dst must be a
 * live sequence other than src; whatever it held is released first. Blocks
 * are SHARED, not copied, including a partially covered last block: each
 * gets one more reference, and whichever sharer writes into a shared block
 * first copies it (at its reserve), so neither side ever sees the other's
 * later writes. O(len / block_size), never allocates blocks, so it cannot
 * fail for lack of pool space. AG_ERR_INVALID / AG_ERR_RANGE for bad ids or
 * len outside [0, len(src)]. */
ag_status ag_kv_fork(ag_kv *kv, int32_t dst, int32_t src, int32_t len);
/* (With a ring, fork shares src's ring entries from ag_kv_ring_first_needed(len)
 * on, and fails with AG_ERR_UNSUPPORTED unless ag_kv_ring_covers(src, len).) */

/* ---- block hooks for the prefix cache ----------------------------------- */

/* One more reference to an allocated block (refcount > 0), so it outlives
 * the sequences that use it. AG_ERR_INVALID for a free or bad id. */
ag_status ag_kv_block_ref(ag_kv *kv, int32_t block);

/* Drops a reference; at 0 the block returns to the pool. AG_ERR_INVALID for
 * a free or bad id. */
ag_status ag_kv_block_unref(ag_kv *kv, int32_t block);

/* Current refcount of a block (0 = free, -1 = bad id). */
int32_t ag_kv_block_refcount(const ag_kv *kv, int32_t block);

/* Takes a block from the pool with refcount 1 held by the caller (to fill
 * with ag_kv_block_copy_in when restoring from disk, then adopt and unref).
 * Its contents are unspecified. AG_ERR_NOMEM when the pool is empty. */
ag_status ag_kv_block_alloc(ag_kv *kv, int32_t *block);

/* seq (live; its contents are released first) becomes a sequence of length
 * len over `blocks` (n_blocks ids, each allocated, i.e. held by someone),
 * taking one reference on each; the blocks are shared, not copied, and a
 * write into a shared one copies it first as after a fork. Requires
 * (n_blocks - 1) * block_size < len <= n_blocks * block_size (or both 0).
 * `blocks` is read during the call only. */
ag_status ag_kv_seq_adopt(ag_kv *kv, int32_t seq, const int32_t *blocks, int32_t n_blocks,
                          int32_t len);

/* ag_kv_seq_adopt with the ring: ring[i] is the ring block of logical block
 * i or -1; entries from ag_kv_ring_first_needed(len) to n_blocks - 1 must be
 * allocated ring blocks (else AG_ERR_UNSUPPORTED), and the table takes one
 * reference on each of the contiguous run of present entries ending at the
 * last. ring may be NULL without a ring (then it is ag_kv_seq_adopt). */
ag_status ag_kv_seq_adopt_ring(ag_kv *kv, int32_t seq, const int32_t *blocks, const int32_t *ring,
                               int32_t n_blocks, int32_t len);

/* The block hooks above for ring blocks (ids of the ring pool). */
ag_status ag_kv_ring_block_ref(ag_kv *kv, int32_t block);
ag_status ag_kv_ring_block_unref(ag_kv *kv, int32_t block);
int32_t   ag_kv_ring_block_refcount(const ag_kv *kv, int32_t block);
ag_status ag_kv_ring_block_alloc(ag_kv *kv, int32_t *block);

/* Size in bytes of one block's data for one layer in the portable copy
 * format: K [n_kv_heads][block_size][head_dim_k] then V [...][head_dim_v],
 * elements of dtype, no padding (= layout.copy_bytes). A persisted block is
 * n_layers of these. */
size_t ag_kv_block_bytes(const ag_kv *kv);

/* Copies layer `layer` of block `block` out to dst (size must equal
 * ag_kv_block_bytes). The block must be allocated; for a ring layer it is a
 * ring block id (ag_kv_layer_ring). Positions past the
 * owners' lengths hold whatever was last written there (zeros if never). */
ag_status ag_kv_block_copy_out(const ag_kv *kv, int32_t block, int32_t layer, void *dst,
                               size_t size);

/* Copies src (ag_kv_block_bytes bytes) into layer `layer` of block `block`,
 * which must have refcount exactly 1 (yours, e.g. from ag_kv_block_alloc):
 * shared blocks are immutable. */
ag_status ag_kv_block_copy_in(ag_kv *kv, int32_t block, int32_t layer, const void *src,
                              size_t size);

/* ---- swap (preemption) --------------------------------------------------- */

/* Bytes of host memory a sequence of len committed positions takes when
 * swapped out: its blocks whole, every layer, as the pool stores them (of
 * the ring, the blocks from ag_kv_ring_first_needed(len) on). */
size_t ag_kv_swap_bytes(const ag_kv *kv, int32_t len);

/* Copies the committed history of `seq` (its first blocks_for(len) blocks,
 * whole) into dst (ag_kv_swap_bytes(kv, len) bytes, host memory: pinned
 * from ag_kv_host_alloc moves fastest), so that the sequence can be freed
 * and later rebuilt bit for bit by ag_kv_seq_swap_in. *len gets the
 * committed length. Errors: AG_ERR_INVALID (not live, wrong size),
 * AG_ERR_IO (a device copy failed). The sequence is not changed. */
ag_status ag_kv_seq_swap_out(const ag_kv *kv, int32_t seq, void *dst, size_t size, int32_t *len);

/* Rebuilds a swapped-out history: `seq` (live; whatever it held is
 * released first) gets blocks_for(len) fresh blocks of its own, filled from
 * src (what ag_kv_seq_swap_out wrote for that len), and length len.
 * All-or-nothing: AG_ERR_NOMEM when the pool has too few free blocks,
 * AG_ERR_IO when a device copy failed (the sequence is then empty). */
ag_status ag_kv_seq_swap_in(ag_kv *kv, int32_t seq, int32_t len, const void *src, size_t size);

/* ---- data access -------------------------------------------------------- */

/* Base of the K (resp. V) region of (layer, block): [n_kv_heads][block_size]
 * [head_dim] elements of dtype, strides in ag_kv_layout. Borrowed, valid
 * until ag_kv_free (the pool never moves). NULL for an out-of-range layer or
 * block id. Write only into slots given by ag_kv_slot. A device address when
 * the pool is in device memory (!ag_kv_host_visible). */
void *ag_kv_block_k(ag_kv *kv, int32_t layer, int32_t block);
void *ag_kv_block_v(ag_kv *kv, int32_t layer, int32_t block);

/* Convenience write of one position in one layer, all kv heads: k is
 * [n_kv_heads][head_dim_k] floats, v is [n_kv_heads][head_dim_v], converted
 * to dtype. Same preconditions as ag_kv_slot (pos in [len, reserved end),
 * exclusive block). Either of k, v may be NULL to skip it. */
ag_status ag_kv_write(ag_kv *kv, int32_t layer, int32_t seq, int32_t pos, const float *k,
                      const float *v);

/* Reads one position of one layer back as floats (same shapes as
 * ag_kv_write). pos must lie in [0, reserved end). k or v may be NULL. */
ag_status ag_kv_read(const ag_kv *kv, int32_t layer, int32_t seq, int32_t pos, float *k, float *v);

/* The element conversions used for AG_KV_F16 (IEEE binary16, round to
 * nearest even, overflow to inf, NaN kept NaN), exposed for kernels and
 * tests that read F16 rows directly. */
uint16_t ag_kv_f32_to_f16(float f);
float    ag_kv_f16_to_f32(uint16_t h);

#endif
