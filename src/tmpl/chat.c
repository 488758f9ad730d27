/* The model's chat format: template + special-token text, or ChatML. */
#include "tmpl/chat.h"

#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "tmpl/tmpl.h"

struct ag_chat {
    ag_tmpl *tmpl;
    char    *bos, *eos; /* NULL: undefined in the template */
    bool     is_default;
};

/* ChatML, as used by Qwen, SmolLM and many others. */
static const char k_chatml[] =
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}";

char *ag_chat_token_text(const ag_gguf *g, const char *id_key) {
    uint32_t id;
    if (!ag_gguf_get_u32(g, id_key, &id)) return NULL;
    const ag_gguf_value *toks = ag_gguf_get(g, "tokenizer.ggml.tokens");
    if (!toks || toks->type != AG_GGUF_ARRAY || toks->arr.elem_type != AG_GGUF_STRING || id >= toks->arr.n ||
        !toks->arr.items)
        return NULL;
    const ag_gguf_value *t = &toks->arr.items[id];
    return strndup(t->str.ptr, t->str.len);
}

ag_status ag_chat_from_source(const char *src, size_t len, const char *bos, const char *eos, ag_chat **out) {
    *out = NULL;
    ag_chat *c = calloc(1, sizeof *c);
    if (!c) return ag_errorf(AG_ERR_NOMEM, "out of memory");
    ag_status st = ag_tmpl_parse(src, len, &c->tmpl);
    if (st) {
        free(c);
        return st;
    }
    c->bos = bos ? strdup(bos) : NULL;
    c->eos = eos ? strdup(eos) : NULL;
    *out = c;
    return AG_OK;
}

ag_status ag_chat_from_gguf(const ag_gguf *g, ag_chat **out) {
    uint64_t len = 0;
    const char *src = ag_gguf_get_str(g, "tokenizer.chat_template", &len);
    bool is_default = src == NULL;
    if (is_default) {
        AG_LOGI("the model has no chat template; using ChatML (<|im_start|>role ... <|im_end|>)");
        src = k_chatml;
        len = sizeof k_chatml - 1;
    }
    char *bos = ag_chat_token_text(g, "tokenizer.ggml.bos_token_id");
    char *eos = ag_chat_token_text(g, "tokenizer.ggml.eos_token_id");
    ag_status st = ag_chat_from_source(src, (size_t)len, bos, eos, out);
    free(bos);
    free(eos);
    if (!st) (*out)->is_default = is_default;
    return st;
}

void ag_chat_free(ag_chat *c) {
    if (!c) return;
    ag_tmpl_free(c->tmpl);
    free(c->bos);
    free(c->eos);
    free(c);
}

bool        ag_chat_is_default(const ag_chat *c) { return c->is_default; }
const char *ag_chat_bos_text(const ag_chat *c) { return c->bos ? c->bos : ""; }

ag_status ag_chat_render(const ag_chat *c, const json_t *messages, const json_t *tools, bool add_generation_prompt,
                         const json_t *extra, ag_buf *out) {
    json_t *ctx = ag_tmpl_chat_context(messages, tools, add_generation_prompt, c->bos, c->eos, extra);
    if (!ctx) return ag_errorf(AG_ERR_NOMEM, "out of memory");
    ag_status st = ag_tmpl_render(c->tmpl, ctx, NULL, out);
    json_decref(ctx);
    return st;
}

bool ag_chat_has_bos(const ag_chat *c, const char *text, size_t len) {
    size_t n = c->bos ? strlen(c->bos) : 0;
    return n > 0 && len >= n && memcmp(text, c->bos, n) == 0;
}
