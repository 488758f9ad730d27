/* What the attention and KV-store kernels share: where a layer's KV
 * blocks are (kv_geom), the KV element loads and stores, the attention
 * limits, and attention_wg_k's variant bits (AUGUR_CUDA_WG_VAR, read at
 * start-up). */
#ifndef AG_CUDA_ATTN_CUH
#define AG_CUDA_ATTN_CUH

#include "backend/cuda/common.cuh"

/* Where one layer's blocks are: kv.h's layout, in bytes. */
typedef struct {
    uint8_t *k0;          /* K region of block 0 of this layer */
    size_t   v_off;       /* V region - K region within a block's layer */
    size_t   block_bytes; /* block stride */
    size_t   head_stride_k, head_stride_v, row_bytes_k, row_bytes_v;
    int      block_shift, block_mask;
} kv_geom;

static inline kv_geom geom_of(ag_kv *kv, int layer) {
    const ag_kv_layout *L = ag_kv_get_layout(kv);
    kv_geom             g;
    g.k0 = (uint8_t *)ag_kv_block_k(kv, layer, 0);
    g.v_off = (size_t)((uint8_t *)ag_kv_block_v(kv, layer, 0) - g.k0);
    g.block_bytes = ag_kv_layer_block_stride(kv, layer); /* (a ring layer's pool has its own) */
    g.head_stride_k = L->head_stride_k;
    g.head_stride_v = L->head_stride_v;
    g.row_bytes_k = L->row_bytes_k;
    g.row_bytes_v = L->row_bytes_v;
    g.block_shift = L->block_shift;
    g.block_mask = L->block_size - 1;
    return g;
}

template <bool F16>
static __device__ __forceinline__ void kv_put(uint8_t *p, int d, float v) {
    if (F16) ((__half *)p)[d] = __float2half_rn(v);
    else ((float *)p)[d] = v;
}
/* kv_put of v.x .. v.w at d .. d + 3 (d % 4 == 0, the row 16-byte aligned) */
template <bool F16>
static __device__ __forceinline__ void kv_put4(uint8_t *p, int d, float4 v) {
    if (F16) {
        const __half2 a = __floats2half2_rn(v.x, v.y), b = __floats2half2_rn(v.z, v.w);
        *(uint2 *)((__half *)p + d) = make_uint2(*(const uint32_t *)&a, *(const uint32_t *)&b);
    } else *(float4 *)((float *)p + d) = v;
}
template <bool F16>
static __device__ __forceinline__ float kv_get(const uint8_t *p, int d) {
    if (F16) return __half2float(((const __half *)p)[d]);
    return ((const float *)p)[d];
}
#define ATT_THREADS 128
#define ATT_CHUNK 512
#define ATT_MAX_DV 256 /* head_dim_v up to 2 * ATT_THREADS */

/* attention_wg_k / attention_wgp_k (attn_prompt_wgmma.cu) */
#define WG_ROWS  64 /* query rows a warpgroup (one head) */
#define WG_HEADS 2  /* query heads (warpgroups) a block */
#define WG_PANEL 8192 /* bytes of a [64][64] fp16 swizzled panel */
#define WG_SKIP  2    /* variant: no rescale of O where no max rose (wg_rescale) */
#define WG_DEEP  4    /* variant: four K/V buffers, chunk c + 2 loading while c is computed */
#define WG_N128  8    /* variant: chunks of 128 positions (S by m64n128k16; not with WG_DEEP) */
#define WG_PROD  16   /* variant: attention_wgp_k, a producer warpgroup stages K/V (with WG_DEEP or not) */
#define WG_PING  32   /* variant of attention_wgp_k: the consumers take turns issuing their wgmmas */
#define WG_PIN   64   /* variant of attention_wgp_k: O's rescale pinned before the fence (see the chunk loop) */

#endif
