#!/usr/bin/env python3
"""Regenerates the tokenizer reference data in tests/data/tok/ with llama.cpp's
own tokenizer (through llama-cpp-python), so that augur's tests compare
against an independent implementation without needing llama-cpp-python.

    scripts/tok_reference.py            # corpus + every model found
    scripts/tok_reference.py --corpus   # only rebuild corpus.jsonl

Outputs:
  tests/data/tok/corpus.jsonl   the texts: {"t": str} or {"b": base64} (invalid UTF-8)
  tests/data/tok/<name>.jsonl   line 1: {"model": file, "meta": {...}}; then one line per
                                corpus text, in order:
    "raw":  ids of tokenize(text, add_special=False, parse_special=False)
    "def":  ids of tokenize(text, add_special=True, parse_special=True); omitted when equal
            to [BOS if add_bos] + raw + [EOS if add_eos]
    "draw": llama_detokenize(raw, remove_special=False, unparse_special=False); omitted when
            equal to the text ("drawb": base64 when not UTF-8)
    "ddef": llama_detokenize(def, remove_special=True, unparse_special=True); same rules
  The meta holds bos/eos/eot/eom/pad ids, add_bos/add_eos, n_vocab, the EOG ids, and FNV-1a
  64 hashes over every token's piece (llama_token_to_piece, special true and false).
  tests/data/tok/pre.jsonl      every pre-tokenizer llama.cpp knows, on GPT-2's vocabulary
                                with tokenizer.ggml.pre set to that name: per text (every 3rd
                                corpus text), FNV-1a 32 of the raw ids as "1 2 3".

The corpus is built deterministically (fixed seed) from hand-written multilingual text,
generated whitespace/number/punctuation/contraction/special-token cases, random Unicode,
invalid UTF-8, and source code from Python's standard library.
"""
import argparse
import base64
import ctypes
import glob
import json
import os
import random
import sys
import sysconfig

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "tests", "data", "tok")
SHARED = os.environ.get("AUGUR_SHARED", os.path.join(os.path.dirname(ROOT), "shared"))
MODELS = os.environ.get("AUGUR_MODELS_DIR", os.path.join(ROOT, "models"))

# name -> (path, number of corpus texts to use: the vocab-only files get fewer to keep the
# committed data small)
TARGETS = {
    "smollm2": (os.path.join(MODELS, "SmolLM2-135M-Instruct.Q4_1.gguf"), None),
    "gemma3": (os.path.join(MODELS, "gemma-3-270m-Q4_K_M.gguf"), None),
    "qwen2": (os.path.join(MODELS, "qwen2.5-0.5b-Q4.gguf"), None),
    "gpt2": (os.path.join(SHARED, "testdata", "vocab", "ggml-vocab-gpt-2.gguf"), 700),
    "llama-spm": (os.path.join(SHARED, "testdata", "vocab", "ggml-vocab-llama-spm.gguf"), 700),
    "phi3": (os.path.join(SHARED, "testdata", "vocab", "ggml-vocab-phi-3.gguf"), 700),
    "stories260k": (os.path.join(SHARED, "models", "tiny", "stories260K.gguf"), 400),
}

SENTENCES = [
    "The quick brown fox jumps over the lazy dog.",
    "Hello, world! How are you doing today? I'm fine, thanks.",
    "我想在苹果公司工作。今天天气很好，我们去公园散步吧！",
    "東京は日本の首都です。ひらがなとカタカナと漢字を使います。",
    "안녕하세요, 만나서 반갑습니다. 한국어는 재미있어요.",
    "مرحبا بالعالم! كيف حالك اليوم؟ هذا نص عربي للاختبار.",
    "שלום עולם, זהו טקסט בעברית.",
    "नमस्ते दुनिया! यह हिंदी में एक परीक्षण वाक्य है।",
    "আমি বাংলায় গান গাই।",
    "สวัสดีครับ ยินดีที่ได้รู้จัก",
    "Привет, мир! Съешь же ещё этих мягких французских булок, да выпей чаю.",
    "Україна — це держава у Східній Європі. Ґанок, їжак, є.",
    "Γειά σου Κόσμε! Ξεσκεπάζω την ψυχοφθόρα βδελυγμία.",
    "İstanbul'da güzel bir gün. Şişli'ye gidiyorum, ğ ü ö ç ı.",
    "Tiếng Việt có nhiều dấu: ằ ẳ ẵ ặ ệ ộ ữ.",
    "Größe, Übermaß, Straße — äöü ÄÖÜ ß ẞ.",
    "Ça va? L'été dernier, j'étais à Paris. Œuvre, naïve, façade.",
    "¿Dónde está la biblioteca? ¡Mañana será otro día! Niño, año.",
    "Emoji: 😀😃😄😁😆 🚀🌍🔥 👩‍👩‍👧‍👦 👍🏽 🏳️‍🌈 ❤️ ✅ ☕",
    "Flags 🇺🇸🇫🇷🇯🇵 and keycaps 1️⃣ #️⃣ and ZWJ 🧑‍💻",
    "Math: ∀x∈ℝ, ∃y: x² + y² = z², ∫₀^∞ e^{-x} dx = 1, √2 ≈ 1.41421, π ≠ 3.",
    "Combining: e\u0301 a\u0300 n\u0303 o\u0308 — Z\u0351\u0361a\u0360l\u0358g\u0335o\u0322",
    "Zero width: a\u200bb\u200cc\u200dd\ufeffe and RTL \u202eabc\u202c done",
    "Spaces: a\u00a0b\u2002c\u2003d\u2009e\u3000f\u202fg\u205fh\u1680i",
    "Line seps: one\u2028two\u2029three\u0085four\u000bfive\u000csix",
    "Controls: \x01\x02\x1b[31mred\x1b[0m \x1c\x1d\x1e\x1f end\x7f",
    "Fullwidth: ＡＢＣ ａｂｃ １２３ ！？ （括号） 「引用」",
    "Arabic digits ١٢٣٤٥ and Devanagari ०१२३ and Thai ๑๒๓ and superscripts ¹²³ ½ ¾",
    "Ligatures ﬁ ﬂ ﬀ and compatibility ㎏ ㎡ ™ ℃ Ⅻ",
    "Private use \ue000\ue001 and unassigned \u0378\u0379 and supplementary 𠀀𠀁𪚥 𝔘𝔫𝔦𝔠𝔬𝔡𝔢",
    "Ancient: 𐌰𐌱𐌲 𓀀𓀁 𒀀 ᚠᚢᚦ ᛁ",
    "Mongolian ᠮᠣᠩᠭᠣᠯ and Tibetan བོད་ཡིག and Georgian ქართული and Armenian Հայերեն",
    "Amharic ሰላም, Cherokee ᏣᎳᎩ, Inuktitut ᐃᓄᒃᑎᑐᑦ",
    "Quotes: “double” ‘single’ «guillemets» „low“ ‹angle› 「corner」",
    "Dashes: - – — ― and ellipsis … and bullets • ◦ ‣",
    "Currency: $100 €20 £5 ¥1000 ₹50 ₽ ₿0.5 ¢",
]

WORDS = ("the of and to in is you that it he was for on are as with his they I at be this have "
         "from or one had by word but not what all were we when your can said there use an each "
         "which she do how their if will up other about out many then them these so some her "
         "would make like him into time has look two more write go see number no way could people "
         "my than first water been call who oil its now find long down day did get come made may "
         "part Hello World Python Rust function return const let var class def import").split()

CONTRACTIONS = ["I'm", "you're", "they've", "he'll", "it'd", "don't", "can't", "won't", "she's",
                "we'RE", "YOU'VE", "I'M", "It'S", "they'Ll", "he'D", "O'Neil", "rock 'n' roll",
                "' s", "'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'x", "''", "'", "`quoted'",
                "l'homme", "dell'arte", "ma'am", "y'all", "'tis", "'90s"]

PUNCT = list("!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~") + ["…", "—", "–", "«", "»", "“", "”", "‘", "’",
                                                       "、", "。", "，", "！", "？", "·", "•", "¿", "¡",
                                                       "§", "¶", "†", "‡", "‰", "′", "″"]

SPECIAL = ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<s>", "</s>", "<unk>", "<pad>", "<bos>",
           "<eos>", "<start_of_turn>", "<end_of_turn>", "<mask>", "[multimodal]", "<|fim_prefix|>",
           "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>",
           "<tool_call>", "</tool_call>", "<|user|>", "<|assistant|>", "<|system|>", "<|end|>",
           "<repo_name>", "<reponame>", "<file_sep>", "<filename>", "<gh_stars>", "<issue_start>",
           "<jupyter_code>", "<empty_output>", "<unused0>", "<unused99>", "<start_of_image>",
           "<table>", "</td>", "<h1>", "<b>", "<code>", "<|placeholder1|>", "[PAD151665]",
           "<|box_start|>", "<|vision_pad|>", "<|im_start", "im_end|>", "<|", "|>", "<<|im_end|>>"]

RANGES = [(0x20, 0x7E), (0xA0, 0xFF), (0x100, 0x24F), (0x300, 0x36F), (0x370, 0x3FF), (0x400, 0x4FF),
          (0x590, 0x5FF), (0x600, 0x6FF), (0x900, 0x97F), (0xE00, 0xE7F), (0x1100, 0x11FF),
          (0x2000, 0x206F), (0x2190, 0x22FF), (0x3000, 0x30FF), (0x4E00, 0x9FFF), (0xAC00, 0xD7A3),
          (0xFF00, 0xFFEF), (0x1F300, 0x1F64F), (0x1F900, 0x1F9FF), (0x20000, 0x2A6DF), (0xE000, 0xE0FF),
          (0x10000, 0x1007F), (0x0, 0x1F), (0x80, 0x9F), (0x2EBF0, 0x2EC10), (0xFFF0, 0xFFFF)]


def rnd_unicode(r, n):
    out = []
    for _ in range(n):
        a, b = r.choice(RANGES)
        c = r.randint(a, b)
        if 0xD800 <= c <= 0xDFFF:
            c = 0xFFFD
        out.append(chr(c))
    return "".join(out)


def rnd_words(r, n):
    return " ".join(r.choice(WORDS) for _ in range(n))


def stdlib_code(r, n_lines):
    """Lines and blocks of source code from Python's standard library."""
    libdir = sysconfig.get_paths()["stdlib"]
    files = sorted(glob.glob(os.path.join(libdir, "*.py")))
    picked = []
    for path in r.sample(files, min(40, len(files))):
        try:
            with open(path, encoding="utf-8") as f:
                lines = f.read().split("\n")
        except (OSError, UnicodeDecodeError):
            continue
        if len(lines) < 20:
            continue
        for _ in range(n_lines // 40 + 1):
            i = r.randrange(0, len(lines) - 12)
            k = r.choice([1, 1, 2, 3, 6, 12])
            picked.append("\n".join(lines[i:i + k]))
    return picked[:n_lines]


C_SNIPPETS = [
    "int main(int argc, char **argv) {\n\tprintf(\"%d\\n\", argc);\n\treturn 0;\n}",
    "for (size_t i = 0; i < n; ++i) { a[i] = b[i] * 2 + c[i] >> 1; }",
    "#include <stdio.h>\n#define MAX(a, b) ((a) > (b) ? (a) : (b))",
    "{\"name\": \"augur\", \"version\": \"0.1.0\", \"tags\": [\"llm\", \"c\"], \"n\": 42, \"ok\": true}",
    "<html><body><table><tr><td>cell</td></tr></table><h1>Title</h1><b>bold</b></body></html>",
    "SELECT id, name FROM users WHERE age >= 18 AND name LIKE '%smith%' ORDER BY id DESC;",
    "fn main() {\n    let v: Vec<i32> = (0..10).map(|x| x * x).collect();\n    println!(\"{:?}\", v);\n}",
    "$ ls -la /tmp && echo \"done\" | grep -E '^d' > out.txt 2>&1",
    "# Heading\n\n- item one\n- item two\n\n```python\nprint('hi')\n```\n\n> quote",
    "const f = async (x) => { await fetch(`/api/${x}`); return x?.y ?? 0; };",
    "x = [1, 2, 3]\ny = {k: v for k, v in zip('abc', x)}\nassert y['a'] == 1",
    "\t\tif (x == 1) {\n\t\t\ty += 2;\n\t\t}\n",
    "        return self._cache[key]\n    except KeyError:\n        pass",
]


def build_corpus(seed=1234):
    r = random.Random(seed)
    texts = []
    texts += ["", " ", "  ", "\n", "\n\n", "\t", "a", "Hello", " Hello", "  Hello", "Hello ", "Hello  "]
    texts += SENTENCES
    texts += C_SNIPPETS
    # sentences mixed with words and each other
    for _ in range(150):
        parts = [r.choice(SENTENCES), rnd_words(r, r.randint(1, 12)), r.choice(SENTENCES)]
        r.shuffle(parts)
        texts.append(r.choice([" ", "\n", "", "  ", "\t"]).join(parts))
    # whitespace runs
    ws = [" ", " ", " ", "\t", "\n", "\r", "\r\n", "\v", "\f", "\u00a0", "\u3000", "\u2003", "\u0085"]
    for _ in range(250):
        out = []
        for _ in range(r.randint(1, 8)):
            out.append("".join(r.choice(ws) for _ in range(r.randint(0, 9))))
            out.append(r.choice(["", r.choice(WORDS), r.choice(WORDS) + r.choice(PUNCT), str(r.randint(0, 999))]))
        texts.append("".join(out))
    for n in (1, 2, 3, 4, 5, 8, 15, 16, 17, 31, 32, 33, 64, 100):
        texts.append(" " * n + "x")
        texts.append("x" + " " * n)
        texts.append("\n" * n)
        texts.append("\t" * n + "y")
        texts.append("a" + "\n" * n + "b")
    # numbers
    for _ in range(220):
        k = r.choice([1, 2, 3, 4, 5, 6, 7, 9, 12, 20, 40])
        num = "".join(r.choice("0123456789") for _ in range(k))
        form = r.choice(["{}", " {}", "{} ", "x{}", "{}x", "{}.{}", "{},{}", "${}", "{}%", "v{}.{}.{}",
                         "({})", "-{}", "+{}e-{}", "0x{}", "{}:{}", "1,{},000", "{}th", "１{}２",
                         "٣{}", "{}²"])
        texts.append(form.format(*([num] * form.count("{}"))))
    texts += ["3", "33", "333", "3333", "33333", "333333", "3333333", "1234567890" * 5,
              "3.14159265358979323846", "1,000,000.00", "2024-01-15T10:30:00Z", "192.168.0.1"]
    # contractions and punctuation
    for _ in range(200):
        seq = []
        for _ in range(r.randint(1, 10)):
            c = r.random()
            if c < 0.4:
                seq.append(r.choice(CONTRACTIONS))
            elif c < 0.7:
                seq.append("".join(r.choice(PUNCT) for _ in range(r.randint(1, 5))))
            else:
                seq.append(r.choice(WORDS))
        texts.append(r.choice([" ", "", " ", "\n"]).join(seq))
    # special-token text
    for _ in range(200):
        seq = []
        for _ in range(r.randint(1, 8)):
            c = r.random()
            if c < 0.45:
                seq.append(r.choice(SPECIAL))
            elif c < 0.8:
                seq.append(rnd_words(r, r.randint(1, 4)))
            else:
                seq.append(r.choice(["\n", " ", "  ", "\n\n", "\t", ""]))
        texts.append(r.choice(["", " ", "\n"]).join(seq))
    texts += ["<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\n",
              "<start_of_turn>user\nHello<end_of_turn>\n<start_of_turn>model\n",
              "<s>[INST] hi [/INST]", "<|user|>\nhi<|end|>\n<|assistant|>", " <|im_end|> ", "</s> x", "x </s>"]
    # random unicode
    for _ in range(350):
        texts.append(rnd_unicode(r, r.randint(1, 40)))
    for _ in range(80):
        texts.append(rnd_words(r, 3) + rnd_unicode(r, r.randint(1, 10)) + rnd_words(r, 3))
    # code
    texts += stdlib_code(r, 400)
    for _ in range(60):
        texts.append(r.choice(C_SNIPPETS).replace("    ", r.choice(["    ", "\t", "  ", "        "])))
    # longer texts (a few KB)
    for _ in range(12):
        texts.append("\n".join(r.choice(texts[:800]) for _ in range(r.randint(10, 40))))
    # invalid UTF-8 (bytes)
    raw = []
    for _ in range(60):
        b = bytearray()
        for _ in range(r.randint(1, 12)):
            c = r.random()
            if c < 0.4:
                b += r.choice(WORDS).encode()
            elif c < 0.6:
                b += bytes([r.randint(0x80, 0xFF)])
            elif c < 0.7:
                b += r.choice([b"\xc0\x80", b"\xed\xa0\x80", b"\xf4\x8f\xbf\xbf", b"\xe2\x82", b"\xf0\x9f\x98",
                               b"\xff\xfe", b"\xc3", b"\xe0\x80\x80", b"\xf8\x88\x80\x80\x80"])
            else:
                b += r.choice(SENTENCES).encode()[: r.randint(1, 30)]
        if not crashes_llama_cpp(bytes(b)):
            raw.append(bytes(b))
    return [t.encode("utf-8") for t in texts] + raw


def crashes_llama_cpp(b):
    """llama.cpp's byte-level BPE aborts on a 4-byte sequence above U+10FFFF
    (unicode_cpt_to_utf8 throws through llama_tokenize): keep those out."""
    i = 0
    while i < len(b):
        c = b[i]
        if c & 0xF8 == 0xF0 and i + 3 < len(b) and all(x & 0xC0 == 0x80 for x in b[i + 1:i + 4]):
            if ((c & 7) << 18 | (b[i + 1] & 63) << 12 | (b[i + 2] & 63) << 6 | (b[i + 3] & 63)) > 0x10FFFF:
                return True
            i += 4
        else:
            i += 1
    return False


def encode_item(b):
    try:
        return {"t": b.decode("utf-8")}
    except UnicodeDecodeError:
        return {"b": base64.b64encode(b).decode()}


def decode_item(d):
    return d["t"].encode("utf-8") if "t" in d else base64.b64decode(d["b"])


def fnv1a64(data, h=0xCBF29CE484222325):
    for x in data:
        h ^= x
        h = (h * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def reference(name, path, texts, limit):
    import llama_cpp as L

    llm = L.Llama(path, vocab_only=True, verbose=False)
    vocab = L.llama_model_get_vocab(llm._model.model)
    n_vocab = L.llama_vocab_n_tokens(vocab)

    def tokenize(text, add, parse):
        n = len(text) + 16
        buf = (L.llama_token * n)()
        k = L.llama_tokenize(vocab, text, len(text), buf, n, add, parse)
        if k < 0:
            raise RuntimeError(f"tokenize failed: {k}")
        return list(buf[:k])

    def detokenize(ids, remove_special, unparse):
        arr = (L.llama_token * max(1, len(ids)))(*ids)
        cap = 64 + 64 * len(ids)
        out = ctypes.create_string_buffer(cap)
        k = L.llama_detokenize(vocab, arr, len(ids), out, cap, remove_special, unparse)
        if k < 0:
            cap = -k + 16
            out = ctypes.create_string_buffer(cap)
            k = L.llama_detokenize(vocab, arr, len(ids), out, cap, remove_special, unparse)
        return out.raw[:k]

    def piece(t, special):
        buf = ctypes.create_string_buffer(256)
        k = L.llama_token_to_piece(vocab, t, buf, 256, 0, special)
        if k < 0:
            buf = ctypes.create_string_buffer(-k)
            k = L.llama_token_to_piece(vocab, t, buf, -k, 0, special)
        return buf.raw[:k]

    h_sp, h_pl = 0xCBF29CE484222325, 0xCBF29CE484222325
    for t in range(n_vocab):
        h_sp = fnv1a64(piece(t, True) + b"\0", h_sp)
        h_pl = fnv1a64(piece(t, False) + b"\0", h_pl)
    bos, eos = L.llama_vocab_bos(vocab), L.llama_vocab_eos(vocab)
    add_bos, add_eos = bool(L.llama_vocab_get_add_bos(vocab)), bool(L.llama_vocab_get_add_eos(vocab))
    meta = {
        "n_vocab": n_vocab, "bos": bos, "eos": eos, "eot": L.llama_vocab_eot(vocab),
        "pad": L.llama_vocab_pad(vocab), "add_bos": add_bos, "add_eos": add_eos,
        "eog": [t for t in range(n_vocab) if L.llama_vocab_is_eog(vocab, t)],
        "piece_fnv_special": f"{h_sp:016x}", "piece_fnv_plain": f"{h_pl:016x}",
        "llama_cpp_python": L.__version__,
    }
    rows = []
    for text in texts[:limit] if limit else texts:
        raw = tokenize(text, False, False)
        dfl = tokenize(text, True, True)
        row = {"raw": " ".join(map(str, raw))}
        expect = ([bos] if add_bos else []) + raw + ([eos] if add_eos else [])
        if dfl != expect:
            row["def"] = " ".join(map(str, dfl))
        for key, ids, rs, up in (("draw", raw, False, False), ("ddef", dfl, True, True)):
            d = detokenize(ids, rs, up)
            if d != text:
                try:
                    row[key] = d.decode("utf-8")
                except UnicodeDecodeError:
                    row[key + "b"] = base64.b64encode(d).decode()
        rows.append(row)
    with open(os.path.join(OUT, name + ".jsonl"), "w", encoding="utf-8") as f:
        f.write(json.dumps({"model": os.path.basename(path), "meta": meta}, ensure_ascii=False) + "\n")
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    print(f"{name}: {len(rows)} texts, {len(meta['eog'])} EOG ids", file=sys.stderr)


# every tokenizer.ggml.pre name llama.cpp accepts for gpt2 vocabularies, except kimi-k2
# (its own tokenizer, no merges) and whitespace (a separate tokenizer model)
PRE_NAMES = """default llama3 llama-v3 llama-bpe falcon3 falcon-h1 pixtral midm-2.0 lfm2 jina-v5-nano
deepseek-llm deepseek-coder deepseek-v3 spark2_5 youtu falcon mpt starcoder gpt-2 phi-2 jina-es jina-de
gigachat jina-v2-es jina-v2-de a.x-4.0 mellum modern-bert jais-2 gemma4 granite-embed-multi-311m
sarvam-moe jina-v1-en jina-v2-code roberta-bpe refact command-r qwen2 deepseek-r1-qwen kormo f2llmv2
qwen35 stablelm2 olmo dbrx smaug-bpe poro-chat glm4 chatglm-bpe viking jais tekken smollm codeshell
bloom gpt3-finnish exaone exaone4 exaone-moe chameleon minerva-7b megrez gpt-4o llama4 kanana2 talkie
granite-embed-multi-97m tiny_aya cohere2moe superbpe trillion granite-docling bailingmoe bailingmoe2
llada-moe seed-coder hunyuan hunyuan-dense hy_v4 joyai-llm ufakzeka grok-2 afmoe laguna minimax-m2
solar-open mellum2 minicpm5""".split()


def fnv1a32(data):
    h = 0x811C9DC5
    for x in data:
        h = ((h ^ x) * 0x01000193) & 0xFFFFFFFF
    return h


def with_pre(gguf_bytes, pre):
    """The GGUF bytes with tokenizer.ggml.pre's string replaced (a vocab-only file has no
    tensor data whose offsets could move)."""
    import struct

    key = b"tokenizer.ggml.pre"
    at = gguf_bytes.index(struct.pack("<Q", len(key)) + key) + 8 + len(key)
    (vtype,) = struct.unpack_from("<I", gguf_bytes, at)
    assert vtype == 8
    (n,) = struct.unpack_from("<Q", gguf_bytes, at + 4)
    new = pre.encode()
    return gguf_bytes[:at + 4] + struct.pack("<Q", len(new)) + new + gguf_bytes[at + 12 + n:]


def pre_reference(texts):
    import tempfile

    import llama_cpp as L

    base = open(TARGETS["gpt2"][0], "rb").read()
    sample = texts[::3]
    lines = [json.dumps({"vocab": "ggml-vocab-gpt-2.gguf", "texts": "corpus[::3]", "n": len(sample)})]
    with tempfile.TemporaryDirectory() as tmp:
        for pre in PRE_NAMES:
            path = os.path.join(tmp, pre + ".gguf")
            with open(path, "wb") as f:
                f.write(with_pre(base, pre))
            llm = L.Llama(path, vocab_only=True, verbose=False)
            vocab = L.llama_model_get_vocab(llm._model.model)
            hs = []
            for text in sample:
                n = len(text) + 16
                buf = (L.llama_token * n)()
                k = L.llama_tokenize(vocab, text, len(text), buf, n, False, False)
                assert k >= 0
                hs.append(f"{fnv1a32(' '.join(map(str, buf[:k])).encode()):08x}")
            del llm
            lines.append(json.dumps({"pre": pre, "h": " ".join(hs)}))
            print(f"pre {pre}: {len(hs)} texts", file=sys.stderr)
    with open(os.path.join(OUT, "pre.jsonl"), "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--corpus", action="store_true", help="only rebuild corpus.jsonl")
    ap.add_argument("models", nargs="*", help=f"subset of {', '.join(TARGETS)}, pre")
    args = ap.parse_args()
    os.makedirs(OUT, exist_ok=True)
    texts = build_corpus()
    with open(os.path.join(OUT, "corpus.jsonl"), "w", encoding="utf-8") as f:
        for t in texts:
            f.write(json.dumps(encode_item(t), ensure_ascii=False) + "\n")
    print(f"corpus: {len(texts)} texts, {sum(map(len, texts))} bytes", file=sys.stderr)
    if args.corpus:
        return
    if not args.models or "pre" in args.models:
        pre_reference(texts)
    for name in [m for m in args.models if m != "pre"] if args.models else TARGETS:
        path, limit = TARGETS[name]
        if not os.path.exists(path):
            print(f"{name}: {path} missing, skipped", file=sys.stderr)
            continue
        reference(name, path, texts, limit)


if __name__ == "__main__":
    main()
