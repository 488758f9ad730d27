/* Prefix cache: the index over both tiers and the memory tier (lookup,
 * publish, evict). The disk tier (records, scan, writer, restore) is in
 * disk.c. See cache.h for the model. */
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <xxhash.h>

#include "base/hash.h"
#include "base/log.h"
#include "cache/cache_impl.h"

ag_cache_params ag_cache_default_params(void) {
    ag_cache_params p;
    memset(&p, 0, sizeof p);
    p.write_queue_bytes = (size_t)64 << 20;
    p.read_staging_bytes = (size_t)32 << 20;
    p.disk_sync = true;
    p.background_scan = true;
    p.space_retry_ms = 10000;
    p.read_threads = 4;
    return p;
}

uint64_t ag_cache_namespace(const void *data, size_t len) {
    if (!data || !len) return 0;
    uint64_t h = ag_hash64_seed(data, len, 0x6e616d6573706163ull); /* "namespac" */
    return h ? h : 1;
}

int64_t cache_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

int64_t cache_real_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* ---- keys ---- */

uint64_t cache_identity(uint64_t model_fp, uint64_t tok_fp, uint64_t compute_fp, ag_kv_dtype dtype, int32_t bs,
                        int32_t nl, int32_t nh, int32_t dk, int32_t dv, int32_t key_bits) {
    uint8_t b[80];
    uint64_t v[10] = {model_fp, tok_fp, compute_fp, (uint64_t)dtype, (uint64_t)bs, (uint64_t)nl,
                      (uint64_t)nh, (uint64_t)dk, (uint64_t)dv, (uint64_t)key_bits};
    for (int i = 0; i < 10; i++)
        for (int j = 0; j < 8; j++) b[i * 8 + j] = (uint8_t)(v[i] >> (8 * j)); /* little-endian, portable */
    return ag_hash64_seed(b, sizeof b, 0x61756775726b7631ull); /* "augurkv1" */
}

/* Bytes hashed: parent.lo | parent.hi | ns, then for a partial block one
 * more 64-bit word, 0x80000000 << 32 | n, then the n token ids, all
 * little-endian. The two forms never hash the same bytes: inputs of equal
 * length have n = block_size - 2, and then byte 31 is 0x80 in the partial
 * form but the top byte of a token id (non-negative) in the full one. */
ag_cache_key cache_key_compute(uint64_t identity, int32_t key_bits, ag_cache_key parent, uint64_t ns,
                               const int32_t *tokens, int32_t n, int32_t block_size) {
    uint8_t  buf[32 + 4 * AG_CACHE_MAX_BLOCK];
    uint64_t head[4] = {parent.lo, parent.hi, ns, 0x8000000000000000ull | (uint32_t)n};
    int      n_head = n == block_size ? 3 : 4;
    size_t   o = 0;
    for (int i = 0; i < n_head; i++)
        for (int j = 0; j < 8; j++) buf[o++] = (uint8_t)(head[i] >> (8 * j));
    if (n > AG_CACHE_MAX_BLOCK) n = AG_CACHE_MAX_BLOCK;
    for (int32_t i = 0; i < n; i++) {
        uint32_t t = (uint32_t)tokens[i];
        buf[o++] = (uint8_t)t;
        buf[o++] = (uint8_t)(t >> 8);
        buf[o++] = (uint8_t)(t >> 16);
        buf[o++] = (uint8_t)(t >> 24);
    }
    XXH128_hash_t h = XXH3_128bits_withSeed(buf, o, identity);
    ag_cache_key  k = {h.low64, h.high64};
    if (key_bits > 0 && key_bits < 128) {
        if (key_bits <= 64) {
            k.hi = 0;
            if (key_bits < 64) k.lo &= ((uint64_t)1 << key_bits) - 1;
        } else if (key_bits < 128) {
            k.hi &= ((uint64_t)1 << (key_bits - 64)) - 1;
        }
    }
    return k;
}

ag_cache_key cache_chain_key(const ag_cache *c, ag_cache_key parent, uint64_t ns, const int32_t *tokens,
                             int32_t n_tok) {
    return cache_key_compute(c->identity, c->p.key_bits ? c->p.key_bits : 128, parent, ns, tokens, n_tok, c->bs);
}

static bool key_eq(ag_cache_key a, ag_cache_key b) { return a.lo == b.lo && a.hi == b.hi; }

/* ---- index: nodes, hash table, lists ---- */

static uint32_t bucket_of(const ag_cache *c, ag_cache_key k) {
    uint64_t h = k.lo ^ (k.hi * 0x9E3779B97F4A7C15ull);
    h ^= h >> 29;
    return (uint32_t)h & c->bucket_mask;
}

int32_t cache_find(const ag_cache *c, ag_cache_key key) {
    for (int32_t id = c->buckets[bucket_of(c, key)]; id >= 0; id = c->nodes[id].hnext)
        if (key_eq(c->nodes[id].key, key)) return id;
    return -1;
}

/* The children index: a block's children are found from its key (their
 * parent key), the namespace and their first token, which any block that
 * shares at least one token with a prompt's continuation has in common
 * with it. */
static uint32_t child_bucket_of(const ag_cache *c, ag_cache_key parent, uint64_t ns, int32_t first) {
    uint64_t h = parent.lo ^ (parent.hi * 0x9E3779B97F4A7C15ull) ^ (ns * 0xC2B2AE3D27D4EB4Full) ^
                 ((uint64_t)(uint32_t)first * 0x165667B19E3779F9ull);
    h ^= h >> 31;
    return (uint32_t)h & c->bucket_mask;
}

int32_t cache_child_head(const ag_cache *c, ag_cache_key parent, uint64_t ns, int32_t first) {
    return c->cbuckets[child_bucket_of(c, parent, ns, first)];
}

/* Both indexes over n_buckets buckets (a power of two). */
static bool rehash(ag_cache *c, uint32_t n_buckets) {
    int32_t *b = malloc(sizeof(int32_t) * n_buckets), *cb = malloc(sizeof(int32_t) * n_buckets);
    if (!b || !cb) {
        free(b);
        free(cb);
        return false;
    }
    for (uint32_t i = 0; i < n_buckets; i++) b[i] = cb[i] = -1;
    free(c->buckets);
    free(c->cbuckets);
    c->buckets = b;
    c->cbuckets = cb;
    c->bucket_mask = n_buckets - 1;
    for (int32_t id = 0; id < c->cap; id++) {
        cache_node *n = &c->nodes[id];
        if (!n->used) continue;
        uint32_t h = bucket_of(c, n->key);
        n->hnext = b[h];
        b[h] = id;
        h = child_bucket_of(c, n->parent, n->ns, cache_node_tokens(c, id)[0]);
        n->cnext = cb[h];
        cb[h] = id;
    }
    return true;
}

static bool grow(ag_cache *c) {
    int32_t     ncap = c->cap ? c->cap * 2 : 64;
    cache_node *nn = realloc(c->nodes, sizeof *nn * (size_t)ncap);
    if (!nn) return false;
    c->nodes = nn;
    int32_t *nt = realloc(c->tokens, sizeof(int32_t) * (size_t)ncap * (size_t)c->bs);
    if (!nt) return false;
    c->tokens = nt;
    for (int32_t id = ncap - 1; id >= c->cap; id--) {
        memset(&nn[id], 0, sizeof nn[id]);
        nn[id].hnext = c->free_head;
        c->free_head = id;
    }
    c->cap = ncap;
    return true;
}

int32_t cache_node_new(ag_cache *c, ag_cache_key key, ag_cache_key parent, uint64_t ns, const int32_t *tokens,
                       int32_t n_tok) {
    if (c->free_head < 0 && !grow(c)) return -1;
    if ((uint32_t)c->n_used + 1 > c->bucket_mask + 1 && c->bucket_mask < (1u << 30))
        rehash(c, (c->bucket_mask + 1) * 2); /* on failure the chains just get longer */
    int32_t     id = c->free_head;
    cache_node *n = &c->nodes[id];
    c->free_head = n->hnext;
    uint32_t gen = n->gen + 1;
    memset(n, 0, sizeof *n);
    n->gen = gen;
    n->used = 1;
    n->key = key;
    n->parent = parent;
    n->ns = ns;
    n->block = -1;
    n->rblock = -1;
    n->hslot = -1;
    n->parent_id = -1;
    n->n_tok = n_tok;
    for (int l = 0; l < L_COUNT; l++) n->link[l].prev = n->link[l].next = -1;
    int32_t *t = cache_node_tokens(c, id);
    memcpy(t, tokens, sizeof(int32_t) * (size_t)n_tok);
    memset(t + n_tok, 0, sizeof(int32_t) * (size_t)(c->bs - n_tok));
    uint32_t h = bucket_of(c, key);
    n->hnext = c->buckets[h];
    c->buckets[h] = id;
    h = child_bucket_of(c, parent, ns, tokens[0]);
    n->cnext = c->cbuckets[h];
    c->cbuckets[h] = id;
    c->n_used++;
    return id;
}

void cache_list_remove(ag_cache *c, int which, int32_t id) {
    cache_node *n = &c->nodes[id];
    if (!n->on_list[which]) return;
    cache_list *L = &c->list[which];
    cache_link *k = &n->link[which];
    if (k->prev >= 0) c->nodes[k->prev].link[which].next = k->next;
    else L->head = k->next;
    if (k->next >= 0) c->nodes[k->next].link[which].prev = k->prev;
    else L->tail = k->prev;
    k->prev = k->next = -1;
    n->on_list[which] = 0;
    L->n--;
}

void cache_list_push_head(ag_cache *c, int which, int32_t id) {
    cache_list_remove(c, which, id);
    cache_list *L = &c->list[which];
    cache_link *k = &c->nodes[id].link[which];
    k->prev = -1;
    k->next = L->head;
    if (L->head >= 0) c->nodes[L->head].link[which].prev = id;
    else L->tail = id;
    L->head = id;
    c->nodes[id].on_list[which] = 1;
    L->n++;
}

void cache_list_push_tail(ag_cache *c, int which, int32_t id) {
    cache_list_remove(c, which, id);
    cache_list *L = &c->list[which];
    cache_link *k = &c->nodes[id].link[which];
    k->next = -1;
    k->prev = L->tail;
    if (L->tail >= 0) c->nodes[L->tail].link[which].next = id;
    else L->head = id;
    L->tail = id;
    c->nodes[id].on_list[which] = 1;
    L->n++;
}

void cache_list_insert_behind(ag_cache *c, int which, int32_t after, int32_t id) {
    if (after < 0 || after == id || !c->nodes[after].on_list[which]) {
        cache_list_push_head(c, which, id);
        return;
    }
    cache_list_remove(c, which, id);
    cache_list *L = &c->list[which];
    cache_link *a = &c->nodes[after].link[which];
    cache_link *k = &c->nodes[id].link[which];
    k->prev = after;
    k->next = a->next;
    if (a->next >= 0) c->nodes[a->next].link[which].prev = id;
    else L->tail = id;
    a->next = id;
    c->nodes[id].on_list[which] = 1;
    L->n++;
}

int32_t cache_parent(const ag_cache *c, int32_t id) {
    const cache_node *n = &c->nodes[id];
    if (n->parent_id < 0) return -1;
    const cache_node *p = &c->nodes[n->parent_id];
    return p->used && p->gen == n->parent_gen ? n->parent_id : -1;
}

/* Makes `parent` (or -1) id's parent, moving id's contributions to the
 * children counts from the old parent (if still valid) to the new one. */
void cache_parent_link(ag_cache *c, int32_t id, int32_t parent) {
    cache_node *n = &c->nodes[id];
    int32_t     old = cache_parent(c, id);
    if (old == parent && (parent >= 0 || n->parent_id < 0)) return;
    if (old >= 0) {
        if (n->block >= 0) c->nodes[old].n_mem_children--;
        if (n->disk == D_ON) c->nodes[old].n_disk_children--;
    }
    n->parent_id = parent;
    n->parent_gen = parent >= 0 ? c->nodes[parent].gen : 0;
    if (parent >= 0) {
        if (n->block >= 0) c->nodes[parent].n_mem_children++;
        if (n->disk == D_ON) c->nodes[parent].n_disk_children++;
    }
}

/* A node that neither tier holds any more leaves the index. */
void cache_node_maybe_remove(ag_cache *c, int32_t id) {
    cache_node *n = &c->nodes[id];
    if (!n->used || n->block >= 0 || n->hslot >= 0 || n->disk != D_NONE) return;
    for (int l = 0; l < L_COUNT; l++) cache_list_remove(c, l, id);
    int32_t *pp = &c->buckets[bucket_of(c, n->key)];
    while (*pp != id) pp = &c->nodes[*pp].hnext;
    *pp = n->hnext;
    pp = &c->cbuckets[child_bucket_of(c, n->parent, n->ns, cache_node_tokens(c, id)[0])];
    while (*pp != id) pp = &c->nodes[*pp].cnext;
    *pp = n->cnext;
    n->used = 0;
    n->hnext = c->free_head;
    c->free_head = id;
    c->n_used--;
}

/* Node storage grows by doubling from 64 (grow), the buckets of both
 * indexes from 256 to at least one per node (cache_node_new), the path
 * buffers to the longest prompt in blocks (at most every node). */
size_t ag_cache_index_bytes(int32_t n_nodes, int32_t block_size) {
    size_t cap = 64, buckets = 256;
    while (cap < (size_t)n_nodes) cap *= 2;
    while (buckets < (size_t)n_nodes) buckets *= 2;
    return cap * (sizeof(cache_node) + sizeof(int32_t) * (size_t)block_size) + sizeof(int32_t) * 2 * buckets +
           sizeof(int32_t) * 2 * (cap > 64 ? cap : 64);
}

static void refresh_stats(ag_cache *c) {
    pthread_mutex_lock(&c->mu);
    c->st.memory_blocks = c->list[L_MEM].n;
    c->st.index_nodes = c->n_used;
    c->st.records_on_disk = (uint64_t)c->n_on_disk;
    c->st.disk_bytes = (uint64_t)c->n_on_disk * c->record_bytes;
    c->st.queued_bytes = (uint64_t)c->n_queued * c->record_bytes;
    c->st.disk_max_bytes = c->disk_max;
    c->st.disk_paused = c->space_retry_ns != 0;
    c->st.host_blocks = c->host_used;
    c->st.host_bytes = (uint64_t)c->host_used * c->block_payload;
    c->st.host_max_bytes = (uint64_t)c->host_max * c->block_payload;
    c->st.index_bytes = (size_t)c->cap * (sizeof(cache_node) + sizeof(int32_t) * (size_t)c->bs) +
                        sizeof(int32_t) * 2 * ((size_t)c->bucket_mask + 1) + sizeof(int32_t) * 2 * (size_t)c->path_cap;
    pthread_mutex_unlock(&c->mu);
}

static bool path_reserve(ag_cache *c, int32_t n) {
    if (n <= c->path_cap) return true;
    int32_t *a = realloc(c->path, sizeof(int32_t) * (size_t)n);
    if (!a) return false;
    c->path = a;
    int32_t *b = realloc(c->path_blocks, sizeof(int32_t) * (size_t)n);
    if (!b) return false;
    c->path_blocks = b;
    int32_t *rb = realloc(c->path_rblocks, sizeof(int32_t) * (size_t)n);
    if (!rb) return false;
    c->path_rblocks = rb;
    c->path_cap = n;
    return true;
}

/* Whether node id is a block at `depth` of a prompt, following node `prev`
 * (-1 for the first block) whose key is `parent`, in namespace ns; its
 * tokens are not looked at. A node whose recorded parent is gone or
 * unknown (restored from disk, where parents are linked by key) is
 * re-linked to prev here. */
static bool node_follows(ag_cache *c, int32_t id, ag_cache_key parent, int32_t prev, int32_t depth, uint64_t ns) {
    cache_node *n = &c->nodes[id];
    if (n->ns != ns || n->depth != depth || !key_eq(n->parent, parent)) return false;
    if (prev < 0) return n->parent_id < 0;
    int32_t p = cache_parent(c, id);
    if (p >= 0) return p == prev;
    cache_parent_link(c, id, prev);
    return true;
}

/* node_follows, and node id is a full block of exactly these bs tokens. */
static bool node_matches(ag_cache *c, int32_t id, ag_cache_key parent, int32_t prev, int32_t depth, uint64_t ns,
                         const int32_t *tokens) {
    const cache_node *n = &c->nodes[id];
    if (n->n_tok != c->bs || memcmp(cache_node_tokens(c, id), tokens, sizeof(int32_t) * (size_t)c->bs) != 0)
        return false;
    return node_follows(c, id, parent, prev, depth, ns);
}

static int32_t common_prefix(const int32_t *a, const int32_t *b, int32_t n) {
    int32_t j = 0;
    while (j < n && a[j] == b[j]) j++;
    return j;
}

/* The cached block that continues the prefix matched so far (node prev,
 * key parent; -1 and the zero key at the start) at block `depth` and whose
 * tokens share the longest run with tokens[0..avail), a full block or a
 * partial one: its id and, in *len, that run's length (>= 1), or -1. Only
 * blocks the memory tier holds or, with can_read, the disk tier can
 * restore. Of equal runs, a block in memory wins (no read). */
static int32_t best_continuation(ag_cache *c, ag_cache_key parent, int32_t prev, int32_t depth, uint64_t ns,
                                 const int32_t *tokens, int32_t avail, bool can_read, int32_t *len) {
    int32_t best = -1, best_len = 0;
    bool    best_mem = false;
    if (avail <= 0) return -1;
    for (int32_t id = cache_child_head(c, parent, ns, tokens[0]); id >= 0; id = c->nodes[id].cnext) {
        const cache_node *n = &c->nodes[id];
        bool              mem = n->block >= 0 || n->hslot >= 0; /* (the host tier: a copy, no read) */
        if (!mem && !(n->disk == D_ON && can_read && (c->ring || n->disk_full))) continue;
        int32_t j = common_prefix(cache_node_tokens(c, id), tokens, n->n_tok < avail ? n->n_tok : avail);
        if (j == 0 || j < best_len || (j == best_len && (best_mem || !mem))) continue;
        if (!node_follows(c, id, parent, prev, depth, ns)) continue;
        best = id;
        best_len = j;
        best_mem = mem;
    }
    *len = best_len;
    return best;
}

/* Most recently used first, and each node ahead of its own ancestors'
 * predecessors: touching a path from its last block back to its first
 * leaves every parent more recent than its children, so the LRU end of the
 * list is made of leaves. */
static void touch_path(ag_cache *c, int32_t n) {
    int64_t now = cache_real_now_ns();
    for (int32_t i = n - 1; i >= 0; i--) {
        int32_t id = c->path[i];
        if (id < 0) continue; /* (no longer indexed) */
        c->nodes[id].used_ns = now - c->nodes[id].depth;
        if (c->nodes[id].block >= 0) cache_list_push_head(c, L_MEM, id);
        if (c->nodes[id].disk == D_ON) cache_list_push_head(c, L_DISK, id);
    }
}

/* ---- block payloads (cache_impl.h) ---- */

ag_status cache_payload_out(ag_cache *c, const cache_node *n, uint8_t *dst) {
    const size_t cb = c->lay->copy_bytes;
    ag_status    st = AG_OK;
    for (int32_t l = 0; !st && l < c->lay->n_layers; l++) {
        uint8_t *d = dst + (size_t)l * cb;
        if (!ag_kv_layer_ring(c->kv, l)) st = ag_kv_block_copy_out(c->kv, n->block, l, d, cb);
        else if (n->rblock >= 0) st = ag_kv_block_copy_out(c->kv, n->rblock, l, d, cb);
        else memset(d, 0, cb);
    }
    return st;
}

ag_status cache_payload_in(ag_cache *c, int32_t b, bool ring_layers, const uint8_t *src) {
    const size_t cb = c->lay->copy_bytes;
    ag_status    st = AG_OK;
    for (int32_t l = 0; !st && l < c->lay->n_layers; l++)
        if (ag_kv_layer_ring(c->kv, l) == ring_layers) st = ag_kv_block_copy_in(c->kv, b, l, src + (size_t)l * cb, cb);
    return st;
}

/* ---- the host tier (cache.h, HOST TIER) ---- */

/* A free host slot, allocating a chunk of them when none is free and the
 * bound allows; -1 when the tier is full (or out of host memory). */
static int32_t host_slot_get(ag_cache *c) {
    if (c->host_n_free > 0) return c->host_free[--c->host_n_free];
    if (c->host_n >= c->host_max) return -1;
    /* chunks of 64 MiB (at least one slot): pinned allocations are slow to
     * make, and one allocation of the whole bound would pin it up front */
    int32_t per = (int32_t)(((size_t)64 << 20) / c->block_payload);
    if (per < 1) per = 1;
    if (per > c->host_max - c->host_n) per = c->host_max - c->host_n;
    /* (the slot tables grow with the chunks: a large bound of small blocks
     * costs nothing until it fills) */
    void **ch = realloc(c->host_chunks, sizeof *ch * (size_t)(c->host_n_chunks + 1));
    if (!ch) return -1;
    c->host_chunks = ch;
    uint8_t **sl = realloc(c->host_slot, sizeof *sl * (size_t)(c->host_n + per));
    if (!sl) return -1;
    c->host_slot = sl;
    int32_t *fr = realloc(c->host_free, sizeof *fr * (size_t)(c->host_n + per));
    if (!fr) return -1;
    c->host_free = fr;
    uint8_t *mem = ag_kv_host_alloc(c->kv, (size_t)per * c->block_payload);
    if (!mem) return -1;
    ch[c->host_n_chunks++] = mem;
    for (int32_t k = per - 1; k >= 0; k--) {
        c->host_slot[c->host_n + k] = mem + (size_t)k * c->block_payload;
        c->host_free[c->host_n_free++] = c->host_n + k;
    }
    c->host_n += per;
    return c->host_free[--c->host_n_free];
}

/* Node id's host slot goes back to the free list (its KV is elsewhere now,
 * or dropped). */
static void host_release(ag_cache *c, int32_t id) {
    cache_node *n = &c->nodes[id];
    if (n->hslot < 0) return;
    c->host_free[c->host_n_free++] = n->hslot;
    n->hslot = -1;
    n->host_ring = 0;
    c->host_used--;
    cache_list_remove(c, L_HOST, id);
}

/* The host tier lets go of node id: its record goes to the disk writer
 * first where it is not on disk yet (the cascade), else it is lost. */
static void host_evict(ag_cache *c, int32_t id) {
    cache_node *n = &c->nodes[id];
    if (n->disk == D_NONE) disk_queue_from_host(c, id);
    host_release(c, id);
    if (n->disk == D_NONE) cache_list_remove(c, L_DIRTY, id); /* not written: lost */
    pthread_mutex_lock(&c->mu);
    c->st.evictions_host++;
    pthread_mutex_unlock(&c->mu);
    cache_node_maybe_remove(c, id);
}

/* Node id leaves the pool: its block's KV (every layer; the ring layers
 * from its ring block, zeros without one) is copied into a host slot,
 * made by evicting the host tier's least recently evicted blocks. false
 * when the tier is off or the copy failed: the KV is then dropped. */
static bool host_put(ag_cache *c, int32_t id) {
    if (c->host_max <= 0) return false;
    int32_t slot = host_slot_get(c);
    while (slot < 0 && c->list[L_HOST].tail >= 0) {
        host_evict(c, c->list[L_HOST].tail);
        slot = host_slot_get(c);
    }
    if (slot < 0) return false;
    cache_node  *n = &c->nodes[id];
    uint8_t     *dst = c->host_slot[slot];
    const ag_status st = cache_payload_out(c, n, dst);
    if (st) {
        AG_LOGW("kv cache: copying block %d to the host tier failed: %s", n->block, ag_error_message());
        c->host_free[c->host_n_free++] = slot;
        return false;
    }
    n->hslot = slot;
    n->host_ring = c->ring && n->rblock >= 0;
    c->host_used++;
    cache_list_push_head(c, L_HOST, id);
    return true;
}

static void attach_block(ag_cache *c, int32_t id, int32_t block) {
    cache_node *n = &c->nodes[id];
    host_release(c, id); /* (restored or recomputed meanwhile: the pool's copy is the one) */
    n->block = block;
    int32_t p = cache_parent(c, id);
    if (p >= 0) c->nodes[p].n_mem_children++;
    cache_list_push_head(c, L_MEM, id);
}

static void drop_rblock(ag_cache *c, cache_node *n) {
    if (n->rblock < 0) return;
    ag_kv_ring_block_unref(c->kv, n->rblock);
    n->rblock = -1;
}

/* Node id's block goes back to the pool; with to_host, its KV moves to the
 * host tier (if on). */
static void evict_memory(ag_cache *c, int32_t id, bool to_host) {
    cache_node *n = &c->nodes[id];
    const bool  kept = to_host && host_put(c, id);
    ag_kv_block_unref(c->kv, n->block);
    n->block = -1;
    drop_rblock(c, n);
    int32_t p = cache_parent(c, id);
    if (p >= 0) c->nodes[p].n_mem_children--;
    cache_list_remove(c, L_MEM, id);
    if (!kept) cache_list_remove(c, L_DIRTY, id); /* not written yet: that copy is lost */
    cache_node_maybe_remove(c, id);
}

/* ---- partial blocks made redundant ---- */

/* Whether node `big` makes the partial node `small` redundant: the same
 * parent (node, where both know it; else key), namespace and depth, and
 * big's tokens start with all of small's and hold more, so that any prompt
 * shares at least as long a run with big as with small. */
static bool covers(const ag_cache *c, int32_t big, int32_t small) {
    const cache_node *b = &c->nodes[big], *s = &c->nodes[small];
    if (big == small || s->n_tok >= b->n_tok || s->ns != b->ns || s->depth != b->depth || !key_eq(s->parent, b->parent))
        return false;
    int32_t bp = cache_parent(c, big), sp = cache_parent(c, small);
    if (bp >= 0 && sp >= 0 && bp != sp) return false;
    return memcmp(cache_node_tokens(c, small), cache_node_tokens(c, big), sizeof(int32_t) * (size_t)s->n_tok) == 0;
}

/* Drops a redundant partial block from both tiers: its kv block goes back
 * to the pool (unless a sequence holds it) and its record file is deleted.
 * A record still in the writer's queue is written all the same and stays,
 * an ordinary leaf that lookups pass over (its cover wins every tie) and
 * least-recently-used eviction takes. */
static void evict_memory(ag_cache *c, int32_t id, bool to_host);
static void drop_superseded(ag_cache *c, int32_t id) {
    cache_node *n = &c->nodes[id];
    n->no_write = 1;
    if (n->disk == D_ON && atomic_load(&c->write_on)) disk_delete_record(c, id); /* (else: read-only, it stays) */
    host_release(c, id);
    if (n->block >= 0) evict_memory(c, id, false); /* (removes the node when no tier has it) */
    else cache_node_maybe_remove(c, id);
    pthread_mutex_lock(&c->mu);
    c->st.partials_superseded++;
    pthread_mutex_unlock(&c->mu);
}

bool cache_supersede(ag_cache *c, int32_t id) {
    const cache_node *n = &c->nodes[id];
    int32_t           head = cache_child_head(c, n->parent, n->ns, cache_node_tokens(c, id)[0]);
    /* (siblings that share no first token cannot cover or be covered) */
    for (int32_t k = head; k >= 0; k = c->nodes[k].cnext)
        if (covers(c, k, id)) {
            drop_superseded(c, id);
            return true;
        }
    for (int32_t k = head, next; k >= 0; k = next) {
        next = c->nodes[k].cnext; /* (dropping k unlinks k only) */
        if (covers(c, id, k)) drop_superseded(c, k);
    }
    return false;
}

/* ---- the sliding-window ring (kv.h) ---- */

/* The kv's ring pool ran short (ag_kv_set_ring_reclaim): the memory tier
 * lets go of up to n ring blocks only it holds, least recently used first.
 * Their nodes keep their main blocks: a prefix still resumes there where no
 * window reaches back to them. */
static int32_t reclaim_ring(void *user, int32_t n) {
    ag_cache *c = user;
    int32_t   freed = 0;
    for (int32_t id = c->list[L_MEM].tail; id >= 0 && freed < n; id = c->nodes[id].link[L_MEM].prev) {
        cache_node *nd = &c->nodes[id];
        if (nd->rblock >= 0 && ag_kv_ring_block_refcount(c->kv, nd->rblock) == 1) {
            drop_rblock(c, nd);
            freed++;
        }
    }
    return freed;
}

/* Whether path entry j's ring block is at hand: held (c->path_rblocks), or,
 * with can_read, in its node's record on disk. */
static bool ring_avail(const ag_cache *c, int32_t j, bool can_read) {
    if (c->path_rblocks[j] >= 0) return true;
    if (!can_read || c->path[j] < 0) return false;
    const cache_node *n = &c->nodes[c->path[j]];
    return n->disk == D_ON && n->disk_full;
}

/* With a ring, a prefix of length m can be resumed only with the ring
 * blocks of its window: path entries [ag_kv_ring_first_needed(m), ceil(m /
 * bs)). Of the path's *n entries adopting *len positions, the longest
 * prefix that has them: *n and *len are lowered to it (to a whole number of
 * blocks when cut; 0 when none), and true is returned when they changed.
 * A longer entry that would need a trim the ring cannot do is thus never
 * preferred to a shorter one that works. */
static bool ring_cut(ag_cache *c, bool can_read, int32_t *n, int32_t *len) {
    int32_t k = *n, m = *len;
    while (m > 0) {
        int32_t j = ag_kv_ring_first_needed(c->kv, m);
        while (j < k && ring_avail(c, j, can_read)) j++;
        if (j == k) break;
        /* entry j has no ring block: no length whose window reaches it works */
        k = j;
        m = j * c->bs;
    }
    if (m <= 0) k = m = 0;
    bool cut = k != *n || m != *len;
    *n = k;
    *len = m;
    return cut;
}

/* Drops what the lookup holds of path entries [from, to). */
static void path_release(ag_cache *c, int32_t from, int32_t to) {
    for (int32_t j = from; j < to; j++) {
        if (c->path_blocks[j] >= 0) ag_kv_block_unref(c->kv, c->path_blocks[j]);
        if (c->path_rblocks[j] >= 0) ag_kv_ring_block_unref(c->kv, c->path_rblocks[j]);
        c->path_blocks[j] = c->path_rblocks[j] = -1;
    }
}

/* ---- public ---- */

ag_status ag_cache_new(ag_kv *kv, const ag_cache_params *pp, ag_cache **out) {
    *out = NULL;
    if (!kv) return ag_errorf(AG_ERR_INVALID, "cache: no kv");
    ag_cache_params p = pp ? *pp : ag_cache_default_params();
    if (p.key_bits < 0 || p.key_bits > 128)
        return ag_errorf(AG_ERR_INVALID, "cache: key_bits %d outside [0, 128]", p.key_bits);
    if (!p.write_queue_bytes) p.write_queue_bytes = (size_t)64 << 20;
    if (!p.read_staging_bytes) p.read_staging_bytes = (size_t)32 << 20;
    const ag_kv_layout *lay = ag_kv_get_layout(kv);
    if (lay->block_size > AG_CACHE_MAX_BLOCK)
        return ag_errorf(AG_ERR_INVALID, "cache: block size %d above %d", lay->block_size, AG_CACHE_MAX_BLOCK);
    ag_cache *c = calloc(1, sizeof *c);
    if (!c) return ag_errorf(AG_ERR_NOMEM, "out of memory");
    c->kv = kv;
    c->p = p;
    c->p.disk_dir = NULL;
    c->lay = lay;
    c->bs = lay->block_size;
    c->ring = lay->n_ring_layers > 0;
    c->identity = cache_identity(p.model_fingerprint, p.tok_fingerprint, p.compute_fingerprint, lay->dtype, lay->block_size,
                                 lay->n_layers, lay->n_kv_heads, lay->head_dim_k, lay->head_dim_v,
                                 p.key_bits ? p.key_bits : 128);
    c->block_payload = (size_t)lay->n_layers * lay->copy_bytes;
    c->header_bytes = AG_CACHE_RECORD_HEADER_BYTES((size_t)c->bs);
    c->record_bytes = c->header_bytes + c->block_payload;
    c->free_head = -1;
    c->dirfd = -1;
    atomic_init(&c->write_on, false);
    for (int l = 0; l < L_COUNT; l++) c->list[l].head = c->list[l].tail = -1;
    pthread_mutex_init(&c->mu, NULL);
    {
        /* the writer waits on cv until a pause ends: a monotonic deadline */
        pthread_condattr_t ca;
        pthread_condattr_init(&ca);
        pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
        pthread_cond_init(&c->cv, &ca);
        pthread_condattr_destroy(&ca);
    }
    pthread_cond_init(&c->cv_done, NULL);
    pthread_cond_init(&c->cv_read, NULL);
    if (!rehash(c, 256) || !grow(c) || !path_reserve(c, 64)) {
        ag_cache_free(c);
        return ag_errorf(AG_ERR_NOMEM, "out of memory");
    }
    if (p.disk_dir && *p.disk_dir) {
        c->dir = strdup(p.disk_dir);
        if (!c->dir) {
            ag_cache_free(c);
            return ag_errorf(AG_ERR_NOMEM, "out of memory");
        }
        disk_open(c);
    }
    if (p.host_max_bytes / c->block_payload > 0) { /* (slots are allocated as the tier fills) */
        uint64_t slots = p.host_max_bytes / c->block_payload;
        c->host_max = slots > (uint64_t)(INT32_MAX / 2) ? INT32_MAX / 2 : (int32_t)slots;
    }
    if (c->ring) ag_kv_set_ring_reclaim(kv, reclaim_ring, c);
    refresh_stats(c);
    *out = c;
    return AG_OK;
}

void ag_cache_free(ag_cache *c) {
    if (!c) return;
    disk_close(c);
    if (c->ring) ag_kv_set_ring_reclaim(c->kv, NULL, NULL);
    for (int32_t id = 0; id < c->cap && c->nodes; id++)
        if (c->nodes[id].used && c->nodes[id].block >= 0) {
            ag_kv_block_unref(c->kv, c->nodes[id].block);
            if (c->nodes[id].rblock >= 0) ag_kv_ring_block_unref(c->kv, c->nodes[id].rblock);
        }
    for (int32_t i = 0; i < c->host_n_chunks; i++) ag_kv_host_free(c->kv, c->host_chunks[i]);
    free(c->host_chunks);
    free(c->host_slot);
    free(c->host_free);
    free(c->nodes);
    free(c->tokens);
    free(c->buckets);
    free(c->cbuckets);
    free(c->path);
    free(c->path_blocks);
    free(c->path_rblocks);
    free(c->dir);
    pthread_mutex_destroy(&c->mu);
    pthread_cond_destroy(&c->cv);
    pthread_cond_destroy(&c->cv_done);
    pthread_cond_destroy(&c->cv_read);
    free(c);
}

/* A block for a restore: from the pool, or else from the memory tier's
 * reclaimable blocks (the path being looked up is held, so it is safe). */
static int32_t take_block(ag_cache *c) {
    int32_t b;
    if (ag_kv_block_alloc(c->kv, &b) == AG_OK) return b;
    if (ag_cache_evict(c, 1) == 1 && ag_kv_block_alloc(c->kv, &b) == AG_OK) return b;
    return -1;
}

/* Node id's KV, held by the host tier alone, copied back into a fresh
 * pool block, which joins the memory tier (the cache's reference) and
 * leaves the host tier; with its ring block too where the slot holds the
 * ring layers and the ring pool has room. The block, or -1 (the pool has
 * none to spare, or the copy failed: the host tier keeps it). */
static int32_t host_restore(ag_cache *c, int32_t id) {
    cache_node   *n = &c->nodes[id];
    const int32_t slot = n->hslot;
    const bool    hring = n->host_ring;
    /* off the host tier while a block is found: the evictions that frees
     * one move blocks into the host tier, which must not drop this one */
    cache_list_remove(c, L_HOST, id);
    n->hslot = -1;
    int32_t      b = take_block(c);
    const uint8_t *src = c->host_slot[slot];
    ag_status      st = b < 0 ? AG_ERR_NOMEM : cache_payload_in(c, b, false, src);
    n = &c->nodes[id];
    if (st) {
        if (b >= 0) {
            AG_LOGW("kv cache: copying a block in from the host tier failed: %s", ag_error_message());
            ag_kv_block_unref(c->kv, b);
        }
        n->hslot = slot;
        cache_list_push_head(c, L_HOST, id);
        return -1;
    }
    int32_t rb = -1;
    if (c->ring && hring && ag_kv_ring_block_alloc(c->kv, &rb) == AG_OK) {
        if ((st = cache_payload_in(c, rb, true, src))) {
            ag_kv_ring_block_unref(c->kv, rb);
            rb = -1;
        }
    }
    c->host_free[c->host_n_free++] = slot;
    c->host_used--;
    n->host_ring = 0;
    attach_block(c, id, b); /* the alloc's reference becomes the cache's */
    n->rblock = rb;
    return b;
}

/* Ends a lookup: seq adopts the n blocks of c->path_blocks (nodes c->path),
 * each held by the lookup (one reference, dropped here), as a sequence of
 * len positions (the last block may be used in part), the path becomes the
 * most recently used, and the lookup is counted (from_disk of the adopted
 * positions were read; restore_ns > 0: a restore from start to now).
 * Returns the adopted length. */
static int32_t lookup_end(ag_cache *c, int32_t seq, int32_t n, int32_t len, int32_t from_disk, int32_t from_host,
                          int64_t restore_ns) {
    int32_t n_adopt = n;
    /* (a restore that ended early may lack a ring block the planned length's window needed) */
    if (c->ring && ring_cut(c, false, &n_adopt, &len) && from_disk > len) from_disk = len;
    if (from_host > len - from_disk) from_host = len - from_disk;
    if (len > 0) {
        ag_status st = ag_kv_seq_adopt_ring(c->kv, seq, c->path_blocks, c->ring ? c->path_rblocks : NULL, n_adopt, len);
        if (st) {
            AG_LOGW("kv cache: adopting %d cached tokens failed: %s", len, ag_error_message());
            len = 0;
        }
    } else {
        ag_kv_seq_clear(c->kv, seq);
    }
    if (len == 0) from_disk = from_host = 0;
    for (int32_t j = 0; j < n; j++) {
        ag_kv_block_unref(c->kv, c->path_blocks[j]);
        if (c->path_rblocks[j] >= 0) ag_kv_ring_block_unref(c->kv, c->path_rblocks[j]);
    }
    if (len > 0) touch_path(c, n);
    pthread_mutex_lock(&c->mu);
    c->st.lookups++;
    if (len > 0) {
        c->st.hits++;
        c->st.tokens_from_disk += (uint64_t)from_disk;
        c->st.tokens_from_host += (uint64_t)from_host;
        c->st.tokens_from_memory += (uint64_t)(len - from_disk - from_host);
        c->st.hits_disk += from_disk > 0;
        c->st.hits_host += from_host > 0;
        c->st.hits_memory += len - from_disk - from_host > 0;
    } else {
        c->st.misses++;
    }
    c->st.restore_ns += (uint64_t)restore_ns;
    pthread_mutex_unlock(&c->mu);
    refresh_stats(c);
    return len;
}

/* A restore of the n blocks of c->path (entries whose c->path_blocks is -1
 * are to be read), for seq, which adopts `last_use` positions of the last
 * one. NULL when out of memory. */
static ag_cache_restore *restore_new(ag_cache *c, int32_t seq, int32_t n, int32_t last_use, uint64_t ns) {
    /* (the ring blocks of the adopted length's window are wanted) */
    const int32_t ring_first = n > 0 ? ag_kv_ring_first_needed(c->kv, (n - 1) * c->bs + last_use) : 0;
    ag_cache_restore *r = calloc(1, sizeof *r);
    if (!r) return NULL;
    r->e = calloc((size_t)n, sizeof *r->e);
    r->tokens = malloc(sizeof(int32_t) * (size_t)n * (size_t)c->bs);
    if (!r->e || !r->tokens) {
        free(r->e);
        free(r->tokens);
        free(r);
        return NULL;
    }
    r->seq = seq;
    r->ns = ns;
    r->n = r->end = n;
    r->t_start = cache_now_ns();
    for (int32_t i = 0; i < n; i++) {
        const cache_node *nd = &c->nodes[c->path[i]];
        /* the node's tokens, which the record must hold: for the last
         * entry they may go on past where the prompt's part */
        memcpy(r->tokens + (size_t)i * c->bs, cache_node_tokens(c, c->path[i]), sizeof(int32_t) * (size_t)c->bs);
        const bool want_ring = c->ring && i >= ring_first;
        r->e[i] = (restore_entry){.node = c->path[i], .gen = nd->gen, .block = c->path_blocks[i],
                                  .rblock = c->path_rblocks[i], .want_ring = want_ring,
                                  .from_disk = c->path_blocks[i] < 0 || (want_ring && c->path_rblocks[i] < 0),
                                  .use = i == n - 1 ? last_use : c->bs,
                                  .key = nd->key, .parent = nd->parent, .depth = nd->depth, .n_tok = nd->n_tok,
                                  .result = RS_PENDING};
    }
    return r;
}

/* Holds node id's block for a lookup at path entry i, or marks it to be
 * read (c->path_blocks[i] = -1). */
static void path_take(ag_cache *c, int32_t i, int32_t id) {
    const cache_node *n = &c->nodes[id];
    c->path[i] = id;
    c->path_blocks[i] = n->block;
    if (n->block >= 0) ag_kv_block_ref(c->kv, n->block); /* held while we look on (and while the reader reads) */
    c->path_rblocks[i] = c->ring ? n->rblock : -1;
    if (c->path_rblocks[i] >= 0) ag_kv_ring_block_ref(c->kv, c->path_rblocks[i]);
}

int32_t ag_cache_lookup_start(ag_cache *c, int32_t seq, const int32_t *tokens, int32_t n_tokens, int32_t max_len,
                              uint64_t ns, ag_cache_restore **pending) {
    *pending = NULL;
    disk_drain(c);
    if (!ag_kv_seq_live(c->kv, seq)) return 0;
    const int32_t bs = c->bs;
    const bool    can_read = disk_can_read(c);
    int32_t       lim = n_tokens < max_len ? n_tokens : max_len;
    if (lim < 0 || !tokens) lim = 0;
    int32_t nb = lim / bs;
    if (!path_reserve(c, nb + 1)) lim = nb = 0;
    ag_cache_key parent = {0, 0};
    int32_t      prev = -1, i = 0, to_read = 0, from_host = 0;
    /* whole blocks, as far as they match (a block the host tier holds is
     * copied back into the pool on the way) */
    for (; i < nb; i++) {
        const int32_t *t = tokens + (size_t)i * bs;
        ag_cache_key   key = cache_chain_key(c, parent, ns, t, bs);
        int32_t        id = cache_find(c, key);
        if (id < 0 || !node_matches(c, id, parent, prev, i, ns, t)) break;
        const cache_node *n = &c->nodes[id];
        if (n->block < 0 && n->hslot >= 0) {
            if (host_restore(c, id) < 0) break;
            from_host += bs;
        }
        if (n->block < 0 && !(n->disk == D_ON && can_read && (c->ring || n->disk_full))) break;
        path_take(c, i, id);
        to_read += n->block < 0;
        parent = key;
        prev = id;
    }
    /* then part of one more: the cached continuation (a partial block, or a
     * full one the prompt leaves or diverges from inside) that shares the
     * longest run with the prompt's next tokens, up to lim */
    int32_t len = i * bs, last_use = bs, run = 0;
    int32_t id = best_continuation(c, parent, prev, i, ns, tokens + len, lim - len, can_read, &run);
    if (id >= 0 && c->nodes[id].block < 0 && c->nodes[id].hslot >= 0) {
        if (host_restore(c, id) < 0) id = -1;
        else from_host += run;
    }
    if (id >= 0) {
        path_take(c, i, id);
        to_read += c->path_blocks[i] < 0;
        len += run;
        last_use = run;
        i++;
    }
    if (c->ring && i > 0) {
        /* the longest prefix whose window's ring blocks are in memory or on disk */
        int32_t k = i;
        if (ring_cut(c, can_read, &k, &len)) {
            path_release(c, k, i);
            i = k;
            last_use = c->bs;
        }
        /* ring blocks before the window are not needed; entries whose ring block is only on disk are read */
        const int32_t first = ag_kv_ring_first_needed(c->kv, len);
        to_read = 0;
        for (int32_t j = 0; j < i; j++) {
            if (j < first && c->path_rblocks[j] >= 0) {
                ag_kv_ring_block_unref(c->kv, c->path_rblocks[j]);
                c->path_rblocks[j] = -1;
            }
            to_read += c->path_blocks[j] < 0 || (j >= first && c->path_rblocks[j] < 0);
        }
    }
    if (to_read == 0) return lookup_end(c, seq, i, len, 0, from_host, 0);

    ag_cache_restore *r = restore_new(c, seq, i, last_use, ns);
    if (!r) { /* keep what memory has, up to the first block on disk */
        int32_t m = 0;
        while (m < i && c->path_blocks[m] >= 0) m++;
        path_release(c, m, i);
        AG_LOGW("kv cache: out of memory for a restore; prefilling from position %d", m * bs);
        return lookup_end(c, seq, m, m * bs, 0, from_host, 0); /* (the partial block, if any, is on disk: m < i) */
    }
    /* Most recently used from now on, so that the disk byte cap deletes
     * other records before the ones being read. */
    r->from_host = from_host;
    touch_path(c, i);
    ag_kv_seq_clear(c->kv, seq);
    pthread_mutex_lock(&c->mu);
    c->st.restores_pending++;
    pthread_mutex_unlock(&c->mu);
    disk_restore_submit(c, r);
    *pending = r;
    return 0;
}

/* The verified record of entry en (in buf) in a kv block the restore holds
 * a reference on, which also joins the memory tier; or -1 (logged) when it
 * cannot be placed: the prefix ends there. */
static int32_t place_record(ag_cache *c, const restore_entry *en, const uint8_t *buf) {
    cache_node *n = &c->nodes[en->node];
    if (!n->used || n->gen != en->gen) {
        AG_LOGI("kv cache: a block left the index while it was read; prefilling from position %d",
                en->depth * c->bs);
        return -1;
    }
    if (en->block >= 0) return en->block; /* (read for its ring block only: see place_ring) */
    if (n->block >= 0) { /* another request restored or computed it meanwhile */
        ag_kv_block_ref(c->kv, n->block);
        return n->block;
    }
    int32_t b = take_block(c);
    if (b < 0) {
        AG_LOGW("kv cache: no free block to restore into; prefilling from position %d", en->depth * c->bs);
        return -1;
    }
    if (cache_payload_in(c, b, false, buf + c->header_bytes) != AG_OK) {
        AG_LOGW("kv cache: copying a restored block in failed: %s; prefilling from position %d", ag_error_message(),
                en->depth * c->bs);
        ag_kv_block_unref(c->kv, b);
        return -1;
    }
    attach_block(c, en->node, b); /* the alloc's reference becomes the cache's */
    ag_kv_block_ref(c->kv, b);
    return b;
}

/* The ring block of entry en (its main block placed), when its window
 * wants it: the node's, or the record's ring layers in a fresh ring block,
 * which then joins the node (the cache's reference) and is held by the
 * restore; -1 (logged) when the record has none or the ring pool is full. */
static int32_t place_ring(ag_cache *c, const restore_entry *en, const uint8_t *buf) {
    cache_node *n = &c->nodes[en->node];
    if (n->rblock >= 0) {
        ag_kv_ring_block_ref(c->kv, n->rblock);
        return n->rblock;
    }
    if (!buf || (buf[132] & AG_CACHE_RECORD_NO_RING) || n->block < 0) {
        AG_LOGI("kv cache: the sliding-window layers of block %d are not cached; resuming before it",
                en->depth);
        return -1;
    }
    int32_t rb;
    if (ag_kv_ring_block_alloc(c->kv, &rb) != AG_OK) {
        AG_LOGW("kv cache: no free ring block to restore into; resuming before block %d", en->depth);
        return -1;
    }
    if (cache_payload_in(c, rb, true, buf + c->header_bytes) != AG_OK) {
        AG_LOGW("kv cache: copying a restored ring block in failed: %s", ag_error_message());
        ag_kv_ring_block_unref(c->kv, rb);
        return -1;
    }
    n->rblock = rb; /* the alloc's reference becomes the cache's */
    ag_kv_ring_block_ref(c->kv, rb);
    return rb;
}

bool ag_cache_restore_poll(ag_cache *c, ag_cache_restore *r, int32_t *len) {
    int32_t from_disk = 0, done_before = r->done;
    while (r->done < r->end) {
        restore_entry *en = &r->e[r->done];
        if (en->from_disk) {
            uint8_t *buf = NULL;
            int32_t  res = disk_restore_take(c, r, r->done, &buf);
            if (res == RS_PENDING) {
                if (r->done > done_before) refresh_stats(c); /* blocks joined the memory tier */
                return false;
            }
            if (res != RS_OK) {
                disk_restore_failed(c, en, res);
                r->end = r->done;
                break;
            }
            en->block = place_record(c, en, buf);
            if (en->block >= 0 && en->want_ring && en->rblock < 0) en->rblock = place_ring(c, en, buf);
            disk_staging_put(c, buf);
            if (en->block < 0) {
                r->end = r->done;
                break;
            }
            /* (an entry without its wanted ring block: lookup_end resumes before its window) */
        } else if (en->want_ring && en->rblock < 0) {
            en->rblock = place_ring(c, en, NULL);
        }
        r->done++;
    }
    /* over: entries [0, end) hold their blocks; any beyond (memory blocks
     * past a failed record) are let go */
    path_reserve(c, r->n); /* (it held n at the start: cannot fail) */
    int32_t adopted = 0;
    for (int32_t i = 0; i < r->end; i++) {
        /* (a block the restore held may have left the index meanwhile, a
         * superseded partial one: adopted all the same, not touched) */
        const cache_node *nd = &c->nodes[r->e[i].node];
        c->path[i] = nd->used && nd->gen == r->e[i].gen ? r->e[i].node : -1;
        c->path_blocks[i] = r->e[i].block;
        c->path_rblocks[i] = r->e[i].rblock;
        adopted += r->e[i].use;
        if (r->e[i].from_disk) from_disk += r->e[i].use;
    }
    for (int32_t i = r->end; i < r->n; i++) {
        if (r->e[i].block >= 0) ag_kv_block_unref(c->kv, r->e[i].block);
        if (r->e[i].rblock >= 0) ag_kv_ring_block_unref(c->kv, r->e[i].rblock);
    }
    pthread_mutex_lock(&c->mu);
    c->st.restores_pending--;
    pthread_mutex_unlock(&c->mu);
    int64_t t = cache_now_ns() - r->t_start;
    *len = lookup_end(c, r->seq, r->end, adopted, from_disk, r->from_host, t > 0 ? t : 1);
    disk_restore_release(c, r);
    return true;
}

void ag_cache_restore_cancel(ag_cache *c, ag_cache_restore *r) {
    if (!r) return;
    for (int32_t i = 0; i < r->n; i++) {
        if (r->e[i].block >= 0) ag_kv_block_unref(c->kv, r->e[i].block);
        if (r->e[i].rblock >= 0) ag_kv_ring_block_unref(c->kv, r->e[i].rblock);
    }
    pthread_mutex_lock(&c->mu);
    c->st.restores_pending--;
    c->st.restores_cancelled++;
    pthread_mutex_unlock(&c->mu);
    disk_restore_release(c, r);
    refresh_stats(c);
}

int32_t ag_cache_lookup(ag_cache *c, int32_t seq, const int32_t *tokens, int32_t n_tokens, int32_t max_len,
                        uint64_t ns) {
    ag_cache_restore *r;
    int32_t           len = ag_cache_lookup_start(c, seq, tokens, n_tokens, max_len, ns, &r);
    while (r && !ag_cache_restore_poll(c, r, &len)) disk_restore_wait(c, r);
    return len;
}

/* Indexes kv block `block`, holding the n_tok tokens t at block `depth` of
 * a prompt after node prev (key parent), unless the same block is already
 * cached: the node's id, or -1 where indexing must stop (a key collision,
 * out of memory). *added counts a new node. */
static void attach_rblock(ag_cache *c, int32_t id, int32_t rblock) {
    cache_node *n = &c->nodes[id];
    if (rblock < 0 || n->rblock >= 0 || n->block < 0) return;
    ag_kv_ring_block_ref(c->kv, rblock);
    n->rblock = rblock;
}

static int32_t index_block(ag_cache *c, ag_cache_key parent, int32_t prev, int32_t depth, uint64_t ns,
                           const int32_t *t, int32_t n_tok, int32_t block, int32_t rblock, int32_t *added) {
    ag_cache_key key = cache_chain_key(c, parent, ns, t, n_tok);
    int32_t      id = cache_find(c, key);
    if (id >= 0) {
        const cache_node *n = &c->nodes[id];
        if (n->n_tok != n_tok || memcmp(cache_node_tokens(c, id), t, sizeof(int32_t) * (size_t)n_tok) != 0 ||
            !node_follows(c, id, parent, prev, depth, ns))
            return -1; /* a key collision */
        if (n->block < 0) {
            ag_kv_block_ref(c->kv, block);
            attach_block(c, id, block);
        }
        attach_rblock(c, id, rblock);
        return id;
    }
    id = cache_node_new(c, key, parent, ns, t, n_tok);
    if (id < 0) return -1;
    c->nodes[id].depth = depth;
    cache_parent_link(c, id, prev);
    ag_kv_block_ref(c->kv, block);
    attach_block(c, id, block);
    attach_rblock(c, id, rblock);
    if (c->disk_on && atomic_load(&c->write_on)) cache_list_push_tail(c, L_DIRTY, id);
    (*added)++;
    return id;
}

int32_t ag_cache_publish(ag_cache *c, int32_t seq, const int32_t *tokens, int32_t n_tokens, uint64_t ns) {
    disk_drain(c);
    int32_t len = ag_kv_seq_len(c->kv, seq);
    if (len <= 0 || !tokens || n_tokens <= 0) return 0;
    const int32_t  bs = c->bs;
    int32_t        n = n_tokens < len ? n_tokens : len, nt = 0;
    const int32_t *table = ag_kv_seq_blocks(c->kv, seq, &nt);
    int32_t        nb = n / bs, tail = n % bs;
    if (nb > nt) nb = nt;
    /* with a ring: the ring blocks it still holds (entries [rfirst, rn)) go with their blocks */
    int32_t        rn = 0, rfirst = 0;
    const int32_t *rt = c->ring ? ag_kv_seq_ring_blocks(c->kv, seq, &rn, &rfirst) : NULL;
#define RING_AT(i) (rt && (i) >= rfirst && (i) < rn ? rt[(i)] : -1)
    if (!path_reserve(c, nb + 1)) return 0;
    ag_cache_key parent = {0, 0};
    int32_t      prev = -1, i = 0, added = 0, covered = 0;
    for (; i < nb; i++) {
        int32_t before = added;
        int32_t id = index_block(c, parent, prev, i, ns, tokens + (size_t)i * bs, bs, table[i], RING_AT(i), &added);
        if (id < 0) break;
        /* a new full block makes the partial siblings it starts with
         * redundant (it is never redundant itself) */
        if (added > before) cache_supersede(c, id);
        c->path[i] = id;
        parent = c->nodes[id].key;
        prev = id;
        covered += bs;
    }
    /* the trailing partial block: a leaf, kept unless a sibling covers it */
    if (i == nb && tail > 0 && nb < nt) {
        int32_t before = added;
        int32_t id = index_block(c, parent, prev, nb, ns, tokens + (size_t)nb * bs, tail, table[nb], RING_AT(nb), &added);
#undef RING_AT
        if (id >= 0) {
            covered += tail;
            if (added == before || !cache_supersede(c, id)) c->path[i++] = id;
            else added--; /* dropped at once: a longer block of the same parent holds these tokens */
        }
    }
    touch_path(c, i);
    pthread_mutex_lock(&c->mu);
    c->st.publishes++;
    c->st.blocks_published += (uint64_t)added;
    pthread_mutex_unlock(&c->mu);
    refresh_stats(c);
    return covered;
}

int32_t ag_cache_evict(ag_cache *c, int32_t n_blocks) {
    int32_t freed = 0;
    /* Leaves first, from the least recently used end. Evicting a leaf can
     * make its parent a leaf; parents are more recent than their children
     * (see touch_path), so one pass usually finds it; loop while passes
     * make progress in case the order was disturbed. */
    bool progress = true;
    while (freed < n_blocks && progress) {
        progress = false;
        for (int32_t id = c->list[L_MEM].tail; id >= 0 && freed < n_blocks;) {
            int32_t     next = c->nodes[id].link[L_MEM].prev;
            cache_node *n = &c->nodes[id];
            if (n->n_mem_children == 0 && ag_kv_block_refcount(c->kv, n->block) == 1) {
                evict_memory(c, id, true);
                freed++;
                progress = true;
            }
            id = next;
        }
    }
    if (freed) {
        pthread_mutex_lock(&c->mu);
        c->st.evictions_memory += (uint64_t)freed;
        pthread_mutex_unlock(&c->mu);
        refresh_stats(c);
    }
    return freed;
}

int32_t ag_cache_reclaimable(const ag_cache *c) {
    int32_t n = 0;
    for (int32_t id = c->list[L_MEM].head; id >= 0; id = c->nodes[id].link[L_MEM].next)
        n += ag_kv_block_refcount(c->kv, c->nodes[id].block) == 1;
    return n;
}

bool ag_cache_idle(ag_cache *c, size_t max_bytes) {
    disk_drain(c);
    disk_enforce_cap(c);
    bool more = disk_queue_writes(c, max_bytes);
    refresh_stats(c);
    return more;
}

void ag_cache_flush(ag_cache *c) {
    disk_flush_wait(c);
    refresh_stats(c);
}

void ag_cache_get_stats(const ag_cache *c, ag_cache_stats *out) {
    ag_cache *m = (ag_cache *)c; /* the mutex only */
    pthread_mutex_lock(&m->mu);
    *out = c->st;
    out->disk_enabled = c->disk_on;
    out->disk_writable = c->disk_on && atomic_load(&m->write_on);
    /* done = merged into the index (what lookups and the record counts
     * see), not merely read by the background thread */
    out->scan_done = c->scan_merged || !c->disk_on;
    out->records_on_disk = (uint64_t)c->n_on_disk;
    out->disk_bytes = (uint64_t)c->n_on_disk * c->record_bytes;
    pthread_mutex_unlock(&m->mu);
}
