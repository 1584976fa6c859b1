"""The Core ML backend: the frozen prefix on Apple's Core ML (ANE/GPU/CPU) in the iOS SDK.

    pock-build spec.py:make --platform ios --coreml        # = --backends coreml,cpu
    build_ios(prog, out, backends=["coreml", "cpu"])

Like "htp" it is an inference-only prefix backend: passes/prefix.py splits off the part of
the forward pass no gradient flows through, platforms/coreml.py converts it (torch.jit.trace
+ coremltools) to an ML Program (.mlpackage, fp16 by default) that the export hook writes
into the bundle's prefix/, and the compiled step takes the prefix's outputs as inputs.  The
Swift layer (sdk-ios) runs the package with Core ML before each step.

It builds for --platform ios only.  `prog.build(backends=["coreml", "cpu"])` runs the prefix
through coremltools' predict, which exists only on macOS; elsewhere it is a PockError
naming the way to ship it (pock-build --platform ios --coreml).
"""
from __future__ import annotations

import platform
import shutil
import subprocess
from pathlib import Path

import numpy as np

from ..errors import PockError
from ..build.prefix_stage import build_with_prefix
from ..passes.prefix import FrozenPrefix, split_prefix, torch_supports
from . import Backend, Device, register
from .prefix_torch import PrefixModule

TARGET = "ios"  # the one target it runs on: check_target("ios")


def _xcode() -> bool:
    return platform.system() == "Darwin" and shutil.which("xcodebuild") is not None


def export_coreml_prefix(prefix: FrozenPrefix, bundle_dir, target=None, name: str = "model",
                         fp16: bool = True) -> dict:
    """The prefix as bundle_dir/prefix/<name>_prefix.mlpackage (and .mlmodelc where Xcode
    can compile it); returns the bundle's manifest["prefix"]."""
    from ..platforms.coreml import export_mlpackage
    prefix_dir = Path(bundle_dir) / "prefix"
    prefix_dir.mkdir(parents=True, exist_ok=True)
    package = export_mlpackage(PrefixModule(prefix), prefix.example_inputs, prefix_dir / f"{name}_prefix.mlpackage",
                               [i["name"] for i in prefix.inputs], [o["name"] for o in prefix.outputs], fp16=fp16)
    compiled = None
    if _xcode():  # Core ML compiles at build time; otherwise the Swift layer compiles at first run
        subprocess.run(["xcrun", "coremlcompiler", "compile", str(package), str(prefix_dir)], check=True,
                       capture_output=True)
        compiled = f"prefix/{package.stem}.mlmodelc"
    entry = prefix.manifest(files={"coreml": f"prefix/{package.name}"}, precision="fp16" if fp16 else "fp32",
                            runtime="coreml")
    entry["coreml"] = {"path": f"prefix/{package.name}", "compiled": compiled, "fp16": fp16}  # read by Swift
    return entry


class CoremlRunner:
    """run(arrays) -> arrays: the exported ML Program through coremltools (macOS only)."""

    def __init__(self, prefix: FrozenPrefix, package: Path):
        from ..platforms.coreml import _coremltools
        self.prefix = prefix
        self.model = _coremltools().models.MLModel(str(package))
        self._in = [i["name"] for i in prefix.inputs]
        self._out = [o["name"] for o in prefix.outputs]

    def __call__(self, arrays):
        feeds = {n: np.ascontiguousarray(a, dtype=np.float32 if np.issubdtype(np.asarray(a).dtype, np.floating)
                                         else np.int32) for n, a in zip(self._in, arrays)}
        got = self.model.predict(feeds)
        return [np.asarray(got[n], dtype=np.float32) for n in self._out]


def build_with_coreml_prefix(prog, other_backends, out_dir=None, fp16: bool = True):
    """The step with its frozen prefix on Core ML and the rest on `other_backends` (macOS:
    coremltools runs the ML Program; elsewhere a PockError).  With no frozen prefix the
    step is built on the other backends alone (build/prefix_stage.build_with_prefix)."""
    def prepare(prefix):
        if platform.system() != "Darwin":
            raise PockError("the 'coreml' backend runs the frozen prefix with Core ML, which runs only on Apple "
                            f"platforms (this is {platform.system()}); ship it with `pock-build --platform ios "
                            "--coreml`, or use backends=['cpu'] here")
        import tempfile
        bundle = Path(out_dir) if out_dir is not None else Path(tempfile.mkdtemp(prefix="pock-coreml-"))
        manifest = export_coreml_prefix(prefix, bundle, name=prog.name, fp16=fp16)
        return CoremlRunner(prefix, bundle / manifest["coreml"]["path"]), manifest

    return build_with_prefix(prog, other_backends, out_dir, "coreml", prepare)


def _check_target(target) -> None:
    """Core ML runs on Apple devices: the target is "ios"; an Android SoC cannot run it."""
    if target != TARGET:
        what = getattr(target, "name", target)
        raise PockError(f"--backends coreml runs the frozen prefix with Core ML on Apple devices (--platform ios); "
                        f"{what} cannot run it")


__all__ = ["export_coreml_prefix", "build_with_coreml_prefix", "CoremlRunner"]

register(Backend(
    "coreml", Device(flops_per_s=1e12, dispatch_s=5e-6, handover_s=300e-6),
    role="prefix", inference_only=True,
    supports=torch_supports,  # what the prefix's torch module (traced for coremltools) runs: the partitioner's rule
    split=lambda prog: split_prefix(prog, "coreml"), build_with=build_with_coreml_prefix, check_target=_check_target,
    export=export_coreml_prefix, platforms=(TARGET,),
    doc="the frozen forward prefix on Apple's Core ML (an ML Program in the iOS bundle)"))
