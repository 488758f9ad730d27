"""Tensor parallelism on the CPU (--tp N, issue 49): SmolLM2 (Q4_1) split over
2 and 4 in-process shards against --tp 1, for prompt rows, decode rows and
verify windows; --tp 1 is today's path byte for byte; greedy speculation
equals plain decoding under --tp; the server runs with --tp. stories260K's
checks (and the plans) are tests/unit/test_tp.c.

Tolerance: the shards only reorder float sums, but on this Q4_1 model a
rounding change can flip an activation's int8 rounding (the Q8 activation
blocks), so logits move about as much as between augur's own prompt and
decode kernels on one shard (measured on this prompt: mean KL(tp1 || tpN)
4.1e-3 to 4.6e-3, max |dlogit| 1.3 to 2.0, against 5.2e-3 and 1.26 for
--tp 1's prompt rows against its decode rows). The bound: mean KL <= 1e-2
(the parity tests' bound against llama.cpp) and at most twice --tp 1's own
prompt-against-decode KL; top-1 agreement >= 80%."""
import os

import numpy as np
import pytest

from conftest import GEN_MODEL, SMOLLM2, TINY_GGUF, require_model, run_augur

TEXT = ("The quick brown fox jumps over the lazy dog. In the morning, the old fisherman walked down to the "
        "harbor, where the boats were waiting, and he counted the gulls.")
N_VOCAB = 49152


@pytest.fixture(scope="module")
def tokens(tmp_path_factory):
    require_model(SMOLLM2)
    p = run_augur("tokenize", "-m", SMOLLM2, TEXT, check=True)
    ids = p.stdout.decode().split()
    f = tmp_path_factory.mktemp("tp") / "tokens.txt"
    f.write_text(" ".join(ids))
    return f, len(ids)


def logits(tmp_path, tokens, tp, mode):
    f, n = tokens
    out = tmp_path / f"tp{tp}-{mode}.f32"
    args = {"prompt": ["--chunk", "8"], "decode": ["--chunk", "1", "--decode"],
            "window": ["--chunk", "4", "--decode"]}[mode]
    tp_args = [] if tp is None else ["--tp", str(tp)]
    run_augur("logits", "--device", "cpu", *tp_args, "-m", SMOLLM2, "--tokens", str(f), "-o", str(out), "-t", "2",
              *args, check=True)
    return np.fromfile(out, dtype=np.float32).reshape(n, N_VOCAB)


def kl(p, q):
    p, q = p.astype(np.float64), q.astype(np.float64)
    lp = p - p.max(1, keepdims=True)
    lp -= np.log(np.exp(lp).sum(1, keepdims=True))
    lq = q - q.max(1, keepdims=True)
    lq -= np.log(np.exp(lq).sum(1, keepdims=True))
    return (np.exp(lp) * (lp - lq)).sum(1)


def test_tp1_is_todays_path(tmp_path, tokens):
    assert np.array_equal(logits(tmp_path, tokens, None, "prompt"), logits(tmp_path, tokens, 1, "prompt"))


@pytest.mark.parametrize("tp", [2, 4])
def test_tp_logits_near_tp1(tmp_path, tokens, tp):
    base_prompt, base_decode = logits(tmp_path, tokens, 1, "prompt"), logits(tmp_path, tokens, 1, "decode")
    own = kl(base_prompt, base_decode).mean()  # --tp 1's own kernel-to-kernel noise
    got = {}
    for mode, base in (("prompt", base_prompt), ("decode", base_decode), ("window", base_decode)):
        x = logits(tmp_path, tokens, tp, mode)
        assert np.isfinite(x).all()
        k = kl(base, x)
        top1 = (base.argmax(1) == x.argmax(1)).mean()
        print(f"--tp {tp} {mode}: mean KL {k.mean():.2e} (tp1 prompt/decode {own:.2e}), max KL {k.max():.2e}, "
              f"max |dlogit| {np.abs(base - x).max():.3f}, top-1 {top1:.3f}")
        assert k.mean() <= 1e-2 and k.mean() <= 2 * own, (mode, k.mean(), own)
        assert top1 >= 0.8, (mode, top1)
        got[mode] = x
    # decode rows stay batch-invariant under --tp: a verify window's rows are
    # the bits of one-token steps
    assert np.array_equal(got["decode"], got["window"])


@pytest.mark.parametrize("tp", [2, 4])
def test_tp_greedy_spec_equals_plain(tp):
    require_model(SMOLLM2)
    outs = []
    for draft in ([], ["--draft", "ngram"], ["--draft", SMOLLM2]):
        p = run_augur("run", "--device", "cpu", "--tp", str(tp), "-m", SMOLLM2, "-n", "32", "--temp", "0", "-t", "2",
                      *draft, "-p", "Write a haiku about the sea.", check=True)
        outs.append(p.stdout)
    assert outs[0] and outs[0] == outs[1] == outs[2]


def test_tp_refusals_name_the_flag(tmp_path, tokens):
    f, _ = tokens
    p = run_augur("logits", "--device", "cpu", "--tp", "10", "-m", SMOLLM2, "--tokens", str(f), "-o",
                  str(tmp_path / "x.f32"))
    assert p.returncode != 0 and b"--tp 10" in p.stderr and b"9 attention heads" in p.stderr
    p = run_augur("logits", "--tp", "0", "-m", SMOLLM2, "--tokens", str(f), "-o", str(tmp_path / "x.f32"))
    assert p.returncode == 2 and b"--tp 0" in p.stderr


def test_tp_serves(augur_server):
    s = augur_server(require_model(SMOLLM2), "--device", "cpu", "--tp", "2", "-t", "2", "--parallel", "2")
    c = s.client()
    r = c.chat.completions.create(model="x", messages=[{"role": "user", "content": "Say hello."}], max_tokens=12,
                                  temperature=0)
    assert r.choices[0].message.content
    # structured outputs: the mask applies to the gathered rows
    r = c.chat.completions.create(model="x", messages=[{"role": "user", "content": "Pick a color."}], max_tokens=24,
                                  temperature=0.7, seed=3,
                                  response_format={"type": "json_schema", "json_schema": {"name": "c", "schema": {
                                      "type": "object", "properties": {"color": {"enum": ["red", "blue"]}},
                                      "required": ["color"]}}})
    import json
    assert json.loads(r.choices[0].message.content)["color"] in ("red", "blue")


def test_fit_plans_each_shard():
    import json
    require_model(SMOLLM2)
    one = json.loads(run_augur("fit", "--device", "cpu", "-t", "2", "--json", check=True).stdout)
    assert "shards" not in one
    for tp in (2, 4):
        d = json.loads(run_augur("fit", "--device", "cpu", "--tp", str(tp), "-t", "2", "--json", check=True).stdout)
        assert d["tp"] == tp and len(d["shards"]) == tp
        # every weight once (the file's matrices, embeddings and norms; norms on every shard), KV split evenly
        w = sum(s["weights"] for s in d["shards"])
        assert 0.9 * one["parts"]["weights"] <= w <= 1.1 * one["parts"]["weights"]
        assert all(s["kv"] * tp == d["parts"]["kv"] for s in d["shards"])
        assert all(s["scratch"] > 0 for s in d["shards"])


def test_tp_q4k_cuts_on_block_boundaries(tmp_path):
    """qwen3-tiny in Q4_K (random weights; 4 heads of 128, 256-element blocks):
    --tp 2 cuts attn_output at column 256 and runs (qwen3's per-head q/k
    norms on split heads) near --tp 1 (measured mean KL 3.1e-5, max |dlogit|
    0.098 of 8.9); --tp 4 would cut it at 128, inside a block, and is refused
    with the tensor named."""
    import subprocess
    model = tmp_path / "q3.gguf"
    subprocess.run([GEN_MODEL, str(model), "qwen3-tiny", "--type", "Q4_K"], check=True, capture_output=True)
    toks = tmp_path / "t.txt"
    toks.write_text(" ".join(str((i * 37 + 11) % 1024) for i in range(24)))
    out = {}
    for tp in (1, 2):
        o = tmp_path / f"{tp}.f32"
        run_augur("logits", "--device", "cpu", "--tp", str(tp), "-m", str(model), "--tokens", str(toks), "-o", str(o),
                  "-t", "2", "--chunk", "8", check=True)
        out[tp] = np.fromfile(o, dtype=np.float32).reshape(24, -1)
    k = kl(out[1], out[2])
    assert k.mean() <= 1e-3 and (out[1].argmax(1) == out[2].argmax(1)).mean() >= 0.9, k.mean()
    p = run_augur("logits", "--device", "cpu", "--tp", "4", "-m", str(model), "--tokens", str(toks), "-o",
                  str(tmp_path / "4.f32"))
    assert p.returncode != 0
    assert b"attn_output.weight' (Q4_K, blocks of 256)" in p.stderr and b"inside a block" in p.stderr


def test_tp_run_on_stories():
    """The fast model end to end: `augur run --tp 2` greedy text equals --tp 1's
    (its logits move by at most 1.2e-3, test_tp.c), with speculation too."""
    outs = [run_augur("run", "--device", "cpu", "--tp", str(tp), "-m", TINY_GGUF, "-n", "48", "--temp", "0", "-t", "2",
                      *draft, "-p", "Once upon a time", check=True).stdout
            for tp in (1, 2, 4) for draft in ([], ["--draft", "ngram"])]
    assert outs[0] and all(o == outs[0] for o in outs)


def test_disk_records_belong_to_their_tp(augur_server, tmp_path):
    """The prefix cache's disk tier under --tp: a server at --tp 2 restores
    its own records after a restart; one at --tp 1 (another KV layout and
    model fingerprint) serves none of them: its scan drops them as it drops
    another model's."""
    import json
    import time
    import urllib.request

    from conftest import AugurServer

    def complete(s, prompt):
        req = urllib.request.Request(s.base + "/v1/completions", data=json.dumps(
            {"model": "x", "prompt": prompt, "max_tokens": 8, "temperature": 0}).encode(),
            headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=120) as r:
            u = json.loads(r.read())["usage"]
        return u["prompt_tokens"], u["prompt_tokens_details"]["cached_tokens"]

    def scanned(s):
        for _ in range(400):
            with urllib.request.urlopen(s.base + "/metrics", timeout=30) as r:
                if "augur_prefix_cache_disk_scan_done 1" in r.read().decode():
                    return
            time.sleep(0.05)
        raise AssertionError("no disk scan")

    d = str(tmp_path / "kv")
    prompt = " ".join(f"Tim went to the park and saw a red ball number {i}." for i in range(8))
    for tp, want_cached in ((2, False), (2, True), (1, False)):
        s = AugurServer(TINY_GGUF, "--device", "cpu", "--tp", str(tp), "-t", "2", "--kv-disk", d)
        try:
            scanned(s)
            n, cached = complete(s, prompt)
            assert n > 64
            assert cached == (n - 1 if want_cached else 0), (tp, n, cached)
            if tp == 1:
                assert "dropped" in s.stderr()
        finally:
            assert s.stop() == 0, s.final_stderr[-3000:]
