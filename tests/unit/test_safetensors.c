/* Unit tests for src/model/safetensors.c: a hand-made file read back, and
 * crafted bad headers refused with the right status (never a crash). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "model/safetensors.h"

/* Writes header JSON + `data_len` bytes of data (0, 1, 2, ...) to a temp
 * file; returns its path (static buffer). */
static const char *write_st(const char *header, size_t data_len) {
    static char path[64];
    snprintf(path, sizeof path, "/tmp/augur_st_XXXXXX");
    int   fd = mkstemp(path);
    FILE *f = fdopen(fd, "wb");
    uint64_t hl = strlen(header);
    fwrite(&hl, 8, 1, f);
    fputs(header, f);
    for (size_t i = 0; i < data_len; i++) fputc((int)(i & 0xFF), f);
    fclose(f);
    return path;
}

static ag_status open_st(const char *header, size_t data_len, ag_st_file **f) {
    const char *p = write_st(header, data_len);
    ag_status   st = ag_st_open(p, f);
    unlink(p);
    return st;
}

static void reads_a_file(void **state) {
    ag_st_file *f = NULL;
    assert_int_equal(open_st("{\"__metadata__\":{\"format\":\"pt\"},"
                             "\"w\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]},"
                             "\"b\":{\"dtype\":\"BF16\",\"shape\":[4],\"data_offsets\":[24,32]}}  ",
                             32, &f),
                     AG_OK);
    assert_int_equal(ag_st_n_tensors(f), 2);
    const ag_st_tensor *w = ag_st_find(f, "w"), *b = ag_st_find(f, "b");
    assert_non_null(w);
    assert_non_null(b);
    assert_null(ag_st_find(f, "__metadata__"));
    assert_int_equal(w->type, AG_TYPE_F32);
    assert_int_equal(w->n_dims, 2);
    assert_int_equal(w->shape[0], 2);
    assert_int_equal(w->shape[1], 3);
    assert_int_equal(w->n_elems, 6);
    assert_int_equal(w->size, 24);
    assert_int_equal(w->data[0], 0);
    assert_int_equal(b->type, AG_TYPE_BF16);
    assert_int_equal(b->data[0], 24);
    assert_int_equal(b->size, 8);
    ag_st_free(f);
    ag_st_free(NULL);
}

static void bad_files_are_refused(void **state) {
    static const struct {
        const char *header;
        size_t      data;
        ag_status   want;
    } cases[] = {
        {"[1,2]", 0, AG_ERR_FORMAT},                                                          /* not an object */
        {"{\"w\":", 0, AG_ERR_FORMAT},                                                        /* bad JSON */
        {"{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},\"w\":{}}", 8, AG_ERR_FORMAT}, /* duplicate */
        {"{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 4, AG_ERR_FORMAT},  /* past the end */
        {"{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,12]}}", 12, AG_ERR_FORMAT}, /* size != shape */
        {"{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,0]}}", 8, AG_ERR_FORMAT},  /* end < begin */
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
         "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}", 12, AG_ERR_FORMAT},     /* overlap */
        {"{\"w\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,2]}}", 2, AG_ERR_UNSUPPORTED},
        {"{\"w\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1],\"data_offsets\":[0,4]}}", 4, AG_ERR_UNSUPPORTED},
        {"{\"w\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}", 4, AG_ERR_FORMAT},
        {"{\"w\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296],\"data_offsets\":[0,4]}}", 4, AG_ERR_FORMAT},
        {"{\"w\":{\"shape\":[1],\"data_offsets\":[0,4]}}", 4, AG_ERR_FORMAT},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        ag_st_file *f = (ag_st_file *)1;
        ag_status   st = open_st(cases[i].header, cases[i].data, &f);
        if (st != cases[i].want) fail_msg("case %zu: status %d, want %d", i, st, cases[i].want);
        assert_null(f);
    }
    /* a header length past the file */
    char  path[] = "/tmp/augur_st_XXXXXX";
    int   fd = mkstemp(path);
    FILE *fp = fdopen(fd, "wb");
    uint64_t hl = 1000;
    fwrite(&hl, 8, 1, fp);
    fputs("{}", fp);
    fclose(fp);
    ag_st_file *f = NULL;
    assert_int_equal(ag_st_open(path, &f), AG_ERR_FORMAT);
    unlink(path);
    assert_int_equal(ag_st_open("/nonexistent/x.safetensors", &f), AG_ERR_IO);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(reads_a_file),
        cmocka_unit_test(bad_files_are_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
