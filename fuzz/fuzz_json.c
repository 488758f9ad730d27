/* libFuzzer target for JSON mode's recognizer (sample/json.h): any bytes,
 * fed whole or split at a point the input chooses, must be judged the same
 * way and never crash or over-read; whatever it accepts as done must also
 * be accepted after a copy of the state at every byte (the mask tries
 * tokens on copies). The first byte picks bare or wrapped mode. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "sample/json.h"

static const char *const k_pre[] = {"<t>{\"name\": \"a\", \"arguments\": ", "<t>{\"name\": \"bb\", \"arguments\": "};

static void init(ag_json_state *s, int wrapped) {
    if (wrapped) ag_json_init_wrapped(s, k_pre, 2, "}</t>");
    else ag_json_init(s);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 2) return 0;
    const int    wrapped = data[0] & 1;
    const size_t cut = data[1] % (size - 1);
    const char  *doc = (const char *)data + 2;
    const size_t n = size - 2;
    ag_json_state a, b;
    init(&a, wrapped);
    init(&b, wrapped);
    bool whole = ag_json_feed(&a, doc, n);
    bool split = ag_json_feed(&b, doc, cut < n ? cut : n);
    if (split) {
        ag_json_state c = b; /* a copy carries on exactly like the original */
        split = ag_json_feed(&c, doc + (cut < n ? cut : n), n - (cut < n ? cut : n));
        if (split && ag_json_done(&c) != ag_json_done(&a)) abort();
    }
    if (whole != split) abort();
    return 0;
}
