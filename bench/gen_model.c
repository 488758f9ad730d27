/* gen_model: writes a GGUF model of a real architecture's shape with random
 * (but valid) weights, through our GGUF writer. Speed does not depend on
 * weight values, so this is how benchmarks get an 8B model where only 64 MiB
 * can be carried (the GPU machine), and how the CPU and GPU backends are
 * compared on every weight type and architecture feature.
 *
 *   gen_model OUT.gguf PRESET [--type T] [--layers N] [--seed S]
 *
 * PRESET: llama8b (Llama-3.1-8B: 32 layers, 4096/14336, 32/8 heads, vocab
 * 128256), smollm2 (SmolLM2-135M), qwen05b (Qwen2.5-0.5B, QKV bias),
 * qwen15b (Qwen2.5-1.5B, the shape of Qwen2.5-Coder-1.5B),
 * gemma270m (Gemma 3 270M: sliding window, QK-norm, GELU),
 * qwen3-1.7b (Qwen3-1.7B: per-head q/k RMSNorm, no QKV bias, tied
 * embeddings), qwen3moe-a3b (Qwen3-30B-A3B's shape, 48 layers, 2048 wide,
 * 32/4 heads of 128, experts 768 wide, with 32 experts instead of 128 so
 * that it fits 24 GB of memory, 8 of them used per token as in the real
 * model: ~5 GB in Q4_K_M), and the small test shapes qwen3-tiny and
 * qwen3moe-tiny (4 layers, 512 wide, 4/2 heads of 128, a 1024-token
 * vocabulary; the MoE one with 8 experts of 512, 2 used; every matrix at
 * least two 256-blocks wide, so that decode and prompt kernels sum
 * differently, as in real shapes), gpt-oss-20b (gpt-oss-20b's shape: 24
 * layers, 2880 wide, 64/8 heads of 64, 32 experts of 2880, 4 used, vocab
 * 201088, a 128-position window on every other layer, attention sinks,
 * q/k/v/o, router and expert biases, YaRN x32 from 4096 positions) and
 * gpt-oss-tiny (the same with 4 layers, 512 wide, 8/2 heads of 64, 8
 * experts of 512, 2 used, a 1024-token vocabulary), granite-h-tiny
 * (granitehybrid: 6 layers, 512 wide, attention (8/2 heads of 64, no RoPE)
 * on layers 1 and 4, Mamba-2 elsewhere: 4 conv taps, state 64, inner 1024
 * in 16 heads of 64, 2 groups; Granite 4.0-H's multipliers) and
 * granite-4.0-h-micro (Granite-4.0-H-Micro-like: 40 layers, 2048 wide,
 * 32/8 heads of 64 on every tenth layer, FFN 8192, Mamba-2 inner 4096 in
 * 64 heads, state 128, 1 group, vocab 100352; where its attention layers
 * sit is a guess).
 * For an MoE preset ffn_gate_inp (the router) stays F32, as llama.cpp's
 * quantizer keeps it, and the experts are 3-D stacks ffn_{gate,up,down}_exps.
 * --type: the matrices' type (F16, BF16, Q4_0, Q4_1, Q5_0, Q8_0, Q4_K, Q6_K,
 * MXFP4 (gpt-oss's default, as llama.cpp's gpt-oss files: the experts MXFP4,
 * the other matrices Q8_0 or --dense's type, the router F32);
 * "Q4_K_M" = Q4_K with Q6_K for the output and for attn_v and ffn_down in
 * the layers llama.cpp's Q4_K_M gives more bits: qwen15b --type Q4_K_M has
 * the real Qwen2.5-Coder-1.5B Q4_K_M file's types and sizes). Norm gains are F32 near 1.
 *
 * Quantized blocks get random quants and scales chosen so a weight's
 * spread is about 1/sqrt(fan-in): activations stay finite through the
 * layers, so logits are meaningful numbers to compare. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/quant.h"
#include "gguf/gguf.h"

static uint64_t g_rng = 0x2545F4914F6CDD1Dull;
static uint64_t rnd(void) {
    uint64_t z = (g_rng += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
static float urand(void) { return (float)(rnd() >> 40) * 0x1p-24f; }

typedef struct {
    const char *name, *arch;
    int layers, embd, ff, heads, kv_heads, head_dim, vocab, ctx;
    float rope_base;
    bool  tied;                          /* no output.weight: the embeddings are the head */
    int   experts, experts_used, ff_exp; /* routed experts (0: a dense feed-forward) */
    int   window;                        /* sliding window (gpt-oss: every other layer) */
    /* granitehybrid: Mamba-2 layers but where l % attn_period == attn_at;
     * the mixer's conv taps, state size, inner size, heads and groups */
    int   attn_period, attn_at, ssm_conv, ssm_state, ssm_inner, ssm_heads, ssm_groups;
} preset;

static const preset k_presets[] = {
    {"llama8b", "llama", 32, 4096, 14336, 32, 8, 128, 128256, 131072, 500000.0f, .tied = false},
    {"smollm2", "llama", 30, 576, 1536, 9, 3, 64, 49152, 8192, 100000.0f, .tied = false},
    {"qwen05b", "qwen2", 24, 896, 4864, 14, 2, 64, 151936, 32768, 1000000.0f, .tied = false},
    {"qwen15b", "qwen2", 28, 1536, 8960, 12, 2, 128, 151936, 32768, 1000000.0f, .tied = false},
    {"gemma270m", "gemma3", 18, 640, 2048, 4, 1, 256, 262144, 32768, 1000000.0f, .tied = true},
    {"qwen3-1.7b", "qwen3", 28, 2048, 6144, 16, 8, 128, 151936, 40960, 1000000.0f, .tied = true},
    {"qwen3moe-a3b", "qwen3moe", 48, 2048, 6144, 32, 4, 128, 151936, 40960, 1000000.0f, .experts = 32,
     .experts_used = 8, .ff_exp = 768},
    {"qwen3-tiny", "qwen3", 4, 512, 1536, 4, 2, 128, 1024, 4096, 1000000.0f, .tied = true},
    {"qwen3moe-tiny", "qwen3moe", 4, 512, 1536, 4, 2, 128, 1024, 4096, 1000000.0f, .experts = 8, .experts_used = 2,
     .ff_exp = 512},
    {"gpt-oss-20b", "gpt-oss", 24, 2880, 2880, 64, 8, 64, 201088, 131072, 150000.0f, .experts = 32, .experts_used = 4,
     .ff_exp = 2880, .window = 128},
    {"gpt-oss-tiny", "gpt-oss", 4, 512, 512, 8, 2, 64, 1024, 131072, 150000.0f, .experts = 8, .experts_used = 2,
     .ff_exp = 512, .window = 128},
    {"granite-h-tiny", "granitehybrid", 6, 512, 1024, 8, 2, 64, 1024, 4096, 10000.0f, .attn_period = 3, .attn_at = 1,
     .ssm_conv = 4, .ssm_state = 64, .ssm_inner = 1024, .ssm_heads = 16, .ssm_groups = 2},
    {"granite-4.0-h-micro", "granitehybrid", 40, 2048, 8192, 32, 8, 64, 100352, 131072, 10000.0f, .attn_period = 10,
     .attn_at = 9, .ssm_conv = 4, .ssm_state = 128, .ssm_inner = 4096, .ssm_heads = 64, .ssm_groups = 1},
};

/* Sets the fp16 at byte offset `off` of every block to `v` (times a random factor in [0.5, 1.5)). */
static void set_scales(uint8_t *data, size_t n_blocks, size_t block_bytes, int off, float v) {
    for (size_t b = 0; b < n_blocks; b++) {
        uint16_t h = ag_fp32_to_fp16(v * (0.5f + urand()));
        memcpy(data + b * block_bytes + off, &h, 2);
    }
}

/* A random matrix of n_out rows of n_in elements. */
static uint8_t *random_matrix(uint32_t type, int64_t n_in, int64_t n_out, size_t *bytes) {
    size_t   row = ag_quant_row_bytes(type, n_in), total = row * (size_t)n_out;
    uint8_t *d = malloc(total);
    if (!d) return NULL;
    const float sd = 1.0f / sqrtf((float)n_in); /* target spread of a weight */
    if (type == AG_TYPE_F16 || type == AG_TYPE_BF16 || type == AG_TYPE_F32) {
        size_t n = (size_t)n_in * n_out;
        for (size_t i = 0; i < n; i++) {
            float f = (urand() * 2 - 1) * 1.7f * sd; /* uniform with std sd */
            if (type == AG_TYPE_F32) memcpy(d + 4 * i, &f, 4);
            else {
                uint16_t h = type == AG_TYPE_F16 ? ag_fp32_to_fp16(f) : ag_fp32_to_bf16(f);
                memcpy(d + 2 * i, &h, 2);
            }
        }
        *bytes = total;
        return d;
    }
    for (size_t i = 0; i + 8 <= total; i += 8) {
        uint64_t r = rnd();
        memcpy(d + i, &r, 8);
    }
    for (size_t i = total & ~(size_t)7; i < total; i++) d[i] = (uint8_t)rnd();
    uint32_t be, bb;
    ag_quant_block(type, &be, &bb);
    size_t nb = total / bb;
    switch (type) { /* quants spread ~4.6 steps (4-bit) or ~74 (8-bit) around their centre */
    case AG_TYPE_Q4_0: set_scales(d, nb, bb, 0, sd / 4.6f); break;
    case AG_TYPE_Q5_0: set_scales(d, nb, bb, 0, sd / 9.2f); break;
    case AG_TYPE_Q8_0: set_scales(d, nb, bb, 0, sd / 74.0f); break;
    case AG_TYPE_Q4_1:
        set_scales(d, nb, bb, 0, sd / 4.6f);
        for (size_t b = 0; b < nb; b++) { /* min = -8 d: centred */
            uint16_t h;
            memcpy(&h, d + b * bb, 2);
            uint16_t m = ag_fp32_to_fp16(-8.0f * ag_fp16_to_fp32(h));
            memcpy(d + b * bb + 2, &m, 2);
        }
        break;
    case AG_TYPE_Q4_K: /* x = d*sc*q - dmin*m, sc and m 6-bit: keep it small and roughly centred */
        set_scales(d, nb, bb, 0, sd / (4.6f * 31.0f));
        set_scales(d, nb, bb, 2, sd * 7.5f / 31.0f / 4.6f);
        break;
    case AG_TYPE_Q6_K: set_scales(d, nb, bb, 208, sd / (18.5f * 64.0f)); break;
    case AG_TYPE_MXFP4: /* values of rms ~5.9 (the doubled E2M1 table) times 2^(e-128) */
        for (size_t b = 0; b < nb; b++)
            d[b * bb] = (uint8_t)(128 + lrintf(log2f(sd / 5.9f)) + (int)(rnd() % 3) - 1);
        break;
    default:
        free(d);
        return NULL;
    }
    *bytes = total;
    return d;
}

/* A stack of n_mat random matrices of n_out rows of n_in elements (n_mat
 * 1: a plain 2-D matrix). */
static int add_matrices(ag_gguf_writer *w, const char *name, uint32_t type, int64_t n_in, int64_t n_out, int64_t n_mat) {
    /* rows that do not fill the type's blocks fall back as llama.cpp's quantizer does */
    if (!ag_quant_row_bytes(type, n_in)) type = ag_quant_row_bytes(AG_TYPE_Q8_0, n_in) ? AG_TYPE_Q8_0 : AG_TYPE_F16;
    size_t   bytes;
    uint8_t *d = random_matrix(type, n_in, n_out * n_mat, &bytes);
    if (!d) return fprintf(stderr, "gen_model: cannot make %s (%s)\n", name, ag_tensor_type_name(type)), 1;
    uint64_t  ne[3] = {(uint64_t)n_in, (uint64_t)n_out, (uint64_t)n_mat};
    ag_status st = ag_gguf_writer_add_tensor(w, name, type, n_mat > 1 ? 3 : 2, ne, d, bytes);
    free(d);
    if (st) return fprintf(stderr, "gen_model: %s: %s\n", name, ag_error_message()), 1;
    return 0;
}

static int add_matrix(ag_gguf_writer *w, const char *name, uint32_t type, int64_t n_in, int64_t n_out) {
    return add_matrices(w, name, type, n_in, n_out, 1);
}

/* n_rows F32 rows of n values centre ± spread (n_rows 1: a vector). */
static int add_f32_rows(ag_gguf_writer *w, const char *name, int64_t n, int64_t n_rows, float centre, float spread) {
    const size_t cnt = (size_t)n * (size_t)n_rows;
    float       *v = malloc(sizeof(float) * cnt);
    for (size_t i = 0; i < cnt; i++) v[i] = centre + (urand() * 2 - 1) * spread;
    uint64_t  ne[2] = {(uint64_t)n, (uint64_t)n_rows};
    ag_status st = ag_gguf_writer_add_tensor(w, name, AG_TYPE_F32, n_rows > 1 ? 2 : 1, ne, v, sizeof(float) * cnt);
    free(v);
    if (st) return fprintf(stderr, "gen_model: %s: %s\n", name, ag_error_message()), 1;
    return 0;
}

static int add_vector(ag_gguf_writer *w, const char *name, int64_t n, float centre, float spread) {
    return add_f32_rows(w, name, n, 1, centre, spread);
}

static bool parse_type(const char *s, uint32_t *t, bool *k_m) {
    static const struct { const char *n; uint32_t t; } k[] = {
        {"F32", AG_TYPE_F32}, {"F16", AG_TYPE_F16}, {"BF16", AG_TYPE_BF16}, {"Q4_0", AG_TYPE_Q4_0},
        {"Q4_1", AG_TYPE_Q4_1}, {"Q5_0", AG_TYPE_Q5_0}, {"Q8_0", AG_TYPE_Q8_0}, {"Q4_K", AG_TYPE_Q4_K},
        {"Q6_K", AG_TYPE_Q6_K}, {"Q4_K_M", AG_TYPE_Q4_K}, {"MXFP4", AG_TYPE_MXFP4}};
    for (size_t i = 0; i < sizeof k / sizeof k[0]; i++)
        if (!strcmp(s, k[i].n)) {
            *t = k[i].t;
            *k_m = !strcmp(s, "Q4_K_M");
            return true;
        }
    return false;
}

/* A placeholder SentencePiece vocabulary of n tokens ("<unk>", "<s>",
 * "</s>", then "<0x00>".."<0xFF>" byte tokens and "t<id>" pieces) so that
 * llama.cpp loads the file too (it refuses a model without
 * tokenizer.ggml.model): the peer benchmarks run on the same GGUF. */
static int add_vocab(ag_gguf_writer *w, int n) {
    ag_gguf_value *items = calloc((size_t)n, sizeof *items);
    char          *text = malloc((size_t)n * 16);
    float         *scores = calloc((size_t)n, sizeof *scores);
    int32_t       *types = malloc((size_t)n * sizeof *types);
    int            bad = !items || !text || !scores || !types;
    for (int i = 0; i < n && !bad; i++) {
        char *t = text + (size_t)i * 16;
        int   len = i == 0 ? snprintf(t, 16, "<unk>") : i == 1 ? snprintf(t, 16, "<s>") : i == 2 ? snprintf(t, 16, "</s>")
                    : i < 3 + 256 ? snprintf(t, 16, "<0x%02X>", i - 3) : snprintf(t, 16, "t%d", i);
        items[i] = (ag_gguf_value){.type = AG_GGUF_STRING, .str = {t, (uint64_t)len}};
        types[i] = i == 0 ? 2 : i < 3 ? 3 : i < 3 + 256 ? 6 : 1; /* unknown, control, byte, normal */
    }
    if (!bad) {
        ag_gguf_value tok = {.type = AG_GGUF_ARRAY, .arr = {AG_GGUF_STRING, (uint64_t)n, NULL, items}};
        ag_gguf_value sc = {.type = AG_GGUF_ARRAY, .arr = {AG_GGUF_F32, (uint64_t)n, scores, NULL}};
        ag_gguf_value ty = {.type = AG_GGUF_ARRAY, .arr = {AG_GGUF_I32, (uint64_t)n, types, NULL}};
        bad |= ag_gguf_writer_add_str(w, "tokenizer.ggml.model", "llama") != AG_OK;
        bad |= ag_gguf_writer_add(w, "tokenizer.ggml.tokens", &tok) != AG_OK;
        bad |= ag_gguf_writer_add(w, "tokenizer.ggml.scores", &sc) != AG_OK;
        bad |= ag_gguf_writer_add(w, "tokenizer.ggml.token_type", &ty) != AG_OK;
        bad |= ag_gguf_writer_add_u32(w, "tokenizer.ggml.unknown_token_id", 0) != AG_OK;
        bad |= ag_gguf_writer_add_u32(w, "tokenizer.ggml.bos_token_id", 1) != AG_OK;
        bad |= ag_gguf_writer_add_u32(w, "tokenizer.ggml.eos_token_id", 2) != AG_OK;
    }
    free(items);
    free(text);
    free(scores);
    free(types);
    return bad;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: gen_model OUT.gguf llama8b|smollm2|qwen05b|qwen15b|gemma270m|qwen3-1.7b|qwen3moe-a3b|"
                        "qwen3-tiny|qwen3moe-tiny|gpt-oss-20b|gpt-oss-tiny|granite-h-tiny|granite-4.0-h-micro [--type T] [--dense T] [--layers N] [--seed S]\n");
        return 2;
    }
    const preset *p = NULL;
    for (size_t i = 0; i < sizeof k_presets / sizeof k_presets[0]; i++)
        if (!strcmp(argv[2], k_presets[i].name)) p = &k_presets[i];
    if (!p) return fprintf(stderr, "gen_model: unknown preset '%s'\n", argv[2]), 2;
    preset   c = *p;
    const bool gptoss = !strcmp(c.arch, "gpt-oss");
    uint32_t   type = gptoss ? AG_TYPE_MXFP4 : AG_TYPE_Q4_K;
    bool       k_m = false;
    uint32_t   dense_type = AG_TYPE_COUNT; /* --dense: gpt-oss's matrices other than the experts' */
    for (int i = 3; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--type")) {
            if (!parse_type(argv[i + 1], &type, &k_m)) return fprintf(stderr, "gen_model: bad type %s\n", argv[i + 1]), 2;
        } else if (!strcmp(argv[i], "--dense")) {
            bool km;
            if (!parse_type(argv[i + 1], &dense_type, &km) || km)
                return fprintf(stderr, "gen_model: bad type %s\n", argv[i + 1]), 2;
        } else if (!strcmp(argv[i], "--layers")) {
            c.layers = atoi(argv[i + 1]);
        } else if (!strcmp(argv[i], "--seed")) {
            g_rng ^= strtoull(argv[i + 1], NULL, 10) * 0x9E3779B97F4A7C15ull;
        } else {
            return fprintf(stderr, "gen_model: unknown option %s\n", argv[i]), 2;
        }
    }
    const bool   gemma = !strcmp(c.arch, "gemma3"), qwen = !strcmp(c.arch, "qwen2");
    const bool   qwen3 = !strncmp(c.arch, "qwen3", 5), moe = c.experts > 0;
    const uint32_t t_big = k_m ? AG_TYPE_Q6_K : type; /* Q4_K_M's Q6_K tensors */
    /* MXFP4 as llama.cpp's gpt-oss files have it: the experts MXFP4, every
     * other matrix Q8_0 (--dense: another type for those) */
    const uint32_t t_exp = type, t_dense = dense_type != AG_TYPE_COUNT         ? dense_type
                                           : gptoss && type == AG_TYPE_MXFP4 ? AG_TYPE_Q8_0
                                                                             : type;
    ag_gguf_writer *w = ag_gguf_writer_new();
    char            key[128];
    int             bad = 0;
#define KEY(suffix) (snprintf(key, sizeof key, "%s.%s", c.arch, suffix), key)
    bad |= ag_gguf_writer_add_str(w, "general.architecture", c.arch) != AG_OK;
    bad |= ag_gguf_writer_add_str(w, "general.name", "augur random weights") != AG_OK;
    bad |= ag_gguf_writer_add_u32(w, KEY("block_count"), (uint32_t)c.layers) != AG_OK;
    bad |= ag_gguf_writer_add_u32(w, KEY("context_length"), (uint32_t)c.ctx) != AG_OK;
    bad |= ag_gguf_writer_add_u32(w, KEY("embedding_length"), (uint32_t)c.embd) != AG_OK;
    bad |= ag_gguf_writer_add_u32(w, KEY("feed_forward_length"), (uint32_t)c.ff) != AG_OK;
    bad |= ag_gguf_writer_add_u32(w, KEY("attention.head_count"), (uint32_t)c.heads) != AG_OK;
    const bool granite = c.attn_period > 0;
    if (granite) { /* what convert_hf_to_gguf writes for Granite 4.0-H (GraniteHybridModel) */
        int32_t kvs[512];
        for (int l = 0; l < c.layers && l < 512; l++) kvs[l] = l % c.attn_period == c.attn_at ? c.kv_heads : 0;
        ag_gguf_value v = {.type = AG_GGUF_ARRAY};
        v.arr.elem_type = AG_GGUF_I32;
        v.arr.n = (uint64_t)c.layers;
        v.arr.raw = kvs;
        bad |= ag_gguf_writer_add(w, KEY("attention.head_count_kv"), &v) != AG_OK;
        bad |= ag_gguf_writer_add_u32(w, KEY("ssm.conv_kernel"), (uint32_t)c.ssm_conv) != AG_OK;
        bad |= ag_gguf_writer_add_u32(w, KEY("ssm.state_size"), (uint32_t)c.ssm_state) != AG_OK;
        bad |= ag_gguf_writer_add_u32(w, KEY("ssm.group_count"), (uint32_t)c.ssm_groups) != AG_OK;
        bad |= ag_gguf_writer_add_u32(w, KEY("ssm.inner_size"), (uint32_t)c.ssm_inner) != AG_OK;
        bad |= ag_gguf_writer_add_u32(w, KEY("ssm.time_step_rank"), (uint32_t)c.ssm_heads) != AG_OK;
        /* Granite 4.0-H's multipliers (granite-4.0-h-micro's config) and no RoPE */
        bad |= ag_gguf_writer_add_f32(w, KEY("embedding_scale"), 12.0f) != AG_OK;
        bad |= ag_gguf_writer_add_f32(w, KEY("residual_scale"), 0.22f) != AG_OK;
        bad |= ag_gguf_writer_add_f32(w, KEY("attention.scale"), 0.0078125f) != AG_OK;
        bad |= ag_gguf_writer_add_f32(w, KEY("logit_scale"), 10.0f) != AG_OK;
        bad |= ag_gguf_writer_add_bool(w, KEY("rope.scaling.finetuned"), false) != AG_OK;
    } else {
        bad |= ag_gguf_writer_add_u32(w, KEY("attention.head_count_kv"), (uint32_t)c.kv_heads) != AG_OK;
    }
    bad |= ag_gguf_writer_add_f32(w, KEY("attention.layer_norm_rms_epsilon"), 1e-6f) != AG_OK;
    bad |= ag_gguf_writer_add_f32(w, KEY("rope.freq_base"), c.rope_base) != AG_OK;
    if (gemma || qwen3) {
        bad |= ag_gguf_writer_add_u32(w, KEY("attention.key_length"), (uint32_t)c.head_dim) != AG_OK;
        bad |= ag_gguf_writer_add_u32(w, KEY("attention.value_length"), (uint32_t)c.head_dim) != AG_OK;
    }
    if (gemma) bad |= ag_gguf_writer_add_u32(w, KEY("attention.sliding_window"), 512) != AG_OK;
    if (gptoss) { /* what convert_hf_to_gguf writes for gpt-oss: its window, YaRN from 4096 positions x32 */
        bad |= ag_gguf_writer_add_u32(w, KEY("attention.key_length"), (uint32_t)c.head_dim) != AG_OK;
        bad |= ag_gguf_writer_add_u32(w, KEY("attention.value_length"), (uint32_t)c.head_dim) != AG_OK;
        bad |= ag_gguf_writer_add_u32(w, KEY("attention.sliding_window"), (uint32_t)c.window) != AG_OK;
        bad |= ag_gguf_writer_add_str(w, KEY("rope.scaling.type"), "yarn") != AG_OK;
        bad |= ag_gguf_writer_add_f32(w, KEY("rope.scaling.factor"), 32.0f) != AG_OK;
        bad |= ag_gguf_writer_add_u32(w, KEY("rope.scaling.original_context_length"), 4096) != AG_OK;
    }
    if (moe) { /* what convert_hf_to_gguf writes for Qwen3-MoE */
        bad |= ag_gguf_writer_add_u32(w, KEY("expert_count"), (uint32_t)c.experts) != AG_OK;
        bad |= ag_gguf_writer_add_u32(w, KEY("expert_used_count"), (uint32_t)c.experts_used) != AG_OK;
        bad |= ag_gguf_writer_add_u32(w, KEY("expert_feed_forward_length"), (uint32_t)c.ff_exp) != AG_OK;
    }
    bad |= add_vocab(w, c.vocab);
    if (bad) return fprintf(stderr, "gen_model: metadata: %s\n", ag_error_message()), 1;
    const int64_t qd = (int64_t)c.heads * c.head_dim, kd = (int64_t)c.kv_heads * c.head_dim;
    /* llama.cpp's Q4_K_M gives a tied table the output's Q6_K (done for
     * qwen3 only: the gemma270m files of earlier benchmarks stay as they were) */
    bad |= add_matrix(w, "token_embd.weight", k_m ? (c.tied && qwen3 ? t_big : AG_TYPE_Q4_K) : t_dense, c.embd, c.vocab);
    bad |= add_vector(w, "output_norm.weight", c.embd, 1.0f, 0.1f);
    if (!c.tied) bad |= add_matrix(w, "output.weight", gptoss ? t_dense : t_big, c.embd, c.vocab);
    for (int l = 0; l < c.layers && !bad; l++) {
        char n[96];
#define T(suffix) (snprintf(n, sizeof n, "blk.%d.%s", l, suffix), n)
        bad |= add_vector(w, T("attn_norm.weight"), c.embd, 1.0f, 0.1f);
        if (granite && l % c.attn_period != c.attn_at) { /* a Mamba-2 layer (llama.cpp's names and shapes) */
            const int64_t conv_ch = c.ssm_inner + 2 * c.ssm_groups * c.ssm_state;
            const int64_t proj = 2 * c.ssm_inner + 2 * c.ssm_groups * c.ssm_state + c.ssm_heads;
            bad |= add_matrix(w, T("ssm_in.weight"), type, c.embd, proj);
            bad |= add_f32_rows(w, T("ssm_conv1d.weight"), c.ssm_conv, conv_ch, 0.0f, 0.5f);
            bad |= add_vector(w, T("ssm_conv1d.bias"), conv_ch, 0.0f, 0.1f);
            bad |= add_vector(w, T("ssm_dt.bias"), c.ssm_heads, -2.0f, 1.0f);
            /* A = -exp(A_log), as the converter writes it: decays in (-4, -0.25) */
            bad |= add_f32_rows(w, T("ssm_a"), 1, c.ssm_heads, -2.125f, 1.875f);
            bad |= add_f32_rows(w, T("ssm_d"), 1, c.ssm_heads, 1.0f, 0.5f);
            bad |= add_f32_rows(w, T("ssm_norm.weight"), c.ssm_inner / c.ssm_groups, c.ssm_groups, 1.0f, 0.1f);
            bad |= add_matrix(w, T("ssm_out.weight"), type, c.ssm_inner, c.embd);
            bad |= add_vector(w, T("ffn_norm.weight"), c.embd, 1.0f, 0.1f);
            bad |= add_matrix(w, T("ffn_gate.weight"), type, c.embd, c.ff);
            bad |= add_matrix(w, T("ffn_up.weight"), type, c.embd, c.ff);
            bad |= add_matrix(w, T("ffn_down.weight"), type, c.ff, c.embd);
            continue;
        }
        if (gptoss) { /* q/k/v/o biases, one sink logit per head, the router's bias, the experts' biases */
            bad |= add_matrix(w, T("attn_q.weight"), t_dense, c.embd, qd);
            bad |= add_matrix(w, T("attn_k.weight"), t_dense, c.embd, kd);
            bad |= add_matrix(w, T("attn_v.weight"), t_dense, c.embd, kd);
            bad |= add_matrix(w, T("attn_output.weight"), t_dense, qd, c.embd);
            bad |= add_vector(w, T("attn_q.bias"), qd, 0.0f, 0.1f);
            bad |= add_vector(w, T("attn_k.bias"), kd, 0.0f, 0.1f);
            bad |= add_vector(w, T("attn_v.bias"), kd, 0.0f, 0.1f);
            bad |= add_vector(w, T("attn_output.bias"), c.embd, 0.0f, 0.1f);
            bad |= add_vector(w, T("attn_sinks.weight"), c.heads, 0.0f, 2.0f);
            bad |= add_vector(w, T("post_attention_norm.weight"), c.embd, 1.0f, 0.1f);
            bad |= add_matrix(w, T("ffn_gate_inp.weight"), AG_TYPE_F32, c.embd, c.experts);
            bad |= add_vector(w, T("ffn_gate_inp.bias"), c.experts, 0.0f, 0.5f);
            bad |= add_matrices(w, T("ffn_gate_exps.weight"), t_exp, c.embd, c.ff_exp, c.experts);
            bad |= add_matrices(w, T("ffn_up_exps.weight"), t_exp, c.embd, c.ff_exp, c.experts);
            bad |= add_matrices(w, T("ffn_down_exps.weight"), t_exp, c.ff_exp, c.embd, c.experts);
            bad |= add_f32_rows(w, T("ffn_gate_exps.bias"), c.ff_exp, c.experts, 0.0f, 0.5f);
            bad |= add_f32_rows(w, T("ffn_up_exps.bias"), c.ff_exp, c.experts, 0.0f, 0.5f);
            bad |= add_f32_rows(w, T("ffn_down_exps.bias"), c.embd, c.experts, 0.0f, 0.1f);
            continue;
        }
        bad |= add_matrix(w, T("attn_q.weight"), type, c.embd, qd);
        bad |= add_matrix(w, T("attn_k.weight"), type, c.embd, kd);
        /* llama.cpp's Q4_K_M gives attn_v and ffn_down Q6_K in the first
         * and last eighth of the layers and every third one between
         * (use_more_bits), Q4_K elsewhere */
        const int      e = c.layers / 8;
        const bool     more = l < e || l >= 7 * c.layers / 8 || (l - e) % 3 == 2;
        const uint32_t t_vd = more ? t_big : type;
        bad |= add_matrix(w, T("attn_v.weight"), t_vd, c.embd, kd);
        bad |= add_matrix(w, T("attn_output.weight"), type, qd, c.embd);
        if (qwen) {
            bad |= add_vector(w, T("attn_q.bias"), qd, 0.0f, 0.1f);
            bad |= add_vector(w, T("attn_k.bias"), kd, 0.0f, 0.1f);
            bad |= add_vector(w, T("attn_v.bias"), kd, 0.0f, 0.1f);
        }
        if (gemma || qwen3) {
            bad |= add_vector(w, T("attn_q_norm.weight"), c.head_dim, 1.0f, 0.1f);
            bad |= add_vector(w, T("attn_k_norm.weight"), c.head_dim, 1.0f, 0.1f);
        }
        if (gemma) {
            bad |= add_vector(w, T("post_attention_norm.weight"), c.embd, 1.0f, 0.1f);
            bad |= add_vector(w, T("post_ffw_norm.weight"), c.embd, 1.0f, 0.1f);
        }
        bad |= add_vector(w, T("ffn_norm.weight"), c.embd, 1.0f, 0.1f);
        if (moe) {
            bad |= add_matrix(w, T("ffn_gate_inp.weight"), AG_TYPE_F32, c.embd, c.experts);
            bad |= add_matrices(w, T("ffn_gate_exps.weight"), type, c.embd, c.ff_exp, c.experts);
            bad |= add_matrices(w, T("ffn_up_exps.weight"), type, c.embd, c.ff_exp, c.experts);
            bad |= add_matrices(w, T("ffn_down_exps.weight"), t_vd, c.ff_exp, c.embd, c.experts);
        } else {
            bad |= add_matrix(w, T("ffn_gate.weight"), type, c.embd, c.ff);
            bad |= add_matrix(w, T("ffn_up.weight"), type, c.embd, c.ff);
            bad |= add_matrix(w, T("ffn_down.weight"), t_vd, c.ff, c.embd);
        }
#undef T
    }
    if (!bad && ag_gguf_writer_write(w, argv[1]) != AG_OK) {
        fprintf(stderr, "gen_model: %s: %s\n", argv[1], ag_error_message());
        bad = 1;
    }
    ag_gguf_writer_free(w);
    if (!bad) fprintf(stderr, "gen_model: wrote %s (%s, %d layers, %s)\n", argv[1], c.name, c.layers, ag_tensor_type_name(type));
    return bad;
}
