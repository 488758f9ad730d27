"""Forward-pass parity with llama.cpp (the independent reference).

The references in tests/data/parity/<name>.npz were made by
scripts/logits_reference.py with llama-cpp-python on the same GGUF: the
token ids of tests/data/parity/text.txt and, per position, llama.cpp's top-40
token ids with their log-probabilities. augur is fed the same ids
(`augur logits`) and must agree: mean KL(llama.cpp || augur) <= 1e-2, with KL
computed over llama.cpp's top-40 plus the remaining (tail) mass, and top-1
agreement >= 99% -- or, where llama.cpp does not reach 99% against ITSELF,
within 2 points of that.

Why the second clause: the reference also records llama.cpp's agreement with
itself (the same tokens one at a time through its decode kernels instead of
one batch through its GEMM kernels). In the small quantized models, summation-
order differences of 1e-7 flip the int8 rounding of later activations, and
the flips compound over the layers: llama.cpp agrees with itself only ~97%
top-1 on SmolLM2-135M Q4_1 (KL 2.9e-3). No second implementation can beat
that floor, so the test holds us to it rather than to an unreachable 99%.

stories260K and SmolLM2 run in `make test`; the bigger models are marked
slow and run in `make test-models`.

qwen3, qwen3moe and gpt-oss, whose real files cannot be fetched here, are
checked on small models with random weights that bench/gen_model writes (the
reference records the file's SHA-256 and the preset; the test writes the file
again and checks the hash first). Each is run as prompt rows (chunks of 64),
as decode rows (one token a pass) and as verify windows (decode rows in
passes of 5), all against the same llama.cpp reference. gpt-oss twice:
gpt-oss-tiny-f16 (every matrix F16: no activation is quantized on either
side, so every feature -- sinks, YaRN, the window, the biases, the gating,
the clamped SwiGLU -- must agree to float rounding; it does, KL ~1e-7) and
gpt-oss-tiny (MXFP4 experts beside F32 matrices: the MXFP4 kernels). The
layout of llama.cpp's own gpt-oss files (the other matrices Q8_0) is not
used here: augur's Q8 activations keep a float scale where llama.cpp's Q8_0
keeps an fp16 one, and its F16 matmuls round activations to fp16; on a
random gpt-oss (routed experts, sinks) those differences compound to ~0.90
top-1 agreement (mean KL 4e-3), below the floor, though each side is as far
from an exact float64 forward pass as the other.
"""
import os

import numpy as np
import pytest

from conftest import GEMMA3, QWEN_05B, QWEN_15B, ROOT, SMOLLM2, TINY_GGUF, require_model, run_augur

PARITY = os.path.join(ROOT, "tests", "data", "parity")


def parity_stats(model_path, ref_name, tmp_path, chunk=64, extra=()):
    ref = np.load(os.path.join(PARITY, f"{ref_name}.npz"))
    tokens = ref["tokens"]
    tok_file = tmp_path / "tokens.txt"
    tok_file.write_text(" ".join(map(str, tokens.tolist())))
    out = tmp_path / "logits.f32"
    run_augur("logits", "-m", model_path, "--tokens", str(tok_file), "-o", str(out), "--chunk", str(chunk),
              *extra, check=True, timeout=900)
    n_vocab = int(ref["n_vocab"])
    logits = np.fromfile(out, dtype=np.float32).reshape(len(tokens), n_vocab).astype(np.float64)
    assert np.isfinite(logits).all()
    logz = np.log(np.exp(logits - logits.max(1, keepdims=True)).sum(1)) + logits.max(1)
    logq = logits - logz[:, None]
    top_ids, top_logp = ref["top_ids"], ref["top_logprobs"].astype(np.float64)
    top1 = np.mean(logq.argmax(1) == top_ids[:, 0])
    p = np.exp(top_logp)
    q_at = np.take_along_axis(logq, top_ids, 1)
    kl_head = (p * (top_logp - q_at)).sum(1)
    p_tail = np.clip(1 - p.sum(1), 1e-12, None)
    q_tail = np.clip(1 - np.exp(q_at).sum(1), 1e-12, None)
    kl = kl_head + p_tail * np.log(p_tail / q_tail)
    self_top1 = float(ref["self_top1"]) if "self_top1" in ref.files else 1.0
    return top1, float(kl.mean()), float(kl.max()), len(tokens), self_top1


def check(model, name, tmp_path, **kw):
    require_model(model)
    top1, kl_mean, kl_max, n, self_top1 = parity_stats(model, name, tmp_path, **kw)
    print(f"\n{name}: {n} tokens, top-1 agreement {top1:.4f} (llama.cpp with itself: {self_top1:.4f}), "
          f"mean KL {kl_mean:.2e}, max KL {kl_max:.2e}")
    floor = min(0.99, self_top1 - 0.02)
    assert top1 >= floor, f"top-1 agreement {top1:.4f} < {floor:.4f}"
    assert kl_mean <= 1e-2, f"mean KL {kl_mean}"


def test_stories260k_matches_llama_cpp(tmp_path):
    check(TINY_GGUF, "stories260K", tmp_path)


def test_stories260k_token_by_token_matches_llama_cpp(tmp_path):
    check(TINY_GGUF, "stories260K", tmp_path, chunk=1)


def test_smollm2_matches_llama_cpp(tmp_path):
    check(SMOLLM2, "smollm2", tmp_path)


def test_smollm2_odd_chunks_f32_kv_match_llama_cpp(tmp_path):
    check(SMOLLM2, "smollm2", tmp_path, chunk=37, extra=("--kv", "f32"))


@pytest.mark.slow
def test_gemma3_matches_llama_cpp(tmp_path):
    check(GEMMA3, "gemma3", tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["prompt", "decode", "verify"])
def test_gemma3_past_the_window_matches_llama_cpp(kind, tmp_path):
    """1600 tokens, three times Gemma 3's 512-position sliding window: the
    windowed layers keep a ring of it (kv.h), recycled as the sequence
    grows, as prompt chunks, decode rows and verify windows."""
    check(GEMMA3, "gemma3-long", tmp_path, **ROW_KINDS[kind])


@pytest.mark.parametrize("kind", ["prompt", "verify"])
def test_gemma3_ring_is_bit_identical_to_every_position(kind, tmp_path):
    """The ring changes where the windowed layers' KV lives, never a bit of
    the logits: 1200 tokens with and without it (AUGUR_KV_RING=0)."""
    import subprocess
    from conftest import AUGUR
    require_model(GEMMA3)
    ref = np.load(os.path.join(PARITY, "gemma3-long.npz"))
    tok_file = tmp_path / "tokens.txt"
    tok_file.write_text(" ".join(map(str, ref["tokens"][:1200].tolist())))
    args = {"prompt": ["--chunk", "64"], "verify": ["--chunk", "5", "--decode"]}[kind]
    outs = []
    for ring in ("1", "0"):
        out = tmp_path / f"ring{ring}.f32"
        subprocess.run([AUGUR, "logits", "-m", GEMMA3, "--tokens", str(tok_file), "-o", str(out), *args],
                       check=True, capture_output=True, timeout=900, env=dict(os.environ, AUGUR_KV_RING=ring))
        outs.append(out.read_bytes())
    assert len(outs[0]) == 1200 * int(ref["n_vocab"]) * 4
    assert outs[0] == outs[1]


@pytest.mark.slow
def test_qwen_05b_matches_llama_cpp(tmp_path):
    check(QWEN_05B, "qwen-0.5b", tmp_path)


@pytest.mark.slow
def test_qwen_15b_matches_llama_cpp(tmp_path):
    if not os.path.exists(os.path.join(PARITY, "qwen-1.5b.npz")):
        pytest.skip("no reference yet: scripts/logits_reference.py qwen-1.5b")
    check(QWEN_15B, "qwen-1.5b", tmp_path)


ROW_KINDS = {"prompt": {}, "decode": {"chunk": 1, "extra": ("--decode",)},
             "verify": {"chunk": 5, "extra": ("--decode",)}}


@pytest.mark.parametrize("kind", list(ROW_KINDS))
@pytest.mark.parametrize("name", ["qwen3-tiny", "qwen3moe-tiny", "gpt-oss-tiny", "gpt-oss-tiny-f16", "granite-h-tiny"])
def test_random_weights_match_llama_cpp(name, kind, random_model, tmp_path):
    check(random_model(name), name, tmp_path, **ROW_KINDS[kind])
