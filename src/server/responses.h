/* OpenAI's Responses API (responses.c). */
#ifndef AG_SERVER_RESPONSES_H
#define AG_SERVER_RESPONSES_H

#include "server/reply.h"

/* /v1/responses (responses.c): create; GET or DELETE of a stored one. */
void srv_route_responses(srv_req *rq, srv_resp *out);
void srv_route_response_id(srv_req *rq, srv_resp *out, const char *id);
/* The store of responses: set up before the daemon starts, freed after it
 * stopped. */
void srv_responses_init(ag_server *s);
void srv_responses_free(ag_server *s);

#endif
