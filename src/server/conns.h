/* Connections (conns.c): request deadlines and the readers' share of the
 * slots; http.c drives them. */
#ifndef AG_SERVER_CONNS_H
#define AG_SERVER_CONNS_H

#include "server/server_impl.h"

/* After the headers, a body must keep coming at this many bytes a second on
 * average (over header_timeout_s of grace). */
#define SRV_BODY_MIN_RATE 1024

/* Initializes the connection list and starts its watchdog thread (before
 * the daemon starts), and stops it (after the daemon stopped: no callback
 * runs any more). stop is safe after a failed or no start. */
ag_status srv_conns_start(ag_server *s);
void      srv_conns_stop(ag_server *s);
#ifdef MHD_VERSION
/* libmicrohttpd's MHD_OPTION_NOTIFY_CONNECTION callback (cls: the server):
 * lists a connection from its start to its close, and at its start closes
 * the READING connection that has waited longest when readers are over
 * their share. */
void srv_conn_notify(void *cls, struct MHD_Connection *c, void **socket_context,
                     enum MHD_ConnectionNotificationCode code);
#endif
/* A connection's request: its headers are in (the deadline becomes the
 * body's), body bytes arrived, a response is queued (no deadline while it
 * is answered, a stream included), the response is done (kept alive: the
 * wait for the next request begins). No-ops for untracked connections. */
void srv_conn_headers_in(ag_server *s, struct MHD_Connection *c);
void srv_conn_body(ag_server *s, struct MHD_Connection *c, size_t bytes);
void srv_conn_answering(ag_server *s, struct MHD_Connection *c);
void srv_conn_completed(ag_server *s, struct MHD_Connection *c);

#endif
