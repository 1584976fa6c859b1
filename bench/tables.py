"""bench's shared helpers, in one leaf module (it imports nothing from bench/): the numbers and
table pieces that run.py, report.py, kernels_bw.py, targets.py and the LLM/thread scripts share.

    percentile(xs, q)                     a q-quantile (numpy's linear rule)
    pct_reference(fw, threads, peak, v3)  the FMA peak a row's "% of peak" is taken against
    sig(v)                                v with >= 3 significant digits
    thread_pairs(rows), slower_on_more_threads(rows)   1 thread vs all threads, per build
    bw_table_lines(res)                   kernels_bw.cpp's table
"""
from __future__ import annotations

import math

SCHEME_TITLES = {"full": "full", "last": "last layer", "sparse": "sparse"}


def percentile(xs, q: float) -> float:
    """The q-quantile of xs (0 <= q <= 1), linear between the two nearest ranks (numpy's default)."""
    s = sorted(xs)
    pos = q * (len(s) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def step_summary(times: dict, cpu: dict, losses: dict, meta: dict) -> dict:
    """The JSON record of rows stepped in turn in one process (lm_interleaved.py --json): per row the
    p10 / median / p90 of its step times (ms), the median of the calling thread's CPU ms per step, its
    step count and first and last loss; `meta` as given."""
    rows = {}
    for n, ts in times.items():
        rows[n] = {"p10": percentile(ts, 0.1), "median": percentile(ts, 0.5), "p90": percentile(ts, 0.9),
                   "cpu_ms": percentile(cpu[n], 0.5), "steps": len(ts), "loss_first": losses[n][0],
                   "loss_last": losses[n][-1]}
    return {"meta": meta, "rows": rows}


def pct_reference(framework: str, threads: int, peak: dict, peak_v3: dict) -> float | None:
    """The FMA peak a row's "% of peak" is taken against: the -v3 builds against the AVX2 peak,
    the one-thread rows against one core's."""
    p = peak_v3 if "-v3" in framework and peak_v3 else peak
    if not p:
        return None
    return p.get("single_gflops") if threads == 1 or framework.endswith("-1t") else p.get("all_gflops")


def sig(v, digits=3) -> str:
    """v with >= `digits` significant digits, never in scientific notation."""
    if v is None:
        return "n/a"
    if v == 0 or not math.isfinite(v):
        return str(v)
    places = max(1, min(8, digits - 1 - math.floor(math.log10(abs(v)))))
    return format(v, f".{places}f")


def thread_pairs(rows) -> list[tuple[str, str, str, float, float]]:
    """(title, scheme, framework, ms on 1 thread, ms on all threads) for every framework that ran both
    ways in one run (pockengine vs pockengine-1t, pockengine-v3 vs -v3-1t, eager vs eager-1t), in row order."""
    ms = {(r["title"], r["scheme"], r["framework"]): r["ms"] for r in rows if r["status"] == "ok"}
    order = [(r["title"], r["scheme"], r["framework"]) for r in rows]
    pairs = sorted({(t, s, fw) for (t, s, fw) in ms if not fw.endswith("-1t") and (t, s, fw + "-1t") in ms},
                   key=order.index)
    return [(t, s, fw, ms[(t, s, fw + "-1t")], ms[(t, s, fw)]) for t, s, fw in pairs]


def slower_on_more_threads(rows, tolerance: float = 0.05) -> list[str]:
    """The target "no row slower on 2 threads than on 1", checked: one line per PockEngine build and
    (model, scheme) whose step on all threads took more than (1 + tolerance) x its step on one
    thread in the same run (the tolerance absorbs the run-to-run noise of a median)."""
    return [f"{t} / {SCHEME_TITLES.get(s, s)} / {fw}: {sig(one)} ms on 1 thread, {sig(two)} ms on more"
            for t, s, fw, one, two in thread_pairs(rows)
            if fw.startswith("pockengine") and two > (1 + tolerance) * one]


def bw_table_lines(res: dict) -> list[str]:
    lines = [f"Kernels on one thread (`bench/kernels_bw.cpp`, -march={res['march']}, {res['elements']} floats per "
             f"array), against the measured bandwidth **{res['bandwidth_gbs']:.1f} GB/s** (triad, one thread):", "",
             "| kernel | bound | GB/s | % of bandwidth | elements/ns |", "|---|---|---:|---:|---:|"]
    for k in res["kernels"]:
        lines.append(f"| {k['kernel']} | {'memory' if k['memory_bound'] else 'compute'} | {k['gbs']:.2f} | "
                     f"{k['pct_bandwidth']:.0f}% | {k['elems_per_ns']:.3f} |")
    return lines
