#!/usr/bin/env python3
"""Regenerates tests/fixtures/tokenizer/* with Python tiktoken 0.14.0 as the independent oracle.

Run from the repository root inside /work/venv:  python tests/tokenizer/gen_fixtures.py

tiktoken supplies the rank BPE and the K3 pattern matching; the spec's long-text guards
(400,000-character pieces, runs capped at 25,000 by str.isspace) are applied here in Python,
written from k3-model.md §7.4. Vocabularies: the real o200k_base and cl100k_base rank files
from the tiktoken-rs crate's assets (found with `cargo metadata`), never committed.
"""
import hashlib
import json
import os
import random
import subprocess
import sys

import tiktoken
from tiktoken.load import load_tiktoken_bpe

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OUT = os.path.join(ROOT, "tests", "fixtures", "tokenizer")

# k3-model.md §7.3, byte for byte.
PAT = "|".join([
    r"[\p{Han}]+",
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"\p{N}{1,3}",
    r" ?[^\s\p{L}\p{N}]+[\r\n]*",
    r"\s*[\r\n]+",
    r"\s+(?!\S)",
    r"\s+",
])

# Named added tokens of K3 (§7.2), by offset from the first added id.
K3_NAMED = {
    0: "[BOS]", 1: "[EOS]", 2: "<|end_of_msg|>", 3: "<|open|>", 4: "<|close|>", 5: "<|sep|>",
    6: "[start_header_id]", 7: "[end_header_id]", 9: "[EOT]", 18: "<|media_begin|>",
    19: "<|media_content|>", 20: "<|media_end|>", 21: "<|media_pad|>", 65: "<osagent_mode>",
    254: "[UNK]", 255: "[PAD]",
}
SPECIAL_FLAG = {"[BOS]", "[EOS]", "<|end_of_msg|>", "[UNK]", "[PAD]"}


def tokenizer_config(first):
    decoder = {
        str(first + off): {
            "content": name, "lstrip": False, "normalized": False, "rstrip": False,
            "single_word": False, "special": name in SPECIAL_FLAG,
        }
        for off, name in sorted(K3_NAMED.items())
    }
    return {"added_tokens_decoder": decoder, "bos_token": "[BOS]", "eos_token": "[EOS]",
            "pad_token": "[PAD]", "unk_token": "[UNK]"}


def added_names(first):
    return {K3_NAMED.get(i, f"<|reserved_token_{first + i}|>"): first + i for i in range(256)}


def cap_runs(s, m):
    """§7.4 cap_runs, with Python's own str.isspace."""
    if not s:
        return
    run, is_space, start = 0, s[0].isspace(), 0
    for i, c in enumerate(s):
        now = c.isspace()
        if now != is_space:
            run, is_space = 1, now
        else:
            run += 1
            if run > m:
                yield s[start:i]
                start, run = i, 1
    yield s[start:]


def k3_encode(enc, text, specials):
    ids = []
    for p in range(0, len(text), 400_000):
        for sl in cap_runs(text[p:p + 400_000], 25_000):
            ids += enc.encode(sl, allowed_special="all") if specials else enc.encode_ordinary(sl)
    return ids


def asset(name):
    meta = json.loads(subprocess.check_output(
        ["cargo", "metadata", "--format-version", "1", "--offline"], cwd=ROOT))
    for pkg in meta["packages"]:
        if pkg["name"] == "tiktoken-rs":
            return os.path.join(os.path.dirname(pkg["manifest_path"]), "assets", name)
    sys.exit("tiktoken-rs is not a dependency: cannot find its assets")


# ---------------------------------------------------------------------------------------------
# The corpus: hand-written snippets across scripts, plus seeded random code points.
SNIPPETS = [
    "The quick brown fox doesn't jump; it's WALKING over the lazy dog's 3 bowls.\n",
    "I'LL be there at 10:45, we've said. They'd REALLY like it, you'll see, she's sure.\n",
    "北京的秋天很美，天空又高又蓝。我们明天去图书馆看书，然后一起吃饭吧。\n",
    "机器学习模型在大规模数据上训练，需要很多计算资源和耐心。\n",
    "東京は今日も雨です。カタカナのテキストとひらがなのテキストを混ぜてみましょう。ラーメンが好き！\n",
    "日本語の文章では、漢字・ひらがな・カタカナが一緒に使われます。「こんにちは」と言いました。\n",
    "서울의 봄은 따뜻하고 꽃이 많이 핍니다. 한국어 문장을 토큰으로 나누어 봅시다.\n",
    "Привет, мир! Это тестовая строка на русском языке, с ЗАГЛАВНЫМИ буквами и цифрами 2024.\n",
    "Українська мова має літери ї, є, ґ. Слава науці!\n",
    "مرحبا بالعالم. هذه جملة عربية للاختبار، مع أرقام ١٢٣ و 456.\n",
    "שלום עולם, זו שורה בעברית.\n",
    "Ελληνικά: Η γρήγορη καφέ αλεπού πηδάει πάνω από τον τεμπέλη σκύλο.\n",
    "हिन्दी में एक छोटा वाक्य, जिसमें मात्राएँ और संयुक्ताक्षर हैं: क्षत्रिय, ज्ञान।\n",
    "ภาษาไทยไม่มีช่องว่างระหว่างคำ ทดสอบการตัดคำ\n",
    "Tiếng Việt có nhiều dấu: người, được, những, Nguyễn.\n",
    "Ünïcödé àccénts: café, naïve, Straße, Ærøskøbing, ÇA VA?\n",
    "Family: 👨‍👩‍👧‍👦, flags 🇫🇷🇯🇵, skin tones 👍🏽👋🏿, rainbow flag 🏳️‍🌈, keycap 1️⃣ #️⃣.\n",
    "Emoji run: 😀😃😄😁😆😅🤣😂🙂🙃😉😊😇🥰😍🤩😘 and 🧑‍💻 writes code 🧑🏾‍🚀.\n",
    "fn main() {\n    let xs: Vec<u32> = (0..10).map(|i| i * i).collect();\n    println!(\"{:?}\", xs);\n}\n",
    "def f(x):\n\treturn {'a': x ** 2, \"b\": [1, 2, 3]}  # comment\n\nclass Foo(Bar):\n    pass\n",
    "#include <stdio.h>\nint main(void) { printf(\"%d\\n\", 42); return 0; }\r\n",
    "SELECT id, name FROM users WHERE age >= 18 AND name LIKE '%son' ORDER BY id DESC;\n",
    '{"name": "k3", "layers": 93, "experts": [1, 2, 3], "nested": {"ok": true, "x": null, "pi": 3.14159}}\n',
    '[{"id":1,"tags":["a","b"]},{"id":2,"tags":[]}]\n',
    "<html><body><div class=\"x\">Hello &amp; goodbye</div></body></html>\n",
    "Numbers: 1234567890 0.000123 -42 1e10 3,141,592 ٠١٢٣٤٥٦٧٨٩ ①②③ Ⅻ ½ ¾ 二〇二四年\n",
    "    indented with spaces\n\t\ttabs\n\n\n\nblank lines   \n   trailing spaces    \n",
    "mixed\r\nline\rendings\n\r\n \r\n",
    "Control-ish: \x0b\x0c\x1c\x1d\x1e\x1f\x85\xa0 and U+3000:\u3000end; NBSP\u00a0here; thin\u2009space.\n",
    "Specials as text: <|open|> <|close|> <|sep|> <|end_of_msg|> [EOS] [BOS] <|media_pad|> <osagent_mode> <|reserved_token_OFFSET|> <|open|message\n",
    "Contractions: DON'T, CAN'T, I'M, WE'RE, THEY'VE, it'S, 'll 'd 're.\n",
    "URL https://example.com/path?q=1&r=two#frag and email someone@example.org.\n",
    "Math: ∀x∈ℝ, x² ≥ 0; ∑_{i=1}^{n} i = n(n+1)/2; α+β=γ; √2 ≈ 1.41421356.\n",
    "Zalgo: Z̴̡̧͎a̶̢͔l̵̩̈́g̸̱̀o̵̤͝ and combining e\u0301 vs é.\n",
    "Box drawing ┌──┐ │  │ └──┘ ░▒▓█ and arrows ←↑→↓ ⇐⇒.\n",
    "Hangul jamo: 각; CJK ext: 𠀀𠀁𪚥; ideographic space:　中文　空格\n",
]

CHAR_RANGES = [
    (0x20, 0x7e), (0xa0, 0x24f), (0x370, 0x3ff), (0x400, 0x4ff), (0x590, 0x6ff), (0x900, 0x97f),
    (0xe00, 0xe7f), (0x1100, 0x11ff), (0x2000, 0x206f), (0x2190, 0x22ff), (0x3000, 0x30ff),
    (0x4e00, 0x9fff), (0xac00, 0xd7a3), (0xfe00, 0xfe0f), (0x1f300, 0x1faff), (0x20000, 0x2a6df),
]


def corpus(first_added):
    rng = random.Random(20261129)
    parts, size = [], 0
    while size < 70_000:
        if rng.random() < 0.8:
            s = rng.choice(SNIPPETS).replace("OFFSET", str(first_added + rng.randrange(256)))
        else:
            lo, hi = rng.choice(CHAR_RANGES)
            s = "".join(chr(rng.randint(lo, hi)) for _ in range(rng.randint(1, 40)))
            s += rng.choice(["", " ", "\n", "  ", "\t"])
        if rng.random() < 0.03:
            s += " " * rng.randint(2, 300) + rng.choice(["x", "\n", ""])
        parts.append(s)
        size += len(s.encode("utf-8"))
    return "".join(parts)


# Long cases pin cap_runs (> 25,000 spaces, > 25,000 non-space) and the 400,000-char pieces.
# Each is a recipe [[text, repeat], ...] so the fixture stays small.
LONG_CASES = {
    "spaces_30000": [["x", 1], [" ", 30_000], ["y", 1]],
    "spaces_60001_then_newline": [[" ", 60_001], ["\n", 1], ["z", 1]],
    "equals_26000": [["=", 26_000], [" end", 1]],
    "letters_60000": [["a", 60_000]],
    "han_26000": [["中", 26_000], ["文", 1]],
    "mixed_run_boundary": [["ab", 12_500], ["c", 1], ["  ", 13_000]],
    "words_past_400000": [["hello world ", 34_000]],
}


def gpt2_byte_order():
    """Single bytes in the GPT-2 order that K3 (and cl100k) use: printable first, `!` = 0."""
    first = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAC + 1)) + list(range(0xAE, 0xFF + 1))
    return first + [b for b in range(256) if b not in first]


# A tiny vocabulary (like a synthetic checkpoint's): 256 bytes, a few merges, 256 added slots.
TINY_MERGES = [b"he", b"ll", b"llo", b"hello", b" w", b"or", b"ld", b" world", b"me", b"ss",
               b"age", b"mess", b"message", b" r", b"ole", b" role", b"=\"", b"\xe4\xb8", b"\xe4\xb8\xad"]


def write_tiny():
    import base64
    tokens = [bytes([b]) for b in gpt2_byte_order()] + TINY_MERGES
    d = os.path.join(OUT, "tiny")
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "tiktoken.model"), "w") as f:
        for rank, t in enumerate(tokens):
            f.write(f"{base64.b64encode(t).decode()} {rank}\n")
    with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
        json.dump(tokenizer_config(len(tokens)), f, indent=2)
        f.write("\n")
    return tokens


def ids_digest(ids):
    return hashlib.sha256(" ".join(map(str, ids)).encode()).hexdigest()


def main():
    assert tiktoken.__version__ == "0.14.0", tiktoken.__version__
    for vocab in ["o200k", "cl100k"]:
        ranks = load_tiktoken_bpe(asset(f"{vocab}_base.tiktoken"))
        first = len(ranks)
        assert sorted(ranks.values()) == list(range(first))
        enc = tiktoken.Encoding(f"{vocab}_k3pat", pat_str=PAT, mergeable_ranks=ranks,
                                special_tokens=added_names(first))
        d = os.path.join(OUT, vocab)
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
            json.dump(tokenizer_config(first), f, indent=2)
            f.write("\n")
        text = corpus(first)
        with open(os.path.join(d, "corpus.txt"), "w", encoding="utf-8", newline="") as f:
            f.write(text)
        for mode, specials in [("plain", False), ("specials", True)]:
            ids = k3_encode(enc, text, specials)
            assert enc.decode_bytes(ids) == text.encode("utf-8")
            with open(os.path.join(d, f"corpus.{mode}.ids"), "w") as f:
                f.write(" ".join(map(str, ids)) + "\n")
        long = {}
        for name, recipe in LONG_CASES.items():
            t = "".join(s * n for s, n in recipe)
            ids = k3_encode(enc, t, False)
            long[name] = {"recipe": recipe, "count": len(ids), "sha256": ids_digest(ids),
                          "head": ids[:16], "tail": ids[-16:]}
        with open(os.path.join(d, "long_runs.json"), "w") as f:
            json.dump(long, f, indent=1)
            f.write("\n")
    write_tiny()
    # K3's own added-token table (§7.2), for tests that need K3's real special ids.
    with open(os.path.join(OUT, "k3", "tokenizer_config.json"), "w") as f:
        json.dump(tokenizer_config(163_584), f, indent=2)
        f.write("\n")


if __name__ == "__main__":
    main()
