"""The merged model as a GGUF file llama.cpp runs (trainer.export_gguf(path, tokenizer=...)).

The trainer's weights with every LoRA adapter merged in (Trainer.merged_state_dict) are written
in fp32 under llama.cpp's tensor names (token_embd, blk.N.attn_norm / attn_q / attn_k / attn_v /
attn_output / ffn_norm / ffn_gate / ffn_up / ffn_down, output_norm, output unless tied to the
embedding; Qwen2's q/k/v biases), with the q/k rows of the "llama" architecture permuted as
convert_hf_to_gguf permutes them (its rotary layout), and the hyperparameters llama.cpp reads
(`<arch>.block_count`, `.embedding_length`, `.feed_forward_length`, `.attention.head_count(_kv)`,
`.attention.layer_norm_rms_epsilon`, `.rope.freq_base`, `.rope.dimension_count`, ...).

The vocabulary: `tokenizer` names a GGUF file (e.g. the one the model was loaded from) whose
`tokenizer.*` metadata is copied as it is; without one the file says `tokenizer.ggml.model =
"no_vocab"`, and llama.cpp runs token ids only.  Written to a temporary name and renamed
into place.  Only plain rotary embeddings travel (llama.cpp's freq_base): a model whose
rotary frequencies are scaled is refused with a PockError, as is a model generation cannot run.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from .adapters import GGUF_NAMES, _permute_rows
from .checkpoint import write_atomically
from ..errors import PockError


def _freq_base(spec) -> float:
    """The rotary base theta with inv_freq[i] = theta ** (-2 i / head_dim), checked."""
    inv = np.asarray(spec.inv_freq, np.float64)
    d = spec.head_dim
    i = np.arange(1, len(inv))
    theta = float(np.exp(np.mean(-np.log(inv[1:]) * d / (2.0 * i)))) if len(inv) > 1 else 10000.0
    if abs(theta - round(theta)) < 1e-5 * theta:
        theta = float(round(theta))  # the float32 table's rounding, not a fractional base
    want = theta ** (-np.arange(len(inv)) * 2.0 / d)
    if not np.allclose(inv, want, rtol=1e-4) or abs(spec.rope_scaling - 1.0) > 1e-7:
        raise PockError("export_gguf: the rotary embedding is scaled (rope_scaling / scaled frequencies); only a "
                        "plain rotary embedding (llama.cpp's rope.freq_base) is written")
    return theta


def _tensors(spec, merged: dict) -> dict[str, np.ndarray]:
    p = spec.prefix
    arch = "llama" if spec.arch == "mistral" else spec.arch

    def get(name):
        v = merged.get(p + name)
        return None if v is None else np.ascontiguousarray(np.asarray(v, np.float32))
    out = {"token_embd.weight": get("model.embed_tokens.weight"), "output_norm.weight": get("model.norm.weight")}
    head = get("lm_head.weight")
    if head is not None and not np.array_equal(head, out["token_embd.weight"]):
        out["output.weight"] = head  # else tied: llama.cpp reads token_embd
    for i in range(spec.n_layers):
        lp = f"model.layers.{i}."
        out[f"blk.{i}.attn_norm.weight"] = get(lp + "input_layernorm.weight")
        out[f"blk.{i}.ffn_norm.weight"] = get(lp + "post_attention_layernorm.weight")
        for hf, gg in GGUF_NAMES.items():
            for kind in ("weight", "bias"):
                v = get(f"{lp}{hf}.{kind}")
                if v is None:
                    continue
                if arch == "llama" and hf == "self_attn.q_proj":
                    v = _permute_rows(v, spec.n_heads)
                elif arch == "llama" and hf == "self_attn.k_proj":
                    v = _permute_rows(v, spec.n_kv_heads)
                out[f"blk.{i}.{gg}.{kind}"] = np.ascontiguousarray(v)
    missing = [k for k, v in out.items() if v is None]
    if missing:
        raise PockError(f"export_gguf: no weight for {', '.join(missing[:4])} in the trainer's state")
    return out


def export_gguf(trainer, path, tokenizer=None) -> None:
    import gguf
    spec = getattr(trainer, "decoder", None)
    if spec is None or spec.reason is not None:
        why = "not a Llama-family causal LM" if spec is None else spec.reason
        raise PockError(f"export_gguf needs a Llama-family decoder (llama.cpp's tensor names): {why}")
    if spec.sliding_window:
        raise PockError("export_gguf: a sliding-window attention (Mistral's) is not written; llama.cpp's "
                        "\"llama\" architecture attends to the whole context")
    theta = _freq_base(spec)
    tensors = _tensors(spec, trainer.merged_state_dict())
    source = None
    if tokenizer is not None:
        try:
            source = gguf.GGUFReader(str(tokenizer))
        except (OSError, ValueError) as e:
            raise PockError(f"export_gguf: tokenizer {str(tokenizer)!r} is not a readable GGUF file: {e}") from None
    arch = "llama" if spec.arch == "mistral" else spec.arch
    path = Path(path)

    def write(tmp: Path) -> None:
        w = gguf.GGUFWriter(str(tmp), arch)
        w.add_type("model")
        w.add_name("PockEngine merged model")
        w.add_file_type(0)  # ALL_F32
        w.add_block_count(spec.n_layers)
        w.add_context_length(spec.max_context)
        w.add_embedding_length(spec.hidden)
        w.add_feed_forward_length(spec.intermediate)
        w.add_head_count(spec.n_heads)
        w.add_head_count_kv(spec.n_kv_heads)
        w.add_layer_norm_rms_eps(spec.eps)
        w.add_rope_freq_base(theta)
        w.add_rope_dimension_count(spec.head_dim)
        w.add_vocab_size(spec.vocab)
        if spec.head_dim * spec.n_heads != spec.hidden:
            w.add_key_length(spec.head_dim)
            w.add_value_length(spec.head_dim)
        if source is None:
            w.add_tokenizer_model("no_vocab")
        else:
            copied = 0
            for key, f in source.fields.items():
                if not key.startswith("tokenizer."):
                    continue
                vtype = f.types[0]
                sub = f.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
                w.add_key_value(key, f.contents(), vtype, sub)
                copied += 1
            if not copied:
                raise PockError(f"export_gguf: {str(tokenizer)!r} has no tokenizer.* metadata")
        for name, arr in tensors.items():
            w.add_tensor(name, arr)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()

    write_atomically(path, write, what="export_gguf: cannot write")
