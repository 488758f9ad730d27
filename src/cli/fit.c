/* `augur fit`: how much memory `augur serve` will use with these flags, and
 * the largest context and parallelism that fit this machine.
 *
 * The prediction is ag_engine_plan_memory: the same functions that size the
 * engine's KV pool, activations, buffers, prefix cache and draft model, so it
 * cannot drift from what the server allocates. What no engine function
 * sizes (the program's code and libraries, the tokenizer, the chat template,
 * the CPU threads) is measured: this process loads the model the way serve
 * does and reads its own resident memory, less the model file's pages
 * (counted as weights), plus a small constant for the HTTP server. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "cli/cli.h"
#include "engine/engine.h"
#include "model/tp.h"
#include "tmpl/chat.h"

/* What a serving process adds to what this command measures of itself
 * (libmicrohttpd's threads, connection buffers): serve's resident memory
 * outside the model file right after load exceeds this command's by 0.1 to
 * 0.4 MiB (stories260K, SmolLM2, Qwen2.5-0.5B on x86-64 Linux); the rest
 * is room for connections while it serves. */
#define SERVER_BYTES ((uint64_t)1 << 20)

static const char usage[] =
    "usage: augur fit [-m MODEL] [options]\n"
    "  predicts the memory `augur serve` with the same flags uses once every sequence has filled its\n"
    "  context, by part, and the largest context and parallelism that fit the memory available\n"
    "  (MemAvailable, or the cgroup's limit less its usage when lower; on a GPU, the KV pool and\n"
    "  scratch against the GPU memory left once the weights are loaded)\n"
    "  -m MODEL        GGUF model (default: $AUGUR_MODEL, else models/SmolLM2-135M-Instruct.Q4_1.gguf)\n"
    "  --ctx N         context per sequence (default: serve's, the model's at most 4096)\n"
    "  --parallel N    sequences at once (default: serve's, 4)\n"
    "  --batch N       tokens per engine step (default: serve's, 512; 4096 on a GPU)\n"
    "  --kv-mem SIZE   KV pool (default: serve's, --parallel full contexts)\n"
    "  --kv-host-mem SIZE  the prefix cache's host tier (default: serve's, 0: off)\n"
    "  --kv-type TYPE  KV element type: f16 (default), q8_0, q4_0, f32 (as serve's)\n"
    "  --draft ngram|MODEL.gguf  the speculative decoding source serve would use\n"
    "  --no-kv-disk    serve without the prefix cache's disk tier (no write-behind buffer)\n"
    "  -t THREADS      CPU threads (default: all cores)\n"
    "  --tp N          plan serve --tp N: the totals, then what each of the N shards holds\n"
    "  --json          one JSON object instead of the table\n";

/* Resident bytes of this process (VmRSS) and, of those, the pages of
 * mappings of `paths` (the model files). false if /proc cannot be read. */
static bool self_rss(const char *const *paths, int n_paths, uint64_t *rss, uint64_t *mapped) {
    char real[8][PATH_MAX];
    for (int i = 0; i < n_paths && i < 8; i++)
        if (!realpath(paths[i], real[i])) real[i][0] = '\0';
    FILE *f = fopen("/proc/self/smaps", "r");
    if (!f) return false;
    char line[PATH_MAX + 256];
    bool in_model = false;
    *rss = *mapped = 0;
    unsigned long long kb;
    while (fgets(line, sizeof line, f)) {
        char *nl = strchr(line, '\n');
        if (nl) *nl = '\0';
        if (sscanf(line, "Rss: %llu kB", &kb) == 1) {
            *rss += kb << 10;
            if (in_model) *mapped += kb << 10;
            continue;
        }
        /* a mapping's header: "start-end perms offset dev inode [path]" */
        unsigned long long a, b;
        char dash;
        if (sscanf(line, "%llx%c%llx", &a, &dash, &b) == 3 && dash == '-') {
            const char *path = strchr(line, '/');
            in_model = false;
            for (int i = 0; path && i < n_paths && i < 8; i++) in_model = in_model || !strcmp(path, real[i]);
        }
    }
    fclose(f);
    return true;
}

static bool read_u64(const char *path, uint64_t *out) {
    FILE *f = fopen(path, "r");
    if (!f) return false;
    char buf[64];
    bool ok = fgets(buf, sizeof buf, f) && sscanf(buf, "%llu", (unsigned long long *)out) == 1;
    fclose(f);
    return ok;
}

/* The value of `key` in a "key value" file (memory.stat), or 0. */
static uint64_t stat_value(const char *path, const char *key) {
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    char               k[128];
    unsigned long long v, found = 0;
    while (fscanf(f, "%127s %llu", k, &v) == 2)
        if (!strcmp(k, key)) found = v;
    fclose(f);
    return found;
}

/* Memory a new process may use: MemAvailable, or what the cgroup's limit
 * leaves (limit less usage, page cache that can be dropped not counted as
 * usage) when that is lower. *source names which. */
static uint64_t available_memory(const char **source) {
    uint64_t avail = 0;
    *source = "MemAvailable";
    FILE *f = fopen("/proc/meminfo", "r");
    if (f) {
        char               k[64];
        unsigned long long v;
        char               unit[16];
        while (fscanf(f, "%63s %llu %15s", k, &v, unit) >= 2)
            if (!strcmp(k, "MemAvailable:")) avail = (uint64_t)v << 10;
        fclose(f);
    }
    uint64_t limit, usage;
    const char *kind = NULL;
    uint64_t    inactive = 0;
    if (read_u64("/sys/fs/cgroup/memory.max", &limit) && read_u64("/sys/fs/cgroup/memory.current", &usage)) {
        kind = "cgroup v2 memory.max";
        inactive = stat_value("/sys/fs/cgroup/memory.stat", "inactive_file");
    } else if (read_u64("/sys/fs/cgroup/memory/memory.limit_in_bytes", &limit) &&
               read_u64("/sys/fs/cgroup/memory/memory.usage_in_bytes", &usage)) {
        kind = "cgroup v1 memory.limit_in_bytes";
        inactive = stat_value("/sys/fs/cgroup/memory/memory.stat", "total_inactive_file");
    }
    if (kind) { /* "max" (v2) does not parse: no limit */
        uint64_t used = usage > inactive ? usage - inactive : 0;
        uint64_t left = limit > used ? limit - used : 0;
        if (left < avail || avail == 0) {
            avail = left;
            *source = kind;
        }
    }
    return avail;
}

/* Where the plan must fit: host memory (avail, less the fixed part this
 * command measured) and, for a model on a GPU, the device memory left
 * once its weights are loaded (device_free; on = false on the CPU). */
typedef struct {
    uint64_t avail, fixed;
    bool     on;
    uint64_t device_free, device_total;
} room;

/* Whether the plan of ep at (n_ctx, n_parallel) fits: its host part (the
 * total less what the device holds) plus the fixed part in avail, its
 * device part in device_free. */
static bool fits_at(ag_model *m, const ag_tok *tok, ag_engine_params ep, int n_ctx, int n_parallel, const room *r) {
    ep.n_ctx = n_ctx;
    ep.n_parallel = n_parallel;
    ag_engine_memory mem;
    if (ag_engine_plan_memory(m, tok, &ep, &mem)) return false;
    return mem.total - mem.device + r->fixed <= r->avail && (!r->on || mem.device <= r->device_free);
}

/* The largest v in [lo, hi] that fits (memory grows with v), or lo - 1
 * when even lo does not fit. */
static int largest_fit(ag_model *m, const ag_tok *tok, const ag_engine_params *ep, bool vary_ctx, int other, int lo,
                       int hi, const room *r) {
    int good = lo - 1;
    while (lo <= hi) {
        int  mid = lo + (hi - lo) / 2;
        bool ok = vary_ctx ? fits_at(m, tok, *ep, mid, other, r) : fits_at(m, tok, *ep, other, mid, r);
        if (ok) good = mid, lo = mid + 1;
        else hi = mid - 1;
    }
    return good;
}

static double mib(uint64_t b) { return (double)b / (1 << 20); }

int ag_cli_fit(int argc, char **argv) {
    const ag_engine_params defaults = ag_engine_default_params();
    const char *model_path = NULL;
    long        ctx = 0, parallel = defaults.n_parallel, batch = defaults.n_batch, threads = 0;
    uint64_t    kv_mem = 0, kv_host_mem = 0;
    ag_kv_dtype kv_type = AG_KV_F16;
    bool        json = false, no_kv_disk = false;
    ag_cli_draft_opts dopt;
    ag_cli_draft_defaults(&dopt);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            fputs(usage, stdout);
            return 0;
        }
        if (!strcmp(a, "--json")) { json = true; continue; }
        if (!strcmp(a, "--no-kv-disk")) { no_kv_disk = true; continue; }
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        bool ok = true;
        int  df = ag_cli_draft_flag(a, v, &dopt);
        if (df) ok = df > 0;
        else if (!strcmp(a, "-m")) model_path = v;
        else if (!strcmp(a, "--ctx")) ok = ag_cli_parse_long(v, 2, 1 << 24, &ctx);
        else if (!strcmp(a, "--parallel")) ok = ag_cli_parse_long(v, 1, AG_CLI_MAX_PARALLEL, &parallel);
        else if (!strcmp(a, "--batch")) ok = ag_cli_parse_long(v, 1, 1 << 16, &batch);
        else if (!strcmp(a, "--kv-host-mem")) ok = ag_cli_parse_size(v, &kv_host_mem);
        else if (!strcmp(a, "--kv-mem")) ok = ag_cli_parse_size(v, &kv_mem) && kv_mem > 0 && kv_mem <= SIZE_MAX;
        else if (!strcmp(a, "--kv-type")) ok = ag_kv_dtype_parse(v, &kv_type);
        else if (!strcmp(a, "-t")) ok = ag_cli_parse_long(v, 1, 1024, &threads);
        else return ag_cli_usage_error(usage, "fit: unknown option '%s'", a);
        if (!v) return ag_cli_usage_error(usage, "fit: %s needs a value", a);
        if (!ok) return ag_cli_usage_error(usage, "fit: invalid value '%s' for %s", v, a);
        i++;
    }
    if (!model_path) model_path = ag_cli_default_model();

    int rc = 1;
    ag_model *m = NULL;
    ag_tok *tok = NULL;
    ag_chat *chat = NULL;
    ag_draft_setup *draft = NULL;
    if (ag_cli_load_model(model_path, (int)threads, &m, &tok)) return 1;
    if (ag_chat_from_gguf(ag_model_gguf(m), &chat)) chat = NULL; /* serve goes on without it too */
    ag_engine_params ep = defaults;
    ep.n_parallel = (int)parallel;
    ep.n_ctx = (int)ctx;
    ep.n_batch = ag_engine_resolve_batch(m, (int)batch);
    ep.kv_bytes = (size_t)kv_mem;
    ep.kv_dtype = kv_type;
    ep.cache_host_max = kv_host_mem;
    /* the plan only asks whether there is a disk tier, not where */
    ep.cache_dir = no_kv_disk ? NULL : "disk tier";
    const char *model_files[2] = {model_path, dopt.draft};
    int         n_files = 1;
    if (dopt.draft) {
        if (ag_cli_draft_open(&dopt, m, tok, (int)threads, &ep, &draft)) {
            fprintf(stderr, "augur: fit: serve would run without speculative decoding; planning without it\n");
            ep.draft = NULL;
        } else if (strcmp(dopt.draft, "ngram") != 0) {
            n_files = 2;
        }
    }
    ag_engine_memory mem;
    if (ag_engine_plan_memory(m, tok, &ep, &mem)) {
        ag_cli_fail("%s", ag_error_message());
        goto done;
    }
    /* KV bytes per token (all layers, K and V, block padding included): what --kv-type changes */
    double kv_per_token = 0;
    {
        ag_kv_params kp;
        ag_kv_layout L;
        if (ag_model_kv_params(m, ep.kv_dtype, 1, 0, &kp, &L) == AG_OK) kv_per_token = (double)L.block_bytes / L.block_size;
    }
    uint64_t rss, mapped;
    if (!self_rss(model_files, n_files, &rss, &mapped)) {
        ag_cli_fail("cannot read /proc/self/smaps to measure the program's own memory");
        goto done;
    }
    /* the draft setup made its KV pool already (untouched pages: not resident) */
    uint64_t program = rss - mapped + SERVER_BYTES;
    uint64_t total = mem.total + program, host = total - mem.device;
    const char *source;
    room        r = {.avail = available_memory(&source), .fixed = program};
    r.on = ag_model_device_memory(m, &r.device_free, &r.device_total) == AG_OK;
    const uint64_t avail = r.avail;
    const bool     fits = host <= avail && (!r.on || mem.device <= r.device_free);
    int train = ag_model_config_of(m)->n_ctx_train;
    int max_ctx = largest_fit(m, tok, &ep, true, mem.n_parallel, 2, train, &r);
    int max_par = largest_fit(m, tok, &ep, false, mem.n_ctx, 1, AG_CLI_MAX_PARALLEL, &r);
    struct {
        const char *key, *label;
        uint64_t    bytes;
    } parts[] = {
        {"weights", "weights (the mapped model file, pages read)", mem.weights},
        {"kv", "KV pool", mem.kv},
        {"scratch", "activations and backend scratch", mem.scratch},
        {"buffers", "engine buffers (logits rows, samplers)", mem.buffers},
        {"cache_index", "prefix cache index (memory tier; its blocks are the KV pool's)", mem.cache_index},
        {"cache_write_queue", "prefix cache disk write-behind, at most", mem.cache_write_queue},
        {"cache_read_staging", "prefix cache disk restore staging, at most", mem.cache_read_staging},
        {"cache_host", "prefix cache host tier (--kv-host-mem), at most", mem.cache_host},
        {"draft", "draft (weights, KV, scratch, per-sequence state)", mem.draft},
        {"program", "program, tokenizer, template, threads (measured)", program},
    };
    const int n_parts = (int)(sizeof parts / sizeof parts[0]);
    if (json) {
        json_t *o = json_object(), *pj = json_object();
        for (int i = 0; i < n_parts; i++) json_object_set_new(pj, parts[i].key, json_integer((json_int_t)parts[i].bytes));
        json_object_set_new(o, "model", json_string(model_path));
        json_object_set_new(o, "n_ctx", json_integer(mem.n_ctx));
        json_object_set_new(o, "n_parallel", json_integer(mem.n_parallel));
        json_object_set_new(o, "n_batch", json_integer(ep.n_batch));
        json_object_set_new(o, "kv_blocks", json_integer(mem.n_blocks));
        json_object_set_new(o, "kv_ring", json_integer((json_int_t)mem.kv_ring));
        json_object_set_new(o, "kv_without_ring", json_integer((json_int_t)mem.kv_without_ring));
        json_object_set_new(o, "ring_window", json_integer(mem.ring_window));
        json_object_set_new(o, "ring_layers", json_integer(mem.n_ring_layers));
        json_object_set_new(o, "kv_block_size", json_integer(mem.block_size));
        json_object_set_new(o, "kv_type", json_string(ag_kv_dtype_name(ep.kv_dtype)));
        json_object_set_new(o, "kv_bytes_per_token", json_real(kv_per_token));
        json_object_set_new(o, "draft", ep.draft ? json_string(ag_draft_setup_factory(draft)->name) : json_null());
        json_object_set_new(o, "parts", pj);
        json_object_set_new(o, "cache_host_tokens", json_integer((json_int_t)mem.cache_host_tokens));
        json_object_set_new(o, "total", json_integer((json_int_t)total));
        json_object_set_new(o, "weights_max", json_integer((json_int_t)mem.weights_max));
        json_object_set_new(o, "available", json_integer((json_int_t)avail));
        json_object_set_new(o, "available_source", json_string(source));
        json_object_set_new(o, "host", json_integer((json_int_t)host));
        if (r.on) { /* a GPU: what it must hold beyond the loaded weights, and what it has */
            json_object_set_new(o, "device", json_integer((json_int_t)mem.device));
            json_object_set_new(o, "device_free", json_integer((json_int_t)r.device_free));
            json_object_set_new(o, "device_total", json_integer((json_int_t)r.device_total));
        }
        const ag_tp *tp = ag_model_tp(m);
        if (tp) { /* --tp: what each shard holds (a GPU each, once NCCL ranks run on devices) */
            json_t *sj = json_array();
            for (int k = 0; k < ag_tp_ranks(tp); k++) {
                uint64_t copies, scratch = ag_tp_memory(tp, k, ep.n_batch, mem.n_ctx, &copies);
                json_t  *e = json_object();
                json_object_set_new(e, "weights", json_integer((json_int_t)ag_tp_weight_bytes(tp, k)));
                json_object_set_new(e, "kv", json_integer((json_int_t)(mem.kv / (uint64_t)ag_tp_ranks(tp))));
                json_object_set_new(e, "scratch", json_integer((json_int_t)scratch));
                json_array_append_new(sj, e);
            }
            json_object_set_new(o, "tp", json_integer(ag_tp_ranks(tp)));
            json_object_set_new(o, "shards", sj);
        }
        json_object_set_new(o, "fits", json_boolean(fits));
        json_object_set_new(o, "max_ctx", json_integer(max_ctx));
        json_object_set_new(o, "max_ctx_limit", json_string(max_ctx == train ? "model" : "memory"));
        json_object_set_new(o, "max_parallel", json_integer(max_par));
        json_object_set_new(o, "max_parallel_limit",
                            json_string(max_par == AG_CLI_MAX_PARALLEL ? "server" : "memory"));
        char *s = json_dumps(o, JSON_INDENT(2));
        if (s) puts(s);
        free(s);
        json_decref(o);
    } else {
        printf("augur serve -m %s: context %d x %d sequences, batch %d%s%s\n", model_path, mem.n_ctx,
               mem.n_parallel, ep.n_batch, ep.draft ? ", draft " : "",
               ep.draft ? ag_draft_setup_factory(draft)->name : "");
        for (int i = 0; i < n_parts; i++) {
            if (parts[i].bytes) printf("  %-64s %10.1f MiB\n", parts[i].label, mib(parts[i].bytes));
            if (i == 1 && mem.n_ring_layers) {
                char what[128];
                snprintf(what, sizeof what, "  of which the ring of %d sliding-window layers (window %d)",
                         mem.n_ring_layers, mem.ring_window);
                printf("  %-64s %10.1f MiB\n", what, mib(mem.kv_ring));
                snprintf(what, sizeof what, "  (every position of all %d layers: %.1f MiB)", mem.n_layers,
                         mib(mem.kv_without_ring));
                printf("  %s\n", what);
            }
        }
        printf("  %-64s %10.1f MiB\n", "total", mib(total));
        if (mem.cache_host)
            printf("  host tier: %.1f MiB of host memory hold %lld tokens of evicted prefix-cache KV\n",
                   mib(mem.cache_host), (long long)mem.cache_host_tokens);
        printf("  KV cache %s: %.0f bytes per token (%.1f KiB)\n", ag_kv_dtype_name(ep.kv_dtype), kv_per_token,
               kv_per_token / 1024);
        if (mem.weights_max > mem.weights)
            printf("  (plus up to %.1f MiB as the token embeddings of more distinct tokens are read)\n",
                   mib(mem.weights_max - mem.weights));
        const ag_tp *tp = ag_model_tp(m);
        for (int k = 0; tp && k < ag_tp_ranks(tp); k++) {
            uint64_t copies, scratch = ag_tp_memory(tp, k, ep.n_batch, mem.n_ctx, &copies);
            const uint64_t w = ag_tp_weight_bytes(tp, k), kv = mem.kv / (uint64_t)ag_tp_ranks(tp);
            printf("  shard %d of --tp %d: weights %.1f MiB, KV %.1f MiB, scratch %.1f MiB: %.1f MiB\n", k,
                   ag_tp_ranks(tp), mib(w), mib(kv), mib(scratch), mib(w + kv + scratch));
        }
        if (r.on) {
            printf("  of which on the GPU (KV pool, scratch): %.1f MiB; in host memory: %.1f MiB\n", mib(mem.device),
                   mib(host));
            printf("GPU: %.1f MiB free of %.1f MiB with the weights loaded: %s\n", mib(r.device_free),
                   mib(r.device_total),
                   mem.device <= r.device_free ? "fits"
                                               : "DOES NOT FIT (serve, without --kv-mem, makes the KV pool what fits "
                                                 "and queues the requests it cannot hold)");
        }
        printf("available: %.1f MiB (%s): %s\n", mib(avail), source,
               host <= avail ? "fits" : "DOES NOT FIT");
        if (max_ctx >= 2)
            printf("largest context at %d sequences: %d%s\n", mem.n_parallel, max_ctx,
                   max_ctx == train ? " (the model's training context)" : "");
        else printf("no context fits at %d sequences\n", mem.n_parallel);
        if (max_par >= 1)
            printf("largest parallelism at context %d: %d%s\n", mem.n_ctx, max_par,
                   max_par == AG_CLI_MAX_PARALLEL ? " (serve's limit)" : "");
        else printf("not even one sequence of context %d fits\n", mem.n_ctx);
    }
    rc = 0;
done:
    ag_draft_setup_close(draft);
    ag_chat_free(chat);
    ag_tok_free(tok);
    ag_model_free(m);
    return rc;
}
