/* Prefix cache, disk tier: the record format, the start-up scan, the one
 * background writer thread, restores, the byte cap, and the directory tools
 * behind `augur cache`. See cache.h for the behaviour and its reasons.
 *
 * Record (all integers little-endian):
 *     0   8  magic "AUGURKV\x1a"
 *     8   4  format version (AG_CACHE_RECORD_VERSION)
 *    12   4  header bytes = 144 + 4 * block_size (the payload starts there)
 *    16   8  model fingerprint
 *    24   8  tokenizer fingerprint
 *    32   8  compute fingerprint
 *    40   4  KV dtype (ag_kv_dtype)
 *    44   4  block size
 *    48   4  layers
 *    52   4  kv heads
 *    56   4  head dim K
 *    60   4  head dim V
 *    64   4  key bits
 *    68   4  block index in its prompt
 *    72   8  payload bytes
 *    80   8  namespace
 *    88  16  parent key (lo, hi)
 *   104  16  key (lo, hi)
 *   120   8  payload checksum (XXH3-64)
 *   128   4  token count m, 1..n: the block's first m positions are its KV
 *            (m < n: a partial block, keyed in the partial form, cache.h)
 *   132   4  flags: AG_CACHE_RECORD_NO_RING (the sliding-window layers' part
 *            of the payload is zeros: kv.h's ring had let the block go), else 0
 *   136  4n  the block's token ids: m of them, then zeros
 * 136+4n  8  header checksum (XXH3-64 of the bytes before it)
 *   then the payload: per layer, K then V as ag_kv_block_copy_out writes it
 *   (native element bytes: F16/F32 of a little-endian machine), all n
 *   positions of the block, also of a partial one (positions m.. are never
 *   read back; every record has one size, which keeps the byte accounting,
 *   the staging buffers and the restore path one).
 * (n = block size.) Version 1 had no token count (tokens at 128). */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

#include "base/log.h"
#include "cache/cache_impl.h"

static const uint8_t k_magic[8] = {'A', 'U', 'G', 'U', 'R', 'K', 'V', 0x1a};

/* ---- little-endian fields ---- */

static void put32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static void put64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static uint32_t get32(const uint8_t *p) {
    uint32_t v = 0;
    for (int i = 0; i < 4; i++) v |= (uint32_t)p[i] << (8 * i);
    return v;
}
static uint64_t get64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) v |= (uint64_t)p[i] << (8 * i);
    return v;
}

static bool key_eq(ag_cache_key a, ag_cache_key b) { return a.lo == b.lo && a.hi == b.hi; }

uint64_t ag_cache_payload_hash(const void *payload, size_t len) { return XXH3_64bits(payload, len); }

void ag_cache_key_name(ag_cache_key key, char out[40]) {
    snprintf(out, 40, "%016llx%016llx" AG_CACHE_RECORD_EXT, (unsigned long long)key.hi, (unsigned long long)key.lo);
}

/* Everything but the two checksums (the writer thread seals). */
static void header_build(const ag_cache *c, int32_t id, uint8_t *h) {
    const cache_node   *n = &c->nodes[id];
    const ag_kv_layout *L = c->lay;
    memset(h, 0, c->header_bytes);
    memcpy(h, k_magic, 8);
    put32(h + 8, AG_CACHE_RECORD_VERSION);
    put32(h + 12, (uint32_t)c->header_bytes);
    put64(h + 16, c->p.model_fingerprint);
    put64(h + 24, c->p.tok_fingerprint);
    put64(h + 32, c->p.compute_fingerprint);
    put32(h + 40, (uint32_t)L->dtype);
    put32(h + 44, (uint32_t)L->block_size);
    put32(h + 48, (uint32_t)L->n_layers);
    put32(h + 52, (uint32_t)L->n_kv_heads);
    put32(h + 56, (uint32_t)L->head_dim_k);
    put32(h + 60, (uint32_t)L->head_dim_v);
    put32(h + 64, (uint32_t)(c->p.key_bits ? c->p.key_bits : 128));
    put32(h + 68, (uint32_t)n->depth);
    put64(h + 72, c->block_payload);
    put64(h + 80, n->ns);
    put64(h + 88, n->parent.lo);
    put64(h + 96, n->parent.hi);
    put64(h + 104, n->key.lo);
    put64(h + 112, n->key.hi);
    put32(h + 128, (uint32_t)n->n_tok);
    put32(h + 132, c->ring && n->rblock < 0 ? AG_CACHE_RECORD_NO_RING : 0);
    const int32_t *t = cache_node_tokens(c, id); /* (zero past n_tok) */
    for (int32_t i = 0; i < c->bs; i++) put32(h + 136 + 4 * i, (uint32_t)t[i]);
}

static void record_seal(uint8_t *buf, size_t header_bytes, size_t payload_bytes) {
    put64(buf + 120, XXH3_64bits(buf + header_bytes, payload_bytes));
    put64(buf + header_bytes - 8, XXH3_64bits(buf, header_bytes - 8));
}

ag_status ag_cache_record_parse(const void *buf, size_t len, ag_cache_record *r) {
    const uint8_t *h = buf;
    memset(r, 0, sizeof *r);
    if (!buf || len < 144) return ag_errorf(AG_ERR_FORMAT, "truncated header (%zu bytes)", len);
    if (memcmp(h, k_magic, 8) != 0) return ag_errorf(AG_ERR_FORMAT, "not a KV record (bad magic)");
    r->version = get32(h + 8);
    if (r->version != AG_CACHE_RECORD_VERSION)
        return ag_errorf(AG_ERR_FORMAT, "format version %u, expected %d", r->version, AG_CACHE_RECORD_VERSION);
    r->header_bytes = get32(h + 12);
    uint32_t bs = get32(h + 44);
    if (bs < 8 || bs > AG_CACHE_MAX_BLOCK || (bs & (bs - 1)))
        return ag_errorf(AG_ERR_FORMAT, "block size %u is not a power of two in [8, %d]", bs, AG_CACHE_MAX_BLOCK);
    if (r->header_bytes != AG_CACHE_RECORD_HEADER_BYTES(bs))
        return ag_errorf(AG_ERR_FORMAT, "header size %u does not match block size %u", r->header_bytes, bs);
    if (len < r->header_bytes) return ag_errorf(AG_ERR_FORMAT, "truncated header (%zu of %u bytes)", len, r->header_bytes);
    uint64_t hsum = get64(h + r->header_bytes - 8);
    if (hsum != XXH3_64bits(h, r->header_bytes - 8)) return ag_errorf(AG_ERR_FORMAT, "header checksum mismatch");
    r->model_fingerprint = get64(h + 16);
    r->tok_fingerprint = get64(h + 24);
    r->compute_fingerprint = get64(h + 32);
    uint32_t dtype = get32(h + 40);
    if (dtype != AG_KV_F32 && dtype != AG_KV_F16 && !ag_kv_dtype_quantized((ag_kv_dtype)dtype))
        return ag_errorf(AG_ERR_FORMAT, "unknown KV dtype %u", dtype);
    r->dtype = (ag_kv_dtype)dtype;
    r->block_size = (int32_t)bs;
    uint32_t nl = get32(h + 48), nh = get32(h + 52), dk = get32(h + 56), dv = get32(h + 60);
    if (nl < 1 || nl > 4096 || nh < 1 || nh > 4096 || dk < 1 || dk > 4096 || dv < 1 || dv > 4096)
        return ag_errorf(AG_ERR_FORMAT, "KV shape %u layers x %u heads x %u/%u dims out of range", nl, nh, dk, dv);
    r->n_layers = (int32_t)nl;
    r->n_kv_heads = (int32_t)nh;
    r->head_dim_k = (int32_t)dk;
    r->head_dim_v = (int32_t)dv;
    uint32_t kb = get32(h + 64);
    if (kb < 1 || kb > 128) return ag_errorf(AG_ERR_FORMAT, "key bits %u out of range", kb);
    r->key_bits = (int32_t)kb;
    r->block_index = get32(h + 68);
    r->payload_bytes = get64(h + 72);
    /* at most 4096 * 4096 * 256 * 8192 * 4 bytes: no overflow in 64 bits */
    const uint64_t rk = ag_kv_row_bytes((ag_kv_dtype)dtype, dk), rv = ag_kv_row_bytes((ag_kv_dtype)dtype, dv);
    if (!rk || !rv) return ag_errorf(AG_ERR_FORMAT, "head dims %u/%u do not fit KV dtype %s", dk, dv,
                                     ag_kv_dtype_name((ag_kv_dtype)dtype));
    uint64_t want = (uint64_t)nl * nh * bs * (rk + rv);
    if (r->payload_bytes != want)
        return ag_errorf(AG_ERR_FORMAT, "payload size %llu does not match the KV layout (%llu)",
                         (unsigned long long)r->payload_bytes, (unsigned long long)want);
    r->ns = get64(h + 80);
    r->parent.lo = get64(h + 88);
    r->parent.hi = get64(h + 96);
    r->key.lo = get64(h + 104);
    r->key.hi = get64(h + 112);
    r->payload_hash = get64(h + 120);
    uint32_t m = get32(h + 128);
    if (m < 1 || m > bs) return ag_errorf(AG_ERR_FORMAT, "token count %u outside [1, %u]", m, bs);
    r->flags = get32(h + 132);
    if (r->flags & ~AG_CACHE_RECORD_NO_RING) return ag_errorf(AG_ERR_FORMAT, "unknown header flags %#x", r->flags);
    r->n_tokens = (int32_t)m;
    for (uint32_t i = 0; i < bs; i++) {
        r->tokens[i] = (int32_t)get32(h + 136 + 4 * i);
        if (r->tokens[i] < 0) return ag_errorf(AG_ERR_FORMAT, "negative token id %d", r->tokens[i]);
        if (i >= m && r->tokens[i] != 0)
            return ag_errorf(AG_ERR_FORMAT, "token slot %u past the token count %u is not zero", i, m);
    }
    uint64_t     id = cache_identity(r->model_fingerprint, r->tok_fingerprint, r->compute_fingerprint, r->dtype,
                                     r->block_size, r->n_layers, r->n_kv_heads, r->head_dim_k, r->head_dim_v,
                                     r->key_bits);
    ag_cache_key k = cache_key_compute(id, r->key_bits, r->parent, r->ns, r->tokens, r->n_tokens, r->block_size);
    if (!key_eq(k, r->key)) return ag_errorf(AG_ERR_FORMAT, "key is not the hash of the header's contents");
    return AG_OK;
}

/* "<key hex>.agkv" */
static bool is_record_name(const char *name) {
    for (int i = 0; i < 32; i++)
        if (!((name[i] >= '0' && name[i] <= '9') || (name[i] >= 'a' && name[i] <= 'f'))) return false;
    return strcmp(name + 32, AG_CACHE_RECORD_EXT) == 0;
}

/* "<anything>.<pid>-<anything>.tmp": *pid = the writer's process id (0 if
 * it cannot be read). */
static bool is_tmp_name(const char *name, long *pid) {
    size_t n = strlen(name);
    if (n < 5 || strcmp(name + n - 4, ".tmp") != 0) return false;
    *pid = 0;
    const char *dot = NULL;
    for (const char *p = name; p < name + n - 4; p++)
        if (*p == '.') dot = p;
    if (dot) {
        char *end;
        long  v = strtol(dot + 1, &end, 10);
        if (end != dot + 1 && *end == '-' && v > 0) *pid = v;
    }
    return true;
}

/* Reads and checks a record file's header; NULL when it is a valid record
 * (of any identity), else why not (in why). */
static const char *examine(int dirfd, const char *name, ag_cache_record *rec, struct stat *st, char *why,
                           size_t why_len) {
    int fd = openat(dirfd, name, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    if (fd < 0) {
        snprintf(why, why_len, "cannot open: %s", strerror(errno));
        return why;
    }
    uint8_t h[AG_CACHE_RECORD_MAX_HEADER];
    ssize_t got = -1;
    if (fstat(fd, st) != 0) snprintf(why, why_len, "cannot stat: %s", strerror(errno));
    else if (!S_ISREG(st->st_mode)) snprintf(why, why_len, "not a regular file");
    else if ((got = pread(fd, h, sizeof h, 0)) < 0) snprintf(why, why_len, "read error: %s", strerror(errno));
    close(fd);
    if (got < 0) return why;
    if (ag_cache_record_parse(h, (size_t)got, rec) != AG_OK) {
        snprintf(why, why_len, "corrupt: %s", ag_error_message());
        return why;
    }
    uint64_t want = rec->header_bytes + rec->payload_bytes;
    if ((uint64_t)st->st_size < want) {
        snprintf(why, why_len, "truncated (%llu of %llu bytes)", (unsigned long long)st->st_size,
                 (unsigned long long)want);
        return why;
    }
    if ((uint64_t)st->st_size > want) {
        snprintf(why, why_len, "wrong size (%llu bytes, expected %llu)", (unsigned long long)st->st_size,
                 (unsigned long long)want);
        return why;
    }
    char expect[40];
    ag_cache_key_name(rec->key, expect);
    if (strcmp(expect, name) != 0) {
        snprintf(why, why_len, "file name does not match its key (%s)", expect);
        return why;
    }
    return NULL;
}

/* Why a valid record cannot serve this cache, or NULL. */
static const char *foreign(const ag_cache *c, const ag_cache_record *r) {
    const ag_kv_layout *L = c->lay;
    if (r->model_fingerprint != c->p.model_fingerprint) return "another model";
    if (r->tok_fingerprint != c->p.tok_fingerprint) return "another tokenizer";
    if (r->compute_fingerprint != c->p.compute_fingerprint) return "another compute fingerprint";
    if (r->dtype != L->dtype || r->block_size != L->block_size || r->n_layers != L->n_layers ||
        r->n_kv_heads != L->n_kv_heads || r->head_dim_k != L->head_dim_k || r->head_dim_v != L->head_dim_v)
        return "another KV layout";
    if (r->key_bits != (c->p.key_bits ? c->p.key_bits : 128)) return "another key width";
    return NULL;
}

static int64_t mtime_ns(const struct stat *st) {
    return (int64_t)st->st_mtim.tv_sec * 1000000000 + st->st_mtim.tv_nsec;
}

/* The mtime of a record: now, minus its block index in nanoseconds, so a
 * parent always looks more recently used than its continuations and the
 * least recently used end of the order holds leaves. */
static void set_mtime(int fd, int32_t depth) {
    int64_t         t = cache_real_now_ns() - depth;
    struct timespec ts[2] = {{0, UTIME_OMIT}, {t / 1000000000, t % 1000000000}};
    futimens(fd, ts);
}

/* ---- the start-up scan (background thread, or ag_cache_new) ---- */

static void scan_dir(ag_cache *c) {
    int64_t    t0 = cache_now_ns();
    scan_item *items = NULL;
    int32_t   *toks = NULL;
    size_t     n = 0, cap = 0;
    uint64_t   dropped = 0;
    int        fd = openat(c->dirfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    DIR       *d = fd >= 0 ? fdopendir(fd) : NULL;
    if (!d) {
        if (fd >= 0) close(fd);
        AG_LOGW("kv disk cache: cannot read %s: %s; starting with an empty disk index", c->dir, strerror(errno));
    }
    struct dirent *e;
    char           why[300];
    int64_t        now = cache_real_now_ns();
    while (d && (e = readdir(d))) {
        const char *name = e->d_name;
        long        pid;
        struct stat st;
        if (is_tmp_name(name, &pid)) {
            if (fstatat(c->dirfd, name, &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(st.st_mode)) continue;
            bool gone = pid <= 0 || pid == (long)getpid() || (kill((pid_t)pid, 0) != 0 && errno == ESRCH);
            bool old = now - mtime_ns(&st) > (int64_t)3600 * 1000000000;
            if (!gone && !old) continue; /* another live process is writing it */
            unlinkat(c->dirfd, name, 0);
            AG_LOGW("kv disk cache: dropped %s/%s: leftover temporary file", c->dir, name);
            dropped++;
            continue;
        }
        if (!is_record_name(name)) continue;
        ag_cache_record rec;
        const char     *problem = examine(c->dirfd, name, &rec, &st, why, sizeof why);
        if (!problem) problem = foreign(c, &rec);
        if (problem) {
            bool del = unlinkat(c->dirfd, name, 0) == 0 || errno == ENOENT;
            AG_LOGW("kv disk cache: dropped %s/%s: %s%s", c->dir, name, problem, del ? "" : " (could not delete it)");
            dropped++;
            continue;
        }
        if (n == cap) {
            size_t     ncap = cap ? cap * 2 : 1024;
            scan_item *ni = realloc(items, sizeof *ni * ncap);
            if (ni) items = ni;
            int32_t *nt = ni ? realloc(toks, sizeof(int32_t) * ncap * (size_t)c->bs) : NULL;
            if (nt) toks = nt;
            if (!ni || !nt) {
                AG_LOGW("kv disk cache: out of memory while scanning %s; %zu records indexed", c->dir, n);
                break;
            }
            cap = ncap;
        }
        scan_item *it = &items[n];
        it->key = rec.key;
        it->parent = rec.parent;
        it->ns = rec.ns;
        it->mtime_ns = mtime_ns(&st);
        it->depth = (int32_t)rec.block_index;
        it->n_tok = rec.n_tokens;
        it->tok_off = n * (size_t)c->bs;
        it->full = !(rec.flags & AG_CACHE_RECORD_NO_RING);
        memcpy(toks + it->tok_off, rec.tokens, sizeof(int32_t) * (size_t)c->bs);
        n++;
    }
    if (d) closedir(d);
    int64_t dt = cache_now_ns() - t0;
    AG_LOGI("kv disk cache: %s: %zu records indexed, %llu dropped, in %.1f ms", c->dir, n,
            (unsigned long long)dropped, dt / 1e6);
    pthread_mutex_lock(&c->mu);
    c->scan = items;
    c->n_scan = (int32_t)n;
    c->scan_tokens = toks;
    c->scan_ready = true;
    c->scan_finished = true;
    c->st.dropped_records += dropped;
    c->st.scan_ns = (uint64_t)dt;
    pthread_cond_broadcast(&c->cv_done);
    pthread_mutex_unlock(&c->mu);
}

/* ---- the writer thread ---- */

static void notify(ag_cache *c) {
    if (c->p.notify) c->p.notify(c->p.notify_user);
}

static void writes_off(ag_cache *c, const char *what, int err) {
    if (atomic_exchange(&c->write_on, false))
        AG_LOGW("kv disk cache: %s in %s failed: %s; writing to the disk tier is off from now on (records "
                "already there are still restored); serving continues",
                what, c->dir, strerror(err));
}

static atomic_ullong g_tmp_counter;

/* A write failed with err: a full disk (or a size limit) pauses writing,
 * which the engine thread handles when it drains the result
 * (disk_space_pause); anything else turns writing off. */
static int write_error(ag_cache *c, const char *what, int err) {
    if (err == ENOSPC || err == EDQUOT || err == EFBIG) {
        atomic_store(&c->space_errno, err);
        atomic_store(&c->space_short, true); /* the rest of the queue would fail the same way */
        return W_NOSPACE;
    }
    writes_off(c, what, err);
    return W_FAILED;
}

static int write_record(ag_cache *c, write_job *job) {
    if (!atomic_load(&c->write_on)) return W_FAILED;
    if (atomic_load(&c->space_short)) return W_DEFERRED;
    char        name[40];
    struct stat st;
    ag_cache_key_name(job->key, name);
    if (fstatat(c->dirfd, name, &st, AT_SYMLINK_NOFOLLOW) == 0) return W_EXISTS; /* e.g. another process */
    record_seal(job->buf, c->header_bytes, job->size - c->header_bytes);
    /* Unique among this process's caches (one counter) and, by the pid,
     * among processes; EEXIST (a pid reused in another pid namespace on a
     * shared directory) just tries another name. */
    char        tmp[96];
    const char *what = "creating a record";
    int         fd = -1, err = 0;
    for (int attempt = 0; fd < 0 && attempt < 8; attempt++) {
        snprintf(tmp, sizeof tmp, "%.32s.%ld-%llu.tmp", name, (long)getpid(),
                 (unsigned long long)atomic_fetch_add(&g_tmp_counter, 1));
        fd = openat(c->dirfd, tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
        if (fd < 0 && errno != EEXIST) break;
    }
    if (fd < 0) return write_error(c, what, errno);
    what = "writing a record";
    for (size_t off = 0; !err && off < job->size;) {
        ssize_t w = write(fd, job->buf + off, job->size - off);
        if (w < 0 && errno != EINTR) err = errno;
        else if (w > 0) off += (size_t)w;
    }
    if (!err && c->p.disk_sync && fsync(fd) != 0) {
        what = "syncing a record";
        err = errno;
    }
    if (!err) set_mtime(fd, job->depth);
    if (close(fd) != 0 && !err) {
        what = "closing a record";
        err = errno;
    }
    if (!err && renameat(c->dirfd, tmp, c->dirfd, name) != 0) {
        if (errno == ENOENT) { /* another process's scan took our temp file for a leftover */
            AG_LOGI("kv disk cache: %s/%s vanished before its rename; record skipped", c->dir, tmp);
            return W_FAILED;
        }
        what = "renaming a record";
        err = errno;
    }
    if (err) {
        unlinkat(c->dirfd, tmp, 0);
        return write_error(c, what, err);
    }
    return W_WRITTEN;
}

static void push_done(ag_cache *c, int32_t node, int result) {
    if (c->n_done == c->cap_done) {
        int32_t     ncap = c->cap_done ? c->cap_done * 2 : 64;
        write_done *d = realloc(c->done, sizeof *d * (size_t)ncap);
        if (!d) return; /* the node stays "queued": never written again, never wrong */
        c->done = d;
        c->cap_done = ncap;
    }
    c->done[c->n_done++] = (write_done){node, result};
}

/* Takes the next queued record and writes it (mu is held on entry and on
 * return, released for the I/O). The writer thread does this; so does
 * ag_cache_flush's caller, at its own priority, so that a shutdown does not
 * wait for a low-priority writer on a busy machine. Whoever leaves the
 * queue empty with no write in progress syncs the directory once for the
 * renames and fires notify. */
static void write_next_locked(ag_cache *c) {
    write_job *job = c->q_head;
    c->q_head = job->next;
    if (!c->q_head) c->q_tail = NULL;
    c->writers_busy++;
    pthread_mutex_unlock(&c->mu);

    int res = write_record(c, job);

    pthread_mutex_lock(&c->mu);
    c->q_bytes -= job->size;
    push_done(c, job->node, res);
    if (res == W_WRITTEN) {
        c->st.records_written++;
        c->st.bytes_written += job->size;
        c->dir_dirty = true;
    } else if (res == W_FAILED || res == W_NOSPACE) {
        c->st.write_failures++;
    }
    c->writers_busy--;
    pthread_cond_broadcast(&c->cv_done);
    free(job);
    if (!c->q_head && !c->writers_busy) {
        bool dirty = c->dir_dirty;
        c->dir_dirty = false;
        pthread_mutex_unlock(&c->mu);
        if (dirty && c->p.disk_sync) fsync(c->dirfd);
        notify(c);
        pthread_mutex_lock(&c->mu);
    }
}

static void *writer_main(void *arg) {
    ag_cache *c = arg;
    if (!c->scan_finished) {
        scan_dir(c);
        notify(c);
    }
    /* From now on only what no other thread wants the CPU for: the engine
     * copies blocks out only while idle, but the writes (the page-cache
     * copy, checksums, the file system's work) would otherwise take CPU
     * time from a decode step that starts meanwhile (measured: decode at
     * 0.4-0.8x while a 35 MB prompt was written, 2 cores; bench/RESULTS.md).
     * If the policy cannot be set, the thread runs as it is. */
    struct sched_param idle_prio = {0};
    pthread_setschedparam(pthread_self(), SCHED_IDLE, &idle_prio);
    pthread_mutex_lock(&c->mu);
    for (;;) {
        while (!c->q_head && !c->stop) {
            if (!c->writer_wake_ns) {
                pthread_cond_wait(&c->cv, &c->mu);
                continue;
            }
            /* a pause after a full disk ends: wake the engine so that its
             * next ag_cache_idle writes again (nothing else would call it
             * on an idle server) */
            if (cache_now_ns() >= c->writer_wake_ns) {
                c->writer_wake_ns = 0;
                pthread_mutex_unlock(&c->mu);
                notify(c);
                pthread_mutex_lock(&c->mu);
                continue;
            }
            struct timespec ts = {c->writer_wake_ns / 1000000000, c->writer_wake_ns % 1000000000};
            pthread_cond_timedwait(&c->cv, &c->mu, &ts);
        }
        if (!c->q_head) break;
        write_next_locked(c);
    }
    pthread_mutex_unlock(&c->mu);
    return NULL;
}

/* ---- engine-thread side ---- */

static void *reader_main(void *arg); /* (restores, below) */

void disk_open(ag_cache *c) {
    if (mkdir(c->dir, 0755) != 0 && errno != EEXIST) {
        AG_LOGW("kv disk cache off: cannot create %s: %s", c->dir, strerror(errno));
        return;
    }
    c->dirfd = open(c->dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (c->dirfd < 0) {
        AG_LOGW("kv disk cache off: cannot open %s: %s", c->dir, strerror(errno));
        return;
    }
    c->disk_on = true;
    c->staging_max = (int32_t)(c->p.read_staging_bytes / c->record_bytes);
    if (c->staging_max < 1) c->staging_max = 1;
    /* Writable? A read-only directory (or file system) still serves its
     * records; say so once, here, rather than at the first write. */
    char probe[64];
    snprintf(probe, sizeof probe, "writable-probe.%ld-0.tmp", (long)getpid());
    int     pfd = openat(c->dirfd, probe, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    int     err = errno;
    ssize_t w = -1;
    if (pfd >= 0) {
        w = write(pfd, "x", 1);
        err = errno;
        close(pfd);
        unlinkat(c->dirfd, probe, 0);
    }
    if (w == 1) atomic_store(&c->write_on, true);
    else AG_LOGW("kv disk cache: %s is not writable (%s): its records are restored, nothing new is written; "
                 "serving continues", c->dir, strerror(err));
    struct statvfs vfs;
    if (fstatvfs(c->dirfd, &vfs) == 0) c->free_at_start = (uint64_t)vfs.f_bavail * vfs.f_frsize;
    else c->free_at_start = (uint64_t)320 << 30; /* unknown: the 32 GiB default applies */
    c->cap_explicit = c->p.disk_max_bytes > 0;
    uint64_t def = (uint64_t)32 << 30;
    if (c->free_at_start / 10 < def) def = c->free_at_start / 10;
    c->cap_base = c->disk_max = c->cap_explicit ? c->p.disk_max_bytes : def;
    if (!c->p.background_scan) {
        scan_dir(c);
        disk_drain(c);
    }
    int n_read = c->p.read_threads > 0 ? c->p.read_threads : 4;
    if (n_read > 16) n_read = 16;
    int started = 0;
    pthread_mutex_lock(&c->mu); /* (n_readers counts down as they stop) */
    for (int i = 0; i < n_read; i++)
        if (pthread_create(&c->readers[started], NULL, reader_main, c) == 0) {
            pthread_setname_np(c->readers[started], "augur-kv-read"); /* (top -H, bench/cache_bench.py) */
            started++;
        }
    c->n_readers = c->n_readers_started = started;
    pthread_mutex_unlock(&c->mu);
    c->reader_started = started > 0;
    if (!started) AG_LOGW("kv disk cache: cannot start its reader threads; records will not be restored");
    if (pthread_create(&c->thread, NULL, writer_main, c) != 0) {
        AG_LOGW("kv disk cache: cannot start its thread; nothing will be written");
        atomic_store(&c->write_on, false);
        if (!c->scan_finished) {
            scan_dir(c);
            disk_drain(c);
        }
        return;
    }
    c->thread_started = true;
    pthread_setname_np(c->thread, "augur-kv-write");
}

void disk_close(ag_cache *c) {
    pthread_mutex_lock(&c->mu);
    c->stop = true;
    pthread_cond_broadcast(&c->cv);
    pthread_cond_broadcast(&c->cv_read);
    pthread_mutex_unlock(&c->mu);
    if (c->reader_started) {
        for (int i = 0; i < c->n_readers_started; i++) pthread_join(c->readers[i], NULL);
        c->reader_started = false;
    }
    if (c->thread_started) {
        pthread_join(c->thread, NULL);
        c->thread_started = false;
    }
    while (c->staging_free) {
        staging_buf *b = c->staging_free;
        c->staging_free = b->next;
        ag_kv_host_free(c->kv, b);
    }
    while (c->q_head) {
        write_job *j = c->q_head;
        c->q_head = j->next;
        free(j);
    }
    free(c->done);
    free(c->done2);
    free(c->scan);
    free(c->scan_tokens);
    c->done = c->done2 = NULL;
    c->scan = NULL;
    c->scan_tokens = NULL;
    if (c->dirfd >= 0) close(c->dirfd);
    c->dirfd = -1;
}

/* The record of node id is on disk now (written, found, or scanned). */
static void set_on_disk(ag_cache *c, int32_t id, int64_t mtime) {
    cache_node *n = &c->nodes[id];
    n->disk = D_ON;
    n->mtime_ns = mtime;
    cache_list_remove(c, L_DIRTY, id);
    int32_t p = cache_parent(c, id);
    if (p >= 0) c->nodes[p].n_disk_children++;
    /* behind its parent: still more recent than the rest, never ahead of it */
    cache_list_insert_behind(c, L_DISK, p >= 0 && c->nodes[p].disk == D_ON ? p : -1, id);
    c->n_on_disk++;
}

void disk_forget(ag_cache *c, int32_t id) {
    cache_node *n = &c->nodes[id];
    if (n->disk != D_ON) return;
    int32_t p = cache_parent(c, id);
    if (p >= 0) c->nodes[p].n_disk_children--;
    cache_list_remove(c, L_DISK, id);
    n->disk = D_NONE;
    c->n_on_disk--;
}

/* qsort has no context argument (qsort_r is not C11). */
static _Thread_local const ag_cache *qsort_ctx;

static int cmp_depth_desc(const void *a, const void *b) {
    int32_t x = qsort_ctx->nodes[*(const int32_t *)a].depth, y = qsort_ctx->nodes[*(const int32_t *)b].depth;
    return x > y ? -1 : x < y;
}

static int cmp_recency(const void *a, const void *b) {
    const cache_node *x = &qsort_ctx->nodes[*(const int32_t *)a], *y = &qsort_ctx->nodes[*(const int32_t *)b];
    if (x->mtime_ns != y->mtime_ns) return x->mtime_ns < y->mtime_ns ? -1 : 1;
    return x->depth > y->depth ? -1 : x->depth < y->depth; /* deeper is older */
}

static void merge_scan(ag_cache *c, scan_item *items, int32_t n, const int32_t *toks) {
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)(n ? n : 1));
    for (int32_t k = 0; k < n; k++) {
        const scan_item *it = &items[k];
        const int32_t   *t = toks + it->tok_off;
        int32_t          id = cache_find(c, it->key);
        if (ids) ids[k] = -1;
        if (id >= 0) {
            cache_node *nd = &c->nodes[id];
            bool same = nd->ns == it->ns && nd->depth == it->depth && nd->n_tok == it->n_tok &&
                        nd->parent.lo == it->parent.lo && nd->parent.hi == it->parent.hi &&
                        memcmp(cache_node_tokens(c, id), t, sizeof(int32_t) * (size_t)c->bs) == 0;
            /* published while the scan ran: now known to be on disk (a
             * queued write will find the file and skip) */
            if (same && nd->disk == D_NONE) set_on_disk(c, id, it->mtime_ns), nd->disk_full = it->full;
            continue;
        }
        id = cache_node_new(c, it->key, it->parent, it->ns, t, it->n_tok);
        if (id < 0) break;
        c->nodes[id].depth = it->depth;
        c->nodes[id].disk_full = it->full;
        set_on_disk(c, id, it->mtime_ns); /* (its place in the order is set below) */
        if (ids) ids[k] = id;
    }
    /* link parents by key, now that every record is in */
    int32_t m = 0;
    for (int32_t k = 0; ids && k < n; k++) {
        int32_t id = ids[k];
        if (id < 0) continue;
        ids[m++] = id;
        if (c->nodes[id].depth == 0) continue;
        int32_t p = cache_find(c, c->nodes[id].parent);
        /* (a partial block is never a parent) */
        if (p >= 0 && c->nodes[p].depth == c->nodes[id].depth - 1 && c->nodes[p].n_tok == c->bs)
            cache_parent_link(c, id, p);
    }
    /* The LRU order: a record counts as used as recently as anything that
     * continues it (a parent is written before its children, so its own
     * mtime is older), then deeper first. Then the least recently used end
     * holds leaves, and the cap evicts without searching. */
    if (ids && m > 1) {
        qsort_ctx = c;
        qsort(ids, (size_t)m, sizeof *ids, cmp_depth_desc);
        for (int32_t k = 0; k < m; k++) {
            int32_t p = cache_parent(c, ids[k]);
            if (p >= 0 && c->nodes[p].mtime_ns < c->nodes[ids[k]].mtime_ns)
                c->nodes[p].mtime_ns = c->nodes[ids[k]].mtime_ns;
        }
        qsort(ids, (size_t)m, sizeof *ids, cmp_recency);
        for (int32_t k = 0; k < m; k++) cache_list_push_head(c, L_DISK, ids[k]); /* oldest first in */
        qsort_ctx = NULL;
    }
    for (int32_t k = 0; ids && k < m; k++) c->nodes[ids[k]].used_ns = c->nodes[ids[k]].mtime_ns;
    /* Partial records that a sibling covers (its write was in flight when
     * the sibling was published, or another process wrote them) go now. */
    for (int32_t k = 0; ids && k < m; k++)
        if (c->nodes[ids[k]].used) cache_supersede(c, ids[k]);
    free(ids);
    pthread_mutex_lock(&c->mu); /* read by ag_cache_get_stats from other threads */
    c->scan_merged = true;
    pthread_mutex_unlock(&c->mu);
    if (!c->cap_explicit) {
        uint64_t def = (uint64_t)32 << 30, tenth = (c->free_at_start + (uint64_t)c->n_on_disk * c->record_bytes) / 10;
        c->cap_base = c->disk_max = tenth < def ? tenth : def; /* (nothing was written yet: no pause) */
    }
}

void disk_drain(ag_cache *c) {
    if (!c->disk_on) return;
    pthread_mutex_lock(&c->mu);
    bool       have_scan = c->scan_ready;
    scan_item *scan = c->scan;
    int32_t   *stoks = c->scan_tokens;
    int32_t    n_scan = c->n_scan;
    if (have_scan) {
        c->scan = NULL;
        c->scan_tokens = NULL;
        c->n_scan = 0;
        c->scan_ready = false;
    }
    write_done *d = c->done;
    int32_t     nd = c->n_done, capd = c->cap_done;
    c->done = c->done2;
    c->cap_done = c->cap_done2;
    c->n_done = 0;
    c->done2 = d;
    c->cap_done2 = capd;
    pthread_mutex_unlock(&c->mu);

    if (have_scan) {
        merge_scan(c, scan, n_scan, stoks);
        free(scan);
        free(stoks);
    }
    bool full = false;
    for (int32_t i = 0; i < nd; i++) {
        int32_t     id = d[i].node;
        cache_node *n = &c->nodes[id];
        if (!n->used || n->disk != D_QUEUED) {
            d[i].node = -1; /* (not for the second pass) */
            continue;
        }
        c->n_queued--;
        switch (d[i].result) {
        case W_FAILED:
            n->disk = D_NONE;
            n->no_write = 1;
            cache_node_maybe_remove(c, id);
            d[i].node = -1;
            break;
        case W_NOSPACE:
        case W_DEFERRED:
            n->disk = D_NONE; /* to be written after the pause (second pass) */
            full |= d[i].result == W_NOSPACE;
            break;
        default:
            if (d[i].result == W_WRITTEN) c->space_backoff_ns = 0; /* the disk took it: pauses start short again */
            set_on_disk(c, id, cache_real_now_ns());
            d[i].node = -1;
        }
    }
    /* Records that met a full disk wait again at the head of the dirty
     * list, in their order (parents before their continuations). */
    for (int32_t i = nd - 1; i >= 0; i--) {
        int32_t id = d[i].node;
        if (id < 0) continue;
        cache_node *n = &c->nodes[id];
        if (n->block >= 0 && !n->no_write) cache_list_push_head(c, L_DIRTY, id);
        else cache_node_maybe_remove(c, id);
    }
    if (full) disk_space_pause(c);
    if (!atomic_load(&c->write_on))
        while (c->list[L_DIRTY].head >= 0) cache_list_remove(c, L_DIRTY, c->list[L_DIRTY].head);
}

bool disk_delete_record(ag_cache *c, int32_t id) {
    char name[40];
    ag_cache_key_name(c->nodes[id].key, name);
    if (unlinkat(c->dirfd, name, 0) != 0 && errno != ENOENT) {
        writes_off(c, "deleting a record", errno);
        return false;
    }
    disk_forget(c, id);
    return true;
}

/* The least recently used record on disk that no other record on disk
 * continues (a leaf: deleting it leaves no record without its parent), or
 * -1 when nothing is on disk. */
static int32_t disk_victim(const ag_cache *c) {
    for (int32_t id = c->list[L_DISK].tail; id >= 0; id = c->nodes[id].link[L_DISK].prev)
        if (c->nodes[id].n_disk_children == 0) return id;
    return c->list[L_DISK].tail; /* a cycle of colliding keys: cannot happen at 128 bits */
}

/* Deletes the record of node id to keep the cap; false (writing turned
 * off) if the file could not be deleted. */
static bool evict_record(ag_cache *c, int32_t id) {
    if (!disk_delete_record(c, id)) return false;
    c->nodes[id].no_write = 1; /* the cap chose it: do not write it back */
    cache_list_remove(c, L_DIRTY, id);
    cache_node_maybe_remove(c, id);
    pthread_mutex_lock(&c->mu);
    c->st.evictions_disk++;
    pthread_mutex_unlock(&c->mu);
    return true;
}

/* Bytes of this process's records on disk and queued (the cap counts
 * both); while writing is paused the queued ones come back unwritten
 * (W_DEFERRED), so only those on disk count. */
static uint64_t disk_held(const ag_cache *c) {
    return (uint64_t)(c->n_on_disk + (c->space_retry_ns ? 0 : c->n_queued)) * c->record_bytes;
}

void disk_enforce_cap(ag_cache *c) {
    if (!c->disk_on || !c->scan_merged || !atomic_load(&c->write_on)) return;
    while (disk_held(c) > c->disk_max && c->list[L_DISK].n > 0)
        if (!evict_record(c, disk_victim(c))) break;
}

/* The cap after a full disk: what half of the room this process's records
 * and the free space take together holds (never above the cap asked for).
 * Half, so that the disk is not filled again at once and other writers
 * there keep room; recomputed when each pause ends, so that the cap grows
 * back when space has been freed meanwhile. Counted in records as the file
 * system allocates them (whole fragments: a small record takes a page of
 * a tmpfs), then as the cap counts them (file bytes). */
static void space_cap(ag_cache *c) {
    struct statvfs vfs;
    uint64_t       avail = 0, frag = 4096;
    if (fstatvfs(c->dirfd, &vfs) == 0) {
        avail = (uint64_t)vfs.f_bavail * vfs.f_frsize;
        if (vfs.f_frsize > 0) frag = vfs.f_frsize;
    }
    uint64_t alloc = (c->record_bytes + frag - 1) / frag * frag;
    uint64_t fit = ((uint64_t)c->n_on_disk * alloc + avail) / 2 / alloc * c->record_bytes;
    c->disk_max = fit < c->cap_base ? fit : c->cap_base;
}

void disk_space_pause(ag_cache *c) {
    int64_t now = cache_now_ns();
    if (c->space_retry_ns > now) return; /* (more failures of the same moment) */
    int64_t first = (int64_t)(c->p.space_retry_ms ? c->p.space_retry_ms : 10000) * 1000000;
    c->space_backoff_ns = c->space_backoff_ns ? c->space_backoff_ns * 2 : first;
    if (c->space_backoff_ns > 64 * first) c->space_backoff_ns = 64 * first;
    c->space_retry_ns = now + c->space_backoff_ns;
    uint64_t had = (uint64_t)c->n_on_disk * c->record_bytes;
    space_cap(c);
    int err = atomic_load(&c->space_errno);
    if (!c->space_warned)
        AG_LOGW("kv disk cache: %s is full (%s) with %.1f MiB of records; keeping at most %.1f MiB there (half of "
                "what the records and the free space hold), the least recently used go now, and writing resumes "
                "in %.0f s; serving continues",
                c->dir, strerror(err), had / 1048576.0, c->disk_max / 1048576.0, c->space_backoff_ns / 1e9);
    else
        AG_LOGI("kv disk cache: %s is full again (%s); keeping at most %.1f MiB, writing resumes in %.0f s", c->dir,
                strerror(err), c->disk_max / 1048576.0, c->space_backoff_ns / 1e9);
    c->space_warned = true;
    pthread_mutex_lock(&c->mu);
    c->st.space_pauses++;
    c->writer_wake_ns = c->space_retry_ns; /* the writer wakes the engine then */
    pthread_cond_signal(&c->cv);
    pthread_mutex_unlock(&c->mu);
    disk_enforce_cap(c);
}

/* Whether records may be written now: no pause, or the pause is over (the
 * cap then follows the space there is now, and the writer writes again). */
static bool space_ok(ag_cache *c) {
    if (!c->space_retry_ns) return true;
    if (cache_now_ns() < c->space_retry_ns) return false;
    c->space_retry_ns = 0;
    space_cap(c);
    atomic_store(&c->space_short, false);
    AG_LOGI("kv disk cache: writing to %s again (at most %.1f MiB)", c->dir, c->disk_max / 1048576.0);
    disk_enforce_cap(c);
    return true;
}

/* What make_room found for the next record to write. */
enum { ROOM_OK, ROOM_WAIT, ROOM_SKIP };

/* Makes room under the cap for node x's record: deletes least recently
 * used records on disk while the records on disk, the queued ones and x's
 * would exceed it. ROOM_WAIT: the queued records alone fill the cap (the
 * writer's results will make deletable records of them), or a delete
 * failed. ROOM_SKIP: x is not to be written, being less recently used than
 * every record the cap would delete for it (a prompt's deeper blocks count
 * as older, so a prompt longer than the cap keeps its first blocks), or
 * larger than the cap itself. */
static int make_room(ag_cache *c, int32_t x) {
    while (disk_held(c) + c->record_bytes > c->disk_max) {
        if (c->list[L_DISK].n == 0) return c->n_queued > 0 ? ROOM_WAIT : ROOM_SKIP;
        int32_t v = disk_victim(c);
        if (c->nodes[v].used_ns >= c->nodes[x].used_ns) return ROOM_SKIP;
        if (!evict_record(c, v)) return ROOM_WAIT;
    }
    return ROOM_OK;
}

bool disk_record_build(ag_cache *c, int32_t id, uint8_t *buf) {
    cache_node  *n = &c->nodes[id];
    header_build(c, id, buf);
    if (n->block < 0) { /* the host tier's copy: every layer, ring layers zero unless host_ring */
        memcpy(buf + c->header_bytes, c->host_slot[n->hslot], c->block_payload);
        put32(buf + 132, c->ring && !n->host_ring ? AG_CACHE_RECORD_NO_RING : 0);
        n->disk_full = !c->ring || n->host_ring;
        return true;
    }
    const ag_status st = cache_payload_out(c, n, buf + c->header_bytes); /* (ring layers without a ring block:
                                                                            * zeros, AG_CACHE_RECORD_NO_RING) */
    n->disk_full = !c->ring || n->rblock >= 0;
    if (st) {
        AG_LOGW("kv disk cache: copying block %d out failed: %s", n->block, ag_error_message());
        return false;
    }
    return true;
}

/* A write job holding node id's record, the node marked queued; NULL when
 * out of memory or the copy failed (then no_write is set). */
static write_job *job_new(ag_cache *c, int32_t id) {
    cache_node *n = &c->nodes[id];
    write_job  *job = malloc(sizeof *job + c->record_bytes);
    if (!job) return NULL;
    job->buf = (uint8_t *)(job + 1);
    if (!disk_record_build(c, id, job->buf)) {
        free(job);
        n->no_write = 1;
        return NULL;
    }
    job->next = NULL;
    job->node = id;
    job->depth = n->depth;
    job->key = n->key;
    job->size = c->record_bytes;
    n->disk = D_QUEUED;
    c->n_queued++;
    return job;
}

bool disk_queue_from_host(ag_cache *c, int32_t id) {
    cache_node *n = &c->nodes[id];
    if (!c->disk_on || !c->scan_merged || !atomic_load(&c->write_on) || n->disk != D_NONE || n->no_write) return false;
    if (!space_ok(c)) return false;
    pthread_mutex_lock(&c->mu);
    size_t q = c->q_bytes;
    pthread_mutex_unlock(&c->mu);
    if (q + c->record_bytes > c->p.write_queue_bytes) return false;
    /* no deletes here (this runs while a step makes room, on the engine
     * thread): only where the cap has room already */
    if (disk_held(c) + c->record_bytes > c->disk_max) return false;
    write_job *job = job_new(c, id);
    if (!job) return false;
    cache_list_remove(c, L_DIRTY, id);
    pthread_mutex_lock(&c->mu);
    if (c->q_tail) c->q_tail->next = job;
    else c->q_head = job;
    c->q_tail = job;
    c->q_bytes += c->record_bytes;
    c->st.host_to_disk++;
    pthread_cond_signal(&c->cv);
    pthread_mutex_unlock(&c->mu);
    return true;
}

bool disk_queue_writes(ag_cache *c, size_t max_bytes) {
    if (!c->disk_on || !c->scan_merged || !atomic_load(&c->write_on) || c->list[L_DIRTY].n == 0) return false;
    if (!space_ok(c)) return false;
    if (c->disk_max < c->record_bytes && !c->cap_warned) {
        AG_LOGW("kv disk cache: the byte cap (%llu bytes) is smaller than one record (%zu bytes): nothing is "
                "written to %s", (unsigned long long)c->disk_max, c->record_bytes, c->dir);
        c->cap_warned = true;
    }
    pthread_mutex_lock(&c->mu);
    size_t q = c->q_bytes;
    bool   idle = !c->q_head && !c->writers_busy;
    pthread_mutex_unlock(&c->mu);
    size_t room = c->p.write_queue_bytes > q ? c->p.write_queue_bytes - q : 0;
    size_t budget = max_bytes < room ? max_bytes : room;
    if (idle && budget < c->record_bytes) budget = c->record_bytes;
    write_job *head = NULL, **tail = &head;
    size_t     used = 0;
    uint64_t   skipped = 0;
    bool       wait = false;
    while (c->list[L_DIRTY].head >= 0 && used + c->record_bytes <= budget) {
        int32_t id = c->list[L_DIRTY].head;
        cache_node *n = &c->nodes[id];
        if ((n->block < 0 && n->hslot < 0) || n->disk != D_NONE || n->no_write) {
            cache_list_remove(c, L_DIRTY, id);
            continue;
        }
        int room = make_room(c, id);
        if (room == ROOM_WAIT) {
            wait = true; /* (it stays first in line) */
            break;
        }
        cache_list_remove(c, L_DIRTY, id);
        if (room == ROOM_SKIP) {
            n->no_write = 1;
            skipped++;
            continue;
        }
        write_job *job = job_new(c, id);
        if (!job) {
            if (!n->no_write) cache_list_push_head(c, L_DIRTY, id); /* (out of memory) */
            if (!n->no_write) break;
            continue;
        }
        *tail = job;
        tail = &job->next;
        used += c->record_bytes;
    }
    pthread_mutex_lock(&c->mu);
    c->st.records_skipped += skipped;
    if (head) {
        if (c->q_tail) c->q_tail->next = head;
        else c->q_head = head;
        c->q_tail = (write_job *)((char *)tail - offsetof(write_job, next));
        c->q_bytes += used;
        pthread_cond_signal(&c->cv);
    }
    q = c->q_bytes;
    pthread_mutex_unlock(&c->mu);
    return c->list[L_DIRTY].n > 0 && q + c->record_bytes <= c->p.write_queue_bytes && (used > 0 || skipped > 0) &&
           !wait;
}

/* ---- restores: the reader thread and its staging buffers ---- */

/* A staging buffer (record_bytes), or NULL when the staging budget is all
 * in use. Under mu. */
static uint8_t *staging_get_locked(ag_cache *c) {
    if (c->staging_free) {
        staging_buf *b = c->staging_free;
        c->staging_free = b->next;
        return (uint8_t *)b;
    }
    if (c->staging_n >= c->staging_max) return NULL;
    /* pinned where the KV pool is device memory: a restore's copy into the
     * pool is then one DMA */
    uint8_t *b = ag_kv_host_alloc(c->kv, c->record_bytes);
    if (b) c->staging_n++;
    return b;
}

static void staging_put_locked(ag_cache *c, uint8_t *buf) {
    staging_buf *b = (staging_buf *)(void *)buf;
    b->next = c->staging_free;
    c->staging_free = b;
    pthread_cond_signal(&c->cv_read); /* the reader may be waiting for room */
}

void disk_staging_put(ag_cache *c, uint8_t *buf) {
    if (!buf) return;
    pthread_mutex_lock(&c->mu);
    staging_put_locked(c, buf);
    pthread_mutex_unlock(&c->mu);
}

/* Frees a restore nobody else holds; records it still stages go back to
 * the free list. Under mu. */
static void restore_free_locked(ag_cache *c, ag_cache_restore *r) {
    for (int32_t i = 0; i < r->n; i++)
        if (r->e[i].buf) staging_put_locked(c, r->e[i].buf);
    free(r->e);
    free(r->tokens);
    free(r);
}

static ssize_t pread_full(int fd, uint8_t *buf, size_t n) {
    size_t got = 0;
    while (got < n) {
        ssize_t r = pread(fd, buf + got, n - got, (off_t)got);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) return -1;
        if (r == 0) break;
        got += (size_t)r;
    }
    return (ssize_t)got;
}

/* Reader thread: reads the record of restore entry en (tokens toks,
 * namespace ns) into buf and verifies it: header, identity, that it is the
 * block the index expects, payload checksum. RS_OK; RS_GONE (no such file:
 * evicted by another process, quietly); RS_BAD (logged, record deleted).
 * Touches no index state. */
static int32_t read_record(ag_cache *c, const restore_entry *en, const int32_t *toks, uint64_t ns, uint8_t *buf) {
    char name[40], why[300];
    ag_cache_key_name(en->key, name);
    why[0] = '\0';
    int fd = openat(c->dirfd, name, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0 && errno == ENOENT) {
        AG_LOGI("kv disk cache: %s/%s is gone (evicted by another process?); prefilling from position %d", c->dir,
                name, en->depth * c->bs);
        return RS_GONE;
    }
    if (fd < 0) {
        snprintf(why, sizeof why, "cannot open: %s", strerror(errno));
    } else {
        ssize_t         got = pread_full(fd, buf, c->record_bytes);
        ag_cache_record rec;
        const char     *bad = NULL;
        if (got < 0) snprintf(why, sizeof why, "read error: %s", strerror(errno));
        else if ((size_t)got != c->record_bytes)
            snprintf(why, sizeof why, "truncated (read %zd of %zu bytes)", got, c->record_bytes);
        else if (ag_cache_record_parse(buf, c->header_bytes, &rec) != AG_OK)
            snprintf(why, sizeof why, "corrupt: %s", ag_error_message());
        else if ((bad = foreign(c, &rec)) != NULL)
            snprintf(why, sizeof why, "%s", bad);
        else if (!key_eq(rec.key, en->key) || !key_eq(rec.parent, en->parent) || rec.ns != ns ||
                 (int32_t)rec.block_index != en->depth || rec.n_tokens != en->n_tok ||
                 memcmp(rec.tokens, toks, sizeof(int32_t) * (size_t)c->bs) != 0)
            snprintf(why, sizeof why, "header does not match the index (tokens, parent or namespace)");
        else if (XXH3_64bits(buf + c->header_bytes, c->block_payload) != rec.payload_hash)
            snprintf(why, sizeof why, "payload checksum mismatch");
        if (!why[0]) set_mtime(fd, en->depth); /* a hit bumps the clock */
        close(fd);
    }
    if (!why[0]) return RS_OK;
    bool del = unlinkat(c->dirfd, name, 0) == 0 || errno == ENOENT;
    AG_LOGW("kv disk cache: restoring %s/%s failed: %s; record %s, prefilling from position %d", c->dir, name, why,
            del ? "deleted" : "could not be deleted", en->depth * c->bs);
    return RS_BAD;
}

/* Records read ahead of the one being read: their I/O is in flight while
 * the reader checks the current one (one pread at a time would leave the
 * device idle between records; a cold read then runs at the latency of one
 * request, not the bandwidth). */
#define READ_AHEAD_RECORDS 8

/* A reader: asks the kernel to start reading the records of r after entry
 * i that have not been announced yet (r->hinted, claimed under mu; the
 * keys are immutable). posix_fadvise(WILLNEED) queues the reads and
 * returns; a record that is gone or already cached costs an open. */
static void read_ahead(ag_cache *c, ag_cache_restore *r, int32_t i) {
    int32_t end = i + 1 + READ_AHEAD_RECORDS < r->n ? i + 1 + READ_AHEAD_RECORDS : r->n;
    pthread_mutex_lock(&c->mu);
    int32_t from = r->hinted > i ? r->hinted : i + 1;
    if (end > r->hinted) r->hinted = end;
    pthread_mutex_unlock(&c->mu);
    for (int32_t j = from; j < end; j++) {
        if (!r->e[j].from_disk) continue;
        char name[40];
        ag_cache_key_name(r->e[j].key, name);
        int fd = openat(c->dirfd, name, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
        if (fd < 0) continue;
        posix_fadvise(fd, 0, (off_t)c->record_bytes, POSIX_FADV_WILLNEED);
        close(fd);
    }
}

/* The readers (params.read_threads of them): each takes the first queued
 * restore's next unclaimed record, in prompt order, and reads it into a
 * staging buffer, so that up to read_threads records of a prompt are read
 * at once (parallel preads: one at a time leaves an NVMe drive or a RAID
 * mostly idle); they wait when the staging budget is in use (the engine
 * gives buffers back as it copies records into kv blocks, in prompt order:
 * the earliest record not yet copied is always claimed by a reader that
 * holds a buffer, so waiting cannot deadlock). A failed record ends its
 * restore's reading (records of it already being read finish and are let
 * go with it). A restore leaves the queue when all its records are
 * claimed; the last reader done with an abandoned one frees it. */
static void *reader_main(void *arg) {
    ag_cache *c = arg;
    pthread_mutex_lock(&c->mu);
    while (!c->stop) {
        ag_cache_restore *r = c->rq_head;
        if (!r) {
            pthread_cond_wait(&c->cv_read, &c->mu);
            continue;
        }
        int32_t i = r->next_read;
        while (i < r->n && !r->e[i].from_disk) i++;
        if (r->stop_read || i >= r->n) { /* every record claimed: off the queue */
            c->rq_head = r->next;
            if (!c->rq_head) c->rq_tail = NULL;
            r->next_read = r->n;
            if (r->readers_on == 0) {
                r->reader_has = false;
                if (r->abandoned) restore_free_locked(c, r);
            }
            continue;
        }
        uint8_t *buf = staging_get_locked(c);
        if (!buf) {
            pthread_cond_wait(&c->cv_read, &c->mu);
            continue;
        }
        r->next_read = i + 1;
        r->readers_on++;
        restore_entry  en = r->e[i];
        const int32_t *toks = r->tokens + (size_t)i * c->bs; /* stable while reader_has */
        pthread_mutex_unlock(&c->mu);

        if (c->p.read_delay_us) usleep(c->p.read_delay_us);
        read_ahead(c, r, i);
        int32_t res = read_record(c, &en, toks, r->ns, buf);

        pthread_mutex_lock(&c->mu);
        r->e[i].result = res;
        if (res == RS_OK && !r->abandoned) r->e[i].buf = buf;
        else staging_put_locked(c, buf);
        if (res != RS_OK) r->stop_read = true;
        if (res == RS_OK) c->st.bytes_read += c->record_bytes;
        else c->st.restore_failures++;
        if (res == RS_BAD) c->st.dropped_records++;
        r->readers_on--;
        bool queued = false;
        for (ag_cache_restore *q = c->rq_head; q && !queued; q = q->next) queued = q == r;
        if (r->readers_on == 0 && !queued) {
            r->reader_has = false;
            if (r->abandoned) {
                restore_free_locked(c, r);
                continue;
            }
        }
        pthread_cond_broadcast(&c->cv_done);
        pthread_mutex_unlock(&c->mu);
        notify(c);
        pthread_mutex_lock(&c->mu);
    }
    /* stopping: every restore was finished or cancelled (ag_cache_free's
     * contract); the last reader out frees the cancelled ones still queued */
    if (--c->n_readers == 0) {
        while (c->rq_head) {
            ag_cache_restore *r = c->rq_head;
            c->rq_head = r->next;
            r->reader_has = false;
            if (r->abandoned) restore_free_locked(c, r);
        }
        c->rq_tail = NULL;
    }
    pthread_mutex_unlock(&c->mu);
    return NULL;
}

bool disk_can_read(const ag_cache *c) { return c->disk_on && c->reader_started; }

void disk_restore_submit(ag_cache *c, ag_cache_restore *r) {
    pthread_mutex_lock(&c->mu);
    r->reader_has = true;
    r->next = NULL;
    if (c->rq_tail) c->rq_tail->next = r;
    else c->rq_head = r;
    c->rq_tail = r;
    pthread_cond_signal(&c->cv_read);
    pthread_mutex_unlock(&c->mu);
}

void disk_restore_wait(ag_cache *c, ag_cache_restore *r) {
    pthread_mutex_lock(&c->mu);
    while (r->done < r->n && r->e[r->done].result == RS_PENDING && !c->stop) pthread_cond_wait(&c->cv_done, &c->mu);
    pthread_mutex_unlock(&c->mu);
}

int32_t disk_restore_take(ag_cache *c, ag_cache_restore *r, int32_t i, uint8_t **buf) {
    pthread_mutex_lock(&c->mu);
    int32_t res = r->e[i].result;
    *buf = r->e[i].buf;
    r->e[i].buf = NULL;
    pthread_mutex_unlock(&c->mu);
    return res;
}

void disk_restore_failed(ag_cache *c, const restore_entry *en, int32_t result) {
    cache_node *n = &c->nodes[en->node];
    if (!n->used || n->gen != en->gen) return; /* it left the index meanwhile */
    disk_forget(c, en->node);
    if (result == RS_BAD) n->no_write = 1;
    cache_node_maybe_remove(c, en->node);
}

void disk_restore_release(ag_cache *c, ag_cache_restore *r) {
    pthread_mutex_lock(&c->mu);
    r->stop_read = true;
    if (r->reader_has) {
        r->abandoned = true;
        pthread_cond_signal(&c->cv_read); /* it may be waiting for staging room */
    } else {
        restore_free_locked(c, r);
    }
    pthread_mutex_unlock(&c->mu);
}

void disk_flush_wait(ag_cache *c) {
    if (!c->disk_on) return;
    for (;;) {
        disk_drain(c);
        if (!c->scan_merged) {
            pthread_mutex_lock(&c->mu);
            while (!c->scan_finished) pthread_cond_wait(&c->cv_done, &c->mu);
            pthread_mutex_unlock(&c->mu);
            continue;
        }
        int32_t dirty = c->list[L_DIRTY].n;
        int64_t on = c->n_on_disk, queued = c->n_queued;
        disk_queue_writes(c, SIZE_MAX);
        pthread_mutex_lock(&c->mu);
        while (c->thread_started && (c->q_head || c->writers_busy)) {
            if (c->q_head) write_next_locked(c); /* help: see write_next_locked */
            else pthread_cond_wait(&c->cv_done, &c->mu);
        }
        pthread_mutex_unlock(&c->mu);
        disk_drain(c);
        if (c->list[L_DIRTY].n == 0 || !atomic_load(&c->write_on) || !c->thread_started || c->space_retry_ns) break;
        /* no progress (a result lost to an allocation failure keeps a
         * record queued for ever): do not spin */
        if (c->list[L_DIRTY].n == dirty && c->n_on_disk == on && c->n_queued == queued) break;
    }
    disk_enforce_cap(c);
}

/* ---- directory tools ---- */

/* Opens dir twice: *dfd for the *at() calls on its entries, *d (over a
 * second descriptor, which closedir owns) to list them. */
static ag_status open_dir_for_listing(const char *dir, int *dfd, DIR **d) {
    *dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (*dfd < 0) return ag_errorf(AG_ERR_IO, "%s: %s", dir, strerror(errno));
    int lfd = openat(*dfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    *d = lfd >= 0 ? fdopendir(lfd) : NULL;
    if (!*d) {
        int e = errno;
        if (lfd >= 0) close(lfd);
        close(*dfd);
        return ag_errorf(AG_ERR_IO, "%s: %s", dir, strerror(e));
    }
    return AG_OK;
}

ag_status ag_cache_dir_list(const char *dir, bool (*fn)(void *user, const ag_cache_dir_entry *e), void *user) {
    int       dfd;
    DIR      *d;
    ag_status ost = open_dir_for_listing(dir, &dfd, &d);
    if (ost) return ost;
    struct dirent  *e;
    ag_cache_record rec;
    char            why[300];
    while ((e = readdir(d))) {
        long               pid;
        struct stat        st;
        ag_cache_dir_entry ent = {.name = e->d_name};
        if (is_tmp_name(e->d_name, &pid)) {
            if (fstatat(dfd, e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(st.st_mode)) continue;
            ent.problem = "temporary file";
        } else if (is_record_name(e->d_name)) {
            memset(&st, 0, sizeof st);
            ent.problem = examine(dfd, e->d_name, &rec, &st, why, sizeof why);
            ent.record = ent.problem ? NULL : &rec;
        } else {
            continue;
        }
        ent.file_bytes = (uint64_t)st.st_size;
        ent.mtime_ns = mtime_ns(&st);
        if (!fn(user, &ent)) break;
    }
    closedir(d);
    close(dfd);
    return AG_OK;
}

ag_status ag_cache_dir_clear(const char *dir, uint64_t *n_files, uint64_t *n_bytes) {
    uint64_t nf = 0, nb = 0;
    if (n_files) *n_files = 0;
    if (n_bytes) *n_bytes = 0;
    int       dfd;
    DIR      *d;
    ag_status ost = open_dir_for_listing(dir, &dfd, &d);
    if (ost) return ost;
    struct dirent *e;
    ag_status      st = AG_OK;
    while ((e = readdir(d))) {
        long        pid;
        struct stat s;
        if (!is_record_name(e->d_name) && !is_tmp_name(e->d_name, &pid)) continue;
        if (fstatat(dfd, e->d_name, &s, AT_SYMLINK_NOFOLLOW) != 0 || S_ISDIR(s.st_mode)) continue;
        if (unlinkat(dfd, e->d_name, 0) != 0) {
            if (errno == ENOENT) continue;
            st = ag_errorf(AG_ERR_IO, "%s/%s: %s", dir, e->d_name, strerror(errno));
            break;
        }
        nf++;
        nb += (uint64_t)s.st_size;
    }
    closedir(d);
    close(dfd);
    if (n_files) *n_files = nf;
    if (n_bytes) *n_bytes = nb;
    return st;
}
