"""build/package.py: one packaging path (split prefix -> emit -> .cpp -> summary -> compile ->
weights + bundle -> the target's files) for host, Android and iOS, and one load_trainer."""
import ast
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn

import pockengine as pe
from pockengine.build.package import Target, compile_library, load_trainer, package
from pockengine.runtime.bundle import read_bundle

ROOT = Path(__file__).resolve().parents[2]
PKG = ROOT / "toolchain" / "pockengine"


def small(**kw):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3))
    x, y = torch.randn(4, 6), torch.randint(0, 3, (4,))
    return pe.compile(model, x, y, loss="cross_entropy", update={"2.weight": 1.0}, name="pkg_small", **kw), x, y


def test_package_runs_every_stage_once_in_order(tmp_path):
    prog, _, _ = small()
    calls = []

    def compile_(step, source, cpp):
        calls.append("compile")
        assert cpp.read_text() == source.text and (cpp.parent / "summary.md").is_file()
        assert not (cpp.parent / "bundle").exists()  # the bundle follows the libraries
        return {"lib": cpp.with_suffix(".fake")}

    def layout(step, source, out, libraries, weights, bundle, prefix_entry):
        calls.append("layout")
        assert (bundle / "model.json").is_file() and prefix_entry is None and libraries == {"lib": out / "pkg_small.fake"}
        return {"weights": weights}

    files = package(prog, ["cpu"], Target("test", compile_, layout), tmp_path)
    assert calls == ["compile", "layout"]
    assert files["source"] == tmp_path / "pkg_small.cpp" and files["bundle"] == tmp_path / "bundle"
    assert files["source"].read_text() == prog.emit(["cpu"]).text  # the cached source, written once
    assert read_bundle(files["bundle"])["hash"] == prog.hash


def test_host_package_weights_equal_a_built_trainers_save(tmp_path):
    """The host target writes the initial weights without loading the library: the same bytes
    as the built trainer's save (what it wrote before)."""
    from pockengine.cli import build_host
    prog, _, _ = small()
    files = build_host(prog, tmp_path / "out")
    trainer = prog.build(out_dir=tmp_path / "b")
    trainer.save(str(tmp_path / "saved.pockckpt"))
    trainer.close()
    assert files["weights"].read_bytes() == (tmp_path / "saved.pockckpt").read_bytes()
    assert (tmp_path / "out" / "CMakeLists.txt").is_file() and files["library"].is_file()
    from pockengine.runtime.trainer import Trainer
    t = Trainer(str(files["library"]), str(files["weights"]))  # the packaged pair loads
    assert set(t.state_dict()) == set(prog.build(out_dir=tmp_path / "c").state_dict())
    t.close()


def test_load_trainer_takes_what_the_program_says(tmp_path):
    prog, x, y = small()
    source = prog.emit(["cpu"])
    lib = compile_library(prog, source, tmp_path)
    t = load_trainer(prog, lib, source)
    assert t.trained_names == list(prog.trained) and t.lora_adapters == {} and t.partition is None
    ref = prog.build(out_dir=tmp_path / "b")
    assert t.step(x, y) == ref.step(x, y)
    for k, v in ref.state_dict().items():
        assert np.array_equal(t.state_dict()[k], v), k


def _calls(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call):
            f = node.func
            names.add(f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else "")
    return names


def test_every_target_goes_through_package():
    """The sequence is written once: the host, Android and iOS entry points call package(), and
    none of them emits, writes the source or the bundle itself."""
    for module in ("cli.py", "platforms/android.py", "platforms/ios.py"):
        calls = _calls(PKG / module)
        assert "package" in calls, module
        assert not calls & {"write_bundle", "write_initial_checkpoint", "emit", "summary"}, module


def test_nothing_is_set_on_a_trainer_or_program_after_construction():
    """Constructors take what they need (issue 35): no `trainer.x = ...`, `prog.x = ...` or
    `prefix.x = ...` in the package."""
    for path in PKG.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Assign):
                for t in node.targets:
                    for e in (t.elts if isinstance(t, ast.Tuple) else [t]):
                        if isinstance(e, ast.Attribute) and isinstance(e.value, ast.Name):
                            assert e.value.id not in ("trainer", "prog", "prefix", "suffix") or \
                                e.attr == "learning_rate", f"{path.name}:{node.lineno} sets {e.value.id}.{e.attr}"
