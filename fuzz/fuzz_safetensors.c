/* libFuzzer target for the safetensors reader: any byte string must either
 * open cleanly or fail with AG_ERR_FORMAT / AG_ERR_UNSUPPORTED (never
 * crash, over-read or leak). On success every tensor's bytes are read, so
 * a header that passed validation but lies trips ASan. The input is copied
 * into an exact-size heap block so over-reads are caught. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "model/safetensors.h"

static volatile uint64_t sink;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    uint8_t *copy = malloc(size ? size : 1);
    if (!copy) return 0;
    memcpy(copy, data, size);
    ag_st_file *f = NULL;
    ag_status   st = ag_st_open_memory(copy, size, &f);
    if (st == AG_OK) {
        for (int64_t i = 0; i < ag_st_n_tensors(f); i++) {
            const ag_st_tensor *t = ag_st_tensor_at(f, i);
            if (ag_st_find(f, t->name) != t) abort();
            uint64_t acc = 0;
            for (uint64_t k = 0; k < t->size; k++) acc += t->data[k];
            sink += acc + strlen(t->name);
        }
        ag_st_free(f);
    } else if (st != AG_ERR_FORMAT && st != AG_ERR_UNSUPPORTED && st != AG_ERR_NOMEM) {
        abort();
    }
    free(copy);
    return 0;
}
