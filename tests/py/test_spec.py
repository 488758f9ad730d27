"""Speculative decoding end to end: `--draft ngram` through `augur run` and
`augur serve` gives plain decoding's output token for token at temperature 0
(single stream, 16 concurrent streams, logprobs, stop strings, n > 1), the
request can turn it off, usage and /metrics count drafts, and bad drafts or
bad requests fail clearly without hurting the server.

The reference for every equality is the same binary with speculation off
(the verify rows are plain decode rows, so the tokens must be identical,
not merely close)."""
import concurrent.futures
import json
import os
import socket
import urllib.request

import pytest

from conftest import GEMMA3, QWEN_05B, SMOLLM2, TINY_GGUF, require_model, run_augur

CODE = '''def collect_even_squares(numbers, limit):
    """Return the squares of the even numbers below limit."""
    result = []
    for n in numbers:
        if n % 2 == 0 and n < limit:
            result.append(n * n)
    return result
'''

# Prompts whose answers copy from the prompt (where n-gram drafts are
# accepted) and prompts whose answers do not.
COPY_PROMPTS = [
    "Repeat this code exactly, then say done:\n" + CODE,
    "Rename the function to even_squares and print the whole code again:\n" + CODE,
    "Copy this sentence three times: the quick brown fox jumps over the lazy dog.",
    "Add a type hint to every argument and return the code:\n" + CODE,
]
CHAT_PROMPTS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Give me three tips for learning to cook.",
    "Why is the sky blue?",
]


def post(base, path, body, timeout=300):
    req = urllib.request.Request(base + path, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def chat(base, prompt, **kw):
    body = {"messages": [{"role": "user", "content": prompt}], "temperature": 0, "max_tokens": 64}
    body.update(kw)
    status, r = post(base, "/v1/chat/completions", body)
    assert status == 200, r
    return r


def test_run_ngram_equals_plain_on_the_default_model():
    require_model(SMOLLM2)
    for prompt in COPY_PROMPTS[:2] + CHAT_PROMPTS[:1]:
        plain = run_augur("run", "--chat", "-p", prompt, "-n", "96", "--temp", "0", check=True)
        spec = run_augur("run", "--chat", "-p", prompt, "-n", "96", "--temp", "0", "--draft", "ngram",
                         "--draft-max", "6", check=True)
        assert spec.stdout == plain.stdout
        assert b"augur: draft ngram (up to 6 per step): drafted" in spec.stderr


def test_run_self_draft_refuses_bad_drafts():
    # a file that is not a model: a clear error, exit 1
    p = run_augur("run", "-m", TINY_GGUF, "-p", "Once", "-n", "4", "--draft", "/nonexistent/draft.gguf")
    assert p.returncode == 1
    assert b"draft" in p.stderr
    p = run_augur("run", "-m", TINY_GGUF, "-p", "Once", "-n", "4", "--draft-max", "0")
    assert p.returncode == 2
    p = run_augur("run", "-m", TINY_GGUF, "-p", "Once", "-n", "4", "--draft", "ngram", "--draft-min", "9",
                  "--draft-max", "4")
    assert p.returncode == 1 and b"--draft-min" in p.stderr
    # without --draft-max each source has its own default: 16 for prompt lookup and for a draft model
    # with its lookup (8 for a draft model alone, AUGUR_DRAFT_LOOKUP=0)
    p = run_augur("run", "-m", TINY_GGUF, "-p", "Once", "-n", "4", "--draft", "ngram", "--draft-min", "12")
    assert p.returncode == 0 and b"augur: draft ngram (up to 16 per step)" in p.stderr
    p = run_augur("run", "-m", TINY_GGUF, "-p", "Once", "-n", "4", "--draft", TINY_GGUF, "--draft-min", "12")
    assert p.returncode == 0 and b"augur: draft draft-model+ngram (up to 16 per step)" in p.stderr
    p = run_augur("run", "-m", TINY_GGUF, "-p", "Once", "-n", "4", "--draft", TINY_GGUF, "--draft-min", "20")
    assert p.returncode == 1 and b"draft_min 20 is above draft-model+ngram's default draft_max 16" in p.stderr


@pytest.fixture(scope="module")
def smol_pair():
    """The default model twice: plain, and with n-gram drafts (16 at once)."""
    from conftest import AugurServer
    require_model(SMOLLM2)
    plain = AugurServer(SMOLLM2, "--parallel", "16", "--ctx", "1024")
    spec = AugurServer(SMOLLM2, "--parallel", "16", "--ctx", "1024", "--draft", "ngram")
    yield plain, spec
    assert spec.stop() == 0, spec.final_stderr[-3000:]
    assert plain.stop() == 0, plain.final_stderr[-3000:]


def test_server_greedy_equals_plain(smol_pair):
    plain, spec = smol_pair
    drafted = accepted = 0
    for p in COPY_PROMPTS + CHAT_PROMPTS:
        a = chat(plain.base, p, logprobs=True, top_logprobs=2)
        b = chat(spec.base, p, logprobs=True, top_logprobs=2)
        assert b["choices"][0]["message"]["content"] == a["choices"][0]["message"]["content"]
        assert b["choices"][0]["finish_reason"] == a["choices"][0]["finish_reason"]
        # logprobs of every emitted token, accepted drafts included, are plain decoding's
        la = [(t["token"], t["logprob"]) for t in a["choices"][0]["logprobs"]["content"]]
        lb = [(t["token"], t["logprob"]) for t in b["choices"][0]["logprobs"]["content"]]
        assert la == lb
        d = b["usage"]["completion_tokens_details"]
        assert d["accepted_prediction_tokens"] + d["rejected_prediction_tokens"] == d["drafted_tokens"]
        assert a["usage"]["completion_tokens_details"]["drafted_tokens"] == 0
        drafted += d["drafted_tokens"]
        accepted += d["accepted_prediction_tokens"]
    assert drafted > 0 and accepted > 0


def test_server_16_concurrent_streams_equal_plain(smol_pair):
    plain, spec = smol_pair
    prompts = (COPY_PROMPTS + CHAT_PROMPTS) * 2
    solo = [chat(plain.base, p, max_tokens=48)["choices"][0]["message"]["content"] for p in prompts]

    def stream(p):
        c = spec.client()
        out = []
        for ch in c.chat.completions.create(model="x", messages=[{"role": "user", "content": p}], temperature=0,
                                            max_tokens=48, stream=True):
            if ch.choices and ch.choices[0].delta.content:
                out.append(ch.choices[0].delta.content)
        return "".join(out)

    with concurrent.futures.ThreadPoolExecutor(16) as ex:
        got = list(ex.map(stream, prompts))
    assert got == solo


def test_stop_strings_n_and_max_tokens_inside_windows(smol_pair):
    plain, spec = smol_pair
    p = COPY_PROMPTS[0]
    full = chat(plain.base, p)["choices"][0]["message"]["content"]
    # a stop string spanning several tokens in the middle of the copied code
    stop = "n % 2 == 0"
    if stop in full:
        a = chat(plain.base, p, stop=[stop])
        b = chat(spec.base, p, stop=[stop])
        assert b["choices"][0]["message"]["content"] == a["choices"][0]["message"]["content"]
        assert stop not in b["choices"][0]["message"]["content"]
    for mt in (1, 2, 5, 13):
        a = chat(plain.base, p, max_tokens=mt)
        b = chat(spec.base, p, max_tokens=mt)
        assert b["choices"][0]["message"]["content"] == a["choices"][0]["message"]["content"]
        assert b["usage"]["completion_tokens"] == a["usage"]["completion_tokens"] <= mt
    a = chat(plain.base, p, n=3)
    b = chat(spec.base, p, n=3)
    assert [c["message"]["content"] for c in b["choices"]] == [c["message"]["content"] for c in a["choices"]]


def test_request_turns_speculation_off_or_caps_it(smol_pair):
    _, spec = smol_pair
    p = COPY_PROMPTS[0]
    on = chat(spec.base, p)
    off = chat(spec.base, p, speculative=False)
    assert off["choices"][0]["message"]["content"] == on["choices"][0]["message"]["content"]
    assert off["usage"]["completion_tokens_details"]["drafted_tokens"] == 0
    capped = chat(spec.base, p, speculative={"max": 1})
    assert capped["choices"][0]["message"]["content"] == on["choices"][0]["message"]["content"]
    d = capped["usage"]["completion_tokens_details"]["drafted_tokens"]
    assert 0 < d <= capped["usage"]["completion_tokens"]
    for bad in (3, "yes", {"max": -1}, {"max": 1000}, [1]):
        status, r = post(spec.base, "/v1/chat/completions",
                         {"messages": [{"role": "user", "content": "hi"}], "speculative": bad})
        assert status == 400, r
        assert r["error"]["param"] in ("speculative", "max"), r


def test_metrics_count_drafts(smol_pair):
    _, spec = smol_pair
    chat(spec.base, COPY_PROMPTS[2])
    with urllib.request.urlopen(spec.base + "/metrics", timeout=30) as r:
        text = r.read().decode()
    vals = {}
    for line in text.splitlines():
        if line.startswith("augur_spec_") and not line.startswith("#"):
            k, v = line.rsplit(" ", 1)
            vals[k] = float(v)
    assert vals["augur_spec_draft_tokens_total"] >= vals["augur_spec_accepted_tokens_total"] > 0
    assert vals["augur_spec_verify_steps_total"] > 0
    assert vals["augur_spec_mean_accepted_length"] > 1
    assert 0 < vals['augur_spec_acceptance_by_position{position="0"}'] <= 1


def test_client_disconnect_mid_verify(smol_pair):
    _, spec = smol_pair
    body = json.dumps({"messages": [{"role": "user", "content": COPY_PROMPTS[0]}], "max_tokens": 400,
                       "temperature": 0, "stream": True}).encode()
    for _ in range(3):
        s = socket.create_connection(("127.0.0.1", spec.port), timeout=30)
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        got = b""
        while got.count(b"data:") < 5:
            chunk = s.recv(4096)
            if not chunk:
                break
            got += chunk
        s.close()  # hang up while drafts are being verified
    # the server goes on serving, with the same greedy output as before
    a = chat(spec.base, COPY_PROMPTS[1])
    b = chat(spec.base, COPY_PROMPTS[1])
    assert a["choices"][0]["message"]["content"] == b["choices"][0]["message"]["content"]


def test_server_runs_without_a_draft_that_fails_to_load(augur_server, tmp_path):
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"GGUF" + os.urandom(64))
    s = augur_server(TINY_GGUF, "--draft", str(bad))
    status, r = post(s.base, "/v1/completions", {"prompt": "Once upon a time", "max_tokens": 8, "temperature": 0})
    assert status == 200 and r["usage"]["completion_tokens_details"]["drafted_tokens"] == 0
    assert "serving without speculative decoding" in s.stderr()
    assert "draft" in s.stderr()


def test_sampled_output_with_speculation_is_valid(smol_pair):
    """At temperature > 0 the output is a sample from plain sampling's
    distribution (the chi-square test is in tests/unit/test_spec_engine.c),
    but not the same sample for a seed: the random draws depend on how many
    tokens were drafted, which depends on timing and load. With
    "speculative": false a seed reproduces its sample."""
    _, spec = smol_pair
    a = chat(spec.base, COPY_PROMPTS[0], temperature=0.8, top_p=0.95, seed=7)
    assert a["usage"]["completion_tokens"] > 0
    assert a["usage"]["completion_tokens_details"]["drafted_tokens"] > 0
    b = chat(spec.base, COPY_PROMPTS[0], temperature=0.8, top_p=0.95, seed=7, speculative=False)
    c = chat(spec.base, COPY_PROMPTS[0], temperature=0.8, top_p=0.95, seed=7, speculative=False)
    assert b["choices"][0]["message"]["content"] == c["choices"][0]["message"]["content"]


def test_draft_model_self_draft_equals_plain(augur_server):
    """A draft model through the server: stories260K drafting for itself must
    change nothing, with prompt lookup first (the default) and without it
    (AUGUR_DRAFT_LOOKUP=0); alone, its drafts are accepted (nearly) always
    (the lookup's guesses, drafted first where a story repeats 4 tokens,
    need not be)."""
    from conftest import AugurServer
    plain = augur_server(TINY_GGUF, "--parallel", "4")
    spec = augur_server(TINY_GGUF, "--parallel", "4", "--draft", TINY_GGUF, "--draft-max", "5")
    alone = AugurServer(TINY_GGUF, "--parallel", "4", "--draft", TINY_GGUF, "--draft-max", "5",
                        env=dict(os.environ, AUGUR_DRAFT_LOOKUP="0"))
    try:
        for prompt in ("Once upon a time", "The little dog ran", "Tom and Sue went to the park. They"):
            body = {"prompt": prompt, "max_tokens": 80, "temperature": 0}
            _, a = post(plain.base, "/v1/completions", body)
            for s in (spec, alone):
                _, b = post(s.base, "/v1/completions", body)
                assert b["choices"][0]["text"] == a["choices"][0]["text"]
                d = b["usage"]["completion_tokens_details"]
                assert d["drafted_tokens"] > 0
                if s is alone:
                    assert d["accepted_prediction_tokens"] >= 0.9 * d["drafted_tokens"]
    finally:
        assert alone.stop() == 0, alone.final_stderr[-3000:]
    assert "speculative decoding: draft draft-model+ngram" in spec.stderr()
    assert "speculative decoding: draft draft-model," in alone.final_stderr


def test_draft_head_prefix_under_batching_equals_plain(smol_pair):
    """A draft model computing part of its head (AUGUR_DRAFT_VOCAB: the
    first 8192 of SmolLM2's 49152 ids and the ids each sequence's context
    holds), 16 concurrent greedy streams: plain decoding's text, and the
    copied rows make drafts (the prefix alone lacks most of the prompts'
    words)."""
    from conftest import AugurServer
    plain, _ = smol_pair
    env = dict(os.environ, AUGUR_DRAFT_VOCAB="8192", AUGUR_LOG="info")
    spec = AugurServer(SMOLLM2, "--parallel", "16", "--ctx", "1024", "--draft", SMOLLM2, "--draft-max", "6", env=env)
    try:
        prompts = (COPY_PROMPTS + CHAT_PROMPTS) * 2
        solo = [chat(plain.base, p, max_tokens=40)["choices"][0]["message"]["content"] for p in prompts]
        with concurrent.futures.ThreadPoolExecutor(16) as ex:
            got = list(ex.map(lambda p: chat(spec.base, p, max_tokens=40), prompts))
        assert [g["choices"][0]["message"]["content"] for g in got] == solo
        copy = [g["usage"]["completion_tokens_details"] for g in got[:len(COPY_PROMPTS)]]
        assert sum(d["accepted_prediction_tokens"] for d in copy) > 0
    finally:
        assert spec.stop() == 0, spec.final_stderr[-3000:]
    assert "computes ids below 8192 of 49152" in spec.final_stderr


def test_incompatible_draft_vocab_is_refused(augur_server):
    require_model(SMOLLM2)
    p = run_augur("run", "-m", TINY_GGUF, "-p", "Once", "-n", "4", "--draft", SMOLLM2)
    assert p.returncode == 1
    assert b"incompatible with the target" in p.stderr and b"token 0" in p.stderr
    s = augur_server(TINY_GGUF, "--draft", SMOLLM2)
    assert "incompatible with the target" in s.stderr()
    status, r = post(s.base, "/v1/completions", {"prompt": "Once", "max_tokens": 4, "temperature": 0})
    assert status == 200 and r["usage"]["completion_tokens_details"]["drafted_tokens"] == 0


@pytest.mark.slow
def test_qwen_draft_model_pair_equals_plain():
    """Qwen2.5-0.5B drafting for Qwen2.5-Coder-1.5B (make test-models)."""
    from conftest import QWEN_15B
    require_model(QWEN_15B)
    require_model(QWEN_05B)
    for prompt in COPY_PROMPTS[:2] + CHAT_PROMPTS[:1]:
        plain = run_augur("run", "-m", QWEN_15B, "--chat", "-p", prompt, "-n", "64", "--temp", "0", check=True,
                          timeout=900)
        spec = run_augur("run", "-m", QWEN_15B, "--chat", "-p", prompt, "-n", "64", "--temp", "0", "--draft",
                         QWEN_05B, check=True, timeout=900)
        assert spec.stdout == plain.stdout
        assert b"augur: draft draft-model+ngram (up to 16 per step): drafted" in spec.stderr
        ngram = run_augur("run", "-m", QWEN_15B, "--chat", "-p", prompt, "-n", "64", "--temp", "0", "--draft",
                          "ngram", check=True, timeout=900)
        assert ngram.stdout == plain.stdout


def test_sliding_window_ring_spec_equals_plain(tmp_path):
    """Gemma 3's windowed layers keep a ring of their 512-position window
    (kv.h): a verify window's rejected tail is dropped from it without a
    snapshot, because the ring recycles only against the length the step
    started from. A 700-token prompt (past the window before decoding
    starts) and 160 greedy tokens: n-gram drafts and a draft model (gemma3
    drafting for itself) give plain decoding's tokens, and so does plain
    decoding with every position kept (AUGUR_KV_RING=0)."""
    require_model(GEMMA3)
    prompt = tmp_path / "p.txt"
    prompt.write_text("Repeat this code exactly, four times, then say done:\n" + CODE * 11)
    args = ("run", "-m", GEMMA3, "-f", str(prompt), "-n", "160", "--temp", "0", "--ignore-eos")
    plain = run_augur(*args, check=True, timeout=600)
    import re
    assert int(re.search(rb"prompt (\d+) tokens", plain.stderr).group(1)) > 600  # past the 512 window
    ngram = run_augur(*args, "--draft", "ngram", "--draft-max", "8", check=True, timeout=600)
    assert ngram.stdout == plain.stdout
    assert b"drafted" in ngram.stderr
    self_draft = run_augur(*args, "--draft", GEMMA3, check=True, timeout=600)
    assert self_draft.stdout == plain.stdout
    env = dict(os.environ, AUGUR_KV_RING="0")
    import subprocess
    from conftest import AUGUR
    full = subprocess.run([AUGUR, *args], capture_output=True, timeout=600, env=env, check=True)
    assert full.stdout == plain.stdout
