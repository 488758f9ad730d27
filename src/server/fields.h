/* Request fields (fields.c): what each route's API defines, checked before
 * a body is parsed. */
#ifndef AG_SERVER_FIELDS_H
#define AG_SERVER_FIELDS_H

#include <jansson.h>
#include <stdbool.h>

#include "server/reply.h"

typedef enum { SRV_ROUTE_CHAT, SRV_ROUTE_COMPLETIONS, SRV_ROUTE_MESSAGES, SRV_ROUTE_RESPONSES } srv_route_kind;

/* Checks the top-level fields of body b for a route before it is parsed:
 * a field the route's API does not define is a 400 naming it (code
 * "unknown_parameter"), one it defines but augur does not implement a 400
 * (code "unsupported_parameter") unless its value asks for nothing augur
 * does not do (null, modalities ["text"], ...), and with --lenient-fields
 * (params.lenient_fields) both are ignored instead. A string holding NUL
 * (\u0000) outside the text the model reads (prompts, message content) is
 * a 400 naming where it is, lenient or not. True when the body may be
 * parsed; false with `out` filled. SRV_ROUTE_MESSAGES is also
 * count_tokens' (the same body). */
bool srv_check_fields(ag_server *s, json_t *b, srv_route_kind route, srv_resp *out);

#endif
