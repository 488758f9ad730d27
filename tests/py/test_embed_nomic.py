"""nomic-embed-text-v1.5 (the real F16 GGUF, an optional model:
scripts/fetch_models.py --embed) against llama.cpp's embeddings of 100
sentences (tests/data/embed/nomic_ref.json, from scripts/embed_reference.py):
the same token ids, and cosine >= 0.999 for every sentence."""
import base64, json, os, subprocess

import numpy as np
import pytest

from conftest import AugurServer

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MODEL = os.path.join(ROOT, "models", "nomic-embed-text-v1.5.f16.gguf")
DATA = os.path.join(ROOT, "tests", "data", "embed")
BIN = os.environ.get("AUGUR_BIN", os.path.join(ROOT, "build", "augur"))

pytestmark = pytest.mark.skipif(not os.path.exists(MODEL), reason="nomic-embed-text-v1.5.f16.gguf not fetched")


def _ref():
    ref = json.load(open(os.path.join(DATA, "nomic_ref.json"), encoding="utf-8"))
    return ref["items"]


def test_tokens_match_llama_cpp():
    items = _ref()
    bad = []
    for it in items:
        # --raw: special-token text stays text (as embed tokenizes), no [CLS]/[SEP]
        out = subprocess.run([BIN, "tokenize", "--raw", "-m", MODEL, it["text"]], capture_output=True, text=True,
                             check=True)
        ids = [int(x) for x in out.stdout.split()]
        if ids != it["ids"][1:-1]:
            bad.append((it["text"], ids, it["ids"]))
    assert not bad, bad[:3]


def test_embeddings_match_llama_cpp():
    items = _ref()
    out = subprocess.run([BIN, "embed", "-m", MODEL, "-t", "2", "-f", os.path.join(DATA, "sentences.txt")],
                         capture_output=True, text=True, check=True)
    got = [np.array(json.loads(l)) for l in out.stdout.splitlines()]
    assert len(got) == len(items)
    cos = []
    for g, it in zip(got, items):
        r = np.frombuffer(base64.b64decode(it["embedding_f16_b64"]), dtype="<f2").astype(np.float64)
        assert abs(np.linalg.norm(g) - 1) < 1e-4
        cos.append(float(g @ r / np.linalg.norm(g) / np.linalg.norm(r)))
    print(f"cosine min {min(cos):.6f} median {sorted(cos)[len(cos) // 2]:.6f}")
    assert min(cos) >= 0.999, min(cos)


@pytest.fixture(scope="module")
def server():
    p = AugurServer(MODEL, "-t", "2")
    yield p.base
    assert p.stop() == 0, p.final_stderr[-4000:]


def _post(base, path, body):
    import urllib.error, urllib.request
    req = urllib.request.Request(base + path, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_embeddings_endpoint_openai_client(server):
    openai = pytest.importorskip("openai")
    items = _ref()
    client = openai.OpenAI(base_url=server + "/v1", api_key="x")
    texts = [it["text"] for it in items[:8]]
    r = client.embeddings.create(model="nomic", input=texts)
    assert [d.index for d in r.data] == list(range(8))
    assert r.usage.prompt_tokens == sum(len(it["ids"]) for it in items[:8])
    for d, it in zip(r.data, items):
        ref = np.frombuffer(base64.b64decode(it["embedding_f16_b64"]), dtype="<f2").astype(np.float64)
        g = np.array(d.embedding)
        assert g @ ref / np.linalg.norm(g) / np.linalg.norm(ref) >= 0.999
    # the client's default asks for base64; token-id input gives the text's vector
    one = client.embeddings.create(model="nomic", input=items[0]["ids"], encoding_format="float").data[0].embedding
    assert np.allclose(one, r.data[0].embedding, atol=1e-6)
    # Matryoshka: centred, truncated, re-normalised
    d = client.embeddings.create(model="nomic", input=texts[0], dimensions=256, encoding_format="float").data[0]
    full = np.array(r.data[0].embedding)
    want = (full - full.mean())[:256]
    want /= np.linalg.norm(want)
    assert len(d.embedding) == 256 and np.allclose(d.embedding, want, atol=1e-5)


def test_embeddings_bad_input_is_400(server):
    for body in [{}, {"input": ""}, {"input": []}, {"input": [[]]}, {"input": 5}, {"input": [1.5]},
                 {"input": [[1, 2], "x", 3]}, {"input": [10**9]}, {"input": "a", "dimensions": 0},
                 {"input": "a", "dimensions": 769}, {"input": "a", "encoding_format": "hex"},
                 {"input": "word " * 3000}]:
        code, j = _post(server, "/v1/embeddings", body)
        assert code == 400 and j["error"]["message"], (body, code, j)
    code, j = _post(server, "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]})
    assert code == 400 and "embedding model" in j["error"]["message"]
    code, j = _post(server, "/v1/embeddings", {"input": ["ok", "fine"]})
    assert code == 200 and len(j["data"]) == 2


def test_concurrent_requests_share_passes(server):
    # the embedding engine packs the inputs of concurrent requests into shared passes; a vector does
    # not depend on what shares its pass, so each request gets exactly what it gets alone
    import threading, urllib.request
    items = _ref()
    groups = [[it["text"] for it in items[i::6]] for i in range(6)]
    alone = [_post(server, "/v1/embeddings", {"input": g})[1] for g in groups]

    def metric(name):
        with urllib.request.urlopen(server + "/metrics", timeout=30) as r:
            for line in r.read().decode().splitlines():
                if line.startswith("augur_" + name + " "):
                    return float(line.split()[1])

    shared0 = metric("embed_shared_passes_total")
    got = [None] * len(groups)

    def run(k):
        got[k] = _post(server, "/v1/embeddings", {"input": groups[k]})

    for _ in range(3):  # a few tries: the requests must overlap to share a pass
        ts = [threading.Thread(target=run, args=(k,)) for k in range(len(groups))]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        for (code, j), a in zip(got, alone):
            assert code == 200
            assert [d["embedding"] for d in j["data"]] == [d["embedding"] for d in a["data"]]
            assert j["usage"] == a["usage"]
        if metric("embed_shared_passes_total") > shared0:
            break
    assert metric("embed_shared_passes_total") > shared0
    assert metric("embed_requests_total") >= 6 + len(groups)
