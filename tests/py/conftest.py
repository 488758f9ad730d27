"""Shared fixtures for augur's end-to-end tests (run against the real binary)."""
import os
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
AUGUR = os.environ.get("AUGUR_BIN", os.path.join(ROOT, "build", "augur"))
SHARED = os.environ.get("AUGUR_SHARED", os.path.join(os.path.dirname(ROOT), "shared"))
MODELS = os.environ.get("AUGUR_MODELS_DIR", os.path.join(ROOT, "models"))

TINY_GGUF = os.path.join(SHARED, "models", "tiny", "stories260K.gguf")
SMOLLM2 = os.path.join(MODELS, "SmolLM2-135M-Instruct.Q4_1.gguf")
GEMMA3 = os.path.join(MODELS, "gemma-3-270m-Q4_K_M.gguf")
QWEN_05B = os.path.join(MODELS, "qwen2.5-0.5b-Q4.gguf")
QWEN_15B = os.path.join(MODELS, "Qwen2.5-Coder-1.5B-Instruct-Q4_K_M.gguf")


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
