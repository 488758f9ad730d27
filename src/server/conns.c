/* Connection bookkeeping: a deadline for each request's headers (and a
 * rate for its body), and a share of the connection slots that clients
 * still sending a request may hold. See server_impl.h (srv_conns_*).
 *
 * Why: libmicrohttpd's timeout is an idle timeout, which a client sending
 * one byte every half second resets for ever; 260 such clients held all
 * 256 connection slots and every other client got resets (issue 51).
 * Production servers bound the time a request may take to arrive (nginx's
 * client_header_timeout, Apache's mod_reqtimeout) and keep slots for
 * requests that did arrive.
 *
 * How, with one thread per connection: every connection is listed here
 * from MHD_CONNECTION_NOTIFY_STARTED to MHD_CONNECTION_NOTIFY_CLOSED (which
 * libmicrohttpd calls before it closes the socket, so a listed descriptor
 * is always this connection's). While a connection waits for a request
 * (from its start, or from the end of the previous response on a kept-alive
 * connection) it is READING, with a deadline: the headers must be in
 * within header_timeout_s, and then the body must keep coming at
 * SRV_BODY_MIN_RATE bytes a second on average (a deadline moved on by
 * every chunk), so that a large body on a slow link is fine and a trickle
 * is not. Once the request is in (the route runs: generation, a stream of
 * any length) there is no deadline. A watchdog thread closes READING
 * connections past their deadline: it writes a 408 response (the
 * connection's thread is only reading then, so nothing interleaves) and
 * shuts the socket down, which ends the connection's thread.
 * READING connections may hold at most max_connections minus a reserve
 * (an eighth) of the slots: a new connection beyond that closes the READING
 * connection that has waited longest, so slow clients cannot take the
 * slots of requests that arrive whole. */
#include <errno.h>
#include <microhttpd.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include "base/log.h"
#include "server/conns.h"
#include "server/server_impl.h"

/* One open connection (MHD's socket context). Fields under s->conns_mu. */
struct srv_conn {
    struct srv_conn *prev, *next;
    int              fd;
    bool             reading;  /* waiting for a request's headers or body */
    bool             killed;   /* closed by the watchdog or the reserve: already counted */
    bool             listed;   /* on s->conns (not when its descriptor could not be read) */
    bool             kept_alive; /* a response was sent on it: it waits for a next request */
    int64_t          since_ns; /* monotonic: when the current wait for a request began */
    int64_t          body_ns;  /* when the headers were in (0: not yet) */
    uint64_t         body_bytes;
    int64_t          deadline_ns; /* READING: the request must be in by then */
};

static int64_t mono_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static int64_t header_ns(const ag_server *s) { return (int64_t)s->p.header_timeout_s * 1000000000; }

/* Starts waiting for a request. Under conns_mu. */
static void start_reading(ag_server *s, struct srv_conn *sc) {
    if (!sc->reading) s->n_reading++;
    sc->reading = true;
    sc->since_ns = mono_ns();
    sc->body_ns = 0;
    sc->body_bytes = 0;
    sc->deadline_ns = sc->since_ns + header_ns(s);
}

static void stop_reading(ag_server *s, struct srv_conn *sc) {
    if (sc->reading) s->n_reading--;
    sc->reading = false;
}

/* Closes a READING connection: a 408 for the client, then the socket is
 * shut down, so that the connection's thread sees the end and cleans up.
 * A kept-alive connection idle since its last response is closed without
 * the 408, as nginx closes one past keepalive_timeout: a client that sends
 * its next request at that moment would take the 408 for its answer.
 * Under conns_mu (the descriptor is this connection's while it is listed). */
static void kill_conn(ag_server *s, struct srv_conn *sc, bool timeout) {
    static const char k_408[] = "HTTP/1.1 408 Request Timeout\r\nConnection: close\r\nContent-Length: 0\r\n\r\n";
    if (sc->killed) return;
    sc->killed = true;
    if (!sc->kept_alive && send(sc->fd, k_408, sizeof k_408 - 1, MSG_DONTWAIT | MSG_NOSIGNAL) < 0) {
        /* (best effort) */
    }
    shutdown(sc->fd, SHUT_RDWR);
    stop_reading(s, sc); /* (on its way out: it no longer takes a reader's slot) */
    atomic_fetch_add(timeout ? &s->conn_timeouts : &s->conn_evictions, 1);
}

void srv_conn_notify(void *cls, struct MHD_Connection *c, void **socket_context,
                     enum MHD_ConnectionNotificationCode code) {
    ag_server *s = cls;
    if (code == MHD_CONNECTION_NOTIFY_STARTED) {
        const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
        struct srv_conn *sc = calloc(1, sizeof *sc);
        *socket_context = sc;
        if (!sc || !ci) return; /* (not tracked: the idle timeout still applies) */
        sc->fd = ci->connect_fd;
        sc->listed = true;
        pthread_mutex_lock(&s->conns_mu);
        sc->next = s->conns;
        if (s->conns) s->conns->prev = sc;
        s->conns = sc;
        start_reading(s, sc);
        /* beyond the readers' share: the one that has waited longest goes */
        if (s->n_reading > s->max_reading) {
            struct srv_conn *old = NULL;
            for (struct srv_conn *x = s->conns; x; x = x->next)
                if (x != sc && x->reading && !x->killed && (!old || x->since_ns < old->since_ns)) old = x;
            if (old) kill_conn(s, old, false);
        }
        pthread_cond_signal(&s->conns_cv);
        pthread_mutex_unlock(&s->conns_mu);
        return;
    }
    struct srv_conn *sc = *socket_context;
    if (!sc) return;
    *socket_context = NULL;
    if (sc->listed) {
        pthread_mutex_lock(&s->conns_mu);
        stop_reading(s, sc);
        if (sc->prev) sc->prev->next = sc->next;
        else s->conns = sc->next;
        if (sc->next) sc->next->prev = sc->prev;
        pthread_mutex_unlock(&s->conns_mu);
    }
    free(sc);
}

/* The connection's entry, or NULL when it is not tracked. */
static struct srv_conn *conn_of(struct MHD_Connection *c) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    struct srv_conn                *sc = ci ? ci->socket_context : NULL;
    return sc && sc->listed ? sc : NULL;
}

void srv_conn_headers_in(ag_server *s, struct MHD_Connection *c) {
    struct srv_conn *sc = conn_of(c);
    if (!sc) return;
    pthread_mutex_lock(&s->conns_mu);
    if (sc->reading) {
        sc->body_ns = mono_ns();
        sc->deadline_ns = sc->body_ns + header_ns(s);
    }
    pthread_mutex_unlock(&s->conns_mu);
}

void srv_conn_body(ag_server *s, struct MHD_Connection *c, size_t bytes) {
    struct srv_conn *sc = conn_of(c);
    if (!sc) return;
    pthread_mutex_lock(&s->conns_mu);
    if (sc->reading && sc->body_ns) {
        sc->body_bytes += bytes;
        sc->deadline_ns = sc->body_ns + header_ns(s) + (int64_t)(sc->body_bytes * 1000000000 / SRV_BODY_MIN_RATE);
    }
    pthread_mutex_unlock(&s->conns_mu);
}

void srv_conn_answering(ag_server *s, struct MHD_Connection *c) {
    struct srv_conn *sc = conn_of(c);
    if (!sc) return;
    pthread_mutex_lock(&s->conns_mu);
    stop_reading(s, sc);
    pthread_mutex_unlock(&s->conns_mu);
}

void srv_conn_completed(ag_server *s, struct MHD_Connection *c) {
    struct srv_conn *sc = conn_of(c);
    if (!sc) return;
    pthread_mutex_lock(&s->conns_mu);
    sc->kept_alive = true;
    if (!sc->killed) start_reading(s, sc); /* kept alive: the next request's wait begins */
    pthread_mutex_unlock(&s->conns_mu);
}

/* Closes READING connections past their deadline; sleeps until the next
 * deadline (or a new connection, or a second at most). */
static void *watchdog_main(void *arg) {
    ag_server *s = arg;
    pthread_mutex_lock(&s->conns_mu);
    while (!s->conns_stop) {
        int64_t now = mono_ns(), next = now + 1000000000;
        for (struct srv_conn *x = s->conns; x; x = x->next) {
            if (!x->reading || x->killed) continue;
            if (x->deadline_ns <= now) kill_conn(s, x, true);
            else if (x->deadline_ns < next) next = x->deadline_ns;
        }
        struct timespec ts = {next / 1000000000, next % 1000000000};
        pthread_cond_timedwait(&s->conns_cv, &s->conns_mu, &ts);
    }
    pthread_mutex_unlock(&s->conns_mu);
    return NULL;
}

ag_status srv_conns_start(ag_server *s) {
    pthread_mutex_init(&s->conns_mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&s->conns_cv, &ca);
    pthread_condattr_destroy(&ca);
    s->conns_init = true;
    unsigned reserve = s->p.max_connections / 8;
    s->max_reading = (int)(s->p.max_connections - (reserve ? reserve : 1));
    if (s->max_reading < 1) s->max_reading = 1;
    if (pthread_create(&s->conns_watchdog, NULL, watchdog_main, s) != 0)
        return ag_errorf(AG_ERR_IO, "cannot start the HTTP server's watchdog thread");
    s->watchdog_started = true;
    return AG_OK;
}

void srv_conns_stop(ag_server *s) {
    if (!s->conns_init) return;
    if (s->watchdog_started) {
        pthread_mutex_lock(&s->conns_mu);
        s->conns_stop = true;
        pthread_cond_signal(&s->conns_cv);
        pthread_mutex_unlock(&s->conns_mu);
        pthread_join(s->conns_watchdog, NULL);
        s->watchdog_started = false;
    }
    pthread_cond_destroy(&s->conns_cv);
    pthread_mutex_destroy(&s->conns_mu);
    s->conns_init = false;
}
