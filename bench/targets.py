"""The speed and memory targets of `make bench`, checked against what the benchmarks measured.

    python bench/targets.py [--bench bench] [--out bench/targets.md]

Reads the JSON the benchmarks write (run.py: results.json; llm.py: llm_results.json;
arm64/insns.py: arm64/results.json) and writes one table: each target, the measured value, and
whether it is met.  A benchmark that did not run leaves its targets "not measured", never met.
The targets are ratios within one run (the machine's absolute speed does not enter):

  transformer LM, LSTM LM batch 1, MobileNetV2   PockEngine's -march=x86-64-v3 (AVX2) build vs
                                                 PyTorch eager, same threads, same run
  GEMM-heavy steps                               % of the AVX2 FMA peak (bench/fma_peak.cpp)
  memory-bound kernels                           % of the measured bandwidth (bench/kernels_bw.cpp)
  threads                                        no PockEngine row slower on 2 threads than on 1
  SmolLM2-135M (bench/llm.py --model smollm2)    ms/step ratios, training memory / PyTorch full's
                                                 peak RSS, held-out loss against PyTorch's
"""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent


@dataclass
class Target:
    issue: int
    what: str
    value: float | None        # None: not measured
    unit: str = "x"
    met_if: str = ">="         # ">=" or "<="
    bound: float = 0.0
    detail: str = ""

    @property
    def met(self) -> bool | None:
        if self.value is None:
            return None
        return self.value >= self.bound if self.met_if == ">=" else self.value <= self.bound

    def row(self) -> str:
        shown = "not measured" if self.value is None else f"{self.value:.3g}{self.unit}"
        verdict = {None: "n/a", True: "met", False: "**not met**"}[self.met]
        return f"| {self.issue} | {self.what} | {self.met_if} {self.bound:g}{self.unit} | {shown} | {verdict} | {self.detail} |"


def _load(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _ratio(rows, workload: str, scheme: str, framework: str) -> float | None:
    for r in rows:
        if (r["workload"].startswith(workload) and r["scheme"] == scheme and r["framework"] == framework
                and r.get("status") == "ok"):
            return r.get("ratio")
    return None


def step_targets(results: dict | None) -> list[Target]:
    """Issue 17's step targets (bench/run.py's rows)."""
    rows = (results or {}).get("rows", [])
    fw = "pockengine-v3"
    out = []
    for workload, title, scheme, bound in (("transformer", "transformer LM", "full", 1.5),
                                            ("transformer", "transformer LM", "sparse", 1.5),
                                            ("lstm_b1", "LSTM LM batch 1", "full", 3.0),
                                            ("lstm_b1", "LSTM LM batch 1", "sparse", 3.0),
                                            ("mobilenetv2", "MobileNetV2", "full", 2.5),
                                            ("mobilenetv2", "MobileNetV2", "sparse", 3.0)):
        out.append(Target(17, f"{title} {scheme}, AVX2 build vs eager",
                          _ratio(rows, workload, scheme, fw), bound=bound))
    gemm = [r.get("pct_peak") for r in rows if r["workload"].startswith("transformer") and r["framework"] == fw
            and r.get("status") == "ok" and r.get("pct_peak") is not None]
    out.append(Target(17, "GEMM-heavy steps (transformer LM, AVX2 build) % of FMA peak",
                      min(gemm) if gemm else None, unit="%", bound=65.0,
                      detail="lowest of its schemes" if gemm else ""))
    bw = [k for res in (results or {}).get("meta", {}).get("kernels_bw", []) or [] if res.get("march") == "x86-64-v3"
          for k in res.get("kernels", []) if k.get("memory_bound")]
    worst = min(bw, key=lambda k: k["pct_bandwidth"]) if bw else None
    out.append(Target(17, "memory-bound kernels (AVX2 build) % of bandwidth",
                      worst["pct_bandwidth"] if worst else None, unit="%", bound=60.0,
                      detail=f"lowest: {worst['kernel']}" if worst else ""))
    slower = None
    sys.path.insert(0, str(HERE))
    from report import slower_on_more_threads, thread_pairs
    if rows and any(fw.startswith("pockengine") for _, _, fw, _, _ in thread_pairs(rows)):
        slower = slower_on_more_threads(rows)
    out.append(Target(17, "PockEngine rows slower on 2 threads than on 1", None if slower is None else
                      float(len(slower)), unit="", met_if="<=", bound=0.0, detail="; ".join(slower or [])))
    return out


def llm_targets(llm: dict | None) -> list[Target]:
    """Issue 16's targets (bench/llm.py --model smollm2)."""
    rows = (llm or {}).get("rows", {}) if (llm or {}).get("meta", {}).get("model") == "smollm2" else {}

    def speed(ours, theirs):
        return rows[theirs]["ms_per_step"] / rows[ours]["ms_per_step"] if ours in rows and theirs in rows else None

    def mem(row):
        if row not in rows or "pytorch-full" not in rows or (llm or {}).get("meta", {}).get("interleave"):
            return None  # interleaved rows share one process: no per-row peak RSS for PyTorch full
        return rows[row]["train_mem_mib"] / rows["pytorch-full"]["peak_rss_mib"]

    def loss_gap(ours, ref):
        if ours not in rows or ref not in rows:
            return None
        return 100 * abs(rows[ours]["loss_last"] - rows[ref]["loss_last"]) / abs(rows[ref]["loss_last"])

    out = [Target(16, "SmolLM2 full vs PyTorch full", speed("pockengine-full", "pytorch-full"), bound=2.0),
           Target(16, "SmolLM2 sparse vs PyTorch same-scheme sparse",
                  speed("pockengine-sparse", "pytorch-sparse"), bound=1.5),
           Target(16, "SmolLM2 sparse vs PyTorch full", speed("pockengine-sparse", "pytorch-full"),
                  bound=3.5),
           Target(16, "SmolLM2 LoRA vs PyTorch LoRA", speed("pockengine-lora", "pytorch-lora"), bound=1.5),
           Target(16, "sparse + bf16 frozen: training memory / PyTorch full peak",
                  mem("pockengine-sparse-bf16"), unit="", met_if="<=", bound=0.2),
           Target(16, "sparse + int8 frozen: training memory / PyTorch full peak",
                  mem("pockengine-sparse-int8"), unit="", met_if="<=", bound=0.15)]
    for scheme in ("full", "sparse", "lora"):
        out.append(Target(16, f"SmolLM2 {scheme}: loss after the steps vs PyTorch's",
                          loss_gap(f"pockengine-{scheme}", f"pytorch-{scheme}"), unit="%", met_if="<=", bound=2.0))
    for q in ("bf16", "int8"):
        out.append(Target(16, f"sparse + {q} frozen: loss vs fp32 frozen",
                          loss_gap(f"pockengine-sparse-{q}", "pockengine-sparse"), unit="%", met_if="<=", bound=1.0))
    return out


def arm64_lines(insns: dict | None) -> list[str]:
    """The phone-ISA proxy: aarch64 instructions per step, ours vs the same step without auto-vectorization."""
    if not insns or not insns.get("rows"):
        return ["aarch64 instruction counts: not measured (bench/arm64/insns.py did not run)."]
    full = insns.get("full")
    sizes = "real" if full in ("all", True) else "miniature" + (f" (real size: {full})" if full else "")
    lines = [f"aarch64 instructions per step under qemu (bench/arm64/insns.py; {sizes} workloads):", "",
             "| model | scheme | ours (M) | no auto-vectorization (M) | ratio | vectorization disabled (M) | ratio |",
             "|---|---|---:|---:|---:|---:|---:|"]
    for r in insns["rows"]:
        scalar = (f"{r['scalar'] / 1e6:.2f} | {r['scalar'] / r['ours']:.2f}x" if "scalar" in r else "n/a | n/a")
        lines.append(f"| {r['workload']} | {r['scheme']} | {r['ours'] / 1e6:.2f} | {r['no-autovec'] / 1e6:.2f} | "
                     f"{r['no-autovec'] / r['ours']:.2f}x | {scalar} |")
    return lines


def render(targets: list[Target], insns: dict | None, sources: dict) -> str:
    met = sum(t.met is True for t in targets)
    measured = sum(t.met is not None for t in targets)
    lines = ["# `make bench` targets", "",
             f"{met} of {measured} measured targets met ({len(targets) - measured} not measured). Inputs: "
             + ", ".join(f"`{k}` ({v})" for k, v in sources.items()) + ".", "",
             "| issue | target | goal | measured | verdict | detail |", "|---|---|---|---|---|---|"]
    lines += [t.row() for t in targets]
    return "\n".join(lines + [""] + arm64_lines(insns)) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bench", default=str(HERE), help="folder holding results.json, llm_results.json, arm64/")
    ap.add_argument("--out", help="markdown output (default <bench>/targets.md)")
    a = ap.parse_args(argv)
    bench = Path(a.bench)
    results, llm = _load(bench / "results.json"), _load(bench / "llm_results.json")
    insns = _load(bench / "arm64" / "results.json")
    sources = {name: (d.get("meta", {}).get("date", "undated") if d else "missing")
               for name, d in (("results.json", results), ("llm_results.json", llm))}
    targets = step_targets(results) + llm_targets(llm)
    text = render(targets, insns, sources)
    Path(a.out or bench / "targets.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
