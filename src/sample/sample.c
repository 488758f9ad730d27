/* The sampling chain, penalty history, RNG and the speculative verify rule.
 * See sample.h for the chain order and the logprob semantics. */
#include "sample/sample.h"

#include <float.h>
#include <stdbool.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "base/argmax.h"

struct ag_sampler {
    ag_sample_params p; /* p.logit_bias is NULL: the bias is kept as edits */
    /* the bias as edits: one per token id, ids ascending, a token's biases
     * summed in order (AG_EDIT_BAN if any was <= -100) */
    ag_logit_edit   *bias_ed;
    int32_t          n_bias_ed;
    /* ag_sampler_take_edited_rows: rows and candidates come with steps 1-2
     * applied by whoever computed them (ag_sampler_row_edits) */
    int              edited_rows;
    int32_t          n_vocab;
    uint64_t         stream;
    uint64_t         rng[4];

    ag_cand *cand; /* [n_vocab] scratch, rebuilt on every call: processed
                      logits and their ids (ag_cand, base/argmax.h), which
                      the chain's selection moves around freely */

    /* Per-call results of prepare(). */
    float   max_l;
    int32_t argmax;
    int32_t n_finite;
    double  sumexp; /* sum over finite tokens of exp(l - max_l), if asked for */
    float   inv_temp;
    double  bucket_mass[2048]; /* top-p histogram (TOPP_BUCKETS) */

    /* Penalty history: every accepted token (for rewind) and the counts of
     * those inside the window, in an open-addressing table (a dense count
     * array would cost 4 bytes * n_vocab per sequence). Keys are never
     * deleted; a count can drop to 0. */
    int32_t *hist;
    size_t   n_hist, cap_hist;
    int32_t *hkey; /* -1 = empty slot */
    int32_t *hval;
    size_t   hcap, hused;
};

/* ---- RNG: xoshiro256** seeded through splitmix64 ---------------------- */

static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

static uint64_t rng_next(uint64_t s[4]) {
    uint64_t r = rotl(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return r;
}

/* Uniform in [0, 1) with 53 random bits. */
static double rng_uniform(uint64_t s[4]) { return (double)(rng_next(s) >> 11) * 0x1.0p-53; }

static void rng_seed(uint64_t s[4], uint64_t seed, uint64_t stream) {
    /* Both inputs go through the mixer so that (seed, stream) pairs that
     * differ in one bit still start far apart. */
    uint64_t a = stream + 0x632BE59BD9B4E019ull;
    uint64_t x = seed ^ splitmix64(&a);
    for (int i = 0; i < 4; i++) s[i] = splitmix64(&x);
}

/* ---- params --------------------------------------------------------- */

ag_sample_params ag_sample_default_params(void) {
    ag_sample_params p;
    memset(&p, 0, sizeof p);
    p.temperature = 1.0f;
    p.top_k = 0;
    p.top_p = 1.0f;
    p.min_p = 0.0f;
    p.repetition_penalty = 1.0f;
    p.presence_penalty = 0.0f;
    p.frequency_penalty = 0.0f;
    p.penalty_last_n = -1;
    p.logit_bias = NULL;
    p.n_logit_bias = 0;
    p.seed = 0;
    p.logprobs = 0;
    p.n_logprobs = 0;
    return p;
}

ag_status ag_sample_params_check(const ag_sample_params *p, int32_t n_vocab) {
    if (!p) return ag_errorf(AG_ERR_INVALID, "sample params: NULL");
    if (n_vocab < 1) return ag_errorf(AG_ERR_RANGE, "sample params: n_vocab %d < 1", (int)n_vocab);
    if (!(p->temperature >= 0.0f) || !isfinite(p->temperature))
        return ag_errorf(AG_ERR_RANGE, "sample params: temperature %g must be finite and >= 0",
                         (double)p->temperature);
    if (p->top_k < 0) return ag_errorf(AG_ERR_RANGE, "sample params: top_k %d < 0", (int)p->top_k);
    if (!(p->top_p >= 0.0f && p->top_p <= 1.0f))
        return ag_errorf(AG_ERR_RANGE, "sample params: top_p %g not in [0, 1]", (double)p->top_p);
    if (!(p->min_p >= 0.0f && p->min_p <= 1.0f))
        return ag_errorf(AG_ERR_RANGE, "sample params: min_p %g not in [0, 1]", (double)p->min_p);
    if (!(p->repetition_penalty > 0.0f) || !isfinite(p->repetition_penalty))
        return ag_errorf(AG_ERR_RANGE, "sample params: repetition_penalty %g must be finite and > 0",
                         (double)p->repetition_penalty);
    if (!isfinite(p->presence_penalty))
        return ag_errorf(AG_ERR_RANGE, "sample params: presence_penalty must be finite");
    if (!isfinite(p->frequency_penalty))
        return ag_errorf(AG_ERR_RANGE, "sample params: frequency_penalty must be finite");
    if (p->penalty_last_n < -1)
        return ag_errorf(AG_ERR_RANGE, "sample params: penalty_last_n %d < -1", (int)p->penalty_last_n);
    if (p->n_logprobs < 0 || p->n_logprobs > AG_SAMPLE_MAX_LOGPROBS)
        return ag_errorf(AG_ERR_RANGE, "sample params: n_logprobs %d not in [0, %d]",
                         (int)p->n_logprobs, AG_SAMPLE_MAX_LOGPROBS);
    if (p->n_logit_bias < 0)
        return ag_errorf(AG_ERR_RANGE, "sample params: n_logit_bias %d < 0", (int)p->n_logit_bias);
    if (p->n_logit_bias > 0 && !p->logit_bias)
        return ag_errorf(AG_ERR_INVALID, "sample params: logit_bias is NULL with n_logit_bias %d",
                         (int)p->n_logit_bias);
    for (int32_t i = 0; i < p->n_logit_bias; i++) {
        const ag_logit_bias *b = &p->logit_bias[i];
        if (b->token < 0 || b->token >= n_vocab)
            return ag_errorf(AG_ERR_RANGE, "sample params: logit_bias[%d] token %d not in [0, %d)",
                             (int)i, (int)b->token, (int)n_vocab);
        if (isnan(b->bias))
            return ag_errorf(AG_ERR_RANGE, "sample params: logit_bias[%d] is NaN", (int)i);
    }
    return AG_OK;
}

/* ---- lifetime ------------------------------------------------------- */

typedef struct {
    int32_t token, order;
    float   bias;
} bias_entry;

static int cmp_bias_entry(const void *pa, const void *pb) {
    const bias_entry *a = pa, *b = pb;
    if (a->token != b->token) return (a->token > b->token) - (a->token < b->token);
    return (a->order > b->order) - (a->order < b->order);
}

/* The n biases b[] as one edit per token into out[], ids ascending, a
 * token's biases summed in the order given; returns their count, or -1
 * when out of memory. */
static int32_t merge_bias(const ag_logit_bias *b, int32_t n, ag_logit_edit *out) {
    bias_entry *e = malloc((size_t)n * sizeof *e);
    if (!e) return -1;
    for (int32_t i = 0; i < n; i++) e[i] = (bias_entry){b[i].token, i, b[i].bias};
    qsort(e, (size_t)n, sizeof *e, cmp_bias_entry);
    int32_t m = 0;
    for (int32_t i = 0; i < n; i++) {
        const bool first = m == 0 || out[m - 1].id != e[i].token;
        if (first) out[m++] = (ag_logit_edit){.id = e[i].token, .flags = AG_EDIT_BIAS, .bias = 0.0f, .rep = 1.0f};
        if (e[i].bias <= -100.0f) out[m - 1].flags |= AG_EDIT_BAN;
        else out[m - 1].bias = first ? e[i].bias : out[m - 1].bias + e[i].bias;
    }
    free(e);
    return m;
}

ag_status ag_sampler_new(const ag_sample_params *params, int32_t n_vocab, uint64_t stream,
                         ag_sampler **out) {
    if (!out) return ag_errorf(AG_ERR_INVALID, "ag_sampler_new: out is NULL");
    *out = NULL;
    ag_status st = ag_sample_params_check(params, n_vocab);
    if (st != AG_OK) return st;
    ag_sampler *s = calloc(1, sizeof *s);
    if (!s) return ag_errorf(AG_ERR_NOMEM, "ag_sampler_new: out of memory");
    s->p = *params;
    s->n_vocab = n_vocab;
    s->stream = stream;
    s->cand = malloc((size_t)n_vocab * sizeof *s->cand);
    if (params->n_logit_bias > 0) {
        s->bias_ed = malloc((size_t)params->n_logit_bias * sizeof *s->bias_ed);
        s->n_bias_ed = s->bias_ed ? merge_bias(params->logit_bias, params->n_logit_bias, s->bias_ed) : -1;
    }
    if (!s->cand || s->n_bias_ed < 0) {
        ag_sampler_free(s);
        return ag_errorf(AG_ERR_NOMEM, "ag_sampler_new: out of memory for a %d-token vocab",
                         (int)n_vocab);
    }
    s->p.logit_bias = NULL; /* (borrowed by params only during the call) */
    s->inv_temp = s->p.temperature > 0.0f ? 1.0f / s->p.temperature : 0.0f;
    rng_seed(s->rng, s->p.seed, stream);
    *out = s;
    return AG_OK;
}

void ag_sampler_free(ag_sampler *s) {
    if (!s) return;
    free(s->cand);
    free(s->bias_ed);
    free(s->hist);
    free(s->hkey);
    free(s->hval);
    free(s);
}

void ag_sampler_reset(ag_sampler *s) {
    if (!s) return;
    s->n_hist = 0;
    if (s->hkey) memset(s->hkey, 0xFF, s->hcap * sizeof *s->hkey);
    s->hused = 0;
    rng_seed(s->rng, s->p.seed, s->stream);
}

int ag_sampler_greedy(const ag_sampler *s) { return s && s->p.temperature == 0.0f; }

size_t ag_sampler_n_accepted(const ag_sampler *s) { return s ? s->n_hist : 0; }

/* The capacity a table grown by doubling from `first` reaches for n items. */
static size_t doubled_cap(size_t first, size_t n) {
    size_t cap = first;
    while (cap < n) cap *= 2;
    return cap;
}

size_t ag_sampler_bytes(int32_t n_vocab, size_t n_accepted) {
    size_t hist = n_accepted ? doubled_cap(256, n_accepted) * sizeof(int32_t) : 0;
    /* counts: at most one key per accepted token, at load <= 1/2 (hgrow) */
    size_t counts = n_accepted ? doubled_cap(64, 2 * n_accepted) * 2 * sizeof(int32_t) : 0;
    return sizeof(struct ag_sampler) + (size_t)n_vocab * sizeof(ag_cand) + hist + counts;
}

/* ---- penalty history ------------------------------------------------- */

static int penalties_active(const ag_sampler *s) {
    return s->p.penalty_last_n != 0 &&
           (s->p.repetition_penalty != 1.0f || s->p.presence_penalty != 0.0f ||
            s->p.frequency_penalty != 0.0f);
}

static size_t hslot(int32_t t, size_t cap) {
    return (size_t)(((uint32_t)t * 2654435761u) & (uint32_t)(cap - 1));
}

static ag_status hgrow(ag_sampler *s) {
    size_t ncap = s->hcap ? s->hcap * 2 : 64;
    int32_t *k = malloc(ncap * sizeof *k), *v = malloc(ncap * sizeof *v);
    if (!k || !v) {
        free(k);
        free(v);
        return ag_errorf(AG_ERR_NOMEM, "sampler: out of memory for the penalty history");
    }
    memset(k, 0xFF, ncap * sizeof *k);
    for (size_t i = 0; i < s->hcap; i++) {
        if (s->hkey[i] < 0) continue;
        size_t j = hslot(s->hkey[i], ncap);
        while (k[j] >= 0) j = (j + 1) & (ncap - 1);
        k[j] = s->hkey[i];
        v[j] = s->hval[i];
    }
    free(s->hkey);
    free(s->hval);
    s->hkey = k;
    s->hval = v;
    s->hcap = ncap;
    return AG_OK;
}

/* Adds d (+1 / -1) to the window count of t. Only +1 can insert, and the
 * caller reserves room first, so this cannot fail. */
static void hadd(ag_sampler *s, int32_t t, int32_t d) {
    size_t j = hslot(t, s->hcap);
    while (s->hkey[j] >= 0 && s->hkey[j] != t) j = (j + 1) & (s->hcap - 1);
    if (s->hkey[j] < 0) {
        s->hkey[j] = t;
        s->hval[j] = 0;
        s->hused++;
    }
    s->hval[j] += d;
}

ag_status ag_sampler_accept(ag_sampler *s, int32_t token) {
    if (!s) return ag_errorf(AG_ERR_INVALID, "ag_sampler_accept: NULL sampler");
    if (token < 0 || token >= s->n_vocab)
        return ag_errorf(AG_ERR_RANGE, "ag_sampler_accept: token %d not in [0, %d)", (int)token,
                         (int)s->n_vocab);
    if (s->n_hist == s->cap_hist) {
        size_t ncap = s->cap_hist ? s->cap_hist * 2 : 256;
        int32_t *h = realloc(s->hist, ncap * sizeof *h);
        if (!h) return ag_errorf(AG_ERR_NOMEM, "ag_sampler_accept: out of memory");
        s->hist = h;
        s->cap_hist = ncap;
    }
    /* Keep the load factor <= 1/2 so probes stay short; reserve before
     * touching anything so a failure leaves the state unchanged. */
    if ((s->hused + 1) * 2 > s->hcap) {
        ag_status st = hgrow(s);
        if (st != AG_OK) return st;
    }
    s->hist[s->n_hist++] = token;
    hadd(s, token, +1);
    size_t w = (size_t)s->p.penalty_last_n;
    if (s->p.penalty_last_n > 0 && s->n_hist > w) hadd(s, s->hist[s->n_hist - 1 - w], -1);
    return AG_OK;
}

ag_status ag_sampler_rewind(ag_sampler *s, size_t n) {
    if (!s) return ag_errorf(AG_ERR_INVALID, "ag_sampler_rewind: NULL sampler");
    if (n > s->n_hist)
        return ag_errorf(AG_ERR_RANGE, "ag_sampler_rewind: %zu tokens, history has %zu", n, s->n_hist);
    size_t w = (size_t)s->p.penalty_last_n;
    for (size_t i = 0; i < n; i++) {
        /* Undo accept() exactly: the token leaves the window and the one
         * that had slid out of it comes back (its key is still present). */
        if (s->p.penalty_last_n > 0 && s->n_hist > w) hadd(s, s->hist[s->n_hist - 1 - w], +1);
        hadd(s, s->hist[s->n_hist - 1], -1);
        s->n_hist--;
    }
    return AG_OK;
}

/* ---- chain steps 1-2 and per-call statistics ------------------------- */

/* The window count of t (0 when it has none). */
static int32_t hget(const ag_sampler *s, int32_t t) {
    if (!s->hcap) return 0;
    for (size_t j = hslot(t, s->hcap); s->hkey[j] >= 0; j = (j + 1) & (s->hcap - 1))
        if (s->hkey[j] == t) return s->hval[j];
    return 0;
}

static int cmp_edit_id(const void *pa, const void *pb) {
    const ag_logit_edit *a = pa, *b = pb;
    return (a->id > b->id) - (a->id < b->id);
}

/* Whether steps 1-2 are the sampler's to apply (it has bias or penalties
 * and its rows do not come edited). */
static int mods_on(const ag_sampler *s) {
    return !s->edited_rows && (s->n_bias_ed > 0 || penalties_active(s));
}

/* Where visit_edits puts each edit: into out[], or applied to cand[] from
 * the raw logits. */
typedef struct {
    ag_logit_edit *out;
    ag_cand       *cand;
    const float   *logits;
    size_t         n;
} edit_sink;

static void put_edit(edit_sink *k, const ag_logit_edit *e) {
    if (k->out) k->out[k->n] = *e;
    else k->cand[e->id].l = ag_logit_edit_apply(k->logits[e->id], e);
    k->n++;
}

/* Every token steps 1-2 change for the current history, one edit each:
 * the biased tokens (ids ascending, with their penalty step if they are in
 * the window), then the window's other tokens (in table order). */
static void visit_edits(const ag_sampler *s, edit_sink *k) {
    const int   pen = penalties_active(s);
    const float rep = s->p.repetition_penalty, pres = s->p.presence_penalty, freq = s->p.frequency_penalty;
    for (int32_t i = 0; i < s->n_bias_ed; i++) {
        ag_logit_edit e = s->bias_ed[i];
        const int32_t cnt = pen ? hget(s, e.id) : 0;
        if (cnt > 0) e.flags |= AG_EDIT_PENALTY, e.rep = rep, e.sub = (float)cnt * freq + pres;
        put_edit(k, &e);
    }
    for (size_t j = 0; pen && j < s->hcap; j++) {
        const int32_t t = s->hkey[j], cnt = s->hval[j];
        if (t < 0 || cnt <= 0) continue;
        const ag_logit_edit key = {.id = t};
        if (s->n_bias_ed > 0 && bsearch(&key, s->bias_ed, (size_t)s->n_bias_ed, sizeof key, cmp_edit_id)) continue;
        const ag_logit_edit e = {.id = t, .flags = AG_EDIT_PENALTY, .bias = 0.0f, .rep = rep,
                                 .sub = (float)cnt * freq + pres};
        put_edit(k, &e);
    }
}

int ag_sampler_has_edits(const ag_sampler *s) { return s && (s->n_bias_ed > 0 || penalties_active(s)); }

size_t ag_sampler_max_edits(const ag_sampler *s) {
    return s ? (size_t)s->n_bias_ed + (penalties_active(s) ? s->hused : 0) : 0;
}

size_t ag_sampler_row_edits(const ag_sampler *s, ag_logit_edit *out) {
    if (!s || !out) return 0;
    edit_sink k = {.out = out};
    visit_edits(s, &k);
    return k.n;
}

void ag_sampler_take_edited_rows(ag_sampler *s) {
    if (s) s->edited_rows = 1;
}

/* Fills cand[] in id order with the processed logits and computes max,
 * argmax, the count of finite logits and (if want_z) sumexp. */
static ag_status prepare(ag_sampler *s, const float *logits, int want_z) {
    if (!logits) return ag_errorf(AG_ERR_INVALID, "sampler: logits is NULL");
    const int32_t n = s->n_vocab;
    ag_cand *c = s->cand;
    const int mods = mods_on(s);
    /* The strict '>' keeps the lowest id among equal maxima. Without
     * bias or penalties the max comes out of the copy pass itself. */
    float m = -INFINITY;
    int32_t am = -1, nf = 0;
    if (!mods) {
        for (int32_t i = 0; i < n; i++) {
            float l = ag_logit_sanitize(logits[i]);
            c[i].l = l;
            c[i].id = i;
            nf += l != -INFINITY;
            if (l > m) {
                m = l;
                am = i;
            }
        }
    } else {
        for (int32_t i = 0; i < n; i++) {
            c[i].l = ag_logit_sanitize(logits[i]);
            c[i].id = i;
        }
        /* the edits a device would apply, with the same arithmetic */
        edit_sink k = {.cand = c, .logits = logits};
        visit_edits(s, &k);
        for (int32_t i = 0; i < n; i++) {
            float l = c[i].l;
            nf += l != -INFINITY;
            if (l > m) {
                m = l;
                am = i;
            }
        }
    }
    if (nf == 0) return ag_errorf(AG_ERR_INVALID, "sampler: no token has a finite logit");
    /* float exp, double sum: ~1e-7 relative, plenty for float logprobs,
     * at a fraction of the cost of double exp over 150k tokens. */
    double sum = 0.0;
    if (want_z)
        for (int32_t i = 0; i < n; i++) sum += (double)expf(c[i].l - m);
    s->max_l = m;
    s->argmax = am;
    s->n_finite = nf;
    s->sumexp = sum;
    return AG_OK;
}

static double logprob_of(const ag_sampler *s, float l) {
    if (l == -INFINITY) return -INFINITY;
    return (double)l - (double)s->max_l - log(s->sumexp);
}

/* Top n_logprobs alternatives; cand[] must still be in id order. */
static void fill_top(const ag_sampler *s, ag_sample_result *out) {
    int32_t k = s->p.n_logprobs;
    if (k > s->n_finite) k = s->n_finite;
    int32_t have = 0;
    ag_cand best[AG_SAMPLE_MAX_LOGPROBS];
    for (int32_t i = 0; i < s->n_vocab && k > 0; i++) {
        ag_cand c = s->cand[i];
        if (c.l == -INFINITY) continue;
        /* Ids arrive ascending, so a tie never displaces an earlier entry. */
        if (have == k && !(c.l > best[k - 1].l)) continue;
        int32_t j = have < k ? have++ : k - 1;
        while (j > 0 && c.l > best[j - 1].l) {
            best[j] = best[j - 1];
            j--;
        }
        best[j] = c;
    }
    out->n_top = have;
    for (int32_t i = 0; i < have; i++) {
        out->top[i].token = best[i].id;
        out->top[i].logprob = (float)logprob_of(s, best[i].l);
    }
}

/* ---- chain steps 4-6: selection -------------------------------------- */

/* The total order every filter uses: logit descending, then id ascending. */
static inline int better(ag_cand a, ag_cand b) { return ag_cand_better(a, b); }

/* Whether top-k truncates (below the vocab). */
static inline int top_k_on(const ag_sampler *s) { return s->p.top_k > 0 && s->p.top_k < s->n_vocab; }

static inline void swapc(ag_cand *a, ag_cand *b) {
    ag_cand t = *a;
    *a = *b;
    *b = t;
}

static void sift_down(ag_cand *h, size_t k, size_t i) {
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, w = i;
        if (l < k && better(h[w], h[l])) w = l;
        if (r < k && better(h[w], h[r])) w = r;
        if (w == i) return;
        swapc(&h[i], &h[w]);
        i = w;
    }
}

/* In-place heap selection of the k best of c[0..n): c[0..k) is a heap with
 * the worst kept token at the root; one pass over the
 * rest, most of which fails the single comparison with the root. For the
 * small k of typical top-k this beats quickselect's several passes. */
static void heap_select_best(ag_cand *c, size_t n, size_t k) {
    for (size_t i = k / 2; i-- > 0;) sift_down(c, k, i);
    for (size_t i = k; i < n; i++) {
        if (!better(c[i], c[0])) continue;
        swapc(&c[i], &c[0]);
        sift_down(c, k, 0);
    }
}

/* top-p over c[0..n) (the top-k set, or every finite token): returns the
 * length of the kept prefix, with the kept tokens moved to c[0..ret).
 *
 * Small sets are sorted outright. Large ones (top-k off on a 150k vocab)
 * use one pass that computes each weight once (their total z summed in the
 * array's order, id order when top-k is off: the sum of exponentials of
 * ag_cands) and histograms the mass by distance below the max logit. The
 * cut is first sought in the best TOPP_SORT_MAX tokens, sorted, with the
 * partial sums in order (prefix_cut): the very sums the candidates path
 * (ag_sampler_sample_cands) makes from a row's best candidates, so both
 * keep the same tokens. Past them, the bucket where the cumulative mass
 * crosses the target is the only part that needs sorting. Bucket indices
 * are monotone in the logit, so every token of a nearer bucket precedes
 * every token of the crossing bucket in the (logit desc, id asc) order. */
#define TOPP_SORT_MAX AG_CANDS_MAX
#define TOPP_BUCKETS 2048
#define TOPP_RANGE 32.0f /* logit units below the max; further is the last bucket */

static inline int topp_bucket(float m, float l) {
    float d = (m - l) * ((float)TOPP_BUCKETS / TOPP_RANGE);
    return d < (float)(TOPP_BUCKETS - 1) ? (int)d : TOPP_BUCKETS - 1;
}

/* The length of the shortest prefix of c[0..n) (sorted best first) whose
 * weights, summed in order, reach top_p * z; 0 when all n fall short. */
static size_t prefix_cut(const ag_sampler *s, const ag_cand *c, size_t n, double z) {
    const double target = (double)s->p.top_p * z;
    double       cum = 0.0;
    for (size_t i = 0; i < n; i++) {
        cum += (double)expf(c[i].l - s->max_l);
        if (cum >= target) return i + 1;
    }
    return 0;
}

static size_t top_p_cut(ag_sampler *s, ag_cand *c, size_t n) {
    const float m = s->max_l;
    const double top_p = (double)s->p.top_p;
    if (n <= TOPP_SORT_MAX) {
        qsort(c, n, sizeof *c, ag_cand_cmp);
        double z = 0.0;
        for (size_t i = 0; i < n; i++) z += (double)expf(c[i].l - m);
        const size_t cut = prefix_cut(s, c, n, z);
        return cut ? cut : n;
    }
    double *mass = s->bucket_mass;
    size_t  count[TOPP_BUCKETS] = {0};
    memset(mass, 0, TOPP_BUCKETS * sizeof *mass);
    double z = 0.0;
    for (size_t i = 0; i < n; i++) {
        const double w = (double)expf(c[i].l - m);
        const int    b = topp_bucket(m, c[i].l);
        mass[b] += w;
        count[b]++;
        z += w;
    }
    /* The best TOPP_SORT_MAX lie in the nearest buckets that hold as many;
     * unless those buckets' mass falls short of the target (with a margin
     * far above the sums' rounding), sort the best of them and seek the cut
     * there, as the candidates path does. */
    const double target = top_p * z;
    size_t       near_n = 0;
    double       near_mass = 0.0;
    int          b_near = 0;
    for (; b_near < TOPP_BUCKETS; b_near++) {
        near_n += count[b_near];
        near_mass += mass[b_near];
        if (near_n >= TOPP_SORT_MAX) break;
    }
    if (near_mass * (1.0 + 1e-9) >= target) {
        size_t g = 0;
        for (size_t i = 0; i < n; i++)
            if (topp_bucket(m, c[i].l) <= b_near) swapc(&c[i], &c[g++]);
        if (g > TOPP_SORT_MAX) {
            if (g <= 16 * TOPP_SORT_MAX) heap_select_best(c, g, TOPP_SORT_MAX);
            else ag_cand_select_best(c, g, TOPP_SORT_MAX);
        }
        qsort(c, TOPP_SORT_MAX, sizeof *c, ag_cand_cmp);
        const size_t cut = prefix_cut(s, c, TOPP_SORT_MAX, z);
        if (cut) return cut;
    }
    double cum = 0.0;
    int cross = TOPP_BUCKETS - 1;
    for (int b = 0; b < TOPP_BUCKETS; b++) {
        if (cum + mass[b] >= target) {
            cross = b;
            break;
        }
        cum += mass[b];
    }
    /* Nearer buckets to the front, then the crossing bucket, sorted. */
    size_t a = 0;
    for (size_t i = 0; i < n; i++)
        if (topp_bucket(m, c[i].l) < cross) swapc(&c[i], &c[a++]);
    size_t e = a;
    for (size_t i = a; i < n; i++)
        if (topp_bucket(m, c[i].l) == cross) swapc(&c[i], &c[e++]);
    qsort(c + a, e - a, sizeof *c, ag_cand_cmp);
    for (size_t i = a; i < e; i++) {
        cum += (double)expf(c[i].l - m);
        if (cum >= target) return i + 1;
    }
    return e; /* rounding kept the mass just short: keep the whole bucket */
}

/* Steps 4-6 for temperature > 0 over cand[0..n), the finite candidates
 * (top_p_done: n is already the top-p cut, made from a row's candidates):
 * leaves the kept tokens in cand[0..ret) and sets *by_id to whether they
 * are still in ascending id order. */
static size_t truncate_cands(ag_sampler *s, size_t n, int *by_id, int top_p_done) {
    ag_cand *c = s->cand;
    if (s->p.top_k > 0 && (size_t)s->p.top_k < n) {
        if (s->p.top_k <= 1024) heap_select_best(c, n, (size_t)s->p.top_k);
        else ag_cand_select_best(c, n, (size_t)s->p.top_k);
        n = (size_t)s->p.top_k;
        *by_id = 0;
    }
    if (s->p.top_p < 1.0f && !top_p_done) {
        n = top_p_cut(s, c, n);
        *by_id = 0;
    }
    /* min-p keeps p / p_max >= min_p, a prefix of the order again (and keeps
     * the kept ones' relative order); the max itself always passes, so at
     * least one token stays. */
    if (s->p.min_p > 0.0f) {
        const double thr = log((double)s->p.min_p), m = s->max_l;
        size_t k = 0;
        for (size_t i = 0; i < n; i++)
            if ((double)c[i].l - m >= thr) swapc(&c[i], &c[k++]);
        n = k;
    }
    return n;
}

/* The finite candidates of a prepared cand[] moved to its front, in id
 * order (-inf never survives); returns their count. */
static size_t finite_front(ag_sampler *s) {
    ag_cand *c = s->cand;
    if (s->n_finite == s->n_vocab) return (size_t)s->n_vocab;
    size_t n = 0;
    for (int32_t i = 0; i < s->n_vocab; i++)
        if (c[i].l != -INFINITY) c[n++] = c[i];
    return n;
}

static int cmp_id(const void *pa, const void *pb) {
    int32_t a = ((const ag_cand *)pa)->id, b = ((const ag_cand *)pb)->id;
    return (a > b) - (a < b);
}

/* Puts the kept tokens cand[0..n) (distinct ids) in ascending id order. A
 * small set is sorted; a large one is placed by id within the vocab-sized
 * array (every slot past n marked free first) and compacted: O(n_vocab),
 * where a sort of a 100k-token set would cost several milliseconds. */
static void order_by_id(ag_sampler *s, size_t n) {
    ag_cand *c = s->cand;
    if (n <= 4096) {
        qsort(c, n, sizeof *c, cmp_id);
        return;
    }
    const size_t v = (size_t)s->n_vocab;
    for (size_t i = n; i < v; i++) c[i].id = -1;
    for (size_t i = 0; i < n; i++)
        while (c[i].id >= 0 && (size_t)c[i].id != i) swapc(&c[i], &c[c[i].id]);
    size_t k = 0;
    for (size_t i = 0; i < v; i++)
        if (c[i].id >= 0) c[k++] = c[i];
}

/* Steps 7-8 helper: the unnormalised weight of a kept candidate. */
static inline double weight(const ag_sampler *s, float l) {
    return (double)expf((l - s->max_l) * s->inv_temp);
}

/* Steps 3-7 on the finite candidates cand[0..n) (by_id, top_p_done as
 * for truncate_cands): the kept tokens go to cand[0..ret) in ascending id
 * order and *sum gets their weights' sum, added in that order. Every path
 * to a distribution (the draw, ag_sampler_probs, the candidates' versions)
 * goes through here, so each gives the others' bits. */
static size_t kept_by_id(ag_sampler *s, size_t n, int by_id, int top_p_done, double *sum) {
    n = truncate_cands(s, n, &by_id, top_p_done);
    if (!by_id) order_by_id(s, n);
    double z = 0.0;
    for (size_t i = 0; i < n; i++) z += weight(s, s->cand[i].l);
    *sum = z;
    return n;
}

/* ---- public sampling entry points ----------------------------------- */

static ag_status check_call(const ag_sampler *s, const void *a, const void *b, const char *fn) {
    if (!s) return ag_errorf(AG_ERR_INVALID, "%s: NULL sampler", fn);
    if (!a || !b) return ag_errorf(AG_ERR_INVALID, "%s: NULL argument", fn);
    return AG_OK;
}

/* Greedy without bias, penalties or logprobs: prepare's argmax (the lowest
 * id among the equal maxima of the sanitized logits) without filling the
 * candidate array, a pass over n_vocab floats that writes nothing (on a GPU
 * the sampler is a serial part of every step: ~0.2 ms of 128k candidates).
 * AG_ERR_INVALID when no logit is finite, as prepare. */
static ag_status greedy_argmax(const float *logits, int32_t n, int32_t *out) {
    const int32_t i = ag_argmax_f32(logits, n);
    if (i < 0) return ag_errorf(AG_ERR_INVALID, "sampler: no token has a finite logit");
    *out = i;
    return AG_OK;
}

int ag_sampler_argmax_only(const ag_sampler *s) {
    return s && s->p.temperature == 0.0f && !s->p.logprobs && s->p.n_logprobs <= 0 && !mods_on(s);
}

/* *out for a token found where the logits are (an argmax or a pick):
 * range-checked, a negative one meaning no finite logit, no logprob. */
static ag_status report_found(const ag_sampler *s, int32_t token, ag_sample_result *out, const char *fn) {
    if (token >= s->n_vocab) return ag_errorf(AG_ERR_INVALID, "%s: token %d out of range", fn, token);
    if (token < 0) return ag_errorf(AG_ERR_INVALID, "sampler: no token has a finite logit");
    memset(out, 0, sizeof *out);
    out->token = token;
    out->logprob = NAN;
    return AG_OK;
}

ag_status ag_sampler_sample_argmax(ag_sampler *s, int32_t argmax, ag_sample_result *out) {
    if (!s || !out) return ag_errorf(AG_ERR_INVALID, "ag_sampler_sample_argmax: NULL argument");
    if (!ag_sampler_argmax_only(s))
        return ag_errorf(AG_ERR_INVALID, "ag_sampler_sample_argmax: the sampler needs the whole row");
    return report_found(s, argmax, out, "ag_sampler_sample_argmax");
}

/* A temperature and nothing else in the chain (logprobs or not). */
static int temperature_only(const ag_sampler *s) {
    return s && s->p.temperature > 0.0f && (s->p.top_k <= 0 || s->p.top_k >= s->n_vocab) && s->p.top_p >= 1.0f &&
           s->p.min_p <= 0.0f && !mods_on(s);
}

int ag_sampler_pick_only(const ag_sampler *s) {
    return temperature_only(s) && !s->p.logprobs && s->p.n_logprobs <= 0;
}

int ag_sampler_pick_logprobs(const ag_sampler *s, ag_cands_req *req) {
    if (!temperature_only(s) || !(s->p.logprobs || s->p.n_logprobs > 0)) return 0;
    if (req) *req = (ag_cands_req){s->p.n_logprobs > 1 ? s->p.n_logprobs : 1, 1, AG_CANDS_AT_TOKEN};
    return 1;
}

ag_status ag_sampler_draw_pick(ag_sampler *s, ag_pick *out) {
    if (!s || !out) return ag_errorf(AG_ERR_INVALID, "ag_sampler_draw_pick: NULL argument");
    if (!temperature_only(s)) return ag_errorf(AG_ERR_INVALID, "ag_sampler_draw_pick: the sampler needs the whole row");
    out->u = rng_uniform(s->rng);
    out->inv_temp = s->inv_temp;
    return AG_OK;
}

ag_status ag_sampler_sample_picked(ag_sampler *s, int32_t token, ag_sample_result *out) {
    if (!s || !out) return ag_errorf(AG_ERR_INVALID, "ag_sampler_sample_picked: NULL argument");
    if (!ag_sampler_pick_only(s))
        return ag_errorf(AG_ERR_INVALID, "ag_sampler_sample_picked: the sampler needs the whole row");
    return report_found(s, token, out, "ag_sampler_sample_picked");
}

ag_status ag_sampler_sample_picked_cands(ag_sampler *s, int32_t token, const ag_cands *c, ag_sample_result *out) {
    if (!s || !c || !out) return ag_errorf(AG_ERR_INVALID, "ag_sampler_sample_picked_cands: NULL argument");
    if (!ag_sampler_pick_logprobs(s, NULL))
        return ag_errorf(AG_ERR_INVALID, "ag_sampler_sample_picked_cands: not a sampler with a temperature and logprobs");
    ag_status st = report_found(s, token, out, "ag_sampler_sample_picked_cands");
    return st ? st : ag_sampler_logprobs_cands(s, c, token, out);
}

ag_status ag_sampler_sample_drawn(ag_sampler *s, const float *logits, const ag_pick *d, ag_sample_result *out) {
    ag_status st = check_call(s, logits, out, "ag_sampler_sample_drawn");
    if (st != AG_OK) return st;
    if (!d) return ag_errorf(AG_ERR_INVALID, "ag_sampler_sample_drawn: NULL draw");
    return ag_sampler_sample_picked(s, ag_pick_f32(logits, s->n_vocab, d->inv_temp, d->u), out);
}

/* Steps 3-8 once prepare (or the candidates) set max_l, argmax, n_finite
 * and sumexp, with cand[0..n) the finite candidates (by_id: in id order;
 * top_p_done: n is already the top-p cut) and out's logprob alternatives
 * filled. The kept tokens are drawn in id
 * order, whatever order truncation left them in, so the token depends only
 * on the kept set (the candidates path gives the whole-row path's token). */
static ag_status decide_token(ag_sampler *s, size_t n, int by_id, int top_p_done, ag_sample_result *out) {
    const int want_lp = s->p.logprobs || s->p.n_logprobs > 0;
    out->logprob = NAN;
    if (s->p.temperature == 0.0f) {
        out->token = s->argmax;
        if (want_lp) out->logprob = (float)logprob_of(s, s->max_l);
        return AG_OK;
    }
    double sum;
    n = kept_by_id(s, n, by_id, top_p_done, &sum);
    /* The same weights recomputed in the same order: the scan reproduces the
     * sum's partial sums exactly. */
    double u = rng_uniform(s->rng) * sum, cum = 0.0;
    size_t pick = 0; /* always set below: the kept max has weight 1 */
    for (size_t i = 0; i < n; i++) {
        double w = weight(s, s->cand[i].l);
        if (w <= 0.0) continue;
        pick = i; /* if u rounded up to sum, the last token with mass */
        cum += w;
        if (u < cum) break;
    }
    out->token = s->cand[pick].id;
    if (want_lp) out->logprob = (float)logprob_of(s, s->cand[pick].l);
    return AG_OK;
}

ag_status ag_sampler_sample(ag_sampler *s, const float *logits, ag_sample_result *out) {
    ag_status st = check_call(s, logits, out, "ag_sampler_sample");
    if (st != AG_OK) return st;
    memset(out, 0, sizeof *out);
    const int want_lp = s->p.logprobs || s->p.n_logprobs > 0;
    if (ag_sampler_argmax_only(s)) {
        out->logprob = NAN;
        return greedy_argmax(logits, s->n_vocab, &out->token);
    }
    if ((st = prepare(s, logits, want_lp)) != AG_OK) return st;
    if (s->p.n_logprobs > 0) fill_top(s, out);
    return decide_token(s, s->p.temperature == 0.0f ? 0 : finite_front(s), 1, 0, out);
}

int ag_sampler_cands_req(const ag_sampler *s, ag_cands_req *req) {
    if (!s || mods_on(s)) return 0;
    const int want_lp = s->p.logprobs || s->p.n_logprobs > 0;
    int32_t   k;
    if (s->p.temperature == 0.0f) {
        if (!want_lp) return 0; /* the argmax is all it needs */
        k = 1;
    } else if (top_k_on(s)) {
        if (s->p.top_k > AG_CANDS_MAX) return 0;
        k = s->p.top_k;
    } else { /* top-k off: a top-p or min-p cut that may fall among the best */
        if (s->p.top_p >= 1.0f && s->p.min_p <= 0.0f) return 0;
        k = AG_CANDS_MAX;
    }
    if (s->p.n_logprobs > k) k = s->p.n_logprobs;
    /* top-k off and top-p: z, the whole row's mass */
    const int top_p_off_k = s->p.temperature > 0.0f && !top_k_on(s) && s->p.top_p < 1.0f;
    if (req) *req = (ag_cands_req){k, want_lp || top_p_off_k, -1};
    return 1;
}

/* Sets the sampler up as prepare would for the whole row, from its
 * candidates *c (n of them, checked by the caller): cand[0..n) best first,
 * max_l, argmax, n_finite and (want_z) sumexp. */
static void load_cands(ag_sampler *s, const ag_cands *c, int want_z) {
    memcpy(s->cand, c->c, sizeof *c->c * (size_t)c->n);
    s->max_l = c->max;
    s->argmax = c->c[0].id;
    s->n_finite = c->n_finite;
    s->sumexp = want_z ? c->sumexp : 0.0;
}

/* Whether a loaded row's candidates hold every token the sampler keeps:
 * always for top-k (req.k >= top_k) and greedy, and when they are all the
 * row's finite values; with top-k off, when the top-p cut (the same partial
 * sums as top_p_cut) or, without top-p, the min-p cut falls among them. The
 * tokens left to truncate go to cand[0..*n_kept); *top_p_done: the top-p cut
 * is among them already. */
static int cands_cut(ag_sampler *s, const ag_cands *c, size_t *n_kept, int *top_p_done) {
    size_t n = (size_t)c->n;
    *n_kept = n;
    *top_p_done = 0;
    if (s->p.temperature == 0.0f || top_k_on(s) || c->n >= c->n_finite) return 1;
    if (s->p.top_p < 1.0f) {
        const size_t cut = prefix_cut(s, s->cand, n, c->sumexp);
        if (!cut) return 0;
        *n_kept = cut;
        *top_p_done = 1;
        return 1;
    }
    /* min-p alone: the worst candidate must fall below the threshold */
    return (double)c->c[n - 1].l - (double)c->max < log((double)s->p.min_p);
}

/* Checks a row's candidates against the sampler's request (fn names the
 * caller in the error), loads them (load_cands) and makes the cut: the
 * tokens left to truncate in cand[0..*n_kept), *top_p_done as cands_cut. */
/* Whether candidates *c answer a request for k (and want_z): fn names the
 * caller in the error. */
static ag_status cands_check(const ag_sampler *s, const ag_cands *c, const ag_cands_req *req, const char *fn) {
    if (c->n_finite <= 0 || c->n < 1) return ag_errorf(AG_ERR_INVALID, "sampler: no token has a finite logit");
    if (c->n > AG_CANDS_MAX || c->n > c->n_finite || c->n_finite > s->n_vocab ||
        (c->n < req->k && c->n != c->n_finite) || (req->want_z && !(c->sumexp >= 1.0)))
        return ag_errorf(AG_ERR_INVALID, "%s: %d candidates of %d finite values do not answer a request for %d", fn,
                         (int)c->n, (int)c->n_finite, (int)req->k);
    for (int32_t i = 0; i < c->n; i++)
        if (c->c[i].id < 0 || c->c[i].id >= s->n_vocab)
            return ag_errorf(AG_ERR_INVALID, "%s: token %d out of range", fn, (int)c->c[i].id);
    return AG_OK;
}

static ag_status cands_take(ag_sampler *s, const ag_cands *c, const char *fn, size_t *n_kept, int *top_p_done) {
    ag_cands_req req;
    if (!ag_sampler_cands_req(s, &req)) return ag_errorf(AG_ERR_INVALID, "%s: the sampler needs the whole row", fn);
    ag_status st = cands_check(s, c, &req, fn);
    if (st) return st;
    load_cands(s, c, req.want_z);
    if (!cands_cut(s, c, n_kept, top_p_done))
        return ag_errorf(AG_ERR_INVALID, "%s: the sampler keeps more than the %d candidates "
                                         "(see ag_sampler_cands_enough)", fn, (int)c->n);
    return AG_OK;
}

/* out's logprob alternatives from loaded candidates: the best first, as
 * fill_top orders them (the request's k covers n_logprobs). */
static void cands_fill_top(const ag_sampler *s, const ag_cands *c, ag_sample_result *out) {
    if (s->p.n_logprobs <= 0) return;
    out->n_top = s->p.n_logprobs < c->n ? s->p.n_logprobs : c->n;
    for (int32_t i = 0; i < out->n_top; i++) {
        out->top[i].token = c->c[i].id;
        out->top[i].logprob = (float)logprob_of(s, c->c[i].l);
    }
}

ag_status ag_sampler_sample_cands(ag_sampler *s, const ag_cands *c, ag_sample_result *out) {
    ag_status st = check_call(s, c, out, "ag_sampler_sample_cands");
    size_t    n_kept;
    int       top_p_done;
    if (st || (st = cands_take(s, c, "ag_sampler_sample_cands", &n_kept, &top_p_done))) return st;
    memset(out, 0, sizeof *out);
    cands_fill_top(s, c, out);
    /* the candidates stand for the row's finite values: the top-k of the
     * whole row (req.k >= top_k), all of them, or (top-k off) those up to
     * the top-p cut made with the whole row's mass; min-p and the draw follow */
    return decide_token(s, n_kept, 0, top_p_done, out);
}

ag_status ag_sampler_probs_cands(ag_sampler *s, const ag_cands *c, ag_cand_probs *out) {
    ag_status st = check_call(s, c, out, "ag_sampler_probs_cands");
    size_t    n;
    int       top_p_done;
    if (st || (st = cands_take(s, c, "ag_sampler_probs_cands", &n, &top_p_done))) return st;
    if (s->p.temperature == 0.0f) {
        out->n = 1;
        out->id[0] = s->argmax;
        out->p[0] = 1.0f;
        return AG_OK;
    }
    double sum;
    n = kept_by_id(s, n, 0, top_p_done, &sum);
    out->n = (int32_t)n;
    for (size_t i = 0; i < n; i++) {
        out->id[i] = s->cand[i].id;
        out->p[i] = (float)(weight(s, s->cand[i].l) / sum);
    }
    return AG_OK;
}

int ag_sampler_logprobs_req(const ag_sampler *s, int32_t token, ag_cands_req *req) {
    if (!s || mods_on(s) || !(s->p.logprobs || s->p.n_logprobs > 0)) return 0;
    if (req) *req = (ag_cands_req){s->p.n_logprobs > 1 ? s->p.n_logprobs : 1, 1, token};
    return 1;
}

ag_status ag_sampler_logprobs_cands(ag_sampler *s, const ag_cands *c, int32_t token, ag_sample_result *out) {
    ag_status    st = check_call(s, c, out, "ag_sampler_logprobs_cands");
    ag_cands_req req;
    if (st) return st;
    if (!ag_sampler_logprobs_req(s, token, &req))
        return ag_errorf(AG_ERR_INVALID, "ag_sampler_logprobs_cands: the sampler needs the whole row");
    if (token < 0 || token >= s->n_vocab)
        return ag_errorf(AG_ERR_RANGE, "ag_sampler_logprobs_cands: token %d not in [0, %d)", (int)token,
                         (int)s->n_vocab);
    if ((st = cands_check(s, c, &req, "ag_sampler_logprobs_cands"))) return st;
    float l = NAN;
    for (int32_t j = 0; j < c->n && isnan(l); j++)
        if (c->c[j].id == token) l = c->c[j].l;
    if (isnan(l) && c->at == token) l = c->at_l;
    if (isnan(l))
        return ag_errorf(AG_ERR_INVALID, "ag_sampler_logprobs_cands: token %d is not among the %d candidates",
                         (int)token, (int)c->n);
    s->max_l = c->max;
    s->sumexp = c->sumexp;
    memset(out, 0, sizeof *out);
    cands_fill_top(s, c, out);
    out->token = token;
    out->logprob = (float)logprob_of(s, l);
    return AG_OK;
}

int ag_sampler_cands_enough(ag_sampler *s, const ag_cands *c) {
    ag_cands_req req;
    if (!s || !c || !ag_sampler_cands_req(s, &req) || c->n < 1 || c->n > AG_CANDS_MAX) return 0;
    load_cands(s, c, req.want_z);
    size_t n_kept;
    int    top_p_done;
    return cands_cut(s, c, &n_kept, &top_p_done);
}

ag_status ag_sampler_logits(ag_sampler *s, const float *logits, float *out) {
    ag_status st = check_call(s, logits, out, "ag_sampler_logits");
    if (st != AG_OK) return st;
    if ((st = prepare(s, logits, 0)) != AG_OK) return st;
    for (int32_t i = 0; i < s->n_vocab; i++) out[i] = s->cand[i].l;
    return AG_OK;
}

ag_status ag_sampler_probs(ag_sampler *s, const float *logits, float *probs) {
    ag_status st = check_call(s, logits, probs, "ag_sampler_probs");
    if (st != AG_OK) return st;
    if ((st = prepare(s, logits, 0)) != AG_OK) return st;
    memset(probs, 0, (size_t)s->n_vocab * sizeof *probs);
    if (s->p.temperature == 0.0f) {
        probs[s->argmax] = 1.0f;
        return AG_OK;
    }
    double sum;
    size_t n = kept_by_id(s, finite_front(s), 1, 0, &sum);
    for (size_t i = 0; i < n; i++) probs[s->cand[i].id] = (float)(weight(s, s->cand[i].l) / sum);
    return AG_OK;
}

ag_status ag_sampler_logprobs(ag_sampler *s, const float *logits, int32_t token,
                              ag_sample_result *out) {
    ag_status st = check_call(s, logits, out, "ag_sampler_logprobs");
    if (st != AG_OK) return st;
    if (token < 0 || token >= s->n_vocab)
        return ag_errorf(AG_ERR_RANGE, "ag_sampler_logprobs: token %d not in [0, %d)", (int)token,
                         (int)s->n_vocab);
    memset(out, 0, sizeof *out);
    if ((st = prepare(s, logits, 1)) != AG_OK) return st;
    if (s->p.n_logprobs > 0) fill_top(s, out);
    out->token = token;
    out->logprob = (float)logprob_of(s, s->cand[token].l);
    return AG_OK;
}

/* A probability vector as the draws and the verify rule read it: dense
 * (p[n_vocab]) or a row's candidates' (ag_cand_probs: ids ascending, every
 * other token 0). Both are walked in id order, and the tokens a dense
 * vector holds at 0 add nothing (a double plus 0.0 is itself), so a dense
 * vector and the candidates' vector of the same probabilities give the
 * same sums, the same draws and the same verify results. */
typedef struct {
    const float         *dense;
    const ag_cand_probs *cp;
    int32_t              n; /* entries: n_vocab, or cp->n */
} pvec;

static pvec pvec_dense(const ag_sampler *s, const float *p) { return (pvec){p, NULL, s->n_vocab}; }
static inline int32_t pv_id(const pvec *v, int32_t j) { return v->cp ? v->cp->id[j] : j; }
static inline float   pv_p(const pvec *v, int32_t j) { return v->cp ? v->cp->p[j] : v->dense[j]; }

/* p(token): a lookup in the ascending ids, 0 when absent. */
static float pv_at(const pvec *v, int32_t token) {
    if (!v->cp) return v->dense[token];
    int32_t lo = 0, hi = v->n;
    while (lo < hi) {
        int32_t mid = lo + (hi - lo) / 2;
        if (v->cp->id[mid] < token) lo = mid + 1;
        else hi = mid;
    }
    return lo < v->n && v->cp->id[lo] == token ? v->cp->p[lo] : 0.0f;
}

/* Draws from w(j) >= 0 over p's entries, where w is p, or max(0, p - q). */
typedef double (*weight_fn)(const pvec *p, const float *q, int32_t draft, int32_t j);

static double w_plain(const pvec *p, const float *q, int32_t draft, int32_t j) {
    (void)q, (void)draft;
    float x = pv_p(p, j);
    return x > 0.0f ? (double)x : 0.0; /* also maps NaN to 0 */
}

/* Tokens outside p's entries have p = 0 and so no residual: walking p's
 * entries walks every token with mass. */
static double w_residual(const pvec *p, const float *q, int32_t draft, int32_t j) {
    const int32_t i = pv_id(p, j);
    double qi = q ? (q[i] > 0.0f ? (double)q[i] : 0.0) : (i == draft ? 1.0 : 0.0);
    double d = w_plain(p, NULL, -1, j) - qi;
    return d > 0.0 ? d : 0.0;
}

static int32_t draw_weighted(ag_sampler *s, weight_fn w, const pvec *p, const float *q, int32_t draft, double sum) {
    double  u = rng_uniform(s->rng) * sum, cum = 0.0;
    int32_t last = -1;
    for (int32_t j = 0; j < p->n; j++) {
        double x = w(p, q, draft, j);
        if (x <= 0.0) continue;
        last = pv_id(p, j);
        cum += x;
        if (u < cum) return last;
    }
    return last; /* rounding: the last token with mass */
}

static double weight_sum(weight_fn w, const pvec *p, const float *q, int32_t draft) {
    double sum = 0.0;
    for (int32_t j = 0; j < p->n; j++) sum += w(p, q, draft, j);
    return sum;
}

ag_status ag_sampler_draw(ag_sampler *s, const float *probs, int32_t *token) {
    ag_status st = check_call(s, probs, token, "ag_sampler_draw");
    if (st != AG_OK) return st;
    const pvec p = pvec_dense(s, probs);
    double     sum = weight_sum(w_plain, &p, NULL, -1);
    if (!(sum > 0.0) || !isfinite(sum))
        return ag_errorf(AG_ERR_INVALID, "ag_sampler_draw: probabilities have no finite positive mass");
    *token = draw_weighted(s, w_plain, &p, NULL, -1, sum);
    return AG_OK;
}

/* ag_sampler_verify on either kind of p (fn names the caller). */
static ag_status verify_pv(ag_sampler *s, const pvec *p, const float *q, int32_t draft, ag_verify_result *out,
                           const char *fn) {
    if (draft < 0 || draft >= s->n_vocab)
        return ag_errorf(AG_ERR_RANGE, "%s: draft token %d not in [0, %d)", fn, (int)draft, (int)s->n_vocab);
    if (s->p.temperature == 0.0f) {
        /* argmax p, the lowest id on ties (the first in id order) */
        int32_t am = p->n > 0 ? pv_id(p, 0) : 0;
        float   best = p->n > 0 ? pv_p(p, 0) : 0.0f;
        for (int32_t j = 1; j < p->n; j++)
            if (pv_p(p, j) > best) {
                best = pv_p(p, j);
                am = pv_id(p, j);
            }
        out->accepted = draft == am;
        out->token = am;
        return AG_OK;
    }
    double psum = weight_sum(w_plain, p, NULL, -1);
    if (!(psum > 0.0) || !isfinite(psum)) return ag_errorf(AG_ERR_INVALID, "%s: p has no finite positive mass", fn);
    const float pd = pv_at(p, draft);
    double      px = pd > 0.0f ? (double)pd : 0.0;
    double      qx = q ? (q[draft] > 0.0f ? (double)q[draft] : 0.0) : 1.0;
    /* One uniform per position, drawn even when acceptance is certain, so
     * the RNG stream does not depend on the values. u < px / qx without
     * dividing; qx == 0 (x "impossible" under q) accepts iff px > 0. */
    double u = rng_uniform(s->rng);
    if (qx > 0.0 ? u * qx < px : px > 0.0) {
        out->accepted = 1;
        out->token = draft;
        return AG_OK;
    }
    out->accepted = 0;
    double rsum = weight_sum(w_residual, p, q, draft);
    if (rsum > 0.0 && isfinite(rsum)) out->token = draw_weighted(s, w_residual, p, q, draft, rsum);
    else out->token = draw_weighted(s, w_plain, p, NULL, -1, psum);
    return AG_OK;
}

ag_status ag_sampler_verify(ag_sampler *s, const float *p, const float *q, int32_t draft, ag_verify_result *out) {
    ag_status st = check_call(s, p, out, "ag_sampler_verify");
    if (st != AG_OK) return st;
    const pvec v = pvec_dense(s, p);
    return verify_pv(s, &v, q, draft, out, "ag_sampler_verify");
}

ag_status ag_sampler_verify_cands(ag_sampler *s, const ag_cand_probs *p, const float *q, int32_t draft,
                                  ag_verify_result *out) {
    ag_status st = check_call(s, p, out, "ag_sampler_verify_cands");
    if (st != AG_OK) return st;
    if (p->n < 1 || p->n > AG_CANDS_MAX)
        return ag_errorf(AG_ERR_INVALID, "ag_sampler_verify_cands: %d probabilities", (int)p->n);
    for (int32_t j = 0; j < p->n; j++)
        if (p->id[j] < 0 || p->id[j] >= s->n_vocab || (j > 0 && p->id[j] <= p->id[j - 1]))
            return ag_errorf(AG_ERR_INVALID, "ag_sampler_verify_cands: ids must ascend within [0, %d)",
                             (int)s->n_vocab);
    const pvec v = {NULL, p, p->n};
    return verify_pv(s, &v, q, draft, out, "ag_sampler_verify_cands");
}
