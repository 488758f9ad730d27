/* Anthropic's Messages API (anthropic.c). */
#ifndef AG_SERVER_ANTHROPIC_H
#define AG_SERVER_ANTHROPIC_H

#include "server/reply.h"

void srv_route_messages(srv_req *rq, srv_resp *out);
void srv_route_messages_count_tokens(srv_req *rq, srv_resp *out);

/* Rewrites an error response (OpenAI's shape, as srv_error makes it) into
 * Anthropic's {"type": "error", "error": {"type", "message"}}, with the
 * error type and, for a full queue, the status (529) Anthropic's clients
 * expect. Routes under /v1/messages answer through it. */
void srv_anthropic_error(srv_resp *r);

#endif
