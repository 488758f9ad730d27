/* The chat page (webui.c). */
#ifndef AG_SERVER_WEBUI_H
#define AG_SERVER_WEBUI_H

#include "server/reply.h"

/* An embedded file of webui/, served at `url`. */
typedef struct srv_asset srv_asset;

/* The file served at `url` ("/" is the page; its CSS, JS and icon live
 * under /webui/), or NULL when `url` is none of them. */
const srv_asset *srv_webui_find(const char *url);

/* Fills `out` with the file: 200 with the bytes (static, not copied), or
 * 304 without a body when the request's If-None-Match names its ETag.
 * Either way with Content-Type, ETag and Cache-Control (revalidate every
 * time: the binary, and so the files, may change under the same URL). */
void srv_route_webui(srv_req *rq, srv_resp *out, const srv_asset *a);

#endif
