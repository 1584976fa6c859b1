"""python -m pockengine.federated simulate --task MODULE:FUNCTION --clients N --rounds R
[--scheme sparse|full] [--engine simulation|processes|inprocess]: federated personalization on
Flower (see pockengine/federated/__init__.py); the keyboard demo's task is
keyboard.sim.federated:task, run from the demo apps' folder. `client` is the entry of one client
process of `--engine processes` (started by the server side, not by hand)."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m pockengine.federated", description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("simulate", help="N simulated users, R rounds of federated averaging")
    s.add_argument("--task", required=True, metavar="MODULE:FUNCTION",
                   help="function(scheme) -> federated.simulate.Task: the model, tokenizer and evaluation "
                        "(the keyboard demo's: keyboard.sim.federated:task, run from the demo apps' folder)")
    s.add_argument("--clients", type=int, default=8)
    s.add_argument("--rounds", type=int, default=5)
    s.add_argument("--scheme", choices=("sparse", "full"), default="sparse")
    s.add_argument("--engine", choices=("simulation", "processes", "inprocess"), default="simulation",
                   help="simulation: Flower's simulation engine (Ray); processes: a Flower server and one "
                        "client process per user over gRPC on 127.0.0.1; inprocess: Flower's server loop "
                        "with the clients in this process (no Ray)")
    s.add_argument("--local-steps", type=int, default=20, help="compiled training steps per client per round")
    s.add_argument("--personalize-steps", type=int, default=30, help="local steps per user after the rounds")
    s.add_argument("--clients-per-round", type=int, default=None, help="sampled per round (default: all)")
    s.add_argument("--clip", type=float, default=None, help="user-level DP: clip each update to this L2 norm")
    s.add_argument("--noise", type=float, default=0.0, help="user-level DP: Gaussian noise multiplier")
    s.add_argument("--delta", type=float, default=1e-5)
    s.add_argument("--held-tokens", type=int, default=1200, help="held-out tokens per user in the global test set")
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--out", default=str(Path("out") / "federated"),
                   help="report directory (default: out/federated in the current directory)")
    c = sub.add_parser("client", help="one client process (started by --engine processes)")
    c.add_argument("--run-dir", required=True)
    c.add_argument("--user", type=int, required=True)
    c.add_argument("--server", required=True)
    c.add_argument("--timeout", type=float, default=600)
    return ap


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    if args.cmd == "client":
        from .flower import client_main
        client_main(args.run_dir, args.user, args.server, args.timeout)
        return 0
    from . import report
    from .simulate import load_task, simulate

    out = Path(args.out)
    result = simulate(load_task(args.task, args.scheme), clients=args.clients, rounds=args.rounds, scheme=args.scheme, engine=args.engine,
                      local_steps=args.local_steps, personalize_steps=args.personalize_steps,
                      clients_per_round=args.clients_per_round, clip=args.clip, noise_multiplier=args.noise,
                      delta=args.delta, seed=args.seed, held_tokens=args.held_tokens,
                      work_dir=out / f"work-{args.scheme}-{args.engine}")
    text = report.text(result)
    name = f"federated_{args.scheme}_{args.engine}_{args.clients}x{args.rounds}"
    (out / f"{name}.md").write_text(text + "\n\n" + result.summary() + "\n")
    png = report.plot(result, out / f"{name}.png")
    print("\n" + text + "\n")
    print(f"report: {out / (name + '.md')}, plot: {png}")
    print(result.summary())
    return 0


if __name__ == "__main__":
    sys.exit(main())
