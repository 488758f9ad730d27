"""EmbeddingGemma-300M from its safetensors folder (`-m models/embeddinggemma-300m`: config.json,
model.safetensors, tokenizer.json, the sentence-transformers modules; an optional model:
scripts/fetch_models.py embeddinggemma) against sentence-transformers' float32 embeddings of 100
sentences and of two texts past the 512-token sliding window (tests/data/embed/embeddinggemma_ref.json,
from scripts/embed_reference_gemma.py): the same token ids as the tokenizers library, and cosine >= 0.999
for every input."""
import base64, json, os, subprocess

import numpy as np
import pytest

from conftest import AugurServer

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MODEL = os.path.join(ROOT, "models", "embeddinggemma-300m")
DATA = os.path.join(ROOT, "tests", "data", "embed")
BIN = os.environ.get("AUGUR_BIN", os.path.join(ROOT, "build", "augur"))

pytestmark = pytest.mark.skipif(not os.path.exists(os.path.join(MODEL, "model.safetensors")),
                                reason="models/embeddinggemma-300m not fetched")


def _ref():
    return json.load(open(os.path.join(DATA, "embeddinggemma_ref.json"), encoding="utf-8"))


def _vec(it):
    return np.frombuffer(base64.b64decode(it["embedding_f16_b64"]), dtype="<f2").astype(np.float64)


def _cos(a, b):
    return float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))


def test_tokens_match_tokenizers():
    # one process (tokenize --batch): "e d HEX" encodes as the model does (<bos> ... <eos>), "d 0 IDS"
    # decodes; the text decodes back from the ids without the specials
    ref = _ref()
    items = ref["items"] + ref["long"]
    req = "".join(f"e d {it['text'].encode().hex()}\n" for it in items)
    req += "".join("d 0 " + " ".join(map(str, it["ids"][1:-1])) + "\n" for it in items)
    out = subprocess.run([BIN, "tokenize", "-m", MODEL, "--batch"], input=req, capture_output=True, text=True,
                         check=True).stdout.splitlines()
    assert len(out) == 2 * len(items)
    bad = [it["text"][:60] for it, l in zip(items, out) if [int(x) for x in l.split()] != it["ids"]]
    assert not bad, bad[:3]
    bad = [it["text"][:60] for it, l in zip(items, out[len(items):]) if bytes.fromhex(l).decode() != it["text"]]
    assert not bad, bad[:3]


def test_embeddings_match_sentence_transformers():
    ref = _ref()
    items = ref["items"] + ref["long"]
    inp = "\n".join(it["text"] for it in items) + "\n"
    out = subprocess.run([BIN, "embed", "-m", MODEL, "-t", "2", "-f", "-"], input=inp, capture_output=True,
                         text=True, check=True)
    got = [np.array(json.loads(l)) for l in out.stdout.splitlines()]
    assert len(got) == len(items)
    cos = []
    for g, it in zip(got, items):
        assert abs(np.linalg.norm(g) - 1) < 1e-4
        cos.append(_cos(g, _vec(it)))
    print(f"cosine min {min(cos):.6f} median {sorted(cos)[len(cos) // 2]:.6f}; long texts {cos[-2:]}")
    assert min(cos) >= 0.999, min(cos)


def test_dimensions_truncate_and_renormalize():
    # EmbeddingGemma's Matryoshka dimensions: the first N values, L2-normalized (no centring)
    it = _ref()["items"][2]
    full = np.array(json.loads(subprocess.run([BIN, "embed", "-m", MODEL, "-t", "2", it["text"]], capture_output=True,
                                              text=True, check=True).stdout))
    cut = np.array(json.loads(subprocess.run([BIN, "embed", "-m", MODEL, "-t", "2", "--dimensions", "256", it["text"]],
                                             capture_output=True, text=True, check=True).stdout))
    assert len(cut) == 256 and np.allclose(cut, full[:256] / np.linalg.norm(full[:256]), atol=1e-6)


def test_embeddings_endpoint():
    import urllib.request
    p = AugurServer(MODEL, "-t", "2")
    try:
        base = p.base
        items = _ref()["items"][:4]
        body = json.dumps({"input": [it["text"] for it in items], "encoding_format": "float"}).encode()
        req = urllib.request.Request(base + "/v1/embeddings", data=body, headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=120) as r:
            j = json.loads(r.read())
        assert j["usage"]["prompt_tokens"] == sum(len(it["ids"]) for it in items)
        for d, it in zip(j["data"], items):
            assert _cos(np.array(d["embedding"]), _vec(it)) >= 0.999
    finally:
        assert p.stop() == 0, p.final_stderr[-4000:]
