/* ag_stop: stop strings for streamed output.
 *
 * The caller feeds the generated text as it is detokenized, in chunks of
 * any size. The matcher answers with the bytes that are safe to send now:
 * it holds back the longest tail that could still grow into a stop string,
 * and an incomplete UTF-8 character, so a stop string is never emitted and
 * a multi-byte character is never split across two emissions (for valid
 * UTF-8 input). Results do not depend on how the text was chunked.
 *
 * Which stop wins: the occurrence that ENDS first in the stream (ties:
 * the one that starts first, i.e. the longest). That is the only rule a
 * streaming matcher can honour without looking ahead. Output stops right
 * before that occurrence; the stop string itself is never emitted.
 *
 * EOS/EOT tokens are the caller's business (the tokenizer knows the
 * end-of-generation ids); this only sees text. Matching is on raw bytes,
 * linear in the fed text (one KMP automaton per stop string). */
#ifndef AG_SAMPLE_STOP_H
#define AG_SAMPLE_STOP_H

#include <stddef.h>
#include <stdint.h>

#include "base/status.h"

typedef struct ag_stop ag_stop;

typedef struct {
    const char *text;        /* bytes to emit now; borrowed, valid until the
                                next call on this matcher */
    size_t      len;
    int         stopped;     /* 1: a stop string matched; `text` is the last
                                piece and generation should end */
    int32_t     stop_index;  /* index in the array given to ag_stop_new, or -1 */
    uint64_t    stop_offset; /* stream byte offset where the stop string starts
                                (== total bytes emitted); 0 when not stopped */
} ag_stop_result;

/* Builds a matcher for stops[0..n) (copied; borrowed only for the call).
 * lens may be NULL (NUL-terminated strings) or give each length (bytes may
 * include NUL). Empty stop strings are ignored. n == 0 is allowed (the
 * matcher then only holds back incomplete UTF-8). *out is owned by the
 * caller; free with ag_stop_free. */
ag_status ag_stop_new(const char *const *stops, const size_t *lens, int32_t n, ag_stop **out);

/* NULL-safe. */
void ag_stop_free(ag_stop *m);

/* Feeds text[0..len) (borrowed for the call) and reports what to emit.
 * After a stop (or ag_stop_finish) further feeds emit nothing and repeat
 * the final state. AG_ERR_NOMEM if the internal buffer cannot grow. */
ag_status ag_stop_feed(ag_stop *m, const char *text, size_t len, ag_stop_result *out);

/* End of generation without a stop string (EOS, length limit): releases
 * everything still held back, including an incomplete UTF-8 tail. */
ag_status ag_stop_finish(ag_stop *m, ag_stop_result *out);

/* Bytes currently held back (fed but not yet emitted). */
size_t ag_stop_pending(const ag_stop *m);

#endif
