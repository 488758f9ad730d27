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
needs: llama-cpp-python built for THIS CPU: `make bench-peer` (bench/build_peer.sh)
builds 0.3.36 from the sdist with CMake flags read from /proc/cpuinfo (native,
or, on CPUs with AMX, every ISA flag the CPU has but AMX, whose path crashes
in ggml_backend_amx_mul_mat) and records them in build/peer-build.txt. A wheel
built elsewhere with forced flags (e.g. -DGGML_AVX512_BF16=ON) dies with
SIGILL on a CPU without them. The benchmark prints the CPU, its ISA flags and
that record, runs llama.cpp in a child process, and refuses with a clear
message when `import llama_cpp` fails or the peer crashes. After the table it
prints the kernels augur chose for each model (from `augur bench --json`).
"""
import argparse
import json
import os
import platform
import random
import signal
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


def cpu_isa_flags():
    """The SIMD flags that matter to augur's and llama.cpp's kernels."""
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("flags"):
                flags = line.split(":", 1)[1].split()
                return [f for f in flags if f in ("avx", "avx2", "fma", "f16c", "avx_vnni") or
                        f.startswith("avx512") or f.startswith("amx")]
    except OSError:
        pass
    return []


def cpu_report():
    """CPU model, ISA flags and the environment that overrides augur's
    kernel choice (AUGUR_CPU_ISA / AUGUR_AMX / AUGUR_AMX_PACK); the kernels
    augur chose are printed per model after the table (`augur bench`
    reports them)."""
    env = ", ".join(f"{k}={os.environ[k]}" for k in ("AUGUR_CPU_ISA", "AUGUR_AMX", "AUGUR_AMX_PACK") if k in os.environ)
    return (f"CPU: {cpu_name()}, {os.cpu_count()} logical CPUs; ISA flags: {' '.join(cpu_isa_flags()) or 'none'}"
            f"{'; environment: ' + env if env else ''}")


def peer_build_report():
    """What bench/build_peer.sh recorded: the copy inside the installed
    llama_cpp package (found without importing it) describes what is
    installed; build/peer-build.txt alone may be stale."""
    local = os.path.join(ROOT, "build", "peer-build.txt")
    pkg = None
    try:
        import importlib.util

        spec = importlib.util.find_spec("llama_cpp")
        if spec and spec.origin:
            pkg = os.path.join(os.path.dirname(spec.origin), "augur-peer-build.txt")
    except (ImportError, ValueError):
        pass
    if pkg and os.path.exists(pkg):
        path, note = pkg, ""
    elif os.path.exists(local):
        path, note = local, (" (warning: the installed llama_cpp does not carry this record: it was installed by other "
                             "means since; make bench-peer)" if pkg else " (warning: llama_cpp is not installed)")
    else:
        return ("llama.cpp peer build: no record (llama-cpp-python " +
                ("was not built by `make bench-peer`)" if pkg else "is not installed: make bench-peer)"))
    text = open(path).read().strip()
    return f"llama.cpp peer build ({path}){note}:\n" + "\n".join("  " + line for line in text.splitlines())


def peer_check():
    """None when llama_cpp imports and runs in a child process, else why not."""
    r = subprocess.run([sys.executable, "-c", "import llama_cpp; llama_cpp.llama_backend_init(); "
                        "print(llama_cpp.__version__)"], capture_output=True, text=True)
    if r.returncode == 0:
        return None
    return peer_failure(r.returncode, r.stderr)


def peer_failure(rc, stderr):
    if rc < 0:
        try:
            name = signal.Signals(-rc).name
        except ValueError:
            name = f"signal {-rc}"
        why = f"llama.cpp (llama-cpp-python) crashed with {name}"
        if -rc == signal.SIGILL:
            why += ": it was built for instructions this CPU does not have"
        return why + "; rebuild it for this CPU: make bench-peer"
    last = (stderr or "").strip().splitlines()[-1:] or ["?"]
    if "No module named 'llama_cpp'" in (stderr or ""):
        return "llama-cpp-python is not installed; build it for this CPU: make bench-peer"
    return f"llama.cpp (llama-cpp-python) failed (exit status {rc}: {last[0]}); rebuild it: make bench-peer"


def bench_llama_child(path, threads, pp, tg, reps):
    """bench_llama in a child process, so that a SIGILL or SIGSEGV is reported, not fatal."""
    r = subprocess.run([sys.executable, os.path.abspath(__file__), "--peer-child", path, str(threads), str(pp), str(tg),
                        str(reps)], capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"cpu_bench: {peer_failure(r.returncode, r.stderr)}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("-t", type=int, default=os.cpu_count())
    ap.add_argument("-p", type=int, default=512)
    ap.add_argument("-n", type=int, default=128)
    ap.add_argument("-r", type=int, default=5)
    ap.add_argument("models", nargs="*", help=f"names ({', '.join(MODELS)}) or GGUF paths; default: the fetched ones")
    a = ap.parse_args()
    names = a.models or [n for n in ("smollm2", "gemma3", "qwen-1.5b") if os.path.exists(os.path.join(ROOT, MODELS[n]))]
    paths = {}
    for n in names:
        path = os.path.join(ROOT, MODELS[n]) if n in MODELS else n
        if not os.path.isfile(path):
            known = ", ".join(MODELS)
            sys.exit(f"cpu_bench: no model '{n}' (a name among {known}, fetched by scripts/fetch_models.py, or a GGUF path)")
        paths[n] = path
    print(f"# {time.strftime('%Y-%m-%d')}, {cpu_name()}, {a.t} threads, pp{a.p} / tg{a.n}, median of {a.r}")
    print(cpu_report())
    print(peer_build_report())
    why = peer_check()
    if why:
        sys.exit(f"cpu_bench: {why}")
    print("| model | augur pp tok/s | llama.cpp pp tok/s | pp ratio | augur tg tok/s | llama.cpp tg tok/s | tg ratio | augur decode GB/s |")
    print("|---|---|---|---|---|---|---|---|")
    kernels = []
    for n in names:
        path = paths[n]
        ours = bench_augur(path, a.t, a.p, a.n, a.r)
        ref = bench_llama_child(path, a.t, a.p, a.n, a.r)
        kernels.append(f"  {n}: {ours.get('cpu_kernels', 'not reported (an augur from before the report, or not on the CPU backend)')}")
        print(f"| {n} | {ours['pp_tok_s']:.1f} | {ref['pp_tok_s']:.1f} | {ours['pp_tok_s'] / ref['pp_tok_s']:.2f} | "
              f"{ours['tg_tok_s']:.1f} | {ref['tg_tok_s']:.1f} | {ours['tg_tok_s'] / ref['tg_tok_s']:.2f} | "
              f"{ours['tg_tok_s'] * ours['weight_gb']:.2f} |", flush=True)
    print("augur kernels (augur bench's report: ISA level, decode rows, prompt rows per weight type, AMX):")
    print("\n".join(kernels))


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--peer-child":
        m, t, p, g, r = sys.argv[2:7]
        print(json.dumps(bench_llama(m, int(t), int(p), int(g), int(r))))
        sys.exit(0)
    sys.exit(main())
