"""The package stands alone: a non-editable `pip install .` into a fresh venv ships the
runtime sources and templates (codegen/) inside the package, and a model compiles and
trains from outside the checkout.  (Bounded: the wheel is built without isolation or
dependencies, and the venv reuses this environment's torch, numpy and jinja2.)"""
import os
import shutil
import site
import subprocess
import sys
import textwrap
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

EXAMPLE = textwrap.dedent('''
    import sys
    from pathlib import Path

    import numpy as np
    import torch
    import torch.nn as nn

    import pockengine as pe

    here = Path(pe.__file__).resolve().parent
    assert str(here).startswith(sys.prefix), (here, sys.prefix)  # the installed copy, not the checkout
    assert (here / "_native" / "runtime" / "include").is_dir() and not (here / "_native").is_symlink()

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    x, y = torch.randn(6, 8), torch.randint(0, 4, (6,))
    prog = pe.compile(model, example_inputs=(x,), example_targets=(y,), loss="cross_entropy",
                      update={"2.*": 1.0, "0.weight": 0.5}, optimizer=pe.SGD(lr=0.1, momentum=0.9))
    trainer = prog.build(target="host")
    losses = [trainer.step((x,), (y,)) for _ in range(30)]
    assert losses[-1] < 0.5 * losses[0], losses
    with torch.no_grad():
        before = model[0].bias.numpy().copy()
    assert np.array_equal(trainer.state_dict()["0.bias"], before)  # frozen
    trainer.save("ckpt.pock")
    print("trained", round(losses[0], 4), "->", round(losses[-1], 4), "from", here)
''')


def test_non_editable_install_compiles_and_trains(tmp_path):
    # a copy of what `pip install .` reads, so that its build files stay out of the checkout
    src = tmp_path / "src"
    src.mkdir()
    shutil.copy(ROOT / "pyproject.toml", src)
    shutil.copytree(ROOT / "toolchain", src / "toolchain", symlinks=True,
                    ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    shutil.copytree(ROOT / "native", src / "native")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "POCK_RUNTIME_DIR")}
    wheels = tmp_path / "wheels"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                    "-w", str(wheels), str(src)], check=True, env=env, cwd=tmp_path, timeout=300)
    (wheel,) = wheels.glob("pockengine-*.whl")

    env_dir = tmp_path / "venv"
    venv.EnvBuilder(system_site_packages=True, with_pip=False).create(env_dir)
    py = env_dir / "bin" / "python"
    purelib = subprocess.run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    # this environment's packages (torch, numpy, jinja2) after the venv's own: no editable pockengine,
    # since a path added by a .pth file has its own .pth files (the editable hook) left unread
    (Path(purelib) / "reuse.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    subprocess.run([sys.executable, "-m", "pip", "--python", str(py), "install", "--no-deps", "--no-index", "-q",
                    str(wheel)], check=True, env=env, cwd=tmp_path, timeout=300)
    shutil.rmtree(src)  # nothing may point back at the sources it was built from

    run = tmp_path / "user"
    run.mkdir()
    (run / "example.py").write_text(EXAMPLE)
    r = subprocess.run([py, "example.py"], cwd=run, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr[-4000:]
    assert "trained" in r.stdout and str(ROOT) not in r.stdout
    assert (run / "ckpt.pock").is_file()
