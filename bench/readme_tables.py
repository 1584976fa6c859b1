"""The README's SmolLM2 table, written from the bench's own results (one source per figure).

    python bench/readme_tables.py           # rewrite the table in README.md from bench/llm_*.json
    python bench/readme_tables.py --check   # exit 1 if README.md differs from what the JSON gives

The table lives in README.md between `<!-- bench-table: smollm2 ... -->` and
`<!-- /bench-table -->`; `make bench` runs this after bench/llm.py, and tests/bench checks that
the committed README matches the committed JSON, so the two cannot drift apart.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
BEGIN = "<!-- bench-table: smollm2 (written by bench/readme_tables.py from bench/llm_*.json; make bench) -->"
END = "<!-- /bench-table -->"


def _load(name: str) -> dict:
    path = ROOT / "bench" / name
    return json.loads(path.read_text()) if path.is_file() else {"meta": {}, "rows": {}}


def _col(rows: dict, key: str, names) -> str:
    """One cell: the rows' `key` values joined by " / " (n/a for a row that did not run)."""
    return " / ".join(f"{rows[n][key]:.0f}" if n in rows and key in rows[n] else "n/a" for n in names)


def _ratio(rows: dict, ours: str, theirs: str) -> str:
    if ours not in rows or theirs not in rows:
        return "n/a"
    return f"{rows[theirs]['ms_per_step'] / rows[ours]['ms_per_step']:.2f}x"


THEIRS = ("pytorch-full", "pytorch-lora", "pytorch-sparse")
OURS = ("pockengine-full", "pockengine-lora", "pockengine-sparse")
LOWP = ("pockengine-sparse-bf16", "pockengine-sparse-int8", "pockengine-sparse-q4")


def render(results: dict, interleaved: dict) -> str:
    """The Markdown between the markers: caption, table and the ratios it implies."""
    rows, fast = results.get("rows", {}), interleaved.get("rows", {}) or results.get("rows", {})
    meta, imeta = results.get("meta", {}), interleaved.get("meta", {})
    speed = "interleaved in one process" if interleaved.get("rows") else "each row in its own process"
    peak = rows.get("pytorch-full", {}).get("peak_rss_mib")
    lines = [
        f"Measured by `make bench` on SmolLM2-135M, 1 × 128 tokens, AdamW, {meta.get('threads', 1)} thread "
        f"(`bench/llm.py`: every row in `bench/llm_results.md`, {meta.get('date', '?')}, 1-minute load "
        f"{meta.get('load_start', '?')}; the PyTorch and PockEngine speed rows {speed}, "
        f"`bench/llm_interleaved.md`, {imeta.get('date', '?')}). Training memory is the compiled program's "
        "arena + state; the checkpoint is the bundle's `weights.pockckpt` (every state tensor), the bulk of "
        "an AAR's or XCFramework's size.",
        "",
        "| row | ms/step | training memory MiB | checkpoint MiB |",
        "|---|---|---|---|",
        f"| PyTorch full / LoRA r=8 / same-scheme sparse | {_col(fast, 'ms_per_step', THEIRS)} "
        f"| {_col(rows, 'peak_rss_mib', THEIRS[:1])} peak RSS (full) | - |",
        f"| PockEngine full / LoRA / sparse | {_col(fast, 'ms_per_step', OURS)} | {_col(rows, 'train_mem_mib', OURS)} "
        f"| {_col(rows, 'state_mib', OURS)} |",
        f"| PockEngine sparse, bf16 / int8 / q4 frozen (own processes) | {_col(rows, 'ms_per_step', LOWP)} "
        f"| {_col(rows, 'train_mem_mib', LOWP)} | {_col(rows, 'state_mib', LOWP)} |"]
    lines += ["", f"PockEngine full is {_ratio(fast, 'pockengine-full', 'pytorch-full')} PyTorch full, LoRA "
              f"{_ratio(fast, 'pockengine-lora', 'pytorch-lora')} PyTorch LoRA and sparse "
              f"{_ratio(fast, 'pockengine-sparse', 'pytorch-sparse')} PyTorch's same sparse scheme."]
    if peak:
        fracs = [f"{rows[n]['train_mem_mib'] / peak:.3f}x" for n in LOWP if n in rows]
        lines[-1] += (" Sparse with bf16 / int8 / q4 frozen weights trains in " + " / ".join(fracs)
                      + " of PyTorch full's peak RSS. The targets these are held to: `bench/targets.md`.")
    return "\n".join(lines)


def replace_table(text: str, table: str) -> str:
    pattern = re.compile(re.escape(BEGIN) + r"\n.*?\n" + re.escape(END), re.S)
    if not pattern.search(text):
        raise SystemExit(f"README.md has no {BEGIN} ... {END} block")
    return pattern.sub(lambda _: f"{BEGIN}\n{table}\n{END}", text, count=1)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="exit 1 if README.md is not what the JSON gives")
    a = ap.parse_args(argv)
    text = README.read_text()
    new = replace_table(text, render(_load("llm_results.json"), _load("llm_interleaved.json")))
    if a.check:
        if new != text:
            print("README.md's SmolLM2 table differs from bench/llm_*.json: run python bench/readme_tables.py",
                  file=sys.stderr)
            return 1
        return 0
    README.write_text(new)
    return 0


if __name__ == "__main__":
    sys.exit(main())
