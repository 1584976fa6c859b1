"""`python -m pockengine.federated simulate` end to end on the keyboard demo's real model,
tiny (3 users, 1 round, 2 local steps; Flower's server loop in-process), and its errors."""
import re
import sys
from pathlib import Path

import pytest

import pockengine as pe
from pockengine.federated.__main__ import main
from pockengine.federated.simulate import simulate

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "demo-apps"))  # the task's module (keyboard.sim.federated)

LINE = re.compile(r"^federated: 3 clients, 1 rounds, global held-out top-3 \d+\.\d% -> \d+\.\d%, "
                  r"upload (\d+) bytes/client/round \(full update (\d+)\)$")


def test_tiny_keyboard_federation(tmp_path, capsys):
    main(["simulate", "--task", "keyboard.sim.federated:task", "--clients", "3", "--rounds", "1", "--engine", "inprocess", "--local-steps", "2",
          "--personalize-steps", "1", "--held-tokens", "256", "--out", str(tmp_path)])
    lines = capsys.readouterr().out.strip().splitlines()
    m = LINE.match(lines[-1])
    assert m, lines[-1]
    assert int(m.group(1)) * 3 <= int(m.group(2))          # a sparse round uploads <= 1/3 of a full one
    assert "| 1 |" in lines[lines.index(next(s for s in lines if s.startswith("| round")))+ 3]
    assert (tmp_path / "federated_sparse_inprocess_3x1.png").stat().st_size > 10_000
    assert (tmp_path / "federated_sparse_inprocess_3x1.md").read_text().strip().endswith(lines[-1])


def test_bad_arguments_raise_pock_error():
    with pytest.raises(pe.PockError, match="engine"):
        simulate(clients=2, rounds=1, engine="carrier-pigeon")
    with pytest.raises(pe.PockError, match="rounds"):
        simulate(clients=2, rounds=0, engine="inprocess")
    with pytest.raises(SystemExit):
        main(["simulate", "--task", "keyboard.sim.federated:task", "--scheme", "half"])
    with pytest.raises(SystemExit):  # --task is required: pockengine.federated knows no demo
        main(["simulate"])
    with pytest.raises(pe.PockError, match="MODULE:FUNCTION"):
        main(["simulate", "--task", "keyboard.sim.federated"])
    with pytest.raises(pe.PockError, match="needs a Task"):
        simulate(clients=2, rounds=1, engine="inprocess")


def test_the_report_goes_to_the_current_directory_not_the_package():
    """The default --out is out/federated under the directory the command runs in (it wrote into the
    installed package's source tree before)."""
    from pockengine.federated.__main__ import build_parser
    out = build_parser().parse_args(["simulate", "--task", "keyboard.sim.federated:task"]).out
    assert out == "out/federated" and not out.startswith("/")
