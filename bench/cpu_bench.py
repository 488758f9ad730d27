#!/usr/bin/env python3
"""augur vs llama.cpp (llama-cpp-python) on the CPU: prefill and decode tok/s.

Same GGUF, same thread count, same shapes, one run: for each model,
`augur bench --json` (pp = one prompt of P random tokens in one batch, tg = G
single-token decode steps from an empty context, median of R runs after a
warm-up) and the same two measurements through llama-cpp-python's low-level
eval (fresh KV for each run, logits only for the last token, as llama-bench).
Prints a table with the ratios augur / llama.cpp and the decode bandwidth
(weight bytes read per token x tok/s).

usage: bench/cpu_bench.py [-t THREADS] [-p 512] [-n 128] [-r 5] [MODEL ...]
       (default models: smollm2 gemma3 qwen-1.5b, those fetched)
needs: pip install llama-cpp-python (0.3.36 here). On CPUs with AMX (Sapphire
Rapids and later) its default native build crashes in
ggml_backend_amx_mul_mat (SIGSEGV in an OpenMP worker, seen 2026-12-02), so
build it without AMX but with everything else this CPU has:
  CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON
    -DGGML_F16C=ON -DGGML_BMI2=ON -DGGML_AVX512=ON -DGGML_AVX512_VBMI=ON
    -DGGML_AVX512_VNNI=ON -DGGML_AVX512_BF16=ON -DGGML_AVX_VNNI=ON
    -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF"
    pip install --no-cache-dir llama-cpp-python==0.3.36
"""
import argparse
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODELS = {
    "smollm2": "models/SmolLM2-135M-Instruct.Q4_1.gguf",
    "gemma3": "models/gemma-3-270m-Q4_K_M.gguf",
    "qwen-0.5b": "models/qwen2.5-0.5b-Q4.gguf",
    "qwen-1.5b": "models/Qwen2.5-Coder-1.5B-Instruct-Q4_K_M.gguf",
}


def bench_augur(path, threads, pp, tg, reps):
    out = subprocess.run([os.path.join(ROOT, "build", "augur"), "bench", "-m", path, "-p", str(pp), "-n", str(tg),
                          "-r", str(reps), "-t", str(threads), "--json"], capture_output=True, check=True)
    return json.loads(out.stdout)


def bench_llama(path, threads, pp, tg, reps):
    from llama_cpp import Llama

    llm = Llama(path, n_ctx=max(pp, tg) + 16, n_batch=max(pp, 1), n_ubatch=max(pp, 1), n_threads=threads,
                n_threads_batch=threads, logits_all=False, verbose=False)
    n_vocab = llm.n_vocab()
    rng = random.Random(1234)
    pps, tgs = [], []
    for r in range(reps + 1):  # r == 0: warm-up
        toks = [rng.randrange(n_vocab) for _ in range(pp)]
        llm.reset()
        t0 = time.perf_counter()
        llm.eval(toks)
        a = pp / (time.perf_counter() - t0)
        llm.reset()
        t0 = time.perf_counter()
        for i in range(tg):
            llm.eval([rng.randrange(n_vocab)])
        b = tg / (time.perf_counter() - t0)
        if r:
            pps.append(a)
            tgs.append(b)
    return {"pp_tok_s": statistics.median(pps), "tg_tok_s": statistics.median(tgs)}


def cpu_name():
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("-t", type=int, default=os.cpu_count())
    ap.add_argument("-p", type=int, default=512)
    ap.add_argument("-n", type=int, default=128)
    ap.add_argument("-r", type=int, default=5)
    ap.add_argument("models", nargs="*")
    a = ap.parse_args()
    names = a.models or [n for n in ("smollm2", "gemma3", "qwen-1.5b") if os.path.exists(os.path.join(ROOT, MODELS[n]))]
    print(f"# {time.strftime('%Y-%m-%d')}, {cpu_name()}, {a.t} threads, pp{a.p} / tg{a.n}, median of {a.r}")
    print("| model | augur pp tok/s | llama.cpp pp tok/s | pp ratio | augur tg tok/s | llama.cpp tg tok/s | tg ratio | augur decode GB/s |")
    print("|---|---|---|---|---|---|---|---|")
    for n in names:
        path = os.path.join(ROOT, MODELS[n])
        ours = bench_augur(path, a.t, a.p, a.n, a.r)
        ref = bench_llama(path, a.t, a.p, a.n, a.r)
        print(f"| {n} | {ours['pp_tok_s']:.1f} | {ref['pp_tok_s']:.1f} | {ours['pp_tok_s'] / ref['pp_tok_s']:.2f} | "
              f"{ours['tg_tok_s']:.1f} | {ref['tg_tok_s']:.1f} | {ours['tg_tok_s'] / ref['tg_tok_s']:.2f} | "
              f"{ours['tg_tok_s'] * ours['weight_gb']:.2f} |", flush=True)


if __name__ == "__main__":
    sys.exit(main())
