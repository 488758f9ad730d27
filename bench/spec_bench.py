#!/usr/bin/env python3
"""Speculative decoding: augur vs llama.cpp's prompt lookup, plain vs speculative, one run.

For each prompt set (bench/prompts/<set>/*.txt), each temperature and each
mode, every prompt is sent as one chat turn and N tokens are generated:

  augur         build/augur run --chat -f PROMPT -n N --temp T --seed S -t THREADS
  augur-ngram   ... --draft ngram             (augur's prompt lookup)
  augur-draft   ... --draft DRAFT.gguf        (a draft model; n/a when the build
                                               says "draft models are not supported yet")
  llama         llama-cpp-python: Llama(...).generate() on the same prompt tokens
  llama-lookup  the same with draft_model=LlamaPromptLookupDecoding(num_pred_tokens=K)

Reported: decode tok/s (prefill excluded: augur's own figure, which is
(generated - 1) / decode time; for llama.cpp the same formula from the first
generated token to the last), the speedup of each speculative mode over its
engine's plain mode, tau = tokens emitted per verify step (mean accepted length
incl. the bonus token; counted over target forwards that verified a draft,
as augur's "tokens per verify step"), the draft acceptance rate, and the ratio
augur-ngram / llama-lookup.

Method. In each repetition every prompt runs under every mode back to back,
the mode order rotating between repetitions, so the machine's drift hits all
modes alike. Per repetition a set's tok/s is (sum of generated - 1) / (sum of
decode time) over its prompts; speedups and ratios are taken within a
repetition and then the median over repetitions is printed (ratios from one
run, never from two). tau is the mean over prompts, then the median over
repetitions.

Same prompt on both engines: the prompt file is rendered by augur's chat
template (`augur template`, what `augur run --chat` does; its token count is
checked against the count `augur run` prints), tokenized by augur, and those
token ids are fed to llama.cpp. llama-cpp-python also renders the model's
template itself (Jinja2ChatFormatter, what create_chat_completion uses) and
tokenizes it; the benchmark reports whether its text and tokens equal augur's.

At temperature 0, augur's speculative outputs must equal its plain output
token for token; a difference is printed as MISMATCH and counted (exit 1).

usage: bench/spec_bench.py [-m MODEL] [-t 2] [-n 128] [-r 3] [--sets code_edit,summarise,chat]
           [--temps 0,0.7] [--modes augur,augur-ngram,augur-draft,llama,llama-lookup]
           [--draft-model PATH|none] [--draft-max N] [--peer-draft-max 8] [--prompts K] [--seed 1] [--json FILE]
           [--ab-env VAR=VALUE]
--ab-env VAR=VALUE runs every augur mode a second time with VAR=VALUE in its
environment (an A/B of a kernel or setting in one run: mode "augur-ngram+ab"
etc., rotated with the others, its speedup over "augur+ab"); at temperature 0
every augur output, either variant, must equal augur plain's.
needs: build/augur (make), the model (scripts/fetch_models.py qwen-1.5b), and
for the llama modes llama-cpp-python built for this CPU (make bench-peer);
without it those modes are reported n/a. llama.cpp runs in a child process,
so a crash (e.g. SIGILL from a build for another CPU) is reported, not fatal.
On a shared machine run it when the load average is low (it is printed): the
OpenMP threads of llama.cpp spin-wait and lose several times more than augur's
threads when another process holds the cores; OMP_WAIT_POLICY=PASSIVE in the
environment (passed through to llama.cpp) softens that, at a small cost on an
idle machine. Say which was used when quoting figures.
"""
import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))
from cpu_bench import cpu_report, peer_build_report  # noqa: E402

AUGUR = os.environ.get("AUGUR_BIN", os.path.join(ROOT, "build", "augur"))
PROMPTS = os.path.join(ROOT, "bench", "prompts")
DEFAULT_MODEL = "models/Qwen2.5-Coder-1.5B-Instruct-Q4_K_M.gguf"
DEFAULT_DRAFT = "models/qwen2.5-0.5b-Q4.gguf"  # the default draft for the default target only
MODES = ["augur", "augur-ngram", "augur-draft", "llama", "llama-lookup"]  # the default run
# augur-draft-alone: the draft model without its prompt lookup (AUGUR_DRAFT_LOOKUP=0), on request
ALL_MODES = MODES + ["augur-draft-alone"]
BASE = {"augur": "augur", "augur-ngram": "augur", "augur-draft": "augur", "augur-draft-alone": "augur",
        "llama": "llama", "llama-lookup": "llama"}
LABEL = {"augur": "augur plain", "augur-ngram": "augur ngram", "augur-draft": "augur draft-model",
         "augur-draft-alone": "augur draft-model, no lookup", "llama": "llama.cpp plain",
         "llama-lookup": "llama.cpp lookup"}

RUN_RE = re.compile(r"augur: prompt (\d+) tokens, prefill ([\d.]+) tok/s \(([\d.]+) ms\); generated (\d+) tokens, "
                    r"decode ([\d.]+) tok/s; (.*)")
DRAFT_RE = re.compile(r"augur: draft (\S+)(?: \(up to \d+ per step\))?: drafted (\d+), accepted (\d+) \(([\d.]+)%\), ([\d.]+) tokens per verify step")
NOT_SUPPORTED = "draft models are not supported yet"


def log(msg):
    print(msg, file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- prompts

def load_sets(names, limit):
    sets = {}
    for s in names:
        d = os.path.join(PROMPTS, s)
        if not os.path.isdir(d):
            sys.exit(f"spec_bench: no prompt set '{s}' (have: {', '.join(sorted(os.listdir(PROMPTS)))})")
        files = sorted(f for f in os.listdir(d) if f.endswith(".txt"))
        if limit:
            files = files[:limit]
        sets[s] = [{"name": f"{s}/{f[:-4]}", "path": os.path.join(d, f),
                    "text": open(os.path.join(d, f), encoding="utf-8").read()} for f in files]
    return sets


def augur_render(model, text):
    conv = {"messages": [{"role": "user", "content": text}], "add_generation_prompt": True}
    r = subprocess.run([AUGUR, "template", "-m", model, "--messages", "-"], input=json.dumps(conv).encode(),
                       capture_output=True, check=True)
    return r.stdout.decode("utf-8")


def augur_tokenize(model, text):
    with tempfile.NamedTemporaryFile("w", encoding="utf-8", suffix=".txt", delete=False) as f:
        f.write(text)
    try:
        r = subprocess.run([AUGUR, "tokenize", "-m", model, "-f", f.name], capture_output=True, check=True)
    finally:
        os.unlink(f.name)
    return [int(x) for x in r.stdout.split()]


# --------------------------------------------------------------------------- augur

def augur_gen(a, prompt, mode, temp, seed):
    ab = mode.endswith("+ab")
    mode = mode.removesuffix("+ab")
    cmd = [AUGUR, "run", "-m", a.model, "--chat", "-f", prompt["path"], "-n", str(a.n), "--temp", str(temp),
           "--seed", str(seed), "-t", str(a.t)]
    if mode == "augur-ngram":
        cmd += ["--draft", "ngram"]
    elif mode in ("augur-draft", "augur-draft-alone"):
        cmd += ["--draft", a.draft_model]
    if mode != "augur" and a.draft_max:
        cmd += ["--draft-max", str(a.draft_max)]
    env = dict(os.environ, AUGUR_DRAFT_LOOKUP="0") if mode == "augur-draft-alone" else None
    if ab:
        var, _, val = a.ab_env.partition("=")
        env = dict(env or os.environ, **{var: val})
    r = subprocess.run(cmd, capture_output=True, timeout=1800, env=env)
    err = r.stderr.decode("utf-8", "replace")
    if r.returncode != 0:
        if NOT_SUPPORTED in err:
            return {"na": NOT_SUPPORTED}
        if mode in ("augur-draft", "augur-draft-alone"):  # e.g. a draft whose vocabulary does not match: the mode is n/a, the rest goes on
            return {"na": (err.strip().splitlines() or [f"exit status {r.returncode}"])[-1]}
        raise RuntimeError(f"{' '.join(cmd)}: exit status {r.returncode}: {err.strip()[-500:]}")
    m = RUN_RE.search(err)
    if not m:
        raise RuntimeError(f"{' '.join(cmd)}: no timing line on stderr: {err.strip()[-500:]}")
    res = {"n_prompt": int(m.group(1)), "prefill_tok_s": float(m.group(2)), "n_gen": int(m.group(4)),
           "tok_s": float(m.group(5)), "finish": m.group(6).strip(), "text": r.stdout.decode("utf-8", "replace")}
    res["t_decode"] = (res["n_gen"] - 1) / res["tok_s"] if res["tok_s"] > 0 else 0.0
    d = DRAFT_RE.search(err)
    if mode != "augur":
        if not d:
            raise RuntimeError(f"{' '.join(cmd)}: no draft line on stderr: {err.strip()[-500:]}")
        res.update(drafted=int(d.group(2)), accepted=int(d.group(3)), tau=float(d.group(5)))
    return res


# --------------------------------------------------------------------------- llama.cpp (child process)

def peer_worker(model, threads, n_ctx, ngram, pred):
    """Runs in a child process: JSON requests on stdin, JSON answers on the
    original stdout (fd 1 is pointed at stderr so llama.cpp's prints cannot
    corrupt the protocol)."""
    proto = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)

    def send(obj):
        proto.write(json.dumps(obj) + "\n")
        proto.flush()

    try:
        import llama_cpp
        from llama_cpp import Llama
        from llama_cpp.llama_chat_format import Jinja2ChatFormatter
        from llama_cpp.llama_speculative import LlamaPromptLookupDecoding
    except Exception as e:  # noqa: BLE001
        send({"error": f"import llama_cpp failed: {e!r}"})
        return 1
    send({"ok": True, "version": llama_cpp.__version__})
    llms = {}

    def get(mode):
        if mode not in llms:
            draft = LlamaPromptLookupDecoding(max_ngram_size=ngram, num_pred_tokens=pred) if mode == "llama-lookup" else None
            # logits_all=True with a draft model: Llama uses all logits then anyway, but sizes its score
            # buffer by the logits_all argument (n_batch rows otherwise: a ValueError past 512 tokens).
            llms[mode] = Llama(model, n_ctx=n_ctx, n_batch=512, n_threads=threads, n_threads_batch=threads,
                               draft_model=draft, logits_all=draft is not None, verbose=False)
        return llms[mode]

    for line in sys.stdin:
        req = json.loads(line)
        if req["op"] == "render":
            llm = get("llama")
            tmpl = llm.metadata.get("tokenizer.chat_template")
            if not tmpl:
                send({"text": None, "ids": None})
                continue
            eos, bos = llm.token_eos(), llm.token_bos()
            fmt = Jinja2ChatFormatter(template=tmpl, eos_token=llm._model.token_get_text(eos) if eos != -1 else "",
                                      bos_token=llm._model.token_get_text(bos) if bos != -1 else "",
                                      stop_token_ids=[eos])
            res = fmt(messages=[{"role": "user", "content": req["text"]}])
            ids = llm.tokenize(res.prompt.encode("utf-8"), add_bos=not res.added_special, special=True)
            send({"text": res.prompt, "ids": ids})
        elif req["op"] == "gen":
            try:
                send(peer_gen(llama_cpp, Llama, get(req["mode"]), req))
            except Exception as e:  # noqa: BLE001 (a Python error in one mode; the child goes on)
                send({"na": f"{type(e).__name__}: {e}"})
    return 0


def peer_gen(llama_cpp, Llama, llm, req):
    """One generation on llm (plain or prompt lookup): decode tok/s from the first token to the last, and
    per verify step (a llama_decode of 1 + d tokens, d > 0) the drafted, accepted and emitted counts."""
    llm.reset()
    llm.set_seed(req["seed"])
    steps = []  # tokens per llama_decode batch: [prompt, 1 + drafted, ...]

    def ev(tokens, _llm=llm):
        steps.append(len(tokens))
        return Llama.eval(_llm, tokens)

    llm.eval = ev
    out, rnd = [], []
    t_first = t_last = None
    try:
        for tok in llm.generate(req["ids"], top_k=40, top_p=0.95, min_p=0.05, typical_p=1.0, temp=req["temp"],
                                repeat_penalty=1.0, reset=True):
            t_last = time.perf_counter()
            if t_first is None:
                t_first = t_last
            out.append(tok)
            rnd.append(len(steps) - 1)
            if llama_cpp.llama_vocab_is_eog(llm._model.vocab, tok) or len(out) >= req["n"]:
                break
    finally:
        del llm.eval
    emitted = {}
    for r in rnd[1:]:
        emitted[r] = emitted.get(r, 0) + 1
    rounds = drafted = accepted = em = 0
    for r, e in emitted.items():
        d = steps[r] - 1
        if d > 0:
            rounds += 1
            drafted += d
            accepted += min(e - 1, d)
            em += e
    n = len(out)
    dt = t_last - t_first if n > 1 else 0.0
    return {"n_gen": n, "t_decode": dt, "tok_s": (n - 1) / dt if dt > 0 else 0.0, "drafted": drafted,
            "accepted": accepted, "tau": em / rounds if rounds else 0.0, "rounds": rounds,
            "text": llm.detokenize(out).decode("utf-8", "replace")}


class Peer:
    """The llama.cpp child; after a crash every call answers {"na": reason}."""

    def __init__(self, a, n_ctx):
        self.dead = None
        self.p = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--peer-worker", a.model, str(a.t),
                                   str(n_ctx), str(a.peer_ngram), str(a.peer_draft_max)],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        hello = self._read()
        if hello and "error" in hello:
            self.dead = hello["error"] + " (build it: make bench-peer)"
        elif hello:
            self.version = hello["version"]

    def _read(self):
        line = self.p.stdout.readline()
        if line:
            return json.loads(line)
        rc = self.p.wait()
        if rc < 0:
            try:
                name = signal.Signals(-rc).name
            except ValueError:
                name = f"signal {-rc}"
            self.dead = f"llama.cpp crashed with {name}"
            if -rc == signal.SIGILL:
                self.dead += " (built for another CPU? rebuild it here: make bench-peer)"
        else:
            self.dead = f"the llama.cpp child exited with status {rc}"
        log(f"\n!!! {self.dead}; the llama modes are n/a from here on\n")
        return None

    def call(self, req):
        if self.dead:
            return {"na": self.dead}
        try:
            self.p.stdin.write(json.dumps(req) + "\n")
            self.p.stdin.flush()
        except BrokenPipeError:
            pass
        r = self._read()
        return r if r is not None else {"na": self.dead}

    def close(self):
        if self.p.poll() is None:
            self.p.stdin.close()
            self.p.wait()


# --------------------------------------------------------------------------- report

def med(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def fmt(x, spec=".1f", suffix=""):
    return "n/a" if x is None else f"{x:{spec}}{suffix}"


def summarize(runs, sets, temps, modes, reps):
    """Per (set, temp, mode, rep): aggregate tok/s, tau, acceptance; then medians and ratios."""
    agg = {}
    for (s, temp, mode, rep), rs in runs.items():
        rs = [r for r in rs if "na" not in r and r.get("tok_s", 0) > 0]
        if not rs:
            continue
        n = sum(r["n_gen"] - 1 for r in rs)
        t = sum(r["t_decode"] for r in rs)
        taus = [r["tau"] for r in rs if r.get("tau")]
        dr = sum(r.get("drafted", 0) for r in rs)
        agg[(s, temp, mode, rep)] = {"tok_s": n / t if t > 0 else None, "tau": statistics.mean(taus) if taus else None,
                                     "accept": sum(r.get("accepted", 0) for r in rs) / dr if dr else None,
                                     "n_gen": statistics.mean(r["n_gen"] for r in rs)}

    def ratio(s, temp, m1, m2):
        out = []
        for rep in range(reps):
            x, y = agg.get((s, temp, m1, rep)), agg.get((s, temp, m2, rep))
            if x and y and x["tok_s"] and y["tok_s"]:
                out.append(x["tok_s"] / y["tok_s"])
        return med(out)

    table = {}
    for s in sets:
        for temp in temps:
            row = {}
            for m in modes:
                vals = [agg.get((s, temp, m, rep)) for rep in range(reps)]
                vals = [v for v in vals if v]
                row[m] = {"tok_s": med([v["tok_s"] for v in vals]), "tau": med([v["tau"] for v in vals]),
                          "accept": med([v["accept"] for v in vals]), "n_gen": med([v["n_gen"] for v in vals]),
                          "min": min((v["tok_s"] for v in vals), default=None),
                          "max": max((v["tok_s"] for v in vals), default=None)}
                if m != BASE[m]:
                    row[m]["speedup"] = ratio(s, temp, m, BASE[m])
            row["ngram_vs_lookup"] = ratio(s, temp, "augur-ngram", "llama-lookup")
            row["plain_vs_plain"] = ratio(s, temp, "augur", "llama")
            table[(s, temp)] = row
    return table


def print_tables(table, modes, na):
    def cell(row, m, with_speedup=True):
        if m not in modes:
            return "-"
        v = row[m]
        if v["tok_s"] is None:
            return "n/a"
        c = f"{v['tok_s']:.1f}"
        if with_speedup and m != BASE[m]:
            c += f" ({fmt(v.get('speedup'), '.2f', 'x')}, τ {fmt(v['tau'], '.2f')})"
        return c

    print("\n| set | T | augur plain | augur ngram (speedup, τ) | augur draft-model (speedup, τ) | llama.cpp plain | "
          "llama.cpp lookup (speedup, τ) | augur ngram / llama lookup | augur / llama plain |")
    print("|---|---|---|---|---|---|---|---|---|")
    for (s, temp), row in table.items():
        print(f"| {s} | {temp:g} | {cell(row, 'augur')} | {cell(row, 'augur-ngram')} | {cell(row, 'augur-draft')} | "
              f"{cell(row, 'llama')} | {cell(row, 'llama-lookup')} | {fmt(row['ngram_vs_lookup'], '.2f', 'x')} | "
              f"{fmt(row['plain_vs_plain'], '.2f', 'x')} |")
    print("\ndecode tok/s: median over repetitions of (sum of tokens - 1) / (sum of decode time) over the set's prompts;"
          "\nspeedup and ratios: within each repetition, then the median; τ: tokens per verify step (mean over prompts).")
    for m, why in na.items():
        print(f"{LABEL[m]}: n/a: {why}")

    print("\n| set | T | mode | decode tok/s median | min | max | speedup | draft acceptance | τ | tokens generated (mean) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for (s, temp), row in table.items():
        for m in modes:
            v = row[m]
            if v["tok_s"] is None:
                continue
            print(f"| {s} | {temp:g} | {LABEL[m]} | {v['tok_s']:.1f} | {fmt(v['min'])} | {fmt(v['max'])} | "
                  f"{fmt(v.get('speedup'), '.2f', 'x') if m != BASE[m] else '-'} | {fmt(None if v['accept'] is None else 100 * v['accept'], '.1f', '%')} | {fmt(v['tau'], '.2f')} | "
                  f"{fmt(v['n_gen'], '.0f')} |")


# --------------------------------------------------------------------------- main

def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", default=DEFAULT_MODEL)
    ap.add_argument("-t", type=int, default=2, help="threads (default 2)")
    ap.add_argument("-n", type=int, default=128, help="tokens to generate (default 128)")
    ap.add_argument("-r", type=int, default=3, help="repetitions (default 3)")
    ap.add_argument("--sets", default="code_edit,summarise,chat")
    ap.add_argument("--temps", default="0,0.7")
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--draft-model", default=None,
                    help=f"draft GGUF for augur-draft (default: {DEFAULT_DRAFT} when -m is the default target; "
                         "'none': skip the mode)")
    ap.add_argument("--draft-max", type=int, default=0,
                    help="augur --draft-max (default: none given, each source's own)")
    ap.add_argument("--peer-draft-max", type=int, default=8,
                    help="llama.cpp lookup num_pred_tokens (default 8: 1.16x on whole code-edit answers where "
                         "16 gave 1.11x, bench/RESULTS.md 2026-12-06)")
    ap.add_argument("--peer-ngram", type=int, default=2, help="llama.cpp lookup max_ngram_size (default 2)")
    ap.add_argument("--prompts", type=int, default=0, help="use only the first K prompts of each set")
    ap.add_argument("--seed", type=int, default=1, help="base seed (prompt i, repetition r: seed + i + 1000 r)")
    ap.add_argument("--json", help="write every run and the summary to this file")
    ap.add_argument("--ab-env", help="VAR=VALUE: every augur mode also runs with it in its environment (A/B)")
    a = ap.parse_args()

    def resolve(path):  # as given from here, else relative to the repository; shown relative to it
        path = os.path.abspath(path) if os.path.exists(path) else os.path.join(ROOT, path)
        return os.path.relpath(path, ROOT) if path.startswith(ROOT + os.sep) else path

    default_target = a.model == DEFAULT_MODEL
    a.model = resolve(a.model)
    if a.draft_model not in (None, "none"):
        a.draft_model = resolve(a.draft_model)
    if a.json:
        a.json = os.path.abspath(a.json)
    os.chdir(ROOT)
    if not os.path.exists(AUGUR):
        sys.exit(f"spec_bench: {AUGUR} not found (run make)")
    if not os.path.exists(a.model):
        sys.exit(f"spec_bench: {a.model} not found (python3 scripts/fetch_models.py qwen-1.5b)")
    if a.n < 2:
        sys.exit("spec_bench: -n must be at least 2 (decode speed is measured from the second token on)")
    temps = [float(x) for x in a.temps.split(",")]
    modes = [m for m in a.modes.split(",") if m]
    for m in modes:
        if m not in ALL_MODES:
            sys.exit(f"spec_bench: unknown mode '{m}' (modes: {', '.join(ALL_MODES)})")
    if a.ab_env:
        if "=" not in a.ab_env:
            sys.exit("spec_bench: --ab-env wants VAR=VALUE")
        for m in [m for m in modes if BASE[m] == "augur"]:
            BASE[m + "+ab"] = "augur+ab" if BASE[m] == "augur" else BASE[m]
            LABEL[m + "+ab"] = f"{LABEL[m]} [{a.ab_env}]"
            modes.append(m + "+ab")
    na = {}
    for dm in ("augur-draft", "augur-draft-alone", "augur-draft+ab", "augur-draft-alone+ab"):
        if dm not in modes:
            continue
        if a.draft_model is None:
            a.draft_model = DEFAULT_DRAFT if default_target or a.model == DEFAULT_MODEL else "none"
        if a.draft_model == "none":
            na[dm] = "no draft model for this target (--draft-model PATH)"
        elif not os.path.exists(a.draft_model):
            na[dm] = f"{a.draft_model} not found"
    sets = load_sets([s for s in a.sets.split(",") if s], a.prompts)

    # ---- header
    commit = subprocess.run(["git", "-C", ROOT, "log", "-1", "--format=%h %s"], capture_output=True, text=True).stdout
    print(f"# spec_bench {time.strftime('%Y-%m-%d %H:%M')}, augur {commit.strip()[:80]}")
    print(cpu_report())
    print(peer_build_report())
    load = os.getloadavg()[0]
    omp = os.environ.get("OMP_WAIT_POLICY")
    print(f"load average at start {load:.2f} on {os.cpu_count()} CPUs" + (f"; OMP_WAIT_POLICY={omp}" if omp else ""))
    if load > 0.5:
        print("warning: the machine is busy: tok/s are not comparable with another run, and llama.cpp's OpenMP "
              "threads spin-wait, which costs it far more than augur when cores are shared (about 3x on SmolLM2, "
              "2 threads on 2 busy cores); OMP_WAIT_POLICY=PASSIVE in the environment (passed to llama.cpp) "
              "softens that")
    print(f"model {a.model}, {a.t} threads, {a.n} tokens, {a.r} repetitions, temps {a.temps}, "
          f"augur --draft-max {a.draft_max or 'default'} (llama.cpp lookup: num_pred_tokens {a.peer_draft_max}, "
          f"max_ngram_size {a.peer_ngram}); "
          f"augur-draft: {a.draft_model if 'augur-draft' not in na else 'n/a'}")

    # ---- prompt tokens, the same for both engines
    n_max = 0
    for s, ps in sets.items():
        for p in ps:
            p["rendered"] = augur_render(a.model, p["text"])
            p["ids"] = augur_tokenize(a.model, p["rendered"])
            n_max = max(n_max, len(p["ids"]))
    print("prompt tokens per set (chat-rendered, augur's tokenizer): " +
          "; ".join(f"{s} {min(len(p['ids']) for p in ps)}-{max(len(p['ids']) for p in ps)}" for s, ps in sets.items()))

    peer = None
    if any(BASE[m] == "llama" for m in modes):
        n_ctx = (n_max + a.n + 64 + 255) // 256 * 256
        peer = Peer(a, n_ctx)
        if peer.dead:
            for m in modes:
                if BASE[m] == "llama":
                    na[m] = peer.dead
        else:
            same_text = same_ids = total = 0
            for ps in sets.values():
                for p in ps:
                    r = peer.call({"op": "render", "text": p["text"]})
                    if "na" in r:
                        break
                    total += 1
                    same_text += r["text"] == p["rendered"]
                    same_ids += r["ids"] == p["ids"]
                    if r["ids"] != p["ids"]:
                        log(f"note: {p['name']}: llama.cpp's own chat rendering + tokenization gives "
                            f"{len(r['ids'])} tokens, augur's {len(p['ids'])} (text {'equal' if r['text'] == p['rendered'] else 'differs'})")
            if peer.dead:
                for m in modes:
                    if BASE[m] == "llama":
                        na[m] = peer.dead
            else:
                print(f"llama-cpp-python {peer.version}: both engines get augur's prompt token ids; llama.cpp's own "
                      f"chat template rendering (jinja2) equals augur's for {same_text}/{total} prompts, its tokens "
                      f"for {same_ids}/{total}")

    # ---- runs
    runs = {}
    raw = []
    mismatches = 0
    same_plain = [0, 0]  # temperature 0: augur plain text == llama.cpp plain text, of
    active = [m for m in modes if m not in na]
    order_all = [(s, i, p) for s, ps in sets.items() for i, p in enumerate(ps)]
    total = a.r * len(order_all) * len(temps) * len(active)
    done = 0
    t_start = time.time()
    for rep in range(a.r):
        for s, i, p in order_all:
            for temp in temps:
                seed = a.seed + i + 1000 * rep
                k = rep % len(active) if active else 0
                texts = {}
                for m in active[k:] + active[:k]:
                    if m in na:
                        continue
                    if BASE[m] in ("augur", "augur+ab"):
                        res = augur_gen(a, p, m, temp, seed)
                        if "na" not in res and res["n_prompt"] != len(p["ids"]):
                            log(f"note: {p['name']}: augur run saw {res['n_prompt']} prompt tokens, the rendered "
                                f"prompt given to llama.cpp has {len(p['ids'])}")
                    else:
                        res = peer.call({"op": "gen", "mode": m, "ids": p["ids"], "n": a.n, "temp": temp, "seed": seed})
                    done += 1
                    if "na" in res:
                        na[m] = res["na"]
                        log(f"{m}: n/a: {res['na']}")
                        continue
                    runs.setdefault((s, temp, m, rep), []).append(res)
                    raw.append({"set": s, "prompt": p["name"], "temp": temp, "mode": m, "rep": rep, "seed": seed,
                                **{k2: v for k2, v in res.items()}})
                    texts[m] = res["text"]
                    el = time.time() - t_start
                    log(f"[{done}/{total}, {el:.0f}s] rep {rep + 1} {p['name']} T={temp:g} {m}: {res['tok_s']:.1f} tok/s, "
                        f"{res['n_gen']} tokens" + (f", τ {res['tau']:.2f}" if res.get("tau") else ""))
                if temp == 0 and "augur" in texts:
                    for m in [m for m in texts if m != "augur" and BASE[m] in ("augur", "augur+ab")]:
                        if texts[m] != texts["augur"]:
                            mismatches += 1
                            log(f"\n!!! MISMATCH at temperature 0: {p['name']} rep {rep + 1}: {m} output differs from "
                                f"augur plain\n--- plain:\n{texts['augur']}\n--- {m}:\n{texts[m]}\n")
                if temp == 0 and "augur" in texts and "llama" in texts:
                    same_plain[0] += texts["augur"].removesuffix("\n") == texts["llama"]
                    same_plain[1] += 1
                if temp == 0 and "llama" in texts and "llama-lookup" in texts and texts["llama"] != texts["llama-lookup"]:
                    log(f"note: {p['name']} rep {rep + 1}: llama.cpp lookup output differs from llama.cpp plain at T=0 "
                        "(its batched verify can round differently; not counted)")
    if peer:
        peer.close()

    table = summarize(runs, list(sets), temps, modes, a.r)
    print_tables(table, modes, na)
    spec_modes = [m for m in modes if m != "augur" and BASE[m] in ("augur", "augur+ab")]
    n_checked = sum(1 for r in raw if r["temp"] == 0 and r["mode"] in spec_modes)
    if 0 in temps and any(m in active for m in spec_modes):
        print(f"\ntemperature 0, augur speculative vs plain output: {n_checked - mismatches}/{n_checked} identical"
              + (f" — {mismatches} MISMATCH(ES)" if mismatches else ""))
    if same_plain[1]:
        print(f"temperature 0, augur plain vs llama.cpp plain output: {same_plain[0]}/{same_plain[1]} identical (two "
              "implementations of a quantized model round differently; where the texts differ, the two speculative "
              "modes copy from different continuations)")
    print(f"load average at the end {os.getloadavg()[0]:.2f}; {time.time() - t_start:.0f} s")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"model": a.model, "threads": a.t, "n": a.n, "reps": a.r, "temps": temps, "modes": modes,
                       "draft_model": a.draft_model, "draft_max": a.draft_max, "peer_draft_max": a.peer_draft_max, "na": na, "mismatches": mismatches,
                       "same_plain_text_t0": same_plain,
                       "cpu": cpu_report(), "peer_build": peer_build_report(), "runs": raw,
                       "summary": [{"set": s, "temp": t, **row} for (s, t), row in table.items()]}, f, indent=1)
    return 1 if mismatches else 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--peer-worker":
        m, t, c, g, k = sys.argv[2:7]
        sys.exit(peer_worker(m, int(t), int(c), int(g), int(k)))
    sys.exit(main())
