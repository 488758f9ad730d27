/* Fast non-cryptographic hashing (XXH3, 64-bit) for block keys,
 * fingerprints and checksums. */
#ifndef AG_BASE_HASH_H
#define AG_BASE_HASH_H

#include <stddef.h>
#include <stdint.h>

uint64_t ag_hash64(const void *data, size_t len);
uint64_t ag_hash64_seed(const void *data, size_t len, uint64_t seed);

#endif
