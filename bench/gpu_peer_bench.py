#!/usr/bin/env python3
"""The llama.cpp CUDA peer of bench/gpu_bench.sh: llama-cpp-python, built on
the GPU machine from its sdist with CUDA for sm_90
(CMAKE_ARGS="-DGGML_CUDA=on -DCMAKE_CUDA_ARCHITECTURES=90 -DLLAVA_BUILD=OFF"),
all layers on the GPU, its defaults otherwise (flash attention auto, F16 KV).

For each model: prefill tok/s of a 512- and a 4096-token prompt (one eval,
n_batch = prompt length, n_ubatch 512 as llama-bench uses) and batch-1
decode tok/s over 128 tokens, medians of 3 after a warm-up. Prints one JSON
line per model.

usage: gpu_peer_bench.py MODEL.gguf [...]
"""
import json
import statistics
import sys
import time

import llama_cpp


def bench(path):
    llm = llama_cpp.Llama(model_path=path, n_gpu_layers=-1, n_ctx=4096 + 256, n_batch=4096, n_ubatch=512,
                          logits_all=False, verbose=False, seed=1)
    n_vocab = llm.n_vocab()
    out = {"model": path, "peer": "llama-cpp-python " + llama_cpp.__version__ + " (CUDA)"}

    def prefill(n):
        toks = [(i * 7919 + 13) % n_vocab for i in range(n)]
        llm.reset()
        llm._ctx.memory_clear(True) if hasattr(llm._ctx, "memory_clear") else llm._ctx.kv_cache_clear()
        t = time.perf_counter()
        llm.eval(toks)
        return n / (time.perf_counter() - t)

    def decode(n):
        llm.reset()
        llm._ctx.memory_clear(True) if hasattr(llm._ctx, "memory_clear") else llm._ctx.kv_cache_clear()
        llm.eval([1])
        t = time.perf_counter()
        tok = 2
        for i in range(n):
            llm.eval([tok])
            tok = (tok * 31 + 7) % n_vocab
        return n / (time.perf_counter() - t)

    for name, fn, arg in (("pp512", prefill, 512), ("pp4096", prefill, 4096), ("tg128", decode, 128)):
        fn(min(arg, 64))  # warm-up
        out[name + "_tok_s"] = round(statistics.median(fn(arg) for _ in range(3)), 2)
    del llm
    return out


if __name__ == "__main__":
    for m in sys.argv[1:]:
        print(json.dumps(bench(m)), flush=True)
