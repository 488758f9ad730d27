#!/usr/bin/env python3
"""Greedy reference for stories260K in llama2.c's own format (numpy port of run.c).

llama2.c itself cannot be fetched here (no code hosts reachable), so this is a
line-by-line numpy transcription of its run.c forward pass, BPE encoder and
greedy loop (GQA version), reading the llama2.c checkpoint (stories260K.bin)
and tokenizer (tok512.bin) -- a different file format and code path from
augur's GGUF loader. It writes tests/data/parity/stories260K_greedy.json with
the prompt, the generated token ids and text; the test compares
`augur run --temp 0` against it.

usage: scripts/llama2c_reference.py [PROMPT] [STEPS]
"""
import json
import os
import struct
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED = os.environ.get("AUGUR_SHARED", os.path.join(os.path.dirname(ROOT), "shared"))
TINY = os.path.join(SHARED, "models", "tiny")


def load_checkpoint(path):
    with open(path, "rb") as f:
        dim, hidden, n_layers, n_heads, n_kv_heads, vocab, seq_len = struct.unpack("7i", f.read(28))
        shared = vocab > 0
        vocab = abs(vocab)
        data = np.frombuffer(f.read(), dtype=np.float32)
    head = dim // n_heads
    kv_dim = dim * n_kv_heads // n_heads
    off = 0

    def take(*shape):
        nonlocal off
        n = int(np.prod(shape))
        a = data[off:off + n].reshape(shape)
        off += n
        return a

    w = {}
    w["emb"] = take(vocab, dim)
    w["rms_att"] = take(n_layers, dim)
    w["wq"] = take(n_layers, dim, dim)
    w["wk"] = take(n_layers, kv_dim, dim)
    w["wv"] = take(n_layers, kv_dim, dim)
    w["wo"] = take(n_layers, dim, dim)
    w["rms_ffn"] = take(n_layers, dim)
    w["w1"] = take(n_layers, hidden, dim)
    w["w2"] = take(n_layers, dim, hidden)
    w["w3"] = take(n_layers, hidden, dim)
    w["rms_final"] = take(dim)
    off += seq_len * head // 2 * 2  # freq_cis_real, freq_cis_imag (unused by run.c)
    w["wcls"] = w["emb"] if shared else take(vocab, dim)
    cfg = dict(dim=dim, hidden=hidden, n_layers=n_layers, n_heads=n_heads, n_kv_heads=n_kv_heads,
               vocab=vocab, seq_len=seq_len, head=head, kv_dim=kv_dim)
    return cfg, w


def load_tokenizer(path, vocab_size):
    vocab, scores = [], []
    with open(path, "rb") as f:
        (max_len,) = struct.unpack("i", f.read(4))
        for _ in range(vocab_size):
            (score,) = struct.unpack("f", f.read(4))
            (n,) = struct.unpack("i", f.read(4))
            vocab.append(f.read(n))
            scores.append(score)
    return vocab, scores


def encode(text, vocab, scores):
    """run.c's encode(): BOS, dummy prefix, code points (byte fallback +3), score-greedy merges."""
    lookup = {t: i for i, t in enumerate(vocab)}
    tokens = [1]
    if text:
        tokens.append(lookup[b" "])
    for ch in text:
        b = ch.encode("utf-8")
        if b in lookup:
            tokens.append(lookup[b])
        else:
            tokens.extend(x + 3 for x in b)
    while True:
        best, best_id, best_i = -1e10, -1, -1
        for i in range(len(tokens) - 1):
            merged = vocab[tokens[i]] + vocab[tokens[i + 1]]
            j = lookup.get(merged)
            if j is not None and scores[j] > best:
                best, best_id, best_i = scores[j], j, i
        if best_i < 0:
            break
        tokens[best_i:best_i + 2] = [best_id]
    return tokens


def rmsnorm(x, w):
    ss = np.float32(np.dot(x, x) / np.float32(len(x))) + np.float32(1e-5)
    return w * (x * np.float32(1.0 / np.sqrt(ss)))


def forward(cfg, w, cache, token, pos):
    dim, head, kv_dim = cfg["dim"], cfg["head"], cfg["kv_dim"]
    kv_mul = cfg["n_heads"] // cfg["n_kv_heads"]
    x = w["emb"][token].copy()
    for l in range(cfg["n_layers"]):
        xb = rmsnorm(x, w["rms_att"][l])
        q = w["wq"][l] @ xb
        k = w["wk"][l] @ xb
        v = w["wv"][l] @ xb
        for i in range(0, dim, 2):
            hd = i % head
            freq = np.float32(1.0 / (10000.0 ** (hd / head)))
            val = np.float32(pos) * freq
            fcr, fci = np.float32(np.cos(val)), np.float32(np.sin(val))
            vecs = (q, k) if i < kv_dim else (q,)
            for vec in vecs:
                v0, v1 = vec[i], vec[i + 1]
                vec[i], vec[i + 1] = v0 * fcr - v1 * fci, v0 * fci + v1 * fcr
        cache["k"][l][pos] = k
        cache["v"][l][pos] = v
        out = np.zeros(dim, dtype=np.float32)
        for h in range(cfg["n_heads"]):
            qh = q[h * head:(h + 1) * head]
            kvh = h // kv_mul
            ks = cache["k"][l][:pos + 1, kvh * head:(kvh + 1) * head]
            att = ks @ qh / np.float32(np.sqrt(head))
            att = np.exp(att - att.max())
            att /= att.sum()
            out[h * head:(h + 1) * head] = att @ cache["v"][l][:pos + 1, kvh * head:(kvh + 1) * head]
        x = x + w["wo"][l] @ out
        xb = rmsnorm(x, w["rms_ffn"][l])
        h1 = w["w1"][l] @ xb
        h3 = w["w3"][l] @ xb
        h1 = h1 * (np.float32(1.0) / (np.float32(1.0) + np.exp(-h1))) * h3
        x = x + w["w2"][l] @ h1
    x = rmsnorm(x, w["rms_final"])
    return w["wcls"] @ x


def decode_piece(vocab, prev, token):
    """run.c's decode(): the space after BOS is dropped, <0xNN> is the raw byte."""
    piece = vocab[token]
    if prev == 1 and piece.startswith(b" "):
        piece = piece[1:]
    if len(piece) == 6 and piece.startswith(b"<0x") and piece.endswith(b">"):
        piece = bytes([int(piece[3:5], 16)])
    return piece


def generate(prompt, steps):
    """run.c's generate() with greedy sampling over `steps` positions (prompt included).
    Returns the prompt and generated ids, the generated text and, as `printed`, all
    that run.c writes to stdout (the prompt's pieces from the first one on, then the
    generated ones) -- both from their first byte."""
    cfg, w = load_checkpoint(os.path.join(TINY, "stories260K.bin"))
    vocab, scores = load_tokenizer(os.path.join(TINY, "tok512.bin"), cfg["vocab"])
    prompt_tokens = encode(prompt, vocab, scores)
    cache = {"k": np.zeros((cfg["n_layers"], cfg["seq_len"], cfg["kv_dim"]), np.float32),
             "v": np.zeros((cfg["n_layers"], cfg["seq_len"], cfg["kv_dim"]), np.float32)}
    token, generated, pieces, printed = prompt_tokens[0], [], [], []
    for pos in range(steps):
        logits = forward(cfg, w, cache, token, pos)
        if pos < len(prompt_tokens) - 1:
            nxt = prompt_tokens[pos + 1]
        else:
            nxt = int(np.argmax(logits))
            if nxt == 1:  # run.c stops at BOS
                break
            generated.append(nxt)
            pieces.append(decode_piece(vocab, token, nxt))
        printed.append(decode_piece(vocab, token, nxt))
        token = nxt
    return {"prompt": prompt, "steps": steps, "prompt_tokens": prompt_tokens, "generated": generated,
            "text": b"".join(pieces).decode("utf-8", errors="replace"),
            "printed": b"".join(printed).decode("utf-8", errors="replace")}


def main(argv):
    prompt = argv[0] if argv else "Once upon a time"
    steps = int(argv[1]) if len(argv) > 1 else 200
    ref = generate(prompt, steps)
    del ref["printed"]
    out = os.path.join(ROOT, "tests", "data", "parity", "stories260K_greedy.json")
    with open(out, "w") as f:
        json.dump(ref, f, indent=1)
    print(ref["text"])


if __name__ == "__main__":
    main(sys.argv[1:])
