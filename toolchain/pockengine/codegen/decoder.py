"""Generation next to training: the decoder table of a Llama-family causal LM.

At compile time `recognize(model)` finds a Hugging Face LlamaForCausalLM-like module in
the compiled model (embed_tokens, per layer input_layernorm, q/k/v/o_proj, rotary
embedding, post_attention_layernorm, gate/up/down SwiGLU MLP, final norm, lm_head tied or
not): Llama, SmolLM2, Qwen2, Mistral.  At render time `decoder_source(prog)` turns it into a
`PockDecoder` (pock_model.h) in the generated C++: the hyperparameters, the rotary inverse
frequencies and, for every weight, its offset in the trainer's state, its storage format
(fp32 or compile(frozen_dtype=...)'s bf16/fp16/int8/q4 with its scale tensor) and its LoRA
adapter's offsets and scaling.  native/runtime/generate.cpp runs the model from there in
place (pock_generate); `generate(trainer, ...)` is Trainer.generate's body.

A module that looks like a causal LM but that generation cannot run (another attention or
activation, a dynamic rotary embedding) gets a table with `supported = 0` and the reason, so
pock_generate names it; any other model has no table.
"""
from __future__ import annotations

import ctypes
from dataclasses import dataclass, field

import numpy as np

from ..errors import PockError

ARCHS = ("llama", "qwen2", "mistral")
FORMATS = {"f32": 0, "bf16": 1, "f16": 2, "i8": 3, "q4": 4}
PROJ = (("q", "self_attn.q_proj"), ("k", "self_attn.k_proj"), ("v", "self_attn.v_proj"),
        ("o", "self_attn.o_proj"), ("gate", "mlp.gate_proj"), ("up", "mlp.up_proj"), ("down", "mlp.down_proj"))


@dataclass
class DecoderSpec:
    """What generation needs from the model, by parameter name (prefix: the LM's path)."""
    arch: str
    reason: str | None = None  # None: supported
    prefix: str = ""
    n_layers: int = 0
    hidden: int = 0
    n_heads: int = 0
    n_kv_heads: int = 0
    head_dim: int = 0
    intermediate: int = 0
    vocab: int = 0
    max_context: int = 0
    sliding_window: int = 0
    eps: float = 1e-6
    attn_scale: float = 1.0
    rope_scaling: float = 1.0
    inv_freq: list = field(default_factory=list)
    lora: dict = field(default_factory=dict)  # {module name (with prefix): scaling}


def _find_lm(model):
    for name, m in model.named_modules():
        cfg = getattr(m, "config", None)
        body = getattr(m, "model", None)
        if cfg is not None and hasattr(m, "lm_head") and body is not None and hasattr(body, "layers") \
                and hasattr(body, "embed_tokens"):
            return (name + "." if name else ""), m
    return None, None


def recognize(model, lora_adapters: dict | None = None) -> DecoderSpec | None:
    """The decoder spec of the causal LM inside `model` (after apply_lora), None if there is none."""
    prefix, lm = _find_lm(model)
    if lm is None:
        return None
    cfg = lm.config
    arch = str(getattr(cfg, "model_type", type(lm).__name__))
    spec = DecoderSpec(arch=arch, prefix=prefix)
    if arch not in ARCHS:
        spec.reason = f"model_type {arch!r} is not one generation supports ({', '.join(ARCHS)})"
        return spec
    act = getattr(cfg, "hidden_act", "silu")
    if act != "silu":
        spec.reason = f"hidden_act {act!r}: generation runs the SwiGLU (silu) MLP only"
        return spec
    body = lm.model
    rotary = getattr(body, "rotary_emb", None)
    rope_type = getattr(rotary, "rope_type", "default")
    if rotary is None or not hasattr(rotary, "inv_freq"):
        spec.reason = "no rotary embedding (model.rotary_emb.inv_freq)"
        return spec
    if rope_type in ("dynamic", "longrope"):
        spec.reason = f"rope_type {rope_type!r}: its frequencies change with the position"
        return spec
    layers = list(body.layers)
    attn = layers[0].self_attn
    spec.n_layers = len(layers)
    spec.hidden = int(cfg.hidden_size)
    spec.n_heads = int(cfg.num_attention_heads)
    spec.n_kv_heads = int(getattr(cfg, "num_key_value_heads", None) or spec.n_heads)
    spec.head_dim = int(getattr(attn, "head_dim", None) or spec.hidden // spec.n_heads)
    spec.intermediate = int(cfg.intermediate_size)
    spec.vocab = int(cfg.vocab_size)
    spec.max_context = int(getattr(cfg, "max_position_embeddings", 0) or 0)
    window = getattr(cfg, "sliding_window", None) if getattr(cfg, "use_sliding_window", True) else None
    spec.sliding_window = int(window) if window and int(window) < spec.max_context else 0
    spec.eps = float(getattr(layers[0].input_layernorm, "variance_epsilon", getattr(cfg, "rms_norm_eps", 1e-6)))
    spec.attn_scale = float(getattr(attn, "scaling", spec.head_dim ** -0.5))
    spec.rope_scaling = float(getattr(rotary, "attention_scaling", 1.0))
    spec.inv_freq = [float(v) for v in rotary.inv_freq.detach().float().cpu().numpy()]
    if spec.n_heads % spec.n_kv_heads or len(spec.inv_freq) * 2 != spec.head_dim or spec.max_context < 1:
        spec.reason = (f"heads {spec.n_heads} / kv heads {spec.n_kv_heads}, head_dim {spec.head_dim}, "
                       f"{len(spec.inv_freq)} rotary frequencies, context {spec.max_context}: not a layout "
                       f"generation runs")
        return spec
    for mod in ("q_norm", "k_norm"):
        if getattr(attn, mod, None) is not None:
            spec.reason = f"attention with {mod} (Qwen3-style): not supported"
            return spec
    spec.lora = dict(lora_adapters or {})
    return spec


# -- the C++ table ------------------------------------------------------------------------
def _f(x: float) -> str:
    return float(np.float32(x)).hex() + "f"


def decoder_source(prog) -> str:
    """The PockDecoder definition `kDecoder` for prog's generated C++ ("" for no decoder)."""
    spec: DecoderSpec | None = getattr(prog, "decoder", None)
    if spec is None:
        return ""
    reason = spec.reason
    state, offsets, aliases = prog.state, prog.state_offsets, dict(getattr(prog, "aliases", {}) or {})

    def name_of(n):
        return n if n in state else aliases.get(n, n)

    def off(n):
        n = name_of(n)
        return offsets[n] if n in state else -1

    def weight(module: str, table: bool = False) -> str:
        nonlocal reason
        wname = name_of(f"{module}.weight")
        v = state.get(wname)
        if v is None:
            reason = reason or f"the weight {module}.weight is not in the compiled state"
            return "{-1, 0, -1, 0, 0, -1, -1, -1, 0, 0.0f}"
        fmt = FORMATS.get(v.dtype)
        if fmt is None:
            reason = reason or f"{wname} is stored as {v.dtype}"
            return "{-1, 0, -1, 0, 0, -1, -1, -1, 0, 0.0f}"
        rows = v.shape[0]
        cols = v.shape[1] * 2 if v.dtype == "q4" else v.shape[1]
        a, b = f"{module}.lora_A", f"{module}.lora_B"
        rank, scaling = 0, 0.0
        if a in state and not table:
            rank, scaling = state[a].shape[0], spec.lora.get(module, 0.0)
        scale = off(f"{wname}:scale") if v.dtype in ("i8", "q4") else -1
        return (f"{{{offsets[wname]}, {fmt}, {scale}, {rows}, {cols}, {off(f'{module}.bias')}, "
                f"{off(a) if rank else -1}, {off(b) if rank else -1}, {rank}, {_f(scaling)}}}")

    p = spec.prefix
    layers = []
    if reason is None:
        for i in range(spec.n_layers):
            base = f"{p}model.layers.{i}"
            ws = ", ".join(weight(f"{base}.{mod}") for _, mod in PROJ)
            layers.append(f"    {{{off(base + '.input_layernorm.weight')}, "
                          f"{off(base + '.post_attention_layernorm.weight')}, {ws}}},")
        embed, head = weight(f"{p}model.embed_tokens", table=True), weight(f"{p}lm_head")
        norm = off(f"{p}model.norm.weight")
        if reason is None and (norm < 0 or any("{-1, " in line for line in layers)):
            reason = "a norm weight is not in the compiled state"
    if reason is not None:
        text = reason.replace("\\", "\\\\").replace('"', '\\"')
        return ("// Generation (generate.cpp): this causal LM is not one it runs.\n"
                f"const PockDecoder kDecoder = {{0, \"{text}\", \"{spec.arch}\"}};\n")
    freqs = ", ".join(_f(v) for v in spec.inv_freq)
    return "\n".join([
        f"// Generation (generate.cpp): the {spec.arch} decoder's weights in the state, read in place.",
        f"const float kRopeInvFreq[] = {{{freqs}}};",
        "const PockDecLayer kDecLayers[] = {  // attn_norm, mlp_norm, q, k, v, o, gate, up, down",
        *layers,
        "};",
        f"const PockDecoder kDecoder = {{1, \"\", \"{spec.arch}\", {spec.n_layers}, {spec.hidden}, {spec.n_heads}, "
        f"{spec.n_kv_heads}, {spec.head_dim}, {spec.intermediate}, {spec.vocab}, {spec.max_context}, "
        f"{spec.sliding_window}, {_f(spec.eps)}, {_f(spec.attn_scale)}, {_f(spec.rope_scaling)}, kRopeInvFreq,",
        f"    {embed}, {norm}, {head}, kDecLayers, pk::decoder_open, pk::decoder_forward, pk::decoder_close, "
        f"\"{spec.prefix}\"}};",
        ""])


# -- Trainer.generate ----------------------------------------------------------------------
_CALLBACK = ctypes.CFUNCTYPE(ctypes.c_int32, ctypes.c_int64, ctypes.c_void_p)


class _Options(ctypes.Structure):
    _fields_ = [("max_new_tokens", ctypes.c_int32), ("temperature", ctypes.c_float), ("top_k", ctypes.c_int32),
                ("top_p", ctypes.c_float), ("seed", ctypes.c_uint64), ("stop_ids", ctypes.POINTER(ctypes.c_int64)),
                ("n_stop", ctypes.c_int32), ("callback", _CALLBACK), ("user_data", ctypes.c_void_p)]


def _int(value, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise PockError(f"generate: {what} must be an int, got {value!r}")
    return int(value)


def _ids(values, what: str) -> np.ndarray:
    if hasattr(values, "detach"):
        values = values.detach().cpu().numpy()
    arr = np.asarray(values)
    if arr.ndim == 2 and arr.shape[0] == 1:
        arr = arr[0]
    if arr.ndim != 1 or (arr.size and arr.dtype.kind not in "iu"):
        raise PockError(f"generate: {what} must be a 1-D list of token ids, got {arr.dtype} {list(arr.shape)}")
    return np.ascontiguousarray(arr, np.int64)


def generate(trainer, handle, prompt_ids, max_new_tokens=32, temperature=0.0, top_k=0, top_p=1.0, seed=0,
             stop=None, callback=None) -> list[int]:
    """pock_generate on an open trainer's handle (the caller holds its lock)."""
    lib = trainer._lib
    fn = getattr(lib, "pock_generate", None)
    if fn is None:
        raise PockError(f"{trainer.lib_path} was built before generation (no pock_generate): build the model again")
    fn.restype = ctypes.c_int32
    fn.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_int64), ctypes.c_int32, ctypes.POINTER(_Options),
                   ctypes.POINTER(ctypes.c_int64), ctypes.c_int32, ctypes.POINTER(ctypes.c_int32)]
    prompt = _ids(prompt_ids, "prompt_ids")
    stops = _ids([] if stop is None else ([stop] if isinstance(stop, (int, np.integer)) else list(stop)), "stop")
    n_new = _int(max_new_tokens, "max_new_tokens")
    if not 0 <= n_new < 2 ** 31 or not len(prompt) < 2 ** 31:
        raise PockError(f"generate: max_new_tokens must be in [0, 2**31), got {n_new}")
    for what, v in (("temperature", temperature), ("top_p", top_p)):
        if isinstance(v, bool) or not isinstance(v, (int, float, np.floating)):
            raise PockError(f"generate: {what} must be a number, got {v!r}")
    if callback is not None and not callable(callback):
        raise PockError(f"generate: callback must be callable(token_id) -> bool (True stops), got {callback!r}")
    seed = _int(seed, "seed")
    errors = []

    def on_token(token, _user):
        try:
            return 1 if callback(int(token)) else 0
        except BaseException as e:  # re-raised after the C call; stop generating
            errors.append(e)
            return 1

    opts = _Options(n_new, float(temperature), _int(top_k, "top_k") if abs(_int(top_k, "top_k")) < 2 ** 31 else -1,
                    float(top_p), seed % 2 ** 64, stops.ctypes.data_as(ctypes.POINTER(ctypes.c_int64)), len(stops),
                    _CALLBACK(on_token) if callback is not None else _CALLBACK(), None)
    out = np.zeros(max(n_new, 1), np.int64)
    n_out = ctypes.c_int32(0)
    status = fn(handle, prompt.ctypes.data_as(ctypes.POINTER(ctypes.c_int64)), len(prompt), ctypes.byref(opts),
                out.ctypes.data_as(ctypes.POINTER(ctypes.c_int64)), len(out), ctypes.byref(n_out))
    if errors:
        raise errors[0]
    trainer._check(status)
    return [int(v) for v in out[:n_out.value]]
