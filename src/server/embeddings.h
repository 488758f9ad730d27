/* OpenAI's embeddings endpoint (embeddings.c). */
#ifndef AG_SERVER_EMBEDDINGS_H
#define AG_SERVER_EMBEDDINGS_H

#include "server/reply.h"

/* /v1/embeddings: an encoder model's pooled, normalized vectors of the
 * request's inputs (a 400 on a generative model). */
void srv_route_embeddings(srv_req *rq, srv_resp *out);

#endif
