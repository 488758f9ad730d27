#!/usr/bin/env python3
"""Prefix cache: time to first token of a long prompt, cold vs memory hit vs
disk hit after a restart, in one run; plus the disk's read bandwidth.

For each prompt length L: a server with --kv-disk TMP answers a fresh
L-token prompt (cold prefill), the same prompt again (memory tier), then is
restarted on the same directory and answers it a third time (disk tier).
Each request asks for one token (max_tokens 1), so its latency is the time
to first token. The read bandwidth is `dd` over the cache's record files
(page cache hot unless --drop-caches works here: it says which).

usage: bench/cache_bench.py [-m MODEL] [--lengths 1024,4096] [-t 2] [-r 3]
"""
import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "py"))
from conftest import AugurServer  # noqa: E402

WORDS = ("the engine keeps every block of prompt keys and values so that a later request with the same "
         "prefix restores it instead of computing it again while the disk tier writes blocks behind "
         "and a restarted server scans the headers and finds the longest usable prefix").split()


def prompt_text(n_words, salt):
    # varied but deterministic text; the salt makes each length's prompt distinct
    out = [f"Document {salt}."]
    for i in range(n_words):
        out.append(WORDS[(i * 7 + i // 13 + salt) % len(WORDS)])
        if i % 17 == 16:
            out.append(f"({i})")
    return " ".join(out)


def ask(base, prompt):
    body = json.dumps({"prompt": prompt, "max_tokens": 1, "temperature": 0}).encode()
    req = urllib.request.Request(base + "/v1/completions", data=body, headers={"Content-Type": "application/json"})
    t0 = time.perf_counter()
    with urllib.request.urlopen(req, timeout=3600) as r:
        data = json.loads(r.read())
    dt = time.perf_counter() - t0
    return dt, data["usage"]["prompt_tokens"], data["usage"]["prompt_tokens_details"]["cached_tokens"], \
        data["choices"][0]["text"]


def fit_words(base, target_tokens):
    """Words giving about target_tokens prompt tokens (via /tokenize)."""
    def count(n):
        body = json.dumps({"content": prompt_text(n, 0)}).encode()
        req = urllib.request.Request(base + "/tokenize", data=body, headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=60) as r:
            return len(json.loads(r.read())["tokens"])
    n = target_tokens
    for _ in range(4):
        n = max(8, int(n * target_tokens / max(count(n), 1)))
    return n


def dd_read_mbps(directory):
    files = [os.path.join(directory, f) for f in os.listdir(directory)]
    total = sum(os.path.getsize(f) for f in files)
    dropped = False
    try:
        subprocess.run(["sync"], check=True)
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        dropped = True
    except OSError:
        pass
    t0 = time.perf_counter()
    for f in files:
        subprocess.run(["dd", f"if={f}", "of=/dev/null", "bs=1M", "status=none"], check=True)
    dt = time.perf_counter() - t0
    return total / dt / 1e6 if dt > 0 else 0, total, dropped


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-m", "--model", default=os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--lengths", default="1024,4096")
    ap.add_argument("-t", type=int, default=2)
    ap.add_argument("-r", type=int, default=3, help="repetitions of the memory and disk hits (median)")
    a = ap.parse_args()
    lengths = [int(x) for x in a.lengths.split(",")]
    ctx = max(lengths) + 64
    print(f"# cache_bench {time.strftime('%Y-%m-%d %H:%M')}, {platform.processor() or platform.machine()}, "
          f"model {os.path.basename(a.model)}, {a.t} threads, load {os.getloadavg()[0]:.2f}")
    rows = []
    for li, L in enumerate(lengths):
        d = tempfile.mkdtemp(prefix="augur-cache-bench-")
        args = ["-t", str(a.t), "--ctx", str(ctx), "--parallel", "1", "--kv-disk", d]
        s = AugurServer(a.model, *args)
        words = fit_words(s.base, L)
        p = prompt_text(words, li + 1)
        cold, n_tok, c0, text0 = ask(s.base, p)
        mem = []
        for _ in range(a.r):
            dt, _, cm, t = ask(s.base, p)
            assert t == text0
            mem.append(dt)
        assert s.stop() == 0
        disk, cd = [], 0
        for _ in range(a.r):  # each: a fresh restart, so the hit comes from disk
            s = AugurServer(a.model, *args)
            time.sleep(0.5)  # let the background header scan finish
            dt, _, cd, t = ask(s.base, p)
            assert t == text0, "a disk hit changed the output"
            disk.append(dt)
            assert s.stop() == 0
        mbps, total, dropped = dd_read_mbps(d)
        shutil.rmtree(d, ignore_errors=True)
        r = {"tokens": n_tok, "cold_s": cold, "mem_s": statistics.median(mem), "disk_s": statistics.median(disk),
             "cached_mem": cm, "cached_disk": cd, "disk_mb": total / 1e6, "dd_mbps": mbps, "dd_cold": dropped}
        r["restore_mbps"] = r["disk_mb"] / r["disk_s"] if r["disk_s"] > 0 else 0
        rows.append(r)
    print("| prompt tokens | cold TTFT s | memory hit s (x) | disk hit after restart s (x) | cached (mem/disk) "
          "| records MB | restore MB/s vs dd MB/s |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['tokens']} | {r['cold_s']:.3f} | {r['mem_s']:.3f} ({r['cold_s'] / r['mem_s']:.1f}x) | "
              f"{r['disk_s']:.3f} ({r['cold_s'] / r['disk_s']:.1f}x) | {r['cached_mem']}/{r['cached_disk']} | "
              f"{r['disk_mb']:.1f} | {r['restore_mbps']:.0f} vs {r['dd_mbps']:.0f} "
              f"({'cold' if r['dd_cold'] else 'page cache hot'}) |")


if __name__ == "__main__":
    main()
