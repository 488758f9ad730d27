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
