"""The frozen prefix as an ONNX model: float (run in fp16 by the HTP) or QDQ int8.

    path = export_onnx(prefix, "prefix.onnx")                                   # float32 graph
    path = export_onnx(prefix, "prefix_int8.onnx", precision="int8",
                       calibration=[(x0,), (x1,)])                              # QDQ, calibrated

Float models stay float32 in the file: QNN's HTP runs them in fp16 when the
session asks for it (`enable_htp_fp16_precision`), which is the documented
way to get fp16 on the HTP.  The int8 model is quantised with ONNX Runtime's
QNN QDQ recipe (uint8 activations and weights, min/max calibration over the
sample inputs the user gives; the prefix's random example inputs otherwise).
"""
from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import torch

from ..errors import PockError
from .prefix_torch import PrefixModule

OPSET = 17
PRECISIONS = ("fp16", "int8")


def export_onnx(prefix, path, precision: str = "fp16", calibration=None) -> Path:
    """Write the prefix's ONNX model to `path` (QDQ-quantised when precision is int8)."""
    if precision not in PRECISIONS:
        raise PockError(f"HTP precision must be one of {list(PRECISIONS)}, got {precision!r}")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    float_path = path if precision == "fp16" else path.with_name(path.stem + "_float.onnx")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.onnx.export(PrefixModule(prefix), prefix.example_inputs, str(float_path), dynamo=False,
                              opset_version=OPSET, input_names=[i["name"] for i in prefix.inputs],
                              output_names=[o["name"] for o in prefix.outputs], do_constant_folding=True)
    except Exception as e:  # torch raises many types; the user needs the reason
        raise PockError(f"ONNX export of the frozen prefix failed: {type(e).__name__}: {e}") from e
    if precision == "int8":
        _quantize_qdq(prefix, float_path, path, calibration)
    return path


class _Reader:
    """onnxruntime.quantization.CalibrationDataReader over a list of input tuples."""

    def __init__(self, names, samples):
        self._items = iter([dict(zip(names, s)) for s in samples])

    def get_next(self):
        return next(self._items, None)

    def rewind(self):  # pragma: no cover - ORT calls it only for some calibrators
        pass


def calibration_arrays(prefix, calibration) -> list[list[np.ndarray]]:
    """The prefix inputs of each calibration sample (model inputs -> the ones the prefix reads)."""
    if calibration is None:
        samples = [prefix.random_inputs(seed) for seed in range(8)]
        return [[t.numpy() for t in s] for s in samples]
    out = []
    for i, sample in enumerate(calibration):
        seq = list(sample) if isinstance(sample, (tuple, list)) else [sample]
        n_model = len(prefix.graph.inputs)
        if len(seq) == n_model and n_model != len(prefix.inputs):
            seq = [seq[k] for k in prefix.input_index]
        if len(seq) != len(prefix.inputs):
            raise PockError(f"calibration sample {i} has {len(seq)} tensors; the prefix reads "
                            f"{[io['name'] for io in prefix.inputs]}")
        arrays = []
        for t, io in zip(seq, prefix.inputs):
            a = t.detach().cpu().numpy() if isinstance(t, torch.Tensor) else np.asarray(t)
            if list(a.shape) != io["shape"]:
                raise PockError(f"calibration sample {i}: {io['name']!r} has shape {list(a.shape)}, "
                                f"expected {io['shape']}")
            arrays.append(a)
        out.append(arrays)
    if not out:
        raise PockError("calibration needs at least one sample input")
    return out


def _quantize_qdq(prefix, float_path: Path, path: Path, calibration) -> None:
    try:
        from onnxruntime.quantization import quantize
        from onnxruntime.quantization.execution_providers.qnn import get_qnn_qdq_config, qnn_preprocess_model
    except ImportError as e:
        raise PockError(f"int8 HTP prefixes need onnxruntime's quantization tools ({e})") from None
    pre = path.with_name(path.stem + "_pre.onnx")
    source = pre if qnn_preprocess_model(str(float_path), str(pre)) else float_path
    names = [i["name"] for i in prefix.inputs]
    config = get_qnn_qdq_config(str(source), _Reader(names, calibration_arrays(prefix, calibration)))
    try:
        quantize(str(source), str(path), config)
    except Exception as e:  # noqa: BLE001 - ORT's quantiser raises anything
        raise PockError(f"QDQ int8 quantisation of the frozen prefix failed: {type(e).__name__}: {e}") from e
    finally:
        pre.unlink(missing_ok=True)
