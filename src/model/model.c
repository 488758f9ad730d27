/* Model loading: configuration from GGUF metadata, tensor binding with shape
 * checks, and the shared decoder forward pass. Architecture differences are
 * data (ag_model_config flags and optional tensors), set in arch_config(). */
#include "model/model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/hash.h"
#include "base/log.h"
#include "base/switches.h"
#include "kv/kv.h"
#include "kv/state.h"
#include "model/safetensors.h"
#include "model/tp.h"

struct ag_model {
    ag_gguf         *gguf;
    ag_model_config  cfg;
    ag_tensor        tok_embd, output_norm, output;
    ag_tensor        type_embd, tok_norm, tok_norm_b; /* encoders: token-type rows, the embeddings' LayerNorm */
    ag_tensor        dense[2]; /* decoder-style encoders: the Dense projections after pooling (may be absent) */
    ag_kv           *enc_kv;      /* encoders: ag_model_embed's KV, grown to the largest call */
    int              enc_kv_tokens, enc_kv_seqs;
    ag_layer_weights layers[AG_MAX_LAYERS];
    int32_t          kv_window[AG_MAX_LAYERS]; /* the KV's per-layer sliding windows (kv.h layer_window) */
    bool             kv_ring;                  /* windowed layers' KV in a ring (off: AUGUR_KV_RING=0) */
    ag_backend      *be;
    ag_tp           *tp;        /* --tp N > 1: the shards that run the embedding, layers and head (tp.c) */
    void            *act;       /* activations of one forward pass, in backend memory */
    size_t           act_bytes; /* its size (grown on demand) */
    uint64_t         weight_bytes;
    /* ag_model_set_output_rows: logits of ids >= output_rows are not
     * computed (-inf); n_vocab when all are */
    int              output_rows;
    float           *extra_out;     /* [extra_out_cap] ag_batch.head_extra's logits before they are placed */
    size_t           extra_out_cap; /* floats */
    char             path[512];
    /* YaRN (cfg.rope_yarn): each pair's frequency and the magnitude scale,
     * [0] for global layers, [1] for sliding-window ones */
    float            yarn_freq[2][512];
    float            yarn_mscale[2];
    bool             argmax_off; /* AUGUR_ARGMAX=0 (A/B, tests): rows' argmax never computed by the backend */
    bool             pick_off;   /* AUGUR_PICK=0 (A/B, tests): picked tokens never computed by the backend */
    bool             cands_off;  /* AUGUR_CANDS=0 (A/B, tests): no AG_WANT_CANDS rows (callers sample rows) */
    /* the last pass's output rows, for ag_model_output_row: in the caller's
     * array, or (candidates computed on a device) still in the device's */
    const float     *last_host_rows;
    const float     *last_dev_rows;
    int              last_n_out;
    /* AUGUR_POISON_ROWS=1 (tests, CPU): after each pass the caller's rows
     * that a device would not copy back (their token or candidates were
     * computed) are overwritten with NaN, as a device leaves them unwritten;
     * ag_model_output_row serves them from poison_saved, as a device's
     * fetch does. A caller that reads such a row without fetching it then
     * reads NaN, which the CPU alone would hide. */
    bool             poison_rows;
    float           *poison_saved;
    size_t           poison_cap; /* floats */
};

ag_model_params ag_model_default_params(void) {
    ag_model_params p;
    p.cpu = ag_cpu_default_params();
    p.device = AG_DEVICE_AUTO;
    p.decode_rows_hint = 0;
    p.tp = 0;
    return p;
}

/* ---- metadata helpers ---- */

static bool get_int(const ag_gguf *g, const char *arch, const char *suffix, int *out) {
    char key[160];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    int64_t v;
    if (!ag_gguf_get_i64(g, key, &v) || v < 0 || v > (1 << 30)) return false;
    *out = (int)v;
    return true;
}

static bool get_float(const ag_gguf *g, const char *arch, const char *suffix, float *out) {
    char key[160];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    return ag_gguf_get_f32(g, key, out);
}

static ag_status need_int(const ag_gguf *g, const char *arch, const char *suffix, int *out, int min) {
    if (!get_int(g, arch, suffix, out))
        return ag_errorf(AG_ERR_FORMAT, "missing or invalid metadata %s.%s", arch, suffix);
    if (*out < min) return ag_errorf(AG_ERR_FORMAT, "metadata %s.%s = %d is out of range", arch, suffix, *out);
    return AG_OK;
}

/* ---- architectures ---- */

/* What sets an architecture apart, as data: adding a family is one entry
 * of k_archs (plus any op it needs that the backends lack). */
typedef struct {
    const char *name; /* general.architecture */
    ag_arch     arch;
    bool        rope_neox;  /* else adjacent pairs (llama) */
    bool        qkv_bias;   /* attn_{q,k,v}.bias required */
    bool        qk_norm;    /* attn_{q,k}_norm required: RMSNorm of each q and k head */
    bool        post_norms; /* post_attention_norm and post_ffw_norm required (gemma3) */
    bool        moe;        /* routed experts (ffn_*_exps) instead of the dense feed-forward */
    bool        encoder;    /* an embedding model (BERT-like: post-LayerNorms, fused QKV, no logits) */
    bool        out_bias;   /* attn_output.bias required */
    bool        sinks;      /* attn_sinks required: one softmax logit per head */
    bool        moe_bias;   /* the router's and the experts' biases required */
    bool        hybrid;     /* Mamba-2 layers where head_count_kv is 0 (granitehybrid) */
    const char *ffn_norm;   /* the feed-forward's input norm; NULL: ffn_norm.weight */
    /* Reads the family's own hyper-parameters after the common ones; NULL: none. */
    ag_status (*config)(const ag_gguf *g, ag_model_config *c);
} arch_desc;

static ag_status gemma3_config(const ag_gguf *g, ag_model_config *c) {
    c->gelu = true;
    c->embd_scale = sqrtf((float)c->n_embd);
    if (!get_float(g, c->arch_name, "rope.freq_base_swa", &c->rope_base_swa)) c->rope_base_swa = 10000.0f;
    if (!get_int(g, c->arch_name, "attention.sliding_window", &c->sliding_window)) c->sliding_window = 0;
    /* Gemma 3: five sliding-window layers, then one global layer. */
    for (int l = 0; l < c->n_layer; l++) c->layer_swa[l] = c->sliding_window > 0 && (l % 6) < 5;
    return AG_OK;
}

/* The experts' counts and width, under llama.cpp's keys. */
static ag_status moe_counts(const ag_gguf *g, ag_model_config *c) {
    const char *a = c->arch_name;
    ag_status   st;
    if ((st = need_int(g, a, "expert_count", &c->n_expert, 1))) return st;
    if ((st = need_int(g, a, "expert_used_count", &c->n_expert_used, 1))) return st;
    if (c->n_expert_used > c->n_expert || c->n_expert > AG_MAX_EXPERTS)
        return ag_errorf(AG_ERR_UNSUPPORTED, "%d of %d experts used: at most %d experts, and no more used than there are",
                         c->n_expert_used, c->n_expert, AG_MAX_EXPERTS);
    /* as llama.cpp: without the key an expert is n_ff / n_used wide */
    if (!get_int(g, a, "expert_feed_forward_length", &c->n_ff_exp)) c->n_ff_exp = c->n_ff / c->n_expert_used;
    if (c->n_ff_exp < 1) return ag_errorf(AG_ERR_FORMAT, "%s.expert_feed_forward_length is 0", a);
    c->expert_weights_scale = 1.0f;
    return AG_OK;
}

/* The routed experts' hyper-parameters (Qwen3-MoE), under llama.cpp's keys. */
static ag_status moe_config(const ag_gguf *g, ag_model_config *c) {
    const char *a = c->arch_name;
    ag_status   st;
    if ((st = moe_counts(g, c))) return st;
    /* Gating: softmax over the experts (llama.cpp's only choice for
     * qwen3moe); another function named by the file is refused, not
     * silently replaced. */
    int gating;
    if (get_int(g, a, "expert_gating_func", &gating) && gating != 1)
        return ag_errorf(AG_ERR_UNSUPPORTED, "%s.expert_gating_func = %d: only softmax (1) is supported", a, gating);
    /* Qwen3-MoE renormalises the chosen experts' weights (its config's
     * norm_topk_prob, which llama.cpp assumes for qwen3moe); a file that
     * says otherwise is obeyed. */
    char key[160];
    snprintf(key, sizeof key, "%s.expert_weights_norm", a);
    bool norm;
    c->expert_weights_norm = ag_gguf_get_bool(g, key, &norm) ? norm : true;
    if (!get_float(g, a, "expert_weights_scale", &c->expert_weights_scale) || c->expert_weights_scale == 0.0f)
        c->expert_weights_scale = 1.0f;
    return AG_OK;
}

/* nomic-bert (nomic-embed-text): BERT post-LayerNorm layers with RoPE and
 * SwiGLU; llama.cpp's keys. */
static ag_status encoder_config(const ag_gguf *g, ag_model_config *c) {
    const char *a = c->arch_name;
    c->encoder = true;
    if (!get_float(g, a, "attention.layer_norm_epsilon", &c->norm_eps) || !(c->norm_eps > 0)) c->norm_eps = 1e-12f;
    char key[160];
    snprintf(key, sizeof key, "%s.attention.causal", a);
    bool causal = false;
    if (ag_gguf_get_bool(g, key, &causal) && causal)
        return ag_errorf(AG_ERR_UNSUPPORTED, "%s: a causal encoder (attention.causal = true) is not supported", a);
    c->bidirectional = true;
    if (!get_int(g, a, "pooling_type", &c->pooling)) c->pooling = AG_POOL_MEAN;
    if (c->pooling != AG_POOL_MEAN && c->pooling != AG_POOL_CLS && c->pooling != AG_POOL_LAST)
        return ag_errorf(AG_ERR_UNSUPPORTED, "%s.pooling_type = %d: only mean (1), cls (2) and last (3) are supported",
                         a, c->pooling);
    return AG_OK;
}

/* EmbeddingGemma: Gemma 3 layers with bidirectional attention, pooled
 * (then Dense projections, dense_2 and dense_3), an embedding model. */
static ag_status gemma_embd_config(const ag_gguf *g, ag_model_config *c) {
    ag_status st = gemma3_config(g, c);
    if (st) return st;
    /* The file's window (512) is the whole span of a two-sided window: a
     * token sees 256 positions each side, |p - pos| <= 256, as transformers
     * (sliding_window // 2 + 1, exclusive, when bidirectional) and llama.cpp
     * (symmetric SWA, n_swa / 2) have it; the attention op's bidirectional
     * window is exclusive. */
    if (c->sliding_window > 0) c->sliding_window = c->sliding_window / 2 + 1;
    return encoder_config(g, c);
}

/* gpt-oss (llama.cpp's LLM_ARCH_OPENAI_MOE): routed experts chosen by
 * their largest router logits and weighted by the softmax of those alone
 * (llama.cpp's SOFTMAX_WEIGHT gating, no renormalisation), each a clamped
 * SwiGLU (alpha 1.702, limit 7, llama.cpp's constants); a sliding window
 * on layers l % period < period - 1 (the period 2 unless the file says:
 * the even layers); both kinds of layer rotate with the file's (YaRN)
 * scaling. */
static ag_status gptoss_config(const ag_gguf *g, ag_model_config *c) {
    const char *a = c->arch_name;
    ag_status   st;
    if ((st = moe_counts(g, c))) return st;
    c->expert_gating = AG_MOE_GATE_TOPK_SOFTMAX;
    c->expert_act = AG_MOE_ACT_SWIGLU_OAI;
    c->expert_alpha = 1.702f;
    c->expert_limit = 7.0f;
    c->expert_weights_norm = false;
    c->attn_sinks = true;
    if ((st = need_int(g, a, "attention.sliding_window", &c->sliding_window, 1))) return st;
    int period = 2;
    char key[160];
    snprintf(key, sizeof key, "%s.attention.sliding_window_pattern", a);
    if (ag_gguf_find_key(g, key) >= 0 && !get_int(g, a, "attention.sliding_window_pattern", &period))
        return ag_errorf(AG_ERR_UNSUPPORTED, "%s: a per-layer array is not supported, only a period", key);
    for (int l = 0; l < c->n_layer; l++) c->layer_swa[l] = period == 0 || l % period < period - 1;
    if (!get_float(g, a, "rope.freq_base_swa", &c->rope_base_swa)) c->rope_base_swa = c->rope_base;
    c->rope_freq_scale_swa = c->rope_freq_scale;
    return AG_OK;
}

/* granitehybrid (IBM Granite 4.0-H), as llama.cpp reads it: the Mamba-2
 * sizes (ssm.*: time_step_rank is the heads' count), head_count_kv per
 * layer (0: a Mamba-2 layer), Granite's multipliers (embedding_scale,
 * residual_scale, attention.scale, logit_scale, each optional), and RoPE
 * only where rope.scaling.finetuned says so (default true; Granite 4.0-H
 * files say false: attention without positions). */
static ag_status granite_hybrid_config(const ag_gguf *g, ag_model_config *c) {
    const char *a = c->arch_name;
    ag_status   st;
    if ((st = need_int(g, a, "ssm.conv_kernel", &c->ssm_d_conv, 1))) return st;
    if ((st = need_int(g, a, "ssm.inner_size", &c->ssm_d_inner, 1))) return st;
    if ((st = need_int(g, a, "ssm.state_size", &c->ssm_d_state, 1))) return st;
    if ((st = need_int(g, a, "ssm.time_step_rank", &c->ssm_n_head, 1))) return st;
    if ((st = need_int(g, a, "ssm.group_count", &c->ssm_n_group, 1))) return st;
    if (c->ssm_d_inner % c->ssm_n_head || c->ssm_n_head % c->ssm_n_group || c->ssm_d_conv > 64)
        return ag_errorf(AG_ERR_FORMAT, "%s: ssm inner size %d, %d heads, %d groups, conv %d do not fit", a,
                         c->ssm_d_inner, c->ssm_n_head, c->ssm_n_group, c->ssm_d_conv);
    char key[160];
    snprintf(key, sizeof key, "%s.attention.head_count_kv", a);
    const ag_gguf_value *kv = ag_gguf_get(g, key);
    int n_kv = 0, n_attn = 0;
    for (int l = 0; l < c->n_layer; l++) {
        int64_t v = -1;
        if (!kv) v = c->n_head;
        else if (kv->type == AG_GGUF_ARRAY) {
            if (kv->arr.n != (uint64_t)c->n_layer || !ag_gguf_arr_i64(kv, (uint64_t)l, &v))
                return ag_errorf(AG_ERR_FORMAT, "%s has %llu entries, not %d numbers", key,
                                 (unsigned long long)kv->arr.n, c->n_layer);
        } else if (!ag_gguf_get_i64(g, key, &v)) return ag_errorf(AG_ERR_FORMAT, "%s is not a number", key);
        if (v < 0 || v > c->n_head || (v > 0 && c->n_head % v))
            return ag_errorf(AG_ERR_FORMAT, "%s[%d] = %lld", key, l, (long long)v);
        if (v > 0 && n_kv && v != n_kv)
            return ag_errorf(AG_ERR_UNSUPPORTED, "%s: attention layers with %d and %lld KV heads", key, n_kv,
                             (long long)v);
        if (v > 0) n_kv = (int)v;
        c->layer_recurrent[l] = v == 0;
        c->kv_layer[l] = (int16_t)(v == 0 ? -1 : n_attn);
        n_attn += v > 0;
        c->n_recurrent += v == 0;
    }
    if (n_attn == 0)
        return ag_errorf(AG_ERR_UNSUPPORTED, "%s: no attention layer (a pure Mamba-2 model is not supported)", a);
    c->n_head_kv = n_kv;
    float f;
    if (get_float(g, a, "embedding_scale", &f) && f != 0.0f) c->embd_scale = f;
    if (get_float(g, a, "attention.scale", &f) && f != 0.0f) c->attn_scale = f;
    c->residual_scale = get_float(g, a, "residual_scale", &f) && f != 0.0f ? f : 1.0f;
    c->logit_scale = get_float(g, a, "logit_scale", &f) && f != 0.0f ? f : 1.0f;
    snprintf(key, sizeof key, "%s.rope.scaling.finetuned", a);
    bool rope = true;
    if (ag_gguf_get_bool(g, key, &rope)) c->no_rope = !rope;
    return AG_OK;
}

static const arch_desc k_archs[] = {
    {"llama", AG_ARCH_LLAMA, .rope_neox = false},
    {"qwen2", AG_ARCH_QWEN2, .rope_neox = true, .qkv_bias = true},
    {"qwen3", AG_ARCH_QWEN3, .rope_neox = true, .qk_norm = true},
    {"qwen3moe", AG_ARCH_QWEN3MOE, .rope_neox = true, .qk_norm = true, .moe = true, .config = moe_config},
    {"gemma3", AG_ARCH_GEMMA3, .rope_neox = true, .qk_norm = true, .post_norms = true, .config = gemma3_config},
    {"nomic-bert", AG_ARCH_NOMIC_BERT, .rope_neox = true, .encoder = true, .config = encoder_config},
    {"gpt-oss", AG_ARCH_GPT_OSS, .rope_neox = true, .qkv_bias = true, .moe = true, .out_bias = true, .sinks = true,
     .moe_bias = true, .ffn_norm = "post_attention_norm.weight", .config = gptoss_config},
    {"gemma-embedding", AG_ARCH_GEMMA_EMBD, .rope_neox = true, .qk_norm = true, .post_norms = true,
     .config = gemma_embd_config},
    {"granitehybrid", AG_ARCH_GRANITE_HYBRID, .rope_neox = false, .hybrid = true, .config = granite_hybrid_config},
};

static const arch_desc *arch_of(ag_arch a) {
    for (size_t i = 0; i < sizeof k_archs / sizeof k_archs[0]; i++)
        if (k_archs[i].arch == a) return &k_archs[i];
    return NULL;
}

static ag_status read_config(const ag_gguf *g, ag_model_config *c) {
    memset(c, 0, sizeof *c);
    uint64_t len;
    const char *arch = ag_gguf_get_str(g, "general.architecture", &len);
    if (!arch) return ag_errorf(AG_ERR_FORMAT, "missing general.architecture");
    if (len >= sizeof c->arch_name) len = sizeof c->arch_name - 1;
    memcpy(c->arch_name, arch, len);
    c->arch_name[len] = '\0';
    const char      *a = c->arch_name;
    const arch_desc *d = NULL;
    char             names[128] = "";
    for (size_t i = 0; i < sizeof k_archs / sizeof k_archs[0]; i++) {
        if (!strcmp(a, k_archs[i].name)) d = &k_archs[i];
        snprintf(names + strlen(names), sizeof names - strlen(names), "%s%s", i ? ", " : "", k_archs[i].name);
    }
    if (!d) return ag_errorf(AG_ERR_UNSUPPORTED, "unsupported architecture '%s' (supported: %s)", a, names);
    c->arch = d->arch;

    ag_status st;
    if ((st = need_int(g, a, "embedding_length", &c->n_embd, 1))) return st;
    if ((st = need_int(g, a, "block_count", &c->n_layer, 1))) return st;
    if (d->moe && !get_int(g, a, "feed_forward_length", &c->n_ff)) c->n_ff = 0; /* (a MoE file may have none) */
    else if ((st = need_int(g, a, "feed_forward_length", &c->n_ff, 1))) return st;
    if ((st = need_int(g, a, "attention.head_count", &c->n_head, 1))) return st;
    if (c->n_layer > AG_MAX_LAYERS)
        return ag_errorf(AG_ERR_UNSUPPORTED, "%d layers; at most %d are supported", c->n_layer, AG_MAX_LAYERS);
    if (!get_int(g, a, "attention.head_count_kv", &c->n_head_kv)) c->n_head_kv = c->n_head;
    if (c->n_head_kv < 1 || c->n_head % c->n_head_kv)
        return ag_errorf(AG_ERR_FORMAT, "head_count %d is not a multiple of head_count_kv %d", c->n_head, c->n_head_kv);
    if (!get_int(g, a, "context_length", &c->n_ctx_train) || c->n_ctx_train < 1) c->n_ctx_train = 2048;
    if (!get_int(g, a, "attention.key_length", &c->head_dim_k)) {
        if (c->n_embd % c->n_head) return ag_errorf(AG_ERR_FORMAT, "embedding_length not a multiple of head_count");
        c->head_dim_k = c->n_embd / c->n_head;
    }
    if (!get_int(g, a, "attention.value_length", &c->head_dim_v)) c->head_dim_v = c->head_dim_k;
    if (c->head_dim_k < 2 || c->head_dim_k > 1024 || c->head_dim_v < 1 || c->head_dim_v > 1024)
        return ag_errorf(AG_ERR_UNSUPPORTED, "head dimension %d/%d out of range", c->head_dim_k, c->head_dim_v);
    if (!get_int(g, a, "rope.dimension_count", &c->rope_dim)) c->rope_dim = c->head_dim_k;
    if (c->rope_dim > c->head_dim_k || c->rope_dim % 2)
        return ag_errorf(AG_ERR_FORMAT, "rope.dimension_count %d invalid for head dim %d", c->rope_dim, c->head_dim_k);
    if (!get_float(g, a, "rope.freq_base", &c->rope_base)) c->rope_base = 10000.0f;
    c->rope_base_swa = c->rope_base;
    c->rope_freq_scale = 1.0f;
    float factor;
    char key[160];
    snprintf(key, sizeof key, "%s.rope.scaling.type", a);
    uint64_t tlen;
    const char *stype = ag_gguf_get_str(g, key, &tlen);
    const bool  yarn = stype && tlen == 4 && !memcmp(stype, "yarn", 4);
    if (get_float(g, a, "rope.scaling.factor", &factor) && factor > 0 && factor != 1.0f) {
        if (stype && !yarn && !(tlen == 6 && !memcmp(stype, "linear", 6)) && !(tlen == 4 && !memcmp(stype, "none", 4)))
            return ag_errorf(AG_ERR_UNSUPPORTED, "rope scaling type '%.*s' is not supported", (int)tlen, stype);
        c->rope_freq_scale = 1.0f / factor;
        c->rope_yarn = yarn;
    }
    if (c->rope_yarn) { /* llama.cpp's defaults: ext_factor 1, beta_fast 32, beta_slow 1 */
        /* the magnitude overrides llama.cpp reads for other YaRN models are not done here */
        static const char *const unsupported[] = {"rope.scaling.attn_factor", "rope.scaling.yarn_log_multiplier",
                                                  "rope.scaling.yarn_attn_factor"};
        for (size_t i = 0; i < sizeof unsupported / sizeof unsupported[0]; i++) {
            snprintf(key, sizeof key, "%s.%s", a, unsupported[i]);
            if (ag_gguf_find_key(g, key) >= 0) return ag_errorf(AG_ERR_UNSUPPORTED, "YaRN with %s is not supported", key);
        }
        if (!get_int(g, a, "rope.scaling.original_context_length", &c->yarn_orig_ctx) || c->yarn_orig_ctx < 1)
            c->yarn_orig_ctx = c->n_ctx_train;
        if (!get_float(g, a, "rope.scaling.yarn_ext_factor", &c->yarn_ext_factor) || c->yarn_ext_factor < 0)
            c->yarn_ext_factor = 1.0f;
        if (!get_float(g, a, "rope.scaling.yarn_beta_fast", &c->yarn_beta_fast)) c->yarn_beta_fast = 32.0f;
        if (!get_float(g, a, "rope.scaling.yarn_beta_slow", &c->yarn_beta_slow)) c->yarn_beta_slow = 1.0f;
    }
    c->rope_freq_scale_swa = 1.0f; /* (an architecture's config may say otherwise) */
    if (!get_float(g, a, "attention.layer_norm_rms_epsilon", &c->rms_eps)) c->rms_eps = 1e-5f;
    c->embd_scale = 1.0f;
    c->attn_scale = 1.0f / sqrtf((float)c->head_dim_k);
    c->rope_neox = d->rope_neox;
    c->residual_scale = c->logit_scale = 1.0f;
    return d->config ? d->config(g, c) : AG_OK;
}

/* ---- tensor binding ---- */

/* Binds tensor `name` of shape [ne0, ne1, ne2] (ne1, ne2 0: 1) to *t, or
 * leaves *t empty when it is missing and not required. */
static ag_status bind3(ag_model *m, ag_tensor *t, const char *name, int64_t ne0, int64_t ne1, int64_t ne2,
                       bool required) {
    memset(t, 0, sizeof *t);
    const ag_gguf_tensor *gt = ag_gguf_find_tensor(m->gguf, name);
    if (!gt) {
        if (required) return ag_errorf(AG_ERR_FORMAT, "missing tensor '%s'", name);
        return AG_OK;
    }
    int64_t want1 = ne1 ? ne1 : 1, want2 = ne2 ? ne2 : 1;
    if ((int64_t)gt->ne[0] != ne0 || (int64_t)gt->ne[1] != want1 || (int64_t)gt->ne[2] != want2 || gt->ne[3] != 1)
        return ag_errorf(AG_ERR_FORMAT, "tensor '%s' has shape [%llu, %llu, %llu, %llu], expected [%lld, %lld, %lld]",
                         name, (unsigned long long)gt->ne[0], (unsigned long long)gt->ne[1],
                         (unsigned long long)gt->ne[2], (unsigned long long)gt->ne[3], (long long)ne0,
                         (long long)want1, (long long)want2);
    uint32_t be, bb;
    if (!ag_tensor_type_layout(gt->type, &be, &bb) || ne0 % be)
        return ag_errorf(AG_ERR_UNSUPPORTED, "tensor '%s': type %s unsupported here", name,
                         ag_tensor_type_name(gt->type));
    t->name = gt->name;
    t->type = gt->type;
    t->ne[0] = ne0;
    t->ne[1] = want1;
    t->ne[2] = want2;
    t->ne[3] = 1;
    t->row_bytes = (size_t)(ne0 / be) * bb;
    t->data = gt->data;
    t->host = gt->data;
    return AG_OK;
}

static ag_status bind(ag_model *m, ag_tensor *t, const char *name, int64_t ne0, int64_t ne1, bool required) {
    return bind3(m, t, name, ne0, ne1, 1, required);
}

/* Rows [r0, r0 + nr) of a matrix, as a matrix of its own (the same bytes). */
static ag_tensor row_view(const ag_tensor *t, int64_t r0, int64_t nr) {
    ag_tensor v = *t;
    v.ne[1] = nr;
    v.data = (const char *)t->data + (size_t)r0 * t->row_bytes;
    v.host = (const char *)t->host + (size_t)r0 * t->row_bytes;
    return v;
}

/* An encoder layer (nomic-bert): fused QKV (Q, K, V rows in that order, as
 * llama.cpp splits it), attention output, its post-LayerNorm, the SwiGLU
 * feed-forward, the layer's output LayerNorm. */
static ag_status bind_encoder_layer(ag_model *m, int l) {
    const ag_model_config *c = &m->cfg;
    ag_layer_weights      *w = &m->layers[l];
    const int64_t qd = (int64_t)c->n_head * c->head_dim_k, kd = (int64_t)c->n_head_kv * c->head_dim_k,
                  vd = (int64_t)c->n_head_kv * c->head_dim_v, od = (int64_t)c->n_head * c->head_dim_v;
    char      n[96];
    ag_status st;
#define B(field, suffix, a, b)                                      \
    do {                                                            \
        snprintf(n, sizeof n, "blk.%d.%s", l, suffix);              \
        if ((st = bind3(m, &w->field, n, a, b, 1, true))) return st; \
    } while (0)
    B(wqkv, "attn_qkv.weight", c->n_embd, qd + kd + vd);
    B(wo, "attn_output.weight", od, c->n_embd);
    B(attn_out_norm, "attn_output_norm.weight", c->n_embd, 0);
    B(attn_out_norm_b, "attn_output_norm.bias", c->n_embd, 0);
    B(ffn_gate, "ffn_gate.weight", c->n_embd, c->n_ff);
    B(ffn_up, "ffn_up.weight", c->n_embd, c->n_ff);
    B(ffn_down, "ffn_down.weight", c->n_ff, c->n_embd);
    B(layer_out_norm, "layer_output_norm.weight", c->n_embd, 0);
    B(layer_out_norm_b, "layer_output_norm.bias", c->n_embd, 0);
#undef B
    w->wq = row_view(&w->wqkv, 0, qd);
    w->wk = row_view(&w->wqkv, qd, kd);
    w->wv = row_view(&w->wqkv, qd + kd, vd);
    const ag_tensor *f32[] = {&w->attn_out_norm, &w->attn_out_norm_b, &w->layer_out_norm, &w->layer_out_norm_b};
    for (size_t i = 0; i < sizeof f32 / sizeof f32[0]; i++)
        if (f32[i]->type != AG_TYPE_F32)
            return ag_errorf(AG_ERR_UNSUPPORTED, "tensor '%s' must be F32, is %s", f32[i]->name,
                             ag_tensor_type_name(f32[i]->type));
    const ag_tensor *mats[] = {&w->wqkv, &w->wo, &w->ffn_gate, &w->ffn_up, &w->ffn_down};
    for (size_t i = 0; i < sizeof mats / sizeof mats[0]; i++)
        m->weight_bytes += mats[i]->row_bytes * (uint64_t)mats[i]->ne[1];
    return AG_OK;
}

/* A Mamba-2 layer of a hybrid model: its input norm, the mixer's tensors
 * (llama.cpp's names and shapes: ssm_a and ssm_d without a .weight
 * suffix, [1][n_head]), then the dense feed-forward as any layer. */
static ag_status bind_mamba_layer(ag_model *m, int l) {
    const ag_model_config *c = &m->cfg;
    ag_layer_weights      *w = &m->layers[l];
    const int64_t di = c->ssm_d_inner, ng = c->ssm_n_group, ds = c->ssm_d_state, nh = c->ssm_n_head;
    const int64_t conv_ch = di + 2 * ng * ds, proj = 2 * di + 2 * ng * ds + nh;
    char      n[96];
    ag_status st;
#define B(field, suffix, a, b)                                      \
    do {                                                            \
        snprintf(n, sizeof n, "blk.%d.%s", l, suffix);              \
        if ((st = bind3(m, &w->field, n, a, b, 1, true))) return st; \
    } while (0)
    B(attn_norm, "attn_norm.weight", c->n_embd, 0);
    B(ssm_in, "ssm_in.weight", c->n_embd, proj);
    B(ssm_conv1d, "ssm_conv1d.weight", c->ssm_d_conv, conv_ch);
    B(ssm_conv1d_b, "ssm_conv1d.bias", conv_ch, 0);
    B(ssm_dt_b, "ssm_dt.bias", nh, 0);
    B(ssm_a, "ssm_a", 1, nh);
    B(ssm_d, "ssm_d", 1, nh);
    B(ssm_norm, "ssm_norm.weight", di / ng, ng);
    B(ssm_out, "ssm_out.weight", di, c->n_embd);
    B(ffn_norm, "ffn_norm.weight", c->n_embd, 0);
    B(ffn_gate, "ffn_gate.weight", c->n_embd, c->n_ff);
    B(ffn_up, "ffn_up.weight", c->n_embd, c->n_ff);
    B(ffn_down, "ffn_down.weight", c->n_ff, c->n_embd);
#undef B
    const ag_tensor *f32[] = {&w->attn_norm, &w->ssm_conv1d, &w->ssm_conv1d_b, &w->ssm_dt_b, &w->ssm_a,
                              &w->ssm_d,     &w->ssm_norm,   &w->ffn_norm};
    for (size_t i = 0; i < sizeof f32 / sizeof f32[0]; i++)
        if (f32[i]->type != AG_TYPE_F32)
            return ag_errorf(AG_ERR_UNSUPPORTED, "tensor '%s' must be F32, is %s", f32[i]->name,
                             ag_tensor_type_name(f32[i]->type));
    const ag_tensor *mats[] = {&w->ssm_in, &w->ssm_out, &w->ffn_gate, &w->ffn_up, &w->ffn_down};
    for (size_t i = 0; i < sizeof mats / sizeof mats[0]; i++)
        m->weight_bytes += mats[i]->row_bytes * (uint64_t)mats[i]->ne[1];
    return AG_OK;
}

/* A decoder-style encoder's optional Dense projections after pooling:
 * dense_2 (n_embd -> d) then dense_3 (d -> n_embd), run on the host. */
static ag_status bind_dense(ag_model *m) {
    const ag_gguf_tensor *d2 = ag_gguf_find_tensor(m->gguf, "dense_2.weight");
    const ag_gguf_tensor *d3 = ag_gguf_find_tensor(m->gguf, "dense_3.weight");
    if (!d2 && !d3) return AG_OK;
    if (!d2 || !d3) return ag_errorf(AG_ERR_FORMAT, "dense_2.weight and dense_3.weight come together");
    ag_status st = bind(m, &m->dense[0], "dense_2.weight", m->cfg.n_embd, (int64_t)d2->ne[1], true);
    if (!st) st = bind(m, &m->dense[1], "dense_3.weight", (int64_t)d2->ne[1], m->cfg.n_embd, true);
    for (int i = 0; !st && i < 2; i++)
        if (m->dense[i].type != AG_TYPE_F32 && m->dense[i].type != AG_TYPE_F16 && m->dense[i].type != AG_TYPE_BF16)
            st = ag_errorf(AG_ERR_UNSUPPORTED, "tensor '%s' must be F32, F16 or BF16", m->dense[i].name);
    return st;
}

static ag_status bind_layer(ag_model *m, int l) {
    const ag_model_config *c = &m->cfg;
    const arch_desc       *d = arch_of(c->arch);
    ag_layer_weights *w = &m->layers[l];
    int64_t qd = (int64_t)c->n_head * c->head_dim_k, kd = (int64_t)c->n_head_kv * c->head_dim_k,
            vd = (int64_t)c->n_head_kv * c->head_dim_v, od = (int64_t)c->n_head * c->head_dim_v;
    char n[96];
    ag_status st;
#define B3(field, suffix, a, b, e, req)                              \
    do {                                                             \
        snprintf(n, sizeof n, "blk.%d.%s", l, suffix);               \
        if ((st = bind3(m, &w->field, n, a, b, e, req))) return st;  \
    } while (0)
#define B(field, suffix, a, b, req) B3(field, suffix, a, b, 1, req)
    if (d->encoder) return bind_encoder_layer(m, l);
    if (d->hybrid && c->layer_recurrent[l]) return bind_mamba_layer(m, l);
    B(attn_norm, "attn_norm.weight", c->n_embd, 0, true);
    B(wq, "attn_q.weight", c->n_embd, qd, true);
    B(wk, "attn_k.weight", c->n_embd, kd, true);
    B(wv, "attn_v.weight", c->n_embd, vd, true);
    B(wo, "attn_output.weight", od, c->n_embd, true);
    B(bq, "attn_q.bias", qd, 0, d->qkv_bias);
    B(bk, "attn_k.bias", kd, 0, d->qkv_bias);
    B(bv, "attn_v.bias", vd, 0, d->qkv_bias);
    B(q_norm, "attn_q_norm.weight", c->head_dim_k, 0, d->qk_norm);
    B(k_norm, "attn_k_norm.weight", c->head_dim_k, 0, d->qk_norm);
    /* (gpt-oss's post_attention_norm is its feed-forward's input norm, bound below) */
    if (d->post_norms || !d->ffn_norm) B(post_attn_norm, "post_attention_norm.weight", c->n_embd, 0, d->post_norms);
    B(ffn_norm, d->ffn_norm ? d->ffn_norm : "ffn_norm.weight", c->n_embd, 0, true);
    B(bo, "attn_output.bias", c->n_embd, 0, d->out_bias);
    B(attn_sinks, "attn_sinks.weight", c->n_head, 0, d->sinks);
    if (d->moe) {
        B(ffn_gate_inp, "ffn_gate_inp.weight", c->n_embd, c->n_expert, true);
        B3(ffn_gate_exps, "ffn_gate_exps.weight", c->n_embd, c->n_ff_exp, c->n_expert, true);
        B3(ffn_up_exps, "ffn_up_exps.weight", c->n_embd, c->n_ff_exp, c->n_expert, true);
        B3(ffn_down_exps, "ffn_down_exps.weight", c->n_ff_exp, c->n_embd, c->n_expert, true);
        B(ffn_gate_inp_b, "ffn_gate_inp.bias", c->n_expert, 0, d->moe_bias);
        B(ffn_gate_exps_b, "ffn_gate_exps.bias", c->n_ff_exp, c->n_expert, d->moe_bias);
        B(ffn_up_exps_b, "ffn_up_exps.bias", c->n_ff_exp, c->n_expert, d->moe_bias);
        B(ffn_down_exps_b, "ffn_down_exps.bias", c->n_embd, c->n_expert, d->moe_bias);
    } else {
        B(ffn_gate, "ffn_gate.weight", c->n_embd, c->n_ff, true);
        B(ffn_up, "ffn_up.weight", c->n_embd, c->n_ff, true);
        B(ffn_down, "ffn_down.weight", c->n_ff, c->n_embd, true);
    }
    B(post_ffn_norm, "post_ffw_norm.weight", c->n_embd, 0, d->post_norms);
#undef B
#undef B3
    /* Norm gains and biases are read as plain floats. */
    const ag_tensor *f32[] = {&w->attn_norm, &w->bq,           &w->bk,        &w->bv,
                              &w->q_norm,    &w->k_norm,       &w->post_attn_norm, &w->ffn_norm,
                              &w->post_ffn_norm, &w->bo,       &w->attn_sinks, &w->ffn_gate_inp_b,
                              &w->ffn_gate_exps_b, &w->ffn_up_exps_b, &w->ffn_down_exps_b};
    for (size_t i = 0; i < sizeof f32 / sizeof f32[0]; i++)
        if (f32[i]->data && f32[i]->type != AG_TYPE_F32)
            return ag_errorf(AG_ERR_UNSUPPORTED, "tensor '%s' must be F32, is %s", f32[i]->name,
                             ag_tensor_type_name(f32[i]->type));
    const ag_tensor *mats[] = {&w->wq, &w->wk, &w->wv, &w->wo, &w->ffn_gate, &w->ffn_up, &w->ffn_down,
                               &w->ffn_gate_inp};
    for (size_t i = 0; i < sizeof mats / sizeof mats[0]; i++)
        m->weight_bytes += mats[i]->row_bytes * (uint64_t)mats[i]->ne[1];
    /* a decode step reads the experts its token chose: n_used of n_expert */
    const ag_tensor *exps[] = {&w->ffn_gate_exps, &w->ffn_up_exps, &w->ffn_down_exps};
    for (size_t i = 0; d->moe && i < sizeof exps / sizeof exps[0]; i++)
        m->weight_bytes += exps[i]->row_bytes * (uint64_t)exps[i]->ne[1] * (uint64_t)c->n_expert_used;
    return AG_OK;
}

/* Hands every tensor to the backend once (a GPU backend uploads it and
 * repoints data; tied embeddings share one copy). Progress on stderr for a
 * device upload, which takes seconds for a large model. */
static ag_status prepare_weights(ag_model *m) {
    ag_backend *be = m->be;
    if (!be->ops->prepare_weight) return AG_OK;
    ag_tensor *top[] = {&m->tok_embd, &m->output_norm, &m->output, &m->type_embd, &m->tok_norm, &m->tok_norm_b};
    ag_status  st;
    for (size_t i = 0; i < sizeof top / sizeof top[0]; i++)
        if (top[i]->data && (st = be->ops->prepare_weight(be, top[i]))) return st;
    AG_LOGI("%s: uploading %d layers to %s", m->path, m->cfg.n_layer, be->ops->name);
    for (int l = 0; l < m->cfg.n_layer; l++) {
        ag_layer_weights *w = &m->layers[l];
        ag_tensor *all[] = {&w->attn_norm, &w->wq, &w->wk, &w->wv, &w->wo, &w->bq, &w->bk, &w->bv,
                            &w->q_norm, &w->k_norm, &w->post_attn_norm, &w->ffn_norm, &w->ffn_gate,
                            &w->ffn_up, &w->ffn_down, &w->post_ffn_norm, &w->ffn_gate_inp,
                            &w->ffn_gate_exps, &w->ffn_up_exps, &w->ffn_down_exps, &w->attn_out_norm,
                            &w->attn_out_norm_b, &w->layer_out_norm, &w->layer_out_norm_b, &w->bo,
                            &w->attn_sinks, &w->ffn_gate_inp_b, &w->ffn_gate_exps_b, &w->ffn_up_exps_b,
                            &w->ffn_down_exps_b, &w->ssm_in, &w->ssm_conv1d, &w->ssm_conv1d_b, &w->ssm_dt_b,
                            &w->ssm_a, &w->ssm_d, &w->ssm_norm, &w->ssm_out};
        const bool fused = w->wqkv.data != NULL; /* wq, wk, wv are its views: moved with it */
        for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
            if (all[i]->data && !(fused && i >= 1 && i <= 3) && (st = be->ops->prepare_weight(be, all[i]))) return st;
        if (fused) {
            if ((st = be->ops->prepare_weight(be, &w->wqkv))) return st;
            const int64_t qd = w->wq.ne[1], kd = w->wk.ne[1];
            w->wq = row_view(&w->wqkv, 0, qd);
            w->wk = row_view(&w->wqkv, qd, kd);
            w->wv = row_view(&w->wqkv, qd + kd, w->wv.ne[1]);
        }
        if ((l + 1) % 8 == 0 || l + 1 == m->cfg.n_layer) AG_LOGI("  %d/%d layers", l + 1, m->cfg.n_layer);
    }
    return be->ops->sync(be);
}

/* YaRN's per-pair frequencies and magnitude scale, as llama.cpp's rope
 * (ggml_rope_yarn_corr_dims, rope_yarn): pair i of the rope_dim / 2 turns
 * at base^(-2i / rope_dim) times freq_scale (interpolated) or 1
 * (extrapolated), mixed by a ramp that is 1 below the correction dim of
 * beta_fast rotations in the original context, 0 above beta_slow's,
 * linear between (times ext_factor); with ext_factor != 0 the rotated
 * values are scaled by 1 + 0.1 ln(1 / freq_scale). Computed in double
 * (llama.cpp: float); the two differ in the last bits of each frequency. */
static void yarn_freqs(ag_model *m) {
    const ag_model_config *c = &m->cfg;
    const int              nd = c->rope_dim;
    for (int k = 0; k < 2; k++) {
        const double base = k ? c->rope_base_swa : c->rope_base, fs = k ? c->rope_freq_scale_swa : c->rope_freq_scale;
        /* the dim at which a pair turns n_rot times in yarn_orig_ctx positions */
#define CORR_DIM(n_rot) (nd * log(c->yarn_orig_ctx / ((n_rot) * 2 * M_PI)) / (2 * log(base)))
        const double lo = fmax(0.0, floor(CORR_DIM(c->yarn_beta_fast))),
                     hi = fmin(nd - 1.0, ceil(CORR_DIM(c->yarn_beta_slow)));
#undef CORR_DIM
        for (int i = 0; i < nd / 2; i++) {
            const double y = (i - lo) / fmax(0.001, hi - lo), ramp = 1.0 - fmin(1.0, fmax(0.0, y));
            const double mix = ramp * c->yarn_ext_factor, extrap = pow(base, -2.0 * i / nd);
            m->yarn_freq[k][i] = (float)(extrap * (fs * (1.0 - mix) + mix));
        }
        m->yarn_mscale[k] = c->yarn_ext_factor != 0.0f ? (float)(1.0 + 0.1 * log(1.0 / fs)) : 1.0f;
    }
}

ag_status ag_model_load(const char *path, const ag_model_params *p, ag_model **out) {
    *out = NULL;
    ag_model_params defaults = ag_model_default_params();
    if (!p) p = &defaults;
    ag_model *m = calloc(1, sizeof *m);
    if (!m) return ag_errorf(AG_ERR_NOMEM, "out of memory");
    snprintf(m->path, sizeof m->path, "%s", path);
    ag_status st = ag_model_file_open(path, &m->gguf);
    if (st) goto fail_named;
    if ((st = read_config(m->gguf, &m->cfg))) goto fail_named;
    ag_model_config *c = &m->cfg;
    const ag_gguf_tensor *emb = ag_gguf_find_tensor(m->gguf, "token_embd.weight");
    if (!emb) {
        st = ag_errorf(AG_ERR_FORMAT, "missing tensor 'token_embd.weight'");
        goto fail_named;
    }
    c->n_vocab = (int)emb->ne[1];
    if ((st = bind(m, &m->tok_embd, "token_embd.weight", c->n_embd, c->n_vocab, true))) goto fail_named;
    if (arch_of(c->arch)->encoder) { /* no output norm or head; the embeddings' LayerNorm and token types instead */
        if ((st = bind(m, &m->tok_norm, "token_embd_norm.weight", c->n_embd, 0, true))) goto fail_named;
        if ((st = bind(m, &m->tok_norm_b, "token_embd_norm.bias", c->n_embd, 0, true))) goto fail_named;
        const ag_gguf_tensor *tt = ag_gguf_find_tensor(m->gguf, "token_types.weight");
        if (tt && (st = bind(m, &m->type_embd, "token_types.weight", c->n_embd, (int64_t)tt->ne[1], true)))
            goto fail_named;
        const ag_tensor *f32[] = {&m->tok_norm, &m->tok_norm_b, &m->type_embd};
        for (size_t i = 0; i < 3; i++)
            if (f32[i]->data && f32[i]->type != AG_TYPE_F32) {
                st = ag_errorf(AG_ERR_UNSUPPORTED, "tensor '%s' must be F32", f32[i]->name);
                goto fail_named;
            }
    } else if ((st = bind(m, &m->output_norm, "output_norm.weight", c->n_embd, 0, true))) goto fail_named;
    if (!c->encoder && (st = bind(m, &m->output, "output.weight", c->n_embd, c->n_vocab, false))) goto fail_named;
    if (!m->output.data) m->output = m->tok_embd; /* tied embeddings */
    if (!c->encoder && m->output_norm.type != AG_TYPE_F32) {
        st = ag_errorf(AG_ERR_UNSUPPORTED, "output_norm.weight must be F32");
        goto fail_named;
    }
    m->weight_bytes = c->encoder ? 0 : m->output.row_bytes * (uint64_t)c->n_vocab;
    if (c->encoder && !arch_of(c->arch)->encoder && (st = bind_dense(m))) goto fail_named;
    m->output_rows = c->n_vocab;
    for (int l = 0; l < c->n_layer; l++)
        if ((st = bind_layer(m, l))) goto fail_named;
    if ((st = ag_backend_new(p->device, &p->cpu, p->decode_rows_hint, &m->be))) goto fail_named;
    const ag_backend_ops *bop = m->be->ops;
    if ((c->n_expert > 0 && !bop->moe) || (c->encoder && !bop->layernorm) || (c->rope_yarn && !bop->rope_freqs) ||
        (c->attn_sinks && !bop->attn_sinks) || (c->n_recurrent > 0 && !bop->mamba2)) {
        /* a backend without the moe op (or, for an encoder, the layernorm
         * op; YaRN's rope_freqs; attention sinks) cannot run this model:
         * --device auto takes the CPU instead, an explicit device is an
         * error */
        const char *what = c->n_recurrent > 0 && !bop->mamba2 ? "Mamba-2 recurrent layers"
                           : c->encoder                      ? "an embedding model"
                           : c->n_expert > 0 && !bop->moe    ? "routed experts"
                           : c->rope_yarn && !bop->rope_freqs ? "YaRN rotary scaling"
                                                             : "attention sinks";
        if (p->device != AG_DEVICE_AUTO) {
            st = ag_errorf(AG_ERR_UNSUPPORTED, "architecture '%s' (%s) is not supported on the %s backend yet; use --device cpu",
                           c->arch_name, what, m->be->ops->name);
            goto fail_named;
        }
        AG_LOGW("%s: architecture '%s' (%s) is not supported on the %s backend yet; running on the CPU",
                path, c->arch_name, what, m->be->ops->name);
        ag_backend_free(m->be);
        m->be = NULL;
        if ((st = ag_backend_new(AG_DEVICE_CPU, &p->cpu, p->decode_rows_hint, &m->be))) goto fail_named;
    }
    if (c->rope_yarn) yarn_freqs(m);
    for (int l = 0; l < c->n_layer; l++) /* (the KV's layers: a hybrid's attention layers only) */
        if (!c->layer_recurrent[l]) m->kv_window[c->n_recurrent ? c->kv_layer[l] : l] = c->layer_swa[l] ? c->sliding_window : 0;
    m->kv_ring = !ag_switch_off("AUGUR_KV_RING");
    m->argmax_off = ag_switch_off("AUGUR_ARGMAX");
    m->pick_off = ag_switch_off("AUGUR_PICK");
    m->cands_off = ag_switch_off("AUGUR_CANDS");
    m->poison_rows = ag_switch_int("AUGUR_POISON_ROWS", 0, 1, 0) == 1 && m->be->ops->host_memory;
    if ((st = prepare_weights(m))) goto fail_named;
    if (p->tp > 1 && c->n_recurrent > 0) {
        st = ag_errorf(AG_ERR_UNSUPPORTED, "--tp is not supported for recurrent (Mamba-2) layers yet");
        goto fail_named;
    }
    if (p->tp > 1 && (st = ag_tp_new(p->tp, c, m->layers, &m->tok_embd, &m->output, m->be, &m->tp))) goto fail_named;
    *out = m;
    return AG_OK;
fail_named: {
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", ag_error_message());
    st = ag_errorf(st, "%s: %s", path, msg);
}
    ag_model_free(m);
    return st;
}

void ag_model_free(ag_model *m) {
    if (!m) return;
    if (m->be && m->act) m->be->ops->free(m->be, m->act);
    ag_kv_free(m->enc_kv);
    ag_tp_free(m->tp);
    ag_backend_free(m->be);
    ag_gguf_free(m->gguf);
    free(m->poison_saved);
    free(m->extra_out);
    free(m);
}

const ag_model_config *ag_model_config_of(const ag_model *m) { return &m->cfg; }
const ag_gguf         *ag_model_gguf(const ag_model *m) { return m->gguf; }
ag_backend            *ag_model_backend(ag_model *m) { return m->be; }
const ag_tp           *ag_model_tp(const ag_model *m) { return m->tp; }

float *ag_model_host_floats(ag_model *m, size_t n) {
    return n > SIZE_MAX / sizeof(float) ? NULL : ag_kv_mem_host_alloc(ag_model_kv_mem(m), n * sizeof(float));
}
void ag_model_host_free(ag_model *m, float *p) { ag_kv_mem_host_free(ag_model_kv_mem(m), p); }
ag_device ag_model_device(const ag_model *m) { return m->be->ops->host_memory ? AG_DEVICE_CPU : AG_DEVICE_CUDA; }
const struct ag_kv_mem *ag_model_kv_mem(const ag_model *m) { return m->be->ops->kv_mem ? m->be->ops->kv_mem(m->be) : NULL; }
size_t ag_model_head_row_bytes(const ag_model *m) { return m->output.row_bytes; }

ag_status ag_model_head_rows_copy(const ag_model *m, const int32_t *ids, int n, void *dst) {
    const size_t rb = m->output.row_bytes;
    for (int i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= m->cfg.n_vocab)
            return ag_errorf(AG_ERR_INVALID, "head row %d out of range [0, %d)", ids[i], m->cfg.n_vocab);
        memcpy((char *)dst + (size_t)i * rb, (const char *)m->output.host + (size_t)ids[i] * rb, rb);
    }
    return AG_OK;
}

uint64_t ag_model_weight_bytes(const ag_model *m) {
    return m->weight_bytes - m->output.row_bytes * (uint64_t)(m->cfg.n_vocab - m->output_rows);
}

int ag_model_set_output_rows(ag_model *m, int n) {
    const int n_vocab = m->cfg.n_vocab;
    if (n <= 0 || n >= n_vocab || !m->be->ops->host_memory || m->cfg.final_softcap > 0 || m->tp) n = n_vocab;
    m->output_rows = n;
    return n;
}


ag_status ag_model_device_memory(const ag_model *m, uint64_t *free_bytes, uint64_t *total_bytes) {
    *free_bytes = *total_bytes = 0;
    if (!m->be->ops->device_memory) return ag_errorf(AG_ERR_UNSUPPORTED, "%s: no device memory", m->be->ops->name);
    return m->be->ops->device_memory(m->be, free_bytes, total_bytes);
}

void ag_model_gathered_weights(const ag_model *m, uint64_t *table_bytes, size_t *row_bytes) {
    bool tied = m->output.data == m->tok_embd.data;
    *table_bytes = tied ? 0 : m->tok_embd.row_bytes * (uint64_t)m->tok_embd.ne[1];
    *row_bytes = tied ? 0 : m->tok_embd.row_bytes;
}

/* Serialises values in a fixed little-endian form, so the fingerprint does
 * not depend on struct padding. */
typedef struct {
    uint8_t  buf[512];
    size_t   n;
    uint64_t h;
} fp_state;

static void fp_flush(fp_state *s) {
    if (s->n) s->h = ag_hash64_seed(s->buf, s->n, s->h);
    s->n = 0;
}
static void fp_bytes(fp_state *s, const void *p, size_t len) {
    if (len > sizeof s->buf - s->n) {
        fp_flush(s);
        if (len > sizeof s->buf) {
            s->h = ag_hash64_seed(p, len, s->h);
            return;
        }
    }
    memcpy(s->buf + s->n, p, len);
    s->n += len;
}
static void fp_u64(fp_state *s, uint64_t v) {
    uint8_t b[8];
    for (int i = 0; i < 8; i++) b[i] = (uint8_t)(v >> (8 * i));
    fp_bytes(s, b, 8);
}
static void fp_f32(fp_state *s, float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    fp_u64(s, u);
}

uint64_t ag_model_fingerprint(const ag_model *m) {
    fp_state s = {.n = 0, .h = 0x6d6f64656c667031ull}; /* "modelfp1" */
    const ag_model_config *c = &m->cfg;
    fp_bytes(&s, c->arch_name, strlen(c->arch_name) + 1);
    const int ints[] = {c->arch, c->n_vocab, c->n_ctx_train, c->n_embd, c->n_layer, c->n_ff, c->n_head,
                        c->n_head_kv, c->head_dim_k, c->head_dim_v, c->rope_dim, c->rope_neox,
                        c->sliding_window, c->gelu};
    for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++) fp_u64(&s, (uint64_t)(int64_t)ints[i]);
    const float floats[] = {c->rope_base, c->rope_base_swa, c->rope_freq_scale, c->rms_eps,
                            c->embd_scale, c->attn_scale, c->final_softcap};
    for (size_t i = 0; i < sizeof floats / sizeof floats[0]; i++) fp_f32(&s, floats[i]);
    if (c->n_expert > 0) { /* (only then: dense models keep the fingerprints they had) */
        const int moe[] = {c->n_expert, c->n_expert_used, c->n_ff_exp, c->expert_weights_norm};
        for (size_t i = 0; i < sizeof moe / sizeof moe[0]; i++) fp_u64(&s, (uint64_t)(int64_t)moe[i]);
        fp_f32(&s, c->expert_weights_scale);
    }
    if (c->rope_yarn || c->arch == AG_ARCH_GPT_OSS) { /* (only then, likewise) */
        const int more[] = {c->rope_yarn, c->yarn_orig_ctx, c->expert_gating, c->expert_act, c->attn_sinks};
        for (size_t i = 0; i < sizeof more / sizeof more[0]; i++) fp_u64(&s, (uint64_t)(int64_t)more[i]);
        const float fl[] = {c->rope_freq_scale_swa, c->yarn_beta_fast, c->yarn_beta_slow, c->yarn_ext_factor,
                            c->expert_alpha, c->expert_limit};
        for (size_t i = 0; i < sizeof fl / sizeof fl[0]; i++) fp_f32(&s, fl[i]);
    }
    if (c->n_recurrent > 0) { /* (only then, likewise) */
        const int hy[] = {c->n_recurrent, c->ssm_d_conv, c->ssm_d_inner, c->ssm_d_state, c->ssm_n_head,
                          c->ssm_n_group, c->no_rope};
        for (size_t i = 0; i < sizeof hy / sizeof hy[0]; i++) fp_u64(&s, (uint64_t)(int64_t)hy[i]);
        fp_f32(&s, c->residual_scale);
        fp_f32(&s, c->logit_scale);
        fp_bytes(&s, c->layer_recurrent, (size_t)c->n_layer);
    }
    fp_bytes(&s, c->layer_swa, (size_t)c->n_layer);
    if (m->tp) fp_u64(&s, 0x7470000000000000ull | (uint64_t)ag_tp_ranks(m->tp)); /* a --tp N's KV is its own (N > 1 only) */
    int64_t nt = ag_gguf_n_tensors(m->gguf);
    fp_u64(&s, (uint64_t)nt);
    for (int64_t i = 0; i < nt; i++) {
        const ag_gguf_tensor *t = ag_gguf_tensor_at(m->gguf, i);
        fp_bytes(&s, t->name, strlen(t->name) + 1);
        fp_u64(&s, t->type);
        fp_u64(&s, t->n_dims);
        for (int d = 0; d < AG_GGUF_MAX_DIMS; d++) fp_u64(&s, t->ne[d]);
        fp_u64(&s, t->offset);
        fp_u64(&s, t->size);
        const uint64_t k = 64;
        if (t->size <= 3 * k) {
            fp_bytes(&s, t->data, (size_t)t->size);
        } else {
            fp_bytes(&s, t->data, k);
            fp_bytes(&s, t->data + (t->size / 2 - k / 2), k);
            fp_bytes(&s, t->data + (t->size - k), k);
        }
    }
    fp_flush(&s);
    return s.h;
}

void ag_model_kv_shape(const ag_model *m, int *n_layer, int *n_head_kv, int *head_dim_k, int *head_dim_v) {
    *n_layer = m->cfg.n_layer - m->cfg.n_recurrent; /* (a hybrid's KV: its attention layers only) */
    *n_head_kv = m->cfg.n_head_kv;
    *head_dim_k = m->cfg.head_dim_k;
    *head_dim_v = m->cfg.head_dim_v;
    if (m->tp) ag_tp_kv_shape(m->tp, n_layer, n_head_kv); /* (each rank's layers and heads) */
}

ag_status ag_model_kv_params(const ag_model *m, ag_kv_dtype dtype, int max_seqs, int n_pos, ag_kv_params *kp,
                             ag_kv_layout *lay) {
    *kp = ag_kv_default_params();
    ag_model_kv_shape(m, &kp->n_layers, &kp->n_kv_heads, &kp->head_dim_k, &kp->head_dim_v);
    kp->dtype = dtype;
    kp->max_seqs = max_seqs;
    kp->mem = ag_model_kv_mem(m);
    const ag_model_config *c = &m->cfg;
    if (c->n_recurrent > 0) { /* the Mamba-2 layers' state slots */
        kp->state_layers = c->n_recurrent;
        kp->state_conv_floats = (size_t)(c->ssm_d_conv - 1) * (c->ssm_d_inner + 2 * c->ssm_n_group * c->ssm_d_state);
        kp->state_ssm_floats = (size_t)c->ssm_d_inner * c->ssm_d_state;
    }
    kp->layer_window = m->kv_window;
    kp->ring = m->kv_ring;
    /* the GPU kernels (rope_kv, attn_decode) read and write F16/F32 rows only */
    if (kp->mem && ag_kv_dtype_quantized(dtype))
        return ag_errorf(AG_ERR_UNSUPPORTED,
                         "--kv-type %s: a quantized KV cache runs on the CPU only for now; on the GPU use --kv-type f16",
                         ag_kv_dtype_name(dtype));
    ag_kv_layout L;
    ag_status    st = ag_kv_layout_for(kp, &L, NULL);
    if (!st && n_pos > 0) kp->budget_bytes = ag_kv_budget_for(&L, max_seqs, n_pos);
    if (!st && lay) *lay = L;
    return st;
}

/* ---- forward ---- */

/* The activation buffers of one forward pass, carved from one backend
 * buffer (grown on demand, never shrunk: a step's size repeats). */
typedef struct {
    float   *x, *h, *q, *k, *v, *att, *o, *gate, *up, *logits;
    int32_t *argmax; /* [n_out], a device backend's (the CPU's goes to ag_batch.argmax) */
    ag_cands *cands; /* [n_out], likewise (the CPU's go to ag_batch.cands) */
} fwd_bufs;

static size_t carve(size_t *off, size_t floats) {
    size_t at = *off;
    *off += (floats * sizeof(float) + 255) & ~(size_t)255;
    return at;
}

/* Where each activation of a batch of n tokens (n_out of them wanting
 * logits) sits in the one buffer: at[] offsets in fwd_bufs order (may be
 * NULL), returns the total bytes. One function, so the reservation, the
 * memory plan and the forward pass agree. */
static size_t fwd_layout(const ag_model *m, size_t n, size_t n_out, size_t at[12]) {
    const ag_model_config *c = &m->cfg;
    const size_t qd = (size_t)c->n_head * c->head_dim_k, kd = (size_t)c->n_head_kv * c->head_dim_k,
                 vd = (size_t)c->n_head_kv * c->head_dim_v, od = (size_t)c->n_head * c->head_dim_v;
    /* logits, argmax and candidates: written by the backend, downloaded; the
     * CPU writes the caller's arrays directly (argmax: 4-byte ints in float
     * slots; candidates: ag_cands, a multiple of 8 bytes) */
    const bool   dev = !m->be->ops->host_memory;
    /* gate and up: the dense feed-forward's (a MoE model's layers are all
     * routed, and the moe op keeps its own) */
    const size_t ff = c->n_expert > 0 ? 0 : (size_t)c->n_ff;
    /* a Mamba-2 layer's projected rows go in gate, its mixer's output in up */
    const size_t proj = c->n_recurrent ? 2 * (size_t)c->ssm_d_inner + 2 * (size_t)c->ssm_n_group * c->ssm_d_state +
                                             (size_t)c->ssm_n_head
                                       : 0;
    const size_t ffg = proj > ff ? proj : ff, ffu = c->n_recurrent && (size_t)c->ssm_d_inner > ff ? (size_t)c->ssm_d_inner : ff;
    const size_t floats[12] = {n * c->n_embd, n * c->n_embd, n * qd,      n * kd, n * vd,
                               n * od,        n * c->n_embd, n * ffg,     n * ffu,
                               dev ? n_out * c->n_vocab : 0, dev ? n_out : 0,
                               dev && m->be->ops->cands ? n_out * (sizeof(ag_cands) / sizeof(float)) : 0};
    size_t off = 0;
    for (int i = 0; i < 12; i++) {
        size_t o = carve(&off, floats[i]);
        if (at) at[i] = o;
    }
    return off;
}

static ag_status fwd_buffers(ag_model *m, int n, int n_out, fwd_bufs *f) {
    size_t at[12];
    size_t need = fwd_layout(m, (size_t)n, (size_t)n_out, at);
    if (need > m->act_bytes) {
        if (m->act) m->be->ops->free(m->be, m->act);
        m->act_bytes = 0;
        m->last_n_out = 0; /* the last pass's device rows went with it */
        if (!(m->act = m->be->ops->alloc(m->be, need)))
            return ag_errorf(AG_ERR_NOMEM, "out of %s memory for a batch of %d tokens (%zu bytes)", m->be->ops->name,
                             n, need);
        m->act_bytes = need;
    }
    float **dst[10] = {&f->x, &f->h, &f->q, &f->k, &f->v, &f->att, &f->o, &f->gate, &f->up, &f->logits};
    for (int i = 0; i < 10; i++) *dst[i] = (float *)((char *)m->act + at[i]);
    f->argmax = (int32_t *)((char *)m->act + at[10]);
    f->cands = (ag_cands *)((char *)m->act + at[11]);
    return AG_OK;
}

/* Layer l's routed experts, as the moe op takes them. */
static ag_moe_weights moe_weights(const ag_model *m, int l) {
    const ag_layer_weights *w = &m->layers[l];
    return (ag_moe_weights){.gate_inp = &w->ffn_gate_inp, .gate_exps = &w->ffn_gate_exps, .up_exps = &w->ffn_up_exps,
                            .down_exps = &w->ffn_down_exps, .n_expert = m->cfg.n_expert,
                            .n_used = m->cfg.n_expert_used, .norm_w = m->cfg.expert_weights_norm,
                            .w_scale = m->cfg.expert_weights_scale, .gating = m->cfg.expert_gating,
                            .act = m->cfg.expert_act, .alpha = m->cfg.expert_alpha, .limit = m->cfg.expert_limit,
                            .gate_inp_b = w->ffn_gate_inp_b.data, .gate_b = w->ffn_gate_exps_b.data,
                            .up_b = w->ffn_up_exps_b.data, .down_b = w->ffn_down_exps_b.data};
}

/* The decoder layers over the batch: x (embedded tokens) in, x (final
 * residual stream) out. Every op goes to the backend; the first error ends
 * the pass. */
static ag_status run_layers(ag_model *m, ag_kv *kv, const ag_batch *b, const ag_batch_layout *lay, int n_dec,
                            const fwd_bufs *f) {
    const ag_model_config *c = &m->cfg;
    ag_backend *be = m->be;
    const ag_backend_ops *op = be->ops;
    const int n = b->n;
    const size_t qd = (size_t)c->n_head * c->head_dim_k, kd = (size_t)c->n_head_kv * c->head_dim_k,
                 vd = (size_t)c->n_head_kv * c->head_dim_v;
    float *x = f->x, *h = f->h, *q = f->q, *k = f->k, *v = f->v, *att = f->att, *o = f->o, *gate = f->gate,
          *up = f->up;
    ag_status st;
#define TRY(call)                      \
    do {                               \
        if ((st = (call))) return st;  \
    } while (0)
#define ADD_NORM(wn) TRY(ag_backend_add_rmsnorm(be, x, o, wn, n, c->n_embd, c->rms_eps, h))
    for (int l = 0; l < c->n_layer; l++) {
        const ag_layer_weights *w = &m->layers[l];
        /* later layers' input norm ran with the previous layer's last add */
        if (l == 0) TRY(op->rmsnorm(be, x, w->attn_norm.data, n, c->n_embd, c->rms_eps, h));
        const ag_tensor *qkv_w[3] = {&w->wq, &w->wk, &w->wv};
        float *const     qkv[3] = {q, k, v};
        TRY(op->matmul_multi(be, qkv_w, 3, h, n, n_dec, qkv));
        if (w->bq.data) TRY(op->add_bias(be, q, w->bq.data, n, (int)qd));
        if (w->bk.data) TRY(op->add_bias(be, k, w->bk.data, n, (int)kd));
        if (w->bv.data) TRY(op->add_bias(be, v, w->bv.data, n, (int)vd));
        if (w->q_norm.data) TRY(op->rmsnorm(be, q, w->q_norm.data, n * c->n_head, c->head_dim_k, c->rms_eps, q));
        if (w->k_norm.data) TRY(op->rmsnorm(be, k, w->k_norm.data, n * c->n_head_kv, c->head_dim_k, c->rms_eps, k));
        bool swa = c->layer_swa[l];
        float base = swa ? c->rope_base_swa : c->rope_base;
        float fscale = swa ? c->rope_freq_scale_swa : c->rope_freq_scale;
        ag_attn_shape shape = {.layer = l, .n_head = c->n_head, .n_head_kv = c->n_head_kv,
                               .head_dim_k = c->head_dim_k, .head_dim_v = c->head_dim_v,
                               .scale = c->attn_scale, .window = swa ? c->sliding_window : 0,
                               .sinks = w->attn_sinks.data, .bidirectional = c->bidirectional};
        if (c->rope_yarn) {
            TRY(op->rope_freqs(be, q, n, c->n_head, c->head_dim_k, c->rope_dim, b->pos, m->yarn_freq[swa],
                               m->yarn_mscale[swa], c->rope_neox));
            TRY(op->rope_freqs(be, k, n, c->n_head_kv, c->head_dim_k, c->rope_dim, b->pos, m->yarn_freq[swa],
                               m->yarn_mscale[swa], c->rope_neox));
            TRY(op->kv_store(be, kv, &shape, lay, k, v));
        } else if (op->rope_kv_store) {
            TRY(op->rope_kv_store(be, kv, &shape, lay, q, k, v, c->rope_dim, b->pos, base, fscale, c->rope_neox));
        } else {
            TRY(op->rope(be, q, n, c->n_head, c->head_dim_k, c->rope_dim, b->pos, base, fscale, c->rope_neox));
            TRY(op->rope(be, k, n, c->n_head_kv, c->head_dim_k, c->rope_dim, b->pos, base, fscale, c->rope_neox));
            TRY(op->kv_store(be, kv, &shape, lay, k, v));
        }
        TRY(op->attention(be, kv, &shape, lay, q, att));
        TRY(op->matmul(be, &w->wo, att, n, n_dec, o));
        if (w->bo.data) TRY(op->add_bias(be, o, w->bo.data, n, c->n_embd));
        if (w->post_attn_norm.data) TRY(op->rmsnorm(be, o, w->post_attn_norm.data, n, c->n_embd, c->rms_eps, o));
        ADD_NORM(w->ffn_norm.data);
        if (w->ffn_gate_exps.data) {
            const ag_moe_weights mw = moe_weights(m, l);
            TRY(op->moe(be, &mw, h, n, n_dec, o));
        } else if (op->ffn) {
            TRY(op->ffn(be, &w->ffn_gate, &w->ffn_up, &w->ffn_down, h, n, n_dec, c->gelu, gate, up, o));
        } else {
            const ag_tensor *gu_w[2] = {&w->ffn_gate, &w->ffn_up};
            float *const     gu[2] = {gate, up};
            TRY(op->matmul_multi(be, gu_w, 2, h, n, n_dec, gu));
            if (c->gelu) TRY(op->gelu_mul(be, gate, up, (size_t)n * c->n_ff));
            else TRY(op->silu_mul(be, gate, up, (size_t)n * c->n_ff));
            TRY(op->matmul(be, &w->ffn_down, gate, n, n_dec, o));
        }
        if (w->post_ffn_norm.data) TRY(op->rmsnorm(be, o, w->post_ffn_norm.data, n, c->n_embd, c->rms_eps, o));
        if (l + 1 < c->n_layer) ADD_NORM(m->layers[l + 1].attn_norm.data); /* the next layer's input norm */
        else TRY(op->add(be, x, o, (size_t)n * c->n_embd));
    }
#undef ADD_NORM
#undef TRY
    return AG_OK;
}

/* A hybrid model's sequences in this batch: each sequence's rows (batch
 * order), checked against its recurrent state (consecutive positions from
 * the state's length). */
typedef struct {
    int32_t    *rows;  /* [n] grouped by run */
    ag_ssm_run *runs;  /* [n_runs] */
    int32_t    *seq;   /* [n_runs] */
    float     **snap;  /* [n]: per row, this layer's snapshot slot or NULL */
    uint8_t    *all_dec; /* [n_runs]: every row a decode row */
    int32_t    *n_snap;  /* [n_runs]: rows that record a snapshot (decode runs: all, or all but the last) */
    int         n_runs;
} hybrid_runs;

static void hybrid_runs_free(hybrid_runs *h) {
    free(h->rows);
    free(h->runs);
    free(h->seq);
    free(h->snap);
    free(h->all_dec);
    free(h->n_snap);
}

static ag_status hybrid_runs_make(ag_state *st, const ag_batch *b, int n_dec, hybrid_runs *h) {
    const int n = b->n;
    memset(h, 0, sizeof *h);
    h->rows = malloc(sizeof *h->rows * (size_t)n);
    h->runs = calloc((size_t)n, sizeof *h->runs);
    h->seq = malloc(sizeof *h->seq * (size_t)n);
    h->snap = calloc((size_t)n, sizeof *h->snap);
    h->all_dec = malloc((size_t)n);
    h->n_snap = malloc(sizeof *h->n_snap * (size_t)n);
    if (!h->rows || !h->runs || !h->seq || !h->snap || !h->all_dec || !h->n_snap)
        return ag_errorf(AG_ERR_NOMEM, "out of memory for a batch of %d tokens", n);
    int at = 0;
    for (int i = 0; i < n; i++) {
        int r = 0;
        while (r < h->n_runs && h->seq[r] != b->seq[i]) r++;
        if (r < h->n_runs) continue; /* (its rows were gathered with its first) */
        h->seq[r] = b->seq[i];
        h->all_dec[r] = 1;
        h->n_runs++;
        h->runs[r].rows = h->rows + at;
        h->runs[r].snap = h->snap + at;
        int32_t next = ag_state_len(st, b->seq[i]);
        ag_status e = ag_state_check(st, b->seq[i], b->pos[i]);
        if (e) return e;
        for (int j = i; j < n; j++) {
            if (b->seq[j] != b->seq[i]) continue;
            if (b->pos[j] != next)
                return ag_errorf(AG_ERR_INVALID, "sequence %d: position %d after %d in one batch (a recurrent layer "
                                 "takes a sequence's positions in order)", b->seq[i], b->pos[j], next - 1);
            next++;
            h->rows[at++] = j;
            h->runs[r].n_rows++;
            if (j >= n_dec) h->all_dec[r] = 0;
        }
        h->n_snap[r] = h->runs[r].n_rows - (ag_state_snap_last(st) ? 0 : 1);
    }
    return AG_OK;
}

/* The hybrid decoder (granitehybrid, as llama.cpp's graph): per layer the
 * input RMSNorm, then a Mamba-2 mixer (ssm_in, the mamba2 op over each
 * sequence's state, ssm_out) or attention (no RoPE where the file says
 * so), the branch times residual_scale added to x, the feed-forward's
 * norm and SwiGLU, times residual_scale, added. Decode rows record each
 * layer's state after them in the state's snapshot ring (what lets a
 * verify window's rejected tail be trimmed). */
static ag_status run_hybrid_layers(ag_model *m, ag_kv *kv, const ag_batch *b, const ag_batch_layout *lay, int n_dec,
                                   const fwd_bufs *f) {
    const ag_model_config *c = &m->cfg;
    ag_backend           *be = m->be;
    const ag_backend_ops *op = be->ops;
    const int             n = b->n;
    ag_state             *sst = ag_kv_state(kv);
    if (!sst) return ag_errorf(AG_ERR_INVALID, "a model with recurrent layers needs a KV cache with state slots "
                                               "(ag_model_kv_params)");
    float *x = f->x, *h = f->h, *q = f->q, *k = f->k, *v = f->v, *att = f->att, *o = f->o, *gate = f->gate,
          *up = f->up;
    hybrid_runs hr;
    ag_status   st = hybrid_runs_make(sst, b, n_dec, &hr);
    const ag_ssm_shape base = {.d_conv = c->ssm_d_conv, .d_inner = c->ssm_d_inner, .d_state = c->ssm_d_state,
                               .n_head = c->ssm_n_head, .n_group = c->ssm_n_group, .eps = c->rms_eps};
#define TRY(call)                      \
    do {                               \
        if ((st = (call))) goto done;  \
    } while (0)
#define ADD_NORM(wn) TRY(ag_backend_add_rmsnorm(be, x, o, wn, n, c->n_embd, c->rms_eps, h))
#define RES_SCALE() \
    if (c->residual_scale != 1.0f) TRY(op->scale(be, o, c->residual_scale, (size_t)n * c->n_embd))
    if (st) goto done;
    for (int l = 0, rl = 0; l < c->n_layer; l++) {
        const ag_layer_weights *w = &m->layers[l];
        if (l == 0) TRY(op->rmsnorm(be, x, w->attn_norm.data, n, c->n_embd, c->rms_eps, h));
        if (c->layer_recurrent[l]) {
            TRY(op->matmul(be, &w->ssm_in, h, n, n_dec, gate));
            ag_ssm_shape sh = base;
            sh.conv_w = w->ssm_conv1d.data;
            sh.conv_b = w->ssm_conv1d_b.data;
            sh.dt_b = w->ssm_dt_b.data;
            sh.a = w->ssm_a.data;
            sh.d = w->ssm_d.data;
            sh.norm_w = w->ssm_norm.data;
            for (int r = 0; r < hr.n_runs; r++) {
                ag_ssm_run *run = &hr.runs[r];
                run->state = ag_state_layer(sst, hr.seq[r], rl);
                for (int t = 0; t < run->n_rows; t++)
                    hr.snap[run->rows - hr.rows + t] =
                        hr.all_dec[r] && (t < hr.n_snap[r])
                            ? ag_state_snap_slot(sst, hr.seq[r], rl, b->pos[run->rows[t]])
                            : NULL;
            }
            TRY(op->mamba2(be, &sh, gate, hr.runs, hr.n_runs, up));
            TRY(op->matmul(be, &w->ssm_out, up, n, n_dec, o));
            rl++;
        } else {
            const ag_tensor *qkv_w[3] = {&w->wq, &w->wk, &w->wv};
            float *const     qkv[3] = {q, k, v};
            TRY(op->matmul_multi(be, qkv_w, 3, h, n, n_dec, qkv));
            if (w->bq.data) TRY(op->add_bias(be, q, w->bq.data, n, c->n_head * c->head_dim_k));
            if (w->bk.data) TRY(op->add_bias(be, k, w->bk.data, n, c->n_head_kv * c->head_dim_k));
            if (w->bv.data) TRY(op->add_bias(be, v, w->bv.data, n, c->n_head_kv * c->head_dim_v));
            ag_attn_shape shape = {.layer = c->kv_layer[l], .n_head = c->n_head, .n_head_kv = c->n_head_kv,
                                   .head_dim_k = c->head_dim_k, .head_dim_v = c->head_dim_v, .scale = c->attn_scale};
            if (!c->no_rope) {
                TRY(op->rope(be, q, n, c->n_head, c->head_dim_k, c->rope_dim, b->pos, c->rope_base, c->rope_freq_scale,
                             c->rope_neox));
                TRY(op->rope(be, k, n, c->n_head_kv, c->head_dim_k, c->rope_dim, b->pos, c->rope_base,
                             c->rope_freq_scale, c->rope_neox));
            }
            TRY(op->kv_store(be, kv, &shape, lay, k, v));
            TRY(op->attention(be, kv, &shape, lay, q, att));
            TRY(op->matmul(be, &w->wo, att, n, n_dec, o));
            if (w->bo.data) TRY(op->add_bias(be, o, w->bo.data, n, c->n_embd));
        }
        RES_SCALE();
        ADD_NORM(w->ffn_norm.data);
        if (op->ffn) {
            TRY(op->ffn(be, &w->ffn_gate, &w->ffn_up, &w->ffn_down, h, n, n_dec, false, gate, up, o));
        } else {
            const ag_tensor *gu_w[2] = {&w->ffn_gate, &w->ffn_up};
            float *const     gu[2] = {gate, up};
            TRY(op->matmul_multi(be, gu_w, 2, h, n, n_dec, gu));
            TRY(op->silu_mul(be, gate, up, (size_t)n * c->n_ff));
            TRY(op->matmul(be, &w->ffn_down, gate, n, n_dec, o));
        }
        RES_SCALE();
        if (l + 1 < c->n_layer) ADD_NORM(m->layers[l + 1].attn_norm.data);
        else TRY(op->add(be, x, o, (size_t)n * c->n_embd));
    }
    for (int r = 0; r < hr.n_runs; r++) {
        const ag_ssm_run *run = &hr.runs[r];
        const int32_t     p0 = b->pos[run->rows[0]];
        int               got = 0; /* rows whose snapshots every layer wrote (from the first) */
        while (got < run->n_rows && hr.snap[run->rows - hr.rows + got]) got++;
        ag_state_advance(sst, hr.seq[r], p0 + run->n_rows, p0 + 1, p0 + got);
    }
#undef RES_SCALE
#undef ADD_NORM
#undef TRY
done:
    hybrid_runs_free(&hr);
    return st;
}

ag_status ag_model_reserve_scratch(ag_model *m, int n_tokens) {
    if (n_tokens < 1) return AG_OK;
    fwd_bufs f;
    ag_status st = fwd_buffers(m, n_tokens, n_tokens, &f);
    return st ? ag_errorf(st, "out of memory for the activations of %d tokens", n_tokens) : AG_OK;
}

uint64_t ag_model_scratch_bytes(ag_model *m, int n_tokens, int n_ctx) {
    const ag_model_config *c = &m->cfg;
    ag_backend *be = m->be;
    int block_size = ag_kv_default_params().block_size;
    /* the activation buffer (ag_model_reserve_scratch), in the backend's
     * memory (a device's: the engine sizes a GPU's KV pool to what is left
     * beside it, so leaving it out made the pool take the arena's room) */
    uint64_t arena = fwd_layout(m, (size_t)n_tokens, (size_t)n_tokens, NULL);
    /* the backend's matmul buffer is grown to the largest call: the groups
     * and singles ag_model_forward makes */
    size_t mm = 0, copies = 0, attn = 0, moe = 0;
    const ag_tensor *out[1] = {&m->output};
    size_t need = ag_backend_matmul_scratch_bytes(be, out, 1, n_tokens);
    mm = need;
    copies += ag_backend_weight_copy_bytes(be, &m->output);
    for (int l = 0; l < c->n_layer; l++) {
        const ag_layer_weights *w = &m->layers[l];
        const bool       ssm = w->ssm_in.data != NULL; /* a Mamba-2 layer: its projections instead of q/k/v and o */
        const ag_tensor *groups[4][3] = {{ssm ? &w->ssm_in : &w->wq, &w->wk, &w->wv}, {ssm ? &w->ssm_out : &w->wo},
                                         {&w->ffn_gate, &w->ffn_up}, {&w->ffn_down}};
        const int        sizes[4] = {ssm ? 1 : 3, 1, 2, 1};
        for (int g = 0; g < (w->ffn_gate_exps.data ? 2 : 4); g++) {
            need = ag_backend_matmul_scratch_bytes(be, groups[g], sizes[g], n_tokens);
            if (need > mm) mm = need;
            for (int i = 0; i < sizes[g]; i++) copies += ag_backend_weight_copy_bytes(be, groups[g][i]);
        }
        if (w->ffn_gate_exps.data) { /* the moe op's own buffers, and its matmuls' (all n_tokens rows may pick one expert) */
            const ag_moe_weights mw = moe_weights(m, l);
            moe = ag_backend_moe_scratch_bytes(be, &mw, n_tokens);
            const ag_tensor  gate = ag_moe_expert_view(&w->ffn_gate_exps, 0), up = ag_moe_expert_view(&w->ffn_up_exps, 0),
                             down = ag_moe_expert_view(&w->ffn_down_exps, 0);
            const ag_tensor *gu[2] = {&gate, &up}, *dn[1] = {&down}, *router[1] = {&w->ffn_gate_inp};
            const ag_tensor *const *mgroups[3] = {gu, dn, router};
            const int               msizes[3] = {2, 1, 1};
            for (int g = 0; g < 3; g++) {
                need = ag_backend_matmul_scratch_bytes(be, mgroups[g], msizes[g], n_tokens);
                if (need > mm) mm = need;
            }
        }
        ag_attn_shape shape = {.layer = l, .n_head = c->n_head, .n_head_kv = c->n_head_kv,
                               .head_dim_k = c->head_dim_k, .head_dim_v = c->head_dim_v,
                               .window = c->layer_swa[l] ? c->sliding_window : 0};
        need = ag_backend_attention_scratch_bytes(be, &shape, block_size, n_tokens, n_ctx);
        if (need > attn) attn = need;
    }
    /* --tp: the shards' activations and scratch (their weight copies are
     * made at load: a process's resident memory has them, as `fit` measures) */
    uint64_t tp = 0, tp_copies = 0;
    if (m->tp) tp = ag_tp_memory(m->tp, -1, n_tokens, n_ctx, &tp_copies);
    return arena + mm + copies + attn + moe + tp;
}

/* A walk over a batch's rows (want_logits set): batch row i, and k, the
 * output rows before it. */
typedef struct {
    int i, k;
} row_walk;

/* A set of want_logits kinds, for next_run. */
#define KIND(want) (1u << (want))
/* The rows that want candidates (with a picked token's named: its requests'
 * at is AG_CANDS_AT_TOKEN, the others' never is). */
#define KINDS_WITH_CANDS (KIND(AG_WANT_CANDS) | KIND(AG_WANT_PICK_LP))

/* The next run of adjacent output rows whose want is one of `kinds` (a set
 * of KIND(want)): output rows [*k0, *k1); the walk moves past it. false
 * when none is left. */
static bool next_run(const ag_batch *b, unsigned kinds, row_walk *w, int *k0, int *k1) {
    for (; w->i < b->n && !(kinds & KIND(b->want_logits[w->i])); w->i++) w->k += b->want_logits[w->i] != 0;
    if (w->i == b->n) return false;
    *k0 = w->k;
    for (; w->i < b->n && ((kinds & KIND(b->want_logits[w->i])) || !b->want_logits[w->i]); w->i++)
        w->k += b->want_logits[w->i] != 0;
    *k1 = w->k;
    return true;
}

/* Every op of one pass after begin: embeddings, layers, the logits rows
 * (into the caller's array for a host-memory backend, else f->logits). */
/* Which kinds of output rows the backend computes in this pass (the rest
 * come from the logits rows). */
typedef struct {
    bool argmax, pick, cands;
    /* where the rows' edits and masks (ag_batch.edits, allow) are applied:
     * in the pass, by the model (host memory) or the backend's edit and
     * mask ops; or on the host after the rows are copied back (and
     * softcapped) */
    enum { EDITS_NONE, EDITS_IN_PASS, EDITS_AFTER } edits;
} out_kinds;

/* Applies output rows [0, n_out)'s edits, then their masks, to
 * rows[n_out][n_vocab] in place. */
static void edit_rows_host(const ag_batch *b, int n_out, int n_vocab, float *rows) {
    for (int k = 0; b->edits && k < n_out; k++)
        for (int32_t i = b->edit_start[k]; i < b->edit_start[k + 1]; i++) {
            float *l = rows + (size_t)k * n_vocab + b->edits[i].id;
            *l = ag_logit_edit_apply(*l, &b->edits[i]);
        }
    for (int k = 0; b->allow && k < n_out; k++) {
        const uint32_t *a = b->allow[k];
        float          *l = rows + (size_t)k * n_vocab;
        for (int i = 0; a && i < n_vocab; i++)
            if (!(a[i >> 5] >> (i & 31) & 1u)) l[i] = -INFINITY;
    }
}

/* The output matmul over the head's first output_rows rows (a view of the
 * same weights: a row's dot product is the one the whole head computes),
 * its n_out rows of output_rows logits then spread to n_vocab strides from
 * the last one down (each moves to a higher address) and the rest of each
 * row set to -inf, but for the ids of `extra` (may be NULL), computed from
 * their copied rows. Host memory. */
static ag_status head_prefix(ag_model *m, const ag_head_extra *extra, const float *x, int n_out, int n_out_dec,
                             float *out) {
    const size_t n_vocab = (size_t)m->cfg.n_vocab, rows = (size_t)m->output_rows;
    ag_tensor    head = m->output;
    head.ne[1] = (int64_t)rows;
    ag_status st = m->be->ops->matmul(m->be, &head, x, n_out, n_out_dec, out);
    if (st) return st;
    for (int k = n_out - 1; k >= 0; k--) {
        float *row = out + (size_t)k * n_vocab;
        if (k > 0) memmove(row, out + (size_t)k * rows, sizeof(float) * rows);
        for (size_t i = rows; i < n_vocab; i++) row[i] = -INFINITY;
    }
    if (!extra || extra->n <= 0) return AG_OK;
    const size_t need = (size_t)n_out * (size_t)extra->n;
    if (need > m->extra_out_cap) {
        float *p = realloc(m->extra_out, sizeof(float) * need);
        if (!p) return ag_errorf(AG_ERR_NOMEM, "out of memory for %d extra head rows", extra->n);
        m->extra_out = p, m->extra_out_cap = need;
    }
    head.ne[1] = extra->n;
    head.data = head.host = extra->rows;
    if ((st = m->be->ops->matmul(m->be, &head, x, n_out, n_out_dec, m->extra_out))) return st;
    for (int k = 0; k < n_out; k++)
        for (int j = 0; j < extra->n; j++)
            out[(size_t)k * n_vocab + (size_t)extra->ids[j]] = m->extra_out[(size_t)k * extra->n + j];
    return AG_OK;
}

static ag_status issue_pass(ag_model *m, ag_kv *kv, const ag_batch *b, const ag_batch_layout *lay, int n_dec,
                            int n_out, const out_kinds *ok, const fwd_bufs *f, float *logits) {
    const ag_model_config *c = &m->cfg;
    ag_backend           *be = m->be;
    const ag_backend_ops *op = be->ops;
    const int             n = b->n;
    ag_status             st;
    if (m->tp) { /* the shards embed the tokens and run the layers */
        if ((st = ag_tp_layers(m->tp, kv, b, lay, n_dec, f->x))) return st;
    } else {
        if ((st = op->get_rows(be, &m->tok_embd, b->token, n, f->x))) return st;
        if (c->embd_scale != 1.0f && (st = op->scale(be, f->x, c->embd_scale, (size_t)n * c->n_embd))) return st;
        if ((st = c->n_recurrent ? run_hybrid_layers(m, kv, b, lay, n_dec, f) : run_layers(m, kv, b, lay, n_dec, f)))
            return st;
    }
    /* Only the rows that want logits go through the (large) output matrix. */
    int          n_out_dec = 0, k = 0;
    const size_t row = sizeof(float) * c->n_embd;
    for (int i = 0; i < n; i++) {
        bool want = b->want_logits ? b->want_logits[i] != 0 : i == n - 1;
        if (!want) continue;
        if (i < n_dec) n_out_dec++;
        if (k != i && (st = op->copy(be, (char *)f->x + (size_t)k * row, (char *)f->x + (size_t)i * row, row)))
            return st;
        k++;
    }
    if (n_out == 0) return AG_OK;
    if ((st = op->rmsnorm(be, f->x, m->output_norm.data, n_out, c->n_embd, c->rms_eps, f->x))) return st;
    float *out = op->host_memory ? logits : f->logits;
    if (m->output_rows < c->n_vocab) /* (host memory only: ag_model_set_output_rows) */
        st = head_prefix(m, b->head_extra, f->x, n_out, n_out_dec, out);
    else if (m->tp) /* each shard's vocabulary run, gathered */
        st = ag_tp_head(m->tp, f->x, n_out, n_out_dec, out);
    else
        st = op->matmul(be, &m->output, f->x, n_out, n_out_dec, out);
    if (!st && c->logit_scale != 1.0f) /* Granite: the logits divided by logit_scale */
        st = op->scale(be, out, 1.0f / c->logit_scale, (size_t)n_out * c->n_vocab);
    if (st) return st;
    /* the samplers' steps 1-2 before anything reads the rows */
    if (ok->edits == EDITS_IN_PASS) {
        if (op->host_memory) edit_rows_host(b, n_out, c->n_vocab, out);
        if (!op->host_memory && lay->edits && (st = op->edit(be, out, n_out, c->n_vocab, lay))) return st;
        if (!op->host_memory && lay->allow && (st = op->mask(be, out, n_out, c->n_vocab, lay))) return st;
    }
    /* only the rows that want their argmax, a picked token or candidates
     * (the others' samplers read the rows) */
    int32_t  *am = op->host_memory ? b->argmax : f->argmax;
    ag_cands *cd = op->host_memory ? b->cands : f->cands;
    row_walk  w = {0, 0};
    for (int k0, k1; ok->argmax && next_run(b, KIND(AG_WANT_ARGMAX), &w, &k0, &k1);)
        if ((st = m->tp && ok->edits == EDITS_NONE ? ag_tp_argmax(m->tp, k0, k1 - k0, am + k0) /* the shards' choices */
                                                   : op->argmax(be, out + (size_t)k0 * c->n_vocab, k1 - k0, c->n_vocab, am + k0)))
            return st;
    w = (row_walk){0, 0};
    for (int k0, k1; ok->pick && next_run(b, KIND(AG_WANT_PICK) | KIND(AG_WANT_PICK_LP), &w, &k0, &k1);)
        if ((st = op->pick(be, out + (size_t)k0 * c->n_vocab, k1 - k0, c->n_vocab, lay, k0, am + k0))) return st;
    /* after the picks: a picked token's candidates name it */
    w = (row_walk){0, 0};
    for (int k0, k1; ok->cands && next_run(b, KINDS_WITH_CANDS, &w, &k0, &k1);)
        if ((st = op->cands(be, out + (size_t)k0 * c->n_vocab, k1 - k0, c->n_vocab, lay, k0, am + k0, cd + k0)))
            return st;
    return AG_OK;
}

/* Copies the output rows the caller reads back from a device backend: every
 * row's logits, or (argmax, pick, cands computed) the token array, the
 * candidates of the rows that want them, and the logits of the rows that
 * want them or whose output was not computed, run by run. */
static ag_status download_outputs(ag_model *m, const ag_batch *b, int n_out, const out_kinds *ok, const fwd_bufs *f,
                                  float *logits) {
    const ag_backend_ops *op = m->be->ops;
    const size_t          row = sizeof(float) * (size_t)m->cfg.n_vocab;
    ag_status             st;
    if (!ok->argmax && !ok->pick && !ok->cands) return op->download(m->be, logits, f->logits, row * (size_t)n_out);
    if ((ok->argmax || ok->pick) &&
        (st = op->download(m->be, b->argmax, f->argmax, sizeof(int32_t) * (size_t)n_out)))
        return st;
    row_walk w = {0, 0};
    for (int k0, k1; ok->cands && next_run(b, KINDS_WITH_CANDS, &w, &k0, &k1);)
        if ((st = op->download(m->be, b->cands + k0, f->cands + k0, sizeof(ag_cands) * (size_t)(k1 - k0))))
            return st;
    /* the rows whose outputs were not computed (a picked token's
     * candidates found on the host need its row) */
    const unsigned rows_kinds = KIND(AG_WANT_LOGITS) | (ok->argmax ? 0 : KIND(AG_WANT_ARGMAX)) |
                                (ok->pick ? 0 : KIND(AG_WANT_PICK)) | (ok->cands ? 0 : KINDS_WITH_CANDS);
    w = (row_walk){0, 0};
    for (int k0, k1; next_run(b, rows_kinds, &w, &k0, &k1);)
        if ((st = op->download(m->be, (char *)logits + row * k0, (char *)f->logits + row * k0,
                               row * (size_t)(k1 - k0))))
            return st;
    return AG_OK;
}

bool ag_model_can_pick(const ag_model *m) {
    return m && m->be->ops->pick && m->cfg.final_softcap <= 0 && !m->pick_off;
}

bool ag_model_can_cands(const ag_model *m) { return m && !m->cands_off; }

bool ag_model_can_edit(const ag_model *m) {
    return m && (m->be->ops->host_memory || (m->be->ops->edit && m->cfg.final_softcap <= 0));
}

bool ag_model_can_mask(const ag_model *m) {
    return m && (m->be->ops->host_memory || (m->be->ops->mask && m->cfg.final_softcap <= 0));
}

ag_status ag_model_output_row(ag_model *m, int k, float *out) {
    if (!m || !out || k < 0 || k >= m->last_n_out)
        return ag_errorf(AG_ERR_INVALID, "output row %d: the last pass had %d", k, m ? m->last_n_out : 0);
    const size_t row = (size_t)m->cfg.n_vocab;
    if (m->last_dev_rows) return m->be->ops->download(m->be, out, m->last_dev_rows + (size_t)k * row, sizeof(float) * row);
    const float *src = (m->poison_rows ? m->poison_saved : m->last_host_rows) + (size_t)k * row;
    if (src != out) memmove(out, src, sizeof(float) * row);
    return AG_OK;
}

/* AUGUR_POISON_ROWS=1: keeps the pass's n_out rows for
 * ag_model_output_row, then overwrites with NaN the rows whose outputs
 * were computed, the rows download_outputs would leave on a device. */
static ag_status poison_unread_rows(ag_model *m, const ag_batch *b, int n_out, const out_kinds *ok, float *logits) {
    const size_t row = (size_t)m->cfg.n_vocab, need = (size_t)n_out * row;
    if (need > m->poison_cap) {
        float *p = realloc(m->poison_saved, need * sizeof(float));
        if (!p) return ag_errorf(AG_ERR_NOMEM, "out of memory (AUGUR_POISON_ROWS)");
        m->poison_saved = p, m->poison_cap = need;
    }
    memcpy(m->poison_saved, logits, need * sizeof(float));
    const unsigned computed = (ok->argmax ? KIND(AG_WANT_ARGMAX) : 0) | (ok->pick ? KIND(AG_WANT_PICK) : 0) |
                              (ok->cands ? KIND(AG_WANT_CANDS) : 0) |
                              (ok->pick && ok->cands ? KIND(AG_WANT_PICK_LP) : 0);
    row_walk w = {0, 0};
    for (int k0, k1; next_run(b, computed, &w, &k0, &k1);)
        for (size_t i = (size_t)k0 * row; i < (size_t)k1 * row; i++) logits[i] = NAN;
    return AG_OK;
}

ag_status ag_model_forward(ag_model *m, ag_kv *kv, const ag_batch *b, float *logits) {
    const ag_model_config *c = &m->cfg;
    ag_backend *be = m->be;
    const ag_backend_ops *op = be->ops;
    const int n = b->n;
    m->last_n_out = 0; /* (set again once this pass's rows are out) */
    if (c->encoder)
        return ag_errorf(AG_ERR_UNSUPPORTED, "'%s' is an embedding model: it has no logits (use embeddings)",
                         c->arch_name);
    if (n <= 0) return ag_errorf(AG_ERR_INVALID, "empty batch");
    for (int i = 0; i < n; i++) {
        if (b->token[i] < 0 || b->token[i] >= c->n_vocab)
            return ag_errorf(AG_ERR_INVALID, "token id %d out of range [0, %d)", b->token[i], c->n_vocab);
        if (b->pos[i] < 0) return ag_errorf(AG_ERR_INVALID, "negative position %d", b->pos[i]);
    }
    if (b->n_prompt < 0 || b->n_prompt > n)
        return ag_errorf(AG_ERR_INVALID, "n_prompt %d outside [0, %d]", b->n_prompt, n);
    const int n_dec = n - b->n_prompt;
    int  n_out = 0;
    bool any_argmax = false, any_pick = false, any_cands = false, any_pick_lp = false;
    for (int i = 0; i < n; i++) {
        n_out += b->want_logits ? b->want_logits[i] != 0 : i == n - 1;
        any_argmax |= b->want_logits && b->want_logits[i] == AG_WANT_ARGMAX;
        any_pick |= b->want_logits && b->want_logits[i] == AG_WANT_PICK;
        any_cands |= b->want_logits && b->want_logits[i] == AG_WANT_CANDS;
        any_pick_lp |= b->want_logits && b->want_logits[i] == AG_WANT_PICK_LP;
        if (b->want_logits && b->want_logits[i] > AG_WANT_PICK_LP)
            return ag_errorf(AG_ERR_INVALID, "want_logits[%d] = %d is not a kind of output", i, b->want_logits[i]);
    }
    if ((any_argmax || any_pick || any_pick_lp) && !b->argmax)
        return ag_errorf(AG_ERR_INVALID, "rows want a token but the batch has no array for it");
    if ((any_pick || any_pick_lp) && !b->pick)
        return ag_errorf(AG_ERR_INVALID, "rows want a picked token but the batch has no draws");
    if ((any_cands || any_pick_lp) && (!b->cands || !b->cands_req))
        return ag_errorf(AG_ERR_INVALID, "rows want candidates but the batch has no requests or array for them");
    if ((any_cands || any_pick_lp) && m->cands_off)
        return ag_errorf(AG_ERR_INVALID, "rows want candidates but AUGUR_CANDS=0 turned them off");
    if (any_pick_lp && !ag_model_can_pick(m))
        return ag_errorf(AG_ERR_INVALID, "rows want a picked token with its candidates but this model picks none");
    if (!b->edit_start != !b->edits)
        return ag_errorf(AG_ERR_INVALID, "the batch has edits without their rows' starts, or starts without edits");
    for (int k = 0; b->edit_start && k < n_out; k++)
        if (b->edit_start[0] != 0 || b->edit_start[k + 1] < b->edit_start[k])
            return ag_errorf(AG_ERR_INVALID, "edit_start is not a run of starts from 0");
    const bool any_edits = b->edit_start && b->edit_start[n_out] > 0;
    bool       any_masks = false;
    for (int k = 0; b->allow && k < n_out; k++) any_masks |= b->allow[k] != NULL;
    for (int32_t i = 0; any_edits && i < b->edit_start[n_out]; i++)
        if (b->edits[i].id < 0 || b->edits[i].id >= c->n_vocab)
            return ag_errorf(AG_ERR_INVALID, "edit %d names token %d, not in [0, %d)", (int)i, (int)b->edits[i].id,
                             c->n_vocab);
    const ag_head_extra *hx = m->output_rows < c->n_vocab ? b->head_extra : NULL;
    if (hx && (hx->n < 0 || (hx->n > 0 && (!hx->ids || !hx->rows))))
        return ag_errorf(AG_ERR_INVALID, "head_extra: %d rows without ids or rows", hx->n);
    for (int i = 0; hx && i < hx->n; i++)
        if (hx->ids[i] < m->output_rows || hx->ids[i] >= c->n_vocab)
            return ag_errorf(AG_ERR_INVALID, "head_extra id %d is not in [%d, %d)", hx->ids[i], m->output_rows,
                             c->n_vocab);
    /* a device without the edit op (or the mask op, for masks) edits (and
     * masks) the rows on the host, so nothing may be computed from them on
     * the device; likewise after a final softcap */
    const bool edits_late = (any_edits || any_masks) &&
                            (c->final_softcap > 0 ||
                             (!op->host_memory && ((any_edits && !op->edit) || (any_masks && !op->mask))));
    if (edits_late && (any_pick || any_pick_lp))
        return ag_errorf(AG_ERR_INVALID, "rows want a token picked from edited rows, which this model edits after the copy");
    /* the softcap is applied on the host after the copy, so such a model's
     * tokens and candidates come from the rows */
    const out_kinds ok = {
        .argmax = any_argmax && op->argmax && c->final_softcap <= 0 && !m->argmax_off && !edits_late,
        .pick = (any_pick || any_pick_lp) && ag_model_can_pick(m) && !edits_late,
        .cands = (any_cands || any_pick_lp) && op->cands && c->final_softcap <= 0 && !edits_late,
        .edits = !any_edits && !any_masks ? EDITS_NONE : edits_late ? EDITS_AFTER : EDITS_IN_PASS};
    fwd_bufs f;
    ag_status st = fwd_buffers(m, n, n_out, &f);
    if (st) return st;

    ag_batch_layout lay = {.n = n, .pos = b->pos, .seq = b->seq, .n_decode = n_dec,
                           .pick = ok.pick ? b->pick : NULL, .cands_req = ok.cands ? b->cands_req : NULL,
                           .n_out = n_out,
                           .edit_start = ok.edits == EDITS_IN_PASS && any_edits ? b->edit_start : NULL,
                           .edits = ok.edits == EDITS_IN_PASS && any_edits ? b->edits : NULL,
                           .allow = ok.edits == EDITS_IN_PASS && any_masks ? b->allow : NULL,
                           .allow_words = (c->n_vocab + 31) / 32};
    if (op->begin && (st = op->begin(be, kv, &lay, b->token))) return st;
    /* A pass of decode rows only has the same ops every step for the same
     * shape: a backend may record it once and replay it (graph_begin). Not
     * a model with recurrent layers: its mamba2 op's per-call arguments
     * (each sequence's state and snapshot slots, which move with the
     * positions) are not among begin's arrays. */
    int      gstate = AG_GRAPH_OFF;
    uint64_t key = 0;
    if (op->graph_begin && n_dec == n && c->n_recurrent == 0) {
        uint64_t parts[5] = {(uint64_t)n, (uint64_t)n_out, (uint64_t)(uintptr_t)m->act, (uint64_t)(uintptr_t)kv, 0};
        for (int i = 0; i < n; i++) { /* which rows want what decides the row copies and the argmax */
            int want = b->want_logits ? b->want_logits[i] : i == n - 1;
            if (want) parts[4] = parts[4] * 1000003u + (uint64_t)i * 8 + (uint64_t)want; /* (want < 8) */
        }
        /* the edit and mask ops' launches */
        parts[4] = parts[4] * 4 + (lay.edits != NULL) * 2 + (lay.allow != NULL);
        key = ag_hash64_seed(parts, sizeof parts, 0x67726170686b6579ull);
        if ((st = op->graph_begin(be, key, &gstate))) return st;
    }
    const bool recording = gstate == AG_GRAPH_RECORDING;
    if (gstate != AG_GRAPH_REPLAYED) {
        ag_status issued = issue_pass(m, kv, b, &lay, n_dec, n_out, &ok, &f, logits);
        if (!recording && issued) return issued;
        if (recording && (op->graph_end(be, key, issued != AG_OK) || issued)) {
            /* the recording failed, so nothing of the pass ran: run it unrecorded */
            AG_LOGW("%s: recording a decode pass failed (%s); running it unrecorded", op->name, ag_error_message());
            if ((st = issue_pass(m, kv, b, &lay, n_dec, n_out, &ok, &f, logits))) return st;
        }
    }
    if (n_out == 0) return op->sync(be);
    if (!op->host_memory && (st = download_outputs(m, b, n_out, &ok, &f, logits))) return st;
    m->last_n_out = n_out;
    m->last_host_rows = logits;
    /* a device keeps every output row; without a softcap (applied on the
     * host) they are the rows asked for, downloaded or not */
    m->last_dev_rows = !op->host_memory && c->final_softcap <= 0 && ok.edits != EDITS_AFTER ? f.logits : NULL;
    if (b->argmax) /* rows without a computed token: their sampler reads the row */
        for (int i = 0, k = 0; i < n; i++) {
            const int want = b->want_logits ? b->want_logits[i] : i == n - 1;
            if (want && !(ok.argmax && want == AG_WANT_ARGMAX) &&
                !(ok.pick && (want == AG_WANT_PICK || want == AG_WANT_PICK_LP)))
                b->argmax[k] = AG_ARGMAX_NONE;
            k += want != 0;
        }
    if (c->final_softcap > 0) { /* (no token or candidates were computed: every row is there) */
        for (size_t i = 0; i < (size_t)n_out * c->n_vocab; i++)
            logits[i] = c->final_softcap * tanhf(logits[i] / c->final_softcap);
    }
    if (ok.edits == EDITS_AFTER) edit_rows_host(b, n_out, c->n_vocab, logits);
    if ((any_cands || any_pick_lp) && !ok.cands) { /* from the rows, on the host */
        row_walk w = {0, 0};
        for (int k0, k1; next_run(b, KINDS_WITH_CANDS, &w, &k0, &k1);)
            for (int k = k0; k < k1; k++) {
                ag_cands_req req = b->cands_req[k];
                if (req.at == AG_CANDS_AT_TOKEN) req.at = b->argmax[k]; /* the pick's token */
                ag_top_cands_f32(logits + (size_t)k * c->n_vocab, c->n_vocab, &req, &b->cands[k]);
            }
    }
    if (m->poison_rows) return poison_unread_rows(m, b, n_out, &ok, logits);
    return AG_OK;
}

/* ---- encoders ---- */

bool ag_model_is_encoder(const ag_model *m) { return m && m->cfg.encoder; }

/* ag_model_embed's KV: room for n tokens in n_seq sequences, each in
 * blocks of its own; kept (grown) across calls. */
static ag_status encoder_kv(ag_model *m, int n, int n_seq) {
    if (m->enc_kv && n <= m->enc_kv_tokens && n_seq <= m->enc_kv_seqs) return AG_OK;
    ag_kv_free(m->enc_kv);
    m->enc_kv = NULL;
    m->enc_kv_tokens = m->enc_kv_seqs = 0;
    const ag_model_config *c = &m->cfg;
    ag_kv_params           kp = ag_kv_default_params();
    kp.n_layers = c->n_layer;
    kp.n_kv_heads = c->n_head_kv;
    kp.head_dim_k = c->head_dim_k;
    kp.head_dim_v = c->head_dim_v;
    kp.max_seqs = n_seq;
    kp.mem = ag_model_kv_mem(m);
    ag_kv_layout lay;
    ag_status    st = ag_kv_layout_for(&kp, &lay, NULL);
    if (st) return st;
    /* every sequence may waste most of one block */
    kp.budget_bytes = lay.block_bytes * ((size_t)n / (size_t)lay.block_size + (size_t)n_seq + 1);
    if ((st = ag_kv_init(&kp, &m->enc_kv))) return st;
    m->enc_kv_tokens = n;
    m->enc_kv_seqs = n_seq;
    return AG_OK;
}

/* The encoder layers over the batch (nomic-bert, as llama.cpp's BERT
 * graph): x in (the embeddings after their LayerNorm), x out (the last
 * hidden states). Per layer: attention over the whole sequence, then
 * LayerNorm(x + attn), then LayerNorm(that + SwiGLU FFN(that)). */
static ag_status run_encoder_layers(ag_model *m, ag_kv *kv, const ag_batch_layout *lay, const int32_t *pos,
                                    const fwd_bufs *f) {
    const ag_model_config *c = &m->cfg;
    ag_backend            *be = m->be;
    const ag_backend_ops  *op = be->ops;
    const int              n = lay->n;
    float *x = f->x, *h = f->h, *q = f->q, *k = f->k, *v = f->v, *att = f->att, *o = f->o;
    ag_status st;
#define TRY(call)                     \
    do {                              \
        if ((st = (call))) return st; \
    } while (0)
    for (int l = 0; l < c->n_layer; l++) {
        const ag_layer_weights *w = &m->layers[l];
        const ag_tensor *qkv_w[3] = {&w->wq, &w->wk, &w->wv};
        float *const     qkv[3] = {q, k, v};
        TRY(op->matmul_multi(be, qkv_w, 3, x, n, 0, qkv));
        TRY(op->rope(be, q, n, c->n_head, c->head_dim_k, c->rope_dim, pos, c->rope_base, c->rope_freq_scale,
                     c->rope_neox));
        TRY(op->rope(be, k, n, c->n_head_kv, c->head_dim_k, c->rope_dim, pos, c->rope_base, c->rope_freq_scale,
                     c->rope_neox));
        ag_attn_shape shape = {.layer = l, .n_head = c->n_head, .n_head_kv = c->n_head_kv,
                               .head_dim_k = c->head_dim_k, .head_dim_v = c->head_dim_v,
                               .scale = c->attn_scale, .bidirectional = c->bidirectional};
        TRY(op->kv_store(be, kv, &shape, lay, k, v));
        TRY(op->attention(be, kv, &shape, lay, q, att));
        TRY(op->matmul(be, &w->wo, att, n, 0, o));
        TRY(op->add(be, o, x, (size_t)n * c->n_embd));
        TRY(op->layernorm(be, o, w->attn_out_norm.data, w->attn_out_norm_b.data, n, c->n_embd, c->norm_eps, h));
        if (op->ffn) {
            TRY(op->ffn(be, &w->ffn_gate, &w->ffn_up, &w->ffn_down, h, n, 0, false, f->gate, f->up, o));
        } else {
            const ag_tensor *gu_w[2] = {&w->ffn_gate, &w->ffn_up};
            float *const     gu[2] = {f->gate, f->up};
            TRY(op->matmul_multi(be, gu_w, 2, h, n, 0, gu));
            TRY(op->silu_mul(be, f->gate, f->up, (size_t)n * c->n_ff));
            TRY(op->matmul(be, &w->ffn_down, f->gate, n, 0, o));
        }
        TRY(op->add(be, o, h, (size_t)n * c->n_embd));
        TRY(op->layernorm(be, o, w->layer_out_norm.data, w->layer_out_norm_b.data, n, c->n_embd, c->norm_eps, x));
    }
#undef TRY
    return AG_OK;
}

/* y[ne1] = W x[ne0] on the host, W in F32, F16 or BF16 (bind_dense): a
 * pooled vector or two per sequence, too little work for the backend. */
static void dense_host(const ag_tensor *w, const float *x, float *y) {
    for (int64_t r = 0; r < w->ne[1]; r++) {
        const uint8_t *row = (const uint8_t *)w->host + (size_t)r * w->row_bytes;
        double         acc = 0;
        for (int64_t j = 0; j < w->ne[0]; j++) {
            float v;
            if (w->type == AG_TYPE_F32) {
                memcpy(&v, row + 4 * j, 4);
            } else {
                uint16_t h;
                memcpy(&h, row + 2 * j, 2);
                v = w->type == AG_TYPE_BF16 ? ag_bf16_to_f32(h) : ag_half_to_f32(h);
            }
            acc += (double)v * x[j];
        }
        y[r] = (float)acc;
    }
}

/* e[n_embd] <- dense_3 · (dense_2 · e) */
static ag_status dense_pair(const ag_model *m, float *e) {
    float *mid = malloc(sizeof(float) * (size_t)m->dense[0].ne[1]);
    if (!mid) return ag_errorf(AG_ERR_NOMEM, "out of memory");
    dense_host(&m->dense[0], e, mid);
    dense_host(&m->dense[1], mid, e);
    free(mid);
    return AG_OK;
}

ag_status ag_model_embed(ag_model *m, const int32_t *tok, const int32_t *start, int n_seq, float *out) {
    const ag_model_config *c = &m->cfg;
    if (!c->encoder)
        return ag_errorf(AG_ERR_UNSUPPORTED, "'%s' is a generative model, not an embedding model", c->arch_name);
    if (n_seq < 1 || !start || start[0] != 0) return ag_errorf(AG_ERR_INVALID, "embed: no sequences");
    for (int s = 0; s < n_seq; s++) {
        const int len = start[s + 1] - start[s];
        if (len < 1) return ag_errorf(AG_ERR_INVALID, "embed: sequence %d is empty", s);
        if (len > c->n_ctx_train)
            return ag_errorf(AG_ERR_INVALID, "embed: sequence %d has %d tokens, more than the model's context (%d)", s,
                             len, c->n_ctx_train);
    }
    const int n = start[n_seq];
    for (int i = 0; i < n; i++)
        if (tok[i] < 0 || tok[i] >= c->n_vocab)
            return ag_errorf(AG_ERR_INVALID, "token id %d out of range [0, %d)", tok[i], c->n_vocab);
    ag_backend           *be = m->be;
    const ag_backend_ops *op = be->ops;
    ag_status             st = encoder_kv(m, n, n_seq);
    if (st) return st;
    int32_t *pos = malloc(sizeof(int32_t) * (size_t)n), *seq = malloc(sizeof(int32_t) * (size_t)n);
    float   *hid = malloc(sizeof(float) * (size_t)n * c->n_embd);
    int      n_live = 0;
    if (!pos || !seq || !hid) {
        st = ag_errorf(AG_ERR_NOMEM, "out of memory for a batch of %d tokens", n);
        goto done;
    }
    for (int s = 0; s < n_seq; s++) {
        int32_t id;
        if ((st = ag_kv_seq_new(m->enc_kv, &id))) goto done;
        n_live++;
        if ((st = ag_kv_seq_reserve(m->enc_kv, id, start[s + 1] - start[s]))) goto done;
        for (int i = start[s]; i < start[s + 1]; i++) pos[i] = i - start[s], seq[i] = id;
    }
    fwd_bufs f;
    if ((st = fwd_buffers(m, n, 0, &f))) goto done;
    ag_batch_layout lay = {.n = n, .pos = pos, .seq = seq, .n_decode = 0};
    if (op->begin && (st = op->begin(be, m->enc_kv, &lay, tok))) goto done;
    if ((st = op->get_rows(be, &m->tok_embd, tok, n, f.x))) goto done;
    if (!arch_of(c->arch)->encoder) { /* decoder layers attending both ways (EmbeddingGemma) */
        const ag_batch b = {.n = n, .token = tok, .pos = pos, .seq = seq};
        if (c->embd_scale != 1.0f && (st = op->scale(be, f.x, c->embd_scale, (size_t)n * c->n_embd))) goto done;
        if ((st = run_layers(m, m->enc_kv, &b, &lay, 0, &f))) goto done;
        if ((st = op->rmsnorm(be, f.x, m->output_norm.data, n, c->n_embd, c->rms_eps, f.x))) goto done;
    } else {
        /* token type 0 ("sentence A") for every token, as llama.cpp */
        if (m->type_embd.data && (st = op->add_bias(be, f.x, m->type_embd.data, n, c->n_embd))) goto done;
        if ((st = op->layernorm(be, f.x, m->tok_norm.data, m->tok_norm_b.data, n, c->n_embd, c->norm_eps, f.x)))
            goto done;
        if ((st = run_encoder_layers(m, m->enc_kv, &lay, pos, &f))) goto done;
    }
    if ((st = op->download(be, hid, f.x, sizeof(float) * (size_t)n * c->n_embd))) goto done;
    for (int s = 0; s < n_seq; s++) {
        float       *e = out + (size_t)s * c->n_embd;
        const int    r0 = start[s], r1 = start[s + 1];
        const int    a = c->pooling == AG_POOL_CLS ? r0 : c->pooling == AG_POOL_LAST ? r1 - 1 : r0;
        const int    b = c->pooling == AG_POOL_MEAN ? r1 : a + 1;
        for (int j = 0; j < c->n_embd; j++) {
            double sum = 0;
            for (int r = a; r < b; r++) sum += hid[(size_t)r * c->n_embd + j];
            e[j] = (float)(sum / (b - a));
        }
        if (m->dense[0].data && (st = dense_pair(m, e))) goto done;
        double ss = 0;
        for (int j = 0; j < c->n_embd; j++) ss += (double)e[j] * e[j];
        const float inv = ss > 0 ? (float)(1.0 / sqrt(ss)) : 0.0f;
        for (int j = 0; j < c->n_embd; j++) e[j] *= inv;
    }
done:
    for (int s = 0; s < n_live; s++) ag_kv_seq_free(m->enc_kv, s);
    free(pos);
    free(seq);
    free(hid);
    return st;
}

void ag_embed_truncate(const float *in, int n_embd, int dims, float *out) {
    if (dims >= n_embd) {
        if (out != in) memmove(out, in, sizeof(float) * (size_t)n_embd);
        return;
    }
    double mean = 0;
    for (int j = 0; j < n_embd; j++) mean += in[j];
    mean /= n_embd;
    double ss = 0;
    for (int j = 0; j < dims; j++) ss += (in[j] - mean) * (in[j] - mean);
    const double inv = ss > 0 ? 1.0 / sqrt(ss) : 0.0;
    for (int j = 0; j < dims; j++) out[j] = (float)((in[j] - mean) * inv);
}

void ag_model_embed_truncate(const ag_model *m, const float *in, int dims, float *out) {
    const int n_embd = m->cfg.n_embd;
    if (m->cfg.arch == AG_ARCH_NOMIC_BERT || dims >= n_embd) {
        ag_embed_truncate(in, n_embd, dims, out);
        return;
    }
    double ss = 0;
    for (int j = 0; j < dims; j++) ss += (double)in[j] * in[j];
    const double inv = ss > 0 ? 1.0 / sqrt(ss) : 0.0;
    for (int j = 0; j < dims; j++) out[j] = (float)(in[j] * inv);
}
