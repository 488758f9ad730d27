/* augur tokenize / augur detokenize: text <-> token ids with a model's tokenizer. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/buf.h"
#include "base/file.h"
#include "base/utf8.h"
#include "cli/cli.h"
#include "gguf/gguf.h"
#include "model/safetensors.h"
#include "tok/tok.h"

static const char k_tok_usage[] =
    "usage: augur tokenize [-m MODEL] [--raw] (-f FILE | TEXT)\n"
    "  prints the token ids of TEXT (or of FILE, '-' for stdin), space-separated, on one line\n"
    "  -m MODEL  GGUF model (default: $AUGUR_MODEL, else models/SmolLM2-135M-Instruct.Q4_1.gguf)\n"
    "  --raw     add no BOS/EOS and tokenize special-token text (e.g. <|im_start|>) as plain text;\n"
    "            by default BOS/EOS are added as the model's metadata says and special-token\n"
    "            text becomes its single id\n"
    "  Invalid UTF-8 is tokenized as llama.cpp does (byte-level BPE: U+FFFD per bad byte;\n"
    "  SentencePiece: byte tokens).\n";

static const char k_detok_usage[] =
    "usage: augur detokenize [-m MODEL] [--skip-special] [IDS...]\n"
    "  prints the text of the token ids (arguments, space- or comma-separated; stdin when none),\n"
    "  exactly as decoded, with no newline added\n"
    "  -m MODEL        GGUF model (default: $AUGUR_MODEL, else models/SmolLM2-135M-Instruct.Q4_1.gguf)\n"
    "  --skip-special  leave control tokens (BOS, <|im_end|>, ...) out instead of printing their text\n";

static int run_batch(const ag_tok *tok);

static const char *g_pre_override; /* hidden --pre NAME (tests) */

static int load_tok(const char *path, ag_tok **tok) {
    ag_gguf  *g = NULL;
    ag_status st = ag_model_file_open(path, &g);
    if (st) return ag_cli_fail("%s: %s", path, ag_error_message());
    st = ag_tok_from_gguf_pre(g, g_pre_override, tok);
    ag_gguf_free(g);
    if (st) return ag_cli_fail("%s: %s", path, ag_error_message());
    return 0;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int read_stream(FILE *f, ag_buf *b) {
    char   tmp[65536];
    size_t n;
    while ((n = fread(tmp, 1, sizeof tmp, f)) > 0)
        if (ag_buf_append(b, tmp, n)) return -1;
    return ferror(f) ? -1 : 0;
}

int ag_cli_tokenize(int argc, char **argv) {
    const char *model = NULL, *file = NULL, *text = NULL;
    bool        raw = false;
    long        bench = 0;   /* hidden: time N encodes of the text, print JSON */
    bool        batch = false; /* hidden: the test interface below */
    long        chunk = 0;     /* hidden, with --bench: encode in pieces of about this size */
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            fputs(k_tok_usage, stdout);
            return 0;
        } else if (!strcmp(a, "-m") || !strcmp(a, "--model")) {
            if (++i >= argc) return ag_cli_usage_error(k_tok_usage, "tokenize: %s needs a value", a);
            model = argv[i];
        } else if (!strcmp(a, "-f") || !strcmp(a, "--file")) {
            if (++i >= argc) return ag_cli_usage_error(k_tok_usage, "tokenize: %s needs a value", a);
            file = argv[i];
        } else if (!strcmp(a, "--raw")) {
            raw = true;
        } else if (!strcmp(a, "--pre")) {
            if (++i >= argc) return ag_cli_usage_error(k_tok_usage, "tokenize: %s needs a value", a);
            g_pre_override = argv[i];
        } else if (!strcmp(a, "--batch")) {
            batch = true;
        } else if (!strcmp(a, "--bench-chunk")) {
            char *end;
            if (++i >= argc || (chunk = strtol(argv[i], &end, 10)) <= 0 || *end)
                return ag_cli_usage_error(k_tok_usage, "tokenize: --bench-chunk needs a positive size");
        } else if (!strcmp(a, "--bench")) {
            char *end;
            if (++i >= argc || (bench = strtol(argv[i], &end, 10)) <= 0 || *end)
                return ag_cli_usage_error(k_tok_usage, "tokenize: --bench needs a positive count");
        } else if (!strcmp(a, "--")) {
            if (i + 1 < argc) {
                if (text || i + 2 < argc) return ag_cli_usage_error(k_tok_usage, "tokenize: one TEXT only");
                text = argv[++i];
            }
            break;
        } else if (a[0] == '-' && a[1]) {
            return ag_cli_usage_error(k_tok_usage, "tokenize: unknown option '%s'", a);
        } else {
            if (text) return ag_cli_usage_error(k_tok_usage, "tokenize: one TEXT only (quote it)");
            text = a;
        }
    }
    if (!model) model = ag_cli_default_model();
    if (batch) {
        ag_tok *tok = NULL;
        int     rc = load_tok(model, &tok);
        if (!rc) rc = run_batch(tok);
        ag_tok_free(tok);
        return rc;
    }
    if (!!text == !!file) return ag_cli_usage_error(k_tok_usage, "tokenize: give either TEXT or -f FILE");

    ag_buf in = {0};
    if (file) {
        if (!strcmp(file, "-")) {
            if (read_stream(stdin, &in)) {
                ag_buf_free(&in);
                return ag_cli_fail("tokenize: cannot read stdin: %s", strerror(errno));
            }
        } else {
            char  *data;
            size_t len;
            if (ag_file_read_all(file, &data, &len)) return ag_cli_fail("%s", ag_error_message());
            in.data = data;
            in.len = in.cap = len;
        }
    } else if (ag_buf_append_str(&in, text)) {
        return ag_cli_fail("out of memory");
    }

    ag_tok *tok = NULL;
    int     rc = load_tok(model, &tok);
    if (rc) {
        ag_buf_free(&in);
        return rc;
    }
    ag_tok_ids ids = {0};
    ag_status  st = AG_OK;
    double     best = 1e30;
    for (long r = 0; r < (bench ? bench : 1) && !st; r++) {
        ids.n = 0;
        double t0 = now_s();
        if (chunk && bench) {
            /* pieces end at the first newline at least `chunk` bytes on (bench/tok_bench.py
             * cuts the same pieces for llama.cpp) */
            for (size_t s = 0; s < in.len && !st;) {
                size_t e = s + (size_t)chunk < in.len ? s + (size_t)chunk : in.len;
                while (e < in.len && in.data[e - 1] != '\n') e++;
                st = ag_tok_encode_append(tok, in.data + s, e - s, !raw, !raw, &ids);
                s = e;
            }
        } else {
            st = ag_tok_encode_append(tok, in.data, in.len, !raw, !raw, &ids);
        }
        double dt = now_s() - t0;
        if (dt < best) best = dt;
    }
    if (st) {
        rc = ag_cli_fail("tokenize: %s", ag_error_message());
    } else if (bench) {
        printf("{\"bytes\": %zu, \"tokens\": %zu, \"seconds\": %.6f, \"runs\": %ld}\n", in.len, ids.n, best,
               bench);
    } else {
        ag_buf line = {0};
        for (size_t i = 0; i < ids.n && !st; i++) st = ag_buf_printf(&line, i ? " %d" : "%d", ids.data[i]);
        if (!st) st = ag_buf_append_char(&line, '\n');
        if (st || fwrite(line.data, 1, line.len, stdout) != line.len || fflush(stdout))
            rc = ag_cli_fail("tokenize: cannot write the output");
        ag_buf_free(&line);
    }
    ag_tok_ids_free(&ids);
    ag_tok_free(tok);
    ag_buf_free(&in);
    return rc;
}

/* Parses ids separated by spaces, commas or newlines; -1 on bad input. */
static int parse_ids(const char *s, ag_tok_ids *ids, const char **bad) {
    while (*s) {
        if (*s == ' ' || *s == ',' || *s == '\n' || *s == '\t' || *s == '\r' || *s == '[' || *s == ']') {
            s++;
            continue;
        }
        char *end;
        errno = 0;
        long v = strtol(s, &end, 10);
        if (end == s || errno || v < INT32_MIN || v > INT32_MAX ||
            (*end && !strchr(" ,\n\t\r[]", *end))) {
            *bad = s;
            return -1;
        }
        if (ids->n == ids->cap) {
            size_t   cap = ids->cap ? ids->cap * 2 : 64;
            int32_t *d = realloc(ids->data, cap * sizeof *d);
            if (!d) return -2;
            ids->data = d;
            ids->cap = cap;
        }
        ids->data[ids->n++] = (int32_t)v;
        s = end;
    }
    return 0;
}

/* ---- hidden test interface: `augur tokenize -m MODEL --batch` ----
 * One request per stdin line, one answer line each, so tests can check
 * thousands of texts against reference data in one process:
 *   e r|d HEX        encode the text (hex bytes) raw (no BOS/EOS, special text as
 *                    text) or default (add special, parse special) -> ids
 *   d FLAGS IDS...   ag_tok_decode with FLAGS -> hex of the text
 *   s FLAGS IDS...   the same through ag_detok, one push per id -> hex; every chunk
 *                    is checked to be complete UTF-8
 *   c FLAGS K IDS... as s, for the ids after the first K, through an ag_detok that
 *                    continues those K (ag_detok_new_after) -> hex of the stream
 *   p                every token's piece (special tokens as their text), hex,
 *                    space-separated, in id order
 *   m                vocabulary facts as JSON (special ids, EOG ids, piece hashes)
 * Errors answer "ERR message". */

static uint64_t fnv1a(uint64_t h, const void *p, size_t n) {
    const unsigned char *s = p;
    for (size_t i = 0; i < n; i++) {
        h ^= s[i];
        h *= 0x100000001B3ull;
    }
    return h;
}

static void put_hex(ag_buf *o, const char *s, size_t n) {
    static const char hx[] = "0123456789abcdef";
    for (size_t i = 0; i < n; i++) {
        ag_buf_append_char(o, hx[(unsigned char)s[i] >> 4]);
        ag_buf_append_char(o, hx[(unsigned char)s[i] & 15]);
    }
}

static int hexv(int c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

static void batch_line(const ag_tok *tok, char *line, ag_buf *o) {
    ag_tok_ids ids = {0};
    ag_buf     text = {0};
    const char *bad;
    if (line[0] == 'e' && line[1] == ' ' && (line[2] == 'r' || line[2] == 'd') && (line[3] == ' ' || !line[3])) {
        bool dflt = line[2] == 'd';
        const char *h = line[3] ? line + 4 : "";
        size_t hl = strlen(h);
        for (size_t i = 0; i + 1 < hl; i += 2) {
            int a = hexv(h[i]), b = hexv(h[i + 1]);
            if (a < 0 || b < 0) {
                ag_buf_append_str(o, "ERR bad hex");
                goto out;
            }
            ag_buf_append_char(&text, (char)(a * 16 + b));
        }
        if (ag_tok_encode_append(tok, text.data, text.len, dflt, dflt, &ids)) {
            ag_buf_printf(o, "ERR %s", ag_error_message());
            goto out;
        }
        for (size_t i = 0; i < ids.n; i++) ag_buf_printf(o, i ? " %d" : "%d", ids.data[i]);
    } else if ((line[0] == 'd' || line[0] == 's' || line[0] == 'c') && line[1] == ' ') {
        char *end;
        long  flags = strtol(line + 2, &end, 10), n_ctx = 0;
        if (line[0] == 'c') n_ctx = strtol(end, &end, 10);
        if (parse_ids(end, &ids, &bad) || n_ctx < 0 || (size_t)n_ctx > ids.n) {
            ag_buf_append_str(o, "ERR bad ids");
            goto out;
        }
        if (line[0] == 'd') {
            if (ag_tok_decode(tok, ids.data, ids.n, (unsigned)flags, &text)) {
                ag_buf_printf(o, "ERR %s", ag_error_message());
                goto out;
            }
        } else {
            ag_detok *d = NULL;
            ag_buf    chunk = {0};
            ag_status st = ag_detok_new_after(tok, (unsigned)flags, ids.data, (size_t)n_ctx, &d);
            for (size_t i = (size_t)n_ctx; !st && i <= ids.n; i++) {
                ag_buf_clear(&chunk);
                st = i < ids.n ? ag_detok_push(d, ids.data[i], &chunk) : ag_detok_flush(d, &chunk);
                if (!st && !ag_utf8_valid(chunk.data ? chunk.data : "", chunk.len))
                    st = ag_errorf(AG_ERR_INTERNAL, "chunk %zu is not valid UTF-8", i);
                if (!st) ag_buf_append(&text, chunk.data ? chunk.data : "", chunk.len);
            }
            ag_buf_free(&chunk);
            ag_detok_free(d);
            if (st) {
                ag_buf_printf(o, "ERR %s", ag_error_message());
                goto out;
            }
        }
        put_hex(o, text.data ? text.data : "", text.len);
    } else if (line[0] == 'm') {
        uint64_t hs = 0xCBF29CE484222325ull, hp = hs;
        for (int32_t id = 0; id < ag_tok_n_vocab(tok); id++) {
            size_t      n;
            const char *p = ag_tok_piece(tok, id, &n);
            hs = fnv1a(fnv1a(hs, p, n), "", 1);
            /* the piece with special = false: control and unknown tokens are empty */
            if (ag_tok_attr(tok, id) & (AG_TOK_ATTR_CONTROL | AG_TOK_ATTR_UNKNOWN)) n = 0;
            hp = fnv1a(fnv1a(hp, p, n), "", 1);
        }
        size_t         ne;
        const int32_t *eog = ag_tok_eog_ids(tok, &ne);
        ag_buf_printf(o,
                      "{\"n_vocab\": %d, \"bos\": %d, \"eos\": %d, \"eot\": %d, \"pad\": %d, \"add_bos\": %s, "
                      "\"add_eos\": %s, \"piece_fnv_special\": \"%016llx\", \"piece_fnv_plain\": \"%016llx\", "
                      "\"eog\": [",
                      ag_tok_n_vocab(tok), ag_tok_bos(tok), ag_tok_eos(tok), ag_tok_eot(tok), ag_tok_pad(tok),
                      ag_tok_add_bos(tok) ? "true" : "false", ag_tok_add_eos(tok) ? "true" : "false",
                      (unsigned long long)hs, (unsigned long long)hp);
        for (size_t i = 0; i < ne; i++) ag_buf_printf(o, i ? ", %d" : "%d", eog[i]);
        ag_buf_append_str(o, "]}");
    } else if (line[0] == 'p' && !line[1]) {
        for (int32_t id = 0; id < ag_tok_n_vocab(tok); id++) {
            size_t      n;
            const char *p = ag_tok_piece(tok, id, &n);
            if (id) ag_buf_append_char(o, ' ');
            put_hex(o, p, n);
        }
    } else {
        ag_buf_append_str(o, "ERR unknown request");
    }
out:
    ag_tok_ids_free(&ids);
    ag_buf_free(&text);
}

static int run_batch(const ag_tok *tok) {
    char  *line = NULL;
    size_t cap = 0;
    ssize_t n;
    ag_buf o = {0};
    while ((n = getline(&line, &cap, stdin)) > 0) {
        while (n > 0 && (line[n - 1] == '\n' || line[n - 1] == '\r')) line[--n] = '\0';
        ag_buf_clear(&o);
        batch_line(tok, line, &o);
        ag_buf_append_char(&o, '\n');
        fwrite(o.data, 1, o.len, stdout);
    }
    fflush(stdout);
    free(line);
    ag_buf_free(&o);
    return 0;
}

int ag_cli_detokenize(int argc, char **argv) {
    const char *model = NULL;
    bool        skip_special = false, have_args = false;
    ag_tok_ids  ids = {0};
    int         rc = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *bad = NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            fputs(k_detok_usage, stdout);
            ag_tok_ids_free(&ids);
            return 0;
        } else if (!strcmp(a, "-m") || !strcmp(a, "--model")) {
            if (++i >= argc) {
                ag_tok_ids_free(&ids);
                return ag_cli_usage_error(k_detok_usage, "detokenize: %s needs a value", a);
            }
            model = argv[i];
        } else if (!strcmp(a, "--skip-special")) {
            skip_special = true;
        } else if (a[0] == '-' && !(a[1] >= '0' && a[1] <= '9')) {
            ag_tok_ids_free(&ids);
            return ag_cli_usage_error(k_detok_usage, "detokenize: unknown option '%s'", a);
        } else {
            have_args = true;
            int r = parse_ids(a, &ids, &bad);
            if (r == -2) {
                ag_tok_ids_free(&ids);
                return ag_cli_fail("out of memory");
            }
            if (r) {
                ag_tok_ids_free(&ids);
                return ag_cli_usage_error(k_detok_usage, "detokenize: not a token id: '%.40s'", bad);
            }
        }
    }
    if (!have_args) {
        ag_buf in = {0};
        const char *bad = NULL;
        if (read_stream(stdin, &in)) {
            ag_buf_free(&in);
            return ag_cli_fail("detokenize: cannot read stdin: %s", strerror(errno));
        }
        int r = parse_ids(ag_buf_cstr(&in), &ids, &bad);
        if (r) {
            rc = r == -2 ? ag_cli_fail("out of memory")
                         : ag_cli_usage_error(k_detok_usage, "detokenize: not a token id: '%.40s'", bad);
            ag_buf_free(&in);
            ag_tok_ids_free(&ids);
            return rc;
        }
        ag_buf_free(&in);
    }
    if (!model) model = ag_cli_default_model();
    ag_tok *tok = NULL;
    if ((rc = load_tok(model, &tok))) {
        ag_tok_ids_free(&ids);
        return rc;
    }
    ag_buf    out = {0};
    ag_status st = ag_tok_decode(tok, ids.data, ids.n, skip_special ? 0 : AG_DECODE_SPECIAL, &out);
    if (st) rc = ag_cli_fail("detokenize: %s", ag_error_message());
    else if (out.len && (fwrite(out.data, 1, out.len, stdout) != out.len || fflush(stdout)))
        rc = ag_cli_fail("detokenize: cannot write the output");
    ag_buf_free(&out);
    ag_tok_free(tok);
    ag_tok_ids_free(&ids);
    return rc;
}
