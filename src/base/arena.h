/* A bump allocator for per-step scratch memory.
 *
 * Allocations are carved from chunks and all released at once by
 * ag_arena_reset() (keeps the largest chunk for reuse) or ag_arena_free().
 * Pointers are aligned to 64 bytes (cache line, and enough for AVX-512). */
#ifndef AG_BASE_ARENA_H
#define AG_BASE_ARENA_H

#include <stdbool.h>
#include <stddef.h>

typedef struct ag_arena_chunk ag_arena_chunk;
typedef struct {
    ag_arena_chunk *head;
    size_t          min_chunk; /* 0: 1 MiB */
    size_t          used;      /* bytes handed out since the last reset */
    size_t          peak;      /* high-water mark of `used` */
} ag_arena;

/* Returns NULL when memory runs out. Contents are uninitialised. */
void *ag_arena_alloc(ag_arena *a, size_t size);
/* Makes the newest chunk hold at least `size` bytes (allocating one chunk of
 * exactly that size if it does not), so that steps that allocate up to
 * `size` bytes between resets never add chunks. Returns false when memory
 * runs out. Call right after a reset (or before any allocation). */
bool  ag_arena_reserve(ag_arena *a, size_t size);
void  ag_arena_reset(ag_arena *a);
void  ag_arena_free(ag_arena *a);

#endif
