#!/usr/bin/env python3
"""Benchmark `augur serve` with N concurrent streaming clients.

For each concurrency level (default 1, 4, 16, 32) every client sends the
same kind of request at once: a streaming /v1/completions with a fixed
prompt, temperature 0, ignore_eos and max_tokens tokens. Reported per level:
aggregate generated tok/s (all tokens / wall time of the level), time to
first token (TTFT) and inter-token latency (ITL) percentiles over all
clients. The single-client decode rate is compared with `augur bench`'s tg
rate on the same model (the server's overhead; goal <= 3%).

usage:
  bench/server_bench.py [-m MODEL] [--levels 1,4,16,32] [--tokens 128]
                        [--prompt-tokens 64] [--parallel 32] [--url URL]
                        [--markdown] [--repeat R]
Without --url it starts build/augur serve itself (--parallel = the largest
level unless given) and stops it afterwards. Loopback only.
"""
import argparse
import http.client
import json
import os
import statistics
import subprocess
import sys
import threading
import time
import urllib.parse

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
AUGUR = os.environ.get("AUGUR_BIN", os.path.join(ROOT, "build", "augur"))
DEFAULT_MODEL = os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")
PROMPT_WORDS = ("the quick brown fox jumps over the lazy dog while a small cat watches from the old wooden "
                "fence and thinks about dinner ").split()


def prompt_of(n_words, salt, tag=""):
    """A prompt of n_words words; tag (e.g. the round) goes first so that a
    later round's prompts do not hit the server's prefix cache."""
    words = [PROMPT_WORDS[(i * 7 + salt) % len(PROMPT_WORDS)] for i in range(n_words)]
    return (tag + " " if tag else "") + " ".join(words)


def one_client(host, port, body, out):
    """Streams one completion; records send time, chunk arrival times and
    the usage the server reports."""
    conn = http.client.HTTPConnection(host, port, timeout=600)
    t0 = time.perf_counter()
    conn.request("POST", "/v1/completions", body=json.dumps(body), headers={"Content-Type": "application/json"})
    r = conn.getresponse()
    if r.status != 200:
        out.append({"error": f"HTTP {r.status}: {r.read()[:200]!r}"})
        return
    times, usage, buf = [], None, b""
    while True:
        line = r.readline()
        if not line:
            break
        if not line.startswith(b"data: "):
            continue
        data = line[6:].strip()
        if data == b"[DONE]":
            break
        ev = json.loads(data)
        if ev.get("usage"):
            usage = ev["usage"]
        for ch in ev.get("choices", []):
            if ch.get("text"):
                times.append(time.perf_counter())
    conn.close()
    out.append({"t0": t0, "times": times, "usage": usage})


def pct(xs, p):
    if not xs:
        return float("nan")
    xs = sorted(xs)
    k = min(len(xs) - 1, max(0, int(round(p / 100 * (len(xs) - 1)))))
    return xs[k]


def run_level(host, port, n, args, tag=""):
    results = []
    threads = []
    for i in range(n):
        body = {"prompt": prompt_of(args.prompt_words, i, tag), "max_tokens": args.tokens, "temperature": 0,
                "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
        threads.append(threading.Thread(target=one_client, args=(host, port, body, results)))
    t_start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t_start
    errors = [r["error"] for r in results if "error" in r]
    if errors:
        raise SystemExit(f"level {n}: {len(errors)} failed requests, e.g. {errors[0]}")
    gen = sum(r["usage"]["completion_tokens"] for r in results)
    ttft = [(r["times"][0] - r["t0"]) * 1e3 for r in results if r["times"]]
    itl = [(b - a) * 1e3 for r in results for a, b in zip(r["times"], r["times"][1:])]
    # per-client decode rate: tokens after the first over the time they took
    rates = [(len(r["times"]) - 1) / (r["times"][-1] - r["times"][0]) for r in results if len(r["times"]) > 2]
    return {"clients": n, "wall_s": wall, "tokens": gen, "agg_tok_s": gen / wall,
            "ttft_p50": pct(ttft, 50), "ttft_p90": pct(ttft, 90), "ttft_p99": pct(ttft, 99),
            "itl_p50": pct(itl, 50), "itl_p90": pct(itl, 90), "itl_p99": pct(itl, 99),
            "client_tok_s": statistics.mean(rates) if rates else float("nan"),
            "prompt_tokens": results[0]["usage"]["prompt_tokens"]}


def augur_bench(model, prompt_tokens, tokens, threads, reps=3):
    cmd = [AUGUR, "bench", "-m", model, "-p", str(prompt_tokens), "-n", str(tokens), "-r", str(reps), "--json"]
    if threads:
        cmd += ["-t", str(threads)]
    p = subprocess.run(cmd, capture_output=True, timeout=1800)
    if p.returncode != 0:
        return None
    return json.loads(p.stdout)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", default=DEFAULT_MODEL)
    ap.add_argument("--levels", default="1,4,16,32")
    ap.add_argument("--tokens", type=int, default=128, help="generated tokens per request")
    ap.add_argument("--prompt-words", type=int, default=48, help="words in each prompt")
    ap.add_argument("--parallel", type=int, default=0, help="server --parallel (default: largest level)")
    ap.add_argument("--ctx", type=int, default=1024)
    ap.add_argument("-t", "--threads", type=int, default=0)
    ap.add_argument("--url", help="use a running server instead of starting one")
    ap.add_argument("--no-bench", action="store_true", help="skip the `augur bench` comparison")
    ap.add_argument("--markdown", action="store_true", help="print a Markdown table")
    ap.add_argument("--repeat", type=int, default=1,
                    help="rounds; each runs every level once (and, with level 1, one `augur bench`), "
                         "so that noise hits all of them alike; medians and per-round ratios are reported")
    args = ap.parse_args()
    levels = [int(x) for x in args.levels.split(",")]

    proc = None
    if args.url:
        u = urllib.parse.urlparse(args.url)
        host, port = u.hostname, u.port
        assert host in ("127.0.0.1", "localhost", "::1"), "loopback only"
    else:
        cmd = [AUGUR, "serve", "-m", args.model, "--port", "0", "--parallel", str(args.parallel or max(levels)),
               "--ctx", str(args.ctx), "--max-queue", "256"]
        if args.threads:
            cmd += ["-t", str(args.threads)]
        log = open(os.devnull, "w")
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log)
        line = proc.stdout.readline().decode()
        if not line.startswith("augur: serving"):
            raise SystemExit(f"server did not start: {line!r}")
        host, port = "127.0.0.1", int(line.rsplit(":", 1)[1])
    rounds, refs = [], []
    try:
        run_level(host, port, 1, argparse.Namespace(prompt_words=8, tokens=8), "warm-up")
        prompt_tokens = run_level(host, port, 1, argparse.Namespace(prompt_words=args.prompt_words, tokens=1),
                                  "round 0:")["prompt_tokens"]
        for k in range(args.repeat):
            tag = f"round {k}:" if args.repeat > 1 else ""
            if 1 in levels and not args.no_bench and not args.url:
                # the server is idle now: one bench run right before the
                # single-client level, so that the machine's drift between
                # the two is small
                refs.append(augur_bench(args.model, prompt_tokens, args.tokens, args.threads,
                                        reps=1 if args.repeat > 1 else 3))
            rounds.append([run_level(host, port, n, args, tag) for n in levels])
            if args.repeat > 1:
                print(f"round {k}: " + ", ".join(f"{r['clients']}: {r['agg_tok_s']:.2f} tok/s" for r in rounds[-1])
                      + (f", bench tg {refs[-1]['tg_tok_s']:.2f}" if refs and refs[-1] else ""), flush=True)
    finally:
        if proc:
            proc.terminate()
            proc.wait(timeout=60)

    # one row per level: each figure the median over the rounds
    rows = []
    for i, n in enumerate(levels):
        per = [rd[i] for rd in rounds]
        rows.append({key: (statistics.median(r[key] for r in per) if isinstance(per[0][key], float) else per[0][key])
                     for key in per[0]})
    single = next((r for r in rows if r["clients"] == 1), None)
    refs = [r for r in refs if r]
    ref = {"tg_tok_s": statistics.median(r["tg_tok_s"] for r in refs)} if refs else None

    model = os.path.basename(args.model)
    if args.markdown:
        print(f"model `{model}`, {args.tokens} tokens per request, prompt {rows[0]['prompt_tokens']} tokens, "
              f"temperature 0\n")
        print("| clients | aggregate tok/s | per-client tok/s | TTFT p50 / p90 / p99 ms | ITL p50 / p90 / p99 ms |")
        print("|---:|---:|---:|---|---|")
        for r in rows:
            print(f"| {r['clients']} | {r['agg_tok_s']:.1f} | {r['client_tok_s']:.1f} | "
                  f"{r['ttft_p50']:.0f} / {r['ttft_p90']:.0f} / {r['ttft_p99']:.0f} | "
                  f"{r['itl_p50']:.1f} / {r['itl_p90']:.1f} / {r['itl_p99']:.1f} |")
    else:
        for r in rows:
            print(json.dumps(r))
    if single:
        i1 = levels.index(1)
        for i, n in enumerate(levels):
            if n > 1:
                ratios = sorted(rd[i]["agg_tok_s"] / rd[i1]["agg_tok_s"] for rd in rounds)
                print(f"{n} clients: {statistics.median(ratios):.2f}x the single-client aggregate"
                      + (f" (median of {len(ratios)} rounds, range {ratios[0]:.2f}-{ratios[-1]:.2f})"
                         if len(ratios) > 1 else ""))
    if ref and single:
        overs = sorted(1 - rd[levels.index(1)]["client_tok_s"] / rf["tg_tok_s"] for rd, rf in zip(rounds, refs))
        print(f"single client decode {single['client_tok_s']:.1f} tok/s vs augur bench tg {ref['tg_tok_s']:.1f} "
              f"tok/s: overhead {statistics.median(overs) * 100:.1f}%"
              + (f" (median of {len(overs)} rounds, range {overs[0] * 100:.1f}% to {overs[-1] * 100:.1f}%)"
                 if len(overs) > 1 else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
