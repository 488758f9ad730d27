#!/usr/bin/env python3
"""Serving benchmark: a load generator in the manner of `vllm bench serve`,
against augur and llama.cpp's llama-server (or any OpenAI-compatible server).

Each request is a /v1/completions call with a token-id prompt ("prompt":
[ids...], random ids from a seeded generator, so no two requests share a
prefix), temperature 0, ignore_eos and max_tokens = the output length, so that
every request generates exactly its output length whatever the model says
(random-weight models too). Streaming (SSE) by default, with
stream_options.include_usage.

Datasets (--dataset, a comma list):
  fixed      every request --prompt-len tokens in, --output-len out (128/128)
  fixed:P:O  the same with P and O given here
  sharegpt   lengths drawn from a fixed-seed lognormal shaped like ShareGPT's
             (a few hundred prompt tokens, ~200 output tokens, a long tail):
             prompt lognormal(median 128, sigma 1.0), output lognormal(median
             128, sigma 0.9), each clipped to [4, 1024], the pair to the
             context (1000 draws: prompt mean 196, median 126, p90 458;
             output mean 183, median 129, p90 395). ShareGPT itself cannot be
             downloaded here: this is a stand-in of its shape, not a fit.
Loads: --concurrency 1,8,32,64,128 (closed loop: N clients, each sending its
next request when the last one ends; max(8, 2 x N) requests a run unless
--requests) or --rate R1,R2 (Poisson arrivals of R requests/s, 64 requests,
optionally capped by --max-concurrency); --duration S stops sending after S
seconds. Every dataset runs at every load, or --runs lists the runs.

Per run (one dataset at one load): requests completed and failed, duration
(first send to last byte), requests/s, output tok/s, total tok/s, prompt and
output token totals (from the usage the server reports), TTFT mean/p50/p99,
ITL p50/p99 (gaps between the chunks that carry text, over all requests),
TPOT p50/p99 ((end - first token) / (output tokens - 1) per request), E2E
p50 (without streaming, --no-stream or /nostream, TTFT is the whole
request's latency and there is no ITL or TPOT), and CPU use in cores (CPU seconds / wall seconds) of the server, of
this client (near 1.0 would mean the client is the bottleneck) and of the
rest of the machine ("others": noise on a shared machine; --wait-quiet
waits for a quiet machine before each run). One JSON line per run (stdout, and
--jsonl FILE), then a table of medians over --repeat rounds (with the range),
and with several servers the ratios of the first to each other.

Servers (--server, repeatable; NAME's prefix "augur" or "llama" says which
kind it is and how it is started):
  --server augur                     start build/augur serve
  --server augur-base=/tmp/b/augur   start this binary (a label of your own)
  --server llama-server              start bench/serve_peer.sh's llama-server
  --server llama-server=PATH         start this llama-server
  --server augur=http://127.0.0.1:8080   use a running server (no start)
Started servers get the same model (-m), slots (--parallel, default the
largest concurrency), context per slot (--ctx), threads (-t) and device:
  augur:        serve -m M --port 0 --parallel P --ctx C [-t T] [--device D]
                --no-webui --max-queue 4096 --max-connections 1024, and
                --augur-args (default --no-kv-disk)
  llama-server: -m M --port X -np P -c P*C -cb -fa on [-t T] [-ngl 99 with
                --device cuda, else -ngl 0] --no-webui, and --llama-args
                (default --cache-ram 0)
Neither of those caches could serve a request here (no two requests share
a prefix), so both are off; each server's in-memory prefix reuse stays as
it is. Each server is started afresh for every round, warmed up with one
short request, and stopped after its runs; its log goes to
build/serve_bench_logs/. Servers run one at a time.

Examples:
  # the CPU measurement of bench/RESULTS.md (2 cores, SmolLM2)
  bench/serve_bench.py --server augur --server llama-server -t 2 --parallel 16 \\
      --concurrency 1,4,16 --dataset fixed,sharegpt --repeat 3 --markdown
  # the GPU sweep (bench/gpu_serve.sh runs this and more)
  bench/serve_bench.py --server augur=build/cuda/augur --device cuda -m 8B.gguf \\
      --parallel 64 --concurrency 1,8,32,64 --dataset fixed,sharegpt
  # a table from earlier JSON lines (several files: one table)
  bench/serve_bench.py --report build/a.jsonl build/b.jsonl --markdown
Standard library only; loopback or any URL.
"""
import argparse
import asyncio
import json
import math
import os
import random
import resource
import signal
import socket
import statistics
import subprocess
import sys
import time
import urllib.parse
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_MODEL = os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")
LOG_DIR = os.path.join(ROOT, "build", "serve_bench_logs")


# ---------------------------------------------------------------- datasets

def parse_datasets(spec, prompt_len, output_len):
    out = []
    for d in spec.split(","):
        d = d.strip()
        if d == "fixed":
            out.append(("fixed", prompt_len, output_len))
        elif d.startswith("fixed:"):
            _, p, o = d.split(":")
            out.append(("fixed", int(p), int(o)))
        elif d == "sharegpt":
            out.append(("sharegpt", None, None))
        else:
            raise SystemExit(f"unknown dataset {d!r} (fixed, fixed:P:O, sharegpt)")
    return out


def parse_run(spec, args):
    """DATASET@cN or DATASET@rR, then /nostream optionally: one run."""
    try:
        what, _, how = spec.partition("@")
        how, _, flag = how.partition("/")
        ds = parse_datasets(what, args.prompt_len, args.output_len)[0]
        kind, v = ("concurrency", int(how[1:])) if how[0] == "c" else ("rate", float(how[1:]))
        assert how[0] in "cr" and flag in ("", "nostream")
    except (ValueError, IndexError, AssertionError):
        raise SystemExit(f"--runs: bad item {spec!r} (e.g. fixed:8:512@c64, sharegpt@r4, fixed@c1/nostream)")
    return ds, kind, v, flag != "nostream"


def dataset_label(ds):
    kind, p, o = ds
    return f"fixed {p}/{o}" if kind == "fixed" else kind


def make_requests(ds, n, ctx, seed_key, vocab_lo, vocab_hi):
    """n (prompt ids, output length) pairs, the same for every server given
    the same seed_key (which differs between runs, so that a server never sees
    a prompt twice: no prefix-cache hits)."""
    rng = random.Random(seed_key)
    kind, p, o = ds
    reqs = []
    for _ in range(n):
        if kind == "fixed":
            pl, ol = p, o
        else:
            pl = min(1024, max(4, int(round(rng.lognormvariate(math.log(128), 1.0)))))
            ol = min(1024, max(4, int(round(rng.lognormvariate(math.log(128), 0.9)))))
            room = ctx - 8  # the pair must fit one slot's context
            if pl + ol > room:
                ol = max(4, room - pl)
                pl = min(pl, room - ol)
        reqs.append(([rng.randrange(vocab_lo, vocab_hi) for _ in range(pl)], ol))
    return reqs


# ---------------------------------------------------------------- HTTP client

async def http_post(host, port, path, body, on_data):
    """POSTs body (bytes); calls on_data(bytes, arrival_time) for each piece
    of the response body as it arrives (HTTP/1.1 chunked, Content-Length or
    read to close). Returns the status code; a non-200 body is returned too."""
    reader, writer = await asyncio.open_connection(host, port, limit=1 << 22)
    try:
        writer.write((f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
                      f"Accept: text/event-stream\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n"
                      ).encode() + body)
        status_line = await reader.readline()
        if not status_line:
            raise ConnectionError("the server closed the connection without a response")
        status = int(status_line.split(None, 2)[1])
        headers = {}
        while True:
            line = await reader.readline()
            if line in (b"\r\n", b"\n", b""):
                break
            k, _, v = line.decode("latin-1").partition(":")
            headers[k.strip().lower()] = v.strip().lower()
        if status != 200:
            err = await reader.read(400)
            return status, err
        if "chunked" in headers.get("transfer-encoding", ""):
            while True:
                size_line = await reader.readline()
                if not size_line:
                    raise ConnectionError("the stream ended inside a chunked body")
                size = int(size_line.split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    break
                data = await reader.readexactly(size + 2)
                on_data(data[:-2], time.perf_counter())
        elif "content-length" in headers:
            left = int(headers["content-length"])
            while left > 0:
                data = await reader.read(min(left, 1 << 16))
                if not data:
                    raise ConnectionError("short body")
                left -= len(data)
                on_data(data, time.perf_counter())
        else:
            while True:
                data = await reader.read(1 << 16)
                if not data:
                    break
                on_data(data, time.perf_counter())
        return status, None
    finally:
        writer.close()
        try:
            await writer.wait_closed()
        except (ConnectionError, OSError):
            pass


class Stream:
    """Splits an SSE body into events and notes when text-carrying chunks
    arrived. A chunk counts as a token arrival when its choice carries
    non-empty text; the usage comes from the event that has one (augur: a last
    event with empty choices; llama-server: the last choice's event)."""

    def __init__(self):
        self.buf = b""
        self.times = []
        self.usage = None
        self.error = None
        self.done = False
        self.chunks = 0

    def feed(self, data, t):
        self.buf += data
        while True:
            i = self.buf.find(b"\n")
            if i < 0:
                return
            line, self.buf = self.buf[:i].rstrip(b"\r"), self.buf[i + 1:]
            if not line.startswith(b"data:"):
                continue
            payload = line[5:].strip()
            if payload == b"[DONE]":
                self.done = True
                continue
            ev = json.loads(payload)
            if "error" in ev:
                self.error = str(ev["error"])[:300]
                continue
            if ev.get("usage"):
                self.usage = ev["usage"]
            for ch in ev.get("choices") or ():
                self.chunks += 1
                text = ch.get("text")
                if text is None:
                    text = (ch.get("delta") or {}).get("content")
                if text:
                    self.times.append(t)


class Whole:
    def __init__(self):
        self.parts = []
        self.t_end = None

    def feed(self, data, t):
        self.parts.append(data)
        self.t_end = t


async def one_request(host, port, prompt, out_len, stream, model_name, timeout):
    body = {"prompt": prompt, "max_tokens": out_len, "temperature": 0, "ignore_eos": True, "stream": stream}
    if model_name:
        body["model"] = model_name
    if stream:
        body["stream_options"] = {"include_usage": True}
    raw = json.dumps(body, separators=(",", ":")).encode()
    rec = {"prompt_len": len(prompt), "output_len": out_len}
    sink = Stream() if stream else Whole()
    t0 = time.perf_counter()
    try:
        status, err = await asyncio.wait_for(http_post(host, port, "/v1/completions", raw, sink.feed), timeout)
    except (OSError, ConnectionError, asyncio.TimeoutError, asyncio.IncompleteReadError, ValueError) as e:
        rec["error"] = f"{type(e).__name__}: {e}"
        return rec
    t_end = time.perf_counter()
    rec.update(t0=t0, t_end=t_end)
    if status != 200:
        rec["error"] = f"HTTP {status}: {err!r}"
        return rec
    if stream:
        if sink.error:
            rec["error"] = sink.error
            return rec
        if not sink.done:
            rec["error"] = "the stream ended without [DONE]"
        rec["times"] = sink.times
        rec["chunks"] = sink.chunks
        usage = sink.usage
    else:
        j = json.loads(b"".join(sink.parts))
        usage = j.get("usage")
        rec["times"] = [t_end]
        rec["chunks"] = 1
    if not usage:
        rec["error"] = "no usage in the response"
        return rec
    rec["prompt_tokens"] = usage.get("prompt_tokens")
    rec["completion_tokens"] = usage.get("completion_tokens")
    return rec


async def closed_loop(host, port, reqs, conc, stream, model_name, timeout, duration):
    results = []
    it = iter(reqs)
    t_start = time.perf_counter()

    async def client():
        for prompt, ol in it:
            if duration and time.perf_counter() - t_start > duration:
                return
            results.append(await one_request(host, port, prompt, ol, stream, model_name, timeout))

    await asyncio.gather(*(client() for _ in range(conc)))
    return results


async def poisson(host, port, reqs, rate, max_conc, stream, model_name, timeout, duration, seed_key):
    rng = random.Random(seed_key + ":arrivals")
    sem = asyncio.Semaphore(max_conc) if max_conc else None

    async def run(prompt, ol):
        if sem:
            async with sem:
                return await one_request(host, port, prompt, ol, stream, model_name, timeout)
        return await one_request(host, port, prompt, ol, stream, model_name, timeout)

    tasks = []
    t_start = time.perf_counter()
    t_next = t_start
    for prompt, ol in reqs:
        now = time.perf_counter()
        if duration and now - t_start > duration:
            break
        if t_next > now:
            await asyncio.sleep(t_next - now)
        tasks.append(asyncio.create_task(run(prompt, ol)))
        t_next += rng.expovariate(rate)
    return list(await asyncio.gather(*tasks))


# ---------------------------------------------------------------- statistics

def pct(xs, p):
    """Percentile with linear interpolation (numpy's default)."""
    if not xs:
        return float("nan")
    xs = sorted(xs)
    k = (len(xs) - 1) * p / 100
    lo = math.floor(k)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def summarize(results, stream):
    ok = [r for r in results if "error" not in r]
    bad = [r for r in results if "error" in r]
    out = {"completed": len(ok), "failed": len(bad)}
    if bad:
        out["first_error"] = bad[0]["error"][:300]
    if not ok:
        return out
    t0 = min(r["t0"] for r in results if "t0" in r)
    t1 = max(r["t_end"] for r in results if "t_end" in r)
    dur = t1 - t0
    n_in = sum(r["prompt_tokens"] for r in ok)
    n_out = sum(r["completion_tokens"] for r in ok)
    ttft = [(r["times"][0] - r["t0"]) * 1e3 for r in ok if r["times"]]
    itl = [(b - a) * 1e3 for r in ok for a, b in zip(r["times"], r["times"][1:])]
    tpot = [(r["t_end"] - r["times"][0]) * 1e3 / (r["completion_tokens"] - 1)
            for r in ok if r["times"] and r["completion_tokens"] > 1]
    e2e = [(r["t_end"] - r["t0"]) * 1e3 for r in ok]
    first = min(ok, key=lambda r: r["t0"])  # the run's first request sent: a cold start shows in its TTFT
    out.update({
        "duration_s": round(dur, 3),
        "request_throughput": round(len(ok) / dur, 4),
        "output_throughput": round(n_out / dur, 2),
        "total_token_throughput": round((n_in + n_out) / dur, 2),
        "total_input_tokens": n_in,
        "total_output_tokens": n_out,
        "expected_output_tokens": sum(r["output_len"] for r in ok),
        "length_mismatches": sum(r["completion_tokens"] != r["output_len"] for r in ok),
        "prompt_mismatches": sum(r["prompt_tokens"] != r["prompt_len"] for r in ok),
        "text_chunks_per_token": round(sum(len(r["times"]) for r in ok) / max(1, n_out), 4) if stream else None,
        "mean_ttft_ms": round(statistics.mean(ttft), 2) if ttft else None,
        "p50_ttft_ms": round(pct(ttft, 50), 2), "p99_ttft_ms": round(pct(ttft, 99), 2),
        "max_ttft_ms": round(max(ttft), 2) if ttft else None,
        "first_ttft_ms": round((first["times"][0] - first["t0"]) * 1e3, 2) if first["times"] else None,
        "p50_itl_ms": round(pct(itl, 50), 3) if stream else None,
        "p99_itl_ms": round(pct(itl, 99), 3) if stream else None,
        "p50_tpot_ms": round(pct(tpot, 50), 3) if stream else None,
        "p99_tpot_ms": round(pct(tpot, 99), 3) if stream else None,
        "p50_e2el_ms": round(pct(e2e, 50), 2),
    })
    return out


# ---------------------------------------------------------------- servers

def cpu_seconds(pid=None):
    """Busy CPU seconds of the whole machine (/proc/stat), or of one process
    (its threads included); None where /proc cannot say."""
    hz = os.sysconf("SC_CLK_TCK")
    try:
        if pid is None:
            with open("/proc/stat") as f:
                v = [int(x) for x in f.readline().split()[1:]]
            return (sum(v[:8]) - v[3] - v[4]) / hz  # all but idle and iowait (guest time is in user)
        with open(f"/proc/{pid}/stat") as f:
            v = f.read().rsplit(")", 1)[1].split()
        return (int(v[11]) + int(v[12])) / hz  # utime, stime
    except (OSError, ValueError, IndexError):
        return None


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def get(url, timeout=5):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.status, r.read()


class Server:
    def __init__(self, spec, args):
        name, _, where = spec.partition("=")
        self.name = name
        if name.startswith("augur"):
            self.kind = "augur"
        elif name.startswith("llama"):
            self.kind = "llama-server"
        else:
            raise SystemExit(f"--server {spec}: the name must start with 'augur' or 'llama'")
        self.url = where if where.startswith("http") else None
        self.bin = None if self.url else (where or self.default_bin())
        self.args = args
        self.proc = None
        self.log = None
        self.host = self.port = None

    def default_bin(self):
        if self.kind == "augur":
            return os.environ.get("AUGUR_BIN", os.path.join(ROOT, "build", "augur"))
        p = subprocess.run(["bash", os.path.join(ROOT, "bench", "serve_peer.sh"), "path"], capture_output=True,
                           text=True)
        if p.returncode != 0:
            raise SystemExit("llama-server is not built: bench/serve_peer.sh build (or --server llama-server=PATH)")
        return p.stdout.strip()

    def command(self, parallel):
        a = self.args
        if self.kind == "augur":
            cmd = [self.bin, "serve", "-m", a.model, "--host", "127.0.0.1", "--port", "0", "--parallel", str(parallel),
                   "--ctx", str(a.ctx), "--no-webui", "--max-queue", "4096", "--max-connections", "1024"]
            if a.threads:
                cmd += ["-t", str(a.threads)]
            if a.device:
                cmd += ["--device", a.device]
            return cmd + a.augur_args.split()
        self.port = free_port()
        cmd = [self.bin, "-m", a.model, "--host", "127.0.0.1", "--port", str(self.port), "-np", str(parallel),
               "-c", str(parallel * a.ctx), "-cb", "-fa", "on", "-ngl", "99" if a.device == "cuda" else "0",
               "--no-webui"]
        if a.threads:
            cmd += ["-t", str(a.threads)]
        return cmd + a.llama_args.split()

    def start(self, parallel, tag):
        if self.url:
            u = urllib.parse.urlparse(self.url)
            self.host, self.port = u.hostname, u.port or 80
            return
        os.makedirs(LOG_DIR, exist_ok=True)
        cmd = self.command(parallel)
        self.log_path = os.path.join(LOG_DIR, f"{self.name}-{tag}.log")
        self.log = open(self.log_path, "w")
        self.log.write(" ".join(cmd) + "\n")
        self.log.flush()
        self.cmdline = " ".join(os.path.basename(c) if i == 0 else c for i, c in enumerate(cmd))
        if self.kind == "augur":
            self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=self.log)
            line = self.proc.stdout.readline().decode()
            if "serving" not in line:
                self.stop()
                raise SystemExit(f"{self.name} did not start ({line!r}); log {self.log_path}")
            self.host, self.port = "127.0.0.1", int(line.rsplit(":", 1)[1])
        else:
            self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT)
            self.host = "127.0.0.1"
            t = time.time()
            while True:
                if self.proc.poll() is not None:
                    raise SystemExit(f"{self.name} exited ({self.proc.returncode}); log {self.log_path}")
                try:
                    if get(f"http://127.0.0.1:{self.port}/health")[0] == 200:
                        break
                except OSError:
                    pass
                if time.time() - t > 600:
                    self.stop()
                    raise SystemExit(f"{self.name} not ready after 600 s; log {self.log_path}")
                time.sleep(0.2)

    def stop(self):
        if self.proc:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            self.proc = None
        if self.log:
            self.log.close()
            self.log = None


# ---------------------------------------------------------------- report

KEYS = ["request_throughput", "output_throughput", "total_token_throughput", "mean_ttft_ms", "p50_ttft_ms",
        "p99_ttft_ms", "p50_itl_ms", "p99_itl_ms", "p50_tpot_ms", "p99_tpot_ms", "p50_e2el_ms", "client_cpu",
        "server_cpu", "others_cpu",
        "total_input_tokens", "total_output_tokens", "completed", "failed", "length_mismatches"]


def group(records):
    """Medians over rounds per (server, dataset, load, stream); servers and
    datasets in first-seen order, loads by kind and size."""
    groups = {}
    for r in records:
        k = (r["server"], r["dataset"], r["load"], r["stream"])
        groups.setdefault(k, []).append(r)
    s_order = list(dict.fromkeys(r["server"] for r in records))
    d_order = list(dict.fromkeys(r["dataset"] for r in records))

    def load_key(load):
        kind, _, v = load.partition("=")
        return kind, float(v.rstrip("/s"))
    rows = []
    for k in sorted(groups, key=lambda k: (s_order.index(k[0]), d_order.index(k[1]), not k[3], load_key(k[2]))):
        rs = groups[k]
        row = {"server": k[0], "dataset": k[1], "load": k[2], "stream": k[3], "rounds": len(rs)}
        for key in KEYS:
            v = [r[key] for r in rs if r.get(key) is not None]
            if v:
                row[key] = statistics.median(v)
                row[key + "_range"] = (min(v), max(v))
        rows.append(row)
    return rows


def fmt(x, nd=1):
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    return f"{x:.{nd}f}"


def spread(row, key, nd=1):
    if key not in row:
        return "-"
    lo, hi = row[key + "_range"]
    s = fmt(row[key], nd)
    return s + (f" ({fmt(lo, nd)}-{fmt(hi, nd)})" if row["rounds"] > 1 else "")


def print_table(records, markdown, max_others=None):
    if max_others is not None:
        noisy = [r for r in records if (r.get("others_cpu") or 0) > max_others]
        if noisy:
            print(f"(left out: {len(noisy)} of {len(records)} runs during which the rest of the machine used more "
                  f"than {max_others} cores)")
        records = [r for r in records if (r.get("others_cpu") or 0) <= max_others]
    rows = group(records)
    head = ["server", "dataset", "load", "rounds", "reqs", "req/s", "out tok/s", "TTFT p50 / p99 ms", "ITL p50 / p99 ms",
            "TPOT p50 ms", "prompt / output tokens", "CPU server / client / others"]
    lines = []
    for r in rows:
        stream = "" if r["stream"] else " (no stream)"
        lines.append([r["server"], r["dataset"] + stream, r["load"], str(r["rounds"]), f"{r.get('completed', 0):.0f}",
                      fmt(r.get("request_throughput"), 2), spread(r, "output_throughput"),
                      f"{fmt(r.get('p50_ttft_ms'), 0)} / {spread(r, 'p99_ttft_ms', 0)}",
                      f"{fmt(r.get('p50_itl_ms'), 1)} / {spread(r, 'p99_itl_ms', 1)}",
                      fmt(r.get("p50_tpot_ms"), 1),
                      f"{r.get('total_input_tokens', 0):.0f} / {r.get('total_output_tokens', 0):.0f}",
                      f"{fmt(r.get('server_cpu'), 2)} / {fmt(r.get('client_cpu'), 2)} / {fmt(r.get('others_cpu'), 2)}"])
    emit(head, lines, markdown)
    if any(r["rounds"] > 1 for r in rows):
        print("(medians over the rounds; ranges in parentheses)")
    servers = list(dict.fromkeys(r["server"] for r in rows))
    for other in servers[1:]:
        base = servers[0]
        by = {(r["server"], r["dataset"], r["load"], r["stream"]): r for r in rows}
        # a round is one seed's round of one file: the same requests for every server
        per_round = {(r["server"], r["dataset"], r["load"], r["stream"], (r.get("seed"), r.get("_file"), r["round"])): r
                     for r in records}
        rl = []
        for r in rows:
            if r["server"] != base:
                continue
            o = by.get((other, r["dataset"], r["load"], r["stream"]))
            if not o:
                continue

            def ratio(key):
                # the median of the rounds' ratios where both ran a round
                # (the same requests), else the ratio of the medians
                pairs = []
                for (srv, d, ld, st, rnd), x in per_round.items():
                    y = per_round.get((other, d, ld, st, rnd))
                    if srv == base and (d, ld, st) == (r["dataset"], r["load"], r["stream"]) and y \
                            and x.get(key) and y.get(key):
                        pairs.append(x[key] / y[key])
                if pairs:
                    return f"{statistics.median(pairs):.2f}x"
                a, b = r.get(key), o.get(key)
                return f"{a / b:.2f}x" if a and b else "-"
            rl.append([r["dataset"] + ("" if r["stream"] else " (no stream)"), r["load"],
                       ratio("output_throughput"), ratio("request_throughput"), ratio("p50_ttft_ms"),
                       ratio("p99_ttft_ms"), ratio("p50_itl_ms"), ratio("p99_itl_ms"), ratio("p50_tpot_ms")])
        if rl:
            print(f"\n{base} / {other}, median of the rounds' ratios (throughput above 1 and latency below 1 "
                  f"favour {base}):")
            emit(["dataset", "load", "out tok/s", "req/s", "TTFT p50", "TTFT p99", "ITL p50", "ITL p99", "TPOT p50"],
                 rl, markdown)


def emit(head, lines, markdown):
    if markdown:
        print("| " + " | ".join(head) + " |")
        print("|" + "|".join("---" for _ in head) + "|")
        for ln in lines:
            print("| " + " | ".join(ln) + " |")
        return
    w = [max(len(h), *(len(ln[i]) for ln in lines)) if lines else len(h) for i, h in enumerate(head)]
    print("  ".join(h.ljust(w[i]) for i, h in enumerate(head)))
    for ln in lines:
        print("  ".join(c.ljust(w[i]) for i, c in enumerate(ln)))


# ---------------------------------------------------------------- main

def wait_quiet(pid, limit, max_wait):
    """Waits until the rest of the machine (all but this process and the
    server) used less than `limit` cores over 2 s, at most max_wait seconds;
    returns the seconds waited."""
    t0 = time.time()
    while time.time() - t0 < max_wait:
        a, b, c = cpu_seconds(), cpu_seconds(pid) if pid else 0.0, time.process_time()
        time.sleep(2)
        a1, b1, c1 = cpu_seconds(), cpu_seconds(pid) if pid else 0.0, time.process_time()
        if a is None or b is None or b1 is None or (a1 - a) - (b1 - b) - (c1 - c) < 2 * limit:
            break
    return round(time.time() - t0, 1)


def one_run(srv, ds, kind, v, stream, rnd, parallel, args):
    """One dataset at one load against a started server: its JSON record."""
    vocab_lo, vocab_hi = (int(x) for x in args.vocab.split(":"))
    load = f"c={v}" if kind == "concurrency" else f"rate={v:g}/s"
    key = f"{args.seed}:{rnd}:{dataset_label(ds)}:{load}:{stream}"
    if args.requests:
        n = args.requests
    elif kind == "rate":
        n = 64
    else:
        n = max(args.min_requests, args.requests_per_client * v)
    reqs = make_requests(ds, n, args.ctx, key, vocab_lo, vocab_hi)
    pid = srv.proc.pid if srv.proc else None
    waited = wait_quiet(pid, args.wait_quiet, args.wait_quiet_max) if args.wait_quiet else None
    ru0 = resource.getrusage(resource.RUSAGE_SELF)
    sys0, srv0 = cpu_seconds(), cpu_seconds(pid) if pid else None
    w0 = time.perf_counter()
    if kind == "concurrency":
        res = asyncio.run(closed_loop(srv.host, srv.port, reqs, v, stream, args.model_name, args.timeout,
                                      args.duration))
    else:
        res = asyncio.run(poisson(srv.host, srv.port, reqs, v, args.max_concurrency, stream, args.model_name,
                                  args.timeout, args.duration, key))
    wall = time.perf_counter() - w0
    ru1 = resource.getrusage(resource.RUSAGE_SELF)
    sys1, srv1 = cpu_seconds(), cpu_seconds(pid) if pid else None
    cpu = (ru1.ru_utime - ru0.ru_utime) + (ru1.ru_stime - ru0.ru_stime)
    rec = {"server": srv.name, "kind": srv.kind, "model": os.path.basename(args.model),
           "dataset": dataset_label(ds), "load": load, kind: v, "stream": stream, "seed": args.seed, "round": rnd,
           "parallel": None if srv.url else parallel, "ctx": None if srv.url else args.ctx,
           "threads": args.threads or None, "device": args.device or "cpu",
           "command": getattr(srv, "cmdline", srv.url)}
    rec.update(summarize(res, stream))
    # CPU use in cores over the run: the client, the server and everything
    # else on the machine (others > 0 on a shared machine: noise)
    rec["client_cpu"] = round(cpu / wall, 4)
    if srv0 is not None and srv1 is not None:
        rec["server_cpu"] = round((srv1 - srv0) / wall, 3)
        if sys0 is not None and sys1 is not None:
            rec["others_cpu"] = round(max(0.0, (sys1 - sys0) - (srv1 - srv0) - cpu) / wall, 3)
    if waited is not None:
        rec["waited_for_quiet_s"] = waited
    with open("/proc/loadavg") as f:
        rec["loadavg_1min"] = float(f.read().split()[0])
    rec["date"] = time.strftime("%Y-%m-%d %H:%M:%S")
    return rec


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--server", action="append", help="NAME, NAME=BINARY or NAME=URL (repeatable; default augur)")
    ap.add_argument("-m", "--model", default=DEFAULT_MODEL)
    ap.add_argument("--parallel", type=int, default=0, help="slots of a started server (default: largest concurrency)")
    ap.add_argument("--ctx", type=int, default=1024, help="context per slot (llama-server gets -c parallel*ctx)")
    ap.add_argument("-t", "--threads", type=int, default=0, help="server threads (default: the server's)")
    ap.add_argument("--device", default="", help="cuda: augur --device cuda, llama-server -ngl 99")
    ap.add_argument("--augur-args", default="--no-kv-disk",
                    help="more arguments for augur serve (default --no-kv-disk: no disk tier, which no request "
                         "here could use)")
    ap.add_argument("--llama-args", default="--cache-ram 0",
                    help="more arguments for llama-server (default --cache-ram 0: no host-memory prompt cache, "
                         "which no request here could use and whose copies cost time)")
    ap.add_argument("--dataset", default="fixed", help="fixed, fixed:P:O, sharegpt (comma list)")
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--concurrency", default="", help="closed-loop client counts (default 1,8,32,64,128)")
    ap.add_argument("--rate", default="", help="Poisson request rates per second (instead of --concurrency)")
    ap.add_argument("--max-concurrency", type=int, default=0, help="cap on requests in flight with --rate")
    ap.add_argument("--requests", type=int, default=0,
                    help="requests per run (default: max(--min-requests, --requests-per-client x concurrency); "
                         "with --rate: 64)")
    ap.add_argument("--requests-per-client", type=int, default=2)
    ap.add_argument("--min-requests", type=int, default=8)
    ap.add_argument("--duration", type=float, default=0, help="stop sending new requests after S seconds of a run")
    ap.add_argument("--repeat", type=int, default=1, help="rounds (each server restarted per round); medians")
    ap.add_argument("--no-stream", action="store_true")
    ap.add_argument("--runs", default="",
                    help="instead of --dataset x --concurrency/--rate: a space-separated list of runs, each "
                         "DATASET@cN or DATASET@rR, /nostream optionally (e.g. 'fixed:8:512@c64 fixed@c1/nostream')")
    ap.add_argument("--seed", default="0")
    ap.add_argument("--timeout", type=float, default=1800, help="per request, seconds")
    ap.add_argument("--vocab", default="1000:32000", help="prompt token ids are drawn from [LO, HI)")
    ap.add_argument("--model-name", default="", help="'model' field sent (default none)")
    ap.add_argument("--wait-quiet", type=float, default=0, metavar="CORES",
                    help="before each run, wait until the rest of the machine used fewer than CORES cores over 2 s "
                         "(a shared machine's noise; at most --wait-quiet-max seconds, then run anyway)")
    ap.add_argument("--wait-quiet-max", type=float, default=300)
    ap.add_argument("--max-others", type=float, default=None, metavar="CORES",
                    help="the table leaves out runs during which the rest of the machine used more than CORES cores")
    ap.add_argument("--jsonl", help="append the JSON lines to this file too")
    ap.add_argument("--markdown", action="store_true")
    ap.add_argument("--report", nargs="+", metavar="JSONL", help="no runs: the table of these files' lines")
    args = ap.parse_args()
    # stopped by SIGTERM or SIGINT (even where a background shell ignores
    # SIGINT): exit through the finally clauses, which stop the servers
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda s, f: sys.exit(f"serve_bench: signal {s}"))

    if args.report:
        recs = []
        for i, f in enumerate(args.report):
            with open(f) as fh:
                recs += [dict(json.loads(ln), _file=i) for ln in fh if ln.startswith("{")]
        print_table(recs, args.markdown, args.max_others)
        return 0

    if args.rate and args.concurrency:
        raise SystemExit("--rate or --concurrency, not both")
    if args.runs:
        runs = [parse_run(x, args) for x in args.runs.split()]
    else:
        loads = ([("rate", float(x)) for x in args.rate.split(",")] if args.rate else
                 [("concurrency", int(x)) for x in (args.concurrency or "1,8,32,64,128").split(",")])
        runs = [(ds, kind, v, not args.no_stream)
                for ds in parse_datasets(args.dataset, args.prompt_len, args.output_len) for kind, v in loads]
    vocab_lo, vocab_hi = (int(x) for x in args.vocab.split(":"))
    max_conc = max((v for _, k, v, _ in runs if k == "concurrency"), default=args.max_concurrency or 64)
    parallel = args.parallel or max_conc
    servers = [Server(s, args) for s in (args.server or ["augur"])]
    jl = open(args.jsonl, "a") if args.jsonl else None
    records = []

    try:
        for rnd in range(args.repeat):
            for srv in servers:
                srv.start(parallel, f"round{rnd}")
                try:
                    warm = make_requests(("fixed", 16, 8), 1, args.ctx, f"warm:{rnd}:{srv.name}", vocab_lo, vocab_hi)
                    w = asyncio.run(closed_loop(srv.host, srv.port, warm, 1, True, args.model_name, args.timeout, 0))
                    if "error" in w[0]:
                        raise SystemExit(f"{srv.name}: the warm-up request failed: {w[0]['error']}")
                    for ds, kind, v, stream in runs:
                        rec = one_run(srv, ds, kind, v, stream, rnd, parallel, args)
                        records.append(rec)
                        line = json.dumps(rec)
                        print(line, flush=True)
                        if jl:
                            jl.write(line + "\n")
                            jl.flush()
                        if rec["completed"] == 0:
                            raise SystemExit(f"{srv.name} {rec['load']}: every request failed: {rec.get('first_error')}")
                finally:
                    srv.stop()
    finally:
        if jl:
            jl.close()
    print()
    print_table(records, args.markdown, args.max_others)
    bad = [r for r in records if r.get("failed") or r.get("length_mismatches")]
    for r in bad:
        print(f"warning: {r['server']} {r['dataset']} {r['load']} round {r['round']}: {r.get('failed', 0)} failed, "
              f"{r.get('length_mismatches', 0)} with another output length than asked"
              + (f" ({r['first_error']})" if r.get("first_error") else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
