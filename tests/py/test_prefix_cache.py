"""The prefix cache in the server (issue 10): KV blocks of earlier prompts
are reused across conversations (memory tier) and across restarts (disk
tier, --kv-disk), and whatever happens to the directory (corrupt,
truncated, foreign or half-written records, two servers, a full disk, a
byte cap), the output at temperature 0 is the one a cold server gives.

"Cold" answers come from the session servers of conftest (no disk tier)
with a fresh cache_salt per request, so nothing cached can be shared."""
import json
import os
import random
import shutil
import signal
import socket
import struct
import subprocess
import threading
import time
import urllib.request
import uuid

import numpy as np
import pytest
import xxhash

from conftest import AUGUR, SMOLLM2, TINY_GGUF, AugurServer, require_model

BLOCK = 16  # the KV block size (kv.h default)
READERS = 4  # the disk tier's reader threads (ag_cache_params.read_threads default): records read at once
RECORD_EXT = ".agkv"


def n_records(n_prompt):
    """Records of one prompt: its full blocks and, when n_prompt is not a
    multiple of the block size, the partial block of its last tokens."""
    return -(-n_prompt // BLOCK)


def story(seed, n=12):
    """A prompt of roughly 30 tokens per sentence for stories260K."""
    rnd = random.Random(seed)
    names = ["Tim", "Lily", "Max", "Sue", "Ben", "Mia", "Sam", "Ann"]
    things = ["a red ball", "a big tree", "a small dog", "a blue car", "a happy bird", "a funny hat"]
    return " ".join(f"{rnd.choice(names)} went to the park and saw {rnd.choice(things)} number {rnd.randrange(1000)}."
                    for _ in range(n))


P = story(1)


def post(server, path, body, timeout=120):
    req = urllib.request.Request(server.base + path, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


def complete(server, prompt, salt=None, n=16):
    """(text, prompt_tokens, cached_tokens) of a greedy completion."""
    body = {"model": "x", "prompt": prompt, "max_tokens": n, "temperature": 0}
    if salt is not None:
        body["cache_salt"] = salt
    r = post(server, "/v1/completions", body)
    u = r["usage"]
    return r["choices"][0]["text"], u["prompt_tokens"], u["prompt_tokens_details"]["cached_tokens"]


def tokenize(server, text):
    """The token ids of a completion prompt (what the server computes for it)."""
    return post(server, "/tokenize", {"content": text, "add_special": True})["tokens"]


def cold(server, prompt, n=16):
    text, _, cached = complete(server, prompt, salt=uuid.uuid4().hex, n=n)
    assert cached == 0
    return text


def metrics(server):
    with urllib.request.urlopen(server.base + "/metrics", timeout=30) as r:
        out = {}
        for line in r.read().decode().splitlines():
            if line and not line.startswith("#") and "{" not in line:
                k, v = line.split()
                out[k] = float(v)
        return out


def wait_for(server, cond, what, timeout=20):
    deadline = time.time() + timeout
    while True:
        m = metrics(server)
        if cond(m):
            return m
        if time.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}: {m}\n{server.stderr()[-3000:]}")
        time.sleep(0.05)


def wait_scan(server):
    return wait_for(server, lambda m: m["augur_prefix_cache_disk_scan_done"] == 1, "the disk scan")


def records(d):
    return sorted(f for f in os.listdir(d) if f.endswith(RECORD_EXT))


def disk_bytes(d):
    return sum(os.path.getsize(os.path.join(d, f)) for f in os.listdir(d))


def listing(d):
    """`augur cache ls --json`: one dict per file (valid or not)."""
    p = subprocess.run([AUGUR, "cache", "ls", "--kv-disk", d, "--json"], capture_output=True, timeout=60)
    assert p.returncode == 0, p.stderr.decode()
    return [json.loads(l) for l in p.stdout.decode().splitlines() if l.strip()]


@pytest.fixture
def servers():
    """Factory for servers this test stops itself (or that are killed);
    whatever is still running at the end is stopped."""
    started = []

    def start(model, *args, **kw):
        s = AugurServer(model, *args, **kw)
        started.append(s)
        return s

    yield start
    for s in started:
        if s.proc.poll() is None:
            s.stop()


def stop_ok(s):
    rc = s.stop()
    assert rc == 0, s.final_stderr[-4000:]


# ---- restart: the disk tier ----

@pytest.mark.parametrize("model", [TINY_GGUF, SMOLLM2], ids=["stories260K", "SmolLM2"])
def test_restart_restores_the_prompt_from_disk(servers, tmp_path, tiny_server, smol_server, model):
    require_model(model)
    ref = tiny_server if model == TINY_GGUF else smol_server
    d = str(tmp_path / "kv")
    a = servers(model, "--kv-disk", d)
    text_a, n_prompt, cached = complete(a, P)
    assert cached == 0
    assert n_prompt > 150
    stop_ok(a)  # SIGTERM: the flush at shutdown writes what was not written yet
    assert n_prompt % BLOCK != 0  # (so that the last block is a partial one)
    assert len(records(d)) == n_records(n_prompt)

    b = servers(model, "--kv-disk", d)
    wait_scan(b)
    text_b, _, cached = complete(b, P)
    # all of P but its last token (computed for the logits): the full blocks
    # and the partial one, whose record is read and used but for that token
    assert cached == n_prompt - 1
    m = metrics(b)
    assert m["augur_prefix_cache_tokens_restored_disk_total"] == cached
    assert m["augur_prefix_cache_disk_bytes_read_total"] > 0
    assert m["augur_prefix_cache_disk_restore_seconds_total"] > 0
    assert m["augur_prefix_cache_hits_total"] == 1
    stop_ok(b)

    assert text_a == text_b == cold(ref, P)


@pytest.mark.parametrize("tier", ["memory", "disk"])
def test_a_prompt_that_diverges_inside_a_block_adopts_the_common_run(servers, tmp_path, smol_server, tier):
    """A cached block is adopted in part: up to where the new prompt leaves
    it, here 7 tokens into block 5 (a full block of the first prompt, read
    from its record after a restart in the disk case)."""
    require_model(SMOLLM2)
    args = ("--kv-disk", str(tmp_path / "kv")) if tier == "disk" else ("--no-kv-disk",)
    s = servers(SMOLLM2, *args)
    a = tokenize(s, P)
    k = 5 * BLOCK + 7
    b = a[:k] + tokenize(s, story(2))[-40:]
    assert len(a) > 7 * BLOCK and b[k] != a[k]
    _, n_a, cached = complete(s, a, n=1)
    assert (n_a, cached) == (len(a), 0)
    if tier == "disk":
        stop_ok(s)
        s = servers(SMOLLM2, *args)
        wait_scan(s)
    text, n, cached = complete(s, b)
    assert (n, cached) == (len(b), k)
    m = metrics(s)
    assert m["augur_prefix_cache_tokens_restored_" + tier + "_total"] == k
    stop_ok(s)
    assert text == cold(smol_server, b)


# ---- the host tier (--kv-host-mem) ----

def test_blocks_evicted_from_the_pool_come_back_from_the_host_tier(servers, tmp_path, tiny_server):
    """A pool of one context (--kv-mem) lets the first prompt's blocks go
    when a second prompt needs the room: with --kv-host-mem they move to
    host memory and the first prompt, asked again, adopts them from there
    (no disk tier), with the text of a cold server; the host tier stays
    within its bound and /metrics counts hits per tier."""
    s = servers(TINY_GGUF, "--no-kv-disk", "--ctx", "512", "--parallel", "1", "--kv-mem", "320K",
                "--kv-host-mem", "1M")
    q = story(3)
    text_p, n_p, cached = complete(s, P)
    assert cached == 0 and n_p > 300
    _, n_q, cached = complete(s, q)
    assert cached < BLOCK and n_p + n_q > 512  # (it may share the first token)
    m = metrics(s)
    assert m["augur_prefix_cache_evictions_memory_total"] > 0
    assert m["augur_prefix_cache_host_blocks"] > 0
    assert 0 < m["augur_prefix_cache_host_bytes"] <= m["augur_prefix_cache_host_max_bytes"] <= 1 << 20
    mem0 = m["augur_prefix_cache_tokens_restored_memory_total"]
    text, _, cached = complete(s, P)
    assert cached == n_p - 1
    m = metrics(s)
    assert m["augur_prefix_cache_tokens_restored_host_total"] > 0
    assert m["augur_prefix_cache_hits_host_total"] == 1
    assert m["augur_prefix_cache_hits_disk_total"] == 0
    assert (m["augur_prefix_cache_tokens_restored_host_total"] + m["augur_prefix_cache_tokens_restored_memory_total"]
            - mem0 == cached)
    stop_ok(s)
    assert text == text_p == cold(tiny_server, P)


def test_host_tier_overflow_goes_to_disk_and_survives_a_restart(servers, tmp_path, tiny_server):
    """A host tier smaller than what the pool evicts passes its oldest
    blocks on to the disk; after a restart the disk serves the prompt."""
    d = str(tmp_path / "kv")
    s = servers(TINY_GGUF, "--kv-disk", d, "--ctx", "512", "--parallel", "1", "--kv-mem", "320K",
                "--kv-host-mem", "64K")
    wait_scan(s)
    text_p, n_p, _ = complete(s, P)
    complete(s, story(3))
    complete(s, story(4))
    m = metrics(s)
    assert m["augur_prefix_cache_host_bytes"] <= m["augur_prefix_cache_host_max_bytes"] <= 64 << 10
    assert m["augur_prefix_cache_evictions_host_total"] > 0
    stop_ok(s)
    b = servers(TINY_GGUF, "--kv-disk", d, "--ctx", "512", "--parallel", "1", "--kv-mem", "320K",
                "--kv-host-mem", "64K")
    wait_scan(b)
    text, _, cached = complete(b, P)
    assert cached == n_p - 1
    m = metrics(b)
    assert m["augur_prefix_cache_hits_disk_total"] == 1
    assert m["augur_prefix_cache_tokens_restored_disk_total"] == cached
    stop_ok(b)
    assert text == text_p == cold(tiny_server, P)


# ---- the memory tier ----

def test_second_conversation_shares_a_long_system_prompt(smol_server, servers):
    require_model(SMOLLM2)
    s = servers(None, "--no-kv-disk", "--parallel", "2")
    system = ("You are a careful assistant for a small bakery. " + story(7, 6) +
              " Always answer in one short sentence and never use lists.")

    def chat(server, question, salt=None):
        body = {"model": "x", "max_tokens": 12, "temperature": 0,
                "messages": [{"role": "system", "content": system}, {"role": "user", "content": question}]}
        if salt:
            body["cache_salt"] = salt
        r = post(server, "/v1/chat/completions", body)
        return r["choices"][0]["message"]["content"], r["usage"]

    _, u1 = chat(s, "When do you open on Sundays?")
    assert u1["prompt_tokens_details"]["cached_tokens"] == 0
    text, u2 = chat(s, "Do you sell rye bread?")
    cached = u2["prompt_tokens_details"]["cached_tokens"]
    # the two prompts' common run of tokens, the whole system prompt and the
    # template up to the user's words, to the token (inside a block)
    assert cached == common_run(chat_ids(s, system, "When do you open on Sundays?"),
                                chat_ids(s, system, "Do you sell rye bread?"))
    assert 100 <= cached < u2["prompt_tokens"]
    m = metrics(s)
    assert m["augur_prefix_cache_tokens_restored_memory_total"] == cached
    assert m["augur_prefix_cache_disk_enabled"] == 0
    text_cold, u3 = chat(smol_server, "Do you sell rye bread?", salt=uuid.uuid4().hex)
    assert u3["prompt_tokens_details"]["cached_tokens"] == 0
    assert text == text_cold
    stop_ok(s)


def common_run(a, b):
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def chat_ids(server, system, question):
    """The token ids of a chat prompt: SmolLM2's template rendered by Python's
    jinja2 as transformers renders it, tokenized by the server."""
    from test_server_tools import gguf_template, hf_render
    text = hf_render(gguf_template(SMOLLM2), [{"role": "system", "content": system},
                                                   {"role": "user", "content": question}])
    return post(server, "/tokenize", {"content": text, "add_special": True, "parse_special": True})["tokens"]


def test_cache_salt_separates_namespaces(tiny_server):
    s = tiny_server
    p = story(11)
    salt = uuid.uuid4().hex
    t1, n, c1 = complete(s, p, salt=salt)
    t2, _, c2 = complete(s, p, salt=salt)
    t3, _, c3 = complete(s, p, salt=salt + "x")
    t4, _, c4 = complete(s, p)
    t5, _, c5 = complete(s, p)
    assert (c1, c3, c4) == (0, 0, 0)
    assert c2 == c5 == n - 1
    assert t1 == t2 == t3 == t4 == t5


def test_cache_salt_must_be_a_string(tiny_server):
    req = urllib.request.Request(tiny_server.base + "/v1/completions",
                                 data=json.dumps({"model": "x", "prompt": "hi", "cache_salt": 3}).encode(),
                                 headers={"Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=30)
    assert e.value.code == 400
    assert json.loads(e.value.read())["error"]["param"] == "cache_salt"


# ---- damaged directories ----

def test_bad_records_are_dropped_and_prefilled(servers, tmp_path, tiny_server):
    require_model(SMOLLM2)
    d = str(tmp_path / "kv")
    a = servers(TINY_GGUF, "--kv-disk", d)
    _, n_prompt, _ = complete(a, P)
    stop_ok(a)
    by_block = {e["block"]: e["file"] for e in listing(d)}
    assert len(by_block) == n_records(n_prompt) >= 12

    # a flipped payload byte in block 5 (found at restore: the header is fine)
    path = os.path.join(d, by_block[5])
    with open(path, "r+b") as f:
        f.seek(-100, os.SEEK_END)
        byte = f.read(1)
        f.seek(-100, os.SEEK_END)
        f.write(bytes([byte[0] ^ 0x40]))
    # block 9 truncated (found at the scan)
    path = os.path.join(d, by_block[9])
    os.truncate(path, os.path.getsize(path) // 2)
    # a leftover of a writer that is gone (no process has this pid)
    with open(os.path.join(d, by_block[11]), "rb") as f:
        data = f.read()
    with open(os.path.join(d, by_block[11][:32] + ".4194999-7.tmp"), "wb") as f:
        f.write(data[: len(data) // 3])
    # records of another model in the same directory
    d2 = str(tmp_path / "smol")
    o = servers(SMOLLM2, "--kv-disk", d2)
    complete(o, "The quick brown fox jumps over the lazy dog. " * 4, n=2)
    stop_ok(o)
    foreign = records(d2)
    assert foreign
    for f in foreign:
        os.rename(os.path.join(d2, f), os.path.join(d, f))

    b = servers(TINY_GGUF, "--kv-disk", d)
    m = wait_scan(b)
    assert m["augur_prefix_cache_disk_dropped_records_total"] == len(foreign) + 2
    assert m["augur_prefix_cache_disk_records"] == n_records(n_prompt) - 1
    text, _, cached = complete(b, P)
    assert cached == 5 * BLOCK  # blocks 0-4; block 5 fails its checksum and is prefilled from there
    m = metrics(b)
    assert m["augur_prefix_cache_disk_restore_failures_total"] == 1
    assert m["augur_prefix_cache_disk_dropped_records_total"] == len(foreign) + 3
    log = b.stderr()
    assert "truncated" in log and "temporary" in log
    stop_ok(b)
    assert text == cold(tiny_server, P)
    # nothing unusable is left: the damaged files were deleted, the prompt written again
    left = listing(d)
    assert all(e.get("problem") is None for e in left), left
    assert len({e["model"] for e in left}) == 1  # the foreign records are gone
    assert len(left) == n_records(n_prompt)


def test_kill_9_during_write_behind_never_restores_a_partial_record(servers, tmp_path, tiny_server):
    d = str(tmp_path / "kv")
    rnd = random.Random(1234)
    deadline = time.time() + 60
    prev, kills = None, 0
    while kills < 50 and time.time() < deadline:
        s = servers(TINY_GGUF, "--kv-disk", d)
        wait_scan(s)
        if prev is not None:
            text, _, _ = complete(s, prev)
            assert text == cold(tiny_server, prev), f"after kill {kills}"
            m = metrics(s)
            assert m["augur_prefix_cache_disk_restore_failures_total"] == 0, s.stderr()[-3000:]
        prev = story(100 + kills, 14)
        complete(s, prev)
        time.sleep(rnd.uniform(0, 0.03))  # write-behind runs now
        s.proc.send_signal(signal.SIGKILL)
        s.proc.wait()
        s.stop()
        kills += 1
    # 50 take about 11 s on a plain build; a sanitized one starts servers
    # several times slower and does what fits in the minute
    assert kills >= 10, f"only {kills} kills in a minute"
    s = servers(TINY_GGUF, "--kv-disk", d)
    wait_scan(s)
    text, n, cached = complete(s, prev)
    assert text == cold(tiny_server, prev)
    assert metrics(s)["augur_prefix_cache_disk_restore_failures_total"] == 0
    stop_ok(s)
    assert all(e.get("problem") is None for e in listing(d))


def test_two_servers_on_one_directory(servers, tmp_path, tiny_server):
    d = str(tmp_path / "kv")
    a = servers(TINY_GGUF, "--kv-disk", d)
    b = servers(TINY_GGUF, "--kv-disk", d)
    p1, p2 = story(21), story(22)
    # the same prompt on both (same record names), and one of its own each
    for s in (a, b, a, b):
        complete(s, P)
    complete(a, p1)
    complete(b, p2)
    for s in (a, b):
        s.proc.send_signal(signal.SIGTERM)
    stop_ok(a)
    stop_ok(b)
    assert all(e.get("problem") is None for e in listing(d))

    c = servers(TINY_GGUF, "--kv-disk", d)
    wait_scan(c)
    assert metrics(c)["augur_prefix_cache_disk_dropped_records_total"] == 0
    for p in (P, p1, p2):
        text, n, cached = complete(c, p)
        assert cached == n - 1
        assert text == cold(tiny_server, p)
    assert metrics(c)["augur_prefix_cache_disk_restore_failures_total"] == 0
    stop_ok(c)


def test_disk_cap_is_kept(servers, tmp_path):
    d = str(tmp_path / "kv")
    cap = 64 * 1024
    s = servers(TINY_GGUF, "--kv-disk", d, "--kv-disk-max", "64K")
    wait_scan(s)
    for i in range(4):
        complete(s, story(30 + i, 8), n=4)
    m = wait_for(s, lambda m: m["augur_prefix_cache_disk_records_written_total"] >= 12 and
                 m["augur_prefix_cache_disk_bytes"] <= cap and m["augur_prefix_cache_disk_evictions_total"] > 0,
                 "records written and the cap enforced")
    assert m["augur_prefix_cache_disk_max_bytes"] == cap
    stop_ok(s)
    assert 0 < disk_bytes(d) <= cap


class DirSampler(threading.Thread):
    """Samples the bytes of record and temp files in a directory as fast as
    it can, until stopped: the peak is what the directory held at worst."""

    def __init__(self, d):
        super().__init__(daemon=True)
        self.d, self.peak, self.done = d, 0, threading.Event()

    def run(self):
        while not self.done.is_set():
            total = 0
            for f in os.listdir(self.d):
                if f.endswith((RECORD_EXT, ".tmp")):
                    try:
                        total += os.path.getsize(os.path.join(self.d, f))
                    except FileNotFoundError:  # renamed or deleted meanwhile
                        pass
            self.peak = max(self.peak, total)

    def stop(self):
        self.done.set()
        self.join()
        return self.peak


def test_disk_cap_is_a_hard_bound_while_writing(servers, tmp_path, tiny_server):
    """Records queued for the writer count against --kv-disk-max, so the
    directory never holds more than the cap while a prompt many times its
    size is written (issue 51: a 2 MiB cap peaked at 26-38 MiB). The one
    record of slack is for the sampler, whose listing can see a record
    under its temp name and its final name at once."""
    d = str(tmp_path / "kv")
    cap = 32 * 1024
    s = servers(TINY_GGUF, "--kv-disk", d, "--kv-disk-max", "32K")
    wait_scan(s)
    sampler = DirSampler(d)
    sampler.start()
    prompt = story(77, 14)  # ~375 tokens: 24 records of ~10 KiB
    n = len(tokenize(s, prompt))
    text, _, _ = complete(s, prompt, n=4)
    m = wait_for(s, lambda m: m["augur_prefix_cache_disk_records_written_total"] >= 1 and
                 m["augur_prefix_cache_disk_queued_bytes"] == 0 and
                 m["augur_prefix_cache_disk_records_written_total"] + m["augur_prefix_cache_disk_records_skipped_total"]
                 >= n_records(n), "the prompt's records written or left out")
    time.sleep(0.3)
    peak = sampler.stop()
    rec = os.path.getsize(os.path.join(d, records(d)[0]))
    assert n_records(n) * rec > 4 * cap  # (the prompt is far larger than the cap)
    assert 0 < peak <= cap + rec, f"peak {peak} bytes on disk, cap {cap}, record {rec}"
    assert m["augur_prefix_cache_disk_bytes"] <= cap
    assert m["augur_prefix_cache_disk_records_skipped_total"] > 0  # the prompt's tail: older than its head
    # what stayed is the prompt's head: a restart restores it
    stop_ok(s)
    assert 0 < disk_bytes(d) <= cap
    s = servers(TINY_GGUF, "--kv-disk", d, "--kv-disk-max", "32K")
    wait_scan(s)
    t2, n2, cached = complete(s, prompt, n=4)
    assert cached == (cap // rec) * BLOCK and t2 == text
    stop_ok(s)


def test_full_disk_pauses_writing_evicts_and_resumes(servers, tmp_path, tiny_server):
    """A full disk pauses writing instead of stopping it for good (issue 51:
    16 MB of records stayed on a full 16 MiB volume for the rest of the
    server's life): the cap in force drops to half of the room there, the
    least recently used records go at once, and after the pause new records
    are written. One warning; serving goes on, with cold text."""
    probe = subprocess.run(["unshare", "-m", "sh", "-c", "mount -t tmpfs -o size=64k augur-probe /mnt"],
                           capture_output=True)
    if probe.returncode != 0:
        pytest.skip("cannot mount a tmpfs in a private mount namespace here (unshare -m needs CAP_SYS_ADMIN): "
                    + probe.stderr.decode(errors="replace").strip())
    d = str(tmp_path / "tiny-fs")
    os.mkdir(d)
    # a 256 KiB tmpfs over d, seen only by the server (the test looks at it
    # through /proc/PID/root, which resolves in the server's mounts)
    wrap = ["unshare", "-m", "sh", "-c", 'mount -t tmpfs -o size=256k augur-test "$0" && exec "$@"', d]
    env = dict(os.environ, AUGUR_TEST_KV_SPACE_RETRY_MS="300")
    s = servers(TINY_GGUF, "--kv-disk", d, "--kv-disk-max", "1G", prefix=wrap, env=env)
    seen = f"/proc/{s.proc.pid}/root{d}"
    wait_scan(s)
    prompts = [story(40 + i, 8) for i in range(6)]
    for p in prompts:
        complete(s, p, n=4)
    m = wait_for(s, lambda m: m["augur_prefix_cache_disk_full_total"] >= 1, "the disk to fill")
    assert m["augur_prefix_cache_disk_writable"] == 1 and m["augur_prefix_cache_disk_enabled"] == 1
    assert m["augur_prefix_cache_disk_max_bytes"] < 256 * 1024
    vfs = os.statvfs(seen)
    assert vfs.f_bavail * vfs.f_frsize >= 64 * 1024, "the disk was left full"
    # after the pause, new prompts are written again
    m = wait_for(s, lambda m: m["augur_prefix_cache_disk_write_paused"] == 0, "the pause to end")
    written = m["augur_prefix_cache_disk_records_written_total"]
    later = [story(60 + i, 4) for i in range(2)]
    for p in later:
        complete(s, p, n=4)
    m = wait_for(s, lambda m: m["augur_prefix_cache_disk_records_written_total"] > written, "writes after the pause")
    assert m["augur_prefix_cache_disk_bytes"] <= m["augur_prefix_cache_disk_max_bytes"]
    for p in prompts + later:  # still serving, the text a cold server gives
        text, n, cached = complete(s, p)
        assert cached == n - 1
        assert text == cold(tiny_server, p)
    err = s.stderr()
    assert err.count("is full (") == 1, err[-3000:]
    assert "writing to the disk tier is off" not in err
    assert not [f for f in os.listdir(seen) if f.endswith(".tmp")]
    stop_ok(s)


# ---- records of another tokenizer or KV layout ----
#
# The record format, read and written here from its description in
# src/cache/disk.c with Python's xxhash (an implementation independent of
# the server's): 8-byte magic, then little-endian fields, the token count,
# the block's token ids, the header checksum, the payload.

MAGIC = b"AUGURKV\x1a"
VERSION = 2
HEAD = struct.Struct("<IIQQQIIIIIIIIQQQQQQQII")  # from offset 8 up to the token ids (offset 136)
FIELDS = ("version", "header_bytes", "model_fp", "tok_fp", "compute_fp", "dtype", "block_size", "n_layers",
          "n_kv_heads", "head_dim_k", "head_dim_v", "key_bits", "block_index", "payload_bytes", "ns",
          "parent_lo", "parent_hi", "key_lo", "key_hi", "payload_hash", "n_tokens", "zero")
KV_F32, KV_F16 = 0, 1
M64 = (1 << 64) - 1


def parse_record(data):
    assert data[:8] == MAGIC
    r = dict(zip(FIELDS, HEAD.unpack_from(data, 8)))
    bs, hb, m = r["block_size"], r["header_bytes"], r["n_tokens"]
    assert r["version"] == VERSION and hb == 144 + 4 * bs and 1 <= m <= bs and r["zero"] == 0
    slots = list(struct.unpack_from(f"<{bs}I", data, 136))
    assert slots[m:] == [0] * (bs - m)
    r["tokens"] = slots[:m]
    assert struct.unpack_from("<Q", data, hb - 8)[0] == xxhash.xxh3_64_intdigest(data[:hb - 8]), "header checksum"
    r["payload"] = data[hb:]
    assert len(r["payload"]) == r["payload_bytes"]
    assert xxhash.xxh3_64_intdigest(r["payload"]) == r["payload_hash"], "payload checksum"
    return r


def identity(r):
    """The chain hash's seed: what decides the KV bits (cache.c cache_identity)."""
    v = struct.pack("<10Q", r["model_fp"], r["tok_fp"], r["compute_fp"], r["dtype"], r["block_size"], r["n_layers"],
                    r["n_kv_heads"], r["head_dim_k"], r["head_dim_v"], r["key_bits"])
    return xxhash.xxh3_64_intdigest(v, seed=0x61756775726B7631)  # "augurkv1"


def chain_key(r, parent):
    """Full block: XXH3-128 over parent, namespace, tokens; a partial one of
    m tokens has one more word after the namespace, 0x80000000 << 32 | m."""
    assert r["key_bits"] == 128
    head = [parent[0], parent[1], r["ns"]]
    if len(r["tokens"]) < r["block_size"]:
        head.append(0x80000000 << 32 | len(r["tokens"]))
    data = struct.pack(f"<{len(head)}Q", *head) + struct.pack(f"<{len(r['tokens'])}I", *r["tokens"])
    h = xxhash.xxh3_128_intdigest(data, seed=identity(r))
    return h & M64, h >> 64


def build_record(r):
    """A complete record file of r (key, parent and payload as r says)."""
    bs, m = r["block_size"], len(r["tokens"])
    r = dict(r, payload_bytes=len(r["payload"]), payload_hash=xxhash.xxh3_64_intdigest(r["payload"]),
             header_bytes=144 + 4 * bs, n_tokens=m, zero=0)
    head = MAGIC + HEAD.pack(*(r[f] for f in FIELDS)) + struct.pack(f"<{bs}I", *(r["tokens"] + [0] * (bs - m)))
    return head + struct.pack("<Q", xxhash.xxh3_64_intdigest(head)) + r["payload"]


def record_name(r):
    return f"{r['key_hi']:016x}{r['key_lo']:016x}{RECORD_EXT}"


def read_records(d):
    """The records of d, checked against the format, in block order."""
    out = []
    for f in records(d):
        with open(os.path.join(d, f), "rb") as fh:
            r = parse_record(fh.read())
        assert f == record_name(r)
        out.append(r)
    out.sort(key=lambda r: r["block_index"])
    parent = (0, 0)
    for i, r in enumerate(out):  # one prompt: a chain of keys from block 0, a partial block last
        assert r["block_index"] == i and (r["parent_lo"], r["parent_hi"]) == parent
        assert chain_key(r, parent) == (r["key_lo"], r["key_hi"])
        assert r["n_tokens"] == r["block_size"] or i == len(out) - 1
        parent = (r["key_lo"], r["key_hi"])
    return out


def drop_metrics_and_log(server, n_foreign, why):
    m = wait_scan(server)
    assert m["augur_prefix_cache_disk_dropped_records_total"] == n_foreign
    assert m["augur_prefix_cache_disk_records"] == 0
    assert server.stderr().count(f": {why}") == n_foreign, server.stderr()[-3000:]


def test_records_of_another_tokenizer_are_dropped(servers, tmp_path, tiny_server):
    # the same weights with one tokenizer score changed: the model fingerprint
    # stays, the tokenizer's does not
    retok = str(tmp_path / "stories260K-retokenized.gguf")
    shutil.copy(TINY_GGUF, retok)
    import gguf
    g = gguf.GGUFReader(retok, "r+")
    scores = g.fields["tokenizer.ggml.scores"]
    scores.parts[scores.data[-1]][0] += 1.0
    g.data.flush()
    del g
    d = str(tmp_path / "kv")
    x = servers(retok, "--kv-disk", d)
    complete(x, P)
    stop_ok(x)
    foreign = read_records(d)
    assert len(foreign) >= 10

    s = servers(TINY_GGUF, "--kv-disk", d)
    drop_metrics_and_log(s, len(foreign), "another tokenizer")
    text, n, cached = complete(s, P)
    assert cached == 0
    stop_ok(s)
    assert text == cold(tiny_server, P)
    mine = read_records(d)  # what the server wrote instead: only its own
    assert len(mine) == n_records(n)
    assert {r["model_fp"] for r in mine} == {r["model_fp"] for r in foreign}
    assert {r["tok_fp"] for r in mine}.isdisjoint({r["tok_fp"] for r in foreign})


def test_records_of_another_kv_layout_are_dropped(servers, tmp_path, tiny_server):
    d = str(tmp_path / "kv")
    a = servers(TINY_GGUF, "--kv-disk", d)
    _, n, _ = complete(a, P)
    stop_ok(a)
    mine = read_records(d)
    assert len(mine) == n_records(n) and all(r["dtype"] == KV_F16 for r in mine)
    assert mine[-1]["n_tokens"] == n % BLOCK > 0  # the partial block is rebuilt too
    # The same prompt's KV as a build with F32 KV would store it: the F16
    # values widened, keys chained under that layout's identity. Complete,
    # valid records, only of another layout.
    for f in records(d):
        os.unlink(os.path.join(d, f))
    parent = (0, 0)
    for r in mine:
        w = dict(r, dtype=KV_F32, parent_lo=parent[0], parent_hi=parent[1],
                 payload=np.frombuffer(r["payload"], dtype="<f2").astype("<f4").tobytes())
        w["key_lo"], w["key_hi"] = chain_key(w, parent)
        parent = (w["key_lo"], w["key_hi"])
        with open(os.path.join(d, record_name(w)), "wb") as fh:
            fh.write(build_record(w))
    assert len(read_records(d)) == len(mine)  # (valid as records)

    s = servers(TINY_GGUF, "--kv-disk", d)
    drop_metrics_and_log(s, len(mine), "another KV layout")
    text, _, cached = complete(s, P)
    assert cached == 0
    stop_ok(s)
    assert text == cold(tiny_server, P)
    assert all(r["dtype"] == KV_F16 for r in read_records(d))


# ---- streamed restores ----

def raw_post(server, body):
    """Sends a POST /v1/completions on a raw socket; returns the socket."""
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=60)
    data = json.dumps(body).encode()
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: " + str(len(data)).encode() + b"\r\n\r\n" + data)
    return sock


def slow_reads(ms):
    """The environment of a server whose disk reader sleeps ms per record."""
    return dict(os.environ, AUGUR_TEST_KV_READ_DELAY_MS=str(ms))


def test_a_slow_restore_does_not_stall_other_streams(servers, tmp_path, smol_server):
    require_model(SMOLLM2)
    d = str(tmp_path / "kv")
    a = servers(SMOLLM2, "--kv-disk", d)
    _, n_prompt, _ = complete(a, P, n=1)
    stop_ok(a)
    delay = 0.15
    b = servers(SMOLLM2, "--kv-disk", d, "--parallel", "2", env=slow_reads(int(delay * 1000)))
    wait_scan(b)
    # another stream, decoding all along
    arrivals, stop = [], threading.Event()
    sock = raw_post(b, {"prompt": "Once upon a time", "max_tokens": 1000, "ignore_eos": True, "temperature": 0,
                        "stream": True, "cache_salt": uuid.uuid4().hex})

    def read_stream():
        try:
            while not stop.is_set():
                chunk = sock.recv(65536)
                if not chunk:
                    return
                arrivals.extend([time.monotonic()] * chunk.count(b"data: {"))
        except OSError:
            pass

    reader = threading.Thread(target=read_stream)
    reader.start()
    try:
        deadline = time.time() + 60
        while len(arrivals) < 3 and time.time() < deadline:
            time.sleep(0.01)
        assert len(arrivals) >= 3, b.stderr()[-2000:]
        t0 = time.monotonic()
        text, _, cached = complete(b, P)
        t1 = time.monotonic()
    finally:
        stop.set()
        sock.close()
        reader.join()
    restored = n_records(cached)  # records read: the last one used in part
    assert cached == n_prompt - 1 and restored >= 10
    slow = -(-restored // READERS) * delay  # (READERS records at once, each delayed)
    assert t1 - t0 >= slow  # the reads were slow ...
    during = [t for t in arrivals if t0 <= t <= t1]
    # ... and the other stream went on meanwhile: no pause near the restore's length
    gaps = np.diff([t0] + during + [t1])
    assert len(during) >= 10, (len(during), t1 - t0)
    assert gaps.max() < (t1 - t0) / 3, (gaps.max(), t1 - t0)
    m = metrics(b)
    assert m["augur_prefix_cache_tokens_restored_disk_total"] == cached
    assert m["augur_prefix_cache_disk_restore_seconds_total"] >= slow
    assert m["augur_prefix_cache_disk_restores_pending"] == 0
    stop_ok(b)
    assert text == cold(smol_server, P)


def test_hang_up_during_a_restore_frees_everything(servers, tmp_path, tiny_server):
    d = str(tmp_path / "kv")
    a = servers(TINY_GGUF, "--kv-disk", d)
    _, n_prompt, _ = complete(a, P)
    stop_ok(a)
    delay = 0.2
    b = servers(TINY_GGUF, "--kv-disk", d, env=slow_reads(int(delay * 1000)))
    wait_scan(b)
    sock = raw_post(b, {"prompt": P, "max_tokens": 16, "temperature": 0})
    wait_for(b, lambda m: m["augur_prefix_cache_disk_restores_pending"] == 1, "the restore to begin")
    t = time.monotonic()
    sock.close()
    m = wait_for(b, lambda m: m["augur_prefix_cache_disk_restores_cancelled_total"] == 1 and
                 m["augur_running_sequences"] == 0 and m["augur_kv_blocks_used"] == m["augur_kv_blocks_cached"],
                 "the cancelled restore to give everything back")
    # long before the reads would have ended
    assert time.monotonic() - t < -(-n_records(n_prompt - 1) // READERS) * delay / 2
    assert m["augur_prefix_cache_disk_restores_pending"] == 0
    assert m["augur_prefix_cache_lookups_total"] == 0  # it never finished
    assert m["augur_client_cancels_total"] >= 1
    # the server goes on: the same prompt is restored (blocks read before the
    # hang-up from memory, the rest from disk) and answers as a cold server
    text, n, cached = complete(b, P)
    assert cached == n - 1
    m = metrics(b)
    assert m["augur_prefix_cache_disk_restore_failures_total"] == 0
    assert m["augur_prefix_cache_tokens_restored_disk_total"] + m["augur_prefix_cache_tokens_restored_memory_total"] \
        == cached
    stop_ok(b)
    assert text == cold(tiny_server, P)


# ---- the default directory ----

def test_disk_tier_is_on_by_default_in_a_per_user_directory(servers, tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "XDG_CACHE_HOME"}
    env["HOME"] = str(tmp_path / "home")
    os.mkdir(env["HOME"])
    s = servers(TINY_GGUF, env=env, default_disk=True)
    complete(s, P, n=2)
    stop_ok(s)
    kv = os.path.join(env["HOME"], ".cache", "augur", "kv")
    subdirs = os.listdir(kv)
    assert len(subdirs) == 1 and len(subdirs[0]) == 16  # the model fingerprint in hex
    assert records(os.path.join(kv, subdirs[0]))

    env["XDG_CACHE_HOME"] = str(tmp_path / "xdg")
    s = servers(TINY_GGUF, env=env, default_disk=True)
    wait_scan(s)
    complete(s, P, n=2)
    stop_ok(s)
    assert records(os.path.join(env["XDG_CACHE_HOME"], "augur", "kv", subdirs[0]))


def test_an_unusable_directory_is_one_warning(servers, tmp_path):
    bad = tmp_path / "file"
    bad.write_text("not a directory")
    s = servers(TINY_GGUF, "--kv-disk", str(bad / "kv"))
    text, n, _ = complete(s, P)
    _, _, cached = complete(s, P)
    assert cached == n - 1  # the memory tier still works
    assert metrics(s)["augur_prefix_cache_disk_enabled"] == 0
    log = s.stderr()
    assert log.count("kv disk cache off") == 1, log
    stop_ok(s)


def test_kv_disk_flags_are_checked(servers, tmp_path):
    from conftest import run_augur
    for i, (flag, want) in enumerate([("512M", 512 << 20), ("32G", 32 << 30), ("1.5GiB", 3 << 29), ("100000", 100000)]):
        s = servers(TINY_GGUF, "--kv-disk", str(tmp_path / str(i)), "--kv-disk-max", flag)
        assert wait_scan(s)["augur_prefix_cache_disk_max_bytes"] == want
        stop_ok(s)
    for bad in (["--kv-disk-max", "12Q"], ["--kv-disk-max", "-1G"], ["--kv-disk-max", "0"], ["--kv-disk", ""]):
        p = run_augur("serve", "-m", TINY_GGUF, "--port", "0", *bad, timeout=30)
        assert p.returncode == 2, (bad, p.stderr)
    p = run_augur("serve", "--help")
    assert b"--kv-disk DIR" in p.stdout and b"--kv-disk-max SIZE" in p.stdout and b"--no-kv-disk" in p.stdout
