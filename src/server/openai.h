/* OpenAI's routes (openai.c). */
#ifndef AG_SERVER_OPENAI_H
#define AG_SERVER_OPENAI_H

#include "server/reply.h"

void srv_route_chat(srv_req *rq, srv_resp *out);
void srv_route_completions(srv_req *rq, srv_resp *out);

#endif
