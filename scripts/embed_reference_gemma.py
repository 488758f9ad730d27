#!/usr/bin/env python3
"""Reference embeddings for EmbeddingGemma-300M (safetensors) from sentence-transformers.

The model folder (models/embeddinggemma-300m: config.json, model.safetensors,
tokenizer.json, modules.json, 1_Pooling, 2_Dense, 3_Dense) is what augur loads
with -m DIR. sentence-transformers runs its own pipeline on the CPU in float32:
Gemma 3 with bidirectional attention, mean pooling, the two Dense layers,
Normalize. No prompt is prepended (augur embeds the text it is given).

Writes tests/data/embed/embeddinggemma_ref.json: for each sentence of
tests/data/embed/sentences.txt the tokenizer's ids (tokenizers, with the
special tokens) and the embedding as base64 float16 (the test's goal is
cosine >= 0.999); and under "long" two texts past the 512-token sliding
window (the sentences joined), which exercise the layers' two-sided window.

usage: scripts/embed_reference_gemma.py [MODEL_DIR]
needs: pip install torch sentence-transformers (CPU is enough)
"""
import base64, hashlib, json, os, sys

import numpy as np
import torch
from sentence_transformers import SentenceTransformer
from tokenizers import Tokenizer

root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
model_dir = sys.argv[1] if len(sys.argv) > 1 else os.path.join(root, "models", "embeddinggemma-300m")
sents = [l.rstrip("\n") for l in open(os.path.join(root, "tests/data/embed/sentences.txt"), encoding="utf-8")]
sents = [s for s in sents if s]
torch.set_num_threads(2)
tok = Tokenizer.from_file(os.path.join(model_dir, "tokenizer.json"))
model = SentenceTransformer(model_dir, device="cpu")
assert model.max_seq_length >= 2048


def item(s, e):
    return {"text": s, "ids": tok.encode(s).ids,
            "embedding_f16_b64": base64.b64encode(np.asarray(e, dtype=np.float32).astype("<f2").tobytes()).decode()}


with torch.no_grad():
    embs = model.encode(sents, batch_size=1, convert_to_numpy=True, normalize_embeddings=False)
    longs = []
    for want in (700, 1600):  # tokens: past the window once, and three windows
        k = 1
        while len(tok.encode(" ".join(sents[:k])).ids) < want:
            k += 1
        longs.append(" ".join(sents[:k]))
    lembs = model.encode(longs, batch_size=1, convert_to_numpy=True, normalize_embeddings=False)
h = hashlib.sha256()
with open(os.path.join(model_dir, "model.safetensors"), "rb") as f:
    for chunk in iter(lambda: f.read(1 << 24), b""):
        h.update(chunk)
import sentence_transformers, transformers
out = {"model_safetensors_sha256": h.hexdigest(), "sentence_transformers": sentence_transformers.__version__,
       "transformers": transformers.__version__, "torch": torch.__version__,
       "items": [item(s, e) for s, e in zip(sents, embs)],
       "long": [item(s, e) for s, e in zip(longs, lembs)]}
with open(os.path.join(root, "tests/data/embed/embeddinggemma_ref.json"), "w") as f:
    json.dump(out, f, indent=0, ensure_ascii=False)
print(f"{len(sents)} sentences, {len(longs)} long texts ({[len(tok.encode(t).ids) for t in longs]} tokens)")
