/* Prefix cache: KV blocks of finished (or fully prefilled) prompts, kept in
 * memory and written behind to disk, so that any later prompt that starts
 * with the same tokens, in any conversation, before or after a restart,
 * adopts them instead of recomputing them (DESIGN.md, "The disk tier, in
 * behaviour"; issue 10).
 *
 * UNIT AND KEY. The unit is one kv block of PROMPT-written KV (see
 * ag_batch.n_prompt: decode-written KV rounds differently, so it is never
 * shared): a FULL block, or the PARTIAL block that holds a prompt's last
 * m = n_prompt % block_size tokens (1 <= m < block_size). Block i of a
 * prompt is keyed by a 128-bit chain hash
 *     key(i) = XXH3-128(seed = identity, key(i-1) | namespace | tokens of block i)
 * and a partial block by
 *     key(i) = XXH3-128(seed = identity, key(i-1) | namespace | 0x80000000 << 32 | m
 *                       | its m tokens)
 * (64-bit words and 32-bit token ids, little-endian; the marker word keeps
 * the two forms' inputs distinct: where their lengths agree, its top byte
 * 0x80 sits where a full block has a token id's top byte, which is < 0x80),
 * where key(-1) = 0 and `identity` hashes the model and tokenizer
 * fingerprints, the compute fingerprint and the KV layout (so records of
 * different models never even share a file name). Every match compares the
 * block's actual token ids, namespace and position, never the hash alone.
 * Its parent is the block matched just before: the index maps a key to one
 * block and each block records its parent's key, so a lookup verifies the
 * whole prefix token by token, up to the uniqueness of 128-bit keys (XXH3 is
 * not a cryptographic hash: a tenant able to craft collisions could poison
 * its own namespace, not another's). Prompts that share a system prompt
 * share its blocks, in memory and on disk, with no bookkeeping of which
 * prompt superseded which.
 *  - A lookup follows the chain of whole blocks as far as the prompt
 *    matches them, then adopts PART of one more: of the cached children of
 *    the last matched block (a second index maps a parent key, namespace
 *    and first token to them, in memory and rebuilt at the scan), the one,
 *    full or partial, whose tokens share the longest run j >= 1 with the
 *    prompt's next ones (equal runs: the one in memory). The adopted length
 *    is (matched blocks) * block_size + j, capped by max_len; its last block
 *    is shared, so the sequence's first write copies it (copy-on-write, one
 *    block). Only the first j positions of that block are ever read by the
 *    adopter: a block's positions past a partial block's m tokens (decode
 *    wrote them) or past where the prompt leaves a full block never are.
 *  - A partial block is a leaf (never a parent) and is evicted like any
 *    leaf. It is REDUNDANT once a sibling (same parent, namespace, position)
 *    starts with all its tokens and holds more: every prompt shares at
 *    least as long a run with that sibling. Redundant partial blocks are
 *    dropped at once, from memory and disk, when the sibling is published
 *    (or found at the scan), and never indexed after it; a record whose
 *    write was in flight stays, an ordinary leaf that lookups pass over
 *    (its sibling wins every tie) and least-recently-used eviction takes.
 *
 * MEMORY TIER. An index over kv blocks: the cache holds one reference
 * (ag_kv_block_ref) on every block it indexes; sequences that adopt a prefix
 * (ag_kv_seq_adopt) hold their own. A block held by no sequence (refcount ==
 * the cache's 1) is "reclaimable": ag_cache_evict frees such blocks, least
 * recently used LEAF first (a block whose continuation is still cached is
 * kept as long as the continuation: the continuation is useless without it),
 * and never a block some sequence still holds.
 *
 * DISK TIER (optional: params.disk_dir). A directory of content-addressed
 * record files, one per block, named <32 hex digits of the key>.agkv. The
 * files are the database: there is no index file; a scan of the headers at
 * start (on the background thread, so startup does not wait for it) rebuilds
 * the index. Record = header (magic, format version, model / tokenizer /
 * compute fingerprints, KV layout, namespace, parent key, key, the number
 * of valid tokens (block_size, or m for a partial block), the block's token
 * ids, payload checksum, header checksum) + payload (the block's n_layers x
 * ag_kv_block_bytes in ag_kv_block_copy_out's format, also for a partial
 * block: one record size). A partial record is restored into a fresh block
 * like any other and adopted in part.
 * Why one record per block and not per run of blocks: the block is the
 * unit of sharing, so a system prompt shared by a thousand conversations is
 * stored once and evicted once, and a damaged file costs one block; a record
 * of a real model is 0.1-1 MiB, large enough that the per-file cost is
 * small; and a scan reads one small header per file: 1.3 s per 100,000
 * records (page cache warm, a shared 2-core machine, bench/cache_scan_bench),
 * on the background thread, so a server starts serving at once and disk
 * hits begin when the scan is merged.
 *  - Writes are write-behind: ag_cache_idle copies blocks not yet on disk
 *    (memcpy, bounded per call) on the engine thread and hands them to ONE
 *    background writer thread that does all file I/O: temp file in the same
 *    directory (<key>.<pid>-<n>.tmp), write, fsync, rename; the directory is
 *    fsynced once per drained batch. After its start-up scan the writer runs
 *    at SCHED_IDLE: it writes with CPU time nothing else on the machine
 *    wants, so a decode step that starts while records are being written is
 *    not slowed by them (the page-cache copies, checksums and file-system
 *    work cost about 1.2 ms of CPU per MB, which on 2 cores slowed decoding
 *    to 0.4-0.8x while a prompt was written; bench/RESULTS.md). It holds the
 *    cache mutex only for bookkeeping, never across I/O. ag_cache_flush
 *    writes on its caller's thread as well, so a shutdown on a busy machine
 *    does not wait for the idle-priority writer. A crash leaves either the whole record
 *    or a .tmp leftover, which the next scan deletes. A block already on disk
 *    (by this or another process) is never written twice.
 *  - Two processes on one directory never corrupt each other: names are
 *    content addresses and every record appears by an atomic rename, so a
 *    name holds either nothing or a complete record of exactly that content;
 *    a reader that has the file open keeps its inode even if the other
 *    process replaces or deletes the name. No lock is taken. A scan only
 *    deletes .tmp files whose writer process is gone (or that are older than
 *    an hour). Each process keeps its own byte accounting.
 *  - Records of another model, tokenizer, compute fingerprint or KV layout,
 *    corrupt (bad magic/version/header checksum/name) or truncated ones are
 *    deleted at the scan, with one log line each, and counted (dropped).
 *    A DIRECTORY SHOULD THEREFORE BELONG TO ONE MODEL: servers of different
 *    models on one directory delete each other's records at start; give
 *    each model its own subdirectory (e.g. DIR/<model fingerprint hex>).
 *  - Restore is streamed and never blocks the engine thread on the disk:
 *    ag_cache_lookup_start adopts what the memory tier has and, where the
 *    chain continues only on disk, hands the records to ONE background
 *    reader thread and returns a pending restore. The reader reads each
 *    record (in prompt order) into a staging buffer and verifies header,
 *    tokens and payload checksum there; ag_cache_restore_poll, called by
 *    the engine between its steps, copies the verified records into fresh
 *    kv blocks (ag_kv_block_copy_in) and, once the last one is in, makes the
 *    sequence adopt the whole prefix. Staging is bounded
 *    (params.read_staging_bytes, shared by all restores): the reader waits
 *    for the engine to consume records, so a long prompt is read through a
 *    window, and the copy per poll is at most that much memcpy. A failed
 *    record (bad checksum, short read, mismatching header) is deleted with a
 *    warning and ends the prefix there: the rest of the prompt is
 *    prefilled. Why staging and not a read straight into kv blocks: the
 *    blocks are then taken from the pool only on the engine thread, and a
 *    request that is cancelled mid-read gives
 *    everything back at once (the reader never holds a kv block), at the
 *    price of one memcpy per record, small next to the read.
 *  - A write that finds the disk full (ENOSPC, EDQUOT, or EFBIG: a size
 *    limit) PAUSES writing: the cap in force becomes half of what this
 *    process's records and the free space hold together (so the disk is
 *    not filled again and other programs keep room), least recently used
 *    records are deleted down to it at once, the records queued behind the
 *    failed one go back to wait, and writing resumes after a pause
 *    (params.space_retry_ms, doubling while the disk stays full, back to
 *    the first length after a record is written), with the cap recomputed
 *    from the space there is then. One warning the first time, an info
 *    line at later pauses. Any other failure (read-only directory,
 *    permissions, I/O error) turns WRITING off with one warning; serving
 *    goes on, and records already on disk are still restored (a read-only
 *    directory is a valid pre-filled cache). A directory that cannot be
 *    created or opened turns the disk tier off entirely, with one warning.
 *    No error reaches the caller in any case.
 *  - Byte cap (params.disk_max_bytes; default min(32 GiB, 10% of the free
 *    space plus what the records already use)), a HARD bound on this
 *    process's records: a record is copied out for the writer only once it
 *    fits under the cap together with every record on disk and every
 *    record already queued or being written (temp files included); to make
 *    room, least recently used records on disk are deleted, leaf first,
 *    unless the record to write is itself less recently used than all of
 *    them (then it is not written: deeper blocks of a prompt count as
 *    older than their parents, so a prompt longer than the cap keeps its
 *    first blocks, not its last). So the records of this process never
 *    take more than the cap, at any moment, counted in file bytes (the
 *    file system's allocation adds up to a block per record). Exceptions:
 *    a directory that held more than the cap when the server started
 *    (the scan's merge deletes down to the cap before anything is
 *    written), and records another process writes to the same directory
 *    (each process counts its own). The file mtime is the clock across
 *    restarts: a disk hit bumps it; memory hits reorder this process's
 *    list only.
 *
 * HOST TIER (optional: params.host_max_bytes). Between the pool and the
 * disk, like SGLang's HiCache: a block the memory tier evicts from the
 * pool (ag_cache_evict, or a restore taking a block) is first copied out,
 * every layer (and its ring block's layers, when it still has one), into a
 * slot of host memory, and the node keeps it there; the slots are carved
 * from ag_kv_host_alloc chunks (pinned on CUDA, so a copy back is one DMA
 * at the bus's speed) allocated as the tier fills and kept until
 * ag_cache_free. The tier holds at most host_max_bytes / block payload
 * slots; to make room it drops its least recently evicted block. A block
 * that leaves the host tier and is not on disk yet is queued for the
 * writer right then (its payload copied from the slot, as write-behind
 * does from the pool; the writer thread does the file I/O), where the disk
 * is writable, its cap has room without deleting a record (no file is
 * touched on the engine thread while a step makes room) and the write
 * queue has room; otherwise it is lost, as a pool eviction lost it
 * before. A lookup that reaches a block only the host tier holds copies it
 * into a fresh pool block at once, on the engine thread (a memcpy on the
 * CPU, a host-to-device copy on a GPU: no disk, no reader), and the block
 * leaves the host tier (a node is in the pool or in the host tier, never
 * both). Write-behind writes a host-tier block from its slot like a pool
 * one. Nothing of the tier survives a restart: the disk does that. A
 * superseded partial block is dropped, not moved to the host tier.
 *
 * THREADING. Every function is called from the one thread that owns the kv
 * (the engine thread), except ag_cache_get_stats, which any thread may call.
 * The cache starts background threads when the disk tier is on (the
 * scanner/writer and params.read_threads readers); none touches the kv or
 * the index.
 *
 * HOW THE ENGINE USES IT (ns = ag_cache_namespace(cache_salt or API key)):
 *  - Creation: after ag_kv_init, ag_cache_new(kv, &params) with the model's
 *    ag_model_fingerprint, the tokenizer's ag_tok_fingerprint, and a notify
 *    callback that wakes the engine thread (see below). The kv must outlive
 *    the cache: ag_cache_free before ag_kv_free.
 *  - Memory: blocks only the cache holds are free space to the engine
 *    (admission and step sizing count ag_cache_reclaimable with the free
 *    blocks; blocks it shares with running sequences are theirs); before a
 *    step reserves what it needs, it makes room:
 *        if (need > free) ag_cache_evict(c, need - free);
 *  - Admission, lookup: right after ag_kv_seq_new for choice 0, unless the
 *    request wants prompt logprobs (every prompt position's logits):
 *        int32_t n = ag_cache_lookup_start(c, seq, prompt, n_prompt, n_prompt - 1, ns,
 *                                          &r->restore);
 *        r->n_prefilled = r->n_cached = n;   // prefill starts at position n
 *    max_len = n_prompt - 1 leaves at least one prompt token to compute, for
 *    the logits that sample the first output token. The adopted length may
 *    end inside a block (the prompt again: n_prompt - 1), whose first write
 *    then copies it (copy-on-write) while the cache keeps the original,
 *    which is then the cache's alone (reclaimable): the engine's step
 *    sizing counts the copy (ag_kv_reserve_cost). Blocks restored from
 *    disk are taken from the pool.
 *    When r->restore is set, records are being read: the request stays out
 *    of the batch (it computes nothing) while the others go on stepping, and
 *    at every step (and whenever notify fired):
 *        if (ag_cache_restore_poll(c, r->restore, &n)) {
 *            r->restore = NULL; r->n_prefilled = r->n_cached = n;
 *        }
 *    after which the request prefills its tail like any other. A request
 *    that ends while restoring (client gone, shutdown) calls
 *    ag_cache_restore_cancel(c, r->restore) before freeing its sequence.
 *    ag_cache_lookup is the same thing, waiting (tests, tools).
 *  - Publish: the full blocks when the prompt is fully prefilled (so that
 *    requests admitted meanwhile already share them), and all of it, the
 *    trailing partial block too, when choice 0 finishes normally:
 *        ag_cache_publish(c, seq, prompt, n_prompt - n_prompt % bs, ns);  // prefilled
 *        ag_cache_publish(c, seq, prompt, n_prompt, ns);                  // choice 0 ends
 *    Only positions [0, n) are looked at: KV the sequence wrote while
 *    decoding is never published, so no trim is needed first. Why the
 *    partial block only at the end: published at prefill it would be shared
 *    while the request itself decodes into it, which would then copy it at
 *    its first decode step (a copy and a block more per request);
 *    published at the end it costs nothing, its decode-written positions
 *    being past what any adopter reads. Publishing twice is harmless. Then
 *    the engine frees the sequence as usual (ag_kv_seq_free); the cache
 *    keeps its refs. (This replaces the engine's `struct retained`.)
 *  - Memory pressure: on AG_ERR_NOMEM from ag_kv_seq_reserve (should not
 *    happen: the step was sized to the free blocks) ag_cache_evict(c,
 *    blocks needed) and retry.
 *  - Idle: in the engine loop, when a step had nothing to do:
 *        if (ag_cache_idle(c, 8u << 20)) continue;   // re-check the queue
 *        ... then wait on the condition variable, waking also when the
 *        notify callback fired (set a flag under the engine mutex; signal).
 *    notify is called from a background thread (never with a cache lock
 *    held) when it finished the start-up scan or drained its write queue,
 *    i.e. when another ag_cache_idle call would do something, and when the
 *    reader finished a record, i.e. when an ag_cache_restore_poll call would
 *    make progress. Write-behind is best skipped while restores are pending:
 *    the writer's I/O would compete with the reads a request is waiting for.
 *  - Shutdown: ag_cache_flush(c) (writes every block not yet on disk, waits
 *    for the writer: a restarted server then finds them), then
 *    ag_cache_free(c), then ag_kv_free.
 *  - Metrics: ag_cache_get_stats (thread-safe) for /metrics. */
#ifndef AG_CACHE_H
#define AG_CACHE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/status.h"
#include "kv/kv.h"

typedef struct ag_cache ag_cache;

/* A 128-bit chain key. */
typedef struct {
    uint64_t lo, hi;
} ag_cache_key;

typedef struct {
    /* What decides the KV bits, stamped into every record; a record whose
     * values differ is not used (and is dropped at the scan). */
    uint64_t model_fingerprint;   /* ag_model_fingerprint */
    uint64_t tok_fingerprint;     /* ag_tok_fingerprint */
    uint64_t compute_fingerprint; /* backend / kernel choice when it changes
                                     KV rounding (CPU vs CUDA); 0 if one */
    /* Disk tier directory (created if missing, one level), or NULL/"" for
     * the memory tier only. Copied. */
    const char *disk_dir;
    uint64_t    disk_max_bytes; /* byte cap; 0 = default (see above) */
    /* Most bytes copied out and waiting for the writer at once; default
     * 64 MiB. Bounds the heap the write-behind uses. */
    size_t write_queue_bytes;
    /* fsync each record before its rename (default true). false only for
     * tests and throwaway directories. */
    bool disk_sync;
    /* Scan the directory on the background thread (default true). false:
     * ag_cache_new returns after the scan (tests, the CLI). */
    bool background_scan;
    /* Called from the background thread when an ag_cache_idle call would
     * now make progress (scan finished, write queue drained). May be NULL.
     * Must not call into the cache. */
    void (*notify)(void *user);
    void *notify_user;
    /* Bits of the chain key kept: 0 = 128 (default). Lower only in tests, to
     * force hash collisions and exercise the token comparisons. */
    int key_bits;
    /* Most bytes of records read and waiting for the engine to copy them
     * into kv blocks, over all pending restores; default 32 MiB (at least
     * one record is always allowed). Bounds the heap restores use and the
     * memcpy of one ag_cache_restore_poll call. */
    size_t read_staging_bytes;
    /* Test hook: the reader sleeps this long before reading each record, so
     * that a test can watch what happens while a restore runs. 0: none. */
    uint32_t read_delay_us;
    /* After a full disk, writing pauses this long (doubling, up to 64
     * times, while the disk stays full); default 10 s (the engine takes
     * $AUGUR_TEST_KV_SPACE_RETRY_MS instead, a test hook). */
    uint32_t space_retry_ms;
    /* The HOST tier's byte bound (0: off). Blocks evicted from the kv pool
     * keep their KV in host memory (ag_kv_host_alloc: pinned where the pool
     * is device memory), least recently evicted dropped first once this is
     * full; a lookup that reaches such a block copies it back into the pool
     * at once, without the disk (see HOST TIER). Counted in whole blocks of
     * n_layers x copy_bytes (a bound below one block turns the tier off). */
    uint64_t host_max_bytes;
    /* Threads that read disk records for restores, each one record at a
     * time (parallel preads: a record is 0.1-1 MiB, and one pread at a time
     * leaves a fast device idle). Default 4; 1..16. */
    int read_threads;
} ag_cache_params;

ag_cache_params ag_cache_default_params(void);

/* Creates a cache over `kv` (borrowed: it must outlive the cache). With a
 * disk directory, opens it, checks that it is writable, and starts the
 * background thread, which scans it first. Disk trouble is never an error
 * here: the tier turns itself off (or read-only) with one warning, see
 * ag_cache_get_stats. Errors: AG_ERR_INVALID (no kv, bad key_bits),
 * AG_ERR_NOMEM. */
ag_status ag_cache_new(ag_kv *kv, const ag_cache_params *p, ag_cache **out);

/* Stops the background threads (the writer finishes the writes already
 * queued; it does not copy more: call ag_cache_flush first for that) and
 * drops the cache's reference on every block. Every pending restore must
 * have been finished or cancelled. NULL-safe. Call before ag_kv_free. */
void ag_cache_free(ag_cache *c);

/* The namespace of a tenant or adapter (e.g. a request's cache_salt or its
 * API key): a 64-bit hash of the bytes, so the secret itself is never
 * written to disk. 0 (the default namespace) for len 0. Prompts of
 * different namespaces never share blocks. */
uint64_t ag_cache_namespace(const void *data, size_t len);

/* A restore from the disk tier in progress (see ag_cache_lookup_start). */
typedef struct ag_cache_restore ag_cache_restore;

/* Finds the longest cached prefix of tokens[0..n_tokens) whose length does
 * not exceed max_len: full blocks as far as they match, then the first j
 * tokens of the cached continuation sharing the longest run with the
 * prompt (see UNIT AND KEY), and makes `seq` (live; whatever it held is
 * released) a sequence of that length over those blocks (ag_kv_seq_adopt:
 * shared, copy-on-write; a length inside a block means the first write
 * copies that block). Blocks are taken from the
 * memory tier first, then from the host tier (copied back into fresh pool
 * blocks during the call); where the chain continues only on disk, records are
 * restored into fresh pool blocks (which then join the memory tier), until
 * the first block that is not cached, fails to restore, or finds the pool
 * empty (after evicting reclaimable blocks not on this path).
 * Without disk records to read, that is done at once: *pending = NULL and
 * the adopted length is returned (0 on a miss; a multiple of the block
 * size when max_len is). Otherwise the reads are queued for the reader thread, `seq` is left
 * empty, 0 is returned and *pending is the restore, to be finished by
 * ag_cache_restore_poll or dropped by ag_cache_restore_cancel; until then
 * `seq` must not be used. Never fails: trouble is logged and ends the
 * prefix early. tokens are read during the call only. */
int32_t ag_cache_lookup_start(ag_cache *c, int32_t seq, const int32_t *tokens, int32_t n_tokens,
                              int32_t max_len, uint64_t ns, ag_cache_restore **pending);

/* Moves the records the reader has verified so far into kv blocks (copies
 * of at most params.read_staging_bytes), without waiting for the disk.
 * Returns false while records are still to come. Returns true when the
 * restore is over: the sequence then holds the adopted prefix, *len is its
 * length (whole blocks up to a record that failed; 0 if the first record
 * failed), and r is freed. */
bool ag_cache_restore_poll(ag_cache *c, ag_cache_restore *r, int32_t *len);

/* Abandons a pending restore (its request ended: client gone, shutdown):
 * gives back the blocks it holds (those already copied in stay in the
 * memory tier, reclaimable) and its staging buffers, and tells the reader
 * to skip the rest of its records. The sequence is left empty. r is freed
 * (or, if the reader is in the middle of one of its records, freed by the
 * reader right after; never used again by the caller either way).
 * NULL-safe. */
void ag_cache_restore_cancel(ag_cache *c, ag_cache_restore *r);

/* ag_cache_lookup_start, then waits for the reader and polls until the
 * restore is over: the adopted length. For tests and tools; the engine
 * uses the pair above so that a restore never stalls other sequences. Not
 * while another restore is pending: records staged for it, which only its
 * own polls take, could hold the whole staging budget. */
int32_t ag_cache_lookup(ag_cache *c, int32_t seq, const int32_t *tokens, int32_t n_tokens,
                        int32_t max_len, uint64_t ns);

/* Indexes the blocks of `seq` (live) that hold positions [0, n) computed
 * AS PROMPT from tokens[0..n), n = min(n_tokens, len(seq)): its full
 * blocks, then, when n is not a multiple of the block size, block n / bs
 * as a partial block of its first n % bs positions (dropped at once if a
 * sibling covers it, see UNIT AND KEY; a new full block drops the partial
 * siblings it covers). The caller promises that those positions were
 * written by prompt batches (ag_batch.n_prompt), i.e. n_tokens <= the
 * request's prompt length; positions of the last block past n may hold
 * anything (decode output): they are never adopted. The cache takes one
 * reference on each newly indexed block (the sequence keeps its own).
 * Where a block with the same content is already cached (e.g. the prefix
 * was adopted, or a concurrent request computed it too), the cached one is
 * kept. New blocks are queued for the disk writer. Returns the number of
 * tokens now covered by the index along this prompt (<= n; a partial block
 * a sibling covers counts as covered). tokens are read during the call
 * only. */
int32_t ag_cache_publish(ag_cache *c, int32_t seq, const int32_t *tokens, int32_t n_tokens,
                         uint64_t ns);

/* Frees up to n_blocks reclaimable blocks (held by the cache alone),
 * least recently used leaf first; with a host tier their KV is copied
 * there first (a memcpy, or a device-to-host copy, per block); blocks on
 * disk stay restorable. Returns the number of blocks returned to the
 * pool. */
int32_t ag_cache_evict(ag_cache *c, int32_t n_blocks);

/* Blocks held by the cache alone (refcount 1): what ag_cache_evict can
 * return to the pool right now. O(blocks in the memory tier). */
int32_t ag_cache_reclaimable(const ag_cache *c);

/* Write-behind step, for the engine's idle branch: picks up what the
 * background thread finished (scan results, written records), enforces the
 * disk byte cap, and copies out blocks not yet on disk, at most max_bytes of
 * them (at least one block if the writer is idle), handing them to the
 * writer. Cost on the calling thread: about max_bytes of memcpy. Returns
 * true when calling again right away would copy more (false: nothing left,
 * or the writer's queue is full; notify fires when that changes). */
bool ag_cache_idle(ag_cache *c, size_t max_bytes);

/* Blocks until the background scan is merged and every indexed block that
 * is not on disk has been written, or was left out by the byte cap (or the
 * tier is off, or writing is paused after a full disk: a flush does not
 * wait for the pause to end). For shutdown and tests. */
void ag_cache_flush(ag_cache *c);

typedef struct {
    uint64_t lookups, hits, misses; /* finished lookups; hit: at least one block adopted */
    uint64_t tokens_from_memory, tokens_from_disk;
    uint64_t tokens_from_host; /* copied back into the pool from the host tier */
    /* lookups that adopted at least one block from each tier (a lookup may
     * count in several) */
    uint64_t hits_memory, hits_host, hits_disk;
    uint64_t publishes, blocks_published; /* blocks newly indexed */
    uint64_t bytes_read, bytes_written;   /* record bytes (header + payload) */
    uint64_t restore_ns;  /* wall time of restores with disk records, from start to adoption */
    uint64_t restores_cancelled; /* pending restores abandoned (not counted in lookups) */
    int32_t  restores_pending;   /* restores now waiting for records */
    uint64_t records_written;
    uint64_t evictions_memory, evictions_disk;
    uint64_t evictions_host;  /* blocks the host tier let go (its bound) */
    uint64_t host_to_disk;    /* of those, records queued for the disk as they left (not written yet) */
    int32_t  host_blocks;     /* blocks the host tier holds */
    uint64_t host_bytes, host_max_bytes; /* their bytes (payload), and the bound (0: tier off) */
    uint64_t dropped_records; /* deleted at the scan or after a failed restore */
    uint64_t partials_superseded; /* partial blocks dropped because a longer block of
                                     the same parent starts with their tokens */
    uint64_t restore_failures;
    uint64_t write_failures; /* writes that failed, for a full disk too */
    uint64_t space_pauses;   /* writing paused after a full disk */
    uint64_t records_skipped; /* blocks the byte cap left unwritten (less recently used than
                                 every record on disk, or larger than the cap) */
    uint64_t queued_bytes;   /* records copied out for the writer, not yet on disk: with
                                disk_bytes, never more than disk_max_bytes */
    uint64_t records_on_disk, disk_bytes, disk_max_bytes;
    uint64_t scan_ns;       /* duration of the start-up scan */
    int32_t  memory_blocks; /* blocks the memory tier holds a reference on */
    int32_t  index_nodes;   /* blocks known to either tier */
    size_t   index_bytes;   /* heap the index uses */
    bool     disk_enabled;  /* a directory is in use (reads) */
    bool     disk_writable; /* and records are being written (or will be again after a pause) */
    bool     disk_paused;   /* writing is paused after a full disk */
    bool     scan_done;
} ag_cache_stats;

/* The index's heap (index_bytes) when it knows n_nodes blocks of
 * block_size tokens (e.g. every block of the kv pool, for the memory tier
 * alone): for memory planning. */
size_t ag_cache_index_bytes(int32_t n_nodes, int32_t block_size);

/* Thread-safe snapshot. (memory_blocks/index_nodes/index_bytes are as of the
 * last call on the engine thread.) */
void ag_cache_get_stats(const ag_cache *c, ag_cache_stats *out);

/* ---- records, for tools and the fuzzer (no cache or model needed) ---- */

/* 2: records carry a token count (partial blocks); version 1 records are
 * dropped at the scan like any other foreign record. */
#define AG_CACHE_RECORD_VERSION 2
#define AG_CACHE_MAX_BLOCK 256 /* largest kv block size */
#define AG_CACHE_RECORD_EXT ".agkv"
/* Header bytes of a record of a block_size kv (the payload starts there). */
#define AG_CACHE_RECORD_HEADER_BYTES(block_size) (144 + 4 * (block_size))
/* Header flag (offset 132): the payload's sliding-window layers are zeros,
 * not KV (their ring block had left memory when the record was written:
 * kv.h). Such a record resumes a prompt only where no window reaches it. */
#define AG_CACHE_RECORD_NO_RING 1u

/* A record header, parsed and checked. */
typedef struct {
    uint32_t     version;
    uint32_t     header_bytes; /* payload starts here */
    uint64_t     model_fingerprint, tok_fingerprint, compute_fingerprint;
    ag_kv_dtype  dtype;
    int32_t      block_size, n_layers, n_kv_heads, head_dim_k, head_dim_v;
    int32_t      key_bits;
    uint32_t     block_index;   /* the block's place in its prompt: positions
                                   [block_index * block_size, + n_tokens) */
    int32_t      n_tokens;      /* valid tokens (1..block_size): fewer for a
                                   partial block, the trailing tokens of a prompt */
    uint64_t     payload_bytes; /* n_layers * per-layer block bytes */
    uint64_t     ns;
    ag_cache_key parent, key;
    uint64_t     payload_hash; /* XXH3-64 of the payload */
    int32_t      tokens[AG_CACHE_MAX_BLOCK]; /* n_tokens of them (zero up to block_size) */
    uint32_t     flags;        /* AG_CACHE_RECORD_NO_RING */
} ag_cache_record;

/* Parses and validates a record header from the first `len` bytes of a
 * record file (it needs at most AG_CACHE_RECORD_MAX_HEADER bytes):
 * magic, version, field ranges (a token count outside 1..block_size is
 * corrupt, and so are nonzero token slots past it), layout consistency
 * (payload size), header checksum, and that `key` is the chain hash of the
 * header's own parent, namespace and tokens (full or partial form by the
 * token count). Does not look at the payload. AG_ERR_FORMAT with a
 * message on any problem. Reads only buf[0..len). */
#define AG_CACHE_RECORD_MAX_HEADER AG_CACHE_RECORD_HEADER_BYTES(AG_CACHE_MAX_BLOCK)
ag_status ag_cache_record_parse(const void *buf, size_t len, ag_cache_record *out);

/* XXH3-64 of a payload, as stored in payload_hash. */
uint64_t ag_cache_payload_hash(const void *payload, size_t len);

/* The file name of a key: 32 lowercase hex digits + AG_CACHE_RECORD_EXT. */
void ag_cache_key_name(ag_cache_key key, char out[40]);

/* One directory entry, for ag_cache_dir_list. */
typedef struct {
    const char            *name;   /* file name within the directory */
    const ag_cache_record *record; /* parsed header, or NULL (see problem) */
    const char            *problem; /* NULL for a valid record; else why not
                                       ("truncated", "corrupt header: ...",
                                       "temporary file", ...) */
    uint64_t file_bytes;
    int64_t  mtime_ns;
} ag_cache_dir_entry;

/* Lists the record files (and .tmp leftovers) of a directory, reading
 * headers only, in directory order; other files are skipped. fn returns
 * false to stop. AG_ERR_IO if the directory cannot be read. */
ag_status ag_cache_dir_list(const char *dir, bool (*fn)(void *user, const ag_cache_dir_entry *e),
                            void *user);

/* Deletes every record file and .tmp leftover of a directory (other files
 * are left alone). Counts what it removed (either pointer may be NULL). */
ag_status ag_cache_dir_clear(const char *dir, uint64_t *n_files, uint64_t *n_bytes);

#endif
