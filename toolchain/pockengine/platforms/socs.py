"""The SoC table behind `pock-build --soc`: what PockEngine needs to know about a
phone chip to build for it and to split work across its CPU, GPU and NPU.

    soc = get_soc("sm8550")   # unknown names raise PockError listing the known

Fields:
  abi          Android ABI of the natives
  march        -march for the C++ kernels (the big cores' ISA)
  features     CPU extensions the kernels may use (dotprod, fp16, i8mm, sve2)
  big_cores    performance cores: the default thread-pool size
  htp_arch     Hexagon Tensor Processor version for QNN's `htp_arch` (None: no HTP)
  qnn_soc_model  QNN's SoC id for offline context binaries (`soc_model`)
  gpu, vulkan  the GPU and the Vulkan version its driver exposes
"""
from __future__ import annotations

from dataclasses import dataclass

from ..errors import PockError


@dataclass(frozen=True)
class Soc:
    name: str
    marketing: str
    abi: str
    march: str
    features: tuple[str, ...]
    big_cores: int
    htp_arch: int | None
    qnn_soc_model: int | None
    gpu: str | None
    vulkan: str | None

    @property
    def backends(self) -> list[str]:
        """The backends a step built for this SoC may use, CPU last: from the registry
        (backends/), each one with a check_target that accepts this SoC, in registration order."""
        from ..backends import ALWAYS, registered

        def fits(b) -> bool:
            try:
                b.check_target(self)
            except PockError:
                return False
            return True

        return [b.name for b in registered() if b.name != ALWAYS and b.check_target is not None and fits(b)] + [ALWAYS]


_SOCS = [
    # 1x Cortex-X2 + 3x A710 performance cores; Hexagon v69
    Soc("sm8450", "Snapdragon 8 Gen 1", "arm64-v8a", "armv9-a+dotprod+fp16+i8mm",
        ("dotprod", "fp16", "i8mm"), 4, 69, 36, "Adreno 730", "1.1"),
    # 1x Cortex-X3 + 2x A715 + 2x A710; Hexagon v73
    Soc("sm8550", "Snapdragon 8 Gen 2", "arm64-v8a", "armv9-a+dotprod+fp16+i8mm",
        ("dotprod", "fp16", "i8mm"), 5, 73, 43, "Adreno 740", "1.3"),
    # 1x Cortex-X4 + 3x A720 + 2x A720; Hexagon v75
    Soc("sm8650", "Snapdragon 8 Gen 3", "arm64-v8a", "armv9.2-a+dotprod+fp16+i8mm",
        ("dotprod", "fp16", "i8mm"), 6, 75, 57, "Adreno 750", "1.3"),
    # 2x Oryon prime + 6x Oryon performance; Hexagon v79
    Soc("sm8750", "Snapdragon 8 Elite", "arm64-v8a", "armv8.7-a+dotprod+fp16+i8mm",
        ("dotprod", "fp16", "i8mm"), 8, 79, 69, "Adreno 830", "1.3"),
    # any ARMv8.2 phone: NEON + dotprod + fp16, no NPU or GPU assumed
    Soc("generic-arm64", "any arm64 Android device (ARMv8.2-A)", "arm64-v8a", "armv8.2-a+dotprod+fp16",
        ("dotprod", "fp16"), 4, None, None, None, None),
]
SOCS: dict[str, Soc] = {s.name: s for s in _SOCS}


def get_soc(name: str) -> Soc:
    """The table entry for `name` (case-insensitive)."""
    soc = SOCS.get(str(name).lower())
    if soc is None:
        raise PockError(f"unknown SoC {name!r}; known: {', '.join(SOCS)}")
    return soc
