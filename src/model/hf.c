/* Hugging Face model folders as GGUF (see safetensors.h): config.json to
 * llama.cpp's metadata keys, safetensors tensors renamed to llama.cpp's
 * tensor names (their bytes stay in the mapped files), tokenizer.json to
 * tokenizer.ggml.* (tok_hf.c), and a sentence-transformers pipeline
 * (modules.json) to pooling metadata and Dense tensors.
 *
 * What llama.cpp's converter changes on the way, done here too: Gemma's
 * RMSNorm computes x * (1 + w), GGUF files store 1 + w (so every RMSNorm is
 * x * w), so the norm gains are converted to F32 with 1 added, in memory the
 * result owns. Every hyper-parameter augur does not implement is refused by
 * name, never ignored. */
#include <dirent.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/log.h"
#include "model/safetensors.h"
#include "tok/tok.h"

/* What the composite GGUF's tensors point into: the mapped files and the
 * converted norm gains. */
typedef struct {
    ag_st_file **files;
    int          n_files;
    void       **bufs;
    int          n_bufs, cap_bufs;
} hf_owner;

static void owner_release(void *p) {
    hf_owner *o = p;
    if (!o) return;
    for (int i = 0; i < o->n_files; i++) ag_st_free(o->files[i]);
    for (int i = 0; i < o->n_bufs; i++) free(o->bufs[i]);
    free(o->files);
    free(o->bufs);
    free(o);
}

static void *owner_alloc(hf_owner *o, size_t bytes) {
    if (o->n_bufs == o->cap_bufs) {
        int    cap = o->cap_bufs ? o->cap_bufs * 2 : 64;
        void **b = realloc(o->bufs, sizeof *b * (size_t)cap);
        if (!b) return NULL;
        o->bufs = b;
        o->cap_bufs = cap;
    }
    void *p = malloc(bytes ? bytes : 1);
    if (p) o->bufs[o->n_bufs++] = p;
    return p;
}

bool ag_hf_is_model_dir(const char *path) {
    struct stat sb;
    if (stat(path, &sb) || !S_ISDIR(sb.st_mode)) return false;
    char cfg[4096];
    snprintf(cfg, sizeof cfg, "%s/config.json", path);
    return !stat(cfg, &sb) && S_ISREG(sb.st_mode);
}

float ag_bf16_to_f32(uint16_t h) {
    uint32_t bits = (uint32_t)h << 16;
    float    f;
    memcpy(&f, &bits, 4);
    return f;
}

ag_status ag_model_file_open(const char *path, ag_gguf **out) {
    return ag_hf_is_model_dir(path) ? ag_hf_open(path, out) : ag_gguf_open(path, out);
}

float ag_half_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, e = (h >> 10) & 0x1F, m = h & 0x3FF, bits;
    if (e == 0) {
        float f = ldexpf((float)m, -24);
        return sign ? -f : f;
    }
    bits = e == 31 ? sign | 0x7F800000u | (m << 13) : sign | ((e + 112) << 23) | (m << 13);
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

static float elem_f32(const ag_st_tensor *t, uint64_t i) {
    if (t->type == AG_TYPE_F32) {
        float f;
        memcpy(&f, t->data + i * 4, 4);
        return f;
    }
    uint16_t h;
    memcpy(&h, t->data + i * 2, 2);
    return t->type == AG_TYPE_F16 ? ag_half_to_f32(h) : ag_bf16_to_f32(h);
}

/* ---- config.json ---- */

static bool cfg_int(json_t *c, const char *k, int64_t *v) {
    json_t *x = json_object_get(c, k);
    if (!json_is_integer(x)) return false;
    *v = json_integer_value(x);
    return true;
}

static bool cfg_num(json_t *c, const char *k, double *v) {
    json_t *x = json_object_get(c, k);
    if (!json_is_number(x)) return false;
    *v = json_number_value(x);
    return true;
}

/* A Gemma 3 text config's keys, checked and written. */
static ag_status gemma3_meta(json_t *c, const char *arch, ag_gguf_writer *w, int *n_layer) {
    static const struct {
        const char *hf, *gguf;
    } ints[] = {{"max_position_embeddings", "context_length"},
                {"hidden_size", "embedding_length"},
                {"num_hidden_layers", "block_count"},
                {"intermediate_size", "feed_forward_length"},
                {"num_attention_heads", "attention.head_count"},
                {"num_key_value_heads", "attention.head_count_kv"},
                {"head_dim", "attention.key_length"},
                {"head_dim", "attention.value_length"},
                {"sliding_window", "attention.sliding_window"}};
    char      key[128];
    ag_status st;
    int64_t   v[9];
    for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++) {
        if (!cfg_int(c, ints[i].hf, &v[i]) || v[i] < 1 || v[i] > (1 << 30))
            return ag_errorf(AG_ERR_FORMAT, "config.json: %s is missing or out of range", ints[i].hf);
        snprintf(key, sizeof key, "%s.%s", arch, ints[i].gguf);
        if ((st = ag_gguf_writer_add_u32(w, key, (uint32_t)v[i]))) return st;
    }
    *n_layer = (int)v[2];
    const int64_t head_dim = v[6];
    double        theta, local = 10000.0, eps, qscale;
    if (!cfg_num(c, "rms_norm_eps", &eps)) return ag_errorf(AG_ERR_FORMAT, "config.json: rms_norm_eps missing");
    /* RoPE: transformers 5's rope_parameters per layer type, or the older
     * rope_theta, rope_local_base_freq and rope_scaling (global layers) */
    json_t *rp = json_object_get(c, "rope_parameters"), *scaling = NULL, *slide = NULL;
    if (json_is_object(rp)) {
        scaling = json_object_get(rp, "full_attention");
        slide = json_object_get(rp, "sliding_attention");
        if (!cfg_num(scaling, "rope_theta", &theta) || (slide && !cfg_num(slide, "rope_theta", &local)))
            return ag_errorf(AG_ERR_FORMAT, "config.json: rope_parameters without rope_theta");
    } else {
        if (!cfg_num(c, "rope_theta", &theta)) return ag_errorf(AG_ERR_FORMAT, "config.json: rope_theta missing");
        cfg_num(c, "rope_local_base_freq", &local);
        scaling = json_object_get(c, "rope_scaling");
    }
    const char *slide_type = json_string_value(json_object_get(slide, "rope_type"));
    if (slide_type && strcmp(slide_type, "default"))
        return ag_errorf(AG_ERR_UNSUPPORTED, "config.json: sliding layers' rope_type %s (only default)", slide_type);
    const char *rtype = json_string_value(json_object_get(scaling, "rope_type"));
    if (!rtype) rtype = json_string_value(json_object_get(scaling, "type"));
    if (rtype && !strcmp(rtype, "linear")) { /* global layers' positions divided by factor (Gemma 3 4B+) */
        double factor;
        if (!cfg_num(scaling, "factor", &factor) || !(factor > 0))
            return ag_errorf(AG_ERR_FORMAT, "config.json: linear rope scaling without a factor");
        snprintf(key, sizeof key, "%s.rope.scaling.type", arch);
        if ((st = ag_gguf_writer_add_str(w, key, "linear"))) return st;
        snprintf(key, sizeof key, "%s.rope.scaling.factor", arch);
        if ((st = ag_gguf_writer_add_f32(w, key, (float)factor))) return st;
    } else if (rtype && strcmp(rtype, "default")) {
        return ag_errorf(AG_ERR_UNSUPPORTED, "config.json: rope_type %s is not supported (default or linear)", rtype);
    }
    snprintf(key, sizeof key, "%s.rope.freq_base", arch);
    if ((st = ag_gguf_writer_add_f32(w, key, (float)theta))) return st;
    snprintf(key, sizeof key, "%s.rope.freq_base_swa", arch);
    if ((st = ag_gguf_writer_add_f32(w, key, (float)local))) return st;
    snprintf(key, sizeof key, "%s.attention.layer_norm_rms_epsilon", arch);
    if ((st = ag_gguf_writer_add_f32(w, key, (float)eps))) return st;
    /* what augur's gemma3 does not do is refused */
    json_t     *act = json_object_get(c, "hidden_activation");
    if (!act) act = json_object_get(c, "hidden_act");
    if (!json_is_string(act) || strcmp(json_string_value(act), "gelu_pytorch_tanh"))
        return ag_errorf(AG_ERR_UNSUPPORTED, "config.json: hidden_activation must be gelu_pytorch_tanh");
    static const char *const nulls[] = {"attn_logit_softcapping", "final_logit_softcapping"};
    for (size_t i = 0; i < 2; i++) {
        json_t *x = json_object_get(c, nulls[i]);
        if (x && !json_is_null(x))
            return ag_errorf(AG_ERR_UNSUPPORTED, "config.json: %s is set; augur's Gemma 3 does not implement it",
                             nulls[i]);
    }
    if (json_is_true(json_object_get(c, "attention_bias")))
        return ag_errorf(AG_ERR_UNSUPPORTED, "config.json: attention_bias is not supported for Gemma 3");
    if (cfg_num(c, "query_pre_attn_scalar", &qscale) && qscale != (double)head_dim)
        return ag_errorf(AG_ERR_UNSUPPORTED, "config.json: query_pre_attn_scalar %g differs from head_dim %lld",
                         qscale, (long long)head_dim);
    /* augur's Gemma 3: five sliding-window layers, then a global one */
    json_t *lt = json_object_get(c, "layer_types");
    for (int l = 0; json_is_array(lt) && l < *n_layer; l++) {
        const char *t = json_string_value(json_array_get(lt, (size_t)l));
        const char *want = l % 6 < 5 ? "sliding_attention" : "full_attention";
        if (!t || strcmp(t, want))
            return ag_errorf(AG_ERR_UNSUPPORTED, "config.json: layer_types[%d] is %s; only Gemma 3's pattern of five "
                             "sliding layers then one full layer is supported", l, t ? t : "?");
    }
    return AG_OK;
}

/* ---- tensors ---- */

typedef struct {
    ag_gguf_tensor *v;
    int64_t         n, cap;
} tensor_list;

/* Gemma 3's HF tensor names (the "model." prefix stripped) and llama.cpp's;
 * norm: the gain is stored as w, GGUF wants 1 + w. */
static const struct {
    const char *hf, *gguf;
    bool        norm;
} k_gemma3_names[] = {
    {"input_layernorm.weight", "attn_norm.weight", true},
    {"self_attn.q_proj.weight", "attn_q.weight", false},
    {"self_attn.k_proj.weight", "attn_k.weight", false},
    {"self_attn.v_proj.weight", "attn_v.weight", false},
    {"self_attn.o_proj.weight", "attn_output.weight", false},
    {"self_attn.q_norm.weight", "attn_q_norm.weight", true},
    {"self_attn.k_norm.weight", "attn_k_norm.weight", true},
    {"post_attention_layernorm.weight", "post_attention_norm.weight", true},
    {"pre_feedforward_layernorm.weight", "ffn_norm.weight", true},
    {"post_feedforward_layernorm.weight", "post_ffw_norm.weight", true},
    {"mlp.gate_proj.weight", "ffn_gate.weight", false},
    {"mlp.up_proj.weight", "ffn_up.weight", false},
    {"mlp.down_proj.weight", "ffn_down.weight", false},
};

static ag_status add_tensor(tensor_list *L, hf_owner *o, const ag_st_tensor *t, const char *name, bool norm) {
    if (L->n == L->cap) {
        int64_t         cap = L->cap ? L->cap * 2 : 512;
        ag_gguf_tensor *v = realloc(L->v, sizeof *v * (size_t)cap);
        if (!v) return ag_errorf(AG_ERR_NOMEM, "out of memory");
        L->v = v;
        L->cap = cap;
    }
    ag_gguf_tensor *g = &L->v[L->n];
    memset(g, 0, sizeof *g);
    char *nm = owner_alloc(o, strlen(name) + 1);
    if (!nm) return ag_errorf(AG_ERR_NOMEM, "out of memory");
    strcpy(nm, name);
    g->name = nm;
    g->type = t->type;
    g->n_dims = t->n_dims ? t->n_dims : 1;
    for (uint32_t d = 0; d < 4; d++) g->ne[d] = 1;
    for (uint32_t d = 0; d < t->n_dims; d++) g->ne[d] = t->shape[t->n_dims - 1 - d]; /* GGUF: ne[0] contiguous */
    g->size = t->size;
    g->offset = t->offset;
    g->data = t->data;
    uint32_t be, bb;
    ag_tensor_type_layout(t->type, &be, &bb);
    if (norm || ((uintptr_t)t->data % bb)) {
        if (norm && t->type != AG_TYPE_F32 && t->type != AG_TYPE_F16 && t->type != AG_TYPE_BF16)
            return ag_errorf(AG_ERR_UNSUPPORTED, "tensor '%s': a norm gain of type %s", t->name,
                             ag_tensor_type_name(t->type));
        /* a norm gain as F32 1 + w (or a misaligned tensor, copied) */
        size_t bytes = norm ? t->n_elems * 4 : t->size;
        void  *p = owner_alloc(o, bytes);
        if (!p) return ag_errorf(AG_ERR_NOMEM, "out of memory");
        if (norm) {
            float *f = p;
            for (uint64_t i = 0; i < t->n_elems; i++) f[i] = 1.0f + elem_f32(t, i);
            g->type = AG_TYPE_F32;
        } else {
            memcpy(p, t->data, bytes);
        }
        g->data = p;
        g->size = bytes;
    }
    L->n++;
    return AG_OK;
}

static ag_status open_st(hf_owner *o, const char *path, ag_st_file **f) {
    ag_st_file **v = realloc(o->files, sizeof *v * (size_t)(o->n_files + 1));
    if (!v) return ag_errorf(AG_ERR_NOMEM, "out of memory");
    o->files = v;
    ag_status st = ag_st_open(path, f);
    if (st) {
        char msg[512];
        snprintf(msg, sizeof msg, "%s", ag_error_message());
        return ag_errorf(st, "%s: %s", path, msg);
    }
    o->files[o->n_files++] = *f;
    return AG_OK;
}

/* Every tensor of every top-level *.safetensors file, renamed. */
static ag_status gemma3_tensors(const char *dir, hf_owner *o, tensor_list *L, int n_layer) {
    DIR *d = opendir(dir);
    if (!d) return ag_errorf(AG_ERR_IO, "%s: cannot list the folder", dir);
    struct dirent *e;
    ag_status      st = AG_OK;
    int            n_files = 0;
    char           path[4096], name[256];
    while (!st && (e = readdir(d))) {
        size_t nl = strlen(e->d_name);
        if (nl < 12 || strcmp(e->d_name + nl - 12, ".safetensors")) continue;
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        ag_st_file *f;
        if ((st = open_st(o, path, &f))) break;
        n_files++;
        for (int64_t i = 0; !st && i < ag_st_n_tensors(f); i++) {
            const ag_st_tensor *t = ag_st_tensor_at(f, i);
            const char         *hf = t->name;
            if (!strncmp(hf, "model.", 6)) hf += 6;
            int  l, used = 0;
            bool found = false;
            if (!strcmp(hf, "embed_tokens.weight")) {
                st = add_tensor(L, o, t, "token_embd.weight", false), found = true;
            } else if (!strcmp(hf, "norm.weight")) {
                st = add_tensor(L, o, t, "output_norm.weight", true), found = true;
            } else if (!strcmp(t->name, "lm_head.weight")) {
                st = add_tensor(L, o, t, "output.weight", false), found = true;
            } else if (sscanf(hf, "layers.%d.%n", &l, &used) == 1 && used > 0 && l >= 0 && l < n_layer) {
                for (size_t k = 0; k < sizeof k_gemma3_names / sizeof k_gemma3_names[0]; k++)
                    if (!strcmp(hf + used, k_gemma3_names[k].hf)) {
                        snprintf(name, sizeof name, "blk.%d.%s", l, k_gemma3_names[k].gguf);
                        st = add_tensor(L, o, t, name, k_gemma3_names[k].norm);
                        found = true;
                        break;
                    }
            }
            if (!st && !found)
                st = ag_errorf(AG_ERR_UNSUPPORTED, "%s: tensor '%s' is not part of a Gemma 3 text model", path, t->name);
        }
    }
    closedir(d);
    if (!st && !n_files) st = ag_errorf(AG_ERR_NOT_FOUND, "%s: no *.safetensors file", dir);
    return st;
}

/* ---- sentence-transformers modules ---- */

static json_t *load_json(const char *dir, const char *sub, const char *file, ag_status *st) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s%s%s", dir, sub, *sub ? "/" : "", file);
    json_error_t je;
    json_t      *j = json_load_file(path, 0, &je);
    *st = j ? AG_OK : ag_errorf(AG_ERR_FORMAT, "%s: %s", path, je.text);
    return j;
}

static bool type_is(json_t *m, const char *suffix) {
    const char *t = json_string_value(json_object_get(m, "type"));
    size_t      a = t ? strlen(t) : 0, b = strlen(suffix);
    return t && a >= b && !strcmp(t + a - b, suffix);
}

/* Transformer, Pooling, up to two Dense layers (no bias, identity
 * activation), Normalize: the pooling type and the Dense tensors
 * (dense_2.weight, dense_3.weight, as llama.cpp names EmbeddingGemma's). */
static ag_status st_modules(const char *dir, const char *arch, ag_gguf_writer *w, hf_owner *o, tensor_list *L) {
    char        path[4096];
    struct stat sb;
    snprintf(path, sizeof path, "%s/modules.json", dir);
    ag_status st = AG_OK;
    int       pooling = 1; /* mean, the transformers default for an encoder without modules.json */
    if (!stat(path, &sb)) {
        json_t *mods = load_json(dir, "", "modules.json", &st);
        if (!mods) return st;
        size_t  i;
        json_t *m;
        int     stage = 0, n_dense = 0; /* 0 transformer, 1 pooling, 2 dense, 3 normalize */
        json_array_foreach(mods, i, m) {
            const char *sub = json_string_value(json_object_get(m, "path"));
            if (!sub) sub = "";
            if (type_is(m, ".Transformer") && stage == 0) {
                stage = 1;
            } else if (type_is(m, ".Pooling") && stage == 1) {
                json_t *pc = load_json(dir, sub, "config.json", &st);
                if (!pc) break;
                int n_modes = 0;
                if (json_is_true(json_object_get(pc, "pooling_mode_mean_tokens"))) pooling = 1, n_modes++;
                if (json_is_true(json_object_get(pc, "pooling_mode_cls_token"))) pooling = 2, n_modes++;
                if (json_is_true(json_object_get(pc, "pooling_mode_lasttoken"))) pooling = 3, n_modes++;
                const char *bad[] = {"pooling_mode_max_tokens", "pooling_mode_mean_sqrt_len_tokens",
                                     "pooling_mode_weightedmean_tokens"};
                for (int k = 0; k < 3; k++)
                    if (json_is_true(json_object_get(pc, bad[k]))) n_modes = 99;
                json_t *inc = json_object_get(pc, "include_prompt");
                if (n_modes != 1 || (inc && !json_is_true(inc)))
                    st = ag_errorf(AG_ERR_UNSUPPORTED, "%s/%s: only one of mean, cls or last-token pooling, "
                                   "include_prompt true, is supported", dir, sub);
                json_decref(pc);
                stage = 2;
            } else if (type_is(m, ".Dense") && stage == 2 && n_dense < 2) {
                json_t *dc = load_json(dir, sub, "config.json", &st);
                if (!dc) break;
                const char *act = json_string_value(json_object_get(dc, "activation_function"));
                if (json_is_true(json_object_get(dc, "bias")) || !act ||
                    strcmp(act, "torch.nn.modules.linear.Identity"))
                    st = ag_errorf(AG_ERR_UNSUPPORTED, "%s/%s: only a Dense layer without bias and with the identity "
                                   "activation is supported", dir, sub);
                json_decref(dc);
                ag_st_file *f;
                snprintf(path, sizeof path, "%s/%s/model.safetensors", dir, sub);
                if (!st) st = open_st(o, path, &f);
                const ag_st_tensor *t = st ? NULL : ag_st_find(f, "linear.weight");
                if (!st && (!t || t->n_dims != 2))
                    st = ag_errorf(AG_ERR_FORMAT, "%s: no 2-D linear.weight", path);
                char name[32];
                snprintf(name, sizeof name, "dense_%d.weight", 2 + n_dense++);
                if (!st) st = add_tensor(L, o, t, name, false);
            } else if (type_is(m, ".Normalize") && stage >= 2) {
                stage = 3; /* ag_model_embed always L2-normalizes */
            } else {
                st = ag_errorf(AG_ERR_UNSUPPORTED, "%s/modules.json: module %zu (%s) is not supported here", dir, i,
                               json_string_value(json_object_get(m, "type")));
            }
            if (st) break;
        }
        json_decref(mods);
        if (st) return st;
        if (stage != 3) AG_LOGW("%s: no Normalize module; augur's embeddings are L2-normalized all the same", dir);
    }
    char key[128];
    snprintf(key, sizeof key, "%s.pooling_type", arch);
    if ((st = ag_gguf_writer_add_u32(w, key, (uint32_t)pooling))) return st;
    snprintf(key, sizeof key, "%s.attention.causal", arch);
    return ag_gguf_writer_add_bool(w, key, false);
}

ag_status ag_hf_open(const char *dir, ag_gguf **out) {
    *out = NULL;
    ag_status       st;
    json_t         *cfg = load_json(dir, "", "config.json", &st);
    ag_gguf_writer *w = ag_gguf_writer_new();
    hf_owner       *o = calloc(1, sizeof *o);
    tensor_list     L = {0};
    uint8_t        *image = NULL;
    size_t          image_len = 0;
    if (!cfg) goto fail;
    if (!w || !o) {
        st = ag_errorf(AG_ERR_NOMEM, "out of memory");
        goto fail;
    }
    const char *mt = json_string_value(json_object_get(cfg, "model_type"));
    if (!mt || strcmp(mt, "gemma3_text")) {
        st = ag_errorf(AG_ERR_UNSUPPORTED, "%s/config.json: model_type '%s' is not supported from safetensors "
                       "(only gemma3_text)", dir, mt ? mt : "?");
        goto fail;
    }
    const bool  embed = json_is_true(json_object_get(cfg, "use_bidirectional_attention"));
    const char *arch = embed ? "gemma-embedding" : "gemma3";
    const char *base = strrchr(dir, '/');
    char        name[256];
    snprintf(name, sizeof name, "%s", base && base[1] ? base + 1 : dir);
    int n_layer = 0;
    if ((st = ag_gguf_writer_add_str(w, "general.architecture", arch)) ||
        (st = ag_gguf_writer_add_str(w, "general.name", name)))
        goto fail;
    if ((st = gemma3_meta(cfg, arch, w, &n_layer))) {
        char msg[512];
        snprintf(msg, sizeof msg, "%s", ag_error_message());
        st = ag_errorf(st, "%s/%s", dir, msg);
        goto fail;
    }
    if ((st = gemma3_tensors(dir, o, &L, n_layer))) goto fail;
    if (embed && (st = st_modules(dir, arch, w, o, &L))) goto fail;
    char tj[4096];
    snprintf(tj, sizeof tj, "%s/tokenizer.json", dir);
    int64_t n_vocab = 0;
    cfg_int(cfg, "vocab_size", &n_vocab);
    if ((st = ag_tok_hf_to_gguf(tj, n_vocab, w))) goto fail;
    if ((st = ag_gguf_writer_to_memory(w, &image, &image_len))) goto fail;
    ag_gguf_writer_free(w);
    json_decref(cfg);
    st = ag_gguf_open_composite(image, image_len, L.v, L.n, owner_release, o, out);
    free(L.v);
    return st;
fail:
    json_decref(cfg);
    ag_gguf_writer_free(w);
    owner_release(o);
    free(L.v);
    return st;
}
