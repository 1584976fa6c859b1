"""What the libFuzzer tests share: building a target with clang 14 (libFuzzer, AddressSanitizer,
UBSan; skipped with the Debian packages to install when clang or its fuzzer runtime is missing)
and running it for a bounded time over a corpus, returning the runs and the corpus growth."""
import os
import re
import shutil
import signal
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


def spawn_small(argv: list[str]) -> list[str]:
    """argv run through a forking shell, so that its process starts from the shell's small memory,
    not this one's.  Linux keeps a process's peak RSS (getrusage's ru_maxrss, which libFuzzer's
    -rss_limit_mb reads) across execve, and a child exec'd straight from a pytest worker inherits
    the worker's peak: after a worker had held a model of ~3 GB, every fuzzer it started read
    "rss: 3082Mb" from its first input and stopped as out-of-memory (CI, both fuzz tests).  A
    forked child gets a fresh peak; `; exit` keeps the shell from exec'ing the command itself."""
    return ["sh", "-c", '"$0" "$@"; exit $?', *argv]


def run_fuzzer(exe: Path, corpus: Path, seconds: int, *, malloc_limit_mb: int, max_len: int,
               detect_leaks: bool) -> tuple[int, int, int]:
    """Fuzz for `seconds` over corpus (grown in place); a crash, sanitizer report or timeout fails
    the test.  Returns (runs, seeds, inputs after).  Crash inputs land beside the corpus, never in
    the checkout.  The RSS limit is the process's own (spawn_small); ASan's shadow and quarantine
    take some of it, and any single allocation over malloc_limit_mb is still reported as a failure."""
    seeds = len(list(corpus.iterdir()))
    argv = [str(exe), f"-max_total_time={seconds}", "-timeout=10", "-rss_limit_mb=3072",
            f"-malloc_limit_mb={malloc_limit_mb}", f"-max_len={max_len}", "-print_final_stats=1",
            f"-artifact_prefix={corpus.parent}/", str(corpus)]
    proc = subprocess.Popen(spawn_small(argv), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=corpus.parent, start_new_session=True,
                            env={**os.environ, "ASAN_OPTIONS": f"detect_leaks={int(detect_leaks)}"})
    try:
        _, log = proc.communicate(timeout=seconds + 120)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the shell and the fuzzer under it
        _, log = proc.communicate()
        raise AssertionError(f"{exe.name} ran past {seconds + 120} s: {log[-4000:]}")
    assert proc.returncode == 0, log[-4000:]
    runs = int(re.search(r"stat::number_of_executed_units:\s*(\d+)", log).group(1))
    return runs, seeds, len(list(corpus.iterdir()))
