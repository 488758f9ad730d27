/* libFuzzer target for structured output (sample/schema.h): the input is a
 * schema, a NUL byte, then a text. Any schema must compile or fail cleanly;
 * a compiled one must judge the text the same way whether it is fed whole
 * or split at a point the input chooses (tokens split texts anywhere).
 * Never a crash or an over-read. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "sample/schema.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const uint8_t *nul = memchr(data, 0, size);
    if (!nul || nul == data) return 0;
    json_t *j = json_loadb((const char *)data, (size_t)(nul - data), 0, NULL);
    if (!j) return 0;
    ag_schema *s = NULL;
    if (ag_schema_compile(j, &s)) {
        json_decref(j);
        return 0;
    }
    const char  *text = (const char *)nul + 1;
    const size_t n = size - (size_t)(nul - data) - 1;
    const size_t cut = n ? (unsigned char)text[0] % (n + 1) : 0;
    ag_schema_matcher *a, *b;
    if (ag_schema_matcher_new(s, NULL, &a) || ag_schema_matcher_new(s, NULL, &b)) abort();
    bool whole = ag_schema_feed(a, text, n);
    bool split = ag_schema_feed(b, text, cut) && ag_schema_feed(b, text + cut, n - cut);
    if (whole != split) abort();
    if (whole && (ag_schema_done(a) != ag_schema_done(b) || ag_schema_can_end(a) != ag_schema_can_end(b))) abort();
    ag_schema_matcher_free(a);
    ag_schema_matcher_free(b);
    ag_schema_unref(s);
    json_decref(j);
    return 0;
}
