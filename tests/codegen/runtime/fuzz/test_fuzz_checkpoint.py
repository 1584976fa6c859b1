"""Coverage-guided fuzzing of the C runtime's checkpoint parser (issue 13):
libFuzzer (clang 14, Debian's clang-14 + libclang-rt-14-dev) with AddressSanitizer
and UBSan over fuzz_checkpoint.cpp, seeded with real checkpoints of the tiny
model (corpus/), for a bounded time (POCK_FUZZ_SECONDS, default 20 s)."""
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[3]
RUNTIME = ROOT / "codegen" / "runtime"
TINY = ROOT / "tests" / "codegen" / "runtime" / "fixtures" / "tiny_model.cpp"
SECONDS = int(os.environ.get("POCK_FUZZ_SECONDS", "20"))


def clang() -> str | None:
    for name in ("clang++-14", "clang++"):
        path = shutil.which(name)
        if path:
            return path
    return None


def build_fuzzer(out: Path) -> Path:
    cxx = clang()
    if cxx is None:
        pytest.skip("clang++ is not installed (Debian: apt-get install clang-14 libclang-rt-14-dev; "
                    "`make test` installs them as root)")
    exe = out / "fuzz_checkpoint"
    srcs = [HERE / "fuzz_checkpoint.cpp", TINY, *sorted(RUNTIME.glob("*.cpp"))]
    cmd = [cxx, "-std=c++17", "-O1", "-g", "-fsanitize=fuzzer,address,undefined", "-fno-sanitize-recover=undefined",
           "-I", str(RUNTIME / "include"), "-I", str(RUNTIME), *map(str, srcs), "-pthread", "-o", str(exe)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0 and "fuzzer" in r.stderr and ("cannot find" in r.stderr or "not found" in r.stderr):
        pytest.skip(f"clang has no libFuzzer runtime (Debian: apt-get install libclang-rt-14-dev): {r.stderr[-300:]}")
    assert r.returncode == 0, r.stderr[-3000:]
    return exe


def test_fuzz_checkpoint_parser(tmp_path):
    exe = build_fuzzer(tmp_path)
    corpus = tmp_path / "corpus"
    shutil.copytree(HERE / "corpus", corpus)
    seeds = len(list(corpus.iterdir()))
    r = subprocess.run([str(exe), f"-max_total_time={SECONDS}", "-timeout=10",
                        # ASan's shadow and quarantine keep a fuzzing process above 1 GiB of RSS on its own
                        # (seen: 1129 MB with 24 MB of live heap); any single allocation over 64 MiB, which
                        # a tiny model's checkpoint never needs, is still reported as a failure
                        "-rss_limit_mb=3072", "-malloc_limit_mb=64",
                        "-max_len=4096", "-print_final_stats=1",
                        f"-artifact_prefix={tmp_path}/",  # a crash/oom input lands here, never in the checkout
                        str(corpus)],
                       capture_output=True, text=True, timeout=SECONDS + 120, cwd=tmp_path,
                       env={**os.environ, "ASAN_OPTIONS": "detect_leaks=0"})
    log = r.stderr
    assert r.returncode == 0, log[-4000:]  # a crash, sanitizer report or timeout fails the test
    runs = int(re.search(r"stat::number_of_executed_units:\s*(\d+)", log).group(1))
    grown = len(list(corpus.iterdir()))
    print(f"fuzzed the checkpoint parser {SECONDS} s: {runs} runs, corpus {seeds} seeds -> {grown} inputs")
    assert runs > 1000 and grown > seeds
