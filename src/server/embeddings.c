/* POST /v1/embeddings (OpenAI's shape) for an embedding model (an encoder:
 * ag_model_is_encoder). input: a string, a list of strings, a list of token
 * ids, or a list of lists of token ids; encoding_format "float" (default) or
 * "base64" (little-endian float32); dimensions: a Matryoshka truncation
 * (ag_model_embed_truncate: as the model card says). `model` and `user` cannot change the output and are
 * ignored. Texts get the tokenizer's special tokens ([CLS] ... [SEP]) with
 * special-token text kept as text; token-id inputs are taken as given.
 * The inputs go to the server's embedding engine (engine/embed.h): the
 * inputs of every request waiting, this one's and other connections', are
 * packed into shared forward passes of up to SRV_EMB_PASS_TOKENS tokens,
 * taken from the requests in turn, as the generation engine packs waiting
 * prompts; the connection thread waits for its vectors. (The generation
 * engine never runs an encoder: generation routes refuse such a model.) */
#include <stdlib.h>
#include <string.h>

#include "server/conns.h"
#include "server/embeddings.h"
#include "server/server_impl.h"

#define EMB_MAX_INPUTS 2048 /* OpenAI's limit on the inputs of one request */

static void b64(const unsigned char *p, size_t n, ag_buf *out) {
    static const char t[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    for (size_t i = 0; i < n; i += 3) {
        unsigned v = (unsigned)p[i] << 16 | (i + 1 < n ? (unsigned)p[i + 1] << 8 : 0) | (i + 2 < n ? p[i + 2] : 0);
        char q[4] = {t[v >> 18 & 63], t[v >> 12 & 63], i + 1 < n ? t[v >> 6 & 63] : '=', i + 2 < n ? t[v & 63] : '='};
        ag_buf_append(out, q, 4);
    }
}

typedef struct {
    int32_t *ids;
    size_t   n;
} emb_input;

static void inputs_free(emb_input *v, int n) {
    for (int i = 0; v && i < n; i++) free(v[i].ids);
    free(v);
}

/* A list of token ids into *in; false (with the 400 filled) when it is not one. */
static bool ids_of(const json_t *a, int n_vocab, int index, emb_input *in, srv_resp *out) {
    size_t n = json_array_size(a);
    if (n == 0) {
        srv_error(out, 400, "invalid_request_error", "input", "invalid_value", "input %d is an empty list of tokens",
                  index);
        return false;
    }
    if (!(in->ids = malloc(sizeof(int32_t) * n))) {
        srv_error(out, 500, "server_error", NULL, NULL, "out of memory");
        return false;
    }
    in->n = n;
    for (size_t i = 0; i < n; i++) {
        const json_t *v = json_array_get(a, i);
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= n_vocab) {
            srv_error(out, 400, "invalid_request_error", "input", "invalid_value",
                      "input %d: token %zu is not a token id in [0, %d)", index, i, n_vocab);
            return false;
        }
        in->ids[i] = (int32_t)json_integer_value(v);
    }
    return true;
}

void srv_route_embeddings(srv_req *rq, srv_resp *out) {
    ag_server *s = rq->s;
    if (!ag_model_is_encoder(s->model)) {
        srv_error(out, 400, "invalid_request_error", "model", "model_not_supported",
                  "'%s' is a generative model, not an embedding model: /v1/embeddings needs one (e.g. nomic-embed-text)",
                  s->model_id);
        return;
    }
    json_t *b = srv_parse_body(rq, out);
    if (!b) return;
    const ag_model_config *c = ag_model_config_of(s->model);
    json_t *input = json_object_get(b, "input"), *fmt = json_object_get(b, "encoding_format"),
           *dim = json_object_get(b, "dimensions");
    emb_input *in = NULL;
    int        n_in = 0, dims = c->n_embd;
    bool       base64 = false;
    float     *vec = NULL;
    const int32_t **seqs = NULL;
    size_t        *lens = NULL;
    if (fmt && !json_is_null(fmt)) {
        const char *f = json_string_value(fmt);
        if (!f || (strcmp(f, "float") && strcmp(f, "base64"))) {
            srv_error(out, 400, "invalid_request_error", "encoding_format", "invalid_value",
                      "'encoding_format' must be \"float\" or \"base64\"");
            goto done;
        }
        base64 = !strcmp(f, "base64");
    }
    if (dim && !json_is_null(dim)) {
        if (!json_is_integer(dim) || json_integer_value(dim) < 1 || json_integer_value(dim) > c->n_embd) {
            srv_error(out, 400, "invalid_request_error", "dimensions", "invalid_value",
                      "'dimensions' must be an integer in [1, %d] (the model's dimensions)", c->n_embd);
            goto done;
        }
        dims = (int)json_integer_value(dim);
    }
    /* the inputs: one string, one list of ids, or a list of either */
    const bool one = json_is_string(input) ||
                     (json_is_array(input) && json_array_size(input) > 0 && json_is_integer(json_array_get(input, 0)));
    if (!input || (!json_is_string(input) && !json_is_array(input))) {
        srv_error(out, 400, "invalid_request_error", "input", input ? "invalid_type" : "missing_required_parameter",
                  "'input' must be a string, a list of strings, a list of token ids or a list of such lists");
        goto done;
    }
    n_in = one ? 1 : (int)json_array_size(input);
    if (n_in == 0 || n_in > EMB_MAX_INPUTS) {
        srv_error(out, 400, "invalid_request_error", "input", "invalid_value", "'input' must hold 1 to %d inputs",
                  EMB_MAX_INPUTS);
        n_in = 0;
        goto done;
    }
    if (!(in = calloc((size_t)n_in, sizeof *in))) {
        srv_error(out, 500, "server_error", NULL, NULL, "out of memory");
        n_in = 0;
        goto done;
    }
    long total = 0;
    for (int i = 0; i < n_in; i++) {
        const json_t *v = one ? input : json_array_get(input, (size_t)i);
        if (json_is_string(v)) {
            if (json_string_length(v) == 0) {
                srv_error(out, 400, "invalid_request_error", "input", "invalid_value", "input %d is an empty string", i);
                goto done;
            }
            if (ag_tok_encode(s->tok, json_string_value(v), json_string_length(v), true, false, &in[i].ids, &in[i].n)) {
                srv_error(out, 400, "invalid_request_error", "input", "invalid_value", "input %d: %s", i,
                          ag_error_message());
                goto done;
            }
        } else if (json_is_array(v)) {
            if (!ids_of(v, c->n_vocab, i, &in[i], out)) goto done;
        } else {
            srv_error(out, 400, "invalid_request_error", "input", "invalid_type",
                      "input %d must be a string or a list of token ids", i);
            goto done;
        }
        if ((long)in[i].n > c->n_ctx_train) {
            srv_error(out, 400, "invalid_request_error", "input", "context_length_exceeded",
                      "input %d has %zu tokens; the model's maximum context length is %d tokens", i, in[i].n,
                      c->n_ctx_train);
            goto done;
        }
        total += (long)in[i].n;
    }
    const size_t n_inputs = (size_t)n_in; /* 1 .. EMB_MAX_INPUTS here */
    vec = malloc(sizeof *vec * n_inputs * (size_t)c->n_embd);
    seqs = calloc(n_inputs, sizeof *seqs);
    lens = calloc(n_inputs, sizeof *lens);
    if (!vec || !seqs || !lens) {
        srv_error(out, 500, "server_error", NULL, NULL, "out of memory");
        goto done;
    }
    for (int i = 0; i < n_in; i++) seqs[i] = in[i].ids, lens[i] = in[i].n;
    /* the request is in: the header deadline (conns.c) must not close the
     * connection while it waits for its passes, which may take long */
    if (rq->conn) srv_conn_answering(s, rq->conn);
    ag_status st = ag_embedder_run(s->emb, seqs, lens, n_in, vec);
    if (st) { /* 400 for a bad input, 429 with Retry-After when the queue is full, 503 when stopping */
        srv_status_error(out, st, "input");
        goto done;
    }
    json_t *data = json_array();
    for (int i = 0; i < n_in; i++) {
        float *e = vec + (size_t)i * c->n_embd;
        ag_model_embed_truncate(s->model, e, dims, e);
        json_t *emb;
        if (base64) {
            ag_buf bb = {0};
            b64((const unsigned char *)e, sizeof(float) * (size_t)dims, &bb); /* (x86: little-endian) */
            emb = json_stringn(bb.data ? bb.data : "", bb.len);
            ag_buf_free(&bb);
        } else {
            emb = json_array();
            for (int j = 0; j < dims; j++) json_array_append_new(emb, json_real(e[j]));
        }
        json_array_append_new(data, json_pack("{s:s, s:i, s:o}", "object", "embedding", "index", i, "embedding", emb));
    }
    srv_json(out, 200,
             json_pack("{s:s, s:o, s:s, s:{s:I, s:I}}", "object", "list", "data", data, "model", s->model_id, "usage",
                       "prompt_tokens", (json_int_t)total, "total_tokens", (json_int_t)total));
done:
    inputs_free(in, n_in);
    free(vec);
    free(seqs);
    free(lens);
    json_decref(b);
}
