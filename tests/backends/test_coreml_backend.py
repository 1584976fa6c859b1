"""The Core ML backend's registry record (backends/coreml.py): an inference-only prefix
backend for --platform ios, found by the registry like htp is for Android."""
import platform

import pytest
import torch

import pockengine as pe
from models import MODELS, batches
from pockengine.backends import check_backends, get, names, registered, split_roles
from pockengine.errors import PockError
from pockengine.platforms.ios import ios_backends
from pockengine.platforms.socs import SOCS, get_soc


def test_coreml_is_a_registered_prefix_backend():
    assert "coreml" in names() and names()[:3] == ["cpu", "vulkan", "htp"]
    coreml = get("coreml")
    assert coreml.role == "prefix" and coreml.inference_only
    assert coreml.split is not None and coreml.build_with is not None and coreml.export is not None
    assert coreml.platforms == ("ios",) and "ios" not in get("htp").platforms
    assert split_roles(check_backends(["coreml", "cpu"])) == (coreml, ["cpu"])
    with pytest.raises(PockError, match="one prefix backend|2 prefix backends"):
        split_roles(["coreml", "htp", "cpu"])
    coreml.check_target("ios")  # accepted
    with pytest.raises(PockError, match="Core ML on Apple devices .* sm8550 cannot run it"):
        coreml.check_target(get_soc("sm8550"))
    assert all("coreml" not in soc.backends for soc in SOCS.values())  # Android SoCs never list it
    prefixes = [b.name for b in registered() if b.role == "prefix"]
    assert prefixes[:2] == ["htp", "coreml"]


def test_ios_picks_prefix_backends_from_the_registry():
    assert ios_backends(None) == ["cpu"]
    assert ios_backends(None, coreml=True) == ["coreml", "cpu"]  # --coreml selects the registered backend
    assert ios_backends(["coreml", "cpu"], coreml=True) == ["coreml", "cpu"]
    with pytest.raises(PockError, match="--backends htp is not available on iOS"):
        ios_backends(["htp", "cpu"])
    with pytest.raises(PockError, match="--backends vulkan,htp are not available on iOS"):
        ios_backends(["vulkan", "htp", "cpu"])


def test_android_refuses_coreml(tmp_path):
    from pockengine.platforms.android import build_android
    with pytest.raises(PockError, match=r"optionally with the frozen prefix on htp; got --backends coreml,cpu"):
        build_android(None, tmp_path, soc="sm8550", backends=["coreml", "cpu"])


@pytest.mark.skipif(platform.system() == "Darwin", reason="coremltools runs the prefix on macOS")
def test_prog_build_names_where_coreml_runs(tmp_path):
    torch.manual_seed(0)
    x, y = batches("mlp")[0]
    prog = pe.compile(MODELS["mlp"](), x, y, optimizer=pe.SGD(lr=0.1), update={"net.4.*": 1.0})  # net.0 frozen
    with pytest.raises(PockError, match="Core ML, which runs only on Apple platforms.*--platform ios --coreml"):
        prog.build(backends=["coreml", "cpu"], out_dir=tmp_path)


def test_ai_hub_goes_through_the_registry(tmp_path):
    """pock-build --ai-hub uses the prefix backend's profile_remote hook (htp: Qualcomm AI Hub)."""
    from dataclasses import replace

    from pockengine.backends import register
    from pockengine.cli import submit_to_ai_hub
    assert get("htp").profile_remote is not None and get("coreml").profile_remote is None
    torch.manual_seed(0)
    x, y = batches("mlp")[0]
    prog = pe.compile(MODELS["mlp"](), x, y, optimizer=pe.SGD(lr=0.1), update={"net.4.*": 1.0})
    original, calls = get("htp"), []
    register(replace(original, profile_remote=lambda prefix, soc: calls.append((prefix.inputs[0]["name"], soc))
                     or {"compile_job": "c1", "profile_job": "p1"}), replace=True)
    try:
        submit_to_ai_hub(prog, "sm8650")
    finally:
        register(original, replace=True)
    assert calls == [(prog.graph.inputs[0].name, "sm8650")]
