"""platforms/socs.py: a SoC's backends come from the backend registry (each backend's check_target)."""
import pockengine  # noqa: F401  (registers the built-in backends)
from pockengine.backends import Backend, Device, register, unregister
from pockengine.errors import PockError
from pockengine.platforms.socs import SOCS, get_soc


def test_soc_backends_are_the_registered_backends_whose_check_target_accepts_it():
    assert get_soc("sm8550").backends == ["vulkan", "htp", "cpu"]
    assert get_soc("generic-arm64").backends == ["cpu"]

    def needs_dsp(soc):
        if soc.name != "sm8750":
            raise PockError(f"{soc.name} has no dsp")

    register(Backend("dsp", Device(flops_per_s=1e12, dispatch_s=1e-6), check_target=needs_dsp))
    register(Backend("anywhere", Device(flops_per_s=1e12, dispatch_s=1e-6)))  # no check_target: no SoC lists it
    try:
        assert {name: soc.backends for name, soc in SOCS.items()} == {
            "sm8450": ["vulkan", "htp", "cpu"], "sm8550": ["vulkan", "htp", "cpu"], "sm8650": ["vulkan", "htp", "cpu"],
            "sm8750": ["vulkan", "htp", "dsp", "cpu"], "generic-arm64": ["cpu"]}
    finally:
        unregister("dsp")
        unregister("anywhere")
