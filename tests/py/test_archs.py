"""Every architecture of the table on its random-weight model (no real
qwen3/qwen3moe/gpt-oss file can be fetched here): `augur info`, `augur run` and
`augur serve` work end to end, speculative decoding gives plain decoding's text; loading on a device without the op a family
needs is a clear error. Their logits are checked against llama.cpp in
test_parity.py."""
import pytest

from conftest import AugurServer, run_augur

ARCHS = {"qwen3-tiny": "qwen3", "qwen3moe-tiny": "qwen3moe", "gpt-oss-tiny": "gpt-oss",
         "granite-h-tiny": "granitehybrid"}


@pytest.mark.parametrize("name", list(ARCHS))
def test_info_run_serve(name, random_model):
    path = random_model(name)
    info = run_augur("info", "-m", path, check=True).stdout.decode()
    assert f'architecture:    "{ARCHS[name]}"' in info
    if name.startswith(("qwen3moe", "gpt-oss")):
        assert "expert_count" in info and "expert_used_count" in info
    if name.startswith("gpt-oss"):
        assert "MXFP4" in info and "sliding_window" in info
    if name.startswith("granite"):
        assert "ssm.state_size" in info and "residual_scale" in info
    # greedy generation is deterministic, and the same text twice
    outs = [run_augur("run", "-m", path, "-p", "Hello", "-n", "12", "--temp", "0", "--ignore-eos", "-t", "2",
                      check=True) for _ in range(2)]
    assert outs[0].stdout == outs[1].stdout and len(outs[0].stdout) > 0
    assert b"generated 12 tokens" in outs[0].stderr
    # speculative decoding (verify windows) gives plain greedy's text
    prompt = ("-p", "Hello Hello Hello world", "-n", "48", "--temp", "0", "--ignore-eos", "-t", "2")
    plain = run_augur("run", "-m", path, *prompt, check=True)
    spec = run_augur("run", "-m", path, *prompt, "--draft", "ngram", check=True)
    assert spec.stdout == plain.stdout and b"drafted" in spec.stderr
    s = AugurServer(path, "--parallel", "2", "-t", "2")
    try:
        c = s.client()
        r = c.completions.create(model="x", prompt="Hello", max_tokens=12, temperature=0, extra_body={"ignore_eos": True})
        assert r.usage.completion_tokens == 12
        assert r.choices[0].text
    finally:
        assert s.stop() == 0


@pytest.mark.parametrize("name", ["qwen3moe-tiny", "gpt-oss-tiny"])
def test_moe_on_cuda_runs_or_needs_a_gpu(name, random_model, tmp_path):
    """--device cuda: this build has no CUDA backend, or no GPU is visible:
    a clear error at load. On a GPU both run (the CUDA moe op; gpt-oss also
    needs MXFP4 weights, attention sinks and rope_freqs there). (`augur
    logits`, which honours --device; `augur run` goes through the C API,
    whose model parameters have no device.)"""
    tok = tmp_path / "tok.txt"
    tok.write_text("1 2 3")
    p = run_augur("logits", "-m", random_model(name), "--device", "cuda", "--tokens", str(tok), "-o",
                  str(tmp_path / "out.f32"))
    err = p.stderr.decode()
    if "no CUDA backend" in err or "no CUDA GPU" in err:
        assert p.returncode != 0
    else:
        assert p.returncode == 0, err


def test_granite_hybrid_spec_and_server(random_model):
    """granitehybrid's Mamba-2 state cannot drop positions: a verify window's
    rejected tail is undone from the snapshots its decode rows recorded.
    Greedy speculation (n-gram drafts, and the model drafting for itself,
    whose own rollbacks use its KV's snapshots) gives plain decoding's text;
    the server runs with the prefix cache off (a cached block has no state),
    so a second turn computes its whole prompt and gives the same text as a
    fresh server; parallel choices (n > 1) fork the state with the prompt."""
    path = random_model("granite-h-tiny")
    prompt = ("-p", "Hello Hello Hello world Hello Hello", "-n", "64", "--temp", "0", "--ignore-eos", "-t", "2")
    plain = run_augur("run", "-m", path, *prompt, check=True)
    for draft in ("ngram", path):
        spec = run_augur("run", "-m", path, *prompt, "--draft", draft, check=True)
        assert spec.stdout == plain.stdout, draft
        assert b"accepted" in spec.stderr
    s = AugurServer(path, "--parallel", "2", "-t", "2")
    try:
        c = s.client()
        kw = dict(model="x", max_tokens=16, temperature=0, extra_body={"ignore_eos": True})
        a = c.completions.create(prompt="Hello world", **kw)
        b = c.completions.create(prompt="Hello world" + a.choices[0].text + " again", **kw)
        assert b.usage.prompt_tokens_details is None or not b.usage.prompt_tokens_details.cached_tokens
        n2 = c.completions.create(prompt="Hello world", n=2, **kw)
        assert [ch.text for ch in n2.choices] == [a.choices[0].text] * 2
    finally:
        assert s.stop() == 0
    s2 = AugurServer(path, "--parallel", "2", "-t", "2")
    try:
        b2 = s2.client().completions.create(prompt="Hello world" + a.choices[0].text + " again", **kw)
        assert b2.choices[0].text == b.choices[0].text
    finally:
        assert s2.stop() == 0


def test_granite_hybrid_on_cuda_runs_or_needs_a_gpu(random_model, tmp_path):
    """--device cuda: the CUDA backend has the mamba2 op, so on a GPU the
    model loads and runs (its logits against the CPU's: gpu_test.sh's
    compare_backends.py); without CUDA or a GPU, a clear error."""
    tok = tmp_path / "tok.txt"
    tok.write_text("1 2 3")
    p = run_augur("logits", "-m", random_model("granite-h-tiny"), "--device", "cuda", "--tokens", str(tok), "-o",
                  str(tmp_path / "out.f32"))
    err = p.stderr.decode()
    if p.returncode == 0:
        assert (tmp_path / "out.f32").stat().st_size > 0
        return
    assert "no CUDA backend" in err or "no CUDA GPU" in err, err


def test_granite_hybrid_preempted_sequence_resumes_exactly(random_model):
    """Two sequences that outgrow a small KV pool together: the newest is
    preempted (its KV, and its recurrent state with it, moved to host memory
    and back), and each greedy text equals the one it gets alone."""
    import concurrent.futures
    path = random_model("granite-h-tiny")
    kw = dict(model="x", max_tokens=200, temperature=0, extra_body={"ignore_eos": True})
    prompts = ["Hello world", "Once upon a time"]
    solo = AugurServer(path, "--parallel", "1", "-t", "2", "--ctx", "256")
    try:
        want = [solo.client().completions.create(prompt=p, **kw).choices[0].text for p in prompts]
    finally:
        assert solo.stop() == 0
    s = AugurServer(path, "--parallel", "2", "-t", "2", "--ctx", "256", "--kv-mem", "320K")
    try:
        c = s.client()
        with concurrent.futures.ThreadPoolExecutor(2) as ex:
            got = list(ex.map(lambda p: c.completions.create(prompt=p, **kw).choices[0].text, prompts))
        import urllib.request
        metrics = urllib.request.urlopen(s.base + "/metrics").read().decode()
    finally:
        assert s.stop() == 0
    assert got == want
    pre = [l for l in metrics.splitlines() if l.startswith("augur_preemptions_total")]
    assert pre and float(pre[0].split()[-1]) >= 1, pre
