"""The speed and memory targets of `make bench`, checked against what the benchmarks measured.

    python bench/targets.py [--bench bench] [--out bench/targets.md]

Reads the JSON the benchmarks write (run.py: results.json; llm.py: llm_results.json, and
llm_interleaved.json for the SmolLM2 ms/step ratios when present; lm_interleaved.py:
lm_interleaved.json and lm_bench_interleaved.json; arm64/insns.py: arm64/results.json) and writes one table: each target, the measured value, and whether it is
met.  A benchmark that did not run leaves its targets "not measured", never met.
The targets are ratios within one run (the machine's absolute speed does not enter):

  transformer LM, LSTM LM batch 1, MobileNetV2   PockEngine's -march=x86-64-v3 (AVX2) build vs
                                                 PyTorch eager, same threads, same run
  GEMM-heavy steps                               % of the AVX2 FMA peak (bench/fma_peak.cpp)
  memory-bound kernels                           % of the measured bandwidth (bench/kernels_bw.cpp)
  threads                                        no PockEngine row slower on 2 threads than on 1
  SmolLM2-135M (bench/llm.py --model smollm2)    ms/step ratios, training memory / PyTorch full's
                                                 peak RSS, held-out loss against PyTorch's
  held-out transformer LM (lm_interleaved.py)    issue 39: vs PyTorch eager, p90 / median, 2 threads
                                                 / 1, rows interleaved in one process
  every run.py row vs torch.compile              issue 39; the transformer's rows from
                                                 lm_interleaved.py --size bench when it ran
"""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from tables import pct_reference, slower_on_more_threads, thread_pairs  # noqa: E402  (the peak run.py's "% of peak" is taken against)


@dataclass
class Target:
    issue: int
    what: str
    value: float | None        # None: not measured
    unit: str = "x"
    met_if: str = ">="         # ">=" or "<="
    bound: float = 0.0
    detail: str = ""
    # speed targets: the ratio our step would reach at 100% of the machine's fp32 FMA peak (its FLOPs
    # / the peak, against the same reference time), and the reference's own % of that peak
    ceiling: float | None = None
    ref_pct_peak: float | None = None

    @property
    def met(self) -> bool | None:
        if self.value is None:
            return None
        return self.value >= self.bound if self.met_if == ">=" else self.value <= self.bound

    def peak_detail(self) -> str:
        """A speed target against the fp32 FMA peak: the ceiling, and the % of the peak our step
        runs at now and would need to run at to meet the target (ratio / ceiling)."""
        ours = f"ours at {100 * self.value / self.ceiling:.0f}%, " if self.value is not None else ""
        need = 100 * self.bound / self.ceiling
        need_text = f"{need:.1f}" if abs(need - 100) < 0.5 else f"{need:.0f}"  # 100.7 is not "100"
        return (f"fp32 ceiling {self.ceiling:.2f}x (PyTorch at {self.ref_pct_peak:.0f}% of the FMA peak; "
                f"{ours}the target needs {need_text}%)"
                + (": **beyond 100% of peak**" if self.ceiling < self.bound else ""))

    def row(self) -> str:
        shown = "not measured" if self.value is None else f"{self.value:.3g}{self.unit}"
        verdict = {None: "n/a", True: "met", False: "**not met**"}[self.met]
        detail = self.detail
        if self.ceiling is not None:
            detail = "; ".join(filter(None, [detail, self.peak_detail()]))
        return f"| {self.issue} | {self.what} | {self.met_if} {self.bound:g}{self.unit} | {shown} | {verdict} | {detail} |"


def ceiling(ref_ms: float | None, flops: float | None, peak_gflops: float | None) -> tuple[float | None, float | None]:
    """(the speed-up over a reference of ref_ms that a step of `flops` would reach at 100% of the FMA
    peak, the reference's % of that peak): a ratio target above the first cannot be met in fp32."""
    if not ref_ms or not flops or not peak_gflops:
        return None, None
    at_peak_ms = flops / (peak_gflops * 1e6)
    return ref_ms / at_peak_ms, 100 * at_peak_ms / ref_ms


def _load(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _row(rows, workload: str, scheme: str, framework: str) -> dict | None:
    return next((r for r in rows if r["workload"].startswith(workload) and r["scheme"] == scheme
                 and r["framework"] == framework and r.get("status") == "ok"), None)


def _ratio(rows, workload: str, scheme: str, framework: str) -> float | None:
    return (_row(rows, workload, scheme, framework) or {}).get("ratio")


def step_targets(results: dict | None) -> list[Target]:
    """Issue 17's step targets (bench/run.py's rows)."""
    rows = (results or {}).get("rows", [])
    meta = (results or {}).get("meta", {})
    fw = "pockengine-v3"
    peak_v3 = pct_reference(fw, meta.get("threads") or 0, {}, meta.get("peak_v3") or {})
    out = []
    for workload, title, scheme, bound in (("transformer", "transformer LM", "full", 1.5),
                                            ("transformer", "transformer LM", "sparse", 1.5),
                                            ("lstm_b1", "LSTM LM batch 1", "full", 3.0),
                                            ("lstm_b1", "LSTM LM batch 1", "sparse", 3.0),
                                            ("mobilenetv2", "MobileNetV2", "full", 2.5),
                                            ("mobilenetv2", "MobileNetV2", "sparse", 3.0)):
        ours = _row(rows, workload, scheme, fw)
        ref = _row(rows, workload, scheme, "eager-v3") or _row(rows, workload, scheme, "eager")
        cap, pct = ceiling(ref and ref["ms"], ours and ours.get("flops_per_step"), peak_v3)
        vs = "eager-v3 (PyTorch on AVX2)" if ref and ref["framework"] == "eager-v3" else "eager"
        out.append(Target(17, f"{title} {scheme}, AVX2 build vs {vs}",
                          _ratio(rows, workload, scheme, fw), bound=bound, ceiling=cap, ref_pct_peak=pct))
    gemm = [r.get("pct_peak") for r in rows if r["workload"].startswith("transformer") and r["framework"] == fw
            and r.get("status") == "ok" and r.get("pct_peak") is not None]
    out.append(Target(17, "GEMM-heavy steps (transformer LM, AVX2 build) % of FMA peak",
                      min(gemm) if gemm else None, unit="%", bound=65.0,
                      detail="lowest of its schemes" if gemm else ""))
    bw = [k for res in (results or {}).get("meta", {}).get("kernels_bw", []) or [] if res.get("march") == "x86-64-v3"
          for k in res.get("kernels", []) if k.get("memory_bound")]
    worst = min(bw, key=lambda k: k["pct_bandwidth"]) if bw else None
    again = (results or {}).get("meta", {}).get("kernels_bw_measured")
    out.append(Target(17, "memory-bound kernels (AVX2 build) % of bandwidth",
                      worst["pct_bandwidth"] if worst else None, unit="%", bound=60.0,
                      detail=(f"lowest: {worst['kernel']}" + (f"; measured again {again}" if again else ""))
                      if worst else ""))
    slower = None
    if rows and any(fw.startswith("pockengine") for _, _, fw, _, _ in thread_pairs(rows)):
        slower = slower_on_more_threads(rows)
    out.append(Target(17, "PockEngine rows slower on 2 threads than on 1", None if slower is None else
                      float(len(slower)), unit="", met_if="<=", bound=0.0, detail="; ".join(slower or [])))
    return out


def _smollm2_rows(llm: dict | None) -> dict:
    return (llm or {}).get("rows", {}) if (llm or {}).get("meta", {}).get("model") == "smollm2" else {}


def llm_targets(llm: dict | None, interleaved: dict | None = None) -> list[Target]:
    """Issue 16's targets (bench/llm.py --model smollm2).  The ms/step ratios come from the interleaved
    run (every row's steps taken in turn in one process) where it measured both rows: rows run one
    after another in their own processes meet different machine loads, so their ratio can be off by
    tens of percent on a shared machine.  Memory and loss come from the per-process run."""
    rows, inter = _smollm2_rows(llm), _smollm2_rows(interleaved)
    peak = (llm or {}).get("meta", {}).get("fma_peak") or (interleaved or {}).get("meta", {}).get("fma_peak")

    def timed(ours, theirs):
        return (inter, "interleaved in one process") if ours in inter and theirs in inter else (rows, "")

    def speed(ours, theirs):
        src = timed(ours, theirs)[0]
        return src[theirs]["ms_per_step"] / src[ours]["ms_per_step"] if ours in src and theirs in src else None

    def cap(ours, theirs):
        src, how = timed(ours, theirs)
        if ours not in src or theirs not in src:
            return {}
        c, pct = ceiling(src[theirs]["ms_per_step"], src[ours].get("flops_per_step"), peak)
        how += f" ({src[ours]['ms_per_step']:g} vs {src[theirs]['ms_per_step']:g} ms)"
        return {"ceiling": c, "ref_pct_peak": pct, "detail": how.strip()}

    def mem(row):
        if row not in rows or "pytorch-full" not in rows or (llm or {}).get("meta", {}).get("interleave"):
            return None  # interleaved rows share one process: no per-row peak RSS for PyTorch full
        return rows[row]["train_mem_mib"] / rows["pytorch-full"]["peak_rss_mib"]

    def loss_gap(ours, ref):
        if ours not in rows or ref not in rows:
            return None
        return 100 * abs(rows[ours]["loss_last"] - rows[ref]["loss_last"]) / abs(rows[ref]["loss_last"])

    out = [Target(16, "SmolLM2 full vs PyTorch full", speed("pockengine-full", "pytorch-full"), bound=2.0,
                  **cap("pockengine-full", "pytorch-full")),
           Target(16, "SmolLM2 sparse vs PyTorch same-scheme sparse",
                  speed("pockengine-sparse", "pytorch-sparse"), bound=1.5, **cap("pockengine-sparse", "pytorch-sparse")),
           Target(16, "SmolLM2 sparse vs PyTorch full", speed("pockengine-sparse", "pytorch-full"),
                  bound=3.5, **cap("pockengine-sparse", "pytorch-full")),
           Target(16, "SmolLM2 LoRA vs PyTorch LoRA", speed("pockengine-lora", "pytorch-lora"), bound=1.5,
                  **cap("pockengine-lora", "pytorch-lora")),
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


def _lm_rows(lm: dict | None) -> dict:
    return (lm or {}).get("rows", {})


def steady_targets(results: dict | None, heldout: dict | None, bench_lm: dict | None) -> list[Target]:
    """Issue 39's targets on fp32 (2 threads, rows interleaved in one process): the held-out LM
    (bench/lm_interleaved.py -> lm_interleaved.json), and every `make bench` row against
    torch.compile, its transformer rows from the one-process run (--size bench ->
    lm_bench_interleaved.json) where that ran, the other rows from run.py's results.json."""
    held = _lm_rows(heldout)

    def med(rows, name):
        return rows[name]["median"] if name in rows else None

    def over(rows, num, den):
        a, b = med(rows, num), med(rows, den)
        return a / b if a and b else None

    out = []
    for s in ("full", "sparse"):
        out.append(Target(39, f"held-out transformer LM {s} vs PyTorch eager fp32",
                          over(held, f"eager/{s}", f"pockengine/{s}"), bound=1.3,
                          detail="interleaved in one process" if held else ""))
    steady = [(held[n]["p90"] / held[n]["median"], n) for n in ("pockengine/full", "pockengine/sparse") if n in held]
    out.append(Target(39, "2-thread steps steady: PockEngine p90 / median (held-out LM)",
                      max(steady)[0] if steady else None, unit="", met_if="<=", bound=1.2,
                      detail=f"worst: {max(steady)[1]}" if steady else ""))
    two = [(over(held, f"pockengine/{s}", f"pockengine-1t/{s}"), s) for s in ("full", "sparse")]
    two = [(v, s) for v, s in two if v is not None]
    out.append(Target(39, "2 threads / 1 thread (held-out LM)", max(two)[0] if two else None, unit="x",
                      met_if="<=", bound=0.75, detail=f"worst: {max(two)[1]}" if two else ""))
    # every make bench row: torch.compile's ms / PockEngine's, same scheme, same threads
    ratios = {}
    for r in (results or {}).get("rows", []):
        tc = _row((results or {}).get("rows", []), r["workload"], r["scheme"], "torch.compile")
        if r["framework"] == "pockengine" and r.get("status") == "ok" and tc:
            ratios[f"{r['workload']} {r['scheme']}"] = tc["ms"] / r["ms"]
    bench_rows, m = _lm_rows(bench_lm), (bench_lm or {}).get("meta", {})
    inter = []
    for s in ("full", "sparse"):
        v = over(bench_rows, f"torch.compile/{s}", f"pockengine/{s}")
        if v is not None:  # replaces run.py's transformer row of this scheme
            ratios = {k: x for k, x in ratios.items() if not (k.startswith("transformer") and k.endswith(f" {s}"))}
            ratios[f"transformer_b{m.get('batch', '?')}s{m.get('seq', '?')} {s} (one process)"] = v
            inter.append(s)
    low = min(ratios.items(), key=lambda kv: kv[1]) if ratios else None
    detail = f"lowest: {low[0]} {low[1]:.2f}x of {len(ratios)} rows" if low else ""
    if inter:
        detail += f"; transformer {'/'.join(inter)} interleaved in one process (lm_bench_interleaved.json)"
    out.append(Target(39, "every make bench row vs torch.compile (lowest)", low[1] if low else None, bound=1.2,
                      detail=detail))
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
             "A speed target's *fp32 ceiling* is the ratio our step would reach if it ran at 100% of the "
             "machine's measured fp32 FMA peak (bench/fma_peak.cpp; the AVX2 peak for the AVX2 build): its "
             "FLOPs / the peak, against the same PyTorch time. A target above its ceiling cannot be met by "
             "fp32 arithmetic on this machine, only by doing fewer FLOPs or lower-precision ones. The detail also gives "
             "the % of that peak our step runs at, and the % it would have to run at to meet the target.", "",
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
    inter = _load(bench / "llm_interleaved.json")
    heldout, bench_lm = _load(bench / "lm_interleaved.json"), _load(bench / "lm_bench_interleaved.json")
    insns = _load(bench / "arm64" / "results.json")
    sources = {name: (d.get("meta", {}).get("date", "undated") if d else "missing")
               for name, d in (("results.json", results), ("llm_results.json", llm), ("llm_interleaved.json", inter),
                               ("lm_interleaved.json", heldout), ("lm_bench_interleaved.json", bench_lm))}
    targets = step_targets(results) + llm_targets(llm, inter) + steady_targets(results, heldout, bench_lm)
    text = render(targets, insns, sources)
    Path(a.out or bench / "targets.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
