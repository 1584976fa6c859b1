"""Writes tokenizer_vectors.tsv: texts and the Python tokenizer's tokens and ids with
model/vocab.txt. Tokenizer.kt must give the same (tests/demo/test_keyboard_shared.py).

    .venv/bin/python demo-apps/keyboard/shared/testdata/make_vectors.py
Columns: text (\\ \t \n escaped), tokens (space-separated), ids (space-separated)."""
from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[2]))
from keyboard.model import corpora  # noqa: E402
from keyboard.model.tokenizer import Tokenizer, tokens  # noqa: E402

EDGE_CASES = [
    "", "   ", "Hello, World!", "I don't think it's 2 o'clock; is it?", "ROCK'N'ROLL isn't dead...",
    "\u2018quoted\u2019 and it\u2019s curly", "numbers 12 345,678 and 3.14 and v2", "tab\tand\nnewline",
    "caf\u00e9 na\u00efve \u00c9cole stra\u00dfe \u0130stanbul \u212aelvin", "emoji \U0001F600 ok \U0001F44D!",
    "'leading and trailing' apostrophes''", "x-ray e-mail self-help", "zzqx blorfing unkword",
    "CAPS LOCK ON", "a\\b back\\slash", "end.", "?!;:,.", "under_score and #hash @at",
]


def escape(s: str) -> str:
    return s.replace("\\", "\\\\").replace("\t", "\\t").replace("\n", "\\n")


def unescape(s: str) -> str:
    out, i = [], 0
    while i < len(s):
        if s[i] == "\\" and i + 1 < len(s):
            out.append({"t": "\t", "n": "\n", "\\": "\\"}[s[i + 1]])
            i += 2
        else:
            out.append(s[i])
            i += 1
    return "".join(out)


def rows(tok: Tokenizer) -> list[str]:
    texts = EDGE_CASES + corpora.user_sentences()[::19]
    return [f"{escape(t)}\t{' '.join(tokens(t))}\t{' '.join(map(str, tok.encode(t)))}" for t in texts]


if __name__ == "__main__":
    (HERE / "tokenizer_vectors.tsv").write_text("\n".join(rows(Tokenizer.load())) + "\n", encoding="utf-8")
