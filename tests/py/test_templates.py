"""augur template against Python's jinja2 (configured as transformers does),
byte for byte: every chat template in shared/testdata/templates and in the
fetched GGUF models, across the conversations in tests/data/conversations.
Where jinja2 raises, augur must fail (exit 1) with the same message."""
import glob
import json
import os

import pytest

from conftest import GEMMA3, QWEN_05B, ROOT, SHARED, SMOLLM2, run_augur
import jinja_ref

CONV_DIR = os.path.join(ROOT, "tests", "data", "conversations")
CONVS = sorted(glob.glob(os.path.join(CONV_DIR, "*.json")))
# the shared real-model templates, plus templates written for these tests
# that exercise features the real ones do not (strftime_now, call blocks ...)
TEMPLATES = sorted(glob.glob(os.path.join(SHARED, "testdata", "templates", "*.jinja"))) + sorted(
    glob.glob(os.path.join(ROOT, "tests", "data", "templates", "*.jinja")))
MODELS = [SMOLLM2, QWEN_05B]
# a fixed clock for strftime_now(), in UTC, on both sides
ENV = {"SOURCE_DATE_EPOCH": "1735689600", "TZ": "UTC"}


@pytest.fixture(autouse=True)
def _pinned_clock(monkeypatch):
    for k, v in ENV.items():
        monkeypatch.setenv(k, v)


def _load(path):
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def _expected_message(err):
    """The message part of jinja_ref's "Type: message"."""
    return err.split(": ", 1)[1] if ": " in err else err


def _compare(args, ok, ref):
    p = run_augur(*args)
    if ok:
        assert p.returncode == 0, f"augur failed where jinja2 rendered: {p.stderr.decode(errors='replace')}"
        got = p.stdout.decode("utf-8")
        assert got == ref, f"mismatch:\n--- jinja2\n{ref!r}\n--- augur\n{got!r}"
    else:
        assert p.returncode == 1, f"jinja2 raised {ref!r} but augur exited {p.returncode}: {p.stdout[:300]!r}"
        err = p.stderr.decode("utf-8")
        assert _expected_message(ref) in err, f"jinja2: {ref!r}\naugur: {err!r}"
        assert err.count("\n") == 1 or _expected_message(ref).count("\n"), "error must be one line"


@pytest.mark.parametrize("conv", CONVS, ids=lambda p: os.path.basename(p)[:-5])
@pytest.mark.parametrize("template", TEMPLATES, ids=lambda p: os.path.basename(p)[:-6])
def test_shared_template_matches_jinja2(template, conv):
    with open(template, encoding="utf-8") as f:
        src = f.read()
    ok, ref = jinja_ref.render(src, _load(conv))
    _compare(["template", "--template", template, "--messages", conv], ok, ref)


@pytest.mark.parametrize("conv", CONVS, ids=lambda p: os.path.basename(p)[:-5])
@pytest.mark.parametrize("model", MODELS, ids=lambda p: os.path.basename(p).split(".")[0].split("-Q")[0])
def test_model_template_matches_jinja2(model, conv):
    if not os.path.exists(model):
        pytest.skip(f"model not fetched: {model}")
    src, bos, eos = jinja_ref.gguf_template(model)
    assert src, f"{model} has a chat template"
    ok, ref = jinja_ref.render(src, _load(conv), bos, eos)
    _compare(["template", "-m", model, "--messages", conv], ok, ref)


def test_model_without_template_is_an_error():
    if not os.path.exists(GEMMA3):
        pytest.skip("gemma3 not fetched")
    src, _, _ = jinja_ref.gguf_template(GEMMA3)
    if src:
        pytest.skip("this gemma3 file has a template")
    p = run_augur("template", "-m", GEMMA3, "--messages", CONVS[0])
    assert p.returncode == 1
    assert p.stderr == b"augur: model has no chat template\n"


# ---- the command line around the renderer

def test_default_model_is_used_and_nothing_is_added(tmp_path):
    conv = os.path.join(CONV_DIR, "basic.json")
    src, bos, eos = jinja_ref.gguf_template(SMOLLM2)
    _, ref = jinja_ref.render(src, _load(conv), bos, eos)
    p = run_augur("template", "--messages", conv, check=True)
    assert p.stdout.decode("utf-8") == ref  # no trailing newline or other additions
    assert p.stderr == b""


def test_messages_from_stdin():
    conv = os.path.join(CONV_DIR, "single_user.json")
    with open(conv, "rb") as f:
        data = f.read()
    p = run_augur("template", "-m", SMOLLM2, "--messages", "-", input=data, check=True)
    assert p.stdout == run_augur("template", "-m", SMOLLM2, "--messages", conv, check=True).stdout


def test_template_file_and_model_tokens_combine(tmp_path):
    t = tmp_path / "t.jinja"
    t.write_text("{{ bos_token }}|{{ eos_token }}|{{ messages|length }}")
    conv = tmp_path / "c.json"
    conv.write_text(json.dumps({"messages": [{"role": "user", "content": "x"}]}))
    p = run_augur("template", "--template", str(t), "-m", SMOLLM2, "--messages", str(conv), check=True)
    assert p.stdout == b"<|im_start|>|<|im_end|>|1"
    # without a model, the tokens are whatever the conversation gives (here: undefined)
    p = run_augur("template", "--template", str(t), "--messages", str(conv), check=True)
    assert p.stdout == b"||1"


def test_usage_errors_exit_2(tmp_path):
    assert run_augur("template").returncode == 2
    assert run_augur("template", "--messages").returncode == 2
    assert run_augur("template", "--bogus", "x").returncode == 2
    assert run_augur("template", "--help").returncode == 0


@pytest.mark.parametrize("content,needle", [
    ("{not json", b"invalid JSON"),
    ("[1, 2]", b"must be a JSON object"),
    ('{"messages": 3}', b'"messages" must be an array'),
])
def test_bad_conversation_files_exit_1(tmp_path, content, needle):
    conv = tmp_path / "c.json"
    conv.write_text(content)
    p = run_augur("template", "-m", SMOLLM2, "--messages", str(conv))
    assert p.returncode == 1
    assert needle in p.stderr and p.stderr.count(b"\n") == 1


def test_template_syntax_error_names_the_line(tmp_path):
    t = tmp_path / "t.jinja"
    t.write_text("ok\n{% if x %}\nno end")
    p = run_augur("template", "--template", str(t), "--messages", os.path.join(CONV_DIR, "basic.json"))
    assert p.returncode == 1
    assert p.stderr.startswith(b"augur: template line ") and b"'endif'" in p.stderr
