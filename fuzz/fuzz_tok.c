/* libFuzzer target for the tokenizers (make fuzz; build/fuzz/fuzz_tok).
 *
 * The first input byte picks what the rest is:
 *   0..15  text for one of several tokenizers built here (SPM with byte
 *          fallback; byte-level BPE under pre-tokenizers that take different
 *          code paths: scanners, collapsed regexes, code-point regexes, an
 *          empty-match regex, lookahead repetition; special tokens with
 *          strip attributes): encode, decode, stream, and check that every
 *          streamed chunk is valid UTF-8 and the stream equals the decode
 *          when that is valid UTF-8;
 *   16..   a GGUF file whose tokenizer metadata is loaded and used.
 * Untrusted input must never crash, hang or leak. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/buf.h"
#include "base/log.h"
#include "base/utf8.h"
#include "gguf/gguf.h"
#include "tok/tok.h"

#define N_TOK 8
static ag_tok *g_tok[N_TOK];

static ag_tok *build(const char *model, const char *pre, const char *name) {
    /* 256 byte tokens (as <0xNN> for SPM, GPT-2 byte characters for BPE),
     * a few words, merges and special tokens */
    static char     store[256][8];
    const char     *text[300];
    uint32_t        len[300];
    float           score[300];
    int32_t         type[300];
    uint32_t        n = 0;
    bool            spm = !strcmp(model, "llama");
    for (int b = 0; b < 256; b++) {
        if (spm) {
            snprintf(store[b], sizeof store[b], "<0x%02X>", b);
        } else {
            unsigned cp = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE) ? (unsigned)b : 0;
            if (!cp) {
                unsigned k = 0;
                for (int c = 0; c < b; c++)
                    if (!((c >= 0x21 && c <= 0x7E) || (c >= 0xA1 && c <= 0xAC) || (c >= 0xAE))) k++;
                cp = 256 + k;
            }
            char u[4];
            size_t l = ag_utf8_encode(cp, u);
            memcpy(store[b], u, l);
            store[b][l] = 0;
        }
        text[n] = store[b];
        len[n] = (uint32_t)strlen(store[b]);
        score[n] = 0;
        type[n] = spm ? 6 : 1;
        n++;
    }
    static const char *const words[] = {"\xE2\x96\x81", "\xE2\x96\x81t", "he", "the", "\xC4\xA0t", "\xC4\xA0the",
                                        "in", "ing", "12", "123", "<|im_start|>", "<|im_end|>", "<u>", "</s>",
                                        "<unk>", "<s>"};
    static const int wtypes[] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 3, 3, 4, 1, 2, 3};
    for (size_t i = 0; i < sizeof words / sizeof words[0]; i++) {
        if (spm && words[i][0] == '\xC4') continue;
        if (!spm && words[i][0] == '\xE2') continue;
        text[n] = words[i];
        len[n] = (uint32_t)strlen(words[i]);
        score[n] = -(float)i;
        type[n] = wtypes[i];
        n++;
    }
    static const char *const merges[] = {"h e", "t he", "Ġ t", "Ġt he", "i n", "in g", "1 2", "12 3", "Ġ Ġ"};
    uint32_t                 mlen[9];
    for (int i = 0; i < 9; i++) mlen[i] = (uint32_t)strlen(merges[i]);
    ag_tok_spec s;
    ag_tok_spec_init(&s);
    s.model = model;
    s.pre = pre;
    s.name = name;
    s.n_tokens = n;
    s.token_text = text;
    s.token_len = len;
    s.scores = score;
    s.types = type;
    if (!spm) {
        s.n_merges = 9;
        s.merge_text = merges;
        s.merge_len = mlen;
        s.bos = s.eos = 256 + 10 - 6; /* some id in range */
    } else {
        s.bos = n - 1;
        s.eos = n - 3;
        s.unk = n - 2;
    }
    ag_tok *tok = NULL;
    if (ag_tok_new(&s, &tok)) {
        fprintf(stderr, "fuzz_tok: %s\n", ag_error_message());
        abort();
    }
    return tok;
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    ag_log_set_level(AG_LOG_ERROR);
    g_tok[0] = build("llama", NULL, NULL);
    g_tok[1] = build("gpt2", "gpt-2", "phi-3"); /* phi-3: special tokens strip spaces right */
    g_tok[2] = build("gpt2", "llama-bpe", NULL);
    g_tok[3] = build("gpt2", "qwen2", NULL);
    g_tok[4] = build("gpt2", "deepseek-llm", NULL);
    g_tok[5] = build("gpt2", "tekken", NULL);
    g_tok[6] = build("gpt2", "superbpe", NULL);
    g_tok[7] = build("gpt2", "default", NULL);
    return 0;
}

static void check_text(const ag_tok *tok, const uint8_t *data, size_t size, unsigned mode) {
    int32_t *ids = NULL;
    size_t   n = 0;
    bool     special = mode & 1;
    if (ag_tok_encode(tok, (const char *)data, size, special, special, &ids, &n)) return;
    for (size_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= ag_tok_n_vocab(tok)) abort();
    unsigned flags = (mode >> 1) & 3;
    ag_buf   full = {0}, stream = {0}, chunk = {0};
    if (ag_tok_decode(tok, ids, n, flags, &full)) abort();
    ag_detok *d;
    if (ag_detok_new(tok, flags, &d)) abort();
    for (size_t i = 0; i <= n; i++) {
        ag_buf_clear(&chunk);
        if ((i < n ? ag_detok_push(d, ids[i], &chunk) : ag_detok_flush(d, &chunk))) abort();
        if (!ag_utf8_valid(ag_buf_cstr(&chunk), chunk.len)) abort();
        ag_buf_append(&stream, ag_buf_cstr(&chunk), chunk.len);
    }
    if (ag_utf8_valid(ag_buf_cstr(&full), full.len) &&
        (full.len != stream.len || memcmp(ag_buf_cstr(&full), ag_buf_cstr(&stream), full.len)))
        abort();
    ag_detok_free(d);
    ag_buf_free(&full);
    ag_buf_free(&stream);
    ag_buf_free(&chunk);
    free(ids);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    unsigned sel = data[0];
    if (sel < 16) {
        check_text(g_tok[sel % N_TOK], data + 1, size - 1, sel / N_TOK ? 7 : 0);
        return 0;
    }
    ag_gguf *g = NULL;
    if (ag_gguf_open_memory(data + 1, size - 1, &g)) return 0;
    ag_tok *tok = NULL;
    if (!ag_tok_from_gguf(g, &tok)) {
        static const char *const texts[] = {"Hello, world! 123", "<|im_start|>x<|im_end|>", " \n\t\xE2\x96\x81",
                                            "\xF0\x9F\x98\x80\xFF"};
        for (size_t i = 0; i < 4; i++) check_text(tok, (const uint8_t *)texts[i], strlen(texts[i]), (unsigned)i * 2 + 1);
        int32_t n = ag_tok_n_vocab(tok), ids[64];
        size_t  k = 0;
        for (int32_t i = 0; i < n && k < 64; i += 1 + n / 64) ids[k++] = i;
        ag_buf out = {0};
        ag_tok_decode(tok, ids, k, AG_DECODE_SPECIAL, &out);
        ag_buf_free(&out);
        ag_tok_free(tok);
    }
    ag_gguf_free(g);
    return 0;
}
