/* Unit tests for src/base: utf-8, buffers, arena, atomic file write. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "base/arena.h"
#include "base/buf.h"
#include "base/file.h"
#include "base/switches.h"
#include "base/utf8.h"

static void utf8_decode_valid_and_invalid(void **state) {
    uint32_t cp;
    assert_int_equal(ag_utf8_decode("A", 1, &cp), 1);
    assert_int_equal(cp, 'A');
    assert_int_equal(ag_utf8_decode("\xC3\xA9", 2, &cp), 2);
    assert_int_equal(cp, 0xE9);
    assert_int_equal(ag_utf8_decode("\xF0\x9F\x98\x80", 4, &cp), 4);
    assert_int_equal(cp, 0x1F600);
    assert_int_equal(ag_utf8_decode("\xC0\x80", 2, &cp), 0);     /* overlong */
    assert_int_equal(ag_utf8_decode("\xED\xA0\x80", 3, &cp), 0); /* surrogate */
    assert_int_equal(ag_utf8_decode("\xF4\x90\x80\x80", 4, &cp), 0); /* > U+10FFFF */
    assert_int_equal(ag_utf8_decode("\xE2\x82", 2, &cp), 0);     /* truncated */
    assert_int_equal(cp, 0xFFFD);
    char out[4];
    assert_int_equal(ag_utf8_encode(0x20AC, out), 3);
    assert_memory_equal(out, "\xE2\x82\xAC", 3);
    assert_int_equal(ag_utf8_encode(0xD800, out), 0);
}

static void utf8_complete_prefix_holds_partial(void **state) {
    assert_int_equal(ag_utf8_complete_prefix("ab\xE2\x82", 4), 2);
    assert_int_equal(ag_utf8_complete_prefix("ab\xE2\x82\xAC", 5), 5);
    assert_int_equal(ag_utf8_complete_prefix("\xF0", 1), 0);
    assert_int_equal(ag_utf8_complete_prefix("abc", 3), 3);
    assert_true(ag_utf8_valid("h\xC3\xA9llo", 6));
    assert_false(ag_utf8_valid("h\xC3llo", 5));
}

static void buf_appends_and_grows(void **state) {
    ag_buf b = {0};
    assert_string_equal(ag_buf_cstr(&b), "");
    for (int i = 0; i < 1000; i++) assert_int_equal(ag_buf_printf(&b, "%d,", i), AG_OK);
    assert_true(b.len > 3000);
    assert_memory_equal(b.data, "0,1,2,", 6);
    assert_int_equal(b.data[b.len], '\0');
    ag_buf_clear(&b);
    assert_int_equal(b.len, 0);
    ag_buf_append(&b, "x\0y", 3);
    assert_int_equal(b.len, 3);
    char *s = ag_buf_take(&b);
    assert_memory_equal(s, "x\0y", 3);
    free(s);
    assert_null(b.data);
    ag_buf_free(&b);
}

static void arena_alignment_and_reset(void **state) {
    ag_arena a = {.min_chunk = 256};
    for (int i = 1; i < 200; i++) {
        unsigned char *p = ag_arena_alloc(&a, (size_t)i * 7);
        assert_non_null(p);
        assert_int_equal((uintptr_t)p % 64, 0);
        memset(p, 0xAB, (size_t)i * 7);
    }
    size_t peak = a.peak;
    ag_arena_reset(&a);
    assert_int_equal(a.used, 0);
    assert_int_equal(a.peak, peak);
    assert_non_null(ag_arena_alloc(&a, 100));
    ag_arena_free(&a);
}

static void file_atomic_write_then_read(void **state) {
    char dir[] = "/tmp/augur-test-XXXXXX";
    assert_non_null(mkdtemp(dir));
    char path[128];
    snprintf(path, sizeof path, "%s/f.bin", dir);
    assert_int_equal(ag_file_write_atomic(path, "hello", 5), AG_OK);
    assert_int_equal(ag_file_write_atomic(path, "bye", 3), AG_OK);
    char *data;
    size_t len;
    assert_int_equal(ag_file_read_all(path, &data, &len), AG_OK);
    assert_int_equal(len, 3);
    assert_string_equal(data, "bye");
    free(data);
    ag_mapped_file m;
    assert_int_equal(ag_file_map(path, &m), AG_OK);
    assert_int_equal(m.size, 3);
    ag_file_unmap(&m);
    assert_int_equal(ag_file_read_all("/nonexistent/x", &data, &len), AG_ERR_IO);
    assert_non_null(strstr(ag_error_message(), "/nonexistent/x"));
    unlink(path);
    rmdir(dir);
}

/* The switch readers: unset, malformed and out-of-range values give the
 * fallback; "0..." is off; a name outside the table reads as unset. */
static void switches_parse_and_bound(void **state) {
    (void)state;
    unsetenv("AUGUR_THREADS");
    assert_int_equal(ag_switch_int("AUGUR_THREADS", 1, 1024, 7), 7);
    setenv("AUGUR_THREADS", "12", 1);
    assert_int_equal(ag_switch_int("AUGUR_THREADS", 1, 1024, 7), 12);
    setenv("AUGUR_THREADS", "12x", 1);
    assert_int_equal(ag_switch_int("AUGUR_THREADS", 1, 1024, 7), 7);
    setenv("AUGUR_THREADS", "5000", 1);
    assert_int_equal(ag_switch_int("AUGUR_THREADS", 1, 1024, 7), 7);
    setenv("AUGUR_THREADS", "", 1);
    assert_null(ag_switch_text("AUGUR_THREADS"));
    unsetenv("AUGUR_THREADS");
    setenv("AUGUR_SPEC_MARGIN", "1.5", 1);
    assert_true(ag_switch_real("AUGUR_SPEC_MARGIN", 1.0, 3.0, 1.15) == 1.5);
    setenv("AUGUR_SPEC_MARGIN", "9", 1);
    assert_true(ag_switch_real("AUGUR_SPEC_MARGIN", 1.0, 3.0, 1.15) == 1.15);
    unsetenv("AUGUR_SPEC_MARGIN");
    setenv("AUGUR_EDITS", "0", 1);
    assert_true(ag_switch_off("AUGUR_EDITS"));
    setenv("AUGUR_EDITS", "1", 1);
    assert_false(ag_switch_off("AUGUR_EDITS"));
    unsetenv("AUGUR_EDITS");
    assert_false(ag_switch_off("AUGUR_EDITS"));
    setenv("AUGUR_NOT_A_SWITCH", "1", 1);
    assert_null(ag_switch_text("AUGUR_NOT_A_SWITCH"));
    unsetenv("AUGUR_NOT_A_SWITCH");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(utf8_decode_valid_and_invalid),
        cmocka_unit_test(utf8_complete_prefix_holds_partial),
        cmocka_unit_test(buf_appends_and_grows),
        cmocka_unit_test(arena_alignment_and_reset),
        cmocka_unit_test(file_atomic_write_then_read),
        cmocka_unit_test(switches_parse_and_bound),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
