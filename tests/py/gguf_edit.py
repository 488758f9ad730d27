"""Copies of a GGUF with its chat template replaced and, optionally,
control tokens appended to its vocabulary (for tests that need a small
model dressed as another family: stories260K with Qwen3's or gpt-oss's
template, and gpt-oss's harmony markers as single tokens)."""
import gguf
import numpy as np


def copy_with_template(src, dst, template, control_tokens=()):
    """Writes dst: the GGUF src with tokenizer.chat_template = template and
    control_tokens appended to the vocabulary as CONTROL tokens (score 0;
    vocab_size, token_embd and output grow by as many small random rows,
    seeded, so the copy is the same every run)."""
    control_tokens = list(control_tokens)
    r = gguf.GGUFReader(src)
    arch = bytes(r.fields["general.architecture"].parts[-1]).decode()
    w = gguf.GGUFWriter(dst, arch)
    extra = {"tokenizer.ggml.tokens": control_tokens, "tokenizer.ggml.scores": [0.0] * len(control_tokens),
             "tokenizer.ggml.token_type": [int(gguf.TokenType.CONTROL)] * len(control_tokens)}
    n_vocab = None
    for name, f in r.fields.items():
        if name.startswith("GGUF.") or name in ("general.architecture", "tokenizer.chat_template"):
            continue
        vtype = f.types[0]
        if vtype == gguf.GGUFValueType.ARRAY:
            if f.types[-1] == gguf.GGUFValueType.STRING:
                vals = [bytes(f.parts[i]).decode("utf-8", "surrogateescape") for i in f.data]
            else:
                vals = [f.parts[i][0].item() for i in f.data]
            if control_tokens and name in extra:
                n_vocab = len(vals) + len(control_tokens)
                vals = vals + extra[name]
            if name == "tokenizer.ggml.scores":
                w.add_array(name, [float(v) for v in vals])
            else:
                w.add_array(name, vals)
        elif vtype == gguf.GGUFValueType.STRING:
            w.add_string(name, bytes(f.parts[-1]).decode("utf-8", "surrogateescape"))
        elif control_tokens and name.endswith(".vocab_size"):
            w.add_key_value(name, f.parts[-1][0].item() + len(control_tokens), vtype)
        else:
            w.add_key_value(name, f.parts[-1][0].item(), vtype)
    w.add_string("tokenizer.chat_template", template)
    rng = np.random.default_rng(0)
    for t in r.tensors:
        if control_tokens and t.name in ("token_embd.weight", "output.weight"):
            data = np.array(t.data)
            assert data.shape[0] + len(control_tokens) == n_vocab and data.dtype == np.float32
            rows = (rng.standard_normal((len(control_tokens), data.shape[1])) * 0.02).astype(np.float32)
            w.add_tensor(t.name, np.concatenate([data, rows]))
        else:
            w.add_tensor(t.name, t.data, raw_shape=list(t.data.shape), raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
