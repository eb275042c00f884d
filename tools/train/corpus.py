"""Training text and tokenizer for the trained fixture model.

Text: the top-level modules of the CPython standard library of the interpreter running this
script (``Lib/*.py``, Python Software Foundation License v2), in sorted file-name order, plus
a few hundred templated chat dialogues rendered in K3's XTML structure (spec §8) so that
`k3 chat` replies with the channel markers.

Tokenizer: a byte-level BPE learned on that text with the K3 pre-tokeniser (spec §7.3), written
in K3's convention (spec §7.1): ranks = the 256 single bytes in byte-level order (``!`` is rank
0), then merges in learned order; 256 added-token slots after the ranks with the 16 named ones
of spec §7.2. Encoding is tiktoken's rank BPE with the whole-piece fast path (spec §7.4), so the
ids are exactly what the engine's tokenizer produces for the same text.
"""

import base64
import json
import random
import sysconfig
from pathlib import Path

import regex

# Spec §7.3, byte for byte (Python `regex` needs V1 mode for `&&`).
PATTERN = regex.compile(
    r"[\p{Han}]+|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
    regex.V1,
)

# Spec §7.2: (offset after the ranks, content, special).
NAMED_ADDED = [
    (0, "[BOS]", True),
    (1, "[EOS]", True),
    (2, "<|end_of_msg|>", True),
    (3, "<|open|>", False),
    (4, "<|close|>", False),
    (5, "<|sep|>", False),
    (6, "[start_header_id]", True),
    (7, "[end_header_id]", True),
    (9, "[EOT]", True),
    (18, "<|media_begin|>", True),
    (19, "<|media_content|>", True),
    (20, "<|media_end|>", True),
    (21, "<|media_pad|>", True),
    (65, "<osagent_mode>", True),
    (254, "[UNK]", True),
    (255, "[PAD]", True),
]
ADDED_SLOTS = 256
EOM, OPEN, CLOSE, SEP = 2, 3, 4, 5


def stdlib_files():
    """Top-level `Lib/*.py` of this interpreter, sorted by name, with their text."""
    lib = Path(sysconfig.get_paths()["stdlib"])
    out = []
    for p in sorted(lib.glob("*.py")):
        text = p.read_text(encoding="utf-8")
        out.append((p.name, text))
    return lib, out


def byte_order():
    """The 256 bytes in byte-level BPE order: printable first, so rank 0 is `!` (spec §7.1)."""
    order = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    order += [b for b in range(256) if b not in order]
    return order


def pieces(text):
    return [m.group(0).encode("utf-8") for m in PATTERN.finditer(text)]


def learn_ranks(texts, n_ranks):
    """Byte-level BPE on the pre-tokenised pieces of `texts`; returns `n_ranks` byte strings
    (256 bytes, then merges in order: most frequent pair, ties to the smallest rank pair)."""
    counts = {}
    for t in texts:
        for p in pieces(t):
            counts[p] = counts.get(p, 0) + 1
    ranks = [bytes([b]) for b in byte_order()]
    index = {b: i for i, b in enumerate(ranks)}
    words = [[index[bytes([c])] for c in p] for p in counts]
    freq = list(counts.values())
    # Incremental pair statistics: pair -> count, pair -> set of word indices.
    pair_count, where = {}, {}
    for wi, w in enumerate(words):
        for a, b in zip(w, w[1:]):
            pair_count[(a, b)] = pair_count.get((a, b), 0) + freq[wi]
            where.setdefault((a, b), set()).add(wi)
    while len(ranks) < n_ranks and pair_count:
        (a, b), n = max(pair_count.items(), key=lambda kv: (kv[1], -kv[0][0], -kv[0][1]))
        if n < 2:
            break
        cat = ranks[a] + ranks[b]
        new = index.get(cat)
        if new is None:
            new = len(ranks)
            ranks.append(cat)
            index[cat] = new
        for wi in sorted(where.pop((a, b), ())):
            w, f = words[wi], freq[wi]
            for x, y in zip(w, w[1:]):
                pair_count[(x, y)] -= f
                if pair_count[(x, y)] == 0:
                    del pair_count[(x, y)]
            merged, i = [], 0
            while i < len(w):
                if i + 1 < len(w) and w[i] == a and w[i + 1] == b:
                    merged.append(new)
                    i += 2
                else:
                    merged.append(w[i])
                    i += 1
            words[wi] = merged
            for x, y in zip(merged, merged[1:]):
                pair_count[(x, y)] = pair_count.get((x, y), 0) + f
                where.setdefault((x, y), set()).add(wi)
        pair_count.pop((a, b), None)
    return ranks


class Tokenizer:
    def __init__(self, ranks):
        self.ranks = ranks
        self.index = {b: i for i, b in enumerate(ranks)}
        self.cache = {}

    @classmethod
    def read(cls, work: Path):
        """The tokenizer `write` left in `work` (its ranks, in rank order)."""
        ranks = []
        for rank, line in enumerate((work / "tiktoken.model").read_text().splitlines()):
            b64, r = line.split()
            assert int(r) == rank, f"tiktoken.model line {rank + 1}: rank {r}"
            ranks.append(base64.b64decode(b64))
        return cls(ranks)

    @property
    def n_ranks(self):
        return len(self.ranks)

    def added(self, offset):
        return self.n_ranks + offset

    def rank_bpe(self, b):
        """Spec §7.4: merge the adjacent pair of lowest rank (leftmost on ties) until none."""
        if b in self.index:  # whole-piece fast path (required)
            return [self.index[b]]
        parts = [b[i : i + 1] for i in range(len(b))]
        while True:
            best = None
            for i in range(len(parts) - 1):
                r = self.index.get(parts[i] + parts[i + 1])
                if r is not None and (best is None or r < best[0]):
                    best = (r, i)
            if best is None:
                break
            i = best[1]
            parts[i : i + 2] = [parts[i] + parts[i + 1]]
        return [self.index[p] for p in parts]

    def encode(self, text):
        """Spec §7.4 without specials; texts here have no 25,000-character runs (checked)."""
        longest = max((len(m.group(0)) for m in regex.finditer(r"\s+|\S+", text)), default=0)
        if longest > 25_000:
            raise ValueError("a whitespace/non-whitespace run exceeds the 25,000 cap")
        ids = []
        for p in pieces(text):
            got = self.cache.get(p)
            if got is None:
                got = self.cache[p] = self.rank_bpe(p)
            ids.extend(got)
        return ids

    def decode(self, ids):
        out = b""
        for i in ids:
            out += self.ranks[i] if i < self.n_ranks else b"?"
        return out.decode("utf-8", errors="replace")

    def write(self, out: Path):
        lines = "".join(
            f"{base64.b64encode(b).decode()} {r}\n" for r, b in enumerate(self.ranks)
        )
        (out / "tiktoken.model").write_text(lines)
        decoder = {
            str(self.n_ranks + off): {
                "content": content,
                "lstrip": False,
                "normalized": False,
                "rstrip": False,
                "single_word": False,
                "special": special,
            }
            for off, content, special in NAMED_ADDED
        }
        config = {
            "added_tokens_decoder": decoder,
            "bos_token": "[BOS]",
            "eos_token": "[EOS]",
            "pad_token": "[PAD]",
            "unk_token": "[UNK]",
            "model_max_length": 1048576,
            "tokenizer_class": "TikTokenTokenizer",
        }
        (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")


# ---- docstrings: the facts and prose of the conversations -------------------------------


def docstring_facts(files):
    """(module, function, first docstring line) from `def name(...):\n    \"\"\"Line.` patterns."""
    facts = []
    pat = regex.compile(r'\n    def ([a-z_][a-z0-9_]*)\([^)]*\)[^:\n]*:\n        """([A-Z][^\n"]{10,90}\.)')
    pat2 = regex.compile(r'\ndef ([a-z_][a-z0-9_]*)\([^)]*\)[^:\n]*:\n    """([A-Z][^\n"]{10,90}\.)')
    for name, text in files:
        mod = name[:-3]
        for m in list(pat2.finditer(text)) + list(pat.finditer(text)):
            if not m.group(1).startswith("_"):
                facts.append((mod, m.group(1), m.group(2)))
    return facts


def docstring_paragraphs(files):
    """Prose paragraphs (40–400 characters, at least 5 words) of the modules' docstrings: the
    bulk of the conversations' long system prompts and tool descriptions."""
    out = []
    for _, text in files:
        m = regex.match(r'\s*(?:#[^\n]*\n\s*)*(?:[rR]?)"""(.*?)"""', text, regex.S)
        if not m:
            continue
        for para in regex.split(r"\n\s*\n", m.group(1)):
            para = " ".join(para.split())
            if 40 <= len(para) <= 400 and len(para.split()) >= 5 and para[0].isupper():
                out.append(para)
    return out
