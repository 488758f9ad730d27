#!/usr/bin/env python3
"""Regenerate the forward-pass parity references with llama.cpp (llama-cpp-python).

For each model: tokenize tests/data/parity/text.txt with llama.cpp's own
tokenizer (BOS as the model's metadata says), teacher-force the tokens through
llama.cpp on the same GGUF, and store, per position, the top-K token ids and
their log-probabilities (log-softmax over the full vocab) in
tests/data/parity/<name>.npz. The parity test feeds the SAME token ids to augur
and compares (top-1 agreement, KL(llama.cpp || augur) over the top-K plus the
tail mass). llama.cpp is the independent reference; CI reads the committed
files and does not need llama-cpp-python.

Models with random weights (architectures no real file of which can be
fetched here: qwen3, qwen3moe, gpt-oss, granitehybrid) are written by bench/gen_model (deterministic:
a preset, a type and the default seed give the same bytes every time) into
build/parity/; the reference records the file's SHA-256, and the test
regenerates the file and checks that hash before comparing.

Quantized-KV references (<model>-kv-<type>, e.g. smollm2-kv-q8_0): the same
tokens through llama.cpp with type_k = type_v = that type (-ctk/-ctv), which
needs flash attention, and llama.cpp's default Walsh-Hadamard rotation of a
quantized cache (what augur's --kv-type does too). Beside the usual floor they
record llama.cpp's own agreement of that type with its f16 cache (flash
attention on both: only the KV type differs), the bar augur's own q8_0-vs-f16
agreement is held to, and the same without the rotation
(LLAMA_ATTN_ROT_DISABLE=1), for the record.

usage: scripts/logits_reference.py [NAME ...]   (default: every model present)
needs: pip install llama-cpp-python numpy; build/bench/gen_model (make build/bench/gen_model)
"""
import hashlib
import os
import subprocess
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED = os.environ.get("AUGUR_SHARED", os.path.join(os.path.dirname(ROOT), "shared"))
OUT = os.path.join(ROOT, "tests", "data", "parity")
TOP_K = 40

# name -> (path, max tokens)
MODELS = {
    "stories260K": (os.path.join(SHARED, "models", "tiny", "stories260K.gguf"), 512),
    "smollm2": (os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf"), 1024),
    "gemma3": (os.path.join(ROOT, "models", "gemma-3-270m-Q4_K_M.gguf"), 1024),
    # past Gemma 3's 512-position sliding window (augur keeps a ring of it: kv.h)
    "gemma3-long": (os.path.join(ROOT, "models", "gemma-3-270m-Q4_K_M.gguf"), 1600),
    "qwen-0.5b": (os.path.join(ROOT, "models", "qwen2.5-0.5b-Q4.gguf"), 1024),
    "qwen-1.5b": (os.path.join(ROOT, "models", "Qwen2.5-Coder-1.5B-Instruct-Q4_K_M.gguf"), 1024),
    "qwen3-tiny": (os.path.join(ROOT, "build", "parity", "qwen3-tiny.gguf"), 512),
    "qwen3moe-tiny": (os.path.join(ROOT, "build", "parity", "qwen3moe-tiny.gguf"), 512),
    "gpt-oss-tiny": (os.path.join(ROOT, "build", "parity", "gpt-oss-tiny.gguf"), 512),
    "gpt-oss-tiny-f16": (os.path.join(ROOT, "build", "parity", "gpt-oss-tiny-f16.gguf"), 512),
    "granite-h-tiny": (os.path.join(ROOT, "build", "parity", "granite-h-tiny.gguf"), 512),
}

# name -> its text in tests/data/parity (default text.txt); text_long.txt is
# text.txt and then prose of DESIGN.md, frozen here
TEXTS = {"gemma3-long": "text_long.txt"}

# name -> (bench/gen_model preset, type, further options): the random-weight
# models. gpt-oss-tiny: MXFP4 experts beside F32 matrices (llama.cpp's F32
# matmuls take F32 activations, its F16 ones round them to fp16: with F32
# the experts' quantized products are the only quantization on either side);
# gpt-oss-tiny-f16: every matrix F16 (no activation is quantized at all)
GENERATED = {
    "qwen3-tiny": ("qwen3-tiny", "Q4_K_M"),
    "qwen3moe-tiny": ("qwen3moe-tiny", "Q4_K_M"),
    "gpt-oss-tiny": ("gpt-oss-tiny", "MXFP4", "--dense", "F32"),
    "gpt-oss-tiny-f16": ("gpt-oss-tiny", "F16"),
    "granite-h-tiny": ("granite-h-tiny", "Q4_K"),
}


# name -> (model, KV type): the quantized-KV references
KV_REFS = {
    "smollm2-kv-q8_0": ("smollm2", "q8_0"),
    "smollm2-kv-q4_0": ("smollm2", "q4_0"),
}
GGML_TYPES = {"f16": 1, "q4_0": 2, "q8_0": 8}


def generate(name, gen_model=os.path.join(ROOT, "build", "bench", "gen_model")):
    """Writes a random-weight model with bench/gen_model; returns (path, sha256)."""
    preset, qtype, *more = GENERATED[name]
    path = MODELS[name][0]
    os.makedirs(os.path.dirname(path), exist_ok=True)
    subprocess.run([gen_model, path, preset, "--type", qtype, *more], check=True, capture_output=True)
    return path, hashlib.sha256(open(path, "rb").read()).hexdigest()


def log_softmax(logits):
    logz = np.log(np.exp(logits - logits.max(1, keepdims=True)).sum(1)) + logits.max(1)
    return logits - logz[:, None]


def llama_scores(path, tokens, n_batch):
    """llama.cpp's teacher-forced logits (float32, as it computes them), n_batch tokens per decode call."""
    from llama_cpp import Llama

    llm = Llama(path, n_ctx=max(1024, len(tokens)), n_batch=n_batch, n_ubatch=n_batch, logits_all=True,
                n_threads=os.cpu_count(), verbose=False)
def llama_logprobs(path, tokens, n_batch, kv=None, rotate=True):
    """llama.cpp's teacher-forced log-probabilities, n_batch tokens per decode call;
    kv: a KV cache type (flash attention on), rotate: llama.cpp's rotation of a quantized one."""
    from llama_cpp import Llama

    more = {}
    if kv:
        more = {"flash_attn": True, "type_k": GGML_TYPES[kv], "type_v": GGML_TYPES[kv]}
    if rotate:
        os.environ.pop("LLAMA_ATTN_ROT_DISABLE", None)
    else:
        os.environ["LLAMA_ATTN_ROT_DISABLE"] = "1"
    llm = Llama(path, n_ctx=1024, n_batch=n_batch, n_ubatch=n_batch, logits_all=True,
                n_threads=os.cpu_count(), verbose=False, **more)
    llm.eval(tokens)
    out = np.array(llm.scores[: len(tokens)], dtype=np.float32)
    del llm
    return out


def rows_logp(scores, r0, r1):
    """log-softmax of rows [r0, r1) in float64 (a few rows at a time: a
    262k vocabulary times 1600 positions is 3.4 GB in float64)."""
    return log_softmax(scores[r0:r1].astype(np.float64))
def agreement(p, q):
    """(top-1 agreement, mean KL(p || q)) of two log-probability arrays."""
    return float(np.mean(p.argmax(1) == q.argmax(1))), float((np.exp(p) * (p - q)).sum(1).mean())


def reference(name):
    from llama_cpp import Llama

    kv = None
    extra = {}
    if name in KV_REFS:
        base, kv = KV_REFS[name]
        path, max_tokens = MODELS[base]
    else:
        path, max_tokens = MODELS[name]
    if name in GENERATED:
        path, digest = generate(name)
        extra = {"gguf_sha256": np.array(digest), "gen_model": np.array(" ".join(GENERATED[name]))}
    text = open(os.path.join(OUT, TEXTS.get(name, "text.txt")), "rb").read()
    vocab = Llama(path, vocab_only=True, verbose=False)
    tokens = vocab.tokenize(text, add_bos=True, special=False)[:max_tokens]
    scores = llama_scores(path, tokens, 1024)
    logp = llama_logprobs(path, tokens, 1024, kv)
    # llama.cpp against itself: the same tokens one at a time (its decode
    # kernels) instead of one batch (its GEMM kernels). In a quantized model
    # summation-order differences flip int8 roundings of activations, so this
    # is the noise floor any second implementation is measured against.
    scores1 = llama_scores(path, tokens, 1)
    same, kl, tops, top_lps = 0, 0.0, [], []
    for r0 in range(0, len(tokens), 64):
        logp, logp1 = rows_logp(scores, r0, r0 + 64), rows_logp(scores1, r0, r0 + 64)
        same += int((logp.argmax(1) == logp1.argmax(1)).sum())
        kl += float((np.exp(logp) * (logp - logp1)).sum(1).sum())
        t = np.argsort(-logp, axis=1, kind="stable")[:, :TOP_K].astype(np.int32)
        tops.append(t)
        top_lps.append(np.take_along_axis(logp, t, 1).astype(np.float32))
    self_top1 = same / len(tokens)
    self_kl = kl / len(tokens)
    logits = scores
    top, top_logp = np.concatenate(tops), np.concatenate(top_lps)
    logp1 = llama_logprobs(path, tokens, 1, kv)
    self_top1 = float(np.mean(logp.argmax(1) == logp1.argmax(1)))
    self_kl = float((np.exp(logp) * (logp - logp1)).sum(1).mean())
    logits = logp
    if kv:
        f16 = llama_logprobs(path, tokens, 1024, "f16")
        norot = llama_logprobs(path, tokens, 1024, kv, rotate=False)
        extra["vs_f16_top1"], extra["vs_f16_kl"] = map(np.float64, agreement(f16, logp))
        extra["norot_vs_f16_top1"], extra["norot_vs_f16_kl"] = map(np.float64, agreement(f16, norot))
        extra["kv_type"] = np.array(kv)
        print(f"{name}: llama.cpp {kv} vs f16 KV: top-1 {float(extra['vs_f16_top1']):.4f}, KL "
              f"{float(extra['vs_f16_kl']):.2e}; unrotated: top-1 {float(extra['norot_vs_f16_top1']):.4f}, KL "
              f"{float(extra['norot_vs_f16_kl']):.2e}")
    top = np.argsort(-logp, axis=1, kind="stable")[:, :TOP_K].astype(np.int32)
    top_logp = np.take_along_axis(logp, top, 1).astype(np.float32)
    out = os.path.join(OUT, f"{name}.npz")
    np.savez_compressed(out, tokens=np.array(tokens, dtype=np.int32), top_ids=top,
                        top_logprobs=top_logp, n_vocab=np.int32(logits.shape[1]),
                        self_top1=np.float64(self_top1), self_kl=np.float64(self_kl),
                        llama_cpp_version=np.array(__import__("llama_cpp").__version__), **extra)
    print(f"{name}: {len(tokens)} tokens, vocab {logits.shape[1]}, llama.cpp batch vs one-by-one: "
          f"top-1 {self_top1:.4f}, KL {self_kl:.2e} -> {out}")


def main(argv):
    names = argv or [n for n, (p, _) in MODELS.items() if n in GENERATED or os.path.exists(p)] + [
        n for n, (base, _) in KV_REFS.items() if os.path.exists(MODELS[base][0])]
    for n in names:
        reference(n)


if __name__ == "__main__":
    main(sys.argv[1:])
