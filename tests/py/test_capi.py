"""The embeddable C library: examples/simple.c built by `make examples`
against build/libaugur.a and build/libaugur.so, run on SmolLM2; its greedy
chat reply must be the server's (/v1/chat/completions at temperature 0, a
separate code path: the server renders the chat and drives the engine
itself) and `augur run --chat --temp 0`'s. Also the shared library's shape
(soname, only augur_* exported) and that include/augur.h stands alone (no
src/ header, plain C99 and C++)."""
import os
import shutil
import subprocess

import pytest

from conftest import AUGUR, ROOT, SMOLLM2, require_model, run_augur
from test_spec import chat

BUILD = os.path.dirname(AUGUR)
STATIC = os.path.join(BUILD, "examples", "simple")
SHARED = os.path.join(BUILD, "examples", "simple-shared")
SO = os.path.join(BUILD, "libaugur.so")

PROMPTS = ["What is the capital of France?", "Write a haiku about the sea.", "Why is the sky blue?"]
N = 48


def needed(path):
    out = subprocess.run(["readelf", "-d", path], capture_output=True, text=True, check=True).stdout
    return [l.split("[")[1].rstrip("]") for l in out.splitlines() if "(NEEDED)" in l]


def test_the_examples_link_the_way_they_say():
    for p in (STATIC, SHARED, SO):
        assert os.path.exists(p), f"{p} missing: run make"
    assert "libaugur.so.0" in needed(SHARED)
    assert not any(n.startswith("libaugur") for n in needed(STATIC))
    dyn = subprocess.run(["readelf", "-d", SO], capture_output=True, text=True, check=True).stdout
    assert "Library soname: [libaugur.so.0]" in dyn
    syms = subprocess.run(["nm", "-D", "--defined-only", SO], capture_output=True, text=True, check=True).stdout
    names = [l.split()[-1] for l in syms.splitlines() if l.strip()]
    assert "augur_generate" in names and "augur_model_load" in names
    assert [n for n in names if not n.startswith("augur_")] == []


@pytest.mark.parametrize("std,compiler", [("-std=c99", "cc"), ("-std=c++17", "c++")])
def test_the_header_stands_alone(tmp_path, std, compiler):
    if not shutil.which(compiler):
        pytest.skip(f"no {compiler}")
    src = tmp_path / ("use.cpp" if compiler == "c++" else "use.c")
    src.write_text('#include "augur.h"\n'
                   'int main(void) { augur_gen_params p = augur_gen_default_params();'
                   ' return p.max_tokens == 256 && AUGUR_VERSION_NUMBER >= 100 ? 0 : 1; }\n')
    lang = [] if compiler == "c++" else ["-pedantic-errors"]
    p = subprocess.run([compiler, std, *lang, "-Wall", "-Wextra", "-Werror", "-fsyntax-only",
                        "-I", os.path.join(ROOT, "include"), str(src)], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr


def run_example(binary, prompt, n=N, model=SMOLLM2):
    return subprocess.run([binary, model, prompt, str(n)], capture_output=True, timeout=300)


def test_the_example_streams_the_servers_greedy_reply(smol_server):
    require_model(SMOLLM2)
    for prompt in PROMPTS:
        want = chat(smol_server.base, prompt, max_tokens=N)["choices"][0]["message"]["content"]
        for binary in (STATIC, SHARED):
            p = run_example(binary, prompt)
            assert p.returncode == 0, p.stderr
            assert p.stdout.decode() == want, (binary, prompt)
            assert b"prompt tokens" in p.stderr


def test_run_is_the_same_library():
    require_model(SMOLLM2)
    prompt = PROMPTS[0]
    r = run_augur("run", "-m", SMOLLM2, "--chat", "-p", prompt, "--temp", "0", "-n", str(N), check=True)
    p = run_example(SHARED, prompt)
    assert r.stdout.decode() == p.stdout.decode() + "\n"


def test_the_example_reports_a_missing_model():
    p = run_example(SHARED, "hi", model="/nonexistent/model.gguf")
    assert p.returncode == 1
    assert b"/nonexistent/model.gguf" in p.stderr
