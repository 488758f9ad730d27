#!/usr/bin/env python3
"""Differential tester: random small templates and contexts, rendered by
Python's jinja2 (configured as transformers does, tests/py/jinja_ref.py) and by
`augur template`; prints every disagreement.

    scripts/tmpl_difftest.py [-n 2000] [--seed 1] [--augur build/augur] [--chat]

A case agrees when both render the same bytes, or both fail and augur's
message contains jinja2's. Cases where augur reports "unsupported" are
counted separately (a construct it refuses on purpose)."""
import argparse
import copy
import glob
import json
import os
import random
import re
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "py"))
import jinja_ref  # noqa: E402

STRS = ["'a'", '"It\'s"', "'Ünï ✓'", "'  x  '", "'a,b,,c'", "''", "'\\n'", "'Hello World'", "'42'", "'3.5'",
        "'ß'", "'x-y z'", "'<b>&'", "'%s!'", "'{}-{}'", "'tool_call'", "'abc'[1:]"]
NUMS = ["0", "1", "2", "3", "-1", "7", "10", "0.5", "1.0", "-2.25", "1e20", "0.1", "3.0", "1_000"]
VARS = ["s", "n", "f", "l", "d", "msgs", "e", "u", "t", "nested", "b", "none_v"]
FILTERS = [("trim", []), ("length", []), ("upper", []), ("lower", []), ("title", []), ("capitalize", []),
           ("first", []), ("last", []), ("list", []), ("string", []), ("int", []), ("float", []), ("abs", []),
           ("round", []), ("round", ["1"]), ("round", ["2", "'floor'"]), ("tojson", []), ("tojson", ["indent=2"]),
           ("tojson", ["sort_keys=true"]), ("join", ["', '"]), ("join", []), ("default", ["'dflt'"]),
           ("default", ["'dflt'", "true"]), ("d", ["0"]), ("replace", ["'a'", "'o'"]), ("replace", ["'a'", "'o'", "1"]),
           ("items", []), ("map", ["'upper'"]), ("map", ["attribute='role'"]), ("select", ["'odd'"]),
           ("reject", ["'none'"]), ("selectattr", ["'role'", "'equalto'", "'user'"]), ("rejectattr", ["'content'"]),
           ("sort", []), ("sort", ["reverse=true"]), ("sort", ["attribute='role'"]), ("unique", []),
           ("reverse", []), ("count", []), ("safe", []), ("e", []), ("indent", []), ("indent", ["2", "true"]),
           ("wordcount", []), ("center", ["9"]), ("batch", ["2"]), ("slice", ["2"]), ("dictsort", []),
           ("sum", []), ("min", []), ("max", []), ("truncate", ["5"]), ("format", ["1", "2"]), ("string", []),
           ("attr", ["'keys'"]), ("groupby", ["'role'"]), ("groupby", ["0"]), ("striptags", []), ("wordwrap", ["5"]),
           ("wordwrap", ["3", "false"]), ("urlencode", []), ("xmlattr", []), ("filesizeformat", []),
           ("filesizeformat", ["true"]), ("pprint", [])]
TESTS = ["defined", "undefined", "none", "string", "number", "integer", "float", "mapping", "iterable", "sequence",
         "boolean", "true", "false", "odd", "even", "divisibleby 3", "equalto 1", "eq 'a'", "in ['a', 1]",
         "callable", "lower", "upper", "sameas none", "escaped", "gt 1", "lt 2"]
METHODS = ["startswith('a')", "endswith('c')", "strip()", "lstrip()", "rstrip('x ')", "split()", "split(',')",
           "split(',', 1)", "rsplit(',', 1)", "upper()", "lower()", "title()", "capitalize()", "replace('a', 'b')",
           "find('b')", "count('a')", "splitlines()", "isdigit()", "isalpha()", "zfill(5)", "center(7, '*')",
           "ljust(4)", "partition(',')", "format(1, 'x')", "join(['p', 'q'])", "get('k')", "get('role', 'none')",
           "items()", "keys()", "values()", "index(1)", "swapcase()", "removeprefix('a')", "casefold()"]
SUBSCRIPTS = ["[0]", "[-1]", "[1:]", "[::-1]", "[:2]", ".role", '["content"]', ".k", "[5]", ".x", '["role"]']
BINOPS = ["+", "-", "*", "/", "//", "%", "**", "~", "==", "!=", "<", "<=", ">", ">=", "in", "not in", "and", "or"]


def gen_expr(rng, depth=0):
    r = rng.random()
    if depth > 2 or r < 0.25:
        k = rng.random()
        if k < 0.3:
            return rng.choice(STRS)
        if k < 0.5:
            return rng.choice(NUMS)
        if k < 0.85:
            return rng.choice(VARS)
        return rng.choice(["none", "true", "false", "True", "None", "[]", "{}", "[1, 'a', none]",
                           "{'k': 1, 'role': 'user'}", "(1, 2)", "range(4)", "namespace(x=1)", "undefined_name"])
    if r < 0.40:
        return f"{gen_expr(rng, depth + 1)} {rng.choice(BINOPS)} {gen_expr(rng, depth + 1)}"
    if r < 0.55:
        name, args = rng.choice(FILTERS)
        a = f"({', '.join(args)})" if args else ""
        return f"{gen_expr(rng, depth + 1)}|{name}{a}"
    if r < 0.63:
        return f"{gen_expr(rng, depth + 1)} is {'not ' if rng.random() < 0.3 else ''}{rng.choice(TESTS)}"
    if r < 0.72:
        return f"{rng.choice(VARS)}.{rng.choice(METHODS)}"
    if r < 0.80:
        return rng.choice(VARS) + rng.choice(SUBSCRIPTS)
    if r < 0.86:
        return f"({gen_expr(rng, depth + 1)} if {gen_expr(rng, depth + 1)} else {gen_expr(rng, depth + 1)})"
    if r < 0.90:
        return f"not {gen_expr(rng, depth + 1)}"
    if r < 0.93:
        return f"-{gen_expr(rng, depth + 1)}"
    if r < 0.97:
        return f"[{gen_expr(rng, depth + 1)}, {gen_expr(rng, depth + 1)}]"
    return f"({gen_expr(rng, depth + 1)})"


WS = ["", "-", "+"]


def tag(rng, body):
    return "{%" + rng.choice(WS) + " " + body + " " + rng.choice(["", "-", "+"]) + "%}"


def gen_stmt(rng, depth=0):
    r = rng.random()
    pad = rng.choice(["", " ", "\n", "  \n", "\n  ", "\t", "x\n   "])
    if depth > 2 or r < 0.35:
        return pad + "{{" + rng.choice(["", "-"]) + " " + gen_expr(rng) + " " + rng.choice(["", "-"]) + "}}" + pad
    if r < 0.5:
        body = "".join(gen_stmt(rng, depth + 1) for _ in range(rng.randint(1, 3)))
        els = ""
        if rng.random() < 0.5:
            els = tag(rng, "else") + "".join(gen_stmt(rng, depth + 1) for _ in range(rng.randint(1, 2)))
        return pad + tag(rng, "if " + gen_expr(rng)) + body + els + tag(rng, "endif") + pad
    if r < 0.65:
        it = rng.choice(["l", "msgs", "d", "s", "range(3)", "d|items", "[]", "msgs|selectattr('role', 'eq', 'user')"])
        target = "k, v" if it == "d|items" else "x"
        cond = f" if {gen_expr(rng, 2)}" if rng.random() < 0.2 else ""
        inner = rng.choice(["{{ loop.index }}", "{{ loop.first }}{{ loop.last }}", "{{ loop.revindex0 }}",
                            "{{ loop.previtem }}", "{{ loop.nextitem }}", "{{ loop.length }}",
                            "{{ loop.cycle('a', 'b') }}", "{% if loop.index > 1 %}{% break %}{% endif %}",
                            "{% if loop.first %}{% continue %}{% endif %}", "{{ x }}", "{{ k }}={{ v }}"])
        body = inner + "".join(gen_stmt(rng, depth + 1) for _ in range(rng.randint(0, 2)))
        els = tag(rng, "else") + "E" if rng.random() < 0.2 else ""
        return pad + tag(rng, f"for {target} in {it}{cond}") + body + els + tag(rng, "endfor") + pad
    if r < 0.78:
        return pad + tag(rng, f"set {rng.choice(['a', 'b', 's', 'ns.x'])} = {gen_expr(rng)}") + pad + "{{ a }}{{ ns.x }}"
    if r < 0.85:
        return (pad + tag(rng, "macro m(p, q='dq')") + "[{{ p }}|{{ q }}]" + tag(rng, "endmacro") +
                "{{ m(" + gen_expr(rng, 2) + ") }}{{ m(1, q=" + gen_expr(rng, 2) + ") }}")
    if r < 0.9:
        return pad + tag(rng, "set blk") + gen_stmt(rng, depth + 1) + tag(rng, "endset") + "{{ blk|length }}"
    if r < 0.95:
        return pad + "{# comment " + pad + " #}" + rng.choice(["", "\n", " \n"]) + gen_stmt(rng, depth + 1)
    return pad + tag(rng, "filter upper") + gen_stmt(rng, depth + 1) + tag(rng, "endfilter")


GEN_ADDR = re.compile(r"( object(?: [a-z_]+)?) at 0x[0-9a-f]+>", re.I)

CTX = {"s": "a,b,c", "n": 3, "f": 2.5, "l": [3, 1, 2], "d": {"k": "v", "role": "sys", "n": 2},
       "msgs": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo", "x": None},
                {"role": "user", "content": "Ünï ✓"}],
       "e": "", "t": True, "b": False, "none_v": None, "nested": {"a": [1, {"b": "c"}], "s": "x"},
       "u": "Straße İ ǅ"}


def ws_tag(rng, body, kind="%"):
    """A tag with random whitespace control, preceded by random layout."""
    pre = rng.choice(["", "\n", "\n    ", "    ", "\t", "\n\n  ", " ", "x\n  ", "\u00a0", "\n\t  "])
    open_, close = ("{%", "%}") if kind == "%" else ("{{", "}}") if kind == "{" else ("{#", "#}")
    l = rng.choice(["", "-", "+"]) if kind != "{" else rng.choice(["", "-"])
    r = rng.choice(["", "-", "+"]) if kind != "{" else rng.choice(["", "-"])
    if kind == "{" and r == "+":
        r = ""
    return pre + open_ + l + " " + body + " " + r + close


def gen_chat_template(rng):
    """A random template shaped like real chat templates."""
    out = []
    if rng.random() < 0.5:
        out.append(ws_tag(rng, "bos_token", "{"))
    if rng.random() < 0.4:
        out.append(ws_tag(rng, "set ns = namespace(sys='', n=0)"))
        out.append(ws_tag(rng, "for m in messages"))
        out.append(ws_tag(rng, "if m.role == 'system'"))
        out.append(ws_tag(rng, "set ns.sys = m.content"))
        out.append(ws_tag(rng, "endif"))
        out.append(ws_tag(rng, "set ns.n = ns.n + 1"))
        out.append(ws_tag(rng, "endfor"))
        out.append(ws_tag(rng, "ns.sys ~ '|' ~ ns.n", "{"))
    if rng.random() < 0.3:
        out.append(ws_tag(rng, "comment " + rng.choice(["", "x\ny"]), "#"))
    if rng.random() < 0.5:
        out.append(ws_tag(rng, "if tools"))
        out.append(rng.choice(["<tools>", "\n# Tools\n", ""]))
        out.append(ws_tag(rng, "for t in tools"))
        out.append(ws_tag(rng, rng.choice(["t|tojson", "t.function.name", "t|tojson(indent=2)", "t.function.parameters.properties|list"]), "{"))
        out.append(ws_tag(rng, "endfor"))
        out.append(ws_tag(rng, "endif"))
    out.append(ws_tag(rng, "for message in messages" + rng.choice(["", " if message.role != 'system'"])))
    for role in rng.sample(["user", "assistant", "system", "tool"], rng.randint(1, 4)):
        out.append(ws_tag(rng, ("if" if role == "user" or not out[-1].endswith("%}") else "if") + f" message.role == '{role}'"))
        out.append(rng.choice(["<|" + role + "|>", "[" + role.upper() + "]", role + ":\n", ""]))
        out.append(ws_tag(rng, rng.choice(["message.content", "message.content|trim", "(message.content or '')|trim",
                                          "message['content'] if message.content is string else message.content|tojson",
                                          "message.content|default('', true)", "loop.index", "message.tool_calls|length if message.tool_calls else ''"]), "{"))
        out.append(rng.choice(["<|end|>", "\n", "", "</s>"]))
        out.append(ws_tag(rng, "endif"))
    if rng.random() < 0.4:
        out.append(ws_tag(rng, "if not loop.last"))
        out.append(rng.choice(["\n", " ", "---"]))
        out.append(ws_tag(rng, "endif"))
    out.append(ws_tag(rng, "endfor"))
    out.append(ws_tag(rng, "if add_generation_prompt"))
    out.append(rng.choice(["<|assistant|>\n", "\nASSISTANT:", ""]))
    out.append(ws_tag(rng, "endif"))
    out.append(rng.choice(["", "\n", "\n\n", "  \n"]))
    return "".join(out)


def main_chat(args):
    rng = random.Random(args.seed)
    convs = sorted(glob.glob(os.path.join(HERE, "..", "tests", "data", "conversations", "*.json")))
    agree, bad = 0, []
    with tempfile.TemporaryDirectory() as td:
        tpath = os.path.join(td, "t.jinja")
        for i in range(args.n):
            src = gen_chat_template(rng)
            conv = rng.choice(convs)
            with open(conv, encoding="utf-8") as f:
                c = json.load(f)
            ok, ref = jinja_ref.render(src, c)
            with open(tpath, "w") as f:
                f.write(src)
            p = subprocess.run([args.augur, "template", "--template", tpath, "--messages", conv], capture_output=True)
            got, err = p.stdout.decode("utf-8", "replace"), p.stderr.decode("utf-8", "replace")
            if (ok and p.returncode == 0 and got == ref) or (not ok and p.returncode == 1 and ref.split(": ", 1)[-1] in err):
                agree += 1
            else:
                bad.append((src, ok, ref, got, err.strip()))
    for src, ok, ref, got, err in bad[: args.show]:
        print("=" * 70)
        print("TEMPLATE:", repr(src))
        print("jinja2  :", ("OK " if ok else "ERR ") + repr(ref)[:400])
        print("augur   :", repr(got)[:400], err[:300])
    print(f"chat mode: {agree}/{args.n} agree, {len(bad)} disagree")
    return 1 if bad else 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("-n", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--augur", default=os.path.join(HERE, "..", "build", "augur"))
    ap.add_argument("--show", type=int, default=20)
    ap.add_argument("--chat", action="store_true", help="chat-template-shaped templates over the test conversations")
    args = ap.parse_args()
    if args.chat:
        return main_chat(args)
    rng = random.Random(args.seed)
    agree = unsupported = 0
    bad = []
    with tempfile.TemporaryDirectory() as td:
        conv = os.path.join(td, "c.json")
        with open(conv, "w") as f:
            json.dump(dict(CTX, messages=CTX["msgs"], ns=None), f)
        tpath = os.path.join(td, "t.jinja")
        for i in range(args.n):
            src = tag(rng, "set ns = namespace(x=0)") + "".join(gen_stmt(rng) for _ in range(rng.randint(1, 4)))
            ok, ref = jinja_ref.render(src, copy.deepcopy(dict(CTX, messages=CTX["msgs"], ns=None)))
            with open(tpath, "w") as f:
                f.write(src)
            p = subprocess.run([args.augur, "template", "--template", tpath, "--messages", conv], capture_output=True)
            got, err = p.stdout.decode("utf-8", "replace"), p.stderr.decode("utf-8", "replace")
            # object addresses cannot match: compare without them
            got, ref = GEN_ADDR.sub(r"\1>", got), GEN_ADDR.sub(r"\1>", ref)
            if ok and p.returncode == 0 and got == ref:
                agree += 1
            elif not ok and p.returncode == 1 and ref.split(": ", 1)[-1] in err:
                agree += 1
            elif "unsupported:" in err:
                unsupported += 1
            else:
                bad.append((src, ok, ref, got, err.strip()))
    for src, ok, ref, got, err in bad[: args.show]:
        print("=" * 70)
        print("TEMPLATE:", repr(src))
        print("jinja2  :", ("OK " if ok else "ERR ") + repr(ref)[:400])
        print("augur   :", repr(got)[:400], err[:300])
    print(f"{agree}/{args.n} agree, {unsupported} unsupported, {len(bad)} disagree")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
