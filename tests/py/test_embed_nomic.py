"""nomic-embed-text-v1.5 (the real F16 GGUF, an optional model:
scripts/fetch_models.py --embed) against llama.cpp's embeddings of 100
sentences (tests/data/embed/nomic_ref.json, from scripts/embed_reference.py):
the same token ids, and cosine >= 0.999 for every sentence."""
import base64, json, os, subprocess

import numpy as np
import pytest

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
