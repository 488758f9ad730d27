/* The small routes (routes.c): models, health, metrics, tokenize. */
#ifndef AG_SERVER_ROUTES_H
#define AG_SERVER_ROUTES_H

#include "server/reply.h"

void srv_route_models(srv_req *rq, srv_resp *out, const char *id);
void srv_route_health(srv_req *rq, srv_resp *out);
void srv_route_metrics(srv_req *rq, srv_resp *out);
void srv_route_tokenize(srv_req *rq, srv_resp *out);
void srv_route_detokenize(srv_req *rq, srv_resp *out);

#endif
