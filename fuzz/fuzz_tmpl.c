/* libFuzzer target for the template interpreter: the input is a template
 * (everything after the first NUL byte, if any, is a JSON context). Parses,
 * and when that works renders with a fixed chat context and tight limits, so
 * every path of lexer, parser, scope pass and evaluator sees hostile input.
 * Any crash, leak, sanitizer report or hang is a bug: errors must come back
 * as ag_status values. */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "base/buf.h"
#include "tmpl/tmpl.h"

static const char default_ctx[] =
    "{\"messages\": [{\"role\": \"system\", \"content\": \"sys\"}, {\"role\": \"user\", \"content\": \"h\\u00e9llo\"},"
    " {\"role\": \"assistant\", \"content\": \"\", \"tool_calls\": [{\"id\": \"c1\", \"type\": \"function\","
    " \"function\": {\"name\": \"f\", \"arguments\": {\"a\": [1, 2.5, null, true]}}}]},"
    " {\"role\": \"tool\", \"content\": \"{}\"}], \"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\","
    " \"parameters\": {\"type\": \"object\", \"properties\": {\"a\": {\"type\": \"array\"}}}}}],"
    " \"add_generation_prompt\": true, \"bos_token\": \"<s>\", \"eos_token\": \"</s>\", \"n\": 3, \"s\": \"a,b\"}";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *src = (const char *)data;
    size_t      n = size;
    const char *nul = memchr(src, 0, size);
    const char *ctx = default_ctx;
    size_t      ctx_len = sizeof default_ctx - 1;
    if (nul) {
        n = (size_t)(nul - src);
        ctx = nul + 1;
        ctx_len = size - n - 1;
    }
    ag_tmpl *t = NULL;
    if (ag_tmpl_parse(src, n, &t) != AG_OK) return 0;
    ag_tmpl_params p = ag_tmpl_default_params();
    p.max_output = 1 << 16;
    p.max_memory = 16 << 20;
    p.max_steps = 20000;
    p.max_depth = 50;
    p.now = 0;
    ag_buf out = {0};
    if (ag_tmpl_render_json(t, ctx, ctx_len, &p, &out) != AG_OK && nul)
        ag_tmpl_render_json(t, default_ctx, sizeof default_ctx - 1, &p, &out);
    ag_buf_free(&out);
    ag_tmpl_free(t);
    return 0;
}
