#!/usr/bin/env python3
"""Tokenizer throughput: augur vs llama.cpp (llama-cpp-python) on the same GGUF and text.

    bench/tok_bench.py [--mb 4] [--runs 3] [--chunk 4096] [--whole] [MODEL.gguf ...]

Builds a few MB of mixed text (the tests' corpus: prose in many scripts, code, numbers,
whitespace runs, emoji; repeated), then times only the encode call on each side, best of
--runs, in the same process run: augur through `augur tokenize --raw --bench N` (the
encode loop is timed inside the binary, after the model is loaded), llama.cpp through
llama_tokenize() called directly with a buffer large enough up front (the high-level
Llama.tokenize() would tokenize twice). Both run raw (no BOS/EOS, special text as text)
and must produce the same number of tokens. Prints tokens/s for each and the ratio.

The text is encoded in prompt-sized pieces (--chunk bytes, cut at the next newline; the same
pieces on both sides), because llama.cpp's special-token pass is quadratic in the number of
special-token matches in one call: with Gemma 3, whose user-defined tokens include "\n" and
runs of spaces, one multi-MB call does not finish. --whole also times single whole-text
calls (skipped for Gemma for that reason).
"""
import argparse
import base64
import ctypes
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
AUGUR = os.environ.get("AUGUR_BIN", os.path.join(ROOT, "build", "augur"))
DEFAULT_MODELS = [os.path.join(ROOT, "models", m) for m in
                  ("SmolLM2-135M-Instruct.Q4_1.gguf", "qwen2.5-0.5b-Q4.gguf", "gemma-3-270m-Q4_K_M.gguf")]


def build_text(mb):
    parts = []
    with open(os.path.join(ROOT, "tests", "data", "tok", "corpus.jsonl"), encoding="utf-8") as f:
        for line in f:
            d = json.loads(line)
            if "t" in d:
                parts.append(d["t"])
    one = "\n".join(parts).encode("utf-8")
    reps = max(1, int(mb * 1e6 / len(one)) + 1)
    return (one + b"\n") * reps


def pieces(text, chunk):
    """The pieces `augur tokenize --bench-chunk` cuts: up to the first newline at least
    `chunk` bytes on."""
    if not chunk:
        return [text]
    out, s = [], 0
    while s < len(text):
        e = min(s + chunk, len(text))
        nl = text.find(b"\n", e - 1)
        e = len(text) if nl < 0 else nl + 1
        out.append(text[s:e])
        s = e
    return out


def bench_llama(model, text, runs, chunk):
    import llama_cpp as L

    llm = L.Llama(model, vocab_only=True, verbose=False)
    vocab = L.llama_model_get_vocab(llm._model.model)
    ps = pieces(text, chunk)
    cap = max(len(p) for p in ps) + 16
    buf = (L.llama_token * cap)()
    tokenize = L.llama_tokenize
    best, total = 1e30, 0
    for _ in range(runs):
        total = 0
        t0 = time.perf_counter()
        for p in ps:
            n = tokenize(vocab, p, len(p), buf, cap, False, False)
            if n < 0:
                raise RuntimeError("llama_tokenize failed")
            total += n
        best = min(best, time.perf_counter() - t0)
    return total, best


def bench_augur(model, path, runs, chunk):
    cmd = [AUGUR, "tokenize", "-m", model, "--raw", "-f", path, "--bench", str(runs)]
    if chunk:
        cmd += ["--bench-chunk", str(chunk)]
    p = subprocess.run(cmd, capture_output=True, check=True)
    r = json.loads(p.stdout)
    return r["tokens"], r["seconds"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mb", type=float, default=4.0, help="text size in MB (default 4)")
    ap.add_argument("--runs", type=int, default=3, help="timed runs per side, best taken (default 3)")
    ap.add_argument("--chunk", type=int, default=4096, help="piece size in bytes (default 4096)")
    ap.add_argument("--whole", action="store_true", help="also time whole-text calls (not for Gemma)")
    ap.add_argument("models", nargs="*", default=DEFAULT_MODELS)
    args = ap.parse_args()
    text = build_text(args.mb)
    with tempfile.NamedTemporaryFile(suffix=".txt", delete=False) as f:
        f.write(text)
        path = f.name
    try:
        print(f"text: {len(text) / 1e6:.2f} MB, best of {args.runs} runs, encode only", flush=True)
        print(f"{'model':34s} {'pieces':>7s} {'tokens':>9s} {'augur tok/s':>12s} {'llama.cpp tok/s':>16s} "
              f"{'ratio':>6s}", flush=True)
        for model in args.models:
            if not os.path.exists(model):
                print(f"{os.path.basename(model):34s} (missing, skipped)")
                continue
            for chunk in [args.chunk] + ([0] if args.whole and "gemma" not in model else []):
                na, ta = bench_augur(model, path, args.runs, chunk)
                nl, tl = bench_llama(model, text, args.runs, chunk)
                if na != nl:
                    print(f"warning: token counts differ: augur {na}, llama.cpp {nl}", file=sys.stderr)
                label = f"{chunk}B" if chunk else "whole"
                print(f"{os.path.basename(model):34s} {label:>7s} {na:9d} {na / ta:12.0f} {nl / tl:16.0f} "
                      f"{tl / ta:5.2f}x   ({len(text) / ta / 1e6:.1f} vs {len(text) / tl / 1e6:.1f} MB/s)",
                      flush=True)
    finally:
        os.unlink(path)


if __name__ == "__main__":
    main()
