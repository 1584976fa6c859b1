"""Tiny Hugging Face models built from configs with random init (nothing downloads).

Each builder returns (model, example_inputs, example_targets, loss, output); the encoder-decoder
families (T5, Whisper) give example_inputs as a dict of keyword inputs: the model in
train mode without dropout, batch 2 x seq 8 token ids or 2 x 3 x 32 x 32 images.
"""
from __future__ import annotations

import torch

B, T, V = 2, 8, 64


def _lm_common(**kw):
    return dict(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, max_position_embeddings=64, use_cache=False, **kw)


def _ids(seed=0, n=V):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, n, (B, T), generator=g)


def _lm(model):
    model.train()
    return model, (_ids(0),), (_ids(1),), "cross_entropy", "logits"


def llama(attn="sdpa"):
    from transformers import LlamaConfig, LlamaForCausalLM
    return _lm(LlamaForCausalLM(LlamaConfig(**_lm_common(), attn_implementation=attn)))


def qwen2(attn="sdpa"):
    from transformers import Qwen2Config, Qwen2ForCausalLM
    return _lm(Qwen2ForCausalLM(Qwen2Config(**_lm_common(), attn_implementation=attn)))


def mistral(attn="sdpa"):
    from transformers import MistralConfig, MistralForCausalLM
    return _lm(MistralForCausalLM(MistralConfig(**_lm_common(), attn_implementation=attn)))


def phi3(attn="sdpa"):
    from transformers import Phi3Config, Phi3ForCausalLM
    return _lm(Phi3ForCausalLM(Phi3Config(**_lm_common(), pad_token_id=0, attn_implementation=attn)))


def gemma(attn="sdpa"):
    from transformers import GemmaConfig, GemmaForCausalLM
    return _lm(GemmaForCausalLM(GemmaConfig(**_lm_common(), head_dim=8, attn_implementation=attn)))


def gpt2(attn="sdpa"):
    from transformers import GPT2Config, GPT2LMHeadModel
    cfg = GPT2Config(vocab_size=V, n_positions=64, n_embd=32, n_layer=2, n_head=4, resid_pdrop=0.0,
                     embd_pdrop=0.0, attn_pdrop=0.0, attn_implementation=attn)
    return _lm(GPT2LMHeadModel(cfg))


def bert(attn="sdpa"):
    from transformers import BertConfig, BertForMaskedLM
    cfg = BertConfig(vocab_size=V, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                     max_position_embeddings=64, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                     attn_implementation=attn)
    return _lm(BertForMaskedLM(cfg))


def distilbert(attn="sdpa"):
    from transformers import DistilBertConfig, DistilBertForMaskedLM
    cfg = DistilBertConfig(vocab_size=V, dim=32, n_layers=2, n_heads=4, hidden_dim=64, max_position_embeddings=64,
                           dropout=0.0, attention_dropout=0.0, attn_implementation=attn)
    return _lm(DistilBertForMaskedLM(cfg))


def bert_masks(attn="sdpa"):
    """BERT given an attention_mask (the second row padded) and token_type_ids: masks and
    token types that depend on the inputs (compare/where, the padding-mask lookup)."""
    model = bert(attn)[0]
    ids = _ids(0)
    mask = torch.ones(B, T, dtype=torch.long)
    mask[1, T - 3:] = 0
    types = torch.zeros(B, T, dtype=torch.long)
    types[:, T // 2:] = 1
    x = {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}
    return model, x, (_ids(1),), "cross_entropy", "logits"


def roberta(attn="sdpa"):
    """RoBERTa with padded input_ids: position ids from cumsum(input_ids.ne(pad)) and the
    token-type gather by those positions, both input-dependent; attention_mask from the ids."""
    from transformers import RobertaConfig, RobertaForMaskedLM
    cfg = RobertaConfig(vocab_size=V, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=64, max_position_embeddings=T + 4, hidden_dropout_prob=0.0,
                        attention_probs_dropout_prob=0.0, pad_token_id=1, attn_implementation=attn)
    model = RobertaForMaskedLM(cfg).train()
    ids = _ids(0)
    ids[1, T - 3:] = 1
    x = {"input_ids": ids, "attention_mask": ids.ne(1).long()}
    return model, x, (_ids(1),), "cross_entropy", "logits"


def t5(attn="eager"):
    from transformers import T5Config, T5ForConditionalGeneration
    cfg = T5Config(vocab_size=V, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4, dropout_rate=0.0,
                   relative_attention_num_buckets=8, relative_attention_max_distance=16, decoder_start_token_id=0,
                   attn_implementation=attn)
    m = T5ForConditionalGeneration(cfg).train()
    return m, {"input_ids": _ids(0), "decoder_input_ids": _ids(2)}, (_ids(1),), "cross_entropy", "logits"


def whisper(attn="sdpa"):
    from transformers import WhisperConfig, WhisperForConditionalGeneration
    cfg = WhisperConfig(vocab_size=V, num_mel_bins=8, encoder_layers=1, decoder_layers=1, d_model=32,
                        encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64,
                        max_source_positions=8, max_target_positions=16, dropout=0.0, attention_dropout=0.0,
                        activation_dropout=0.0, pad_token_id=0, bos_token_id=1, eos_token_id=2,
                        decoder_start_token_id=1, attn_implementation=attn)
    m = WhisperForConditionalGeneration(cfg).train()
    feats = torch.randn(B, 8, 16, generator=torch.Generator().manual_seed(3))
    return m, {"input_features": feats, "decoder_input_ids": _ids(2)}, (_ids(1),), "cross_entropy", "logits"


def _img(model, classes=10, batch=B):
    model.train()
    g = torch.Generator().manual_seed(0)
    x = torch.randn(batch, 3, 32, 32, generator=g)
    y = torch.randint(0, classes, (batch,), generator=g)
    return model, (x,), (y,), "cross_entropy", "logits"


def vit():
    from transformers import ViTConfig, ViTForImageClassification
    cfg = ViTConfig(image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                    intermediate_size=64, num_labels=10, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    return _img(ViTForImageClassification(cfg))


def mobilenet_v2(tf_padding=True):
    from transformers import MobileNetV2Config, MobileNetV2ForImageClassification
    cfg = MobileNetV2Config(image_size=32, depth_multiplier=0.25, num_labels=10, tf_padding=tf_padding,
                            classifier_dropout_prob=0.0)
    # batch 8: with 2 images, batch norm over the 1x1 late maps is too ill-conditioned for a fair
    # fp64 judgement (PyTorch fp32 itself drifts by 3e-3 in the loss); the test also lowers lr
    return _img(MobileNetV2ForImageClassification(cfg), batch=8)


def efficientnet():
    from transformers import EfficientNetConfig, EfficientNetForImageClassification
    cfg = EfficientNetConfig(image_size=32, width_coefficient=0.1, depth_coefficient=0.1, num_labels=10,
                             dropout_rate=0.0, drop_connect_rate=0.0, hidden_dim=128)
    return _img(EfficientNetForImageClassification(cfg))


def resnet():
    from transformers import ResNetConfig, ResNetForImageClassification
    cfg = ResNetConfig(embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1], num_labels=10)
    return _img(ResNetForImageClassification(cfg))


def convnext():
    from transformers import ConvNextConfig, ConvNextForImageClassification
    cfg = ConvNextConfig(num_stages=2, hidden_sizes=[8, 16], depths=[1, 1], num_labels=10)
    return _img(ConvNextForImageClassification(cfg))


def convnextv2():
    from transformers import ConvNextV2Config, ConvNextV2ForImageClassification
    cfg = ConvNextV2Config(num_stages=2, hidden_sizes=[8, 16], depths=[1, 1], num_labels=10)
    return _img(ConvNextV2ForImageClassification(cfg))


def regnet():
    from transformers import RegNetConfig, RegNetForImageClassification
    cfg = RegNetConfig(embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1], groups_width=8, num_labels=10)
    return _img(RegNetForImageClassification(cfg))


FAMILIES = {
    "llama": llama, "gpt2": gpt2, "gpt2_eager": lambda: gpt2("eager"), "bert": bert, "qwen2": qwen2,
    "mistral": mistral, "phi3": phi3, "gemma": gemma, "distilbert": distilbert, "vit": vit, "t5": t5,
    "whisper": whisper, "mobilenet_v2": mobilenet_v2, "mobilenet_v2_nopad": lambda: mobilenet_v2(False),
    "bert_masks": bert_masks, "roberta": roberta,
    "efficientnet": efficientnet, "resnet": resnet, "convnext": convnext, "convnextv2": convnextv2, "regnet": regnet,
}
