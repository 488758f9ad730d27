"""--kv-type f16|q8_0|q4_0 (issue 46): the KV cache in ggml's Q8_0 / Q4_0
blocks on the CPU, in the pool and on disk.

Parity, on SmolLM2-135M (head dim 64, so both types apply; stories260K's
head dim 8 cannot be cut into 32-element blocks and is refused):
- against llama.cpp on the same types (tests/data/parity/smollm2-kv-<type>.npz,
  scripts/logits_reference.py: -ctk/-ctv with flash attention and llama.cpp's
  default Walsh-Hadamard rotation, which augur applies too): mean KL <= 1e-2
  for q8_0 (as the f16 parity test), <= 8e-2 for q4_0 (whose KV alone costs
  ~0.04 nats against f16 on either side); top-1 agreement at least the
  lower of two floors less 2 points: the model's own noise floor (llama.cpp
  batched vs one token at a time, from the f16 reference: 0.968; llama.cpp's
  flash-attention path gives the same bits both ways, so the quantized
  references cannot measure it) and llama.cpp's own agreement of that type
  with its f16 cache (q8_0 0.961, q4_0 0.884: two implementations of a lossy
  cache cannot be held closer to each other than each is to f16). Measured:
  q8_0 0.965 / 3.0e-3, q4_0 0.887 / 3.1e-2 (KL over the top-40 and the tail);
- against augur's own f16 cache: q8_0 top-1 agreement no worse than llama.cpp's
  own q8_0-vs-f16 agreement less 1 point, and mean KL at most 1.5x llama.cpp's
  (the issue's goal: >= llama.cpp's agreement; measured 0.9623 vs 0.9608);
- bits: a token's logits do not depend on its batch (prompt chunks of 64 and
  37 give the same bytes) and decode rows equal verify windows.

The disk tier: records carry the KV type (and whether rows are rotated, in the
compute fingerprint); a restarted q8_0 server restores the prompt and answers
what a cold q8_0 server does; records of another type or rotation are dropped,
not served."""
import json
import os
import uuid

import numpy as np
import pytest

from conftest import ROOT, SMOLLM2, TINY_GGUF, AugurServer, require_model, run_augur
from test_parity import PARITY, parity_stats
from test_prefix_cache import P, complete, listing, metrics, n_records, records, stop_ok, wait_scan

N_VOCAB = 49152


@pytest.fixture
def servers():
    started = []

    def start(model, *args, **kw):
        s = AugurServer(model, *args, **kw)
        started.append(s)
        return s

    yield start
    for s in started:
        if s.proc.poll() is None:
            s.stop()


# ---- memory: what each type costs -------------------------------------------

def test_fit_shows_kv_bytes_per_token():
    require_model(SMOLLM2)
    got = {}
    for t in ("f16", "q8_0", "q4_0"):
        p = run_augur("fit", "-m", SMOLLM2, "--ctx", "1024", "--kv-type", t, "--json", check=True)
        o = json.loads(p.stdout)
        assert o["kv_type"] == t
        got[t] = (o["kv_bytes_per_token"], o["parts"]["kv"])
    # SmolLM2-135M: 30 layers x 3 kv heads x (64 + 64) dims; Q8_0 is 34 bytes a
    # 32 elements, Q4_0 18 (block padding: none at these sizes)
    assert got["f16"][0] == 30 * 3 * 128 * 2 == 23040
    assert got["q8_0"][0] == 30 * 3 * 128 // 32 * 34 == 12240
    assert got["q4_0"][0] == 30 * 3 * 128 // 32 * 18 == 6480
    assert got["q8_0"][1] < 0.54 * got["f16"][1] and got["q4_0"][1] < 0.29 * got["f16"][1]
    text = run_augur("fit", "-m", SMOLLM2, "--kv-type", "q8_0", check=True).stdout.decode()
    assert "KV cache q8_0: 12240 bytes per token" in text


def test_quantized_kv_is_refused_where_it_cannot_apply(tmp_path):
    # stories260K's head dim is 8: not a whole 32-element block
    p = run_augur("fit", "-m", TINY_GGUF, "--kv-type", "q8_0")
    assert p.returncode != 0 and b"multiples of 32" in p.stderr and b"--kv-type f16" in p.stderr
    p = run_augur("fit", "-m", SMOLLM2, "--kv-type", "q5_0")
    assert p.returncode != 0 and b"--kv-type" in p.stderr
    toks = tmp_path / "t.txt"
    toks.write_text("1 2 3")
    p = run_augur("logits", "-m", TINY_GGUF, "--tokens", str(toks), "-o", str(tmp_path / "o"), "--kv-type", "q4_0")
    assert p.returncode != 0 and b"multiples of 32" in p.stderr


# ---- parity -----------------------------------------------------------------

def kv_ref(kv):
    path = os.path.join(PARITY, f"smollm2-kv-{kv}.npz")
    if not os.path.exists(path):
        pytest.skip(f"no reference yet: scripts/logits_reference.py smollm2-kv-{kv}")
    return np.load(path)


@pytest.mark.parametrize("kv,kl_max", [("q8_0", 1e-2), ("q4_0", 8e-2)])
def test_quantized_kv_matches_llama_cpp(tmp_path, kv, kl_max):
    require_model(SMOLLM2)
    ref = kv_ref(kv)
    top1, kl_mean, kl_max_seen, n, _ = parity_stats(SMOLLM2, f"smollm2-kv-{kv}", tmp_path, extra=("--kv-type", kv))
    model_floor = float(np.load(os.path.join(PARITY, "smollm2.npz"))["self_top1"])
    ll_vs_f16 = float(ref["vs_f16_top1"])
    print(f"\nsmollm2 --kv-type {kv} vs llama.cpp -ctk/-ctv {kv}: {n} tokens, top-1 {top1:.4f}, mean KL "
          f"{kl_mean:.2e}, max KL {kl_max_seen:.2e}; model floor {model_floor:.4f}; llama.cpp {kv} vs its f16: "
          f"top-1 {ll_vs_f16:.4f}, KL {float(ref['vs_f16_kl']):.2e}")
    assert top1 >= min(0.99, model_floor - 0.02, ll_vs_f16 - 0.02)
    assert kl_mean <= kl_max


def logprobs(path, n):
    x = np.fromfile(path, dtype=np.float32).reshape(n, N_VOCAB).astype(np.float64)
    m = x.max(1, keepdims=True)
    return x - (np.log(np.exp(x - m).sum(1, keepdims=True)) + m)


def run_logits(tmp_path, tokens, name, *args):
    tok_file = tmp_path / "tokens.txt"
    tok_file.write_text(" ".join(map(str, tokens)))
    out = tmp_path / f"{name}.f32"
    run_augur("logits", "-m", SMOLLM2, "--tokens", str(tok_file), "-o", str(out), *args, check=True, timeout=900)
    return out


def test_q8_0_kv_against_f16_kv_is_no_worse_than_llama_cpps(tmp_path):
    require_model(SMOLLM2)
    ref = kv_ref("q8_0")
    tokens = ref["tokens"].tolist()
    f16 = logprobs(run_logits(tmp_path, tokens, "f16"), len(tokens))
    q8 = logprobs(run_logits(tmp_path, tokens, "q8_0", "--kv-type", "q8_0"), len(tokens))
    top1 = float(np.mean(f16.argmax(1) == q8.argmax(1)))
    kl = float((np.exp(f16) * (f16 - q8)).sum(1).mean())
    ll_top1, ll_kl = float(ref["vs_f16_top1"]), float(ref["vs_f16_kl"])
    print(f"\naugur q8_0 vs f16 KV: top-1 {top1:.4f}, mean KL {kl:.2e}; llama.cpp's: top-1 {ll_top1:.4f}, "
          f"KL {ll_kl:.2e}")
    assert top1 >= ll_top1 - 0.01
    assert kl <= 1.5 * ll_kl


@pytest.mark.parametrize("kv", ["q8_0", "q4_0"])
def test_quantized_kv_bits_do_not_depend_on_the_batch(tmp_path, kv):
    require_model(SMOLLM2)
    tokens = np.load(os.path.join(PARITY, "smollm2.npz"))["tokens"][:150].tolist()
    runs = {
        "chunk64": ("--chunk", "64"),
        "chunk37": ("--chunk", "37"),
        "decode": ("--chunk", "1", "--decode"),
        "verify": ("--chunk", "5", "--decode"),
    }
    out = {k: open(run_logits(tmp_path, tokens, k, "--kv-type", kv, *a), "rb").read() for k, a in runs.items()}
    assert out["chunk64"] == out["chunk37"]  # prompt rows: whatever shares the batch
    assert out["decode"] == out["verify"]  # decode == verify-window bits


# ---- the disk tier ----------------------------------------------------------

def cold_q8(servers, prompt):
    s = servers(SMOLLM2, "--kv-type", "q8_0", "--no-kv-disk")
    text, _, cached = complete(s, prompt, salt=uuid.uuid4().hex)
    assert cached == 0
    stop_ok(s)
    return text


def test_q8_0_prompt_survives_a_restart(servers, tmp_path):
    require_model(SMOLLM2)
    d = str(tmp_path / "kv")
    a = servers(SMOLLM2, "--kv-disk", d, "--kv-type", "q8_0")
    text_a, n_prompt, cached = complete(a, P)
    assert cached == 0 and n_prompt > 150
    stop_ok(a)
    assert len(records(d)) == n_records(n_prompt)
    assert all(e["layout"].startswith("q8_0/") for e in listing(d))

    b = servers(SMOLLM2, "--kv-disk", d, "--kv-type", "q8_0")
    wait_scan(b)
    text_b, _, cached = complete(b, P)
    assert cached == n_prompt - 1
    m = metrics(b)
    assert m["augur_prefix_cache_tokens_restored_disk_total"] == cached
    assert m["augur_prefix_cache_disk_dropped_records_total"] == 0
    stop_ok(b)
    assert text_a == text_b == cold_q8(servers, P)


def test_records_of_another_kv_type_are_not_served(servers, tmp_path):
    require_model(SMOLLM2)
    d = str(tmp_path / "kv")
    a = servers(SMOLLM2, "--kv-disk", d)  # f16
    _, n_prompt, _ = complete(a, P)
    stop_ok(a)
    n = n_records(n_prompt)
    assert len(records(d)) == n and all(e["layout"].startswith("f16/") for e in listing(d))

    # a q8_0 server finds f16 records: another identity, dropped at the scan
    b = servers(SMOLLM2, "--kv-disk", d, "--kv-type", "q8_0")
    m = wait_scan(b)
    assert m["augur_prefix_cache_disk_dropped_records_total"] == n
    assert m["augur_prefix_cache_disk_records"] == 0
    text, _, cached = complete(b, P)
    assert cached == 0
    stop_ok(b)
    assert text == cold_q8(servers, P)
    left = listing(d)
    assert len(left) == n and all(e["layout"].startswith("q8_0/") for e in left)

    # the same type with the rows unrotated stores other bits: dropped too
    env = dict(os.environ, AUGUR_KV_ROTATE="0")
    c = servers(SMOLLM2, "--kv-disk", d, "--kv-type", "q8_0", env=env)
    m = wait_scan(c)
    assert m["augur_prefix_cache_disk_dropped_records_total"] == n
    _, _, cached = complete(c, P)
    assert cached == 0
    stop_ok(c)
