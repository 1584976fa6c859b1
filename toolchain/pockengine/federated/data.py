"""The simulated population: keyboard users who each type their own real text.

Every user is one document of legal prose from Debian's /usr/share/common-licenses (GPL,
LGPL, GFDL, MPL, Apache, Artistic, CC0: the same genre as the keyboard demo's user,
different authors and wording), split into sentences like the demo's corpus. With more
users than documents, the longest user's text is halved until there are enough (a user is
then a contiguous part of one document). Each user's sentences are split as in the demo:
every 4th block of 8 sentences is held out. The global held-out set is all users' held-out
sentences; per-user personalization is measured on that user's own held-out sentences.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import PockError

LICENSES = Path("/usr/share/common-licenses")
MIN_WORDS = 900   # BSD (225 words) is too short to be a user


@dataclass
class User:
    name: str
    typed: np.ndarray     # token ids of the sentences the user types (training data)
    held: np.ndarray      # token ids of the user's held-out sentences


def sentences(text: str) -> list[str]:
    """Sentences of a document (split after . ! ? and at blank lines; >= 3 words)."""
    out = []
    for para in re.split(r"\n\s*\n", text):
        flat = " ".join(para.split())
        out += [s for s in re.split(r"(?<=[.!?])\s+", flat) if len(s.split()) >= 3]
    return out


def documents(directory: Path = LICENSES) -> list[tuple[str, list[str]]]:
    """(name, sentences) of every distinct licence text, longest first (symlinks skipped)."""
    if not directory.is_dir():
        raise PockError(f"{directory} is missing (Debian's base-files package provides it)")
    docs = []
    for f in sorted(directory.iterdir()):
        if f.is_symlink() or not f.is_file():
            continue
        text = f.read_text(encoding="utf-8", errors="replace")
        if len(text.split()) >= MIN_WORDS:
            docs.append((f.name, sentences(text)))
    docs.sort(key=lambda d: (-sum(len(s) for s in d[1]), d[0]))
    return docs


def users(n: int, tokenizer, directory: Path = LICENSES, block: int = 8, every: int = 4) -> list[User]:
    """n users, each with their own text (see the module docstring)."""
    if n < 1:
        raise PockError(f"a federation needs at least 1 client, got {n}")
    docs = documents(directory)
    parts = [(name, sents) for name, sents in docs[:n]]
    while len(parts) < n:
        i = max(range(len(parts)), key=lambda j: len(parts[j][1]))
        name, sents = parts[i]
        if len(sents) < 4 * block * every:
            raise PockError(f"not enough text in {directory} for {n} users")
        half = len(sents) // 2
        base = name.split("#")[0]
        parts[i:i + 1] = [(f"{base}#a" if "#" not in name else name + "a", sents[:half]),
                          (f"{base}#b" if "#" not in name else name + "b", sents[half:])]
    out = []
    for name, sents in parts:
        typed, held = [], []
        for i, s in enumerate(sents):
            (held if (i // block) % every == every - 1 else typed).append(s)
        encode = lambda ss: np.array([t for s in ss for t in tokenizer.encode_message(s)], dtype=np.int64)
        out.append(User(name, encode(typed), encode(held)))
    return out


def windows(ids: np.ndarray, batch: int, seq: int, rng: np.random.Generator):
    """A random batch of (inputs, next-word targets) windows from a token stream."""
    starts = rng.integers(0, max(1, len(ids) - seq - 1), batch)
    x = np.stack([ids[s:s + seq] for s in starts])
    y = np.stack([ids[s + 1:s + seq + 1] for s in starts])
    return x, y
