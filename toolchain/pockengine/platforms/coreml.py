"""The frozen prefix as a Core ML ML Program (.mlpackage), for the iOS SDK.

The part of the forward pass that no gradient flows through (an embedding
lookup, a frozen backbone) runs on Core ML (ANE/GPU/CPU) in the Swift layer;
the compiled C++ step then takes the prefix's outputs as its inputs.

    export_mlpackage(module, example_inputs, "prefix.mlpackage",
                     input_names=["tokens"], output_names=["emb"], fp16=True)
    io = mlpackage_io("prefix.mlpackage")            # {"inputs": [...], "outputs": [...]}
    weights = mlpackage_weights("prefix.mlpackage")  # {const name: numpy array}

The module is traced with torch.jit.trace (in eval mode) and converted with
coremltools to an ML Program for iOS 15; fp16=True stores weights and
computes in float16 (inputs and outputs stay float32 / int32).  coremltools
cannot run a model off macOS, so on Linux the export is checked by reading
the package back (spec and weights).
"""
from __future__ import annotations

import contextlib
import io
import shutil
import warnings
from pathlib import Path

import numpy as np
import torch

from ..errors import PockError

MIN_IOS = "iOS15"
_DTYPES = {65568: "float32", 65552: "float16", 131104: "int32", 65600: "float64"}  # ArrayFeatureType codes


def _coremltools():
    try:
        with contextlib.redirect_stderr(io.StringIO()):  # "Failed to load libcoremlpython" off macOS
            import coremltools as ct
    except ImportError:
        raise PockError("--coreml needs coremltools (pip install coremltools==9.0)") from None
    return ct


def export_mlpackage(module: torch.nn.Module, example_inputs, path, input_names, output_names,
                     fp16: bool = False) -> Path:
    """Convert module (called as module(*example_inputs)) to an .mlpackage at path.

    Integer inputs become int32 (Core ML has no int64 inputs); shapes are the
    example shapes, fixed like the compiled step's."""
    ct = _coremltools()
    example_inputs = tuple(example_inputs)
    if len(input_names) != len(example_inputs):
        raise PockError(f"export_mlpackage: {len(example_inputs)} example inputs but input names {input_names}")
    was_training = module.training
    module.eval()
    try:
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # torch.jit.trace: coremltools' way in
            outputs = module(*example_inputs)
            n_out = len(outputs) if isinstance(outputs, (tuple, list)) else 1
            if n_out != len(output_names):
                raise PockError(f"export_mlpackage: the module returns {n_out} outputs but output names "
                                f"{output_names}")
            traced = torch.jit.trace(module, example_inputs)
    finally:
        module.train(was_training)
    inputs = [ct.TensorType(name=n, shape=tuple(x.shape),
                            dtype=np.float32 if x.is_floating_point() else np.int32)
              for n, x in zip(input_names, example_inputs)]
    with contextlib.redirect_stderr(io.StringIO()), warnings.catch_warnings():  # progress bars
        warnings.simplefilter("ignore", DeprecationWarning)
        model = ct.convert(traced, inputs=inputs, outputs=[ct.TensorType(name=n) for n in output_names],
                           convert_to="mlprogram", minimum_deployment_target=getattr(ct.target, MIN_IOS),
                           compute_precision=ct.precision.FLOAT16 if fp16 else ct.precision.FLOAT32)
    path = Path(path)
    tmp = path.with_name(f".tmp-{path.name}")  # coremltools wants the suffix
    shutil.rmtree(tmp, ignore_errors=True)
    model.save(str(tmp))
    shutil.rmtree(path, ignore_errors=True)
    tmp.rename(path)
    return path


def mlpackage_io(path) -> dict:
    """{"inputs": [...], "outputs": [...]}: each {name, shape, dtype} as the spec declares them
    (an output's shape is [] when Core ML leaves it to be inferred)."""
    ct = _coremltools()
    spec = ct.utils.load_spec(str(path))

    def describe(features):
        return [{"name": f.name, "shape": [int(s) for s in f.type.multiArrayType.shape],
                 "dtype": _DTYPES.get(f.type.multiArrayType.dataType, str(f.type.multiArrayType.dataType))}
                for f in features]
    return {"inputs": describe(spec.description.input), "outputs": describe(spec.description.output),
            "spec_version": spec.specificationVersion, "kind": spec.WhichOneof("Type")}


def mlpackage_weights(path) -> dict[str, np.ndarray]:
    """Every constant tensor of the ML Program read back from its weight file, by name."""
    ct = _coremltools()
    from coremltools.optimize.coreml import get_weights_metadata
    model = ct.models.MLModel(str(path), skip_model_load=True)
    with contextlib.redirect_stderr(io.StringIO()):
        meta = get_weights_metadata(model, weight_threshold=0)
    return {name: np.asarray(m.val) for name, m in meta.items()}
