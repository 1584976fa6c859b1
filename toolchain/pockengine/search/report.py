"""The scheme-search report: per-layer contribution bars and the cost of the chosen scheme
next to full update and last-layer update, as pictures.

    write_report(result, "out.html")   # one self-contained page (PNGs inlined)
    write_report(result, "out.md")     # Markdown + out_contrib/_cost/_sensitivity.png beside it
"""
from __future__ import annotations

import base64
import html
import io
from pathlib import Path

from ..errors import PockError

MIB = 2 ** 20


def contribution_figure(result):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups, delta = result.groups, result.contributions.delta
    ratios = sorted({r for g in groups for r in g.ratios})
    colors = {r: c for r, c in zip(ratios, ("#c6dbef", "#6baed6", "#2171b5", "#08306b"))}
    fig, ax = plt.subplots(figsize=(7.5, 0.32 * len(groups) + 1.4))
    height = 0.8 / len(ratios)
    for gi, g in enumerate(groups):
        for o, r in enumerate(g.ratios, start=1):
            y = gi + (ratios.index(r) - (len(ratios) - 1) / 2) * height
            chosen = result.scheme[gi] == o
            ax.barh(y, delta[(gi, o)], height=height, color=colors[r], edgecolor="#d62728" if chosen else "none",
                    linewidth=1.6 if chosen else 0)
    ax.set_yticks(range(len(groups)))
    ax.set_yticklabels([g.name for g in groups], fontsize=7)
    ax.invert_yaxis()
    ax.axvline(0, color="black", linewidth=0.6)
    ax.set_xlabel(f"loss drop after {result.contributions.steps} steps (higher is better)")
    ax.set_title("Contribution of each candidate fine-tuned alone (red edge: chosen)", fontsize=9)
    handles = [plt.Rectangle((0, 0), 1, 1, color=colors[r]) for r in ratios]
    ax.legend(handles, [f"ratio {r:g}" for r in ratios], fontsize=7, loc="lower right")
    fig.tight_layout()
    return fig


def sensitivity_figure(result, title: str | None = None):
    """The paper's sensitivity curves (PockEngine 4.2): held-out loss drop against the ratio of
    input channels updated, one line per weight layer (darker: later in the model)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups, delta = result.groups, result.contributions.delta
    weights = [(gi, g) for gi, g in enumerate(groups) if g.kind == "weight"]
    fig, ax = plt.subplots(figsize=(7.5, 4.2))
    cmap = plt.get_cmap("viridis")
    for rank, (gi, g) in enumerate(weights):
        color = cmap(rank / max(len(weights) - 1, 1))
        xs = [0.0, *g.ratios]
        ys = [0.0, *(delta[(gi, o)] for o in range(1, len(g.ratios) + 1))]
        ax.plot(xs, ys, marker="o", markersize=3, color=color, linewidth=1.2, label=g.name)
    for gi, g in enumerate(groups):
        if g.kind != "weight":
            ax.scatter([1.0], [delta[(gi, 1)]], marker="x", s=18, color="#d62728")
    ax.axhline(result.contributions.full_delta, color="black", linestyle="--", linewidth=0.8,
               label="full update")
    ax.set_xlabel("ratio of input channels updated")
    ax.set_ylabel(f"held-out loss drop after {result.contributions.steps} steps")
    ax.set_title(title or "Which layers matter: loss drop vs update ratio per layer (x: biases/norms)", fontsize=9)
    if len(weights) <= 16:
        ax.legend(fontsize=6, ncol=2)
    fig.tight_layout()
    return fig


def cost_figure(result):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [("searched", result.cost), ("full", result.full), ("last layer", result.last)]
    labels = [r[0] for r in rows]
    fig, (a, b) = plt.subplots(1, 2, figsize=(8, 3.2))
    arena = [c["arena_bytes"] / MIB for _, c in rows]
    opt = [c["optimizer_state_bytes"] / MIB for _, c in rows]
    rest = [(c["state_bytes"] - c["optimizer_state_bytes"]) / MIB for _, c in rows]
    a.bar(labels, arena, label="arena", color="#2171b5")
    a.bar(labels, opt, bottom=arena, label="optimizer state", color="#fd8d3c")
    a.bar(labels, rest, bottom=[x + y for x, y in zip(arena, opt)], label="weights + buffers", color="#bdbdbd")
    if result.budget.memory_mb is not None:
        a.axhline(result.budget.memory_mb, color="#d62728", linestyle="--", linewidth=1, label="budget")
    a.set_ylabel("MiB")
    a.set_title("training memory", fontsize=9)
    a.legend(fontsize=7)
    b.bar(labels, [c["flops_per_step"] / 1e6 for _, c in rows], color="#41ab5d")
    if result.budget.flops is not None:
        b.axhline(result.budget.flops / 1e6, color="#d62728", linestyle="--", linewidth=1, label="budget")
        b.legend(fontsize=7)
    b.set_ylabel("MFLOP per step")
    b.set_title("compute", fontsize=9)
    fig.tight_layout()
    return fig


def _png(fig) -> bytes:
    import matplotlib.pyplot as plt
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    return buf.getvalue()


def _contrib_table(result) -> str:
    lines = ["| candidate | kind | " + " | ".join(f"x{r:g}" for r in (0.125, 0.25, 0.5, 1.0)) + " | chosen |",
             "|---|---|---|---|---|---|---|"]
    for gi, g in enumerate(result.groups):
        cells = []
        for r in (0.125, 0.25, 0.5, 1.0):
            o = g.ratios.index(r) + 1 if r in g.ratios else None
            cells.append(f"{result.contributions.delta[(gi, o)]:+.4f}" if o else "")
        chosen = f"x{g.ratios[result.scheme[gi] - 1]:g}" if result.scheme[gi] else ""
        lines.append(f"| {g.name} | {g.kind} | " + " | ".join(cells) + f" | {chosen} |")
    return "\n".join(lines)


def markdown(result, contrib_png: str, cost_png: str, sens_png: str | None = None) -> str:
    c = result.contributions
    return "\n".join([
        "# PockEngine update-scheme search", "",
        f"Budget: {result.budget.describe()}; seed {result.seed}; {c.steps} fine-tuning steps per candidate; "
        f"{result.compiles} schemes compiled for their costs.", "",
        f"Sample loss before fine-tuning {c.base_loss:.4f}; drop with the full update {c.full_delta:.4f}; "
        f"predicted drop of the searched scheme (sum of its candidates) {result.predicted_delta:.4f}.", "",
        f"Measured held-out loss drop of the searched scheme {result.measured_delta:.4f} after "
        f"{result.measured_steps or c.steps} steps (never below a fitting hand baseline's, same steps); search "
        f"{result.seconds:.1f} s{' (contributions from the cache)' if result.cached else ''}." if result.measured_delta
        is not None else f"Search {result.seconds:.1f} s.", "",
        "## Chosen scheme", "", "```python", "update = " + repr(result.update), "```", "",
        result.table(), "", f"![cost]({cost_png})", "",
        "## Contribution of each candidate", "", f"![contributions]({contrib_png})", "",
        _contrib_table(result), "",
        *(["## Which layers matter (sensitivity curves)", "", f"![sensitivity]({sens_png})", ""] if sens_png else [])])


def write_report(result, path) -> Path:
    """Write the report to path (.html: self-contained; .md: with two PNGs beside it)."""
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix not in (".html", ".htm", ".md"):
        raise PockError(f"search report must be .html or .md, got {str(path)!r}")
    path.parent.mkdir(parents=True, exist_ok=True)
    contrib, cost = _png(contribution_figure(result)), _png(cost_figure(result))
    sens = _png(sensitivity_figure(result))
    if suffix == ".md":
        cp, kp = path.with_name(path.stem + "_contrib.png"), path.with_name(path.stem + "_cost.png")
        sp = path.with_name(path.stem + "_sensitivity.png")
        cp.write_bytes(contrib)
        kp.write_bytes(cost)
        sp.write_bytes(sens)
        path.write_text(markdown(result, cp.name, kp.name, sp.name))
        return path
    uri = {k: "data:image/png;base64," + base64.b64encode(v).decode()
           for k, v in (("c", contrib), ("k", cost), ("s", sens))}
    body = html.escape(markdown(result, "CONTRIB", "COST", "SENS"))
    body = body.replace("![contributions](CONTRIB)", f'<img alt="contributions" src="{uri["c"]}">')
    body = body.replace("![cost](COST)", f'<img alt="cost" src="{uri["k"]}">')
    body = body.replace("![sensitivity](SENS)", f'<img alt="sensitivity" src="{uri["s"]}">')
    path.write_text("<!doctype html>\n<html><head><meta charset=\"utf-8\"><title>PockEngine scheme search</title>"
                    "<style>body{font-family:sans-serif;max-width:60em;margin:2em auto}pre{white-space:pre-wrap}"
                    "</style></head>\n<body><pre>" + body + "</pre></body></html>\n")
    return path
