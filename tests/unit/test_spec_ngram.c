/* Unit tests for src/spec/ngram: the prompt-lookup draft source.
 *
 * Directed cases check each part of the rule in ngram.h on histories small
 * enough to work out by hand. The randomized test keeps its own copy of the
 * history (following draft.h's protocol independently of the source) and a
 * brute-force reference that rescans that history on every round; the
 * source's proposal must equal the reference's, token for token, every
 * round. Small vocabularies make matches, ties and long chains common. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "base/status.h"
#include "spec/ngram.h"

/* ---- test-side helpers ---------------------------------------------- */

static uint64_t trng_state = 424242;
static uint64_t trng(void) { /* splitmix64, only to generate test inputs */
    uint64_t z = (trng_state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
static int trng_int(int n) { return (int)(trng() % (uint64_t)n); }

static ag_draft_source *make(int n_min, int n_max, int cand) {
    ag_ngram_params p = ag_ngram_default_params();
    p.n_min = n_min;
    p.n_max = n_max;
    p.max_candidates = cand;
    ag_draft_source *s = NULL;
    assert_int_equal(ag_draft_ngram_new(&p, &s), AG_OK);
    assert_non_null(s);
    return s;
}

static void prefill(ag_draft_source *s, const int32_t *t, int n) {
    assert_int_equal(s->ops->prefill(s, t, n), AG_OK);
}

static int draft(ag_draft_source *s, const int32_t *feed, int n_feed, int max, int32_t *out) {
    return s->ops->draft(s, feed, n_feed, max, out, NULL);
}

static void expect_tokens(const int32_t *got, int n_got, const int32_t *want, int n_want) {
    assert_int_equal(n_got, n_want);
    for (int i = 0; i < n_want; i++) {
        if (got[i] != want[i]) fail_msg("token %d: got %d, want %d", i, got[i], want[i]);
    }
}

/* The rule of ngram.h, by rescanning the whole history: for n from n_max
 * down, the most recent `cand` earlier occurrences of the suffix vote with
 * their next token; most votes wins, a tie goes to the latest voter; copy
 * from the winner's latest occurrence, up to max tokens or the history's
 * end. Written from the rule, sharing nothing with the source. */
static int reference(const int32_t *h, int L, int n_min, int n_max, int cand, int max, int32_t *out) {
    if (max <= 0) return 0;
    for (int n = n_max; n >= n_min; n--) {
        if (L - n < 1) continue;
        int pos[4096], tok[4096], m = 0;
        for (int p = L - n - 1; p >= 0 && m < cand; p--) {
            if (memcmp(h + p, h + L - n, (size_t)n * sizeof *h) == 0) {
                pos[m] = p;
                tok[m] = h[p + n];
                m++;
            }
        }
        if (m == 0) continue;
        int best = -1, best_cnt = 0;
        for (int i = 0; i < m; i++) { /* i in recency order: first seen = latest */
            int seen = 0, cnt = 0;
            for (int j = 0; j < i; j++) seen |= tok[j] == tok[i];
            if (seen) continue;
            for (int j = i; j < m; j++) cnt += tok[j] == tok[i];
            if (cnt > best_cnt) best = i, best_cnt = cnt;
        }
        int from = pos[best] + n, d = 0;
        while (d < max && from + d < L) out[d] = h[from + d], d++;
        return d;
    }
    return 0;
}

/* ---- directed cases ---------------------------------------------------- */

static void identity_fields(void **st) {
    (void)st;
    ag_draft_source *s = make(1, 4, 8);
    assert_string_equal(s->name, "ngram");
    assert_false(s->stochastic);
    assert_true(s->cost_per_token == 0.0f);
    assert_true(s->ops->resident_bytes(s) > 0);
    ag_draft_free(s);
    ag_draft_free(NULL); /* NULL-safe */

    ag_ngram_params d = ag_ngram_default_params();
    assert_int_equal(d.n_min, 2);
    assert_int_equal(d.n_max, 12);
    assert_int_equal(d.max_candidates, 8);
    s = NULL;
    assert_int_equal(ag_draft_ngram_new(NULL, &s), AG_OK); /* NULL = defaults */
    ag_draft_free(s);
}

/* A passage seen once and now being repeated: the rest of it is proposed,
 * exactly, and the copy stops at the end of the history. */
static void repeated_text_copies(void **st) {
    (void)st;
    ag_draft_source *s = make(1, 4, 8);
    const int32_t prompt[] = {11, 12, 13, 14, 15, 16, 17, 18};
    prefill(s, prompt, 8);
    int32_t out[16];
    const int32_t feed[] = {11, 12, 13};
    int d = draft(s, feed, 3, 5, out);
    const int32_t want5[] = {14, 15, 16, 17, 18};
    expect_tokens(out, d, want5, 5);
    s->ops->commit(s, d, 0);

    /* max larger than what follows: everything up to the history's end
     * (history is now 11..18 11 12 13 14, suffix 11 12 13 14 at 0). */
    const int32_t f2[] = {14};
    d = draft(s, f2, 1, 16, out);
    const int32_t want_all[] = {15, 16, 17, 18, 11, 12, 13, 14};
    expect_tokens(out, d, want_all, 8);
    s->ops->commit(s, d, d);

    /* Nothing like the suffix before: no guess. */
    const int32_t f3[] = {99};
    assert_int_equal(draft(s, f3, 1, 8, out), 0);
    s->ops->commit(s, 0, 0);
    ag_draft_free(s);
}

/* The longest matching suffix decides even against a more frequent
 * continuation of a shorter one. History: ... 1 2 3 -> 10 once, 2 3 -> 20
 * twice; suffix 1 2 3. */
static void longest_match_wins(void **st) {
    (void)st;
    const int32_t h[] = {1, 2, 3, 10, 7, 2, 3, 20, 2, 3, 20, 1, 2, 3};
    int n = (int)(sizeof h / sizeof *h);
    int32_t out[8];

    ag_draft_source *s = make(1, 4, 8);
    prefill(s, h, n);
    int d = draft(s, NULL, 0, 3, out);
    const int32_t want[] = {10, 7, 2};
    expect_tokens(out, d, want, 3);
    s->ops->commit(s, d, 0);
    ag_draft_free(s);

    /* Capped at bigrams, "2 3" matches: 20 (twice) beats 10 (once), copied
     * from the latest occurrence that voted for it (at 8). */
    s = make(1, 2, 8);
    prefill(s, h, n);
    d = draft(s, NULL, 0, 8, out);
    const int32_t want2[] = {20, 1, 2, 3};
    expect_tokens(out, d, want2, 4);
    s->ops->commit(s, d, 0);
    ag_draft_free(s);

    /* n_min above every matching length: no guess. */
    s = make(5, 6, 8);
    prefill(s, h, n);
    assert_int_equal(draft(s, NULL, 0, 8, out), 0);
    s->ops->commit(s, 0, 0);
    ag_draft_free(s);
}

/* Only unigrams match (the bigram ending the history is new). */
static void frequency_ranking(void **st) {
    (void)st;
    int32_t out[16];
    /* 5 -> 6 twice (at 0, 3), 5 -> 7 once and most recently (at 6). */
    const int32_t h1[] = {5, 6, 1, 5, 6, 2, 5, 7, 3, 5};
    ag_draft_source *s = make(1, 4, 8);
    prefill(s, h1, 10);
    int d = draft(s, NULL, 0, 10, out);
    const int32_t w1[] = {6, 2, 5, 7, 3, 5}; /* from the occurrence at 3 */
    expect_tokens(out, d, w1, 6);
    s->ops->commit(s, d, 0);
    ag_draft_free(s);

    /* A tie goes to the most recent occurrence. */
    const int32_t h2[] = {5, 6, 1, 5, 7, 2, 5};
    s = make(1, 4, 8);
    prefill(s, h2, 7);
    d = draft(s, NULL, 0, 10, out);
    const int32_t w2[] = {7, 2, 5};
    expect_tokens(out, d, w2, 3);
    s->ops->commit(s, d, 0);
    ag_draft_free(s);

    /* 6 three times long ago, 7 twice recently: with 8 voters 6 wins, with
     * the 2 latest only 7 does. */
    const int32_t h3[] = {5, 6, 1, 5, 6, 2, 5, 6, 3, 5, 7, 4, 5, 7, 8, 5};
    s = make(1, 4, 8);
    prefill(s, h3, 16);
    d = draft(s, NULL, 0, 4, out);
    const int32_t w3[] = {6, 3, 5, 7};
    expect_tokens(out, d, w3, 4);
    s->ops->commit(s, d, 0);
    ag_draft_free(s);
    s = make(1, 4, 2);
    prefill(s, h3, 16);
    d = draft(s, NULL, 0, 4, out);
    const int32_t w4[] = {7, 8, 5};
    expect_tokens(out, d, w4, 3);
    s->ops->commit(s, d, 0);
    ag_draft_free(s);
}

/* commit(d, k) with k < d: exactly the first k proposed tokens join the
 * history, then the feed; the rejected tail is gone. */
static void partial_commit_history(void **st) {
    (void)st;
    ag_draft_source *s = make(1, 4, 8);
    const int32_t prompt[] = {1, 2, 3, 4, 5, 6, 7, 8};
    prefill(s, prompt, 8);
    int32_t out[16];
    const int32_t f1[] = {1, 2, 3};
    int d = draft(s, f1, 3, 5, out);
    assert_int_equal(d, 5); /* 4 5 6 7 8 */
    s->ops->commit(s, d, 2); /* history: 1..8 1 2 3 4 5 */

    const int32_t f2[] = {99};
    assert_int_equal(draft(s, f2, 1, 4, out), 0);
    s->ops->commit(s, 0, 0); /* history: 1..8 1 2 3 4 5 99 */

    /* "99 1" is new, "1" occurred at 0 and 8, both followed by 2: the
     * latest copy runs 2 3 4 5 99 1 to the end (with the rejected 6 still
     * in the history it would read 2 3 4 5 6 99 1). */
    const int32_t f3[] = {1};
    d = draft(s, f3, 1, 10, out);
    const int32_t w[] = {2, 3, 4, 5, 99, 1};
    expect_tokens(out, d, w, 6);

    /* A commit claiming more than was proposed accepts only what was. */
    s->ops->commit(s, d + 3, d + 3); /* history += 2 3 4 5 99 1 */
    const int32_t f4[] = {2};
    d = draft(s, f4, 1, 3, out);
    /* suffix "5 99 1 2" (n=4) occurred at 12 -> 3 4 5 */
    const int32_t w4[] = {3, 4, 5};
    expect_tokens(out, d, w4, 3);
    s->ops->commit(s, d, 0);
    ag_draft_free(s);
}

/* max = 0 proposes nothing but still takes the feed into the history. */
static void max_zero(void **st) {
    (void)st;
    ag_draft_source *s = make(1, 4, 8);
    const int32_t prompt[] = {1, 2, 3, 4, 1, 2};
    prefill(s, prompt, 6);
    int32_t out[8] = {-7};
    assert_int_equal(draft(s, NULL, 0, 0, out), 0);
    assert_int_equal(out[0], -7);
    s->ops->commit(s, 0, 0);
    const int32_t f[] = {3};
    assert_int_equal(draft(s, f, 1, 0, NULL), 0); /* out may be NULL then */
    s->ops->commit(s, 0, 0);
    int d = draft(s, NULL, 0, 8, out); /* history 1 2 3 4 1 2 3 */
    const int32_t w[] = {4, 1, 2, 3};
    expect_tokens(out, d, w, 4);
    s->ops->commit(s, d, 0);
    ag_draft_free(s);
}

static void empty_and_short_history(void **st) {
    (void)st;
    ag_draft_source *s = make(1, 4, 8);
    int32_t out[8];
    assert_int_equal(draft(s, NULL, 0, 8, out), 0); /* never prefilled */
    s->ops->commit(s, 0, 0);
    prefill(s, NULL, 0);
    assert_int_equal(draft(s, NULL, 0, 8, out), 0);
    s->ops->commit(s, 0, 0);
    const int32_t f[] = {4, 4};
    int d = draft(s, f, 1, 8, out); /* history 4: nothing earlier */
    assert_int_equal(d, 0);
    s->ops->commit(s, 0, 0);
    d = draft(s, f, 1, 8, out); /* history 4 4: "4" at 0 -> 4 */
    const int32_t w[] = {4};
    expect_tokens(out, d, w, 1);
    s->ops->commit(s, d, 1);

    /* A second prefill starts over: nothing of the old history matches. */
    const int32_t p2[] = {7, 8};
    prefill(s, p2, 2);
    assert_int_equal(draft(s, f, 1, 8, out), 0); /* history 7 8 4 */
    s->ops->commit(s, 0, 0);
    ag_draft_free(s);
}

static void bad_params_refused(void **st) {
    (void)st;
    const ag_ngram_params bad[] = {
        {.n_min = 0, .n_max = 4, .max_candidates = 8},
        {.n_min = -1, .n_max = 4, .max_candidates = 8},
        {.n_min = 3, .n_max = 2, .max_candidates = 8},
        {.n_min = 1, .n_max = AG_NGRAM_N_LIMIT + 1, .max_candidates = 8},
        {.n_min = 1, .n_max = 4, .max_candidates = 0},
        {.n_min = 1, .n_max = 4, .max_candidates = AG_NGRAM_CANDIDATES_LIMIT + 1},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        static int32_t junk;
        ag_draft_source *s = (ag_draft_source *)(void *)&junk; /* must be reset to NULL */
        ag_errorf(AG_OK, "%s", "");
        assert_int_equal(ag_draft_ngram_new(&bad[i], &s), AG_ERR_RANGE);
        assert_null(s);
        assert_non_null(strstr(ag_error_message(), "ngram"));
    }
    ag_ngram_params ok = {.n_min = AG_NGRAM_N_LIMIT, .n_max = AG_NGRAM_N_LIMIT,
                          .max_candidates = AG_NGRAM_CANDIDATES_LIMIT};
    ag_draft_source *s = NULL;
    assert_int_equal(ag_draft_ngram_new(&ok, &s), AG_OK);
    ag_draft_free(s);
    assert_int_equal(ag_draft_ngram_new(&ok, NULL), AG_ERR_INVALID);

    /* Bad draft/prefill arguments are errors, not crashes. */
    s = make(1, 4, 8);
    int32_t out[4];
    assert_int_equal(draft(s, NULL, 2, 4, out), -1);
    assert_int_equal(draft(s, NULL, -1, 4, out), -1);
    assert_int_equal(draft(s, NULL, 0, -1, out), -1);
    assert_int_equal(draft(s, NULL, 0, 4, NULL), -1);
    assert_int_equal(s->ops->prefill(s, NULL, 3), AG_ERR_INVALID);
    assert_int_equal(s->ops->prefill(s, NULL, -1), AG_ERR_INVALID);
    ag_draft_free(s);
}

/* ---- against the brute-force reference -------------------------------- */

typedef struct {
    int32_t *h;
    int      len, cap;
} hist;

static void hist_push(hist *h, int32_t t) {
    if (h->len == h->cap) {
        h->cap = h->cap ? h->cap * 2 : 64;
        h->h = realloc(h->h, (size_t)h->cap * sizeof *h->h);
        assert_non_null(h->h);
    }
    h->h[h->len++] = t;
}

/* One stream: random params, a random prompt, then rounds of
 * feed (1..3 tokens) / draft (random max) / commit (random k). The feed is
 * mostly a continuation that agrees with the history, as real output often
 * does, so long matches and long chains occur. */
static void one_stream(int vocab, int rounds) {
    int n_min = 1 + trng_int(3), n_max = n_min + trng_int(12), cand = 1 + trng_int(12);
    ag_draft_source *s = make(n_min, n_max, cand);
    hist h = {0};
    int32_t out[32], ref[32];
    int32_t prompt[64];
    int np = trng_int(64);
    for (int i = 0; i < np; i++) prompt[i] = trng_int(vocab);
    prefill(s, prompt, np);
    for (int i = 0; i < np; i++) hist_push(&h, prompt[i]);

    for (int r = 0; r < rounds; r++) {
        if (trng_int(200) == 0) { /* start over now and then */
            np = trng_int(64);
            for (int i = 0; i < np; i++) prompt[i] = trng_int(vocab);
            prefill(s, prompt, np);
            h.len = 0;
            for (int i = 0; i < np; i++) hist_push(&h, prompt[i]);
        }
        int32_t feed[3];
        int nf = 1 + trng_int(3);
        for (int i = 0; i < nf; i++) {
            /* copy an earlier token's successor sometimes, else random */
            if (h.len > 2 && trng_int(3) != 0) {
                int p = trng_int(h.len - 1);
                feed[i] = h.h[p + 1];
            } else {
                feed[i] = trng_int(vocab);
            }
            hist_push(&h, feed[i]);
        }
        int max = trng_int(10) == 0 ? 0 : 1 + trng_int(31);
        int d = draft(s, feed, nf, max, out);
        int dr = reference(h.h, h.len, n_min, n_max, cand, max, ref);
        if (d != dr || memcmp(out, ref, (size_t)d * sizeof *out) != 0) {
            fail_msg("round %d (n %d..%d, cand %d, len %d, max %d): source proposed %d tokens, reference %d "
                     "(first %d vs %d)",
                     r, n_min, n_max, cand, h.len, max, d, dr, d > 0 ? out[0] : -1, dr > 0 ? ref[0] : -1);
        }
        /* Accept a random prefix; bias toward full or none as in practice. */
        int k = trng_int(4) == 0 ? d : trng_int(d + 1);
        if (trng_int(20) == 0) {
            /* A buggy caller claiming more than was proposed: only the
             * proposal can enter the history. */
            int e = 1 + trng_int(3);
            s->ops->commit(s, d + e, d + e);
            k = d;
        } else {
            s->ops->commit(s, d, k);
        }
        for (int i = 0; i < k; i++) hist_push(&h, out[i]);
    }
    free(h.h);
    ag_draft_free(s);
}

static void matches_reference_random(void **st) {
    (void)st;
    for (int stream = 0; stream < 60; stream++) one_stream(2 + stream % 5, 400);
}

static void long_history_with(ag_draft_source *s) {
    enum { N = 20000 };
    int32_t *prompt = malloc(N * sizeof *prompt);
    assert_non_null(prompt);
    /* A few hundred-token "paragraphs" repeated with edits, over a big vocab. */
    for (int i = 0; i < N; i++) prompt[i] = (i % 997 < 500) ? (int32_t)(i % 997) : trng_int(32000);
    size_t empty = s->ops->resident_bytes(s);
    prefill(s, prompt, N);
    assert_true(s->ops->resident_bytes(s) > empty + N * sizeof(int32_t));
    int32_t out[16];
    int hits = 0;
    int32_t next = 0;
    for (int r = 0; r < 800; r++) {
        int d = draft(s, &next, 1, 8, out);
        assert_true(d >= 0 && d <= 8);
        hits += d > 0;
        int k = d > 0 ? trng_int(d + 1) : 0;
        s->ops->commit(s, d, k);
        next = (int32_t)(r % 500); /* walk a paragraph again */
    }
    assert_true(hits > 400);
    free(prompt);
    ag_draft_free(s);
}

/* A 20000-token history, then hundreds of rounds: must simply complete
 * (with the index this is milliseconds; a rescan per round would show). */
static void long_history(void **st) {
    (void)st;
    long_history_with(make(1, 4, 8));
    ag_draft_source *s = NULL;
    assert_int_equal(ag_draft_ngram_new(NULL, &s), AG_OK); /* the defaults */
    long_history_with(s);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(identity_fields),
        cmocka_unit_test(repeated_text_copies),
        cmocka_unit_test(longest_match_wins),
        cmocka_unit_test(frequency_ranking),
        cmocka_unit_test(partial_commit_history),
        cmocka_unit_test(max_zero),
        cmocka_unit_test(empty_and_short_history),
        cmocka_unit_test(bad_params_refused),
        cmocka_unit_test(matches_reference_random),
        cmocka_unit_test(long_history),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
