/* Unit tests for src/sample: the sampling chain, penalties, logprobs, seeds,
 * the speculative verify rule and the stop-string matcher.
 *
 * References are written here independently of the implementation: a
 * plain sort-based chain in double precision, the penalty formulas spelled
 * out, log-softmax in double, and a brute-force stop matcher. Statistical
 * tests use fixed seeds, so they are deterministic; their thresholds are
 * chi-square critical values at p = 0.001. */
#include <float.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "base/argmax.h"
#include "sample/sample.h"
#include "sample/stop.h"

/* ---- test-side helpers ---------------------------------------------- */

static uint64_t trng_state = 12345;
static uint64_t trng(void) { /* splitmix64, only to generate test inputs */
    uint64_t z = (trng_state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
static double trng_unit(void) { return (double)(trng() >> 11) / 9007199254740992.0; }
static int trng_int(int n) { return (int)(trng() % (uint64_t)n); }
static double trng_normal(void) {
    double u = trng_unit(), v = trng_unit();
    return sqrt(-2.0 * log(u + 1e-300)) * cos(6.283185307179586 * v);
}

/* Chi-square critical value at p = 0.001 (Wilson-Hilferty approximation,
 * within 1% of the exact value for df >= 3). */
static double chi2_crit(int df) {
    double k = df, z = 3.090232306;
    double t = 1.0 - 2.0 / (9.0 * k) + z * sqrt(2.0 / (9.0 * k));
    return k * t * t * t;
}

/* Chi-square of observed counts against expected probabilities, pooling
 * cells with a small expectation so the statistic stays valid. Fails if a
 * token with probability 0 was observed. Returns the statistic; *df_out. */
static double chi2_stat(const long *obs, const double *prob, int n, long total, int *df_out) {
    double stat = 0.0, pool_e = 0.0;
    long pool_o = 0;
    int cells = 0;
    for (int i = 0; i < n; i++) {
        if (prob[i] <= 0.0) {
            assert_int_equal(obs[i], 0);
            continue;
        }
        double e = prob[i] * (double)total;
        if (e < 50.0) {
            pool_e += e;
            pool_o += obs[i];
            continue;
        }
        stat += ((double)obs[i] - e) * ((double)obs[i] - e) / e;
        cells++;
    }
    if (pool_e > 0.0) {
        stat += ((double)pool_o - pool_e) * ((double)pool_o - pool_e) / pool_e;
        cells++;
    }
    *df_out = cells - 1;
    return stat;
}

/* b is a, bit for bit: the token, its logprob, the alternatives. */
static void assert_same_result(const ag_sample_result *b, const ag_sample_result *a) {
    assert_int_equal(b->token, a->token);
    assert_memory_equal(&b->logprob, &a->logprob, sizeof a->logprob);
    assert_int_equal(b->n_top, a->n_top);
    assert_memory_equal(b->top, a->top, sizeof a->top[0] * (size_t)a->n_top);
}

/* ---- reference chain ------------------------------------------------ */

typedef struct {
    double l;
    int    id;
} rc;

static int rc_cmp(const void *a, const void *b) {
    const rc *x = a, *y = b;
    if (x->l > y->l) return -1;
    if (x->l < y->l) return 1;
    return x->id - y->id;
}

/* Processed logits: bias (<= -100 bans), then penalties over the window. */
static void ref_processed(const float *logits, int n, const ag_sample_params *p, const int32_t *hist,
                          int nh, double *out) {
    for (int i = 0; i < n; i++) out[i] = isnan(logits[i]) ? -INFINITY : (double)logits[i];
    for (int i = 0; i < p->n_logit_bias; i++) {
        int t = p->logit_bias[i].token;
        if (p->logit_bias[i].bias <= -100.0f) out[t] = -INFINITY;
        else out[t] += p->logit_bias[i].bias;
    }
    if (p->penalty_last_n == 0) return;
    int start = p->penalty_last_n < 0 ? 0 : (nh > p->penalty_last_n ? nh - p->penalty_last_n : 0);
    int *cnt = calloc((size_t)n, sizeof *cnt);
    for (int i = start; i < nh; i++) cnt[hist[i]]++;
    for (int t = 0; t < n; t++) {
        if (cnt[t] == 0) continue;
        double r = p->repetition_penalty;
        out[t] = out[t] > 0 ? out[t] / r : out[t] * r;
        out[t] -= cnt[t] * (double)p->frequency_penalty + (double)p->presence_penalty;
    }
    free(cnt);
}

/* The chain after processing, by the book: sort everything, cut, renormalise. */
static void ref_probs(const double *proc, int n, const ag_sample_params *p, double *probs) {
    rc *v = malloc((size_t)n * sizeof *v);
    int nf = 0;
    for (int i = 0; i < n; i++) {
        probs[i] = 0.0;
        if (proc[i] > -INFINITY) v[nf++] = (rc){proc[i], i};
    }
    qsort(v, (size_t)nf, sizeof *v, rc_cmp);
    if (p->temperature == 0.0f) {
        probs[v[0].id] = 1.0;
        free(v);
        return;
    }
    double m = v[0].l;
    int keep = nf;
    if (p->top_k > 0 && p->top_k < keep) keep = p->top_k;
    if (p->top_p < 1.0f) {
        double z = 0.0, cum = 0.0;
        for (int i = 0; i < keep; i++) z += exp(v[i].l - m);
        for (int i = 0; i < keep; i++) {
            cum += exp(v[i].l - m) / z;
            if (cum >= p->top_p) {
                keep = i + 1;
                break;
            }
        }
    }
    if (p->min_p > 0.0f) {
        int k2 = 0;
        while (k2 < keep && exp(v[k2].l - m) >= p->min_p) k2++;
        keep = k2;
    }
    double z = 0.0;
    for (int i = 0; i < keep; i++) z += exp((v[i].l - m) / p->temperature);
    for (int i = 0; i < keep; i++) probs[v[i].id] = exp((v[i].l - m) / p->temperature) / z;
    free(v);
}

static void assert_probs_match(const float *got, const double *want, int n) {
    for (int i = 0; i < n; i++) {
        if (want[i] == 0.0) {
            if (got[i] != 0.0f) fail_msg("token %d: got %g, reference excludes it", i, (double)got[i]);
            continue;
        }
        if (!(got[i] > 0.0f)) fail_msg("token %d: excluded, reference %g", i, want[i]);
        if (fabs((double)got[i] - want[i]) > 1e-5 * want[i] + 1e-7)
            fail_msg("token %d: got %.9g want %.9g", i, (double)got[i], want[i]);
    }
}

static ag_sampler *new_sampler(const ag_sample_params *p, int n, uint64_t stream) {
    ag_sampler *s = NULL;
    ag_status st = ag_sampler_new(p, n, stream, &s);
    if (st != AG_OK) fail_msg("ag_sampler_new: %s", ag_error_message());
    return s;
}

/* ---- params --------------------------------------------------------- */

static void params_defaults_and_validation(void **state) {
    ag_sample_params p = ag_sample_default_params();
    assert_true(p.temperature == 1.0f && p.top_k == 0 && p.top_p == 1.0f && p.min_p == 0.0f);
    assert_true(p.repetition_penalty == 1.0f && p.presence_penalty == 0.0f && p.frequency_penalty == 0.0f);
    assert_int_equal(p.penalty_last_n, -1);
    assert_int_equal(p.n_logprobs, 0);
    assert_int_equal(ag_sample_params_check(&p, 10), AG_OK);

#define BAD(field, value)                                                    \
    do {                                                                     \
        ag_sample_params q = ag_sample_default_params();                     \
        q.field = value;                                                     \
        assert_int_not_equal(ag_sample_params_check(&q, 10), AG_OK);          \
        assert_non_null(strstr(ag_error_message(), #field));                  \
        ag_sampler *s = (ag_sampler *)1;                                     \
        assert_int_not_equal(ag_sampler_new(&q, 10, 0, &s), AG_OK);           \
        assert_null(s);                                                      \
    } while (0)
    BAD(temperature, -0.1f);
    BAD(temperature, NAN);
    BAD(temperature, INFINITY);
    BAD(top_k, -1);
    BAD(top_p, 1.5f);
    BAD(top_p, -0.01f);
    BAD(min_p, 1.01f);
    BAD(repetition_penalty, 0.0f);
    BAD(presence_penalty, NAN);
    BAD(frequency_penalty, INFINITY);
    BAD(penalty_last_n, -2);
    BAD(n_logprobs, 21);
    BAD(n_logprobs, -1);
#undef BAD
    ag_logit_bias lb[] = {{3, 1.0f}, {10, 1.0f}};
    p.logit_bias = lb;
    p.n_logit_bias = 2;
    assert_int_equal(ag_sample_params_check(&p, 10), AG_ERR_RANGE); /* id 10 >= n_vocab */
    assert_int_equal(ag_sample_params_check(&p, 11), AG_OK);
    lb[0].bias = NAN;
    assert_int_equal(ag_sample_params_check(&p, 11), AG_ERR_RANGE);
    p = ag_sample_default_params();
    assert_int_not_equal(ag_sample_params_check(&p, 0), AG_OK);

    ag_sampler *s = new_sampler(&p, 4, 0);
    float l[4] = {-INFINITY, NAN, -INFINITY, -INFINITY};
    ag_sample_result r;
    assert_int_equal(ag_sampler_sample(s, l, &r), AG_ERR_INVALID); /* nothing finite */
    assert_int_equal(ag_sampler_sample(s, NULL, &r), AG_ERR_INVALID);
    assert_int_equal(ag_sampler_accept(s, 4), AG_ERR_RANGE);
    assert_int_equal(ag_sampler_accept(s, -1), AG_ERR_RANGE);
    assert_int_equal(ag_sampler_rewind(s, 1), AG_ERR_RANGE);
    ag_verify_result vr;
    float pr[4] = {0.25f, 0.25f, 0.25f, 0.25f};
    assert_int_equal(ag_sampler_verify(s, pr, NULL, 7, &vr), AG_ERR_RANGE);
    int32_t tok;
    float zero[4] = {0};
    assert_int_equal(ag_sampler_draw(s, zero, &tok), AG_ERR_INVALID);
    ag_sampler_free(s);
    ag_sampler_free(NULL);
}

/* ---- greedy ---------------------------------------------------------- */

static void greedy_is_argmax_lowest_id(void **state) {
    ag_sample_params p = ag_sample_default_params();
    p.temperature = 0.0f;
    p.top_k = 3; /* filters must not matter at temperature 0 */
    p.top_p = 0.5f;
    enum { N = 1000 };
    ag_sampler *s = new_sampler(&p, N, 0);
    assert_true(ag_sampler_greedy(s));
    float l[N];
    for (int trial = 0; trial < 200; trial++) {
        for (int i = 0; i < N; i++) l[i] = (float)(trng_int(40) - 20) * 0.5f; /* many ties */
        if (trial % 7 == 0) l[trng_int(N)] = NAN;
        int want = -1;
        for (int i = 0; i < N; i++)
            if (!isnan(l[i]) && (want < 0 || l[i] > l[want])) want = i;
        ag_sample_result r;
        assert_int_equal(ag_sampler_sample(s, l, &r), AG_OK);
        assert_int_equal(r.token, want);
    }
    /* Explicit tie: ids 5 and 2 share the maximum. */
    for (int i = 0; i < N; i++) l[i] = 0.0f;
    l[5] = 3.0f;
    l[2] = 3.0f;
    ag_sample_result r;
    assert_int_equal(ag_sampler_sample(s, l, &r), AG_OK);
    assert_int_equal(r.token, 2);
    float *pr = malloc(N * sizeof *pr);
    assert_int_equal(ag_sampler_probs(s, l, pr), AG_OK);
    for (int i = 0; i < N; i++) assert_true(pr[i] == (i == 2 ? 1.0f : 0.0f));
    free(pr);
    /* +inf counts as the largest float (it ties with FLT_MAX: the lower id
     * wins), NaN never wins, and nothing finite is an error */
    for (int i = 0; i < N; i++) l[i] = NAN;
    l[700] = INFINITY, l[300] = FLT_MAX, l[900] = INFINITY;
    assert_int_equal(ag_sampler_sample(s, l, &r), AG_OK);
    assert_int_equal(r.token, 300);
    l[300] = 1.0f;
    assert_int_equal(ag_sampler_sample(s, l, &r), AG_OK);
    assert_int_equal(r.token, 700);
    for (int i = 0; i < N; i++) l[i] = i % 2 ? NAN : -INFINITY;
    assert_int_equal(ag_sampler_sample(s, l, &r), AG_ERR_INVALID);
    ag_sampler_free(s);
    /* a vocabulary whose last ids lie past the scan's eight-wide part */
    s = new_sampler(&p, N - 3, 0);
    l[N - 4] = -1e30f;
    assert_int_equal(ag_sampler_sample(s, l, &r), AG_OK);
    assert_int_equal(r.token, N - 4);
    l[N - 4] = NAN;
    assert_int_equal(ag_sampler_sample(s, l, &r), AG_ERR_INVALID);
    ag_sampler_free(s);
}

/* +inf is clamped to the largest float (so two +inf tie), NaN never sampled. */
static void nonfinite_logits(void **state) {
    ag_sample_params p = ag_sample_default_params();
    p.logprobs = 1;
    ag_sampler *s = new_sampler(&p, 5, 0);
    float l[5] = {0.0f, INFINITY, NAN, INFINITY, 1.0f}, pr[5];
    assert_int_equal(ag_sampler_probs(s, l, pr), AG_OK);
    assert_true(pr[1] == 0.5f && pr[3] == 0.5f && pr[0] == 0.0f && pr[2] == 0.0f && pr[4] == 0.0f);
    for (int k = 0; k < 100; k++) {
        ag_sample_result r;
        assert_int_equal(ag_sampler_sample(s, l, &r), AG_OK);
        assert_true(r.token == 1 || r.token == 3);
        assert_true(fabs((double)r.logprob - log(0.5)) < 1e-6);
    }
    float l2[5] = {NAN, 1.0f, NAN, 2.0f, NAN};
    assert_int_equal(ag_sampler_probs(s, l2, pr), AG_OK);
    assert_true(pr[0] == 0.0f && pr[2] == 0.0f && pr[4] == 0.0f);
    assert_true(fabs((double)pr[3] - exp(2.0) / (exp(1.0) + exp(2.0))) < 1e-6);
    ag_sampler_free(s);
    /* without logprobs requested the field is NaN (not computed) */
    p.logprobs = 0;
    s = new_sampler(&p, 5, 0);
    ag_sample_result r;
    assert_int_equal(ag_sampler_sample(s, l2, &r), AG_OK);
    assert_true(isnan(r.logprob));
    assert_int_equal(r.n_top, 0);
    ag_sampler_free(s);
}

/* A sampler that needs only the argmax (greedy, no logprobs, bias or
 * penalties) takes a token found elsewhere (a GPU's argmax) and reports
 * what ag_sampler_sample reports for that row; any other refuses it. */
static void sample_argmax_takes_a_found_token(void **state) {
    ag_sample_params p = ag_sample_default_params();
    p.temperature = 0.0f;
    ag_sampler *s = new_sampler(&p, 5, 0);
    assert_true(ag_sampler_argmax_only(s));
    float            l[5] = {0.5f, 2.0f, NAN, 2.0f, -1.0f};
    ag_sample_result a, b;
    assert_int_equal(ag_sampler_sample(s, l, &a), AG_OK);
    assert_int_equal(ag_sampler_sample_argmax(s, 1, &b), AG_OK);
    assert_int_equal(a.token, 1);
    assert_int_equal(b.token, a.token);
    assert_true(isnan(b.logprob) && isnan(a.logprob));
    assert_int_equal(b.n_top, a.n_top);
    /* no finite logit: the error sample gives */
    float none[5] = {-INFINITY, NAN, -INFINITY, NAN, -INFINITY};
    assert_int_equal(ag_sampler_sample(s, none, &a), AG_ERR_INVALID);
    assert_int_equal(ag_sampler_sample_argmax(s, -2, &b), AG_ERR_INVALID);
    assert_non_null(strstr(ag_error_message(), "finite"));
    assert_int_equal(ag_sampler_sample_argmax(s, 5, &b), AG_ERR_INVALID); /* out of range */
    ag_sampler_free(s);
    /* samplers that need the row */
    ag_sample_params q[4];
    for (int i = 0; i < 4; i++) q[i] = p;
    q[0].temperature = 0.7f;
    q[1].logprobs = 1;
    q[2].repetition_penalty = 1.3f;
    ag_logit_bias bias = {.token = 2, .bias = 1.0f};
    q[3].logit_bias = &bias;
    q[3].n_logit_bias = 1;
    for (int i = 0; i < 4; i++) {
        s = new_sampler(&q[i], 5, 0);
        assert_false(ag_sampler_argmax_only(s));
        assert_int_equal(ag_sampler_sample_argmax(s, 1, &b), AG_ERR_INVALID);
        ag_sampler_free(s);
    }
}

/* A sampler with only a temperature draws its uniform ahead
 * (ag_sampler_draw_pick) and takes a token picked elsewhere (a backend's
 * pick op running ag_pick_f32): the tokens are those of ag_sampler_sample
 * from the same seed, over random rows with ties, NaN, +-inf and tokens
 * far below the max, at temperatures from 0.1 to 3. Any sampler that
 * needs more refuses the draw. */
static void pick_draws_what_sample_draws(void **state) {
    (void)state;
    const int   n = 257;
    float       l[257];
    const float temps[5] = {0.1f, 0.5f, 1.0f, 1.7f, 3.0f};
    for (int round = 0; round < 60; round++) {
        ag_sample_params p = ag_sample_default_params();
        p.temperature = temps[round % 5];
        p.seed = 1000 + (uint64_t)round;
        if (round % 3 == 1) p.top_k = n; /* no truncation either */
        ag_sampler *a = new_sampler(&p, n, 7), *b = new_sampler(&p, n, 7);
        assert_true(ag_sampler_pick_only(a));
        for (int step = 0; step < 40; step++) {
            for (int i = 0; i < n; i++) l[i] = (float)(trng_normal() * 3.0);
            if (step % 4 == 0) l[trng_int(n)] = NAN;
            if (step % 5 == 0) l[trng_int(n)] = -INFINITY;
            if (step % 7 == 0) l[trng_int(n)] = -80.0f; /* weight underflows to 0 */
            if (step % 9 == 0) l[trng_int(n)] = l[trng_int(n)]; /* a tie */
            if (step % 11 == 0) l[trng_int(n)] = INFINITY;
            ag_sample_result ra, rb;
            ag_pick          d;
            assert_int_equal(ag_sampler_sample(a, l, &ra), AG_OK);
            assert_int_equal(ag_sampler_draw_pick(b, &d), AG_OK);
            assert_true(d.u >= 0.0 && d.u < 1.0);
            if (step % 2) {
                assert_int_equal(ag_sampler_sample_picked(b, ag_pick_f32(l, n, d.inv_temp, d.u), &rb), AG_OK);
            } else {
                assert_int_equal(ag_sampler_sample_drawn(b, l, &d, &rb), AG_OK);
            }
            assert_int_equal(rb.token, ra.token);
            assert_true(isnan(rb.logprob) && isnan(ra.logprob));
            assert_int_equal(ag_sampler_accept(a, ra.token), AG_OK);
            assert_int_equal(ag_sampler_accept(b, rb.token), AG_OK);
        }
        ag_sampler_free(a);
        ag_sampler_free(b);
    }
    /* no finite logit: the error sample gives; out of range refused */
    ag_sample_params p = ag_sample_default_params();
    p.temperature = 0.8f;
    ag_sampler      *s = new_sampler(&p, 5, 0);
    float            none[5] = {-INFINITY, NAN, -INFINITY, NAN, -INFINITY};
    ag_sample_result r;
    assert_int_equal(ag_pick_f32(none, 5, 1.25f, 0.5), -1);
    assert_int_equal(ag_sampler_sample_picked(s, -1, &r), AG_ERR_INVALID);
    assert_non_null(strstr(ag_error_message(), "finite"));
    assert_int_equal(ag_sampler_sample_picked(s, 5, &r), AG_ERR_INVALID);
    ag_sampler_free(s);
    /* samplers that need more than a temperature */
    ag_sample_params q[7];
    for (int i = 0; i < 7; i++) q[i] = p;
    q[0].temperature = 0.0f;
    q[1].top_k = 3;
    q[2].top_p = 0.9f;
    q[3].min_p = 0.05f;
    q[4].logprobs = 1;
    q[5].presence_penalty = 0.5f;
    ag_logit_bias bias = {.token = 2, .bias = 1.0f};
    q[6].logit_bias = &bias;
    q[6].n_logit_bias = 1;
    for (int i = 0; i < 7; i++) {
        s = new_sampler(&q[i], 5, 0);
        ag_pick d;
        assert_false(ag_sampler_pick_only(s));
        /* logprobs: drawn ahead too, the token then taken with its candidates */
        assert_int_equal(ag_sampler_draw_pick(s, &d), i == 4 ? AG_OK : AG_ERR_INVALID);
        assert_int_equal(ag_sampler_sample_picked(s, 1, &r), AG_ERR_INVALID);
        ag_sampler_free(s);
    }
}

/* ---- chain vs reference ----------------------------------------------- */

static void random_params(ag_sample_params *p, int n) {
    *p = ag_sample_default_params();
    p->temperature = trng_int(6) == 0 ? 0.0f : (float)(0.2 + 1.8 * trng_unit());
    p->top_k = trng_int(3) == 0 ? 0 : 1 + trng_int(n + 2);
    p->top_p = trng_int(3) == 0 ? 1.0f : (float)trng_unit();
    p->min_p = trng_int(3) == 0 ? 0.0f : (float)(0.3 * trng_unit());
    if (trng_int(10) == 0) p->min_p = 1.0f;
    if (trng_int(10) == 0) p->top_p = 0.0f;
    p->seed = trng();
}

static void chain_matches_reference(void **state) {
    static const int sizes[] = {1, 2, 3, 8, 17, 100, 1000, 5000};
    int checked = 0;
    for (size_t si = 0; si < sizeof sizes / sizeof *sizes; si++) {
        int n = sizes[si];
        float *l = malloc((size_t)n * sizeof *l), *got = malloc((size_t)n * sizeof *got);
        double *proc = malloc((size_t)n * sizeof *proc), *want = malloc((size_t)n * sizeof *want);
        for (int trial = 0; trial < 60; trial++) {
            ag_sample_params p;
            random_params(&p, n);
            int quant = trial % 2; /* half the trials with many exact ties */
            for (int i = 0; i < n; i++)
                l[i] = quant ? (float)trng_int(24) * 0.25f - 3.0f : (float)(3.0 * trng_normal());
            if (n > 2 && trial % 5 == 0) l[trng_int(n)] = -INFINITY;
            ag_logit_bias lb[3];
            if (trial % 3 == 0) { /* exactly representable biases, one ban */
                lb[0] = (ag_logit_bias){trng_int(n), 1.25f};
                lb[1] = (ag_logit_bias){trng_int(n), -2.5f};
                lb[2] = (ag_logit_bias){trng_int(n), -100.0f};
                p.logit_bias = lb;
                p.n_logit_bias = n > 2 ? 3 : 2;
            }
            ag_sampler *s = new_sampler(&p, n, 0);
            ref_processed(l, n, &p, NULL, 0, proc);
            int any = 0;
            for (int i = 0; i < n; i++) any |= proc[i] > -INFINITY;
            if (!any) {
                assert_int_equal(ag_sampler_probs(s, l, got), AG_ERR_INVALID);
                ag_sampler_free(s);
                continue;
            }
            ref_probs(proc, n, &p, want);
            assert_int_equal(ag_sampler_probs(s, l, got), AG_OK);
            assert_probs_match(got, want, n);
            /* sample() must draw only from that support */
            for (int k = 0; k < 20; k++) {
                ag_sample_result r;
                assert_int_equal(ag_sampler_sample(s, l, &r), AG_OK);
                assert_true(r.token >= 0 && r.token < n);
                assert_true(want[r.token] > 0.0);
            }
            ag_sampler_free(s);
            checked++;
        }
        free(l);
        free(got);
        free(proc);
        free(want);
    }
    assert_true(checked > 400);
}

/* top_p with top_k off on a large, nearly flat vocab forces several rounds
 * of the growing partial sort; compare against the full sort. */
static void chain_large_vocab_top_p(void **state) {
    enum { N = 60000 };
    float *l = malloc(N * sizeof *l), *got = malloc(N * sizeof *got);
    double *proc = malloc(N * sizeof *proc), *want = malloc(N * sizeof *want);
    const float tps[] = {0.05f, 0.5f, 0.95f, 0.999f};
    for (int k = 0; k < 4; k++) {
        ag_sample_params p = ag_sample_default_params();
        p.top_p = tps[k];
        p.temperature = 0.8f;
        p.min_p = k == 3 ? 0.2f : 0.0f;
        for (int i = 0; i < N; i++) l[i] = (float)(0.3 * trng_normal());
        ag_sampler *s = new_sampler(&p, N, 0);
        ref_processed(l, N, &p, NULL, 0, proc);
        ref_probs(proc, N, &p, want);
        assert_int_equal(ag_sampler_probs(s, l, got), AG_OK);
        assert_probs_match(got, want, N);
        int kept = 0;
        for (int i = 0; i < N; i++) kept += want[i] > 0;
        print_message("top_p=%.3f min_p=%.2f: %d of %d kept\n", (double)p.top_p, (double)p.min_p, kept, N);
        ag_sampler_free(s);
    }
    free(l);
    free(got);
    free(proc);
    free(want);
}

/* The kept tokens are drawn in id order (sample.h, step 8): the token for a
 * uniform u is the first id, in id order over the reference's support, at
 * which the running sum of the sampler's float weights exceeds u times their
 * total. u comes from a twin temperature-only sampler (same seed and stream:
 * the same first uniform). Large kept sets take the placement path of the
 * id ordering, top-k above 1024 the quickselect, min-p alone no reordering. */
static void draw_walks_the_kept_set_in_id_order(void **state) {
    enum { N = 60000 };
    float  *l = malloc(N * sizeof *l);
    double *proc = malloc(N * sizeof *proc), *want = malloc(N * sizeof *want);
    const struct { int top_k; float top_p, min_p, temp; } cases[] = {
        {0, 0.999f, 0.0f, 0.8f}, {0, 0.95f, 0.0f, 1.3f}, {3000, 0.9f, 0.0f, 0.7f}, {3000, 1.0f, 0.0f, 1.0f},
        {0, 1.0f, 0.3f, 0.9f},   {50, 1.0f, 0.0f, 2.0f}, {40, 0.95f, 0.05f, 0.6f}, {0, 1.0f, 0.0f, 1.1f},
    };
    int draws = 0;
    for (size_t ci = 0; ci < sizeof cases / sizeof *cases; ci++)
        for (int round = 0; round < 6; round++) {
            ag_sample_params p = ag_sample_default_params(), q;
            p.top_k = cases[ci].top_k;
            p.top_p = cases[ci].top_p;
            p.min_p = cases[ci].min_p;
            p.temperature = cases[ci].temp;
            p.seed = 77 + (uint64_t)(ci * 10 + round);
            q = ag_sample_default_params();
            q.temperature = 1.0f;
            q.seed = p.seed;
            for (int i = 0; i < N; i++) l[i] = round % 2 ? (float)(0.2 * trng_normal()) : (float)(2.0 * trng_normal());
            ag_sampler *a = new_sampler(&p, N, 3), *b = new_sampler(&q, N, 3);
            ag_pick     d;
            assert_int_equal(ag_sampler_draw_pick(b, &d), AG_OK);
            ref_processed(l, N, &p, NULL, 0, proc);
            ref_probs(proc, N, &p, want);
            float m = -INFINITY;
            for (int i = 0; i < N; i++) m = l[i] > m ? l[i] : m;
            const float inv_temp = 1.0f / p.temperature;
            double      sum = 0.0, cum = 0.0;
            for (int i = 0; i < N; i++)
                if (want[i] > 0) sum += (double)expf((l[i] - m) * inv_temp);
            int expect = -1;
            for (int i = 0; i < N && expect < 0; i++) {
                if (!(want[i] > 0)) continue;
                cum += (double)expf((l[i] - m) * inv_temp);
                if (d.u * sum < cum) expect = i;
            }
            ag_sample_result r;
            assert_int_equal(ag_sampler_sample(a, l, &r), AG_OK);
            assert_int_equal(r.token, expect);
            draws++;
            ag_sampler_free(a);
            ag_sampler_free(b);
        }
    assert_int_equal(draws, 48);
    free(l);
    free(proc);
    free(want);
}

/* ag_top_cands_f32 against a sort of the sanitized row: the same best k in
 * the total order, the count of finite values, the max, and the sum of
 * exponentials summed as the sampler sums it (index order, bit for bit). */
static void top_cands_match_a_sort(void **state) {
    static const int sizes[] = {1, 3, 40, 257, 5000};
    static const int ks[] = {1, 2, 40, 256, 300};
    for (size_t si = 0; si < sizeof sizes / sizeof *sizes; si++)
        for (int trial = 0; trial < 30; trial++) {
            const int n = sizes[si];
            float    *l = malloc((size_t)n * sizeof *l);
            rc       *ref = malloc((size_t)n * sizeof *ref);
            for (int i = 0; i < n; i++)
                l[i] = trial % 2 ? (float)trng_int(12) * 0.5f - 3.0f : (float)(3.0 * trng_normal());
            if (trial % 3 == 0) l[trng_int(n)] = NAN;
            if (trial % 4 == 0) l[trng_int(n)] = -INFINITY;
            if (trial % 5 == 0) l[trng_int(n)] = INFINITY;
            if (trial % 7 == 0) l[trng_int(n)] = FLT_MAX; /* ties with +inf once sanitized */
            if (trial == 29)
                for (int i = 0; i < n; i++) l[i] = i % 2 ? NAN : -INFINITY; /* nothing finite */
            int nf = 0;
            for (int i = 0; i < n; i++) {
                float v = ag_logit_sanitize(l[i]);
                if (v == -INFINITY) continue;
                ref[nf++] = (rc){v, i};
            }
            qsort(ref, (size_t)nf, sizeof *ref, rc_cmp);
            const int     k = ks[trial % 5];
            ag_cands_req  req = {k, trial % 2, trial % 3 ? trng_int(n + 1) : -1}; /* at: n is past the row */
            static ag_cands c;
            ag_top_cands_f32(l, n, &req, &c);
            const int kk = k > AG_CANDS_MAX ? AG_CANDS_MAX : k;
            assert_int_equal(c.n_finite, nf);
            assert_int_equal(c.n, nf < kk ? nf : kk);
            for (int i = 0; i < c.n; i++) {
                assert_int_equal(c.c[i].id, ref[i].id);
                assert_true(c.c[i].l == (float)ref[i].l);
            }
            if (nf == 0) {
                assert_true(c.max == -INFINITY);
            } else {
                assert_true(c.max == (float)ref[0].l);
            }
            if (req.at >= 0 && req.at < n) { /* the named id's value, best or not */
                assert_int_equal(c.at, req.at);
                float v = ag_logit_sanitize(l[req.at]);
                assert_memory_equal(&c.at_l, &v, sizeof v);
            } else {
                assert_true(c.at == -1 && isnan(c.at_l));
            }
            if (req.want_z) {
                double z = 0.0;
                for (int i = 0; i < n && nf; i++) z += (double)expf(ag_logit_sanitize(l[i]) - c.max);
                assert_memory_equal(&z, &c.sumexp, sizeof z);
            } else {
                assert_true(isnan(c.sumexp));
            }
            free(l);
            free(ref);
        }
}

/* A sampler fed a row's candidates (ag_sampler_cands_req, ag_top_cands_f32)
 * gives what it gives the whole row: the token, its logprob and the
 * alternatives, bit for bit, draw after draw. With top-k off (a top-p or
 * min-p cut) the candidates are used when ag_sampler_cands_enough says the
 * cut falls among them, else the row, as the engine does: both branches
 * are taken. */
static void cands_draw_what_sample_draws(void **state) {
    static const int sizes[] = {7, 300, 4000};
    int              compared = 0, from_row = 0, off_cands = 0;
    static ag_cands  c;
    for (size_t si = 0; si < sizeof sizes / sizeof *sizes; si++)
        for (int round = 0; round < 40; round++) {
            const int        n = sizes[si];
            ag_sample_params p = ag_sample_default_params();
            p.temperature = round % 8 == 0 ? 0.0f : (float)(0.2 + 1.8 * trng_unit());
            p.top_k = 1 + trng_int(round % 3 ? 60 : AG_CANDS_MAX);
            p.top_p = round % 3 == 0 ? 1.0f : (float)(0.3 + 0.7 * trng_unit());
            p.min_p = round % 4 == 0 ? (float)(0.2 * trng_unit()) : 0.0f;
            if (round % 5 == 2) { /* top-k off: the cut may fall past the candidates */
                p.top_k = 0;
                p.top_p = round % 2 ? 1.0f : (float)(0.5 + 0.5 * trng_unit());
                p.min_p = round % 2 ? (float)(0.01 + 0.2 * trng_unit()) : p.min_p;
            }
            p.logprobs = round % 2;
            p.n_logprobs = round % 5 == 0 ? trng_int(AG_SAMPLE_MAX_LOGPROBS + 1) : 0;
            if (p.temperature == 0.0f) p.logprobs = 1; /* else it is the argmax-only sampler */
            p.seed = 500 + (uint64_t)round;
            ag_sampler  *a = new_sampler(&p, n, 1), *b = new_sampler(&p, n, 1);
            ag_cands_req req;
            const int top_k_off = p.top_k == 0 || p.top_k >= n;
            if (top_k_off && p.temperature > 0.0f && p.top_p >= 1.0f && p.min_p <= 0.0f) { /* no cut: the row */
                assert_false(ag_sampler_cands_req(b, &req));
                ag_sampler_free(a);
                ag_sampler_free(b);
                continue;
            }
            assert_true(ag_sampler_cands_req(b, &req));
            assert_true(req.k >= (p.temperature > 0.0f && !top_k_off ? p.top_k : 1) && req.k >= p.n_logprobs);
            if (top_k_off && p.temperature > 0.0f) assert_int_equal(req.k, AG_CANDS_MAX);
            assert_int_equal(req.want_z, p.logprobs || p.n_logprobs > 0 ||
                                             (top_k_off && p.temperature > 0.0f && p.top_p < 1.0f));
            float *l = malloc((size_t)n * sizeof *l);
            for (int step = 0; step < 25; step++) {
                for (int i = 0; i < n; i++)
                    l[i] = step % 3 ? (float)(2.5 * trng_normal()) : (float)trng_int(8) * 0.5f; /* ties */
                if (step % 4 == 1) l[trng_int(n)] = NAN;
                if (step % 5 == 2) l[trng_int(n)] = -INFINITY;
                if (step % 6 == 3) l[trng_int(n)] = INFINITY;
                if (step == 24 && n == 7)
                    for (int i = 1; i < n; i++) l[i] = -INFINITY; /* fewer finite values than k */
                ag_sample_result ra, rb;
                assert_int_equal(ag_sampler_sample(a, l, &ra), AG_OK);
                ag_top_cands_f32(l, n, &req, &c);
                if (ag_sampler_cands_enough(b, &c)) {
                    assert_int_equal(ag_sampler_sample_cands(b, &c, &rb), AG_OK);
                    off_cands += top_k_off && p.temperature > 0.0f && c.n < c.n_finite;
                } else {
                    assert_true(top_k_off); /* top-k and greedy samplers always have enough */
                    assert_int_equal(ag_sampler_sample_cands(b, &c, &rb), AG_ERR_INVALID);
                    assert_int_equal(ag_sampler_sample(b, l, &rb), AG_OK);
                    from_row++;
                }
                assert_same_result(&rb, &ra);
                assert_int_equal(ag_sampler_accept(a, ra.token), AG_OK);
                assert_int_equal(ag_sampler_accept(b, rb.token), AG_OK);
                compared++;
            }
            free(l);
            ag_sampler_free(a);
            ag_sampler_free(b);
        }
    print_message("%d draws compared; top-k off: %d cut among the candidates, %d from the row (cut past them)\n",
                  compared, off_cands, from_row);
    assert_true(compared > 1500);
    assert_true(from_row > 20 && off_cands > 100);
    /* refused: samplers that need the row, candidates that do not answer */
    ag_sample_params p = ag_sample_default_params();
    p.temperature = 0.8f;
    p.top_k = 5;
    ag_sampler *s = new_sampler(&p, 50, 0);
    float       l[50];
    for (int i = 0; i < 50; i++) l[i] = (float)i;
    ag_cands_req     req = {3, 0, -1};
    ag_sample_result r;
    ag_top_cands_f32(l, 50, &req, &c); /* 3 < top_k 5 */
    assert_int_equal(ag_sampler_sample_cands(s, &c, &r), AG_ERR_INVALID);
    req.k = 5;
    ag_top_cands_f32(l, 50, &req, &c);
    c.c[1].id = 50;
    assert_int_equal(ag_sampler_sample_cands(s, &c, &r), AG_ERR_INVALID);
    for (int i = 0; i < 50; i++) l[i] = -INFINITY;
    ag_top_cands_f32(l, 50, &req, &c);
    assert_int_equal(ag_sampler_sample_cands(s, &c, &r), AG_ERR_INVALID);
    assert_non_null(strstr(ag_error_message(), "finite"));
    ag_sampler_free(s);
    ag_sample_params q[4];
    for (int i = 0; i < 4; i++) q[i] = p;
    q[0].top_k = 0;                /* the whole row */
    q[1].presence_penalty = 0.5f;  /* penalties read the row */
    q[2].temperature = 0.0f;       /* the argmax alone */
    q[3].top_k = AG_CANDS_MAX + 1; /* more than a row gives */
    for (int i = 0; i < 4; i++) {
        s = new_sampler(&q[i], 300, 0);
        assert_false(ag_sampler_cands_req(s, &req));
        assert_int_equal(ag_sampler_sample_cands(s, &c, &r), AG_ERR_INVALID);
        ag_sampler_free(s);
    }
}

/* A verify position decided from the row's candidates (ag_sampler_probs_cands,
 * ag_sampler_verify_cands, ag_sampler_logprobs_cands) gives what the row
 * gives (ag_sampler_probs, ag_sampler_verify, ag_sampler_logprobs): the
 * same probabilities bit for bit (every other token 0), the same accept or
 * reject and correction, the same RNG stream after it, the same logprobs.
 * Drafts are kept tokens, tokens outside the kept set, and the argmax; q
 * one-hot (NULL) or a dense distribution with holes. */
/* A sampler with bias and penalties whose rows come edited
 * (ag_sampler_take_edited_rows) gives, from the row with its edits applied
 * (ag_sampler_row_edits, ag_logit_edit_apply) and from that row's
 * candidates, its argmax or its pick, what the sampler reading the raw row
 * gives, bit for bit: the edits are steps 1-2 exactly. */
static void edited_rows_sample_what_raw_rows_sample(void **state) {
    static ag_cands c;
    int             by_cands = 0, by_argmax = 0, by_pick = 0, edits_seen = 0;
    for (int round = 0; round < 60; round++) {
        const int        n = round % 2 ? 300 : 5000;
        ag_sample_params p = ag_sample_default_params();
        p.temperature = round % 6 == 0 ? 0.0f : (float)(0.3 + 1.5 * trng_unit());
        p.top_k = round % 4 == 1 ? 0 : 1 + trng_int(AG_CANDS_MAX);
        p.top_p = round % 3 == 0 ? 1.0f : (float)(0.4 + 0.6 * trng_unit());
        p.min_p = round % 5 == 0 ? (float)(0.1 * trng_unit()) : 0.0f;
        if (round % 7 == 3) p.top_k = 0, p.top_p = 1.0f, p.min_p = 0.0f; /* temperature only: pick */
        p.logprobs = round % 3 == 1;
        p.n_logprobs = round % 9 == 4 ? 1 + trng_int(AG_SAMPLE_MAX_LOGPROBS) : 0;
        p.repetition_penalty = round % 4 == 3 ? 1.0f : (float)(0.7 + 0.8 * trng_unit());
        p.frequency_penalty = round % 3 == 2 ? 0.0f : (float)(2.0 * trng_unit() - 1.0);
        p.presence_penalty = (float)(2.0 * trng_unit() - 1.0);
        p.penalty_last_n = round % 5 == 1 ? 8 : -1;
        ag_logit_bias lb[6];
        const int     nb = round % 4 == 2 ? 0 : 6;
        for (int i = 0; i < nb; i++) lb[i] = (ag_logit_bias){trng_int(40), (float)(8.0 * trng_unit() - 4.0)};
        if (nb) lb[5] = (ag_logit_bias){lb[1].token, -100.0f}; /* a ban after a bias of the same token */
        if (nb && round % 3 == 0) lb[4].bias = 3e38f;           /* overflows to +inf: sanitized */
        p.logit_bias = lb;
        p.n_logit_bias = nb;
        p.seed = 900 + (uint64_t)round;
        /* raw: reads raw rows; row, cands, quick: take edited rows */
        ag_sampler *raw = new_sampler(&p, n, 2), *row = new_sampler(&p, n, 2), *cands = new_sampler(&p, n, 2),
                   *quick = new_sampler(&p, n, 2);
        assert_true(ag_sampler_has_edits(raw));
        ag_sampler_take_edited_rows(row);
        ag_sampler_take_edited_rows(cands);
        ag_sampler_take_edited_rows(quick);
        ag_cands_req req;
        const int    has_req = ag_sampler_cands_req(cands, &req);
        assert_false(ag_sampler_cands_req(raw, NULL)); /* reading raw rows, it needs the whole row */
        float *l = malloc(sizeof(float) * (size_t)n), *ed = malloc(sizeof(float) * (size_t)n),
              *proc = malloc(sizeof(float) * (size_t)n);
        ag_logit_edit *e = NULL;
        for (int step = 0; step < 12; step++) {
            for (int i = 0; i < n; i++) l[i] = step % 4 == 3 ? (float)trng_int(6) : (float)(2.0 * trng_normal());
            if (step % 3 == 1) l[trng_int(40)] = NAN, l[trng_int(40)] = INFINITY, l[trng_int(40)] = -0.0f;
            const size_t cap = ag_sampler_max_edits(raw);
            e = realloc(e, sizeof *e * (cap ? cap : 1));
            const size_t ne = ag_sampler_row_edits(raw, e);
            assert_true(ne <= cap);
            assert_int_equal(ne, ag_sampler_row_edits(row, e)); /* (the same history) */
            edits_seen += (int)ne;
            for (int i = 0; i < n; i++) ed[i] = l[i];
            for (size_t k = 0; k < ne; k++) {
                for (size_t j = 0; j < k; j++) assert_int_not_equal(e[j].id, e[k].id); /* a token once */
                ed[e[k].id] = ag_logit_edit_apply(l[e[k].id], &e[k]);
            }
            for (int i = 0; i < n; i++) ed[i] = ag_logit_sanitize(ed[i]);
            assert_int_equal(ag_sampler_logits(raw, l, proc), AG_OK);
            assert_memory_equal(proc, ed, sizeof(float) * (size_t)n);
            ag_sample_result a, b, q;
            assert_int_equal(ag_sampler_sample(raw, l, &a), AG_OK);
            assert_int_equal(ag_sampler_sample(row, ed, &b), AG_OK);
            assert_same_result(&b, &a);
            if (ag_sampler_argmax_only(quick)) {
                assert_int_equal(ag_argmax_f32(ed, n), a.token);
                by_argmax++;
            } else if (ag_sampler_pick_only(quick)) {
                ag_pick d;
                assert_int_equal(ag_sampler_draw_pick(quick, &d), AG_OK);
                assert_int_equal(ag_pick_f32(ed, n, d.inv_temp, d.u), a.token);
                by_pick++;
            }
            if (has_req) {
                ag_top_cands_f32(ed, n, &req, &c);
                if (ag_sampler_cands_enough(cands, &c)) {
                    assert_int_equal(ag_sampler_sample_cands(cands, &c, &q), AG_OK);
                    by_cands++;
                } else {
                    assert_int_equal(ag_sampler_sample(cands, ed, &q), AG_OK);
                }
                assert_same_result(&q, &a);
            }
            ag_sampler *all[] = {raw, row, cands, quick};
            const int32_t next = step % 2 ? a.token : trng_int(40); /* (often a biased token) */
            for (int k = 0; k < 4; k++) assert_int_equal(ag_sampler_accept(all[k], next), AG_OK);
        }
        free(e);
        free(l);
        free(ed);
        free(proc);
        ag_sampler_free(raw);
        ag_sampler_free(row);
        ag_sampler_free(cands);
        ag_sampler_free(quick);
    }
    print_message("edited rows: %d edits, %d by candidates, %d by argmax, %d by pick\n", edits_seen, by_cands,
                  by_argmax, by_pick);
    assert_true(by_cands > 100 && by_argmax > 20 && by_pick > 10);
}

static void cands_verify_what_rows_verify(void **state) {
    static const int sizes[] = {9, 400, 3000};
    static ag_cands      c;
    static ag_cand_probs cp;
    int                  compared = 0, accepted = 0, rejected = 0, from_row = 0;
    for (size_t si = 0; si < sizeof sizes / sizeof *sizes; si++)
        for (int round = 0; round < 30; round++) {
            const int        n = sizes[si];
            ag_sample_params p = ag_sample_default_params();
            p.temperature = round % 10 == 0 ? 0.0f : (float)(0.3 + 1.5 * trng_unit());
            p.top_k = 1 + trng_int(round % 3 ? 50 : AG_CANDS_MAX);
            p.top_p = round % 3 == 1 ? 1.0f : (float)(0.4 + 0.6 * trng_unit());
            p.min_p = round % 4 == 0 ? (float)(0.15 * trng_unit()) : 0.0f;
            if (round % 5 == 2) p.top_k = 0; /* top-k off: a cut that may fall past the candidates */
            if ((p.top_k == 0 || p.top_k >= n) && p.top_p >= 1.0f && p.min_p <= 0.0f)
                p.min_p = (float)(0.01 + 0.1 * trng_unit()); /* else a pick-only sampler */
            p.logprobs = round % 2 || p.temperature == 0.0f;
            p.n_logprobs = round % 3 == 0 ? trng_int(AG_SAMPLE_MAX_LOGPROBS + 1) : 0;
            p.seed = 900 + (uint64_t)round;
            ag_sampler  *a = new_sampler(&p, n, 2), *b = new_sampler(&p, n, 2);
            ag_cands_req req;
            assert_true(ag_sampler_cands_req(b, &req));
            float *l = malloc((size_t)n * sizeof *l), *pa = malloc((size_t)n * sizeof *pa);
            float *q = malloc((size_t)n * sizeof *q);
            for (int step = 0; step < 30; step++) {
                for (int i = 0; i < n; i++)
                    l[i] = step % 4 ? (float)(2.0 * trng_normal()) : (float)trng_int(6) * 0.5f; /* ties */
                if (step % 5 == 1) l[trng_int(n)] = NAN;
                if (step % 6 == 2) l[trng_int(n)] = -INFINITY;
                const float *qq = NULL;
                if (step % 2) { /* a dense q with holes */
                    double z = 0.0;
                    for (int i = 0; i < n; i++) z += q[i] = trng_int(4) ? (float)trng_unit() : 0.0f;
                    for (int i = 0; i < n; i++) q[i] = (float)(q[i] / (z > 0 ? z : 1.0));
                    qq = q;
                }
                assert_int_equal(ag_sampler_probs(a, l, pa), AG_OK);
                int32_t x = trng_int(n);
                if (step % 3 == 0) { /* a kept token */
                    int32_t kept[AG_CANDS_MAX * 4], nk = 0;
                    for (int i = 0; i < n && nk < (int)(sizeof kept / sizeof *kept); i++)
                        if (pa[i] > 0.0f) kept[nk++] = i;
                    x = kept[trng_int(nk)];
                }
                ag_verify_result va, vb;
                ag_sample_result ra, rb;
                assert_int_equal(ag_sampler_verify(a, pa, qq, x, &va), AG_OK);
                ag_top_cands_f32(l, n, &req, &c);
                if (!ag_sampler_cands_enough(b, &c)) { /* the engine reads such a row whole */
                    assert_int_equal(ag_sampler_probs_cands(b, &c, &cp), AG_ERR_INVALID);
                    float *pb = malloc((size_t)n * sizeof *pb);
                    assert_int_equal(ag_sampler_probs(b, l, pb), AG_OK);
                    assert_int_equal(ag_sampler_verify(b, pb, qq, x, &vb), AG_OK);
                    free(pb);
                    from_row++;
                } else {
                    assert_int_equal(ag_sampler_probs_cands(b, &c, &cp), AG_OK);
                    int nz = 0;
                    for (int i = 0; i < n; i++) nz += pa[i] != 0.0f;
                    assert_int_equal(cp.n, nz);
                    for (int j = 0; j < cp.n; j++) {
                        if (j) assert_true(cp.id[j] > cp.id[j - 1]);
                        assert_memory_equal(&cp.p[j], &pa[cp.id[j]], sizeof(float));
                    }
                    assert_int_equal(ag_sampler_verify_cands(b, &cp, qq, x, &vb), AG_OK);
                }
                assert_int_equal(vb.accepted, va.accepted);
                assert_int_equal(vb.token, va.token);
                accepted += va.accepted;
                rejected += !va.accepted;
                if (p.logprobs || p.n_logprobs > 0) {
                    assert_int_equal(ag_sampler_logprobs(a, l, va.token, &ra), AG_OK);
                    if (ag_sampler_cands_enough(b, &c)) {
                        assert_int_equal(ag_sampler_logprobs_cands(b, &c, vb.token, &rb), AG_OK);
                        assert_same_result(&rb, &ra);
                    }
                }
                assert_int_equal(ag_sampler_accept(a, va.token), AG_OK);
                assert_int_equal(ag_sampler_accept(b, vb.token), AG_OK);
                compared++;
            }
            /* the RNG streams stayed together */
            ag_sample_result ra, rb;
            assert_int_equal(ag_sampler_sample(a, l, &ra), AG_OK);
            if (ag_sampler_cands_enough(b, &c)) assert_int_equal(ag_sampler_sample_cands(b, &c, &rb), AG_OK);
            else assert_int_equal(ag_sampler_sample(b, l, &rb), AG_OK);
            assert_int_equal(rb.token, ra.token);
            free(l);
            free(pa);
            free(q);
            ag_sampler_free(a);
            ag_sampler_free(b);
        }
    print_message("%d verify positions compared (%d accepted, %d rejected, %d read from the row)\n", compared,
                  accepted, rejected, from_row);
    assert_true(compared > 2500 && accepted > 300 && rejected > 300 && from_row > 10);
    /* refused: a token that is not a candidate, ids out of order */
    ag_sample_params p = ag_sample_default_params();
    p.temperature = 0.7f;
    p.top_k = 4;
    p.logprobs = 1;
    ag_sampler *s = new_sampler(&p, 50, 0);
    float       l[50];
    for (int i = 0; i < 50; i++) l[i] = (float)i;
    ag_cands_req     req = {4, 1, -1};
    ag_sample_result r;
    ag_verify_result v;
    ag_top_cands_f32(l, 50, &req, &c);
    assert_int_equal(ag_sampler_logprobs_cands(s, &c, 3, &r), AG_ERR_INVALID);
    assert_non_null(strstr(ag_error_message(), "not among"));
    assert_int_equal(ag_sampler_probs_cands(s, &c, &cp), AG_OK);
    assert_int_equal(cp.n, 4);
    assert_int_equal(cp.id[0], 46);
    int32_t t = cp.id[0];
    cp.id[0] = cp.id[1];
    cp.id[1] = t;
    assert_int_equal(ag_sampler_verify_cands(s, &cp, NULL, 47, &v), AG_ERR_INVALID);
    cp.n = 0;
    assert_int_equal(ag_sampler_verify_cands(s, &cp, NULL, 47, &v), AG_ERR_INVALID);
    ag_sampler_free(s);
}

/* A scored token's logprob and alternatives from candidates whose request
 * named it (ag_sampler_logprobs_req: at = the token, best or not) equal
 * ag_sampler_logprobs of the row, bit for bit; a token neither among them
 * nor named is refused, and samplers with bias or penalties need the row. */
static void scored_tokens_from_candidates(void **state) {
    static ag_cands c;
    const int       n = 5000;
    float          *l = malloc((size_t)n * sizeof *l);
    int             outside = 0;
    for (int round = 0; round < 200; round++) {
        ag_sample_params p = ag_sample_default_params();
        p.logprobs = 1;
        p.n_logprobs = round % 3 ? trng_int(AG_SAMPLE_MAX_LOGPROBS + 1) : 0;
        ag_sampler *a = new_sampler(&p, n, 0), *b = new_sampler(&p, n, 0);
        for (int i = 0; i < n; i++) l[i] = round % 4 ? (float)(3.0 * trng_normal()) : (float)trng_int(5);
        if (round % 5 == 1) l[trng_int(n)] = NAN;
        if (round % 7 == 2) l[trng_int(n)] = -INFINITY;
        int32_t tok = trng_int(n);
        if (round % 6 == 0) tok = ag_argmax_f32(l, n);
        if (round == 7) l[tok] = NAN; /* a token with no probability: -inf */
        ag_cands_req req;
        assert_true(ag_sampler_logprobs_req(b, tok, &req));
        assert_int_equal(req.at, tok);
        assert_true(req.want_z && req.k >= 1 && req.k >= p.n_logprobs);
        ag_top_cands_f32(l, n, &req, &c);
        ag_sample_result ra, rb;
        assert_int_equal(ag_sampler_logprobs(a, l, tok, &ra), AG_OK);
        assert_int_equal(ag_sampler_logprobs_cands(b, &c, tok, &rb), AG_OK);
        assert_same_result(&rb, &ra);
        int among = 0;
        for (int j = 0; j < c.n; j++) among |= c.c[j].id == tok;
        outside += !among;
        if (!among) { /* named but not a candidate: unnamed, it is refused */
            c.at = -1;
            assert_int_equal(ag_sampler_logprobs_cands(b, &c, tok, &rb), AG_ERR_INVALID);
            assert_non_null(strstr(ag_error_message(), "not among"));
        }
        ag_sampler_free(a);
        ag_sampler_free(b);
    }
    assert_true(outside > 100);
    free(l);
    ag_sample_params p = ag_sample_default_params();
    p.logprobs = 1;
    p.frequency_penalty = 0.5f;
    ag_sampler *s = new_sampler(&p, n, 0);
    assert_false(ag_sampler_logprobs_req(s, 3, NULL));
    ag_sampler_free(s);
    p = ag_sample_default_params(); /* no logprobs asked */
    s = new_sampler(&p, n, 0);
    assert_false(ag_sampler_logprobs_req(s, 3, NULL));
    ag_sampler_free(s);
}

/* A sampler with only a temperature that reports logprobs draws its uniform
 * ahead like a pick-only one; the token picked elsewhere and the row's
 * candidates naming it (ag_sampler_pick_logprobs' request, at = the token)
 * give what ag_sampler_sample gives the row: token, logprob, alternatives,
 * bit for bit, step after step. */
static void picked_tokens_with_logprobs(void **state) {
    static ag_cands c;
    const int       n = 3000;
    float          *l = malloc((size_t)n * sizeof *l);
    int             outside = 0;
    for (int round = 0; round < 20; round++) {
        ag_sample_params p = ag_sample_default_params();
        p.temperature = (float)(0.3 + 2.0 * trng_unit());
        p.logprobs = 1;
        p.n_logprobs = round % 4 ? trng_int(AG_SAMPLE_MAX_LOGPROBS + 1) : 0;
        p.seed = 300 + (uint64_t)round;
        ag_sampler *a = new_sampler(&p, n, 5), *b = new_sampler(&p, n, 5);
        ag_cands_req req;
        assert_false(ag_sampler_pick_only(b));
        assert_true(ag_sampler_pick_logprobs(b, &req));
        assert_true(req.at == AG_CANDS_AT_TOKEN && req.want_z && req.k >= p.n_logprobs && req.k >= 1);
        for (int step = 0; step < 20; step++) {
            for (int i = 0; i < n; i++) l[i] = (float)(2.0 * trng_normal());
            if (step % 3 == 0) l[trng_int(n)] = NAN;
            if (step % 4 == 1) l[trng_int(n)] = INFINITY;
            ag_sample_result ra, rb;
            ag_pick          d;
            assert_int_equal(ag_sampler_sample(a, l, &ra), AG_OK);
            assert_int_equal(ag_sampler_draw_pick(b, &d), AG_OK);
            const int32_t tok = ag_pick_f32(l, n, d.inv_temp, d.u);
            ag_cands_req  h = req;
            h.at = tok; /* as the backend names it */
            ag_top_cands_f32(l, n, &h, &c);
            int among = 0;
            for (int j = 0; j < c.n; j++) among |= c.c[j].id == tok;
            outside += !among;
            assert_int_equal(ag_sampler_sample_picked_cands(b, tok, &c, &rb), AG_OK);
            assert_same_result(&rb, &ra);
            assert_int_equal(ag_sampler_accept(a, ra.token), AG_OK);
            assert_int_equal(ag_sampler_accept(b, rb.token), AG_OK);
        }
        ag_sampler_free(a);
        ag_sampler_free(b);
    }
    assert_true(outside > 50); /* mostly a token outside the best: its value came from at */
    free(l);
    /* not for a pick-only sampler (no logprobs) or one that truncates */
    ag_sample_params p = ag_sample_default_params();
    p.temperature = 0.9f;
    ag_sampler      *s = new_sampler(&p, 50, 0);
    ag_sample_result r;
    assert_false(ag_sampler_pick_logprobs(s, NULL));
    assert_int_equal(ag_sampler_sample_picked_cands(s, 3, &c, &r), AG_ERR_INVALID);
    ag_sampler_free(s);
    p.logprobs = 1;
    p.top_k = 10;
    s = new_sampler(&p, 50, 0);
    assert_false(ag_sampler_pick_logprobs(s, NULL));
    ag_sampler_free(s);
}

/* Not an assertion on speed (the machine is shared), a measurement. */
static void chain_timing_150k(void **state) {
    enum { N = 151936 }; /* Qwen2.5 vocab */
    float *l = malloc(N * sizeof *l);
    for (int i = 0; i < N; i++) l[i] = (float)(2.5 * trng_normal());
    struct {
        const char *name;
        float t, tp, mp;
        int tk;
    } cfg[] = {
        {"greedy", 0.0f, 1.0f, 0.0f, 0},         {"T=1 full vocab", 1.0f, 1.0f, 0.0f, 0},
        {"top_k=40", 0.8f, 1.0f, 0.0f, 40},      {"top_p=0.9 (top_k off)", 0.8f, 0.9f, 0.0f, 0},
        {"top_k=40 top_p=0.95 min_p=0.05", 0.8f, 0.95f, 0.05f, 40},
    };
    for (size_t c = 0; c < sizeof cfg / sizeof *cfg; c++) {
        for (int lp = 0; lp < 2; lp++) {
            ag_sample_params p = ag_sample_default_params();
            p.temperature = cfg[c].t;
            p.top_p = cfg[c].tp;
            p.min_p = cfg[c].mp;
            p.top_k = cfg[c].tk;
            p.n_logprobs = lp ? 5 : 0;
            ag_sampler *s = new_sampler(&p, N, 0);
            double best = 1e9; /* the minimum: the machine is shared */
            for (int r = 0; r < 15; r++) {
                struct timespec a, b;
                clock_gettime(CLOCK_MONOTONIC, &a);
                ag_sample_result res;
                assert_int_equal(ag_sampler_sample(s, l, &res), AG_OK);
                clock_gettime(CLOCK_MONOTONIC, &b);
                double ms = (double)(b.tv_sec - a.tv_sec) * 1e3 + (double)(b.tv_nsec - a.tv_nsec) / 1e6;
                if (ms < best) best = ms;
            }
            print_message("sample, vocab %d, %-32s %s %.3f ms/token\n", N, cfg[c].name,
                          lp ? "+logprobs" : "         ", best);
            ag_sampler_free(s);
        }
    }
    free(l);
}

/* ---- penalties and bias ----------------------------------------------- */

static void check_processed(ag_sampler *s, const float *l, int n, const ag_sample_params *p,
                            const int32_t *hist, int nh) {
    float *got = malloc((size_t)n * sizeof *got);
    double *want = malloc((size_t)n * sizeof *want);
    assert_int_equal(ag_sampler_logits(s, l, got), AG_OK);
    ref_processed(l, n, p, hist, nh, want);
    for (int i = 0; i < n; i++) {
        if (want[i] == -INFINITY) {
            if (got[i] != -INFINITY) fail_msg("token %d: got %g want -inf", i, (double)got[i]);
            continue;
        }
        if (fabs((double)got[i] - want[i]) > 1e-6 * fmax(1.0, fabs(want[i])))
            fail_msg("token %d: got %.9g want %.9g", i, (double)got[i], want[i]);
    }
    free(got);
    free(want);
}

static void penalties_and_bias_follow_formulas(void **state) {
    /* Hand-checked anchor: the formulas on a few values. */
    {
        ag_sample_params p = ag_sample_default_params();
        p.repetition_penalty = 2.0f;
        p.frequency_penalty = 0.5f;
        p.presence_penalty = 0.25f;
        ag_logit_bias lb[] = {{0, 1.0f}, {3, -100.0f}, {4, 0.5f}, {4, 0.25f}};
        p.logit_bias = lb;
        p.n_logit_bias = 4;
        ag_sampler *s = new_sampler(&p, 6, 0);
        float l[6] = {3.0f, -3.0f, 1.0f, 50.0f, 0.0f, 2.0f};
        /* history: token 0 twice, token 1 once */
        assert_int_equal(ag_sampler_accept(s, 0), AG_OK);
        assert_int_equal(ag_sampler_accept(s, 1), AG_OK);
        assert_int_equal(ag_sampler_accept(s, 0), AG_OK);
        float got[6];
        assert_int_equal(ag_sampler_logits(s, l, got), AG_OK);
        /* 0: (3+1)/2 - 2*0.5 - 0.25 = 0.75;  1: -3*2 - 0.5 - 0.25 = -6.75 */
        assert_true(fabsf(got[0] - 0.75f) < 1e-6f);
        assert_true(fabsf(got[1] - -6.75f) < 1e-6f);
        assert_true(got[2] == 1.0f);
        assert_true(got[3] == -INFINITY); /* banned despite a huge logit */
        assert_true(got[4] == 0.75f);     /* duplicate biases add */
        assert_true(got[5] == 2.0f);
        ag_sample_result r;
        for (int k = 0; k < 200; k++) {
            assert_int_equal(ag_sampler_sample(s, l, &r), AG_OK);
            assert_int_not_equal(r.token, 3);
        }
        ag_sampler_free(s);
    }
    /* Random histories, windows and rewinds against the reference. */
    enum { N = 300 };
    float l[N];
    int32_t hist[400];
    const int32_t windows[] = {-1, 0, 1, 5, 64};
    for (size_t w = 0; w < sizeof windows / sizeof *windows; w++) {
        for (int trial = 0; trial < 10; trial++) {
            ag_sample_params p = ag_sample_default_params();
            p.penalty_last_n = windows[w];
            p.repetition_penalty = (float)(0.5 + 1.5 * trng_unit());
            p.frequency_penalty = (float)(4.0 * trng_unit() - 2.0);
            p.presence_penalty = (float)(4.0 * trng_unit() - 2.0);
            ag_logit_bias lb[4];
            for (int i = 0; i < 4; i++) lb[i] = (ag_logit_bias){trng_int(N), (float)(20 * trng_unit() - 10)};
            p.logit_bias = lb;
            p.n_logit_bias = 4;
            ag_sampler *s = new_sampler(&p, N, 0);
            for (int i = 0; i < N; i++) l[i] = (float)(4.0 * trng_normal());
            int nh = 0;
            for (int step = 0; step < 300; step++) {
                if (trng_int(5) == 0 && nh > 0) { /* speculative rollback */
                    int k = 1 + trng_int(nh < 6 ? nh : 6);
                    assert_int_equal(ag_sampler_rewind(s, (size_t)k), AG_OK);
                    nh -= k;
                } else {
                    /* a small alphabet so tokens repeat within windows */
                    int32_t t = trng_int(40);
                    assert_int_equal(ag_sampler_accept(s, t), AG_OK);
                    hist[nh++] = t;
                }
                assert_int_equal(ag_sampler_n_accepted(s), (size_t)nh);
                if (step % 10 == 0) check_processed(s, l, N, &p, hist, nh);
            }
            check_processed(s, l, N, &p, hist, nh);
            ag_sampler_reset(s);
            assert_int_equal(ag_sampler_n_accepted(s), 0);
            check_processed(s, l, N, &p, hist, 0);
            ag_sampler_free(s);
        }
    }
}

/* The processed chain with penalties, end to end, through probs. */
static void chain_with_penalties_matches_reference(void **state) {
    enum { N = 64 };
    float l[N], got[N];
    double proc[N], want[N];
    int32_t hist[50];
    for (int trial = 0; trial < 100; trial++) {
        ag_sample_params p;
        random_params(&p, N);
        p.repetition_penalty = 1.3f;
        p.presence_penalty = 0.5f;
        p.frequency_penalty = 0.25f;
        p.penalty_last_n = trial % 2 ? 16 : -1;
        ag_sampler *s = new_sampler(&p, N, 0);
        int nh = 1 + trng_int(50);
        for (int i = 0; i < nh; i++) {
            hist[i] = trng_int(N);
            assert_int_equal(ag_sampler_accept(s, hist[i]), AG_OK);
        }
        for (int i = 0; i < N; i++) l[i] = (float)(2.0 * trng_normal());
        ref_processed(l, N, &p, hist, nh, proc);
        ref_probs(proc, N, &p, want);
        assert_int_equal(ag_sampler_probs(s, l, got), AG_OK);
        for (int i = 0; i < N; i++) { /* rounding in the penalised logits: looser */
            if ((want[i] == 0.0) != (got[i] == 0.0f)) fail_msg("token %d support differs", i);
            assert_true(fabs((double)got[i] - want[i]) < 1e-5 * want[i] + 1e-6);
        }
        ag_sampler_free(s);
    }
}

/* ---- logprobs ------------------------------------------------------------ */

static void logprobs_are_double_log_softmax(void **state) {
    enum { N = 2000 };
    float l[N];
    double proc[N];
    for (int trial = 0; trial < 40; trial++) {
        ag_sample_params p;
        random_params(&p, N); /* the truncation must not change logprobs */
        p.n_logprobs = trial % 2 ? 20 : 1 + trng_int(20);
        ag_logit_bias lb[] = {{7, -100.0f}, {11, 3.0f}};
        p.logit_bias = lb;
        p.n_logit_bias = 2;
        p.presence_penalty = 0.7f;
        ag_sampler *s = new_sampler(&p, N, 9);
        int32_t hist[3] = {11, 12, 11};
        for (int i = 0; i < 3; i++) assert_int_equal(ag_sampler_accept(s, hist[i]), AG_OK);
        for (int i = 0; i < N; i++) l[i] = (float)(3.0 * trng_normal());
        if (trial % 4 == 0) l[100] = l[101] = l[102] = 12.0f; /* tied at the top */
        ref_processed(l, N, &p, hist, 3, proc);
        double m = -INFINITY, z = 0.0;
        for (int i = 0; i < N; i++) m = fmax(m, proc[i]);
        for (int i = 0; i < N; i++) z += exp(proc[i] - m);
        double lz = m + log(z);
        rc *v = malloc(N * sizeof *v);
        for (int i = 0; i < N; i++) v[i] = (rc){proc[i], i};
        qsort(v, N, sizeof *v, rc_cmp);

        ag_sample_result r;
        assert_int_equal(ag_sampler_sample(s, l, &r), AG_OK);
        assert_true(fabs((double)r.logprob - (proc[r.token] - lz)) < 1e-5);
        assert_int_equal(r.n_top, p.n_logprobs);
        for (int i = 0; i < r.n_top; i++) {
            assert_int_equal(r.top[i].token, v[i].id);
            assert_true(fabs((double)r.top[i].logprob - (v[i].l - lz)) < 1e-5);
        }
        ag_sample_result r2;
        assert_int_equal(ag_sampler_logprobs(s, l, 7, &r2), AG_OK);
        assert_true(r2.logprob == -INFINITY && r2.token == 7);
        assert_int_equal(ag_sampler_logprobs(s, l, 11, &r2), AG_OK);
        assert_true(fabs((double)r2.logprob - (proc[11] - lz)) < 1e-5);
        assert_memory_equal(r2.top, r.top, sizeof r.top[0] * (size_t)r.n_top);
        free(v);
        ag_sampler_free(s);
    }
    /* Fewer finite tokens than asked for. */
    ag_sample_params p = ag_sample_default_params();
    p.n_logprobs = 5;
    ag_sampler *s = new_sampler(&p, 4, 0);
    float l4[4] = {1.0f, -INFINITY, 2.0f, NAN};
    ag_sample_result r;
    assert_int_equal(ag_sampler_sample(s, l4, &r), AG_OK);
    assert_int_equal(r.n_top, 2);
    assert_int_equal(r.top[0].token, 2);
    assert_int_equal(r.top[1].token, 0);
    assert_true(fabs((double)r.top[0].logprob - (2.0 - log(exp(1.0) + exp(2.0)))) < 1e-6);
    ag_sampler_free(s);
}

/* ---- seeds ------------------------------------------------------------------ */

static void run_seq(ag_sampler *s, const float *l, int n, int32_t *out, int len) {
    for (int i = 0; i < len; i++) {
        ag_sample_result r;
        assert_int_equal(ag_sampler_sample(s, l, &r), AG_OK);
        out[i] = r.token;
        (void)n;
    }
}

static void seeds_reproduce(void **state) {
    enum { N = 500, LEN = 200 };
    float l[N];
    for (int i = 0; i < N; i++) l[i] = (float)trng_normal();
    ag_sample_params p = ag_sample_default_params();
    p.top_p = 0.9f;
    p.seed = 42;
    int32_t a[LEN], b[LEN], c[LEN], d[LEN], e[LEN];
    ag_sampler *s1 = new_sampler(&p, N, 0), *s2 = new_sampler(&p, N, 0), *s3 = new_sampler(&p, N, 1);
    run_seq(s1, l, N, a, LEN);
    run_seq(s2, l, N, b, LEN);
    run_seq(s3, l, N, d, LEN);
    assert_memory_equal(a, b, sizeof a);
    assert_memory_not_equal(a, d, sizeof a); /* another stream */
    ag_sampler_reset(s1);
    run_seq(s1, l, N, e, LEN);
    assert_memory_equal(a, e, sizeof a); /* reset replays */
    p.seed = 43;
    ag_sampler *s4 = new_sampler(&p, N, 0);
    run_seq(s4, l, N, c, LEN);
    assert_memory_not_equal(a, c, sizeof a);
    int same = 0;
    for (int i = 0; i < LEN; i++) same += a[i] == c[i];
    assert_true(same < LEN / 4); /* not merely shifted or mostly equal */
    ag_sampler_free(s1);
    ag_sampler_free(s2);
    ag_sampler_free(s3);
    ag_sampler_free(s4);
}

/* ---- empirical frequencies ---------------------------------------------------- */

static void sampling_frequencies_match(void **state) {
    enum { N = 16, DRAWS = 200000 };
    struct {
        float t, tp, mp;
        int tk;
    } cfg[] = {{1.0f, 1.0f, 0.0f, 0}, {0.7f, 1.0f, 0.0f, 10}, {1.3f, 0.9f, 0.0f, 0},
               {0.9f, 0.95f, 0.05f, 12}, {2.0f, 1.0f, 0.1f, 0}};
    float l[N];
    for (int i = 0; i < N; i++) l[i] = (float)(i % 5) * 0.6f - (float)i * 0.05f;
    for (size_t c = 0; c < sizeof cfg / sizeof *cfg; c++) {
        ag_sample_params p = ag_sample_default_params();
        p.temperature = cfg[c].t;
        p.top_p = cfg[c].tp;
        p.min_p = cfg[c].mp;
        p.top_k = cfg[c].tk;
        p.seed = 1000 + c;
        ag_sampler *s = new_sampler(&p, N, 0);
        double proc[N], want[N];
        ref_processed(l, N, &p, NULL, 0, proc);
        ref_probs(proc, N, &p, want);
        long obs[N] = {0};
        for (int k = 0; k < DRAWS; k++) {
            ag_sample_result r;
            assert_int_equal(ag_sampler_sample(s, l, &r), AG_OK);
            obs[r.token]++;
        }
        int df;
        double x2 = chi2_stat(obs, want, N, DRAWS, &df);
        print_message("config %zu: chi2 = %.2f, df = %d, critical %.2f\n", c, x2, df, chi2_crit(df));
        assert_true(df >= 1);
        assert_true(x2 < chi2_crit(df));
        /* ag_sampler_draw over the same distribution */
        float pf[N];
        assert_int_equal(ag_sampler_probs(s, l, pf), AG_OK);
        memset(obs, 0, sizeof obs);
        for (int k = 0; k < DRAWS; k++) {
            int32_t t;
            assert_int_equal(ag_sampler_draw(s, pf, &t), AG_OK);
            obs[t]++;
        }
        x2 = chi2_stat(obs, want, N, DRAWS, &df);
        assert_true(x2 < chi2_crit(df));
        ag_sampler_free(s);
    }
}

/* ---- speculative verify ---------------------------------------------------- */

/* Target p and draft q from real samplers (different logits and params), x
 * drawn from q by the draft's sampler, verified by the target's: the emitted
 * token must be distributed as p, and acceptance must happen at the rate
 * sum_x min(p(x), q(x)). */
static void verify_preserves_distribution(void **state) {
    enum { N = 8, TRIALS = 200000 };
    const float lp[N] = {2.0f, 1.5f, 0.2f, -1.0f, 0.8f, 1.9f, -3.0f, 0.0f};
    const float lq[N] = {0.5f, 2.5f, 2.0f, -1.0f, -9.0f, 0.7f, 1.0f, 0.3f};
    ag_sample_params pp = ag_sample_default_params(), pq = ag_sample_default_params();
    pp.temperature = 0.8f;
    pp.top_k = 6; /* p excludes tokens 3 and 6 */
    pq.temperature = 1.2f;
    pq.top_p = 0.9f; /* q excludes token 4 */
    pp.seed = pq.seed = 7;
    ag_sampler *tgt = new_sampler(&pp, N, 0), *drf = new_sampler(&pq, N, 1);
    float p[N], q[N];
    assert_int_equal(ag_sampler_probs(tgt, lp, p), AG_OK);
    assert_int_equal(ag_sampler_probs(drf, lq, q), AG_OK);
    assert_true(p[3] == 0.0f && p[6] == 0.0f && q[4] == 0.0f && q[6] > 0.0f);
    double want[N], overlap = 0.0;
    {
        double proc[N];
        ref_processed(lp, N, &pp, NULL, 0, proc);
        ref_probs(proc, N, &pp, want);
        for (int i = 0; i < N; i++) overlap += fmin(want[i], (double)q[i]);
    }
    long obs[N] = {0}, acc = 0;
    for (int k = 0; k < TRIALS; k++) {
        int32_t x;
        assert_int_equal(ag_sampler_draw(drf, q, &x), AG_OK);
        ag_verify_result v;
        assert_int_equal(ag_sampler_verify(tgt, p, q, x, &v), AG_OK);
        if (v.accepted) assert_int_equal(v.token, x);
        acc += v.accepted;
        obs[v.token]++;
    }
    int df;
    double x2 = chi2_stat(obs, want, N, TRIALS, &df);
    double rate = (double)acc / TRIALS, sd = sqrt(overlap * (1 - overlap) / TRIALS);
    print_message("verify: chi2 = %.2f (df %d, crit %.2f); acceptance %.4f, expected %.4f\n", x2, df,
                  chi2_crit(df), rate, overlap);
    assert_true(x2 < chi2_crit(df));
    assert_true(fabs(rate - overlap) < 5 * sd);
    ag_sampler_free(tgt);
    ag_sampler_free(drf);
}

/* Deterministic drafts (q = NULL): prompt-lookup style drafters. */
static void verify_one_hot_draft(void **state) {
    enum { N = 8, TRIALS = 200000 };
    const double pw[N] = {0.30, 0.05, 0.20, 0.0, 0.15, 0.10, 0.12, 0.08};
    float p[N];
    for (int i = 0; i < N; i++) p[i] = (float)pw[i];
    ag_sample_params pp = ag_sample_default_params();
    pp.seed = 99;
    ag_sampler *s = new_sampler(&pp, N, 0);
    const int32_t drafts[] = {2, 0, 3}; /* 3 has p = 0: always rejected */
    for (int d = 0; d < 3; d++) {
        long obs[N] = {0}, acc = 0;
        for (int k = 0; k < TRIALS; k++) {
            ag_verify_result v;
            assert_int_equal(ag_sampler_verify(s, p, NULL, drafts[d], &v), AG_OK);
            acc += v.accepted;
            obs[v.token]++;
        }
        int df;
        double x2 = chi2_stat(obs, pw, N, TRIALS, &df);
        double a = pw[drafts[d]], rate = (double)acc / TRIALS;
        print_message("one-hot draft %d: chi2 = %.2f (crit %.2f), acceptance %.4f vs p(x) %.4f\n",
                      drafts[d], x2, chi2_crit(df), rate, a);
        assert_true(x2 < chi2_crit(df));
        if (a == 0.0) assert_int_equal(acc, 0);
        else assert_true(fabs(rate - a) < 5 * sqrt(a * (1 - a) / TRIALS));
    }
    ag_sampler_free(s);
}

/* Two positions of a toy Markov "model": draft two tokens from q, verify
 * them in order, and take the first two emitted tokens (a correction ends
 * the round; the next round starts from it). The joint distribution of
 * the pair must be the target's p(t1 | t0) p(t2 | t1): exact rejection
 * sampling composes across positions. */
static void verify_two_positions_joint(void **state) {
    enum { N = 8, TRIALS = 200000 };
    float P[N][N], Q[N][N], lg[N];
    ag_sample_params pp = ag_sample_default_params(), pq = ag_sample_default_params();
    pp.temperature = 0.9f;
    pp.seed = pq.seed = 2024;
    pq.temperature = 1.5f;
    ag_sampler *tgt = new_sampler(&pp, N, 0), *drf = new_sampler(&pq, N, 1);
    for (int a = 0; a < N; a++) {
        for (int i = 0; i < N; i++) lg[i] = (float)((i * 3 + a * 5) % 7) * 0.4f;
        assert_int_equal(ag_sampler_probs(tgt, lg, P[a]), AG_OK);
        for (int i = 0; i < N; i++) lg[i] = (float)((i + a) % 4) * 0.6f;
        assert_int_equal(ag_sampler_probs(drf, lg, Q[a]), AG_OK);
    }
    const int t0 = 3;
    long obs[N * N] = {0};
    double want[N * N];
    for (int a = 0; a < N; a++)
        for (int b = 0; b < N; b++) want[a * N + b] = (double)P[t0][a] * (double)P[a][b];
    for (int k = 0; k < TRIALS; k++) {
        int32_t out[3];
        int n_out = 0, prev = t0;
        while (n_out < 2) {
            int32_t d1, d2;
            assert_int_equal(ag_sampler_draw(drf, Q[prev], &d1), AG_OK);
            assert_int_equal(ag_sampler_draw(drf, Q[d1], &d2), AG_OK);
            int32_t dr[2] = {d1, d2};
            int ctx = prev, i;
            for (i = 0; i < 2 && n_out < 2; i++) {
                ag_verify_result v;
                assert_int_equal(ag_sampler_verify(tgt, P[ctx], Q[ctx], dr[i], &v), AG_OK);
                out[n_out++] = v.token;
                ctx = v.token;
                if (!v.accepted) break;
            }
            if (i == 2 && n_out < 2) { /* all accepted: the bonus token */
                assert_int_equal(ag_sampler_draw(tgt, P[ctx], &out[n_out]), AG_OK);
                n_out++;
            }
            prev = out[n_out - 1];
        }
        obs[out[0] * N + out[1]]++;
    }
    int df;
    double x2 = chi2_stat(obs, want, N * N, TRIALS, &df);
    print_message("two-position joint: chi2 = %.2f, df = %d, critical %.2f\n", x2, df, chi2_crit(df));
    assert_true(x2 < chi2_crit(df));
    ag_sampler_free(tgt);
    ag_sampler_free(drf);
}

static void verify_greedy_exact_match(void **state) {
    ag_sample_params p = ag_sample_default_params();
    p.temperature = 0.0f;
    ag_sampler *s = new_sampler(&p, 5, 0);
    float l[5] = {0.1f, 2.0f, 2.0f, -1.0f, 0.5f}, pr[5], q[5] = {0.1f, 0.1f, 0.1f, 0.6f, 0.1f};
    assert_int_equal(ag_sampler_probs(s, l, pr), AG_OK);
    ag_verify_result v;
    for (int x = 0; x < 5; x++) {
        assert_int_equal(ag_sampler_verify(s, pr, x % 2 ? q : NULL, x, &v), AG_OK);
        assert_int_equal(v.accepted, x == 1);
        assert_int_equal(v.token, 1);
    }
    /* a non-one-hot p: still argmax, lowest id on ties */
    float p2[5] = {0.1f, 0.3f, 0.3f, 0.2f, 0.1f};
    assert_int_equal(ag_sampler_verify(s, p2, NULL, 2, &v), AG_OK);
    assert_int_equal(v.accepted, 0);
    assert_int_equal(v.token, 1);
    ag_sampler_free(s);
}

/* Speculative bookkeeping: accept drafts, compute the next distribution,
 * rewind the rejected ones; the penalties seen must equal plain decoding's. */
static void rewind_restores_penalty_state(void **state) {
    enum { N = 50 };
    ag_sample_params p = ag_sample_default_params();
    p.repetition_penalty = 1.5f;
    p.frequency_penalty = 0.3f;
    p.penalty_last_n = 4;
    ag_sampler *a = new_sampler(&p, N, 0), *b = new_sampler(&p, N, 0);
    float l[N], pa[N], pb[N];
    for (int i = 0; i < N; i++) l[i] = (float)trng_normal();
    const int32_t committed[] = {1, 2, 3, 1, 5, 1};
    for (int i = 0; i < 6; i++) {
        assert_int_equal(ag_sampler_accept(a, committed[i]), AG_OK);
        assert_int_equal(ag_sampler_accept(b, committed[i]), AG_OK);
    }
    for (int i = 0; i < 5; i++) assert_int_equal(ag_sampler_accept(a, 7 + i % 2), AG_OK); /* drafts */
    assert_int_equal(ag_sampler_rewind(a, 5), AG_OK);
    assert_int_equal(ag_sampler_probs(a, l, pa), AG_OK);
    assert_int_equal(ag_sampler_probs(b, l, pb), AG_OK);
    assert_memory_equal(pa, pb, sizeof pa);
    ag_sampler_free(a);
    ag_sampler_free(b);
}

/* ---- stop matcher ------------------------------------------------------------ */

typedef struct {
    const char *s[4];
    size_t      len[4];
    int         n;
} stopset;

/* Brute force: the occurrence with the earliest end, then the earliest start. */
static int ref_first_stop(const char *t, size_t n, const stopset *ss, size_t *start, int *which) {
    for (size_t e = 1; e <= n; e++) {
        int best = -1;
        for (int k = 0; k < ss->n; k++) {
            size_t L = ss->len[k];
            if (L == 0 || L > e || memcmp(t + e - L, ss->s[k], L) != 0) continue;
            if (best < 0 || L > ss->len[best]) best = k;
        }
        if (best >= 0) {
            *start = e - ss->len[best];
            *which = best;
            return 1;
        }
    }
    return 0;
}

/* Largest UTF-8 character boundary <= n in valid UTF-8 text t. */
static size_t ref_char_boundary(const char *t, size_t n) {
    size_t i = 0, last = 0;
    while (i < n) {
        unsigned char c = (unsigned char)t[i];
        size_t k = c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
        if (i + k > n) break;
        i += k;
        last = i;
    }
    return last;
}

/* What may be out after the prefix t[0..n) (with no complete match in it):
 * up to the earliest position whose suffix is a proper prefix of a stop,
 * then back to a character boundary. */
static size_t ref_safe(const char *t, size_t n, const stopset *ss) {
    size_t safe = n;
    for (size_t i = 0; i < n && safe == n; i++)
        for (int k = 0; k < ss->n; k++)
            if (ss->len[k] > n - i && memcmp(t + i, ss->s[k], n - i) == 0) {
                safe = i;
                break;
            }
    return ref_char_boundary(t, safe);
}

/* Feeds t in chunks ending at cuts[0..ncut) (ascending, last == n) and
 * checks every intermediate emission and the final result. */
static void stop_run(const char *t, size_t n, const stopset *ss, const size_t *cuts, int ncut) {
    ag_stop *m = NULL;
    assert_int_equal(ag_stop_new(ss->s, ss->len, ss->n, &m), AG_OK);
    size_t want_start = n;
    int want_which = -1;
    int has = ref_first_stop(t, n, ss, &want_start, &want_which);
    char *outb = malloc(n + 1);
    size_t out = 0, fed = 0;
    int stopped = 0;
    ag_stop_result r;
    for (int c = 0; c < ncut && !stopped; c++) {
        assert_int_equal(ag_stop_feed(m, t + fed, cuts[c] - fed, &r), AG_OK);
        fed = cuts[c];
        memcpy(outb + out, r.text, r.len);
        out += r.len;
        if (r.stopped) {
            stopped = 1;
            break;
        }
        /* No stop reported: none may be complete within what was fed, and
         * exactly the safe amount is out. */
        size_t st;
        int wh;
        assert_false(ref_first_stop(t, fed, ss, &st, &wh));
        if (out != ref_safe(t, fed, ss))
            fail_msg("after %zu bytes: emitted %zu, reference %zu", fed, out, ref_safe(t, fed, ss));
        assert_int_equal(ag_stop_pending(m), fed - out);
    }
    if (!stopped) {
        assert_int_equal(ag_stop_finish(m, &r), AG_OK);
        memcpy(outb + out, r.text, r.len);
        out += r.len;
        assert_false(r.stopped);
    }
    assert_int_equal(stopped, has);
    if (has) {
        assert_int_equal(r.stop_index, want_which);
        assert_int_equal(r.stop_offset, want_start);
        assert_int_equal(out, want_start);
        /* after a stop, nothing more comes out */
        ag_stop_result r2;
        assert_int_equal(ag_stop_feed(m, "zz", 2, &r2), AG_OK);
        assert_int_equal(r2.len, 0);
        assert_true(r2.stopped);
        assert_int_equal(r2.stop_index, want_which);
        assert_int_equal(ag_stop_finish(m, &r2), AG_OK);
        assert_int_equal(r2.len, 0);
        assert_true(r2.stopped);
    } else {
        assert_int_equal(out, n);
    }
    assert_memory_equal(outb, t, out);
    free(outb);
    ag_stop_free(m);
}

/* Every single split point, every pair of split points (short texts), and
 * byte by byte. */
static void stop_all_chunkings(const char *t, const stopset *ss) {
    size_t n = strlen(t);
    size_t cuts[4];
    cuts[0] = n;
    stop_run(t, n, ss, cuts, 1);
    for (size_t a = 0; a <= n; a++) {
        cuts[0] = a;
        cuts[1] = n;
        stop_run(t, n, ss, cuts, 2);
        if (n <= 40)
            for (size_t b = a; b <= n; b++) {
                cuts[1] = b;
                cuts[2] = n;
                stop_run(t, n, ss, cuts, 3);
            }
    }
    size_t *bytes = malloc((n + 1) * sizeof *bytes);
    for (size_t i = 0; i < n; i++) bytes[i] = i + 1;
    stop_run(t, n, ss, bytes, (int)n);
    free(bytes);
}

static stopset mkstops(int n, ...) {
    stopset ss = {.n = n};
    va_list ap;
    va_start(ap, n);
    for (int i = 0; i < n; i++) {
        ss.s[i] = va_arg(ap, const char *);
        ss.len[i] = strlen(ss.s[i]);
    }
    va_end(ap);
    return ss;
}

static void stop_matcher_cases(void **state) {
    struct {
        const char *text;
        stopset     ss;
    } cases[] = {
        {"Hello world, and more", mkstops(1, "world")},
        {"STOP right at the start", mkstops(1, "STOP")},
        {"no stop in here at all", mkstops(2, "xyz", "here!")},
        {"aaab tail", mkstops(1, "aab")},                   /* overlapping self-prefix */
        {"xabcd", mkstops(2, "abcd", "bc")},               /* bc ends first */
        {"xabc", mkstops(2, "bc", "abc")},                 /* same end: longest wins */
        {"the wor is not a word", mkstops(1, "word")},     /* partial match that fails */
        {"abababac", mkstops(1, "ababac")},
        {"ends with stop", mkstops(1, "stop")},
        {"h\xC3\xA9llo \xE4\xB8\x96\xE7\x95\x8C \xF0\x9F\x99\x82 end", mkstops(1, "\xF0\x9F\x99\x82 e")},
        {"\xE4\xB8\x96\xE7\x95\x8C and \xE4\xB8\x96X", mkstops(1, "\xE4\xB8\x96X")}, /* multibyte partial fails */
        {"caf\xC3\xA9 \xC3\xA9t\xC3\xA9", mkstops(2, "\xC3\xA9t\xC3\xA9!", "\xC3\xA9t\xC3\xA9")},
        {"\xF0\x9F\x98\x80\xF0\x9F\x98\x81\xF0\x9F\x98\x82", mkstops(0)}, /* utf-8 only */
        {"<|im_end|> after", mkstops(3, "<|im_end|>", "<|", "|>")},
        {"a<|im_e<|im_end|", mkstops(1, "<|im_end|>")}, /* never completes */
        {"", mkstops(1, "x")},
    };
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) stop_all_chunkings(cases[c].text, &cases[c].ss);

    /* Empty stop strings are ignored; indices still refer to the caller's array. */
    stopset e = mkstops(3, "", "lo", "");
    ag_stop *m;
    assert_int_equal(ag_stop_new(e.s, e.len, 3, &m), AG_OK);
    ag_stop_result r;
    assert_int_equal(ag_stop_feed(m, "hello", 5, &r), AG_OK);
    assert_true(r.stopped);
    assert_int_equal(r.stop_index, 1);
    assert_int_equal(r.len, 3);
    assert_memory_equal(r.text, "hel", 3);
    ag_stop_free(m);
    /* Explicit lengths: a stop string containing NUL. */
    const char *nul[] = {"a\0b"};
    size_t nl[] = {3};
    assert_int_equal(ag_stop_new(nul, nl, 1, &m), AG_OK);
    assert_int_equal(ag_stop_feed(m, "xxa", 3, &r), AG_OK);
    assert_int_equal(r.len, 2);
    assert_int_equal(ag_stop_feed(m, "\0bq", 3, &r), AG_OK);
    assert_true(r.stopped);
    assert_int_equal(r.len, 0);
    assert_int_equal(r.stop_offset, 2);
    ag_stop_free(m);
    const char *bad[] = {NULL};
    assert_int_equal(ag_stop_new(bad, NULL, 1, &m), AG_ERR_INVALID);
    assert_null(m);
    ag_stop_free(NULL);
}

/* Random texts over a tiny alphabet (so stops overlap a lot), with
 * multibyte characters, random stops and random chunkings. */
static void stop_matcher_random(void **state) {
    static const char *alpha[] = {"a", "b", "\xC3\xA9", "\xE2\x82\xAC", "\xF0\x9F\x99\x82"};
    char text[256], stops[4][32];
    for (int trial = 0; trial < 3000; trial++) {
        size_t n = 0;
        int chars = trng_int(30);
        for (int i = 0; i < chars; i++) {
            const char *c = alpha[trng_int(trial % 2 ? 2 : 5)];
            memcpy(text + n, c, strlen(c));
            n += strlen(c);
        }
        text[n] = 0;
        stopset ss = {.n = 1 + trng_int(3)};
        for (int k = 0; k < ss.n; k++) {
            size_t L = 0;
            int sc = 1 + trng_int(4);
            for (int i = 0; i < sc; i++) {
                const char *c = alpha[trng_int(trial % 2 ? 2 : 5)];
                memcpy(stops[k] + L, c, strlen(c));
                L += strlen(c);
            }
            stops[k][L] = 0;
            ss.s[k] = stops[k];
            ss.len[k] = L;
        }
        size_t cuts[64];
        int nc = 0;
        size_t pos = 0;
        while (pos < n) {
            pos += 1 + (size_t)trng_int(6);
            if (pos > n) pos = n;
            cuts[nc++] = pos;
        }
        if (nc == 0) cuts[nc++] = 0;
        stop_run(text, n, &ss, cuts, nc);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(params_defaults_and_validation),
        cmocka_unit_test(greedy_is_argmax_lowest_id),
        cmocka_unit_test(nonfinite_logits),
        cmocka_unit_test(sample_argmax_takes_a_found_token),
        cmocka_unit_test(pick_draws_what_sample_draws),
        cmocka_unit_test(chain_matches_reference),
        cmocka_unit_test(chain_large_vocab_top_p),
        cmocka_unit_test(draw_walks_the_kept_set_in_id_order),
        cmocka_unit_test(top_cands_match_a_sort),
        cmocka_unit_test(cands_draw_what_sample_draws),
        cmocka_unit_test(edited_rows_sample_what_raw_rows_sample),
        cmocka_unit_test(cands_verify_what_rows_verify),
        cmocka_unit_test(scored_tokens_from_candidates),
        cmocka_unit_test(picked_tokens_with_logprobs),
        cmocka_unit_test(chain_timing_150k),
        cmocka_unit_test(penalties_and_bias_follow_formulas),
        cmocka_unit_test(chain_with_penalties_matches_reference),
        cmocka_unit_test(logprobs_are_double_log_softmax),
        cmocka_unit_test(seeds_reproduce),
        cmocka_unit_test(sampling_frequencies_match),
        cmocka_unit_test(verify_preserves_distribution),
        cmocka_unit_test(verify_one_hot_draft),
        cmocka_unit_test(verify_two_positions_joint),
        cmocka_unit_test(verify_greedy_exact_match),
        cmocka_unit_test(rewind_restores_penalty_state),
        cmocka_unit_test(stop_matcher_cases),
        cmocka_unit_test(stop_matcher_random),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
