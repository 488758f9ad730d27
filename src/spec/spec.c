/* The verify executor and the adaptive draft length. See spec.h. */
#include "spec/spec.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "base/switches.h"

/* Weight of the newest observation in the acceptance average: about the
 * last 16 verified positions matter. */
#define ACCEPT_EMA 0.0625
/* Where a new sequence's acceptance estimate starts: optimistic enough that
 * the first rounds draft, so the estimate can learn from them. It counts as
 * ACCEPT_PRIOR_N observations: the first verified positions move the
 * estimate by 1 / (ACCEPT_PRIOR_N + seen), a running mean, until that falls
 * to ACCEPT_EMA. With the EMA alone from the start, an open-chat answer at
 * 15% acceptance kept drafting for ~17 missed positions (0.6 decays by
 * 1/16 a miss) and lost 6% to plain decoding on the AVX2 VM; with the
 * prior as 4 observations 6 misses bring it below 0.25. */
#define ACCEPT_PRIOR 0.6
#define ACCEPT_PRIOR_N 4
/* While the estimate is still mostly that prior (fewer than
 * PROBE_LEARN_OBS verified positions), a sequence whose length says 0
 * probes every PROBE_LEARN_EVERY rounds rather than every probe_every. A
 * draft model costing 0.4 of a target step does not pay at the prior (a
 * 2-token draft promises 1.07x, under the margin), so it learned its
 * 90-100% acceptance from one 2-token probe every 8 rounds, and a short
 * answer ended before it drafted at all (Qwen2.5-0.5B for the 1.5B on the
 * AMX Xeon, 2026-12-05). The n-gram source (cost 0) drafts at the prior. */
#define PROBE_LEARN_OBS   8
#define PROBE_LEARN_EVERY 2
/* How much more than plain decoding a draft must promise (expected tokens
 * per unit of cost) to be made at all: the model is rough (acceptance falls along a draft;
 * step times are noisy), and on open chat a predicted 2-10% gain measured
 * as a 7-16% loss on an AVX2 CPU (bench/RESULTS.md). Overridable for
 * experiments with AUGUR_SPEC_MARGIN. */
static double spec_margin(void) {
    static double m = 0;
    if (m == 0) {
        m = ag_switch_real("AUGUR_SPEC_MARGIN", 1.0, 3.0, 1.15);
    }
    return m;
}

struct ag_spec_seq {
    ag_draft_source *src;
    ag_spec_params   p;
    int32_t          n_vocab;
    bool             active;
    int              n_seen;  /* output tokens the source has been told */
    int              d;       /* drafted in the current round (until verify) */
    int32_t          drafts[AG_SPEC_MAX_DRAFT];
    float           *q;       /* [draft_max][n_vocab] when the source is stochastic */
    float           *p_row;   /* [n_vocab]: the target's distribution at one position */
    ag_cand_probs    p_cands; /* the same from the row's candidates */
    double           accept;  /* per-position acceptance average */
    int              n_obs;   /* verified positions observed (saturates) */
    int              idle;    /* rounds since the last draft while the length is 0 */
    ag_spec_stats    stats;
};

ag_spec_params ag_spec_default_params(void) {
    return (ag_spec_params){.draft_max = 8, .draft_min = 0, .verify_row_cost = 0.1f, .probe_every = 8,
                            .adaptive = true};
}

int ag_draft_default_max(const ag_draft_factory *f) {
    return f && f->draft_max > 0 ? f->draft_max : ag_spec_default_params().draft_max;
}

ag_status ag_spec_params_check(const ag_spec_params *p) {
    if (p->draft_max < 1 || p->draft_max > AG_SPEC_MAX_DRAFT)
        return ag_errorf(AG_ERR_RANGE, "draft_max must be in [1, %d]", AG_SPEC_MAX_DRAFT);
    if (p->draft_min < 0 || p->draft_min > p->draft_max)
        return ag_errorf(AG_ERR_RANGE, "draft_min must be in [0, draft_max = %d]", p->draft_max);
    if (!(p->verify_row_cost >= 0.0f && p->verify_row_cost <= 10.0f))
        return ag_errorf(AG_ERR_RANGE, "verify_row_cost must be in [0, 10]");
    if (p->probe_every < 1) return ag_errorf(AG_ERR_RANGE, "probe_every must be >= 1");
    return AG_OK;
}

void ag_spec_stats_add(ag_spec_stats *a, const ag_spec_stats *b) {
    a->rounds += b->rounds;
    a->drafted += b->drafted;
    a->accepted += b->accepted;
    a->emitted += b->emitted;
    for (int i = 0; i < AG_SPEC_MAX_DRAFT; i++) {
        a->drafted_at[i] += b->drafted_at[i];
        a->accepted_at[i] += b->accepted_at[i];
    }
}

ag_status ag_spec_seq_new(ag_draft_source *src, const ag_spec_params *p, int32_t n_vocab, ag_spec_seq **out) {
    *out = NULL;
    ag_status st = ag_spec_params_check(p);
    if (st || n_vocab < 1) {
        ag_draft_free(src);
        return st ? st : ag_errorf(AG_ERR_INVALID, "ag_spec_seq_new: n_vocab must be >= 1");
    }
    ag_spec_seq *s = calloc(1, sizeof *s);
    if (s) s->p_row = malloc(sizeof(float) * (size_t)n_vocab);
    if (s && src->stochastic) s->q = malloc(sizeof(float) * (size_t)n_vocab * (size_t)p->draft_max);
    if (!s || !s->p_row || (src->stochastic && !s->q)) {
        if (s) {
            free(s->p_row);
            free(s->q);
            free(s);
        }
        ag_draft_free(src);
        return ag_errorf(AG_ERR_NOMEM, "out of memory for speculative decoding state");
    }
    s->src = src;
    s->p = *p;
    s->n_vocab = n_vocab;
    s->active = true;
    s->accept = ACCEPT_PRIOR;
    *out = s;
    return AG_OK;
}

void ag_spec_seq_free(ag_spec_seq *s) {
    if (!s) return;
    ag_draft_free(s->src);
    free(s->q);
    free(s->p_row);
    free(s);
}

ag_status ag_spec_prefill(ag_spec_seq *s, const int32_t *prompt, int n) {
    ag_status st = s->src->ops->prefill(s->src, prompt, n);
    if (st) s->active = false;
    return st;
}

const int32_t       *ag_spec_drafts(const ag_spec_seq *s) { return s->drafts; }
const ag_spec_stats *ag_spec_get_stats(const ag_spec_seq *s) { return &s->stats; }
bool                 ag_spec_active(const ag_spec_seq *s) { return s && s->active; }

size_t ag_spec_resident_bytes(const ag_spec_seq *s) {
    size_t b = sizeof *s + sizeof(float) * (size_t)s->n_vocab;
    if (s->q) b += sizeof(float) * (size_t)s->n_vocab * (size_t)s->p.draft_max;
    return b + s->src->ops->resident_bytes(s->src);
}

/* The draft length that maximises expected tokens per unit of cost, given
 * the acceptance estimate a: E(d) = 1 + a + ... + a^d tokens for
 * step_cost[d] (NULL: 1 + d * verify_row_cost) + d * the source's cost per
 * token, in decode steps. Speculation must beat plain decoding (d = 0,
 * value 1) by the margin; among the lengths that do, the best wins. (The
 * margin used to apply between consecutive lengths too, which on a
 * code edit at 88% acceptance stopped the draft at 2 where 4-5 pay most.) */
static int best_length(const ag_spec_seq *s, int cap, const float *step_cost) {
    const double a = s->accept, src = (double)s->src->cost_per_token;
    double       best = 0.0, e = 1.0, ak = 1.0;
    int          best_d = 0;
    for (int d = 1; d <= cap; d++) {
        ak *= a;
        e += ak;
        const double step = step_cost ? (double)step_cost[d] : 1.0 + d * (double)s->p.verify_row_cost;
        const double v = e / (step + d * src);
        if (v > best) {
            best = v;
            best_d = d;
        }
    }
    return best > spec_margin() ? best_d : 0;
}

int ag_spec_propose(ag_spec_seq *s, const int32_t *output, int n_output, int cap, const float *step_cost) {
    s->d = 0;
    if (!s->active) return 0;
    if (cap > s->p.draft_max) cap = s->p.draft_max;
    if (cap < 0) cap = 0;
    int want = cap;
    if (s->p.adaptive && cap > 0) {
        want = best_length(s, cap, step_cost);
        const int every =
            s->n_obs < PROBE_LEARN_OBS && s->p.probe_every > PROBE_LEARN_EVERY ? PROBE_LEARN_EVERY : s->p.probe_every;
        if (want == 0 && ++s->idle >= every) {
            /* probe: a short draft keeps the estimate alive */
            want = cap < 2 ? cap : 2;
            s->idle = 0;
        }
        if (want > 0 && want < s->p.draft_min) want = s->p.draft_min <= cap ? s->p.draft_min : 0;
    }
    /* Rounds that do not draft do not call the source: the output it has
     * not seen is fed at its next draft. */
    if (want == 0) return 0;
    int n_feed = n_output - s->n_seen;
    int d = s->src->ops->draft(s->src, output + s->n_seen, n_feed, want, s->drafts, s->q);
    s->n_seen = n_output;
    if (d < 0) {
        AG_LOGW("speculative decoding off for a sequence: draft source '%s' failed: %s", s->src->name,
                ag_error_message());
        s->active = false;
        return 0;
    }
    if (d > want) d = want; /* a misbehaving source cannot overrun the buffers */
    bool usable = d >= s->p.draft_min;
    for (int i = 0; usable && i < d; i++)
        if (s->drafts[i] < 0 || s->drafts[i] >= s->n_vocab) usable = false; /* never verify an impossible id */
    if (d == 0 || !usable) {
        s->src->ops->commit(s->src, d, 0); /* nothing to verify: the round ends here */
        d = 0;
    }
    s->d = d;
    return d;
}

void ag_spec_stats_add_round(ag_spec_stats *a, const ag_spec_round *r) {
    if (r->drafted <= 0) return;
    int observed = r->accepted < r->drafted ? r->accepted + 1 : r->drafted;
    for (int i = 0; i < observed && i < AG_SPEC_MAX_DRAFT; i++) {
        a->drafted_at[i]++;
        if (i < r->accepted) a->accepted_at[i]++;
    }
    a->rounds++;
    a->drafted += (uint64_t)r->drafted;
    a->accepted += (uint64_t)r->accepted;
    a->emitted += (uint64_t)r->emitted;
}

/* Records one verified position i of a round (accepted or not) in the
 * counters and the acceptance average, at once: the sink may end the choice
 * (and free this state) with the next token it is handed. */
static void observe(ag_spec_seq *s, int i, bool hit) {
    double w = 1.0 / (ACCEPT_PRIOR_N + 1 + s->n_obs);
    if (w < ACCEPT_EMA) w = ACCEPT_EMA;
    else s->n_obs++;
    s->accept += w * ((hit ? 1.0 : 0.0) - s->accept);
    if (i < AG_SPEC_MAX_DRAFT) {
        s->stats.drafted_at[i]++;
        if (hit) s->stats.accepted_at[i]++;
    }
    if (hit) s->stats.accepted++;
}

/* Decides the token that follows one row (hint: its argmax or picked token
 * from the backend, or -1; cands: its candidates from the backend, or NULL),
 * accepting it into the sampler. */
static ag_status decide(ag_spec_seq *spec, ag_sampler *sampler, bool want_logprobs, const float *row, int32_t hint,
                        const ag_cands *cands, int i, int d, ag_sample_result *sr, bool *accepted) {
    ag_status st;
    *accepted = false;
    if (i == d || ag_sampler_greedy(sampler)) {
        /* The bonus token, and every greedy decision: the very call plain
         * decoding makes, so the token (and its logprob) are plain's. */
        if (hint != -1 && ag_sampler_argmax_only(sampler)) st = ag_sampler_sample_argmax(sampler, hint, sr);
        else if (hint != -1 && i == 0 && d == 0 && ag_sampler_pick_only(sampler))
            st = ag_sampler_sample_picked(sampler, hint, sr); /* drawn by the caller (AG_WANT_PICK) */
        else if (hint != -1 && cands && i == 0 && d == 0 && ag_sampler_pick_logprobs(sampler, NULL))
            st = ag_sampler_sample_picked_cands(sampler, hint, cands, sr); /* AG_WANT_PICK_LP */
        else if (cands) st = ag_sampler_sample_cands(sampler, cands, sr); /* AG_WANT_CANDS */
        else st = ag_sampler_sample(sampler, row, sr);
        if (st) return st;
        if (i < d) *accepted = sr->token == spec->drafts[i];
    } else {
        ag_verify_result v;
        const float *q = spec->src->stochastic && spec->q ? spec->q + (size_t)i * (size_t)spec->n_vocab : NULL;
        if (cands) { /* p from the candidates: the same bits as from the row */
            if ((st = ag_sampler_probs_cands(sampler, cands, &spec->p_cands))) return st;
            if ((st = ag_sampler_verify_cands(sampler, &spec->p_cands, q, spec->drafts[i], &v))) return st;
        } else {
            if ((st = ag_sampler_probs(sampler, row, spec->p_row))) return st;
            if ((st = ag_sampler_verify(sampler, spec->p_row, q, spec->drafts[i], &v))) return st;
        }
        *accepted = v.accepted != 0;
        if (want_logprobs) {
            st = cands ? ag_sampler_logprobs_cands(sampler, cands, v.token, sr)
                       : ag_sampler_logprobs(sampler, row, v.token, sr);
            if (st) return st;
        } else {
            memset(sr, 0, sizeof *sr);
            sr->token = v.token;
            sr->logprob = NAN;
        }
    }
    return ag_sampler_accept(sampler, sr->token);
}

ag_status ag_spec_verify(ag_spec_seq *spec, ag_sampler *sampler, bool want_logprobs, const float *logits,
                         const int32_t *argmax, const ag_cands *const *cands, size_t row_stride, int d, ag_kv *kv,
                         int32_t kv_seq, const ag_spec_sink *sink, ag_spec_round *out) {
    memset(out, 0, sizeof *out);
    if (d > 0 && (!spec || d != spec->d))
        return ag_errorf(AG_ERR_INVALID, "ag_spec_verify: %d rows of drafts but %d were proposed", d,
                         spec ? spec->d : 0);
    out->drafted = d;
    if (d > 0) {
        spec->stats.rounds++;
        spec->stats.drafted += (uint64_t)d;
    }
    /* Everything that touches `spec` happens before each emit: an emit that
     * ends the choice frees the sequence's speculative state. */
    for (int i = 0; i <= d; i++) {
        const float *row = sink->prepare(sink->user, logits + (size_t)i * row_stride);
        if (!row) return ag_errorf(AG_ERR_INTERNAL, "ag_spec_verify: the row could not be prepared");
        ag_sample_result sr;
        bool             accepted;
        ag_status        st =
            decide(spec, sampler, want_logprobs, row, argmax ? argmax[i] : -1, cands ? cands[i] : NULL, i, d, &sr,
                   &accepted);
        if (st) return st;
        if (i < d) observe(spec, i, accepted);
        out->emitted++;
        if (d > 0) spec->stats.emitted++;
        if (i < d && !accepted) {
            /* The correction ends the round: trim and commit first. */
            out->accepted = i;
            /* A sliding-window ring (kv.h) cannot drop every suffix, but
             * always what the last step added: it recycles against the
             * length the step's reserve started from, the pending token's
             * position, and the rejected tail lies past it. So no snapshot
             * is needed; a refusal here is a broken invariant. */
            if (!ag_kv_trimmable(kv, kv_seq, d - i))
                return ag_errorf(AG_ERR_INTERNAL,
                                 "ag_spec_verify: the target's KV cannot drop the %d rejected positions (it can "
                                 "drop %d)",
                                 d - i, ag_kv_trim_limit(kv, kv_seq));
            if ((st = ag_kv_trim(kv, kv_seq, d - i))) return st;
            spec->src->ops->commit(spec->src, d, i);
            spec->n_seen += i; /* the source has the accepted drafts already */
            spec->d = 0;
            out->ended = !sink->emit(sink->user, sr.token, &sr);
            return AG_OK;
        }
        if (i < d) {
            out->accepted = i + 1;
        } else if (d > 0) { /* every draft stood; this is the bonus */
            spec->src->ops->commit(spec->src, d, d);
            spec->n_seen += d;
            spec->d = 0;
        }
        if (!sink->emit(sink->user, sr.token, &sr)) {
            /* Ended (possibly on an accepted draft, with the window's KV and
             * the source's round left as they are: both go with the choice). */
            out->ended = true;
            return AG_OK;
        }
    }
    return AG_OK;
}
