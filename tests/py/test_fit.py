"""`augur fit`: its prediction against the resident memory (VmRSS) of a
real `augur serve` with the same flags, measured after every sequence has
filled its context at once (parallel concurrent prompts of nearly n_ctx
tokens, then a scored prompt that fills the logits rows), within 10%; its
defaults against serve's; its available memory against /proc/meminfo and
the cgroup read here."""
import concurrent.futures
import json
import os
import subprocess

import pytest

from conftest import QWEN_05B, SMOLLM2, TINY_GGUF, AugurServer, require_model, run_augur

WORDS = "harbor lantern quiet meadow copper thunder violet orchard glacier saddle ember willow".split()


def post(base, path, body, timeout=600):
    import urllib.request
    req = urllib.request.Request(base + path, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


def prompt_of(base, seed, n_tokens):
    """A text of at most n_tokens tokens (by the server's own tokenizer), distinct per seed."""
    text = " ".join(f"{WORDS[(seed * 5 + j * 7) % len(WORDS)]}{(seed * 31 + j) % 89}" for j in range(n_tokens))
    while True:
        n = len(post(base, "/tokenize", {"content": text})["tokens"])
        if n <= n_tokens:
            return text
        text = text[: max(1, int(len(text) * n_tokens / n) - 2)]


def vm_rss(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def measured_rss(model, ctx, parallel, *flags, max_tokens=4):
    s = AugurServer(model, "--ctx", str(ctx), "--parallel", str(parallel), *flags)
    try:
        prompts = [prompt_of(s.base, i, ctx - max_tokens - 4) for i in range(parallel)]
        body = {"max_tokens": max_tokens, "temperature": 0}
        with concurrent.futures.ThreadPoolExecutor(parallel) as ex:
            list(ex.map(lambda p: post(s.base, "/v1/completions", dict(body, prompt=p)), prompts))
        # prompt logprobs: the engine's scored-prompt logits rows
        post(s.base, "/v1/completions", {"prompt": prompts[0][: len(prompts[0]) // 2], "max_tokens": 1,
                                         "temperature": 0, "echo": True, "logprobs": 1})
        return vm_rss(s.proc.pid)
    finally:
        assert s.stop() == 0, s.final_stderr[-3000:]


def fit(model, *flags):
    p = run_augur("fit", "-m", model, *flags, "--json", check=True)
    return json.loads(p.stdout)


def check_prediction(model, ctx, parallel, *flags, max_tokens=4):
    f = fit(model, "--ctx", str(ctx), "--parallel", str(parallel), *flags)
    assert f["n_ctx"] == ctx and f["n_parallel"] == parallel
    assert f["total"] == sum(f["parts"].values())
    rss = measured_rss(model, ctx, parallel, *flags, max_tokens=max_tokens)
    err = (f["total"] - rss) / rss
    print(f"{os.path.basename(model)} ctx {ctx} x {parallel} {' '.join(flags)}: predicted "
          f"{f['total'] / 2**20:.1f} MiB, measured {rss / 2**20:.1f} MiB ({100 * err:+.1f}%)")
    assert abs(err) <= 0.10, (f, rss)
    return f


@pytest.mark.parametrize("ctx,parallel", [(1024, 1), (256, 4)])
def test_smollm2_prediction_within_10_percent(ctx, parallel):
    require_model(SMOLLM2)
    check_prediction(SMOLLM2, ctx, parallel, "--no-kv-disk")


def test_draft_model_prediction_within_10_percent():
    """SmolLM2 drafting for itself: the draft's mapping, KV and scratch count
    on top of the target's (two mappings of one file are resident twice).
    The draft's pages are all read once it has drafted (its tied output
    matrix): the repetitive prompts and 40 tokens make the adaptive length
    try drafts."""
    require_model(SMOLLM2)
    f = check_prediction(SMOLLM2, 512, 2, "--no-kv-disk", "--draft", SMOLLM2, max_tokens=40)
    plain = fit(SMOLLM2, "--ctx", "512", "--parallel", "2", "--no-kv-disk")
    assert f["draft"] == "draft-model+ngram"  # prompt lookup first, then the model
    assert f["parts"]["draft"] > os.path.getsize(SMOLLM2)
    # the target's parts are the same; the verify rows widen the logits buffer
    for part in ("weights", "kv", "scratch", "cache_index"):
        assert f["parts"][part] == plain["parts"][part]
    assert f["parts"]["buffers"] > plain["parts"]["buffers"]


@pytest.mark.parametrize("ctx,parallel", [(512, 2), (256, 4)])
def test_qwen_prediction_within_10_percent(ctx, parallel):
    require_model(QWEN_05B)
    f = check_prediction(QWEN_05B, ctx, parallel, "--no-kv-disk")
    # untied embeddings: only the rows of tokens seen are read
    assert f["weights_max"] > f["parts"]["weights"]


def test_defaults_are_serves(augur_server):
    require_model(SMOLLM2)
    s = augur_server(SMOLLM2)
    f = fit(SMOLLM2)
    assert f"context {f['n_ctx']} per sequence, {f['n_parallel']} sequences at once" in s.stderr()
    assert f["n_batch"] == 512
    # serve's disk tier is on by default: its write-behind buffer and restore staging are planned
    assert f["parts"]["cache_write_queue"] > 0
    assert f["parts"]["cache_read_staging"] == 32 << 20  # the default budget (one SmolLM2 record is 0.4 MiB)
    off = fit(SMOLLM2, "--no-kv-disk")["parts"]
    assert off["cache_write_queue"] == off["cache_read_staging"] == 0


def available_here():
    with open("/proc/meminfo") as fh:
        avail = next(int(l.split()[1]) * 1024 for l in fh if l.startswith("MemAvailable:"))

    def read(path):
        try:
            with open(path) as fh:
                return fh.read()
        except OSError:
            return None

    for limit, usage, stat, key in (("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current",
                                     "/sys/fs/cgroup/memory.stat", "inactive_file"),
                                    ("/sys/fs/cgroup/memory/memory.limit_in_bytes",
                                     "/sys/fs/cgroup/memory/memory.usage_in_bytes",
                                     "/sys/fs/cgroup/memory/memory.stat", "total_inactive_file")):
        lim, use = read(limit), read(usage)
        if lim is None or use is None:
            continue
        if lim.strip() == "max":
            break
        inactive = dict(l.split() for l in (read(stat) or "").splitlines() if l.strip()).get(key, "0")
        avail = min(avail, max(0, int(lim) - max(0, int(use) - int(inactive))))
        break
    return avail


def test_available_memory_and_largest_fits():
    require_model(SMOLLM2)
    f = fit(SMOLLM2, "--ctx", "1024", "--parallel", "2")
    here = available_here()
    # memory moves while other processes run: within 10%
    assert abs(f["available"] - here) <= 0.1 * here, (f["available"], here)
    assert f["fits"] == (f["total"] <= f["available"])
    # the largest context / parallelism: they fit, one more does not (or a hard limit is reached)
    for key, flag, other, limit_name, limit in (("max_ctx", "--ctx", ("--parallel", "2"), "model", None),
                                                ("max_parallel", "--parallel", ("--ctx", "1024"), "server", 256)):
        best = f[key]
        at = fit(SMOLLM2, flag, str(best), *other)
        assert at["total"] <= f["available"] * 1.01
        if f[key + "_limit"] == "memory":
            above = fit(SMOLLM2, flag, str(best + 1), *other)
            assert above["total"] > f["available"] * 0.99
        elif limit is not None:
            assert best == limit


def test_bad_flags():
    p = run_augur("fit", "--ctx", "1")
    assert p.returncode == 2 and b"invalid value '1' for --ctx" in p.stderr
    p = run_augur("fit", "--parallel", "257")
    assert p.returncode == 2
    p = run_augur("fit", "-m", "/nonexistent/model.gguf")
    assert p.returncode == 1 and b"/nonexistent/model.gguf" in p.stderr


def test_kv_mem_sets_the_pool_and_admission_queues_what_it_cannot_hold(augur_server):
    """--kv-mem: a pool of one 256-token context under --parallel 4. Requests
    that each book most of it (prompt + max_tokens) run one after another and
    all complete; fit plans the same pool; a pool under one context is refused."""
    one = fit(TINY_GGUF, "--ctx", "256", "--parallel", "1")
    kv_mem = str(one["parts"]["kv"])  # the pool and its tables: one context, not two
    planned = fit(TINY_GGUF, "--ctx", "256", "--parallel", "4", "--kv-mem", kv_mem)
    assert planned["kv_blocks"] == one["kv_blocks"]
    s = augur_server(TINY_GGUF, "--ctx", "256", "--parallel", "4", "--kv-mem", kv_mem)
    c = s.client()

    def one_request(i):
        r = c.completions.create(model=s.model_id, prompt=f"Once upon a time {i}", max_tokens=200, temperature=0,
                                 extra_body={"ignore_eos": True})
        return r.usage.completion_tokens

    with concurrent.futures.ThreadPoolExecutor(3) as ex:
        assert list(ex.map(one_request, range(3))) == [200, 200, 200]
    p = run_augur("serve", "-m", TINY_GGUF, "--ctx", "256", "--kv-mem", "1K", "--no-kv-disk", check=False)
    assert p.returncode != 0 and b"holds less than one 256-token context" in p.stderr
