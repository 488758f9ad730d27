"""Shared fixtures for augur's end-to-end tests (run against the real binary)."""
import os
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
AUGUR = os.environ.get("AUGUR_BIN", os.path.join(ROOT, "build", "augur"))
SHARED = os.environ.get("AUGUR_SHARED", os.path.join(os.path.dirname(ROOT), "shared"))
MODELS = os.environ.get("AUGUR_MODELS_DIR", os.path.join(ROOT, "models"))

# `augur serve` keeps a disk cache in $XDG_CACHE_HOME (else ~/.cache) by
# default: no test may write into the machine's real one (servers started
# through AugurServer also get --no-kv-disk, see there).
if not os.environ.get("AUGUR_TEST_KEEP_XDG"):
    import tempfile as _tempfile
    os.environ["XDG_CACHE_HOME"] = _tempfile.mkdtemp(prefix="augur-test-xdg-")
    import atexit as _atexit
    import shutil as _shutil
    _atexit.register(_shutil.rmtree, os.environ["XDG_CACHE_HOME"], True)

TINY_GGUF = os.path.join(SHARED, "models", "tiny", "stories260K.gguf")
SMOLLM2 = os.path.join(MODELS, "SmolLM2-135M-Instruct.Q4_1.gguf")
GEMMA3 = os.path.join(MODELS, "gemma-3-270m-Q4_K_M.gguf")
QWEN_05B = os.path.join(MODELS, "qwen2.5-0.5b-Q4.gguf")
QWEN_15B = os.path.join(MODELS, "Qwen2.5-Coder-1.5B-Instruct-Q4_K_M.gguf")


GEN_MODEL = os.environ.get("AUGUR_GEN_MODEL", os.path.join(ROOT, "build", "bench", "gen_model"))
PARITY = os.path.join(ROOT, "tests", "data", "parity")


def run_augur(*args, input=None, check=False, timeout=120):
    """Runs the augur binary; returns CompletedProcess with bytes stdout/stderr."""
    p = subprocess.run([AUGUR, *args], input=input, capture_output=True, timeout=timeout)
    if check and p.returncode != 0:
        raise AssertionError(f"augur {' '.join(args)} exited {p.returncode}: {p.stderr.decode(errors='replace')}")
    return p


def require_model(path):
    """Skips the test when an optional model is not fetched; the default model is required."""
    if not os.path.exists(path):
        if path == SMOLLM2 or path == TINY_GGUF:
            raise AssertionError(f"required model missing: {path} (run scripts/setup.sh)")
        pytest.skip(f"model not fetched: {path} (scripts/fetch_models.py)")
    return path


# ---- augur serve (tests/py/test_server*.py) ----

class AugurServer:
    """The real `augur serve` on a free loopback port (--port 0; the port is
    read from the one line it prints when ready). stderr goes to a file, never
    a pipe, so a chatty server can never block on it."""

    def __init__(self, model=None, *args, ready_timeout=120, prefix=(), env=None, default_disk=False):
        import select
        import tempfile
        self.log = tempfile.NamedTemporaryFile(prefix="augur-serve-", suffix=".log", delete=False)
        # The disk tier is on by default (in ~/.cache): tests must not write
        # there, nor depend on each other through it. A test that wants it
        # passes its own --kv-disk (a tmp dir).
        if "--kv-disk" not in args and "--no-kv-disk" not in args and not default_disk:
            args = (*args, "--no-kv-disk")
        # prefix: a wrapper command the server runs under (e.g. unshare)
        cmd = [*prefix, AUGUR, "serve", "--port", "0", *args]
        if model:
            cmd[len(prefix) + 2:len(prefix) + 2] = ["-m", model]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=self.log, stdin=subprocess.DEVNULL,
                                     env=env)
        r, _, _ = select.select([self.proc.stdout], [], [], ready_timeout)
        line = self.proc.stdout.readline().decode() if r else ""
        if not line.startswith("augur: serving "):
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(f"augur serve did not start: {line!r}\n{self.stderr()}")
        self.ready_line = line.strip()
        self.port = int(line.rsplit(":", 1)[1])
        self.base = f"http://127.0.0.1:{self.port}"
        self.model_id = line.split()[2]

    def stderr(self):
        with open(self.log.name, "rb") as f:
            return f.read().decode(errors="replace")

    def client(self, api_key="none", **kw):
        import openai
        return openai.OpenAI(base_url=self.base + "/v1", api_key=api_key, max_retries=0, timeout=120, **kw)

    def stop(self, sig=None, timeout=60):
        """Signals the server (SIGTERM by default) and returns its exit code."""
        import signal
        if self.proc.poll() is None:
            self.proc.send_signal(sig or signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                raise AssertionError(f"augur serve did not stop within {timeout}s\n{self.stderr()[-4000:]}")
        if self.proc.stdout:
            self.proc.stdout.close()
        if os.path.exists(self.log.name):
            self.final_stderr = self.stderr()
            os.unlink(self.log.name)
        return self.proc.returncode


class ScriptedServers:
    """Servers whose outputs are scripted (the server's AUGUR_TEST_SCRIPT
    hook: each request writes the next given text token by token through
    the engine). As a context manager it yields start(*outputs), which
    starts a server on `model` (flags `args`, default --parallel 2; extra
    environment `env`) whose requests write outputs[0], outputs[1], ... in
    turn; on exit every server is stopped and must exit 0."""

    def __init__(self, model, tmp_path, env=None, *args):
        self.model, self.tmp_path, self.env = model, tmp_path, env or {}
        self.args = args or ("--parallel", "2")
        self.servers = []

    def start(self, *outputs):
        import json
        script = self.tmp_path / f"script{len(self.servers)}.json"
        script.write_text(json.dumps(list(outputs)))
        env = {**os.environ, **self.env, "AUGUR_TEST_SCRIPT": str(script)}
        s = AugurServer(self.model, *self.args, env=env)
        self.servers.append(s)
        return s

    def __enter__(self):
        return self.start

    def __exit__(self, *exc):
        for s in self.servers:
            assert s.stop() == 0, s.final_stderr[-4000:]


@pytest.fixture
def augur_server():
    """Factory: augur_server(model, *flags) starts a server that is stopped
    (SIGTERM, must exit 0) after the test."""
    started = []

    def start(model, *args):
        s = AugurServer(model, *args)
        started.append(s)
        return s

    yield start
    for s in started:
        rc = s.stop()
        assert rc == 0, s.final_stderr[-4000:]


@pytest.fixture(scope="session")
def tiny_server():
    """stories260K (no chat template: ChatML default), 8 sequences at once."""
    s = AugurServer(TINY_GGUF, "--parallel", "8")
    yield s
    rc = s.stop()
    assert rc == 0, s.final_stderr[-4000:]


@pytest.fixture(scope="session")
def smol_server():
    """The default model (no -m), its own chat template."""
    require_model(SMOLLM2)
    s = AugurServer(None, "--parallel", "2")
    yield s
    rc = s.stop()
    assert rc == 0, s.final_stderr[-4000:]


@pytest.fixture(scope="session")
def random_model(tmp_path_factory):
    """name -> the path of a random-weight model (qwen3-tiny, qwen3moe-tiny, gpt-oss-tiny, ...)
    that bench/gen_model writes, the very file tests/data/parity/NAME.npz
    was made from (its SHA-256 is checked)."""
    import hashlib

    import numpy as np
    made = {}

    def get(name):
        if name not in made:
            ref = np.load(os.path.join(PARITY, f"{name}.npz"))
            preset, qtype, *more = str(ref["gen_model"]).split()
            path = str(tmp_path_factory.mktemp("gen") / f"{name}.gguf")
            subprocess.run([GEN_MODEL, path, preset, "--type", qtype, *more], check=True, capture_output=True)
            digest = hashlib.sha256(open(path, "rb").read()).hexdigest()
            assert digest == str(ref["gguf_sha256"]), (
                f"bench/gen_model {preset} --type {qtype} no longer writes the file the reference was made from: "
                f"regenerate it (scripts/logits_reference.py {name})")
            made[name] = path
        return made[name]
    return get
