/* augur info: what a GGUF model file holds.
 *
 * The default report is for people: architecture, hyper-parameters,
 * tensors by type, tokenizer and special tokens, chat template. --kv and
 * --tensors print the whole metadata / tensor table instead, one entry per
 * line with tab-separated fields, for scripts and tests. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/switches.h"
#include "base/utf8.h"
#include "cli/cli.h"
#include "gguf/gguf.h"
#include "model/safetensors.h"

static const char usage_text[] =
    "usage: augur info [-m MODEL | MODEL] [--kv | --tensors] | --switches\n"
    "  -m, --model PATH  the GGUF file (default: $AUGUR_MODEL or the bundled SmolLM2)\n"
    "  --kv              print every metadata key: key<TAB>type<TAB>value\n"
    "  --items N         with --kv: array elements shown per array (default 8, 0: all)\n"
    "  --tensors         print every tensor: name<TAB>type<TAB>shape<TAB>offset<TAB>bytes\n"
    "  --switches        print every environment switch augur reads (no model): a Markdown table of\n"
    "                    name, kind, default, meaning and reader (the README's list)\n"
    "  -h, --help        this help\n";

/* Prints s[0..n) quoted, JSON-style escapes; bytes that are not valid UTF-8
 * come out as \xNN so the output stays one line of valid text. At most
 * `limit` bytes of input are shown (0: all), then "...". */
static void put_quoted(FILE *f, const char *s, uint64_t n, uint64_t limit) {
    fputc('"', f);
    uint64_t shown = limit && n > limit ? limit : n;
    for (uint64_t i = 0; i < shown;) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\') fprintf(f, "\\%c", c);
        else if (c == '\n') fputs("\\n", f);
        else if (c == '\r') fputs("\\r", f);
        else if (c == '\t') fputs("\\t", f);
        else if (c < 0x20 || c == 0x7f) fprintf(f, "\\u%04x", c);
        else if (c < 0x80) fputc(c, f);
        else {
            uint32_t cp;
            size_t k = ag_utf8_decode(s + i, (size_t)(n - i), &cp);
            if (k == 0) {
                fprintf(f, "\\x%02x", c);
                i++;
            } else {
                fwrite(s + i, 1, k, f);
                i += k;
            }
            continue;
        }
        i++;
    }
    fputc('"', f);
    if (shown < n) fputs("...", f);
}

/* The shortest decimal that reads back as the same float (or double). */
static void put_real(FILE *f, double v, bool is_f32) {
    char buf[64];
    for (int prec = is_f32 ? 6 : 15; prec <= 17; prec++) {
        snprintf(buf, sizeof buf, "%.*g", prec, v);
        double back = strtod(buf, NULL);
        if (is_f32 ? (float)back == (float)v : back == v) break;
    }
    fputs(buf, f);
}

static const char *type_name(ag_gguf_type t) {
    static const char *names[] = {"u8",   "i8",     "u16",   "i16", "u32", "i32", "f32",
                                  "bool", "string", "array", "u64", "i64", "f64"};
    return (unsigned)t < sizeof names / sizeof names[0] ? names[t] : "?";
}

/* A value on one line; arrays show their first `max_items` elements. */
static void put_value(FILE *f, const ag_gguf_value *v, uint64_t max_items) {
    switch (v->type) {
    case AG_GGUF_U8: case AG_GGUF_U16: case AG_GGUF_U32: case AG_GGUF_U64:
        fprintf(f, "%" PRIu64, v->u);
        break;
    case AG_GGUF_I8: case AG_GGUF_I16: case AG_GGUF_I32: case AG_GGUF_I64:
        fprintf(f, "%" PRId64, v->i);
        break;
    case AG_GGUF_F32: put_real(f, v->f, true); break;
    case AG_GGUF_F64: put_real(f, v->f, false); break;
    case AG_GGUF_BOOL: fputs(v->u ? "true" : "false", f); break;
    case AG_GGUF_STRING: put_quoted(f, v->str.ptr, v->str.len, 0); break;
    case AG_GGUF_ARRAY: {
        fprintf(f, "%s[%" PRIu64 "] [", type_name(v->arr.elem_type), v->arr.n);
        uint64_t n = v->arr.n < max_items ? v->arr.n : max_items;
        for (uint64_t i = 0; i < n; i++) {
            if (i) fputs(", ", f);
            ag_gguf_type et = v->arr.elem_type;
            /* Long strings in arrays are cut short unless everything is asked for. */
            if (et == AG_GGUF_STRING)
                put_quoted(f, v->arr.items[i].str.ptr, v->arr.items[i].str.len, max_items == UINT64_MAX ? 0 : 64);
            else if (et == AG_GGUF_ARRAY) put_value(f, &v->arr.items[i], max_items);
            else if (et == AG_GGUF_F32 || et == AG_GGUF_F64) {
                double d;
                ag_gguf_arr_f64(v, i, &d);
                put_real(f, d, et == AG_GGUF_F32);
            } else if (et == AG_GGUF_U64) {
                uint64_t u;
                memcpy(&u, (const uint8_t *)v->arr.raw + 8 * i, 8);
                fprintf(f, "%" PRIu64, u);
            } else if (et == AG_GGUF_BOOL) {
                fputs(((const uint8_t *)v->arr.raw)[i] ? "true" : "false", f);
            } else {
                int64_t x;
                ag_gguf_arr_i64(v, i, &x);
                fprintf(f, "%" PRId64, x);
            }
        }
        if (n < v->arr.n) fputs(n ? ", ..." : "...", f);
        fputc(']', f);
        break;
    }
    }
}

/* Keys and tensor names are untrusted bytes: control characters (which
 * would break the one-entry-per-line output) are printed as \xNN. */
static void put_name(const char *s) {
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c < 0x20 || c == 0x7f || c == '\\') printf("\\x%02x", c);
        else putchar(c);
    }
}

static void print_kv(const ag_gguf *g, uint64_t max_items) {
    for (int64_t i = 0; i < ag_gguf_n_kv(g); i++) {
        const ag_gguf_value *v = ag_gguf_kv_value(g, i);
        put_name(ag_gguf_key(g, i));
        printf("\t%s\t", type_name(v->type));
        put_value(stdout, v, max_items);
        putchar('\n');
    }
}

static void print_tensors(const ag_gguf *g) {
    for (int64_t i = 0; i < ag_gguf_n_tensors(g); i++) {
        const ag_gguf_tensor *t = ag_gguf_tensor_at(g, i);
        put_name(t->name);
        printf("\t%s\t", ag_tensor_type_name(t->type));
        for (uint32_t d = 0; d < t->n_dims; d++) printf("%s%" PRIu64, d ? "x" : "", t->ne[d]);
        printf("\t%" PRIu64 "\t%" PRIu64 "\n", t->offset, t->size);
    }
}

static void human_bytes(char *out, size_t n, uint64_t b) {
    if (b < 1024) snprintf(out, n, "%" PRIu64 " B", b);
    else if (b < (1u << 20)) snprintf(out, n, "%.1f KiB", b / 1024.0);
    else if (b < (1u << 30)) snprintf(out, n, "%.1f MiB", b / 1048576.0);
    else snprintf(out, n, "%.2f GiB", b / 1073741824.0);
}

/* The token text for an id, from tokenizer.ggml.tokens, or NULL. */
static const ag_gguf_value *token_text(const ag_gguf_value *tokens, uint64_t id) {
    if (!tokens || tokens->type != AG_GGUF_ARRAY || tokens->arr.elem_type != AG_GGUF_STRING || id >= tokens->arr.n)
        return NULL;
    return &tokens->arr.items[id];
}

static void print_summary(const ag_gguf *g, const char *path) {
    char hb[64];
    human_bytes(hb, sizeof hb, ag_gguf_file_size(g));
    printf("file:            %s\n", path);
    printf("gguf version:    %u\n", ag_gguf_version(g));
    printf("file size:       %zu bytes (%s)\n", ag_gguf_file_size(g), hb);
    printf("alignment:       %" PRIu64 "\n", ag_gguf_alignment(g));
    printf("data offset:     %" PRIu64 "\n", ag_gguf_data_offset(g));
    printf("metadata keys:   %" PRId64 "\n", ag_gguf_n_kv(g));

    uint64_t alen = 0;
    const char *arch = ag_gguf_get_str(g, "general.architecture", &alen);
    printf("architecture:    ");
    if (arch) put_quoted(stdout, arch, alen, 0);
    else fputs("(not set)", stdout);
    putchar('\n');
    uint64_t nlen;
    const char *name = ag_gguf_get_str(g, "general.name", &nlen);
    if (name) {
        printf("name:            ");
        put_quoted(stdout, name, nlen, 0);
        putchar('\n');
    }
    uint32_t ftype;
    if (ag_gguf_get_u32(g, "general.file_type", &ftype)) printf("file type:       %u\n", ftype);

    /* Hyper-parameters: every "<arch>.*" key, in file order. */
    if (arch && alen < 256) {
        char prefix[260];
        memcpy(prefix, arch, (size_t)alen);
        prefix[alen] = '.';
        prefix[alen + 1] = '\0';
        bool any = false;
        for (int64_t i = 0; i < ag_gguf_n_kv(g); i++) {
            const char *k = ag_gguf_key(g, i);
            if (strncmp(k, prefix, (size_t)alen + 1) != 0) continue;
            if (!any) puts("hyper-parameters:");
            any = true;
            printf("  ");
            put_name(k + alen + 1);
            printf("%*s ", (int)(strlen(k + alen + 1) < 40 ? 40 - strlen(k + alen + 1) : 0), "");
            put_value(stdout, ag_gguf_kv_value(g, i), 8);
            putchar('\n');
        }
    }

    /* Tensors by type. */
    uint64_t count[AG_TYPE_COUNT] = {0}, bytes[AG_TYPE_COUNT] = {0}, total = 0, n_params = 0;
    for (int64_t i = 0; i < ag_gguf_n_tensors(g); i++) {
        const ag_gguf_tensor *t = ag_gguf_tensor_at(g, i);
        count[t->type]++;
        bytes[t->type] += t->size;
        total += t->size;
        n_params += t->n_elems;
    }
    human_bytes(hb, sizeof hb, total);
    printf("tensors:         %" PRId64 " (%" PRIu64 " bytes, %s; %" PRIu64 " parameters)\n", ag_gguf_n_tensors(g),
           total, hb, n_params);
    for (uint32_t t = 0; t < AG_TYPE_COUNT; t++) {
        if (!count[t]) continue;
        human_bytes(hb, sizeof hb, bytes[t]);
        printf("  %-8s %6" PRIu64 " tensors %14" PRIu64 " bytes (%s)\n", ag_tensor_type_name(t), count[t], bytes[t],
               hb);
    }

    /* Tokenizer. */
    uint64_t len;
    const char *model = ag_gguf_get_str(g, "tokenizer.ggml.model", &len);
    printf("tokenizer:       ");
    if (model) put_quoted(stdout, model, len, 0);
    else fputs("(not set)", stdout);
    putchar('\n');
    const char *pre = ag_gguf_get_str(g, "tokenizer.ggml.pre", &len);
    if (pre) {
        printf("pre-tokenizer:   ");
        put_quoted(stdout, pre, len, 0);
        putchar('\n');
    }
    const ag_gguf_value *tokens = ag_gguf_get(g, "tokenizer.ggml.tokens");
    if (tokens && tokens->type == AG_GGUF_ARRAY) printf("vocab size:      %" PRIu64 "\n", tokens->arr.n);
    const ag_gguf_value *merges = ag_gguf_get(g, "tokenizer.ggml.merges");
    if (merges && merges->type == AG_GGUF_ARRAY) printf("merges:          %" PRIu64 "\n", merges->arr.n);

    static const struct {
        const char *label, *key;
    } specials[] = {
        {"bos", "tokenizer.ggml.bos_token_id"},       {"eos", "tokenizer.ggml.eos_token_id"},
        {"eot", "tokenizer.ggml.eot_token_id"},       {"eom", "tokenizer.ggml.eom_token_id"},
        {"pad", "tokenizer.ggml.padding_token_id"},   {"unk", "tokenizer.ggml.unknown_token_id"},
        {"sep", "tokenizer.ggml.seperator_token_id"}, {"mask", "tokenizer.ggml.mask_token_id"},
        {"fim_pre", "tokenizer.ggml.fim_pre_token_id"}, {"fim_suf", "tokenizer.ggml.fim_suf_token_id"},
        {"fim_mid", "tokenizer.ggml.fim_mid_token_id"},
    };
    bool any = false;
    for (size_t i = 0; i < sizeof specials / sizeof specials[0]; i++) {
        int64_t id;
        if (!ag_gguf_get_i64(g, specials[i].key, &id)) continue;
        if (!any) puts("special tokens:");
        any = true;
        printf("  %-8s %8" PRId64 "  ", specials[i].label, id);
        const ag_gguf_value *tt = id >= 0 ? token_text(tokens, (uint64_t)id) : NULL;
        if (tt) put_quoted(stdout, tt->str.ptr, tt->str.len, 200);
        else fputs("(not in the vocabulary)", stdout);
        putchar('\n');
    }
    bool b;
    printf("add_bos:         %s\n",
           ag_gguf_get_bool(g, "tokenizer.ggml.add_bos_token", &b) ? (b ? "true" : "false") : "(not set)");
    printf("add_eos:         %s\n",
           ag_gguf_get_bool(g, "tokenizer.ggml.add_eos_token", &b) ? (b ? "true" : "false") : "(not set)");
    uint64_t tlen;
    if (ag_gguf_get_str(g, "tokenizer.chat_template", &tlen))
        printf("chat template:   yes (%" PRIu64 " bytes)\n", tlen);
    else
        printf("chat template:   no\n");
    /* Named templates (tokenizer.chat_template.<name>: tool_use, rag...). */
    for (int64_t i = 0; i < ag_gguf_n_kv(g); i++) {
        const char *k = ag_gguf_key(g, i);
        if (strncmp(k, "tokenizer.chat_template.", 24) || ag_gguf_kv_type(g, i) != AG_GGUF_STRING) continue;
        printf("  template %-20s %" PRIu64 " bytes\n", k + 24, ag_gguf_kv_value(g, i)->str.len);
    }
}

/* s as a Markdown table cell: '|' escaped. */
static void put_cell(const char *s) {
    for (; *s; s++) {
        if (*s == '|') putchar('\\');
        putchar(*s);
    }
}

/* The switch table as Markdown (the README's list is this output). */
static int print_switches(void) {
    static const char *const kinds[] = {"flag", "integer", "number", "text"};
    int                        n;
    const ag_switch_info      *t = ag_switch_table(&n);
    printf("| switch | kind | unset | meaning | read by |\n|---|---|---|---|---|\n");
    for (int i = 0; i < n; i++) {
        printf("| `%s` | %s | ", t[i].name, kinds[t[i].kind]);
        put_cell(t[i].deflt);
        fputs(" | ", stdout);
        put_cell(t[i].meaning);
        printf(" | %s |\n", t[i].reader);
    }
    return 0;
}

int ag_cli_info(int argc, char **argv) {
    const char *path = NULL;
    enum { SUMMARY, KV, TENSORS } mode = SUMMARY;
    uint64_t max_items = 8;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            fputs(usage_text, stdout);
            return 0;
        } else if (!strcmp(a, "-m") || !strcmp(a, "--model")) {
            if (i + 1 >= argc) return ag_cli_usage_error(usage_text, "info: %s needs a path", a);
            if (path) return ag_cli_usage_error(usage_text, "info: more than one model given");
            path = argv[++i];
        } else if (!strncmp(a, "--model=", 8)) {
            if (path) return ag_cli_usage_error(usage_text, "info: more than one model given");
            path = a + 8;
        } else if (!strcmp(a, "--switches")) {
            return print_switches();
        } else if (!strcmp(a, "--kv")) {
            mode = KV;
        } else if (!strcmp(a, "--items")) {
            char *end;
            if (i + 1 >= argc || !argv[i + 1][0] || argv[i + 1][0] == '-')
                return ag_cli_usage_error(usage_text, "info: --items needs a count");
            unsigned long long n = strtoull(argv[++i], &end, 10);
            if (*end) return ag_cli_usage_error(usage_text, "info: bad --items count '%s'", argv[i]);
            max_items = n ? (uint64_t)n : UINT64_MAX;
        } else if (!strcmp(a, "--tensors")) {
            mode = TENSORS;
        } else if (a[0] == '-' && a[1]) {
            return ag_cli_usage_error(usage_text, "info: unknown option '%s'", a);
        } else {
            if (path) return ag_cli_usage_error(usage_text, "info: more than one model given");
            path = a;
        }
    }
    if (!path) path = ag_cli_default_model();
    ag_gguf *g = NULL;
    if (ag_model_file_open(path, &g) != AG_OK) return ag_cli_fail("%s: %s", path, ag_error_message());
    if (mode == KV) print_kv(g, max_items);
    else if (mode == TENSORS) print_tensors(g);
    else print_summary(g, path);
    ag_gguf_free(g);
    if (fflush(stdout) != 0 || ferror(stdout)) return ag_cli_fail("info: error writing the output");
    return 0;
}
