#!/usr/bin/env python3
"""Embedding throughput: augur's /v1/embeddings beside llama.cpp's embedding
mode (llama-cpp-python, in process) on the same GGUF, same threads, the same
inputs, in one run, alternating, medians.

Each round embeds the whole input set as one request (augur: one POST with
the list; llama.cpp: Llama.embed(list), which packs the inputs into batches
of n_batch tokens as augur packs them into forwards). Input tokens per
second are counted from augur's usage (both tokenize alike: the nomic test
checks the ids). augur's figure includes its HTTP and JSON; llama.cpp's
none.

usage: bench/embed_bench.py [-m MODEL] [-t 2] [-r 5] [-f SENTENCES] [--copies N]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("-m", "--model", default=os.path.join(ROOT, "models", "nomic-embed-text-v1.5.f16.gguf"))
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-r", "--reps", type=int, default=5)
    ap.add_argument("-f", "--file", default=os.path.join(ROOT, "tests", "data", "embed", "sentences.txt"))
    ap.add_argument("--copies", type=int, default=1, help="the input set repeated N times in a request")
    ap.add_argument("--bin", default=os.path.join(ROOT, "build", "augur"))
    a = ap.parse_args()
    texts = [l.rstrip("\n") for l in open(a.file, encoding="utf-8") if l.strip()] * a.copies

    import llama_cpp
    llm = llama_cpp.Llama(a.model, embedding=True, pooling_type=llama_cpp.LLAMA_POOLING_TYPE_MEAN, n_ctx=4096,
                          n_batch=4096, n_ubatch=4096, n_threads=a.threads, n_threads_batch=a.threads, verbose=False)
    srv = subprocess.Popen([a.bin, "serve", "-m", a.model, "--port", "0", "-t", str(a.threads), "--no-kv-disk"],
                           stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    try:
        line = srv.stdout.readline().decode()
        if not line.startswith("augur: serving "):
            sys.exit(f"augur serve did not start: {line!r}")
        url = "http://127.0.0.1:" + line.rsplit(":", 1)[1].strip() + "/v1/embeddings"
        body = json.dumps({"input": texts, "model": "m"}).encode()

        def augur_once():
            q = urllib.request.Request(url, body, {"Content-Type": "application/json"})
            t0 = time.perf_counter()
            with urllib.request.urlopen(q, timeout=600) as r:
                out = json.loads(r.read())
            return time.perf_counter() - t0, out["usage"]["prompt_tokens"]

        def llama_once():
            t0 = time.perf_counter()
            llm.embed(texts, normalize=True)
            return time.perf_counter() - t0

        augur_once(), llama_once()  # warm-up
        ta, tl, n_tok = [], [], 0
        for _ in range(a.reps):
            dt, n_tok = augur_once()
            ta.append(dt)
            tl.append(llama_once())
        ma, ml = statistics.median(ta), statistics.median(tl)
        print(f"{len(texts)} inputs, {n_tok} tokens, {a.threads} threads, {a.reps} rounds (alternating)")
        print(f"augur /v1/embeddings  {n_tok / ma:9.1f} tok/s  (median {ma * 1e3:.1f} ms, "
              f"range {min(ta) * 1e3:.1f}-{max(ta) * 1e3:.1f})")
        print(f"llama.cpp embed       {n_tok / ml:9.1f} tok/s  (median {ml * 1e3:.1f} ms, "
              f"range {min(tl) * 1e3:.1f}-{max(tl) * 1e3:.1f})")
        print(f"augur / llama.cpp     {ml / ma:9.2f}x")
    finally:
        srv.terminate()
        srv.wait()


if __name__ == "__main__":
    main()
