"""augur serve under concurrency: 32 streaming clients, clients that vanish
mid-stream, and shutdown with requests in flight."""
import http.client
import json
import signal
import socket
import threading
import time
import urllib.request

import pytest

from conftest import TINY_GGUF, AugurServer

ANIMALS = ["dog", "cat", "bird", "fish", "frog", "bear", "duck", "lion"]


def metrics(server):
    with urllib.request.urlopen(server.base + "/metrics", timeout=30) as r:
        vals = {}
        for line in r.read().decode().splitlines():
            if line and not line.startswith("#"):
                k, v = line.rsplit(" ", 1)
                vals[k] = float(v)
        return vals


def wait_idle(server, timeout=20):
    """Until no sequence runs and every KV block is free again, apart from the
    blocks of finished conversations kept for prefix reuse."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        m = metrics(server)
        if m["augur_running_sequences"] == 0 and m["augur_kv_blocks_used"] == m["augur_kv_blocks_cached"] and m["augur_queue_depth"] == 0:
            return m
        time.sleep(0.05)
    raise AssertionError(f"server not idle after {timeout}s: {metrics(server)}")


def open_stream(server, body, allow_end=False):
    """Starts a streaming request on a raw socket and reads until the first
    content chunks; returns the socket (the caller closes it)."""
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=30)
    data = json.dumps(body).encode()
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: " + str(len(data)).encode() + b"\r\n\r\n" + data)
    got = b""
    while got.count(b"data: ") < 3:
        chunk = sock.recv(65536)
        if not chunk and allow_end:
            break
        assert chunk, got
        got += chunk
    assert got.startswith(b"HTTP/1.1 200")
    return sock, got


def test_32_concurrent_streams_equal_solo(tiny_server):
    c = tiny_server.client()
    jobs = []
    for i in range(32):
        prompt = f"Once upon a time there was a {ANIMALS[i % 8]} named {'ABCDEFGH'[i // 8]}"
        jobs.append(("chat" if i % 2 else "completion", prompt, 24 + (i % 5) * 8))

    def run(kind, prompt, n, stream):
        if kind == "chat":
            r = c.chat.completions.create(model="x", messages=[{"role": "user", "content": prompt}], max_tokens=n,
                                          temperature=0, stream=stream, extra_body={"ignore_eos": True})
            if not stream:
                return r.choices[0].message.content, r.choices[0].finish_reason
            text, fin = "", None
            for ch in r:
                if ch.choices:
                    text += ch.choices[0].delta.content or ""
                    fin = ch.choices[0].finish_reason or fin
            return text, fin
        r = c.completions.create(model="x", prompt=prompt, max_tokens=n, temperature=0, stream=stream,
                                 extra_body={"ignore_eos": True})
        if not stream:
            return r.choices[0].text, r.choices[0].finish_reason
        text, fin = "", None
        for ch in r:
            text += ch.choices[0].text
            fin = ch.choices[0].finish_reason or fin
        return text, fin

    solo = [run(k, p, n, False) for k, p, n in jobs]
    assert len(set(t for t, _ in solo)) > 16  # the prompts really differ
    together = [None] * 32

    def worker(i):
        together[i] = run(*jobs[i], True)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(32)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    for i in range(32):
        assert together[i] == solo[i], (i, jobs[i], together[i], solo[i])
    wait_idle(tiny_server)


@pytest.fixture(scope="module")
def long_server():
    """stories260K with a 16k context: a request of 15,000 tokens runs for
    seconds however fast the engine steps (the session's tiny_server has
    the model's 512, which a fast engine writes in a tenth of a second, less
    than the 200 ms a non-streaming request takes to notice its client is
    gone)."""
    s = AugurServer(TINY_GGUF, "--parallel", "8", "--ctx", "16384")
    yield s
    assert s.stop() == 0, s.final_stderr[-4000:]


def test_disconnects_cancel_and_free(long_server):
    before = metrics(long_server)["augur_client_cancels_total"]
    body = {"prompt": "Once upon a time", "max_tokens": 15000, "ignore_eos": True, "stream": True}
    socks = [open_stream(long_server, body)[0] for _ in range(5)]
    m = metrics(long_server)
    assert m["augur_running_sequences"] >= 1 and m["augur_kv_blocks_used"] > 0
    for s in socks:
        s.close()
    # a non-streaming client that leaves while its request runs
    sock = socket.create_connection(("127.0.0.1", long_server.port), timeout=30)
    data = json.dumps({"prompt": "Once upon a time", "max_tokens": 15000, "ignore_eos": True}).encode()
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: " + str(len(data)).encode() +
                 b"\r\n\r\n" + data)
    time.sleep(0.3)
    sock.close()
    m = wait_idle(long_server, timeout=10)  # 15,000 tokens would take seconds more
    assert m["augur_client_cancels_total"] >= before + 6
    # healthy afterwards: the greedy reference still comes out
    r = long_server.client().completions.create(model="x", prompt="Once upon a time", max_tokens=12,
                                                temperature=0)
    assert r.choices[0].text.startswith(", there was a little girl named Lily")


def test_keepalive_reuses_connection(tiny_server):
    conn = http.client.HTTPConnection("127.0.0.1", tiny_server.port, timeout=30)
    for _ in range(3):
        conn.request("POST", "/v1/completions", body=json.dumps({"prompt": "Once", "max_tokens": 3}),
                     headers={"Content-Type": "application/json"})
        r = conn.getresponse()
        assert r.status == 200 and json.loads(r.read())["object"] == "text_completion"
    conn.close()


def stream_until_end(server, body, out):
    """Reads a streaming response to the end; records the events seen."""
    try:
        sock, buf = open_stream(server, body, allow_end=True)
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                break
            buf += chunk
            if b"0\r\n\r\n" in buf[-16:]:
                break
        out.append(buf)
        sock.close()
    except OSError as e:
        out.append(e)


def test_sigterm_with_streams_in_flight_exits_0(augur_server):
    s = augur_server(TINY_GGUF, "--parallel", "2")
    out = []
    body = {"prompt": "Once upon a time", "max_tokens": 1900, "ignore_eos": True, "stream": True}
    threads = [threading.Thread(target=stream_until_end, args=(s, body, out)) for _ in range(3)]
    for t in threads:
        t.start()
    time.sleep(0.5)
    t0 = time.time()
    assert s.stop(signal.SIGTERM) == 0
    assert time.time() - t0 < 10
    for t in threads:
        t.join(timeout=30)
    assert len(out) == 3
    for o in out:
        if isinstance(o, bytes):
            # cut short with an error event, never a [DONE] of a full answer
            assert b"shutting down" in o or b"[DONE]" not in o
    # nothing listens any more
    try:
        socket.create_connection(("127.0.0.1", s.port), timeout=2).close()
        refused = False
    except OSError:
        refused = True
    assert refused


def test_sigint_idle_exits_0(augur_server):
    s = augur_server(TINY_GGUF)
    assert s.client().completions.create(model="x", prompt="Once", max_tokens=2).choices
    assert s.stop(signal.SIGINT) == 0


def test_kquant_batch_on_amx_equals_solo():
    """Gemma 3 (Q4_K / Q6_K weights): 20 greedy streams at once decode in
    batches of 16+ rows, which go to the AMX tiles where the CPU has them
    (ag_matmul_decode_on_amx), 1..3 rows through the dot kernels; every
    output must equal the request's solo output. Elsewhere it checks the
    dot kernels' batch invariance on a K-quant model."""
    from conftest import GEMMA3, AugurServer, require_model
    require_model(GEMMA3)
    s = AugurServer(GEMMA3, "--parallel", "20", "--ctx", "256")
    try:
        c = s.client()
        prompts = [f"Write one sentence about a {ANIMALS[i % 8]} called {'ABC'[i // 8]}." for i in range(20)]

        def run(i):
            r = c.completions.create(model="x", prompt=prompts[i], max_tokens=12 + (i % 3) * 4, temperature=0,
                                     extra_body={"ignore_eos": True})
            return r.choices[0].text

        solo = [run(i) for i in range(20)]
        assert len(set(solo)) > 10
        together = [None] * 20

        def worker(i):
            together[i] = run(i)

        threads = [threading.Thread(target=worker, args=(i,)) for i in range(20)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=300)
        for i in range(20):
            assert together[i] == solo[i], (i, prompts[i], together[i], solo[i])
    finally:
        assert s.stop() == 0
