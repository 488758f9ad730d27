/* A model's chat format: its chat template (GGUF tokenizer.chat_template)
 * with its special tokens' text, or a documented default when the model has
 * none.
 *
 * Default: ChatML ("<|im_start|>{role}\n{content}<|im_end|>\n" per message,
 * then "<|im_start|>assistant\n" when a generation prompt is asked for). It is
 * used, with a log line, for models whose GGUF carries no template. */
#ifndef AG_TMPL_CHAT_H
#define AG_TMPL_CHAT_H

#include <jansson.h>
#include <stdbool.h>

#include "base/buf.h"
#include "base/status.h"
#include "gguf/gguf.h"

typedef struct ag_chat ag_chat;

/* Reads and compiles the model's template (or the default). Borrows g only
 * during the call. Errors: the template does not compile (AG_ERR_TEMPLATE /
 * AG_ERR_UNSUPPORTED, message names the line). */
ag_status ag_chat_from_gguf(const ag_gguf *g, ag_chat **out);
/* From template source text; bos/eos may be NULL (left undefined). */
ag_status ag_chat_from_source(const char *src, size_t len, const char *bos, const char *eos, ag_chat **out);
void      ag_chat_free(ag_chat *c); /* NULL-safe */

/* True when the model had no template and ChatML is used. */
bool ag_chat_is_default(const ag_chat *c);
/* The BOS token's text ("" when none). */
const char *ag_chat_bos_text(const ag_chat *c);

/* Renders messages (a JSON array of {role, content, ...}) with optional tools
 * (JSON array or NULL) and extra template variables (object or NULL), and
 * appends the prompt text to out. Thread-safe (the template is read-only).
 * Errors are the template's own (raise_exception messages come through
 * unchanged). */
ag_status ag_chat_render(const ag_chat *c, const json_t *messages, const json_t *tools, bool add_generation_prompt,
                         const json_t *extra, ag_buf *out);

/* The text of the token whose id is the metadata value `id_key` (e.g.
 * "tokenizer.ggml.bos_token_id"), as a heap string the caller frees; NULL
 * when the key or the token is missing. */
char *ag_chat_token_text(const ag_gguf *g, const char *id_key);

/* Whether a rendered prompt already starts with the BOS text, in which case
 * the tokenizer must not add another BOS. */
bool ag_chat_has_bos(const ag_chat *c, const char *text, size_t len);

#endif
