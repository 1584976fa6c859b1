"""results.json rows -> bench/results.md (Markdown table) and bench/results.png (chart).

    .venv/bin/python bench/report.py [bench/results.json]   # re-render from a saved run
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from tables import SCHEME_TITLES, bw_table_lines, sig, slower_on_more_threads, thread_pairs  # noqa: E402,F401

COLUMNS = ["model", "scheme", "framework", "ms/step (median)", "p10 / p90 ms", "min-max ms", "speed vs eager", "GFLOP/s",
           "% of FMA peak", "train mem MiB", "loss @ step 1", "loss @ last step", "notes"]


def _f(v, fmt):
    return "n/a" if v is None else format(v, fmt)


_ms = _sig = sig


def _esc(s: str) -> str:
    return str(s).replace("|", "\\|").replace("\n", " ")


def table_lines(rows, loss_step=None) -> list[str]:
    cols = [f"loss @ step {loss_step}" if c == "loss @ last step" and loss_step else c for c in COLUMNS]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        model = r["title"]
        scheme = SCHEME_TITLES.get(r["scheme"], r["scheme"])
        if r["status"] != "ok":
            cells = [model, scheme, r["framework"], "n/a", "", "", "n/a", "n/a", "n/a", "n/a", "", "", _esc(r["reason"])]
        else:
            spread = f"{_ms(r['ms_p10'])} / {_ms(r['ms_p90'])}" if "ms_p10" in r else "n/a"  # older results.json
            cells = [model, scheme, r["framework"], _ms(r["ms"]), spread, f"{_ms(r['ms_min'])}-{_ms(r['ms_max'])}",
                     _f(r["ratio"], ".2f") + ("x" if r["ratio"] is not None else ""), _sig(r["gflops"]),
                     _sig(r["pct_peak"]), _sig(r.get("mem_mib")), _f(r.get("first_loss"), ".4f"), _f(r.get("final_loss"), ".4f"),
                     _esc("; ".join(r.get("notes") or []))]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def thread_lines(rows) -> list[str]:
    """2 threads vs 1 for each framework that ran both (pockengine vs pockengine-1t, -v3 vs -v3-1t,
    eager vs eager-1t): the target is that no PockEngine row is slower on 2 threads than on 1."""
    pairs = thread_pairs(rows)
    if not pairs:
        return []
    out = ["", "Threads: each build on 2 threads against the same build on 1 (same run; > 1: "
           "2 threads faster; the target is >= 1 everywhere for PockEngine).", "",
           "| model | scheme | build | ms 1 thread | ms 2 threads | speed-up |", "|---|---|---|---:|---:|---:|"]
    for t, s, fw, one, two in pairs:
        out.append(f"| {t} | {SCHEME_TITLES.get(s, s)} | {fw} | {_ms(one)} | {_ms(two)} | {one / two:.2f}x"
                   + (" (slower)" if two > one else "") + " |")
    return out


def write_markdown(path: Path, meta: dict, rows: list[dict]) -> None:
    peak = meta.get("peak") or {}
    v = meta.get("versions", {})
    out = [f"# PockEngine training-step benchmark{' (quick)' if meta.get('quick') else ''}", ""]
    out.append(f"{meta['date']}, {meta['cpu']}, {meta['cores']} cores, {meta['threads']} threads for every "
               f"framework; Python {meta['python']}; run took {meta['seconds']:.0f} s.")
    la = meta.get("load_avg")
    if la:
        busy = la["max"] > 0.5 * meta["cores"] + 1
        out.append(f"1-minute load average during the run: {la['start']:.1f} at start, mean {la['mean']:.1f}, max "
                   f"{la['max']:.1f}" + (" -- **other work was running on the machine: treat the timings with "
                                         "care**" if busy else " (the benchmark's own load is about 1-2)") + ".")
    out.append("")
    if peak:
        out.append(f"Measured FP32 FMA peak (`bench/fma_peak.cpp`, {peak['isa']}, g++ -O3 -march=native, best of "
               "a measurement before and after the run): "
                   f"**{peak['single_gflops']:.1f} GFLOP/s on one core, {peak['all_gflops']:.1f} GFLOP/s on "
                   f"{peak['threads']} threads** (the % column is against the "
                   f"{'one-core' if meta['threads'] == 1 else 'all-core'} figure: {meta['threads']} thread(s) ran; "
                   "the -1t rows against the one-core figure).")
        v3 = meta.get("peak_v3")
        if v3:
            out.append(f"The -v3 rows (built with -march=x86-64-v3: AVX2 + FMA) are against the same measurement "
                       f"built that way ({v3['isa']}): **{v3['single_gflops']:.1f} GFLOP/s on one core, "
                       f"{v3['all_gflops']:.1f} GFLOP/s on {v3['threads']} threads**.")
    else:
        out.append("FMA peak: not measured (no C++ compiler?).")
    out.append("")
    out.append("Frameworks: " + ", ".join(f"{k} {val}" for k, val in v.items()) + ".")
    for k, why in meta.get("unavailable", {}).items():
        out.append(f"Not run: {k} ({why}).")
    out.append("")
    out.append(f"Each number is the median of {meta['steps']} timed steps after {meta['warmup']} warm-up steps "
               f"(fewer, at least one, where they took over {meta.get('warmup_budget', 2):g} s), "
               f"timed in {meta['rounds']} rounds that alternate the frameworks, each framework in its own "
               "process. SGD lr 0.01 momentum 0.9 (ONNX Runtime: no momentum), cross-entropy loss, random "
               "init, fixed random batches. speed vs eager = eager ms / framework ms (> 1: faster than "
               "PyTorch eager), against PyTorch on the same threads and, for a `-v3` (AVX2) build, PyTorch "
               "held to AVX2 too (`eager-v3`: ATEN_CPU_CAPABILITY, MKL and oneDNN capped) when that ran. GFLOP/s uses PockEngine's `flops_per_step` of that model and scheme for every "
               "framework. train mem = peak RSS during the steps - RSS after loading (PockEngine: + its "
               "arena and optimizer state, which it allocates and zeroes when it loads; ExecuTorch: + the RSS "
               "its method took beyond the program file on the first, pre-baseline run: memory-planned "
               "activations and gradients). loss @ step 1 is the "
               "first step's loss (the same weights and batch everywhere); loss @ step "
               f"{meta.get('loss_step', '')} is the loss of that step (the same batches in the same order "
               "everywhere, so it agrees across frameworks that implement the same update).")
    out.append("")
    out += table_lines(rows, meta.get("loss_step"))
    out += thread_lines(rows)
    if meta.get("kernels_bw_measured"):
        out += ["", f"The kernel tables below were measured again on {meta['kernels_bw_measured']} "
                    "(bench/kernels_bw.py --update), after the run above."]
    for res in meta.get("kernels_bw") or []:
        out += [""] + bw_table_lines(res)
    stats = meta.get("stats") or {}
    if stats:
        out += ["", "PockEngine's compiled programs (`prog.stats()`):", "",
                "| model/scheme | GFLOP/step | arena MiB | optimizer state MiB | trainable elements |",
                "|---|---|---|---|---|"]
        for k, s in stats.items():
            out.append(f"| {k} | {s['flops_per_step'] / 1e9:.3f} | {s['arena_bytes'] / 2**20:.2f} | "
                       f"{s['optimizer_state_bytes'] / 2**20:.2f} | {s['trainable_elements']} |")
    path.write_text("\n".join(out) + "\n")


def write_plot(path: Path, meta: dict, rows: list[dict]) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    configs = []
    for r in rows:
        key = (r["title"], r["scheme"])
        if key not in configs:
            configs.append(key)
    fws = []
    for r in rows:
        if r["framework"] not in fws:
            fws.append(r["framework"])
    by = {(r["title"], r["scheme"], r["framework"]): r for r in rows}
    colors = {"pockengine": "#d62728", "pockengine-vulkan": "#ff7f0e", "eager": "#7f7f7f", "torch.compile": "#1f77b4", "executorch": "#2ca02c",
              "onnxruntime": "#9467bd"}
    width = 0.8 / max(1, len(fws))
    fig, axes = plt.subplots(2, 1, figsize=(max(10, 1.1 * len(configs) + 3), 9), sharex=True)
    labels = [f"{t}\n{SCHEME_TITLES.get(s, s)}" for t, s in configs]
    for panel, (ax, field, ylabel) in enumerate(
            zip(axes, ("ratio", "mem_mib"), ("speed vs PyTorch eager (x, log)", "training memory (MiB)"))):
        for j, fw in enumerate(fws):
            xs, ys = [], []
            for i, (t, s) in enumerate(configs):
                r = by.get((t, s, fw))
                x = i + (j - (len(fws) - 1) / 2) * width
                if r and r["status"] == "ok" and r.get(field) is not None:
                    xs.append(x)
                    ys.append(max(r[field], 1e-3))
                else:
                    ax.text(x, 0.02, "n/a", rotation=90, ha="center", va="bottom", fontsize=6,
                            transform=ax.get_xaxis_transform(), color=colors.get(fw, "k"))
            ax.bar(xs, ys, width, label=fw, color=colors.get(fw))
        ax.set_ylabel(ylabel)
        ax.grid(axis="y", alpha=0.3)
        if field == "ratio":
            ax.set_yscale("log")
            ax.axhline(1.0, color="k", lw=0.8)
    axes[0].legend(ncol=len(fws), fontsize=8, loc="upper left")
    axes[0].set_title(f"Training step, {meta['threads']} threads, {meta['cpu']}" + (" (quick)" if meta["quick"] else ""))
    axes[1].set_xticks(range(len(configs)))
    axes[1].set_xticklabels(labels, rotation=45, ha="right", fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    src = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parent / "results.json"
    data = json.loads(src.read_text())
    write_markdown(src.with_suffix(".md"), data["meta"], data["rows"])
    write_plot(src.with_suffix(".png"), data["meta"], data["rows"])
