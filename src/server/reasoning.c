/* Reasoning apart from the answer: models that think in tags (Qwen3,
 * DeepSeek-R1 and its distills) write <think>...</think> before the answer,
 * or only the closing tag when their chat template opened the block in the
 * prompt. The scanner (server.h, ag_think) splits a growing output into the
 * two, incrementally and monotonically, so that a stream can send each part
 * as soon as it is certain:
 *  - leading whitespace, and a tail that may still become "<think>" (or
 *    "</think>"), is held back until it is decided;
 *  - the reasoning is the text between the tags without the whitespace
 *    around it (trailing whitespace is held until more text follows);
 *  - the answer starts after "</think>" and the whitespace after it;
 *  - an output that does not start with "<think>" is all answer (a thinking
 *    template whose model answered directly); one whose reasoning never
 *    closed (cut off by max_tokens) is all reasoning. */
#include <string.h>

#include "server/server.h"

static const char k_open_tag[] = "<think>";
static const char k_close_tag[] = "</think>";
#define OPEN_LEN  (sizeof k_open_tag - 1)
#define CLOSE_LEN (sizeof k_close_tag - 1)

static bool is_ws(char c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; }

void ag_think_init(ag_think *t, bool opened) {
    memset(t, 0, sizeof *t);
    t->phase = opened ? AG_THINK_IN : AG_THINK_LEAD;
}

/* Longest suffix of s[from..len) that is a proper prefix of `tag`. */
static size_t partial_tag(const char *s, size_t from, size_t len, const char *tag, size_t tlen) {
    size_t max = len - from < tlen - 1 ? len - from : tlen - 1;
    for (size_t k = max; k > 0; k--)
        if (!memcmp(s + len - k, tag, k)) return k;
    return 0;
}

void ag_think_scan(ag_think *t, const char *text, size_t len, bool final) {
    if (t->phase == AG_THINK_LEAD) {
        size_t i = 0;
        while (i < len && is_ws(text[i])) i++;
        size_t rest = len - i, cmp = rest < OPEN_LEN ? rest : OPEN_LEN;
        if (rest >= OPEN_LEN && !memcmp(text + i, k_open_tag, OPEN_LEN)) {
            t->phase = AG_THINK_IN;
            t->reason_start = t->reason_end = t->scan = i + OPEN_LEN;
        } else if (final || (rest && memcmp(text + i, k_open_tag, cmp))) {
            t->phase = AG_THINK_NONE; /* the answer is the whole text */
            t->answer_start = 0;
            return;
        } else {
            return; /* whitespace, or the start of a tag: undecided */
        }
    }
    if (t->phase == AG_THINK_IN) {
        /* the reasoning's leading whitespace is not part of it */
        if (t->reason_end == t->reason_start)
            while (t->reason_start < len && is_ws(text[t->reason_start]))
                t->reason_start = t->reason_end = t->scan = t->reason_start + 1;
        size_t from = t->scan > t->reason_start + CLOSE_LEN ? t->scan - CLOSE_LEN : t->reason_start;
        const char *close = NULL;
        for (size_t i = from; i + CLOSE_LEN <= len; i++)
            if (text[i] == '<' && !memcmp(text + i, k_close_tag, CLOSE_LEN)) {
                close = text + i;
                break;
            }
        size_t end = close ? (size_t)(close - text) : len - (final ? 0 : partial_tag(text, t->reason_start, len, k_close_tag, CLOSE_LEN));
        while (end > t->reason_start && is_ws(text[end - 1])) end--;
        if (end > t->reason_end) t->reason_end = end;
        t->scan = len;
        if (close) {
            t->phase = AG_THINK_GAP;
            t->answer_start = (size_t)(close - text) + CLOSE_LEN;
        } else if (final) {
            t->phase = AG_THINK_ANSWER; /* never closed: no answer */
            t->answer_start = len;
            return;
        } else {
            return;
        }
    }
    if (t->phase == AG_THINK_GAP) {
        while (t->answer_start < len && is_ws(text[t->answer_start])) t->answer_start++;
        if (t->answer_start < len || final) t->phase = AG_THINK_ANSWER;
    }
}

bool ag_think_answer_known(const ag_think *t) { return t->phase == AG_THINK_ANSWER || t->phase == AG_THINK_NONE; }

bool ag_think_template_thinks(const char *src, size_t len) {
    if (!src) return false;
    for (size_t i = 0; i + CLOSE_LEN <= len; i++)
        if (!memcmp(src + i, k_close_tag, CLOSE_LEN)) return true;
    return false;
}

bool ag_think_prompt_opens(const char *prompt, size_t len) {
    while (len && is_ws(prompt[len - 1])) len--;
    return len >= OPEN_LEN && !memcmp(prompt + len - OPEN_LEN, k_open_tag, OPEN_LEN);
}
