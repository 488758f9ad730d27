#!/usr/bin/env python3
"""Prefix cache: time to first token (TTFT) of long prompts, cold vs memory
hit vs disk hit after a restart; restore throughput against the disk's read
bandwidth; the write-behind's cost on decode; llama.cpp's state save/load
as the peer. Everything in one run, same threads.

1. TTFT, for each prompt length L (one server per L, --parallel 1, a fresh
   --kv-disk directory): a new L-token prompt (cold prefill), the same prompt
   again R times (memory tier); then (unless --no-host) a server on a copy
   of the records whose KV pool holds one context (--kv-mem from `augur
   fit`) and whose host tier (--kv-host-mem) holds four: the prompt (a disk
   hit), then R times another L-token prompt, which pushes the first one's
   blocks out of the pool into the host tier, and the first again (a host
   hit: copied back into the pool, no disk read); then R
   restarts on the same directory, each
   answering it once (disk tier), first with the records in the page cache
   (they were just written), then R more with the records evicted from the
   page cache (posix_fadvise DONTNEED on each record file, after the
   start-up scan: a global drop_caches would also evict the model's weights
   and other people's files). Each request asks for one token, so its
   latency is the TTFT.
2. Restore throughput: record bytes read / restore time, from the server's
   own metrics (augur_prefix_cache_disk_*: wall time from admission to
   adoption), against `dd` over the same record files: evicted first (cold),
   then again (page cache), and with iflag=direct (O_DIRECT, no cache);
   plus dd iflag=direct over the model file as the disk's sequential
   bandwidth. dd's own timing is summed over the files (no process start-up).
3. Write-behind cost (--wb-rounds, 0 to skip): per round a new
   --wb-prompt-token prompt is answered (its blocks go to the writer thread
   while the engine is idle: --wb-gap seconds, as when requests come a
   little apart), then a --wb-tokens streamed decode B, timed per token, while /metrics is sampled every 10 ms to see
   when the writer writes, then, once it is done, another decode C. Decode
   tok/s over B's tokens that arrived while the writer wrote, against the
   same tokens of C (same server, writer idle) and of B and C on a
   --no-kv-disk server given the same prompts; and the writer thread's CPU
   time (/proc, thread "augur-kv-write") over that window.
4. Peer (unless --no-peer): llama-cpp-python (`make bench-peer`) on the same
   GGUF, threads and prompt text, in a child process: cold TTFT (eval of the
   prompt), then llama_state_save_file of the KV of all but the last token,
   and R times llama_state_load_file + eval of the last token (what a disk
   hit costs there), page cache warm, then evicted. The first token's
   argmax is checked against the cold run.

usage: bench/cache_bench.py [-m MODEL] [--lengths 1024,4096] [--long] [-t 2] [-r 3]
                            [--wb-rounds 3] [--wb-prompt 2048] [--wb-tokens 64] [--wb-gap 0.05]
                            [--no-peer] [--no-host] [--device cpu|cuda|auto] [--dir DIR]
(--device cuda: the servers run on the GPU; the peer stays llama-cpp-python's
CPU build, so add --no-peer unless it was built with CUDA.)
"""
import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "py"))
sys.path.insert(0, os.path.join(ROOT, "bench"))
from conftest import AUGUR, AugurServer  # noqa: E402
from cpu_bench import cpu_isa_flags, cpu_name, peer_build_report, peer_check, peer_failure  # noqa: E402

WORDS = ("the engine keeps every block of prompt keys and values so that a later request with the same "
         "prefix restores it instead of computing it again while the disk tier writes blocks behind "
         "and a restarted server scans the headers and finds the longest usable prefix").split()
RECORD_EXT = ".agkv"


def prompt_text(n_words, salt):
    # varied but deterministic text; the salt makes each prompt distinct from its first block
    out = [f"Document {salt}."]
    for i in range(n_words):
        out.append(WORDS[(i * 7 + i // 13 + salt) % len(WORDS)])
        if i % 17 == 16:
            out.append(f"({i})")
    return " ".join(out)


def post(base, path, body, timeout=7200):
    req = urllib.request.Request(base + path, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return json.loads(r.read())
    except urllib.error.HTTPError as e:  # say what the server said
        raise SystemExit(f"cache_bench: {path}: HTTP {e.code}: {e.read().decode(errors='replace')[:500]}")


def ask(base, prompt):
    """(seconds, prompt tokens, cached tokens, text) of a one-token answer."""
    t0 = time.perf_counter()
    data = post(base, "/v1/completions", {"prompt": prompt, "max_tokens": 1, "temperature": 0})
    dt = time.perf_counter() - t0
    u = data["usage"]
    return dt, u["prompt_tokens"], u["prompt_tokens_details"]["cached_tokens"], data["choices"][0]["text"]


def metrics(base):
    with urllib.request.urlopen(base + "/metrics", timeout=30) as r:
        out = {}
        for line in r.read().decode().splitlines():
            if line and not line.startswith("#") and "{" not in line:
                k, v = line.split()
                out[k] = float(v)
        return out


def wait_scan(base):
    while metrics(base)["augur_prefix_cache_disk_scan_done"] != 1:
        time.sleep(0.05)


def fit_words(base, target_tokens):
    """Words giving about target_tokens prompt tokens (via /tokenize)."""
    def count(n):
        return len(post(base, "/tokenize", {"content": prompt_text(n, 0)})["tokens"])
    n = target_tokens
    for _ in range(4):
        n = max(8, int(n * target_tokens / max(count(n), 1)))
    while n > 8 and count(n) > target_tokens:  # never past the target: the context holds target + 64
        n = max(8, int(n * 0.98) - 1)
    return n


def record_files(d):
    return [os.path.join(d, f) for f in sorted(os.listdir(d)) if f.endswith(RECORD_EXT)]


def evict(paths):
    """Drops the files' pages from the page cache (they are clean: written
    and synced, or only read); returns the pages still cached (fincore)."""
    os.sync()
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    if not shutil.which("fincore") or not paths:
        return None
    out = subprocess.run(["fincore", "-b", "-n", "-o", "RES", *paths[:200]], capture_output=True, text=True)
    return sum(int(x) for x in out.stdout.split()) if out.returncode == 0 else None


DD_RE = re.compile(r"(\d+) bytes .* copied, ([0-9.e+-]+) s")


def dd_read(paths, direct=False, limit_mb=None):
    """MB/s of dd reading the files to /dev/null, by dd's own clock."""
    total_b, total_s = 0, 0.0
    for p in paths:
        cmd = ["dd", f"if={p}", "of=/dev/null", "bs=1M"] + (["iflag=direct"] if direct else [])
        if limit_mb:
            cmd.append(f"count={limit_mb}")
        r = subprocess.run(cmd, capture_output=True, text=True)
        m = DD_RE.search(r.stderr)
        if r.returncode != 0 or not m:
            return None  # e.g. O_DIRECT unsupported by the file system
        total_b += int(m.group(1))
        total_s += float(m.group(2))
    return total_b / total_s / 1e6 if total_s > 0 else None


def median(xs):
    return statistics.median(xs) if xs else float("nan")


# ---- 1 and 2: TTFT and restore throughput ----

def disk_hit(model, args, d, prompt, text0, cold_cache):
    """A restart on d answering prompt: (TTFT s, restore s, bytes read, cached tokens)."""
    s = AugurServer(model, *args)
    try:
        wait_scan(s.base)
        if cold_cache:
            evict(record_files(d))
        m0 = metrics(s.base)
        dt, _, cached, text = ask(s.base, prompt)
        m1 = metrics(s.base)
    finally:
        assert s.stop() == 0
    assert text == text0, "a disk hit changed the output"
    rs = m1["augur_prefix_cache_disk_restore_seconds_total"] - m0["augur_prefix_cache_disk_restore_seconds_total"]
    rb = m1["augur_prefix_cache_disk_bytes_read_total"] - m0["augur_prefix_cache_disk_bytes_read_total"]
    return dt, rs, rb, cached


def device_args(a):
    return ["--device", a.device] if a.device else []


def bench_host(a, L, words, salt, text0, d, workdir):
    """Host-tier hits: (median TTFT s, cached tokens, host tokens per hit).
    The server runs on a copy of d (p's records: its first answer is a
    disk hit, not another cold prefill)."""
    fit = subprocess.run([AUGUR, "fit", "-m", a.model, "--ctx", str(L + 64), "--parallel", "1", "--no-kv-disk",
                          "--json", "-t", str(a.t)] + device_args(a), capture_output=True, text=True)
    assert fit.returncode == 0, fit.stderr
    kv = json.loads(fit.stdout)["parts"]["kv"]
    d2 = tempfile.mkdtemp(prefix="augur-cache-host-", dir=workdir)
    shutil.rmtree(d2)
    shutil.copytree(d, d2)
    args = ["-t", str(a.t), "--ctx", str(L + 64), "--parallel", "1", "--kv-disk", d2, "--kv-mem", str(kv),
            "--kv-host-mem", str(4 * kv + (64 << 20))] + device_args(a)
    s = AugurServer(a.model, *args)
    # other fills nearly the whole context, so that every block of p leaves the pool
    p, other = prompt_text(words, salt), prompt_text(int(words * (L + 40) / L), salt + 500)
    times, cached, host = [], 0, 0
    try:
        wait_scan(s.base)
        _, _, _, t = ask(s.base, p)
        assert t == text0
        for _ in range(a.r):
            ask(s.base, other)  # needs the pool: p's blocks move to the host tier (cold once, then host hits)
            m0 = metrics(s.base)
            dt, _, cached, t = ask(s.base, p)
            m1 = metrics(s.base)
            assert t == text0, "a host-tier hit changed the output"
            host = m1["augur_prefix_cache_tokens_restored_host_total"] - m0["augur_prefix_cache_tokens_restored_host_total"]
            times.append(dt)
    finally:
        assert s.stop() == 0
        shutil.rmtree(d2, ignore_errors=True)
    return median(times), cached, int(host)


def bench_length(a, L, salt, workdir):
    d = tempfile.mkdtemp(prefix="augur-cache-bench-", dir=workdir)
    args = ["-t", str(a.t), "--ctx", str(L + 64), "--parallel", "1", "--kv-disk", d] + device_args(a)
    s = AugurServer(a.model, *args)
    try:
        words = fit_words(s.base, L)
        p = prompt_text(words, salt)
        cold, n_tok, _, text0 = ask(s.base, p)
        mem = []
        for _ in range(a.r):
            dt, _, cm, t = ask(s.base, p)
            assert t == text0
            mem.append(dt)
    finally:
        assert s.stop() == 0  # SIGTERM: the flush writes every block
    host = bench_host(a, L, words, salt, text0, d, workdir) if not a.no_host else None
    hits = {True: [], False: []}
    for cold_cache in (False, True):
        for _ in range(a.r):
            hits[cold_cache].append(disk_hit(a.model, args, d, p, text0, cold_cache))
    files = record_files(d)
    left = evict(files)
    dd_cold = dd_read(files)
    dd_warm = dd_read(files)
    dd_direct = dd_read(files, direct=True)
    r = {"L": L, "tokens": n_tok, "cold": cold, "mem": median(mem), "cached_mem": cm, "prompt": p, "text0": text0,
         "records": len(files), "mb": sum(os.path.getsize(f) for f in files) / 1e6, "dd_cold": dd_cold,
         "dd_warm": dd_warm, "dd_direct": dd_direct, "pages_left_after_evict": left, "host": host}
    for cold_cache, key in ((False, "warm"), (True, "cold")):
        h = hits[cold_cache]
        r[f"disk_{key}"] = median([x[0] for x in h])
        r[f"restore_s_{key}"] = median([x[1] for x in h])
        r[f"restore_mbps_{key}"] = median([x[2] / x[1] / 1e6 for x in h if x[1] > 0])
        r[f"cached_disk_{key}"] = h[-1][3]
    shutil.rmtree(d, ignore_errors=True)
    return r


# ---- 3: write-behind cost on decode ----

def stream_times(base, prompt, n_tokens):
    """Arrival times of each streamed token of a greedy completion."""
    body = json.dumps({"prompt": prompt, "max_tokens": n_tokens, "temperature": 0, "ignore_eos": True,
                       "stream": True}).encode()
    req = urllib.request.Request(base + "/v1/completions", data=body, headers={"Content-Type": "application/json"})
    times = []
    with urllib.request.urlopen(req, timeout=3600) as r:
        for line in r:
            if line.startswith(b"data: {"):
                times.append(time.perf_counter())
    return times


def thread_cpu_s(pid, name):
    """CPU seconds (user + system) of the thread of pid called name, or 0."""
    tick = os.sysconf("SC_CLK_TCK")
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            if open(f"/proc/{pid}/task/{tid}/comm").read().strip() == name:
                f = open(f"/proc/{pid}/task/{tid}/stat").read().rsplit(")", 1)[1].split()
                return (int(f[11]) + int(f[12])) / tick  # utime, stime: fields 14 and 15
        except OSError:
            pass
    return 0.0


def sample_writes(base, stop, out):
    """(time, bytes written) every 10 ms until stop is set."""
    while not stop.is_set():
        m = metrics(base)
        out.append((time.perf_counter(), m.get("augur_prefix_cache_disk_bytes_written_total", 0.0)))
        time.sleep(0.01)


def decode_during(s, prompt, n_tokens):
    """Streams prompt's greedy decode while sampling the writer: (token
    times, (time, bytes written) samples, writer CPU seconds meanwhile)."""
    samples, stop = [], threading.Event()
    poller = threading.Thread(target=sample_writes, args=(s.base, stop, samples))
    cpu0 = thread_cpu_s(s.proc.pid, "augur-kv-write")
    poller.start()
    times = stream_times(s.base, prompt, n_tokens)
    stop.set()
    poller.join()
    return times, samples, thread_cpu_s(s.proc.pid, "augur-kv-write") - cpu0


def writer_window(samples):
    """(start, end, MB) of the writes the samples saw, or None."""
    grew = [i for i in range(1, len(samples)) if samples[i][1] > samples[i - 1][1]]
    if not grew:
        return None
    return samples[grew[0] - 1][0], samples[grew[-1]][0], (samples[grew[-1]][1] - samples[grew[0] - 1][1]) / 1e6


def rate(times, k0, k1):
    """tok/s of tokens k0..k1 (each timed from the one before)."""
    return (k1 - k0 + 1) / (times[k1] - times[k0 - 1])


def writer_cost(a, workdir):
    """Per round, a new --wb-prompt prompt is answered (its blocks are then
    written behind), then a decode runs at once (B: the writer writes) and
    another once the writer is done (C: idle). The same on a --no-kv-disk
    server. Returns per round a dict of the tok/s of B's tokens that arrived
    while the writer wrote and of the same tokens of C and of the
    --no-kv-disk server's B and C, with what the writer did meanwhile."""
    runs = {"disk": [], "off": []}
    for mode in ("disk", "off"):
        d = tempfile.mkdtemp(prefix="augur-cache-wb-", dir=workdir)
        args = ["-t", str(a.t), "--ctx", str(a.wb_prompt + a.wb_tokens + 256), "--parallel", "1"]
        args += ["--kv-disk", d] if mode == "disk" else ["--no-kv-disk"]
        s = AugurServer(a.model, *args)
        try:
            if mode == "disk":
                wait_scan(s.base)
            words = fit_words(s.base, a.wb_prompt)
            for i in range(a.wb_rounds):
                ask(s.base, prompt_text(words, 1000 + i))  # new blocks: the writer takes them once idle
                time.sleep(a.wb_gap)  # the idle engine queues them meanwhile (up to the 64 MiB write queue)
                busy = decode_during(s, f"Story {i}: once upon a time, in a quiet town by the sea,", a.wb_tokens)
                if mode == "disk":  # until the writer is done
                    last = -1.0
                    while True:
                        w = metrics(s.base)["augur_prefix_cache_disk_bytes_written_total"]
                        if w == last:
                            break
                        last = w
                        time.sleep(0.5)
                idle = decode_during(s, f"Tale {i}: long ago, in a small village in the hills,", a.wb_tokens)
                runs[mode].append((busy, idle))
        finally:
            assert s.stop() == 0
        shutil.rmtree(d, ignore_errors=True)
    out = []
    for (busy, idle), (off_b, off_c) in zip(runs["disk"], runs["off"]):
        times, samples, cpu = busy
        w = writer_window(samples)
        inside = [k for k in range(1, len(times)) if w and times[k - 1] >= w[0] and times[k] <= w[1]]
        if len(inside) < 3:
            out.append(None)
            continue
        k0, k1 = inside[0], inside[-1]
        out.append({"busy": rate(times, k0, k1), "idle": rate(idle[0], k0, k1), "off_b": rate(off_b[0], k0, k1),
                    "off_c": rate(off_c[0], k0, k1), "mb": w[2], "write_s": w[1] - w[0], "cpu_s": cpu,
                    "tokens": k1 - k0 + 1, "window_s": times[k1] - times[k0 - 1]})
    return out


# ---- 4: the llama.cpp peer ----

def peer_child(model, threads, text_path, reps, state_dir):
    import ctypes

    import llama_cpp
    import numpy as np
    from llama_cpp import Llama

    text = open(text_path).read()
    probe = Llama(model, vocab_only=True, verbose=False)
    toks = probe.tokenize(text.encode(), add_bos=True)
    del probe
    n = len(toks)
    llm = Llama(model, n_ctx=n + 64, n_batch=512, n_ubatch=512, n_threads=threads, n_threads_batch=threads,
                verbose=False)
    n_vocab = llm.n_vocab()

    def last_argmax():
        return int(np.argmax(np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(n_vocab,))))

    llm.reset()
    t0 = time.perf_counter()
    llm.eval(toks[:-1])
    t_prefix = time.perf_counter() - t0
    path = os.path.join(state_dir, "state.bin")
    arr = (llama_cpp.llama_token * n)(*toks)
    t0 = time.perf_counter()
    ok = llama_cpp.llama_state_save_file(llm.ctx, path.encode(), arr, n - 1)
    t_save = time.perf_counter() - t0
    assert ok, "llama_state_save_file failed"
    fd = os.open(path, os.O_RDONLY)  # on disk, as augur's records are (its writer fsyncs them)
    os.fsync(fd)
    os.close(fd)
    t0 = time.perf_counter()
    llm.eval(toks[-1:])
    cold = t_prefix + time.perf_counter() - t0
    ref = last_argmax()
    res = {"tokens": n, "cold_s": cold, "save_s": t_save, "state_mb": os.path.getsize(path) / 1e6}
    for key, cold_cache in (("warm", False), ("cold", True)):
        times = []
        for _ in range(reps):
            llm.reset()
            if cold_cache:
                evict([path])
            out = (llama_cpp.llama_token * (n + 64))()
            n_out = ctypes.c_size_t(0)
            t0 = time.perf_counter()
            ok = llama_cpp.llama_state_load_file(llm.ctx, path.encode(), out, len(out), ctypes.byref(n_out))
            assert ok and n_out.value == n - 1, "llama_state_load_file failed"
            llm.n_tokens = n_out.value  # the wrapper's position: the eval below appends
            llm.input_ids[: n - 1] = toks[:-1]
            llm.eval(toks[-1:])
            times.append(time.perf_counter() - t0)
            assert last_argmax() == ref, "the restored state gave another first token"
        res[f"load_{key}_s"] = statistics.median(times)
    print(json.dumps(res))


def bench_peer(a, prompt, workdir):
    with tempfile.TemporaryDirectory(prefix="augur-cache-peer-", dir=workdir) as d:
        tp = os.path.join(d, "prompt.txt")
        with open(tp, "w") as f:
            f.write(prompt)
        r = subprocess.run([sys.executable, os.path.abspath(__file__), "--peer-child", a.model, str(a.t), tp,
                            str(a.r), d], capture_output=True, text=True)
        if r.returncode != 0:
            return {"error": peer_failure(r.returncode, r.stderr)}
        return json.loads(r.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-m", "--model", default=os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--lengths", default="1024,4096")
    ap.add_argument("--long", action="store_true", help="add a 16384-token prompt (many minutes on 2 cores)")
    ap.add_argument("-t", type=int, default=2)
    ap.add_argument("-r", type=int, default=3, help="repetitions of each hit (median)")
    ap.add_argument("--wb-rounds", type=int, default=3, help="write-behind rounds (0: skip)")
    ap.add_argument("--wb-prompt", type=int, default=2048, help="tokens of the prompt whose blocks are written")
    ap.add_argument("--wb-tokens", type=int, default=64, help="decode tokens timed while they are written")
    ap.add_argument("--wb-gap", type=float, default=0.05,
                    help="seconds between the prompt's answer and the decode: the engine is idle and queues writes")
    ap.add_argument("--no-peer", action="store_true", help="skip llama.cpp")
    ap.add_argument("--no-host", action="store_true", help="skip the host-tier row")
    ap.add_argument("--device", choices=["cpu", "cuda", "auto"], help="the servers' --device (default: augur's)")
    ap.add_argument("--dir", default=os.path.join(ROOT, "build"), help="where the record directories go")
    a = ap.parse_args()
    lengths = [int(x) for x in a.lengths.split(",") if x] + ([16384] if a.long else [])
    os.makedirs(a.dir, exist_ok=True)
    print(f"# cache_bench {time.strftime('%Y-%m-%d %H:%M')}, model {os.path.basename(a.model)}, {a.t} threads, "
          f"device {a.device or 'default'}, load {os.getloadavg()[0]:.2f}")
    print(f"# CPU: {cpu_name()}, {os.cpu_count()} logical CPUs; ISA flags: {' '.join(cpu_isa_flags()) or 'none'}")
    fs = subprocess.run(["df", "-T", a.dir], capture_output=True, text=True).stdout.splitlines()[-1:]
    print(f"# records in {a.dir} ({' '.join(fs[0].split()[:2]) if fs else '?'})")
    peer_why = None if a.no_peer else peer_check()
    if not a.no_peer:
        print("# " + peer_build_report().replace("\n", "\n# "))
        if peer_why:
            print(f"# peer skipped: {peer_why}")
    rows, peers = [], {}
    for li, L in enumerate(lengths):
        r = bench_length(a, L, li + 1, a.dir)
        rows.append(r)
        if not a.no_peer and not peer_why:
            peers[L] = bench_peer(a, r["prompt"], a.dir)
        print(f"# done {L}: load {os.getloadavg()[0]:.2f}", flush=True)
    model_dd = dd_read([a.model], direct=True, limit_mb=512)

    print("\n## TTFT (s; x = cold / hit)\n")
    print("| prompt tokens | cold prefill | memory hit | host hit | disk hit, page cache | disk hit, evicted | "
          "cached (mem/host (of which from host)/disk) |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        h = r["host"]
        hs = f"{h[0]:.3f} ({r['cold'] / h[0]:.0f}x)" if h else "-"
        hc = f"{h[1]} ({h[2]})" if h else "-"
        print(f"| {r['tokens']} | {r['cold']:.2f} | {r['mem']:.3f} ({r['cold'] / r['mem']:.0f}x) | {hs} | "
              f"{r['disk_warm']:.3f} ({r['cold'] / r['disk_warm']:.0f}x) | "
              f"{r['disk_cold']:.3f} ({r['cold'] / r['disk_cold']:.0f}x) | "
              f"{r['cached_mem']}/{hc}/{r['cached_disk_cold']} |")

    print("\n## Restore throughput vs dd over the same records (MB/s)\n")
    print(f"dd iflag=direct over the model file (512 MB, sequential): "
          f"{model_dd:.0f} MB/s" if model_dd else "dd iflag=direct over the model file: unsupported here")
    print()
    print("| prompt tokens | records (MB) | restore, page cache | dd, page cache | ratio | restore, evicted | "
          "dd, evicted | ratio | dd iflag=direct |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        def ratio(x, y):
            return f"{x / y:.2f}" if x and y else "-"

        def mbps(x):
            return f"{x:.0f}" if x else "-"
        print(f"| {r['tokens']} | {r['records']} ({r['mb']:.1f}) | {mbps(r['restore_mbps_warm'])} | "
              f"{mbps(r['dd_warm'])} | {ratio(r['restore_mbps_warm'], r['dd_warm'])} | "
              f"{mbps(r['restore_mbps_cold'])} | {mbps(r['dd_cold'])} | {ratio(r['restore_mbps_cold'], r['dd_cold'])} | "
              f"{mbps(r['dd_direct'])} |")
    if any(r["pages_left_after_evict"] for r in rows):
        print("(warning: some record pages stayed cached after eviction: "
              f"{[r['pages_left_after_evict'] for r in rows]} bytes)")

    if not a.no_peer:
        print("\n## llama.cpp peer (llama-cpp-python, same GGUF, threads and text; state file save/load)\n")
        if peer_why:
            print(f"skipped: {peer_why}")
        else:
            print("| prompt tokens (llama.cpp) | llama.cpp cold s | state file MB | load + last token, page cache s | "
                  "evicted s | augur disk hit, page cache s | evicted s | augur / llama.cpp (cache, evicted) |")
            print("|---|---|---|---|---|---|---|---|")
            for r in rows:
                p = peers.get(r["L"], {})
                if "error" in p:
                    print(f"| {r['tokens']} | {p['error']} |")
                    continue
                print(f"| {p['tokens']} | {p['cold_s']:.2f} | {p['state_mb']:.1f} | {p['load_warm_s']:.3f} | "
                      f"{p['load_cold_s']:.3f} | {r['disk_warm']:.3f} | {r['disk_cold']:.3f} | "
                      f"{p['load_warm_s'] / r['disk_warm']:.2f}x, {p['load_cold_s'] / r['disk_cold']:.2f}x faster |")

    if a.wb_rounds > 0:
        wb = writer_cost(a, a.dir)
        print(f"\n## Write-behind cost on decode ({a.wb_prompt}-token prompts written behind, "
              f"{a.wb_tokens}-token decodes)\n")
        print("tok/s of the decode tokens that arrived while the writer wrote (B); the same tokens of a decode once "
              "it was done (C, same server); the same tokens on a --no-kv-disk server (B, C)\n")
        print("| round | B, writer writing | C, writer idle | B / C | --no-kv-disk B | --no-kv-disk C | "
              "B / --no-kv-disk B | writer: MB in s, CPU s | tokens timed |")
        print("|---|---|---|---|---|---|---|---|---|")
        for i, w in enumerate(wb):
            if w is None:
                print(f"| {i + 1} | the writer did not write during 3 tokens of the decode | | | | | | | |")
                continue
            print(f"| {i + 1} | {w['busy']:.2f} | {w['idle']:.2f} | {w['busy'] / w['idle']:.3f} | {w['off_b']:.2f} | "
                  f"{w['off_c']:.2f} | {w['busy'] / w['off_b']:.3f} | {w['mb']:.1f} in {w['write_s']:.2f}, "
                  f"{w['cpu_s']:.2f} | {w['tokens']} |")
        ok = [w for w in wb if w]
        if ok:
            print(f"\nmedians: B / C {median([w['busy'] / w['idle'] for w in ok]):.3f}, B / --no-kv-disk B "
                  f"{median([w['busy'] / w['off_b'] for w in ok]):.3f}; the writer's CPU time over the decode "
                  f"window {median([w['cpu_s'] / w['window_s'] for w in ok]) * 100:.1f}% of one core "
                  f"({median([w['cpu_s'] / w['mb'] * 1e3 for w in ok]):.1f} ms per MB)")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--peer-child":
        m, t, tp, reps, d = sys.argv[2:7]
        peer_child(m, int(t), tp, int(reps), d)
        sys.exit(0)
    sys.exit(main())
