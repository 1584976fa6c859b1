"""build/host.py's options are explicit arguments, not module globals: the model TU's
optimisation level (model_opt, default MODEL_OPT = -O1) and the native/runtime tree a library
is built against (runtime, default runtime_dir(): the package's, or $POCK_RUNTIME_DIR)."""
import shutil

import pytest

import pockengine as pe
from pockengine.build import host


def _commands(monkeypatch):
    seen = []
    real = host._run
    monkeypatch.setattr(host, "_run", lambda cmd, what: (seen.append(list(cmd)), real(cmd, what))[1])
    return seen


def test_model_opt_and_runtime_are_arguments(tmp_path, monkeypatch):
    seen = _commands(monkeypatch)
    rt = shutil.copytree(host.runtime_dir(), tmp_path / "runtime")  # another tree, the same contents
    src = tmp_path / "m.cpp"
    src.write_text('#include "pock_model.h"\nint pock_opt_probe() { return 2; }\n')
    try:
        host.build_shared_library([src], tmp_path / "out", kernels=False, model_opt="-O3", runtime=rt)
    except pe.PockError:
        pass  # no pock_compiled_model: the link may fail; the compile commands are what is checked
    model_cmd = next(c for c in seen if str(src) in c)
    assert "-O3" in model_cmd and host.MODEL_OPT not in model_cmd
    assert str(rt / "include") in model_cmd and str(host.runtime_dir() / "include") not in model_cmd
    # the runtime objects are keyed by content (the tree as <runtime>): this tree reuses the cached ones
    assert not any(str(host.runtime_dir()) in " ".join(c) for c in seen)
    assert host.MODEL_OPT == "-O1"  # the default, untouched by the call
    assert host.model_flags(("-O3", "-fPIC")) == ("-O1", "-fPIC")
    assert host.runtime_sources(False, rt)[0].parent == rt


def test_a_bad_model_opt_is_named(tmp_path):
    src = tmp_path / "m.cpp"
    src.write_text("int x;\n")
    with pytest.raises(pe.PockError, match="model_opt must be one of .*got '-O9; rm'"):
        host.build_shared_library([src], tmp_path / "out", kernels=False, model_opt="-O9; rm")


def test_march_is_an_argument_over_the_environment(tmp_path, monkeypatch):
    """march= (a bench's x86-64-v3 build on an AVX-512 machine) wins over $POCK_MARCH for that
    build alone; a bad value is a PockError naming the argument."""
    monkeypatch.setenv(host.MARCH_ENV, "native")
    assert host.march_flags() == ("-march=native",)
    assert host.march_flags("x86-64-v3") == ("-march=x86-64-v3",)
    seen = _commands(monkeypatch)
    src = tmp_path / "m.cpp"
    src.write_text('#include "pock_model.h"\nint pock_march_probe() { return 3; }\n')
    try:
        host.build_shared_library([src], tmp_path / "out", kernels=False, march="x86-64-v3")
    except pe.PockError:
        pass  # no pock_compiled_model: the link may fail; the compile commands are what is checked
    model_cmd = next(c for c in seen if str(src) in c)
    assert "-march=x86-64-v3" in model_cmd and "-march=native" not in model_cmd
    with pytest.raises(pe.PockError, match=r"march='x86; rm'"):
        host.march_flags("x86; rm")
    monkeypatch.setenv(host.MARCH_ENV, "x86 64")
    with pytest.raises(pe.PockError, match=host.MARCH_ENV):
        host.march_flags()
