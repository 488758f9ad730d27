"""augur run and augur bench against the real binary."""
import json
import os
import re
import subprocess

import gguf
import pytest

from conftest import AUGUR, GEMMA3, ROOT, SMOLLM2, TINY_GGUF, require_model, run_augur

GREEDY_REF = os.path.join(ROOT, "tests", "data", "parity", "stories260K_greedy.json")


def test_stories260k_greedy_matches_llama2c_reference():
    """scripts/llama2c_reference.py (run.c's algorithm on the llama2.c checkpoint) made this."""
    ref = json.load(open(GREEDY_REF))
    p = run_augur("run", "-m", TINY_GGUF, "-p", ref["prompt"], "--temp", "0", "-n", str(len(ref["generated"])),
                  "--ignore-eos", check=True)
    assert p.stdout.decode() == ref["text"] + "\n"
    assert re.search(rb"prompt \d+ tokens, prefill [\d.]+ tok/s.*decode [\d.]+ tok/s", p.stderr)


def test_seed_makes_sampling_reproducible():
    args = ("run", "-m", TINY_GGUF, "-p", "Once upon a time", "-n", "40", "--temp", "1.0", "--seed")
    a = run_augur(*args, "7", check=True).stdout
    b = run_augur(*args, "7", check=True).stdout
    c = run_augur(*args, "8", check=True).stdout
    assert a == b
    assert a != c


def assert_same_text(cases, env_off):
    """`augur run` of each (model, flags) gives the same text with env_off set
    as without (a path that must not change the tokens). The run without it
    poisons the rows a device would not copy back (AUGUR_POISON_ROWS=1), so
    a row read without its fetch shows."""
    for model, extra in cases:
        args = [AUGUR, "run", "-m", model, "-p", "Once upon a time", "-n", "64", *extra]
        # speculative runs draft lengths from a fixed verify cost, not from timings
        base = {**os.environ, "AUGUR_SPEC_ROW_COST": "0.1"}
        on = subprocess.run(args, capture_output=True, timeout=120, env={**base, "AUGUR_POISON_ROWS": "1"})
        off = subprocess.run(args, capture_output=True, timeout=120, env={**base, **env_off})
        assert on.returncode == 0, on.stderr.decode(errors="replace")
        assert off.returncode == 0, off.stderr.decode(errors="replace")
        assert len(on.stdout) > 20
        assert on.stdout == off.stdout, (model, extra)


def test_backend_picked_tokens_equal_the_samplers():
    """A sampler with only a temperature draws its uniform before the step and
    the backend draws the token where the logits are (AG_WANT_PICK; on the CPU
    by the sampler's own rule): the text equals AUGUR_PICK=0's, where the
    sampler draws from the copied rows, at several temperatures and seeds,
    plain and speculative (rounds with drafts keep their rows), on stories260K
    and SmolLM2; top-p (a sampler that needs the row) is unchanged too."""
    require_model(SMOLLM2)
    only = ("--top-k", "0", "--top-p", "1", "--min-p", "0")  # (the CLI's defaults truncate)
    cases = [(TINY_GGUF, ("--temp", "1.0", "--seed", "7", *only)), (TINY_GGUF, ("--temp", "0.6", "--seed", "3", *only)),
             (TINY_GGUF, ("--temp", "1.4", "--seed", "11", "--draft", "ngram", *only)),
             (TINY_GGUF, ("--temp", "0.9", "--top-p", "0.8", "--seed", "5")),
             (SMOLLM2, ("--temp", "0.8", "--seed", "2", "--chat", *only))]
    assert_same_text(cases, {"AUGUR_PICK": "0"})


def test_candidate_rows_equal_the_samplers():
    """A top-k sampler (the CLI's defaults: top-k 40, top-p 0.95, min-p 0.05)
    reads only its row's best candidates (AG_WANT_CANDS; on the CPU found by
    the backend over its threads), and so does one with top-k off whose top-p
    or min-p cut falls among the best 256 (else the row is fetched): the text
    equals AUGUR_CANDS=0's, where the sampler reads the whole row, at several
    temperatures, seeds and cuts, plain and speculative, on stories260K and
    SmolLM2. (Verify windows at a temperature, which stories260K's adaptive
    length seldom drafts here, are compared seed by seed in test_spec_engine's
    test_sampled_windows_from_candidates.)"""
    require_model(SMOLLM2)
    cases = [(TINY_GGUF, ("--temp", "1.0", "--seed", "7")), (TINY_GGUF, ("--temp", "1.6", "--seed", "3", "--top-k", "5")),
             (TINY_GGUF, ("--temp", "1.2", "--seed", "11", "--draft", "ngram")),
             (TINY_GGUF, ("--temp", "0.9", "--seed", "5", "--top-k", "256", "--top-p", "1", "--min-p", "0")),
             (SMOLLM2, ("--temp", "0.8", "--seed", "2", "--chat")),
             # top-k off: the top-p (or min-p) cut among the best 256 of 512 or 49152, else the row fetched
             (TINY_GGUF, ("--temp", "1.0", "--seed", "4", "--top-k", "0", "--top-p", "0.97", "--min-p", "0")),
             (TINY_GGUF, ("--temp", "1.0", "--seed", "8", "--top-k", "0", "--top-p", "1", "--min-p", "0.002")),
             (SMOLLM2, ("--temp", "1.0", "--seed", "6", "--chat", "--top-k", "0", "--top-p", "0.9", "--min-p", "0"))]
    assert_same_text(cases, {"AUGUR_CANDS": "0"})


def test_edited_rows_equal_the_samplers():
    """A sampler with a repetition penalty has it applied to its rows where
    the logits are, as edits of the tokens in its window (ag_batch.edits), and
    then reads only the rows' argmax, picked token or best candidates: the
    text equals AUGUR_EDITS=0's, where the sampler applies the penalty to the
    whole copied row, greedy, with a temperature alone, with the CLI's
    truncation, speculative, on stories260K and SmolLM2 (penalties below 1
    too, which favour repeats)."""
    require_model(SMOLLM2)
    only = ("--top-k", "0", "--top-p", "1", "--min-p", "0")
    cases = [(TINY_GGUF, ("--temp", "0", "--repeat-penalty", "1.3")),
             (TINY_GGUF, ("--temp", "1.0", "--seed", "7", "--repeat-penalty", "1.2", *only)),
             (TINY_GGUF, ("--temp", "0.9", "--seed", "3", "--repeat-penalty", "0.8")),
             (TINY_GGUF, ("--temp", "0", "--repeat-penalty", "1.5", "--draft", "ngram")),
             (TINY_GGUF, ("--temp", "1.1", "--seed", "5", "--repeat-penalty", "1.4", "--draft", "ngram")),
             (SMOLLM2, ("--temp", "0.8", "--seed", "2", "--chat", "--repeat-penalty", "1.15"))]
    assert_same_text(cases, {"AUGUR_EDITS": "0"})


def test_chat_renders_the_models_template():
    """SmolLM2's template adds its default system prompt: llama.cpp tokenizes the
    rendered conversation to these 37 ids (checked with llama-cpp-python)."""
    require_model(SMOLLM2)
    p = run_augur("run", "-m", SMOLLM2, "--chat", "-p", "What is the capital of France?", "--temp", "0", "-n",
                  "8", check=True)
    assert b"prompt 37 tokens" in p.stderr
    assert b"<|im_" not in p.stdout
    # llama.cpp's greedy answer (this 135M Q4_1 model is weak) starts the same way
    assert p.stdout.startswith("L'\u00c9toile".encode("utf-8"))


def test_bench_reports_prefill_and_decode():
    p = run_augur("bench", "-m", TINY_GGUF, "-p", "64", "-n", "16", "-r", "2", "--json", check=True)
    r = json.loads(p.stdout)
    assert r["pp_tok_s"] > 0 and r["tg_tok_s"] > 0 and r["pp"] == 64 and r["tg"] == 16 and r["batch"] == 1


def cpu_best_isa():
    """augur's best ISA level from /proc/cpuinfo's flags (its own rule: AVX2+FMA+F16C, then AVX-512 F/BW/VL/VNNI)."""
    flags = set()
    for line in open("/proc/cpuinfo"):
        if line.startswith("flags"):
            flags = set(line.split(":", 1)[1].split())
            break
    if not {"avx2", "fma", "f16c"} <= flags:
        return "scalar"
    return "avx512" if {"avx512f", "avx512bw", "avx512vl", "avx512_vnni"} <= flags else "avx2"


@pytest.mark.parametrize("model", [SMOLLM2, GEMMA3])
@pytest.mark.parametrize("isa", [None, "scalar"])
def test_bench_reports_cpu_kernels(model, isa):
    """The kernel line names the ISA level the CPU supports (or the one forced) and every matrix type of the
    file (read with gguf-py); the scalar level has only dot kernels."""
    if not os.path.exists("/proc/cpuinfo"):
        pytest.skip("no /proc/cpuinfo")
    require_model(model)
    env = dict(os.environ)
    env.pop("AUGUR_CPU_ISA", None)
    if isa:
        env["AUGUR_CPU_ISA"] = isa
    p = subprocess.run([AUGUR, "bench", "-m", model, "-p", "8", "-n", "0", "-r", "1", "--json", "--device", "cpu"],
                       capture_output=True, env=env, timeout=120, check=True)
    k = json.loads(p.stdout)["cpu_kernels"]
    best = cpu_best_isa()
    active = isa or best
    assert k.startswith(f"isa {active} (best {best}); decode: {active} dot"), k
    prompt = k.split("; prompt: ", 1)[1]
    types = {t.tensor_type.name for t in gguf.GGUFReader(model).tensors if len(t.shape) >= 2}
    named = set(re.findall(r"\b(?:F16|F32|BF16|Q\d_[01K])\b", prompt))
    assert named == types, (named, types, k)
    if isa == "scalar":
        assert re.fullmatch(r"scalar dot \([A-Z0-9_ ]+\); amx: no", prompt), k


def test_bench_batched_decode():
    # -b N: N sequences decode in lockstep; tg is their aggregate rate
    p = run_augur("bench", "-m", TINY_GGUF, "-p", "0", "-n", "8", "-b", "5", "-r", "1", "--json", check=True)
    r = json.loads(p.stdout)
    assert r["batch"] == 5 and r["tg"] == 8 and r["tg_tok_s"] > 0 and "pp_tok_s" not in r


def test_bench_decode_after_context():
    # -d N: the sequences' first N positions are filled (untimed), then decode runs from position N
    p = run_augur("bench", "-m", TINY_GGUF, "-p", "0", "-n", "8", "-d", "300", "-b", "2", "-r", "1", "--json",
                  check=True)
    r = json.loads(p.stdout)
    assert r["depth"] == 300 and r["batch"] == 2 and r["tg"] == 8 and r["tg_tok_s"] > 0
    text = run_augur("bench", "-m", TINY_GGUF, "-p", "0", "-n", "4", "-d", "40", "-r", "1", check=True).stdout
    assert b"(tg after 40 positions of context)" in text


def test_bench_argmax_rows():
    # --argmax: decode rows bring back their argmax (greedy sampling's need) instead of their logits
    p = run_augur("bench", "-m", TINY_GGUF, "-p", "0", "-n", "8", "-b", "3", "-r", "1", "--argmax", "--json",
                  check=True)
    r = json.loads(p.stdout)
    assert r["argmax"] is True and r["batch"] == 3 and r["tg_tok_s"] > 0
    p = run_augur("bench", "-m", TINY_GGUF, "-p", "0", "-n", "8", "-r", "1", "--json", check=True)
    assert json.loads(p.stdout)["argmax"] is False
    text = run_augur("bench", "-m", TINY_GGUF, "-p", "0", "-n", "4", "-r", "1", "--argmax", check=True).stdout
    assert b"(tg brings back each row's argmax, not its logits)" in text


def test_bad_inputs_fail_cleanly(tmp_path):
    cases = [
        (("run", "-m", "/nonexistent.gguf", "-p", "x"), 1, b"/nonexistent.gguf"),
        (("run", "-m", TINY_GGUF, "-p", "x", "-n", "-5"), 2, b"invalid value '-5' for -n"),
        (("run", "-m", TINY_GGUF, "-p", "x", "--frobnicate", "1"), 2, b"unknown option"),
        (("run", "-m", TINY_GGUF), 2, b"exactly one of -p"),
        (("run", "-m", TINY_GGUF, "-p", "Once upon a time there was a big dog " * 20, "--ctx", "16"), 1,
         b"context_length_exceeded"),
        (("bench", "-m", TINY_GGUF, "-r", "0"), 2, b"invalid value"),
        (("bench", "-m", TINY_GGUF, "-b", "0"), 2, b"invalid value '0' for -b"),
        (("bench", "-m", TINY_GGUF, "-d", "-1"), 2, b"invalid value '-1' for -d"),
    ]
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(open(TINY_GGUF, "rb").read()[:5000])
    cases.append((("run", "-m", str(bad), "-p", "x"), 1, b"bad.gguf"))
    for args, rc, msg in cases:
        p = run_augur(*args)
        assert p.returncode == rc, (args, p.returncode, p.stderr)
        assert msg in p.stderr, (args, p.stderr)
        assert len(p.stderr.strip().splitlines()) >= 1


def test_run_honours_device():
    """`augur run --device` reaches the C library (it used to be dropped:
    run loads through the C API, which has no device field): --device cpu
    runs, --device cuda on a build without CUDA is a clear error, not a
    silent CPU run."""
    r = subprocess.run([AUGUR, "run", "--device", "cpu", "-m", TINY_GGUF, "-p", "Once", "-n", "4", "--temp", "0"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.strip(), r.stderr
    if subprocess.run([AUGUR, "bench", "--device", "cuda", "-m", TINY_GGUF, "-p", "4", "-n", "0", "-r", "1"],
                      capture_output=True, text=True, timeout=60).returncode == 0:
        pytest.skip("a GPU is here: --device cuda runs")
    r = subprocess.run([AUGUR, "run", "--device", "cuda", "-m", TINY_GGUF, "-p", "Once", "-n", "4"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "cuda" in r.stderr.lower(), (r.returncode, r.stderr)
