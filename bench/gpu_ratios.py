#!/usr/bin/env python3
"""augur against llama.cpp, same GGUF files, from one run's JSON lines.

usage: gpu_ratios.py AUGUR.jsonl PEER.jsonl

AUGUR.jsonl: `augur bench --json` lines (bench/gpu_bench.sh writes them);
PEER.jsonl: `bench/gpu_peer.sh run` lines. Prints, per model, a markdown
table of the figures both measured and their ratio (augur / llama.cpp):
prefill 512 and 4096 (pp512, pp4096: augur's `-p N -n 0`), batch-1 decode
(tg128: augur's `-p 0 -n N`, batch 1, no context), and aggregate decode of
B sequences (llama-batched-bench's "decode xB": augur's `-b B`). Figures
only one side has are listed with '-' for the other. Exit status 1 when
the files share no model.
"""
import json
import os
import sys


def augur_key(j):
    """the peer's test name for an augur bench line, or None"""
    if j.get("pp") and not j.get("tg"):
        return "pp%d" % j["pp"]
    if j.get("tg") and not j.get("pp") and not j.get("depth"):
        b = j.get("batch", 1)
        if j.get("argmax") or j.get("pick"):  # plain decode steps only, as llama-bench's
            return None
        return "tg128" if b == 1 else "decode x%d" % b
    return None


def load(path, peer):
    out = {}
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line.startswith("{"):
                continue
            j = json.loads(line)
            model = os.path.basename(j.get("model", "?"))
            if peer:
                if "test" in j and "tok_s" in j:
                    out.setdefault(model, {})[j["test"]] = float(j["tok_s"])
            else:
                k = augur_key(j)
                v = j.get("pp_tok_s") if k and k.startswith("pp") else j.get("tg_tok_s")
                if k and v is not None:
                    out.setdefault(model, {})[k] = float(v)
    return out


def order(test):
    if test.startswith("pp"):
        return (0, int(test[2:]))
    if test == "tg128":
        return (1, 1)
    return (2, int(test.split("x")[-1]))


def main():
    if len(sys.argv) != 3:
        print(__doc__.strip().splitlines()[2], file=sys.stderr)
        return 2
    a, p = load(sys.argv[1], False), load(sys.argv[2], True)
    shared = [m for m in a if m in p]
    if not shared:
        print("gpu_ratios: no model in both files", file=sys.stderr)
        return 1
    for m in shared:
        print(f"\n{m}\n\n| test | augur tok/s | llama.cpp tok/s | augur / llama.cpp |\n|---|---|---|---|")
        for t in sorted(set(a[m]) | set(p[m]), key=order):
            x, y = a[m].get(t), p[m].get(t)
            fx = f"{x:.1f}" if x else "-"
            fy = f"{y:.1f}" if y else "-"
            print(f"| {t} | {fx} | {fy} | {f'{x / y:.2f}x' if x and y else '-'} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
