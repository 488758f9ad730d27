/* The sampler's rules that need nothing but a row of floats, in one place:
 * the greedy rule (the sampler on the host, the CPU backend's argmax op; the
 * CUDA kernel argmax_rows_k implements it too), the temperature rule without
 * truncation (the sampler on the host, the backends' pick op), and a row's
 * best candidates with its max and sum of exponentials (the backends' cands
 * op), all a truncating sampler reads of a row. */
#ifndef AG_BASE_ARGMAX_H
#define AG_BASE_ARGMAX_H

#include <float.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>

/* The sampler's view of a logit: NaN as -inf (never drawn), +inf as
 * FLT_MAX (so weights stay finite). */
static inline float ag_logit_sanitize(float l) {
    if (!(l > -INFINITY)) return -INFINITY; /* NaN too */
    return l == INFINITY ? FLT_MAX : l;
}

/* One token's steps 1-2 of the sampler's chain (sample/sample.h), applied
 * where the logits are (a backend's edit of a row before its argmax, pick
 * or candidates are found, ag_batch.edits), so a sampler with logit bias or
 * penalties need not read the whole row: flags say which steps the token
 * has; `sub` is its count * frequency_penalty + presence_penalty, computed
 * by the sampler. ag_logit_edit_apply is the arithmetic, which the sampler
 * itself uses on the host and a device kernel repeats bit for bit. */
enum { AG_EDIT_BIAS = 1, AG_EDIT_BAN = 2, AG_EDIT_PENALTY = 4 };
typedef struct {
    int32_t  id;
    uint32_t flags; /* AG_EDIT_* */
    float    bias;  /* AG_EDIT_BIAS: added (the token's biases summed, in order) */
    float    rep;   /* AG_EDIT_PENALTY: the repetition penalty (1: none) */
    float    sub;   /* AG_EDIT_PENALTY: then subtracted */
} ag_logit_edit;

/* A raw logit l of token e->id after its edit: sanitized; then -inf if
 * banned, else plus the bias (sanitized); then (in the penalty window) l >
 * 0 ? l / rep : l * rep unless rep is 1, minus sub (sanitized). Each
 * operation rounds on its own (no contraction: C11 mode, and __f*_rn on a
 * device). */
static inline float ag_logit_edit_apply(float l, const ag_logit_edit *e) {
    l = ag_logit_sanitize(l);
    if (e->flags & AG_EDIT_BAN) l = -INFINITY;
    else if (e->flags & AG_EDIT_BIAS) l = ag_logit_sanitize(l + e->bias);
    if (e->flags & AG_EDIT_PENALTY) {
        if (e->rep != 1.0f) l = l > 0.0f ? l / e->rep : l * e->rep;
        l = ag_logit_sanitize(l - e->sub);
    }
    return l;
}

/* The lowest index among x[0..n)'s largest values, +inf and FLT_MAX counted
 * alike, NaN skipped; -1 when no value is finite (or n <= 0). */
int32_t ag_argmax_f32(const float *x, int32_t n);

/* The token the sampler draws from softmax(x / T) with its uniform u in
 * [0, 1), when nothing truncates the row: the values sanitized (NaN -> -inf,
 * +inf -> FLT_MAX), m their max, weights w_i = (double)expf((x_i - m) *
 * inv_temp) summed in index order, and the first index (with w_i > 0) at
 * which the running sum exceeds u times the total; the last index with a
 * weight if rounding leaves u times the total at the end. -1 when no value
 * is finite (or n <= 0). ag_sampler_sample gives the same token for such a
 * sampler and the same u (tests/unit/test_sample.c). */
int32_t ag_pick_f32(const float *x, int32_t n, float inv_temp, double u);

/* What a backend needs to draw a sampler's next token with ag_pick_f32: the
 * sampler's uniform u, taken from its RNG ahead (ag_sampler_draw_pick), and
 * 1/T. */
typedef struct {
    double u;
    float  inv_temp;
} ag_pick;

/* One candidate: a (sanitized) logit and its token id. The sampler's total
 * order on candidates is logit descending, then id ascending. */
typedef struct {
    float   l;
    int32_t id;
} ag_cand;

/* 1 if a comes before b in that order. */
static inline int ag_cand_better(ag_cand a, ag_cand b) { return a.l > b.l || (a.l == b.l && a.id < b.id); }

/* qsort's comparator for that order (best first). */
int ag_cand_cmp(const void *a, const void *b);

/* Rearranges c[0..n) so that c[0..k) are its k best (in no order), 0 < k < n.
 * Quickselect with median-of-three; past a depth limit it sorts the rest,
 * so adversarial values cost O(n log n), never O(n^2). */
void ag_cand_select_best(ag_cand *c, size_t n, size_t k);

/* The most candidates a row gives (ag_top_cands_f32's k). */
#define AG_CANDS_MAX 256

/* What a sampler reads of a row when its truncation keeps at most k tokens
 * (top-k) and it reports at most k alternatives: the row's k best values in
 * the total order, its max, how many values are finite, (want_z) the sum
 * of exponentials for logprobs, and (at) the value of one given id, best or
 * not (a scored prompt token's). */
typedef struct {
    int32_t k;      /* 1..AG_CANDS_MAX */
    int32_t want_z; /* 1: fill sumexp */
    int32_t at;     /* an id whose value goes to at_l, or -1 (also any id outside the row),
                       or AG_CANDS_AT_TOKEN (the backend op only) */
} ag_cands_req;

/* The largest `at` a device must carry (packed with k and want_z in one
 * word: 23 bits); a larger one reads as none. */
#define AG_CANDS_AT_MAX ((1 << 23) - 3) /* (at + 1 all ones is AG_CANDS_AT_TOKEN's) */

/* `at` for the backend's cands op: the token the same pass drew for the row
 * (its pick), known only where the logits are. */
#define AG_CANDS_AT_TOKEN INT32_MIN /* (not -2, which a pick writes for "no finite logit") */

typedef struct {
    int32_t n;        /* candidates in c: min(k, n_finite) */
    int32_t n_finite; /* values that are not -inf once sanitized */
    float   max;      /* the largest sanitized value (c[0].l); -inf if none is finite */
    int32_t at;       /* the request's at, or -1 when it named no id of the row */
    float   at_l;     /* that id's sanitized value (NaN when at is -1) */
    int32_t pad_;
    double  sumexp;   /* sum over the row, in index order, of (double)expf(l - max) for
                         the sanitized values l (want_z; a device may sum in another
                         order); NaN when not asked for */
    ag_cand c[AG_CANDS_MAX]; /* [n], best first */
} ag_cands;

/* Fills *out for row x[0..n) as ag_cands describes, with req->k clamped to
 * [1, AG_CANDS_MAX]: the values sanitized as ag_logit_sanitize does, the k
 * best finite ones in the total order (logit desc, id asc). One pass over the
 * row, linear whatever its order (a second, of expf, for want_z). */
void ag_top_cands_f32(const float *x, int32_t n, const ag_cands_req *req, ag_cands *out);

#endif
