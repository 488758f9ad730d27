"""A reply's text continues its prompt's text (issue 13).

The rule: prompt text + returned text == detokenize(prompt tokens + generated tokens),
in `augur run`, completions (plain, streamed, echoed, token-id prompts, logprobs'
text_offset) and chat, on every tokenizer family we ship: stories260K (SentencePiece
with add_space_prefix: the case that broke, the first generated piece lost its space),
SmolLM2 (byte-level BPE), Gemma 3 (SentencePiece without the space prefix) and
Qwen2.5 (byte-level BPE, qwen2 pre-tokenizer).

detokenize is ours (`augur tokenize --batch`, checked against llama.cpp over thousands of
texts in test_tokenizer.py); the generated ids come from the reply's logprobs tokens
through the vocabulary's pieces (every piece is llama.cpp's: test_tokenizer.py compares
their hash). stories260K's greedy text is also compared from its first byte with
llama2.c's (scripts/llama2c_reference.py, a numpy transcription of run.c on the llama2.c
checkpoint), which prints " named Max" after "... a little dog".
"""
import importlib.util
import json
import os
import subprocess
import urllib.request

import pytest

from conftest import AUGUR, GEMMA3, QWEN_05B, ROOT, SMOLLM2, TINY_GGUF, AugurServer, require_model, run_augur

MODELS = {"stories260k": TINY_GGUF, "smollm2": SMOLLM2, "gemma3": GEMMA3, "qwen2": QWEN_05B}
# Prompts whose continuation starts with a space on the SentencePiece model.
PROMPTS = {
    "stories260k": ["Once upon a time, a little dog", "Lily and Ben went to the"],
    "smollm2": ["The capital of France is", "def add(a, b):\n   "],
    "gemma3": ["The capital of France is", "Once upon a time, a little dog"],
    "qwen2": ["The capital of France is", "Once upon a time, a little dog"],
}
QUESTION = "Name three colours."
N = 16


def _llama2c():
    spec = importlib.util.spec_from_file_location("llama2c_reference",
                                                  os.path.join(ROOT, "scripts", "llama2c_reference.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def post(server, path, obj):
    req = urllib.request.Request(server.base + path, data=json.dumps(obj).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.loads(r.read())


def post_stream(server, path, obj):
    """The SSE chunks of a streamed request, parsed."""
    req = urllib.request.Request(server.base + path, data=json.dumps(dict(obj, stream=True)).encode(),
                                 headers={"Content-Type": "application/json"})
    chunks = []
    with urllib.request.urlopen(req, timeout=120) as r:
        for line in r.read().decode().split("\n"):
            if line.startswith("data: ") and line != "data: [DONE]":
                chunks.append(json.loads(line[6:]))
    return chunks


class Tok:
    """Our tokenizer through `augur tokenize --batch`: decode with flags 0 (what the
    engine's detokenizer uses: special tokens render as nothing) and the pieces."""

    def __init__(self, model):
        self.model = model
        pieces, meta = self.ask(["p", "m"])
        self.meta = json.loads(meta)
        self.pieces = [bytes.fromhex(h) for h in pieces.split(" ")]
        self.by_piece = {}
        for i, b in enumerate(self.pieces):
            self.by_piece.setdefault(b, i)

    def ask(self, lines):
        p = subprocess.run([AUGUR, "tokenize", "-m", self.model, "--batch"], capture_output=True, timeout=300,
                           input="".join(l + "\n" for l in lines).encode())
        assert p.returncode == 0, p.stderr.decode(errors="replace")
        out = p.stdout.decode().split("\n")[:-1]
        assert len(out) == len(lines) and not any(o.startswith("ERR") for o in out), out
        return out

    def decode(self, *seqs):
        return [bytes.fromhex(a).decode("utf-8", "replace")
                for a in self.ask(["d 0 " + " ".join(map(str, s)) for s in seqs])]

    def ids_of_pieces(self, tokens):
        """Token strings of a completions logprobs list -> ids (any id with that piece:
        they all decode alike)."""
        ids = []
        for t in tokens:
            b = t.encode("utf-8")
            assert b in self.by_piece, f"no token has the piece {t!r} (a partial UTF-8 piece?)"
            ids.append(self.by_piece[b])
        return ids


@pytest.fixture(scope="module", params=list(MODELS))
def model(request):
    """(name, path, server, tokenizer) for one shipped model."""
    path = require_model(MODELS[request.param])
    s = AugurServer(path, "--parallel", "2")
    yield request.param, path, s, Tok(path)
    rc = s.stop()
    assert rc == 0, s.final_stderr[-4000:]


def complete(server, prompt, **kw):
    return post(server, "/v1/completions", dict(model="m", prompt=prompt, max_tokens=N, temperature=0, **kw))


def prompt_ids(server, text):
    return post(server, "/tokenize", {"content": text, "add_special": True})["tokens"]


def check_identity(tok, prompt_text, p_ids, text, tokens):
    """prompt text + text == detokenize(prompt ids + generated ids), also as a
    continuation of the prompt's own decode (BOS included: llama.cpp's decode keeps
    the space of the piece after a BOS, which a text without BOS loses)."""
    g = tok.ids_of_pieces(tokens)
    assert text == "".join(tokens)
    bos = tok.meta["bos"] if tok.meta["add_bos"] else None
    no_bos = p_ids[1:] if p_ids[:1] == [bos] else p_ids
    whole, head, whole_nb = tok.decode(p_ids + g, p_ids, no_bos + g)
    assert whole == head + text
    assert whole_nb == prompt_text + text
    return g


def test_completion_continues_the_prompt(model):
    name, path, s, tok = model
    for prompt in PROMPTS[name]:
        r = complete(s, prompt, logprobs=1)
        ch = r["choices"][0]
        text, lp = ch["text"], ch["logprobs"]
        assert text, f"{name}: {prompt!r} generated nothing"
        p_ids = prompt_ids(s, prompt)
        check_identity(tok, prompt, p_ids, text, lp["tokens"])
        # its own logprobs agree: each token at its text_offset
        for tk, off in zip(lp["tokens"], lp["text_offset"]):
            assert text[off:off + len(tk)] == tk, (name, prompt, text, lp)
        assert lp["text_offset"][0] == 0
        # the prompt as token ids: the same continuation
        assert complete(s, p_ids)["choices"][0]["text"] == text


def test_completion_stream_and_echo(model):
    name, path, s, tok = model
    for prompt in PROMPTS[name]:
        text = complete(s, prompt)["choices"][0]["text"]
        streamed = "".join(c["choices"][0]["text"] for c in post_stream(s, "/v1/completions", dict(
            model="m", prompt=prompt, max_tokens=N, temperature=0)) if c.get("choices"))
        assert streamed == text
        echo = complete(s, prompt, echo=True)["choices"][0]["text"]
        assert echo == prompt + text
        streamed = "".join(c["choices"][0]["text"] for c in post_stream(s, "/v1/completions", dict(
            model="m", prompt=prompt, max_tokens=N, temperature=0, echo=True)) if c.get("choices"))
        assert streamed == prompt + text
        # echo + logprobs: the generated tokens' offsets continue the echoed prompt's
        r = complete(s, prompt, echo=True, logprobs=0)["choices"][0]
        lp = r["logprobs"]
        assert r["text"] == prompt + text
        n_gen = len(complete(s, prompt, logprobs=0)["choices"][0]["logprobs"]["tokens"])
        gen_offsets = lp["text_offset"][len(lp["tokens"]) - n_gen:]
        gen_tokens = lp["tokens"][len(lp["tokens"]) - n_gen:]
        assert gen_offsets[0] == len(prompt)
        for tk, off in zip(gen_tokens, gen_offsets):
            assert r["text"][off:off + len(tk)] == tk


def test_chat_content_is_its_tokens(model):
    """Chat content is the generated pieces, the first one's leading space included."""
    name, path, s, tok = model
    body = dict(model="m", messages=[{"role": "user", "content": QUESTION}], max_tokens=N, temperature=0,
                logprobs=True)
    r = post(s, "/v1/chat/completions", body)
    ch = r["choices"][0]
    content = ch["message"]["content"]
    pieces = b"".join(bytes(e["bytes"]) for e in ch["logprobs"]["content"])
    assert content == pieces.decode("utf-8", "replace")
    streamed = "".join(c["choices"][0]["delta"].get("content") or "" for c in post_stream(
        s, "/v1/chat/completions", body) if c.get("choices"))
    assert streamed == content


def test_run_prints_the_continuation(model):
    name, path, s, tok = model
    for prompt in PROMPTS[name]:
        text = complete(s, prompt)["choices"][0]["text"]
        p = run_augur("run", "-m", path, "-p", prompt, "-n", str(N), "--temp", "0", check=True)
        assert p.stdout.decode() == text + "\n"


# ---- stories260K against llama2.c, from the first byte ----

@pytest.fixture(scope="module")
def llama2c():
    return _llama2c()


@pytest.mark.parametrize("prompt", PROMPTS["stories260k"])
def test_stories260k_matches_llama2c_from_the_first_byte(llama2c, prompt):
    n = 20
    n_prompt = len(llama2c.encode(prompt, *llama2c.load_tokenizer(
        os.path.join(llama2c.TINY, "tok512.bin"), 512)))
    ref = llama2c.generate(prompt, n_prompt - 1 + n)
    assert len(ref["generated"]) == n
    assert ref["text"].startswith(" ")  # what this test is about
    p = run_augur("run", "-m", TINY_GGUF, "-p", prompt, "-n", str(n), "--temp", "0", "--ignore-eos", check=True)
    assert p.stdout.decode() == ref["text"] + "\n"
    s = AugurServer(TINY_GGUF)
    try:
        r = post(s, "/v1/completions", dict(model="m", prompt=prompt, max_tokens=n, temperature=0, echo=True,
                                            logprobs=0, ignore_eos=True))
        ch = r["choices"][0]
        # llama2.c prints the prompt (its first piece without the space after BOS) and
        # then the generated pieces: exactly what echo returns
        assert ch["text"] == ref["printed"]
        assert r["usage"]["prompt_tokens"] == n_prompt
        tok = Tok(TINY_GGUF)
        assert ch["logprobs"]["tokens"][-n:] == [tok.pieces[i].decode() for i in ref["generated"]]
        r = post(s, "/v1/completions", dict(model="m", prompt=prompt, max_tokens=n, temperature=0,
                                            ignore_eos=True, logprobs=0))
        assert r["choices"][0]["text"] == ref["text"]
        assert r["choices"][0]["logprobs"]["text_offset"][:2] == [0, len(r["choices"][0]["logprobs"]["tokens"][0])]
    finally:
        assert s.stop() == 0, s.final_stderr[-4000:]


@pytest.mark.parametrize("prompt", [" Once upon a time", "  Once upon", "Once upon a time", "Hello</s>world",
                                    "Hello<s> world"])
def test_echo_logprobs_offsets_follow_the_echoed_text(prompt):
    """SentencePiece's add_space_prefix puts a space in front of the text (also when it
    starts with one) and after every special token: such a piece covers one character
    less of the echoed text, and the generated tokens start right after the prompt."""
    s = AugurServer(TINY_GGUF)
    try:
        n = 6
        r = post(s, "/v1/completions", dict(model="m", prompt=prompt, max_tokens=n, temperature=0, echo=True,
                                            logprobs=0, ignore_eos=True))["choices"][0]
        text, toks, offs = r["text"], r["logprobs"]["tokens"], r["logprobs"]["text_offset"]
        assert text.startswith(prompt)
        assert offs == sorted(offs) and offs[0] == 0
        for i, (tk, off) in enumerate(zip(toks, offs)):
            assert text[off:off + len(tk)] == tk or (tk.startswith(" ") and text[off:off + len(tk) - 1] == tk[1:]), \
                (i, tk, off, text)
        assert offs[-n] == len(prompt)
        for tk, off in zip(toks[-n:], offs[-n:]):
            assert text[off:off + len(tk)] == tk
    finally:
        assert s.stop() == 0, s.final_stderr[-4000:]
