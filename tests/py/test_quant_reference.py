"""Checks the dequantization reference data (tests/data/quant) that
tests/unit/test_quant.c compares augur's dequantization against: every file
must still be exactly what gguf-py (the independent reference) computes from
its blocks, cover every supported type, and stay small. The synthetic part
must be reproducible by scripts/quant_reference.py."""
import importlib.util
import os

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DATA = os.path.join(ROOT, "tests", "data", "quant")

gguf = pytest.importorskip("gguf")


def _load_script():
    spec = importlib.util.spec_from_file_location("quant_reference", os.path.join(ROOT, "scripts", "quant_reference.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


qr = _load_script()
TYPES = list(qr.SPEC)


def test_all_types_present_and_small():
    total = 0
    for name in TYPES:
        path = os.path.join(DATA, f"{name}.bin")
        assert os.path.exists(path), f"missing {path}: run scripts/quant_reference.py"
        total += os.path.getsize(path)
    assert total < 2 * 1024 * 1024


@pytest.mark.parametrize("name", TYPES)
def test_expected_values_are_gguf_py(name):
    qtype, elems, nbytes, blocks, n_syn, expected = qr.read(os.path.join(DATA, f"{name}.bin"))
    assert qtype == int(gguf.GGMLQuantizationType[name])
    assert (elems, nbytes) == tuple(gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[name]])
    assert blocks.shape[0] >= 96
    again = qr.reference_dequant(blocks, gguf.GGMLQuantizationType[name])
    # bit for bit (the data has no NaNs)
    assert np.array_equal(again.view(np.uint32), expected.view(np.uint32))
    assert np.isfinite(expected).all() or name in ("F32", "F16", "BF16")


@pytest.mark.parametrize("name", TYPES)
def test_synthetic_blocks_reproducible(tmp_path, name):
    _, _, _, blocks, n_syn, _ = qr.read(os.path.join(DATA, f"{name}.bin"))
    # with no models directory only the synthetic blocks are generated
    _, _, _, gen, gen_syn, _ = qr.build(name, str(tmp_path / "no-models"), 20250101)
    assert gen_syn == n_syn
    assert np.array_equal(gen[:n_syn], blocks[:n_syn])


def test_mxfp4_reference_is_ggml_c():
    """gguf-py's MXFP4 dequantization (the reference file's floats) against
    ggml's own C dequantize_row_mxfp4, from the libggml-base that
    llama-cpp-python ships: the value table, the nibble order and the
    half-scale E8M0 exponent (subnormal scales included) as llama.cpp reads
    gpt-oss's expert weights."""
    import ctypes
    import glob

    llama_cpp = pytest.importorskip("llama_cpp")
    libs = glob.glob(os.path.join(os.path.dirname(llama_cpp.__file__), "lib", "libggml-base.so*"))
    if not libs:
        pytest.skip("llama-cpp-python without libggml-base")
    lib = ctypes.CDLL(sorted(libs)[0])
    fn = lib.dequantize_row_mxfp4
    fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
    fn.restype = None
    _, elems, _, blocks, _, expected = qr.read(os.path.join(DATA, "MXFP4.bin"))
    src = np.ascontiguousarray(blocks)
    out = np.zeros(blocks.shape[0] * elems, np.float32)
    fn(src.ctypes.data, out.ctypes.data, out.size)
    assert np.array_equal(out.view(np.uint32), expected.reshape(-1).view(np.uint32))
