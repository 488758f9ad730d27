/* augur.h: the embeddable C API of augur (an LLM inference engine).
 *
 * Link with build/libaugur.so (-Lbuild -laugur) or build/libaugur.a (plus
 * -lpcre2-8 -lutf8proc -lxxhash -ljansson -lmicrohttpd -lm -lpthread). This
 * header is the whole interface: it needs only the C standard headers, and
 * every name it defines starts with augur_ / AUGUR_.
 *
 *   augur_model *m;
 *   if (augur_model_load("model.gguf", NULL, &m)) { puts(augur_last_error()); ... }
 *   augur_message msg[] = {{"user", "Hello!"}};
 *   char *prompt;
 *   augur_chat_render(m, msg, 1, true, &prompt, NULL);
 *   augur_gen_params gp = augur_gen_default_params();
 *   gp.prompt_kind = AUGUR_PROMPT_CHAT;
 *   augur_generate(m, prompt, strlen(prompt), &gp, on_piece, NULL, NULL);
 *   augur_free(prompt);
 *   augur_model_free(m);
 *
 * ERRORS. Every fallible function returns an augur_status; AUGUR_OK is 0.
 * On failure augur_last_error() says what went wrong and where (e.g. the
 * file and the problem). Nothing aborts the process on bad input.
 *
 * TEXT. Every text argument must be valid UTF-8 (AUGUR_ERR_INVALID
 * otherwise, naming the byte offset); every text result is valid UTF-8.
 * Pointer + length pairs may contain NUL bytes; results are also
 * NUL-terminated for convenience.
 *
 * MEMORY. Results the library allocates (token arrays, strings) belong to
 * the caller and are released with augur_free.
 *
 * THREADS. One model may be used from several threads at once. Tokenizing,
 * detokenizing and chat rendering only read it. Generations on one model
 * run one at a time, in the order they were asked for (later callers wait
 * inside augur_generate); the streaming callback runs on the thread that
 * called augur_generate. augur_model_free must not race with any other call
 * on the same model. */
#ifndef AUGUR_H
#define AUGUR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define AUGUR_VERSION_MAJOR 0
#define AUGUR_VERSION_MINOR 1
#define AUGUR_VERSION_PATCH 0
#define AUGUR_VERSION "0.1.0"
/* MAJOR * 10000 + MINOR * 100 + PATCH, for #if comparisons. */
#define AUGUR_VERSION_NUMBER (AUGUR_VERSION_MAJOR * 10000 + AUGUR_VERSION_MINOR * 100 + AUGUR_VERSION_PATCH)

/* The version of the library actually linked (a program built against one
 * header may run with another libaugur.so of the same soname). Static. */
const char *augur_version(void);

/* ---- errors --------------------------------------------------------------- */

typedef enum {
    AUGUR_OK = 0,
    AUGUR_ERR_IO = 1,          /* a file could not be opened, read or mapped */
    AUGUR_ERR_FORMAT = 2,      /* a malformed model file */
    AUGUR_ERR_UNSUPPORTED = 3, /* well-formed, but not something augur runs */
    AUGUR_ERR_NOMEM = 4,       /* out of memory, or the request cannot fit the context's KV */
    AUGUR_ERR_INVALID = 5,     /* a bad argument: NULL, invalid UTF-8, unknown role, ... */
    AUGUR_ERR_RANGE = 6,       /* a value out of range, e.g. a prompt longer than the context */
    AUGUR_ERR_NOT_FOUND = 7,   /* a file or item that does not exist */
    AUGUR_ERR_TEMPLATE = 8,    /* the model's chat template failed */
    AUGUR_ERR_INTERNAL = 9,    /* a bug or a failure inside generation */
} augur_status;

/* The message of the last failing augur_ call on the calling thread ("" if
 * none). Borrowed: valid until the next failing call on this thread. */
const char *augur_last_error(void);

/* A short name for a status, e.g. "format error". Static. */
const char *augur_status_name(augur_status status);

/* Frees memory the library returned (token arrays, strings). NULL-safe. */
void augur_free(void *p);

/* ---- models --------------------------------------------------------------- */

typedef struct augur_model augur_model;

typedef struct {
    int n_threads; /* CPU threads; 0 = all cores (default) */
    int n_ctx;     /* tokens per generation, prompt and output together;
                      0 = the model's training context, at most 4096 (default) */
    /* Speculative decoding (the output is the same, only faster when drafts
     * are accepted): NULL = off (default); "ngram" = prompt lookup; or the
     * path of a smaller GGUF model with the same vocabulary. */
    const char *draft;
    int         draft_max; /* most tokens drafted per step, 1..32; 0 = the source's
                              own (default): 16 for "ngram" and for a draft model with
                              its prompt lookup, 8 without (AUGUR_DRAFT_LOOKUP=0) */
    int         draft_min; /* drafts shorter than this are not verified; default 0 */
} augur_model_params;

/* The defaults named above. */
augur_model_params augur_model_default_params(void);

/* Loads a GGUF model (weights are memory-mapped), its tokenizer and chat
 * template, and starts its generation thread. params NULL = defaults. On
 * success *out owns everything (free with augur_model_free); on failure
 * *out is NULL and the message names the file and the problem: a missing
 * file (AUGUR_ERR_IO), a corrupt or truncated one (AUGUR_ERR_FORMAT), an
 * architecture augur does not run (AUGUR_ERR_UNSUPPORTED), a draft model
 * that cannot be used. A chat template that does not compile is not a load
 * error: augur_chat_render reports it. The device is the environment's
 * AUGUR_DEVICE (cpu, cuda or auto; unset: auto, a GPU when the library was
 * built with CUDA and one is visible); another value is AUGUR_ERR_INVALID. */
augur_status augur_model_load(const char *path, const augur_model_params *params, augur_model **out);

/* Stops the model's thread and frees everything. NULL-safe. No other call on
 * the model may be running or follow. */
void augur_model_free(augur_model *model);

typedef struct {
    const char *architecture;  /* "llama", "qwen2", "gemma3" */
    const char *name;          /* the file's general.name, or "" */
    int         n_vocab;       /* tokenizer vocabulary size */
    int         n_ctx_train;   /* context the model was trained with */
    int         n_ctx;         /* context of a generation (augur_model_params.n_ctx, resolved) */
    int         n_embd, n_layer, n_head, n_head_kv;
    uint64_t    file_bytes;    /* size of the GGUF file */
    int32_t     bos, eos;      /* special token ids, -1 when the model has none */
    bool        chat_template; /* the model has its own template (false: ChatML is used) */
    const char *draft;         /* the draft source in use ("ngram", "draft-model"), or NULL */
    int         draft_max;     /* its most tokens per step (the default resolved), 0 without one */
} augur_model_info;

/* Describes a loaded model. The strings are borrowed from the model and live
 * as long as it does. */
augur_status augur_model_get_info(const augur_model *model, augur_model_info *out);

/* ---- tokens --------------------------------------------------------------- */

enum {
    /* Add BOS/EOS as the model's metadata asks (what a prompt needs). */
    AUGUR_TOKENIZE_ADD_SPECIAL = 1u << 0,
    /* Text of control tokens (e.g. "<|im_start|>") becomes that token;
     * without it such text is tokenized as plain characters. */
    AUGUR_TOKENIZE_PARSE_SPECIAL = 1u << 1,
};

/* Tokenizes text[0..len) with the model's tokenizer. *tokens receives a new
 * array of *n_tokens ids (free with augur_free; NULL when *n_tokens is 0). */
augur_status augur_tokenize(const augur_model *model, const char *text, size_t len, unsigned flags,
                            int32_t **tokens, size_t *n_tokens);

enum {
    /* Render control tokens (BOS, <|im_end|>, ...) as their text; without it
     * they produce nothing. */
    AUGUR_DETOKENIZE_SPECIAL = 1u << 0,
};

/* The text of tokens[0..n): a new NUL-terminated string in *text, its
 * length (without the NUL) in *len (may be NULL). Bytes of a character cut
 * at the end of the array (a token sequence that ends inside a multi-byte
 * character) come out as U+FFFD. AUGUR_ERR_RANGE for an id outside the
 * vocabulary. */
augur_status augur_detokenize(const augur_model *model, const int32_t *tokens, size_t n, unsigned flags,
                              char **text, size_t *len);

/* ---- chat ----------------------------------------------------------------- */

typedef struct {
    const char *role;    /* "system", "user", "assistant", ... as the template knows them */
    const char *content; /* NUL-terminated UTF-8 */
} augur_message;

/* Renders a conversation with the model's own chat template (ChatML when
 * the model has none) into a new NUL-terminated prompt string (*text, free
 * with augur_free; its length in *len, which may be NULL). With
 * add_generation_prompt the text ends where the assistant's reply starts.
 * Generate from it with prompt_kind = AUGUR_PROMPT_CHAT. Errors: NULL
 * role/content or invalid UTF-8 (AUGUR_ERR_INVALID), the template's own
 * failures, e.g. an unsupported role order (AUGUR_ERR_TEMPLATE, with the
 * template's message). */
augur_status augur_chat_render(const augur_model *model, const augur_message *messages, size_t n_messages,
                               bool add_generation_prompt, char **text, size_t *len);

/* ---- generation ----------------------------------------------------------- */

typedef enum {
    /* Plain text: BOS is added as the model's metadata asks, and text that
     * looks like a control token is just text. */
    AUGUR_PROMPT_TEXT = 0,
    /* The output of augur_chat_render: the template's control tokens are
     * parsed as tokens, and no second BOS is added when the template wrote
     * one. */
    AUGUR_PROMPT_CHAT = 1,
} augur_prompt_kind;

#define AUGUR_SEED_RANDOM UINT64_MAX

typedef struct {
    float    temperature;    /* >= 0; 0 = greedy (always the most likely token); default 0.8 */
    float    top_p;          /* (0, 1]; 1 = off; default 0.95 */
    int      top_k;          /* >= 0; 0 = off; default 40 */
    float    min_p;          /* [0, 1]; 0 = off; default 0.05 */
    float    repeat_penalty; /* > 0, over the last 64 tokens; 1 = off (default) */
    uint64_t seed;           /* the same seed, params and prompt give the same text;
                                default AUGUR_SEED_RANDOM: a fresh seed per call */
    int      max_tokens;     /* tokens to generate; 0 = until the end of text or the
                                context is full; default 256 */
    /* Strings that end the generation (not included in the output); at most
     * 16. Borrowed for the call. */
    const char *const *stop;
    size_t             n_stop;
    bool               ignore_eos;  /* keep going past end-of-text tokens; default false */
    augur_prompt_kind  prompt_kind; /* default AUGUR_PROMPT_TEXT */
} augur_gen_params;

/* The defaults named above (those of `augur run`). */
augur_gen_params augur_gen_default_params(void);

typedef enum {
    AUGUR_FINISH_STOP = 1,     /* an end-of-text token or a stop string */
    AUGUR_FINISH_LENGTH = 2,   /* max_tokens, or the context is full */
    AUGUR_FINISH_CALLBACK = 3, /* the callback asked to stop */
} augur_finish;

typedef struct {
    augur_finish finish;
    int          prompt_tokens;    /* tokens of the prompt */
    int          cached_tokens;    /* of those, reused from an earlier generation's KV */
    int          generated_tokens; /* tokens generated (may exceed what the callback saw after it stopped) */
    double       prefill_ms;       /* from the start to the first generated token */
    double       decode_ms;        /* from the first to the last generated token */
    /* Speculative decoding: tokens drafted and verified, of those accepted;
     * steps that verified drafts and the tokens those steps produced
     * (verify_tokens / verify_steps = tokens per verify step). */
    int          drafted_tokens, accepted_tokens, verify_steps, verify_tokens;
} augur_usage;

/* Receives the generated text piece by piece, in order (each piece is
 * complete UTF-8, not NUL-terminated; stop strings are never shown). Return
 * 0 to go on, anything else to stop the generation. Runs on the thread that
 * called augur_generate. */
typedef int (*augur_piece_fn)(const char *piece, size_t len, void *user);

/* Generates a continuation of prompt[0..len) (see augur_prompt_kind),
 * calling on_piece (may be NULL) with each new piece of text, and returns
 * when it ends. params NULL = defaults; usage (may be NULL) receives the
 * figures, also when the callback stopped it (finish =
 * AUGUR_FINISH_CALLBACK; that is AUGUR_OK). Errors: invalid UTF-8 or an
 * empty prompt (AUGUR_ERR_INVALID), a prompt that leaves no room in the
 * context (AUGUR_ERR_RANGE, "context_length_exceeded"), bad sampling
 * values (AUGUR_ERR_RANGE / AUGUR_ERR_INVALID, naming the field), a failure
 * during generation (AUGUR_ERR_INTERNAL). */
augur_status augur_generate(augur_model *model, const char *prompt, size_t len, const augur_gen_params *params,
                            augur_piece_fn on_piece, void *user, augur_usage *usage);

/* The same from prompt token ids (params->prompt_kind is ignored). */
augur_status augur_generate_tokens(augur_model *model, const int32_t *tokens, size_t n_tokens,
                                   const augur_gen_params *params, augur_piece_fn on_piece, void *user,
                                   augur_usage *usage);

#ifdef __cplusplus
}
#endif

#endif
