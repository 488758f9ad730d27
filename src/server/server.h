/* server/: the OpenAI-compatible HTTP server (libmicrohttpd).
 *
 * Routes: POST /v1/chat/completions, POST /v1/completions, GET /v1/models
 * (and /v1/models/{id}), GET /health, GET /metrics (Prometheus text),
 * POST /tokenize, POST /detokenize, Anthropic's POST /v1/messages and
 * POST /v1/messages/count_tokens (anthropic.c), and the chat page: GET / and
 * its files under /webui/ (webui.c; embedded in the binary, served without
 * the API key so that the page can load and ask for it). The API key is
 * accepted as "Authorization: Bearer" or "x-api-key". Errors use OpenAI's shape
 * {"error": {"message", "type", "param", "code"}} (Anthropic's routes:
 * {"type": "error", "error": {"type", "message"}}): 400 for malformed JSON
 * (with its position), wrong types, out-of-range values, fields the API does
 * not define or augur does not implement (naming them; params.lenient_fields
 * ignores them instead) and prompts over the context (code
 * "context_length_exceeded"), 401 without the API key,
 * 404 unknown route, 405 wrong method, 413 body too large, 429 when the
 * engine's queue is full, 503 while shutting down. A client fault never
 * gets a 5xx.
 *
 * Threading: one thread per connection (libmicrohttpd's
 * MHD_USE_THREAD_PER_CONNECTION). A generating connection submits to the
 * engine and then waits on its own event queue; the engine callback only
 * copies the event into that queue and signals, so it never blocks on a
 * client. A client that goes away (failed write, or a closed socket seen
 * while it waits) cancels its request.
 *
 * Lifetime: the server borrows the engine, model, tokenizer and chat format.
 * Shutdown order: ag_server_stop() (no new connections; in-flight requests
 * are cancelled; afterwards the server never touches the engine again), then
 * ag_engine_free() (it must come before ag_server_free: it delivers the
 * cancelled requests' final events, which the waiting connections need),
 * then ag_server_free() (closes connections and joins their threads), then
 * model/tokenizer/chat. */
#ifndef AG_SERVER_H
#define AG_SERVER_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

#include "base/buf.h"
#include "base/status.h"
#include "engine/engine.h"
#include "model/model.h"
#include "tmpl/chat.h"
#include "tok/tok.h"

typedef struct ag_server ag_server;

typedef struct {
    const char *host;            /* numeric address or name to bind; default "127.0.0.1" */
    int         port;            /* 0: any free port (see ag_server_port) */
    const char *api_key;         /* NULL/"": no authentication */
    const char *cors_origin;     /* NULL: no CORS headers; else Access-Control-Allow-Origin */
    const char *model_id;        /* the name /v1/models reports and responses echo */
    size_t      max_body;        /* request body limit in bytes (413 past it); default 8 MiB */
    unsigned    max_connections; /* concurrent connections; default 256 */
    unsigned    timeout_s;       /* idle connection timeout; default 60 */
    /* A request's headers must be in this many seconds after its connection
     * opened, or after the previous response on it ended (a kept-alive
     * connection waits that long for its next request); then its body must
     * keep coming at 1 KiB/s on average. Past that the connection gets a
     * 408 and is closed. Default 20. A response (a stream of any length) is
     * never cut by it. */
    unsigned    header_timeout_s;
    /* Connections one client address may hold at once; 0 (default): no
     * limit. Beyond it a connection is closed at once. */
    unsigned    max_connections_per_ip;
    bool        webui;           /* serve the chat page at / (default true) */
    /* Ignore request fields the API does not define, or that augur does not
     * implement, instead of answering 400 (default false; see fields.c). */
    bool        lenient_fields;
} ag_server_params;

ag_server_params ag_server_default_params(void);

/* Starts listening. Everything passed in is borrowed (strings in the params
 * too) and must outlive the server. chat may be NULL (chat completions then
 * answer 400). Errors: the address does not resolve or cannot be bound
 * (AG_ERR_IO, message names it). */
ag_status ag_server_new(const ag_server_params *p, ag_engine *eng, ag_model *model, const ag_tok *tok,
                        const ag_chat *chat, ag_server **out);

/* The port actually bound (useful with port 0). */
int ag_server_port(const ag_server *s);

/* Stops accepting connections, makes new requests on open connections
 * answer 503, cancels every in-flight generation and detaches the engine:
 * once this returns the server makes no further engine call (final events
 * of cancelled requests may still arrive through the callbacks, which stay
 * valid). Idempotent. */
void ag_server_stop(ag_server *s);

/* Stops (if not yet), closes every connection and joins their threads.
 * NULL-safe. */
void ag_server_free(ag_server *s);

/* ---- tool calls (exposed for tests) ---- */

/* How a model writes tool calls, decided from its chat template. */
typedef enum {
    AG_TOOLS_HERMES,  /* <tool_call>{"name": ..., "arguments": {...}}</tool_call> (Qwen, Hermes, default) */
    AG_TOOLS_LLAMA3,  /* [<|python_tag|>]{"name": ..., "parameters": {...}} (Llama 3.1+) */
    AG_TOOLS_GENERIC, /* either */
    AG_TOOLS_HARMONY, /* gpt-oss: messages to=functions.NAME (harmony.c reads them, not ag_server_parse_tool_calls) */
} ag_tool_format;

/* The format a template source implies (NULL source: the ChatML default,
 * which gets the Hermes convention). */
ag_tool_format ag_server_tool_format(const char *template_src, size_t len);

/* Parses tool calls out of a complete model output text[0..len).
 * Conventions: <tool_call>{json}</tool_call> blocks (not for LLAMA3; when a
 * tag is present, the tags decide), else the whole output as one or more
 * bare JSON objects {"name", "arguments"|"parameters"}, optionally after
 * <|python_tag|> and separated by ';' -- accepted only when every name is
 * one of `tools` (the request's OpenAI tools array), so that a plain JSON
 * answer stays content.
 * Returns true when the text holds at least one well-formed call: *calls
 * gets a new JSON array of OpenAI tool calls ({"id", "type": "function",
 * "function": {"name", "arguments": <JSON string>}}; the caller decrefs) and
 * `content` receives the text outside the calls, whitespace-trimmed
 * (possibly empty). Returns false (nothing allocated, content untouched)
 * when there is no call or any call is malformed: the caller then treats the
 * whole text as plain content. */
bool ag_server_parse_tool_calls(ag_tool_format f, const char *text, size_t len, const json_t *tools, json_t **calls,
                                ag_buf *content);

/* For streaming: how many bytes of the output so far, text[0..len), can be
 * sent as content because they cannot belong to a tool call (an output that
 * starts like a bare JSON call is held whole; otherwise the text before a
 * <tool_call> tag, or before a tail that could become one). */
size_t ag_server_tool_safe_prefix(ag_tool_format f, const char *text, size_t len);

/* ---- reasoning in <think> tags (reasoning.c; exposed for tests) ---- */

typedef enum {
    AG_THINK_LEAD,   /* nothing decided yet (whitespace, or the start of "<think>") */
    AG_THINK_IN,     /* inside the reasoning */
    AG_THINK_GAP,    /* after "</think>", in the whitespace before the answer */
    AG_THINK_ANSWER, /* the answer is text[answer_start..) */
    AG_THINK_NONE,   /* the output does not think: all of it is the answer */
} ag_think_phase;

/* Where the reasoning and the answer of one growing output lie. */
typedef struct {
    ag_think_phase phase;
    size_t reason_start, reason_end; /* the reasoning certain so far: text[reason_start..reason_end) */
    size_t answer_start;             /* with ANSWER or NONE: the answer is text[answer_start..len) */
    size_t scan;                     /* where the search for "</think>" resumes */
} ag_think;

/* opened: the prompt ended inside a think block (the template wrote
 * "<think>"), so the output starts with reasoning. */
void ag_think_init(ag_think *t, bool opened);
/* Advances over text[0..len), the whole output so far (it only grows
 * between calls); final: no more text will come. reason_end and the answer
 * only grow, so what was decided may be sent at once. */
void ag_think_scan(ag_think *t, const char *text, size_t len, bool final);
/* The answer's start is known (ANSWER or NONE). */
bool ag_think_answer_known(const ag_think *t);
/* Whether a chat template's model thinks in tags (its source names
 * "</think>"). */
bool ag_think_template_thinks(const char *src, size_t len);
/* Whether a rendered prompt ends inside an opened think block ("<think>"
 * and whitespace at its end). */
bool ag_think_prompt_opens(const char *prompt, size_t len);

/* ---- gpt-oss's harmony format (harmony.c; exposed for tests) ---- */

/* One growing output read as harmony messages: analysis bodies into
 * `reasoning`, final bodies (and commentary without a recipient) into
 * `content`, messages to a recipient into `calls`. Each buffer only grows,
 * and only by text that is certain (a tail that may become a marker is
 * held back), so what they hold may be sent at once. */
typedef struct {
    ag_buf  reasoning, content;
    json_t *calls;          /* OpenAI tool calls ({"id", "type", "function": {"name", "arguments"}}), complete ones */
    size_t  pos;            /* where reading resumes in the text */
    size_t  hscan;          /* how far the search for a header's end got */
    bool    in_body;        /* inside a message body (else before or in a header) */
    bool    fresh;          /* the body has not contributed yet */
    int     kind;           /* the body's destination (harmony.c) */
    char    recipient[128]; /* of a call's body: "functions.NAME" */
    ag_buf  args;           /* a call's body so far */
} ag_harmony;

void ag_harmony_init(ag_harmony *h);
/* The prompt ends inside a message body (a prefill after
 * "<|channel|>final<|message|>", say): the output continues that body. */
void ag_harmony_start_in(ag_harmony *h, const char *prompt, size_t len);
/* Advances over text[0..len), the whole output so far (it only grows
 * between calls); final: no more text will come (a body cut there ends;
 * a call whose arguments are not a complete JSON object is dropped). */
void ag_harmony_scan(ag_harmony *h, const char *text, size_t len, bool final);
/* Inside an analysis body (the last text was reasoning). */
bool ag_harmony_in_reasoning(const ag_harmony *h);
void ag_harmony_free(ag_harmony *h); /* NULL-safe; a freed state may be init'ed again */
/* Whether a chat template writes harmony (it names <|start|>, <|channel|>
 * and <|message|>). */
bool ag_harmony_template(const char *src, size_t len);

#endif
