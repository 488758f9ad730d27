/* CPU attention over the paged KV cache, and the KV store op.
 *
 * One task is one (token, kv head) pair: the query heads that share that kv
 * head (grouped-query attention) are processed together, so each K/V block
 * is converted to float once per group and read from memory once. Two
 * passes per task: scores for every visible position, then the softmax-
 * weighted sum of V (the reference's order of rounding, see round_f16). */
#include "backend/cpu/attention.h"

#include <math.h>
#include <string.h>

#include "backend/cpu/quant.h"
#include "kv/kv.h"

ag_status ag_cpu_kv_store(ag_kv *kv, const ag_attn_shape *s, const ag_batch_layout *b, const float *k,
                          const float *v) {
    const ag_kv_layout *L = ag_kv_get_layout(kv);
    const size_t kd = (size_t)s->n_head_kv * s->head_dim_k, vd = (size_t)s->n_head_kv * s->head_dim_v;
    for (int t = 0; t < b->n; t++) {
        int32_t block, off;
        ag_status st = ag_kv_slot(kv, b->seq[t], b->pos[t], &block, &off);
        if (st) return st;
        uint8_t *kb = ag_kv_block_k(kv, s->layer, block);
        uint8_t *vb = ag_kv_block_v(kv, s->layer, block);
        for (int h = 0; h < s->n_head_kv; h++) {
            const float *kr = k + t * kd + (size_t)h * s->head_dim_k;
            const float *vr = v + t * vd + (size_t)h * s->head_dim_v;
            void *kdst = kb + h * L->head_stride_k + (size_t)off * L->row_bytes_k;
            void *vdst = vb + h * L->head_stride_v + (size_t)off * L->row_bytes_v;
            if (L->dtype == AG_KV_F16) {
                ag_fp32_to_fp16_row(kr, kdst, s->head_dim_k);
                ag_fp32_to_fp16_row(vr, vdst, s->head_dim_v);
            } else {
                memcpy(kdst, kr, sizeof(float) * s->head_dim_k);
                memcpy(vdst, vr, sizeof(float) * s->head_dim_v);
            }
        }
    }
    return AG_OK;
}

/* Rows [o0, o1) of one (layer, block, head) region as floats: converted into
 * `tmp` for F16 storage, or pointed at directly for F32. */
static const float *rows_f32(const ag_kv_layout *L, const uint8_t *base, size_t row_bytes, int dim, int o0,
                             int o1, float *tmp) {
    const uint8_t *p = base + (size_t)o0 * row_bytes;
    if (L->dtype == AG_KV_F32) return (const float *)p;
    ag_fp16_to_fp32_row((const uint16_t *)p, tmp, (int64_t)(o1 - o0) * dim);
    return tmp;
}

/* Rounds through fp16: llama.cpp (the reference) multiplies Q with the F16 K
 * cache and the softmax weights with the F16 V cache as F16 values. Doing the
 * same keeps our rounding in step with it, which matters more than it seems:
 * in a quantized model a 1e-3 perturbation flips the int8 rounding of later
 * activations, and the two implementations then drift apart. */
static inline float round_f16(float x) { return ag_fp16_to_fp32(ag_fp32_to_fp16(x)); }

void ag_cpu_attention_task(ag_kv *kv, const ag_attn_shape *s, const ag_batch_layout *b, const float *q,
                           float *out, int task, float *scratch) {
    const ag_kv_layout *L = ag_kv_get_layout(kv);
    const int t = task / s->n_head_kv, g = task % s->n_head_kv;
    const int group = s->n_head / s->n_head_kv;
    const int dk = s->head_dim_k, dv = s->head_dim_v, bs = L->block_size;
    const int pos = b->pos[t];
    const int lo = s->window > 0 && pos - s->window + 1 > 0 ? pos - s->window + 1 : 0;
    const int n_pos = pos - lo + 1;
    int32_t n_blocks;
    const int32_t *table = ag_kv_seq_blocks(kv, b->seq[t], &n_blocks);

    /* scratch: kvbuf[bs * max(dk, dv)], qh[group * dk], sc[group * n_pos], acc[group * dv] */
    float *kvbuf = scratch;
    float *qh = kvbuf + (size_t)bs * (dk > dv ? dk : dv);
    float *sc = qh + (size_t)group * dk;
    float *acc = sc + (size_t)group * n_pos;
    const size_t qd = (size_t)s->n_head * dk;
    for (int h = 0; h < group; h++)
        for (int i = 0; i < dk; i++) qh[h * dk + i] = round_f16(q[t * qd + (size_t)(g * group + h) * dk + i]);

    /* pass 1: scores, block by block (each K block converted once for the group) */
    const int b0 = lo / bs, b1 = pos / bs < n_blocks ? pos / bs : n_blocks - 1;
    for (int bi = b0; bi <= b1; bi++) {
        const int o0 = bi * bs < lo ? lo - bi * bs : 0;
        const int o1 = (bi + 1) * bs - 1 > pos ? pos - bi * bs + 1 : bs;
        const uint8_t *kb = (const uint8_t *)ag_kv_block_k(kv, s->layer, table[bi]) + g * L->head_stride_k;
        const float *K = rows_f32(L, kb, L->row_bytes_k, dk, o0, o1, kvbuf);
        for (int h = 0; h < group; h++) {
            const float *qv = qh + (size_t)h * dk;
            float *row = sc + (size_t)h * n_pos + (bi * bs + o0 - lo);
            for (int j = 0; j < o1 - o0; j++) {
                const float *kr = K + (size_t)j * dk;
                float d = 0;
                for (int i = 0; i < dk; i++) d += qv[i] * kr[i];
                d *= s->scale;
                if (s->softcap > 0) d = s->softcap * tanhf(d / s->softcap);
                row[j] = d;
            }
        }
    }
    /* softmax per head; the weights rounded to fp16 as the reference does */
    for (int h = 0; h < group; h++) {
        float *row = sc + (size_t)h * n_pos;
        float mx = -INFINITY;
        for (int j = 0; j < n_pos; j++) mx = row[j] > mx ? row[j] : mx;
        double sum = 0;
        for (int j = 0; j < n_pos; j++) {
            row[j] = expf(row[j] - mx);
            sum += row[j];
        }
        float inv = (float)(1.0 / sum);
        for (int j = 0; j < n_pos; j++) row[j] = round_f16(row[j] * inv);
    }
    /* pass 2: weighted sum of V (each V block converted once for the group) */
    memset(acc, 0, sizeof(float) * (size_t)group * dv);
    for (int bi = b0; bi <= b1; bi++) {
        const int o0 = bi * bs < lo ? lo - bi * bs : 0;
        const int o1 = (bi + 1) * bs - 1 > pos ? pos - bi * bs + 1 : bs;
        const uint8_t *vb = (const uint8_t *)ag_kv_block_v(kv, s->layer, table[bi]) + g * L->head_stride_v;
        const float *V = rows_f32(L, vb, L->row_bytes_v, dv, o0, o1, kvbuf);
        for (int h = 0; h < group; h++) {
            const float *p = sc + (size_t)h * n_pos + (bi * bs + o0 - lo);
            float *a = acc + (size_t)h * dv;
            for (int j = 0; j < o1 - o0; j++) {
                const float *vr = V + (size_t)j * dv;
                const float w = p[j];
                for (int i = 0; i < dv; i++) a[i] += w * vr[i];
            }
        }
    }
    const size_t od = (size_t)s->n_head * dv;
    for (int h = 0; h < group; h++) memcpy(out + t * od + (size_t)(g * group + h) * dv, acc + (size_t)h * dv,
                                          sizeof(float) * dv);
}

size_t ag_cpu_attention_scratch_floats(const ag_kv *kv, const ag_attn_shape *s, int max_pos) {
    const ag_kv_layout *L = ag_kv_get_layout(kv);
    const size_t group = (size_t)(s->n_head / s->n_head_kv);
    const size_t dmax = (size_t)(s->head_dim_k > s->head_dim_v ? s->head_dim_k : s->head_dim_v);
    size_t n_pos = (size_t)max_pos + 1;
    if (s->window > 0 && n_pos > (size_t)s->window) n_pos = (size_t)s->window;
    return (size_t)L->block_size * dmax + group * ((size_t)s->head_dim_k + n_pos + (size_t)s->head_dim_v);
}
