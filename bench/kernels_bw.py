"""Memory-bound kernels in GB/s against this machine's measured bandwidth (bench/kernels_bw.cpp),
one thread; run by bench/run.py (`make bench`) and on its own:

    .venv/bin/python bench/kernels_bw.py [--mib 64] [--march native|x86-64-v3]
    .venv/bin/python bench/kernels_bw.py --update bench/results.json

--update re-measures both builds' tables into an existing `make bench` results.json (dated, with
the commit, apart from the run's own date), then rewrites the results.md beside it and
targets.md: a kernel change re-measured without the whole 45-minute run.

The runtime's threadpool and kernels are compiled in (g++ -O3, the runtime's flags) with no pool,
so every kernel runs on the calling thread.  Target: memory-bound kernels >= 60% of the
measured (STREAM-triad-style) bandwidth; the transcendental ones are listed with their
throughput for reference (they are compute-bound).
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from tables import bw_table_lines  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
RT = ROOT / "native" / "runtime"
KERNELS = ["activation", "optimizer", "layer_norm", "rms_norm", "linear", "gemm", "softmax", "loss", "elementwise",
           "guards"]  # guards: all_finite, which linear.cpp's checked weight gradient falls back to


def measure(mib: int = 64, march: str = "native", timeout: float = 600) -> dict:
    with tempfile.TemporaryDirectory(prefix="pock-kbw-") as tmp:
        exe = Path(tmp) / "kernels_bw"
        srcs = [str(ROOT / "bench" / "kernels_bw.cpp"), str(RT / "threadpool.cpp"),
                *(str(RT / "kernels" / f"{k}.cpp") for k in KERNELS)]
        subprocess.run(["g++", "-O3", "-std=c++17", f"-march={march}", "-pthread", "-I", str(RT / "include"),
                        "-I", str(RT), *srcs, "-o", str(exe)], check=True, capture_output=True, text=True,
                       timeout=timeout)
        out = subprocess.run([str(exe), str(mib)], check=True, capture_output=True, text=True, timeout=timeout)
    res = json.loads(out.stdout)
    res["march"] = march
    return res


def update(results: Path, mib: int = 64) -> None:
    """Re-measure meta["kernels_bw"] of a results.json; rewrite its results.md and targets.md."""
    import time
    data = json.loads(results.read_text())
    meta = data["meta"]
    meta["kernels_bw"] = [measure(mib, m) for m in ("native", "x86-64-v3")]
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout
    meta["kernels_bw_measured"] = f"{time.strftime('%Y-%m-%d %H:%M')} at commit {commit.strip() or '?'}"
    results.write_text(json.dumps(data, indent=1))
    from report import write_markdown
    import targets
    write_markdown(results.parent / "results.md", meta, data["rows"])
    targets.main(["--bench", str(results.parent)])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mib", type=int, default=64)
    ap.add_argument("--march", default="native")
    ap.add_argument("--update", metavar="RESULTS_JSON", help="re-measure the kernel tables of a make bench run")
    a = ap.parse_args(argv)
    if a.update:
        update(Path(a.update), a.mib)
        return 0
    print("\n".join(bw_table_lines(measure(a.mib, a.march))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
