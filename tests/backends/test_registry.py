"""The backend registry (backends/__init__.py): the built-ins register themselves, a
backend registered from outside the package shows up in every dispatch (backend checks,
the partitioner's candidates and cost model, emit and build), and bad names are named."""
import numpy as np
import pytest
import torch

import pockengine as pe
from models import MODELS, batches
from pockengine.backends import (ALWAYS, Backend, Device, check_backends, get, names, register, registered,
                                 split_roles, step_backend, unregister)
from pockengine.codegen import Source, emit_cpu
from pockengine.errors import PockError
from pockengine.passes.partition import CostModel, partition
from pockengine.compiler.program import build


def mlp():
    torch.manual_seed(0)
    return pe.compile(MODELS["mlp"](), *batches("mlp")[0], optimizer=pe.SGD(lr=0.1))


def test_builtins_are_registered():
    assert names()[:3] == ["cpu", "vulkan", "htp"]
    assert get("cpu").supports is None  # every op
    # its step is rendered through its own record like every step backend's (issue 35 finding 3: it was emit=None)
    assert get("cpu").emit is not None and get("cpu").emit(mlp()).backends == ("cpu",)
    assert get("vulkan").role == "step" and get("vulkan").emit is not None and get("vulkan").open is not None
    htp = get("htp")
    assert htp.role == "prefix" and htp.inference_only and htp.split is not None and htp.export is not None
    assert "android" in htp.platforms and "android" not in get("vulkan").platforms
    assert set(CostModel().devices) >= {"cpu", "vulkan", "htp"}  # the partitioner's devices come from here


def test_unknown_backend_names_the_registered_ones():
    with pytest.raises(PockError, match=r"unknown backend\(s\) \['tpu'\]; PockEngine has \['cpu', 'vulkan', 'htp'"):
        check_backends(["cpu", "tpu"])
    with pytest.raises(PockError, match=r"unknown backend 'tpu'; PockEngine has \['cpu', 'vulkan', 'htp'"):
        get("tpu")
    with pytest.raises(PockError, match="unknown backend"):
        mlp().build(backends=["tpu", "cpu"])
    with pytest.raises(PockError, match="must include 'cpu'"):
        check_backends(["vulkan"])
    with pytest.raises(PockError, match="name one twice"):
        check_backends(["cpu", "cpu"])


def test_bad_records_are_refused():
    with pytest.raises(PockError, match="already registered"):
        register(Backend("cpu", Device(1e9, 1e-6)))
    with pytest.raises(PockError, match="prefix backend needs split and build_with"):
        Backend("npu", Device(1e9, 1e-6), role="prefix")
    with pytest.raises(PockError, match="role must be"):
        Backend("npu", Device(1e9, 1e-6), role="suffix")
    with pytest.raises(PockError, match="cannot be unregistered"):
        unregister(ALWAYS)
    with pytest.raises(PockError, match="takes a Backend record"):
        register("toy")


@pytest.fixture
def toy():
    """A step backend that "runs" linear layers: its emitter partitions the step over
    (toy, cpu) with the registry's supports and devices, and renders the all-CPU code; its
    build hook records the call and builds that code for the host."""
    calls = []

    def emit(prog, cost=None):
        part = partition(prog.order, prog.graph, ["toy", "cpu"], cost=cost, prefer=None if cost else "toy")
        cpu = emit_cpu(prog)
        calls.append("emit")
        return Source(cpu.text, cpu.hash, ("toy", "cpu"), part)

    def build_hook(prog, source, out_dir=None):
        calls.append("build")
        return build(prog, prog.emit(["cpu"]), out_dir)

    backend = register(Backend("toy", Device(flops_per_s=1e15, dispatch_s=1e-9), supports=lambda n: n.op == "linear",
                               emit=emit, build=build_hook))
    yield backend, calls
    unregister("toy")
    assert "toy" not in names()


def test_a_registered_backend_shows_up_in_dispatch(toy, tmp_path):
    backend, calls = toy
    assert names()[-1] == "toy" and registered()[-1] is backend
    assert check_backends(["toy", "cpu"]) == ["toy", "cpu"]
    assert split_roles(["toy", "cpu"]) == (None, ["toy", "cpu"])
    assert step_backend(["cpu", "toy"]) is backend
    with pytest.raises(PockError, match="one accelerator"):
        step_backend(["toy", "vulkan", "cpu"])
    assert CostModel().devices["toy"] == backend.device

    prog = mlp()
    source = prog.emit(["toy", "cpu"])
    assert source.backends == ("toy", "cpu") and calls == ["emit"]
    assert prog.emit(["toy", "cpu"]) is source  # cached per backend set
    on_toy = [n.op for n in source.partition.nodes_on("toy")]
    assert on_toy and set(on_toy) == {"linear"}
    assert len(on_toy) == sum(n.op == "linear" for n in prog.order)

    trainer = prog.build(backends=["toy", "cpu"], out_dir=tmp_path)
    assert calls == ["emit", "build"]
    reference = mlp().build(out_dir=tmp_path / "cpu")
    for x, y in batches("mlp"):
        assert trainer.step(*x, *y) == reference.step(*x, *y)
    for name, value in reference.state_dict().items():
        assert np.array_equal(trainer.state_dict()[name], value)


def test_platforms_come_from_the_registry(tmp_path):
    from pockengine.platforms.android import build_android
    with pytest.raises(PockError, match=r"optionally with the frozen prefix on htp; got --backends vulkan,cpu "
                                        r"\(vulkan on Android is not wired"):
        build_android(None, tmp_path, backends=["vulkan", "cpu"])
    with pytest.raises(PockError, match="--backends htp needs a SoC with a Hexagon HTP; generic-arm64 has none"):
        build_android(None, tmp_path, soc="generic-arm64", backends=["htp", "cpu"])
    with pytest.raises(PockError, match="unknown backend"):
        build_android(None, tmp_path, backends=["tpu", "cpu"])


def test_one_trainer_class_with_a_device_hook(tmp_path):
    """Backends open their device through Trainer's open_device hook (Backend.open); there
    is no per-backend Trainer subclass."""
    from pockengine.backends.vulkan import VulkanTrainer, open_backend
    from pockengine.runtime.trainer import Trainer
    assert get("vulkan").open is open_backend and callable(VulkanTrainer)
    lib = mlp().build(out_dir=tmp_path).lib_path
    opened = []
    t = Trainer(lib, open_device=opened.append)
    assert opened == [lib] and t.describe_partition() == "" and t.partition is None
    t.close()

    def no_device(path):
        raise PockError("no device here")
    with pytest.raises(PockError, match="no device here"):
        Trainer(lib, open_device=no_device)
