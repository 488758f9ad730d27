/* Internals of src/cache shared by cache.c (index, memory tier) and disk.c
 * (records, scan, writer thread, restore). Not a public API. */
#ifndef AG_CACHE_IMPL_H
#define AG_CACHE_IMPL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "cache/cache.h"

/* Where a block's record stands on disk. */
enum { D_NONE = 0, D_QUEUED, D_ON };

/* The three intrusive lists a node can be on. */
enum { L_MEM = 0, L_DISK, L_DIRTY, L_HOST, L_COUNT };

typedef struct {
    int32_t prev, next;
} cache_link;

typedef struct {
    int32_t head, tail; /* head: most recently used / first queued */
    int32_t n;
} cache_list;

/* One block known to either tier. Ids index c->nodes; `gen` changes each
 * time an id is reused, so (parent_id, parent_gen) names the parent node
 * exactly: in memory a prefix is verified by identity, not only by key.
 * A node of n_tok < block size tokens is a PARTIAL block (the trailing
 * tokens of a prompt): a leaf, never a parent. */
typedef struct {
    ag_cache_key key, parent;
    uint64_t     ns;
    int64_t      mtime_ns; /* disk record's mtime (scan order) */
    /* Recency, CLOCK_REALTIME ns like the records' mtimes: a touch sets
     * now - depth (a parent is always more recent than its continuation);
     * the scan sets the record's mtime. The disk cap compares a record it
     * would write with the one it would delete for it. */
    int64_t      used_ns;
    uint32_t     gen;
    int32_t      depth;     /* block index within the prompt */
    int32_t      n_tok;     /* valid tokens: the block size, or fewer for a partial block */
    int32_t      parent_id; /* -1: root block, or parent unknown */
    uint32_t     parent_gen;
    int32_t      hnext;     /* hash chain; free list when unused */
    int32_t      cnext;     /* chain of the children index (see cache_child_head) */
    int32_t      block;     /* kv block held by the cache, -1 none */
    int32_t      rblock;    /* its sliding-window ring block held by the cache (kv.h), -1 none; only
                               with block >= 0 */
    int32_t      hslot;     /* host tier slot holding its KV, -1 none; only with block < 0 */
    cache_link   link[L_COUNT];
    int32_t      n_mem_children, n_disk_children;
    uint8_t      disk;       /* D_* */
    uint8_t      on_list[L_COUNT];
    uint8_t      no_write;   /* do not (re)write: failed, or evicted by the cap */
    uint8_t      disk_full;  /* its record holds every layer (else not the ring's: AG_CACHE_RECORD_NO_RING) */
    uint8_t      used;       /* slot in use */
    uint8_t      host_ring;  /* its host slot holds the ring layers too */
} cache_node;

/* A record the scan found valid. */
typedef struct {
    ag_cache_key key, parent;
    uint64_t     ns;
    int64_t      mtime_ns;
    int32_t      depth, n_tok;
    size_t       tok_off; /* block_size ids at c->scan_tokens + tok_off (zero past n_tok) */
    bool         full;    /* every layer (no AG_CACHE_RECORD_NO_RING) */
} scan_item;

/* A copied-out block waiting for the writer. */
typedef struct write_job {
    struct write_job *next;
    int32_t           node;
    int32_t           depth;
    ag_cache_key      key;
    uint8_t          *buf; /* header + payload */
    size_t            size;
} write_job;

/* What became of a queued record. W_NOSPACE: the file system is full (or
 * a size limit was hit): writing pauses (see disk_space_pause). W_DEFERRED:
 * not tried, because a write before it found the disk full. */
enum { W_WRITTEN = 0, W_EXISTS, W_FAILED, W_NOSPACE, W_DEFERRED };

/* What became of one block of a restore. */
enum { RS_PENDING = 0, RS_OK, RS_BAD, RS_GONE };

/* One block of a restore's prefix, in prompt order. */
typedef struct {
    int32_t      node; /* index node id, and its gen when the restore began */
    uint32_t     gen;
    int32_t      block;     /* kv block the restore holds a reference on, or -1 */
    int32_t      rblock;    /* ring block it holds a reference on, or -1 */
    bool         want_ring; /* the adopted length's window covers it: its ring block is needed */
    bool         from_disk; /* its record is read (else the memory tier had it) */
    int32_t      use;       /* positions of it the sequence adopts: the block size but
                               for the last entry of a partial match */
    /* What the reader checks the record against (copied at the start: the
     * reader never reads the index). Tokens: r->tokens + i * bs, the
     * node's own (zero past n_tok). */
    ag_cache_key key, parent;
    int32_t      depth, n_tok;
    /* Written by the reader once, under mu, then handed over: */
    int32_t      result; /* RS_*: RS_PENDING until the reader is done with it */
    uint8_t     *buf;    /* RS_OK: the verified record (a staging buffer) */
} restore_entry;

/* A restore in progress. Owned by the engine thread, shared with the reader
 * while `reader_has` (under mu): the reader writes only entries' result and
 * buf and `next_read`; whoever lets go of it last frees it. */
struct ag_cache_restore {
    struct ag_cache_restore *next; /* the reader's queue */
    int32_t                  seq;
    uint64_t                 ns;
    int32_t                  n;      /* entries */
    restore_entry           *e;
    int32_t                 *tokens; /* n * bs */
    int32_t                  done;   /* engine: entries [0, done) hold their block */
    int32_t                  end;    /* engine: the prefix ends before this entry */
    int64_t                  t_start;
    int32_t                  hinted; /* readers, under mu: entries [0, hinted) were read ahead */
    int32_t                  from_host; /* positions copied back from the host tier at the start */
    int32_t                  readers_on; /* under mu: readers reading one of its records now */
    /* under mu */
    int32_t next_read;  /* reader: the next entry to look at */
    bool    reader_has; /* queued for, or being read by, a reader */
    bool    abandoned;  /* the engine let go: the reader frees it */
    bool    stop_read;  /* no more records are wanted */
};

/* A staging buffer on the free list (the buffer itself holds the link). */
typedef struct staging_buf {
    struct staging_buf *next;
} staging_buf;

typedef struct {
    int32_t node;
    int32_t result; /* W_* */
} write_done;

struct ag_cache {
    ag_kv              *kv;
    ag_cache_params     p;
    const ag_kv_layout *lay;
    int32_t             bs;
    uint64_t            identity; /* seed of the chain hash */
    size_t              block_payload; /* n_layers * copy_bytes */
    size_t              header_bytes, record_bytes;

    /* index (engine thread) */
    cache_node *nodes;
    int32_t    *tokens; /* [cap * bs] */
    int32_t     cap, n_used, free_head;
    int32_t    *buckets;  /* key -> node (hnext chains) */
    int32_t    *cbuckets; /* (parent key, namespace, first token) -> children (cnext chains),
                             same size as buckets */
    uint32_t    bucket_mask;
    cache_list  list[L_COUNT];
    int32_t    *path; /* scratch: [path_cap] node ids / blocks / ring blocks */
    int32_t    *path_blocks;
    int32_t    *path_rblocks;
    bool        ring; /* the kv keeps sliding-window layers in a ring (kv.h): nodes hold ring blocks too */
    int32_t     path_cap;

    /* disk tier */
    char       *dir;
    int         dirfd;   /* -1: tier off */
    bool        disk_on; /* reads */
    atomic_bool write_on;
    uint64_t    disk_max;   /* the cap in force: cap_base, or less after a full disk */
    uint64_t    cap_base;   /* the cap asked for (params), or the default */
    int64_t     n_on_disk;  /* records this process knows are on disk */
    /* Records handed to the writer and not yet drained (D_QUEUED): they
     * count against the cap as if written, so that the records of this
     * process, written, being written or queued, never exceed it. */
    int64_t     n_queued;
    /* A full disk pauses writing until space_retry_ns (monotonic; 0: not
     * paused), for space_backoff_ns (doubling while it stays full; 0 again
     * after a record is written). */
    int64_t     space_retry_ns;
    int64_t     space_backoff_ns;
    bool        space_warned; /* the one warning was logged */
    bool        cap_warned;   /* "the cap holds no record" was logged */
    atomic_bool space_short;  /* the writer defers its queue (W_DEFERRED) */
    atomic_int  space_errno;  /* what the failed write said, for the log */
    uint64_t    free_at_start; /* bytes free when the tier opened */
    bool        cap_explicit;
    bool        scan_merged;

    /* shared with the background thread, under mu */
    pthread_mutex_t mu;
    pthread_cond_t  cv;      /* the writer waits for jobs */
    pthread_cond_t  cv_done; /* flush waits for progress */
    pthread_t       thread;
    bool            thread_started, stop;
    int32_t         writers_busy;  /* records being written (the writer, and a flush helping) */
    int64_t         writer_wake_ns; /* monotonic: the writer fires notify then (a pause ends); 0 none */
    write_job      *q_head, *q_tail;
    size_t          q_bytes;
    write_done     *done;
    int32_t         n_done, cap_done;
    write_done     *done2; /* the engine thread's half of the double buffer */
    int32_t         cap_done2;
    bool            scan_ready;    /* scan results waiting to be merged */
    bool            scan_finished; /* the scan ran (never reset) */
    bool            dir_dirty;     /* renames since the last directory fsync */
    scan_item      *scan;
    int32_t         n_scan;
    int32_t        *scan_tokens;
    ag_cache_stats  st; /* counters; the node counts are refreshed on the engine thread */

    /* the reader threads, under mu */
    pthread_t         readers[16];
    int32_t           n_readers; /* running (counts down as they stop) */
    int32_t           n_readers_started;
    bool              reader_started;
    pthread_cond_t    cv_read;  /* the reader waits for jobs and staging room */
    ag_cache_restore *rq_head, *rq_tail;
    staging_buf      *staging_free;
    int32_t           staging_n, staging_max; /* buffers allocated (free or in use), most */

    /* host tier (engine thread) */
    int32_t   host_max;     /* slots at most; 0: tier off */
    int32_t   host_n;       /* slots allocated (in use or free) */
    int32_t   host_used;    /* slots holding a block */
    uint8_t **host_slot;    /* [host_n] slot -> its bytes (block_payload) */
    int32_t  *host_free;    /* [host_n] stack of free allocated slots */
    int32_t   host_n_free;
    void    **host_chunks;  /* ag_kv_host_alloc allocations the slots are carved from */
    int32_t   host_n_chunks;
};

/* cache.c */
/* The key of a block of n_tok tokens (the block size: a full block) under
 * parent, in this cache's identity. */
ag_cache_key cache_chain_key(const ag_cache *c, ag_cache_key parent, uint64_t ns, const int32_t *tokens,
                             int32_t n_tok);
uint64_t     cache_identity(uint64_t model_fp, uint64_t tok_fp, uint64_t compute_fp, ag_kv_dtype dtype,
                            int32_t bs, int32_t nl, int32_t nh, int32_t dk, int32_t dv, int32_t key_bits);
/* The chain key of a block of n tokens of a block_size kv: the full form
 * when n == block_size, else the partial form (see cache.h, UNIT AND KEY). */
ag_cache_key cache_key_compute(uint64_t identity, int32_t key_bits, ag_cache_key parent, uint64_t ns,
                               const int32_t *tokens, int32_t n, int32_t block_size);
int32_t      cache_find(const ag_cache *c, ag_cache_key key);
/* A new node of n_tok tokens (copied; the rest of its token row is zeroed),
 * in the key index and the children index. -1 when out of memory. */
int32_t      cache_node_new(ag_cache *c, ag_cache_key key, ag_cache_key parent, uint64_t ns, const int32_t *tokens,
                            int32_t n_tok);
/* The first node of the children-index chain that holds the children of
 * `parent` in namespace ns whose first token is `first` (follow cnext; the
 * chain also holds others: compare parent, ns and the first token). */
int32_t      cache_child_head(const ag_cache *c, ag_cache_key parent, uint64_t ns, int32_t first);
/* Partial siblings made redundant by node id (a block of the same parent
 * whose tokens start with all of theirs) leave both tiers; returns true
 * when id itself is such a redundant partial block and was dropped. */
bool         cache_supersede(ag_cache *c, int32_t id);
void         cache_node_maybe_remove(ag_cache *c, int32_t id);
void         cache_list_push_head(ag_cache *c, int which, int32_t id);
void         cache_list_push_tail(ag_cache *c, int which, int32_t id);
/* Puts id right behind `after` (on the tail side), or at the head if after < 0. */
void         cache_list_insert_behind(ag_cache *c, int which, int32_t after, int32_t id);
void         cache_list_remove(ag_cache *c, int which, int32_t id);
static inline int32_t *cache_node_tokens(const ag_cache *c, int32_t id) { return c->tokens + (size_t)id * c->bs; }
void         cache_parent_link(ag_cache *c, int32_t id, int32_t parent); /* sets parent_id/gen */
int32_t      cache_parent(const ag_cache *c, int32_t id); /* valid parent id or -1 */
/* A block's payload (every layer at copy_bytes apart, as a record and a
 * host slot hold it) copied out of node n's blocks: its main block's
 * layers, its ring block's ring layers, zeros for ring layers without one.
 * The first failure is returned. */
ag_status cache_payload_out(ag_cache *c, const cache_node *n, uint8_t *dst);
/* The layers of one kind (ring_layers: the sliding-window layers, else the
 * rest) of payload src copied into pool block b (a ring block for ring
 * layers). The first failure is returned. */
ag_status cache_payload_in(ag_cache *c, int32_t b, bool ring_layers, const uint8_t *src);
int64_t      cache_now_ns(void);      /* CLOCK_MONOTONIC */
int64_t      cache_real_now_ns(void); /* CLOCK_REALTIME: the records' mtime clock */

/* disk.c */
void    disk_open(ag_cache *c);   /* from ag_cache_new */
void    disk_close(ag_cache *c);  /* from ag_cache_free: stops the thread */
void    disk_drain(ag_cache *c);  /* merge scan results and finished writes */
void    disk_enforce_cap(ag_cache *c);
/* A write found the disk full: lowers the cap in force, deletes down to
 * it and pauses writing (see cache.h). */
void    disk_space_pause(ag_cache *c);
bool    disk_queue_writes(ag_cache *c, size_t max_bytes);
/* Restores (disk.c; engine thread unless said). */
bool    disk_can_read(const ag_cache *c); /* the reader runs: records can be restored */
void    disk_restore_submit(ag_cache *c, ag_cache_restore *r); /* queue r's disk entries for the reader */
/* Blocks until entry r->done's result is in (ag_cache_lookup). */
void    disk_restore_wait(ag_cache *c, ag_cache_restore *r);
/* The result of entry i (RS_PENDING while the reader is on it), and its
 * buffer, which the caller then owns (give it back: disk_staging_put). */
int32_t disk_restore_take(ag_cache *c, ag_cache_restore *r, int32_t i, uint8_t **buf);
void    disk_staging_put(ag_cache *c, uint8_t *buf);
/* Entry i's record was bad or gone (the reader logged it and deleted a bad
 * one): the index forgets it. */
void    disk_restore_failed(ag_cache *c, const restore_entry *en, int32_t result);
/* The engine lets go of r: frees it, or leaves that to the reader. */
void    disk_restore_release(ag_cache *c, ag_cache_restore *r);

/* The node's record left the disk (evicted, gone, dropped): accounting. */
void    disk_forget(ag_cache *c, int32_t id);
/* Deletes the node's record file and forgets it (the byte cap, a
 * superseded partial block); false (writing turned off) if it could not. */
bool    disk_delete_record(ag_cache *c, int32_t id);
void    disk_flush_wait(ag_cache *c);
/* The host tier lets go of node id (not on disk yet): queue its record for
 * the writer from its host slot (a copy of one record on the calling
 * thread; no file I/O), if the disk is writable, the cap has room without
 * deleting a record and the write queue has room. true when queued. */
bool    disk_queue_from_host(ag_cache *c, int32_t id);
/* The record bytes of node id's block (header + payload) into buf, from the
 * pool block or the host slot; false (logged) when a copy fails. */
bool    disk_record_build(ag_cache *c, int32_t id, uint8_t *buf);

#endif
