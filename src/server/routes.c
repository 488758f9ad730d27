/* The small routes: /v1/models, /health, /metrics, /tokenize, /detokenize. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/routes.h"
#include "server/gen.h"
#include "server/reply.h"
#include "server/server_impl.h"

static json_t *model_obj(ag_server *s) {
    json_t *m = json_object();
    json_object_set_new(m, "id", json_string(s->model_id));
    json_object_set_new(m, "object", json_string("model"));
    json_object_set_new(m, "created", json_integer((json_int_t)s->started));
    json_object_set_new(m, "owned_by", json_string("augur"));
    const ag_model_config *cfg = ag_model_config_of(s->model);
    json_t *meta = json_object();
    json_object_set_new(meta, "architecture", json_string(cfg->arch_name));
    json_object_set_new(meta, "n_vocab", json_integer(cfg->n_vocab));
    json_object_set_new(meta, "n_ctx_train", json_integer(cfg->n_ctx_train));
    json_object_set_new(meta, "n_ctx", json_integer(s->n_ctx));
    json_object_set_new(meta, "n_parallel", json_integer(s->n_parallel));
    json_object_set_new(meta, "chat_template", json_string(s->chat && ag_chat_is_default(s->chat) ? "chatml (default)" : "model"));
    json_object_set_new(m, "meta", meta);
    return m;
}

void srv_route_models(srv_req *rq, srv_resp *out, const char *id) {
    ag_server *s = rq->s;
    if (id) {
        if (strcmp(id, s->model_id) != 0) {
            srv_error(out, 404, "invalid_request_error", "model", "model_not_found", "the model '%s' does not exist",
                      id);
            return;
        }
        srv_json(out, 200, model_obj(s));
        return;
    }
    json_t *r = json_object();
    json_object_set_new(r, "object", json_string("list"));
    json_t *data = json_array();
    json_array_append_new(data, model_obj(s));
    json_object_set_new(r, "data", data);
    srv_json(out, 200, r);
}

void srv_route_health(srv_req *rq, srv_resp *out) {
    ag_server *s = rq->s;
    ag_engine_stats st;
    if (atomic_load(&s->stopping) || !srv_engine_stats(s, &st)) {
        srv_json(out, 503, json_pack("{s:s}", "status", "shutting down"));
        return;
    }
    srv_json(out, 200, json_pack("{s:s, s:i, s:i}", "status", "ok", "running", st.running, "queued", st.queue_depth));
}

static void metric(ag_buf *b, const char *name, const char *type, const char *help, double v) {
    ag_buf_printf(b, "# HELP augur_%s %s\n# TYPE augur_%s %s\naugur_%s %.17g\n", name, help, name, type, name, v);
}

/* The prefix cache's counters (cache/cache.h), memory and disk tiers. */
static void cache_metrics(ag_buf *b, const ag_cache_stats *c) {
    metric(b, "prefix_cache_lookups_total", "counter", "Prefix cache lookups (admitted requests).", (double)c->lookups);
    metric(b, "prefix_cache_hits_total", "counter", "Prefix cache lookups that adopted at least one block.",
           (double)c->hits);
    metric(b, "prefix_cache_misses_total", "counter", "Prefix cache lookups that adopted nothing.", (double)c->misses);
    metric(b, "prefix_cache_tokens_restored_memory_total", "counter",
           "Prompt tokens whose KV was adopted from the memory tier.", (double)c->tokens_from_memory);
    metric(b, "prefix_cache_tokens_restored_disk_total", "counter",
           "Prompt tokens whose KV was restored from the disk tier.", (double)c->tokens_from_disk);
    metric(b, "prefix_cache_tokens_restored_host_total", "counter",
           "Prompt tokens whose KV was copied back into the pool from the host tier.", (double)c->tokens_from_host);
    metric(b, "prefix_cache_hits_memory_total", "counter",
           "Lookups that adopted at least one block the memory tier (the KV pool) held.", (double)c->hits_memory);
    metric(b, "prefix_cache_hits_host_total", "counter",
           "Lookups that adopted at least one block copied back from the host tier.", (double)c->hits_host);
    metric(b, "prefix_cache_hits_disk_total", "counter",
           "Lookups that adopted at least one block restored from the disk tier.", (double)c->hits_disk);
    metric(b, "prefix_cache_host_blocks", "gauge", "KV blocks the host tier holds.", c->host_blocks);
    metric(b, "prefix_cache_host_bytes", "gauge", "Bytes of KV the host tier holds.", (double)c->host_bytes);
    metric(b, "prefix_cache_host_max_bytes", "gauge", "The host tier's bound (whole blocks; 0: off).",
           (double)c->host_max_bytes);
    metric(b, "prefix_cache_evictions_host_total", "counter",
           "KV blocks the host tier let go to stay within its bound.", (double)c->evictions_host);
    metric(b, "prefix_cache_host_to_disk_total", "counter",
           "Blocks queued for the disk as they left the host tier (not written before).", (double)c->host_to_disk);
    metric(b, "prefix_cache_blocks_published_total", "counter", "KV blocks newly indexed by the prefix cache.",
           (double)c->blocks_published);
    metric(b, "prefix_cache_memory_blocks", "gauge", "KV blocks the prefix cache holds a reference on.",
           c->memory_blocks);
    metric(b, "prefix_cache_evictions_memory_total", "counter", "KV blocks the memory tier gave back to the pool.",
           (double)c->evictions_memory);
    metric(b, "prefix_cache_disk_enabled", "gauge", "1 when the disk tier is in use (restores).", c->disk_enabled);
    metric(b, "prefix_cache_disk_writable", "gauge", "1 when the disk tier is writing records.", c->disk_writable);
    metric(b, "prefix_cache_disk_scan_done", "gauge", "1 once the start-up scan of the disk tier is merged.",
           c->scan_done);
    metric(b, "prefix_cache_disk_bytes_read_total", "counter", "Record bytes read from the disk tier.",
           (double)c->bytes_read);
    metric(b, "prefix_cache_disk_bytes_written_total", "counter", "Record bytes written to the disk tier.",
           (double)c->bytes_written);
    metric(b, "prefix_cache_disk_records_written_total", "counter", "Records written to the disk tier.",
           (double)c->records_written);
    metric(b, "prefix_cache_disk_restore_seconds_total", "counter",
           "Wall time of restores from the disk tier, from admission to adoption.", (double)c->restore_ns / 1e9);
    metric(b, "prefix_cache_disk_restores_pending", "gauge", "Requests waiting for their prefix's disk records.",
           c->restores_pending);
    metric(b, "prefix_cache_disk_restores_cancelled_total", "counter",
           "Restores abandoned before they finished (the request ended).", (double)c->restores_cancelled);
    metric(b, "prefix_cache_disk_evictions_total", "counter", "Records deleted to keep the disk byte cap.",
           (double)c->evictions_disk);
    metric(b, "prefix_cache_disk_dropped_records_total", "counter",
           "Records deleted as unusable (other model/tokenizer/layout, corrupt, truncated, .tmp leftovers, failed "
           "restores).",
           (double)c->dropped_records);
    metric(b, "prefix_cache_disk_restore_failures_total", "counter", "Disk restores that failed (then prefilled).",
           (double)c->restore_failures);
    metric(b, "prefix_cache_disk_write_failures_total", "counter",
           "Disk writes that failed (a full disk pauses writing; other errors stop it).", (double)c->write_failures);
    metric(b, "prefix_cache_disk_full_total", "counter",
           "Times writing paused because the disk was full (then the cap in force drops to half the room there).",
           (double)c->space_pauses);
    metric(b, "prefix_cache_disk_write_paused", "gauge", "1 while writing is paused after a full disk.",
           c->disk_paused);
    metric(b, "prefix_cache_disk_records_skipped_total", "counter",
           "Blocks the byte cap left unwritten (less recently used than every record it could delete).",
           (double)c->records_skipped);
    metric(b, "prefix_cache_disk_records", "gauge", "Records in the disk tier.", (double)c->records_on_disk);
    metric(b, "prefix_cache_disk_bytes", "gauge", "Bytes of records in the disk tier.", (double)c->disk_bytes);
    metric(b, "prefix_cache_disk_queued_bytes", "gauge",
           "Bytes of records queued for the writer or being written (with disk_bytes, at most the cap).",
           (double)c->queued_bytes);
    metric(b, "prefix_cache_disk_max_bytes", "gauge", "The disk tier's byte cap in force.", (double)c->disk_max_bytes);
    metric(b, "prefix_cache_disk_scan_seconds", "gauge", "Duration of the disk tier's start-up scan.",
           (double)c->scan_ns / 1e9);
}

void srv_route_metrics(srv_req *rq, srv_resp *out) {
    ag_server *s = rq->s;
    ag_engine_stats st;
    if (!srv_engine_stats(s, &st)) {
        srv_error(out, 503, "server_error", NULL, "shutting_down", "the server is shutting down");
        return;
    }
    ag_buf *b = &out->body;
    ag_buf_clear(b);
    metric(b, "requests_total", "counter", "Generation requests accepted by the engine.", (double)st.requests_total);
    metric(b, "requests_finished_total", "counter", "Generation requests the engine finished (any reason).",
           (double)st.requests_finished);
    metric(b, "prompt_tokens_total", "counter", "Prompt tokens prefilled.", (double)st.prompt_tokens);
    metric(b, "generation_tokens_total", "counter", "Tokens generated.", (double)st.generated_tokens);
    metric(b, "cached_tokens_total", "counter", "Prompt tokens reused from the KV cache.", (double)st.cached_tokens);
    metric(b, "prefill_seconds_total", "counter", "Engine time in steps that prefilled.", st.prefill_seconds);
    metric(b, "decode_seconds_total", "counter", "Engine time in decode-only steps.", st.decode_seconds);
    metric(b, "prefill_tokens_per_second", "gauge", "Prompt tokens per second of prefill time (since start).",
           st.prefill_seconds > 0 ? (double)st.prompt_tokens / st.prefill_seconds : 0);
    metric(b, "decode_tokens_per_second", "gauge",
           "Generated tokens per second of engine stepping time (since start).",
           st.decode_seconds + st.prefill_seconds > 0
               ? (double)st.generated_tokens / (st.decode_seconds + st.prefill_seconds)
               : 0);
    metric(b, "spec_draft_tokens_total", "counter", "Speculative decoding: draft tokens verified.",
           (double)st.spec.drafted);
    metric(b, "spec_accepted_tokens_total", "counter", "Speculative decoding: draft tokens accepted.",
           (double)st.spec.accepted);
    metric(b, "spec_verify_steps_total", "counter", "Speculative decoding: target forwards that verified drafts.",
           (double)st.spec.rounds);
    metric(b, "spec_mean_accepted_length", "gauge",
           "Speculative decoding: tokens emitted per verifying forward (accepted drafts + 1), since start.",
           st.spec.rounds ? (double)st.spec.emitted / (double)st.spec.rounds : 0);
    metric(b, "decode_forwards_total", "counter", "Per-sequence decode windows run (plain or verifying).",
           (double)st.decode_forwards);
    ag_buf_printf(b, "# HELP augur_spec_acceptance_by_position Speculative decoding: share of rounds that "
                     "verified draft position i (0-based) and accepted it.\n"
                     "# TYPE augur_spec_acceptance_by_position gauge\n");
    for (int i = 0; i < AG_SPEC_MAX_DRAFT && st.spec.drafted_at[i]; i++)
        ag_buf_printf(b, "augur_spec_acceptance_by_position{position=\"%d\"} %.6f\n", i,
                      (double)st.spec.accepted_at[i] / (double)st.spec.drafted_at[i]);
    metric(b, "queue_depth", "gauge", "Requests waiting for admission.", st.queue_depth);
    metric(b, "running_sequences", "gauge", "Sequences (choices) running (preempted ones too).", st.running);
    metric(b, "swapped_requests", "gauge", "Requests preempted for KV blocks, their KV in host memory.", st.swapped);
    metric(b, "preemptions_total", "counter", "Requests preempted because the running ones outgrew the KV pool.",
           (double)st.preemptions);
    metric(b, "engine_steps_total", "counter", "Forward steps.", (double)st.steps);
    metric(b, "engine_mixed_steps_total", "counter", "Forward steps with prompt and decode rows together.",
           (double)st.mixed_steps);
    metric(b, "step_prompt_budget", "gauge",
           "Prompt tokens the last step with decode rows could take (--itl-target and the measured costs).",
           st.prompt_budget);
    metric(b, "step_prompt_tokens_max", "gauge", "The most prompt tokens a step carried beside decode rows.",
           st.max_mixed_prompt_tokens);
    metric(b, "step_prompt_fixed_ms", "gauge", "Fitted cost of having prompt rows in a step, ms.",
           st.prompt_step_fixed_ms);
    metric(b, "step_prompt_token_ms", "gauge", "Fitted cost of one prompt token in a step, ms.", st.prompt_token_ms);
    metric(b, "kv_blocks_used", "gauge", "KV cache blocks in use.", st.kv_blocks_used);
    metric(b, "kv_blocks_free", "gauge", "KV cache blocks free.", st.kv_blocks_free);
    metric(b, "kv_blocks_cached", "gauge",
           "KV cache blocks held only by the prefix cache (reusable prefixes, reclaimable).", st.kv_blocks_cached);
    if (st.prefix_cache) cache_metrics(b, &st.cache);
    if (s->emb) { /* the embedding engine (engine/embed.h) */
        ag_embedder_stats es;
        ag_embedder_get_stats(s->emb, &es);
        metric(b, "embed_requests_total", "counter", "Embedding requests queued.", (double)es.requests);
        metric(b, "embed_inputs_total", "counter", "Embedding inputs run.", (double)es.inputs);
        metric(b, "embed_tokens_total", "counter", "Tokens of embedding inputs run.", (double)es.tokens);
        metric(b, "embed_passes_total", "counter", "Embedding forward passes.", (double)es.passes);
        metric(b, "embed_shared_passes_total", "counter",
               "Embedding passes that held inputs of more than one request.", (double)es.shared_passes);
    }
    metric(b, "n_ctx", "gauge", "Context size per sequence.", st.n_ctx);
    metric(b, "n_parallel", "gauge", "Sequences run at once.", st.n_parallel);
    metric(b, "client_cancels_total", "counter", "Generations cancelled because the client went away.",
           (double)atomic_load(&s->client_cancels));
    metric(b, "http_request_timeouts_total", "counter",
           "Connections closed (408) because a request's headers or body did not arrive in time.",
           (double)atomic_load(&s->conn_timeouts));
    metric(b, "http_slow_connections_closed_total", "counter",
           "Connections still sending a request closed to keep slots for requests that arrived whole.",
           (double)atomic_load(&s->conn_evictions));
    ag_buf_printf(b, "# HELP augur_http_requests_total HTTP responses by status code.\n"
                     "# TYPE augur_http_requests_total counter\n");
    for (int i = 0; i < SRV_CODE_SLOTS; i++)
        ag_buf_printf(b, "augur_http_requests_total{code=\"%d\"} %llu\n", srv_codes[i],
                      (unsigned long long)atomic_load(&s->http_count[i]));
    ag_buf_printf(b, "augur_http_requests_total{code=\"other\"} %llu\n",
                  (unsigned long long)atomic_load(&s->http_count[SRV_CODE_SLOTS]));
    out->status = 200;
    out->content_type = "text/plain; version=0.0.4; charset=utf-8";
}

void srv_route_tokenize(srv_req *rq, srv_resp *out) {
    ag_server *s = rq->s;
    json_t *b = srv_parse_body(rq, out);
    if (!b) return;
    json_t *content = json_object_get(b, "content");
    if (!content) content = json_object_get(b, "text");
    json_t *as = json_object_get(b, "add_special");
    json_t *ps = json_object_get(b, "parse_special");
    json_t *wp = json_object_get(b, "with_pieces");
    if (!json_is_string(content)) {
        srv_error(out, 400, "invalid_request_error", "content", content ? "invalid_type" : "missing_required_parameter",
                  "'content' must be a string");
    } else if ((as && !json_is_boolean(as)) || (ps && !json_is_boolean(ps)) || (wp && !json_is_boolean(wp))) {
        const char *p = as && !json_is_boolean(as) ? "add_special" : ps && !json_is_boolean(ps) ? "parse_special"
                                                                                                 : "with_pieces";
        srv_error(out, 400, "invalid_request_error", p, "invalid_type", "'%s' must be a boolean", p);
    } else {
        int32_t *ids = NULL;
        size_t n = 0;
        bool add_special = as ? json_is_true(as) : false;
        bool parse_special = ps ? json_is_true(ps) : true;
        if (ag_tok_encode(s->tok, json_string_value(content), json_string_length(content), add_special, parse_special,
                          &ids, &n)) {
            srv_error(out, 400, "invalid_request_error", "content", "invalid_value", "%s", ag_error_message());
        } else {
            json_t *arr = json_array();
            for (size_t i = 0; i < n; i++) {
                if (json_is_true(wp)) {
                    size_t len;
                    const char *p = ag_tok_piece(s->tok, ids[i], &len);
                    json_array_append_new(arr, json_pack("{s:i, s:o}", "id", ids[i], "piece", srv_jstr(p, p ? len : 0)));
                } else {
                    json_array_append_new(arr, json_integer(ids[i]));
                }
            }
            free(ids);
            srv_json(out, 200, json_pack("{s:o}", "tokens", arr));
        }
    }
    json_decref(b);
}

void srv_route_detokenize(srv_req *rq, srv_resp *out) {
    ag_server *s = rq->s;
    json_t *b = srv_parse_body(rq, out);
    if (!b) return;
    json_t *toks = json_object_get(b, "tokens");
    if (!json_is_array(toks)) {
        srv_error(out, 400, "invalid_request_error", "tokens", toks ? "invalid_type" : "missing_required_parameter",
                  "'tokens' must be a list of token ids");
        json_decref(b);
        return;
    }
    size_t n = json_array_size(toks);
    int32_t *ids = malloc(sizeof *ids * (n ? n : 1));
    size_t i;
    json_t *x;
    bool ok = ids != NULL;
    json_array_foreach(toks, i, x) {
        if (!ok) break;
        if (!json_is_integer(x) || json_integer_value(x) < 0 || json_integer_value(x) >= s->n_vocab) {
            srv_error(out, 400, "invalid_request_error", "tokens", "invalid_value",
                      "token ids must be integers in [0, %d); item %zu is not", s->n_vocab, i);
            free(ids);
            json_decref(b);
            return;
        }
        ids[i] = (int32_t)json_integer_value(x);
    }
    ag_buf text = {0};
    if (!ok || ag_tok_decode(s->tok, ids, n, AG_DECODE_SPECIAL, &text)) {
        srv_error(out, 400, "invalid_request_error", "tokens", "invalid_value", "%s",
                  ok ? ag_error_message() : "out of memory");
    } else {
        srv_json(out, 200, json_pack("{s:o}", "content", srv_jstr(text.data, text.len)));
    }
    ag_buf_free(&text);
    free(ids);
    json_decref(b);
}
