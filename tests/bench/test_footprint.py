"""bench/footprint.py's command line: --steps below 2 is refused up front (the first step is an
untimed warm-up, so one step leaves no step time: the budgeted-vs-unbudgeted ratio divided by zero)."""
import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("pock_bench_footprint_cli", ROOT / "bench" / "footprint.py")
footprint = importlib.util.module_from_spec(spec)
spec.loader.exec_module(footprint)


@pytest.mark.parametrize("steps", ["1", "0", "-3"])
def test_fewer_than_two_steps_is_refused(steps, tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        footprint.main(["--steps", steps, "--out", str(tmp_path / "r.md"), "--no-torch"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert f"--steps must be at least 2, got {steps}" in err and "not timed" in err
    assert not (tmp_path / "r.md").exists()  # refused before anything was measured or written
