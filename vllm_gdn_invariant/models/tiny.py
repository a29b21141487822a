"""A tiny Qwen3-Next checkpoint folder (config and tokenizer, no weights) for demos and tests.

vLLM serves it with ``load_format="dummy"``. The tokenizer is a word-level one built
locally: words ``w0`` … ``w{n}``, split on whitespace.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

SPECIAL_TOKENS = ("<unk>", "<s>", "</s>", "<pad>")
VOCAB_SIZE = 512

TINY_QWEN3_NEXT: dict[str, Any] = {
    "architectures": ["Qwen3NextForCausalLM"],
    "model_type": "qwen3_next",
    "vocab_size": VOCAB_SIZE,
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 4,
    "full_attention_interval": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "linear_conv_kernel_dim": 4,
    "linear_key_head_dim": 64,
    "linear_value_head_dim": 64,
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "num_experts": 4,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 64,
    "shared_expert_intermediate_size": 64,
    "decoder_sparse_step": 1,
    "max_position_embeddings": 2048,
    "rms_norm_eps": 1e-6,
    "torch_dtype": "bfloat16",
    "tie_word_embeddings": False,
    "bos_token_id": 1,
    "eos_token_id": 2,
}

# Qwen3-Next's GDN layer shapes (16 key and 32 value heads of 128, conv width 4; hidden 2048)
# with 8 layers (6 GDN, 2 attention) and 64 experts, 8 per token: the engine benchmarks' model.
BENCH_QWEN3_NEXT: dict[str, Any] = {
    **TINY_QWEN3_NEXT,
    "vocab_size": 32768,
    "hidden_size": 2048,
    "num_hidden_layers": 8,
    "full_attention_interval": 4,
    "num_attention_heads": 16,
    "num_key_value_heads": 2,
    "head_dim": 256,
    "linear_num_key_heads": 16,
    "linear_num_value_heads": 32,
    "linear_key_head_dim": 128,
    "linear_value_head_dim": 128,
    "linear_conv_kernel_dim": 4,
    "num_experts": 64,
    "num_experts_per_tok": 8,
    "moe_intermediate_size": 512,
    "shared_expert_intermediate_size": 512,
    "intermediate_size": 5120,
    "max_position_embeddings": 4096,
}

# The demo's workload (the shadow engine check runs it too): a short target among six others.
DEMO_TARGET_WORDS = 12
DEMO_OTHER_WORDS = (300, 37, 64, 5, 150, 1)


def words(n: int, start: int = 0) -> str:
    """A prompt of ``n`` vocabulary words."""
    count = VOCAB_SIZE - len(SPECIAL_TOKENS)
    return " ".join(f"w{(start + i) % count}" for i in range(n))


def write_tiny_model(folder: str | Path, **overrides: Any) -> Path:
    """Write ``config.json`` and a word-level tokenizer into ``folder``; return it."""
    path = Path(folder)
    path.mkdir(parents=True, exist_ok=True)
    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
    for i in range(VOCAB_SIZE - len(SPECIAL_TOKENS)):
        vocab[f"w{i}"] = len(vocab)
    tokenizer = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        unk_token="<unk>",
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
    ).save_pretrained(str(path))
    config = {**TINY_QWEN3_NEXT, **overrides}
    (path / "config.json").write_text(json.dumps(config, indent=1), encoding="utf-8")
    return path
