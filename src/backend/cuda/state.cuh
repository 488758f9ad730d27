/* The CUDA backend's state (cuda_state: one per device, be->impl) and
 * the launch helper every family uses (launch_k: PDL). What one family
 * owns is its own struct (cuda_sample_state, cuda_rope_state,
 * cuda_attn_split_state); the rest the families share (the pass's arrays,
 * the prepared activations, the decode
 * kernels' switches), documented member by member. */
#ifndef AG_CUDA_STATE_CUH
#define AG_CUDA_STATE_CUH

#include "backend/cuda/common.cuh"

/* ---- state ---- */

typedef struct {
    const void *host;
    size_t      bytes;
    void       *dev;
} weight_copy;

/* a recorded decode pass */
typedef struct {
    uint64_t        key;
    const int32_t  *ints;
    cudaGraphExec_t exec; /* NULL: recording this key failed; run it unrecorded */
} graph_entry;

/* sample.cu's buffers: the sampling ops' scratch and the pass's edits
 * and masks (allocated in ag_cuda_backend_new and begin, freed in
 * cu_destroy) */
typedef struct {
    /* argmax_split_k's partials (ARGMAX_SLICES per row) and per-row
     * counters, for cap_am_rows rows (reserved in begin for the pass) */
    bool    argmax_split; /* argmax_split_k (AUGUR_CUDA_ARGMAX_SPLIT=0: one block a row) */
    float  *d_am_v;
    int    *d_am_i, *d_am_cnt;
    size_t  cap_am_rows;
    /* the scratch of the pick and cands ops' split grids (few rows, each
     * cut into slices of a block; split_slices), allocated with the
     * backend for SPLIT_BLOCKS slices and SPLIT_BLOCKS / 2 rows (2 slices
     * or more a row): cands_split_k's slices' best (AG_CANDS_MAX keys and
     * ids each) and counts, a double a slice (cands_z_k's sums,
     * pick_split_k's totals), pick_split_k's threads' sums
     * (PICK_SPLIT_THREADS a slice), pick_max_k's maxima (a slice's, a
     * row's), and a counter per row (zero between launches) */
    bool      sample_split; /* AUGUR_CUDA_SAMPLE_SPLIT=0: one block a row at every batch size (A/B) */
    uint32_t *d_cs_key;
    int32_t  *d_cs_id;
    int      *d_cs_nf, *d_split_cnt;
    double   *d_split_sum, *d_sp_part;
    float    *d_sp_slice_m, *d_sp_m;
    /* the pass's edits (begin; the edit op): a count, padding, then
     * edit_rec records; staged in h_edits (pinned). A regrown d_edits
     * drops the recorded passes. */
    int32_t       *d_edits, *h_edits;
    size_t         cap_edits, cap_h_edits; /* int32 elements */
    /* the pass's masks (begin; the mask op): a flag per output row (1: it
     * has a bitmap), then n_out bitmaps of allow_words words; staged in
     * h_masks. A regrown d_masks drops the recorded passes. */
    uint32_t      *d_masks, *h_masks;
    size_t         cap_masks, cap_h_masks; /* words */
} cuda_sample_state;

/* rope_kv.cu's table of the pass's angles (sized in begin) */
typedef struct {
    /* rope_kv_store's angles for the pass's rows: (cos, sin) per row and
     * pair for up to two (base, freq_scale, rope_dim) sets (Gemma 3's local
     * and global layers), made by the pass's first layer of each set
     * (rope_table_k: the double-precision pow/cos/sin once per pass instead
     * of once per layer) and read by the later ones; forgotten at begin.
     * Sized in begin: 2 sets x n rows x ROPE_MAX_HALF. */
    float2 *d_rope;
    size_t  cap_rope; /* float2 elements */
    struct {
        float base, freq_scale;
        int   dim;
    } rope_set[2];
    int n_rope_sets;
} cuda_rope_state;

/* attn_decode.cu's split-K scratch and settings (sized in begin, or by
 * cu_attention outside a recorded pass; max_att_out from prepare_weight) */
typedef struct {
    /* split-K decode attention (the default; AUGUR_CUDA_SPLITK=0: one block
     * per row and head): each split's (m, l) and unnormalized V sums, and a
     * counter per (row, head) for the last split to combine them; sized in
     * begin from max_att_out (the widest attn_output weight's ne[0] =
     * n_head * hd_v). att_splits: the most splits of a row (16;
     * AUGUR_CUDA_ATT_SPLITS=1..64 for tuning); att_min: the fewest positions
     * per split (32; AUGUR_CUDA_ATT_MIN for tuning: 8 was no faster at
     * batch 1, H200, 8B Q4_K_M 281 vs 284 tok/s). */
    bool     splitk_on;
    int      att_splits, att_min;
    int      att_z; /* this pass's grid z: att_splits, or with att_fit a power of 2 >= every decode row's splits */
    bool     att_fit; /* split-K grid z fitted to the pass (AUGUR_CUDA_ATT_FIT=0: always att_splits) */
    float   *d_att_part;
    size_t   cap_att_part; /* floats */
    int     *d_att_cnt;
    size_t   cap_att_cnt;  /* ints, zero between passes */
    int      max_att_out;
} cuda_attn_split_state;

/* moe.cu's scratch (grown to the largest call, freed in cu_destroy by
 * moe_free). Device: the router's logits [n][E]; the gathered rows of h
 * [n K][D], grouped by expert (ascending id), each expert's decode rows
 * first; their gate and up products [n K][F] and outputs [n K][D]; the
 * per-entry ints (the row an entry came from, its expert) and each row's
 * entries and weights in ascending expert id [n][K]. Host (pinned): the
 * logits downloaded and the ints and weights uploaded. */
typedef struct {
    bool     host_routed; /* a stack of experts was prepared: no recorded passes (cu_graph_begin) */
    float   *d_logits, *d_xg, *d_g, *d_u, *d_y, *d_wts;
    int32_t *d_ints;
    size_t   cap_logits, cap_xg, cap_g, cap_u, cap_y, cap_wts, cap_ints; /* elements */
    void    *h_buf;    /* pinned: the logits, then the ints and weights to upload */
    size_t   cap_h;    /* bytes */
} cuda_moe_state;

typedef struct {
    int            device;
    int            sm_count;
    cudaStream_t   stream;
    cublasHandle_t blas;
    weight_copy   *w; /* one device copy per distinct host tensor (tied embeddings share) */
    size_t         n_w, cap_w;
    size_t         weight_bytes;

    /* the current forward pass (begin): device copies of its host arrays */
    int            n;
    const int32_t *h_tokens, *h_pos;
    int32_t       *d_ints;    /* tokens[n] pos[n] slot[n] tok_table[n] tables[...] */
    size_t         cap_ints;  /* int32 elements */
    int32_t       *h_pinned;  /* staging for the upload */
    size_t         cap_pinned;
    int32_t       *d_tokens, *d_pos, *d_slot, *d_tok_table, *d_tables;
    /* The main pool's slot and tok_table arrays, and the ring's (a
     * sliding-window layer's KV lives in the ring pool: kv.h); kv_select
     * points d_slot / d_tok_table at one pair per layer. Both pairs sit at
     * fixed offsets of d_ints (a recorded decode graph keeps pointers). */
    int32_t       *d_slot_main, *d_tt_main, *d_slot_ring, *d_tt_ring;
    int32_t       *d_tiles; /* [n_tiles + 1]: prompt rows in runs of one sequence (attention tiles) */
    /* [n_btiles[r] + 1]: the same runs in tiles of up to (r + 2) ATT_TQ rows
     * (attention_fa1_k's blocks of r + 2 row tiles; attention_wg_k's 64 rows) */
    int32_t       *d_btiles[BTILE_MAX - 1];
    int            n_btiles[BTILE_MAX - 1];
    int32_t       *d_draws; /* [3 n_out]: the pass's pick draws (begin) */
    int32_t       *d_cand_reqs; /* [n_out]: the pass's cands requests, a word each (cands_req_word; begin) */
    int            n_tiles;

    /* prompt-row GEMM scratch: the weight and the activations in BF16, an
     * F16 weight in FP32 */
    __nv_bfloat16 *d_wbf, *d_xbf;
    float         *d_wf;
    size_t         cap_wbf, cap_xbf, cap_wf; /* elements */

    ag_kv_mem kvmem;

    /* decode rows' activations as int8 per 32 (quantize_q8_32) for the
     * K-quant kernels (mmqv, mmq); sized in begin for n rows of the widest
     * weight (max_k), so a recorded pass never regrows them */
    int8_t *d_xq;
    float2 *d_xs;
    size_t  cap_xq, cap_xs; /* elements */
    int     max_k;          /* largest ne[0] of a prepared K-quant weight */
    /* mmv_dp4a: decode rows of Q4_K/Q6_K on int8 activations (uses_dp4a:
     * up to MMQV_FEW rows a matmul mmqv, more mmq, both with mmq's bits)
     * and of BF16 on mmt_bf16 (uses_mmt); AUGUR_CUDA_MMV=fp32: the fp32
     * GEMVs for every type (an A/B switch) */
    bool    mmv_dp4a;
    /* fa_on: prompt-row attention over fp16 KV on the tensor cores
     * (attention_mma_k) unless AUGUR_CUDA_FA=0 (the SIMT tile kernel): 8B
     * BF16 prefill at 512 / 4096 tokens 9078 / 1895 tok/s -> 21969 / 8742. */
    bool fa_on;
    bool mmqv_smem_ready[2]; /* the staged mmqv<NT, true>'s dynamic shared memory opted in to 48 KB (NT 1, 2) */
    bool fa_per_head; /* AUGUR_CUDA_FA=head: attention_mma_k (a block per query head) for every head dim (A/B) */
    /* fa_one_pass: attention_fa1_k, the default; AUGUR_CUDA_FA=2pass:
     * attention_fa_k. H200, 8B prefill at 512 / 4096 tokens, tok/s, two-pass
     * -> one-pass: BF16 24730 / 14708 -> 29020 / 24564, Q4_K_M 16396 / 11287
     * -> 18212 / 16398 (2026-12-05) */
    bool fa_one_pass;
    /* fa_wg: attention_wg_k (wgmma) for the prompt rows of head dims 64
     * and 128, the default of sm_90a builds on a CC 9.0 device (AUGUR_CUDA_FA=1:
     * attention_fa1_k there too) */
    bool fa_wg;
    bool rope_vec_on; /* rope_kv_store_vec_k where the shapes allow (AUGUR_CUDA_ROPE_VEC=0: the scalar kernel, A/B) */
    int  wg_var; /* attention_wg_k's variants (WG_SKIP | WG_DEEP | WG_N128 | WG_PROD | WG_PING | WG_PIN; AUGUR_CUDA_WG_VAR, default WG_PROD | WG_DEEP) */
    /* attention_fa1_k's row tiles (of ATT_TQ rows) a block, 1..FA_ROWS_MAX,
     * as many as fit the register file (AUGUR_CUDA_FA_ROWS) */
    int fa_rows;
    bool group_on;     /* matmul_multi's BF16 decode rows in one launch (AUGUR_CUDA_GROUP=0: one per weight, for A/B) */
    int  mmq_tile;     /* the K-quant decode kernel's tile beyond 16 rows (AUGUR_CUDA_MMQ_TILE, mmq_for; 0: default) */
    int  mmt_tile;     /* the BF16 decode kernel's tile beyond 16 rows (AUGUR_CUDA_MMT_TILE, mmt_for; -1: by the batch) */
    bool mmt_lean;     /* up to 8 rows at 16 warps a block: mmt_bf16_group_lean (AUGUR_CUDA_MMT_LEAN=0: off) */
    bool mmt_staged_ready[3]; /* mmt_bf16_staged's shared-memory limit raised, by 4, 8 or 16 warps */
    bool mmv_split_on; /* mmqv's rows over several warps for few-row weights (mmqv_ws; AUGUR_CUDA_MMV_SPLIT=0: off, A/B) */
    /* mmqv's rows staged in shared memory (stage_rows): 1 in group
     * launches (the default), 2 in every launch, 0 none (AUGUR_CUDA_STAGE=0|1|2;
     * why 1: see stage_rows) */
    int stage_mode;
    /* matmul_multi's Q4_K/Q6_K weights' few decode rows in one mmqv launch
     * (mmqv_group_len): 1 groups of up to MMQV_PARTS (the default), 2 only
     * pairs (A/B), 0 none (AUGUR_CUDA_PAIR=0|2) */
    int pair_mode;
    bool fuse_on;     /* add_rmsnorm and rope_kv_store in one kernel each (the default; AUGUR_CUDA_FUSE=0: the
                         separate ops' kernels, for A/B) */

    /* Activations a producer op (rmsnorm, add_rmsnorm, silu_mul) of a pass
     * with decode rows also left, while writing them, in the decode rows'
     * formats (XR_*: d_xq/d_xs for the K-quant kernels, d_xh for mmt_bf16):
     * the next matmul that reads prep_x skips its conversion kernel (2-3 us
     * a launch at batch 1, three a layer). The same arithmetic as the
     * conversion kernels, so the same bits. Forgotten when an op writes
     * memory overlapping prep_x's rows, when a matmul converts other
     * activations into those buffers, and at begin. prep_want: the formats
     * the prepared weights read; AUGUR_CUDA_PREP=0: off (A/B). */
    const float *prep_x;
    int          prep_rows, prep_dim, prep_fmt, prep_want;
    bool         prep_on;
    /* where prep_x's BF16 rows are: d_xh, or (ffn_decode_glu's product,
     * made while its input is read from d_xh) the other half of d_xh */
    const __nv_bfloat16 *prep_h;
    bool glu_on; /* ffn_decode_glu: gate/up and the SiLU or GELU product in one launch (AUGUR_CUDA_GLU=0: off, for A/B) */
    bool         ffn16_on; /* cu_ffn's prompt rows in BF16 (AUGUR_CUDA_FFN16=0: off, for A/B) */
    /* Prompt rows likewise: silu_mul, the rmsnorms over the pass's rows and
     * the one-pass prompt attention leave the pass's prompt rows also as
     * BF16 in d_xbf, which the next GEMM (down; q/k/v and gate/up; the
     * output projection) reads instead of converting them (at 4096 rows the
     * conversion read 235 MB of an 8B's F32 activations a layer).
     * d_xbf[0..pp_elems) holds pp_x[0..pp_elems); used once, forgotten as
     * prep_x is; AUGUR_CUDA_PREP=0 turns it off too. */
    const float   *pp_x;
    size_t         pp_elems;
    __nv_bfloat16 *pp_xbf_now; /* where the current matmul_multi's x sits as BF16 (in d_xbf) */
    int          pass_n_decode; /* the pass's decode rows (begin) */



    /* decode rows' activations in BF16 for the tensor-core kernel of BF16
     * weights (mmt_bf16); sized in begin like d_xq (max_k_bf16) */
    __nv_bfloat16 *d_xh;
    size_t         cap_xh;     /* elements */
    int            max_k_bf16; /* largest ne[0] of a prepared BF16 weight */

    /* recorded decode passes (graph_begin/graph_end), keyed by the model's
     * key and the pass buffer they read (a regrown d_ints invalidates) */
    graph_entry graphs[64];
    int  n_graphs;
    bool graphs_on; /* on unless AUGUR_CUDA_GRAPHS=0: +8-11% batch-1 decode on an 8B model */
    bool pdl_on;    /* kernels launched early (programmatic dependent launch; AUGUR_CUDA_PDL=0: serial) */

    cuda_sample_state     smp;  /* sample.cu */
    cuda_rope_state       rope; /* rope_kv.cu */
    cuda_attn_split_state att;  /* attn_decode.cu: split-K */
    void                 *ssm;  /* mamba.cu's scratch (cuda_ssm_scratch), made at its first call */
    cuda_moe_state        moe;  /* moe.cu */
} cuda_state;

/* k<<<grid, block, smem, s->stream>>>(args...), with the PDL attribute
 * when s->pdl_on. Errors show in cudaGetLastError (LAUNCHED). */
template <typename... KArgs, typename... Args>
static cudaError_t launch_k(const cuda_state *s, void (*k)(KArgs...), dim3 grid, dim3 block, size_t smem,
                            Args... args) {
    cudaLaunchConfig_t  cfg = {};
    cudaLaunchAttribute attr;
    cfg.gridDim = grid, cfg.blockDim = block, cfg.dynamicSmemBytes = smem, cfg.stream = s->stream;
    if (s->pdl_on) {
        attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
        attr.val.programmaticStreamSerializationAllowed = 1;
        cfg.attrs = &attr, cfg.numAttrs = 1;
    }
    return cudaLaunchKernelEx(&cfg, k, args...);
}

static inline cuda_state *st_of(ag_backend *be) { return (cuda_state *)be->impl; }

static inline ag_status grow(void **p, size_t *cap, size_t need, size_t elem) {
    if (need <= *cap) return AG_OK;
    size_t n = need + need / 4;
    if (*p) cudaFree(*p);
    *p = NULL;
    *cap = 0;
    CUDA_TRY(cudaMalloc(p, n * elem));
    *cap = n;
    return AG_OK;
}

#endif
