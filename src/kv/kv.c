/* Paged KV cache (see kv.h for the model and the forward-pass protocol).
 *
 * Bookkeeping is three arrays: a refcount per block, a LIFO stack of free
 * block ids (the most recently freed block is reused first: its pages are
 * warm), and per-sequence block tables. Every operation that can fail checks
 * everything it needs (ids, ranges, free blocks, table capacity) before it
 * mutates anything, so a failed call leaves the cache exactly as it was. */
#include "kv/kv.h"

#include "base/switches.h"
#include "kv/state.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define KV_ALIGN 64
#define KV_MAX_DIM 65536 /* generous caps that keep all size arithmetic far from overflow */
#define KV_MAX_HEADS 4096
#define KV_MAX_LAYERS 4096
#define KV_MAX_SEQS 65536

typedef struct {
    bool     live;
    int32_t  len;      /* committed positions */
    int32_t  reserved; /* writable end, >= len */
    int32_t  n_blocks; /* entries used in `blocks` */
    int32_t  cap;      /* entries allocated */
    int32_t *blocks;
    int32_t *rblocks; /* the ring table ([cap], -1: recycled), NULL without a ring */
    int32_t  rlo;     /* entries [rlo, n_blocks) of rblocks are ring blocks */
} kv_seq;

struct ag_kv {
    ag_kv_layout lay;
    int32_t      max_seqs;
    int32_t     *window; /* [n_layers] */
    uint8_t     *pool_raw;
    uint8_t     *pool; /* KV_ALIGN-aligned inside pool_raw */
    size_t       pool_bytes;
    size_t       v_offset; /* V region offset within a layer of a block */
    int32_t      n_blocks;
    int32_t     *ref;   /* [n_blocks] */
    int32_t     *stack; /* [n_blocks] free ids; top at n_free-1 */
    int32_t      n_free;
    kv_seq      *seqs; /* [max_seqs] */
    size_t       meta_bytes;
    uint64_t     cow_copies;
    uint64_t     nomem_errors;
    const ag_kv_mem *mem; /* NULL: host pool */
    ag_state        *state; /* recurrent layers' state slots, or NULL */
    /* the ring (r_n_blocks == 0: none) */
    int32_t  ring_w, ring_slack;
    uint8_t *is_ring;   /* [n_layers] */
    int32_t *layer_idx; /* [n_layers]: the layer's index within its pool's blocks */
    uint8_t *rpool_raw, *rpool;
    size_t   rpool_bytes;
    int32_t  r_n_blocks;
    int32_t *rref, *rstack;
    int32_t  r_n_free;
    ag_kv_ring_reclaim_fn reclaim;
    void    *reclaim_user;
};

/* Block-byte moves, through the device hooks when the pool is not host
 * memory. A failed device copy is reported by the caller as AG_ERR_IO. */
static int pool_copy(const ag_kv *kv, void *dst, const void *src, size_t n) {
    if (kv->mem) return kv->mem->copy(kv->mem->ctx, dst, src, n);
    memcpy(dst, src, n);
    return 0;
}
static int pool_to_host(const ag_kv *kv, void *host, const void *src, size_t n) {
    if (kv->mem) return kv->mem->to_host(kv->mem->ctx, host, src, n);
    memcpy(host, src, n);
    return 0;
}
static int pool_from_host(const ag_kv *kv, void *dst, const void *host, size_t n) {
    if (kv->mem) return kv->mem->from_host(kv->mem->ctx, dst, host, n);
    memcpy(dst, host, n);
    return 0;
}

static size_t align_up(size_t x) { return (x + KV_ALIGN - 1) & ~(size_t)(KV_ALIGN - 1); }

static size_t row_bytes(ag_kv_dtype t, int32_t dim) { return ag_kv_row_bytes(t, dim); }

const char *ag_kv_dtype_name(ag_kv_dtype t) {
    switch (t) {
    case AG_KV_F32: return "f32";
    case AG_KV_F16: return "f16";
    case AG_KV_Q8_0: return "q8_0";
    case AG_KV_Q4_0: return "q4_0";
    }
    return "?";
}

bool ag_kv_dtype_parse(const char *name, ag_kv_dtype *out) {
    static const ag_kv_dtype all[] = {AG_KV_F32, AG_KV_F16, AG_KV_Q8_0, AG_KV_Q4_0};
    for (size_t i = 0; name && i < sizeof all / sizeof all[0]; i++)
        if (!strcmp(name, ag_kv_dtype_name(all[i]))) {
            *out = all[i];
            return true;
        }
    return false;
}

bool ag_kv_dtype_quantized(ag_kv_dtype t) { return t == AG_KV_Q8_0 || t == AG_KV_Q4_0; }

/* Q8_0 packs 32 elements into 34 bytes (an f16 scale, 32 int8), Q4_0 into
 * 18 (an f16 scale, 16 bytes of nibbles): ggml's blocks, byte for byte. */
size_t ag_kv_row_bytes(ag_kv_dtype t, int64_t dim) {
    if (dim < 0) return 0;
    switch (t) {
    case AG_KV_F32: return (size_t)dim * 4;
    case AG_KV_F16: return (size_t)dim * 2;
    case AG_KV_Q8_0: return dim % AG_KV_QBLOCK ? 0 : (size_t)dim / AG_KV_QBLOCK * 34;
    case AG_KV_Q4_0: return dim % AG_KV_QBLOCK ? 0 : (size_t)dim / AG_KV_QBLOCK * 18;
    }
    return 0;
}

ag_kv_params ag_kv_default_params(void) {
    ag_kv_params p;
    memset(&p, 0, sizeof p);
    p.block_size = 16;
    p.dtype = AG_KV_F16;
    p.budget_bytes = (size_t)256 << 20;
    p.max_seqs = 64;
    p.layer_window = NULL;
    p.state_snapshots = 8;
    p.state_snap_last = true;
    p.ring = false;
    p.ring_slack = 32;
    p.ring_step = 512;
    return p;
}

/* ---- F16 conversion ----------------------------------------------------- */

uint16_t ag_kv_f32_to_f16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    uint32_t sign = (x >> 16) & 0x8000u;
    uint32_t ax = x & 0x7fffffffu;
    if (ax >= 0x7f800000u) /* inf stays inf; NaN stays a (quiet) NaN */
        return (uint16_t)(sign | 0x7c00u | (ax > 0x7f800000u ? 0x200u | ((ax >> 13) & 0x3ffu) : 0));
    if (ax >= 0x477ff000u) /* >= 65520 rounds past the largest half (65504) */
        return (uint16_t)(sign | 0x7c00u);
    if (ax >= 0x38800000u) { /* normal half: rebias exponent, round mantissa to even */
        uint32_t h = (ax - 0x38000000u) >> 13;
        uint32_t rem = ax & 0x1fffu;
        if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) h++; /* carry may bump exponent: fine */
        return (uint16_t)(sign | h);
    }
    if (ax <= 0x33000000u) return (uint16_t)sign; /* <= 2^-25: rounds (to even) to zero */
    /* Subnormal half: value / 2^-24, rounded to nearest even. */
    uint32_t e = ax >> 23;
    uint32_t m = (ax & 0x7fffffu) | 0x800000u;
    uint32_t shift = 126u - e; /* 14..24 */
    uint32_t h = m >> shift;
    uint32_t rem = m & ((1u << shift) - 1u);
    uint32_t half = 1u << (shift - 1u);
    if (rem > half || (rem == half && (h & 1u))) h++;
    return (uint16_t)(sign | h);
}

float ag_kv_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t e = (h >> 10) & 0x1fu;
    uint32_t m = h & 0x3ffu;
    uint32_t x;
    if (e == 0) {
        if (m == 0) {
            x = sign;
        } else { /* subnormal: normalise */
            uint32_t ee = 113;
            while (!(m & 0x400u)) {
                m <<= 1;
                ee--;
            }
            x = sign | (ee << 23) | ((m & 0x3ffu) << 13);
        }
    } else if (e == 31) {
        x = sign | 0x7f800000u | (m << 13);
    } else {
        x = sign | ((e + 112u) << 23) | (m << 13);
    }
    float f;
    memcpy(&f, &x, 4);
    return f;
}

static void put_scale(uint8_t *p, float d) {
    uint16_t h = ag_kv_f32_to_f16(d);
    p[0] = (uint8_t)h, p[1] = (uint8_t)(h >> 8);
}
static float get_scale(const uint8_t *p) { return ag_kv_f16_to_f32((uint16_t)(p[0] | p[1] << 8)); }

void ag_kv_store_row(ag_kv_dtype t, void *dst, const float *src, int64_t n) {
    uint8_t *o = dst;
    switch (t) {
    case AG_KV_F32: memcpy(dst, src, (size_t)n * 4); return;
    case AG_KV_F16:
        for (int64_t i = 0; i < n; i++) ((uint16_t *)dst)[i] = ag_kv_f32_to_f16(src[i]);
        return;
    case AG_KV_Q8_0:
        for (int64_t b = 0; b < n / AG_KV_QBLOCK; b++, o += 34) {
            const float *x = src + b * AG_KV_QBLOCK;
            float amax = 0;
            for (int j = 0; j < AG_KV_QBLOCK; j++) amax = fabsf(x[j]) > amax ? fabsf(x[j]) : amax;
            const float d = amax / 127.0f, id = amax > 0 ? 127.0f / amax : 0.0f;
            put_scale(o, d);
            for (int j = 0; j < AG_KV_QBLOCK; j++) o[2 + j] = (uint8_t)(int8_t)nearbyintf(x[j] * id);
        }
        return;
    case AG_KV_Q4_0:
        for (int64_t b = 0; b < n / AG_KV_QBLOCK; b++, o += 18) {
            const float *x = src + b * AG_KV_QBLOCK;
            float amax = 0, max = 0;
            for (int j = 0; j < AG_KV_QBLOCK; j++)
                if (fabsf(x[j]) > amax) amax = fabsf(x[j]), max = x[j];
            const float d = max / -8.0f, id = d != 0 ? 1.0f / d : 0.0f;
            put_scale(o, d);
            for (int j = 0; j < AG_KV_QBLOCK / 2; j++) {
                const int q0 = (int)(int8_t)(x[j] * id + 8.5f), q1 = (int)(int8_t)(x[j + 16] * id + 8.5f);
                o[2 + j] = (uint8_t)((q0 < 15 ? q0 : 15) | (q1 < 15 ? q1 : 15) << 4);
            }
        }
        return;
    }
}

void ag_kv_load_row(ag_kv_dtype t, float *dst, const void *src, int64_t n) {
    const uint8_t *p = src;
    switch (t) {
    case AG_KV_F32: memcpy(dst, src, (size_t)n * 4); return;
    case AG_KV_F16:
        for (int64_t i = 0; i < n; i++) dst[i] = ag_kv_f16_to_f32(((const uint16_t *)src)[i]);
        return;
    case AG_KV_Q8_0:
        for (int64_t b = 0; b < n / AG_KV_QBLOCK; b++, p += 34) {
            const float d = get_scale(p);
            for (int j = 0; j < AG_KV_QBLOCK; j++) dst[b * AG_KV_QBLOCK + j] = d * (float)(int8_t)p[2 + j];
        }
        return;
    case AG_KV_Q4_0:
        for (int64_t b = 0; b < n / AG_KV_QBLOCK; b++, p += 18) {
            const float d = get_scale(p);
            for (int j = 0; j < AG_KV_QBLOCK / 2; j++) {
                dst[b * AG_KV_QBLOCK + j] = d * (float)((p[2 + j] & 15) - 8);
                dst[b * AG_KV_QBLOCK + j + 16] = d * (float)((p[2 + j] >> 4) - 8);
            }
        }
        return;
    }
}

static void store_row(ag_kv_dtype t, void *dst, const float *src, int32_t n) { ag_kv_store_row(t, dst, src, n); }
static void load_row(ag_kv_dtype t, float *dst, const void *src, int32_t n) { ag_kv_load_row(t, dst, src, n); }

/* ---- init / free -------------------------------------------------------- */

ag_status ag_kv_layout_for(const ag_kv_params *p, ag_kv_layout *out, int32_t *n_blocks) {
    if (!p || !out) return ag_errorf(AG_ERR_INVALID, "kv: NULL params");
    if (p->n_layers < 1 || p->n_layers > KV_MAX_LAYERS)
        return ag_errorf(AG_ERR_INVALID, "kv: n_layers %d outside [1, %d]", p->n_layers,
                         KV_MAX_LAYERS);
    if (p->n_kv_heads < 1 || p->n_kv_heads > KV_MAX_HEADS)
        return ag_errorf(AG_ERR_INVALID, "kv: n_kv_heads %d outside [1, %d]", p->n_kv_heads,
                         KV_MAX_HEADS);
    if (p->head_dim_k < 1 || p->head_dim_k > KV_MAX_DIM || p->head_dim_v < 1 ||
        p->head_dim_v > KV_MAX_DIM)
        return ag_errorf(AG_ERR_INVALID, "kv: head dims k=%d v=%d outside [1, %d]", p->head_dim_k,
                         p->head_dim_v, KV_MAX_DIM);
    int32_t bs = p->block_size;
    if (bs < 8 || bs > 256 || (bs & (bs - 1)))
        return ag_errorf(AG_ERR_INVALID, "kv: block_size %d is not a power of two in [8, 256]", bs);
    if (p->max_seqs < 1 || p->max_seqs > KV_MAX_SEQS)
        return ag_errorf(AG_ERR_INVALID, "kv: max_seqs %d outside [1, %d]", p->max_seqs,
                         KV_MAX_SEQS);
    if (p->dtype != AG_KV_F32 && p->dtype != AG_KV_F16 && !ag_kv_dtype_quantized(p->dtype))
        return ag_errorf(AG_ERR_INVALID, "kv: unknown dtype %d", (int)p->dtype);
    if (ag_kv_dtype_quantized(p->dtype) && (p->head_dim_k % AG_KV_QBLOCK || p->head_dim_v % AG_KV_QBLOCK))
        return ag_errorf(AG_ERR_UNSUPPORTED,
                         "kv: a %s KV cache needs head dims that are multiples of %d (this model's: k=%d v=%d); use "
                         "--kv-type f16",
                         ag_kv_dtype_name(p->dtype), AG_KV_QBLOCK, p->head_dim_k, p->head_dim_v);
    if (p->layer_window) {
        for (int32_t l = 0; l < p->n_layers; l++)
            if (p->layer_window[l] < 0)
                return ag_errorf(AG_ERR_INVALID, "kv: layer %d: negative sliding window %d", l,
                                 p->layer_window[l]);
    }

    ag_kv_layout lay;
    memset(&lay, 0, sizeof lay);
    lay.dtype = p->dtype;
    lay.n_layers = p->n_layers;
    lay.n_kv_heads = p->n_kv_heads;
    lay.head_dim_k = p->head_dim_k;
    lay.head_dim_v = p->head_dim_v;
    lay.block_size = bs;
    while ((1 << lay.block_shift) < bs) lay.block_shift++;
    if (ag_kv_dtype_quantized(p->dtype) && !ag_switch_off("AUGUR_KV_ROTATE")) {
        int32_t r = p->head_dim_k & -p->head_dim_k;
        lay.rot_k = p->head_dim_k % 64 ? 0 : r > 512 ? 512 : r;
        lay.rot_v = p->head_dim_v % 64 ? 0 : 64;
    }
    lay.row_bytes_k = row_bytes(p->dtype, p->head_dim_k);
    lay.row_bytes_v = row_bytes(p->dtype, p->head_dim_v);
    lay.head_stride_k = (size_t)bs * lay.row_bytes_k;
    lay.head_stride_v = (size_t)bs * lay.row_bytes_v;
    /* The caps above bound each region by 2^38 bytes and a block by 2^51. */
    size_t k_bytes = (size_t)p->n_kv_heads * lay.head_stride_k;
    size_t v_bytes = (size_t)p->n_kv_heads * lay.head_stride_v;
    lay.layer_stride = align_up(k_bytes) + align_up(v_bytes);
    lay.block_bytes = (size_t)p->n_layers * lay.layer_stride;
    lay.copy_bytes = k_bytes + v_bytes;
    if (p->ring && p->layer_window) {
        int32_t nr = 0, w = 0;
        for (int32_t l = 0; l < p->n_layers; l++)
            if (p->layer_window[l] > 0) nr++, w = p->layer_window[l] > w ? p->layer_window[l] : w;
        if (nr > 0 && nr < p->n_layers) { /* (all windowed: no main pool to speak of; no ring) */
            lay.ring_window = w;
            lay.n_ring_layers = nr;
            lay.ring_block_bytes = (size_t)nr * lay.layer_stride;
            lay.block_bytes = (size_t)(p->n_layers - nr) * lay.layer_stride;
        }
    }

    size_t nb = p->budget_bytes / lay.block_bytes;
    if (nb > (size_t)INT32_MAX / 2) nb = (size_t)INT32_MAX / 2;
    *out = lay;
    if (n_blocks) *n_blocks = (int32_t)nb;
    return AG_OK;
}

/* The metadata ag_kv_init allocates next to the pool (block tables, which
 * grow with the sequences, are added as they grow). */
static size_t fixed_meta_bytes(const ag_kv_params *p, size_t n_blocks, size_t r_blocks) {
    return sizeof(struct ag_kv) + (size_t)p->n_layers * (2 * sizeof(int32_t) + 1) +
           (n_blocks + r_blocks) * 2 * sizeof(int32_t) + (size_t)p->max_seqs * sizeof(kv_seq);
}

/* Ring blocks n_seqs sequences hold at most: each, after a recycle, the
 * blocks of positions from len - W + 1 - slack (rounded down to a block) to
 * len - 1, and then, all together, the step positions reserved past that
 * (a partial block more each). */
static int64_t ring_blocks_held(const ag_kv_layout *lay, int32_t slack, int32_t n_seqs, int32_t step) {
    const int64_t bs = lay->block_size;
    const int64_t win = ((int64_t)lay->ring_window + (slack > 0 ? slack : 0) + bs - 1) / bs + 1;
    return (int64_t)n_seqs * (win + 1) + ((step > 0 ? step : 1) + bs - 1) / bs;
}

int32_t ag_kv_ring_blocks_for(const ag_kv_params *p, int32_t n_seqs, int32_t step) {
    ag_kv_layout lay;
    if (ag_kv_layout_for(p, &lay, NULL) || !lay.n_ring_layers) return 0;
    int64_t n = ring_blocks_held(&lay, p->ring_slack, n_seqs, step);
    return n > INT32_MAX / 4 ? INT32_MAX / 4 : (int32_t)n;
}

/* The ring pool's block count of params p (0 without a ring). */
static int32_t ring_pool_blocks(const ag_kv_params *p, const ag_kv_layout *lay) {
    if (!lay->n_ring_layers) return 0;
    if (p->ring_blocks > 0) return p->ring_blocks;
    int64_t n = ring_blocks_held(lay, p->ring_slack, p->max_seqs, p->ring_step) * 3 / 2;
    return n > INT32_MAX / 4 ? INT32_MAX / 4 : (int32_t)n;
}

size_t ag_kv_ring_pool_bytes(const ag_kv_params *p) {
    ag_kv_layout lay;
    if (ag_kv_layout_for(p, &lay, NULL)) return 0;
    return (size_t)ring_pool_blocks(p, &lay) * lay.ring_block_bytes;
}

size_t ag_kv_budget_for(const ag_kv_layout *lay, int32_t n_seqs, int32_t n_ctx) {
    size_t per_seq = ((size_t)n_ctx + (size_t)lay->block_size - 1) / (size_t)lay->block_size;
    return (size_t)n_seqs * per_seq * lay->block_bytes;
}

ag_status ag_kv_memory_bytes(const ag_kv_params *p, int32_t max_len, size_t *bytes) {
    ag_kv_layout lay;
    int32_t      nb;
    ag_status    st = ag_kv_layout_for(p, &lay, &nb);
    if (st) return st;
    /* a sequence's table doubles from 8 entries up to what max_len needs */
    size_t table = 0, need = ((size_t)max_len + (size_t)lay.block_size - 1) / (size_t)lay.block_size;
    if (need > 0) {
        table = 8;
        while (table < need) table *= 2;
    }
    const size_t rb = (size_t)ring_pool_blocks(p, &lay);
    *bytes = (size_t)nb * lay.block_bytes + rb * lay.ring_block_bytes + fixed_meta_bytes(p, (size_t)nb, rb) +
             (size_t)p->max_seqs * table * sizeof(int32_t) * (lay.n_ring_layers ? 2 : 1);
    if (p->state_layers > 0) /* the slots, and at most a snapshot ring per sequence */
        *bytes += (size_t)p->max_seqs * (size_t)(1 + p->state_snapshots) * (size_t)p->state_layers *
                  (p->state_conv_floats + p->state_ssm_floats) * sizeof(float);
    return AG_OK;
}

ag_status ag_kv_init(const ag_kv_params *p, ag_kv **out) {
    if (!out) return ag_errorf(AG_ERR_INVALID, "kv: init: NULL out");
    *out = NULL;
    ag_kv_layout lay;
    int32_t      n_blocks;
    ag_status    st = ag_kv_layout_for(p, &lay, &n_blocks);
    if (st) return st;
    if (n_blocks < 1)
        return ag_errorf(AG_ERR_NOMEM, "kv: budget %zu bytes is below one block (%zu bytes)",
                         p->budget_bytes, lay.block_bytes);
    size_t nb = (size_t)n_blocks;
    size_t k_bytes = (size_t)p->n_kv_heads * lay.head_stride_k;

    ag_kv *kv = calloc(1, sizeof *kv);
    if (!kv) return ag_errorf(AG_ERR_NOMEM, "kv: out of memory");
    kv->lay = lay;
    kv->max_seqs = p->max_seqs;
    kv->n_blocks = (int32_t)nb;
    kv->v_offset = align_up(k_bytes);
    kv->pool_bytes = nb * lay.block_bytes;
    /* calloc: positions never written read as zeros (deterministic bytes for
     * persistence), and large callocs are fresh, lazily committed pages. A
     * device pool is zero-filled by its allocator for the same reason. */
    kv->mem = p->mem;
    kv->pool_raw = kv->mem ? kv->mem->alloc(kv->mem->ctx, kv->pool_bytes + KV_ALIGN) : calloc(1, kv->pool_bytes + KV_ALIGN);
    kv->window = calloc((size_t)p->n_layers, sizeof *kv->window);
    kv->ref = calloc(nb, sizeof *kv->ref);
    kv->stack = malloc(nb * sizeof *kv->stack);
    kv->seqs = calloc((size_t)p->max_seqs, sizeof *kv->seqs);
    kv->is_ring = calloc((size_t)p->n_layers, 1);
    kv->layer_idx = calloc((size_t)p->n_layers, sizeof *kv->layer_idx);
    const int32_t rnb = ring_pool_blocks(p, &lay);
    if (rnb > 0) {
        kv->ring_w = lay.ring_window;
        kv->ring_slack = p->ring_slack > 0 ? p->ring_slack : 0;
        kv->r_n_blocks = rnb;
        kv->rpool_bytes = (size_t)rnb * lay.ring_block_bytes;
        kv->rpool_raw = kv->mem ? kv->mem->alloc(kv->mem->ctx, kv->rpool_bytes + KV_ALIGN)
                                : calloc(1, kv->rpool_bytes + KV_ALIGN);
        kv->rref = calloc((size_t)rnb, sizeof *kv->rref);
        kv->rstack = malloc((size_t)rnb * sizeof *kv->rstack);
    }
    if (!kv->pool_raw || !kv->window || !kv->ref || !kv->stack || !kv->seqs || !kv->is_ring || !kv->layer_idx ||
        (rnb > 0 && (!kv->rpool_raw || !kv->rref || !kv->rstack))) {
        size_t want = kv->pool_bytes + kv->rpool_bytes;
        ag_kv_free(kv);
        return ag_errorf(AG_ERR_NOMEM, "kv: cannot allocate a pool of %zu bytes", want);
    }
    if (p->state_layers > 0 &&
        (st = ag_state_new(p->state_layers, p->state_conv_floats, p->state_ssm_floats, p->max_seqs,
                           p->state_snapshots, p->mem, &kv->state))) {
        ag_kv_free(kv);
        return st;
    }
    if (kv->state) ag_state_set_snap_last(kv->state, p->state_snap_last);
    kv->pool = kv->pool_raw + (KV_ALIGN - (uintptr_t)kv->pool_raw % KV_ALIGN) % KV_ALIGN;
    if (p->layer_window)
        memcpy(kv->window, p->layer_window, (size_t)p->n_layers * sizeof *kv->window);
    /* Pushed in reverse so that a fresh cache hands out 0, 1, 2, ... */
    for (int32_t i = 0; i < kv->n_blocks; i++) kv->stack[i] = kv->n_blocks - 1 - i;
    kv->n_free = kv->n_blocks;
    {
        int32_t gi = 0, ri = 0;
        for (int32_t l = 0; l < p->n_layers; l++) {
            kv->is_ring[l] = rnb > 0 && kv->window[l] > 0;
            kv->layer_idx[l] = kv->is_ring[l] ? ri++ : gi++;
        }
    }
    if (rnb > 0) {
        kv->rpool = kv->rpool_raw + (KV_ALIGN - (uintptr_t)kv->rpool_raw % KV_ALIGN) % KV_ALIGN;
        for (int32_t i = 0; i < rnb; i++) kv->rstack[i] = rnb - 1 - i;
        kv->r_n_free = rnb;
    }
    kv->meta_bytes = fixed_meta_bytes(p, nb, (size_t)rnb);
    *out = kv;
    return AG_OK;
}

void ag_kv_free(ag_kv *kv) {
    if (!kv) return;
    if (kv->seqs)
        for (int32_t i = 0; i < kv->max_seqs; i++) free(kv->seqs[i].blocks), free(kv->seqs[i].rblocks);
    free(kv->seqs);
    free(kv->is_ring);
    free(kv->layer_idx);
    free(kv->rref);
    free(kv->rstack);
    if (kv->rpool_raw) {
        if (kv->mem) kv->mem->free(kv->mem->ctx, kv->rpool_raw);
        else free(kv->rpool_raw);
    }
    free(kv->stack);
    free(kv->ref);
    free(kv->window);
    ag_state_free(kv->state);
    if (kv->mem) {
        if (kv->pool_raw) kv->mem->free(kv->mem->ctx, kv->pool_raw);
    } else {
        free(kv->pool_raw);
    }
    free(kv);
}

const ag_kv_layout *ag_kv_get_layout(const ag_kv *kv) { return &kv->lay; }

int32_t ag_kv_free_blocks(const ag_kv *kv) { return kv->n_free; }

void ag_kv_get_stats(const ag_kv *kv, ag_kv_stats *out) {
    memset(out, 0, sizeof *out);
    out->pool_bytes = kv->pool_bytes;
    out->meta_bytes = kv->meta_bytes;
    out->block_bytes = kv->lay.block_bytes;
    out->n_blocks = kv->n_blocks;
    out->blocks_free = kv->n_free;
    out->blocks_used = kv->n_blocks - kv->n_free;
    for (int32_t b = 0; b < kv->n_blocks; b++) out->blocks_shared += kv->ref[b] > 1;
    out->max_seqs = kv->max_seqs;
    for (int32_t s = 0; s < kv->max_seqs; s++) {
        if (!kv->seqs[s].live) continue;
        out->seqs_live++;
        out->positions += kv->seqs[s].len;
    }
    out->cow_copies = kv->cow_copies;
    out->nomem_errors = kv->nomem_errors;
    out->ring_pool_bytes = kv->rpool_bytes;
    out->ring_blocks = kv->r_n_blocks;
    out->ring_blocks_free = kv->r_n_free;
    for (int32_t s = 0; s < kv->max_seqs && kv->r_n_blocks; s++)
        if (kv->seqs[s].live && kv->seqs[s].n_blocks > kv->seqs[s].rlo)
            out->ring_positions += (int64_t)(kv->seqs[s].n_blocks - kv->seqs[s].rlo) * kv->lay.block_size;
}

int32_t ag_kv_layer_window(const ag_kv *kv, int32_t layer) {
    if (layer < 0 || layer >= kv->lay.n_layers) return 0;
    return kv->window[layer];
}

bool ag_kv_layer_ring(const ag_kv *kv, int32_t layer) {
    return layer >= 0 && layer < kv->lay.n_layers && kv->is_ring[layer];
}

size_t ag_kv_layer_block_stride(const ag_kv *kv, int32_t layer) {
    return ag_kv_layer_ring(kv, layer) ? kv->lay.ring_block_bytes : kv->lay.block_bytes;
}

void ag_kv_set_ring_reclaim(ag_kv *kv, ag_kv_ring_reclaim_fn fn, void *user) {
    kv->reclaim = fn;
    kv->reclaim_user = user;
}

/* ---- internals ---------------------------------------------------------- */

static kv_seq *seq_get(const ag_kv *kv, int32_t seq) {
    if (seq < 0 || seq >= kv->max_seqs || !kv->seqs[seq].live) return NULL;
    return &kv->seqs[seq];
}

static uint8_t *block_base(const ag_kv *kv, int32_t block) {
    return kv->pool + (size_t)block * kv->lay.block_bytes;
}

/* Layer `layer` of block `block` of the layer's pool. */
static uint8_t *layer_base(const ag_kv *kv, int32_t layer, int32_t block) {
    uint8_t *b = kv->is_ring[layer] ? kv->rpool + (size_t)block * kv->lay.ring_block_bytes : block_base(kv, block);
    return b + (size_t)kv->layer_idx[layer] * kv->lay.layer_stride;
}

static int32_t blocks_for(const ag_kv *kv, int32_t len) {
    return (int32_t)(((int64_t)len + kv->lay.block_size - 1) >> kv->lay.block_shift);
}

/* Ensures room for `need` table entries; the only failure is malloc's. */
static ag_status table_grow(ag_kv *kv, kv_seq *s, int32_t need) {
    if (need <= s->cap) return AG_OK;
    int32_t cap = s->cap ? s->cap : 8;
    while (cap < need) cap = cap > INT32_MAX / 2 ? need : cap * 2;
    int32_t *nb = realloc(s->blocks, (size_t)cap * sizeof *nb);
    if (!nb) return ag_errorf(AG_ERR_NOMEM, "kv: cannot grow a block table to %d entries", cap);
    s->blocks = nb;
    if (kv->r_n_blocks) {
        int32_t *rb = realloc(s->rblocks, (size_t)cap * sizeof *rb);
        if (!rb) return ag_errorf(AG_ERR_NOMEM, "kv: cannot grow a ring table to %d entries", cap);
        for (int32_t i = s->cap; i < cap; i++) rb[i] = -1;
        s->rblocks = rb;
        kv->meta_bytes += (size_t)(cap - s->cap) * sizeof *rb;
    }
    kv->meta_bytes += (size_t)(cap - s->cap) * sizeof *nb;
    s->cap = cap;
    return AG_OK;
}

/* Caller has checked n_free > 0. */
static int32_t block_take(ag_kv *kv) {
    int32_t b = kv->stack[--kv->n_free];
    kv->ref[b] = 1;
    return b;
}

static void block_drop(ag_kv *kv, int32_t b) {
    if (--kv->ref[b] == 0) kv->stack[kv->n_free++] = b;
}

static int32_t rblock_take(ag_kv *kv) {
    int32_t b = kv->rstack[--kv->r_n_free];
    kv->rref[b] = 1;
    return b;
}

static void rblock_drop(ag_kv *kv, int32_t b) {
    if (--kv->rref[b] == 0) kv->rstack[kv->r_n_free++] = b;
}

/* Releases ring entries [from, to) (those present). */
static void ring_release(ag_kv *kv, kv_seq *s, int32_t from, int32_t to) {
    if (!s->rblocks) return;
    for (int32_t i = from < s->rlo ? s->rlo : from; i < to; i++)
        if (s->rblocks[i] >= 0) rblock_drop(kv, s->rblocks[i]), s->rblocks[i] = -1;
}

/* Releases table entries [keep, n_blocks). */
static void seq_release_from(ag_kv *kv, kv_seq *s, int32_t keep) {
    for (int32_t i = keep; i < s->n_blocks; i++) block_drop(kv, s->blocks[i]);
    ring_release(kv, s, keep, s->n_blocks);
    if (s->n_blocks > keep) s->n_blocks = keep;
    if (s->rlo > keep) s->rlo = keep;
}

void ag_kv_seq_recycle(ag_kv *kv, int32_t seq) {
    kv_seq *s = seq_get(kv, seq);
    if (!s || !s->rblocks) return;
    int32_t lo = s->len - kv->ring_w + 1 - kv->ring_slack;
    int32_t keep_from = lo > 0 ? lo >> kv->lay.block_shift : 0;
    if (keep_from > s->n_blocks) keep_from = s->n_blocks;
    if (keep_from <= s->rlo) return;
    ring_release(kv, s, s->rlo, keep_from);
    s->rlo = keep_from;
}

int32_t ag_kv_ring_first_needed(const ag_kv *kv, int32_t len) {
    if (!kv->r_n_blocks || len - kv->ring_w + 1 <= 0) return 0;
    return (len - kv->ring_w + 1) >> kv->lay.block_shift;
}

static ag_status full_error(ag_kv *kv, int32_t need) {
    kv->nomem_errors++;
    return ag_errorf(AG_ERR_NOMEM, "KV cache full: need %d blocks, %d free", need, kv->n_free);
}

/* ---- sequences ---------------------------------------------------------- */

ag_status ag_kv_seq_new(ag_kv *kv, int32_t *seq) {
    for (int32_t i = 0; i < kv->max_seqs; i++) {
        kv_seq *s = &kv->seqs[i];
        if (s->live) continue;
        s->live = true;
        s->len = s->reserved = s->n_blocks = 0;
        if (kv->state) ag_state_reset(kv->state, i);
        *seq = i;
        return AG_OK;
    }
    return ag_errorf(AG_ERR_NOMEM, "kv: all %d sequence ids are in use", kv->max_seqs);
}

ag_status ag_kv_seq_free(ag_kv *kv, int32_t seq) {
    kv_seq *s = seq_get(kv, seq);
    if (!s) return ag_errorf(AG_ERR_INVALID, "kv: seq_free: sequence %d is not live", seq);
    seq_release_from(kv, s, 0);
    kv->meta_bytes -= (size_t)s->cap * sizeof *s->blocks * (s->rblocks ? 2 : 1);
    free(s->blocks);
    free(s->rblocks);
    memset(s, 0, sizeof *s);
    return AG_OK;
}

bool ag_kv_seq_live(const ag_kv *kv, int32_t seq) { return seq_get(kv, seq) != NULL; }

int32_t ag_kv_seq_len(const ag_kv *kv, int32_t seq) {
    kv_seq *s = seq_get(kv, seq);
    return s ? s->len : -1;
}

const int32_t *ag_kv_seq_blocks(const ag_kv *kv, int32_t seq, int32_t *n_blocks) {
    kv_seq *s = seq_get(kv, seq);
    if (!s || s->n_blocks == 0) {
        *n_blocks = 0;
        return NULL;
    }
    *n_blocks = s->n_blocks;
    return s->blocks;
}

const int32_t *ag_kv_seq_layer_blocks(const ag_kv *kv, int32_t seq, int32_t layer, int32_t *n_blocks) {
    const int32_t *t = ag_kv_seq_blocks(kv, seq, n_blocks);
    return t && ag_kv_layer_ring(kv, layer) ? kv->seqs[seq].rblocks : t;
}

const int32_t *ag_kv_seq_ring_blocks(const ag_kv *kv, int32_t seq, int32_t *n_blocks, int32_t *first) {
    kv_seq *s = seq_get(kv, seq);
    *n_blocks = s && s->rblocks ? s->n_blocks : 0;
    *first = s && s->rblocks ? s->rlo : 0;
    return s && s->rblocks && s->n_blocks ? s->rblocks : NULL;
}

/* The blocks reserving n_new (> 0) positions after s's length takes: every
 * existing block from the one holding position len onwards may be written
 * from then on, so any that is shared must be copied, and the missing ones
 * are new. */
static int32_t reserve_need(const ag_kv *kv, const kv_seq *s, int32_t n_new) {
    const int32_t first = s->len >> kv->lay.block_shift;
    const int32_t last = (int32_t)(((int64_t)s->len + n_new - 1) >> kv->lay.block_shift);
    int32_t       need = 0;
    for (int32_t i = first; i < s->n_blocks; i++) need += kv->ref[s->blocks[i]] > 1;
    if (last >= s->n_blocks) need += last + 1 - s->n_blocks;
    return need;
}

ag_status ag_kv_seq_reserve(ag_kv *kv, int32_t seq, int32_t n_new) {
    kv_seq *s = seq_get(kv, seq);
    if (!s) return ag_errorf(AG_ERR_INVALID, "kv: reserve: sequence %d is not live", seq);
    if (n_new < 0) return ag_errorf(AG_ERR_INVALID, "kv: reserve: n_new %d < 0", n_new);
    if (n_new == 0) return AG_OK;
    if ((int64_t)s->len + n_new > INT32_MAX - kv->lay.block_size)
        return ag_errorf(AG_ERR_RANGE, "kv: reserve: length %d + %d overflows", s->len, n_new);
    int32_t end = s->len + n_new;
    int32_t first = s->len >> kv->lay.block_shift;
    int32_t last = (end - 1) >> kv->lay.block_shift;
    int32_t need = reserve_need(kv, s, n_new);
    if (need > kv->n_free) return full_error(kv, need);
    /* The ring: entries below what the oldest query of this step (at len)
     * can read, less the slack, are recycled; the rest is as above. */
    int32_t keep_from = 0, r_need = 0, r_back = 0;
    if (kv->r_n_blocks) {
        int32_t lo = s->len - kv->ring_w + 1 - kv->ring_slack;
        keep_from = lo > 0 ? lo >> kv->lay.block_shift : 0;
        if (keep_from > first) keep_from = first;
        if (keep_from < s->rlo) keep_from = s->rlo;
        for (int32_t i = s->rlo; i < keep_from && i < s->n_blocks; i++) r_back += kv->rref[s->rblocks[i]] == 1;
        for (int32_t i = first; i < s->n_blocks; i++) r_need += kv->rref[s->rblocks[i]] > 1;
        if (last >= s->n_blocks) r_need += last + 1 - s->n_blocks;
        if (r_need > kv->r_n_free + r_back && kv->reclaim)
            kv->reclaim(kv->reclaim_user, r_need - kv->r_n_free - r_back);
        if (r_need > kv->r_n_free + r_back) {
            kv->nomem_errors++;
            return ag_errorf(AG_ERR_NOMEM, "KV ring full: need %d ring blocks, %d free", r_need,
                             kv->r_n_free + r_back);
        }
    }
    ag_status st = table_grow(kv, s, last + 1);
    if (st != AG_OK) return st;
    if (kv->r_n_blocks) {
        ring_release(kv, s, s->rlo, keep_from);
        if (s->rlo < keep_from) s->rlo = keep_from;
        for (int32_t i = first; i < s->n_blocks; i++) {
            int32_t old = s->rblocks[i];
            if (kv->rref[old] == 1) continue;
            int32_t nb = rblock_take(kv);
            if (pool_copy(kv, kv->rpool + (size_t)nb * kv->lay.ring_block_bytes,
                          kv->rpool + (size_t)old * kv->lay.ring_block_bytes, kv->lay.ring_block_bytes)) {
                rblock_drop(kv, nb);
                return ag_errorf(AG_ERR_IO, "kv: copying a shared ring block on the device failed");
            }
            rblock_drop(kv, old);
            s->rblocks[i] = nb;
            kv->cow_copies++;
        }
        for (int32_t i = s->n_blocks; i <= last; i++) s->rblocks[i] = rblock_take(kv);
        if (s->n_blocks == 0) s->rlo = 0;
    }

    for (int32_t i = first; i < s->n_blocks; i++) {
        int32_t old = s->blocks[i];
        if (kv->ref[old] == 1) continue;
        int32_t nb = block_take(kv);
        if (pool_copy(kv, block_base(kv, nb), block_base(kv, old), kv->lay.block_bytes)) {
            block_drop(kv, nb);
            return ag_errorf(AG_ERR_IO, "kv: copying a shared block on the device failed");
        }
        block_drop(kv, old);
        s->blocks[i] = nb;
        kv->cow_copies++;
    }
    for (int32_t i = s->n_blocks; i <= last; i++) s->blocks[i] = block_take(kv);
    if (s->n_blocks < last + 1) s->n_blocks = last + 1;
    if (s->reserved < end) s->reserved = end;
    return AG_OK;
}

int32_t ag_kv_reserve_cost(const ag_kv *kv, int32_t seq, int32_t n_new) {
    kv_seq *s = seq_get(kv, seq);
    if (!s || n_new < 0) return -1;
    return n_new == 0 ? 0 : reserve_need(kv, s, n_new);
}

/* The slot check shared by ag_kv_slot and ag_kv_write. */
static ag_status slot_check(const ag_kv *kv, int32_t seq, int32_t pos, int32_t *block,
                            int32_t *offset) {
    kv_seq *s = seq_get(kv, seq);
    if (!s) return ag_errorf(AG_ERR_INVALID, "kv: slot: sequence %d is not live", seq);
    if (pos < s->len || pos >= s->reserved)
        return ag_errorf(AG_ERR_INVALID,
                         "kv: slot: position %d of sequence %d is not writable (len %d, "
                         "reserved up to %d)",
                         pos, seq, s->len, s->reserved);
    int32_t b = s->blocks[pos >> kv->lay.block_shift];
    if (kv->ref[b] != 1)
        return ag_errorf(AG_ERR_INVALID,
                         "kv: slot: block %d of sequence %d is shared (refcount %d) since the "
                         "reserve; reserve again",
                         b, seq, kv->ref[b]);
    *block = b;
    *offset = pos & (kv->lay.block_size - 1);
    return AG_OK;
}

ag_status ag_kv_slot(const ag_kv *kv, int32_t seq, int32_t pos, int32_t *block, int32_t *offset) {
    return slot_check(kv, seq, pos, block, offset);
}

ag_status ag_kv_layer_slot(const ag_kv *kv, int32_t seq, int32_t layer, int32_t pos, int32_t *block,
                           int32_t *offset) {
    ag_status st = slot_check(kv, seq, pos, block, offset);
    if (st || !ag_kv_layer_ring(kv, layer)) return st;
    int32_t b = kv->seqs[seq].rblocks[pos >> kv->lay.block_shift];
    if (b < 0 || kv->rref[b] != 1)
        return ag_errorf(AG_ERR_INVALID, "kv: slot: ring block of position %d of sequence %d is %s", pos, seq,
                         b < 0 ? "missing" : "shared; reserve again");
    *block = b;
    return AG_OK;
}

ag_status ag_kv_seq_commit(ag_kv *kv, int32_t seq, int32_t new_len) {
    kv_seq *s = seq_get(kv, seq);
    if (!s) return ag_errorf(AG_ERR_INVALID, "kv: commit: sequence %d is not live", seq);
    if (new_len < s->len || new_len > s->reserved)
        return ag_errorf(AG_ERR_RANGE,
                         "kv: commit: length %d of sequence %d outside [len %d, reserved %d]",
                         new_len, seq, s->len, s->reserved);
    s->len = new_len;
    return AG_OK;
}

/* ---- trim and fork ------------------------------------------------------ */

bool ag_kv_can_trim(const ag_kv *kv) { return kv->r_n_blocks == 0; }

/* The ring's limit alone. */
static int32_t ring_trim_limit(const ag_kv *kv, const kv_seq *s) {
    if (!s->rblocks || s->rlo == 0) return s->len;
    /* the shortest length m whose window [m - W + 1, m) starts in block rlo or later */
    int64_t min_len = ((int64_t)s->rlo << kv->lay.block_shift) + kv->ring_w - 1;
    return min_len >= s->len ? 0 : (int32_t)(s->len - min_len);
}

int32_t ag_kv_trim_limit(const ag_kv *kv, int32_t seq) {
    kv_seq *s = seq_get(kv, seq);
    if (!s) return -1;
    const int32_t ring = ring_trim_limit(kv, s), state = ag_kv_state_trim_limit(kv, seq);
    return ring < state ? ring : state; /* (a recurrent state: what its snapshots restore) */
}

bool ag_kv_trimmable(const ag_kv *kv, int32_t seq, int32_t n) {
    int32_t lim = ag_kv_trim_limit(kv, seq);
    return lim >= 0 && n >= 0 && n <= lim;
}

bool ag_kv_ring_covers(const ag_kv *kv, int32_t seq, int32_t m) {
    kv_seq *s = seq_get(kv, seq);
    if (!s || m < 0 || m > s->len) return false;
    return !s->rblocks || m == 0 || s->rlo <= ag_kv_ring_first_needed(kv, m);
}

struct ag_state *ag_kv_state(ag_kv *kv) { return kv->state; }

int32_t ag_kv_state_trim_limit(const ag_kv *kv, int32_t seq) {
    return kv->state && seq_get(kv, seq) ? ag_state_trim_limit(kv->state, seq) : INT32_MAX;
}

ag_status ag_kv_trim(ag_kv *kv, int32_t seq, int32_t n) {
    kv_seq *s = seq_get(kv, seq);
    if (!s) return ag_errorf(AG_ERR_INVALID, "kv: trim: sequence %d is not live", seq);
    if (n < 0 || n > s->len)
        return ag_errorf(AG_ERR_RANGE, "kv: trim: cannot drop %d of %d positions of sequence %d", n,
                         s->len, seq);
    if (!ag_kv_trimmable(kv, seq, n))
        return ag_errorf(AG_ERR_UNSUPPORTED,
                         "kv: trim: the %s of sequence %d (length %d) no longer holds what "
                         "length %d needs (it can drop %d positions)",
                         ring_trim_limit(kv, s) < n ? "sliding-window ring" : "recurrent state's snapshots", seq,
                         s->len, s->len - n, ag_kv_trim_limit(kv, seq));
    if (kv->state) {
        ag_status st = ag_state_trim(kv->state, seq, n);
        if (st) return st;
    }
    int32_t new_len = s->len - n;
    seq_release_from(kv, s, blocks_for(kv, new_len));
    s->len = s->reserved = new_len;
    return AG_OK;
}

ag_status ag_kv_seq_clear(ag_kv *kv, int32_t seq) {
    kv_seq *s = seq_get(kv, seq);
    if (!s) return ag_errorf(AG_ERR_INVALID, "kv: clear: sequence %d is not live", seq);
    seq_release_from(kv, s, 0);
    s->len = s->reserved = 0;
    if (kv->state) ag_state_reset(kv->state, seq);
    return AG_OK;
}

ag_status ag_kv_fork(ag_kv *kv, int32_t dst, int32_t src, int32_t len) {
    kv_seq *d = seq_get(kv, dst);
    kv_seq *s = seq_get(kv, src);
    if (!d || !s)
        return ag_errorf(AG_ERR_INVALID, "kv: fork: sequence %d is not live", d ? src : dst);
    if (dst == src) return ag_errorf(AG_ERR_INVALID, "kv: fork: dst and src are both %d", dst);
    if (len < 0 || len > s->len)
        return ag_errorf(AG_ERR_RANGE, "kv: fork: length %d outside [0, %d] of sequence %d", len,
                         s->len, src);
    /* a recurrent state is only the state after its last position */
    if (kv->state && len != 0 && len != s->len)
        return ag_errorf(AG_ERR_UNSUPPORTED,
                         "kv: fork: sequence %d has recurrent state at %d positions; it cannot fork at %d", src,
                         s->len, len);
    if (!ag_kv_ring_covers(kv, src, len))
        return ag_errorf(AG_ERR_UNSUPPORTED, "kv: fork: the ring of sequence %d no longer holds length %d's window",
                         src, len);
    int32_t   nb = blocks_for(kv, len);
    ag_status st = table_grow(kv, d, nb);
    if (st != AG_OK) return st;
    /* Take the new references before dropping dst's old ones, so a block
     * both hold never passes through refcount 0. */
    const int32_t rfirst = len ? ag_kv_ring_first_needed(kv, len) : 0;
    for (int32_t i = 0; i < nb; i++) kv->ref[s->blocks[i]]++;
    for (int32_t i = rfirst; s->rblocks && i < nb; i++) kv->rref[s->rblocks[i]]++;
    seq_release_from(kv, d, 0);
    if (nb) memcpy(d->blocks, s->blocks, (size_t)nb * sizeof *d->blocks);
    if (s->rblocks && nb) memcpy(d->rblocks + rfirst, s->rblocks + rfirst, (size_t)(nb - rfirst) * sizeof *d->rblocks);
    d->rlo = rfirst;
    d->n_blocks = nb;
    d->len = d->reserved = len;
    if (kv->state) {
        if (len) ag_state_copy(kv->state, dst, src);
        else ag_state_reset(kv->state, dst);
    }
    return AG_OK;
}

/* ---- block hooks -------------------------------------------------------- */

static bool block_allocated(const ag_kv *kv, int32_t block) {
    return block >= 0 && block < kv->n_blocks && kv->ref[block] > 0;
}

ag_status ag_kv_block_ref(ag_kv *kv, int32_t block) {
    if (!block_allocated(kv, block))
        return ag_errorf(AG_ERR_INVALID, "kv: block_ref: block %d is not allocated", block);
    kv->ref[block]++;
    return AG_OK;
}

ag_status ag_kv_block_unref(ag_kv *kv, int32_t block) {
    if (!block_allocated(kv, block))
        return ag_errorf(AG_ERR_INVALID, "kv: block_unref: block %d is not allocated", block);
    block_drop(kv, block);
    return AG_OK;
}

int32_t ag_kv_block_refcount(const ag_kv *kv, int32_t block) {
    if (block < 0 || block >= kv->n_blocks) return -1;
    return kv->ref[block];
}

ag_status ag_kv_block_alloc(ag_kv *kv, int32_t *block) {
    if (kv->n_free == 0) return full_error(kv, 1);
    *block = block_take(kv);
    return AG_OK;
}

static bool rblock_allocated(const ag_kv *kv, int32_t block) {
    return block >= 0 && block < kv->r_n_blocks && kv->rref[block] > 0;
}

ag_status ag_kv_ring_block_ref(ag_kv *kv, int32_t block) {
    if (!rblock_allocated(kv, block))
        return ag_errorf(AG_ERR_INVALID, "kv: ring_block_ref: ring block %d is not allocated", block);
    kv->rref[block]++;
    return AG_OK;
}

ag_status ag_kv_ring_block_unref(ag_kv *kv, int32_t block) {
    if (!rblock_allocated(kv, block))
        return ag_errorf(AG_ERR_INVALID, "kv: ring_block_unref: ring block %d is not allocated", block);
    rblock_drop(kv, block);
    return AG_OK;
}

int32_t ag_kv_ring_block_refcount(const ag_kv *kv, int32_t block) {
    if (block < 0 || block >= kv->r_n_blocks) return -1;
    return kv->rref[block];
}

ag_status ag_kv_ring_block_alloc(ag_kv *kv, int32_t *block) {
    if (kv->r_n_free == 0 && kv->reclaim && kv->r_n_blocks) kv->reclaim(kv->reclaim_user, 1);
    if (kv->r_n_free == 0) {
        kv->nomem_errors++;
        return ag_errorf(AG_ERR_NOMEM, "KV ring full: need 1 ring block, 0 free");
    }
    *block = rblock_take(kv);
    return AG_OK;
}

ag_status ag_kv_seq_adopt(ag_kv *kv, int32_t seq, const int32_t *blocks, int32_t n_blocks,
                          int32_t len) {
    return ag_kv_seq_adopt_ring(kv, seq, blocks, NULL, n_blocks, len);
}

ag_status ag_kv_seq_adopt_ring(ag_kv *kv, int32_t seq, const int32_t *blocks, const int32_t *ring,
                               int32_t n_blocks, int32_t len) {
    kv_seq *s = seq_get(kv, seq);
    if (!s) return ag_errorf(AG_ERR_INVALID, "kv: adopt: sequence %d is not live", seq);
    if (kv->state && len > 0)
        return ag_errorf(AG_ERR_UNSUPPORTED, "kv: adopt: a cache with recurrent state cannot adopt blocks "
                                             "without the state they lead to");
    if (n_blocks < 0 || len < 0 || (n_blocks > 0 && !blocks) || blocks_for(kv, len) != n_blocks)
        return ag_errorf(AG_ERR_RANGE, "kv: adopt: %d blocks cannot hold exactly %d positions",
                         n_blocks, len);
    for (int32_t i = 0; i < n_blocks; i++)
        if (!block_allocated(kv, blocks[i]))
            return ag_errorf(AG_ERR_INVALID, "kv: adopt: block %d (entry %d) is not allocated",
                             blocks[i], i);
    int32_t rfirst = n_blocks;
    if (kv->r_n_blocks && n_blocks > 0) {
        const int32_t need = ag_kv_ring_first_needed(kv, len);
        for (int32_t i = n_blocks - 1; ring && i >= 0; i--) {
            if (ring[i] < 0 || ring[i] >= kv->r_n_blocks || kv->rref[ring[i]] <= 0) break;
            rfirst = i;
        }
        if (rfirst > need)
            return ag_errorf(AG_ERR_UNSUPPORTED,
                             "kv: adopt: length %d needs the ring blocks from entry %d on; they start at %d", len,
                             need, rfirst);
    }
    /* `blocks` may point into this very table: then n_blocks <= cap and the
     * grow does not move it; memmove below copies overlapping ids safely. */
    ag_status st = table_grow(kv, s, n_blocks);
    if (st != AG_OK) return st;
    for (int32_t i = 0; i < n_blocks; i++) kv->ref[blocks[i]]++;
    for (int32_t i = rfirst; kv->r_n_blocks && i < n_blocks; i++) kv->rref[ring[i]]++;
    seq_release_from(kv, s, 0);
    if (n_blocks) memmove(s->blocks, blocks, (size_t)n_blocks * sizeof *s->blocks);
    if (kv->r_n_blocks && n_blocks) {
        if (rfirst < n_blocks) memmove(s->rblocks + rfirst, ring + rfirst, (size_t)(n_blocks - rfirst) * sizeof *ring);
        s->rlo = rfirst;
    }
    s->n_blocks = n_blocks;
    s->len = s->reserved = len;
    return AG_OK;
}

size_t ag_kv_block_bytes(const ag_kv *kv) { return kv->lay.copy_bytes; }

static ag_status copy_check(const ag_kv *kv, const char *what, int32_t block, int32_t layer,
                            const void *buf, size_t size) {
    if (layer < 0 || layer >= kv->lay.n_layers)
        return ag_errorf(AG_ERR_RANGE, "kv: %s: layer %d outside [0, %d)", what, layer,
                         kv->lay.n_layers);
    if (kv->is_ring[layer] ? !rblock_allocated(kv, block) : !block_allocated(kv, block))
        return ag_errorf(AG_ERR_INVALID, "kv: %s: %sblock %d is not allocated", what,
                         kv->is_ring[layer] ? "ring " : "", block);
    if (!buf || size != kv->lay.copy_bytes)
        return ag_errorf(AG_ERR_INVALID, "kv: %s: buffer of %zu bytes, need %zu", what, size,
                         kv->lay.copy_bytes);
    return AG_OK;
}

ag_status ag_kv_block_copy_out(const ag_kv *kv, int32_t block, int32_t layer, void *dst,
                               size_t size) {
    ag_status st = copy_check(kv, "copy_out", block, layer, dst, size);
    if (st != AG_OK) return st;
    const uint8_t *base = layer_base(kv, layer, block);
    size_t         kb = (size_t)kv->lay.n_kv_heads * kv->lay.head_stride_k;
    if (pool_to_host(kv, dst, base, kb) || pool_to_host(kv, (uint8_t *)dst + kb, base + kv->v_offset, size - kb))
        return ag_errorf(AG_ERR_IO, "kv: copy_out: device copy failed");
    return AG_OK;
}

ag_status ag_kv_block_copy_in(ag_kv *kv, int32_t block, int32_t layer, const void *src,
                              size_t size) {
    ag_status st = copy_check(kv, "copy_in", block, layer, src, size);
    if (st != AG_OK) return st;
    const int32_t rc = kv->is_ring[layer] ? kv->rref[block] : kv->ref[block];
    if (rc != 1)
        return ag_errorf(AG_ERR_INVALID, "kv: copy_in: block %d is shared (refcount %d)", block, rc);
    uint8_t *base = layer_base(kv, layer, block);
    size_t   kb = (size_t)kv->lay.n_kv_heads * kv->lay.head_stride_k;
    if (pool_from_host(kv, base, src, kb) || pool_from_host(kv, base + kv->v_offset, (const uint8_t *)src + kb, size - kb))
        return ag_errorf(AG_ERR_IO, "kv: copy_in: device copy failed");
    return AG_OK;
}

/* ---- swap (preemption) --------------------------------------------------- */

/* (a recurrent state travels after the blocks and ring blocks) */
static size_t state_swap_bytes(const ag_kv *kv) {
    return kv->state ? ag_state_seq_floats(kv->state) * sizeof(float) : 0;
}

/* Ring blocks a swapped sequence of len positions keeps: from the first
 * its window needs to its last. */
static int32_t swap_ring_blocks(const ag_kv *kv, int32_t len) {
    if (!kv->r_n_blocks || len <= 0) return 0;
    return blocks_for(kv, len) - ag_kv_ring_first_needed(kv, len);
}

size_t ag_kv_swap_bytes(const ag_kv *kv, int32_t len) {
    return (size_t)blocks_for(kv, len < 0 ? 0 : len) * kv->lay.block_bytes +
           (size_t)swap_ring_blocks(kv, len) * kv->lay.ring_block_bytes + state_swap_bytes(kv);
}

ag_status ag_kv_seq_swap_out(const ag_kv *kv, int32_t seq, void *dst, size_t size, int32_t *len) {
    kv_seq *s = seq_get(kv, seq);
    if (!s) return ag_errorf(AG_ERR_INVALID, "kv: swap_out: sequence %d is not live", seq);
    const int32_t nb = blocks_for(kv, s->len);
    if (size != ag_kv_swap_bytes(kv, s->len) || (size && !dst))
        return ag_errorf(AG_ERR_INVALID, "kv: swap_out: buffer of %zu bytes, need %zu", size,
                         ag_kv_swap_bytes(kv, s->len));
    ag_status sst;
    if (kv->state && (sst = ag_state_to_host(kv->state, seq, (uint8_t *)dst + size - state_swap_bytes(kv)))) return sst;
    for (int32_t i = 0; i < nb; i++)
        if (pool_to_host(kv, (uint8_t *)dst + (size_t)i * kv->lay.block_bytes, block_base(kv, s->blocks[i]),
                         kv->lay.block_bytes))
            return ag_errorf(AG_ERR_IO, "kv: swap_out: device copy failed");
    const int32_t rf = ag_kv_ring_first_needed(kv, s->len), rn = swap_ring_blocks(kv, s->len);
    uint8_t      *rdst = (uint8_t *)dst + (size_t)nb * kv->lay.block_bytes;
    for (int32_t i = 0; i < rn; i++)
        if (s->rblocks[rf + i] < 0 ||
            pool_to_host(kv, rdst + (size_t)i * kv->lay.ring_block_bytes,
                         kv->rpool + (size_t)s->rblocks[rf + i] * kv->lay.ring_block_bytes, kv->lay.ring_block_bytes))
            return ag_errorf(AG_ERR_IO, "kv: swap_out: ring copy failed");
    *len = s->len;
    return AG_OK;
}

ag_status ag_kv_seq_swap_in(ag_kv *kv, int32_t seq, int32_t len, const void *src, size_t size) {
    kv_seq *s = seq_get(kv, seq);
    if (!s) return ag_errorf(AG_ERR_INVALID, "kv: swap_in: sequence %d is not live", seq);
    if (len < 0) return ag_errorf(AG_ERR_RANGE, "kv: swap_in: length %d < 0", len);
    const int32_t nb = blocks_for(kv, len);
    if (size != ag_kv_swap_bytes(kv, len) || (size && !src))
        return ag_errorf(AG_ERR_INVALID, "kv: swap_in: buffer of %zu bytes, need %zu", size,
                         ag_kv_swap_bytes(kv, len));
    if (kv->state) {
        ag_state_reset(kv->state, seq);
        ag_status sst = ag_state_from_host(kv->state, seq, (const uint8_t *)src + size - state_swap_bytes(kv));
        if (sst) return sst;
        ag_state_advance(kv->state, seq, len, 1, 0);
    }
    seq_release_from(kv, s, 0);
    s->len = s->reserved = 0;
    if (nb > kv->n_free) return full_error(kv, nb);
    const int32_t rf = ag_kv_ring_first_needed(kv, len), rn = swap_ring_blocks(kv, len);
    if (rn > kv->r_n_free && kv->reclaim) kv->reclaim(kv->reclaim_user, rn - kv->r_n_free);
    if (rn > kv->r_n_free) {
        kv->nomem_errors++;
        return ag_errorf(AG_ERR_NOMEM, "KV ring full: need %d ring blocks, %d free", rn, kv->r_n_free);
    }
    ag_status st = table_grow(kv, s, nb);
    if (st != AG_OK) return st;
    for (int32_t i = 0; i < nb; i++) {
        s->blocks[i] = block_take(kv);
        s->n_blocks = i + 1;
        if (pool_from_host(kv, block_base(kv, s->blocks[i]), (const uint8_t *)src + (size_t)i * kv->lay.block_bytes,
                           kv->lay.block_bytes)) {
            seq_release_from(kv, s, 0);
            return ag_errorf(AG_ERR_IO, "kv: swap_in: device copy failed");
        }
    }
    const uint8_t *rsrc = (const uint8_t *)src + (size_t)nb * kv->lay.block_bytes;
    s->rlo = rf;
    for (int32_t i = 0; i < rn; i++) {
        int32_t b = rblock_take(kv);
        s->rblocks[rf + i] = b;
        if (pool_from_host(kv, kv->rpool + (size_t)b * kv->lay.ring_block_bytes,
                           rsrc + (size_t)i * kv->lay.ring_block_bytes, kv->lay.ring_block_bytes)) {
            seq_release_from(kv, s, 0);
            return ag_errorf(AG_ERR_IO, "kv: swap_in: device copy failed");
        }
    }
    if (!rn) s->rlo = 0;
    s->len = s->reserved = len;
    return AG_OK;
}

/* ---- data access -------------------------------------------------------- */

bool ag_kv_host_visible(const ag_kv *kv) { return kv->mem == NULL; }

/* A leading tag says which allocator a host buffer came from, so freeing
 * needs no bookkeeping (pinned allocation may fail, or be switched off,
 * for some buffers and not others). */
#define HOST_HDR 64
enum { HOST_PINNED = 0x50494e44, HOST_MALLOC = 0x4d414c4c }; /* "PIND", "MALL" */

void *ag_kv_mem_host_alloc(const ag_kv_mem *mem, size_t bytes) {
    if (bytes > SIZE_MAX - HOST_HDR) return NULL;
    uint8_t *p = mem && mem->host_alloc ? mem->host_alloc(mem->ctx, HOST_HDR + bytes) : NULL;
    uint32_t tag = HOST_PINNED;
    if (!p) p = malloc(HOST_HDR + bytes), tag = HOST_MALLOC;
    if (!p) return NULL;
    memcpy(p, &tag, sizeof tag);
    return p + HOST_HDR;
}

void ag_kv_mem_host_free(const ag_kv_mem *mem, void *p) {
    if (!p) return;
    uint8_t *b = (uint8_t *)p - HOST_HDR;
    uint32_t tag;
    memcpy(&tag, b, sizeof tag);
    if (tag == HOST_PINNED) mem->host_free(mem->ctx, b);
    else free(b);
}

void *ag_kv_host_alloc(ag_kv *kv, size_t bytes) { return ag_kv_mem_host_alloc(kv->mem, bytes); }
void  ag_kv_host_free(ag_kv *kv, void *p) { ag_kv_mem_host_free(kv->mem, p); }

void *ag_kv_block_k(ag_kv *kv, int32_t layer, int32_t block) {
    if (layer < 0 || layer >= kv->lay.n_layers || block < 0 ||
        block >= (kv->is_ring[layer] ? kv->r_n_blocks : kv->n_blocks))
        return NULL;
    return layer_base(kv, layer, block);
}

void *ag_kv_block_v(ag_kv *kv, int32_t layer, int32_t block) {
    uint8_t *k = ag_kv_block_k(kv, layer, block);
    return k ? k + kv->v_offset : NULL;
}

ag_status ag_kv_write(ag_kv *kv, int32_t layer, int32_t seq, int32_t pos, const float *k,
                      const float *v) {
    if (layer < 0 || layer >= kv->lay.n_layers)
        return ag_errorf(AG_ERR_RANGE, "kv: write: layer %d outside [0, %d)", layer,
                         kv->lay.n_layers);
    int32_t   b, off;
    ag_status st = ag_kv_layer_slot(kv, seq, layer, pos, &b, &off);
    if (st != AG_OK) return st;
    const ag_kv_layout *L = &kv->lay;
    uint8_t            *kb = ag_kv_block_k(kv, layer, b), *vb = ag_kv_block_v(kv, layer, b);
    /* rows are converted on the host, then moved (a plain store for a host pool) */
    uint8_t *row = malloc(L->row_bytes_k > L->row_bytes_v ? L->row_bytes_k : L->row_bytes_v);
    if (!row) return ag_errorf(AG_ERR_NOMEM, "kv: write: out of memory");
    int bad = 0;
    for (int32_t h = 0; h < L->n_kv_heads && !bad; h++) {
        if (k) {
            store_row(L->dtype, row, k + (size_t)h * L->head_dim_k, L->head_dim_k);
            bad |= pool_from_host(kv, kb + h * L->head_stride_k + (size_t)off * L->row_bytes_k, row, L->row_bytes_k);
        }
        if (v) {
            store_row(L->dtype, row, v + (size_t)h * L->head_dim_v, L->head_dim_v);
            bad |= pool_from_host(kv, vb + h * L->head_stride_v + (size_t)off * L->row_bytes_v, row, L->row_bytes_v);
        }
    }
    free(row);
    return bad ? ag_errorf(AG_ERR_IO, "kv: write: device copy failed") : AG_OK;
}

ag_status ag_kv_read(const ag_kv *kv, int32_t layer, int32_t seq, int32_t pos, float *k, float *v) {
    if (layer < 0 || layer >= kv->lay.n_layers)
        return ag_errorf(AG_ERR_RANGE, "kv: read: layer %d outside [0, %d)", layer,
                         kv->lay.n_layers);
    kv_seq *s = seq_get(kv, seq);
    if (!s) return ag_errorf(AG_ERR_INVALID, "kv: read: sequence %d is not live", seq);
    if (pos < 0 || pos >= s->reserved)
        return ag_errorf(AG_ERR_RANGE, "kv: read: position %d outside [0, %d) of sequence %d", pos,
                         s->reserved, seq);
    const ag_kv_layout *L = &kv->lay;
    int32_t             b = kv->is_ring[layer] ? s->rblocks[pos >> L->block_shift] : s->blocks[pos >> L->block_shift];
    if (b < 0)
        return ag_errorf(AG_ERR_RANGE, "kv: read: position %d of sequence %d left the sliding-window ring", pos, seq);
    size_t              off = (size_t)(pos & (L->block_size - 1));
    const uint8_t      *base = layer_base(kv, layer, b);
    uint8_t            *row = malloc(L->row_bytes_k > L->row_bytes_v ? L->row_bytes_k : L->row_bytes_v);
    if (!row) return ag_errorf(AG_ERR_NOMEM, "kv: read: out of memory");
    int bad = 0;
    for (int32_t h = 0; h < L->n_kv_heads && !bad; h++) {
        if (k && !(bad |= pool_to_host(kv, row, base + h * L->head_stride_k + off * L->row_bytes_k, L->row_bytes_k)))
            load_row(L->dtype, k + (size_t)h * L->head_dim_k, row, L->head_dim_k);
        if (v && !(bad |= pool_to_host(kv, row, base + kv->v_offset + h * L->head_stride_v + off * L->row_bytes_v,
                                       L->row_bytes_v)))
            load_row(L->dtype, v + (size_t)h * L->head_dim_v, row, L->head_dim_v);
    }
    free(row);
    return bad ? ag_errorf(AG_ERR_IO, "kv: read: device copy failed") : AG_OK;
}
