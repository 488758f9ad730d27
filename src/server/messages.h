/* Chat messages and tools in OpenAI's shape, into a prompt (messages.c). */
#ifndef AG_SERVER_MESSAGES_H
#define AG_SERVER_MESSAGES_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

#include "server/reply.h"

/* OpenAI tools + tool_choice of body b: the tools the prompt gets (a new
 * reference; NULL for none, or on error with *failed and `out` filled).
 * *forced: tool_choice "required" or a named function (then the result
 * holds just that one). */
json_t *srv_parse_tools(json_t *b, srv_resp *out, bool *failed, bool *forced);
/* Validates OpenAI chat messages and builds the list the template sees
 * (tool calls as objects; for a template that does not render tools, the
 * Hermes instructions in the system message and calls/results spelled out
 * as text). A new reference, or NULL with `out` filled. */
json_t *srv_build_messages(ag_server *s, json_t *msgs, json_t *tools, srv_resp *out);
/* Renders srv_build_messages' list with the chat template (tools when the
 * template renders them), appends `prefill` (prefill_len bytes: the start
 * of the assistant's reply, which the output continues; NULL for none) and
 * tokenizes it into *ids (the caller frees). `vars` (may be NULL): more
 * template variables (srv_reasoning_effort). *opened (may be NULL): the
 * prompt ends inside a <think> block the template opened, or (harmony) in
 * the final message's body that a prefill starts. False with a 400
 * in `out` (errors name `param`). */
bool srv_chat_prompt(ag_server *s, json_t *msgs, json_t *tools, const json_t *vars, const char *prefill,
                     size_t prefill_len, const char *param, int32_t **ids, size_t *n_ids, bool *opened,
                     srv_resp *out);
/* A request's reasoning effort (`param` names it in errors) as template
 * variables ({"reasoning_effort": ...}, a new reference) for a template
 * that takes it (gpt-oss's harmony: "low", "medium" or "high"); NULL when
 * none was asked for, or with *failed and a 400 in `out` (another value;
 * a model whose reasoning cannot be steered, unless --lenient-fields
 * ignores it). */
json_t *srv_reasoning_effort(ag_server *s, const json_t *effort, const char *param, bool *failed, srv_resp *out);

#endif
