/* Unicode helpers for the tokenizers: code point classes (general category
 * from utf8proc, llama.cpp's whitespace set), lenient UTF-8 as llama.cpp
 * decodes it, and GPT-2's byte <-> code point mapping. */
#include <pthread.h>
#include <stdlib.h>

#include <utf8proc.h>

#include "tok/tok_internal.h"

static uint16_t      *g_table;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

/* \s for the pre-tokenizers: the set llama.cpp generates from Python's
 * str.isspace minus the 0x1C-0x1F separators (its unicode_set_whitespace). */
static const uint32_t k_space[] = {0x09,   0x0A,   0x0B,   0x0C,   0x0D,   0x20,   0x85,
                                   0xA0,   0x1680, 0x2000, 0x2001, 0x2002, 0x2003, 0x2004,
                                   0x2005, 0x2006, 0x2007, 0x2008, 0x2009, 0x200A, 0x2028,
                                   0x2029, 0x202F, 0x205F, 0x3000};

static uint16_t category_flag(uint32_t cp) {
    switch (utf8proc_category((utf8proc_int32_t)cp)) {
    case UTF8PROC_CATEGORY_LU:
    case UTF8PROC_CATEGORY_LL:
    case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM:
    case UTF8PROC_CATEGORY_LO: return CPT_LETTER;
    case UTF8PROC_CATEGORY_MN:
    case UTF8PROC_CATEGORY_MC:
    case UTF8PROC_CATEGORY_ME: return CPT_MARK;
    case UTF8PROC_CATEGORY_ND:
    case UTF8PROC_CATEGORY_NL:
    case UTF8PROC_CATEGORY_NO: return CPT_NUMBER;
    case UTF8PROC_CATEGORY_PC:
    case UTF8PROC_CATEGORY_PD:
    case UTF8PROC_CATEGORY_PS:
    case UTF8PROC_CATEGORY_PE:
    case UTF8PROC_CATEGORY_PI:
    case UTF8PROC_CATEGORY_PF:
    case UTF8PROC_CATEGORY_PO: return CPT_PUNCT;
    case UTF8PROC_CATEGORY_SM:
    case UTF8PROC_CATEGORY_SC:
    case UTF8PROC_CATEGORY_SK:
    case UTF8PROC_CATEGORY_SO: return CPT_SYMBOL;
    case UTF8PROC_CATEGORY_ZS:
    case UTF8PROC_CATEGORY_ZL:
    case UTF8PROC_CATEGORY_ZP: return CPT_SEPARATOR;
    case UTF8PROC_CATEGORY_CC:
    case UTF8PROC_CATEGORY_CF:
    case UTF8PROC_CATEGORY_CS:
    case UTF8PROC_CATEGORY_CO: return CPT_CONTROL;
    default: return CPT_UNDEFINED;
    }
}

static void build_table(void) {
    uint16_t *t = malloc(sizeof *t * CPT_MAX);
    if (!t) return;
    for (uint32_t cp = 0; cp < CPT_MAX; cp++) {
        /* utf8proc has no data for surrogates; Unicode calls them Cs. */
        t[cp] = (cp >= 0xD800 && cp <= 0xDFFF) ? CPT_CONTROL : category_flag(cp);
    }
    /* Unicode 15.1 additions, which llama.cpp's tables have and utf8proc 2.8
     * (Unicode 15.0) lacks: CJK extension I and five ideographic symbols. */
    for (uint32_t cp = 0x2EBF0; cp <= 0x2EE5D; cp++) t[cp] = CPT_LETTER;
    for (uint32_t cp = 0x2FFC; cp <= 0x2FFF; cp++) t[cp] = CPT_SYMBOL;
    t[0x31EF] = CPT_SYMBOL;
    for (size_t i = 0; i < sizeof k_space / sizeof k_space[0]; i++) t[k_space[i]] |= CPT_SPACE;
    g_table = t;
}

const uint16_t *tok_cpt_table(void) {
    pthread_once(&g_once, build_table);
    return g_table;
}

size_t tok_utf8_decode(const unsigned char *s, size_t n, uint32_t *cp) {
    unsigned char c = s[0];
    if (c < 0x80) {
        *cp = c;
        return 1;
    }
    size_t len;
    uint32_t v;
    if ((c & 0xE0) == 0xC0) {
        len = 2;
        v = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
        len = 3;
        v = c & 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
        len = 4;
        v = c & 0x07;
    } else {
        *cp = 0xFFFD; /* continuation byte or 0xF8.. as a lead */
        return 1;
    }
    if (len > n) {
        *cp = 0xFFFD;
        return 1;
    }
    for (size_t i = 1; i < len; i++) {
        if ((s[i] & 0xC0) != 0x80) {
            *cp = 0xFFFD;
            return 1;
        }
        v = (v << 6) | (s[i] & 0x3F);
    }
    if (v >= CPT_MAX) {
        *cp = 0xFFFD;
        return 1;
    }
    *cp = v;
    return len;
}

size_t tok_utf8_encode(uint32_t cp, char out[4]) {
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (char)(0xC0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (char)(0xE0 | (cp >> 12));
        out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    if (cp < CPT_MAX) {
        out[0] = (char)(0xF0 | (cp >> 18));
        out[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
        out[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[3] = (char)(0x80 | (cp & 0x3F));
        return 4;
    }
    return 0;
}

/* GPT-2: printable Latin-1 bytes map to themselves, the other 68 bytes to
 * U+0100.. in byte order. */
static bool byte_is_printable(unsigned b) {
    return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
}

uint32_t tok_byte_to_cpt(uint8_t b) {
    if (byte_is_printable(b)) return b;
    uint32_t n = 0;
    for (unsigned c = 0; c < b; c++)
        if (!byte_is_printable(c)) n++;
    return 256 + n;
}

int tok_cpt_to_byte(uint32_t cp) {
    if (cp < 256) return byte_is_printable(cp) ? (int)cp : -1;
    if (cp >= 256 + 68) return -1;
    uint32_t n = cp - 256;
    for (unsigned c = 0; c < 256; c++) {
        if (byte_is_printable(c)) continue;
        if (n == 0) return (int)c;
        n--;
    }
    return -1;
}
