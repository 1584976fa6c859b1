"""Coverage-guided fuzzing of the C runtime's checkpoint parser (issue 13):
libFuzzer (clang 14, Debian's clang-14 + libclang-rt-14-dev) with AddressSanitizer
and UBSan over fuzz_checkpoint.cpp, seeded with real checkpoints of the tiny
model (corpus/), for a bounded time (POCK_FUZZ_SECONDS, default 20 s)."""
import os
import shutil
from pathlib import Path

from fuzzing import RUNTIME, build_fuzzer, run_fuzzer

HERE = Path(__file__).resolve().parent
TINY = HERE.parents[3] / "tests" / "native" / "runtime" / "fixtures" / "tiny_model.cpp"
SECONDS = int(os.environ.get("POCK_FUZZ_SECONDS", "20"))


def test_fuzz_checkpoint_parser(tmp_path):
    exe = build_fuzzer(tmp_path, "fuzz_checkpoint", [HERE / "fuzz_checkpoint.cpp", TINY, *sorted(RUNTIME.glob("*.cpp"))])
    corpus = tmp_path / "corpus"
    shutil.copytree(HERE / "corpus", corpus)
    # a tiny model's checkpoint never needs an allocation over 64 MiB
    runs, seeds, grown = run_fuzzer(exe, corpus, SECONDS, malloc_limit_mb=64, max_len=4096, detect_leaks=False)
    print(f"fuzzed the checkpoint parser {SECONDS} s: {runs} runs, corpus {seeds} seeds -> {grown} inputs")
    assert runs > 1000 and grown > seeds
