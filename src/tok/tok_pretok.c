/* Pre-tokenizers of byte-level BPE vocabularies: text -> words.
 *
 * Each pre-tokenizer is llama.cpp's list of regular expressions, applied in
 * sequence: every expression splits each current piece into its matches and
 * the gaps between them. The expressions themselves are llama.cpp's (the
 * tokenizer.json originals, rewritten where std::regex needs it), and so is
 * how they run, because that decides the token ids:
 *
 *  - the frequent ones (GPT-2's, Llama 3's, Qwen 2's, digit isolation, ...)
 *    run as hand-written scanners, as in llama.cpp (and much faster than any
 *    regex engine);
 *  - an expression with \p{..} classes runs over a "collapsed" text, one byte
 *    per code point: ASCII stays, other whitespace becomes \v, other code
 *    points become one byte per general category (0xD1 number, 0xD2 letter,
 *    0xD3 punctuation, 0xD4 mark, 0xD5 symbol, 0xD0 other), and \p{X} in the
 *    expression becomes a class of that byte plus the ASCII members. This is
 *    exactly llama.cpp's trick; running PCRE2 in UCP mode instead would differ
 *    from it on several code points (e.g. U+001C..U+001F, U+0085 for \s);
 *  - an expression without \p{..} runs over the code points (PCRE2 in UTF
 *    mode, ASCII-only \s \d \w like std::wregex) with non-ASCII whitespace
 *    turned into \v, again as llama.cpp.
 *
 * PCRE2 with JIT does the regex work; the category data comes from utf8proc
 * (tok_unicode.c), checked equal to llama.cpp's tables. */
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "tok/tok_internal.h"

/* ---- the expressions (llama.cpp's llm_tokenizer_bpe regex_exprs) ---- */

#define CONTRACTIONS "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"

static const char RE_GPT2[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)";
static const char RE_LLAMA3[] =
    CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
                 "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
static const char RE_LLAMA3_ORIG[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
static const char RE_QWEN2[] =
    CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
                 "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
static const char RE_QWEN35[] =
    CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}| ?[^\\s\\p{L}\\p{M}\\p{N}]+[\\r\\n]*|"
                 "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
static const char RE_NUMBER[] = "\\p{N}";
static const char RE_NEWLINES[] = "[^\\n]+|[\\n]+";
static const char RE_AFMOE_DIGITS[] = "\\p{AFMoE_digits}";
static const char RE_AYA_DIGITS[] = "\\d{1,3}(?=(?:\\d{3})*\\b)";

static const char RE_JAIS2[] =
    CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
                 "\\s*[\\r\\n]+|\\s{512}(?!\\S)|\\s{256}(?!\\S)|\\s{128}(?!\\S)|\\s{64}(?!\\S)|"
                 "\\s{32}(?!\\S)|\\s{16}(?!\\S)|\\s{8}(?!\\S)|\\s{4}(?!\\S)|\\s{1,2}(?!\\S)|\\s{1}";
static const char RE_DEEPSEEK_LETTERS[] =
    "\\s?[A-Za-z\u00B5\u00C0-\u00D6\u00D8-\u00F6\u00F8-\u01BA\u01BC-\u01BF\u01C4-\u0293\u0295-\u02AF\u0370-\u0373\u0376\u0377\u037B-\u037D\u037F\u0386\u0388-\u038A\u038C\u038E-\u03A1"
    "\u03A3-\u03F5\u03F7-\u0481\u048A-\u052F\u0531-\u0556\u10A0-\u10C5\u13A0-\u13F5\u13F8-\u13FD\u1C90-\u1CBA\u1CBD-\u1CBF\u1D00-\u1D2B\u1D6B-\u1D77\u1D79-\u1D9A\u1E00-\u1F15"
    "\u1F18-\u1F1D\u1F20-\u1F45\u1F48-\u1F4D\u1F50-\u1F57\u1F59\u1F5B\u1F5D\u1F5F-\u1F7D\u1F80-\u1FB4\u1FB6-\u1FBC\u1FBE\u1FC2-\u1FC4\u1FC6-\u1FCC\u1FD0-\u1FD3\u1FD6-\u1FDB"
    "\u1FE0-\u1FEC\u1FF2-\u1FF4\u1FF6-\u1FFC\u2102\u2107\u210A-\u2113\u2115\u2119-\u211D\u2124\u2126\u2128\u212A-\u212D\u212F-\u2134\u2139\u213C-\u213F\u2145-\u2149\u214E"
    "\u2183\u2184\u2C00-\u2C7B\u2C7E-\u2CE4\u2CEB-\u2CEE\u2CF2\u2CF3\uA640-\uA66D\uA680-\uA69B\uA722-\uA76F\uA771-\uA787\uA78B-\uA78E\uAB70-\uABBF\uFB00-\uFB06\uFB13-\uFB17"
    "\uFF21-\uFF3A\uFF41-\uFF5A\U00010400-\U0001044F\U000104B0-\U000104D3\U000104D8-\U000104FB\U00010C80-\U00010CB2\U00010CC0-\U00010CF2\U000118A0-\U000118DF"
    "\U0001E900-\U0001E943]+";
static const char RE_DEEPSEEK3_MAIN[] =
    "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| "
    "?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+";
static const char RE_SPARK_MAIN[] =
    "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| "
    "?[\\p{P}\\p{S}]+|[\r\n]|\\s+(?!\\S)|\\s+";
static const char RE_CJK_KANA[] = "[\u4E00-\u9FA5\u3040-\u309F\u30A0-\u30FF]+";
static const char RE_YOUTU_CJK[] = "[\uAC00-\uD7A3\u3131-\u318E]+|[\uFF01\u2026\u201C\u201D\u2018\u2019\u2014\uFF1A\uFF1B\uFF0C\u3001-\u303F\uFE30-\uFE4F]+|[\u3105-\u312F]+|"
    "[\u4E00-\u9FA5\u3040-\u309F\u30A0-\u30FF]+";
#define CASED_WORDS(M)                                                                             \
    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+" M      \
    "|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*" M
static const char RE_YOUTU_MAIN[] = CASED_WORDS(CONTRACTIONS "?")
    "|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
static const char RE_AYA_MAIN[] = CASED_WORDS(CONTRACTIONS "?")
    "|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
static const char RE_CJK_HANGUL[] = "[\u4E00-\u9FA5\u0800-\u4E00\uAC00-\uD7FF]+";
static const char RE_FALCON_PUNCT[] = "[\\p{P}\\$\\+<=>\\^~\\|`]+";
static const char RE_DEFAULT_PUNCT[] = "[\\p{P}\\$\\+<=>\\^~\\|]+";
static const char RE_BLOOM[] = " ?[^(\\s|.,!?\u2026\u3002\uFF0C\u3001\u0964\u06D4\u060C)]+";
#define TEKKEN_WORDS(M, L)                                                                         \
    "[^\\r\\n\\p{L}\\p{N}]?((?=[" L "])([^a-z]))*((?=[" L "])([^A-Z]))+" M                          \
    "|[^\\r\\n\\p{L}\\p{N}]?((?=[" L "])([^a-z]))+((?=[" L "])([^A-Z]))*" M
static const char RE_TEKKEN[] = TEKKEN_WORDS("", "\\p{L}")
    "|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
static const char RE_GPT4O[] = TEKKEN_WORDS(CONTRACTIONS "?", "\\p{L}")
    "|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
static const char RE_GRANITE_MULTI[] = TEKKEN_WORDS(CONTRACTIONS "?", "\\p{L}\\p{M}")
    "|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
static const char RE_BAILING[] =
    "'(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| "
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]|\\s+(?!\\S)|\\s+";
static const char RE_SEED_CODER[] =
    CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1}| ?[^\\s\\p{L}\\p{N}\\r\\n]+|\\s*[\\r\\n]+|"
                 "\\s+(?!\\S)|\\s+";
static const char RE_UFAKZEKA[] =
    "[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
static const char RE_AFMOE_CJK[] =
    "[\u4E00-\u9FFF\u3400-\u4DBF\u8C48-\uFAFF\u3040-\u309F\u30A0-\u30FF\uFF65-\uFF9F\u2F00-\u2FDF\u0E40-\u0E7F\u0E80-\u0EFF\u1780-\u17FF\u1000-\u109F"
    "\uAA60-\uAA7F\uA9E0-\uA9FF\uAC00-\uD7AF\u1100-\u11FF]+";
static const char RE_AFMOE_MAIN[] =
    "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\\r\\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| "
    "?[\\p{P}\\p{S}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
static const char RE_EXAONE_MOE[] =
    CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?(?:\\p{L}\\p{M}*(?: \\p{L}\\p{M}*)*)+|\\p{N}| "
                 "?[^\\s\\p{L}\\p{N}]+[\\r\\n/]?|\\s*[\\r\\n]|\\s+(?!\\S)|\\s+";
static const char RE_MINICPM5[] =
    CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}+| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|"
                 "\\s+(?!\\S)|\\s+";

#define LIST(...) ((const char *const[]){__VA_ARGS__, NULL})

typedef struct {
    const char         *names; /* '|'-separated tokenizer.ggml.pre values */
    const char *const  *exprs;
    unsigned            flags;
    bool                no_byte_encode;
} pre_def;

#define CLEAN PRE_CLEAN_SPACES

/* llama.cpp's table (llama_vocab::impl::load and llm_tokenizer_bpe). */
static const pre_def k_pre[] = {
    {"default", LIST(RE_DEFAULT_PUNCT, RE_GPT2, "\\p{N}+", "[0-9][0-9][0-9]"), CLEAN, false},
    {"llama3|llama-v3|llama-bpe|falcon3|falcon-h1|pixtral|midm-2.0|lfm2|jina-v5-nano", LIST(RE_LLAMA3),
     CLEAN | PRE_IGNORE_MERGES | PRE_ADD_BOS, false},
    {"dbrx|smaug-bpe", LIST(RE_LLAMA3), CLEAN, false},
    {"jais-2", LIST(RE_JAIS2), CLEAN, false},
    {"deepseek-llm",
     LIST("[\r\n]", RE_DEEPSEEK_LETTERS, "\\s?[!-/:-~\uFF01-\uFF0F\uFF1A-\uFF5E\u2018-\u201F\u3000-\u3002]+", "\\s+$", RE_CJK_HANGUL,
          "\\p{N}+"),
     0, false},
    {"deepseek-coder", LIST("[\r\n]", "\\s?\\p{L}+", "\\s?\\p{P}+", RE_CJK_HANGUL, RE_NUMBER), 0, false},
    {"deepseek-v3|hunyuan-dense|hy_v4|joyai-llm", LIST("\\p{N}{1,3}", RE_CJK_KANA, RE_DEEPSEEK3_MAIN), 0,
     false},
    {"spark2_5", LIST("\\p{N}{1,3}", RE_CJK_KANA, RE_SPARK_MAIN, RE_NUMBER), 0, false},
    {"youtu", LIST(RE_YOUTU_CJK, RE_YOUTU_MAIN), PRE_IGNORE_MERGES, false},
    {"falcon", LIST(RE_FALCON_PUNCT, RE_GPT2, "[0-9][0-9][0-9]"), CLEAN, false},
    {"starcoder|refact|codeshell|exaone|minerva-7b|mellum2", LIST(RE_NUMBER, RE_GPT2), CLEAN, false},
    {"command-r|smollm", LIST(RE_NUMBER, RE_GPT2), 0, false},
    {"gpt-2|phi-2|jina-es|jina-de|gigachat|jina-v2-es|jina-v2-de|a.x-4.0|mellum|modern-bert|jina-v1-en|"
     "jina-v2-code|roberta-bpe|exaone4|mpt|olmo|jais",
     LIST(RE_GPT2), CLEAN, false},
    {"trillion|granite-docling", LIST(RE_GPT2), 0, false},
    {"gemma4|granite-embed-multi-311m", LIST(RE_NEWLINES), CLEAN | PRE_ESCAPE_WS, true},
    {"sarvam-moe", LIST(RE_NEWLINES), PRE_ESCAPE_WS, true},
    /* not llama.cpp's: tokenizer.json's SentencePiece BPE (tok_hf.c), the
     * whole text one word */
    {"sentencepiece-bpe", (const char *const[]){NULL}, PRE_ESCAPE_WS | PRE_UD_ESCAPED, true},
    {"qwen2|deepseek-r1-qwen|kormo|f2llmv2|hunyuan|solar-open|grok-2", LIST(RE_QWEN2), 0, false},
    {"stablelm2|megrez", LIST(RE_QWEN2), CLEAN, false},
    {"qwen35", LIST(RE_QWEN35), 0, false},
    {"poro-chat", LIST(RE_BLOOM), 0, false},
    {"bloom|gpt3-finnish", LIST(RE_BLOOM), CLEAN, false},
    {"glm4|chatglm-bpe", LIST(RE_LLAMA3), CLEAN | PRE_NO_BOS, false},
    {"viking", LIST(RE_BLOOM, RE_NUMBER), 0, false},
    {"tekken", LIST(RE_TEKKEN), PRE_IGNORE_MERGES | PRE_ADD_BOS, false},
    {"chameleon",
     LIST("<sentinel:[0-9]+>", "(IMGIMG)((A|B|C|D|E|F|G|H|I){1,4})Z", "([\\t\\n]|    |  )", RE_NUMBER,
          "[\\p{P}!-/:-@\\[-`{-~]", RE_GPT2),
     PRE_ADD_BOS, false},
    {"gpt-4o|llama4|kanana2|talkie|minimax-m2", LIST(RE_GPT4O), 0, false},
    {"granite-embed-multi-97m", LIST(RE_GRANITE_MULTI), PRE_IGNORE_MERGES, false},
    {"tiny_aya|cohere2moe", LIST(RE_AYA_DIGITS, RE_AYA_MAIN), 0, false},
    {"superbpe", LIST("\\p{N}+", "(?=(\\d{3})+(?!\\d))"), 0, false},
    {"bailingmoe|bailingmoe2|llada-moe", LIST(RE_BAILING), 0, false},
    {"seed-coder", LIST(RE_SEED_CODER), 0, false},
    {"ufakzeka", LIST(RE_UFAKZEKA), 0, false},
    {"afmoe", LIST(RE_AFMOE_DIGITS, RE_AFMOE_CJK, RE_AFMOE_MAIN), 0, false},
    {"laguna", LIST(RE_NEWLINES, RE_QWEN2), 0, false},
    {"exaone-moe", LIST(RE_EXAONE_MOE), CLEAN, false},
    {"minicpm5", LIST("\\p{N}{1,3}", RE_MINICPM5), CLEAN | PRE_IGNORE_MERGES, false},
};

/* ---- steps ---- */

typedef enum {
    ST_REGEX,
    ST_GPT2,
    ST_LLAMA3,  /* digits in groups of 3 */
    ST_QWEN2,   /* single digits */
    ST_QWEN35,  /* single digits, marks join letters */
    ST_NUMBER,  /* \p{N}: every number code point alone */
    ST_NEWLINES,
    ST_DIGIT_GROUPS, /* digit runs: leading 1-2, then groups of 3 */
} step_kind;

typedef struct {
    step_kind    kind;
    bool         collapsed;
    pcre2_code  *re;
} step;

#define MAX_STEPS 8

struct tok_pretok {
    int  n;
    step steps[MAX_STEPS];
    bool need_collapsed, need_u8;
};

static bool names_contain(const char *names, const char *pre) {
    size_t n = strlen(pre);
    for (const char *p = names;;) {
        const char *bar = strchr(p, '|');
        size_t      len = bar ? (size_t)(bar - p) : strlen(p);
        if (len == n && !memcmp(p, pre, n)) return true;
        if (!bar) return false;
        p = bar + 1;
    }
}

/* The \p{..} names llama.cpp collapses, and the byte each stands for. */
static const struct {
    const char *pat;
    char        byte;
    const char *ascii;
} k_ucat[] = {
    {"\\p{N}", (char)0xD1, "0-9"},
    {"\\p{L}", (char)0xD2, "A-Za-z"},
    {"\\p{P}", (char)0xD3, "!-#%-*,-/:-;?-@\\[-\\]_\\{\\}"},
    {"\\p{M}", (char)0xD4, ""},
    {"\\p{S}", (char)0xD5, "\\$\\+<->^`\\|\\~"},
    {"\\p{Lu}", (char)0xD2, "A-Za-z"},
    {"\\p{Ll}", (char)0xD2, "A-Za-z"},
    {"\\p{Lt}", (char)0xD2, "A-Za-z"},
    {"\\p{Lm}", (char)0xD2, "A-Za-z"},
    {"\\p{Lo}", (char)0xD2, "A-Za-z"},
};

static bool uses_categories(const char *re) {
    for (size_t i = 0; i < sizeof k_ucat / sizeof k_ucat[0]; i++)
        if (strstr(re, k_ucat[i].pat)) return true;
    return false;
}

/* The collapsed form of an expression (llama.cpp's rewrite): \p{X} becomes
 * "[<byte><ascii members>]", or the bare members inside brackets. */
static char *collapse_regex(const char *re) {
    size_t n = strlen(re);
    char  *out = malloc(n * 8 + 1);
    if (!out) return NULL;
    size_t o = 0;
    bool   inside = false;
    for (size_t i = 0; i < n; i++) {
        if (re[i] == '[' && (i == 0 || re[i - 1] != '\\')) {
            out[o++] = '[';
            inside = true;
            continue;
        }
        if (inside && re[i] == ']' && re[i - 1] != '\\') {
            out[o++] = ']';
            inside = false;
            continue;
        }
        if (re[i] == '\\' && i + 3 < n && re[i + 1] == 'p' && re[i + 2] == '{') {
            const char *close = strchr(re + i + 3, '}');
            if (close && (size_t)(close - re) <= i + 10) {
                size_t len = (size_t)(close - re) - i + 1;
                size_t k;
                for (k = 0; k < sizeof k_ucat / sizeof k_ucat[0]; k++)
                    if (strlen(k_ucat[k].pat) == len && !memcmp(re + i, k_ucat[k].pat, len)) break;
                if (k < sizeof k_ucat / sizeof k_ucat[0]) {
                    if (!inside) out[o++] = '[';
                    out[o++] = k_ucat[k].byte;
                    size_t al = strlen(k_ucat[k].ascii);
                    memcpy(out + o, k_ucat[k].ascii, al);
                    o += al;
                    if (!inside) out[o++] = ']';
                    i += len - 1;
                    continue;
                }
            }
        }
        out[o++] = re[i];
    }
    out[o] = '\0';
    return out;
}

static ag_status compile_step(const char *re, step *st) {
    memset(st, 0, sizeof *st);
    if (!strcmp(re, RE_GPT2)) st->kind = ST_GPT2;
    else if (!strcmp(re, RE_LLAMA3) || !strcmp(re, RE_LLAMA3_ORIG)) st->kind = ST_LLAMA3;
    else if (!strcmp(re, RE_QWEN2)) st->kind = ST_QWEN2;
    else if (!strcmp(re, RE_QWEN35)) st->kind = ST_QWEN35;
    else if (!strcmp(re, RE_NUMBER)) st->kind = ST_NUMBER;
    else if (!strcmp(re, RE_NEWLINES)) st->kind = ST_NEWLINES;
    else if (!strcmp(re, RE_AFMOE_DIGITS) || !strcmp(re, RE_AYA_DIGITS)) st->kind = ST_DIGIT_GROUPS;
    else st->kind = ST_REGEX;
    if (st->kind != ST_REGEX) return AG_OK;

    st->collapsed = uses_categories(re);
    char       *pat = NULL;
    uint32_t    opts = PCRE2_DOLLAR_ENDONLY; /* ECMAScript $: end of input only */
    if (st->collapsed) {
        for (const unsigned char *p = (const unsigned char *)re; *p; p++)
            if (*p >= 0x80)
                return ag_errorf(AG_ERR_INTERNAL, "pre-tokenizer regex mixes \\p{} and non-ASCII: %s", re);
        pat = collapse_regex(re);
        if (!pat) return ag_errorf(AG_ERR_NOMEM, "out of memory compiling a pre-tokenizer regex");
    } else {
        opts |= PCRE2_UTF;
    }
    int        err = 0;
    PCRE2_SIZE erroff = 0;
    st->re = pcre2_compile((PCRE2_SPTR)(pat ? pat : re), PCRE2_ZERO_TERMINATED, opts, &err, &erroff, NULL);
    free(pat);
    if (!st->re) {
        PCRE2_UCHAR msg[160];
        pcre2_get_error_message(err, msg, sizeof msg);
        return ag_errorf(AG_ERR_INTERNAL, "pre-tokenizer regex does not compile at %zu: %s (%s)",
                         (size_t)erroff, (const char *)msg, re);
    }
    /* JIT is an optimisation: without it (unsupported CPU) the interpreter runs. */
    (void)pcre2_jit_compile(st->re, PCRE2_JIT_COMPLETE);
    return AG_OK;
}

ag_status tok_pretok_new(const char *pre, tok_pretok **out, bool *byte_encode, unsigned *flags) {
    *out = NULL;
    const pre_def *def = NULL;
    if (!pre || !*pre) {
        AG_LOGW("tokenizer: no tokenizer.ggml.pre in the model, using the 'default' pre-tokenizer "
                "(as llama.cpp; token ids may not match the original tokenizer)");
        pre = "default";
    }
    for (size_t i = 0; i < sizeof k_pre / sizeof k_pre[0]; i++)
        if (names_contain(k_pre[i].names, pre)) {
            def = &k_pre[i];
            break;
        }
    if (!def) return ag_errorf(AG_ERR_UNSUPPORTED, "unknown pre-tokenizer type '%s'", pre);

    tok_pretok *p = calloc(1, sizeof *p);
    if (!p) return ag_errorf(AG_ERR_NOMEM, "out of memory");
    for (const char *const *re = def->exprs; *re; re++) {
        if (p->n == MAX_STEPS) {
            tok_pretok_free(p);
            return ag_errorf(AG_ERR_INTERNAL, "pre-tokenizer '%s' has too many steps", pre);
        }
        ag_status s = compile_step(*re, &p->steps[p->n]);
        if (s) {
            tok_pretok_free(p);
            return s;
        }
        step *st = &p->steps[p->n++];
        if (st->kind == ST_REGEX) {
            if (st->collapsed) p->need_collapsed = true;
            else p->need_u8 = true;
        }
    }
    *byte_encode = !def->no_byte_encode;
    *flags = def->flags;
    *out = p;
    return AG_OK;
}

void tok_pretok_free(tok_pretok *p) {
    if (!p) return;
    for (int i = 0; i < p->n; i++) pcre2_code_free(p->steps[i].re);
    free(p);
}

void tok_split_free(tok_split_scratch *s) {
    free(s->a.v);
    free(s->b.v);
    free(s->coll);
    free(s->u8);
    free(s->u8_off);
    pcre2_match_data_free(s->match_data);
    pcre2_jit_stack_free(s->jit_stack);
    memset(s, 0, sizeof *s);
}

/* ---- span lists ---- */

static ag_status spans_push(tok_spans *l, uint32_t start, uint32_t end) {
    if (end <= start) return AG_OK;
    if (l->n == l->cap) {
        size_t    cap = l->cap ? l->cap * 2 : 256;
        tok_span *v = realloc(l->v, cap * sizeof *v);
        if (!v) return ag_errorf(AG_ERR_NOMEM, "out of memory splitting text");
        l->v = v;
        l->cap = cap;
    }
    l->v[l->n].start = start;
    l->v[l->n].end = end;
    l->n++;
    return AG_OK;
}

/* ---- hand-written scanners (llama.cpp's unicode_regex_split_custom_*) ----
 * They look at code points within [ini, end) only; outside, a code point
 * reads as "none" with no flags, as in llama.cpp. */

typedef struct {
    const uint32_t *cps;
    const uint16_t *fl;
    uint32_t        ini, end;
    uint32_t        prev; /* end of the last emitted piece */
    tok_spans      *out;
    ag_status       st;
} scan;

#define NONE 0xFFFFFFFFu
static inline uint32_t sc_cp(const scan *s, uint32_t p) { return p < s->end ? s->cps[p] : NONE; }
static inline uint16_t sc_fl(const scan *s, uint32_t p) { return p < s->end ? s->fl[p] : 0; }
static inline void     sc_emit(scan *s, uint32_t to) {
    if (!s->st) s->st = spans_push(s->out, s->prev, to);
    s->prev = to;
}
static inline uint32_t ascii_lower(uint32_t c) { return (c >= 'A' && c <= 'Z') ? c + 32 : c; }

/* 's|'t|'re|'ve|'m|'ll|'d (case-folded when ci): the length matched, or 0. */
static uint32_t contraction(const scan *s, uint32_t pos, bool ci) {
    if (sc_cp(s, pos) != '\'' || pos + 1 >= s->end) return 0;
    uint32_t a = sc_cp(s, pos + 1);
    if (ci) a = ascii_lower(a);
    if (a == 's' || a == 't' || a == 'm' || a == 'd') return 2;
    if (pos + 2 >= s->end) return 0;
    uint32_t b = sc_cp(s, pos + 2);
    if (ci) b = ascii_lower(b);
    if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return 3;
    return 0;
}

/* Whitespace run at pos: \s+(?!\S) leaves the last space to the next word
 * unless the run ends the piece. Returns the new position. */
static uint32_t whitespace_run(scan *s, uint32_t pos, bool newline_rule) {
    uint32_t n = 0, last_nl = 0;
    while (sc_fl(s, pos + n) & CPT_SPACE) {
        uint32_t c = sc_cp(s, pos + n);
        if (newline_rule && (c == '\r' || c == '\n')) last_nl = pos + n + 1;
        n++;
    }
    if (last_nl > 0) return last_nl;                                  /* \s*[\r\n]+ */
    if (n > 1 && sc_cp(s, pos + n) != NONE) return pos + n - 1;       /* \s+(?!\S) */
    if (n > 0) return pos + n;                                        /* \s+ */
    return pos + 1;                                                   /* no match */
}

static void scan_gpt2(scan *s) {
    for (uint32_t pos = s->ini; pos < s->end && !s->st;) {
        uint32_t cpt = sc_cp(s, pos);
        uint16_t f = sc_fl(s, pos);
        uint32_t k = contraction(s, pos, false);
        if (k) {
            pos += k;
            sc_emit(s, pos);
            continue;
        }
        uint16_t f2 = cpt == ' ' ? sc_fl(s, pos + 1) : f;
        if (f2 & CPT_LETTER) {
            pos += cpt == ' ';
            while (sc_fl(s, pos) & CPT_LETTER) pos++;
            sc_emit(s, pos);
            continue;
        }
        if (f2 & CPT_NUMBER) {
            pos += cpt == ' ';
            while (sc_fl(s, pos) & CPT_NUMBER) pos++;
            sc_emit(s, pos);
            continue;
        }
        if (!(f2 & (CPT_SPACE | CPT_LETTER | CPT_NUMBER)) && f2) {
            pos += cpt == ' ';
            for (;;) {
                uint16_t g = sc_fl(s, pos);
                if ((g & (CPT_SPACE | CPT_LETTER | CPT_NUMBER)) || !g) break;
                pos++;
            }
            sc_emit(s, pos);
            continue;
        }
        pos = whitespace_run(s, pos, false);
        sc_emit(s, pos);
    }
    if (!s->st) sc_emit(s, s->end);
}

/* Llama 3 (digit groups of 3), Qwen 2 (single digits), Qwen 3.5 (single
 * digits; marks belong to words). */
static void scan_llama3(scan *s, int digits, bool marks) {
    const uint16_t word = marks ? (CPT_LETTER | CPT_MARK) : CPT_LETTER;
    for (uint32_t pos = s->ini; pos < s->end && !s->st;) {
        uint32_t cpt = sc_cp(s, pos);
        uint16_t f = sc_fl(s, pos);
        uint32_t k = contraction(s, pos, true);
        if (k) {
            pos += k;
            sc_emit(s, pos);
            continue;
        }
        /* [^\r\n\p{L}\p{N}]?\p{L}+ */
        if (!(cpt == '\r' || cpt == '\n' || (f & CPT_NUMBER))) {
            if ((f & word) || (sc_fl(s, pos + 1) & word)) {
                pos++;
                while (sc_fl(s, pos) & word) pos++;
                sc_emit(s, pos);
                continue;
            }
        }
        if (f & CPT_NUMBER) {
            if (digits == 1) {
                pos++;
                sc_emit(s, pos);
                continue;
            }
            uint32_t ini = pos;
            while (sc_fl(s, pos) & CPT_NUMBER) {
                if (++pos - ini >= (uint32_t)digits) {
                    sc_emit(s, pos);
                    ini = pos;
                }
            }
            sc_emit(s, pos);
            continue;
        }
        /*  ?[^\s\p{L}\p{N}]+[\r\n]* (llama.cpp tests the flags of pos here) */
        const uint16_t stop = CPT_SPACE | word | CPT_NUMBER;
        uint16_t       f2 = cpt == ' ' ? sc_fl(s, pos + 1) : f;
        if (!(f2 & stop) && f) {
            pos += cpt == ' ';
            for (;;) {
                uint16_t g = sc_fl(s, pos);
                if ((g & stop) || !g) break;
                pos++;
            }
            for (uint32_t c = sc_cp(s, pos); c == '\r' || c == '\n'; c = sc_cp(s, ++pos)) {}
            sc_emit(s, pos);
            continue;
        }
        pos = whitespace_run(s, pos, true);
        sc_emit(s, pos);
    }
    if (!s->st) sc_emit(s, s->end);
}

static void scan_number(scan *s) {
    for (uint32_t pos = s->ini; pos < s->end && !s->st; pos++) {
        uint32_t c = s->cps[pos];
        uint16_t f = s->fl[pos];
        /* the collapsed text turns non-ASCII whitespace into \v first */
        if ((f & CPT_NUMBER) && !(c >= 0x80 && (f & CPT_SPACE))) {
            sc_emit(s, pos);
            sc_emit(s, pos + 1);
        }
    }
    if (!s->st) sc_emit(s, s->end);
}

static void scan_newlines(scan *s) {
    uint32_t pos = s->ini;
    while (pos < s->end && !s->st) {
        bool nl = s->cps[pos] == '\n';
        while (pos < s->end && (s->cps[pos] == '\n') == nl) pos++;
        sc_emit(s, pos);
    }
}

static void scan_digit_groups(scan *s) {
    for (uint32_t pos = s->ini; pos < s->end && !s->st;) {
        if (!(s->fl[pos] & CPT_NUMBER)) {
            pos++;
            continue;
        }
        uint32_t start = pos;
        while (pos < s->end && (s->fl[pos] & CPT_NUMBER)) pos++;
        uint32_t count = pos - start, cur = start, rem = count % 3;
        if (rem) {
            cur += rem;
            sc_emit(s, cur);
        }
        while (cur < start + count) {
            cur += 3;
            sc_emit(s, cur);
        }
    }
    if (!s->st) sc_emit(s, s->end);
}

/* ---- regex steps ---- */

static ag_status regex_error(int rc) {
    PCRE2_UCHAR msg[160];
    pcre2_get_error_message(rc, msg, sizeof msg);
    return ag_errorf(AG_ERR_RANGE, "pre-tokenizer regex failed on this text: %s", (const char *)msg);
}

static int run_match(const step *st, tok_split_scratch *s, const char *subj, size_t len, size_t at,
                     uint32_t opts) {
    pcre2_match_data *md = s->match_data;
    int rc = pcre2_match(st->re, (PCRE2_SPTR)subj, len, at, opts | PCRE2_NO_UTF_CHECK, md, NULL);
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT) {
        /* Long words with repeated lookahead groups (tekken, gpt-4o) need
         * more than the default 32 KiB JIT stack. */
        if (!s->jit_stack) s->jit_stack = pcre2_jit_stack_create(64 * 1024, 64 * 1024 * 1024, NULL);
        if (!s->jit_stack) return PCRE2_ERROR_NOMEMORY;
        pcre2_match_context *mc = pcre2_match_context_create(NULL);
        if (!mc) return PCRE2_ERROR_NOMEMORY;
        pcre2_jit_stack_assign(mc, NULL, s->jit_stack);
        rc = pcre2_match(st->re, (PCRE2_SPTR)subj, len, at, opts | PCRE2_NO_UTF_CHECK, md, mc);
        pcre2_match_context_free(mc);
    }
    return rc;
}

/* Byte offset -> code point index within [lo, hi] using the offsets table. */
static uint32_t u8_to_cp(const uint32_t *off, uint32_t lo, uint32_t hi, uint32_t byte) {
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo) / 2;
        if (off[mid] < byte) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

/* Splits one piece [a, b) by a regex the way std::regex_iterator walks it:
 * matches and the gaps between them become pieces; after an empty match a
 * non-empty match at the same place is tried, else the walk moves one code
 * point on. */
static ag_status split_regex(const step *st, tok_split_scratch *s, uint32_t a, uint32_t b,
                             tok_spans *out) {
    const char *subj;
    size_t      len;
    uint32_t    base_byte = 0;
    if (st->collapsed) {
        subj = s->coll + a;
        len = b - a;
    } else {
        base_byte = s->u8_off[a];
        subj = s->u8 + base_byte;
        len = s->u8_off[b] - base_byte;
    }
#define TO_CP(x) (st->collapsed ? a + (uint32_t)(x) : u8_to_cp(s->u8_off, a, b, base_byte + (uint32_t)(x)))
    size_t    pos = 0, last = 0;
    ag_status e;
    while (pos <= len) {
        int rc = run_match(st, s, subj, len, pos, 0);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) return regex_error(rc);
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(s->match_data);
        size_t      ms = ov[0], me = ov[1];
        if ((e = spans_push(out, TO_CP(last), TO_CP(ms)))) return e;
        if ((e = spans_push(out, TO_CP(ms), TO_CP(me)))) return e;
        last = me;
        pos = me;
        if (me == ms) {
            rc = run_match(st, s, subj, len, me, PCRE2_NOTEMPTY_ATSTART | PCRE2_ANCHORED);
            if (rc >= 0) {
                ov = pcre2_get_ovector_pointer(s->match_data);
                if ((e = spans_push(out, TO_CP(ov[0]), TO_CP(ov[1])))) return e;
                last = pos = ov[1];
                continue;
            }
            if (rc != PCRE2_ERROR_NOMATCH) return regex_error(rc);
            if (pos >= len) break;
            pos++;
            if (!st->collapsed)
                while (pos < len && ((unsigned char)subj[pos] & 0xC0) == 0x80) pos++;
        }
    }
    if ((e = spans_push(out, TO_CP(last), TO_CP(len)))) return e;
#undef TO_CP
    return AG_OK;
}

/* ---- driver ---- */

static ag_status prepare_texts(const tok_pretok *p, const uint32_t *cps, const uint16_t *fl, size_t n,
                               tok_split_scratch *s) {
    if (p->need_collapsed) {
        if (s->coll_cap < n + 1) {
            char *c = realloc(s->coll, n + 1);
            if (!c) return ag_errorf(AG_ERR_NOMEM, "out of memory");
            s->coll = c;
            s->coll_cap = n + 1;
        }
        for (size_t i = 0; i < n; i++) {
            uint32_t c = cps[i];
            char     x;
            if (c < 0x80) x = (char)c;
            else if (fl[i] & CPT_SPACE) x = 0x0B;
            else {
                switch (fl[i] & CPT_CATEGORY) {
                case CPT_NUMBER: x = (char)0xD1; break;
                case CPT_LETTER: x = (char)0xD2; break;
                case CPT_PUNCT: x = (char)0xD3; break;
                case CPT_MARK: x = (char)0xD4; break;
                case CPT_SYMBOL: x = (char)0xD5; break;
                default: x = (char)0xD0; break;
                }
            }
            s->coll[i] = x;
        }
    }
    if (p->need_u8) {
        if (s->u8_cap < n * 4 + 1) {
            char *u = realloc(s->u8, n * 4 + 1);
            if (!u) return ag_errorf(AG_ERR_NOMEM, "out of memory");
            s->u8 = u;
            s->u8_cap = n * 4 + 1;
        }
        if (s->u8_off_cap < n + 1) {
            uint32_t *o = realloc(s->u8_off, (n + 1) * sizeof *o);
            if (!o) return ag_errorf(AG_ERR_NOMEM, "out of memory");
            s->u8_off = o;
            s->u8_off_cap = n + 1;
        }
        size_t o = 0;
        for (size_t i = 0; i < n; i++) {
            uint32_t c = cps[i];
            if (c >= 0x80 && (fl[i] & CPT_SPACE)) c = 0x0B;
            if (c >= 0xD800 && c <= 0xDFFF) c = 0xFFFD; /* PCRE2 UTF mode rejects surrogates */
            s->u8_off[i] = (uint32_t)o;
            o += tok_utf8_encode(c, s->u8 + o);
        }
        s->u8_off[n] = (uint32_t)o;
    }
    if ((p->need_collapsed || p->need_u8) && !s->match_data) {
        s->match_data = pcre2_match_data_create(8, NULL);
        if (!s->match_data) return ag_errorf(AG_ERR_NOMEM, "out of memory");
    }
    return AG_OK;
}

ag_status tok_pretok_split(const tok_pretok *p, const uint32_t *cps, const uint16_t *fl, size_t n,
                           tok_split_scratch *s, const tok_spans **words) {
    if (n > UINT32_MAX / 4) return ag_errorf(AG_ERR_RANGE, "text too long to tokenize (%zu code points)", n);
    ag_status e = prepare_texts(p, cps, fl, n, s);
    if (e) return e;
    tok_spans *cur = &s->a, *nxt = &s->b;
    cur->n = 0;
    if ((e = spans_push(cur, 0, (uint32_t)n))) return e;
    for (int k = 0; k < p->n; k++) {
        const step *st = &p->steps[k];
        nxt->n = 0;
        for (size_t i = 0; i < cur->n; i++) {
            uint32_t a = cur->v[i].start, b = cur->v[i].end;
            if (st->kind == ST_REGEX) {
                if ((e = split_regex(st, s, a, b, nxt))) return e;
                continue;
            }
            scan sc = {cps, fl, a, b, a, nxt, AG_OK};
            switch (st->kind) {
            case ST_GPT2: scan_gpt2(&sc); break;
            case ST_LLAMA3: scan_llama3(&sc, 3, false); break;
            case ST_QWEN2: scan_llama3(&sc, 1, false); break;
            case ST_QWEN35: scan_llama3(&sc, 1, true); break;
            case ST_NUMBER: scan_number(&sc); break;
            case ST_NEWLINES: scan_newlines(&sc); break;
            case ST_DIGIT_GROUPS: scan_digit_groups(&sc); break;
            default: break;
            }
            if (sc.st) return sc.st;
        }
        tok_spans *t = cur;
        cur = nxt;
        nxt = t;
    }
    *words = cur;
    return AG_OK;
}
