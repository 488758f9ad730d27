"""augur serve's chat page (webui/, src/server/webui.c) over plain HTTP: the
page and every file it references are served byte-for-byte from webui/ with
the standard content types, revalidate through ETags, load without the API
key while the API stays protected, and are gone with --no-webui.
The page's behaviour in a real browser is tests/py/test_webui_browser.py."""
import http.client
import json
import os
import re
from html.parser import HTMLParser
from urllib.parse import urlsplit

from conftest import ROOT, TINY_GGUF

WEBUI = os.path.join(ROOT, "webui")

# The registered media types (IANA; text/javascript per RFC 9239, which
# obsoletes application/javascript). Text is UTF-8 (the files are).
MEDIA_TYPES = {".html": "text/html; charset=utf-8", ".css": "text/css; charset=utf-8",
               ".js": "text/javascript; charset=utf-8", ".svg": "image/svg+xml"}


def get(server, path, method="GET", headers=None, body=None):
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    conn.request(method, path, body=body, headers=headers or {})
    r = conn.getresponse()
    data = r.read()
    conn.close()
    return r.status, r.headers, data


class AssetRefs(HTMLParser):
    """The same-origin URLs a page loads: scripts, stylesheets, icons."""

    def __init__(self):
        super().__init__()
        self.urls = []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "script" and a.get("src"):
            self.urls.append(a["src"])
        elif tag == "link" and a.get("href") and set(a.get("rel", "").split()) & {"stylesheet", "icon"}:
            self.urls.append(a["href"])


def page_assets():
    refs = AssetRefs()
    with open(os.path.join(WEBUI, "index.html"), encoding="utf-8") as f:
        refs.feed(f.read())
    return refs.urls


def source(url):
    """The file of webui/ that `url` must serve."""
    name = "index.html" if url == "/" else url[len("/webui/"):]
    with open(os.path.join(WEBUI, name), "rb") as f:
        return name, f.read()


def test_page_and_assets_are_the_files_with_their_types(tiny_server):
    urls = ["/", *page_assets()]
    assert all(urlsplit(u).netloc == "" and u.startswith("/webui/") for u in urls[1:]), urls
    # everything in webui/ is used by the page, and so must be served
    assert sorted(source(u)[0] for u in urls) == sorted(os.listdir(WEBUI))
    etags = set()
    for url in urls:
        name, data = source(url)
        st, h, body = get(tiny_server, url)
        assert st == 200, (url, body[:200])
        assert body == data, url
        assert h["Content-Type"] == MEDIA_TYPES[os.path.splitext(name)[1]], url
        assert h["Cache-Control"] == "no-cache"
        assert h["X-Content-Type-Options"] == "nosniff"
        assert re.fullmatch(r'"[0-9a-f]{16}"', h["ETag"]), h["ETag"]
        etags.add(h["ETag"])
    assert len(etags) == len(urls)


def test_page_security_policy_allows_only_its_own_files(tiny_server):
    _, h, _ = get(tiny_server, "/")
    csp = {d.split()[0]: d.split()[1:] for d in h["Content-Security-Policy"].split(";") if d.strip()}
    assert csp["default-src"] == ["'none'"]
    for d in ("script-src", "style-src", "connect-src"):
        assert csp[d] == ["'self'"], d
    assert csp["frame-ancestors"] == ["'none'"]


def test_etag_revalidation(tiny_server):
    _, h, body = get(tiny_server, "/webui/app.js")
    tag = h["ETag"]
    for inm in (tag, "W/" + tag, '"0000000000000000", ' + tag, "*"):
        st, h2, b2 = get(tiny_server, "/webui/app.js", headers={"If-None-Match": inm})
        assert (st, b2) == (304, b""), inm
        assert h2["ETag"] == tag
    st, _, b3 = get(tiny_server, "/webui/app.js", headers={"If-None-Match": '"0000000000000000"'})
    assert (st, b3) == (200, body)
    # another file's tag does not match
    _, hs, _ = get(tiny_server, "/webui/style.css")
    assert get(tiny_server, "/webui/app.js", headers={"If-None-Match": hs["ETag"]})[0] == 200
    _, mh, metrics = get(tiny_server, "/metrics")
    assert re.search(rb'^augur_http_requests_total\{code="304"\} [1-9]', metrics, re.M), metrics[-600:]


def test_head_and_wrong_methods(tiny_server):
    st, h, body = get(tiny_server, "/", method="HEAD")
    assert st == 200 and body == b""
    assert int(h["Content-Length"]) == len(source("/")[1])
    for method in ("POST", "PUT", "DELETE"):
        st, h, body = get(tiny_server, "/", method=method, body=b"{}")
        assert st == 405, method
        assert h["Allow"] == "GET, HEAD"
        assert json.loads(body)["error"]["code"] == "method_not_allowed"


def test_unknown_files_are_404(tiny_server):
    for path in ("/webui/", "/webui/nope.js", "/index.html", "/webui/../webui/app.js", "/webui/app.js/",
                 "/webui//app.js", "/" + "a" * 3000):
        st, h, body = get(tiny_server, path)
        assert st == 404, path
        assert json.loads(body)["error"]["code"] == "not_found"


def test_api_key_leaves_the_page_open_and_the_api_closed(augur_server):
    s = augur_server(TINY_GGUF, "--api-key", "sekret")
    for url in ["/", *page_assets()]:
        assert get(s, url)[0] == 200, url
    assert get(s, "/v1/models")[0] == 401
    chat = json.dumps({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2})
    st, h, body = get(s, "/v1/chat/completions", "POST", {"Content-Type": "application/json"}, chat)
    assert st == 401 and json.loads(body)["error"]["code"] == "invalid_api_key"
    assert h["WWW-Authenticate"] == "Bearer"
    st, _, body = get(s, "/v1/chat/completions", "POST",
                      {"Content-Type": "application/json", "Authorization": "Bearer sekret"}, chat)
    assert st == 200, body


def test_no_webui(augur_server):
    s = augur_server(TINY_GGUF, "--no-webui")
    for url in ["/", *page_assets()]:
        st, _, body = get(s, url)
        assert st == 404, url
        assert json.loads(body)["error"]["code"] == "not_found"
    assert get(s, "/v1/models")[0] == 200
