"""bench/gpu_ratios.py: augur's and llama.cpp's JSON lines of one GPU run
matched per model and test, and their ratio."""
import json
import os
import subprocess
import sys

from conftest import ROOT

SCRIPT = os.path.join(ROOT, "bench", "gpu_ratios.py")


def write(path, rows):
    with open(path, "w") as f:
        f.write("gpu_bench: a line that is not JSON\n")
        for r in rows:
            f.write(json.dumps(r) + "\n")


def run(a, p):
    return subprocess.run([sys.executable, SCRIPT, a, p], capture_output=True, text=True)


def test_ratios_per_model_and_test(tmp_path):
    m = "build/cuda/random/llama8b-q4_k_m.gguf"
    a, p = str(tmp_path / "a.jsonl"), str(tmp_path / "p.jsonl")
    write(a, [
        {"model": m, "tg": 128, "depth": 0, "batch": 1, "argmax": False, "tg_tok_s": 300.0},
        {"model": m, "tg": 128, "depth": 4096, "batch": 1, "argmax": False, "tg_tok_s": 190.0},  # no peer figure
        {"model": m, "pp": 512, "pp_tok_s": 18000.0},
        {"model": m, "pp": 512, "tg": 128, "pp_tok_s": 1.0, "tg_tok_s": 1.0},  # mixed run: matches nothing
        {"model": m, "tg": 32, "depth": 0, "batch": 64, "argmax": False, "tg_tok_s": 4500.0},
        {"model": "other.gguf", "pp": 512, "pp_tok_s": 5.0},
    ])
    write(p, [
        {"peer": "llama.cpp", "model": "/elsewhere/llama8b-q4_k_m.gguf", "test": "pp512", "tok_s": 9000.0},
        {"peer": "llama.cpp", "model": m, "test": "tg128", "tok_s": 250.0},
        {"peer": "llama.cpp", "model": m, "test": "decode x64", "tok_s": 5000.0},
        {"peer": "llama.cpp", "model": m, "test": "pp4096", "tok_s": 9500.0},
    ])
    r = run(a, p)
    assert r.returncode == 0, r.stderr
    rows = {l.split("|")[1].strip(): [c.strip() for c in l.split("|")[2:5]] for l in r.stdout.splitlines()
            if l.startswith("| ") and not l.startswith("| test")}
    assert rows["pp512"] == ["18000.0", "9000.0", "2.00x"]
    assert rows["tg128"] == ["300.0", "250.0", "1.20x"]
    assert rows["decode x64"] == ["4500.0", "5000.0", "0.90x"]
    assert rows["pp4096"] == ["-", "9500.0", "-"]
    assert len(rows) == 4  # the context run, the mixed run and the other model left out
    assert "other.gguf" not in r.stdout


def test_no_shared_model_is_an_error(tmp_path):
    a, p = str(tmp_path / "a.jsonl"), str(tmp_path / "p.jsonl")
    write(a, [{"model": "x.gguf", "pp": 512, "pp_tok_s": 1.0}])
    write(p, [{"peer": "llama.cpp", "model": "y.gguf", "test": "pp512", "tok_s": 1.0}])
    r = run(a, p)
    assert r.returncode == 1
    assert "no model in both files" in r.stderr
