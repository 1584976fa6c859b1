"""What the libFuzzer tests share: building a target with clang 14 (libFuzzer, AddressSanitizer,
UBSan; skipped with the Debian packages to install when clang or its fuzzer runtime is missing)
and running it for a bounded time over a corpus, returning the runs and the corpus growth."""
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[3]
RUNTIME = ROOT / "native" / "runtime"


def clang() -> str | None:
    for name in ("clang++-14", "clang++"):
        path = shutil.which(name)
        if path:
            return path
    return None


def build_fuzzer(out: Path, name: str, sources: list[Path]) -> Path:
    """out/name: the libFuzzer target built from sources (the runtime's include paths)."""
    cxx = clang()
    if cxx is None:
        pytest.skip("clang++ is not installed (Debian: apt-get install clang-14 libclang-rt-14-dev; "
                    "`make test` installs them as root)")
    exe = out / name
    cmd = [cxx, "-std=c++17", "-O1", "-g", "-fsanitize=fuzzer,address,undefined", "-fno-sanitize-recover=undefined",
           "-I", str(RUNTIME / "include"), "-I", str(RUNTIME), *map(str, sources), "-pthread", "-o", str(exe)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0 and "fuzzer" in r.stderr and ("cannot find" in r.stderr or "not found" in r.stderr):
        pytest.skip(f"clang has no libFuzzer runtime (Debian: apt-get install libclang-rt-14-dev): {r.stderr[-300:]}")
    assert r.returncode == 0, r.stderr[-3000:]
    return exe


def run_fuzzer(exe: Path, corpus: Path, seconds: int, *, malloc_limit_mb: int, max_len: int,
               detect_leaks: bool) -> tuple[int, int, int]:
    """Fuzz for `seconds` over corpus (grown in place); a crash, sanitizer report or timeout fails
    the test.  Returns (runs, seeds, inputs after).  Crash inputs land beside the corpus, never in
    the checkout.  ASan's shadow and quarantine keep a fuzzing process above 1 GiB of RSS on its
    own (seen: 1129 MB with 24 MB of live heap), hence the RSS limit; any single allocation over
    malloc_limit_mb is still reported as a failure."""
    seeds = len(list(corpus.iterdir()))
    r = subprocess.run([str(exe), f"-max_total_time={seconds}", "-timeout=10", "-rss_limit_mb=3072",
                        f"-malloc_limit_mb={malloc_limit_mb}", f"-max_len={max_len}", "-print_final_stats=1",
                        f"-artifact_prefix={corpus.parent}/", str(corpus)],
                       capture_output=True, text=True, timeout=seconds + 120, cwd=corpus.parent,
                       env={**os.environ, "ASAN_OPTIONS": f"detect_leaks={int(detect_leaks)}"})
    log = r.stderr
    assert r.returncode == 0, log[-4000:]
    runs = int(re.search(r"stat::number_of_executed_units:\s*(\d+)", log).group(1))
    return runs, seeds, len(list(corpus.iterdir()))
