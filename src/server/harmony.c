/* gpt-oss's chat format ("harmony"): the output is a sequence of messages,
 *
 *     [<|start|>assistant] <|channel|>CHANNEL[ to=RECIPIENT][ <|constrain|>TYPE]<|message|>BODY END
 *
 * (the recipient may also stand before the channel: "<|start|>assistant
 * to=functions.f<|channel|>commentary json<|message|>"), where END is
 * <|end|> (another message follows), <|call|> (a tool call: generation
 * ends) or <|return|> (the answer: generation ends). The generation prompt
 * ends with "<|start|>assistant", so the first message has no <|start|>.
 * The tokenizer renders <|start|>, <|channel|>, <|message|>, <|constrain|>
 * and <|end|> as text (tok.c, as llama.cpp does); <|call|> and <|return|>
 * end generation and render nothing, so a text may simply stop in a body.
 *
 * Channels: "analysis" is the reasoning, "final" the answer, "commentary"
 * without a recipient a preamble the user sees (answer text too); a message
 * with a recipient ("to=functions.NAME") is a tool call whose body is its
 * JSON arguments, whatever the channel. A message from another role than
 * the assistant (a model imagining a tool's reply) is dropped.
 *
 * The scanner (server.h, ag_harmony) reads a growing output incrementally:
 * header bytes never reach the reasoning or the answer, and a body's tail
 * that may still become a marker ("<", "<|", "<|en", ...) is held back
 * until it is decided, so a stream never shows a piece of a marker. Text
 * that does not start like a header at all (a model that skipped the
 * format) is answer text; whitespace between messages belongs to none. */
#include <stdlib.h>
#include <string.h>

#include "server/reply.h"
#include "server/server.h"

static const char *const k_markers[] = {"<|end|>", "<|call|>", "<|return|>", "<|start|>",
                                        "<|channel|>", "<|message|>", "<|constrain|>", NULL};
/* what a header may start with (besides a marker) */
static const char *const k_header_starts[] = {"<|channel|>", "<|start|>", "<|constrain|>", "<|message|>",
                                              " to=", "to=", NULL};

enum { KIND_REASONING, KIND_CONTENT, KIND_CALL, KIND_DROP };

static bool is_ws(char c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; }

static const char *find_n(const char *h, size_t hlen, const char *n, size_t nlen) {
    if (nlen > hlen) return NULL;
    for (size_t i = 0; i + nlen <= hlen; i++)
        if (h[i] == n[0] && !memcmp(h + i, n, nlen)) return h + i;
    return NULL;
}

void ag_harmony_init(ag_harmony *h) {
    memset(h, 0, sizeof *h);
    h->calls = json_array();
}

void ag_harmony_free(ag_harmony *h) {
    if (!h) return;
    ag_buf_free(&h->reasoning);
    ag_buf_free(&h->content);
    ag_buf_free(&h->args);
    json_decref(h->calls);
    h->calls = NULL;
}

bool ag_harmony_template(const char *src, size_t len) {
    return src && find_n(src, len, "<|channel|>", 11) && find_n(src, len, "<|message|>", 11) &&
           find_n(src, len, "<|start|>", 9);
}

/* Whether s[0..n) is, or may still become, the start of a header. */
static bool may_be_header(const char *s, size_t n) {
    for (const char *const *p = k_header_starts; *p; p++) {
        size_t k = strlen(*p);
        if (!memcmp(s, *p, n < k ? n : k)) return true;
    }
    return false;
}

/* The earliest marker in s[0..n): its offset and index in k_markers, or false. */
static bool first_marker(const char *s, size_t n, size_t *at, int *which) {
    for (size_t i = 0; i + 1 < n; i++) {
        if (s[i] != '<' || s[i + 1] != '|') continue;
        for (const char *const *p = k_markers; *p; p++) {
            size_t k = strlen(*p);
            if (k <= n - i && !memcmp(s + i, *p, k)) {
                *at = i;
                *which = (int)(p - k_markers);
                return true;
            }
        }
    }
    return false;
}

/* Longest suffix of s[0..n) that is a proper prefix of a marker. */
static size_t partial_marker(const char *s, size_t n) {
    size_t best = 0;
    for (const char *const *p = k_markers; *p; p++) {
        size_t k = strlen(*p);
        for (size_t m = (n < k - 1 ? n : k - 1); m > best; m--)
            if (!memcmp(s + n - m, *p, m)) {
                best = m;
                break;
            }
    }
    return best;
}

/* The word after `key` in the header hd[0..n) (up to a space, a marker or
 * the end) into out; false when the key is absent. */
static bool header_word(const char *hd, size_t n, const char *key, char *out, size_t cap) {
    size_t klen = strlen(key);
    const char *k = find_n(hd, n, key, klen);
    if (!k) return false;
    const char *p = k + klen, *end = hd + n;
    size_t w = 0;
    while (p < end && !is_ws(*p) && !(*p == '<' && p + 1 < end && p[1] == '|')) {
        if (w + 1 < cap) out[w++] = *p;
        p++;
    }
    out[w] = '\0';
    return true;
}

static void begin_body(ag_harmony *h, const char *hd, size_t n) {
    char role[64] = "", channel[64] = "", to[sizeof h->recipient] = "";
    bool has_role = header_word(hd, n, "<|start|>", role, sizeof role);
    header_word(hd, n, "<|channel|>", channel, sizeof channel);
    /* "to=" only where it is its own word */
    const char *t = find_n(hd, n, "to=", 3);
    if (t && (t == hd || is_ws(t[-1]) || t[-1] == '>'))
        header_word(t, (size_t)(hd + n - t), "to=", to, sizeof to);
    h->in_body = true;
    h->fresh = true;
    h->recipient[0] = '\0';
    ag_buf_clear(&h->args);
    if (has_role && strcmp(role, "assistant")) h->kind = KIND_DROP;
    else if (to[0] && strcmp(to, "assistant")) {
        h->kind = KIND_CALL;
        memcpy(h->recipient, to, sizeof h->recipient);
    } else if (!strcmp(channel, "analysis")) h->kind = KIND_REASONING;
    else h->kind = KIND_CONTENT;
}

static void emit(ag_harmony *h, const char *s, size_t n) {
    if (!n) return;
    ag_buf *dst = h->kind == KIND_REASONING ? &h->reasoning : h->kind == KIND_CONTENT ? &h->content
                : h->kind == KIND_CALL      ? &h->args
                                            : NULL;
    if (!dst) return;
    /* the reasoning of several analysis messages (the answer of several
     * final ones) joins with a line break */
    if (h->fresh && h->kind != KIND_CALL && dst->len) ag_buf_append_char(dst, '\n');
    h->fresh = false;
    ag_buf_append(dst, s, n);
}

/* The body ended (cut: the output ended inside it). */
static void end_body(ag_harmony *h, bool cut) {
    h->in_body = false;
    if (h->kind != KIND_CALL) return;
    const char *a = h->args.data ? h->args.data : "";
    size_t n = h->args.len;
    while (n && is_ws(*a)) a++, n--;
    while (n && is_ws(a[n - 1])) n--;
    json_t *v = NULL;
    if (n) {
        json_error_t err;
        v = json_loadb(a, n, 0, &err);
    }
    /* a call whose arguments are not a JSON object is no call (one cut by
     * the token limit usually is not complete) */
    if ((n && !json_is_object(v)) || (cut && !n)) {
        json_decref(v);
        return;
    }
    json_decref(v);
    const char *name = h->recipient;
    if (!strncmp(name, "functions.", 10)) name += 10;
    char id[40] = "call_";
    srv_random_id(id + 5, 24);
    json_t *fn = json_object();
    json_object_set_new(fn, "name", json_string(name));
    json_object_set_new(fn, "arguments", n ? srv_jstr(a, n) : json_string("{}"));
    json_array_append_new(h->calls,
                          json_pack("{s:s, s:s, s:o}", "id", id, "type", "function", "function", fn));
}

void ag_harmony_scan(ag_harmony *h, const char *text, size_t len, bool final) {
    while (h->pos < len || (final && h->in_body)) {
        const char *rest = text + h->pos;
        size_t rlen = len - h->pos;
        if (!h->in_body) {
            /* whitespace between messages (or before a plain answer) is
             * neither: skipped once something else follows */
            size_t ws = 0;
            while (ws < rlen && is_ws(rest[ws])) ws++;
            if (ws == rlen) {
                if (final) h->pos = len;
                return;
            }
            h->pos += ws;
            rest += ws;
            rlen -= ws;
            if (!may_be_header(rest, rlen)) {
                /* no header: answer text, up to the next marker */
                h->in_body = true;
                h->fresh = true;
                h->kind = KIND_CONTENT;
                continue;
            }
            /* the search resumes where the last one stopped (less a marker's
             * length), so a long header costs no more than its length */
            size_t from = h->hscan > h->pos + 10 ? h->hscan - 10 - h->pos : 0;
            const char *m = find_n(rest + from, rlen - from, "<|message|>", 11);
            if (!m) {
                h->hscan = len;
                if (final) h->pos = len; /* a header cut off: nothing */
                return;
            }
            begin_body(h, rest, (size_t)(m - rest));
            h->pos += (size_t)(m - rest) + 11;
            continue;
        }
        size_t at;
        int which;
        if (first_marker(rest, rlen, &at, &which)) {
            emit(h, rest, at);
            end_body(h, false);
            /* <|end|>, <|call|> and <|return|> (k_markers' first three) end
             * the message; any other marker starts the next header */
            h->pos += at + (which < 3 ? strlen(k_markers[which]) : 0);
            continue;
        }
        size_t keep = final ? 0 : partial_marker(rest, rlen);
        emit(h, rest, rlen - keep);
        h->pos = len - keep;
        if (final) end_body(h, true);
        return;
    }
}

void ag_harmony_start_in(ag_harmony *h, const char *prompt, size_t len) {
    /* the prompt's last message, from its <|start|> */
    const char *last = NULL;
    for (const char *p = prompt; (p = find_n(p, (size_t)(prompt + len - p), "<|start|>", 9)); p += 9) last = p;
    if (!last) return;
    ag_harmony t;
    ag_harmony_init(&t);
    ag_harmony_scan(&t, last, (size_t)(prompt + len - last), false);
    /* it ends inside a body: the output continues that body */
    if (t.in_body && t.pos == (size_t)(prompt + len - last)) {
        h->in_body = true;
        h->fresh = true;
        h->kind = t.kind;
        memcpy(h->recipient, t.recipient, sizeof h->recipient);
    }
    ag_harmony_free(&t);
}

bool ag_harmony_in_reasoning(const ag_harmony *h) { return h->in_body && h->kind == KIND_REASONING; }
