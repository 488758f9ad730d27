/* spec/ngram.c: prompt lookup (see ngram.h for the rule it implements).
 *
 * The index. The history is append-only under draft.h's protocol (rejected
 * drafts never enter it; only prefill starts over), so the index only ever
 * grows. For each n in [n_min, n_max] (k = n - n_min) there is
 *   - an open-addressing hash table whose key is an n-gram and whose value is
 *     the start of its most recent INDEXED occurrence, and
 *   - a chain prev[p * nn + k]: the start of the previous indexed occurrence
 *     of the n-gram that starts at p (-1 at the oldest).
 * The n-gram starting at p is indexed the moment its next token h[p+n] is
 * appended, so the table never holds the history's own suffix: a hit on the
 * suffix is always an EARLIER occurrence, with a next token to vote with.
 * Table slots keep the token position, not the tokens, so keys are compared
 * against the history itself (a hash match alone is never trusted).
 *
 * Everything a commit() may append is reserved by the draft() before it
 * (history, chains, table room), which is what lets commit() return void. */
#include "spec/ngram.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/hash.h"

/* A history this long would need gigabytes of index; refuse rather than let
 * int arithmetic on positions come near overflow. */
#define NGRAM_MAX_HISTORY (1 << 28)

typedef struct {
    uint32_t h;   /* hash of the n-gram (only a quick reject) */
    int32_t  pos; /* start of its latest indexed occurrence; -1 = empty slot */
} ng_slot;

typedef struct {
    ng_slot *slot; /* [mask + 1], NULL while empty */
    uint32_t mask;
    int32_t  count; /* occupied slots */
} ng_table;

typedef struct {
    int32_t tok; /* the next token this occurrence votes for */
    int32_t pos; /* start of the occurrence */
} ng_vote;

typedef struct {
    ag_draft_source base; /* first: the executor sees only this */
    int             n_min, n_max, nn, cand;
    int32_t        *hist; /* [cap] */
    int32_t        *prev; /* [cap * nn] */
    int32_t         len, cap;
    ng_table       *tab;  /* [nn] */
    int32_t        *prop; /* the last proposal, [prop_cap] */
    int32_t         prop_cap, last_d;
    int             last_n; /* the suffix length the last proposal matched (0: none) */
    ng_vote        *vote; /* [cand] scratch for ranking */
} ngram;

/* Why these defaults. Measured by replaying real token streams (Qwen2.5
 * tokenizer) through this source with an oracle verifier, drafting up to 8:
 * 12 code-edit tasks from this repository's history (prompt = old file,
 * output = new file) and 3 outputs unrelated to their prompts.
 *   n_max 12: longer suffixes make code matches specific ("    }\n" is
 *     everywhere, the 8 tokens before it are not): tokens per target forward
 *     on the edits were 5.66 / 6.53 / 6.82 / 6.95 for n_max 4 / 8 / 12 / 16
 *     (n_min 2). 12 keeps most of the gain for 3/4 of 16's index memory.
 *   n_min 2: a one-token match is mostly noise. On unrelated output, n_min 1
 *     drafted 5.8 tokens per forward at 6.6% acceptance, n_min 2 drafted 2.3
 *     at 11%, n_min 3 1.0 at 17%; on the edits 1 / 2 / 3 gave 6.97 / 6.82 /
 *     6.64 tokens per forward. 2 is the middle: it gives up 2% on copying
 *     work to cut wasted verify rows by 60% on ordinary text, which matters
 *     where extra rows are not free (the CPU, full batches).
 *   max_candidates 8: the vote barely matters (1, 4, 16, 64 candidates were
 *     within 0.2% of each other), so it is kept small: ranking stays a
 *     handful of operations and recent context decides. */
ag_ngram_params ag_ngram_default_params(void) {
    ag_ngram_params p = {.n_min = 2, .n_max = 12, .max_candidates = 8};
    return p;
}

static uint32_t gram_hash(const int32_t *t, int n) {
    uint64_t x = ag_hash64(t, (size_t)n * sizeof *t);
    return (uint32_t)(x ^ (x >> 32));
}

/* The slot holding the n-gram that starts at `key` (compared token by token
 * against the history), or the empty slot where it would go. */
static ng_slot *tab_find(const ngram *s, const ng_table *t, int32_t key, int n, uint32_t h) {
    const int32_t *kt = s->hist + key;
    for (uint32_t i = h & t->mask;; i = (i + 1) & t->mask) {
        ng_slot *sl = &t->slot[i];
        if (sl->pos < 0) return sl;
        if (sl->h == h && memcmp(s->hist + sl->pos, kt, (size_t)n * sizeof *kt) == 0) return sl;
    }
}

/* Makes room so that `extra` more entries keep the load at or below 1/2. */
static ag_status tab_reserve(ng_table *t, int32_t extra) {
    uint64_t need = ((uint64_t)t->count + (uint64_t)extra) * 2;
    uint64_t cap = t->slot ? (uint64_t)t->mask + 1 : 0;
    if (need <= cap) return AG_OK;
    uint64_t ncap = cap ? cap * 2 : 64;
    while (ncap < need) ncap *= 2;
    if (ncap > ((uint64_t)1 << 31)) return ag_errorf(AG_ERR_NOMEM, "ngram: index table of %llu slots", (unsigned long long)ncap);
    ng_slot *ns = malloc((size_t)ncap * sizeof *ns);
    if (!ns) return ag_errorf(AG_ERR_NOMEM, "ngram: out of memory growing the index to %llu slots", (unsigned long long)ncap);
    memset(ns, 0xff, (size_t)ncap * sizeof *ns); /* pos = -1 everywhere */
    uint32_t nmask = (uint32_t)(ncap - 1);
    for (uint64_t j = 0; j < cap; j++) {
        ng_slot o = t->slot[j];
        if (o.pos < 0) continue;
        uint32_t i = o.h & nmask;
        while (ns[i].pos >= 0) i = (i + 1) & nmask;
        ns[i] = o;
    }
    free(t->slot);
    t->slot = ns;
    t->mask = nmask;
    return AG_OK;
}

/* Makes room for `extra` more history tokens: the history, the chains and
 * every table. On failure the history is unchanged (some parts may have
 * grown, which is harmless). */
static ag_status reserve(ngram *s, int64_t extra) {
    int64_t need = (int64_t)s->len + extra;
    if (need > NGRAM_MAX_HISTORY)
        return ag_errorf(AG_ERR_RANGE, "ngram: history of %lld tokens exceeds the limit of %d", (long long)need,
                         NGRAM_MAX_HISTORY);
    if (need > s->cap) {
        int64_t ncap = s->cap ? (int64_t)s->cap * 2 : 256;
        while (ncap < need) ncap *= 2;
        if (ncap > NGRAM_MAX_HISTORY) ncap = NGRAM_MAX_HISTORY;
        int32_t *h = realloc(s->hist, (size_t)ncap * sizeof *h);
        if (!h) return ag_errorf(AG_ERR_NOMEM, "ngram: out of memory for a history of %lld tokens", (long long)ncap);
        s->hist = h;
        int32_t *pv = realloc(s->prev, (size_t)ncap * (size_t)s->nn * sizeof *pv);
        if (!pv) return ag_errorf(AG_ERR_NOMEM, "ngram: out of memory for the index of %lld tokens", (long long)ncap);
        s->prev = pv;
        s->cap = (int32_t)ncap;
    }
    for (int k = 0; k < s->nn; k++) {
        ag_status st = tab_reserve(&s->tab[k], (int32_t)extra);
        if (st != AG_OK) return st;
    }
    return AG_OK;
}

/* Appends one token and indexes every n-gram it completes. Room must have
 * been reserved. */
static void append(ngram *s, int32_t tok) {
    int32_t i = s->len;
    s->hist[s->len++] = tok;
    for (int k = 0; k < s->nn; k++) {
        int n = s->n_min + k;
        if (i < n) break; /* longer n-grams do not fit either */
        int32_t p = i - n;
        uint32_t h = gram_hash(s->hist + p, n);
        ng_table *t = &s->tab[k];
        ng_slot *sl = tab_find(s, t, p, n, h);
        if (sl->pos >= 0) {
            s->prev[(size_t)p * s->nn + k] = sl->pos;
        } else {
            s->prev[(size_t)p * s->nn + k] = -1;
            sl->h = h;
            t->count++;
        }
        sl->pos = p;
    }
}

static int vote_cmp(const void *a, const void *b) {
    const ng_vote *x = a, *y = b;
    if (x->tok != y->tok) return x->tok < y->tok ? -1 : 1;
    return x->pos > y->pos ? -1 : x->pos < y->pos; /* latest first */
}

static ag_status ng_prefill(ag_draft_source *src, const int32_t *prompt, int n) {
    ngram *s = (ngram *)src;
    s->len = 0;
    s->last_d = 0;
    for (int k = 0; k < s->nn; k++) {
        ng_table *t = &s->tab[k];
        if (t->slot) memset(t->slot, 0xff, ((size_t)t->mask + 1) * sizeof *t->slot);
        t->count = 0;
    }
    if (n < 0 || (n > 0 && !prompt)) return ag_errorf(AG_ERR_INVALID, "ngram: prefill with %d tokens at %p", n, (const void *)prompt);
    ag_status st = reserve(s, n);
    if (st != AG_OK) return st;
    for (int i = 0; i < n; i++) append(s, prompt[i]);
    return AG_OK;
}

static int ng_draft(ag_draft_source *src, const int32_t *feed, int n_feed, int max, int32_t *out, float *probs) {
    (void)probs; /* deterministic: q is one-hot on the guess (draft.h) */
    ngram *s = (ngram *)src;
    s->last_d = 0;
    s->last_n = 0;
    if (n_feed < 0 || (n_feed > 0 && !feed) || max < 0 || (max > 0 && !out)) {
        ag_errorf(AG_ERR_INVALID, "ngram: draft with n_feed %d (feed %p), max %d (out %p)", n_feed, (const void *)feed,
                  max, (void *)out);
        return -1;
    }
    /* A proposal is copied from the history, so it never exceeds it. */
    int64_t after = (int64_t)s->len + n_feed;
    int32_t room = (int32_t)(max < after ? max : after);
    if (reserve(s, (int64_t)n_feed + room) != AG_OK) return -1;
    if (room > s->prop_cap) {
        int32_t *pr = realloc(s->prop, (size_t)room * sizeof *pr);
        if (!pr) {
            ag_errorf(AG_ERR_NOMEM, "ngram: out of memory for a proposal of %d tokens", room);
            return -1;
        }
        s->prop = pr;
        s->prop_cap = room;
    }
    for (int i = 0; i < n_feed; i++) append(s, feed[i]);
    if (room == 0) return 0;

    const int32_t L = s->len;
    for (int n = s->n_max; n >= s->n_min; n--) {
        if (L - n < 1) continue; /* no room for an earlier occurrence */
        int k = n - s->n_min;
        uint32_t h = gram_hash(s->hist + L - n, n);
        ng_slot *sl = tab_find(s, &s->tab[k], L - n, n, h);
        if (sl->pos < 0) continue;

        int m = 0;
        for (int32_t q = sl->pos; q >= 0 && m < s->cand; q = s->prev[(size_t)q * s->nn + k])
            s->vote[m++] = (ng_vote){.tok = s->hist[q + n], .pos = q};
        if (m > 1) qsort(s->vote, (size_t)m, sizeof *s->vote, vote_cmp);
        int32_t best = -1, best_cnt = 0;
        for (int i = 0; i < m;) {
            int j = i;
            while (j < m && s->vote[j].tok == s->vote[i].tok) j++;
            int32_t cnt = j - i, pos = s->vote[i].pos; /* the group's latest */
            if (cnt > best_cnt || (cnt == best_cnt && pos > best)) best = pos, best_cnt = cnt;
            i = j;
        }

        int32_t from = best + n;
        int32_t d = L - from < room ? L - from : room;
        memcpy(out, s->hist + from, (size_t)d * sizeof *out);
        memcpy(s->prop, s->hist + from, (size_t)d * sizeof *out);
        s->last_d = d;
        s->last_n = n;
        return d;
    }
    return 0;
}

int ag_ngram_last_match(const ag_draft_source *src) {
    return src && src->ops->draft == ng_draft ? ((const ngram *)src)->last_n : 0;
}

static void ng_commit(ag_draft_source *src, int d, int k) {
    ngram *s = (ngram *)src;
    /* Only tokens that were proposed can be accepted; a mismatched d is a
     * caller bug, and clamping keeps the history a prefix of the truth. */
    if (k > d) k = d;
    if (k > s->last_d) k = s->last_d;
    for (int i = 0; i < k; i++) append(s, s->prop[i]); /* room reserved by draft */
    s->last_d = 0;
}

static size_t ng_resident_bytes(const ag_draft_source *src) {
    const ngram *s = (const ngram *)src;
    size_t b = sizeof *s + (size_t)s->cap * sizeof *s->hist + (size_t)s->cap * (size_t)s->nn * sizeof *s->prev +
               (size_t)s->nn * sizeof *s->tab + (size_t)s->prop_cap * sizeof *s->prop +
               (size_t)s->cand * sizeof *s->vote;
    for (int k = 0; k < s->nn; k++)
        if (s->tab[k].slot) b += ((size_t)s->tab[k].mask + 1) * sizeof(ng_slot);
    return b;
}

size_t ag_ngram_plan_bytes(const ag_ngram_params *p, int32_t n_tokens, int max_draft) {
    size_t nn = (size_t)(p->n_max - p->n_min + 1), cap = 256, slots = 64;
    while ((int64_t)cap < n_tokens && cap < NGRAM_MAX_HISTORY) cap *= 2; /* reserve() */
    if (cap > NGRAM_MAX_HISTORY) cap = NGRAM_MAX_HISTORY;
    while (slots < 2 * (size_t)n_tokens) slots *= 2; /* tab_reserve(): load <= 1/2, one n-gram per token at most */
    return sizeof(ngram) + cap * sizeof(int32_t) + cap * nn * sizeof(int32_t) + nn * sizeof(ng_table) +
           nn * slots * sizeof(ng_slot) + (size_t)max_draft * sizeof(int32_t) +
           (size_t)p->max_candidates * sizeof(ng_vote);
}

static void ng_free(ag_draft_source *src) {
    ngram *s = (ngram *)src;
    if (!s) return;
    if (s->tab)
        for (int k = 0; k < s->nn; k++) free(s->tab[k].slot);
    free(s->tab);
    free(s->hist);
    free(s->prev);
    free(s->prop);
    free(s->vote);
    free(s);
}

static const ag_draft_ops ngram_ops = {
    .prefill = ng_prefill,
    .draft = ng_draft,
    .commit = ng_commit,
    .resident_bytes = ng_resident_bytes,
    .free = ng_free,
};

ag_status ag_draft_ngram_new(const ag_ngram_params *p, ag_draft_source **out) {
    if (!out) return ag_errorf(AG_ERR_INVALID, "ngram: NULL output pointer");
    *out = NULL;
    ag_ngram_params d = ag_ngram_default_params();
    if (!p) p = &d;
    if (p->n_min < 1 || p->n_min > AG_NGRAM_N_LIMIT)
        return ag_errorf(AG_ERR_RANGE, "ngram: n_min %d is out of range [1, %d]", p->n_min, AG_NGRAM_N_LIMIT);
    if (p->n_max < p->n_min || p->n_max > AG_NGRAM_N_LIMIT)
        return ag_errorf(AG_ERR_RANGE, "ngram: n_max %d is out of range [n_min = %d, %d]", p->n_max, p->n_min,
                         AG_NGRAM_N_LIMIT);
    if (p->max_candidates < 1 || p->max_candidates > AG_NGRAM_CANDIDATES_LIMIT)
        return ag_errorf(AG_ERR_RANGE, "ngram: max_candidates %d is out of range [1, %d]", p->max_candidates,
                         AG_NGRAM_CANDIDATES_LIMIT);

    ngram *s = calloc(1, sizeof *s);
    if (!s) return ag_errorf(AG_ERR_NOMEM, "ngram: out of memory for the source");
    s->base.ops = &ngram_ops;
    s->base.name = "ngram";
    s->base.stochastic = false;
    s->base.cost_per_token = 0.0f;
    s->n_min = p->n_min;
    s->n_max = p->n_max;
    s->nn = p->n_max - p->n_min + 1;
    s->cand = p->max_candidates;
    s->tab = calloc((size_t)s->nn, sizeof *s->tab);
    s->vote = malloc((size_t)s->cand * sizeof *s->vote);
    if (!s->tab || !s->vote) {
        ng_free(&s->base);
        return ag_errorf(AG_ERR_NOMEM, "ngram: out of memory for the source");
    }
    *out = &s->base;
    return AG_OK;
}
