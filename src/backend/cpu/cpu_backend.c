/* The CPU backend: the reference implementation of backend.h's op table,
 * multi-threaded over a thread pool. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "base/argmax.h"
#include "backend/cpu/attention.h"
#include "backend/cpu/cpu_ops.h"
#include "backend/cpu/matmul.h"
#include "backend/cpu/matmul_amx.h"
#include "backend/cpu/mamba.h"
#include "backend/cpu/moe.h"
#include "backend/cpu/quant.h"
#include "base/log.h"
#include "base/switches.h"
#include "base/threadpool.h"
#include "kv/kv.h"

typedef struct {
    ag_threadpool *pool;
    int            n_threads;
    void          *mm_scratch; /* quantized activations of one matmul */
    size_t         mm_scratch_size;
    float        **attn_scratch; /* per thread */
    size_t         attn_scratch_floats;
    int32_t       *attn_tiles; /* [attn_tiles_cap]: tile starts of the current batch */
    size_t         attn_tiles_cap;
    ag_cpu_moe    *moe; /* the moe op's buffers */
    /* AMX-ready copies of Q4_K / Q6_K weights (ag_amx_pack), made the first
     * time a weight goes through the AMX tiles; open addressing on w->data */
    struct amx_pack {
        const void *w;
        void       *packed; /* NULL: packing failed or is off; unpack per call */
    }     *packs;
    size_t n_packs, packs_cap;
} cpu_state;

static cpu_state *state_of(ag_backend *be) { return be->impl; }

static ag_status grow_mm_scratch(cpu_state *s, size_t need) {
    if (need <= s->mm_scratch_size) return AG_OK;
    free(s->mm_scratch);
    s->mm_scratch = aligned_alloc(64, (need + 63) & ~(size_t)63);
    s->mm_scratch_size = s->mm_scratch ? need : 0;
    if (!s->mm_scratch) return ag_errorf(AG_ERR_NOMEM, "out of memory for matmul scratch (%zu bytes)", need);
    return AG_OK;
}

static size_t pack_slot(const void *w, size_t cap) { return (size_t)(((uintptr_t)w >> 6) * 0x9E3779B97F4A7C15ull) & (cap - 1); }

/* The AMX-ready copy of w, made on first use; NULL where w has none (not a
 * K-quant, no AMX, AUGUR_AMX_PACK=0, out of memory): the AMX path then
 * unpacks the weight per call, with the same results. Costs ~1.3 bytes
 * per weight of memory, for a 16-token decode step ~2x faster. */
static const void *amx_packed(cpu_state *s, const ag_tensor *w) {
    size_t bytes = ag_amx_packed_size(w->type, w->ne[1], w->ne[0]);
    if (!bytes || !ag_amx_available()) return NULL;
    if (s->packs_cap)
        for (size_t i = pack_slot(w->data, s->packs_cap);; i = (i + 1) & (s->packs_cap - 1)) {
            if (s->packs[i].w == w->data) return s->packs[i].packed;
            if (!s->packs[i].w) break;
        }
    if (2 * (s->n_packs + 1) > s->packs_cap) { /* grow, rehash */
        size_t           cap = s->packs_cap ? 2 * s->packs_cap : 256;
        struct amx_pack *t = calloc(cap, sizeof *t);
        if (!t) return NULL;
        for (size_t i = 0; i < s->packs_cap; i++) {
            if (!s->packs[i].w) continue;
            size_t k = pack_slot(s->packs[i].w, cap);
            while (t[k].w) k = (k + 1) & (cap - 1);
            t[k] = s->packs[i];
        }
        free(s->packs);
        s->packs = t, s->packs_cap = cap;
    }
    void *p = ag_switch_off("AUGUR_AMX_PACK") ? NULL : aligned_alloc(64, (bytes + 63) & ~(size_t)63);
    if (p && ag_amx_pack(s->pool, w->type, w->data, w->ne[1], w->ne[0], p) != AG_OK) {
        free(p);
        p = NULL;
    }
    if (p && s->n_packs == 0) AG_LOGI("AMX: keeping tile-ready copies of the Q4_K/Q6_K weights (made on first use)");
    size_t k = pack_slot(w->data, s->packs_cap);
    while (s->packs[k].w) k = (k + 1) & (s->packs_cap - 1);
    s->packs[k] = (struct amx_pack){w->data, p};
    s->n_packs++;
    return p;
}

static ag_status cpu_matmul(ag_backend *be, const ag_tensor *w, const float *x, int n, int n_decode, float *y) {
    cpu_state *s = state_of(be);
    const int64_t n_in = w->ne[0], n_out = w->ne[1];
    if (n_decode < 0 || n_decode > n) n_decode = n;
    /* a large decode batch of K-quant weights goes to the AMX tiles with the
     * prompt rows: the same bits as the dot kernels, far less work */
    if (ag_matmul_decode_on_amx(w->type, n_decode)) n_decode = 0;
    ag_status st = AG_OK;
    if (n_decode > 0 && !(st = grow_mm_scratch(s, ag_matmul_scratch_size(w->type, n_in, n_decode))))
        st = ag_matmul(s->pool, w->type, w->data, n_out, n_in, x, n_in, n_decode, y, n_out, s->mm_scratch,
                       s->mm_scratch_size);
    const int n_prompt = n - n_decode;
    if (!st && n_prompt > 0 &&
        !(st = grow_mm_scratch(s, ag_matmul_prompt_scratch_size(s->pool, w->type, n_in, n_prompt))))
        st = ag_matmul_prompt(s->pool, w->type, w->data, ag_amx_reads_packed(w->type, n_prompt) ? amx_packed(s, w) : NULL,
                              n_out, n_in, x + (size_t)n_decode * n_in,
                              n_in, n_prompt,
                              y + (size_t)n_decode * n_out, n_out, s->mm_scratch, s->mm_scratch_size);
    if (st) return ag_errorf(st, "matmul with '%s': %s", w->name ? w->name : "?", ag_error_message());
    return AG_OK;
}

static ag_status cpu_matmul_multi(ag_backend *be, const ag_tensor *const *w, int n_w, const float *x, int n,
                                  int n_decode, float *const *y) {
    cpu_state *s = state_of(be);
    if (n_w < 1 || n_w > AG_MATMUL_MAX_PARTS) return ag_errorf(AG_ERR_INVALID, "matmul_multi: %d weights", n_w);
    const int64_t n_in = w[0]->ne[0];
    for (int i = 1; i < n_w; i++)
        if (w[i]->ne[0] != n_in) return ag_errorf(AG_ERR_INVALID, "matmul_multi: weights of different widths");
    if (n_decode < 0 || n_decode > n) n_decode = n;
    /* as in cpu_matmul; the parts share a type in practice, else all stay */
    bool all_amx = true;
    for (int i = 0; i < n_w; i++) all_amx = all_amx && ag_matmul_decode_on_amx(w[i]->type, n_decode);
    if (all_amx) n_decode = 0;
    ag_status st = AG_OK;
    if (n_decode > 0) {
        ag_matmul_part parts[AG_MATMUL_MAX_PARTS];
        for (int i = 0; i < n_w; i++)
            parts[i] = (ag_matmul_part){w[i]->type, w[i]->data, w[i]->ne[1], y[i], w[i]->ne[1]};
        if (!(st = grow_mm_scratch(s, ag_matmul_multi_scratch_size(parts, n_w, n_in, n_decode))))
            st = ag_matmul_multi(s->pool, parts, n_w, n_in, x, n_in, n_decode, s->mm_scratch, s->mm_scratch_size);
        if (st) return ag_errorf(st, "matmul with '%s': %s", w[0]->name ? w[0]->name : "?", ag_error_message());
    }
    if (n_decode == n) return AG_OK;
    /* prompt rows: one call per weight (the AMX path quantizes per call) */
    for (int i = 0; i < n_w && !st; i++) {
        const float *xp = x + (size_t)n_decode * n_in;
        float       *yp = y[i] + (size_t)n_decode * w[i]->ne[1];
        if (!(st = grow_mm_scratch(s, ag_matmul_prompt_scratch_size(s->pool, w[i]->type, n_in, n - n_decode))))
            st = ag_matmul_prompt(s->pool, w[i]->type, w[i]->data,
                                  ag_amx_reads_packed(w[i]->type, n - n_decode) ? amx_packed(s, w[i]) : NULL, w[i]->ne[1], n_in, xp, n_in,
                                  n - n_decode, yp,
                                  w[i]->ne[1], s->mm_scratch, s->mm_scratch_size);
        if (st) return ag_errorf(st, "matmul with '%s': %s", w[i]->name ? w[i]->name : "?", ag_error_message());
    }
    return AG_OK;
}

static ag_status cpu_get_rows(ag_backend *be, const ag_tensor *w, const int32_t *ids, int n, float *out) {
    for (int i = 0; i < n; i++) {
        const uint8_t *row = (const uint8_t *)w->data + (size_t)ids[i] * w->row_bytes;
        ag_status st = ag_dequant_row(w->type, row, out + (size_t)i * w->ne[0], w->ne[0]);
        if (st) return st;
    }
    return AG_OK;
}

static ag_status cpu_rmsnorm(ag_backend *be, const float *x, const float *w, int n, int dim, float eps, float *out) {
    ag_cpu_rmsnorm(x, w, n, dim, eps, out);
    return AG_OK;
}

static ag_status cpu_layernorm(ag_backend *be, const float *x, const float *w, const float *b, int n, int dim,
                               float eps, float *out) {
    ag_cpu_layernorm(x, w, b, n, dim, eps, out);
    return AG_OK;
}

static ag_status cpu_rope(ag_backend *be, float *x, int n, int n_head, int head_dim, int rope_dim, const int32_t *pos,
                     float base, float freq_scale, bool neox) {
    ag_cpu_rope(x, n, n_head, head_dim, rope_dim, pos, base, freq_scale, neox);
    return AG_OK;
}

static ag_status cpu_rope_freqs(ag_backend *be, float *x, int n, int n_head, int head_dim, int rope_dim,
                                const int32_t *pos, const float *freq, float mscale, bool neox) {
    ag_cpu_rope_freqs(x, n, n_head, head_dim, rope_dim, pos, freq, mscale, neox);
    return AG_OK;
}

static ag_status cpu_argmax(ag_backend *be, const float *x, int n, int dim, int32_t *out) {
    ag_cpu_argmax_rows(x, n, dim, out);
    return AG_OK;
}

static ag_status cpu_pick(ag_backend *be, const float *x, int n, int dim, const ag_batch_layout *lay, int row0,
                          int32_t *out) {
    if (!lay || !lay->pick || row0 < 0 || row0 + n > lay->n_out)
        return ag_errorf(AG_ERR_INVALID, "pick: rows %d..%d have no draws", row0, row0 + n);
    for (int r = 0; r < n; r++) {
        const ag_pick *d = &lay->pick[row0 + r];
        const int32_t  i = ag_pick_f32(x + (size_t)r * dim, dim, d->inv_temp, d->u);
        out[r] = i < 0 ? -2 : i;
    }
    return AG_OK;
}

/* Candidates row by row over the pool: a row is one pass over the vocab
 * (~0.1-0.5 ms at 150k tokens), worth a thread each at batch. */
typedef struct {
    const float            *x;
    int                     dim, row0;
    const ag_batch_layout  *lay;
    const int32_t          *tok;
    ag_cands               *out;
} cands_job;

static void cands_task(void *ctx, int64_t task, int thread) {
    const cands_job *j = ctx;
    ag_cands_req     req = j->lay->cands_req[j->row0 + task];
    if (req.at == AG_CANDS_AT_TOKEN) req.at = j->tok ? j->tok[task] : -1;
    ag_top_cands_f32(j->x + (size_t)task * j->dim, j->dim, &req, &j->out[task]);
}

static ag_status cpu_cands(ag_backend *be, const float *x, int n, int dim, const ag_batch_layout *lay, int row0,
                           const int32_t *tok, ag_cands *out) {
    if (!lay || !lay->cands_req || row0 < 0 || row0 + n > lay->n_out)
        return ag_errorf(AG_ERR_INVALID, "cands: rows %d..%d have no requests", row0, row0 + n);
    cands_job j = {x, dim, row0, lay, tok, out};
    cpu_state *s = state_of(be);
    if (n == 1 || s->n_threads <= 1) {
        for (int r = 0; r < n; r++) cands_task(&j, r, 0);
    } else {
        ag_threadpool_run(s->pool, n, cands_task, &j);
    }
    return AG_OK;
}

static ag_status cpu_add_bias(ag_backend *be, float *x, const float *b, int n, int dim) {
    ag_cpu_add_bias(x, b, n, dim);
    return AG_OK;
}
static ag_status cpu_add(ag_backend *be, float *y, const float *x, size_t n) {
    ag_cpu_add(y, x, n);
    return AG_OK;
}
static ag_status cpu_scale(ag_backend *be, float *x, float s, size_t n) {
    ag_cpu_scale(x, s, n);
    return AG_OK;
}
/* The gated activations over the pool: a prompt's gate is n_tok x n_ff
 * floats (4.6M for 512 tokens of Qwen2.5-1.5B), worth splitting; a decode
 * step's is not. */
typedef struct {
    void (*fn)(float *, const float *, size_t);
    float       *g;
    const float *u;
    size_t       n, per;
} act_job;

static void act_task(void *ctx, int64_t task, int thread) {
    const act_job *j = ctx;
    size_t         i0 = (size_t)task * j->per, m = j->n - i0 < j->per ? j->n - i0 : j->per;
    j->fn(j->g + i0, j->u + i0, m);
}

static void act_run(cpu_state *s, void (*fn)(float *, const float *, size_t), float *g, const float *u, size_t n) {
    const size_t per = 32 * 1024;
    if (n <= per || s->n_threads <= 1) {
        fn(g, u, n);
        return;
    }
    act_job j = {fn, g, u, n, per};
    ag_threadpool_run(s->pool, (int64_t)((n + per - 1) / per), act_task, &j);
}

static ag_status cpu_silu_mul(ag_backend *be, float *g, const float *u, size_t n) {
    act_run(state_of(be), ag_cpu_silu_mul, g, u, n);
    return AG_OK;
}
static ag_status cpu_gelu_mul(ag_backend *be, float *g, const float *u, size_t n) {
    act_run(state_of(be), ag_cpu_gelu_mul, g, u, n);
    return AG_OK;
}

static ag_status cpu_kv_store(ag_backend *be, ag_kv *kv, const ag_attn_shape *sh, const ag_batch_layout *b,
                              const float *k, const float *v) {
    return ag_cpu_kv_store(kv, sh, b, k, v);
}

typedef struct {
    cpu_state             *s;
    ag_kv                 *kv;
    const ag_attn_shape   *sh;
    const ag_batch_layout *b;
    const float           *q;
    float                 *out;
    const int32_t         *tile_start; /* [n_tiles + 1]: runs of rows of one sequence */
    int                    n_tiles;
} attn_job;

static void attn_task(void *ctx, int64_t task, int thread) {
    attn_job *j = ctx;
    int tile = (int)(task / j->sh->n_head_kv), g = (int)(task % j->sh->n_head_kv);
    ag_cpu_attention_rows(j->kv, j->sh, j->b, j->q, j->out, j->tile_start[tile], j->tile_start[tile + 1], g,
                          j->s->attn_scratch[thread]);
}

static ag_status cpu_attention(ag_backend *be, ag_kv *kv, const ag_attn_shape *sh, const ag_batch_layout *b,
                               const float *q, float *out) {
    cpu_state *s = state_of(be);
    int max_pos = 0;
    for (int i = 0; i < b->n; i++) max_pos = b->pos[i] > max_pos ? b->pos[i] : max_pos;
    size_t need = ag_cpu_attention_scratch_floats(ag_kv_get_layout(kv)->block_size, sh, max_pos);
    if (need > s->attn_scratch_floats) {
        for (int t = 0; t < s->n_threads; t++) {
            free(s->attn_scratch[t]);
            s->attn_scratch[t] = aligned_alloc(64, ((need * sizeof(float)) + 63) & ~(size_t)63);
            if (!s->attn_scratch[t]) {
                s->attn_scratch_floats = 0;
                return ag_errorf(AG_ERR_NOMEM, "out of memory for attention scratch");
            }
        }
        s->attn_scratch_floats = need;
    }
    /* tiles: consecutive rows of one sequence, at most AG_ATTN_MAX_ROWS; a
     * decode step (one row per sequence) gets one tile per row */
    if ((size_t)b->n + 1 > s->attn_tiles_cap) {
        int32_t *t = realloc(s->attn_tiles, sizeof(int32_t) * ((size_t)b->n + 1));
        if (!t) return ag_errorf(AG_ERR_NOMEM, "out of memory for attention tiles");
        s->attn_tiles = t;
        s->attn_tiles_cap = (size_t)b->n + 1;
    }
    int32_t *tile_start = s->attn_tiles;
    int n_tiles = 0;
    for (int i = 0; i < b->n; n_tiles++) {
        tile_start[n_tiles] = i;
        int k = i + 1;
        while (k < b->n && k - i < AG_ATTN_MAX_ROWS && b->seq[k] == b->seq[i]) k++;
        i = k;
    }
    tile_start[n_tiles] = b->n;
    attn_job j = {s, kv, sh, b, q, out, tile_start, n_tiles};
    ag_threadpool_run(s->pool, (int64_t)n_tiles * sh->n_head_kv, attn_task, &j);
    return AG_OK;
}

static ag_status cpu_mamba2(ag_backend *be, const ag_ssm_shape *sh, const float *zx, const ag_ssm_run *runs,
                            int n_runs, float *y) {
    return ag_cpu_mamba2(state_of(be)->pool, sh, zx, runs, n_runs, y);
}

static ag_status cpu_moe(ag_backend *be, const ag_moe_weights *w, const float *h, int n, int n_decode, float *o) {
    return ag_cpu_moe_run(be, &state_of(be)->moe, w, h, n, n_decode, o);
}

/* ---- memory: plain host memory ---- */
static void *cpu_alloc(ag_backend *be, size_t bytes) { return aligned_alloc(256, (bytes + 255) & ~(size_t)255); }
static void  cpu_free(ag_backend *be, void *p) { free(p); }
static ag_status cpu_copy(ag_backend *be, void *dst, const void *src, size_t bytes) {
    if (bytes) memmove(dst, src, bytes);
    return AG_OK;
}
static ag_status cpu_sync(ag_backend *be) { return AG_OK; }
static void      cpu_destroy(ag_backend *be);

size_t ag_backend_matmul_scratch_bytes(ag_backend *be, const ag_tensor *const *w, int n_w, int n_tokens) {
    if (!be->ops->host_memory) return 0; /* a device backend's buffers are not host memory */
    cpu_state *s = state_of(be);
    if (n_w < 1 || n_w > AG_MATMUL_MAX_PARTS || n_tokens < 1) return 0;
    const int64_t n_in = w[0]->ne[0];
    /* the sizes cpu_matmul / cpu_matmul_multi grow mm_scratch to */
    size_t decode;
    if (n_w == 1) {
        decode = ag_matmul_scratch_size(w[0]->type, n_in, n_tokens);
    } else {
        ag_matmul_part parts[AG_MATMUL_MAX_PARTS];
        for (int i = 0; i < n_w; i++) parts[i] = (ag_matmul_part){w[i]->type, w[i]->data, w[i]->ne[1], NULL, w[i]->ne[1]};
        decode = ag_matmul_multi_scratch_size(parts, n_w, n_in, n_tokens);
    }
    size_t need = decode;
    for (int i = 0; i < n_w; i++) {
        size_t prompt = ag_matmul_prompt_scratch_size(s->pool, w[i]->type, n_in, n_tokens);
        if (prompt > need) need = prompt;
    }
    return (need + 63) & ~(size_t)63;
}

size_t ag_backend_weight_copy_bytes(ag_backend *be, const ag_tensor *w) {
    if (!be->ops->host_memory) return 0;
    if (!ag_amx_available() || ag_switch_off("AUGUR_AMX_PACK")) return 0; /* amx_packed makes none */
    size_t bytes = ag_amx_packed_size(w->type, w->ne[1], w->ne[0]);
    return bytes ? (bytes + 63) & ~(size_t)63 : 0;
}

size_t ag_backend_attention_scratch_bytes(ag_backend *be, const ag_attn_shape *sh, int block_size, int n_tokens,
                                          int n_ctx) {
    if (!be->ops->host_memory) return 0;
    cpu_state *s = state_of(be);
    size_t floats = ag_cpu_attention_scratch_floats(block_size, sh, n_ctx > 0 ? n_ctx - 1 : 0);
    size_t per_thread = ((floats * sizeof(float)) + 63) & ~(size_t)63;
    return (size_t)s->n_threads * (per_thread + sizeof(float *)) + sizeof(int32_t) * ((size_t)n_tokens + 1);
}

static const ag_backend_ops cpu_ops = {
    .name = "cpu",
    .host_memory = true,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .upload = cpu_copy,
    .download = cpu_copy,
    .copy = cpu_copy,
    .prepare_weight = NULL, /* weights stay in the mapping */
    .kv_mem = NULL,         /* the KV pool is host memory */
    .sync = cpu_sync,
    .destroy = cpu_destroy,
    .matmul = cpu_matmul,
    .matmul_multi = cpu_matmul_multi,
    .get_rows = cpu_get_rows,
    .rmsnorm = cpu_rmsnorm,
    .layernorm = cpu_layernorm,
    .rope = cpu_rope,
    .rope_freqs = cpu_rope_freqs,
    .attn_sinks = true,
    .add_bias = cpu_add_bias,
    .add = cpu_add,
    .scale = cpu_scale,
    .silu_mul = cpu_silu_mul,
    .gelu_mul = cpu_gelu_mul,
    .moe = cpu_moe,
    .mamba2 = cpu_mamba2,
    .kv_store = cpu_kv_store,
    .attention = cpu_attention,
    .argmax = cpu_argmax,
    .pick = cpu_pick,
    .cands = cpu_cands,
};

ag_cpu_params ag_cpu_default_params(void) {
    ag_cpu_params p = {.n_threads = 0};
    return p;
}

ag_status ag_cpu_backend_new(const ag_cpu_params *p, ag_backend **out) {
    *out = NULL;
    ag_backend *be = calloc(1, sizeof *be);
    cpu_state *s = calloc(1, sizeof *s);
    if (!be || !s) {
        free(be);
        free(s);
        return ag_errorf(AG_ERR_NOMEM, "out of memory");
    }
    be->ops = &cpu_ops;
    be->impl = s;
    ag_cpu_attention_init();
    ag_threadpool_params tp = ag_threadpool_default_params();
    tp.n_threads = p ? p->n_threads : 0;
    ag_status st = ag_threadpool_create(&tp, &s->pool);
    if (st) {
        ag_backend_free(be);
        return st;
    }
    s->n_threads = ag_threadpool_size(s->pool);
    s->attn_scratch = calloc((size_t)s->n_threads, sizeof *s->attn_scratch);
    if (!s->attn_scratch) {
        ag_backend_free(be);
        return ag_errorf(AG_ERR_NOMEM, "out of memory");
    }
    *out = be;
    return AG_OK;
}

void ag_backend_free(ag_backend *be) {
    if (be) be->ops->destroy(be);
}

static void cpu_destroy(ag_backend *be) {
    cpu_state *s = be->impl;
    if (s) {
        ag_threadpool_free(s->pool);
        if (s->attn_scratch)
            for (int t = 0; t < s->n_threads; t++) free(s->attn_scratch[t]);
        free(s->attn_scratch);
        free(s->attn_tiles);
        free(s->mm_scratch);
        ag_cpu_moe_free(s->moe);
        for (size_t i = 0; i < s->packs_cap; i++) free(s->packs[i].packed);
        free(s->packs);
        free(s);
    }
    free(be);
}

int ag_cpu_backend_threads(const ag_backend *be) {
    return be && be->ops == &cpu_ops ? ((const cpu_state *)be->impl)->n_threads : 0;
}

/* Appends to buf[*len..n) like snprintf, never past n. */
static void report_add(char *buf, size_t n, size_t *len, const char *fmt, ...) {
    if (*len >= n) return;
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(buf + *len, n - *len, fmt, ap);
    va_end(ap);
    if (k > 0) *len = *len + (size_t)k < n ? *len + (size_t)k : n - 1;
}

void ag_cpu_kernel_report(const uint32_t *types, int n_types, char *buf, size_t n) {
    if (!buf || n == 0) return;
    buf[0] = 0;
    size_t      len = 0;
    const char *isa = ag_cpu_isa_name(ag_cpu_isa_active());
    report_add(buf, n, &len, "isa %s (best %s); decode: %s dot", isa, ag_cpu_isa_name(ag_cpu_isa_best()), isa);
    for (int i = 0; i < n_types; i++) {
        const int amx_min = ag_matmul_amx_decode_min(types[i]), pmin = ag_matmul_decode_panel_min(types[i]);
        const bool amx = ag_matmul_decode_on_amx(types[i], amx_min);
        if (pmin && (!amx || pmin < amx_min))
            report_add(buf, n, &len, ", %s from %d rows (%s)", ag_matmul_decode_panel_name(types[i]), pmin,
                       ag_tensor_type_name(types[i]));
        if (amx) report_add(buf, n, &len, ", amx from %d rows (%s)", amx_min, ag_tensor_type_name(types[i]));
    }
    /* the prompt kernels, one group per kind, types in the order given */
    static const char *kinds[] = {"amx", "panel", "tile", "dot"};
    report_add(buf, n, &len, "; prompt:");
    bool first = true;
    for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++) {
        bool any = false;
        for (int i = 0; i < n_types; i++) {
            if (strcmp(ag_matmul_prompt_kernel(types[i]), kinds[k])) continue;
            /* the panel kernels exist as AVX2 code only (the AVX-512 level keeps them for the K-quants) */
            const char *kisa = k == 1 ? "avx2" : isa;
            if (!any) report_add(buf, n, &len, "%s %s%s%s (", first ? "" : ",", k ? kisa : "", k ? " " : "", kinds[k]);
            report_add(buf, n, &len, "%s%s", any ? " " : "", ag_tensor_type_name(types[i]));
            any = true, first = false;
        }
        if (any) report_add(buf, n, &len, ")");
    }
    report_add(buf, n, &len, "; amx: %s", ag_amx_available() ? "yes" : "no");
}
