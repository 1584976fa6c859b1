"""The two text sources of the demo, both real English prose installed or bundled here.

- generic (pretraining): Debian's `fortunes` package (fortune-mod's English cookie files
  in /usr/share/games/fortunes: quotations, literature, humour, definitions, ...), each
  cookie one message. `apt-get install fortunes`.
- user (personalization): data/corpus.txt, licence texts copied verbatim from Debian's
  /usr/share/common-licenses (GPL-3, Apache-2.0, GFDL-1.3), split into sentences: one
  "user" who types legal prose, a distribution the base model has barely seen.
"""
from __future__ import annotations

import re
from pathlib import Path

FORTUNES_DIR = Path("/usr/share/games/fortunes")
USER_TEXT = Path(__file__).resolve().parents[1] / "data" / "corpus.txt"
SKIP = {"ascii-art", "art"}   # pictures drawn in characters, not prose


def fortunes(directory: Path = FORTUNES_DIR) -> list[str]:
    """Every English fortune cookie, whitespace collapsed, in file-name order."""
    if not directory.is_dir():
        raise FileNotFoundError(f"{directory} is missing: apt-get install fortunes")
    messages = []
    for f in sorted(directory.iterdir()):
        if f.suffix or f.is_symlink() or f.name in SKIP or not f.is_file():
            continue
        for cookie in re.split(r"^%$", f.read_text(encoding="utf-8", errors="replace"), flags=re.M):
            text = " ".join(cookie.split())
            if text:
                messages.append(text)
    return messages


def user_sentences(path: Path = USER_TEXT) -> list[str]:
    """The user's text as typed sentences (split after . ! ? and at blank lines)."""
    sentences = []
    for para in re.split(r"\n\s*\n", path.read_text(encoding="utf-8")):
        text = " ".join(para.split())
        sentences += [s for s in re.split(r"(?<=[.!?])\s+", text) if len(s.split()) >= 3]
    return sentences


def split_user(sentences: list[str], block: int = 8, every: int = 4) -> tuple[list[str], list[str]]:
    """(typed, held_out): every `every`-th block of `block` consecutive sentences is held out."""
    typed, held = [], []
    for i, s in enumerate(sentences):
        (held if (i // block) % every == every - 1 else typed).append(s)
    return typed, held
