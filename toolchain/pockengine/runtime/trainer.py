"""Trainer: one compiled model's shared library (the C API of pock.h) over ctypes.

    trainer = Trainer("libmodel.so")            # all-zero state
    trainer = Trainer("libmodel.so", "w.ckpt")  # state from a checkpoint
    loss = trainer.step((x,), (y,))
    out = trainer.forward((x,))

Inputs may be torch tensors (shared with numpy, no copy, when on the CPU and
contiguous), numpy arrays, or Python numbers/lists.  Arrays and tensors must
have exactly the compiled shape and dtype: a float64 array for a float32 input
is an error, never a silent cast.  Every failure raises PockError.
"""
from __future__ import annotations

import ctypes
import os
import sys
import threading
import time
from collections import namedtuple
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from ..errors import PockError
from .handle import NativeHandle, bind, check

_MAX_DIMS = 8
_DTYPES = {0: np.dtype(np.float32), 1: np.dtype(np.int64), 2: np.dtype(np.int32), 3: np.dtype(np.uint8),
           4: np.dtype(np.uint16), 5: np.dtype(np.float16), 6: np.dtype(np.int8)}  # 4: bf16 bits
_KINDS = {0: "param", 1: "buffer", 2: "optimizer_state", 3: "constant"}
_INPUTS, _TARGETS, _OUTPUTS = 0, 1, 2
_ERR_NONFINITE = 11  # pock.h: the non-finite guard skipped the step's update
_ERR_NO_TARGETS = 12  # pock.h: every class target was the ignore index; the step was skipped
_MAX_THREADS = 1024

IOInfo = namedtuple("IOInfo", "name dtype shape")
TensorInfo = namedtuple("TensorInfo", "name kind dtype shape")  # kind: "param" | "buffer" | ...


class _Tensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("dtype", ctypes.c_int32), ("ndim", ctypes.c_int32),
                ("shape", ctypes.POINTER(ctypes.c_int64))]


class _Buffer(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("nbytes", ctypes.c_int64)]


class _Info(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("dtype", ctypes.c_int32), ("ndim", ctypes.c_int32),
                ("shape", ctypes.c_int64 * _MAX_DIMS), ("nbytes", ctypes.c_int64), ("kind", ctypes.c_int32)]


_h, _i32, _i64, _str, _vp = ctypes.c_void_p, ctypes.c_int32, ctypes.c_int64, ctypes.c_char_p, ctypes.c_void_p
_SIGNATURES = {
    "pock_last_error": (_str, []),
    "pock_version": (_str, []),
    "pock_model_name": (_str, []),
    "pock_model_hash": (_str, []),
    "pock_open": (_i32, [_str, ctypes.POINTER(_h)]),
    "pock_close": (None, [_h]),
    "pock_io_count": (_i32, [_i32]),
    "pock_io_info": (_i32, [_i32, _i32, ctypes.POINTER(_Info)]),
    "pock_tensor_count": (_i32, []),
    "pock_tensor_info_at": (_i32, [_i32, ctypes.POINTER(_Info)]),
    "pock_step": (_i32, [_h, ctypes.POINTER(_Tensor), _i32, ctypes.POINTER(_Tensor), _i32,
                         ctypes.POINTER(ctypes.c_float)]),
    "pock_forward": (_i32, [_h, ctypes.POINTER(_Tensor), _i32, ctypes.POINTER(_Buffer), _i32]),
    "pock_get_tensor": (_i32, [_h, _str, _vp, _i64]),
    "pock_set_tensor": (_i32, [_h, _str, _vp, _i64]),
    "pock_save": (_i32, [_h, _str]),
    "pock_load": (_i32, [_h, _str]),
    "pock_set_learning_rate": (_i32, [_h, ctypes.c_float]),
    "pock_get_learning_rate": (_i32, [_h, ctypes.POINTER(ctypes.c_float)]),
    "pock_step_count": (_i32, [_h, ctypes.POINTER(ctypes.c_int64)]),
    "pock_set_num_threads": (_i32, [_h, _i32]),
}


class _NodeProfile(ctypes.Structure):
    _fields_ = [("index", ctypes.c_int32), ("phase", ctypes.c_char_p), ("op", ctypes.c_char_p),
                ("kernel", ctypes.c_char_p), ("module", ctypes.c_char_p), ("flops", ctypes.c_int64),
                ("steps", ctypes.c_int64), ("total_ns", ctypes.c_int64)]


# Bound when present: libraries built before the profiler lack them.
_OPTIONAL_SIGNATURES = {
    "pock_profile_enable": (_i32, [_h, _i32]),
    "pock_profile_reset": (_i32, [_h]),
    "pock_profile_count": (_i32, [_h]),
    "pock_profile_entry": (_i32, [_h, _i32, ctypes.POINTER(_NodeProfile)]),
}
_LIBS: dict[str, ctypes.CDLL] = {}
_LIBS_LOCK = threading.Lock()


def _load_library(path) -> ctypes.CDLL:
    key = os.path.realpath(os.fspath(path))
    with _LIBS_LOCK:
        lib = _LIBS.get(key)
        if lib is None:
            try:
                lib = ctypes.CDLL(key)
            except OSError as e:
                raise PockError(f"cannot load model library {os.fspath(path)!r}: {e}") from None
            bind(lib, _SIGNATURES, missing=lambda name: PockError(
                f"{os.fspath(path)!r} is not a PockEngine model library (no {name})"))
            bind(lib, _OPTIONAL_SIGNATURES, optional=True)
            _LIBS[key] = lib
        return lib


def _describe(shape: Sequence[int], dtype) -> str:
    return f"{tuple(shape)} {np.dtype(dtype).name}"


def _from_torch(value, label: str) -> np.ndarray | None:
    """A CPU numpy view of a torch tensor (None if value is not one)."""
    torch = sys.modules.get("torch")
    if torch is None or not isinstance(value, torch.Tensor):
        return None
    t = value.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    try:
        return t.resolve_conj().resolve_neg().numpy()
    except (TypeError, RuntimeError):  # e.g. bfloat16: numpy has no such dtype
        raise PockError(f"{label}: {str(t.dtype).replace('torch.', '')} tensors are not supported "
                        f"(got shape {tuple(t.shape)})") from None


def _input_array(value, label: str, io: IOInfo) -> np.ndarray:
    """value as a C-contiguous array of exactly io's shape and dtype."""
    arr = _from_torch(value, label)
    if arr is None:
        if isinstance(value, np.ndarray):
            arr = value
        elif isinstance(value, (int, float, list, tuple)) and not isinstance(value, bool):
            # Python numbers carry no width: take the compiled one where the kind fits.
            arr = np.asarray(value)
            if (arr.dtype.kind in "iu" and io.dtype.kind in "iuf") or (arr.dtype.kind == "f" and io.dtype.kind == "f"):
                arr = arr.astype(io.dtype)
        else:
            raise PockError(f"{label}: expected an array or tensor of shape {_describe(io.shape, io.dtype)}, "
                            f"got {type(value).__name__}")
    if arr.dtype != io.dtype and arr.dtype.newbyteorder("=") == io.dtype:
        arr = arr.astype(io.dtype)  # a big-endian (or other non-native order) array: same values, native order
    if arr.shape != io.shape or arr.dtype != io.dtype:
        raise PockError(f"{label}: expected shape {_describe(io.shape, io.dtype)}, "
                        f"got {_describe(arr.shape, arr.dtype)}")
    return np.ascontiguousarray(arr)


def _c_path(path, what: str) -> bytes:
    """path as bytes for the C API, which would silently cut it at a NUL."""
    try:
        b = os.fsencode(os.fspath(path))
    except TypeError:
        raise PockError(f"{what}: expected a path, got {type(path).__name__}") from None
    if b"\0" in b:
        raise PockError(f"{what} {os.fsdecode(b)!r} holds a NUL byte")
    if not b:
        raise PockError(f"{what} is empty")
    return b


def _state_array(value, name: str, info: TensorInfo) -> np.ndarray:
    """value for state tensor `info`: like torch's load_state_dict, a float
    tensor takes any real numbers and an integer one any integers."""
    label = f"state tensor {name!r}"
    arr = _from_torch(value, label)
    if arr is None:
        arr = np.asarray(value)
    if arr.shape != info.shape:
        raise PockError(f"{label}: expected shape {_describe(info.shape, info.dtype)}, "
                        f"got {_describe(arr.shape, arr.dtype)}")
    if arr.dtype != info.dtype:
        if not (arr.dtype.kind in "iu" or (arr.dtype.kind == "f" and info.dtype.kind == "f")):
            raise PockError(f"{label}: expected dtype {info.dtype.name}, got {arr.dtype.name}")
        arr = arr.astype(info.dtype)
    return np.ascontiguousarray(arr)


class Trainer(NativeHandle):
    """One trainer over a compiled model library: step, forward, state, checkpoints.

    Pluggable stages around the library (set by prog.build from the backend registry):
      open_device   the device hook, run before the library loads (Backend.open)
      input stage   turns the user's inputs into the library's step inputs, e.g. a
                    frozen prefix run on an inference accelerator (build/prefix_stage.PrefixRunner
                    on the HTP); install it with use_input_stage().  It is any object with
                      inputs                  [IOInfo] of the user's inputs
                      __call__(arrays)        the library's step inputs for checked user arrays
                      prefix_outputs(arrays)  the inputs it computes (beyond the user's it keeps)
                      frozen                  {name: array} of state baked into the stage
                      order                   the model's parameter/buffer names in state_dict order
                      name                    what runs it (for messages), e.g. "htp"
                      close()                 releases what it holds
    """

    partition = None       # passes/partition.Partition of a step built over several backends
    input_stage = None     # see use_input_stage()
    prefix_manifest = None  # a prefix backend's manifest["prefix"] (backends/htp.py)
    _closed_message = "trainer is closed"  # handle.py: lock, _live(), close(), with, __del__

    def __init__(self, lib_path, checkpoint=None, *, aliases: Mapping[str, str] | None = None,
                 strict: bool = False, open_device=None, input_stage=None, partition=None, prefix_manifest=None,
                 lora_adapters: Mapping[str, float] | None = None, trained_names: Sequence[str] | None = None,
                 decoder=None):
        """aliases: {name: canonical name} for tied parameters that PyTorch's
        state_dict lists under several names but the library stores once.

        strict: a step whose input, loss or gradients are non-finite raises
        PockError instead of being skipped and counted in skipped_steps.

        open_device: the device hook, called with lib_path before the library is loaded
        (a backend's Backend.open, e.g. Vulkan's: PockError naming what is missing).

        input_stage: see the class docstring and use_input_stage().

        What the program it was built from says about it (build.package.load_trainer passes them):
        partition (the step's backend partition), prefix_manifest (a prefix backend's
        manifest["prefix"]), lora_adapters ({module: scaling}: merged_state_dict, export_adapter),
        trained_names (save(trained_only=True)), decoder (generation's view of a Llama-family LM)."""
        super().__init__()  # first, so that close()/__del__ work whatever fails below
        self.strict = bool(strict)
        self.skipped_steps = 0          # steps the non-finite guard skipped (no update applied)
        self.last_step_status = "ok"    # "ok" | "skipped" | "partial" (non-finite, see step()) for the last step()
        self.last_step_message = ""     # why the last step was skipped
        self._aliases = dict(aliases or {})
        self.lora_adapters: dict[str, float] = dict(lora_adapters or {})  # {module: scaling} of a compile(lora=...) step
        self.trained_names: list[str] | None = list(trained_names) if trained_names is not None else None
        self.partition = partition  # passes/partition.Partition of a step built over several backends
        self.prefix_manifest = prefix_manifest  # a prefix backend's manifest["prefix"] (backends/htp.py)
        self.decoder = decoder  # decoder.DecoderSpec of a Llama-family LM (generate, export_adapter)
        self.lib_path = Path(lib_path)
        if open_device is not None:
            open_device(lib_path)
        self._lib = lib = _load_library(lib_path)
        self.inputs = self.step_inputs = self._io_infos(_INPUTS)  # inputs: the user's (input stage's)
        self.targets = self._io_infos(_TARGETS)
        self.outputs = self._io_infos(_OUTPUTS)
        self.tensors = []
        for i in range(lib.pock_tensor_count()):
            info = _Info()
            self._check(lib.pock_tensor_info_at(i, ctypes.byref(info)))
            self.tensors.append(TensorInfo(info.name.decode(), _KINDS.get(info.kind, str(info.kind)),
                                           _DTYPES[info.dtype], tuple(info.shape[:info.ndim])))
        self._tensor_by_name = {t.name: t for t in self.tensors}
        # Descriptors are built once: a call only fills in data pointers.
        self._in_structs, self._in_shapes = self._structs(self.step_inputs)
        self._tg_structs, self._tg_shapes = self._structs(self.targets)
        self._out_bufs = (_Buffer * max(1, len(self.outputs)))()
        handle = ctypes.c_void_p()
        ckpt = None if checkpoint is None else _c_path(checkpoint, "checkpoint")
        self._check(lib.pock_open(ckpt, ctypes.byref(handle)))
        self._handle = handle
        if input_stage is not None:
            self.use_input_stage(input_stage)

    def use_input_stage(self, stage) -> "Trainer":
        """Put `stage` in front of the library: step/forward/profile take the user's
        inputs (stage.inputs), the stage turns them into the step's inputs; the state
        it holds (stage.frozen) is listed by state_dict() and never changes."""
        known = {t.name for t in self.tensors}
        self.input_stage = stage
        self.inputs = list(stage.inputs)
        self._stage_frozen = {k: v for k, v in dict(stage.frozen).items() if k not in known}
        return self

    def describe_partition(self) -> str:
        """The step's backend partition as text ("" for a single-backend step)."""
        if self.partition is None:
            return ""
        from ..passes.partition import format_partition
        return format_partition(self.partition)

    # ------------------------------------------------------------------ set-up
    def _io_infos(self, group: int) -> list[IOInfo]:
        out = []
        for i in range(self._lib.pock_io_count(group)):
            info = _Info()
            self._check(self._lib.pock_io_info(group, i, ctypes.byref(info)))
            out.append(IOInfo(info.name.decode(), _DTYPES[info.dtype], tuple(info.shape[:info.ndim])))
        return out

    @staticmethod
    def _structs(ios: list[IOInfo]):
        structs = (_Tensor * max(1, len(ios)))()
        shapes = [(ctypes.c_int64 * max(1, len(io.shape)))(*io.shape) for io in ios]
        for s, io, shape in zip(structs, ios, shapes):
            s.dtype = {v: k for k, v in _DTYPES.items()}[io.dtype]
            s.ndim = len(io.shape)
            s.shape = ctypes.cast(shape, ctypes.POINTER(ctypes.c_int64))
        return structs, shapes

    def _check(self, status: int) -> None:
        check(self._lib, status)

    @staticmethod
    def _check_inputs(values, ios: list[IOInfo], what: str) -> list[np.ndarray]:
        seq = list(values) if isinstance(values, (tuple, list)) else [values]
        if len(seq) != len(ios):
            names = ", ".join(io.name for io in ios)
            raise PockError(f"expected {len(ios)} {what}s ({names}), got {len(seq)}")
        return [_input_array(v, f"{what} {i} {io.name!r}", io) for i, (v, io) in enumerate(zip(seq, ios))]

    def _fill(self, values, ios: list[IOInfo], structs, what: str) -> list[np.ndarray]:
        arrays = self._check_inputs(values, ios, what)
        for s, a in zip(structs, arrays):
            s.data = a.ctypes.data
        return arrays  # the caller keeps them alive across the C call

    # ------------------------------------------------------------------ training
    def step(self, inputs, targets) -> float:
        """One training step (forward, loss, backward, update); returns the loss.

        Non-finite guard: a step whose inputs, loss or gradients hold NaN/inf
        applies no update (weights, optimizer state and step count unchanged;
        see pock.h for the one exception), returns the loss it computed (NaN
        or inf), counts itself in skipped_steps and sets last_step_status to
        "skipped"; with strict=True it raises PockError instead."""
        return self._step(self._stage_inputs(inputs), targets)

    def _stage_inputs(self, inputs):
        """The library's step inputs for the user's `inputs` (through the input stage, if any)."""
        if self.input_stage is None:
            return inputs
        self._live()
        return self.input_stage(self._check_inputs(inputs, self.inputs, "input"))

    def prefix_outputs(self, inputs) -> list[np.ndarray]:
        """What the input stage (e.g. the HTP prefix) computes for `inputs`: the step's
        inputs beyond the user's inputs it keeps."""
        if self.input_stage is None:
            raise PockError("prefix_outputs: this trainer has no input stage (build with a prefix backend, "
                            "e.g. backends=['htp', 'cpu'])")
        return self.input_stage.prefix_outputs(self._check_inputs(inputs, self.inputs, "input"))

    def _step(self, inputs, targets) -> float:
        with self._lock:
            h = self._live()
            keep = (self._fill(inputs, self.step_inputs, self._in_structs, "input"),
                    self._fill(targets, self.targets, self._tg_structs, "target"))
            loss = ctypes.c_float()
            status = self._lib.pock_step(h, self._in_structs, len(self.step_inputs), self._tg_structs,
                                         len(self.targets), ctypes.byref(loss))
            del keep
            if status == _ERR_NO_TARGETS:  # nothing to learn from (all labels ignore_index): skipped, even strict
                self.skipped_steps += 1
                self.last_step_status = "skipped"
                self.last_step_message = self._lib.pock_last_error().decode(errors="replace")
                return float(loss.value)
            if status == _ERR_NONFINITE:
                self.skipped_steps += 1
                self.last_step_message = msg = self._lib.pock_last_error().decode(errors="replace")
                # "partial": a gradient found non-finite after earlier updates of the step ran (pock.h)
                self.last_step_status = "partial" if "earlier update(s)" in msg else "skipped"
                if self.strict:
                    self._check(status)
                return float(loss.value)
            self._check(status)
            self.last_step_status, self.last_step_message = "ok", ""
            return float(loss.value)

    def forward(self, inputs):
        """Inference with the current weights: one numpy array, or a tuple of them."""
        inputs = self._stage_inputs(inputs)
        with self._lock:
            h = self._live()
            keep = self._fill(inputs, self.step_inputs, self._in_structs, "input")
            outs = [np.empty(o.shape, o.dtype) for o in self.outputs]
            for b, a in zip(self._out_bufs, outs):
                b.data, b.nbytes = a.ctypes.data, a.nbytes
            self._check(self._lib.pock_forward(h, self._in_structs, len(self.step_inputs), self._out_bufs,
                                               len(outs)))
            del keep
            return outs[0] if len(outs) == 1 else tuple(outs)

    # ------------------------------------------------------------------ generation and adapters (issue 37)
    def generate(self, prompt_ids, max_new_tokens: int = 32, temperature: float = 0.0, top_k: int = 0,
                 top_p: float = 1.0, seed: int = 0, stop=None, callback=None) -> list[int]:
        """The new token ids a Llama-family causal LM generates after prompt_ids, from the
        current weights in place (LoRA adapters, low-precision frozen weights), with a KV cache.
        temperature 0 is greedy; top_k 0 / top_p 1 are off; the same seed gives the same tokens;
        stop: ids that end generation (kept in the output, as transformers keeps eos);
        callback(token_id) is called per new token, a truthy return stops.  See decoder.py."""
        from ..codegen.decoder import generate
        with self._lock:
            return generate(self, self._live(), prompt_ids, max_new_tokens, temperature, top_k, top_p, seed,
                            stop, callback)

    def export_adapter(self, path, format: str = "peft") -> None:
        """Write the LoRA adapters: format="peft" a folder peft.PeftModel.from_pretrained loads
        (adapter_model.safetensors + adapter_config.json), "gguf" a llama.cpp LoRA adapter
        file (`--lora`).  Written atomically; see adapters.py."""
        from .adapters import export_adapter
        self._live()
        with self._lock:
            return export_adapter(self, path, format)

    def export_gguf(self, path, tokenizer=None) -> None:
        """Write the merged model (adapters merged into the base weights, fp32) as a GGUF file
        llama.cpp runs; `tokenizer`: a GGUF file whose tokenizer.* metadata is copied (else
        llama.cpp runs token ids only).  Written atomically; see gguf_export.py."""
        from .gguf_export import export_gguf
        self._live()
        with self._lock:
            return export_gguf(self, path, tokenizer)

    def profile(self, inputs, targets, steps: int = 20, warmup: int = 3):
        """Time every node of the training step over `steps` steps on one batch.

        Returns a pockengine.runtime.profile.Profile: a list of row dicts, one per node
        in schedule order (index, phase, op, kernel, module, flops, ms per step,
        pct of the step, gflops, ...), with .step_ms (measured wall-clock time
        per step), .steps and .losses; print it with
        pockengine.runtime.profile.format_table.  With an input stage, the stage runs once
        on `inputs` and the library's step is profiled on what it gives.

        These are real training steps: `warmup` unprofiled steps, then `steps`
        profiled ones, each updating the weights, the optimizer state and the
        step count exactly as step() would (profiling only reads a clock
        between nodes, so the losses and weights are bit-identical to
        unprofiled training).  Save a checkpoint first to undo them.
        """
        from .profile import Profile, make_rows
        steps, warmup = int(steps), int(warmup)
        if steps < 1 or warmup < 0:
            raise PockError(f"profile: steps must be >= 1 and warmup >= 0, got steps={steps}, warmup={warmup}")
        lib = self._lib
        if not all(hasattr(lib, name) for name in _OPTIONAL_SIGNATURES):
            raise PockError(f"{str(self.lib_path)!r} was built before the profiler; rebuild it to profile")
        inputs = self._stage_inputs(inputs)
        with self._lock:
            h = self._live()
            if lib.pock_profile_count(h) <= 0:
                raise PockError(f"model {self.model_name!r} was generated without profiling hooks; "
                                "regenerate it with this version of PockEngine")
            losses = [self._step(inputs, targets) for _ in range(warmup)]
            self._check(lib.pock_profile_enable(h, 1))
            try:
                self._check(lib.pock_profile_reset(h))
                start = time.perf_counter()
                losses += [self._step(inputs, targets) for _ in range(steps)]
                elapsed = time.perf_counter() - start
                entries = []
                for i in range(lib.pock_profile_count(h)):
                    e = _NodeProfile()
                    self._check(lib.pock_profile_entry(h, i, ctypes.byref(e)))
                    entries.append({"index": e.index, "phase": e.phase.decode(), "op": e.op.decode(),
                                    "kernel": e.kernel.decode(), "module": e.module.decode(errors="replace"),
                                    "flops": int(e.flops), "steps": int(e.steps), "total_ns": int(e.total_ns)})
            finally:
                lib.pock_profile_enable(h, 0)
        return Profile(make_rows(entries), model=self.model_name, steps=steps, step_ms=elapsed / steps * 1e3,
                       losses=losses[warmup:])

    # ------------------------------------------------------------------ state
    def _info(self, name: str) -> TensorInfo:
        info = self._tensor_by_name.get(self._aliases.get(name, name))
        if info is None:
            raise PockError(f"unknown state tensor {name!r}")
        return info

    def _frozen_in_stage(self, name: str):
        """The input stage's copy of state tensor `name` (or an alias of it), else None."""
        if self.input_stage is None:
            return None
        return self._stage_frozen.get(self._aliases.get(name, name))

    def _check_stage_value(self, name: str, value) -> None:
        want = self._frozen_in_stage(name)
        got = _from_torch(value, f"state tensor {name!r}")
        got = np.asarray(value) if got is None else got
        if got.shape != want.shape or not np.array_equal(got.astype(want.dtype), want):
            raise PockError(f"state tensor {name!r} is frozen in the prefix run by {self.input_stage.name} (its "
                            f"values are baked into the prefix model); recompile the model to change it")

    def get_tensor(self, name: str) -> np.ndarray:
        """A copy of any state tensor (optimizer state and constants included)."""
        frozen = self._frozen_in_stage(name)
        if frozen is not None:
            return frozen.copy()
        with self._lock:
            h = self._live()
            info = self._info(name)
            out = np.empty(info.shape, info.dtype)
            self._check(self._lib.pock_get_tensor(h, info.name.encode(), out.ctypes.data, out.nbytes))
            return out

    def set_tensor(self, name: str, value) -> None:
        """Overwrite any state tensor (same conversions as load_state_dict)."""
        if self._frozen_in_stage(name) is not None:
            return self._check_stage_value(name, value)
        info = self._info(name)
        arr = _state_array(value, name, info)
        with self._lock:
            self._check(self._lib.pock_set_tensor(self._live(), info.name.encode(), arr.ctypes.data, arr.nbytes))

    def state_dict(self) -> dict[str, np.ndarray]:
        """{PyTorch name: array} of the parameters and buffers, in the model's
        order; a tied parameter's other names follow, sharing its array."""
        with self._lock:  # one consistent snapshot, never tensors from two different steps
            sd = {t.name: self._fp32(t) for t in self.tensors if t.kind in ("param", "buffer")}
        if self.input_stage is not None and self._stage_frozen:  # the stage's frozen state, in model order
            frozen = self._stage_frozen
            merged = {n: (frozen[n].copy() if n in frozen else sd[n]) for n in self.input_stage.order
                      if n in frozen or n in sd}
            merged.update({k: v for k, v in sd.items() if k not in merged})
            sd = merged
        sd.update({alias: sd[canon] for alias, canon in self._aliases.items() if canon in sd})
        return sd

    _LOWP = {np.dtype(np.uint16): "bf16", np.dtype(np.float16): "f16", np.dtype(np.int8): "i8"}

    def _fp32(self, t: TensorInfo) -> np.ndarray:
        """A state tensor's values; a frozen weight stored in low precision
        (compile(frozen_dtype=...)) comes back dequantized to fp32."""
        arr = self.get_tensor(t.name)
        lowp = self._LOWP.get(np.dtype(t.dtype))
        if lowp is None and np.dtype(t.dtype) == np.uint8 and t.name + ":scale" in self._tensor_by_name:
            lowp = "q4"  # packed nibbles with per-block (d, m) (frozen_dtype="q4")
        if lowp is None:
            return arr
        from ..schemes.quant import dequantize
        scale = self.get_tensor(t.name + ":scale") if lowp in ("i8", "q4") else None
        return dequantize(arr, lowp, scale)

    def merged_state_dict(self) -> dict[str, "torch.Tensor"]:
        """The original torch module's state_dict with the trained values: each LoRA adapter
        merged into its base weight (W + alpha/rank * B @ A), the lora_A / lora_B entries
        dropped, non-persistent buffers ("buffer:..." entries, which a module's state_dict
        leaves out) dropped, and fp32 torch tensors, so `model.load_state_dict(merged)` (strict)
        loads it into the model it came from."""
        import torch
        from ..schemes.lora import merge_lora
        merged = merge_lora(self.state_dict(), self.lora_adapters)
        return {k: torch.from_numpy(np.array(v)) for k, v in merged.items() if not k.startswith("buffer:")}

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Strict: the keys must be exactly state_dict()'s (a tied parameter's
        other names may be left out), with the same shapes.  Nothing changes
        unless every entry is valid.  State frozen in an input stage must come
        back unchanged."""
        self._live()
        if self.input_stage is not None and self._stage_frozen:
            rest = {}
            for key, value in state_dict.items():
                if self._frozen_in_stage(key) is not None:
                    self._check_stage_value(key, value)
                else:
                    rest[key] = value
            missing = [n for n in self._stage_frozen if n not in state_dict]
            if missing:
                raise PockError("load_state_dict: missing keys: " + ", ".join(map(repr, missing)))
            state_dict = rest
        wanted = [t for t in self.tensors if t.kind in ("param", "buffer")]
        names = {t.name for t in wanted}
        aliases = {a: self._tensor_by_name[c] for a, c in self._aliases.items() if c in names}
        problems = []
        missing = [t.name for t in wanted if t.name not in state_dict]
        unexpected = [k for k in state_dict if k not in names and k not in aliases]
        if missing:
            problems.append("missing keys: " + ", ".join(map(repr, missing)))
        if unexpected:
            problems.append("unexpected keys: " + ", ".join(map(repr, unexpected)))
        staged = []  # a tied name after its canonical one: it wins, as in torch
        for key, t in [(t.name, t) for t in wanted] + list(aliases.items()):
            if key in state_dict:
                try:
                    staged.append((t.name, _state_array(state_dict[key], key, t)))
                except PockError as e:
                    problems.append(str(e))
        if problems:
            raise PockError("load_state_dict: " + "; ".join(problems))
        with self._lock:
            h = self._live()
            for name, arr in staged:
                self._check(self._lib.pock_set_tensor(h, name.encode(), arr.ctypes.data, arr.nbytes))

    # ------------------------------------------------------------------ checkpoints
    def save(self, path, trained_only: bool = False) -> None:
        """Write a checkpoint (all state, step count, learning rate) atomically.
        trained_only: only the trained tensors, buffers and optimizer state,
        tied to the frozen base weights by hash (trained_ckpt.py)."""
        if trained_only:
            from .trained_ckpt import save_trained_only
            _c_path(path, "save path")
            with self._lock:
                return save_trained_only(self, path)
        with self._lock:
            self._check(self._lib.pock_save(self._live(), _c_path(path, "save path")))

    def load(self, path) -> None:
        """Restore a checkpoint; a corrupt one or one for another model raises
        PockError and leaves the trainer as it was.  A trained-only checkpoint
        is recognised by its magic and checked against the base weights' hash."""
        from .trained_ckpt import is_trained_only, load_trained_only
        c_path = _c_path(path, "checkpoint path")
        if is_trained_only(path):
            with self._lock:
                return load_trained_only(self, path)
        with self._lock:
            self._check(self._lib.pock_load(self._live(), c_path))

    # ------------------------------------------------------------------ settings
    @property
    def learning_rate(self) -> float:
        with self._lock:
            lr = ctypes.c_float()
            self._check(self._lib.pock_get_learning_rate(self._live(), ctypes.byref(lr)))
            return float(lr.value)

    @learning_rate.setter
    def learning_rate(self, lr: float) -> None:
        with self._lock:
            self._check(self._lib.pock_set_learning_rate(self._live(), float(lr)))

    @property
    def step_count(self) -> int:
        with self._lock:
            n = ctypes.c_int64()
            self._check(self._lib.pock_step_count(self._live(), ctypes.byref(n)))
            return int(n.value)

    def set_num_threads(self, n: int) -> None:
        n = int(n)
        if not 1 <= n <= _MAX_THREADS:  # checked here: ctypes would wrap 2**32 + 1 to 1
            raise PockError(f"number of threads must be in [1, {_MAX_THREADS}], got {n}")
        with self._lock:
            self._check(self._lib.pock_set_num_threads(self._live(), n))

    @property
    def model_name(self) -> str:
        return self._lib.pock_model_name().decode()

    @property
    def model_hash(self) -> str:
        return self._lib.pock_model_hash().decode()

    # ------------------------------------------------------------------ lifetime (close, with: handle.py)
    def _release(self, handle) -> None:
        self._lib.pock_close(handle)
        if self.input_stage is not None:
            self.input_stage.close()

    def __repr__(self) -> str:
        state = "closed" if self._handle is None else f"{len(self.tensors)} state tensors"
        stage = "" if self.input_stage is None else f", prefix on {self.input_stage.name}"
        return f"<pockengine.Trainer {self.model_name!r} ({state}{stage}) from {str(self.lib_path)!r}>"
