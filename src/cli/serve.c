/* `augur serve`: the OpenAI-compatible HTTP server. */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/log.h"
#include "base/switches.h"
#include "cli/cli.h"
#include "engine/engine.h"
#include "server/server.h"
#include "tmpl/chat.h"

static const char usage[] =
    "usage: augur serve [-m MODEL] [options]\n"
    "  serves the OpenAI API (/v1/chat/completions, /v1/completions, /v1/models) plus /health,\n"
    "  /metrics, /tokenize, /detokenize and a chat page at /; prints one line when ready;\n"
    "  SIGINT/SIGTERM stop it\n"
    "  -m MODEL            GGUF model (default: $AUGUR_MODEL, else models/SmolLM2-135M-Instruct.Q4_1.gguf)\n"
    "  --host HOST         address to bind (default 127.0.0.1)\n"
    "  --port N            port (default 8080; 0 = any free port)\n"
    "  --api-key KEY       require 'Authorization: Bearer KEY' (default: $AUGUR_API_KEY, else none)\n"
    "  --alias NAME        the model name clients see (default: the file name without .gguf)\n"
    "  --parallel N        sequences generated at once (default 4, at most 256); on a GPU the KV pool, not\n"
    "                      N x --ctx, bounds how many run: the rest wait, and the newest is preempted\n"
    "                      (its KV moved to host memory) when the running ones outgrow the pool\n"
    "  --ctx N             context per sequence (default: the model's, at most 4096)\n"
    "  --max-queue N       requests waiting for a slot before 429s (default 64)\n"
    "  --batch N           tokens per engine step; smaller prompt chunks keep streams smoother (default 512; 4096 on a GPU)\n"
    "  --kv-type TYPE      KV cache element type: f16 (default), q8_0 (about half the bytes), q4_0\n"
    "                      (about a quarter), f32; quantized types need head dims that are multiples\n"
    "                      of 32 and run on the CPU only for now\n"
    "  --kv-mem SIZE       KV pool (e.g. 8G): default --parallel full contexts on the CPU, and on a GPU all\n"
    "                      that its free memory holds (requests that do not fit wait); room beyond the\n"
    "                      running sequences holds the prefix cache\n"
    "  --itl-target MS     while streams decode, a step takes as many prompt tokens as fit this step time\n"
    "                      (their inter-token latency), from the measured costs, at least 64; default 200\n"
    "                      on a GPU (waiting prompts enter in one or a few steps), none on the CPU (64 a\n"
    "                      step); 0: the device's default, -1: none\n"
    "  -t THREADS          CPU threads (default: all cores)\n"
    "  --cors-origin ORIG  send Access-Control-Allow-Origin: ORIG (e.g. '*' or https://app.example)\n"
    "  --max-body BYTES    request body limit (default 8388608)\n"
    "  --max-connections N concurrent connections (default 256); clients still sending a request may hold\n"
    "                      7/8 of them: past that the one waiting longest is closed\n"
    "  --max-connections-per-ip N  connections one client address may hold (default 0: no limit)\n"
    "  --timeout S         idle connection timeout in seconds (default 60)\n"
    "  --header-timeout S  a request's headers must arrive within S seconds of its connection opening (or\n"
    "                      of the previous response on it), then its body at 1 KiB/s on average; else a\n"
    "                      408 and the connection is closed (default 20; responses are never cut)\n"
    "  --no-webui          no chat page at / (GET / answers 404)\n"
    "  --lenient-fields    ignore request fields the API does not define, or that this server does not\n"
    "                      implement, instead of answering 400 naming them\n"
    "  --kv-disk DIR       keep the prefix cache's KV blocks in DIR too, so that prompts seen before a\n"
    "                      restart are restored instead of recomputed (DIR is created; give each model\n"
    "                      and KV type its own DIR: records of another model or --kv-type found there\n"
    "                      are deleted). Default: $XDG_CACHE_HOME/augur/kv/<model fingerprint>[-TYPE],\n"
    "                      else ~/.cache/augur/kv/<model fingerprint>[-TYPE] (-TYPE for a type not f16)\n"
    "  --kv-disk-max SIZE  byte cap of the disk cache, a hard bound counting records still being written;\n"
    "                      least recently used records go first (e.g. 512M, 32G, or bytes; default: 32G or\n"
    "                      10% of the free space, whichever is less; a full disk lowers it to half the room)\n"
    "  --no-kv-disk        no disk cache (prompt prefixes are still shared in memory)\n"
    "  --kv-host-mem SIZE  a host-memory tier of the prefix cache between the KV pool and the disk: blocks\n"
    "                      evicted from the pool are kept there (pinned memory on a GPU) and copied back on\n"
    "                      a hit without reading the disk; least recently evicted go first, to the disk\n"
    "                      if not written yet (e.g. 8G; default 0: off)\n"
    "  a disk cache directory that cannot be used is reported once and the server runs without it\n"
    AG_CLI_DRAFT_USAGE
    "  a draft that cannot be loaded is reported and the server runs without speculation\n";

/* The default disk cache directory of a model:
 * $XDG_CACHE_HOME/augur/kv/<fingerprint>, else ~/.cache/augur/kv/<fingerprint>.
 * Creates the parents (the cache creates the last level). false when there
 * is no per-user cache directory. */
/* One directory per model and KV type: records of another type are never
 * served (the record header carries it), and a server would drop them, so
 * a q8_0 server does not clear the f16 one's cache (f16 keeps the plain
 * name it always had). */
static bool default_kv_dir(uint64_t fingerprint, ag_kv_dtype kv_type, char *out, size_t cap) {
    const char *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    char base[4096];
    if (xdg && *xdg == '/') snprintf(base, sizeof base, "%s", xdg);
    else if (home && *home) snprintf(base, sizeof base, "%s/.cache", home);
    else return false;
    const char *parts[] = {"", "/augur", "/augur/kv"};
    for (int i = 0; i < 3; i++) {
        char d[4200];
        snprintf(d, sizeof d, "%s%s", base, parts[i]);
        mkdir(d, 0700); /* best effort: the cache reports a directory it cannot use */
    }
    int n = snprintf(out, cap, "%s/augur/kv/%016llx%s%s", base, (unsigned long long)fingerprint,
                     kv_type == AG_KV_F16 ? "" : "-", kv_type == AG_KV_F16 ? "" : ag_kv_dtype_name(kv_type));
    return n > 0 && (size_t)n < cap;
}

static void model_name(const char *path, char *out, size_t cap) {
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    snprintf(out, cap, "%s", base);
    size_t n = strlen(out);
    if (n > 5 && !strcmp(out + n - 5, ".gguf")) out[n - 5] = '\0';
}

int ag_cli_serve(int argc, char **argv) {
    const char *model_path = NULL, *host = "127.0.0.1", *api_key = ag_switch_text("AUGUR_API_KEY"), *cors = NULL,
               *alias = NULL;
    /* the engine's defaults, which `augur fit` plans with too */
    const ag_engine_params defaults = ag_engine_default_params();
    long port = 8080, parallel = defaults.n_parallel, ctx = 0, max_queue = defaults.max_queue, threads = 0,
         max_body = 8L << 20, max_conn = 256, timeout = 60, header_timeout = 20, max_per_ip = 0, batch = 0;
    const char *kv_disk = NULL;
    bool        no_kv_disk = false, no_webui = false, lenient = false;
    double      itl_target = 0;
    uint64_t    kv_disk_max = 0, kv_mem = 0, kv_host_mem = 0;
    ag_kv_dtype kv_type = AG_KV_F16;
    ag_cli_draft_opts dopt;
    ag_cli_draft_defaults(&dopt);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            fputs(usage, stdout);
            return 0;
        }
        if (!strcmp(a, "--no-kv-disk")) {
            no_kv_disk = true;
            continue;
        }
        if (!strcmp(a, "--no-webui")) {
            no_webui = true;
            continue;
        }
        if (!strcmp(a, "--lenient-fields")) {
            lenient = true;
            continue;
        }
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        bool ok = true;
        int  df = ag_cli_draft_flag(a, v, &dopt);
        if (df) ok = df > 0;
        else if (!strcmp(a, "-m")) model_path = v;
        else if (!strcmp(a, "--host")) host = v;
        else if (!strcmp(a, "--port")) ok = ag_cli_parse_long(v, 0, 65535, &port);
        else if (!strcmp(a, "--api-key")) api_key = v;
        else if (!strcmp(a, "--alias")) alias = v;
        else if (!strcmp(a, "--cors-origin")) cors = v;
        else if (!strcmp(a, "--parallel")) ok = ag_cli_parse_long(v, 1, AG_CLI_MAX_PARALLEL, &parallel);
        else if (!strcmp(a, "--ctx")) ok = ag_cli_parse_long(v, 2, 1 << 24, &ctx);
        else if (!strcmp(a, "--max-queue")) ok = ag_cli_parse_long(v, 0, 1 << 20, &max_queue);
        else if (!strcmp(a, "--batch")) ok = ag_cli_parse_long(v, 1, 1 << 16, &batch);
        else if (!strcmp(a, "--itl-target")) ok = ag_cli_parse_float(v, -1, 60000, &itl_target);
        else if (!strcmp(a, "-t")) ok = ag_cli_parse_long(v, 1, 1024, &threads);
        else if (!strcmp(a, "--max-body")) ok = ag_cli_parse_long(v, 1, 1L << 30, &max_body);
        else if (!strcmp(a, "--max-connections")) ok = ag_cli_parse_long(v, 1, 65536, &max_conn);
        else if (!strcmp(a, "--timeout")) ok = ag_cli_parse_long(v, 1, 86400, &timeout);
        else if (!strcmp(a, "--header-timeout")) ok = ag_cli_parse_long(v, 1, 86400, &header_timeout);
        else if (!strcmp(a, "--max-connections-per-ip")) ok = ag_cli_parse_long(v, 0, 65536, &max_per_ip);
        else if (!strcmp(a, "--kv-disk")) {
            kv_disk = v;
            ok = v && *v;
        }
        else if (!strcmp(a, "--kv-disk-max")) ok = ag_cli_parse_size(v, &kv_disk_max) && kv_disk_max > 0;
        else if (!strcmp(a, "--kv-host-mem")) ok = ag_cli_parse_size(v, &kv_host_mem);
        else if (!strcmp(a, "--kv-mem")) ok = ag_cli_parse_size(v, &kv_mem) && kv_mem > 0 && kv_mem <= SIZE_MAX;
        else if (!strcmp(a, "--kv-type")) ok = ag_kv_dtype_parse(v, &kv_type);
        else return ag_cli_usage_error(usage, "serve: unknown option '%s'", a);
        if (!v) return ag_cli_usage_error(usage, "serve: %s needs a value", a);
        if (!ok) return ag_cli_usage_error(usage, "serve: invalid value '%s' for %s", v, a);
        i++;
    }
    if (!model_path) model_path = ag_cli_default_model();
    if (!ag_switch_text("AUGUR_LOG")) ag_log_set_level(AG_LOG_INFO);

    /* Every thread created from here on (engine, CPU pool, HTTP) inherits
     * this mask, so the signals reach only sigwait below. */
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    signal(SIGPIPE, SIG_IGN);

    int rc = 1;
    ag_model *m = NULL;
    ag_tok *tok = NULL;
    ag_chat *chat = NULL;
    ag_engine *eng = NULL;
    ag_server *srv = NULL;
    ag_draft_setup *draft = NULL;
    char name[256];
    model_name(model_path, name, sizeof name);
    if (ag_cli_load_model(model_path, (int)threads, &m, &tok)) goto done;
    if (ag_chat_from_gguf(ag_model_gguf(m), &chat)) {
        /* completions still work; chat requests answer 400 */
        AG_LOGW("%s: chat template unusable (%s); /v1/chat/completions is disabled", model_path, ag_error_message());
        chat = NULL;
    }
    ag_engine_params ep = ag_engine_default_params();
    ep.n_parallel = (int)parallel;
    ep.n_ctx = (int)ctx;
    ep.max_queue = (int)max_queue;
    if (batch) ep.n_batch = (int)batch;
    ep.itl_target_ms = itl_target;
    ep.kv_bytes = (size_t)kv_mem;
    ep.kv_dtype = kv_type;
    char kv_dir[4300];
    if (!no_kv_disk) {
        if (kv_disk) snprintf(kv_dir, sizeof kv_dir, "%s", kv_disk);
        else if (!default_kv_dir(ag_model_fingerprint(m), kv_type, kv_dir, sizeof kv_dir)) {
            AG_LOGW("no per-user cache directory ($XDG_CACHE_HOME and $HOME unset): serving without the disk "
                    "cache (--kv-disk DIR gives one)");
            no_kv_disk = true;
        }
    }
    ep.cache_dir = no_kv_disk ? NULL : kv_dir;
    ep.cache_disk_max = kv_disk_max;
    ep.cache_host_max = kv_host_mem;
    /* A draft that fails to load costs speed, not service. */
    if (dopt.draft && ag_cli_draft_open(&dopt, m, tok, (int)threads, &ep, &draft)) {
        AG_LOGW("serving without speculative decoding (the draft above could not be used)");
        ep.draft = NULL;
    }
    if (ag_engine_new(m, tok, &ep, &eng)) {
        ag_cli_fail("%s", ag_error_message());
        goto done;
    }
    ag_server_params sp = ag_server_default_params();
    sp.host = host;
    sp.port = (int)port;
    sp.api_key = api_key && *api_key ? api_key : NULL;
    sp.cors_origin = cors;
    sp.model_id = alias ? alias : name;
    sp.max_body = (size_t)max_body;
    sp.max_connections = (unsigned)max_conn;
    sp.timeout_s = (unsigned)timeout;
    sp.header_timeout_s = (unsigned)header_timeout;
    sp.max_connections_per_ip = (unsigned)max_per_ip;
    sp.webui = !no_webui;
    sp.lenient_fields = lenient;
    if (ag_server_new(&sp, eng, m, tok, chat, &srv)) {
        ag_cli_fail("%s", ag_error_message());
        goto done;
    }
    {
        ag_engine_stats st;
        ag_engine_get_stats(eng, &st);
        bool v6 = strchr(host, ':') != NULL;
        AG_LOGI("model %s: context %d per sequence, %d sequences at once, queue %ld%s", name, st.n_ctx,
                st.n_parallel, max_queue, sp.api_key ? ", API key required" : "");
        if (st.cache.disk_enabled)
            AG_LOGI("prefix cache: memory and disk (%s, %s)", kv_dir,
                    st.cache.disk_writable ? "write-behind" : "read-only");
        else AG_LOGI("prefix cache: memory only");
        if (draft)
            AG_LOGI("speculative decoding: draft %s, up to %ld tokens per step (%.1f MiB for the draft)",
                    ag_draft_setup_factory(draft)->name, (long)ep.spec.draft_max, (double)st.draft_bytes / (1 << 20));
        if (strcmp(host, "127.0.0.1") && strcmp(host, "localhost") && strcmp(host, "::1") && !sp.api_key)
            AG_LOGW("listening on %s without --api-key: anyone who can reach it can use it", host);
        printf("augur: serving %s on http://%s%s%s:%d\n", sp.model_id, v6 ? "[" : "", host, v6 ? "]" : "",
               ag_server_port(srv));
        fflush(stdout);
    }
    int sig = 0;
    sigwait(&sigs, &sig);
    AG_LOGI("%s: shutting down", sig == SIGINT ? "SIGINT" : "SIGTERM");
    ag_server_stop(srv);
    rc = 0;
done:
    /* engine before server: its shutdown delivers the final events that
     * waiting connections need (server.h) */
    ag_engine_free(eng);
    ag_draft_setup_close(draft);
    ag_server_free(srv);
    ag_chat_free(chat);
    ag_tok_free(tok);
    ag_model_free(m);
    return rc;
}
