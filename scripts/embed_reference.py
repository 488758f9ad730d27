#!/usr/bin/env python3
"""Reference embeddings for nomic-embed-text-v1.5 (F16 GGUF) from llama.cpp.

No model hub is reachable, so the reference is llama.cpp itself (llama-cpp-python,
embedding=True, mean pooling, L2-normalized) on the same GGUF that augur loads.
Writes tests/data/embed/nomic_ref.json: for each sentence of
tests/data/embed/sentences.txt (one a line) llama.cpp's token ids and its
embedding as base64 float16 (compact; the test's goal is cosine >= 0.999).

usage: scripts/embed_reference.py [MODEL]   (default models/nomic-embed-text-v1.5.f16.gguf)
"""
import base64, hashlib, json, os, sys

import numpy as np
import llama_cpp

root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
model = sys.argv[1] if len(sys.argv) > 1 else os.path.join(root, "models", "nomic-embed-text-v1.5.f16.gguf")
sents = [l.rstrip("\n") for l in open(os.path.join(root, "tests/data/embed/sentences.txt"), encoding="utf-8")]
sents = [s for s in sents if s]
llm = llama_cpp.Llama(model, embedding=True, pooling_type=llama_cpp.LLAMA_POOLING_TYPE_MEAN, n_ctx=2048,
                      n_batch=2048, n_ubatch=2048, n_threads=2, verbose=False)
out = {"model_sha256": hashlib.sha256(open(model, "rb").read()).hexdigest(),
       "llama_cpp_python": llama_cpp.__version__, "items": []}
for s in sents:
    ids = llm.tokenize(s.encode("utf-8"), add_bos=True, special=False)  # as embed() tokenizes
    e = np.asarray(llm.embed(s, normalize=True), dtype=np.float32)
    out["items"].append({"text": s, "ids": ids,
                         "embedding_f16_b64": base64.b64encode(e.astype("<f2").tobytes()).decode()})
with open(os.path.join(root, "tests/data/embed/nomic_ref.json"), "w") as f:
    json.dump(out, f, indent=0, ensure_ascii=False)
print(f"{len(sents)} sentences")
