"""The README's fenced code blocks and the directive each carries.

A block is preceded (on the line before its opening fence) by an HTML comment that GitHub does
not render, saying how the test suite runs it:

    <!-- readme-test: prelude=mlp -->          run after readme_preludes.mlp() set up its names
    <!-- readme-test: prelude=keras child -->  ... in a child process (TensorFlow's LLVM and
                                               Mesa lavapipe's cannot share one)
    <!-- readme-test: prelude=smollm2 slow --> ... only in the slow suite (a real pretrained LLM)
    <!-- readme-test: skip: REASON -->          not run here, and the reason says why

A Python or shell block without a directive runs as it is, in an empty namespace. So a new
example either runs or says why it cannot.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"
DIRECTIVE = re.compile(r"<!--\s*readme-test:\s*(.*?)\s*-->")


@dataclass
class Block:
    lang: str
    code: str
    line: int                      # 1-based line of the opening fence
    prelude: str | None = None
    flags: set = field(default_factory=set)
    skip: str | None = None

    @property
    def id(self) -> str:
        return f"L{self.line}-{self.lang or 'text'}"


def parse_directive(text: str, where: str) -> dict:
    if text.startswith("skip:"):
        reason = text[len("skip:"):].strip()
        if not reason:
            raise ValueError(f"{where}: a skip needs a reason")
        return {"skip": reason}
    out = {"prelude": None, "flags": set()}
    for word in text.split():
        if word.startswith("prelude="):
            out["prelude"] = word.split("=", 1)[1]
        elif word in ("slow", "child"):
            out["flags"].add(word)
        else:
            raise ValueError(f"{where}: unknown readme-test word {word!r}")
    return out


def blocks(path: Path = README) -> list[Block]:
    lines = path.read_text().splitlines()
    out, i = [], 0
    while i < len(lines):
        m = re.match(r"^```(\w*)\s*$", lines[i])
        if not m:
            i += 1
            continue
        start, lang = i, m.group(1)
        j = i + 1
        while j < len(lines) and not lines[j].startswith("```"):
            j += 1
        b = Block(lang, "\n".join(lines[start + 1:j]) + "\n", start + 1)
        d = DIRECTIVE.search(lines[start - 1]) if start else None
        if d:
            for k, v in parse_directive(d.group(1), f"README.md:{start}").items():
                setattr(b, k, v)
        out.append(b)
        i = j + 1
    return out
