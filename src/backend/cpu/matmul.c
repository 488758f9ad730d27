/* Matmul driver: quantize X, then tile (rows × token chunks) over the pool.
 *
 * Two kinds of rows (see ag_batch.n_prompt): decode rows go through the dot
 * kernels (ag_matmul, ag_matmul_multi), Q4_K / Q6_K windows of a few
 * tokens through panel kernels with the same bits (the AVX2 window panels,
 * the AVX-512 VNNI token panels; with AMX the backend sends them to the
 * tiles from ag_matmul_amx_decode_min rows); prompt rows through
 * AMX tiles where the CPU has them (matmul_amx.c), else through the same
 * driver with the
 * AVX2 token-panel kernels (X packed eight tokens at a time, see
 * ag_panel_q8k) or the AVX-512 VNNI tile kernels (ag_matmul_prompt). A
 * token's result depends only on its own row and its kind, never on the
 * rest of the batch; for Q4_K and Q6_K not even on its kind.
 *
 * Tiling: a task owns a range of weight rows and a chunk of tokens. Inside,
 * each weight row is read from memory once and multiplied with the chunk's
 * tokens four at a time (the kernels unpack a block once per 4 tokens);
 * for prompt rows, where the ISA has a tile kernel (AVX-512 VNNI, legacy
 * types), rows go four at a time too, so each activation block is also
 * loaded once per 4 rows. The token chunk is sized so its activations stay
 * in L2 while the task walks its rows; the row range is sized for about 8
 * tasks per thread so dynamic scheduling absorbs uneven threads. */
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/matmul.h"
#include "backend/cpu/matmul_amx.h"
#include "backend/cpu/quant_impl.h"
#include "base/switches.h"

#define L2_ACT_BUDGET (512 * 1024) /* bytes of activations a task keeps hot */

/* The panel paths (below): token panels for prompt rows, window panels
 * (window = true) for decode windows of Q4_K / Q6_K. */
static ag_panel_fn decode_panel_kernel(uint32_t w_type, int64_t n_tok);
static size_t      panel_scratch_size(ag_act_format f, int64_t n_in, int64_t n_tok, bool window);
static void        panel_quantize(ag_threadpool *pool, ag_act_format fmt, bool window, const float *x, int64_t ldx,
                                  int64_t n_tok, int64_t n_in, void *buf, uint8_t **rows, uint8_t **panels);
static ag_status   matmul_panels(ag_threadpool *pool, uint32_t w_type, ag_panel_fn pk, bool window, bool decode,
                                 const void *w, int64_t n_out, int64_t n_in, const float *x, int64_t ldx, int64_t n_tok, float *y,
                                 int64_t ldy, void *scratch, size_t scratch_size);

static bool use_amx(uint32_t w_type);

/* The panels decode rows are packed in: window panels for the window
 * kernels (AVX2; AVX-512 VNNI without AMX), token panels where the ISA has
 * decode-panel kernels and the CPU AMX (AVX-512 VNNI, dpanel: the choice
 * measured beside the tiles, kept as it was). */
static bool decode_windows(uint32_t w_type) {
    if (w_type >= AG_TYPE_COUNT) return true;
    const ag_quant_kernels *k = ag_quant_kernels_active();
    return !k->dpanel[w_type] || (k->wpanel16 && !use_amx(w_type));
}

/* Tokens per panel and bytes per panel row of each kind. */
static int    panel_tokens(bool window) { return window ? AG_WPANEL_NT : AG_PANEL_NT; }
static size_t panel_row_bytes(ag_act_format f, int64_t n, bool window) {
    return !window ? ag_panel_row_bytes(f, n) : f == AG_ACT_Q8K ? ag_wpanel_row_bytes(n) : 0;
}

static ag_status check_common(uint32_t w_type, const void *w, int64_t n_out, int64_t n_in, int64_t n_tok,
                              const void *y, int64_t ldy, ag_act_format *fmt) {
    ag_status st = ag_quant_act_format(w_type, fmt);
    if (st != AG_OK) return st;
    if (n_out < 0 || n_tok < 0)
        return ag_errorf(AG_ERR_INVALID, "matmul: negative size (n_out %lld, n_tok %lld)", (long long)n_out,
                         (long long)n_tok);
    if (ag_quant_row_bytes(w_type, n_in) == 0)
        return ag_errorf(AG_ERR_INVALID, "matmul: n_in %lld is not a positive multiple of the weight block",
                         (long long)n_in);
    if (ldy < n_out) return ag_errorf(AG_ERR_INVALID, "matmul: ldy %lld < n_out %lld", (long long)ldy, (long long)n_out);
    if (n_out > 0 && n_tok > 0 && (!w || !y)) return ag_errorf(AG_ERR_INVALID, "matmul: NULL pointer");
    /* every index computed below fits: rows * row bytes and tokens * ldy */
    size_t tmp;
    if (__builtin_mul_overflow((size_t)n_out, ag_quant_row_bytes(w_type, n_in), &tmp) ||
        __builtin_mul_overflow((size_t)n_tok, (size_t)ldy, &tmp))
        return ag_errorf(AG_ERR_INVALID, "matmul: sizes overflow");
    return AG_OK;
}

/* X's own checks, once the weights' passed: ldx always; NULL and n_tok * ldx
 * overflow only when there is a product to compute (n_out, n_tok > 0). */
static ag_status check_x(const float *x, int64_t ldx, int64_t n_in, int64_t n_out, int64_t n_tok) {
    size_t tmp;
    if (ldx < n_in) return ag_errorf(AG_ERR_INVALID, "matmul: ldx %lld < n_in %lld", (long long)ldx, (long long)n_in);
    if (n_out == 0 || n_tok == 0) return AG_OK;
    if (!x) return ag_errorf(AG_ERR_INVALID, "matmul: NULL pointer");
    if (__builtin_mul_overflow((size_t)n_tok, (size_t)ldx * sizeof(float), &tmp))
        return ag_errorf(AG_ERR_INVALID, "matmul: sizes overflow");
    return AG_OK;
}

/* The caller's scratch if it holds `need` bytes, else a fresh allocation
 * returned in *owned too (the caller frees it); NULL when out of memory. */
static void *scratch_or_alloc(void *scratch, size_t scratch_size, size_t need, void **owned) {
    *owned = NULL;
    if (scratch && scratch_size >= need) return scratch;
    *owned = malloc(need);
    if (!*owned) ag_errorf(AG_ERR_NOMEM, "matmul: cannot allocate %zu bytes of activations", need);
    return *owned;
}

size_t ag_matmul_scratch_size(uint32_t w_type, int64_t n_in, int64_t n_tok) {
    ag_act_format f;
    if (ag_quant_act_format(w_type, &f) != AG_OK || n_tok < 0) return 0;
    if (f == AG_ACT_F32) return 0;
    if (decode_panel_kernel(w_type, n_tok)) return panel_scratch_size(f, n_in, n_tok, true);
    size_t rb = ag_act_row_bytes(f, n_in), total;
    if (rb == 0 || __builtin_mul_overflow(rb, (size_t)n_tok, &total)) return 0;
    return total;
}

/* ---- quantizing X ---- */

typedef struct {
    ag_act_format   fmt;
    const float    *x;
    int64_t         ldx, n_in, n_tok, rows_per_task;
    uint8_t        *xq;
    size_t          row_bytes;
} quant_job;

static void quant_task(void *ctx, int64_t task, int thread) {
    const quant_job *j = ctx;
    int64_t          t0 = task * j->rows_per_task, t1 = t0 + j->rows_per_task;
    if (t1 > j->n_tok) t1 = j->n_tok;
    for (int64_t t = t0; t < t1; t++)
        ag_quantize_act_row(j->fmt, j->x + t * j->ldx, j->xq + (size_t)t * j->row_bytes, j->n_in);
}

ag_status ag_matmul_quantize_x(ag_threadpool *pool, ag_act_format fmt, const float *x, int64_t ldx,
                               int64_t n_tok, int64_t n_in, void *xq, size_t xq_size) {
    size_t rb = ag_act_row_bytes(fmt, n_in), need;
    if (rb == 0) return ag_errorf(AG_ERR_INVALID, "matmul: bad activation format %d or n_in %lld", (int)fmt, (long long)n_in);
    if (n_tok < 0 || ldx < n_in) return ag_errorf(AG_ERR_INVALID, "matmul: n_tok %lld / ldx %lld", (long long)n_tok, (long long)ldx);
    if (n_tok == 0) return AG_OK;
    if (!x || !xq) return ag_errorf(AG_ERR_INVALID, "matmul: NULL pointer");
    if (__builtin_mul_overflow(rb, (size_t)n_tok, &need) || xq_size < need)
        return ag_errorf(AG_ERR_INVALID, "matmul: activation buffer of %zu bytes is too small", xq_size);
    quant_job j = {fmt, x, ldx, n_in, n_tok, 0, xq, rb};
    /* ~64K elements per task: below that, dispatch costs more than it saves */
    int64_t per = (64 * 1024 + n_in - 1) / n_in;
    if (per < 1) per = 1;
    j.rows_per_task = per;
    ag_threadpool_run(pool, (n_tok + per - 1) / per, quant_task, &j);
    return AG_OK;
}

/* ---- the product ---- */

typedef struct {
    ag_dot_fn      dot;
    ag_gemm_fn     gemm;  /* NULL: rows one at a time through dot */
    ag_panel_fn    panel; /* set: xa holds panels, tok_per_task counts panels */
    int            panel_nt; /* tokens per panel */
    const uint8_t *w;
    size_t         w_row_bytes;
    int64_t        n_in, n_out, n_tok;
    const uint8_t *xa;
    size_t         xa_stride;
    float         *y;
    int64_t        ldy;
    int64_t        rows_per_task, tok_per_task, n_row_tasks;
} mm_job;

static void mm_task(void *ctx, int64_t task, int thread) {
    const mm_job *j = ctx;
    int64_t       rt = task % j->n_row_tasks, tt = task / j->n_row_tasks;
    int64_t       r0 = rt * j->rows_per_task, r1 = r0 + j->rows_per_task;
    int64_t       t0 = tt * j->tok_per_task, t1 = t0 + j->tok_per_task;
    if (r1 > j->n_out) r1 = j->n_out;
    if (j->panel) { /* t0, t1 count panels here */
        const int64_t nt = j->panel_nt, n_panels = (j->n_tok + nt - 1) / nt;
        if (t1 > n_panels) t1 = n_panels;
        for (int64_t r = r0; r < r1; r += AG_GEMM_RM) {
            const int nr = (int)(r1 - r < AG_GEMM_RM ? r1 - r : AG_GEMM_RM);
            for (int64_t p = t0; p < t1; p += AG_PANEL_MAX_NP) {
                const int np = (int)(t1 - p < AG_PANEL_MAX_NP ? t1 - p : AG_PANEL_MAX_NP);
                j->panel(j->n_in, j->w + (size_t)r * j->w_row_bytes, j->w_row_bytes, nr, j->xa + (size_t)p * j->xa_stride,
                         j->xa_stride, np, j->n_tok - p * nt, j->y + p * nt * j->ldy + r, j->ldy);
            }
        }
        return;
    }
    if (t1 > j->n_tok) t1 = j->n_tok;
    int64_t r = r0;
    if (j->gemm) /* whole tiles of AG_GEMM_RM rows; the rest through dot */
        for (; r + AG_GEMM_RM <= r1; r += AG_GEMM_RM) {
            const uint8_t *wr = j->w + (size_t)r * j->w_row_bytes;
            for (int64_t t = t0; t < t1; t += AG_DOT_MAX_NX) {
                int nx = (int)(t1 - t < AG_DOT_MAX_NX ? t1 - t : AG_DOT_MAX_NX);
                j->gemm(j->n_in, wr, j->w_row_bytes, j->xa + (size_t)t * j->xa_stride, j->xa_stride, nx,
                        j->y + t * j->ldy + r, j->ldy);
            }
        }
    for (; r < r1; r++) {
        const uint8_t *wr = j->w + (size_t)r * j->w_row_bytes;
        for (int64_t t = t0; t < t1; t += AG_DOT_MAX_NX) {
            int   nx = (int)(t1 - t < AG_DOT_MAX_NX ? t1 - t : AG_DOT_MAX_NX);
            float out[AG_DOT_MAX_NX];
            j->dot(j->n_in, wr, j->xa + (size_t)t * j->xa_stride, j->xa_stride, nx, out);
            for (int k = 0; k < nx; k++) j->y[(t + k) * j->ldy + r] = out[k];
        }
    }
}

/* Fills j for W·X and returns its task count. tiles: use the GEMM tile
 * kernels (prompt rows only: their summation order differs from the dot
 * kernels', see ag_matmul_prompt). Which rows go through a tile depends
 * only on the row index, never on n_tok; the split into tasks never changes
 * a result. panel: xa holds panels (xa_stride bytes per panel; window:
 * window panels, else token panels) for
 * that kernel. want: tasks to aim for (dynamic scheduling absorbs uneven
 * threads). */
static int64_t mm_plan(mm_job *j, uint32_t w_type, const void *w, int64_t n_out, int64_t n_in, const void *xa,
                       size_t xa_stride, int64_t n_tok, float *y, int64_t ldy, bool tiles, ag_panel_fn panel,
                       bool window, int64_t want) {
    memset(j, 0, sizeof *j);
    j->dot = ag_quant_kernels_active()->dot[w_type];
    j->gemm = tiles ? ag_quant_kernels_active()->gemm[w_type] : NULL;
    j->panel = panel;
    j->panel_nt = panel_tokens(window);
    j->w = w;
    j->w_row_bytes = ag_quant_row_bytes(w_type, n_in);
    j->n_in = n_in, j->n_out = n_out, j->n_tok = n_tok;
    j->xa = xa, j->xa_stride = xa_stride;
    j->y = y, j->ldy = ldy;

    /* the token chunk of a task, in tokens or (panel) in panels */
    const int64_t unit = panel ? 1 : AG_DOT_MAX_NX, n_units = panel ? (n_tok + j->panel_nt - 1) / j->panel_nt : n_tok;
    int64_t       tc = (int64_t)(L2_ACT_BUDGET / (xa_stride ? xa_stride : 1));
    tc = tc / unit * unit;
    if (tc < unit) tc = unit;
    if (tc > n_units) tc = n_units;
    j->tok_per_task = tc;
    int64_t n_tok_tasks = (n_units + tc - 1) / tc;

    int64_t row_tasks = (want + n_tok_tasks - 1) / n_tok_tasks;
    int64_t rows = (n_out + row_tasks - 1) / row_tasks;
    if (rows < 4) rows = 4;
    rows = (rows + AG_GEMM_RM - 1) / AG_GEMM_RM * AG_GEMM_RM; /* whole tiles per task */
    if (rows > n_out) rows = n_out;
    j->rows_per_task = rows;
    j->n_row_tasks = (n_out + rows - 1) / rows;
    return j->n_row_tasks * n_tok_tasks;
}

static void matmul_run(ag_threadpool *pool, uint32_t w_type, const void *w, int64_t n_out, int64_t n_in,
                       const void *xa, size_t xa_stride, int64_t n_tok, float *y, int64_t ldy, bool tiles,
                       ag_panel_fn panel, bool window) {
    mm_job  j;
    int     threads = ag_threadpool_size(pool);
    /* one thread: one task, no scheduling at all */
    int64_t n = mm_plan(&j, w_type, w, n_out, n_in, xa, xa_stride, n_tok, y, ldy, tiles, panel, window,
                        threads == 1 ? 1 : threads * 8);
    ag_threadpool_run(pool, n, mm_task, &j);
}

/* ---- several matrices, one X ---- */

typedef struct {
    mm_job  jobs[AG_MATMUL_MAX_PARTS];
    int64_t first[AG_MATMUL_MAX_PARTS + 1]; /* jobs[p] owns tasks [first[p], first[p+1]) */
} mm_multi;

static void mm_multi_task(void *ctx, int64_t task, int thread) {
    const mm_multi *m = ctx;
    int             p = 0;
    while (task >= m->first[p + 1]) p++;
    mm_task((void *)&m->jobs[p], task - m->first[p], thread);
}

/* The distinct activation formats of the parts, in a fixed order. */
static int multi_formats(const ag_matmul_part *parts, int n_parts, ag_act_format fmts[AG_MATMUL_MAX_PARTS]) {
    int n = 0;
    for (int p = 0; p < n_parts; p++) {
        ag_act_format f;
        if (ag_quant_act_format(parts[p].w_type, &f) != AG_OK) return -1;
        int k = 0;
        while (k < n && fmts[k] != f) k++;
        if (k == n) fmts[n++] = f;
    }
    return n;
}

/* True when a part of activation format f takes the panel kernels for
 * n_tok decode rows (decode_panel_kernel): X in that format is then packed
 * into token panels as well. */
static bool multi_wants_panels(const ag_matmul_part *parts, int n_parts, ag_act_format f, int64_t n_tok) {
    for (int p = 0; p < n_parts; p++) {
        ag_act_format pf;
        if (ag_quant_act_format(parts[p].w_type, &pf) == AG_OK && pf == f && decode_panel_kernel(parts[p].w_type, n_tok))
            return true;
    }
    return false;
}

/* The panel kind of format f's decode rows in a multi call: that of its
 * first part with a panel kernel (Q4_K and Q6_K share their ISA's kind). */
static bool multi_windows(const ag_matmul_part *parts, int n_parts, ag_act_format f, int64_t n_tok) {
    for (int p = 0; p < n_parts; p++) {
        ag_act_format pf;
        if (ag_quant_act_format(parts[p].w_type, &pf) == AG_OK && pf == f && decode_panel_kernel(parts[p].w_type, n_tok))
            return decode_windows(parts[p].w_type);
    }
    return true;
}

size_t ag_matmul_multi_scratch_size(const ag_matmul_part *parts, int n_parts, int64_t n_in, int64_t n_tok) {
    ag_act_format fmts[AG_MATMUL_MAX_PARTS];
    if (n_parts < 1 || n_parts > AG_MATMUL_MAX_PARTS || n_tok < 0) return 0;
    int    nf = multi_formats(parts, n_parts, fmts);
    size_t total = 64;
    for (int k = 0; k < nf; k++) {
        if (fmts[k] == AG_ACT_F32) continue;
        size_t rb = ag_act_row_bytes(fmts[k], n_in), b;
        if (rb == 0 || __builtin_mul_overflow(rb, (size_t)n_tok, &b)) return 0;
        if (multi_wants_panels(parts, n_parts, fmts[k], n_tok) &&
            (b = panel_scratch_size(fmts[k], n_in, n_tok, multi_windows(parts, n_parts, fmts[k], n_tok))) == 0)
            return 0;
        if (b > SIZE_MAX / 2 - total) return 0;
        total += (b + 63) & ~(size_t)63;
    }
    return total;
}

ag_status ag_matmul_multi(ag_threadpool *pool, const ag_matmul_part *parts, int n_parts, int64_t n_in,
                          const float *x, int64_t ldx, int64_t n_tok, void *scratch, size_t scratch_size) {
    if (n_parts < 1 || n_parts > AG_MATMUL_MAX_PARTS)
        return ag_errorf(AG_ERR_INVALID, "matmul: %d parts (1..%d)", n_parts, AG_MATMUL_MAX_PARTS);
    for (int p = 0; p < n_parts; p++) {
        ag_act_format f;
        ag_status st = check_common(parts[p].w_type, parts[p].w, parts[p].n_out, n_in, n_tok, parts[p].y,
                                    parts[p].ldy, &f);
        if (st != AG_OK) return st;
    }
    ag_status xst = check_x(x, ldx, n_in, 1, n_tok);
    if (xst != AG_OK) return xst;
    if (n_tok == 0) return AG_OK;
    size_t need = ag_matmul_multi_scratch_size(parts, n_parts, n_in, n_tok);
    if (need == 0) return ag_errorf(AG_ERR_INVALID, "matmul: sizes overflow");
    void *owned, *buf = scratch_or_alloc(scratch, scratch_size, need, &owned);
    if (!buf) return AG_ERR_NOMEM;
    /* X once per activation format (rows, and panels where a part wants them) */
    ag_act_format fmts[AG_MATMUL_MAX_PARTS];
    const void   *xa[AG_MATMUL_MAX_PARTS], *xp[AG_MATMUL_MAX_PARTS];
    size_t        stride[AG_MATMUL_MAX_PARTS];
    bool          win[AG_MATMUL_MAX_PARTS];
    int           nf = multi_formats(parts, n_parts, fmts);
    uint8_t      *at = (uint8_t *)(((uintptr_t)buf + 63) & ~(uintptr_t)63);
    ag_status     st = AG_OK;
    for (int k = 0; k < nf && st == AG_OK; k++) {
        xp[k] = NULL;
        if (fmts[k] == AG_ACT_F32) {
            xa[k] = x, stride[k] = (size_t)ldx * sizeof(float);
            continue;
        }
        size_t rb = ag_act_row_bytes(fmts[k], n_in), bytes = rb * (size_t)n_tok;
        stride[k] = rb;
        if (multi_wants_panels(parts, n_parts, fmts[k], n_tok)) {
            uint8_t *rows, *panels;
            win[k] = multi_windows(parts, n_parts, fmts[k], n_tok);
            panel_quantize(pool, fmts[k], win[k], x, ldx, n_tok, n_in, at, &rows, &panels);
            xa[k] = rows, xp[k] = panels;
            at += (panel_scratch_size(fmts[k], n_in, n_tok, win[k]) + 63) & ~(size_t)63;
            continue;
        }
        st = ag_matmul_quantize_x(pool, fmts[k], x, ldx, n_tok, n_in, at, bytes);
        xa[k] = at;
        at += (bytes + 63) & ~(size_t)63;
    }
    if (st == AG_OK) {
        mm_multi m = {0};
        int64_t  rows = 0;
        for (int p = 0; p < n_parts; p++) rows += parts[p].n_out;
        int threads = ag_threadpool_size(pool);
        for (int p = 0; p < n_parts; p++) {
            ag_act_format f;
            ag_quant_act_format(parts[p].w_type, &f);
            int k = 0;
            while (fmts[k] != f) k++;
            int64_t     want = threads == 1 ? 1 : (threads * 8 * parts[p].n_out + rows - 1) / (rows ? rows : 1);
            /* a part whose kernel wants the other panel kind (Q4_K on VNNI
             * token panels, Q6_K on window panels under AUGUR_CPU_WPANELS=1)
             * takes the dot kernels on the rows */
            ag_panel_fn pk = xp[k] && decode_windows(parts[p].w_type) == win[k] ? decode_panel_kernel(parts[p].w_type, n_tok) : NULL;
            m.first[p + 1] = m.first[p] + (parts[p].n_out == 0 ? 0
                                           : mm_plan(&m.jobs[p], parts[p].w_type, parts[p].w, parts[p].n_out, n_in,
                                                     pk ? xp[k] : xa[k], pk ? panel_row_bytes(fmts[k], n_in, win[k]) : stride[k],
                                                     n_tok, parts[p].y, parts[p].ldy, false, pk, pk && win[k],
                                                     want < 1 ? 1 : want));
        }
        ag_threadpool_run(pool, m.first[n_parts], mm_multi_task, &m);
    }
    free(owned);
    return st;
}

ag_status ag_matmul_xq(ag_threadpool *pool, uint32_t w_type, const void *w, int64_t n_out, int64_t n_in,
                       const void *xq, int64_t n_tok, float *y, int64_t ldy) {
    ag_act_format fmt;
    ag_status     st = check_common(w_type, w, n_out, n_in, n_tok, y, ldy, &fmt);
    if (st != AG_OK) return st;
    if (n_out == 0 || n_tok == 0) return AG_OK;
    if (!xq) return ag_errorf(AG_ERR_INVALID, "matmul: NULL pointer");
    matmul_run(pool, w_type, w, n_out, n_in, xq, ag_act_row_bytes(fmt, n_in), n_tok, y, ldy, false, NULL, false);
    return AG_OK;
}

static ag_status matmul_any(ag_threadpool *pool, uint32_t w_type, const void *w, int64_t n_out, int64_t n_in,
                    const float *x, int64_t ldx, int64_t n_tok, float *y, int64_t ldy, void *scratch,
                    size_t scratch_size, bool tiles) {
    ag_act_format fmt;
    ag_status     st = check_common(w_type, w, n_out, n_in, n_tok, y, ldy, &fmt);
    if (st != AG_OK) return st;
    if ((st = check_x(x, ldx, n_in, n_out, n_tok)) != AG_OK) return st;
    if (n_out == 0 || n_tok == 0) return AG_OK;

    ag_panel_fn pk = tiles ? NULL : decode_panel_kernel(w_type, n_tok);
    if (pk)
        return matmul_panels(pool, w_type, pk, decode_windows(w_type), true, w, n_out, n_in, x, ldx, n_tok, y, ldy,
                             scratch, scratch_size);
    if (fmt == AG_ACT_F32) { /* float weights read X in place */
        matmul_run(pool, w_type, w, n_out, n_in, x, (size_t)ldx * sizeof(float), n_tok, y, ldy, tiles, NULL, false);
        return AG_OK;
    }
    size_t need = ag_matmul_scratch_size(w_type, n_in, n_tok);
    if (need == 0) return ag_errorf(AG_ERR_INVALID, "matmul: sizes overflow");
    void *owned, *xq = scratch_or_alloc(scratch, scratch_size, need, &owned);
    if (!xq) return AG_ERR_NOMEM;
    st = ag_matmul_quantize_x(pool, fmt, x, ldx, n_tok, n_in, xq, need);
    if (st == AG_OK)
        matmul_run(pool, w_type, w, n_out, n_in, xq, ag_act_row_bytes(fmt, n_in), n_tok, y, ldy, tiles, NULL, false);
    free(owned);
    return st;
}

ag_status ag_matmul(ag_threadpool *pool, uint32_t w_type, const void *w, int64_t n_out, int64_t n_in,
                    const float *x, int64_t ldx, int64_t n_tok, float *y, int64_t ldy, void *scratch,
                    size_t scratch_size) {
    return matmul_any(pool, w_type, w, n_out, n_in, x, ldx, n_tok, y, ldy, scratch, scratch_size, false);
}

static bool use_amx(uint32_t w_type) { return ag_amx_supports(w_type) && ag_amx_available(); }

/* ---- token panels (prompt rows where the ISA has panel kernels) ---- */

/* The types whose every kernel computes ag_kquant_fold's bits (dot, panel,
 * AMX), so a row may take any of them. */
static bool canonical_kquant(uint32_t w_type) { return w_type == AG_TYPE_Q4_K || w_type == AG_TYPE_Q6_K; }

/* A batch of at most this many tokens takes the dot kernels, which beat a
 * panel of so few real tokens (of AG_PANEL_NT). 2048x2048, one core of the
 * AVX2 VM, GFLOP/s Q4_K / Q6_K: 4 tokens, panel 82 / 59, dot 93 / 95; 5
 * tokens, panel 96 / 74, dot 79 / 71. A larger batch puts every token in a
 * panel, its last few too: a separate dot pass for them would stream the
 * weights once more (8960x1536 cold, one thread, 12 tokens: one pass of
 * two panels ~3.8 ms, a panel and a 4-token dot pass ~4.3-4.7). */
#define PANEL_DOT_TAIL 4

/* The fewest decode rows of Q4_K / Q6_K (whose panels give the dot
 * kernels' bits) that take the window panels (four tokens each): a
 * speculative verify window. quant_bench --window, 8960x1536, cold, ms,
 * dot kernels -> window panels.
 * AVX2 window panels, 2 threads, medians of 3 alternating runs on the
 * shared VM (runs on other hours moved single figures by 10-30%):
 *   Q4_K  3 tokens 0.81 -> 0.59, 4: 1.06 -> 0.61, 8: 2.00 -> 0.86, 12: 3.14
 *         -> 1.31 (2 tokens: 0.71 / 0.67 in another run, a wash);
 *   Q6_K  5 tokens 1.25 -> 1.42, 6: 1.34 -> 1.52, 7: 1.45 -> 1.41, 8: 1.64
 *         -> 1.48, 12: 2.37 -> 2.22. Q6_K's panel does more work per element
 *         (a scale madd per 2 maddubs) and spills, so it pays only for longer
 *         windows.
 * AVX-512 VNNI window panels (wpanel16), 1 thread of a 2-core Zen 5 VM
 * shared with two other builds, medians of 11, 2026-12-07 (n = 1: Q4_K
 * 0.33-0.36, Q6_K 0.42-0.46; dot kernels for n = 5..8 include the VNNI
 * token panels they replace):
 *   Q4_K  2 tokens 0.44 -> 0.46, 3: 0.54 -> 0.49, 4: 0.66 -> 0.52,
 *         5: 0.91 -> 0.67, 8: 0.90 -> 0.86;
 *   Q6_K  2 tokens 0.46 -> 0.59, 3: 0.56 -> 0.60, 4: 0.64 -> 0.63,
 *         5: 0.91 -> 0.87, 8: 1.24 -> 0.92. */
static int window_panel_min(uint32_t w_type) {
    const bool vnni = ag_quant_kernels_active()->wpanel16;
    return w_type == AG_TYPE_Q4_K ? 3 : w_type == AG_TYPE_Q6_K ? (vnni ? 4 : 7) : 0;
}

/* The panel kernel for prompt rows of w_type, or NULL (AMX or none). */
static ag_panel_fn prompt_panel_kernel(uint32_t w_type) {
    if (w_type >= AG_TYPE_COUNT || use_amx(w_type)) return NULL;
    return ag_quant_kernels_active()->panel[w_type];
}

/* Scratch of the panel path: the quantized rows, then (64-aligned) the panels. */
static size_t panel_scratch_size(ag_act_format f, int64_t n_in, int64_t n_tok, bool window) {
    size_t rb = ag_act_row_bytes(f, n_in), pb = panel_row_bytes(f, n_in, window), rows, panels;
    if (rb == 0 || pb == 0 || n_tok < 0) return 0;
    const size_t n_panels = (size_t)((n_tok + panel_tokens(window) - 1) / panel_tokens(window));
    if (__builtin_mul_overflow(rb, (size_t)n_tok, &rows) || __builtin_mul_overflow(pb, n_panels, &panels) ||
        rows > SIZE_MAX / 2 || panels > SIZE_MAX / 2 - 128 - rows)
        return 0;
    return ((rows + 63) & ~(size_t)63) + panels + 64;
}

/* The fewest decode rows of Q4_K for the AVX-512 VNNI token panels (dpanel, Q4_K). quant_bench
 * --window, 8960x1536, cold, 2 threads of an AMX Xeon, ms, dot kernels ->
 * VNNI panels: 5 rows 1.15 -> 1.0-1.3, 8: 1.6 -> 1.0-1.3, 12: 2.4 ->
 * 1.6-2.3 (n = 1: 0.44). A Q6_K VNNI panel (1.4 for 2-8 rows) beat the
 * dot kernels only at 8 rows, by 3%, and lost at 9-10 (two panels), so
 * Q6_K has none. */
static int dpanel_min(uint32_t w_type) {
    static _Atomic int env; /* AUGUR_DPANEL_MIN (A/B), read once; -1 unset */
    if (!env) {
        env = (int)ag_switch_int("AUGUR_DPANEL_MIN", 1, 1 << 20, -1);
    }
    if (env > 0) return canonical_kquant(w_type) ? env : 0;
    return w_type == AG_TYPE_Q4_K ? 5 : 0;
}

static int decode_panel_min_rows(uint32_t w_type) { return decode_windows(w_type) ? window_panel_min(w_type) : dpanel_min(w_type); }

/* The panel kernel for n_tok decode rows of w_type, or NULL (dot kernels). */
static ag_panel_fn decode_panel_kernel(uint32_t w_type, int64_t n_tok) {
    if (w_type >= AG_TYPE_COUNT) return NULL;
    const int min = decode_panel_min_rows(w_type);
    if (min == 0 || n_tok < min) return NULL;
    /* (with AMX the backend sends the larger batches to the tiles first:
     * ag_matmul_decode_on_amx) */
    const ag_quant_kernels *k = ag_quant_kernels_active();
    return decode_windows(w_type) ? k->wpanel[w_type] : k->dpanel[w_type];
}

const char *ag_matmul_decode_panel_name(uint32_t w_type) {
    if (!decode_windows(w_type)) return "vnni panels";
    return ag_quant_kernels_active()->wpanel16 ? "vnni window panels" : "window panels";
}

int ag_matmul_decode_panel_min(uint32_t w_type) {
    if (w_type >= AG_TYPE_COUNT) return 0;
    const int min = decode_panel_min_rows(w_type);
    return min && decode_panel_kernel(w_type, min) ? min : 0;
}

typedef struct {
    ag_act_format fmt;
    const float  *x;
    int64_t       ldx, n_in, n_tok;
    uint8_t      *rows, *panels;
    size_t        row_bytes, panel_bytes;
    bool          window;
} panel_job;

/* Task p: quantizes panel p's tokens into their rows and packs them into it. */
static void panel_quant_task(void *ctx, int64_t p, int thread) {
    const panel_job *j = ctx;
    const int        pt = panel_tokens(j->window);
    const int64_t    t0 = p * pt;
    const int        nt = (int)(j->n_tok - t0 < pt ? j->n_tok - t0 : pt);
    uint8_t         *rows = j->rows + (size_t)t0 * j->row_bytes;
    for (int t = 0; t < nt; t++) ag_quantize_act_row(j->fmt, j->x + (t0 + t) * j->ldx, rows + (size_t)t * j->row_bytes, j->n_in);
    uint8_t *dst = j->panels + (size_t)p * j->panel_bytes;
    if (j->window) ag_wpanel_pack(rows, j->row_bytes, nt, j->n_in, dst, ag_quant_kernels_active()->wpanel16);
    else ag_panel_pack(j->fmt, rows, j->row_bytes, nt, j->n_in, dst);
}

/* W·X for prompt rows through the panel kernel pk: X quantized exactly as
 * for the dot kernels (same rows), then packed into panels. */
static ag_status matmul_panels(ag_threadpool *pool, uint32_t w_type, ag_panel_fn pk, bool window, bool decode,
                               const void *w, int64_t n_out, int64_t n_in, const float *x, int64_t ldx, int64_t n_tok, float *y,
                               int64_t ldy, void *scratch, size_t scratch_size) {
    ag_act_format fmt;
    ag_status     st = check_common(w_type, w, n_out, n_in, n_tok, y, ldy, &fmt);
    if (st != AG_OK) return st;
    if ((st = check_x(x, ldx, n_in, n_out, n_tok)) != AG_OK) return st;
    if (n_out == 0 || n_tok == 0) return AG_OK;
    size_t need = panel_scratch_size(fmt, n_in, n_tok, window);
    if (need == 0) return ag_errorf(AG_ERR_INVALID, "matmul: sizes overflow");
    void *owned, *buf = scratch_or_alloc(scratch, scratch_size, need, &owned);
    if (!buf) return AG_ERR_NOMEM;
    const size_t rb = ag_act_row_bytes(fmt, n_in), pb = panel_row_bytes(fmt, n_in, window);
    uint8_t     *rows, *panels;
    panel_quantize(pool, fmt, window, x, ldx, n_tok, n_in, buf, &rows, &panels);
    /* Q4_K / Q6_K token panels give the dot kernels' bits, so a batch of at
     * most PANEL_DOT_TAIL tokens (a panel of mostly empty lanes) takes the
     * dot kernels, faster there; the other types' panels have their own
     * arithmetic and take every token whatever the batch; window panels
     * were chosen for this batch by the caller (decode_panel_kernel) */
    if (!decode && canonical_kquant(w_type) && n_tok <= PANEL_DOT_TAIL)
        matmul_run(pool, w_type, w, n_out, n_in, rows, rb, n_tok, y, ldy, false, NULL, false);
    else
        matmul_run(pool, w_type, w, n_out, n_in, panels, pb, n_tok, y, ldy, false, pk, window);
    free(owned);
    return AG_OK;
}

/* Quantizes X into activation rows and packs them into token panels, in
 * buf (panel_scratch_size bytes): *rows and then, 64-aligned as the
 * kernels load them, *panels. */
static void panel_quantize(ag_threadpool *pool, ag_act_format fmt, bool window, const float *x, int64_t ldx,
                           int64_t n_tok, int64_t n_in, void *buf, uint8_t **rows, uint8_t **panels) {
    panel_job j = {fmt, x, ldx, n_in, n_tok, NULL, NULL, ag_act_row_bytes(fmt, n_in), panel_row_bytes(fmt, n_in, window), window};
    j.rows = (uint8_t *)(((uintptr_t)buf + 63) & ~(uintptr_t)63);
    j.panels = j.rows + ((j.row_bytes * (size_t)n_tok + 63) & ~(size_t)63);
    ag_threadpool_run(pool, (n_tok + panel_tokens(window) - 1) / panel_tokens(window), panel_quant_task, &j);
    *rows = j.rows, *panels = j.panels;
}

const char *ag_matmul_prompt_kernel(uint32_t w_type) {
    if (use_amx(w_type)) return "amx";
    if (prompt_panel_kernel(w_type)) return "panel";
    if (w_type < AG_TYPE_COUNT && ag_quant_kernels_active()->gemm[w_type]) return "tile";
    return "dot";
}

size_t ag_matmul_prompt_scratch_size(ag_threadpool *pool, uint32_t w_type, int64_t n_in, int64_t n_tok) {
    if (use_amx(w_type)) return ag_amx_scratch_size(ag_threadpool_size(pool), n_in, n_tok);
    ag_act_format f;
    if (prompt_panel_kernel(w_type) && ag_quant_act_format(w_type, &f) == AG_OK) return panel_scratch_size(f, n_in, n_tok, false);
    return ag_matmul_scratch_size(w_type, n_in, n_tok);
}

int ag_matmul_amx_decode_min(uint32_t w_type) {
    const long e = ag_switch_int("AUGUR_AMX_DECODE_MIN", 1, 1 << 20, 0);
    if (e) return (int)e;
    return w_type == AG_TYPE_Q6_K ? AG_MATMUL_AMX_MIN_TOK_Q6K : AG_MATMUL_AMX_MIN_TOK;
}

bool ag_matmul_decode_on_amx(uint32_t w_type, int64_t n_decode) {
    /* every ISA level's dot kernels compute the K-quants' canonical
     * arithmetic (scalar, AVX2, AVX-512: test_gemm, test_quant); read once:
     * the environment per matmul would cost, and a process keeps one choice */
    static _Atomic int min4, min6;
    if (!min4) {
        min6 = ag_matmul_amx_decode_min(AG_TYPE_Q6_K);
        min4 = ag_matmul_amx_decode_min(AG_TYPE_Q4_K);
    }
    return n_decode >= (w_type == AG_TYPE_Q6_K ? min6 : min4) && canonical_kquant(w_type) && use_amx(w_type);
}

ag_status ag_matmul_prompt(ag_threadpool *pool, uint32_t w_type, const void *w, const void *packed, int64_t n_out,
                           int64_t n_in, const float *x, int64_t ldx, int64_t n_tok, float *y, int64_t ldy,
                           void *scratch, size_t scratch_size) {
    ag_panel_fn pk = prompt_panel_kernel(w_type);
    if (pk) return matmul_panels(pool, w_type, pk, false, false, w, n_out, n_in, x, ldx, n_tok, y, ldy, scratch, scratch_size);
    if (!use_amx(w_type))
        return matmul_any(pool, w_type, w, n_out, n_in, x, ldx, n_tok, y, ldy, scratch, scratch_size, true);
    ag_act_format fmt;
    ag_status     st = check_common(w_type, w, n_out, n_in, n_tok, y, ldy, &fmt);
    if (st != AG_OK) return st;
    if ((st = check_x(x, ldx, n_in, n_out, n_tok)) != AG_OK) return st;
    if (n_out == 0 || n_tok == 0) return AG_OK;
    size_t need = ag_amx_scratch_size(ag_threadpool_size(pool), n_in, n_tok);
    if (need == 0) return ag_errorf(AG_ERR_INVALID, "matmul: sizes overflow");
    void *owned, *buf = scratch_or_alloc(scratch, scratch_size, need, &owned);
    if (!buf) return AG_ERR_NOMEM;
    st = ag_matmul_amx(pool, w_type, w, packed, n_out, n_in, x, ldx, n_tok, y, ldy, buf, owned ? need : scratch_size);
    free(owned);
    return st;
}
