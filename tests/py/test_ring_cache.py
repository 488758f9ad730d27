"""Caches that cannot be trimmed (issue 44 item 4): Gemma 3's sliding-window
layers keep a ring of their 512-position window (kv.h), which cannot go
back to any earlier length, so the prefix cache keeps the windowed layers'
KV of every prompt block (published chunk by chunk during the prefill,
before the ring lets it go), and a lookup resumes only where the window's
ring blocks are at hand, preferring a shorter usable prefix to a longer one
it could not use. A prompt followed by a long answer (the ring has long
moved on when the request ends) and then, after a restart, the same
document with a new question: the restarted server reuses the longest
usable prefix, and the text equals a cold server's.

Cold answers: a server without the disk tier and a fresh cache_salt per
request, so nothing cached is shared."""
import json
import random
import urllib.request
import uuid

import pytest

from conftest import GEMMA3, AugurServer, require_model

BLOCK = 16


def post(server, path, body, timeout=600):
    req = urllib.request.Request(server.base + path, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


def complete(server, prompt, n, salt=None):
    body = {"model": "x", "prompt": prompt, "max_tokens": n, "temperature": 0}
    if salt is not None:
        body["cache_salt"] = salt
    r = post(server, "/v1/completions", body)
    u = r["usage"]
    return r["choices"][0]["text"], u["prompt_tokens"], u["prompt_tokens_details"]["cached_tokens"]


def tokenize(server, text):
    return post(server, "/tokenize", {"content": text, "add_special": True})["tokens"]


def metrics(server):
    with urllib.request.urlopen(server.base + "/metrics", timeout=30) as r:
        out = {}
        for line in r.read().decode().splitlines():
            if line and not line.startswith("#") and "{" not in line:
                k, v = line.split()
                out[k] = float(v)
        return out


def wait_scan(server, timeout=60):
    import time
    deadline = time.time() + timeout
    while metrics(server)["augur_prefix_cache_disk_scan_done"] != 1:
        assert time.time() < deadline, "the disk scan did not finish"
        time.sleep(0.05)


def common(a, b):
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def document():
    rnd = random.Random(44)
    words = ("river mountain village market bridge winter harvest lantern orchard meadow forest "
             "castle harbor desert island valley garden library tower candle").split()
    lines = [f"{i + 1}. {' '.join(rnd.choice(words) for _ in range(8))}." for i in range(60)]
    return "Here is a numbered list of places:\n" + "\n".join(lines) + "\n\n"


DOC = document()
Q1 = "Question: copy the whole list again, every line, then say done.\nAnswer:"
Q2 = "Question: which word appears in line 7?\nAnswer:"


@pytest.fixture
def servers():
    started = []

    def start(*args, **kw):
        s = AugurServer(GEMMA3, *args, **kw)
        started.append(s)
        return s

    yield start
    for s in started:
        if s.proc.poll() is None:
            assert s.stop() == 0, s.final_stderr[-4000:]


def test_restart_reuses_the_longest_usable_prefix_of_a_ring_model(servers, tmp_path):
    require_model(GEMMA3)
    d = str(tmp_path / "kv")
    cold = servers("--parallel", "1", "--header-timeout", "600")

    a = servers("--kv-disk", d, "--parallel", "1", "--header-timeout", "600")
    assert "sliding window of 512" in a.stderr() and "ring" in a.stderr()
    text1, n1, cached = complete(a, DOC + Q1, 640)
    assert cached == 0 and n1 > 600  # the prompt alone is past the window
    ids1 = tokenize(a, DOC + Q1)
    # a long answer: the ring has let the prompt's last blocks go by the end
    assert len(tokenize(a, text1)) > 512
    assert a.stop() == 0, a.final_stderr[-4000:]  # flushes the records

    b = servers("--kv-disk", d, "--parallel", "1", "--header-timeout", "600")
    wait_scan(b)
    # the same document, a new question: all they share is resumed
    text2, n2, cached2 = complete(b, DOC + Q2, 24)
    shared = common(ids1, tokenize(b, DOC + Q2))
    assert shared > 512
    print(f"\nprompt 1: {n1} tokens; prompt 2 shares {shared}: {cached2} cached after the restart")
    assert 0 < cached2 <= shared and cached2 > shared - BLOCK, (cached2, shared)
    assert text2 == complete(cold, DOC + Q2, 24, salt=uuid.uuid4().hex)[0]
    m = metrics(b)
    assert m["augur_prefix_cache_tokens_restored_disk_total"] == cached2

    # the first prompt again: its trailing partial block was published when
    # the request ended, without its ring block (gone by then), so the lookup
    # prefers the last whole block, whose window is all there, to the
    # longer match it could not resume
    text3, _, cached3 = complete(b, DOC + Q1, 24)
    print(f"prompt 1 again: {cached3} cached")
    assert cached3 == (n1 - 1) // BLOCK * BLOCK, (cached3, n1)
    assert text3 == complete(cold, DOC + Q1, 24, salt=uuid.uuid4().hex)[0]
    assert text3 == text1[:len(text3)]
