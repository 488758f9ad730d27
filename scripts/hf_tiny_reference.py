#!/usr/bin/env python3
"""A tiny Gemma 3 text model folder (random weights) and transformers' logits on it.

Writes tests/data/hf/gemma3-tiny/: config.json and model.safetensors as
transformers' save_pretrained writes them (BF16; width 32, six layers:
five with a 4-token sliding window, then a global one), the hand-made
SentencePiece-BPE tokenizer.json of tests/unit/test_tok.c's tokenizer test
with all 256 byte tokens (a vocabulary of 272), and ref.json: token ids and the logits
Gemma3ForCausalLM gives at every position (float32 on the CPU from the BF16
weights). The augur test
(tests/py/test_hf_folder.py) loads the folder with -m DIR as the decoder gemma3
and compares.

usage: scripts/hf_tiny_reference.py      needs: pip install torch transformers
"""
import json, os

import torch
import transformers
from transformers import Gemma3ForCausalLM, Gemma3TextConfig

root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
out = os.path.join(root, "tests", "data", "hf", "gemma3-tiny")
os.makedirs(out, exist_ok=True)
torch.manual_seed(1234)
V = 272
cfg = Gemma3TextConfig(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=6,
                       num_attention_heads=2, num_key_value_heads=1, head_dim=16, query_pre_attn_scalar=16,
                       max_position_embeddings=256, sliding_window=4, rope_theta=1000000.0,
                       rope_local_base_freq=10000.0, rms_norm_eps=1e-6, final_logit_softcapping=None,
                       attn_logit_softcapping=None, rope_scaling=None, pad_token_id=0, eos_token_id=1,
                       bos_token_id=2, tie_word_embeddings=True)
model = Gemma3ForCausalLM(cfg).eval()
with torch.no_grad():  # norm gains away from 0, so the 1 + w convention matters
    for n, p in model.named_parameters():
        if n.endswith("norm.weight"):
            p.uniform_(-0.5, 0.5)
        else:
            p.normal_(0, 0.2)
model = model.to(torch.bfloat16)  # stored as BF16 (small; augur's BF16 path) ...
model.save_pretrained(out, safe_serialization=True)
model = model.float()  # ... and the reference computed in float32 from those values
for f in os.listdir(out):
    if f not in ("config.json", "model.safetensors"):
        os.remove(os.path.join(out, f))

# the tokenizer: bytes, a few pieces and merges (as tests/unit/test_tok.c's)
vocab = {"<pad>": 0, "<eos>": 1, "<bos>": 2, "<unk>": 3}
for b in range(256):
    vocab[f"<0x{b:02X}>"] = len(vocab)
for t in ["a", "b", "c", "d", "\u2581", "ab", "\u2581ab", "bc", "cd", "\u2581c"]:
    vocab[t] = len(vocab)
while len(vocab) < V:
    vocab[f"<unused{len(vocab)}>"] = len(vocab)
special = lambda i, c: {"id": i, "content": c, "single_word": False, "lstrip": False, "rstrip": False,
                        "normalized": False, "special": True}
tok = {"version": "1.0", "truncation": None, "padding": None,
       "added_tokens": [special(0, "<pad>"), special(1, "<eos>"), special(2, "<bos>"), special(3, "<unk>")],
       "normalizer": {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"},
       "pre_tokenizer": {"type": "Split", "pattern": {"String": " "}, "behavior": "MergedWithPrevious",
                         "invert": False},
       "post_processor": {"type": "TemplateProcessing",
                          "single": [{"SpecialToken": {"id": "<bos>", "type_id": 0}},
                                     {"Sequence": {"id": "A", "type_id": 0}}],
                          "pair": [], "special_tokens": {"<bos>": {"id": "<bos>", "ids": [2], "tokens": ["<bos>"]}}},
       "decoder": None,
       "model": {"type": "BPE", "dropout": None, "unk_token": "<unk>", "continuing_subword_prefix": None,
                 "end_of_word_suffix": None, "fuse_unk": True, "byte_fallback": True, "ignore_merges": False,
                 "vocab": vocab, "merges": [["a", "b"], ["\u2581", "ab"], ["b", "c"], ["c", "d"], ["\u2581", "c"]]}}
with open(os.path.join(out, "tokenizer.json"), "w") as f:
    json.dump(tok, f, ensure_ascii=False)

ids = [2] + [int(x) for x in torch.randint(4, V, (23,))]
with torch.no_grad():
    logits = model(torch.tensor([ids])).logits[0]
json.dump({"transformers": transformers.__version__, "torch": torch.__version__, "ids": ids,
           "logits": [[round(float(v), 6) for v in row] for row in logits]},
          open(os.path.join(out, "ref.json"), "w"))
print(f"wrote {out}: {sum(p.numel() for p in model.parameters())} parameters, {len(ids)} positions")
