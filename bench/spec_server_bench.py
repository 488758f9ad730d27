#!/usr/bin/env python3
"""Speculative decoding under concurrency: aggregate throughput of
`augur serve` with and without a draft source, in one run.

Two servers on the same model run side by side (one plain, one with
`--draft DRAFT`); every round runs each concurrency level on both, plain
first, so that the machine's drift hits both alike. The requests are
server_bench.py's: streaming /v1/completions, temperature 0, ignore_eos,
--tokens tokens each. Reported per level: the median aggregate tok/s of
each server and the median of the per-round ratios spec / plain. The goal
(issue 9): at 16 clients speculation costs at most 5% of the aggregate.

usage: bench/spec_server_bench.py [-m MODEL] [--draft ngram] [--levels 1,16]
                                  [--tokens 128] [--repeat 3] [-t THREADS]
"""
import argparse
import os
import statistics
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from server_bench import AUGUR, DEFAULT_MODEL, run_level  # noqa: E402


def start_server(model, parallel, threads, extra):
    cmd = [AUGUR, "serve", "-m", model, "--port", "0", "--parallel", str(parallel), "--ctx", "1024",
           "--max-queue", "256", "--no-kv-disk"] + (["-t", str(threads)] if threads else []) + extra
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    line = proc.stdout.readline().decode()
    if not line.startswith("augur: serving"):
        proc.kill()
        raise SystemExit(f"server did not start ({' '.join(cmd)}): {line!r}")
    return proc, int(line.rsplit(":", 1)[1])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", default=DEFAULT_MODEL)
    ap.add_argument("--draft", default="ngram", help="the spec server's --draft (ngram or a GGUF)")
    ap.add_argument("--levels", default="1,16")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--prompt-words", type=int, default=48)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("-t", "--threads", type=int, default=0)
    args = ap.parse_args()
    levels = [int(x) for x in args.levels.split(",")]
    servers = {}
    try:
        for name, extra in (("plain", []), ("spec", ["--draft", args.draft])):
            servers[name] = start_server(args.model, max(levels), args.threads, extra)
        for name, (_, port) in servers.items():
            run_level("127.0.0.1", port, 1, argparse.Namespace(prompt_words=8, tokens=8), "warm-up")
        agg = {(name, n): [] for name in servers for n in levels}
        for k in range(args.repeat):
            for n in levels:
                for name, (_, port) in servers.items():
                    r = run_level("127.0.0.1", port, n, args, f"round {k} {name}:")
                    agg[(name, n)].append(r["agg_tok_s"])
            print(f"round {k}: " + ", ".join(f"{n} clients plain {agg[('plain', n)][-1]:.1f} spec "
                                             f"{agg[('spec', n)][-1]:.1f} tok/s" for n in levels), flush=True)
    finally:
        for proc, _ in servers.values():
            proc.terminate()
            proc.wait(timeout=60)
    print(f"model {os.path.basename(args.model)}, draft {args.draft}, {args.tokens} tokens per request, "
          f"{args.repeat} rounds")
    for n in levels:
        p, s = agg[("plain", n)], agg[("spec", n)]
        ratios = sorted(b / a for a, b in zip(p, s))
        print(f"{n:3d} clients: plain {statistics.median(p):.1f} tok/s, spec {statistics.median(s):.1f} tok/s, "
              f"spec/plain {statistics.median(ratios):.2f}x (rounds {ratios[0]:.2f}-{ratios[-1]:.2f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
