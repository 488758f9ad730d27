/* The CUDA backend's files to one another: each family's host functions
 * that another file calls (C++ linkage, internal to src/backend/cuda; the
 * public entry points are cuda_backend.h's). A kernel is launched from the
 * file that defines it: a family exports launch functions, never kernels
 * or template instances, so each .cu instantiates what it launches (the
 * one kernel named elsewhere: cuda_backend.cu asks add_k's attributes).
 *
 *   cuda_backend.cu   the op table, memory, begin (the pass's arrays), graphs, lifetime
 *   matmul.cu         matmul / matmul_multi / get_rows: decode rows to mmv, mmt or mmq,
 *                     prompt rows to cuBLAS (dequantize, BF16 GEMM); prepared activations
 *   mmv.cu            decode rows on fp32 GEMVs (AUGUR_CUDA_MMV=fp32, types without mmt/mmq)
 *   mmt.cu            decode rows of BF16 weights on the tensor cores; the fused gate/up (glu)
 *   mmq.cu            decode rows of Q4_K/Q6_K: mmq (tensor cores) and mmqv (few rows)
 *   norm_act.cu       rmsnorm, add, scale, activations, the feed-forward block (ffn)
 *   moe.cu            the routed experts (moe): routing on the host, each expert's rows through matmul
 *   rope_kv.cu        rope, the KV store, rope + KV store in one kernel
 *   attn_decode.cu    attention: the op, decode rows (split-K), the SIMT prompt tiles
 *   attn_prompt_mma.cu   prompt rows on mma.sync (attention_fa1_k, attention_fa_k, attention_mma_k)
 *   attn_prompt_wgmma.cu prompt rows on wgmma (sm_90a: attention_wg_k, attention_wgp_k)
 *   sample.cu         argmax, pick, cands, edit, mask (the kernels: sample_*.cuh)
 *   mamba.cu          the Mamba-2 mixer (mamba2)
 */
#ifndef AG_CUDA_OPS_CUH
#define AG_CUDA_OPS_CUH

#include "backend/cuda/attn.cuh"
#include "backend/cuda/state.cuh"

/* ---- cuda_backend.cu ---- */
void           graphs_clear(cuda_state *s);
const int32_t *pass_ints(cuda_state *s, const int32_t *host, int n);
ag_status      reserve_xq(cuda_state *s, int n, int K);
ag_status      reserve_xh(cuda_state *s, int n, int K);
ag_status      reserve_att_for(cuda_state *s, size_t need, size_t heads);

/* ---- matmul.cu ---- */
ag_status            cu_matmul(ag_backend *be, const ag_tensor *w, const float *x, int n, int n_decode, float *y);
ag_status            cu_matmul_multi(ag_backend *be, const ag_tensor *const *w, int n_w, const float *x, int n,
                                     int n_decode, float *const *y);
ag_status            cu_get_rows(ag_backend *be, const ag_tensor *w, const int32_t *ids, int n, float *out);
void                 prep_forget(cuda_state *s, const void *p, size_t bytes);
int                  prep_formats(const cuda_state *s, int n, int dim);
void                 prep_made(cuda_state *s, const float *out, int n, int dim, int fmt);
int                  prep_ready(const cuda_state *s, const float *x, int n, int K);
__nv_bfloat16       *pp_reserve(cuda_state *s, size_t elems);
void                 pp_made(cuda_state *s, const float *x, size_t elems);
bool                 uses_dp4a(const cuda_state *s, const ag_tensor *w);
bool                 uses_mmt(const cuda_state *s, const ag_tensor *w);
const __nv_bfloat16 *xh_of(const cuda_state *s, const float *x, int n, int K);
ag_status            to_bf16(cuda_state *s, const float *x, int n, int K);
ag_status            prompt_weight_bf16(cuda_state *s, const ag_tensor *w, const __nv_bfloat16 **wb);
ag_status prompt_x_bf16(cuda_state *s, const float *x, int K, int n, int *x_ready, const __nv_bfloat16 **out);
ag_status gemm_bf16(cuda_state *s, const __nv_bfloat16 *wb, const __nv_bfloat16 *xbf, int K, int n_out, int n, void *y,
                    cudaDataType yt, float beta = 0.0f);

/* ---- mmv.cu ---- */
/* decode rows [0, n) of w over x on the fp32 GEMVs */
ag_status launch_mmv(cuda_state *s, const ag_tensor *w, const float *x, int n, float *y);

/* ---- mmt.cu ---- */
#define MMT_GROUP_MAX 4 /* the most weights of one launch_mmt_group */
int       mmt_target_warps(void);
int       mmq_target_warps(void);
void      launch_mmt_group(const cuda_state *s, const ag_tensor *const *w, int n_w, int K, const __nv_bfloat16 *x, int n,
                           float *const *y);
/* n > 16 decode rows of w over xh (BF16) in mmt_for's tiles; the caller checks the launch (LAUNCHED) */
ag_status launch_mmt_tiles(cuda_state *s, const ag_tensor *w, const __nv_bfloat16 *xh, int n, float *y);
ag_status ffn_decode_glu(ag_backend *be, const ag_tensor *gw, const ag_tensor *uw, const ag_tensor *dw, const float *h,
                         int n, int n_decode, bool gelu, float *gate, float *o, bool *done);

/* ---- mmq.cu ---- */
/* decode rows [0, n) of a Q4_K/Q6_K w over the activations in d_xq/d_xs: mmqv up to MMQV_FEW rows, else mmq */
ag_status launch_mmq(cuda_state *s, const ag_tensor *w, int n, float *y);
ag_status launch_mmqv(cuda_state *s, const ag_tensor *const *w, int n_w, int K, int n, float *const *y);
int       mmqv_group_len(const cuda_state *s, const ag_tensor *const *w, int n_w, int n_decode);

/* ---- norm_act.cu ---- */
ag_status cu_rmsnorm(ag_backend *be, const float *x, const float *w, int n, int dim, float eps, float *out);
ag_status cu_add_rmsnorm(ag_backend *be, float *x, const float *o, const float *w, int n, int dim, float eps,
                         float *out);
ag_status cu_add(ag_backend *be, float *y, const float *x, size_t n);
ag_status cu_add_bias(ag_backend *be, float *x, const float *b, int n, int dim);
ag_status cu_scale(ag_backend *be, float *x, float s, size_t n);
ag_status cu_silu_mul(ag_backend *be, float *g, const float *u, size_t n);
ag_status cu_gelu_mul(ag_backend *be, float *g, const float *u, size_t n);
ag_status cu_ffn(ag_backend *be, const ag_tensor *gw, const ag_tensor *uw, const ag_tensor *dw, const float *h, int n,
                 int n_decode, bool gelu, float *gate, float *up, float *o);

/* ---- moe.cu ---- */
ag_status cu_moe(ag_backend *be, const ag_moe_weights *w, const float *h, int n, int n_decode, float *o);
void      moe_free(cuda_state *s);

/* ---- rope_kv.cu ---- */
ag_status cu_rope(ag_backend *be, float *x, int n, int n_head, int head_dim, int rope_dim, const int32_t *pos,
                  float base, float freq_scale, bool neox);
ag_status cu_rope_freqs(ag_backend *be, float *x, int n, int n_head, int head_dim, int rope_dim, const int32_t *pos,
                        const float *freq, float mscale, bool neox);
ag_status cu_kv_store(ag_backend *be, ag_kv *kv, const ag_attn_shape *sh, const ag_batch_layout *b, const float *k,
                      const float *v);
ag_status cu_rope_kv_store(ag_backend *be, ag_kv *kv, const ag_attn_shape *sh, const ag_batch_layout *b, float *q,
                           float *k, const float *v, int rope_dim, const int32_t *pos, float base, float freq_scale,
                           bool neox);

/* ---- attn_decode.cu ---- */
ag_status cu_attention(ag_backend *be, ag_kv *kv, const ag_attn_shape *sh, const ag_batch_layout *b, const float *q,
                       float *out);

/* ---- attn_prompt_mma.cu ---- */
/* The pass's prompt rows (s->n_tiles > 0) of a KV head's query group a
 * block, head dim 64 or 128: attention_wg_k (s->fa_wg), attention_fa1_k or
 * attention_fa_k. */
ag_status launch_attention_group(cuda_state *s, const kv_geom &g, const ag_attn_shape *sh, const float *q, float *out);
/* The pass's prompt rows, a block per query head (attention_mma_k). */
ag_status launch_attention_mma(cuda_state *s, const kv_geom &g, const ag_attn_shape *sh, const float *q, float *out);

/* ---- attn_prompt_wgmma.cu ---- */
ag_status launch_attention_wg(cuda_state *s, const kv_geom &g, const ag_attn_shape *sh, const float *q, float *out);
bool      wg_var_built(int v);

/* ---- sample.cu ---- */
ag_status cu_argmax(ag_backend *be, const float *x, int n, int dim, int32_t *out);
ag_status cu_pick(ag_backend *be, const float *x, int n, int dim, const ag_batch_layout *lay, int row0, int32_t *out);
ag_status cu_cands(ag_backend *be, const float *x, int n, int dim, const ag_batch_layout *lay, int row0,
                   const int32_t *tok, ag_cands *out);
ag_status cu_edit(ag_backend *be, float *x, int n, int dim, const ag_batch_layout *lay);
ag_status cu_mask(ag_backend *be, float *x, int n, int dim, const ag_batch_layout *lay);
ag_status reserve_argmax(cuda_state *s, int n);
ag_status upload_edits(cuda_state *s, const ag_batch_layout *lay);
int32_t   cands_req_word(const ag_cands_req *q);

/* Points the pass's slot and tok_table arrays at those of layer's pool:
 * the ring's for a sliding-window layer kept in a ring (kv.h), else the
 * main pool's (begin uploads both). */
static inline void kv_select(cuda_state *s, ag_kv *kv, int layer) {
    const bool ring = ag_kv_layer_ring(kv, layer);
    s->d_slot = ring ? s->d_slot_ring : s->d_slot_main;
    s->d_tok_table = ring ? s->d_tt_ring : s->d_tt_main;
}

/* ---- mamba.cu ---- */
ag_status cu_mamba2(ag_backend *be, const ag_ssm_shape *sh, const float *zx, const ag_ssm_run *runs, int n_runs,
                    float *y);
void      ssm_free(cuda_state *s); /* (cu_destroy) */

#endif
