/* tokenizer.json (Hugging Face `tokenizers`) into GGUF tokenizer metadata.
 *
 * Only the forms whose behaviour augur's encoders reproduce exactly are
 * taken; anything else is refused by name rather than approximated (a
 * guessed tokenizer silently changes token ids):
 * - model BPE with byte_fallback (all 256 <0xNN> tokens), merges by rank,
 *   no dropout, no continuing-subword prefix or end-of-word suffix;
 * - normalizer: Replace(" " -> "▁") (SentencePiece's whitespace escape), as
 *   Gemma's tokenizer.json has it, alone;
 * - pre_tokenizer: none, or Split on " " (which, after that normalizer,
 *   finds no space: the whole text is one word);
 * - post_processor: none or TemplateProcessing whose single-sequence
 *   template is [special] $A [special] (either optional).
 * That is SentencePiece BPE as `tokenizers` runs it: the "gpt2" (BPE with
 * merges) tokenizer of ag_tok over raw UTF-8, spaces escaped, no split: the
 * pre-tokenizer "sentencepiece-bpe". Added tokens become control tokens
 * (special) or user-defined ones (matched in text like `tokenizers` does);
 * "<0xNN>" tokens are byte tokens. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gguf/gguf.h"
#include "tok/tok.h"

static const char *jstr(json_t *o, const char *k) {
    json_t *v = json_object_get(o, k);
    return json_is_string(v) ? json_string_value(v) : NULL;
}

static bool jtrue(json_t *o, const char *k) { return json_is_true(json_object_get(o, k)); }

/* A Replace/Split pattern {"String": s}: s, or NULL for a regex pattern. */
static const char *pattern_string(json_t *o) {
    return jstr(json_object_get(o, "pattern"), "String");
}

static bool is_byte_token(const char *s, size_t len) {
    static const char hex[] = "0123456789ABCDEF";
    return len == 6 && !memcmp(s, "<0x", 3) && strchr(hex, s[3]) && strchr(hex, s[4]) && s[5] == '>';
}

/* The id of special token `name` in a TemplateProcessing's special_tokens. */
static int64_t template_special(json_t *pp, json_t *item) {
    json_t *sp = json_object_get(item, "SpecialToken");
    if (!sp) return -2; /* not a special token */
    const char *id = jstr(sp, "id");
    json_t     *ids = id ? json_object_get(json_object_get(json_object_get(pp, "special_tokens"), id), "ids") : NULL;
    if (!json_is_array(ids) || json_array_size(ids) != 1 || !json_is_integer(json_array_get(ids, 0))) return -1;
    return json_integer_value(json_array_get(ids, 0));
}

ag_status ag_tok_hf_to_gguf(const char *path, int64_t n_model, ag_gguf_writer *w) {
    json_error_t je;
    json_t      *root = json_load_file(path, 0, &je);
    if (!root) return ag_errorf(AG_ERR_FORMAT, "%s: %s (line %d)", path, je.text, je.line);
    ag_status    st = AG_OK;
    const char **texts = NULL;
    int32_t     *types = NULL;
    char       **merges = NULL;
    size_t       n_merges = 0, n_tok = 0;
    ag_gguf_value *items = NULL;
#define FAIL(code, ...)                            \
    do {                                           \
        st = ag_errorf(code, __VA_ARGS__);         \
        goto done;                                 \
    } while (0)
    json_t     *model = json_object_get(root, "model");
    const char *mtype = jstr(model, "type");
    if (!mtype || strcmp(mtype, "BPE"))
        FAIL(AG_ERR_UNSUPPORTED, "%s: tokenizer model '%s' is not supported (only BPE)", path, mtype ? mtype : "?");
    if (!jtrue(model, "byte_fallback") || jtrue(model, "ignore_merges") ||
        !json_is_null(json_object_get(model, "continuing_subword_prefix")) ||
        !json_is_null(json_object_get(model, "end_of_word_suffix")) ||
        (json_object_get(model, "dropout") && !json_is_null(json_object_get(model, "dropout"))))
        FAIL(AG_ERR_UNSUPPORTED,
             "%s: only a BPE model with byte_fallback, without ignore_merges, dropout, continuing_subword_prefix "
             "or end_of_word_suffix is supported",
             path);
    json_t     *norm = json_object_get(root, "normalizer");
    const char *nt = jstr(norm, "type");
    const char *from = nt && !strcmp(nt, "Replace") ? pattern_string(norm) : NULL, *to = jstr(norm, "content");
    if (!from || strcmp(from, " ") || !to || strcmp(to, "\xE2\x96\x81"))
        FAIL(AG_ERR_UNSUPPORTED, "%s: normalizer '%s' is not supported (only Replace(\" \" -> \"\xE2\x96\x81\"))", path,
             nt ? nt : "none");
    json_t     *pre = json_object_get(root, "pre_tokenizer");
    const char *pt = jstr(pre, "type");
    if (!json_is_null(pre) && pre &&
        !(pt && !strcmp(pt, "Split") && pattern_string(pre) && !strcmp(pattern_string(pre), " ")))
        FAIL(AG_ERR_UNSUPPORTED, "%s: pre_tokenizer '%s' is not supported (only none or Split(\" \"))", path,
             pt ? pt : "?");

    /* the vocabulary, then added tokens (which may extend it) */
    json_t *vocab = json_object_get(model, "vocab"), *added = json_object_get(root, "added_tokens");
    if (!json_is_object(vocab)) FAIL(AG_ERR_FORMAT, "%s: model.vocab is not an object", path);
    const char *key;
    json_t     *val;
    int64_t     max_id = -1;
    json_object_foreach(vocab, key, val) {
        if (!json_is_integer(val) || json_integer_value(val) < 0 || json_integer_value(val) > (1 << 24))
            FAIL(AG_ERR_FORMAT, "%s: vocab id of '%s' out of range", path, key);
        if (json_integer_value(val) > max_id) max_id = json_integer_value(val);
    }
    size_t ai;
    json_array_foreach(added, ai, val) {
        json_t *id = json_object_get(val, "id");
        if (!json_is_integer(id) || json_integer_value(id) < 0 || json_integer_value(id) > (1 << 24) ||
            !jstr(val, "content"))
            FAIL(AG_ERR_FORMAT, "%s: added_tokens[%zu] has no valid id or content", path, ai);
        if (n_model > 0 && json_integer_value(id) >= n_model) continue; /* see tok.h */
        if (json_integer_value(id) > max_id) max_id = json_integer_value(id);
        if (jtrue(val, "lstrip") || jtrue(val, "rstrip") || jtrue(val, "single_word") || jtrue(val, "normalized"))
            FAIL(AG_ERR_UNSUPPORTED, "%s: added token '%s' with lstrip, rstrip, single_word or normalized",
                 path, jstr(val, "content"));
    }
    n_tok = (size_t)(max_id + 1);
    texts = calloc(n_tok, sizeof *texts);
    types = malloc(n_tok * sizeof *types);
    if (!texts || !types) FAIL(AG_ERR_NOMEM, "out of memory");
    json_object_foreach(vocab, key, val) {
        int64_t id = json_integer_value(val);
        if (texts[id]) FAIL(AG_ERR_FORMAT, "%s: vocab id %lld given twice", path, (long long)id);
        texts[id] = key;
        types[id] = is_byte_token(key, strlen(key)) ? AG_TOK_TYPE_BYTE : AG_TOK_TYPE_NORMAL;
    }
    const char *unk = jstr(model, "unk_token");
    json_array_foreach(added, ai, val) {
        int64_t     id = json_integer_value(json_object_get(val, "id"));
        const char *c = jstr(val, "content");
        if (id > max_id) continue;
        if (texts[id] && strcmp(texts[id], c))
            FAIL(AG_ERR_FORMAT, "%s: added token %lld '%s' differs from the vocabulary's '%s'", path, (long long)id, c,
                 texts[id]);
        texts[id] = c;
        types[id] = unk && !strcmp(c, unk)   ? AG_TOK_TYPE_UNKNOWN
                    : jtrue(val, "special") ? AG_TOK_TYPE_CONTROL
                                            : AG_TOK_TYPE_USER_DEFINED;
    }
    size_t n_bytes = 0;
    for (size_t i = 0; i < n_tok; i++) {
        if (!texts[i]) FAIL(AG_ERR_FORMAT, "%s: no token has id %zu", path, i);
        n_bytes += types[i] == AG_TOK_TYPE_BYTE;
    }
    /* tokenizers falls back to <unk> (fused) for a character whose bytes
     * are not all tokens; augur's fallback assumes all 256 */
    if (n_bytes != 256)
        FAIL(AG_ERR_UNSUPPORTED, "%s: byte_fallback with %zu of the 256 <0xNN> tokens is not supported", path, n_bytes);

    /* merges: ["a", "b"] pairs (tokenizers >= 0.20) or "a b" strings */
    json_t *jm = json_object_get(model, "merges");
    if (!json_is_array(jm)) FAIL(AG_ERR_FORMAT, "%s: model.merges is not an array", path);
    merges = calloc(json_array_size(jm) + 1, sizeof *merges);
    if (!merges) FAIL(AG_ERR_NOMEM, "out of memory");
    json_array_foreach(jm, ai, val) {
        const char *a, *b;
        if (json_is_string(val)) {
            merges[n_merges] = strdup(json_string_value(val));
        } else if (json_is_array(val) && json_array_size(val) == 2 && (a = json_string_value(json_array_get(val, 0))) &&
                   (b = json_string_value(json_array_get(val, 1)))) {
            if (strchr(a, ' ') || strchr(b, ' '))
                FAIL(AG_ERR_UNSUPPORTED, "%s: merge %zu has a space inside a token", path, ai);
            size_t la = strlen(a), lb = strlen(b);
            if ((merges[n_merges] = malloc(la + lb + 2))) {
                memcpy(merges[n_merges], a, la);
                merges[n_merges][la] = ' ';
                memcpy(merges[n_merges] + la + 1, b, lb + 1);
            }
        } else {
            FAIL(AG_ERR_FORMAT, "%s: merge %zu is neither \"a b\" nor [\"a\", \"b\"]", path, ai);
        }
        if (!merges[n_merges++]) FAIL(AG_ERR_NOMEM, "out of memory");
    }

    /* special tokens around a sequence */
    json_t     *pp = json_object_get(root, "post_processor");
    const char *ppt = jstr(pp, "type");
    int64_t     bos = -1, eos = -1;
    if (pp && !json_is_null(pp)) {
        json_t *single = json_object_get(pp, "single");
        size_t  n = json_array_size(single);
        bool    ok = ppt && !strcmp(ppt, "TemplateProcessing") && n >= 1 && n <= 3;
        size_t  a_at = n;
        for (size_t i = 0; ok && i < n; i++)
            if (json_object_get(json_array_get(single, i), "Sequence")) a_at = i;
        ok = ok && a_at < n && a_at <= 1 && n - a_at - 1 <= 1;
        if (ok && a_at == 1) ok = (bos = template_special(pp, json_array_get(single, 0))) >= 0;
        if (ok && a_at + 1 < n) ok = (eos = template_special(pp, json_array_get(single, a_at + 1))) >= 0;
        if (!ok || bos >= (int64_t)n_tok || eos >= (int64_t)n_tok)
            FAIL(AG_ERR_UNSUPPORTED, "%s: post_processor '%s' is not supported (only [special] $A [special])", path,
                 ppt ? ppt : "?");
    }

    /* write */
    items = calloc(n_tok > n_merges ? n_tok : n_merges, sizeof *items);
    if (!items) FAIL(AG_ERR_NOMEM, "out of memory");
    for (size_t i = 0; i < n_tok; i++)
        items[i] = (ag_gguf_value){.type = AG_GGUF_STRING, .str = {texts[i], strlen(texts[i])}};
    ag_gguf_value arr = {.type = AG_GGUF_ARRAY, .arr = {.elem_type = AG_GGUF_STRING, .n = n_tok, .items = items}};
    ag_gguf_value ty = {.type = AG_GGUF_ARRAY, .arr = {.elem_type = AG_GGUF_I32, .n = n_tok, .raw = types}};
    if ((st = ag_gguf_writer_add_str(w, "tokenizer.ggml.model", "gpt2")) ||
        (st = ag_gguf_writer_add_str(w, "tokenizer.ggml.pre", "sentencepiece-bpe")) ||
        (st = ag_gguf_writer_add(w, "tokenizer.ggml.tokens", &arr)) ||
        (st = ag_gguf_writer_add(w, "tokenizer.ggml.token_type", &ty)))
        goto done;
    for (size_t i = 0; i < n_merges; i++)
        items[i] = (ag_gguf_value){.type = AG_GGUF_STRING, .str = {merges[i], strlen(merges[i])}};
    arr.arr.n = n_merges;
    if ((st = ag_gguf_writer_add(w, "tokenizer.ggml.merges", &arr))) goto done;
    if (bos >= 0 && (st = ag_gguf_writer_add_u32(w, "tokenizer.ggml.bos_token_id", (uint32_t)bos))) goto done;
    if (eos >= 0 && (st = ag_gguf_writer_add_u32(w, "tokenizer.ggml.eos_token_id", (uint32_t)eos))) goto done;
    if ((st = ag_gguf_writer_add_bool(w, "tokenizer.ggml.add_bos_token", bos >= 0)) ||
        (st = ag_gguf_writer_add_bool(w, "tokenizer.ggml.add_eos_token", eos >= 0)))
        goto done;
    for (size_t i = 0; i < n_tok; i++) {
        if (types[i] == AG_TOK_TYPE_UNKNOWN && (st = ag_gguf_writer_add_u32(w, "tokenizer.ggml.unknown_token_id", (uint32_t)i)))
            goto done;
        if (!strcmp(texts[i], "<pad>") && (st = ag_gguf_writer_add_u32(w, "tokenizer.ggml.padding_token_id", (uint32_t)i)))
            goto done;
    }
#undef FAIL
done:
    for (size_t i = 0; merges && i < n_merges; i++) free(merges[i]);
    free(merges);
    free(items);
    free(texts);
    free(types);
    json_decref(root);
    return st;
}
