"""Tiny Qwen3-Next (MoE) and dense Qwen3.5 checkpoints with seeded random weights.

``load_format="dummy"`` fills weights uniformly within ±1e-3: every logit is then almost the
same and greedy decoding repeats one token, so two runs that differ inside the model still
agree on every token, and a test of batch invariance cannot fail. These folders hold real
``model.safetensors`` files instead, drawn from a seeded generator with a scale that keeps
activations of order one through the layers (linear weights ``N(0, 1/fan_in)``, norms near
one, GDN decay parameters as the reference initialisation draws them), so greedy tokens
depend on the context. The parameter names are those of the Hugging Face checkpoints, which
vLLM's loaders read: per-expert MoE weights (``mlp.experts.{e}.gate_proj``) for Qwen3-Next;
``model.language_model.*`` with split GDN projections (``in_proj_qkv``, ``in_proj_z``,
``in_proj_b``, ``in_proj_a``) for Qwen3.5, whose vision tower is not written (vLLM skips it
with ``language_model_only=True``).

* Qwen3-Next: ``Qwen3NextForCausalLM`` (every supported vLLM).
* Qwen3.5: ``Qwen3_5ForConditionalGeneration`` with ``language_model_only=True`` (vLLM 0.26
  registers dense Qwen3.5 only under that architecture; 0.27+ also as ``Qwen3_5ForCausalLM``).
  Building it needs the multimodal model code to import, which on some installs needs
  torchvision.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import torch

from vllm_gdn_invariant.models.tiny import TINY_QWEN3_NEXT, VOCAB_SIZE, write_tiny_model

# Qwen3-Next for the end-to-end test: 16 experts, 2 per token, so that a step of one or two
# tokens takes vLLM's small-batch MoE path (no block alignment) and larger steps the other.
QWEN3_NEXT_E2E: dict[str, Any] = {
    **TINY_QWEN3_NEXT,
    "num_experts": 16,
    "num_experts_per_tok": 2,
    "norm_topk_prob": True,
}

# Qwen3-Next's GDN head shapes (16 key and 32 value heads of 128, conv width 4) in a small
# model otherwise (hidden 512, 4 layers: 3 GDN + 1 attention): the kernels' tiles of the full
# model's GDN layers, with seeded weights that keep greedy tokens context-dependent. Eight KV
# heads of 256 (Qwen3-Next has two) keep vLLM's hybrid KV block at a few hundred tokens
# beside the 2 MiB recurrent state, so that a long generation grows across blocks.
QWEN3_NEXT_GDN_DIMS: dict[str, Any] = {
    **QWEN3_NEXT_E2E,
    "hidden_size": 512,
    "intermediate_size": 1024,
    "num_attention_heads": 8,
    "num_key_value_heads": 8,
    "head_dim": 256,
    "linear_num_key_heads": 16,
    "linear_num_value_heads": 32,
    "linear_key_head_dim": 128,
    "linear_value_head_dim": 128,
    "moe_intermediate_size": 128,
    "shared_expert_intermediate_size": 128,
}

# Dense Qwen3.5 (text part), the dimensions of the tiny Qwen3-Next.
QWEN3_5_EXTRA_TOKENS = 4  # image, video, vision start/end ids, past the tokenizer's words
SHARED_WITH_TINY_QWEN3_NEXT = (
    "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
    "num_key_value_heads", "head_dim", "linear_conv_kernel_dim", "linear_key_head_dim",
    "linear_value_head_dim", "linear_num_key_heads", "linear_num_value_heads", "rms_norm_eps",
    "tie_word_embeddings", "torch_dtype", "bos_token_id", "eos_token_id",
)  # fmt: skip
QWEN3_5_TEXT: dict[str, Any] = {
    "model_type": "qwen3_5_text",
    "vocab_size": VOCAB_SIZE + QWEN3_5_EXTRA_TOKENS,
    **{key: TINY_QWEN3_NEXT[key] for key in SHARED_WITH_TINY_QWEN3_NEXT},
    "layer_types": ["linear_attention"] * 3 + ["full_attention"],
    "hidden_act": "silu",
    "max_position_embeddings": 4096,
    "rope_parameters": {
        "rope_type": "default",
        "rope_theta": 10000.0,
        "partial_rotary_factor": 0.25,
        "mrope_interleaved": True,
        "mrope_section": [3, 3, 2],
    },
    "mamba_ssm_dtype": "float32",
}
QWEN3_5_VISION: dict[str, Any] = {
    "model_type": "qwen3_5",
    "depth": 1,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_heads": 2,
    "in_channels": 3,
    "patch_size": 16,
    "spatial_merge_size": 2,
    "temporal_patch_size": 2,
    "out_hidden_size": 128,
    "num_position_embeddings": 2304,
}


def qwen3_5_config(**text_overrides: Any) -> dict[str, Any]:
    """``config.json`` of the tiny dense Qwen3.5 (``Qwen3_5ForConditionalGeneration``)."""
    ids = range(VOCAB_SIZE, VOCAB_SIZE + QWEN3_5_EXTRA_TOKENS)
    image, video, start, end = ids
    return {
        "architectures": ["Qwen3_5ForConditionalGeneration"],
        "model_type": "qwen3_5",
        "text_config": {**QWEN3_5_TEXT, **text_overrides},
        "vision_config": QWEN3_5_VISION,
        "image_token_id": image,
        "video_token_id": video,
        "vision_start_token_id": start,
        "vision_end_token_id": end,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
    }


def _linear(generator: torch.Generator, out_dim: int, in_dim: int) -> torch.Tensor:
    return torch.randn(out_dim, in_dim, generator=generator) / math.sqrt(in_dim)


def _norm(generator: torch.Generator, dim: int, offset: float = 1.0) -> torch.Tensor:
    return offset + 0.1 * torch.randn(dim, generator=generator)


def _gdn_params(generator: torch.Generator, c: dict[str, Any]) -> dict[str, torch.Tensor]:
    """The GDN layer's parameters that both models share (names after ``linear_attn.``)."""
    hk, dk = c["linear_num_key_heads"], c["linear_key_head_dim"]
    hv, dv = c["linear_num_value_heads"], c["linear_value_head_dim"]
    width = c["linear_conv_kernel_dim"]
    conv_dim = 2 * hk * dk + hv * dv
    return {
        "dt_bias": torch.randn(hv, generator=generator) * 0.5,
        "A_log": torch.log(torch.empty(hv).uniform_(1.0, 16.0, generator=generator)),
        "conv1d.weight": torch.randn(conv_dim, 1, width, generator=generator) / math.sqrt(width),
        "norm.weight": _norm(generator, dv),
        "out_proj.weight": _linear(generator, c["hidden_size"], hv * dv),
    }


def _attention_params(generator: torch.Generator, c: dict[str, Any]) -> dict[str, torch.Tensor]:
    """Gated full attention (``q_proj`` also yields the output gate)."""
    h, d = c["hidden_size"], c["head_dim"]
    heads, kv_heads = c["num_attention_heads"], c["num_key_value_heads"]
    return {
        "q_proj.weight": _linear(generator, 2 * heads * d, h),
        "k_proj.weight": _linear(generator, kv_heads * d, h),
        "v_proj.weight": _linear(generator, kv_heads * d, h),
        "o_proj.weight": _linear(generator, h, heads * d),
        "q_norm.weight": _norm(generator, d),
        "k_norm.weight": _norm(generator, d),
    }


def _mlp_params(generator: torch.Generator, hidden: int, inner: int) -> dict[str, torch.Tensor]:
    return {
        "gate_proj.weight": _linear(generator, inner, hidden),
        "up_proj.weight": _linear(generator, inner, hidden),
        "down_proj.weight": _linear(generator, hidden, inner),
    }


def qwen3_next_weights(config: dict[str, Any], seed: int) -> dict[str, torch.Tensor]:
    """Every tensor of a Qwen3-Next checkpoint with ``config``, seeded, in float32."""
    g = torch.Generator().manual_seed(seed)
    c = config
    h = c["hidden_size"]
    hk, dk = c["linear_num_key_heads"], c["linear_key_head_dim"]
    hv, dv = c["linear_num_value_heads"], c["linear_value_head_dim"]
    out = {"model.embed_tokens.weight": torch.randn(c["vocab_size"], h, generator=g)}
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        out[p + "input_layernorm.weight"] = _norm(g, h)
        out[p + "post_attention_layernorm.weight"] = _norm(g, h)
        if (i + 1) % c["full_attention_interval"]:
            gdn = _gdn_params(g, c)
            gdn["in_proj_qkvz.weight"] = _linear(g, 2 * hk * dk + 2 * hv * dv, h)
            gdn["in_proj_ba.weight"] = _linear(g, 2 * hv, h)
            out.update({p + "linear_attn." + k: v for k, v in gdn.items()})
        else:
            out.update({p + "self_attn." + k: v for k, v in _attention_params(g, c).items()})
        out[p + "mlp.gate.weight"] = _linear(g, c["num_experts"], h)
        for e in range(c["num_experts"]):
            expert = _mlp_params(g, h, c["moe_intermediate_size"])
            out.update({f"{p}mlp.experts.{e}.{k}": v for k, v in expert.items()})
        shared = _mlp_params(g, h, c["shared_expert_intermediate_size"])
        out.update({p + "mlp.shared_expert." + k: v for k, v in shared.items()})
        out[p + "mlp.shared_expert_gate.weight"] = _linear(g, 1, h)
    out["model.norm.weight"] = _norm(g, h)
    out["lm_head.weight"] = _linear(g, c["vocab_size"], h)
    return out


def qwen3_5_weights(text: dict[str, Any], seed: int) -> dict[str, torch.Tensor]:
    """The text model's tensors of a Qwen3.5 checkpoint (``model.language_model.*``, ``lm_head``).

    Qwen3.5's RMSNorms scale by ``1 + weight``, so their weights are drawn near zero."""
    g = torch.Generator().manual_seed(seed)
    c = text
    h = c["hidden_size"]
    hk, dk = c["linear_num_key_heads"], c["linear_key_head_dim"]
    hv, dv = c["linear_num_value_heads"], c["linear_value_head_dim"]
    root = "model.language_model."
    out = {root + "embed_tokens.weight": torch.randn(c["vocab_size"], h, generator=g)}
    for i, kind in enumerate(c["layer_types"]):
        p = f"{root}layers.{i}."
        out[p + "input_layernorm.weight"] = _norm(g, h, offset=0.0)
        out[p + "post_attention_layernorm.weight"] = _norm(g, h, offset=0.0)
        if kind == "linear_attention":
            gdn = _gdn_params(g, c)
            gdn["in_proj_qkv.weight"] = _linear(g, 2 * hk * dk + hv * dv, h)
            gdn["in_proj_z.weight"] = _linear(g, hv * dv, h)
            gdn["in_proj_b.weight"] = _linear(g, hv, h)
            gdn["in_proj_a.weight"] = _linear(g, hv, h)
            out.update({p + "linear_attn." + k: v for k, v in gdn.items()})
        else:
            attention = _attention_params(g, c)
            attention["q_norm.weight"] = _norm(g, c["head_dim"], offset=0.0)
            attention["k_norm.weight"] = _norm(g, c["head_dim"], offset=0.0)
            out.update({p + "self_attn." + k: v for k, v in attention.items()})
        out.update(
            {p + "mlp." + k: v for k, v in _mlp_params(g, h, c["intermediate_size"]).items()}
        )
    out[root + "norm.weight"] = _norm(g, h, offset=0.0)
    out["lm_head.weight"] = _linear(g, c["vocab_size"], h)
    return out


MODELS = ("qwen3_next", "qwen3_5", "qwen3_next_dims")
QWEN3_NEXT_CONFIGS = {"qwen3_next": QWEN3_NEXT_E2E, "qwen3_next_dims": QWEN3_NEXT_GDN_DIMS}

# What vLLM shards across tensor-parallel ranks, per model: every count must divide by the size.
SHARDED_BY_TENSOR_PARALLEL = (
    "linear_num_key_heads",
    "linear_num_value_heads",
    "num_attention_heads",
    "intermediate_size",
    "moe_intermediate_size",
    "shared_expert_intermediate_size",
)


def text_config(model: str) -> dict[str, Any]:
    """The language model's configuration of :data:`MODELS` ``model`` (Qwen3.5: its text part)."""
    if model not in MODELS:
        raise ValueError(f"model={model!r} is not one of {', '.join(MODELS)}")
    return dict(QWEN3_NEXT_CONFIGS.get(model, QWEN3_5_TEXT))


def sharding_problems(config: dict[str, Any], size: int, name: str) -> list[str]:
    """Why a model of ``config`` (named ``name`` in the messages) cannot run at
    tensor-parallel ``size`` (empty: it can). The sharded counts
    (:data:`SHARDED_BY_TENSOR_PARALLEL`) must divide by ``size``; the attention's KV heads are
    split (``size`` divides them) or replicated (they divide ``size``), as vLLM allows."""
    problems = [
        f"{name}: {key}={config[key]} does not divide by tensor_parallel_size={size}"
        for key in SHARDED_BY_TENSOR_PARALLEL
        if key in config and config[key] % size
    ]
    kv_heads = config["num_key_value_heads"]
    if kv_heads % size and size % kv_heads:
        problems.append(
            f"{name}: num_key_value_heads={kv_heads} neither divides nor is divided by "
            f"tensor_parallel_size={size}"
        )
    return problems


def tensor_parallel_problems(model: str, size: int) -> list[str]:
    """:func:`sharding_problems` of :data:`MODELS` ``model``."""
    return sharding_problems(text_config(model), size, model)


def write_weighted_model(folder: str | Path, model: str = "qwen3_next", seed: int = 0) -> Path:
    """Write config, word-level tokenizer and seeded ``model.safetensors`` (bf16) into
    ``folder``; ``model`` is one of :data:`MODELS`. Return the folder."""
    from safetensors.torch import save_file

    if model not in MODELS:
        raise ValueError(f"model={model!r} is not one of {', '.join(MODELS)}")
    path = write_tiny_model(folder)
    if model in QWEN3_NEXT_CONFIGS:
        config = dict(QWEN3_NEXT_CONFIGS[model])
        weights = qwen3_next_weights(config, seed)
    else:
        config = qwen3_5_config()
        weights = qwen3_5_weights(config["text_config"], seed)
    (path / "config.json").write_text(json.dumps(config, indent=1), encoding="utf-8")
    tensors = {k: v.to(torch.bfloat16).contiguous() for k, v in weights.items()}
    save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})
    return path
