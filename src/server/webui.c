/* The chat page: the files of webui/ (HTML, CSS, JS, an icon), embedded in
 * the binary at build time and served at / and /webui/.
 *
 * Embedding: the assembler's .incbin copies each file into .rodata between
 * two symbols, so the files stay plain files in the repository (no
 * generated C arrays) and the binary needs nothing beside it at run time.
 * The paths are relative to the directory the compiler runs in (the
 * repository root, as the Makefile does); the Makefile also makes this
 * object depend on the files of webui/, which the compiler's own dependency list cannot
 * see. ETags are the XXH3 of the bytes, computed once. */
#include <microhttpd.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <xxhash.h>

#include "server/webui.h"
#include "server/reply.h"
#include "server/server_impl.h"

/* Defines webui_<sym>_start/_end around the bytes of webui/<file>; hidden,
 * so that they resolve inside this program or library alone. */
#define WEBUI_EMBED(sym, file)                                                                                  \
    __asm__(".pushsection .rodata\n"                                                                            \
            ".balign 16\n"                                                                                      \
            ".globl webui_" #sym "_start\n"                                                                     \
            ".hidden webui_" #sym "_start\n"                                                                    \
            "webui_" #sym "_start:\n"                                                                           \
            ".incbin \"webui/" file "\"\n"                                                                      \
            ".globl webui_" #sym "_end\n"                                                                       \
            ".hidden webui_" #sym "_end\n"                                                                      \
            "webui_" #sym "_end:\n"                                                                             \
            ".popsection\n");                                                                                   \
    extern const unsigned char webui_##sym##_start[] __attribute__((visibility("hidden")));                   \
    extern const unsigned char webui_##sym##_end[] __attribute__((visibility("hidden")))

WEBUI_EMBED(index_html, "index.html");
WEBUI_EMBED(style_css, "style.css");
WEBUI_EMBED(markdown_js, "markdown.js");
WEBUI_EMBED(app_js, "app.js");
WEBUI_EMBED(favicon_svg, "favicon.svg");

struct srv_asset {
    const char          *url;
    const char          *content_type;
    const unsigned char *start, *end;
    bool                 is_page; /* the HTML page gets the security policy headers */
    char                 etag[24]; /* "\"<16 hex>\"", filled once */
};

#define ASSET(u, type, sym, page) {u, type, webui_##sym##_start, webui_##sym##_end, page, ""}
static srv_asset assets[] = {
    ASSET("/", "text/html; charset=utf-8", index_html, true),
    ASSET("/webui/style.css", "text/css; charset=utf-8", style_css, false),
    /* text/javascript: the one JavaScript type of RFC 9239 and the HTML standard */
    ASSET("/webui/markdown.js", "text/javascript; charset=utf-8", markdown_js, false),
    ASSET("/webui/app.js", "text/javascript; charset=utf-8", app_js, false),
    ASSET("/webui/favicon.svg", "image/svg+xml", favicon_svg, false),
};
#define N_ASSETS (sizeof assets / sizeof assets[0])

static pthread_once_t etags_once = PTHREAD_ONCE_INIT;

static void compute_etags(void) {
    for (size_t i = 0; i < N_ASSETS; i++) {
        XXH64_hash_t h = XXH3_64bits(assets[i].start, (size_t)(assets[i].end - assets[i].start));
        snprintf(assets[i].etag, sizeof assets[i].etag, "\"%016llx\"", (unsigned long long)h);
    }
}

const srv_asset *srv_webui_find(const char *url) {
    for (size_t i = 0; i < N_ASSETS; i++)
        if (!strcmp(url, assets[i].url)) {
            pthread_once(&etags_once, compute_etags);
            return &assets[i];
        }
    return NULL;
}

/* If-None-Match is "*" or a comma-separated list of entity tags, each
 * possibly weak (W/"..."); weak comparison applies to GET (RFC 9110 13.1.2). */
static bool etag_listed(const char *header, const char *etag) {
    size_t elen = strlen(etag);
    const char *p = header;
    while (*p) {
        while (*p == ' ' || *p == '\t' || *p == ',') p++;
        if (!*p) break;
        const char *tok = p;
        while (*p && *p != ',') p++;
        const char *end = p;
        while (end > tok && (end[-1] == ' ' || end[-1] == '\t')) end--;
        if (end - tok == 1 && *tok == '*') return true;
        if (end - tok > 2 && tok[0] == 'W' && tok[1] == '/') tok += 2;
        if ((size_t)(end - tok) == elen && !memcmp(tok, etag, elen)) return true;
    }
    return false;
}

/* Revalidated on every load: the files change with the binary, not their URL. */
static const char *const asset_headers[] = {"Cache-Control", "no-cache", "X-Content-Type-Options", "nosniff", NULL};

/* The page runs only its own scripts and styles and talks only to this
 * server: markup that slips into a reply can neither run nor load anything. */
static const char *const page_headers[] = {
    "Cache-Control", "no-cache",
    "X-Content-Type-Options", "nosniff",
    "Content-Security-Policy",
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
    "base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
    "Referrer-Policy", "no-referrer",
    NULL};

void srv_route_webui(srv_req *rq, srv_resp *out, const srv_asset *a) {
    const char *inm = MHD_lookup_connection_value(rq->conn, MHD_HEADER_KIND, "If-None-Match");
    out->headers = a->is_page ? page_headers : asset_headers;
    out->etag = a->etag;
    out->content_type = a->content_type;
    if (inm && etag_listed(inm, a->etag)) {
        out->status = 304;
        return;
    }
    out->status = 200;
    out->static_body = a->start;
    out->static_len = (size_t)(a->end - a->start);
}
