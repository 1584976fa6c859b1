"""The federation's report: per-round table, per-user personalization table, plot."""
from __future__ import annotations

from pathlib import Path

import numpy as np


def rounds_table(result) -> str:
    rows = ["| round | global top-1 | global top-3 | mean local loss | clients | upload bytes/client | wall s |",
            "|---|---|---|---|---|---|---|"]
    for r in result.rounds_log:
        up = f"{np.mean(r.upload_bytes):,.0f}" if r.upload_bytes else "-"
        loss = f"{r.loss:.3f}" if r.round else "-"
        rows.append(f"| {r.round} | {r.top1:.1%} | {r.top3:.1%} | {loss} | {r.clients or '-'} | {up} | {r.seconds:.1f} |")
    return "\n".join(rows)


def users_table(result) -> str:
    rows = ["| user (document) | typed tokens | base top-3 | global top-3 | personalized top-3 |",
            "|---|---|---|---|---|"]
    for name, n, b, g, p in result.users:
        rows.append(f"| {name} | {n} | {b:.1%} | {g:.1%} | {p:.1%} |")
    b, g, p = (np.mean([u[i] for u in result.users]) for i in (2, 3, 4))
    rows.append(f"| **mean** | | {b:.1%} | {g:.1%} | {p:.1%} |")
    return "\n".join(rows)


def text(result) -> str:
    up = result.upload_per_client_round
    lines = [f"## Federated keyboard: {result.clients} clients, {result.rounds} rounds, {result.scheme} update, "
             f"Flower engine {result.engine}", "",
             f"trains {result.trained_elements:,} of {result.total_elements:,} parameters; upload "
             f"{up:,.0f} bytes/client/round = {up / result.full_upload_bytes:.1%} of a full update "
             f"({result.full_upload_bytes:,} bytes); wall time {result.wall_seconds:.1f}s", ""]
    if result.epsilon is not None:
        lines += [f"user-level DP: ({result.epsilon:.2f}, {result.delta:g})-DP (RDP accountant, "
                  "subsampled Gaussian)", ""]
    lines += [rounds_table(result), "", "Per user, on their own held-out sentences (personalized: "
              "local steps on top of the final global model):", "", users_table(result)]
    return "\n".join(lines)


def plot(result, path: Path) -> Path:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(11, 3.8))
    rs = [r.round for r in result.rounds_log]
    ax.plot(rs, [100 * r.top3 for r in result.rounds_log], marker="o", label="top-3")
    ax.plot(rs, [100 * r.top1 for r in result.rounds_log], marker=".", ls="--", label="top-1")
    ax.set_xlabel("federated round")
    ax.set_ylabel("global held-out accuracy (%)")
    ax.set_title(f"{result.clients} clients, {result.scheme} update "
                 f"({result.upload_per_client_round / 1e6:.2f} MB/client/round)")
    ax.legend(fontsize=8)
    names = [u[0] for u in result.users]
    x = np.arange(len(names))
    for i, (label, col) in enumerate([("base", 2), ("global", 3), ("personalized", 4)]):
        ax2.bar(x + (i - 1) * 0.27, [100 * u[col] for u in result.users], 0.27, label=label)
    ax2.set_xticks(x, names, rotation=45, ha="right", fontsize=7)
    ax2.set_ylabel("user's held-out top-3 (%)")
    ax2.set_title("Per user: base, global, personalized")
    ax2.legend(fontsize=8, loc="lower center", ncol=3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
