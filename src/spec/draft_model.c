/* The "draft-model" draft source (spec/draft_model.h).
 *
 * State of one source against the history protocol of spec/draft.h. With H
 * the history length and L the committed length of the source's draft KV
 * sequence, between calls L is H or H - 1, and `last` is history[H-1]:
 *   L == H - 1 ("pending"): the last history token has not been run through
 *     the draft model. After prefill (the last prompt token is left for the
 *     first draft(), which needs its logits anyway) and after a round whose
 *     drafts were all accepted (the last draft was never fed: the re-feed
 *     rule).
 *   L == H: everything ran; after a round with a rejection, the accepted
 *     drafts stay in the KV and the next feed (the correction) continues.
 * draft() runs [last if pending] + feed in one forward (logits only for the
 * final row), then drafts autoregressively, feeding each draft back with a
 * batch-1 decode forward only when another draft will follow it. commit()
 * trims the fed drafts that were rejected. */
#include "spec/draft_model.h"

#include <assert.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "base/switches.h"
#include "kv/kv.h"
#include "spec/spec.h"

#define CHUNK 256 /* most tokens one forward of this source runs */
/* Feeds of up to this many tokens run as decode rows, like the target ran
 * them (so a draft identical to the target reproduces its logits exactly);
 * longer ones (after many rounds without drafting) as prompt rows, whose
 * batched kernels are much faster. */
#define FEED_AS_DECODE 32

struct ag_draft_model {
    ag_model *model;
    ag_tok   *tok;
    ag_kv    *kv;
    int       n_vocab_target; /* q / sampler width */
    int       n_vocab_draft;  /* draft logits row width */
    int       n_valid;        /* ids [0, n_valid) can be drafted and fed */
    int       head_rows;      /* the head's prefix the draft computes (n_vocab_draft: all of it) */
    int       n_ctx;
    int       n_sources;
    int       max_seqs;
    float     p_min;
    size_t    file_bytes;
    size_t    pool_bytes;
    size_t    scratch_bytes; /* ag_model_scratch_bytes for CHUNK-token forwards */
    char      path[512];
};

typedef struct {
    ag_draft_source  base; /* first: the executor sees an ag_draft_source */
    ag_draft_model  *dm;
    int32_t          seq;
    ag_sampler      *sampler;
    int64_t          hist;    /* H */
    int32_t          last;    /* history[H-1] (valid when H > 0) */
    bool             pending; /* L == H - 1 */
    bool             dead;    /* failed or out of context: drafts nothing until prefill */
    int              d_open;  /* drafts of the last draft() awaiting commit, -1: none */
    int              fed;     /* of those, how many ran through the KV */
    int32_t         *drafts;  /* [cap] the last round's drafts */
    float           *confs;   /* [cap] their confidences */
    int              n_last;  /* drafts of the last draft() */
    int              cap;
    float           *row;     /* [n_vocab_target] draft logits mapped to the target vocab */
    float           *proc;    /* [n_vocab_target] processed logits, or q when probs is NULL */
    float           *logits;  /* [n_vocab_draft] */
    /* Whether each draft step asks the model for its row's best candidates
     * (AG_WANT_CANDS; a device then copies back ~2 KB, not the row): a
     * greedy sampler without bias or penalties (the argmax, and the sum of
     * exponentials for its confidence) or one with ag_sampler_cands_req,
     * on a draft whose rows hold no id the target lacks. Fixed for the
     * source's life. */
    bool             cands_on;
    ag_cands_req     cands_req;
    ag_cands         cands;   /* the last draft step's */
    ag_cand_probs    cp;      /* q from them */
    int32_t          b_tok[CHUNK], b_pos[CHUNK], b_seq[CHUNK];
    uint8_t          b_want[CHUNK];
    /* With a head prefix (dm->head_rows < n_vocab_draft): the ids past it
     * that this sequence has seen (prompt and output, up to
     * AG_DRAFT_MODEL_EXTRA_MAX) and their head rows, computed every step as
     * well, so that what the context copies can still be drafted. */
    uint8_t         *x_seen; /* bitmap over n_vocab_draft */
    int32_t         *x_ids;
    uint8_t         *x_rows;
    ag_head_extra    hx;
} dm_source;

/* ---- the draft model ---------------------------------------------------- */

static bool is_special_attr(uint32_t a) {
    return (a & (AG_TOK_ATTR_CONTROL | AG_TOK_ATTR_USER_DEFINED | AG_TOK_ATTR_UNUSED)) != 0;
}

/* Appends a token's raw text, quoted and shortened, to buf[cap]. */
static void quote_token(char *buf, size_t cap, const ag_tok *t, int32_t id) {
    size_t      len = 0, used = strlen(buf);
    const char *s = ag_tok_text(t, id, &len);
    if (!s) {
        snprintf(buf + used, cap - used, "(none)");
        return;
    }
    int shown = len > 40 ? 40 : (int)len;
    snprintf(buf + used, cap - used, "'%.*s%s'", shown, s, len > 40 ? "..." : "");
}

static void add_fact(char *msg, size_t cap, int *n_facts, const char *fact) {
    size_t used = strlen(msg);
    snprintf(msg + used, cap - used, "%s%s", (*n_facts)++ ? "; " : "", fact);
}

/* The vocabulary check of ag_draft_model_open. Collects the first instance
 * of every kind of difference into one message. */
static ag_status check_vocab(const char *path, const ag_tok *d, const ag_tok *t) {
    char msg[1536] = "", f[512];
    int  n_facts = 0;
    if (strcmp(ag_tok_model(d), ag_tok_model(t)) != 0) {
        snprintf(f, sizeof f, "the tokenizer is '%s' in the draft and '%s' in the target", ag_tok_model(d),
                 ag_tok_model(t));
        add_fact(msg, sizeof msg, &n_facts, f);
    }
    if (ag_tok_bos(d) != ag_tok_bos(t)) {
        snprintf(f, sizeof f, "BOS is %d in the draft and %d in the target", ag_tok_bos(d), ag_tok_bos(t));
        add_fact(msg, sizeof msg, &n_facts, f);
    }
    if (ag_tok_eos(d) != ag_tok_eos(t)) {
        snprintf(f, sizeof f, "EOS is %d in the draft and %d in the target", ag_tok_eos(d), ag_tok_eos(t));
        add_fact(msg, sizeof msg, &n_facts, f);
    }
    const int32_t nd = ag_tok_n_vocab(d), nt = ag_tok_n_vocab(t);
    const int32_t shared = nd < nt ? nd : nt, total = nd > nt ? nd : nt;
    int32_t       n_diff = 0, first = -1;
    for (int32_t i = 0; i < shared; i++) {
        size_t      ld, lt;
        const char *sd = ag_tok_text(d, i, &ld), *st = ag_tok_text(t, i, &lt);
        if (ld == lt && memcmp(sd, st, ld) == 0) continue;
        if (first < 0) first = i;
        n_diff++;
    }
    if (first >= 0) {
        snprintf(f, sizeof f, "token %d is ", first);
        quote_token(f, sizeof f, d, first);
        snprintf(f + strlen(f), sizeof f - strlen(f), " in the draft and ");
        quote_token(f, sizeof f, t, first);
        snprintf(f + strlen(f), sizeof f - strlen(f), " in the target (%d of the %d shared ids differ)", n_diff,
                 shared);
        add_fact(msg, sizeof msg, &n_facts, f);
    }
    /* ids only the larger vocabulary has: fine if they are special tokens
     * (the draft never proposes them, the target rarely emits them) */
    const ag_tok *big = nd > nt ? d : t;
    for (int32_t i = shared; i < total; i++) {
        if (is_special_attr(ag_tok_attr(big, i))) continue;
        snprintf(f, sizeof f, "the %s has %d tokens and the %s %d, and its token %d ", big == d ? "draft" : "target",
                 total, big == d ? "target" : "draft", shared, i);
        quote_token(f, sizeof f, big, i);
        snprintf(f + strlen(f), sizeof f - strlen(f), " is not a special token");
        add_fact(msg, sizeof msg, &n_facts, f);
        break;
    }
    if (n_facts == 0) return AG_OK;
    return ag_errorf(AG_ERR_FORMAT, "draft model %s is incompatible with the target: %s", path, msg);
}

/* A source's own memory: its sampler over the target's vocabulary, its
 * logits and probability rows, and its draft buffers of `cap` tokens. */
static size_t source_bytes(int32_t n_vocab_target, int32_t n_vocab_draft, size_t n_accepted, int cap,
                           size_t extra_bytes) {
    return sizeof(dm_source) + extra_bytes + ag_sampler_bytes(n_vocab_target, n_accepted) +
           sizeof(float) * (2 * (size_t)n_vocab_target + (size_t)n_vocab_draft) +
           (sizeof(int32_t) + sizeof(float)) * (size_t)cap;
}

/* The draft's KV pool: max_seqs sequences of n_ctx (already clamped)
 * positions. */
static ag_status draft_kv_params(const ag_model *m, int max_seqs, int n_ctx, ag_kv_params *kp) {
    ag_status st = ag_model_kv_params(m, AG_KV_F16, max_seqs, n_ctx, kp, NULL);
    kp->ring_step = CHUNK * max_seqs; /* (run_tokens reserves a chunk at most; each source may hold its last) */
    return st;
}

static int clamp_ctx(const ag_model *m, int n_ctx) {
    int train = ag_model_config_of(m)->n_ctx_train;
    return train > 0 && n_ctx > train ? train : n_ctx;
}

/* A source's buffers for the ids past the head prefix (none without one). */
static size_t extra_bytes(const ag_draft_model *dm) {
    if (dm->head_rows >= dm->n_vocab_draft) return 0;
    return ((size_t)dm->n_vocab_draft + 7) / 8 +
           (size_t)AG_DRAFT_MODEL_EXTRA_MAX * (sizeof(int32_t) + ag_model_head_row_bytes(dm->model));
}

size_t ag_draft_model_plan_bytes(ag_draft_model *dm, int max_seqs, int n_ctx) {
    ag_model *draft = dm->model;
    n_ctx = clamp_ctx(draft, n_ctx);
    int32_t n_vocab = ag_model_config_of(draft)->n_vocab; /* the target's too (ag_draft_setup_open) */
    ag_kv_params kp;
    size_t       kv = 0;
    if (draft_kv_params(draft, max_seqs, n_ctx, &kp) || ag_kv_memory_bytes(&kp, n_ctx, &kv)) return 0;
    return ag_gguf_file_size(ag_model_gguf(draft)) + kv + ag_model_scratch_bytes(draft, CHUNK, n_ctx) +
           (size_t)max_seqs * source_bytes(n_vocab, n_vocab, (size_t)n_ctx, AG_SPEC_MAX_DRAFT, extra_bytes(dm));
}

ag_status ag_draft_model_open(const char *path, const ag_model_params *mp, const ag_tok *target_tok,
                              int max_seqs, int n_ctx, ag_draft_model **out) {
    if (!out) return ag_errorf(AG_ERR_INVALID, "draft model: NULL out");
    *out = NULL;
    if (!path || !target_tok) return ag_errorf(AG_ERR_INVALID, "draft model: NULL path or target tokenizer");
    if (max_seqs < 1 || n_ctx < 1)
        return ag_errorf(AG_ERR_INVALID, "draft model: max_seqs %d and n_ctx %d must be >= 1", max_seqs, n_ctx);
    ag_draft_model *dm = calloc(1, sizeof *dm);
    if (!dm) return ag_errorf(AG_ERR_NOMEM, "draft model: out of memory");
    snprintf(dm->path, sizeof dm->path, "%s", path);
    dm->p_min = AG_DRAFT_MODEL_P_MIN;
    ag_status st = ag_model_load(path, mp, &dm->model);
    if (st) {
        char inner[1024];
        snprintf(inner, sizeof inner, "%s", ag_error_message());
        free(dm);
        return ag_errorf(st, "draft model: %s", inner);
    }
    const ag_model_config *cfg = ag_model_config_of(dm->model);
    if ((st = ag_tok_from_gguf(ag_model_gguf(dm->model), &dm->tok))) {
        char inner[1024];
        snprintf(inner, sizeof inner, "%s", ag_error_message());
        ag_draft_model_close(dm);
        return ag_errorf(st, "draft model %s: tokenizer: %s", path, inner);
    }
    if ((st = check_vocab(path, dm->tok, target_tok))) {
        ag_draft_model_close(dm);
        return st;
    }
    if (ag_tok_n_vocab(dm->tok) > cfg->n_vocab) {
        int nt = ag_tok_n_vocab(dm->tok);
        ag_draft_model_close(dm);
        return ag_errorf(AG_ERR_FORMAT, "draft model %s: tokenizer has %d tokens but the model only %d", path, nt,
                         cfg->n_vocab);
    }
    dm->n_vocab_target = ag_tok_n_vocab(target_tok);
    dm->n_vocab_draft = cfg->n_vocab;
    dm->n_valid = ag_tok_n_vocab(dm->tok) < dm->n_vocab_target ? ag_tok_n_vocab(dm->tok) : dm->n_vocab_target;
    if (clamp_ctx(dm->model, n_ctx) < n_ctx) {
        AG_LOGI("draft model %s: n_ctx %d clamped to its n_ctx_train %d", path, n_ctx, cfg->n_ctx_train);
        n_ctx = clamp_ctx(dm->model, n_ctx);
    }
    dm->n_ctx = n_ctx;
    dm->max_seqs = max_seqs;

    ag_kv_params kp;
    if ((st = draft_kv_params(dm->model, max_seqs, n_ctx, &kp))) goto fail_kv;
    if ((st = ag_kv_init(&kp, &dm->kv))) goto fail_kv;
    ag_kv_stats ks;
    ag_kv_get_stats(dm->kv, &ks);
    dm->pool_bytes = ks.pool_bytes + ks.meta_bytes;
    dm->file_bytes = ag_gguf_file_size(ag_model_gguf(dm->model));
    if ((st = ag_model_reserve_scratch(dm->model, CHUNK))) goto fail_kv;
    dm->scratch_bytes = ag_model_scratch_bytes(dm->model, CHUNK, n_ctx);
    const int rows = (int)ag_switch_int("AUGUR_DRAFT_VOCAB", 0, 1 << 30,
                                        dm->n_vocab_draft > 2 * AG_DRAFT_MODEL_HEAD_ROWS ? AG_DRAFT_MODEL_HEAD_ROWS : 0);
    dm->head_rows = ag_model_set_output_rows(dm->model, rows);
    if (dm->head_rows < dm->n_vocab_draft)
        AG_LOGI("draft model %s: its output head computes ids below %d of %d, and those its context holds "
                "(AUGUR_DRAFT_VOCAB=0: all)", path, dm->head_rows, dm->n_vocab_draft);
    *out = dm;
    return AG_OK;

fail_kv: {
    char inner[1024];
    snprintf(inner, sizeof inner, "%s", ag_error_message());
    ag_draft_model_close(dm);
    return ag_errorf(st, "draft model %s: KV pool for %d sequences of %d positions: %s", path, max_seqs, n_ctx,
                     inner);
}
}

void ag_draft_model_close(ag_draft_model *dm) {
    if (!dm) return;
    assert(dm->n_sources == 0 && "ag_draft_model_close with live sources");
    ag_kv_free(dm->kv);
    ag_tok_free(dm->tok);
    ag_model_free(dm->model);
    free(dm);
}

size_t ag_draft_model_resident_bytes(const ag_draft_model *dm) {
    return dm ? dm->file_bytes + dm->pool_bytes + dm->scratch_bytes : 0;
}

float ag_draft_model_cost(const ag_draft_model *dm, const ag_model *target) {
    uint64_t t = target ? ag_model_weight_bytes(target) : 0;
    if (!dm || t == 0) return 1.0f;
    return (float)((double)ag_model_weight_bytes(dm->model) / (double)t);
}

int ag_draft_model_n_vocab(const ag_draft_model *dm) { return dm ? dm->n_vocab_target : 0; }

int ag_draft_model_n_ctx(const ag_draft_model *dm) { return dm ? dm->n_ctx : 0; }

void ag_draft_model_set_p_min(ag_draft_model *dm, float p_min) {
    if (!dm) return;
    if (!(p_min >= 0.0f)) p_min = 0.0f; /* also NaN */
    if (p_min > 1.0f) p_min = 1.0f;
    dm->p_min = p_min;
}

/* ---- the source --------------------------------------------------------- */

/* Runs [head if >= 0] + toks[0..n) of the source's sequence from its
 * committed length, in chunks; as prompt rows or decode rows; logits of the
 * final token into s->logits when want_last. Commits each chunk that ran. */
static ag_status run_tokens(dm_source *s, int32_t head, const int32_t *toks, int n, bool as_prompt, bool want_last) {
    ag_draft_model *dm = s->dm;
    const int       h = head >= 0;
    n += h;
    for (int p0 = 0; p0 < n; p0 += CHUNK) {
        int     k = n - p0 < CHUNK ? n - p0 : CHUNK;
        int32_t len = ag_kv_seq_len(dm->kv, s->seq);
        for (int i = 0; i < k; i++) {
            int j = p0 + i;
            s->b_tok[i] = h && j == 0 ? head : toks[j - h];
            s->b_pos[i] = len + i;
            s->b_seq[i] = s->seq;
            s->b_want[i] = 0;
        }
        bool want = want_last && p0 + k == n;
        s->b_want[k - 1] = !want ? 0 : s->cands_on ? AG_WANT_CANDS : AG_WANT_LOGITS;
        ag_batch  b = {.n = k, .token = s->b_tok, .pos = s->b_pos, .seq = s->b_seq, .want_logits = s->b_want,
                       .cands_req = &s->cands_req, .cands = &s->cands, .n_prompt = as_prompt ? k : 0,
                       .head_extra = s->hx.n > 0 ? &s->hx : NULL};
        ag_status st = ag_kv_seq_reserve(dm->kv, s->seq, k);
        if (!st) st = ag_model_forward(dm->model, dm->kv, &b, want ? s->logits : NULL);
        if (st) return st;
        if ((st = ag_kv_seq_commit(dm->kv, s->seq, len + k))) return st;
    }
    return AG_OK;
}

/* Adds the ids of toks[0..n) past the head prefix that are new to the
 * source to the rows it computes beside the prefix (until
 * AG_DRAFT_MODEL_EXTRA_MAX). */
static void note_tokens(dm_source *s, const int32_t *toks, int n) {
    const ag_draft_model *dm = s->dm;
    if (!s->x_seen) return;
    const size_t rb = ag_model_head_row_bytes(dm->model);
    for (int i = 0; i < n && s->hx.n < AG_DRAFT_MODEL_EXTRA_MAX; i++) {
        const int32_t t = toks[i];
        if (t < dm->head_rows || t >= dm->n_vocab_draft || (s->x_seen[t >> 3] >> (t & 7) & 1)) continue;
        if (ag_model_head_rows_copy(dm->model, &t, 1, s->x_rows + (size_t)s->hx.n * rb)) continue;
        s->x_seen[t >> 3] |= (uint8_t)(1u << (t & 7));
        s->x_ids[s->hx.n++] = t;
    }
}

/* The draft's logits in the target vocabulary: ids neither side can draft
 * get -inf (q = 0). */
static void map_row(dm_source *s) {
    const ag_draft_model *dm = s->dm;
    memcpy(s->row, s->logits, sizeof(float) * (size_t)dm->n_valid);
    for (int i = dm->n_valid; i < dm->n_vocab_target; i++) s->row[i] = -INFINITY;
}

static ag_status src_prefill(ag_draft_source *base, const int32_t *prompt, int n) {
    dm_source      *s = (dm_source *)base;
    ag_draft_model *dm = s->dm;
    ag_kv_seq_clear(dm->kv, s->seq);
    ag_sampler_reset(s->sampler);
    s->hist = 0;
    s->pending = false;
    s->dead = false;
    s->d_open = -1;
    s->n_last = 0;
    if (s->x_seen) memset(s->x_seen, 0, ((size_t)dm->n_vocab_draft + 7) / 8);
    s->hx.n = 0;
    if (n < 0 || (n > 0 && !prompt)) return ag_errorf(AG_ERR_INVALID, "draft-model: prefill: bad prompt (%d tokens)", n);
    for (int i = 0; i < n; i++)
        if (prompt[i] < 0 || prompt[i] >= dm->n_valid) {
            s->dead = true;
            return ag_errorf(AG_ERR_INVALID, "draft-model: prefill: prompt token %d (id %d) is not in the draft's "
                                             "vocabulary [0, %d)", i, prompt[i], dm->n_valid);
        }
    if (n == 0) return AG_OK;
    if (n > dm->n_ctx) {
        /* nothing to draft past the draft's context: stay silent */
        s->dead = true;
        return AG_OK;
    }
    note_tokens(s, prompt, n);
    ag_status st = run_tokens(s, -1, prompt, n - 1, true, false);
    if (st) {
        char inner[1024];
        snprintf(inner, sizeof inner, "%s", ag_error_message());
        s->dead = true;
        return ag_errorf(st, "draft-model: prefill of %d tokens: %s", n, inner);
    }
    s->hist = n;
    s->last = prompt[n - 1];
    s->pending = true;
    return AG_OK;
}

/* An error inside draft(): the source goes silent until the next prefill
 * (the executor decodes plainly), and draft() returns -1. */
static int fail(dm_source *s, ag_status st, const char *what) {
    char inner[1024];
    snprintf(inner, sizeof inner, "%s", ag_error_message());
    s->dead = true;
    s->d_open = 0;
    s->fed = 0;
    s->n_last = 0;
    ag_errorf(st, "draft-model: %s: %s", what, inner);
    return -1;
}

/* Whether the last forward's final row is read from its candidates: else
 * its logits are in s->logits (fetched here when the candidates do not hold
 * the sampler's cut; false with *ok = false if that fails). */
static bool from_cands(dm_source *s, bool *ok) {
    *ok = true;
    if (!s->cands_on) return false;
    if (!s->base.stochastic || ag_sampler_cands_enough(s->sampler, &s->cands)) return true;
    *ok = ag_model_output_row(s->dm->model, 0, s->logits) == AG_OK;
    if (!*ok) AG_LOGW("draft-model: the row could not be fetched (%s); this round drafts no more", ag_error_message());
    return false;
}

/* Processes a row of the draft's logits (or its candidates); *tok gets the
 * token to draft and *conf its confidence (see draft_model.h), or returns
 * false when no token is possible. q (n_vocab_target floats) receives the
 * distribution when sampling. Candidates give the row's bits: the argmax
 * and the sum of exponentials as ag_top_cands_f32 finds them (the row path
 * sums in the same order), q as ag_sampler_probs_cands. */
static bool pick(dm_source *s, float *q, int32_t *tok, float *conf) {
    ag_draft_model *dm = s->dm;
    const int       n = dm->n_vocab_target;
    bool            ok, cands = from_cands(s, &ok);
    if (!ok) return false;
    if (!cands) map_row(s);
    if (!s->base.stochastic) {
        double  z;
        int32_t am = -1;
        if (cands) {
            if (s->cands.n < 1 || s->cands.n_finite < 1) return false;
            am = s->cands.c[0].id;
            z = s->cands.sumexp;
        } else {
            if (ag_sampler_logits(s->sampler, s->row, s->proc)) return false;
            float m = -INFINITY;
            for (int i = 0; i < n; i++)
                if (s->proc[i] > m) {
                    m = s->proc[i];
                    am = i;
                }
            if (am < 0) return false;
            z = 0;
            for (int i = 0; i < n; i++) z += (double)expf(s->proc[i] - m);
        }
        *tok = am;
        *conf = (float)(1.0 / z);
        return true;
    }
    if (cands) {
        if (ag_sampler_probs_cands(s->sampler, &s->cands, &s->cp)) return false;
        memset(q, 0, sizeof(float) * (size_t)n);
        for (int32_t j = 0; j < s->cp.n; j++) q[s->cp.id[j]] = s->cp.p[j];
    } else if (ag_sampler_probs(s->sampler, s->row, q)) {
        return false;
    }
    float top = 0;
    for (int i = 0; i < n; i++)
        if (q[i] > top) top = q[i];
    *conf = top;
    if (top < dm->p_min) return true; /* the caller stops: no RNG draw */
    return ag_sampler_draw(s->sampler, q, tok) == AG_OK;
}

static int src_draft(ag_draft_source *base, const int32_t *feed, int n_feed, int max, int32_t *out, float *probs) {
    dm_source      *s = (dm_source *)base;
    ag_draft_model *dm = s->dm;
    s->n_last = 0;
    if (s->dead) {
        s->d_open = 0;
        s->fed = 0;
        return 0;
    }
    if (s->d_open >= 0) {
        ag_errorf(AG_ERR_INTERNAL, "draft() called twice without commit()");
        return fail(s, AG_ERR_INTERNAL, "protocol");
    }
    s->d_open = 0;
    s->fed = 0;
    if (n_feed < 0 || (n_feed > 0 && !feed) || max < 0 || (max > 0 && !out)) {
        ag_errorf(AG_ERR_INVALID, "bad arguments (n_feed %d, max %d)", n_feed, max);
        return fail(s, AG_ERR_INVALID, "draft");
    }
    for (int i = 0; i < n_feed; i++)
        if (feed[i] < 0 || feed[i] >= dm->n_valid) {
            ag_errorf(AG_ERR_INVALID, "token %d is not in the draft's vocabulary [0, %d)", feed[i], dm->n_valid);
            return fail(s, AG_ERR_INVALID, "draft");
        }
    const int64_t h_new = s->hist + n_feed;
    if (h_new >= dm->n_ctx) {
        s->dead = true; /* the history only grows: no room ever again */
        return 0;
    }
    if (h_new == 0) return 0; /* nothing to condition on */
    note_tokens(s, feed, n_feed);
    for (int i = 0; i < n_feed; i++)
        if (ag_sampler_accept(s->sampler, feed[i])) return fail(s, AG_ERR_INTERNAL, "sampler");

    /* [last if pending] + feed, with the final row's logits */
    ag_status st = AG_OK;
    if (!s->pending && n_feed == 0) {
        /* everything ran but the logits after it are gone: run the last again */
        /* (a sliding-window ring keeps ring_slack positions past the
         * last reserve: a position is always there to drop) */
        if (!ag_kv_trimmable(dm->kv, s->seq, 1))
            return fail(s, ag_errorf(AG_ERR_UNSUPPORTED, "the draft's KV cannot drop its last position"), "trim");
        if ((st = ag_kv_trim(dm->kv, s->seq, 1))) return fail(s, st, "trim");
        s->pending = true;
    }
    const int n_run = (s->pending ? 1 : 0) + n_feed;
    if ((st = run_tokens(s, s->pending ? s->last : -1, feed, n_feed, n_run > FEED_AS_DECODE, true)))
        return fail(s, st, "forward");
    s->pending = false;
    if (n_feed > 0) s->last = feed[n_feed - 1];
    s->hist = h_new;

    int max_d = max;
    if (max_d > dm->n_ctx - h_new) max_d = (int)(dm->n_ctx - h_new); /* draft i sits at position h_new + i */
    if (max_d > s->cap) {
        int32_t *nd = realloc(s->drafts, sizeof(int32_t) * (size_t)max_d);
        if (nd) s->drafts = nd;
        float *nc = nd ? realloc(s->confs, sizeof(float) * (size_t)max_d) : NULL;
        if (nc) s->confs = nc;
        if (!nd || !nc) {
            ag_errorf(AG_ERR_NOMEM, "out of memory for %d drafts", max_d);
            return fail(s, AG_ERR_NOMEM, "draft");
        }
        s->cap = max_d;
    }
    int d = 0;
    while (d < max_d) {
        float  *q = s->base.stochastic ? (probs ? probs + (size_t)d * dm->n_vocab_target : s->proc) : NULL;
        int32_t tok = -1;
        float   conf = 0;
        if (!pick(s, q, &tok, &conf) || conf < dm->p_min || tok < 0) break;
        if (ag_sampler_accept(s->sampler, tok)) break;
        out[d] = tok;
        s->confs[d] = conf;
        s->drafts[d++] = tok;
        if (d == max_d) break;
        if ((st = run_tokens(s, -1, &tok, 1, false, true))) return fail(s, st, "forward");
        s->fed = d;
    }
    s->d_open = d;
    s->n_last = d;
    return d;
}

static void src_commit(ag_draft_source *base, int d, int k) {
    dm_source      *s = (dm_source *)base;
    ag_draft_model *dm = s->dm;
    if (s->d_open < 0) return; /* no draft() since the last commit: a protocol slip, nothing to undo */
    /* The executor's d is what draft() returned; trust our own count. */
    (void)d;
    d = s->d_open;
    if (k < 0) k = 0;
    if (k > d) k = d;
    s->d_open = -1;
    if (s->dead) return;
    int keep = k < s->fed ? k : s->fed;
    /* (a sliding-window ring may not reach back that far: ask first) */
    if (s->fed > keep && (!ag_kv_trimmable(dm->kv, s->seq, s->fed - keep) || ag_kv_trim(dm->kv, s->seq, s->fed - keep))) {
        s->dead = true; /* cannot roll back: stop drafting (never propose from a wrong state) */
        return;
    }
    ag_sampler_rewind(s->sampler, (size_t)(d - k));
    s->hist += k;
    if (k > 0) s->last = s->drafts[k - 1];
    s->pending = k > keep; /* all accepted and the last draft never ran */
    s->fed = 0;
}

static size_t src_resident_bytes(const ag_draft_source *base) {
    const dm_source      *s = (const dm_source *)base;
    const ag_draft_model *dm = s->dm;
    return source_bytes(dm->n_vocab_target, dm->n_vocab_draft, ag_sampler_n_accepted(s->sampler), s->cap,
                        extra_bytes(dm));
}

static void src_free(ag_draft_source *base) {
    dm_source *s = (dm_source *)base;
    if (!s) return;
    if (s->dm) {
        if (s->seq >= 0) ag_kv_seq_free(s->dm->kv, s->seq);
        s->dm->n_sources--;
    }
    ag_sampler_free(s->sampler);
    free(s->drafts);
    free(s->confs);
    free(s->row);
    free(s->proc);
    free(s->x_seen);
    free(s->x_ids);
    free(s->x_rows);
    if (s->dm) ag_model_host_free(s->dm->model, s->logits); /* before s->dm is set, the constructor frees it */
    free(s);
}

static const ag_draft_ops k_ops = {
    .prefill = src_prefill,
    .draft = src_draft,
    .commit = src_commit,
    .resident_bytes = src_resident_bytes,
    .free = src_free,
};

ag_status ag_draft_model_source_new(ag_draft_model *dm, const ag_sample_params *sp, uint64_t stream,
                                    float cost_per_token, ag_draft_source **out) {
    if (!out) return ag_errorf(AG_ERR_INVALID, "draft-model: NULL out");
    *out = NULL;
    if (!dm || !sp) return ag_errorf(AG_ERR_INVALID, "draft-model: NULL draft model or sample params");
    dm_source *s = calloc(1, sizeof *s);
    if (!s) return ag_errorf(AG_ERR_NOMEM, "draft-model: out of memory");
    s->base.ops = &k_ops;
    s->base.name = "draft-model";
    s->base.stochastic = sp->temperature > 0.0f;
    s->base.cost_per_token = cost_per_token;
    s->seq = -1;
    s->d_open = -1;
    ag_sample_params p = *sp;
    p.logprobs = 0;
    p.n_logprobs = 0;
    ag_status st = ag_sampler_new(&p, dm->n_vocab_target, stream, &s->sampler);
    if (st) {
        free(s);
        return st;
    }
    s->row = malloc(sizeof(float) * (size_t)dm->n_vocab_target);
    s->proc = malloc(sizeof(float) * (size_t)dm->n_vocab_target);
    s->logits = ag_model_host_floats(dm->model, (size_t)dm->n_vocab_draft); /* downloaded every draft step */
    bool x_ok = true;
    if (dm->head_rows < dm->n_vocab_draft) {
        s->x_seen = calloc(((size_t)dm->n_vocab_draft + 7) / 8, 1);
        s->x_ids = malloc(sizeof(int32_t) * AG_DRAFT_MODEL_EXTRA_MAX);
        s->x_rows = malloc(ag_model_head_row_bytes(dm->model) * AG_DRAFT_MODEL_EXTRA_MAX);
        s->hx = (ag_head_extra){.n = 0, .ids = s->x_ids, .rows = s->x_rows};
        x_ok = s->x_seen && s->x_ids && s->x_rows;
    }
    if (!s->row || !s->proc || !s->logits || !x_ok) {
        ag_model_host_free(dm->model, s->logits);
        s->logits = NULL;
        src_free(&s->base);
        return ag_errorf(AG_ERR_NOMEM, "draft-model: out of memory for vocab rows");
    }
    /* candidates where they give the row's bits (draft_model.h: ids past
     * n_valid are -inf in the row, so a row as wide as n_valid has no more) */
    if (ag_model_can_cands(dm->model) && dm->n_vocab_draft == dm->n_valid) {
        if (ag_sampler_argmax_only(s->sampler)) { /* greedy: the argmax and its confidence */
            s->cands_on = true;
            s->cands_req = (ag_cands_req){1, 1, -1};
        } else {
            s->cands_on = ag_sampler_cands_req(s->sampler, &s->cands_req);
        }
    }
    s->dm = dm;
    dm->n_sources++;
    if ((st = ag_kv_seq_new(dm->kv, &s->seq))) {
        s->seq = -1;
        src_free(&s->base);
        return ag_errorf(st, "draft-model: all %d draft sequences are in use", dm->max_seqs);
    }
    *out = &s->base;
    return AG_OK;
}

int ag_draft_model_source_confidence(const ag_draft_source *base, float *conf, int n) {
    if (!base || base->ops != &k_ops) return 0;
    const dm_source *s = (const dm_source *)base;
    for (int i = 0; i < n && i < s->n_last; i++) conf[i] = s->confs[i];
    return s->n_last;
}
