"""`augur info` and the GGUF reader/writer, checked against the python `gguf`
package (an independent implementation of the format)."""
import os
import re
import shutil
import subprocess

import numpy as np
import pytest
from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType, GGUFWriter
from gguf.constants import GGML_QUANT_SIZES

from conftest import AUGUR, GEMMA3, QWEN_05B, SMOLLM2, TINY_GGUF, require_model, run_augur

ALL_MODELS = [TINY_GGUF, SMOLLM2, GEMMA3, QWEN_05B]
TYPE_NAMES = {
    GGUFValueType.UINT8: "u8", GGUFValueType.INT8: "i8", GGUFValueType.UINT16: "u16",
    GGUFValueType.INT16: "i16", GGUFValueType.UINT32: "u32", GGUFValueType.INT32: "i32",
    GGUFValueType.FLOAT32: "f32", GGUFValueType.BOOL: "bool", GGUFValueType.STRING: "string",
    GGUFValueType.ARRAY: "array", GGUFValueType.UINT64: "u64", GGUFValueType.INT64: "i64",
    GGUFValueType.FLOAT64: "f64",
}
NAME_TYPES = {v: k for k, v in TYPE_NAMES.items()}


# ---- the reference side: values as the gguf package parsed them ----

def _walk(parts, i, vtype):
    """Rebuilds one value from a GGUFReader field's parts (which keep the
    nesting that ReaderField.contents() flattens). Returns (value, next)."""
    if vtype == GGUFValueType.STRING:
        return bytes(parts[i + 1]), i + 2
    if vtype == GGUFValueType.ARRAY:
        et = GGUFValueType(int(parts[i][0]))
        n = int(parts[i + 1][0])
        i += 2
        items = []
        for _ in range(n):
            v, i = _walk(parts, i, et)
            items.append(v)
        return (et, items), i
    x = parts[i][0]
    if vtype == GGUFValueType.BOOL:
        return bool(x), i + 1
    if vtype in (GGUFValueType.FLOAT32, GGUFValueType.FLOAT64):
        return float(x), i + 1
    return int(x), i + 1


def reference_kv(path):
    """{key: (type, value)} in file order, from the gguf package."""
    r = GGUFReader(path)
    out = {}
    for key, f in r.fields.items():
        if key.startswith("GGUF."):
            continue  # the header pseudo-fields
        vtype = GGUFValueType(int(f.parts[2][0]))
        value, end = _walk(f.parts, 3, vtype)
        assert end == len(f.parts)
        out[key] = (vtype, value)
    return r, out


# ---- our side: parse `augur info --kv --items 0` ----

_TOKEN = re.compile(r'"((?:[^"\\]|\\.)*)"(\.\.\.)?|(true|false)\b|([a-z0-9]+)\[(\d+)\] \[|(\])|(, )'
                    r'|(-?(?:inf|nan|[0-9][0-9.e+\-]*))')
_ESC = re.compile(r'\\(u[0-9a-f]{4}|x[0-9a-f]{2}|.)')


def _unescape(s):
    out = bytearray()
    pos = 0
    for m in _ESC.finditer(s):
        out += s[pos:m.start()].encode()
        e = m.group(1)
        if e[0] in "ux" and len(e) > 1:
            out.append(int(e[1:], 16))
        else:
            out += {"n": b"\n", "r": b"\r", "t": b"\t"}.get(e, e.encode())
        pos = m.end()
    out += s[pos:].encode()
    return bytes(out)


def _parse(s, pos, vtype):
    m = _TOKEN.match(s, pos)
    assert m, f"cannot parse at {pos}: {s[pos:pos + 40]!r}"
    if m.group(1) is not None:
        assert vtype == GGUFValueType.STRING and not m.group(2), "truncated or misplaced string"
        return _unescape(m.group(1)), m.end()
    if m.group(3):
        assert vtype == GGUFValueType.BOOL
        return m.group(3) == "true", m.end()
    if m.group(4):
        assert vtype == GGUFValueType.ARRAY
        et, n = NAME_TYPES[m.group(4)], int(m.group(5))
        pos = m.end()
        items = []
        for k in range(n):
            if k:
                sep = _TOKEN.match(s, pos)
                assert sep and sep.group(7), f"expected ', ' at {pos}"
                pos = sep.end()
            v, pos = _parse(s, pos, et)
            items.append(v)
        close = _TOKEN.match(s, pos)
        assert close and close.group(6), f"expected ']' at {pos}: {s[pos:pos + 20]!r}"
        return (et, items), close.end()
    if m.group(8):
        if vtype in (GGUFValueType.FLOAT32, GGUFValueType.FLOAT64):
            return float(m.group(8)), m.end()
        return int(m.group(8)), m.end()
    raise AssertionError(f"unexpected token at {pos}: {s[pos:pos + 20]!r}")


def augur_kv(path):
    p = run_augur("info", "--kv", "--items", "0", "-m", path, check=True)
    out = {}
    for line in p.stdout.decode().split("\n"):
        if not line:
            continue
        key, tname, text = line.split("\t", 2)
        vtype = NAME_TYPES[tname]
        value, end = _parse(text, 0, vtype)
        assert end == len(text), f"{key}: trailing text {text[end:end + 20]!r}"
        out[key] = (vtype, value)
    return out


def _same(vtype, ours, ref):
    if vtype == GGUFValueType.FLOAT32:
        return np.float32(ours) == np.float32(ref) or (np.isnan(ours) and np.isnan(ref))
    if vtype == GGUFValueType.FLOAT64:
        return ours == ref or (np.isnan(ours) and np.isnan(ref))
    if vtype == GGUFValueType.ARRAY:
        (et1, a), (et2, b) = ours, ref
        return et1 == et2 and len(a) == len(b) and all(_same(et1, x, y) for x, y in zip(a, b))
    return ours == ref


def assert_kv_equal(ours, ref):
    assert list(ours) == list(ref), "keys or their order differ"
    for key in ref:
        (t1, v1), (t2, v2) = ours[key], ref[key]
        assert t1 == t2, f"{key}: type {t1} vs {t2}"
        assert _same(t1, v1, v2), f"{key}: values differ"


def augur_tensors(path):
    p = run_augur("info", "--tensors", "-m", path, check=True)
    rows = []
    for line in p.stdout.decode().split("\n"):
        if line:
            name, tname, shape, off, size = line.split("\t")
            rows.append((name, tname, [int(x) for x in shape.split("x")], int(off), int(size)))
    return rows


def summary(path):
    p = run_augur("info", "-m", path, check=True)
    assert p.stderr == b""
    return p.stdout.decode()


def field_line(text, label):
    m = re.search(rf"^{re.escape(label)}:\s+(.*)$", text, re.M)
    assert m, f"no '{label}:' line"
    return m.group(1)


def quoted(b):
    """How augur prints a string (JSON-style escapes; see put_quoted)."""
    out = []
    s = b.decode("utf-8", errors="surrogateescape")
    for ch in s:
        o = ord(ch)
        if ch in '"\\':
            out.append("\\" + ch)
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\r":
            out.append("\\r")
        elif ch == "\t":
            out.append("\\t")
        elif o < 0x20 or o == 0x7F:
            out.append(f"\\u{o:04x}")
        elif 0xDC80 <= o <= 0xDCFF:
            out.append(f"\\x{o - 0xDC00:02x}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


# ---- the summary ----

def check_summary(path, r, kv):
    out = summary(path)
    assert field_line(out, "file") == path
    assert field_line(out, "gguf version") == str(int(r.fields["GGUF.version"].parts[0][0]))
    assert field_line(out, "file size").startswith(f"{os.path.getsize(path)} bytes")
    arch = kv["general.architecture"][1]
    assert field_line(out, "architecture") == quoted(arch)
    if "general.name" in kv:
        assert field_line(out, "name") == quoted(kv["general.name"][1])

    # every scalar <arch>.* key appears under hyper-parameters with its value
    prefix = arch.decode() + "."
    hp = dict(re.findall(r"^  (\S+)\s+(.*)$", out.split("hyper-parameters:\n")[1].split("tensors:")[0], re.M))
    want = {k[len(prefix):]: v for k, v in kv.items() if k.startswith(prefix)}
    assert set(hp) == set(want)
    for k, (t, v) in want.items():
        if t == GGUFValueType.ARRAY:
            continue
        ours = float(hp[k]) if t in (GGUFValueType.FLOAT32, GGUFValueType.FLOAT64) else hp[k]
        assert _same(t, ours, v) if t in (GGUFValueType.FLOAT32, GGUFValueType.FLOAT64) else ours == str(
            v).lower(), k

    # tensors in total and by type
    total = sum(int(t.n_bytes) for t in r.tensors)
    m = re.search(r"^tensors:\s+(\d+) \((\d+) bytes", out, re.M)
    assert (int(m.group(1)), int(m.group(2))) == (len(r.tensors), total)
    by_type = {}
    for t in r.tensors:
        c, b = by_type.get(t.tensor_type.name, (0, 0))
        by_type[t.tensor_type.name] = (c + 1, b + int(t.n_bytes))
    ours = {m[0]: (int(m[1]), int(m[2])) for m in re.findall(r"^  (\S+)\s+(\d+) tensors\s+(\d+) bytes", out, re.M)}
    assert ours == by_type

    # tokenizer
    assert field_line(out, "tokenizer") == quoted(kv["tokenizer.ggml.model"][1])
    if "tokenizer.ggml.pre" in kv:
        assert field_line(out, "pre-tokenizer") == quoted(kv["tokenizer.ggml.pre"][1])
    tokens = kv["tokenizer.ggml.tokens"][1][1]
    assert field_line(out, "vocab size") == str(len(tokens))
    specials = dict((lab, (int(i), txt)) for lab, i, txt in
                    re.findall(r"^  (\w+)\s+(-?\d+)  (.*)$", out.split("special tokens:\n")[1], re.M))
    for lab, key in [("bos", "bos"), ("eos", "eos"), ("pad", "padding"), ("unk", "unknown"), ("eot", "eot")]:
        full = f"tokenizer.ggml.{key}_token_id"
        if full not in kv:
            assert lab not in specials
            continue
        tid = kv[full][1]
        assert specials[lab][0] == tid
        assert specials[lab][1] == (quoted(tokens[tid]) if tid < len(tokens) else "(not in the vocabulary)")
    for flag in ("bos", "eos"):
        key = f"tokenizer.ggml.add_{flag}_token"
        want = ("true" if kv[key][1] else "false") if key in kv else "(not set)"
        assert field_line(out, f"add_{flag}") == want
    if "tokenizer.chat_template" in kv:
        assert field_line(out, "chat template") == f"yes ({len(kv['tokenizer.chat_template'][1])} bytes)"
    else:
        assert field_line(out, "chat template") == "no"


def test_default_model_is_smollm2():
    require_model(SMOLLM2)
    env = dict(os.environ)
    env.pop("AUGUR_MODEL", None)
    p = subprocess.run([AUGUR, "info"], capture_output=True, env=env, timeout=60)
    assert p.returncode == 0, p.stderr
    assert os.path.basename(field_line(p.stdout.decode(), "file")) == os.path.basename(SMOLLM2)


def test_positional_model_and_help():
    require_model(TINY_GGUF)
    p = run_augur("info", TINY_GGUF, check=True)
    assert field_line(p.stdout.decode(), "file") == TINY_GGUF
    p = run_augur("info", "--help", check=True)
    assert b"usage: augur info" in p.stdout


# ---- every key and tensor, against the gguf package ----

def check_tensors(path, r):
    data_offset = int(field_line(summary(path), "data offset"))
    ours = augur_tensors(path)
    assert len(ours) == len(r.tensors)
    for (name, tname, shape, off, size), t in zip(ours, r.tensors):
        assert name == t.name
        assert tname == t.tensor_type.name
        assert shape == [int(x) for x in t.shape]
        assert data_offset + off == int(t.data_offset)
        assert size == int(t.n_bytes)


@pytest.mark.parametrize("path", ALL_MODELS, ids=["tiny", "smollm2", "gemma3", "qwen0.5b"])
def test_model_matches_gguf_package(path):
    """The summary, every key/value and every tensor of a real model, as the
    gguf package reads them (one GGUFReader parse per model: it is slow)."""
    require_model(path)
    r, ref = reference_kv(path)
    check_summary(path, r, ref)
    assert_kv_equal(augur_kv(path), ref)
    check_tensors(path, r)


# ---- type layouts ----

def test_type_layouts_match_gguf_package(tmp_path):
    """One tensor of every type the gguf package knows, written by it: our
    reader must know each type and compute the same byte size."""
    path = str(tmp_path / "types.gguf")
    w = GGUFWriter(path, "test")
    expect = {}
    for qt, (blck, nbytes) in GGML_QUANT_SIZES.items():
        rows, blocks = 2, 3
        raw = np.arange(rows * blocks * nbytes, dtype=np.uint8).reshape(rows, blocks * nbytes)
        w.add_tensor(f"t.{qt.name}", raw, raw_dtype=qt)
        expect[f"t.{qt.name}"] = (qt.name, [blocks * blck, rows], rows * blocks * nbytes)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    ours = {name: (tname, shape, size) for name, tname, shape, _, size in augur_tensors(path)}
    assert set(ours) == set(expect)
    for name, (tname, shape, size) in expect.items():
        if tname == "Q8_1":
            # gguf-py still lists Q8_1 as 40 bytes (two f32), but ggml's
            # block_q8_1 has been two f16 + 32 quants = 36 bytes for years
            # (ggml-common.h static_assert); Q8_1 never appears in files.
            assert ours[name] == (tname, shape, size * 36 // 40)
        else:
            assert ours[name] == (tname, shape, size), name


# ---- writer <-> gguf package ----

def _test_gguf_bin():
    path = os.path.join(os.path.dirname(AUGUR), "tests", "test_gguf")
    if not os.path.exists(path):
        pytest.skip(f"{path} not built (make unit)")
    return path


def test_our_written_file_reads_identically_in_gguf_package(tmp_path):
    path = str(tmp_path / "sample.gguf")
    subprocess.run([_test_gguf_bin(), "--write-sample", path], check=True, timeout=60)
    r, ref = reference_kv(path)
    ours = augur_kv(path)
    assert_kv_equal(ours, ref)
    # the sample holds every value type, including nested and string arrays
    types = {t for t, _ in ref.values()}
    assert types == set(GGUFValueType)
    assert ref["a.deep"][0] == GGUFValueType.ARRAY
    assert ref["a.arr_strs"][1][1][0][1][2] == "héllo €".encode()
    assert ref["s.i64"][1] == -(2 ** 63) and ref["s.u64"][1] == 2 ** 64 - 4
    # tensors: placement, alignment and bytes (fill pattern of test_gguf.c)
    assert r.alignment == 64
    for i, ((name, tname, shape, off, size), t) in enumerate(zip(augur_tensors(path), r.tensors)):
        assert (name, tname, shape, size) == (t.name, t.tensor_type.name, [int(x) for x in t.shape], int(t.n_bytes))
        assert int(t.data_offset) % 64 == 0
        want = ((np.arange(size, dtype=np.uint64) * 31 + i * 7 + 1) % 256).astype(np.uint8)
        got = np.frombuffer(open(path, "rb").read(), dtype=np.uint8, count=size, offset=int(t.data_offset))
        assert np.array_equal(got, want), name


def test_gguf_package_written_file_reads_identically(tmp_path):
    """The other direction: every value type written by the gguf package."""
    path = str(tmp_path / "py.gguf")
    w = GGUFWriter(path, "llama")
    scalars = [
        ("s.u8", 250, GGUFValueType.UINT8), ("s.i8", -100, GGUFValueType.INT8),
        ("s.u16", 65000, GGUFValueType.UINT16), ("s.i16", -32000, GGUFValueType.INT16),
        ("s.u32", 2 ** 32 - 1, GGUFValueType.UINT32), ("s.i32", -(2 ** 31), GGUFValueType.INT32),
        ("s.f32", 0.1, GGUFValueType.FLOAT32), ("s.bool", True, GGUFValueType.BOOL),
        ("s.str", "tab\there \"q\" \\ \x01 \u00e9\U0001F600", GGUFValueType.STRING),
        ("s.u64", 2 ** 64 - 1, GGUFValueType.UINT64), ("s.i64", -(2 ** 63), GGUFValueType.INT64),
        ("s.f64", 1e-300, GGUFValueType.FLOAT64),
    ]
    for k, v, t in scalars:
        w.add_key_value(k, v, t)
    w.add_array("a.ints", [1, -2, 3])
    w.add_array("a.floats", [0.5, -1.25])
    w.add_array("a.strs", ["", "a", "\n", "long" * 100])
    w.add_array("a.nested", [[1, 2], [3]])
    w.add_array("a.nested_strs", [["x", "y"], ["z"]])
    w.add_array("a.deeper", [[[1], [2, 3]], [[4]]])
    w.add_array("a.bools", [True, False])
    w.add_tensor("w", np.arange(12, dtype=np.float32).reshape(3, 4))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    _, ref = reference_kv(path)
    ours = augur_kv(path)
    assert_kv_equal(ours, ref)
    assert ours["a.deeper"][1][1][0][1][1][1] == [2, 3]
    assert ours["s.str"][1] == scalars[8][1].encode()
    assert augur_tensors(path) == [("w", "F32", [4, 3], 0, 48)]


def test_control_characters_in_names_stay_escaped(tmp_path):
    path = str(tmp_path / "names.gguf")
    w = GGUFWriter(path, "llama")
    w.add_uint32("bad\nkey\x01", 5)
    w.add_tensor("t\tab", np.zeros(4, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    kv = run_augur("info", "--kv", "-m", path, check=True).stdout.decode().splitlines()
    assert "bad\\x0akey\\x01\tu32\t5" in kv
    t = run_augur("info", "--tensors", "-m", path, check=True).stdout.decode().splitlines()
    assert t == ["t\\x09ab\tF32\t4\t0\t16"]


# ---- errors ----

def test_truncated_file_is_a_clean_error(tmp_path):
    require_model(TINY_GGUF)
    data = open(TINY_GGUF, "rb").read()
    for n in (0, 3, 10, 24, 100, 5000, 14000, len(data) - 1):
        bad = tmp_path / f"trunc{n}.gguf"
        bad.write_bytes(data[:n])
        p = run_augur("info", "-m", str(bad))
        assert p.returncode == 1, n
        assert p.stdout == b""
        err = p.stderr.decode()
        assert err.startswith(f"augur: {bad}: ") and err.count("\n") == 1, err
    # the message says what and where
    p = run_augur("info", "-m", str(tmp_path / "trunc5000.gguf"))
    assert "offset" in p.stderr.decode() and "tokenizer.ggml.tokens" in p.stderr.decode()
    p = run_augur("info", "-m", str(tmp_path / f"trunc{len(data) - 1}.gguf"))
    assert "beyond end of file" in p.stderr.decode()


def test_corrupt_files_are_clean_errors(tmp_path):
    require_model(TINY_GGUF)
    data = bytearray(open(TINY_GGUF, "rb").read())
    cases = {
        "magic": (0, b"GGUX", "not a GGUF file"),
        "v1": (4, (1).to_bytes(4, "little"), "version 1"),
        "tensors": (8, (2 ** 62).to_bytes(8, "little"), "tensor count"),
        "keys": (16, (2 ** 40).to_bytes(8, "little"), "key/value count"),
    }
    for name, (off, patch, needle) in cases.items():
        bad = bytearray(data)
        bad[off:off + len(patch)] = patch
        path = tmp_path / f"{name}.gguf"
        path.write_bytes(bytes(bad))
        p = run_augur("info", "-m", str(path))
        assert p.returncode == 1, name
        assert needle in p.stderr.decode(), p.stderr


def test_missing_file_and_bad_usage(tmp_path):
    missing = str(tmp_path / "nope.gguf")
    p = run_augur("info", "-m", missing)
    assert p.returncode == 1
    assert p.stderr.decode() == f"augur: {missing}: No such file or directory\n"
    p = run_augur("info", "-m", str(tmp_path))
    assert p.returncode == 1 and b"not a regular file" in p.stderr
    for args in (["--frobnicate"], ["-m"], ["a.gguf", "b.gguf"], ["--items", "x", "--kv"]):
        p = run_augur("info", *args)
        assert p.returncode == 2, args
        assert b"usage: augur info" in p.stderr


# ---- the environment switches (src/base/switches.c) ----

def test_switch_table_is_the_readme_list_and_covers_every_variable_read():
    """`augur info --switches` prints the one table of AUGUR_* variables;
    the README's list is that output, every name the code asks for by a
    string literal is in it, and every entry is read somewhere."""
    out = subprocess.run([AUGUR, "info", "--switches"], capture_output=True, text=True, check=True).stdout
    root = os.path.join(os.path.dirname(__file__), "..", "..")
    readme = open(os.path.join(root, "README.md"), encoding="utf-8").read()
    listed = readme.split("<!-- switches:begin -->\n", 1)[1].split("<!-- switches:end -->", 1)[0]
    assert listed == out, "README's switch list is not `augur info --switches` (paste its output between the markers)"
    table = re.findall(r"^\| `(AUGUR_[A-Z0-9_]+)` \|", out, re.M)
    assert table == sorted(table), "the table must stay in name order (the lookup bisects)"
    read, direct = set(), []
    for d, _, files in os.walk(os.path.join(root, "src")):
        for f in files:
            if f.endswith((".c", ".h", ".cu", ".cuh")) and f not in ("switches.c", "switches.h"):
                text = open(os.path.join(d, f), encoding="utf-8").read()
                read |= set(re.findall(r'"(AUGUR_[A-Z0-9_]+)"', text))
                # the table is the only reader of AUGUR_* variables: getenv only with other literal names
                direct += [f"{f}: getenv({a}" for a in re.findall(r'getenv\(\s*("AUGUR_|[^"\s])', text)]
    assert not direct, f"read the environment through src/base/switches.h: {direct}"
    assert read - set(table) == set(), f"read but not in the table: {sorted(read - set(table))}"
    assert set(table) - read == set(), f"in the table but read nowhere: {sorted(set(table) - read)}"
