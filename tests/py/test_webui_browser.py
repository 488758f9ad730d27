"""The chat page in a real browser: Debian's headless Chromium driven by
Playwright (`make test-webui` installs both and runs this file).

Slow suite: the page against SmolLM2 (streamed replies checked against the
raw SSE the browser received, the token figures against the usage event,
stop mid-reply with the server cancelling the generation, reload, rename,
delete), the API-key dialog, and the Markdown renderer against markdown-it-py
(the CommonMark reference's Python port) plus hostile input. A screenshot
goes to build/test-artifacts/webui.png."""
import json
import os
import re
import shutil
import time
from html.parser import HTMLParser

import pytest

from conftest import ROOT, SMOLLM2, TINY_GGUF, require_model

pytestmark = pytest.mark.slow

ARTIFACTS = os.path.join(ROOT, "build", "test-artifacts")
CHROMIUM = os.environ.get("AUGUR_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"


def _missing(why):
    # `make test-webui` installs the browser first: there, missing is a failure
    if os.environ.get("AUGUR_WEBUI_REQUIRED"):
        pytest.fail(why)
    pytest.skip(why + " (make test-webui installs it)")


@pytest.fixture(scope="module")
def browser():
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _missing("Python Playwright is not installed")
    if not os.access(CHROMIUM, os.X_OK):
        _missing(f"no Chromium at {CHROMIUM}")
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield b
        b.close()


class Page:
    """A fresh browser context on the server's page; collects script errors."""

    def __init__(self, browser, server, **ctx):
        self.server = server
        self.ctx = browser.new_context(viewport={"width": 1200, "height": 800}, **ctx)
        self.page = self.ctx.new_page()
        self.page.set_default_timeout(60_000)
        self.errors = []
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))
        self.page.on("dialog", lambda d: d.accept())  # the delete confirmation

    def open(self):
        self.page.goto(self.server.base + "/")
        self.page.wait_for_function("() => window.AugurMarkdown !== undefined")
        return self.page

    def storage(self, key):
        v = self.page.evaluate("k => localStorage.getItem(k)", key)
        return None if v is None else json.loads(v)

    def close(self):
        self.ctx.close()
        assert self.errors == [], self.errors


def sse_reply(body):
    """Content, finish reason and usage from a raw SSE body, parsed here
    independently of the page's own parser."""
    content, finish, usage, done = "", None, None, False
    for block in body.split("\n\n"):
        data = "\n".join(l[5:].lstrip(" ") for l in block.split("\n") if l.startswith("data:"))
        if not data:
            continue
        if data == "[DONE]":
            done = True
            continue
        ev = json.loads(data)
        for ch in ev.get("choices", []):
            content += ch.get("delta", {}).get("content") or ""
            finish = ch.get("finish_reason") or finish
        if ev.get("usage"):
            usage = ev["usage"]
    assert done, body[-300:]
    return content, finish, usage


def send_and_capture(pg, text):
    """Types `text`, sends it with Enter, waits for the reply to finish;
    returns the SSE body the browser received and the request it sent."""
    with pg.expect_response(lambda r: r.url.endswith("/v1/chat/completions")) as resp:
        pg.fill("#prompt", text)
        pg.press("#prompt", "Enter")
    n = pg.locator(".msg.assistant").count()
    pg.wait_for_function(f"() => document.querySelectorAll('.msg.assistant .msg-stats').length >= {n}")
    return resp.value.body().decode("utf-8"), resp.value.request.post_data_json


STATS = re.compile(r"(\d+) tokens · ([\d.]+) tok/s · (\d+)/(\d+) prompt tokens cached · ([\d.]+) s to first token")


def last_stats(pg):
    text = pg.locator(".msg.assistant .msg-stats").last.inner_text()
    m = STATS.search(text)
    assert m, text
    return {"completion": int(m[1]), "tps": float(m[2]), "cached": int(m[3]), "prompt": int(m[4])}


def metric(server, name):
    import urllib.request
    with urllib.request.urlopen(server.base + "/metrics", timeout=30) as r:
        text = r.read().decode()
    m = re.search(rf"^augur_{name} (\S+)$", text, re.M)
    return float(m[1])


def test_chat_stream_stop_reload(browser, augur_server):
    require_model(SMOLLM2)
    s = augur_server(SMOLLM2, "--parallel", "2")
    p = Page(browser, s)
    pg = p.open()
    assert pg.locator("#key-dialog[open]").count() == 0
    pg.wait_for_function("() => document.getElementById('model-name').textContent === 'SmolLM2-135M-Instruct.Q4_1'")

    # settings persist in localStorage
    pg.click("#settings-button")
    pg.fill("#system-prompt", "You are a helpful assistant.")
    pg.fill("#temperature", "0")
    pg.fill("#max-tokens", "40")
    pg.press("#max-tokens", "Tab")
    assert p.storage("augur.settings") == {"system": "You are a helpful assistant.", "temperature": 0,
                                           "max_tokens": 40}

    # a streamed reply: the request carries the settings; the stored text is
    # exactly what the SSE carried, the figures under it are the usage event's
    first = "What is the capital of France?"
    body, sent = send_and_capture(pg, first)
    assert sent["messages"] == [{"role": "system", "content": "You are a helpful assistant."},
                                {"role": "user", "content": first}]
    assert (sent["temperature"], sent["max_tokens"], sent["stream"]) == (0, 40, True)
    assert sent["stream_options"] == {"include_usage": True}
    content, finish, usage = sse_reply(body)
    assert content.strip()
    conv = p.storage("augur.conversations")[0]
    assert conv["title"] == first
    assert [m["role"] for m in conv["messages"]] == ["user", "assistant"]
    assert conv["messages"][1]["content"] == content
    st = last_stats(pg)
    assert (st["completion"], st["prompt"], st["cached"]) == (
        usage["completion_tokens"], usage["prompt_tokens"], usage["prompt_tokens_details"]["cached_tokens"])
    assert st["tps"] > 0
    # the rendered reply shows the text (Markdown aside, the words are there)
    words = re.findall(r"\w+", content)
    shown = pg.locator(".msg.assistant .msg-body").last.inner_text()
    assert all(w in shown for w in words), (content, shown)

    # the second turn reuses the first one's KV blocks
    body, _ = send_and_capture(pg, "And of Germany?")
    _, _, usage2 = sse_reply(body)
    st2 = last_stats(pg)
    assert st2["cached"] == usage2["prompt_tokens_details"]["cached_tokens"] > 0
    assert st2["prompt"] == usage2["prompt_tokens"] > usage["prompt_tokens"]

    # stop a long reply mid-stream: the server sees the hang-up and cancels
    pg.fill("#max-tokens", "2000")
    pg.press("#max-tokens", "Tab")
    pg.fill("#prompt", "Write a very long story about a dragon who learns to paint, with ten chapters.")
    pg.press("#prompt", "Enter")
    pg.wait_for_function("() => (document.querySelector('.msg.assistant.streaming .msg-body') || {}).textContent"
                         "?.length > 30")
    assert pg.locator("#stop").is_visible() and not pg.locator("#send").is_visible()
    pg.click("#stop")
    pg.wait_for_selector("#send", state="visible")
    assert "stopped" in pg.locator(".msg.assistant .msg-stats").last.inner_text()
    stopped_text = p.storage("augur.conversations")[0]["messages"][-1]["content"]
    assert len(stopped_text) > 30
    deadline = time.time() + 20
    while time.time() < deadline and (metric(s, "client_cancels_total") < 1 or metric(s, "running_sequences")):
        time.sleep(0.2)
    assert metric(s, "client_cancels_total") == 1
    assert metric(s, "running_sequences") == 0
    generated = metric(s, "generation_tokens_total")
    assert generated < 40 + 40 + 2000  # the long reply did not run on to its max_tokens

    # the server goes on serving: another message gets a whole reply
    pg.fill("#max-tokens", "100")
    pg.press("#max-tokens", "Tab")
    pg.click("#settings-button")
    assert not pg.locator("#settings").is_visible()
    body, _ = send_and_capture(pg, "Write a Python function that adds two numbers. Put it in a code block.")
    content4, _, _ = sse_reply(body)
    assert p.storage("augur.conversations")[0]["messages"][-1]["content"] == content4
    os.makedirs(ARTIFACTS, exist_ok=True)
    pg.screenshot(path=os.path.join(ARTIFACTS, "webui.png"))

    # reload: the conversation, its figures and the settings are all back
    pg.reload()
    pg.wait_for_selector(".conv")
    assert pg.locator(".conv-title").all_inner_texts() == [first]
    assert pg.locator(".msg").count() == 8
    assert "stopped" in pg.locator(".msg.assistant .msg-stats").nth(2).inner_text()
    assert pg.input_value("#system-prompt") == "You are a helpful assistant."
    assert pg.input_value("#max-tokens") == "100"

    # a second conversation; rename the first; delete the second
    pg.click("#new-chat")
    assert pg.locator(".msg").count() == 0
    send_and_capture(pg, "Hello there, how are you today my friend?")
    titles = pg.locator(".conv-title").all_inner_texts()
    assert titles == ["Hello there, how are you today my friend?", first]
    pg.locator(".conv").nth(1).hover()
    pg.locator(".conv").nth(1).locator(".conv-rename").click()
    pg.fill(".conv-title-input", "Capitals")
    pg.press(".conv-title-input", "Enter")
    assert pg.locator(".conv-title").all_inner_texts() == ["Hello there, how are you today my friend?", "Capitals"]
    pg.locator(".conv").nth(0).locator(".conv-delete").click()
    assert pg.locator(".conv-title").all_inner_texts() == ["Capitals"]
    pg.reload()
    pg.wait_for_selector(".conv")
    assert pg.locator(".conv-title").all_inner_texts() == ["Capitals"]
    assert pg.locator(".msg").count() == 8
    p.close()


def test_api_key_dialog(browser, augur_server):
    s = augur_server(TINY_GGUF, "--api-key", "sekret")
    p = Page(browser, s)
    pg = p.open()
    # the page loaded without a key; its first API call got a 401 and asks
    pg.wait_for_selector("#key-dialog[open]")
    pg.fill("#key-input", "wrong")
    pg.click("#key-ok")
    pg.wait_for_function("() => document.getElementById('key-reason').textContent.includes('did not accept')")
    assert pg.locator("#key-dialog[open]").count() == 1
    pg.fill("#key-input", "sekret")
    pg.click("#key-ok")
    pg.wait_for_function("() => document.getElementById('model-name').textContent === 'stories260K'")
    assert p.storage("augur.apiKey") == "sekret"
    pg.click("#settings-button")
    pg.fill("#max-tokens", "20")
    pg.press("#max-tokens", "Tab")
    content, _, usage = sse_reply(send_and_capture(pg, "Once upon a time")[0])
    assert p.storage("augur.conversations")[0]["messages"][1]["content"] == content
    assert last_stats(pg)["completion"] == usage["completion_tokens"]
    # the stored key is used after a reload: no dialog
    pg.reload()
    pg.wait_for_function("() => document.getElementById('model-name').textContent === 'stories260K'")
    assert pg.locator("#key-dialog[open]").count() == 0
    # forgetting it brings the dialog back on the next request
    pg.click("#settings-button")
    pg.click("#forget-key")
    pg.fill("#prompt", "Again")
    pg.press("#prompt", "Enter")
    pg.wait_for_selector("#key-dialog[open]")
    pg.fill("#key-input", "sekret")
    pg.click("#key-ok")
    pg.wait_for_function("() => document.querySelectorAll('.msg.assistant .msg-stats').length === 2")
    p.close()


# ---- the Markdown renderer ----

BLOCK = {"body", "div", "p", "h1", "h2", "h3", "h4", "h5", "h6", "ul", "ol", "li", "blockquote", "pre", "hr",
         "table", "thead", "tbody", "tr", "th", "td"}


class Tree(HTMLParser):
    """HTML to a comparable tree: (tag, attrs, children) and text strings.
    Whitespace outside <pre> is collapsed and trimmed next to block
    boundaries and after <br> (markdown-it writes newlines there, the page
    does not); the page's code-block chrome is dropped (its header with the
    Copy button and the wrappers), <del> is <s> (both mean strikethrough)."""

    KEEP = {"href", "title", "start", "class"}

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.root = ("body", {}, [])
        self.stack = [self.root]
        self.skip = 0

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        cls = a.get("class") or ""
        if self.skip or "codeblock-head" in cls.split():
            self.skip += 1
            return
        if tag == "div":  # .codeblock / .table-wrap wrappers
            self.stack.append(self.stack[-1])
            return
        tag = "s" if tag == "del" else tag
        keep = {k: v for k, v in a.items() if k in self.KEEP and v is not None}
        if tag == "a":  # the page opens links in a new tab; that is not content
            keep.pop("class", None)
        node = (tag, keep, [])
        self.stack[-1][2].append(node)
        if tag not in ("br", "hr"):
            self.stack.append(node)

    def handle_startendtag(self, tag, attrs):
        self.handle_starttag(tag, attrs)
        if tag not in ("br", "hr") and not self.skip:
            self.handle_endtag(tag)

    def handle_endtag(self, tag):
        if self.skip:
            self.skip -= 1
            return
        if tag not in ("br", "hr"):
            self.stack.pop()

    def handle_data(self, data):
        if not self.skip:
            self.stack[-1][2].append(data)


def normalize(node, in_pre=False):
    tag, attrs, kids = node
    in_pre = in_pre or tag == "pre"
    out = []
    for k in kids:
        if isinstance(k, str):
            k = k if in_pre else re.sub(r"\s+", " ", k)
            if out and isinstance(out[-1], str):
                out[-1] += k
            else:
                out.append(k)
        else:
            out.append(normalize(k, in_pre))
    if not in_pre:
        for i, k in enumerate(out):
            if not isinstance(k, str):
                continue
            prev = out[i - 1] if i else None
            nxt = out[i + 1] if i + 1 < len(out) else None
            if prev is None or (not isinstance(prev, str) and prev[0] in BLOCK | {"br"}) or tag in BLOCK and i == 0:
                k = k.lstrip()
            if nxt is None and tag in BLOCK or (nxt is not None and not isinstance(nxt, str) and nxt[0] in BLOCK):
                k = k.rstrip()
            out[i] = k
        out = [k for k in out if k != ""]
    return (tag, attrs, out)


def tree(html):
    t = Tree()
    t.feed(html)
    t.close()
    return normalize(t.root)


MARKDOWN_CASES = [
    "# Title\n\n## Sub *title*\n\n###### six",
    "Setext\n===\n\nTwo\n---",
    "plain *em* **strong** ***both*** _em_ __strong__ ~~gone~~ snake_case_name 2*3*4",
    "a `code` b ``with ` tick`` c\\*not em\\* \\# \\[x]",
    "line one\nline two\nline three",
    "```python\ndef f(x):\n    return x * 2\n```\n\ntext after",
    "~~~\nno <b>lang</b> & stuff\n\n  indented\n~~~",
    "- one\n- two\n  - nested a\n  - nested b\n- three",
    "1. first\n2. second\n3. third",
    "3. starts at three\n4. four",
    "- loose one\n\n- loose two",
    "* item with `code` and **bold**\n* [a link](https://example.com/x?y=1&z=2)",
    "> quoted *text*\n> more\n\nafter",
    "para\n\n---\n\n***\n\nend",
    'see [the docs](https://example.com "Docs title") and <https://example.org/path>',
    "mail [me](mailto:someone@example.com)",
    "<b>not html</b> & <script>alert(1)</script> done",
    "| Name | Value |\n|------|------:|\n| a | 1 |\n| **b** | `2` |",
    "1. step\n\n   ```sh\n   make test\n   ```\n\n2. next",
    "Text with a list:\n- x\n- y",
    "Here is code:\n```js\nconsole.log('hi')\n```",
    "- a\n    - deep\n        - deeper",
    "[unsafe](javascript:alert(1)) [data](data:text/html,<script>x</script>)",
]


@pytest.fixture
def tiny_page(browser, augur_server):
    p = Page(browser, augur_server(TINY_GGUF))
    p.open()
    yield p
    p.close()


def render_html(pg, text):
    return pg.evaluate("t => { const d = document.createElement('div');"
                       " d.appendChild(AugurMarkdown.render(t)); return d.innerHTML; }", text)


@pytest.mark.parametrize("case", range(len(MARKDOWN_CASES)))
def test_markdown_matches_markdown_it(tiny_page, case):
    try:
        from markdown_it import MarkdownIt
    except ImportError:
        _missing("markdown-it-py is not installed")
    # CommonMark, raw HTML shown as text, GFM tables and strikethrough, and a
    # newline inside a paragraph is a line break: what the page promises
    md = MarkdownIt("commonmark", {"breaks": True, "html": False}).enable("table").enable("strikethrough")
    text = MARKDOWN_CASES[case]
    ours = render_html(tiny_page.page, text)
    ref = md.render(text)
    assert tree(ours) == tree(ref), f"\ninput: {text!r}\nours:  {ours}\nref:   {ref}"


HOSTILE = [
    "<script>window.__xss = 1</script>",
    "<img src=x onerror=\"window.__xss=1\">",
    "[click](javascript:window.__xss=1)",
    "[click](JaVaScRiPt:window.__xss=1)",
    "[click]( javascript:window.__xss=1 )",
    "[x](vbscript:msgbox(1)) [y](data:text/html;base64,PHNjcmlwdD4=)",
    "<javascript:window.__xss=1>",
    "![img](https://example.com/x.png\" onerror=\"window.__xss=1)",
    "```\n</code></pre><img src=x onerror=window.__xss=1>\n```",
    "`<svg onload=window.__xss=1>`",
    "**<iframe src=javascript:window.__xss=1>**",
    "| <b onclick=x> | b |\n|---|---|\n| <style>*{}</style> | c |",
    "[a](https://ok.example/\"><script>window.__xss=1</script>)",
    "http://example.com/<script>window.__xss=1</script>",
]
ALLOWED_TAGS = {"DIV", "SPAN", "BUTTON", "P", "H1", "H2", "H3", "H4", "H5", "H6", "EM", "STRONG", "DEL", "CODE",
                "PRE", "UL", "OL", "LI", "BLOCKQUOTE", "HR", "BR", "A", "TABLE", "THEAD", "TBODY", "TR", "TH", "TD"}


def test_markdown_hostile_input_stays_text(tiny_page):
    pg = tiny_page.page
    found = pg.evaluate("""cases => {
        const out = [];
        for (const t of cases) {
            const d = document.createElement('div');
            d.appendChild(AugurMarkdown.render(t));
            document.body.appendChild(d);
            for (const e of d.querySelectorAll('*')) {
                const attrs = [...e.attributes].map(a => [a.name, a.value]);
                out.push({tag: e.tagName, attrs, text: d.textContent});
            }
            d.remove();
        }
        return out;
    }""", HOSTILE)
    for e in found:
        assert e["tag"] in ALLOWED_TAGS, e
        for name, value in e["attrs"]:
            assert not name.startswith("on"), e
            assert name in {"class", "href", "title", "target", "rel", "type", "start", "style"}, e
            if name == "href":
                assert re.match(r"(https?|mailto):", value, re.I) and not re.search(r"[\s<>\"]", value), e
    pg.wait_for_timeout(200)
    assert pg.evaluate("window.__xss") is None


def test_markdown_is_fast_on_pathological_input(tiny_page):
    pg = tiny_page.page
    text = ("*_`[" * 5000) + ("> " * 2000) + "x" + ("\n- " * 3000) + ("**a " * 5000)
    ms = pg.evaluate("t => { const t0 = performance.now(); AugurMarkdown.render(t); return performance.now() - t0; }",
                     text)
    assert ms < 3000, ms


def test_stored_reply_renders_and_copies(browser, augur_server):
    """A conversation written into localStorage (as another tab or an older
    session left it) comes back rendered; the code block's Copy button puts
    the code on the clipboard; hostile content in it stays text."""
    s = augur_server(TINY_GGUF)
    p = Page(browser, s, permissions=["clipboard-read", "clipboard-write"])
    pg = p.open()
    reply = "Sure:\n\n```python\nprint('<b>hi</b>')\n```\n\n<img src=x onerror=window.__xss=1> **done**"
    conv = [{"id": "c1", "title": "Stored", "named": True, "created": 1, "updated": 1,
             "messages": [{"role": "user", "content": "<i>code</i> please"},
                          {"role": "assistant", "content": reply, "stats": {"completion_tokens": 9}}]},
            {"id": "bad"}, "junk"]
    pg.evaluate("c => localStorage.setItem('augur.conversations', JSON.stringify(c))", conv)
    pg.reload()
    pg.wait_for_selector(".codeblock")
    assert pg.locator(".conv-title").all_inner_texts() == ["Stored"]  # malformed entries are dropped
    assert pg.locator(".msg.user .msg-body").inner_text() == "<i>code</i> please"
    assert pg.locator(".msg.assistant strong").inner_text() == "done"
    assert pg.locator(".msg img, .msg i").count() == 0
    pg.click(".codeblock .copy")
    pg.wait_for_function("() => document.querySelector('.codeblock .copy').textContent === 'Copied'")
    assert pg.evaluate("navigator.clipboard.readText()") == "print('<b>hi</b>')\n"
    assert pg.evaluate("window.__xss") is None
    p.close()
