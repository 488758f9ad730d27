/* CPU attention over the paged KV cache (see backend.h for the op
 * contracts and kv.h for the storage layout). */
#ifndef AG_BACKEND_CPU_ATTENTION_H
#define AG_BACKEND_CPU_ATTENTION_H

#include "backend/backend.h"

/* Picks the SIMD inner loops for the active ISA (ag_cpu_isa_active). Called
 * when a CPU backend is created; idempotent. */
void ag_cpu_attention_init(void);

/* Writes each token's K/V rows into its reserved KV slot (F16 or F32 storage). */
ag_status ag_cpu_kv_store(ag_kv *kv, const ag_attn_shape *s, const ag_batch_layout *b, const float *k,
                          const float *v);

/* Attention for batch rows [t0, t1) (1..AG_ATTN_MAX_ROWS rows of one
 * sequence) and kv head g: writes the outputs of the query heads of group g
 * for those rows. A row's result does not depend on which rows share the
 * call. `scratch` holds ag_cpu_attention_scratch_floats() floats, private to
 * the caller's thread. Calls on disjoint (rows, head) are independent and
 * may run concurrently. */
#define AG_ATTN_MAX_ROWS 8
void   ag_cpu_attention_rows(ag_kv *kv, const ag_attn_shape *s, const ag_batch_layout *b, const float *q,
                             float *out, int t0, int t1, int g, float *scratch);
/* The softmax's e^x for x <= 0 (the same bits on every ISA; expf's value
 * but for rare last-bit ties). Exposed for tests. */
float ag_cpu_softmax_exp(float x);

/* Scratch for calls whose rows sit at positions <= max_pos, over a KV of
 * block_size positions per block. */
size_t ag_cpu_attention_scratch_floats(int block_size, const ag_attn_shape *s, int max_pos);

#endif
