"""augur cache ls|stats|clear --kv-disk DIR: the prefix cache's disk tier from
its record headers, with no model loaded. The records are the fuzzer's seeds
(fuzz/seeds/cache_record: real records of two KV layouts, written by the
cache's own writer: per layout one prompt of two full blocks and 3 tokens,
the last a partial block) plus unusable files a server would drop."""
import json
import os
import shutil

from conftest import ROOT, run_augur

SEEDS = os.path.join(ROOT, "fuzz", "seeds", "cache_record")


def make_dir(tmp_path):
    d = tmp_path / "kv"
    d.mkdir()
    for name in os.listdir(SEEDS):
        shutil.copy(os.path.join(SEEDS, name), d / name)
    (d / "0123456789abcdef0123456789abcdef.agkv").write_bytes(b"junk")  # corrupt
    (d / "0123456789abcdef0123456789abcdef.999999-1.tmp").write_bytes(b"partial")  # a crashed write
    (d / "README").write_text("not ours")
    return d


def test_ls_lists_records_and_unusable_files(tmp_path):
    d = make_dir(tmp_path)
    p = run_augur("cache", "ls", "--kv-disk", str(d), check=True)
    out = p.stdout.decode()
    assert out.splitlines()[0].split()[:3] == ["BLOCK", "POSITIONS", "NAMESPACE"]
    for name in os.listdir(SEEDS):
        assert name in out
    assert "corrupt: truncated header" in out
    assert "temporary file" in out
    assert "README" not in out
    assert "f16/bs8/2Lx2H/3+5" in out and "f32/bs16/1Lx1H/4+4" in out
    assert "tokens:" not in out
    with_tokens = run_augur("cache", "ls", "--tokens", "--kv-disk", str(d), check=True).stdout.decode()
    assert "tokens: 1 38 75" in with_tokens
    # the partial blocks: token i of the prompt is (i * 37 + 1) % 1000, 3 of them after 2 blocks
    assert "tokens: 593 630 667\n" in with_tokens and "tokens: 185 222 259\n" in with_tokens
    assert "16-18" in out and "32-34" in out


def test_ls_json_one_object_per_line(tmp_path):
    d = make_dir(tmp_path)
    p = run_augur("cache", "ls", "--json", "--tokens", f"--kv-disk={d}", check=True)
    rows = [json.loads(line) for line in p.stdout.decode().splitlines()]
    assert len(rows) == 8
    good = [r for r in rows if "problem" not in r]
    assert len(good) == 6
    for r in good:
        bs = 8 if "/bs8/" in r["layout"] else 16
        assert r["model"] == "0000000000001234" and r["tokenizer"] == "0000000000005678"
        assert r["first_pos"] == r["block"] * bs
        assert r["n_tokens"] == (3 if r["block"] == 2 else bs)
        assert r["tokens"] == [(i * 37 + 1) % 1000 for i in range(r["first_pos"], r["first_pos"] + r["n_tokens"])]
    assert {r["namespace"] for r in good} == {"0000000000000000", "000000000000002a"}
    assert sorted(r["problem"].split(":")[0] for r in rows if "problem" in r) == ["corrupt", "temporary file"]


def test_stats(tmp_path):
    d = make_dir(tmp_path)
    s = json.loads(run_augur("cache", "stats", "--json", "--kv-disk", str(d), check=True).stdout)
    assert s["records"] == 6
    assert s["bytes"] == 3 * 688 + 3 * 720  # (header 144 + 4 * block size, payload)
    assert s["prompt_starts"] == 2
    assert s["partial_records"] == 2
    assert s["namespaces"] == 2
    assert s["unusable"] == 1 and s["temporary"] == 1
    assert sorted(m["layout"] for m in s["models"]) == ["f16/bs8/2Lx2H/3+5", "f32/bs16/1Lx1H/4+4"]
    assert all(m["records"] == 3 and m["prompt_starts"] == 1 for m in s["models"])
    text = run_augur("cache", "stats", "--kv-disk", str(d), check=True).stdout.decode()
    assert "records:        6" in text and "partial blocks: 2" in text


def test_clear_removes_records_and_leftovers_only(tmp_path):
    d = make_dir(tmp_path)
    c = json.loads(run_augur("cache", "clear", "--json", "--kv-disk", str(d), check=True).stdout)
    assert c["removed_files"] == 8
    assert c["removed_bytes"] == 3 * 688 + 3 * 720 + 4 + 7
    assert os.listdir(d) == ["README"]
    s = json.loads(run_augur("cache", "stats", "--json", "--kv-disk", str(d), check=True).stdout)
    assert s["records"] == 0 and s["oldest_use"] is None
    assert b"removed 0 files" in run_augur("cache", "clear", "--kv-disk", str(d), check=True).stdout


def test_errors(tmp_path):
    p = run_augur("cache", "ls")
    assert p.returncode == 2 and b"--kv-disk DIR is required" in p.stderr
    p = run_augur("cache", "--kv-disk", str(tmp_path))
    assert p.returncode == 2 and b"ls, stats or clear" in p.stderr
    p = run_augur("cache", "purge", "--kv-disk", str(tmp_path))
    assert p.returncode == 2 and b"unknown action 'purge'" in p.stderr
    p = run_augur("cache", "ls", "--kv-disk", str(tmp_path / "missing"))
    assert p.returncode == 1 and b"missing" in p.stderr
    assert run_augur("cache", "--help", check=True).stdout.startswith(b"usage: augur cache")
