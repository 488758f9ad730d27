/* The switch table and its readers (switches.h). Most switches are A/B
 * choices kept for measurements and tests (bench/RESULTS.md and
 * docs/design-notes.md give each one's figures); the few a user sets are
 * marked "user" in their meaning. */
#include "base/switches.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"

#define F AG_SWITCH_FLAG
#define I AG_SWITCH_INT
#define R AG_SWITCH_REAL
#define T AG_SWITCH_TEXT

/* In name order (the lookup bisects). */
static const ag_switch_info k_switches[] = {
    {"AUGUR_AMX", F, "on where the CPU has AMX", "0: the AMX tile kernels off (the AVX-512 ones instead)", "cpu"},
    {"AUGUR_AMX_DECODE_MIN", I, "Q4_K 4, Q6_K 8", "decode rows from which K-quant matmuls take the AMX tiles", "cpu"},
    {"AUGUR_AMX_PACK", F, "on", "0: no tile-ready copy of the weights kept (AMX reads them as stored)", "cpu"},
    {"AUGUR_AMX_WINDOW", F, "on", "0: verify windows take the tile-ready copy too (A/B)", "cpu"},
    {"AUGUR_AMX_WINDOW_T", F, "on", "0: Q4_K windows take the 16-lane window panel, not its T mode (A/B, same bits)", "cpu"},
    {"AUGUR_API_KEY", T, "none", "user: the key `serve` requires (as --api-key)", "cli"},
    {"AUGUR_ARGMAX", F, "on", "0: greedy rows copied back and reduced on the host, not by the backend's argmax op", "model"},
    {"AUGUR_CANDS", F, "on", "0: samplers read whole copied rows, not the backend's best candidates", "model, bench"},
    {"AUGUR_CPU_DPANELS", F, "on", "0: AVX-512 decode rows stay on the dot kernels, not the VNNI panels", "cpu"},
    {"AUGUR_CPU_ISA", T, "the best the CPU has", "scalar|avx2|avx512: force the CPU kernels' level", "cpu"},
    {"AUGUR_CPU_PANELS", F, "on", "0: AVX-512 prompt rows stay off the VNNI panels", "cpu"},
    {"AUGUR_CPU_WPANELS", F, "on", "0: AVX-512 verify windows take the old dot/panel path, not the window panels", "cpu"},
    {"AUGUR_CUDA_ARGMAX_SPLIT", F, "on", "0: the argmax op one block a row", "cuda"},
    {"AUGUR_CUDA_ATT_FIT", F, "on", "0: the split-K decode attention always 16 splits deep", "cuda"},
    {"AUGUR_CUDA_ATT_MIN", I, "32", "positions from which decode attention is split (tests: 8)", "cuda"},
    {"AUGUR_CUDA_ATT_SPLITS", I, "16", "the split-K decode attention's splits (1-64)", "cuda"},
    {"AUGUR_CUDA_CANDS", F, "on", "0: no candidates op on the GPU (rows copied back)", "cuda"},
    {"AUGUR_CUDA_EDIT", F, "on", "0: no edit and mask kernels (rows edited and masked on the host)", "cuda"},
    {"AUGUR_CUDA_FA", T, "wg on sm_90a, else 1", "prompt attention: wg (wgmma), 1 (one pass, mma.sync), 2pass, head, 0 (SIMT)", "cuda"},
    {"AUGUR_CUDA_FA_ROWS", I, "3", "row tiles a block of the one-pass mma.sync prompt attention (1-3)", "cuda"},
    {"AUGUR_CUDA_FFN16", F, "on", "0: the feed-forward op as three ops in F32", "cuda"},
    {"AUGUR_CUDA_FUSE", F, "on", "0: add then rmsnorm, and rope then KV store, as separate kernels", "cuda"},
    {"AUGUR_CUDA_GLU", F, "on", "0: a 1-8-row BF16 SiLU/GELU block as three launches, not mmt_bf16_glu", "cuda"},
    {"AUGUR_CUDA_GRAPHS", F, "on", "0: decode passes launched, not replayed as recorded graphs", "cuda"},
    {"AUGUR_CUDA_GROUP", F, "on", "0: one launch per weight for the decode rows of weights sharing x", "cuda"},
    {"AUGUR_CUDA_MMQ_TILE", I, "0", "the K-quant decode kernel's tile beyond 16 rows (1-4; A/B, same bits)", "cuda"},
    {"AUGUR_CUDA_MMQ_WARPS", I, "2048", "the K-quant decode kernels' K-split target in warps (tuning; changes bits)", "cuda"},
    {"AUGUR_CUDA_MMT_LEAN", F, "on", "0: 1-8 BF16 decode rows at 16 warps without the lean kernel", "cuda"},
    {"AUGUR_CUDA_MMT_TILE", I, "by the batch", "the BF16 decode kernel's tile beyond 16 rows (0-4; same bits)", "cuda"},
    {"AUGUR_CUDA_MMT_WARPS", I, "2048", "the BF16 decode kernels' K-split target in warps (tuning; changes bits)", "cuda"},
    {"AUGUR_CUDA_MMV", T, "dp4a", "fp32: the other-type decode GEMVs in F32, not int8", "cuda"},
    {"AUGUR_CUDA_MMV_SPLIT", F, "on", "0: the few-row GEMVs in one K slice", "cuda"},
    {"AUGUR_CUDA_PAIR", I, "1", "0: the K-quant weights of a matmul_multi in separate mmqv launches; 2: pairs only", "cuda"},
    {"AUGUR_CUDA_PDL", F, "on (sm_90+)", "0: serial launches, no programmatic dependent launch", "cuda"},
    {"AUGUR_CUDA_PICK", F, "on", "0: no pick op on the GPU (rows copied back)", "cuda"},
    {"AUGUR_CUDA_PINNED", F, "on", "0: host arrays pageable, not pinned (A/B)", "cuda"},
    {"AUGUR_CUDA_PREP", F, "on", "0: decode rows' activations converted by the matmul, not their producer", "cuda"},
    {"AUGUR_CUDA_ROPE_VEC", F, "on", "0: rope_kv_store's scalar kernel", "cuda"},
    {"AUGUR_CUDA_SAMPLE_SPLIT", F, "on", "0: the pick and cands ops one block a row", "cuda"},
    {"AUGUR_CUDA_SPLITK", F, "on", "0: decode attention one block per row and head", "cuda"},
    {"AUGUR_CUDA_STAGE", I, "1 (sm_90+)", "mmqv rows staged in shared memory by bulk copies: 0 never, 2 every launch", "cuda"},
    {"AUGUR_CUDA_WG_VAR", I, "20", "bits of the wgmma prompt attention's variant (0, 6, 10, 16, 24, 52, 84 tested)", "cuda"},
    {"AUGUR_DEVICE", T, "auto", "user: cpu|cuda|auto, as --device; the C library's device", "cli, C library"},
    {"AUGUR_DPANEL_MIN", I, "Q4_K 5", "decode rows from which K-quants take the VNNI panels (A/B)", "cpu"},
    {"AUGUR_DRAFT_LOOKUP", F, "on", "0: the draft model's prompt lookup off", "spec"},
    {"AUGUR_DRAFT_VOCAB", I, "a draft's head rows", "rows of a draft model's output head computed (0: all)", "spec"},
    {"AUGUR_EDITS", F, "on", "0: penalties and bias applied by the samplers to copied rows, not where the logits are", "engine, bench"},
    {"AUGUR_KV_RING", F, "on", "0: sliding-window layers keep every position, not a ring of the window (A/B, tests)", "model"},
    {"AUGUR_LOG", T, "warn (info for serve)", "user: error|warn|info|debug", "base"},
    {"AUGUR_LOOKUP_MIN_MATCH", I, "the combined source's", "the draft model's lookup: shortest match (tuning)", "spec"},
    {"AUGUR_MASKS", F, "on", "0: structured-output masks applied by the samplers, not where the logits are", "engine"},
    {"AUGUR_MODEL", T, "the SmolLM2 file in models/", "user: the model when -m is not given", "cli"},
    {"AUGUR_PICK", F, "on", "0: tokens drawn from copied rows, not by the backend's pick op", "model"},
    {"AUGUR_POISON_ROWS", F, "off", "1: the CPU model leaves unwanted rows poisoned, as a device would (tests)", "model"},
    {"AUGUR_SPEC_MARGIN", R, "1.15", "how much a draft length must beat plain decoding to be chosen (1-3)", "spec"},
    {"AUGUR_SPEC_ROW_COST", R, "measured", "a verify row's cost as a fraction of a step, fixed (tests)", "engine"},
    {"AUGUR_TEST_KV_READ_DELAY_MS", I, "0", "tests: each disk-cache record read slowed by this much", "engine"},
    {"AUGUR_TEST_KV_SPACE_RETRY_MS", I, "10000", "tests: retry writing this soon after a full disk", "engine"},
    {"AUGUR_TEST_SCRIPT", T, "none", "tests: a file of a JSON list of texts forced as the answers, one a request", "server"},
    {"AUGUR_THREADS", I, "the CPUs online", "user: CPU threads (as -t)", "base"},
    {"AUGUR_TP", I, "1", "user: tensor-parallel shards (as --tp; CPU only for now)", "cli, C library"},
};

#undef F
#undef I
#undef R
#undef T

const ag_switch_info *ag_switch_table(int *n) {
    *n = (int)(sizeof k_switches / sizeof k_switches[0]);
    return k_switches;
}

static const ag_switch_info *find(const char *name) {
    int lo = 0, hi = (int)(sizeof k_switches / sizeof k_switches[0]) - 1;
    while (lo <= hi) {
        const int mid = (lo + hi) / 2, c = strcmp(name, k_switches[mid].name);
        if (!c) return &k_switches[mid];
        if (c < 0) hi = mid - 1;
        else lo = mid + 1;
    }
    return NULL;
}

const char *ag_switch_text(const char *name) {
    if (!find(name)) {
        AG_LOGE("internal: the switch %s is not in the table (src/base/switches.c)", name);
        return NULL;
    }
    const char *v = getenv(name);
    return v && *v ? v : NULL;
}

bool ag_switch_off(const char *name) {
    const char *v = ag_switch_text(name);
    return v && *v == '0';
}

long ag_switch_int(const char *name, long lo, long hi, long fallback) {
    const char *v = ag_switch_text(name);
    if (!v) return fallback;
    char *end;
    errno = 0;
    const long x = strtol(v, &end, 10);
    return errno || *end || x < lo || x > hi ? fallback : x;
}

double ag_switch_real(const char *name, double lo, double hi, double fallback) {
    const char *v = ag_switch_text(name);
    if (!v) return fallback;
    char *end;
    errno = 0;
    const double x = strtod(v, &end);
    return errno || *end || !(x >= lo && x <= hi) ? fallback : x;
}
