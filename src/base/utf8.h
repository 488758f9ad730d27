/* UTF-8 helpers (strict: no overlongs, no surrogates, max U+10FFFF). */
#ifndef AG_BASE_UTF8_H
#define AG_BASE_UTF8_H

#include <stddef.h>
#include <stdint.h>

/* Decodes one code point from s[0..n). Returns the number of bytes used
 * (1..4) and stores the code point, or returns 0 for an invalid or
 * truncated sequence (then *cp is U+FFFD). n == 0 returns 0. */
size_t ag_utf8_decode(const char *s, size_t n, uint32_t *cp);

/* Encodes cp (<= 0x10FFFF) into out[0..4); returns the byte count (0 if cp
 * is not encodable). */
size_t ag_utf8_encode(uint32_t cp, char out[4]);

/* 1 if s[0..n) is entirely valid UTF-8. */
int ag_utf8_valid(const char *s, size_t n);

/* Length of the longest prefix of s[0..n) that does not end inside an
 * incomplete (but so far valid) multi-byte sequence. Used by streaming
 * output so that a partial character is held back until it completes. */
size_t ag_utf8_complete_prefix(const char *s, size_t n);

#endif
