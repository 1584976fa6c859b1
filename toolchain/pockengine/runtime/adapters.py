"""Adapters out: a trainer's LoRA adapters in the formats other runtimes load
(trainer.export_adapter(path, format=...)).

    peft  a folder with adapter_model.safetensors + adapter_config.json that
          peft.PeftModel.from_pretrained loads onto the Hugging Face base model:
          tensors base_model.model.<module>.lora_A.weight [r, in] / .lora_B.weight [out, r]
          (our <module>.lora_A / .lora_B, the LM's path inside the compiled model
          stripped), lora_alpha = scaling * r, target_modules the exact module names.
    gguf  one file in llama.cpp's LoRA adapter layout (what its convert_lora_to_gguf.py
          writes, `--lora` loads): general.type = adapter, adapter.type = lora,
          adapter.lora.alpha; tensors blk.N.<attn_q|attn_k|attn_v|attn_output|ffn_gate|
          ffn_up|ffn_down>.weight.lora_a [r, in] and .lora_b [out, r] in fp32 (ggml reads
          them as ne [in, r] / [r, out]).  For the "llama"/"mistral" architectures the
          q/k rows are permuted as convert_hf_to_gguf permutes the base weights (its rotary
          layout), which for an adapter touches lora_b's rows only.

Both files are written to a temporary name and renamed into place (a failed export
leaves no half-written adapter).  Only the adapters travel: a trainer whose update
scheme also trains base weights has no adapter-only export (PockError naming them).
"""
from __future__ import annotations

import json
import re
import struct
from pathlib import Path

import numpy as np

from .checkpoint import write_atomically
from ..errors import PockError

GGUF_NAMES = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
              "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
              "mlp.down_proj": "ffn_down"}


def _adapters(trainer) -> tuple[str, dict]:
    """(the LM's prefix, {module relative to it: (A [r, in], B [out, r], scaling)})."""
    if not trainer.lora_adapters:
        raise PockError("export_adapter: the trainer has no LoRA adapters (compile with lora=pe.LoRA(...))")
    trained = [n for n in (trainer.trained_names or []) if not n.endswith((".lora_A", ".lora_B"))]
    if trained:
        raise PockError(f"export_adapter: the update scheme also trains base weights ({', '.join(trained[:4])}"
                        f"{' ...' if len(trained) > 4 else ''}), which an adapter cannot carry; save a checkpoint "
                        f"or merged_state_dict() instead")
    spec = getattr(trainer, "decoder", None)
    prefix = spec.prefix if spec is not None else ""
    out = {}
    for module, scaling in trainer.lora_adapters.items():
        a = trainer.get_tensor(f"{module}.lora_A")
        b = trainer.get_tensor(f"{module}.lora_B")
        name = module[len(prefix):] if prefix and module.startswith(prefix) else module
        out[name] = (np.ascontiguousarray(a, np.float32), np.ascontiguousarray(b, np.float32), float(scaling))
    return prefix, out


def _atomic_write(path: Path, data) -> None:
    """data (bytes, or a function writing the file at a Path) to path as a checkpoint is saved."""
    write_atomically(path, data, what="export_adapter: cannot write")


def safetensors_bytes(tensors: dict[str, np.ndarray], metadata: dict[str, str] | None = None) -> bytes:
    """The safetensors format: u64 header length, JSON header (dtype, shape, data_offsets), raw data."""
    header, blobs, pos = {}, [], 0
    if metadata:
        header["__metadata__"] = dict(metadata)
    for name, arr in tensors.items():
        arr = np.ascontiguousarray(arr, np.float32)
        raw = arr.tobytes()
        header[name] = {"dtype": "F32", "shape": list(arr.shape), "data_offsets": [pos, pos + len(raw)]}
        blobs.append(raw)
        pos += len(raw)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # the data starts 8-byte aligned
    return struct.pack("<Q", len(text)) + text + b"".join(blobs)


def export_peft(trainer, path) -> None:
    _, adapters = _adapters(trainer)
    folder = Path(path)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise PockError(f"export_adapter: cannot create the folder {str(folder)!r}: {e.strerror or e}") from None
    ranks = {a.shape[0] for a, _, _ in adapters.values()}
    alphas = {s * a.shape[0] for a, _, s in adapters.values()}
    if len(ranks) != 1 or len(alphas) != 1:
        raise PockError(f"export_adapter: adapters of several ranks {sorted(ranks)} / alphas {sorted(alphas)}")
    tensors = {}
    for name, (a, b, _) in adapters.items():
        tensors[f"base_model.model.{name}.lora_A.weight"] = a
        tensors[f"base_model.model.{name}.lora_B.weight"] = b
    config = {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": ranks.pop(), "lora_alpha": alphas.pop(),
              "target_modules": sorted(adapters), "lora_dropout": 0.0, "bias": "none", "fan_in_fan_out": False,
              "use_rslora": False, "use_dora": False, "init_lora_weights": True, "inference_mode": True,
              "modules_to_save": None, "base_model_name_or_path": None, "revision": None}
    _atomic_write(folder / "adapter_model.safetensors", safetensors_bytes(tensors, {"format": "pt"}))
    _atomic_write(folder / "adapter_config.json", (json.dumps(config, indent=2) + "\n").encode())


def _permute_rows(w: np.ndarray, n_head: int) -> np.ndarray:
    """convert_hf_to_gguf's LlamaModel.permute of a q/k projection's output rows."""
    rows = w.shape[0]
    return w.reshape(n_head, 2, rows // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def export_gguf(trainer, path) -> None:
    import gguf
    spec = getattr(trainer, "decoder", None)
    if spec is None or spec.reason is not None:
        why = "not a Llama-family causal LM" if spec is None else spec.reason
        raise PockError(f"export_adapter(format='gguf') needs a Llama-family decoder (llama.cpp's tensor names): {why}")
    _, adapters = _adapters(trainer)
    arch = "llama" if spec.arch == "mistral" else spec.arch
    tensors, alphas = {}, set()
    for name, (a, b, scaling) in adapters.items():
        m = re.fullmatch(r"model\.layers\.(\d+)\.(.+)", name)
        if name == "lm_head":
            base = "output"
        elif m and m.group(2) in GGUF_NAMES:
            base = f"blk.{m.group(1)}.{GGUF_NAMES[m.group(2)]}"
        else:
            raise PockError(f"export_adapter(format='gguf'): no llama.cpp tensor for the adapter of {name!r}")
        if arch == "llama" and name.endswith("self_attn.q_proj"):
            b = _permute_rows(b, spec.n_heads)
        elif arch == "llama" and name.endswith("self_attn.k_proj"):
            b = _permute_rows(b, spec.n_kv_heads)
        tensors[f"{base}.weight.lora_a"] = a
        tensors[f"{base}.weight.lora_b"] = np.ascontiguousarray(b)
        alphas.add(scaling * a.shape[0])
    if len(alphas) != 1:
        raise PockError(f"export_adapter(format='gguf'): llama.cpp takes one alpha per adapter, got {sorted(alphas)}")
    path, alpha = Path(path), float(alphas.pop())

    def write(tmp: Path) -> None:
        w = gguf.GGUFWriter(str(tmp), arch)
        w.add_string("general.type", "adapter")
        w.add_string("adapter.type", "lora")
        w.add_float32("adapter.lora.alpha", alpha)
        for name, arr in tensors.items():
            w.add_tensor(name, np.ascontiguousarray(arr, np.float32))
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()

    _atomic_write(path, write)


def export_adapter(trainer, path, format: str = "peft") -> None:
    if format == "peft":
        return export_peft(trainer, path)
    if format == "gguf":
        return export_gguf(trainer, path)
    raise PockError(f"export_adapter: format must be 'peft' or 'gguf', got {format!r}")
