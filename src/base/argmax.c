#include "base/argmax.h"

#include <float.h>
#include <math.h>

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

void ag_cand_sift_down(ag_cand *h, int32_t k, int32_t i) {
    for (;;) {
        int32_t l = 2 * i + 1, r = l + 1, w = i;
        if (l < k && ag_cand_better(h[w], h[l])) w = l;
        if (r < k && ag_cand_better(h[w], h[r])) w = r;
        if (w == i) return;
        ag_cand t = h[i];
        h[i] = h[w];
        h[w] = t;
        i = w;
    }
}

void ag_top_cands_f32(const float *x, int32_t n, const ag_cands_req *req, ag_cands *out) {
    int32_t k = req->k < 1 ? 1 : req->k > AG_CANDS_MAX ? AG_CANDS_MAX : req->k;
    ag_cand *h = out->c;
    int32_t  have = 0, nf = 0;
    float    m = -INFINITY;
    for (int32_t i = 0; i < n; i++) {
        const float l = ag_logit_sanitize(x[i]);
        if (l == -INFINITY) continue;
        nf++;
        if (l > m) m = l;
        if (have < k) { /* filling: sift the newcomer up */
            int32_t j = have++;
            h[j] = (ag_cand){l, i};
            while (j > 0 && ag_cand_better(h[(j - 1) / 2], h[j])) {
                ag_cand t = h[j];
                h[j] = h[(j - 1) / 2];
                h[(j - 1) / 2] = t;
                j = (j - 1) / 2;
            }
            continue;
        }
        /* ids rise along the row, so an equal value loses to the root */
        if (!(l > h[0].l)) continue;
        h[0] = (ag_cand){l, i};
        ag_cand_sift_down(h, k, 0);
    }
    /* best first: pop the worst to the back */
    for (int32_t e = have; e > 1; e--) {
        ag_cand t = h[0];
        h[0] = h[e - 1];
        h[e - 1] = t;
        ag_cand_sift_down(h, e - 1, 0);
    }
    out->n = have;
    out->n_finite = nf;
    out->max = m;
    out->sumexp = NAN;
    if (req->want_z) {
        double sum = 0.0;
        if (nf > 0)
            for (int32_t i = 0; i < n; i++) sum += (double)expf(ag_logit_sanitize(x[i]) - m);
        out->sumexp = sum;
    }
}
