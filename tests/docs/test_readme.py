"""The README's code blocks, extracted and run as written (see readme_blocks.py for the
directives that say how), so the docs cannot drift from what the code does."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from readme_blocks import README, blocks
from readme_preludes import PRELUDES

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
RUNNABLE = ("python", "sh")
ALL = blocks()


def _params():
    out = []
    for b in ALL:
        if b.lang not in RUNNABLE or b.skip:
            continue
        marks = [pytest.mark.slow] if "slow" in b.flags else []
        out.append(pytest.param(b, id=b.id, marks=marks))
    return out


def test_every_block_runs_or_says_why_not():
    """A Python or shell example either runs here or carries `readme-test: skip: REASON`; every
    prelude named exists; kotlin/swift/text blocks are checked elsewhere or are not code."""
    assert len([b for b in ALL if b.lang == "python"]) >= 8
    for b in ALL:
        assert b.prelude is None or b.prelude in PRELUDES, f"{b.id}: unknown prelude {b.prelude!r}"
        if b.lang and b.lang not in RUNNABLE + ("kotlin", "swift", "toml", "text", "json", "c"):
            pytest.fail(f"{b.id}: a ```{b.lang} block: add it to RUNNABLE or mark it skip")


CHILD = """
import os, sys
sys.path[:0] = [{here!r}, {toolchain!r}]
from readme_preludes import PRELUDES
import numpy as np, torch, pockengine as pe
ns = {{"pe": pe, "torch": torch, "np": np}}
prelude = {prelude!r}
if prelude:
    ns.update(PRELUDES[prelude]())
exec(compile(open({code!r}).read(), {name!r}, "exec"), ns)
print("README-BLOCK-OK")
"""


def _run_python(b, tmp_path):
    code = tmp_path / "block.py"
    code.write_text(b.code)
    script = tmp_path / "run_block.py"
    script.write_text(CHILD.format(here=str(HERE), toolchain=str(ROOT / "toolchain"), prelude=b.prelude,
                                   code=str(code), name=f"README.md:{b.line}"))
    env = dict(os.environ, PYTHONPATH=str(ROOT / "toolchain"))
    r = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
                       timeout=900)
    assert r.returncode == 0 and "README-BLOCK-OK" in r.stdout, \
        f"README.md:{b.line} failed:\n{b.code}\n--- stderr ---\n{r.stderr[-4000:]}"


def _run_sh(b, tmp_path):
    if b.prelude:
        cwd = os.getcwd()
        os.chdir(tmp_path)
        try:
            PRELUDES[b.prelude]()
        finally:
            os.chdir(cwd)
    env = dict(os.environ, PYTHONPATH=str(ROOT / "toolchain"),
               PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    for line in b.code.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        r = subprocess.run(["bash", "-c", line], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
        assert r.returncode == 0, f"README.md:{b.line}: `{line}` failed:\n{r.stdout[-2000:]}\n{r.stderr[-4000:]}"


@pytest.mark.parametrize("block", _params())
def test_readme_block(block, tmp_path):
    """Each block in its own fresh directory and process (a newcomer's copy-paste), after its
    prelude; `pe`, `torch` and `np` are imported as the README's first example does."""
    (_run_python if block.lang == "python" else _run_sh)(block, tmp_path)


def test_readme_path():
    assert README.is_file()
