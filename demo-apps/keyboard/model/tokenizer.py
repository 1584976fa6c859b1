"""Word-level tokenizer of the keyboard model. shared/.../Tokenizer.kt is the same
algorithm in Kotlin; tests/demo checks both on shared/testdata/tokenizer_vectors.tsv.

Rules (keep the two implementations identical):
  1. curly apostrophes (U+2018, U+2019) become ';  2. ASCII A-Z become a-z (nothing else
  changes case, so every platform lowercases alike);  3. tokens are the matches of
  TOKEN_PATTERN, in order: words with inner apostrophes, digit runs, . , ! ? ; :
  4. a digit run is <num>; a word not in the vocabulary is <unk>.
A message (one typed sentence or text field) is encoded as <s> followed by its tokens.
"""
from __future__ import annotations

import re
from pathlib import Path

SPECIALS = ("<pad>", "<unk>", "<s>", "<num>")
PAD, UNK, BOS, NUM = range(4)
PUNCTUATION = (".", ",", "!", "?", ";", ":")
TOKEN_PATTERN = r"[a-z]+(?:'[a-z]+)*|[0-9]+|[.,!?;:]"
_TOKEN_RE = re.compile(TOKEN_PATTERN)
_NORMALIZE = str.maketrans({"\u2018": "'", "\u2019": "'",
                            **{chr(c): chr(c + 32) for c in range(ord("A"), ord("Z") + 1)}})
VOCAB_FILE = Path(__file__).with_name("vocab.txt")


def tokens(text: str) -> list[str]:
    """The token strings of `text` (digit runs as <num>)."""
    return ["<num>" if t[0].isdigit() else t for t in _TOKEN_RE.findall(text.translate(_NORMALIZE))]


class Tokenizer:
    def __init__(self, words: list[str]):
        if tuple(words[:len(SPECIALS)]) != SPECIALS:
            raise ValueError(f"a keyboard vocabulary starts with {SPECIALS}")
        self.words = list(words)
        self.ids = {w: i for i, w in enumerate(self.words)}
        # ids a suggestion strip may show: real words, not specials or punctuation
        self.suggestable = [i for i, w in enumerate(self.words) if i >= len(SPECIALS) and w not in PUNCTUATION]

    @classmethod
    def load(cls, path: Path = VOCAB_FILE) -> "Tokenizer":
        return cls(Path(path).read_text(encoding="utf-8").split("\n")[:-1])

    def save(self, path: Path) -> None:
        Path(path).write_text("".join(w + "\n" for w in self.words), encoding="utf-8")

    def __len__(self) -> int:
        return len(self.words)

    def encode(self, text: str) -> list[int]:
        return [self.ids.get(t, UNK) for t in tokens(text)]

    def encode_message(self, text: str) -> list[int]:
        return [BOS] + self.encode(text)

    def decode(self, ids) -> list[str]:
        return [self.words[i] for i in ids]
