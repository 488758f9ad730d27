/* Tensor parallelism over in-process shards (tp.h). */
#include "model/tp.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kv/kv.h"

/* One rank's slice of one layer: views and copies of the model's tensors.
 * The norms (replicated) are read from the model's layer. */
typedef struct {
    ag_tensor    wq, wk, wv, wo, gate, up, down;
    const float *bq, *bk, *bv; /* the rank's part of the biases, or NULL */
} shard_layer;

/* A rank's chosen token of a row: its id in the whole vocabulary and its
 * logit; id < 0: none finite. */
typedef struct {
    int32_t id;
    float   v;
} tp_chosen;

typedef struct {
    ag_backend  *be;
    ag_tp_heads  heads;
    int64_t      ff0, nff, v0, nv;
    ag_tensor    embd, head; /* vocabulary rows [v0, v0 + nv) */
    shard_layer *layers;     /* [n_layer] */
    char        *copies;     /* the row-parallel cuts, one host allocation */
    size_t       copies_bytes;
    void        *act;        /* activations, in be's memory */
    size_t       act_bytes;
    int          act_rows, out_rows; /* the rows act holds, and the head's output rows */
    float       *x, *h, *q, *k, *v, *att, *o, *gate, *up, *logits;
    int32_t     *ids;        /* [act_rows] host: the batch's tokens this rank embeds, then its argmax ids */
    int32_t     *at;         /* [act_rows] host: their rows */
    tp_chosen   *pairs;      /* [act_rows] host: ag_tp_argmax's choices */
} shard;

struct ag_tp {
    int                     n;
    ag_model_config         c;
    const ag_layer_weights *full; /* the model's layers: the replicated norms */
    ag_comm                *comm;
    int                     kv_heads; /* the pool's heads per layer: the most of any rank */
    int                     n_out;    /* the last head's rows */
    shard                   s[AG_COMM_MAX_RANKS];
    char                   *stage; /* host: gathers land here */
    size_t                  stage_cap;
};

/* ---- plans ---- */

ag_status ag_tp_plan_range(int64_t len, int64_t unit, int n, int64_t *start) {
    if (n < 1 || unit < 1 || len % unit || len / unit < n)
        return ag_errorf(AG_ERR_UNSUPPORTED, "%lld cannot be cut into %d runs of whole %lld-element units",
                         (long long)len, n, (long long)unit);
    const int64_t units = len / unit;
    for (int r = 0; r <= n; r++) start[r] = units * r / n * unit;
    return AG_OK;
}

ag_status ag_tp_plan_heads(int n_head, int n_head_kv, int n, ag_tp_heads *out) {
    if (n < 1 || n > n_head || n_head_kv < 1 || n_head % n_head_kv)
        return ag_errorf(AG_ERR_UNSUPPORTED, "%d query heads (%d KV heads) cannot be split among %d ranks", n_head,
                         n_head_kv, n);
    const int g = n_head / n_head_kv;
    if (n <= n_head_kv) {
        for (int r = 0; r < n; r++) {
            const int kv0 = r * n_head_kv / n, kv1 = (r + 1) * n_head_kv / n;
            out[r] = (ag_tp_heads){.q0 = kv0 * g, .nq = (kv1 - kv0) * g, .kv0 = kv0, .nkv = kv1 - kv0};
        }
        return AG_OK;
    }
    /* more ranks than KV heads: KV head j (its g query heads) goes to ranks
     * [j n / n_head_kv, (j + 1) n / n_head_kv), at least one, at most g */
    for (int j = 0; j < n_head_kv; j++) {
        const int r0 = j * n / n_head_kv, r1 = (j + 1) * n / n_head_kv, cnt = r1 - r0;
        for (int i = 0; i < cnt; i++) {
            const int a = i * g / cnt, b = (i + 1) * g / cnt;
            out[r0 + i] = (ag_tp_heads){.q0 = j * g + a, .nq = b - a, .kv0 = j, .nkv = 1};
        }
    }
    return AG_OK;
}

/* ---- building the shards ---- */

/* Rows [r0, r0 + nr) of t: the same bytes. */
static ag_tensor rows_of(const ag_tensor *t, int64_t r0, int64_t nr) {
    ag_tensor v = *t;
    v.ne[1] = nr;
    v.data = (const char *)t->data + (size_t)r0 * t->row_bytes;
    v.host = (const char *)t->host + (size_t)r0 * t->row_bytes;
    return v;
}

/* Bytes of columns [k0, k0 + nk) of each row of t (a row-parallel cut),
 * after checking the cut falls on block boundaries. */
static ag_status cut_bytes(const ag_tensor *t, int n, int64_t k0, int64_t nk, size_t *row_bytes) {
    uint32_t be, bb;
    if (!ag_tensor_type_layout(t->type, &be, &bb))
        return ag_errorf(AG_ERR_UNSUPPORTED, "--tp %d: tensor '%s' has type %s, which cannot be cut", n, t->name,
                         ag_tensor_type_name(t->type));
    if (k0 % be || nk % be)
        return ag_errorf(AG_ERR_UNSUPPORTED,
                         "--tp %d: '%s' (%s, blocks of %u) would be cut at columns %lld..%lld, inside a block; "
                         "choose a --tp that divides it at block boundaries",
                         n, t->name, ag_tensor_type_name(t->type), be, (long long)k0, (long long)(k0 + nk));
    *row_bytes = (size_t)(nk / be) * bb;
    return AG_OK;
}

/* Columns [k0, k0 + nk) of t, copied row by row to *cursor (advanced). */
static ag_tensor cut_cols(const ag_tensor *t, int64_t k0, int64_t nk, size_t rb, char **cursor) {
    uint32_t be, bb;
    ag_tensor_type_layout(t->type, &be, &bb);
    ag_tensor c = *t;
    c.ne[0] = nk;
    c.row_bytes = rb;
    char *dst = *cursor;
    for (int64_t r = 0; r < t->ne[1]; r++)
        memcpy(dst + (size_t)r * rb, (const char *)t->host + (size_t)r * t->row_bytes + (size_t)(k0 / be) * bb, rb);
    c.data = c.host = dst;
    *cursor += ((size_t)t->ne[1] * rb + 63) & ~(size_t)63;
    return c;
}

static ag_status build_shard(ag_tp *tp, int r, const ag_layer_weights *layers) {
    const ag_model_config *c = &tp->c;
    shard                 *s = &tp->s[r];
    const ag_tp_heads      H = s->heads;
    const int64_t          hk = c->head_dim_k, hv = c->head_dim_v;
    ag_status              st;
    if (!(s->layers = calloc((size_t)c->n_layer, sizeof *s->layers))) return ag_errorf(AG_ERR_NOMEM, "out of memory");
    /* the row-parallel cuts' sizes first (and their alignment), then one allocation */
    size_t total = 0;
    for (int l = 0; l < c->n_layer; l++) {
        size_t rb_o, rb_d;
        if ((st = cut_bytes(&layers[l].wo, tp->n, H.q0 * hv, H.nq * hv, &rb_o))) return st;
        if ((st = cut_bytes(&layers[l].ffn_down, tp->n, s->ff0, s->nff, &rb_d))) return st;
        total += ((size_t)layers[l].wo.ne[1] * rb_o + 63) & ~(size_t)63;
        total += ((size_t)layers[l].ffn_down.ne[1] * rb_d + 63) & ~(size_t)63;
    }
    if (!(s->copies = aligned_alloc(64, total ? total : 64)))
        return ag_errorf(AG_ERR_NOMEM, "--tp %d: out of memory for rank %d's weights (%zu bytes)", tp->n, r, total);
    s->copies_bytes = total;
    char *cur = s->copies;
    for (int l = 0; l < c->n_layer; l++) {
        const ag_layer_weights *w = &layers[l];
        shard_layer            *L = &s->layers[l];
        size_t                  rb_o, rb_d;
        cut_bytes(&w->wo, tp->n, H.q0 * hv, H.nq * hv, &rb_o);
        cut_bytes(&w->ffn_down, tp->n, s->ff0, s->nff, &rb_d);
        L->wq = rows_of(&w->wq, H.q0 * hk, H.nq * hk);
        L->wk = rows_of(&w->wk, H.kv0 * hk, H.nkv * hk);
        L->wv = rows_of(&w->wv, H.kv0 * hv, H.nkv * hv);
        L->bq = w->bq.data ? (const float *)w->bq.data + H.q0 * hk : NULL;
        L->bk = w->bk.data ? (const float *)w->bk.data + H.kv0 * hk : NULL;
        L->bv = w->bv.data ? (const float *)w->bv.data + H.kv0 * hv : NULL;
        L->wo = cut_cols(&w->wo, H.q0 * hv, H.nq * hv, rb_o, &cur);
        L->gate = rows_of(&w->ffn_gate, s->ff0, s->nff);
        L->up = rows_of(&w->ffn_up, s->ff0, s->nff);
        L->down = cut_cols(&w->ffn_down, s->ff0, s->nff, rb_d, &cur);
        /* a device rank takes its own copies (views of the file for the
         * column-parallel ones); the CPU reads them where they are */
        ag_tensor *mine[] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->gate, &L->up, &L->down};
        for (size_t i = 0; s->be->ops->prepare_weight && i < sizeof mine / sizeof mine[0]; i++)
            if ((st = s->be->ops->prepare_weight(s->be, mine[i]))) return st;
    }
    return AG_OK;
}

ag_status ag_tp_new(int n, const ag_model_config *c, const ag_layer_weights *layers, const ag_tensor *tok_embd,
                    const ag_tensor *output, ag_backend *be, ag_tp **out) {
    *out = NULL;
    if (n < 2 || n > AG_COMM_MAX_RANKS)
        return ag_errorf(AG_ERR_UNSUPPORTED, "--tp %d: 1 to %d shards are supported", n, AG_COMM_MAX_RANKS);
    if (c->encoder || c->n_expert > 0 ||
        !(c->arch == AG_ARCH_LLAMA || c->arch == AG_ARCH_QWEN2 || c->arch == AG_ARCH_QWEN3 || c->arch == AG_ARCH_GEMMA3))
        return ag_errorf(AG_ERR_UNSUPPORTED, "--tp %d: architecture '%s' is not split yet (llama, qwen2, qwen3 and gemma3 are)",
                         n, c->arch_name);
    if (!be->ops->host_memory)
        return ag_errorf(AG_ERR_UNSUPPORTED,
                         "--tp %d runs its shards on the CPU only for now (--device cpu); the GPU version (NCCL) is not built yet",
                         n);
    ag_tp *tp = calloc(1, sizeof *tp);
    if (!tp) return ag_errorf(AG_ERR_NOMEM, "out of memory");
    tp->n = n;
    tp->c = *c;
    tp->full = layers;
    ag_tp_heads heads[AG_COMM_MAX_RANKS];
    int64_t     ff[AG_COMM_MAX_RANKS + 1], voc[AG_COMM_MAX_RANKS + 1];
    /* the feed-forward is cut in whole blocks of every layer's ffn_down
     * (mixed-type files: the largest block, a multiple of the others) */
    uint32_t down_be = 1;
    for (int l = 0; l < c->n_layer; l++) {
        uint32_t be_l = 1, bb;
        ag_tensor_type_layout(layers[l].ffn_down.type, &be_l, &bb);
        if (be_l > down_be) down_be = be_l;
    }
    ag_status st = ag_tp_plan_heads(c->n_head, c->n_head_kv, n, heads);
    if (st) {
        st = ag_errorf(st, "--tp %d: the model has %d attention heads; at most that many shards", n, c->n_head);
        goto fail;
    }
    if ((st = ag_tp_plan_range(c->n_ff, down_be, n, ff))) {
        st = ag_errorf(st, "--tp %d: the feed-forward's %d columns (blocks of %u) cannot be split %d ways", n, c->n_ff,
                       down_be, n);
        goto fail;
    }
    if ((st = ag_tp_plan_range(c->n_vocab, 1, n, voc))) goto fail;
    if ((st = ag_comm_cpu_new(n, &tp->comm))) goto fail;
    for (int r = 0; r < n; r++) {
        shard *s = &tp->s[r];
        s->be = be; /* one CPU backend drives every rank in turn; a GPU rank would have its own */
        s->heads = heads[r];
        s->ff0 = ff[r], s->nff = ff[r + 1] - ff[r];
        s->v0 = voc[r], s->nv = voc[r + 1] - voc[r];
        s->embd = rows_of(tok_embd, s->v0, s->nv);
        s->head = rows_of(output, s->v0, s->nv);
        if (heads[r].nkv > tp->kv_heads) tp->kv_heads = heads[r].nkv;
        if ((st = build_shard(tp, r, layers))) goto fail;
    }
    *out = tp;
    return AG_OK;
fail:
    ag_tp_free(tp);
    return st;
}

void ag_tp_free(ag_tp *tp) {
    if (!tp) return;
    for (int r = 0; r < tp->n; r++) {
        shard *s = &tp->s[r];
        if (s->act) s->be->ops->free(s->be, s->act);
        free(s->layers);
        free(s->copies);
        free(s->ids);
        free(s->at);
        free(s->pairs);
    }
    ag_comm_free(tp->comm);
    free(tp->stage);
    free(tp);
}

int ag_tp_ranks(const ag_tp *tp) { return tp ? tp->n : 1; }

void ag_tp_rank_plan(const ag_tp *tp, int r, ag_tp_heads *heads, int64_t *ff0, int64_t *nff, int64_t *v0,
                     int64_t *nv) {
    const shard *s = &tp->s[r];
    *heads = s->heads;
    *ff0 = s->ff0, *nff = s->nff, *v0 = s->v0, *nv = s->nv;
}

void ag_tp_kv_shape(const ag_tp *tp, int *n_layer, int *n_head_kv) {
    *n_layer = tp->c.n_layer * tp->n;
    *n_head_kv = tp->kv_heads;
}

/* ---- activations ---- */

static size_t carve(size_t *off, size_t floats) {
    size_t at = *off;
    *off += (floats * sizeof(float) + 255) & ~(size_t)255;
    return at;
}

/* Rank s's activation layout for n rows, n_out of them through the head:
 * offsets of x, h, q, k, v, att, o, gate, up, logits; the total bytes. */
static size_t shard_layout(const ag_tp *tp, const shard *s, size_t n, size_t n_out, size_t at[10]) {
    const ag_model_config *c = &tp->c;
    const size_t           floats[10] = {n * c->n_embd,
                                         n * c->n_embd,
                                         n * (size_t)s->heads.nq * c->head_dim_k,
                                         n * (size_t)s->heads.nkv * c->head_dim_k,
                                         n * (size_t)s->heads.nkv * c->head_dim_v,
                                         n * (size_t)s->heads.nq * c->head_dim_v,
                                         n * c->n_embd,
                                         n * (size_t)s->nff,
                                         n * (size_t)s->nff,
                                         n_out * (size_t)s->nv};
    size_t off = 0;
    for (int i = 0; i < 10; i++) {
        size_t o = carve(&off, floats[i]);
        if (at) at[i] = o;
    }
    return off;
}

/* Room for n rows, n_out of them through the head (grown, never shrunk;
 * what the buffers held is lost when they grow). */
static ag_status grow(ag_tp *tp, int n, int n_out) {
    for (int r = 0; r < tp->n; r++) {
        shard *s = &tp->s[r];
        if (n <= s->act_rows && n_out <= s->out_rows) continue;
        if (n < s->act_rows) n = s->act_rows;
        if (n_out < s->out_rows) n_out = s->out_rows;
        size_t at[10], need = shard_layout(tp, s, (size_t)n, (size_t)n_out, at);
        if (s->act) s->be->ops->free(s->be, s->act);
        free(s->ids);
        free(s->at);
        free(s->pairs);
        s->act_rows = s->out_rows = 0;
        s->ids = malloc(sizeof(int32_t) * (size_t)n);
        s->at = malloc(sizeof(int32_t) * (size_t)n);
        s->pairs = malloc(sizeof(tp_chosen) * (size_t)n);
        if (!(s->act = s->be->ops->alloc(s->be, need)) || !s->ids || !s->at || !s->pairs)
            return ag_errorf(AG_ERR_NOMEM, "--tp %d: out of memory for rank %d's activations of %d tokens", tp->n, r, n);
        s->act_bytes = need;
        s->act_rows = n;
        s->out_rows = n_out;
        float **dst[10] = {&s->x, &s->h, &s->q, &s->k, &s->v, &s->att, &s->o, &s->gate, &s->up, &s->logits};
        for (int i = 0; i < 10; i++) *dst[i] = (float *)((char *)s->act + at[i]);
    }
    return AG_OK;
}

static ag_status all_reduce(ag_tp *tp, int which, size_t n) {
    float *buf[AG_COMM_MAX_RANKS];
    for (int r = 0; r < tp->n; r++) buf[r] = which == 0 ? tp->s[r].x : tp->s[r].o;
    return tp->comm->ops->all_reduce_sum(tp->comm, buf, n);
}

static ag_status stage_for(ag_tp *tp, size_t bytes) {
    if (bytes <= tp->stage_cap) return AG_OK;
    char *p = realloc(tp->stage, bytes);
    if (!p) return ag_errorf(AG_ERR_NOMEM, "out of memory (%zu bytes)", bytes);
    tp->stage = p, tp->stage_cap = bytes;
    return AG_OK;
}

/* ---- the pass ---- */

/* The vocabulary-parallel embedding: rank r writes the rows of the tokens
 * in its run and zeros elsewhere; the all-reduce then leaves every token's
 * row (plus zeros: the same value) in every rank. Host memory. */
static ag_status embed(ag_tp *tp, const ag_batch *b) {
    const ag_model_config *c = &tp->c;
    const size_t           row = (size_t)c->n_embd;
    ag_status              st;
    for (int r = 0; r < tp->n; r++) {
        shard *s = &tp->s[r];
        int    m = 0;
        for (int i = 0; i < b->n; i++)
            if (b->token[i] >= s->v0 && b->token[i] < s->v0 + s->nv) s->ids[m] = b->token[i] - (int32_t)s->v0, s->at[m++] = i;
        memset(s->x, 0, sizeof(float) * row * (size_t)b->n);
        if (m && (st = s->be->ops->get_rows(s->be, &s->embd, s->ids, m, s->h))) return st;
        for (int j = m - 1; j >= 0; j--) memcpy(s->x + (size_t)s->at[j] * row, s->h + (size_t)j * row, sizeof(float) * row);
    }
    if ((st = all_reduce(tp, 0, row * (size_t)b->n))) return st;
    for (int r = 0; c->embd_scale != 1.0f && r < tp->n; r++)
        if ((st = tp->s[r].be->ops->scale(tp->s[r].be, tp->s[r].x, c->embd_scale, row * (size_t)b->n))) return st;
    return AG_OK;
}

ag_status ag_tp_layers(ag_tp *tp, ag_kv *kv, const ag_batch *b, const ag_batch_layout *lay, int n_dec, float *x) {
    const ag_model_config *c = &tp->c;
    const int              n = b->n, N = tp->n;
    const size_t           xe = (size_t)n * c->n_embd;
    ag_status              st;
#define TRY(call)                     \
    do {                              \
        if ((st = (call))) return st; \
    } while (0)
    TRY(grow(tp, n, 0));
    TRY(embed(tp, b));
    for (int l = 0; l < c->n_layer; l++) {
        const ag_layer_weights *w = &tp->full[l];
        const bool              swa = c->layer_swa[l];
        const float             base = swa ? c->rope_base_swa : c->rope_base, fscale = swa ? 1.0f : c->rope_freq_scale;
        /* attention: each rank's heads, its partial attention output */
        for (int r = 0; r < N; r++) {
            shard                *s = &tp->s[r];
            const shard_layer    *L = &s->layers[l];
            ag_backend           *be = s->be;
            const ag_backend_ops *op = be->ops;
            const int             nq = s->heads.nq, nkv = s->heads.nkv;
            if (l == 0) TRY(op->rmsnorm(be, s->x, w->attn_norm.data, n, c->n_embd, c->rms_eps, s->h));
            const ag_tensor *qkv_w[3] = {&L->wq, &L->wk, &L->wv};
            float *const     qkv[3] = {s->q, s->k, s->v};
            TRY(op->matmul_multi(be, qkv_w, 3, s->h, n, n_dec, qkv));
            if (L->bq) TRY(op->add_bias(be, s->q, L->bq, n, nq * c->head_dim_k));
            if (L->bk) TRY(op->add_bias(be, s->k, L->bk, n, nkv * c->head_dim_k));
            if (L->bv) TRY(op->add_bias(be, s->v, L->bv, n, nkv * c->head_dim_v));
            if (w->q_norm.data) TRY(op->rmsnorm(be, s->q, w->q_norm.data, n * nq, c->head_dim_k, c->rms_eps, s->q));
            if (w->k_norm.data) TRY(op->rmsnorm(be, s->k, w->k_norm.data, n * nkv, c->head_dim_k, c->rms_eps, s->k));
            ag_attn_shape shape = {.layer = l * N + r, .n_head = nq, .n_head_kv = nkv, .head_dim_k = c->head_dim_k,
                                   .head_dim_v = c->head_dim_v, .scale = c->attn_scale,
                                   .window = swa ? c->sliding_window : 0};
            if (op->rope_kv_store) {
                TRY(op->rope_kv_store(be, kv, &shape, lay, s->q, s->k, s->v, c->rope_dim, b->pos, base, fscale,
                                      c->rope_neox));
            } else {
                TRY(op->rope(be, s->q, n, nq, c->head_dim_k, c->rope_dim, b->pos, base, fscale, c->rope_neox));
                TRY(op->rope(be, s->k, n, nkv, c->head_dim_k, c->rope_dim, b->pos, base, fscale, c->rope_neox));
                TRY(op->kv_store(be, kv, &shape, lay, s->k, s->v));
            }
            TRY(op->attention(be, kv, &shape, lay, s->q, s->att));
            TRY(op->matmul(be, &L->wo, s->att, n, n_dec, s->o));
        }
        TRY(all_reduce(tp, 1, xe));
        /* the feed-forward: each rank's columns, its partial output */
        for (int r = 0; r < N; r++) {
            shard                *s = &tp->s[r];
            const shard_layer    *L = &s->layers[l];
            ag_backend           *be = s->be;
            const ag_backend_ops *op = be->ops;
            if (w->post_attn_norm.data)
                TRY(op->rmsnorm(be, s->o, w->post_attn_norm.data, n, c->n_embd, c->rms_eps, s->o));
            TRY(ag_backend_add_rmsnorm(be, s->x, s->o, w->ffn_norm.data, n, c->n_embd, c->rms_eps, s->h));
            if (op->ffn) {
                TRY(op->ffn(be, &L->gate, &L->up, &L->down, s->h, n, n_dec, c->gelu, s->gate, s->up, s->o));
            } else {
                const ag_tensor *gu_w[2] = {&L->gate, &L->up};
                float *const     gu[2] = {s->gate, s->up};
                TRY(op->matmul_multi(be, gu_w, 2, s->h, n, n_dec, gu));
                if (c->gelu) TRY(op->gelu_mul(be, s->gate, s->up, (size_t)n * s->nff));
                else TRY(op->silu_mul(be, s->gate, s->up, (size_t)n * s->nff));
                TRY(op->matmul(be, &L->down, s->gate, n, n_dec, s->o));
            }
        }
        TRY(all_reduce(tp, 1, xe));
        for (int r = 0; r < N; r++) {
            shard                *s = &tp->s[r];
            ag_backend           *be = s->be;
            const ag_backend_ops *op = be->ops;
            if (w->post_ffn_norm.data)
                TRY(op->rmsnorm(be, s->o, w->post_ffn_norm.data, n, c->n_embd, c->rms_eps, s->o));
            if (l + 1 < c->n_layer)
                TRY(ag_backend_add_rmsnorm(be, s->x, s->o, tp->full[l + 1].attn_norm.data, n, c->n_embd, c->rms_eps, s->h));
            else
                TRY(op->add(be, s->x, s->o, xe));
        }
    }
#undef TRY
    /* every rank holds the same residual stream: rank 0's goes on */
    return tp->s[0].be->ops->copy(tp->s[0].be, x, tp->s[0].x, sizeof(float) * xe);
}

ag_status ag_tp_head(ag_tp *tp, const float *x, int n_out, int n_out_dec, float *logits) {
    const size_t n_vocab = (size_t)tp->c.n_vocab;
    const void  *send[AG_COMM_MAX_RANKS];
    size_t       bytes[AG_COMM_MAX_RANKS], total = 0;
    ag_status    st;
    if ((st = grow(tp, n_out, n_out))) return st;
    for (int r = 0; r < tp->n; r++) {
        shard *s = &tp->s[r];
        /* (host memory: x is every rank's; a device rank would take a copy) */
        if ((st = s->be->ops->matmul(s->be, &s->head, x, n_out, n_out_dec, s->logits))) return st;
        send[r] = s->logits;
        bytes[r] = sizeof(float) * (size_t)n_out * (size_t)s->nv;
        total += bytes[r];
    }
    tp->n_out = n_out;
    if ((st = stage_for(tp, total)) || (st = tp->comm->ops->gather(tp->comm, send, bytes, tp->stage))) return st;
    const float *p = (const float *)tp->stage;
    for (int r = 0; r < tp->n; r++) {
        const shard *s = &tp->s[r];
        for (int k = 0; k < n_out; k++)
            memcpy(logits + (size_t)k * n_vocab + s->v0, p + (size_t)k * s->nv, sizeof(float) * (size_t)s->nv);
        p += (size_t)n_out * s->nv;
    }
    return AG_OK;
}

ag_status ag_tp_argmax(ag_tp *tp, int k0, int n, int32_t *out) {
    if (k0 < 0 || n < 0 || k0 + n > tp->n_out)
        return ag_errorf(AG_ERR_INVALID, "tp argmax: rows %d..%d of %d", k0, k0 + n, tp->n_out);
    const void *send[AG_COMM_MAX_RANKS];
    size_t      bytes[AG_COMM_MAX_RANKS];
    ag_status   st;
    /* each rank's choice among its run: (global id, value), or id < 0
     * (host memory; a device rank would pack its pairs on the device) */
    for (int r = 0; r < tp->n; r++) {
        shard       *s = &tp->s[r];
        const float *rows = s->logits + (size_t)k0 * s->nv;
        if ((st = s->be->ops->argmax(s->be, rows, n, (int)s->nv, s->ids))) return st;
        for (int k = 0; k < n; k++)
            s->pairs[k] = s->ids[k] < 0 ? (tp_chosen){-1, 0}
                                        : (tp_chosen){(int32_t)(s->ids[k] + s->v0), rows[(size_t)k * s->nv + s->ids[k]]};
        send[r] = s->pairs;
        bytes[r] = sizeof(tp_chosen) * (size_t)n;
    }
    if ((st = stage_for(tp, sizeof(tp_chosen) * (size_t)n * (size_t)tp->n)) ||
        (st = tp->comm->ops->gather(tp->comm, send, bytes, tp->stage)))
        return st;
    const tp_chosen *all = (const tp_chosen *)tp->stage;
    for (int k = 0; k < n; k++) {
        int32_t best = AG_ARGMAX_NOFINITE;
        float   bv = 0;
        for (int r = 0; r < tp->n; r++) { /* rank order is id order: a later rank wins only when larger */
            const tp_chosen ch = all[(size_t)r * n + k];
            const float     v = ch.v > FLT_MAX ? FLT_MAX : ch.v; /* +inf and FLT_MAX alike */
            if (ch.id >= 0 && (best < 0 || v > bv)) best = ch.id, bv = v;
        }
        out[k] = best;
    }
    return AG_OK;
}

static uint64_t tensor_bytes(const ag_tensor *t) { return t->data ? t->row_bytes * (uint64_t)t->ne[1] * (uint64_t)t->ne[2] : 0; }

uint64_t ag_tp_weight_bytes(const ag_tp *tp, int r) {
    const shard *s = &tp->s[r];
    uint64_t     b = tensor_bytes(&s->embd) + (s->head.host == s->embd.host ? 0 : tensor_bytes(&s->head));
    for (int l = 0; l < tp->c.n_layer; l++) {
        const shard_layer      *L = &s->layers[l];
        const ag_layer_weights *w = &tp->full[l];
        const ag_tensor        *mats[] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->gate, &L->up, &L->down};
        const ag_tensor        *norms[] = {&w->attn_norm, &w->q_norm, &w->k_norm, &w->post_attn_norm, &w->ffn_norm,
                                           &w->post_ffn_norm};
        for (size_t i = 0; i < sizeof mats / sizeof mats[0]; i++) b += tensor_bytes(mats[i]);
        for (size_t i = 0; i < sizeof norms / sizeof norms[0]; i++) b += tensor_bytes(norms[i]);
        b += sizeof(float) * (uint64_t)((L->bq ? s->heads.nq : 0) * tp->c.head_dim_k +
                                        (L->bk ? s->heads.nkv : 0) * tp->c.head_dim_k +
                                        (L->bv ? s->heads.nkv : 0) * tp->c.head_dim_v);
    }
    return b;
}

uint64_t ag_tp_memory(const ag_tp *tp, int rank, int n_tokens, int n_ctx, uint64_t *copies) {
    const ag_model_config *c = &tp->c;
    const int              block_size = ag_kv_default_params().block_size;
    uint64_t               sum = 0;
    *copies = 0;
    for (int r = 0; r < tp->n; r++) {
        if (rank >= 0 && r != rank) continue;
        const shard *s = &tp->s[r];
        size_t mm = 0, attn = 0, need;
        *copies += s->copies_bytes;
        sum += shard_layout(tp, s, (size_t)n_tokens, (size_t)n_tokens, NULL); /* (every row may want logits) */
        const ag_tensor *head[1] = {&s->head};
        mm = ag_backend_matmul_scratch_bytes(s->be, head, 1, n_tokens);
        for (int l = 0; l < c->n_layer; l++) {
            const shard_layer *L = &s->layers[l];
            const ag_tensor   *groups[4][3] = {{&L->wq, &L->wk, &L->wv}, {&L->wo}, {&L->gate, &L->up}, {&L->down}};
            const int          sizes[4] = {3, 1, 2, 1};
            for (int g = 0; g < 4; g++) {
                need = ag_backend_matmul_scratch_bytes(s->be, groups[g], sizes[g], n_tokens);
                if (need > mm) mm = need;
                for (int i = 0; i < sizes[g]; i++) *copies += ag_backend_weight_copy_bytes(s->be, groups[g][i]);
            }
            ag_attn_shape shape = {.layer = l * tp->n + r, .n_head = s->heads.nq, .n_head_kv = s->heads.nkv,
                                   .head_dim_k = c->head_dim_k, .head_dim_v = c->head_dim_v,
                                   .window = c->layer_swa[l] ? c->sliding_window : 0};
            need = ag_backend_attention_scratch_bytes(s->be, &shape, block_size, n_tokens, n_ctx);
            if (need > attn) attn = need;
        }
        sum += mm + attn;
    }
    return sum;
}
