"""The reference renderer: Python's jinja2 configured exactly as Hugging Face
transformers' apply_chat_template configures it (transformers'
utils/chat_template_utils.py: _compile_jinja_template and
render_jinja_template), so that augur's C interpreter can be compared with it
byte for byte.

The context is built the way `augur template` builds it from a conversation
object: every key of the object, plus tools=None, documents=None and
add_generation_prompt=False when absent, plus bos_token/eos_token (from the
model) when absent. strftime_now() uses SOURCE_DATE_EPOCH when set (in UTC
when TZ=UTC), like augur, so date output can be compared too.
"""
import datetime
import functools
import json
import os
import struct

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment


def _raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    # transformers overrides jinja2's tojson: json.dumps with these defaults
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(format):
    epoch = os.environ.get("SOURCE_DATE_EPOCH")
    if epoch is not None:
        return datetime.datetime.fromtimestamp(int(epoch)).strftime(format)
    return datetime.datetime.now().strftime(format)


class _GenerationTag(jinja2.ext.Extension):
    """transformers' AssistantTracker as it renders when no assistant mask is
    requested: {% generation %}...{% endgeneration %} outputs its body."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_generation_support"), [], [], body).set_lineno(lineno)

    def _generation_support(self, caller):
        return caller()


def make_env():
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[_GenerationTag, jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


def build_context(conv, bos_token=None, eos_token=None):
    ctx = dict(conv)
    ctx.setdefault("tools", None)
    ctx.setdefault("documents", None)
    ctx.setdefault("add_generation_prompt", False)
    if bos_token is not None:
        ctx.setdefault("bos_token", bos_token)
    if eos_token is not None:
        ctx.setdefault("eos_token", eos_token)
    return ctx


def render(source, conv, bos_token=None, eos_token=None):
    """Returns (True, text) or (False, "ExceptionType: message")."""
    try:
        tmpl = make_env().from_string(source)
        return True, tmpl.render(**build_context(conv, bos_token, eos_token))
    except Exception as e:  # noqa: BLE001 - any jinja2 failure is a result to compare
        return False, f"{type(e).__name__}: {e}"


@functools.lru_cache(maxsize=None)
def gguf_template(path):
    """(chat_template or None, bos text or None, eos text or None) of a GGUF
    file, read with a small independent parser of the GGUF metadata section
    (the gguf package reads every tensor and token too, which takes tens of
    seconds on a real model)."""
    scalar = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
    with open(path, "rb") as f:
        data = f.read(64 << 20)  # the metadata of the models used here is far smaller
    pos = 0

    def take(fmt):
        nonlocal pos
        v = struct.unpack_from(fmt, data, pos)[0]
        pos += struct.calcsize(fmt)
        return v

    def string():
        nonlocal pos
        n = take("<Q")
        s = data[pos:pos + n]
        pos += n
        return s

    def value(t):
        if t == 8:
            return string()
        if t == 9:
            et, n = take("<I"), take("<Q")
            return [value(et) for _ in range(n)]
        return take(scalar[t])

    assert data[:4] == b"GGUF", path
    pos = 4
    version = take("<I")
    assert version in (2, 3), version
    take("<Q")  # tensor count
    n_kv = take("<Q")
    kv = {}
    for _ in range(n_kv):
        key = string().decode("utf-8")
        kv[key] = value(take("<I"))

    def token_text(id_key):
        toks = kv.get("tokenizer.ggml.tokens")
        i = kv.get(id_key)
        if toks is None or i is None or i >= len(toks):
            return None
        return toks[i].decode("utf-8")

    tmpl = kv.get("tokenizer.chat_template")
    return (tmpl.decode("utf-8") if tmpl is not None else None, token_text("tokenizer.ggml.bos_token_id"),
            token_text("tokenizer.ggml.eos_token_id"))
