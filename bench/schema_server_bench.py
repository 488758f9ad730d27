#!/usr/bin/env python3
"""Decode speed with and without a JSON schema, through `augur serve`.

One sequence at a time, streamed: decode tok/s = (tokens - 1) / (time from
the first streamed token to the last). Free text runs with ignore_eos; the
schema (an array of at least 50 records) cannot close within the token
budget, so both runs decode exactly --tokens tokens. Runs alternate (free,
schema, free, ...) so that a machine's changing load hits both alike;
medians are reported.

    python3 bench/schema_server_bench.py [-m MODEL] [-r RUNS] [--tokens N]
"""
import argparse
import json
import os
import select
import statistics
import subprocess
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

SCHEMA = {"type": "array", "minItems": 50, "items": {
    "type": "object",
    "properties": {"id": {"type": "integer", "minimum": 1, "maximum": 100000},
                   "name": {"type": "string", "maxLength": 24},
                   "role": {"enum": ["admin", "user", "guest"]},
                   "score": {"type": "number", "minimum": 0, "maximum": 1},
                   "active": {"type": "boolean"}},
    "required": ["id", "name", "role", "score", "active"]}}


def stream(base, body):
    """Streams one chat completion; returns (tokens, seconds from first to last token)."""
    req = urllib.request.Request(base + "/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    times, usage = [], None
    with urllib.request.urlopen(req, timeout=600) as r:
        for line in r:
            line = line.strip()
            if not line.startswith(b"data: ") or line == b"data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                usage = chunk["usage"]
            if chunk["choices"] and chunk["choices"][0]["delta"].get("content"):
                times.append(time.perf_counter())
    return usage["completion_tokens"], times[-1] - times[0]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("-m", "--model", default=os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("-r", "--runs", type=int, default=7)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--augur", default=os.path.join(ROOT, "build", "augur"))
    a = ap.parse_args()
    srv = subprocess.Popen([a.augur, "serve", "-m", a.model, "--port", "0", "--parallel", "1", "--no-kv-disk"],
                           stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    try:
        ready, _, _ = select.select([srv.stdout], [], [], 120)
        line = srv.stdout.readline().decode() if ready else ""
        if not line.startswith("augur: serving "):
            raise SystemExit(f"the server did not start: {line!r}")
        base = "http://127.0.0.1:" + line.strip().rsplit(":", 1)[1]
        msgs = [{"role": "user", "content": "List the members of a club as JSON records."}]
        common = {"messages": msgs, "max_tokens": a.tokens, "temperature": 0, "stream": True,
                  "stream_options": {"include_usage": True}}
        free_body = dict(common, ignore_eos=True)
        schema_body = dict(common, response_format={"type": "json_schema",
                                                    "json_schema": {"name": "club", "schema": SCHEMA}})
        stream(base, free_body)  # warm-up (and the schema tables are built on the first schema request)
        stream(base, schema_body)
        rates = {"free": [], "schema": []}
        for _ in range(a.runs):
            for name, body in (("free", free_body), ("schema", schema_body)):
                n, dt = stream(base, body)
                assert n == a.tokens, (name, n)
                rates[name].append((n - 1) / dt)
        for name, r in rates.items():
            print(f"{name:7s} decode tok/s: median {statistics.median(r):7.2f}  "
                  f"(runs: {', '.join(f'{x:.1f}' for x in r)})")
        f, s = statistics.median(rates["free"]), statistics.median(rates["schema"])
        print(f"schema / free: {s / f:.3f} ({(s / f - 1) * 100:+.1f}%)")
    finally:
        srv.terminate()
        srv.wait()


if __name__ == "__main__":
    main()
