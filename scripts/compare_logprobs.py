#!/usr/bin/env python3
"""Logprob requests through two `augur serve` processes that differ only in
their environment (e.g. a GPU's candidates and picks, the default, against
rows copied back, AUGUR_CANDS=0 AUGUR_PICK=0):
the tokens must be equal, the logprobs within --tol (a device sums the
exponentials in another order than the host), the alternatives' ids equal.

    python3 scripts/compare_logprobs.py --bin build/cuda/augur -m MODEL \\
        --a "" --b "AUGUR_CANDS=0 AUGUR_PICK=0" -- --device cuda

Only the standard library (runs on a bare device machine). Exit status 1 on
a difference, with the request and the first differing position. (A top-p
cut made with a device's z could in principle move by a token where top_p·z
falls within rounding of a partial sum: then a token differs legitimately;
the request and position say where.)"""
import argparse
import json
import os
import select
import subprocess
import sys
import urllib.request

PROMPT = "Once upon a time, there was a little girl who"
REQUESTS = [  # the kinds of rows that carry logprobs without copying a row back
    dict(prompt=PROMPT, max_tokens=24, temperature=0, logprobs=3),  # greedy
    dict(prompt=PROMPT, max_tokens=24, temperature=0.9, top_k=40, seed=3, logprobs=5),  # top-k
    dict(prompt=PROMPT, max_tokens=24, temperature=1.0, top_p=0.9, top_k=0, seed=4, logprobs=2),  # top-p cut
    dict(prompt=PROMPT, max_tokens=24, temperature=1.1, top_k=0, top_p=1.0, min_p=0, seed=8, logprobs=4),  # picked
    dict(prompt=PROMPT + " Zebra quantum xylophone.", max_tokens=8, temperature=0, logprobs=3, echo=True),  # scored
    # bias and penalties (the rows edited where the logits are), a JSON mode and a schema (the rows masked there)
    dict(prompt=PROMPT, max_tokens=24, temperature=0.9, top_k=40, seed=5, logprobs=2, frequency_penalty=0.7,
         presence_penalty=0.3, logit_bias={"11": 3, "13": -100}),
    dict(prompt=PROMPT, max_tokens=24, temperature=0, logprobs=1, repetition_penalty=1.3),
    dict(prompt="A book as JSON: ", max_tokens=32, temperature=0, logprobs=2, response_format={"type": "json_object"}),
    dict(prompt="A person as JSON: ", max_tokens=32, temperature=0.8, top_k=20, seed=6, logprobs=1,
         frequency_penalty=0.4, response_format={"type": "json_schema", "json_schema": {"name": "p", "schema": {
             "type": "object", "properties": {"name": {"type": "string", "maxLength": 20},
                                              "age": {"type": "integer", "minimum": 0, "maximum": 120}},
             "required": ["name", "age"]}}}),
]


def serve(binary, model, env_words, extra):
    env = dict(os.environ)
    env.update(w.split("=", 1) for w in env_words.split())
    # two servers run at once: each a bounded KV pool (on a GPU the default takes all the free memory)
    p = subprocess.Popen([binary, "serve", "-m", model, "--port", "0", "--no-kv-disk", "--kv-mem", "256M", *extra],
                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL, env=env)
    r, _, _ = select.select([p.stdout], [], [], 300)
    line = p.stdout.readline().decode() if r else ""
    if not line.startswith("augur: serving "):
        p.kill()
        sys.exit(f"augur serve ({env_words}) did not start: {line!r}")
    return p, "http://127.0.0.1:" + line.rsplit(":", 1)[1].strip()


def ask(base, req):
    body = json.dumps({"model": "m", **req}).encode()
    q = urllib.request.Request(base + "/v1/completions", body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(q, timeout=300) as r:
        lp = json.loads(r.read())["choices"][0]["logprobs"]
    return lp["tokens"], lp["token_logprobs"], [sorted(t) if t else t for t in lp["top_logprobs"]]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="build/augur")
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("--a", default="", help="environment of the first server (VAR=VALUE ...)")
    ap.add_argument("--b", default="AUGUR_CANDS=0 AUGUR_PICK=0", help="environment of the second")
    ap.add_argument("--tol", type=float, default=1e-4)
    ap.add_argument("extra", nargs="*", help="after --: arguments for both servers")
    a = ap.parse_args()
    servers = [serve(a.bin, a.model, a.a, a.extra), serve(a.bin, a.model, a.b, a.extra)]
    bad = 0
    try:
        for req in REQUESTS:
            (ta, la, aa), (tb, lb, ab) = (ask(base, req) for _, base in servers)
            diff = next((i for i in range(max(len(ta), len(tb)))
                         if i >= len(ta) or i >= len(tb) or ta[i] != tb[i] or aa[i] != ab[i] or
                         (la[i] is None) != (lb[i] is None) or (la[i] is not None and abs(la[i] - lb[i]) > a.tol)),
                        None)
            ok = diff is None
            bad += not ok
            print(f"{'ok  ' if ok else 'FAIL'} {json.dumps({k: v for k, v in req.items() if k != 'prompt'})}" +
                  ("" if ok else f": position {diff}: {ta[diff:diff + 1]} {la[diff:diff + 1]} vs "
                                 f"{tb[diff:diff + 1]} {lb[diff:diff + 1]}"))
    finally:
        for p, _ in servers:
            p.terminate()
            p.wait()
    print(f"logprobs ({a.a or 'default'}) vs ({a.b}): {len(REQUESTS) - bad}/{len(REQUESTS)} equal")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
