#include "base/arena.h"

#include <stdint.h>
#include <stdlib.h>

struct ag_arena_chunk {
    ag_arena_chunk *next;
    size_t          size, off;
    _Alignas(64) unsigned char data[];
};

void *ag_arena_alloc(ag_arena *a, size_t size) {
    size = (size + 63) & ~(size_t)63;
    ag_arena_chunk *c = a->head;
    if (!c || c->size - c->off < size) {
        size_t want = a->min_chunk ? a->min_chunk : (size_t)1 << 20;
        if (c && c->size * 2 > want) want = c->size * 2;
        if (want < size) want = size;
        c = aligned_alloc(64, (sizeof *c + want + 63) & ~(size_t)63);
        if (!c) return NULL;
        c->size = want;
        c->off = 0;
        c->next = a->head;
        a->head = c;
    }
    void *p = c->data + c->off;
    c->off += size;
    a->used += size;
    if (a->used > a->peak) a->peak = a->used;
    return p;
}

bool ag_arena_reserve(ag_arena *a, size_t size) {
    size = (size + 63) & ~(size_t)63;
    if (a->head && a->head->size - a->head->off >= size) return true;
    ag_arena_chunk *c = aligned_alloc(64, (sizeof *c + size + 63) & ~(size_t)63);
    if (!c) return false;
    c->size = size;
    c->off = 0;
    c->next = a->head;
    a->head = c;
    return true;
}

void ag_arena_reset(ag_arena *a) {
    /* Keep only the newest (largest) chunk. */
    ag_arena_chunk *c = a->head;
    if (c) {
        ag_arena_chunk *rest = c->next;
        while (rest) {
            ag_arena_chunk *n = rest->next;
            free(rest);
            rest = n;
        }
        c->next = NULL;
        c->off = 0;
    }
    a->used = 0;
}

void ag_arena_free(ag_arena *a) {
    ag_arena_chunk *c = a->head;
    while (c) {
        ag_arena_chunk *n = c->next;
        free(c);
        c = n;
    }
    a->head = NULL;
    a->used = 0;
}
