/* Generation jobs (job.c): one request's output, JSON or SSE, for any
 * protocol (srv_protocol). */
#ifndef AG_SERVER_JOB_H
#define AG_SERVER_JOB_H

#include <jansson.h>
#include <stdbool.h>
#include <sys/types.h>
#include <time.h>

#include "server/gen.h"
#include "server/reply.h"
#include "server/request.h"

typedef struct {
    ag_buf    text;   /* everything generated (stop strings removed) */
    size_t    sent;   /* bytes of text already streamed as content */
    ag_finish finish;
    int       stop_index; /* with AG_FINISH_STOP: the srv_job.stops entry that ended it, or -1 */
    bool      done;
    char     *error;
    json_t   *lp;     /* chat: content entries; completions: {tokens,...} (non-stream) */
    size_t    offset; /* completions text_offset of the next token */
    int       prompt; /* index of its prompt (completions) */
    int       lp_first; /* echo + logprobs: prompt position of lp's first entry (1 when BOS is not echoed) */
    /* Reasoning in <think> tags (srv_job_think): where it and the answer
     * lie in text; `sent` then counts bytes of the answer. */
    bool      think_on;
    ag_think  think;
    size_t    rsent;            /* bytes of the reasoning already streamed */
    int       reasoning_tokens; /* tokens generated before the answer began */
    /* gpt-oss's harmony format (srv_job_think): reasoning, answer and tool
     * calls are read from text into hm. */
    bool       harmony_on;
    ag_harmony hm;
} srv_choice;

/* What a harmony prompt ends with when a prefill continues the answer. */
#define SRV_HARMONY_PREFILL "<|start|>assistant<|channel|>final<|message|>"
/* The header of a harmony answer (after the prompt's "<|start|>assistant"). */
#define SRV_HARMONY_FINAL "<|channel|>final<|message|>"

typedef struct srv_job srv_job;

/* What differs between the protocols that share the job machinery. */
typedef struct {
    const char *id_prefix; /* of the response id: "chatcmpl-", "msg_" */
    /* Streaming: the first bytes once every prompt is submitted (may be
     * NULL), one engine event, and the end once every choice finished
     * (j->ended is set afterwards). They append SSE bytes to j->out; an
     * error that ends the stream sets j->ended. */
    void (*stream_start)(srv_job *j);
    void (*stream_event)(srv_job *j, srv_event *e);
    void (*stream_end)(srv_job *j);
    /* Not streaming, optional: sees each event of a choice not yet done
     * before it is added to the choice, and each prompt token's score
     * (e->prompt_pos > 0), e.g. to keep logprobs. */
    void (*collect)(srv_job *j, const srv_event *e);
    /* Not streaming: the whole response, every choice being done. */
    void (*respond)(srv_job *j, srv_resp *out);
    /* Frees j->proto_state (NULL: free()). */
    void (*state_free)(void *state);
} srv_protocol;

struct srv_job {
    ag_server             *s;
    struct MHD_Connection *conn;
    const srv_protocol    *proto;
    bool                   chat, stream, include_usage, logprobs, tools;
    bool                   one_call; /* keep the first tool call only (srv_opts.one_tool_call) */
    int                    top_logprobs;
    ag_tool_format         tf;
    json_t                *tool_list; /* the request's tools (owned), when tools are active */
    int                    n_choices;
    srv_choice            *ch;
    char                 **echo; /* per prompt (completions with echo) */
    size_t                *echo_len;
    int                    n_prompts;
    char                  *stops[SRV_MAX_STOPS]; /* the request's stop strings (owned) */
    int                    n_stops;
    char                   id[48];
    time_t                 created;
    srv_gen               *gen;
    ag_buf                 out; /* SSE bytes not yet handed to MHD */
    size_t                 out_off;
    bool                   ended;
    void                  *proto_state; /* the protocol's state (freed with the job by proto->state_free, else free()) */
};

/* A job for n_prompts prompts of o->n choices each (copies what it needs
 * of o); NULL when out of memory. */
srv_job *srv_job_new(srv_req *rq, const srv_protocol *proto, const srv_opts *o, int n_prompts);
/* The request's tools (borrowed; the job keeps a reference) are active:
 * output is parsed for calls in the template's format, and with `forced`
 * o is set up so that the output is one call whose arguments are a value of
 * the tool's parameters schema. False (with a 400 in `out`) when a
 * parameters schema does not compile; the caller frees j. */
bool srv_job_use_tools(srv_job *j, srv_opts *o, json_t *tools, bool forced, srv_resp *out);
/* Submits every prompt and produces the response, or hands the stream to
 * `out`. Takes ownership of j. Errors name `prompt_param`. */
void srv_job_run(srv_job *j, const srv_opts *o, int32_t **ids, const size_t *n_ids, const char *prompt_param,
                 srv_resp *out);
/* Not streaming: false (with a 500 or 503 in `out`) when a choice failed
 * or was cancelled. */
bool srv_job_choices_ok(srv_job *j, srv_resp *out);
/* The tool calls in `text` (ag_server_parse_tool_calls with the job's format
 * and tools), only the first when the request allows one call; false when
 * there are none. */
bool srv_job_tool_calls(srv_job *j, const char *text, size_t len, json_t **calls, ag_buf *content);
/* c's tool calls (only when the job's tools are active): for harmony the
 * call messages read from its output, else srv_job_tool_calls on its
 * answer; `content` receives the answer text outside the calls. */
bool srv_choice_tool_calls(srv_job *j, const srv_choice *c, json_t **calls, ag_buf *content);
/* Streaming: the bytes of c's answer that may go out now (*fresh, the
 * return value), marked as sent. With tools, text that may still become a
 * tool call is held back unless release_all; with reasoning, nothing goes
 * out before the answer begins. */
size_t srv_stream_fresh(srv_job *j, srv_choice *c, bool release_all, const char **fresh);
/* Streaming: the bytes of c's reasoning that may go out now (*fresh, the
 * return value), marked as sent. */
size_t srv_stream_reasoning(srv_choice *c, const char **fresh);

/* The job's model thinks in tags (the server's template does): each choice
 * splits its output into reasoning and answer; opened: the prompt ends
 * inside the think block. For a harmony template each choice reads its
 * output as harmony messages (opened: the prompt ends in a final body,
 * SRV_HARMONY_PREFILL). A no-op for other templates. */
void srv_job_think(srv_job *j, bool opened);
/* Appends an event's text to c (counting reasoning tokens) and advances
 * the split; final: the event ends the choice. */
void srv_choice_add(srv_job *j, srv_choice *c, const srv_event *e);
/* Advances c's split over its text (final: it is complete). */
void srv_choice_scan(srv_job *j, srv_choice *c, bool final);
/* c's answer and reasoning so far (after srv_choice_scan): without
 * reasoning, the answer is the whole text and the reasoning empty. */
size_t srv_choice_answer(const srv_choice *c, const char **text);
size_t srv_choice_reasoning(const srv_choice *c, const char **text);

/* Streaming: appends one SSE event to j->out: "event: <event>" (none when
 * event is NULL) and "data: <data as compact JSON>". Steals data. */
void srv_job_sse(srv_job *j, const char *event, json_t *data);

/* The MHD content-reader and its free callback for an SSE stream
 * (srv_job_free also frees a job that never ran). */
ssize_t srv_job_read(void *job, uint64_t pos, char *buf, size_t max);
void    srv_job_free(void *job);

#endif
