/* augur template: renders a conversation through a chat template, exactly
 * as transformers' apply_chat_template(tokenize=False) would. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/buf.h"
#include "base/file.h"
#include "cli/cli.h"
#include "gguf/gguf.h"
#include "model/safetensors.h"
#include "tmpl/chat.h"
#include "tmpl/tmpl.h"

static const char usage_text[] =
    "usage: augur template (-m MODEL | --template FILE) --messages CONV.json\n"
    "  -m, --model PATH     the model whose chat template (tokenizer.chat_template) and BOS/EOS\n"
    "                       token text are used (default: $AUGUR_MODEL or the bundled SmolLM2)\n"
    "  --template FILE      a Jinja chat template file instead of the model's (BOS/EOS still come\n"
    "                       from -m when it is given)\n"
    "  --messages FILE      the conversation, one JSON object ('-' reads stdin):\n"
    "                       {\"messages\": [...], \"tools\": [...], \"add_generation_prompt\": true,\n"
    "                        \"bos_token\": \"<s>\", \"eos_token\": \"</s>\", ...other template variables}\n"
    "  -h, --help           this help\n"
    "Prints the rendering to stdout, nothing added. SOURCE_DATE_EPOCH, when set, is the time\n"
    "strftime_now() formats.\n";

static json_t *load_json_file(const char *path, char *err, size_t errcap) {
    json_error_t je;
    json_t      *j;
    if (!strcmp(path, "-")) j = json_loadf(stdin, JSON_DECODE_ANY | JSON_ALLOW_NUL, &je);
    else {
        char  *data;
        size_t len;
        if (ag_file_read_all(path, &data, &len) != AG_OK) {
            snprintf(err, errcap, "%s", ag_error_message());
            return NULL;
        }
        j = json_loadb(data, len, JSON_DECODE_ANY | JSON_ALLOW_NUL, &je);
        free(data);
    }
    if (!j) snprintf(err, errcap, "%s: invalid JSON: %s (line %d, column %d)", path, je.text, je.line, je.column);
    return j;
}

int ag_cli_template(int argc, char **argv) {
    const char *model = NULL, *tmpl_path = NULL, *conv_path = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            fputs(usage_text, stdout);
            return 0;
        }
        const char **slot = NULL;
        if (!strcmp(a, "-m") || !strcmp(a, "--model")) slot = &model;
        else if (!strcmp(a, "--template")) slot = &tmpl_path;
        else if (!strcmp(a, "--messages")) slot = &conv_path;
        else return ag_cli_usage_error(usage_text, "template: unknown argument '%s'", a);
        if (i + 1 >= argc) return ag_cli_usage_error(usage_text, "template: %s needs a value", a);
        *slot = argv[++i];
    }
    if (!conv_path) return ag_cli_usage_error(usage_text, "template: --messages is required");

    char    err[1024];
    json_t *conv = load_json_file(conv_path, err, sizeof err);
    if (!conv) return ag_cli_fail("%s", err);
    if (!json_is_object(conv)) {
        json_decref(conv);
        return ag_cli_fail("%s: the conversation must be a JSON object with a \"messages\" array", conv_path);
    }
    if (!json_is_array(json_object_get(conv, "messages"))) {
        json_decref(conv);
        return ag_cli_fail("%s: \"messages\" must be an array", conv_path);
    }

    ag_gguf *g = NULL;
    char    *src = NULL;
    size_t   src_len = 0;
    int      rc = 1;
    char    *bos = NULL, *eos = NULL;
    ag_tmpl *t = NULL;
    ag_buf   out = {0};
    if (!tmpl_path && !model) model = ag_cli_default_model();
    if (model && ag_model_file_open(model, &g) != AG_OK) {
        rc = ag_cli_fail("%s", ag_error_message());
        goto done;
    }
    if (tmpl_path) {
        if (ag_file_read_all(tmpl_path, &src, &src_len) != AG_OK) {
            rc = ag_cli_fail("%s", ag_error_message());
            goto done;
        }
    } else {
        uint64_t    n;
        const char *s = ag_gguf_get_str(g, "tokenizer.chat_template", &n);
        if (!s) {
            rc = ag_cli_fail("model has no chat template");
            goto done;
        }
        src = malloc((size_t)n + 1);
        if (!src) {
            rc = ag_cli_fail("out of memory");
            goto done;
        }
        memcpy(src, s, (size_t)n);
        src[n] = 0;
        src_len = (size_t)n;
    }
    if (ag_tmpl_parse(src, src_len, &t) != AG_OK) {
        rc = ag_cli_fail("%s", ag_error_message());
        goto done;
    }

    /* The context apply_chat_template builds: tools and documents default to
     * None, add_generation_prompt to False, special tokens from the model. */
    if (!json_object_get(conv, "tools")) json_object_set_new(conv, "tools", json_null());
    if (!json_object_get(conv, "documents")) json_object_set_new(conv, "documents", json_null());
    if (!json_object_get(conv, "add_generation_prompt")) json_object_set_new(conv, "add_generation_prompt", json_false());
    if (g) {
        bos = ag_chat_token_text(g, "tokenizer.ggml.bos_token_id");
        eos = ag_chat_token_text(g, "tokenizer.ggml.eos_token_id");
        if (bos && !json_object_get(conv, "bos_token")) json_object_set_new(conv, "bos_token", json_string(bos));
        if (eos && !json_object_get(conv, "eos_token")) json_object_set_new(conv, "eos_token", json_string(eos));
    }
    /* SOURCE_DATE_EPOCH pins strftime_now() (reproducible output, tests) */
    ag_tmpl_params params = ag_tmpl_default_params();
    const char    *epoch = getenv("SOURCE_DATE_EPOCH");
    if (epoch && *epoch) {
        char     *end;
        long long v = strtoll(epoch, &end, 10);
        if (*end || v < 0) {
            rc = ag_cli_fail("SOURCE_DATE_EPOCH must be a non-negative integer");
            goto done;
        }
        params.now = (int64_t)v;
    }
    if (ag_tmpl_render(t, conv, &params, &out) != AG_OK) {
        rc = ag_cli_fail("%s", ag_error_message());
        goto done;
    }
    if (out.len && fwrite(out.data, 1, out.len, stdout) != out.len) {
        rc = ag_cli_fail("template: writing the output failed");
        goto done;
    }
    if (fflush(stdout) != 0) {
        rc = ag_cli_fail("template: writing the output failed");
        goto done;
    }
    rc = 0;
done:
    ag_buf_free(&out);
    ag_tmpl_free(t);
    free(src);
    free(bos);
    free(eos);
    ag_gguf_free(g);
    json_decref(conv);
    return rc;
}
