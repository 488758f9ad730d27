#include "base/argmax.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

int32_t ag_argmax_f32(const float *x, int32_t n) {
    /* the max first, in eight independent chains (the max is the same in any
     * order; NaN compares false and is skipped), then its first index: a
     * pass that writes nothing, ~0.1 ms over 128k floats */
    float   mm[8] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY};
    int32_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int k = 0; k < 8; k++) mm[k] = x[i + k] > mm[k] ? x[i + k] : mm[k];
    float m = -INFINITY;
    for (; i < n; i++) m = x[i] > m ? x[i] : m;
    for (int k = 0; k < 8; k++) m = mm[k] > m ? mm[k] : m;
    if (!(m > -INFINITY)) return -1;
    const float at_least = m > FLT_MAX ? FLT_MAX : m; /* +inf: the first of +inf or FLT_MAX */
    i = 0;
    while (!(x[i] >= at_least)) i++;
    return i;
}

int32_t ag_pick_f32(const float *x, int32_t n, float inv_temp, double u) {
    float m = -INFINITY;
    for (int32_t i = 0; i < n; i++) {
        const float l = ag_logit_sanitize(x[i]);
        if (l > m) m = l;
    }
    if (!(m > -INFINITY)) return -1;
    /* the same weights twice, in the same order: the scan reproduces the
     * sum's partial sums exactly */
    double sum = 0.0;
    for (int32_t i = 0; i < n; i++) sum += (double)expf((ag_logit_sanitize(x[i]) - m) * inv_temp);
    const double target = u * sum;
    double       cum = 0.0;
    int32_t      pick = -1; /* set below: the max has weight 1 */
    for (int32_t i = 0; i < n; i++) {
        const double w = (double)expf((ag_logit_sanitize(x[i]) - m) * inv_temp);
        if (w <= 0.0) continue;
        pick = i;
        cum += w;
        if (target < cum) break;
    }
    return pick;
}

int ag_cand_cmp(const void *pa, const void *pb) {
    ag_cand a = *(const ag_cand *)pa, b = *(const ag_cand *)pb;
    return ag_cand_better(a, b) ? -1 : ag_cand_better(b, a) ? 1 : 0;
}

static inline void swapc(ag_cand *a, ag_cand *b) {
    ag_cand t = *a;
    *a = *b;
    *b = t;
}

void ag_cand_select_best(ag_cand *c, size_t n, size_t k) {
    size_t lo = 0, hi = n;
    int depth = 0, limit = 8;
    for (size_t t = n; t > 1; t >>= 1) limit += 2;
    while (hi - lo > 16) {
        if (depth++ > limit) {
            qsort(c + lo, hi - lo, sizeof *c, ag_cand_cmp);
            return;
        }
        size_t mid = lo + (hi - lo) / 2;
        if (ag_cand_better(c[mid], c[lo])) swapc(&c[mid], &c[lo]);
        if (ag_cand_better(c[hi - 1], c[lo])) swapc(&c[hi - 1], &c[lo]);
        if (ag_cand_better(c[hi - 1], c[mid])) swapc(&c[hi - 1], &c[mid]);
        swapc(&c[mid], &c[hi - 1]); /* the median is the pivot, parked at the end */
        ag_cand piv = c[hi - 1];
        size_t st = lo;
        for (size_t i = lo; i < hi - 1; i++)
            if (ag_cand_better(c[i], piv)) swapc(&c[i], &c[st++]);
        swapc(&c[st], &c[hi - 1]);
        if (st == k || st + 1 == k) return;
        if (st < k) lo = st + 1;
        else hi = st;
    }
    for (size_t i = lo + 1; i < hi; i++) { /* insertion sort of the small rest */
        ag_cand x = c[i];
        size_t j = i;
        while (j > lo && ag_cand_better(x, c[j - 1])) {
            c[j] = c[j - 1];
            j--;
        }
        c[j] = x;
    }
}

void ag_top_cands_f32(const float *x, int32_t n, const ag_cands_req *req, ag_cands *out) {
    const int32_t k = req->k < 1 ? 1 : req->k > AG_CANDS_MAX ? AG_CANDS_MAX : req->k;
    /* Values better than the k-th best so far gather in a buffer of 4k;
     * when it fills, the k best stay (ag_cand_select_best) and the k-th
     * becomes the bar. Ids rise
     * along the row, so a value equal to the bar loses to it. A pass over
     * the row, and O(row) however the values are ordered (a heap costs
     * O(row log k) when they rise with the id). */
    ag_cand       buf[4 * AG_CANDS_MAX];
    const int32_t cap = 4 * k;
    int32_t       have = 0, nf = 0;
    float         m = -INFINITY, bar = -INFINITY;
    for (int32_t i = 0; i < n; i++) {
        const float l = ag_logit_sanitize(x[i]);
        if (l == -INFINITY) continue;
        nf++;
        if (l > m) m = l;
        if (!(l > bar) && bar > -INFINITY) continue;
        buf[have++] = (ag_cand){l, i};
        if (have == cap) {
            ag_cand_select_best(buf, (size_t)have, (size_t)k);
            have = k;
            bar = buf[0].l; /* the k-th best: the least of the k kept */
            for (int32_t j = 1; j < k; j++) bar = buf[j].l < bar ? buf[j].l : bar;
        }
    }
    if (have > k) ag_cand_select_best(buf, (size_t)have, (size_t)k), have = k;
    qsort(buf, (size_t)have, sizeof *buf, ag_cand_cmp);
    memcpy(out->c, buf, sizeof *buf * (size_t)have);
    out->n = have;
    out->n_finite = nf;
    out->max = m;
    out->at = req->at >= 0 && req->at < n && req->at <= AG_CANDS_AT_MAX ? req->at : -1;
    out->at_l = out->at >= 0 ? ag_logit_sanitize(x[out->at]) : NAN;
    out->pad_ = 0;
    out->sumexp = NAN;
    if (req->want_z) {
        double sum = 0.0;
        if (nf > 0)
            for (int32_t i = 0; i < n; i++) sum += (double)expf(ag_logit_sanitize(x[i]) - m);
        out->sumexp = sum;
    }
}
