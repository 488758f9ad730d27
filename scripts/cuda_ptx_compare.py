#!/usr/bin/env python3
"""Whether two trees' CUDA kernels compile to the same code, kernel by kernel.

For a change that should not touch the generated code (moving kernels
between files, renaming a host function, editing comments): every .cu under
src/backend/cuda of both trees is compiled to PTX with the Makefile's
NVCCFLAGS (sm_90a), and each kernel (.entry) and device function (.func) is
compared by name, whatever file it now lives in:

  - its PTX body, with what only says where it came from taken out: the
    .loc/.file debug lines, the TU's hash in the names of static functions'
    statics (_INTERNAL_<hash>_<len>_<file>_cu_<hash>), the function's index
    in the module in its labels ($L__BB12_3) and local depot;
  - ptxas -v's figures (registers, barriers, stack frame, spill stores and
    loads, shared and constant memory);
  - the module-scope declarations (.shared/.global/.const), normalized the
    same way, as a set.

A kernel that is missing on one side (a template no longer instantiated)
counts as a difference. Exit status 0: the same; 1: differences (listed).

  scripts/cuda_ptx_compare.py                  # the working tree against HEAD
  scripts/cuda_ptx_compare.py --base main      # ... against another revision
  scripts/cuda_ptx_compare.py --base-dir D     # ... against PTX saved in D (--save D)
  scripts/cuda_ptx_compare.py --save D [--tree T]  # only compile T (default: .) into D
  scripts/cuda_ptx_compare.py --compare A B    # two saved directories

-j N compiles N files at once (default 2). The PTX of one tree takes minutes
(cicc on the biggest file); ptxas -v about as long again. No GPU needed.
"""
import argparse
import concurrent.futures as cf
import os
import re
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CUDA_HOME = os.environ.get("CUDA_HOME") or (
    os.path.dirname(os.path.dirname(shutil.which("nvcc"))) if shutil.which("nvcc") else "/usr/local/cuda")
NVCC = os.path.join(CUDA_HOME, "bin", "nvcc")
PTXAS = os.path.join(CUDA_HOME, "bin", "ptxas")
ARCH = "sm_90a"
# The Makefile's NVCCFLAGS for CUDA_ARCH=-gencode=arch=compute_90a,code=sm_90a
# (less -MMD -MP); keep in step with it.
NVCCFLAGS = ["-std=c++17", "-O3", "-gencode=arch=compute_90a,code=sm_90a", "-DAUGUR_SM90A", "-Isrc", "-Iinclude",
             "-DAUGUR_CUDA", "-Xcompiler", "-Wall,-fno-strict-aliasing", "-lineinfo"]
# what nvcc runs ptxas with for these flags (nvcc -dryrun)
PTXAS_FLAGS = ["-arch=" + ARCH, "-m64", "--generate-line-info", "-v"]


def cu_files(tree):
    d = os.path.join(tree, "src", "backend", "cuda")
    return sorted(os.path.join(d, f) for f in os.listdir(d) if f.endswith(".cu"))


def compile_one(tree, cu, out_dir):
    base = os.path.splitext(os.path.basename(cu))[0]
    ptx = os.path.join(out_dir, base + ".ptx")
    r = subprocess.run([NVCC] + NVCCFLAGS + ["-ptx", os.path.relpath(cu, tree), "-o", ptx], cwd=tree,
                       capture_output=True, text=True)
    if r.returncode:
        raise RuntimeError("nvcc -ptx %s failed:\n%s" % (cu, r.stderr))
    r = subprocess.run([PTXAS] + PTXAS_FLAGS + [ptx, "-o", os.devnull], capture_output=True, text=True)
    if r.returncode:
        raise RuntimeError("ptxas %s failed:\n%s" % (ptx, r.stderr))
    with open(os.path.join(out_dir, base + ".ptxas"), "w") as f:
        f.write(r.stdout + r.stderr)
    return base


def save(tree, out_dir, jobs):
    os.makedirs(out_dir, exist_ok=True)
    for f in os.listdir(out_dir):
        if f.endswith((".ptx", ".ptxas")):
            os.remove(os.path.join(out_dir, f))
    files = cu_files(tree)
    # the biggest first, so the longest compile starts at once
    files.sort(key=lambda p: -os.path.getsize(p))
    with cf.ThreadPoolExecutor(max_workers=jobs) as ex:
        for base in ex.map(lambda cu: compile_one(tree, cu, out_dir), files):
            print("  compiled %s" % base, file=sys.stderr)


INTERNAL = re.compile(r"(\d+)_INTERNAL_")


def strip_internal(s):
    """_ZN46_INTERNAL_305758b9_15_cuda_backend_cu_a150d02b12argmax_block... ->
    _ZN_INTERNAL_12argmax_block...: the length-prefixed TU name taken out."""
    out, i = [], 0
    while True:
        m = INTERNAL.search(s, i)
        if not m:
            out.append(s[i:])
            return "".join(out)
        n = int(m.group(1))
        out.append(s[i:m.start()])
        out.append("_INTERNAL_")
        i = m.start(1) + len(m.group(1)) + n


def normalize(line):
    line = strip_internal(line)
    line = re.sub(r"\$L__BB\d+_", "$L__BB_", line)
    line = re.sub(r"__local_depot\d+", "__local_depot", line)
    line = re.sub(r"\$L__func_(begin|end)\d+", r"$L__func_\1", line)
    return line


HEAD = re.compile(r"^(?:\.visible |\.weak |\.extern )?\.(entry|func)\s+(?:\([^)]*\)\s*)?([A-Za-z_$][\w$]*)")
DECL = re.compile(r"^(?:\.visible |\.weak |\.extern )?\.(shared|global|const)\b")


def parse_ptx(path):
    """{name: (normalized body lines, the .shared variables it uses)} for
    .entry/.func definitions, and the set of normalized module-scope
    declarations. A function-scope __shared__ variable of an inline
    function is declared at module scope when two kernels of the file use
    it, or inside the one kernel that does ("// demoted variable"): which
    one depends on the file's other kernels, so a function's variables are
    compared as a set (name, type, size, alignment) wherever declared."""
    funcs, decls, module_shared = {}, set(), {}
    with open(path) as f:
        lines = f.read().split("\n")
    i, n = 0, len(lines)
    while i < n:
        ln = lines[i]
        if ln.startswith(".section"):  # debug sections: the rest of the file
            break
        m = HEAD.match(ln)
        if m:
            name = strip_internal(m.group(2))
            body, shared, depth, started = [], set(), 0, False
            while i < n:
                cur = lines[i]
                s = cur.strip()
                i += 1
                if s.startswith(".loc") or s.startswith(".file") or not s:
                    continue
                if s == "// demoted variable":
                    shared.add(normalize(lines[i].strip()))
                    i += 1
                    continue
                body.append(normalize(cur.rstrip()))
                depth += cur.count("{") - cur.count("}")
                if "{" in cur:
                    started = True
                if started and depth == 0:
                    break
                if not started and s.endswith(";"):  # a prototype only
                    body = None
                    break
            if body is not None:
                funcs[name] = (body, shared)
            continue
        if DECL.match(ln) or ln.startswith(".extern .shared"):
            d = normalize(ln.strip())
            decls.add(d)
            if ".shared" in d:
                var = re.search(r"([A-Za-z_$][\w$]*)\s*(\[\d*\])?\s*;", d)
                if var:
                    module_shared[var.group(1)] = d
        i += 1
    for name, (body, shared) in funcs.items():
        text = "\n".join(body)
        for var, d in module_shared.items():
            if re.search(r"(?<![\w$])" + re.escape(var) + r"(?![\w$])", text):
                shared.add(d)
    return {k: (b, tuple(sorted(sh))) for k, (b, sh) in funcs.items()}, decls


def externs(path):
    """the file's .extern .shared declarations (dynamic shared memory)"""
    with open(path) as f:
        return [ln.strip() for ln in f if ln.startswith(".extern .shared")]


def ptxas_with(path, extra, out_dir):
    """ptxas -v of the PTX at path with the declarations extra added at
    module scope (unreferenced: no code changes; their alignment can change
    how ptxas pads a kernel's static shared memory)"""
    with open(path) as f:
        s = f.read()
    i = s.index(".address_size")
    i = s.index("\n", i) + 1
    tmp = os.path.join(out_dir, os.path.basename(path))
    with open(tmp, "w") as f:
        f.write(s[:i] + "\n" + "\n".join(extra) + "\n" + s[i:])
    r = subprocess.run([PTXAS] + PTXAS_FLAGS + [tmp, "-o", os.devnull], capture_output=True, text=True)
    rep = os.path.join(out_dir, os.path.basename(path) + "as")
    with open(rep, "w") as f:
        f.write(r.stdout + r.stderr)
    return parse_ptxas(rep)


PROPS = re.compile(r"Function properties for (\S+)")
FIG = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
USED = re.compile(r"Used (\d+) registers(.*)")


def parse_ptxas(path):
    """{kernel: 'figures'} from ptxas -v's report"""
    out, cur = {}, None
    with open(path) as f:
        for ln in f:
            m = PROPS.search(ln)
            if m:
                cur = strip_internal(m.group(1))
                out.setdefault(cur, [])
                continue
            m = re.search(r"Compiling entry function '([^']+)'", ln) or re.search(r"Function '([^']+)'", ln)
            if m and "properties" not in ln:
                cur = strip_internal(m.group(1))
                out.setdefault(cur, [])
                continue
            if cur is None:
                continue
            m = FIG.search(ln)
            if m:
                out[cur].append("stack %s, spill st %s, spill ld %s" % m.groups())
            m = USED.search(ln)
            if m:
                out[cur].append("regs %s%s" % (m.group(1), m.group(2).strip().rstrip(".")))
    return {k: "; ".join(v) for k, v in out.items()}


def load(d):
    funcs, decls, figs, where = {}, set(), {}, {}
    for f in sorted(os.listdir(d)):
        p = os.path.join(d, f)
        if f.endswith(".ptx"):
            fu, de = parse_ptx(p)
            for k, v in fu.items():
                if k in funcs:  # libdevice helpers (__internal_*), one copy per module
                    if funcs[k] != v:
                        funcs[k + "@" + f] = v
                    continue
                funcs[k] = v
                where[k] = p
            decls |= de
        elif f.endswith(".ptxas"):
            for k, v in parse_ptxas(p).items():
                if k in figs and figs[k] != v and not k.startswith("__internal_"):
                    figs[k + "@" + f] = v
                else:
                    figs.setdefault(k, v)
    return funcs, decls, figs, where


SMEM = re.compile(r",? ?\d+ bytes smem")


def compare(a_dir, b_dir):
    fa, da, ga, wa = load(a_dir)
    fb, db, gb, wb = load(b_dir)
    bad = 0
    only_a, only_b = sorted(set(fa) - set(fb)), sorted(set(fb) - set(fa))
    for k in only_a:
        print("only in %s: %s" % (a_dir, k))
    for k in only_b:
        print("only in %s: %s" % (b_dir, k))
    bad += len(only_a) + len(only_b)
    same_body = 0
    import difflib
    for k in sorted(set(fa) & set(fb)):
        if fa[k] != fb[k]:
            bad += 1
            print("PTX differs: %s (%s -> %s)" % (k, wa.get(k), wb.get(k)))
            if fa[k][1] != fb[k][1]:
                print("    shared variables: %s -> %s" % (fa[k][1], fb[k][1]))
            for d in list(difflib.unified_diff(fa[k][0], fb[k][0], lineterm="", n=1))[:20]:
                print("    " + d)
        else:
            same_body += 1
    # ptxas -v: a kernel's static shared memory is padded to the largest
    # alignment of the file's dynamic shared memory (.extern .shared, e.g.
    # mmqv's 128-byte aligned rows), so a kernel whose file lost or gained
    # such a declaration reports other smem bytes with identical code: those
    # are checked again with the other side's declarations added.
    smem_only, redo = [], {}
    for k in sorted(set(ga) | set(gb)):
        a, b = ga.get(k), gb.get(k)
        if a == b:
            continue
        if a and b and SMEM.sub("", a) == SMEM.sub("", b) and k in wa and k in wb and fa.get(k) == fb.get(k):
            redo.setdefault((wa[k], wb[k]), []).append(k)
            continue
        bad += 1
        print("ptxas -v differs: %s: %s -> %s" % (k, a, b))
    if redo:
        tmp = tempfile.mkdtemp(prefix="ptxcmp-smem.")
        try:
            for (pa, pb), ks in sorted(redo.items()):
                ea, eb = externs(pa), externs(pb)
                add_b = [x for x in ea if x.split()[-1].rstrip("[];") not in {y.split()[-1].rstrip("[];") for y in eb}]
                add_a = [x for x in eb if x.split()[-1].rstrip("[];") not in {y.split()[-1].rstrip("[];") for y in ea}]
                ra = ptxas_with(pa, add_a, tmp) if add_a else ga
                rb = ptxas_with(pb, add_b, tmp) if add_b else gb
                for k in ks:
                    if ra.get(k) == rb.get(k):
                        smem_only.append((k, ga[k], gb[k], add_b or add_a))
                    else:
                        bad += 1
                        print("ptxas -v differs: %s: %s -> %s (and with the other file's .extern .shared: %s -> %s)"
                              % (k, ga[k], gb[k], ra.get(k), rb.get(k)))
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    for k, a, b, ext in smem_only:
        names = ", ".join(re.sub(r"\[\]\s*;$", "", x).split()[-1] for x in ext)
        print("smem padding only: %s: %s -> %s (the same with %s declared)" % (
            k, SMEM.search(a).group(0).strip(", "), SMEM.search(b).group(0).strip(", "), names))
    for d in sorted(da - db):
        if ".shared" in d and not d.startswith(".extern"):
            continue  # a function's shared variables are compared with it
        bad += 1
        print("declaration only in %s: %s" % (a_dir, d[:160]))
    for d in sorted(db - da):
        if ".shared" in d and not d.startswith(".extern"):
            continue
        bad += 1
        print("declaration only in %s: %s" % (b_dir, d[:160]))
    both = set(fa) & set(fb)
    print("%d functions (.entry/.func) in both: %d identical PTX (and shared variables); ptxas -v: %d identical, "
          "%d differing only by the file's shared-memory padding; %d differences"
          % (len(both), same_body, len(set(ga) & set(gb)) - len(smem_only) - sum(
              1 for k in set(ga) & set(gb) if ga[k] != gb[k] and k not in {x[0] for x in smem_only}),
             len(smem_only), bad))
    moved = {}
    for k in both:
        src, dst = os.path.basename(wa[k])[:-4], os.path.basename(wb[k])[:-4]
        moved[(src, dst)] = moved.get((src, dst), 0) + 1
    for (src, dst), c in sorted(moved.items()):
        print("  %3d from %s.cu to %s.cu" % (c, src, dst))
    return 1 if bad else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base", default="HEAD", help="the revision to compare the working tree with (default HEAD)")
    ap.add_argument("--base-dir", help="saved PTX of the base (--save), instead of compiling --base")
    ap.add_argument("--save", metavar="DIR", help="only compile --tree into DIR")
    ap.add_argument("--tree", default=ROOT, help="the tree --save compiles (default: this checkout)")
    ap.add_argument("--compare", nargs=2, metavar=("A", "B"), help="compare two saved directories")
    ap.add_argument("--keep", metavar="DIR", help="keep the working tree's PTX in DIR")
    ap.add_argument("-j", type=int, default=2)
    a = ap.parse_args()
    if a.compare:
        return compare(*a.compare)
    if a.save:
        save(a.tree, a.save, a.j)
        return 0
    tmp = tempfile.mkdtemp(prefix="ptxcmp.")
    try:
        base_dir = a.base_dir
        if not base_dir:
            base_tree = os.path.join(tmp, "base")
            os.makedirs(base_tree)
            arch = subprocess.run(["git", "-C", ROOT, "archive", a.base, "src", "include"], check=True,
                                  capture_output=True).stdout
            subprocess.run(["tar", "-x", "-C", base_tree], input=arch, check=True)
            base_dir = os.path.join(tmp, "base.ptx")
            print("compiling %s ..." % a.base, file=sys.stderr)
            save(base_tree, base_dir, a.j)
        head_dir = a.keep or os.path.join(tmp, "head.ptx")
        print("compiling the working tree ...", file=sys.stderr)
        save(ROOT, head_dir, a.j)
        return compare(base_dir, head_dir)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
