"""More tiny Hugging Face families (beyond hf_zoo.py's first set), built from configs with
random init (nothing downloads), same contract: each builder returns
(model, example_inputs, example_targets, loss, output).

Dropouts are zeroed so a train-mode step is deterministic; batch 2 x seq 8 token ids,
2 x 3 x 32 x 32 images or 2 x 400 raw audio samples.
"""
from __future__ import annotations

import importlib

import torch

from hf_zoo import B, T, V, _ids, _img, _lm, _lm_common


def _cls(name):
    return getattr(importlib.import_module("transformers"), name)


def _decoder(config, model, **kw):
    """A Llama-style config (hidden_size, intermediate_size, num_*_heads, ...)."""
    common = _lm_common()
    for k in list(common):
        if k in kw and kw[k] is None:
            del common[k], kw[k]
    common.update(kw)
    return _lm(_cls(model)(_cls(config)(**common)))


def _seq2seq(config, model, **kw):
    cfg = dict(vocab_size=V, d_model=32, encoder_layers=1, decoder_layers=1, encoder_attention_heads=4,
               decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=64,
               dropout=0.0, attention_dropout=0.0, activation_dropout=0.0, pad_token_id=1, bos_token_id=0,
               eos_token_id=2, decoder_start_token_id=2, use_cache=False)
    cfg.update(kw)
    m = _cls(model)(_cls(config)(**cfg)).train()
    return m, {"input_ids": _ids(0), "decoder_input_ids": _ids(2)}, (_ids(1),), "cross_entropy", "logits"


_BERT = dict(vocab_size=V, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
             max_position_embeddings=64, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)


def _encoder(config, model, **kw):
    cfg = dict(_BERT)
    cfg.update(kw)
    cfg = {k: v for k, v in cfg.items() if v is not None}
    return _lm(_cls(model)(_cls(config)(**cfg)))


_VIT = dict(image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
            intermediate_size=64, num_labels=10, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)


def _vision(config, model, **kw):
    cfg = dict(_VIT)
    cfg.update(kw)
    cfg = {k: v for k, v in cfg.items() if v is not None}
    return _img(_cls(model)(_cls(config)(**cfg)))


_TOWER = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64)


def _two_tower(config, model):
    """CLIP/SigLIP image classification: the vision tower of a two-tower config."""
    vision = dict(_TOWER, image_size=32, patch_size=8)
    cfg = _cls(config)(vision_config=vision, text_config=dict(_TOWER, vocab_size=V), num_labels=10)
    return _img(_cls(model)(cfg))


def _clip_text(config, model, output):
    """The text tower alone, trained to regress its embedding to a target (mse)."""
    m = _cls(model)(_cls(config)(**_TOWER, vocab_size=V, max_position_embeddings=T, projection_dim=16)).train()
    with torch.no_grad():
        dim = m(_ids(0))[output].shape[-1]
    y = torch.randn(B, dim, generator=torch.Generator().manual_seed(1))
    return m, (_ids(0),), (y,), "mse", output


def _audio(config, model, **kw):
    cfg = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
               conv_dim=(8, 8), conv_stride=(5, 2), conv_kernel=(10, 3), num_conv_pos_embeddings=16,
               num_conv_pos_embedding_groups=4, hidden_dropout=0.0, attention_dropout=0.0, activation_dropout=0.0,
               feat_proj_dropout=0.0, final_dropout=0.0, layerdrop=0.0, mask_time_prob=0.0,
               mask_feature_prob=0.0, num_labels=10, classifier_proj_size=16)
    cfg.update(kw)
    m = _cls(model)(_cls(config)(**cfg)).train()
    g = torch.Generator().manual_seed(0)
    x = torch.randn(B, 400, generator=g)
    y = torch.randint(0, 10, (B,), generator=g)
    return m, (x,), (y,), "cross_entropy", "logits"


def _t5like(config, model, **kw):
    cfg = dict(vocab_size=V, d_model=32, d_kv=8, d_ff=64, num_layers=1, num_heads=4, dropout_rate=0.0,
               relative_attention_num_buckets=8, relative_attention_max_distance=16, decoder_start_token_id=0,
               pad_token_id=0, eos_token_id=1, use_cache=False)
    cfg.update(kw)
    m = _cls(model)(_cls(config)(**cfg)).train()
    return m, {"input_ids": _ids(0), "decoder_input_ids": _ids(2)}, (_ids(1),), "cross_entropy", "logits"


def _speech2text():
    cfg = dict(vocab_size=V, d_model=32, encoder_layers=1, decoder_layers=1, encoder_attention_heads=4,
               decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, max_source_positions=16,
               max_target_positions=16, dropout=0.0, attention_dropout=0.0, activation_dropout=0.0,
               conv_channels=16, input_feat_per_channel=8, num_conv_layers=2, conv_kernel_sizes=[3, 3],
               pad_token_id=1, bos_token_id=0, eos_token_id=2, decoder_start_token_id=2, use_cache=False)
    m = _cls("Speech2TextForConditionalGeneration")(_cls("Speech2TextConfig")(**cfg)).train()
    feats = torch.randn(B, 16, 8, generator=torch.Generator().manual_seed(3))
    return m, {"input_features": feats, "decoder_input_ids": _ids(2)}, (_ids(1),), "cross_entropy", "logits"


def _ast():
    cfg = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
               hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, patch_size=8, frequency_stride=8,
               time_stride=8, max_length=32, num_mel_bins=16, num_labels=10)
    m = _cls("ASTForAudioClassification")(_cls("ASTConfig")(**cfg)).train()
    g = torch.Generator().manual_seed(0)
    return m, (torch.randn(B, 32, 16, generator=g),), (torch.randint(0, 10, (B,), generator=g),), \
        "cross_entropy", "logits"


def _dpt():
    """Dense prediction (depth) on a 4-layer ViT: the reassemble stage upsamples with
    ConvTranspose2d, the fusion stage with bilinear interpolation; mse to a depth map."""
    cfg = dict(_VIT, num_hidden_layers=4, backbone_out_indices=[0, 1, 2, 3], neck_hidden_sizes=[8, 16, 32, 32],
               reassemble_factors=[4, 2, 1, 0.5], fusion_hidden_size=16, head_in_index=-1, num_labels=None)
    cfg = {k: v for k, v in cfg.items() if v is not None}
    m = _cls("DPTForDepthEstimation")(_cls("DPTConfig")(**cfg)).train()
    g = torch.Generator().manual_seed(0)
    x = torch.randn(B, 3, 32, 32, generator=g)
    with torch.no_grad():
        shape = m(x).predicted_depth.shape
    return m, (x,), (torch.rand(shape, generator=g),), "mse", "predicted_depth"


def _depth(config, model, output="predicted_depth", size=32, **kw):
    """A dense regression head (depth map, super-resolved image) trained by mse to a random map."""
    m = _cls(model)(_cls(config)(**kw)).train()
    g = torch.Generator().manual_seed(0)
    x = torch.randn(B, 3, size, size, generator=g)
    with torch.no_grad():
        shape = m(x)[output].shape
    return m, (x,), (torch.rand(shape, generator=g),), "mse", output


def _with(fn, *a, **kw):
    return lambda: fn(*a, **kw)


EXTRA = {
    # decoders
    "opt": _with(_decoder, "OPTConfig", "OPTForCausalLM", ffn_dim=64, intermediate_size=None,
                 num_key_value_heads=None, word_embed_proj_dim=32, dropout=0.0, attention_dropout=0.0),
    "gpt_neox": _with(_decoder, "GPTNeoXConfig", "GPTNeoXForCausalLM", num_key_value_heads=None, rotary_pct=0.5,
                      hidden_dropout=0.0, attention_dropout=0.0),
    "falcon": _with(_decoder, "FalconConfig", "FalconForCausalLM", intermediate_size=None, num_key_value_heads=None,
                    hidden_dropout=0.0, attention_dropout=0.0),
    "bloom": _with(_decoder, "BloomConfig", "BloomForCausalLM", intermediate_size=None, num_key_value_heads=None,
                   max_position_embeddings=None, n_layer=2, n_head=4, num_hidden_layers=None,
                   num_attention_heads=None, hidden_dropout=0.0, attention_dropout=0.0),
    "gptj": _with(_decoder, "GPTJConfig", "GPTJForCausalLM", hidden_size=None, intermediate_size=None,
                  num_hidden_layers=None, num_attention_heads=None, num_key_value_heads=None,
                  max_position_embeddings=None, n_positions=64, n_embd=32, n_layer=2, n_head=4, rotary_dim=4,
                  resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0),
    "codegen": _with(_decoder, "CodeGenConfig", "CodeGenForCausalLM", hidden_size=None, intermediate_size=None,
                     num_hidden_layers=None, num_attention_heads=None, num_key_value_heads=None,
                     max_position_embeddings=None, n_positions=64, n_ctx=64, n_embd=32, n_layer=2, n_head=4,
                     rotary_dim=4, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0),
    "gpt_neo": _with(_decoder, "GPTNeoConfig", "GPTNeoForCausalLM", intermediate_size=None, num_key_value_heads=None,
                     num_hidden_layers=None, num_layers=2, num_heads=4, num_attention_heads=None,
                     attention_types=[[["global", "local"], 1]], window_size=4, resid_dropout=0.0,
                     embed_dropout=0.0, attention_dropout=0.0),
    "stablelm": _with(_decoder, "StableLmConfig", "StableLmForCausalLM", partial_rotary_factor=0.5,
                      hidden_dropout=0.0, attention_dropout=0.0),
    "phi": _with(_decoder, "PhiConfig", "PhiForCausalLM", partial_rotary_factor=0.5, resid_pdrop=0.0,
                 embd_pdrop=0.0, attention_dropout=0.0),
    "qwen3": _with(_decoder, "Qwen3Config", "Qwen3ForCausalLM", head_dim=8),
    "gemma2": _with(_decoder, "Gemma2Config", "Gemma2ForCausalLM", head_dim=8, sliding_window=4),
    "gemma3": _with(_decoder, "Gemma3TextConfig", "Gemma3ForCausalLM", head_dim=8, sliding_window=4),
    "olmo": _with(_decoder, "OlmoConfig", "OlmoForCausalLM"),
    "olmo2": _with(_decoder, "Olmo2Config", "Olmo2ForCausalLM"),
    "granite": _with(_decoder, "GraniteConfig", "GraniteForCausalLM"),
    "smollm3": _with(_decoder, "SmolLM3Config", "SmolLM3ForCausalLM", pad_token_id=0),
    "cohere": _with(_decoder, "CohereConfig", "CohereForCausalLM"),
    "starcoder2": _with(_decoder, "Starcoder2Config", "Starcoder2ForCausalLM", residual_dropout=0.0,
                        embedding_dropout=0.0),
    "gpt_bigcode": _with(_decoder, "GPTBigCodeConfig", "GPTBigCodeForCausalLM", hidden_size=None,
                         intermediate_size=None, num_hidden_layers=None, num_attention_heads=None,
                         num_key_value_heads=None, max_position_embeddings=None, n_positions=64, n_embd=32, n_layer=2,
                         n_head=4, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0),
    "biogpt": _with(_decoder, "BioGptConfig", "BioGptForCausalLM", num_key_value_heads=None, hidden_dropout_prob=0.0,
                    attention_probs_dropout_prob=0.0, activation_dropout=0.0, layerdrop=0.0),
    "xglm": _with(_decoder, "XGLMConfig", "XGLMForCausalLM", hidden_size=None, intermediate_size=None,
                  num_hidden_layers=None, num_attention_heads=None, num_key_value_heads=None, d_model=32, ffn_dim=64,
                  num_layers=2, attention_heads=4, dropout=0.0, attention_dropout=0.0, activation_dropout=0.0,
                  layerdrop=0.0),
    "mixtral": _with(_decoder, "MixtralConfig", "MixtralForCausalLM", num_local_experts=4, num_experts_per_tok=2),
    "qwen2_moe": _with(_decoder, "Qwen2MoeConfig", "Qwen2MoeForCausalLM", num_experts=4, num_experts_per_tok=2,
                       moe_intermediate_size=32, shared_expert_intermediate_size=64),
    "glm4": _with(_decoder, "Glm4Config", "Glm4ForCausalLM", head_dim=8, pad_token_id=0),
    "helium": _with(_decoder, "HeliumConfig", "HeliumForCausalLM", head_dim=8),
    "nemotron": _with(_decoder, "NemotronConfig", "NemotronForCausalLM", head_dim=8),
    "persimmon": _with(_decoder, "PersimmonConfig", "PersimmonForCausalLM", num_key_value_heads=None,
                       hidden_dropout=0.0, attention_dropout=0.0),
    "mpt": _with(_decoder, "MptConfig", "MptForCausalLM", hidden_size=None, intermediate_size=None,
                 num_hidden_layers=None, num_attention_heads=None, num_key_value_heads=None,
                 max_position_embeddings=None, d_model=32, n_heads=4, n_layers=2, expansion_ratio=2, max_seq_len=64),
    "openai_gpt": _with(_decoder, "OpenAIGPTConfig", "OpenAIGPTLMHeadModel", hidden_size=None,
                        intermediate_size=None, num_hidden_layers=None, num_attention_heads=None,
                        num_key_value_heads=None, max_position_embeddings=None, n_positions=64, n_embd=32, n_layer=2,
                        n_head=4, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0),
    "mamba": _with(_decoder, "MambaConfig", "MambaForCausalLM", intermediate_size=None, num_attention_heads=None,
                   num_key_value_heads=None, max_position_embeddings=None, state_size=4, expand=2, conv_kernel=4,
                   pad_token_id=0),
    "recurrent_gemma": _with(_decoder, "RecurrentGemmaConfig", "RecurrentGemmaForCausalLM",
                             max_position_embeddings=None,
                             lru_width=32, attention_window_size=4, conv1d_width=4, pad_token_id=0,
                             block_types=["recurrent", "attention"]),
    "exaone4": _with(_decoder, "Exaone4Config", "Exaone4ForCausalLM", sliding_window=4),
    "ernie4_5": _with(_decoder, "Ernie4_5Config", "Ernie4_5ForCausalLM", head_dim=8),
    "arcee": _with(_decoder, "ArceeConfig", "ArceeForCausalLM", head_dim=8),
    "olmo3": _with(_decoder, "Olmo3Config", "Olmo3ForCausalLM", sliding_window=4),
    "qwen3_moe": _with(_decoder, "Qwen3MoeConfig", "Qwen3MoeForCausalLM", moe_intermediate_size=32,
                       num_experts=4, num_experts_per_tok=2),
    "ctrl": _with(_decoder, "CTRLConfig", "CTRLLMHeadModel", hidden_size=None, intermediate_size=None,
                  num_hidden_layers=None, num_attention_heads=None, num_key_value_heads=None,
                  max_position_embeddings=None, n_positions=64, n_embd=32, dff=64, n_layer=2, n_head=4,
                  resid_pdrop=0.0, embd_pdrop=0.0),
    "xlnet": _with(_decoder, "XLNetConfig", "XLNetLMHeadModel", hidden_size=None, intermediate_size=None,
                   num_hidden_layers=None, num_attention_heads=None, num_key_value_heads=None,
                   max_position_embeddings=None, use_cache=None, d_model=32, n_layer=2, n_head=4, d_inner=64,
                   dropout=0.0),
    "bert_generation": _with(_encoder, "BertGenerationConfig", "BertGenerationDecoder", is_decoder=True),
    # encoder-decoders
    "mt5": _with(_t5like, "MT5Config", "MT5ForConditionalGeneration"),
    "umt5": _with(_t5like, "UMT5Config", "UMT5ForConditionalGeneration"),
    "longt5": _with(_t5like, "LongT5Config", "LongT5ForConditionalGeneration", local_radius=2, global_block_size=4),
    "speech2text": _speech2text,
    "ast": _ast,
    "bart": _with(_seq2seq, "BartConfig", "BartForConditionalGeneration"),
    "mbart": _with(_seq2seq, "MBartConfig", "MBartForConditionalGeneration"),
    "pegasus": _with(_seq2seq, "PegasusConfig", "PegasusForConditionalGeneration"),
    "marian": _with(_seq2seq, "MarianConfig", "MarianMTModel", decoder_vocab_size=V, pad_token_id=V - 1),
    "blenderbot": _with(_seq2seq, "BlenderbotConfig", "BlenderbotForConditionalGeneration"),
    # encoders
    "albert": _with(_encoder, "AlbertConfig", "AlbertForMaskedLM", embedding_size=16),
    "electra": _with(_encoder, "ElectraConfig", "ElectraForMaskedLM", embedding_size=16),
    "xlm_roberta": _with(_encoder, "XLMRobertaConfig", "XLMRobertaForMaskedLM", pad_token_id=1,
                         max_position_embeddings=T + 4),
    "deberta_v2": _with(_encoder, "DebertaV2Config", "DebertaV2ForMaskedLM", relative_attention=True,
                        position_buckets=8, max_relative_positions=16, pos_att_type=["p2c", "c2p"]),
    "deberta": _with(_encoder, "DebertaConfig", "DebertaForMaskedLM", relative_attention=True,
                     max_relative_positions=16, pos_att_type=["p2c", "c2p"]),
    "mpnet": _with(_encoder, "MPNetConfig", "MPNetForMaskedLM"),
    "convbert": _with(_encoder, "ConvBertConfig", "ConvBertForMaskedLM", embedding_size=32),
    "funnel": _with(_encoder, "FunnelConfig", "FunnelForMaskedLM", hidden_size=None, num_hidden_layers=None,
                    num_attention_heads=None, intermediate_size=None, max_position_embeddings=None,
                    hidden_dropout_prob=None, attention_probs_dropout_prob=None, block_sizes=[1, 1], d_model=32,
                    n_head=4, d_head=8, d_inner=64, hidden_dropout=0.0, attention_dropout=0.0,
                    activation_dropout=0.0),
    "modernbert": _with(_encoder, "ModernBertConfig", "ModernBertForMaskedLM", hidden_dropout_prob=None,
                        attention_probs_dropout_prob=None, global_attn_every_n_layers=2, local_attention=4,
                        pad_token_id=0,
                        bos_token_id=0, eos_token_id=0, cls_token_id=0, sep_token_id=0),
    "roformer": _with(_encoder, "RoFormerConfig", "RoFormerForMaskedLM", embedding_size=32),
    "megatron_bert": _with(_encoder, "MegatronBertConfig", "MegatronBertForMaskedLM"),
    "squeezebert": _with(_encoder, "SqueezeBertConfig", "SqueezeBertForMaskedLM", embedding_size=32, q_groups=2,
                         k_groups=2, v_groups=2, post_attention_groups=2, intermediate_groups=2, output_groups=2),
    "rembert": _with(_encoder, "RemBertConfig", "RemBertForMaskedLM", input_embedding_size=16,
                     output_embedding_size=16),
    "nystromformer": _with(_encoder, "NystromformerConfig", "NystromformerForMaskedLM", segment_means_seq_len=T,
                           num_landmarks=4, conv_kernel_size=3),
    "xlm": _with(_encoder, "XLMConfig", "XLMWithLMHeadModel", hidden_size=None, num_hidden_layers=None,
                 num_attention_heads=None, intermediate_size=None, hidden_dropout_prob=None,
                 attention_probs_dropout_prob=None, emb_dim=32, n_layers=2, n_heads=4, dropout=0.0,
                 attention_dropout=0.0),
    "layoutlm": _with(_encoder, "LayoutLMConfig", "LayoutLMForMaskedLM"),
    # vision
    "deit": _with(_vision, "DeiTConfig", "DeiTForImageClassification"),
    "beit": _with(_vision, "BeitConfig", "BeitForImageClassification", use_relative_position_bias=True,
                  drop_path_rate=0.0),
    "data2vec_vision": _with(_vision, "Data2VecVisionConfig", "Data2VecVisionForImageClassification",
                             drop_path_rate=0.0, use_relative_position_bias=True),
    "dinov2": _with(_vision, "Dinov2Config", "Dinov2ForImageClassification", mlp_ratio=2,
                    intermediate_size=None),
    "swin": _with(_vision, "SwinConfig", "SwinForImageClassification", patch_size=2, embed_dim=16, depths=[1, 1],
                  num_heads=[2, 4], window_size=4, hidden_size=None, num_hidden_layers=None,
                  num_attention_heads=None, intermediate_size=None, drop_path_rate=0.0),
    "swinv2": _with(_vision, "Swinv2Config", "Swinv2ForImageClassification", patch_size=2, embed_dim=16,
                    depths=[1, 1], num_heads=[2, 4], window_size=4, hidden_size=None, num_hidden_layers=None,
                    num_attention_heads=None, intermediate_size=None, drop_path_rate=0.0),
    "clip_vision": lambda: _two_tower("CLIPConfig", "CLIPForImageClassification"),
    "siglip": lambda: _two_tower("SiglipConfig", "SiglipForImageClassification"),
    "clip_text": lambda: _clip_text("CLIPTextConfig", "CLIPTextModelWithProjection", "text_embeds"),
    "siglip_text": lambda: _clip_text("SiglipTextConfig", "SiglipTextModel", "pooler_output"),
    "segformer": _with(_vision, "SegformerConfig", "SegformerForImageClassification", num_encoder_blocks=2,
                       depths=[1, 1], sr_ratios=[2, 1], hidden_sizes=[16, 32], patch_sizes=[7, 3], strides=[4, 2],
                       num_attention_heads=[1, 2], hidden_size=None, num_hidden_layers=None,
                       intermediate_size=None, patch_size=None, mlp_ratios=[2, 2], drop_path_rate=0.0,
                       decoder_hidden_size=32),
    "mobilevit": _with(_vision, "MobileViTConfig", "MobileViTForImageClassification", hidden_size=None,
                       num_hidden_layers=None, num_attention_heads=None, intermediate_size=None, patch_size=2,
                       hidden_sizes=[16, 24, 32], neck_hidden_sizes=[8, 8, 16, 16, 24, 24, 48],
                       hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, classifier_dropout_prob=0.0),
    "mobilenet_v1": _with(_vision, "MobileNetV1Config", "MobileNetV1ForImageClassification", hidden_size=None,
                          num_hidden_layers=None, num_attention_heads=None, intermediate_size=None, patch_size=None,
                          hidden_dropout_prob=None, attention_probs_dropout_prob=None, depth_multiplier=0.25,
                          classifier_dropout_prob=0.0, tf_padding=False),
    "poolformer": _with(_vision, "PoolFormerConfig", "PoolFormerForImageClassification", hidden_size=None,
                        num_hidden_layers=None, num_attention_heads=None, intermediate_size=None, patch_size=None,
                        hidden_dropout_prob=None, attention_probs_dropout_prob=None, depths=[1, 1],
                        hidden_sizes=[8, 16], num_encoder_blocks=2, patch_sizes=[7, 3], strides=[4, 2],
                        padding=[2, 1], drop_path_rate=0.0),
    "levit": _with(_vision, "LevitConfig", "LevitForImageClassification", hidden_size=None, num_hidden_layers=None,
                   num_attention_heads=[2, 2, 2], intermediate_size=None, patch_size=None, hidden_dropout_prob=None,
                   attention_probs_dropout_prob=None, hidden_sizes=[16, 24, 32], key_dim=[8, 8, 8],
                   depths=[1, 1, 1], mlp_ratio=[2, 2, 2], attention_ratio=[2, 2, 2], drop_path_rate=0),
    "bit": _with(_vision, "BitConfig", "BitForImageClassification", hidden_size=None, num_hidden_layers=None,
                 num_attention_heads=None, intermediate_size=None, patch_size=None, hidden_dropout_prob=None,
                 attention_probs_dropout_prob=None, embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1],
                 num_groups=4, layer_type="bottleneck"),
    "cvt": _with(_vision, "CvtConfig", "CvtForImageClassification", hidden_size=None, num_hidden_layers=None,
                 num_attention_heads=None, intermediate_size=None, patch_size=None, hidden_dropout_prob=None,
                 attention_probs_dropout_prob=None, embed_dim=[16, 16, 32], num_heads=[1, 1, 2], depth=[1, 2, 3],
                 mlp_ratio=[2.0, 2.0, 2.0], drop_path_rate=[0.0, 0.0, 0.0]),
    "focalnet": _with(_vision, "FocalNetConfig", "FocalNetForImageClassification", hidden_size=None,
                      num_hidden_layers=None, num_attention_heads=None, intermediate_size=None, patch_size=4,
                      embed_dim=16, depths=[1, 1], focal_levels=[2, 2], focal_windows=[3, 3], drop_path_rate=0.0),
    "pvt": _with(_vision, "PvtConfig", "PvtForImageClassification", hidden_size=None, num_hidden_layers=None,
                 intermediate_size=None, patch_size=None, num_encoder_blocks=2, depths=[1, 1],
                 sequence_reduction_ratios=[2, 1], hidden_sizes=[16, 32], patch_sizes=[4, 2], strides=[4, 2],
                 num_attention_heads=[1, 2], mlp_ratios=[2, 2], drop_path_rate=0.0),
    "hiera": _with(_vision, "HieraConfig", "HieraForImageClassification", image_size=[32, 32], hidden_size=None,
                   num_hidden_layers=None,
                   num_attention_heads=None, intermediate_size=None, patch_size=[3, 3], hidden_dropout_prob=None,
                   attention_probs_dropout_prob=None, embed_dim=8, patch_stride=[2, 2], patch_padding=[1, 1],
                   depths=[1, 1], num_heads=[1, 2], num_query_pool=1, query_stride=[2, 2],
                   masked_unit_size=[4, 4], masked_unit_attention=[True, False], drop_path_rate=0.0),
    "dpt": _dpt,
    "glpn": lambda: _depth("GLPNConfig", "GLPNForDepthEstimation", num_encoder_blocks=2, depths=[1, 1],
                           sr_ratios=[2, 1], hidden_sizes=[16, 32], patch_sizes=[7, 3], strides=[4, 2],
                           num_attention_heads=[1, 2], mlp_ratios=[2, 2], drop_path_rate=0.0,
                           decoder_hidden_size=16, head_in_index=-1),
    "swin2sr": lambda: _depth("Swin2SRConfig", "Swin2SRForImageSuperResolution", image_size=16, patch_size=1,
                              embed_dim=16, depths=[1, 1], num_heads=[2, 2], window_size=4, mlp_ratio=2.0,
                              upscale=2, drop_path_rate=0.0, output="reconstruction", size=16),
    # audio
    "unispeech": _with(_audio, "UniSpeechConfig", "UniSpeechForSequenceClassification"),
    "wav2vec2": _with(_audio, "Wav2Vec2Config", "Wav2Vec2ForSequenceClassification"),
    "hubert": _with(_audio, "HubertConfig", "HubertForSequenceClassification"),
    "wavlm": _with(_audio, "WavLMConfig", "WavLMForSequenceClassification", num_buckets=8, max_bucket_distance=16),
    "data2vec_audio": _with(_audio, "Data2VecAudioConfig", "Data2VecAudioForSequenceClassification"),
    "sew": _with(_audio, "SEWConfig", "SEWForSequenceClassification", squeeze_factor=2),
}
