#!/usr/bin/env python3
"""Writes reference data for augur's dequantization test (tests/unit/test_quant.c).

For each weight type, tests/data/quant/<TYPE>.bin holds raw blocks and the
floats that gguf-py (`gguf.quants.dequantize`, the independent reference)
turns them into. Blocks are random-but-valid (random bytes, with the fp16
scale fields set to finite halfs: normal, subnormal and zero) and, where a
model in models/ has the type, real blocks picked at random from its tensors.

File layout (little-endian):
    magic    8 bytes  b"AGQREF01"
    type     u32      ggml type id
    elems    u32      elements per block
    bytes    u32      bytes per block
    n_blocks u32
    n_random u32      the first n_random blocks are synthetic, the rest real
    reserved u32
    blocks   n_blocks * bytes
    expected n_blocks * elems float32

Usage: scripts/quant_reference.py [--models DIR] [--out DIR] [--seed N]
Deterministic for a given seed and set of models.
"""
import argparse
import os
import struct
import sys

import numpy as np

try:
    import gguf
    from gguf import GGMLQuantizationType as T
    from gguf.quants import dequantize
except ImportError:  # pragma: no cover
    sys.exit("needs the gguf package (pip install gguf)")

MAGIC = b"AGQREF01"

# type -> (synthetic blocks, max real blocks, offsets of fp16 scale fields)
SPEC = {
    "F32": (2048, 2048, []),
    "F16": (4096, 0, []),
    "BF16": (4096, 0, []),
    "Q4_0": (256, 128, [0]),
    "Q4_1": (128, 256, [0, 2]),
    "Q5_0": (128, 256, [0]),
    "Q5_1": (256, 128, [0, 2]),
    "Q8_0": (128, 256, [0]),
    "Q2_K": (96, 32, [80, 82]),
    "Q3_K": (96, 32, [108]),
    "Q4_K": (64, 64, [0, 2]),
    "Q5_K": (96, 32, [0, 2]),
    "Q6_K": (64, 64, [208]),
    "MXFP4": (256, 0, []),  # no model here has it: synthetic blocks only
}

MODEL_FILES = [
    "SmolLM2-135M-Instruct.Q4_1.gguf",
    "gemma-3-270m-Q4_K_M.gguf",
    "qwen2.5-0.5b-Q4.gguf",
    "Qwen2.5-Coder-1.5B-Instruct-Q4_K_M.gguf",
]


def sane_halfs(rng, n):
    """Finite fp16 bit patterns: mostly normal (2^-14..2^3), some subnormal, some zero."""
    kind = rng.random(n)
    mag = np.exp2(rng.uniform(-14, 3, n)).astype(np.float16).view(np.uint16)
    sub = rng.integers(1, 0x400, n, dtype=np.uint16)  # subnormal: exponent 0
    bits = np.where(kind < 0.9, mag, np.where(kind < 0.95, sub, np.uint16(0)))
    sign = (rng.random(n) < 0.5).astype(np.uint16) << np.uint16(15)
    return (bits | sign).astype(np.uint16)


def synthetic(rng, name, n_blocks, block_bytes, scale_offsets):
    if name == "F32":
        vals = rng.standard_normal(n_blocks).astype(np.float32) * np.float32(3)
        vals[:8] = [0.0, -0.0, np.inf, -np.inf, 1e-45, -1e-45, 3.4e38, -1.17549435e-38]
        return vals.view(np.uint8).reshape(n_blocks, 4)
    if name in ("F16", "BF16"):
        bits = rng.integers(0, 1 << 16, n_blocks, dtype=np.uint32).astype(np.uint16)
        if name == "F16":
            nan = ((bits & 0x7C00) == 0x7C00) & ((bits & 0x3FF) != 0)
            bits[nan] &= 0xFC00  # NaN -> inf: NaN payload handling is not part of the contract
            bits[:6] = [0x0000, 0x8000, 0x0001, 0x03FF, 0x7BFF, 0x7C00]
        else:
            nan = ((bits & 0x7F80) == 0x7F80) & ((bits & 0x7F) != 0)
            bits[nan] &= 0xFF80
        return bits.view(np.uint8).reshape(n_blocks, 2)
    raw = rng.integers(0, 256, (n_blocks, block_bytes), dtype=np.uint8)
    if name == "MXFP4":  # the E8M0 byte: all but the few whose 12 * 2^(e-128) overflows float32
        raw[:, 0] = rng.integers(0, 253, n_blocks, dtype=np.uint8)
        raw[:4, 0] = [0, 1, 2, 252]  # subnormal scales, the smallest normal, the largest finite
    for off in scale_offsets:
        raw[:, off:off + 2] = sane_halfs(rng, n_blocks).view(np.uint8).reshape(n_blocks, 2)
    return raw


_POOLS = {}


def model_pools(models_dir):
    """type -> list of flat uint8 views of every tensor of that type (read once)."""
    if models_dir not in _POOLS:
        pools = {}
        for fname in MODEL_FILES:
            path = os.path.join(models_dir, fname)
            if not os.path.exists(path):
                continue
            reader = gguf.GGUFReader(path)
            for t in reader.tensors:
                pools.setdefault(t.tensor_type, []).append(t.data.view(np.uint8).reshape(-1))
        _POOLS[models_dir] = pools
    return _POOLS[models_dir]


def real_blocks(rng, name, want, block_bytes, models_dir):
    """Up to `want` blocks of type `name` sampled from the models that have it."""
    if want == 0:
        return np.zeros((0, block_bytes), np.uint8)
    pools = model_pools(models_dir).get(T[name], [])
    if not pools:
        return np.zeros((0, block_bytes), np.uint8)
    out = []
    for _ in range(want):
        pool = pools[rng.integers(len(pools))]
        k = rng.integers(pool.size // block_bytes)
        out.append(pool[k * block_bytes:(k + 1) * block_bytes])
    return np.stack(out)


def build(name, models_dir, seed):
    rng = np.random.default_rng([seed, list(SPEC).index(name)])
    n_syn, n_real, offs = SPEC[name]
    qtype = T[name]
    elems, nbytes = gguf.GGML_QUANT_SIZES[qtype]
    syn = synthetic(rng, name, n_syn, nbytes, offs)
    real = real_blocks(rng, name, n_real, nbytes, models_dir)
    blocks = np.concatenate([syn, real]).astype(np.uint8)
    expected = reference_dequant(blocks, qtype)
    return qtype, elems, nbytes, blocks, n_syn, expected


def reference_dequant(blocks, qtype):
    """gguf-py's dequantization of each block, as float32 (n_blocks, elems)."""
    n = blocks.shape[0]
    flat = np.ascontiguousarray(blocks).reshape(-1)
    out = dequantize(flat, qtype)
    return np.asarray(out, dtype=np.float32).reshape(n, -1)


def write(path, qtype, elems, nbytes, blocks, n_syn, expected):
    with open(path, "wb") as f:
        f.write(MAGIC)
        f.write(struct.pack("<6I", int(qtype), elems, nbytes, blocks.shape[0], n_syn, 0))
        f.write(blocks.tobytes())
        f.write(expected.astype("<f4").tobytes())


def read(path):
    """(qtype, elems, nbytes, blocks, n_syn, expected) from a reference file."""
    with open(path, "rb") as f:
        data = f.read()
    if data[:8] != MAGIC:
        raise ValueError(f"{path}: bad magic")
    qtype, elems, nbytes, n, n_syn, _ = struct.unpack_from("<6I", data, 8)
    off = 8 + 24
    blocks = np.frombuffer(data, np.uint8, n * nbytes, off).reshape(n, nbytes)
    expected = np.frombuffer(data, "<f4", n * elems, off + n * nbytes).reshape(n, elems)
    if off + n * nbytes + n * elems * 4 != len(data):
        raise ValueError(f"{path}: size mismatch")
    return qtype, elems, nbytes, blocks, n_syn, expected


def main():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=os.path.join(root, "models"))
    ap.add_argument("--out", default=os.path.join(root, "tests", "data", "quant"))
    ap.add_argument("--seed", type=int, default=20250101)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    total = 0
    for name in SPEC:
        qtype, elems, nbytes, blocks, n_syn, expected = build(name, args.models, args.seed)
        path = os.path.join(args.out, f"{name}.bin")
        write(path, qtype, elems, nbytes, blocks, n_syn, expected)
        size = os.path.getsize(path)
        total += size
        print(f"{name:5s} {blocks.shape[0]:5d} blocks ({n_syn} synthetic, {blocks.shape[0] - n_syn} real) {size} bytes")
    print(f"total {total} bytes")


if __name__ == "__main__":
    main()
