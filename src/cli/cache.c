/* augur cache ls|stats|clear: the prefix cache's disk tier, from its record
 * headers alone (no model is loaded). */
#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cache/cache.h"
#include "cli/cli.h"

static const char k_usage[] =
    "usage: augur cache ls|stats|clear --kv-disk DIR [--json] [--tokens]\n"
    "  the KV prefix cache's disk tier (the directory given to augur serve --kv-disk); reads\n"
    "  record headers only, loads no model\n"
    "  ls      one line per record, most recently used first: block index and the token\n"
    "          positions it covers (fewer than a block for the partial block that holds a\n"
    "          prompt's last tokens), namespace, model and tokenizer fingerprints, KV layout,\n"
    "          size, last use, file; unusable files (corrupt, truncated, temporary) are\n"
    "          listed with the reason a server would drop them\n"
    "  stats   totals: records and bytes, per model/tokenizer/layout, namespaces, prompt\n"
    "          starts (records of block 0), partial blocks, oldest and newest use, unusable files\n"
    "  clear   deletes every record and temporary file (other files are left alone)\n"
    "  --kv-disk DIR  the directory\n"
    "  --json         ls: one JSON object per line; stats, clear: one JSON object\n"
    "  --tokens       ls: also the block's token ids\n";

/* What a listing keeps of a record: its header without the token ids
 * (kept apart, and only for --tokens: 100,000 records stay small). */
typedef struct {
    uint64_t    model_fingerprint, tok_fingerprint, compute_fingerprint, ns;
    ag_kv_dtype dtype;
    int32_t     block_size, n_layers, n_kv_heads, head_dim_k, head_dim_v, key_bits;
    uint32_t    block_index;
    int32_t     n_tokens; /* < block_size: a partial block (a prompt's trailing tokens) */
} meta;

typedef struct {
    char     name[40];
    bool     ok;
    char    *problem; /* when !ok */
    meta     rec;     /* when ok */
    int32_t *tokens;  /* with --tokens */
    uint64_t bytes;
    int64_t  mtime_ns;
} entry;

typedef struct {
    entry *v;
    size_t n, cap;
    bool   oom, want_tokens;
} entries;

static void entries_free(entries *es) {
    for (size_t i = 0; i < es->n; i++) {
        free(es->v[i].problem);
        free(es->v[i].tokens);
    }
    free(es->v);
}

static bool collect(void *user, const ag_cache_dir_entry *e) {
    entries *es = user;
    if (es->n == es->cap) {
        size_t ncap = es->cap ? es->cap * 2 : 256;
        entry *nv = realloc(es->v, sizeof *nv * ncap);
        if (!nv) {
            es->oom = true;
            return false;
        }
        es->v = nv;
        es->cap = ncap;
    }
    entry *x = &es->v[es->n++];
    memset(x, 0, sizeof *x);
    snprintf(x->name, sizeof x->name, "%s", e->name);
    x->ok = e->record != NULL;
    if (e->record) {
        const ag_cache_record *r = e->record;
        x->rec = (meta){r->model_fingerprint, r->tok_fingerprint, r->compute_fingerprint, r->ns, r->dtype,
                        r->block_size, r->n_layers, r->n_kv_heads, r->head_dim_k, r->head_dim_v, r->key_bits,
                        r->block_index, r->n_tokens};
        if (es->want_tokens && (x->tokens = malloc(sizeof(int32_t) * (size_t)r->n_tokens)))
            memcpy(x->tokens, r->tokens, sizeof(int32_t) * (size_t)r->n_tokens);
    } else {
        x->problem = strdup(e->problem ? e->problem : "unusable");
    }
    x->bytes = e->file_bytes;
    x->mtime_ns = e->mtime_ns;
    return true;
}

static int by_recent(const void *a, const void *b) {
    const entry *x = a, *y = b;
    if (x->mtime_ns != y->mtime_ns) return x->mtime_ns > y->mtime_ns ? -1 : 1;
    return strcmp(x->name, y->name);
}

static const char *dtype_name(ag_kv_dtype t) { return ag_kv_dtype_name(t); }

static void layout_str(const meta *r, char *out, size_t n) {
    snprintf(out, n, "%s/bs%d/%dLx%dH/%d+%d", dtype_name(r->dtype), r->block_size, r->n_layers, r->n_kv_heads,
             r->head_dim_k, r->head_dim_v);
}

static void time_str(int64_t ns, char *out, size_t n) {
    time_t    t = (time_t)(ns / 1000000000);
    struct tm tm;
    localtime_r(&t, &tm);
    strftime(out, n, "%Y-%m-%d %H:%M:%S", &tm);
}

static char *hex64(uint64_t v, char out[17]) {
    snprintf(out, 17, "%016" PRIx64, v);
    return out;
}

static void print_json(json_t *j) {
    char *s = json_dumps(j, JSON_COMPACT);
    if (s) puts(s);
    free(s);
    json_decref(j);
}

static int do_ls(const entries *es, bool json, bool tokens) {
    if (!json)
        printf("%-6s %-13s %-16s %-16s %-16s %-18s %9s  %-19s  %s\n", "BLOCK", "POSITIONS", "NAMESPACE", "MODEL",
               "TOKENIZER", "LAYOUT", "BYTES", "LAST USE", "FILE");
    for (size_t i = 0; i < es->n; i++) {
        const entry *x = &es->v[i];
        char         when[32], lay[64], h1[17], h2[17], h3[17];
        time_str(x->mtime_ns, when, sizeof when);
        const meta *r = &x->rec;
        if (json) {
            json_t *j = json_object();
            json_object_set_new(j, "file", json_string(x->name));
            json_object_set_new(j, "bytes", json_integer((json_int_t)x->bytes));
            json_object_set_new(j, "last_use", json_real((double)x->mtime_ns / 1e9));
            if (x->ok) {
                layout_str(r, lay, sizeof lay);
                json_object_set_new(j, "block", json_integer(r->block_index));
                json_object_set_new(j, "first_pos", json_integer((json_int_t)r->block_index * r->block_size));
                json_object_set_new(j, "n_tokens", json_integer(r->n_tokens));
                json_object_set_new(j, "namespace", json_string(hex64(r->ns, h1)));
                json_object_set_new(j, "model", json_string(hex64(r->model_fingerprint, h2)));
                json_object_set_new(j, "tokenizer", json_string(hex64(r->tok_fingerprint, h3)));
                json_object_set_new(j, "compute", json_string(hex64(r->compute_fingerprint, h1)));
                json_object_set_new(j, "layout", json_string(lay));
                if (tokens && x->tokens) {
                    json_t *t = json_array();
                    for (int k = 0; k < r->n_tokens; k++) json_array_append_new(t, json_integer(x->tokens[k]));
                    json_object_set_new(j, "tokens", t);
                }
            } else {
                json_object_set_new(j, "problem", json_string(x->problem));
            }
            print_json(j);
            continue;
        }
        if (!x->ok) {
            printf("%-6s %-13s %-91s %9" PRIu64 "  %-19s  %s\n", "-", "-", x->problem, x->bytes, when, x->name);
            continue;
        }
        char pos[32];
        snprintf(pos, sizeof pos, "%" PRIu64 "-%" PRIu64, (uint64_t)r->block_index * r->block_size,
                 (uint64_t)r->block_index * r->block_size + r->n_tokens - 1);
        layout_str(r, lay, sizeof lay);
        printf("%-6u %-13s %-16s %-16s %-16s %-18s %9" PRIu64 "  %-19s  %s\n", r->block_index, pos,
               hex64(r->ns, h1), hex64(r->model_fingerprint, h2), hex64(r->tok_fingerprint, h3), lay, x->bytes,
               when, x->name);
        if (tokens && x->tokens) {
            fputs("       tokens:", stdout);
            for (int k = 0; k < r->n_tokens; k++) printf(" %d", x->tokens[k]);
            fputc('\n', stdout);
        }
    }
    return 0;
}

/* One (model, tokenizer, compute, layout) group. */
typedef struct {
    meta     id; /* identity fields only */
    uint64_t        records, bytes, starts;
} group;

static bool same_identity(const meta *a, const meta *b) {
    return a->model_fingerprint == b->model_fingerprint && a->tok_fingerprint == b->tok_fingerprint &&
           a->compute_fingerprint == b->compute_fingerprint && a->dtype == b->dtype &&
           a->block_size == b->block_size && a->n_layers == b->n_layers && a->n_kv_heads == b->n_kv_heads &&
           a->head_dim_k == b->head_dim_k && a->head_dim_v == b->head_dim_v && a->key_bits == b->key_bits;
}

static int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static int do_stats(const char *dir, const entries *es, bool json) {
    uint64_t records = 0, bytes = 0, starts = 0, partial = 0, bad = 0, bad_bytes = 0, tmp = 0;
    int64_t  oldest = 0, newest = 0;
    group   *g = NULL;
    size_t   ng = 0;
    uint64_t *ns = malloc(sizeof(uint64_t) * (es->n ? es->n : 1));
    size_t    nns = 0;
    if (!ns) return ag_cli_fail("out of memory");
    for (size_t i = 0; i < es->n; i++) {
        const entry *x = &es->v[i];
        if (!x->ok) {
            if (x->problem && !strcmp(x->problem, "temporary file")) tmp++;
            else bad++;
            bad_bytes += x->bytes;
            continue;
        }
        records++;
        bytes += x->bytes;
        starts += x->rec.block_index == 0;
        partial += x->rec.n_tokens < x->rec.block_size;
        if (!oldest || x->mtime_ns < oldest) oldest = x->mtime_ns;
        if (x->mtime_ns > newest) newest = x->mtime_ns;
        ns[nns++] = x->rec.ns;
        size_t k = 0;
        while (k < ng && !same_identity(&g[k].id, &x->rec)) k++;
        if (k == ng) {
            group *n2 = realloc(g, sizeof *g * (ng + 1));
            if (!n2) {
                free(g);
                free(ns);
                return ag_cli_fail("out of memory");
            }
            g = n2;
            memset(&g[ng], 0, sizeof g[ng]);
            g[ng].id = x->rec;
            ng++;
        }
        g[k].records++;
        g[k].bytes += x->bytes;
        g[k].starts += x->rec.block_index == 0;
    }
    if (nns > 1) qsort(ns, nns, sizeof *ns, cmp_u64);
    size_t distinct = 0;
    for (size_t i = 0; i < nns; i++) distinct += i == 0 || ns[i] != ns[i - 1];
    char o[32] = "-", n[32] = "-";
    if (records) {
        time_str(oldest, o, sizeof o);
        time_str(newest, n, sizeof n);
    }
    if (json) {
        json_t *j = json_object(), *ga = json_array();
        json_object_set_new(j, "directory", json_string(dir));
        json_object_set_new(j, "records", json_integer((json_int_t)records));
        json_object_set_new(j, "bytes", json_integer((json_int_t)bytes));
        json_object_set_new(j, "prompt_starts", json_integer((json_int_t)starts));
        json_object_set_new(j, "partial_records", json_integer((json_int_t)partial));
        json_object_set_new(j, "namespaces", json_integer((json_int_t)distinct));
        json_object_set_new(j, "oldest_use", records ? json_real((double)oldest / 1e9) : json_null());
        json_object_set_new(j, "newest_use", records ? json_real((double)newest / 1e9) : json_null());
        json_object_set_new(j, "unusable", json_integer((json_int_t)bad));
        json_object_set_new(j, "temporary", json_integer((json_int_t)tmp));
        json_object_set_new(j, "unusable_bytes", json_integer((json_int_t)bad_bytes));
        for (size_t k = 0; k < ng; k++) {
            char   lay[64], h1[17], h2[17], h3[17];
            json_t *e = json_object();
            layout_str(&g[k].id, lay, sizeof lay);
            json_object_set_new(e, "model", json_string(hex64(g[k].id.model_fingerprint, h1)));
            json_object_set_new(e, "tokenizer", json_string(hex64(g[k].id.tok_fingerprint, h2)));
            json_object_set_new(e, "compute", json_string(hex64(g[k].id.compute_fingerprint, h3)));
            json_object_set_new(e, "layout", json_string(lay));
            json_object_set_new(e, "records", json_integer((json_int_t)g[k].records));
            json_object_set_new(e, "bytes", json_integer((json_int_t)g[k].bytes));
            json_object_set_new(e, "prompt_starts", json_integer((json_int_t)g[k].starts));
            json_array_append_new(ga, e);
        }
        json_object_set_new(j, "models", ga);
        print_json(j);
    } else {
        printf("directory:      %s\n", dir);
        printf("records:        %" PRIu64 " (%.1f MiB)\n", records, bytes / 1048576.0);
        printf("prompt starts:  %" PRIu64 " (records of block 0)\n", starts);
        printf("partial blocks: %" PRIu64 " (records of a prompt's last tokens, fewer than a block)\n", partial);
        printf("namespaces:     %zu\n", distinct);
        printf("last use:       oldest %s, newest %s\n", o, n);
        printf("unusable:       %" PRIu64 " records, %" PRIu64 " temporary files (%.1f MiB); a server drops them\n",
               bad, tmp, bad_bytes / 1048576.0);
        for (size_t k = 0; k < ng; k++) {
            char lay[64], h1[17], h2[17];
            layout_str(&g[k].id, lay, sizeof lay);
            printf("model %s tokenizer %s %s: %" PRIu64 " records (%.1f MiB), %" PRIu64 " prompt starts\n",
                   hex64(g[k].id.model_fingerprint, h1), hex64(g[k].id.tok_fingerprint, h2), lay, g[k].records,
                   g[k].bytes / 1048576.0, g[k].starts);
        }
    }
    free(g);
    free(ns);
    return 0;
}

int ag_cli_cache(int argc, char **argv) {
    const char *verb = NULL, *dir = NULL;
    bool        json = false, tokens = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            fputs(k_usage, stdout);
            return 0;
        } else if (!strcmp(a, "--kv-disk")) {
            if (++i >= argc) return ag_cli_usage_error(k_usage, "cache: %s needs a value", a);
            dir = argv[i];
        } else if (!strncmp(a, "--kv-disk=", 10)) {
            dir = a + 10;
        } else if (!strcmp(a, "--json")) {
            json = true;
        } else if (!strcmp(a, "--tokens")) {
            tokens = true;
        } else if (a[0] == '-') {
            return ag_cli_usage_error(k_usage, "cache: unknown option '%s'", a);
        } else if (!verb) {
            verb = a;
        } else {
            return ag_cli_usage_error(k_usage, "cache: unexpected argument '%s'", a);
        }
    }
    if (!verb) return ag_cli_usage_error(k_usage, "cache: say ls, stats or clear");
    if (strcmp(verb, "ls") && strcmp(verb, "stats") && strcmp(verb, "clear"))
        return ag_cli_usage_error(k_usage, "cache: unknown action '%s' (ls, stats, clear)", verb);
    if (!dir || !*dir) return ag_cli_usage_error(k_usage, "cache: --kv-disk DIR is required");
    if (!strcmp(verb, "clear")) {
        uint64_t  nf = 0, nb = 0;
        ag_status st = ag_cache_dir_clear(dir, &nf, &nb);
        if (st) return ag_cli_fail("cache clear: %s", ag_error_message());
        if (json) {
            json_t *j = json_object();
            json_object_set_new(j, "directory", json_string(dir));
            json_object_set_new(j, "removed_files", json_integer((json_int_t)nf));
            json_object_set_new(j, "removed_bytes", json_integer((json_int_t)nb));
            print_json(j);
        } else {
            printf("removed %" PRIu64 " files (%.1f MiB) from %s\n", nf, nb / 1048576.0, dir);
        }
        return 0;
    }
    entries es = {0};
    es.want_tokens = tokens;
    ag_status st = ag_cache_dir_list(dir, collect, &es);
    if (st) {
        entries_free(&es);
        return ag_cli_fail("cache %s: %s", verb, ag_error_message());
    }
    if (es.oom) {
        entries_free(&es);
        return ag_cli_fail("cache %s: out of memory", verb);
    }
    if (es.n > 1) qsort(es.v, es.n, sizeof *es.v, by_recent);
    int rc = !strcmp(verb, "ls") ? do_ls(&es, json, tokens) : do_stats(dir, &es, json);
    entries_free(&es);
    return rc;
}
