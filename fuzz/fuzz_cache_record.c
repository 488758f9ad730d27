/* libFuzzer target for the prefix cache's record reader (cache/cache.h):
 * ag_cache_record_parse on any bytes must never crash or read past the
 * buffer, and whatever it accepts must be self-consistent: the layout
 * fields give exactly the payload size it checked, the key is the hash of
 * the header's own contents (so its file name is stable), parsing is a pure
 * function of the header bytes, and the payload checksum can be computed
 * over the bytes that follow (the restore path). The token count (format
 * version 2) is covered like every field: one outside 1..block_size, or a
 * nonzero token slot past it, is corrupt, and an accepted record's key is
 * the hash of exactly its n_tokens tokens (full or partial form).
 *
 * Each input is parsed twice: as it is, then "repaired": with the key and
 * the header checksum recomputed over the (mutated) fields, as a writer
 * would, so that the field checks behind the checksum are reached by
 * mutation and not only by the seeds.
 * Seeds: fuzz/seeds/cache_record/ (fuzz/gen_cache_seeds.c). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "cache/cache.h"
#include "cache/cache_impl.h"

static uint32_t get32(const uint8_t *p) { return p[0] | p[1] << 8 | p[2] << 16 | (uint32_t)p[3] << 24; }
static uint64_t get64(const uint8_t *p) { return get32(p) | (uint64_t)get32(p + 4) << 32; }
static void     put64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}

static void check(const uint8_t *data, size_t size) {
    ag_cache_record r;
    if (ag_cache_record_parse(data, size, &r) != AG_OK) return;
    if (r.header_bytes > size || r.header_bytes != AG_CACHE_RECORD_HEADER_BYTES((uint32_t)r.block_size)) abort();
    if (r.block_size < 8 || r.block_size > AG_CACHE_MAX_BLOCK || (r.block_size & (r.block_size - 1))) abort();
    if (r.n_tokens < 1 || r.n_tokens > r.block_size) abort();
    uint64_t es = r.dtype == AG_KV_F32 ? 4 : 2;
    if (r.payload_bytes !=
        (uint64_t)r.n_layers * r.n_kv_heads * r.block_size * ((uint64_t)r.head_dim_k + r.head_dim_v) * es)
        abort();
    for (int i = 0; i < r.block_size; i++)
        if (r.tokens[i] < 0 || (i >= r.n_tokens && r.tokens[i] != 0)) abort();
    ag_cache_record again;
    if (ag_cache_record_parse(data, r.header_bytes, &again) != AG_OK || memcmp(&again, &r, sizeof r) != 0) abort();
    char name[40];
    ag_cache_key_name(r.key, name);
    if (strlen(name) != 32 + strlen(AG_CACHE_RECORD_EXT)) abort();
    if (size - r.header_bytes >= r.payload_bytes) {
        volatile uint64_t h = ag_cache_payload_hash(data + r.header_bytes, (size_t)r.payload_bytes);
        (void)h;
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    check(data, size);
    if (size < 144) return 0;
    uint32_t bs = get32(data + 44), hb = get32(data + 12);
    if (bs < 1 || bs > AG_CACHE_MAX_BLOCK || hb != AG_CACHE_RECORD_HEADER_BYTES(bs) || hb > size) return 0;
    uint8_t *b = malloc(size);
    if (!b) return 0;
    memcpy(b, data, size);
    int32_t tokens[AG_CACHE_MAX_BLOCK];
    for (uint32_t i = 0; i < bs; i++) tokens[i] = (int32_t)get32(b + 136 + 4 * i);
    /* the key over the count's tokens (a count out of range, which the
     * parser must refuse, hashes what there is) */
    uint32_t m = get32(b + 128);
    int32_t  n_key = m < 1 ? 1 : m > bs ? (int32_t)bs : (int32_t)m;
    int32_t      kb = (int32_t)get32(b + 64);
    uint64_t     id = cache_identity(get64(b + 16), get64(b + 24), get64(b + 32), (ag_kv_dtype)get32(b + 40),
                                     (int32_t)bs, (int32_t)get32(b + 48), (int32_t)get32(b + 52),
                                     (int32_t)get32(b + 56), (int32_t)get32(b + 60), kb);
    ag_cache_key parent = {get64(b + 88), get64(b + 96)};
    ag_cache_key k = cache_key_compute(id, kb, parent, get64(b + 80), tokens, n_key, (int32_t)bs);
    put64(b + 104, k.lo);
    put64(b + 112, k.hi);
    put64(b + hb - 8, XXH3_64bits(b, hb - 8));
    check(b, size);
    free(b);
    return 0;
}
