"""What the batch-invariance CPU tests share: patches applied for one test, vLLM's real
scheduler for a tiny Qwen3-Next with synthetic requests, the tiny model's config."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from pathlib import Path

import torch

from gdn_evidence.harness.scratch import scratch_folder
from vllm_gdn_invariant.models.tiny import TINY_QWEN3_NEXT

MAX_MODEL_LEN = 4096
ATTENTION_LAYER = "model.layers.3.self_attn.attn"
GDN_LAYER = "model.layers.0.linear_attn"


def model_folder(**overrides) -> Path:
    """A folder with the tiny Qwen3-Next's ``config.json`` (no tokenizer, no weights)."""
    folder = scratch_folder("gdn_bi_")
    config = {**TINY_QWEN3_NEXT, "max_position_embeddings": MAX_MODEL_LEN, **overrides}
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def vllm_config(
    folder: Path,
    *,
    budget: int,
    align_block: int | None = None,
    threshold: int = 0,
    prefix_match_unit: int | None = None,
    ssm_dtype: str = "auto",
):
    """The VllmConfig vLLM builds for the model in ``folder``: chunked prefill with a token
    budget of ``budget``; prefix caching in align mode with blocks of ``align_block`` tokens."""
    from vllm.config import CacheConfig, ModelConfig, SchedulerConfig, VllmConfig

    model = ModelConfig(
        model=str(folder), dtype="bfloat16", skip_tokenizer_init=True, max_model_len=MAX_MODEL_LEN
    )
    cache_fields = dict(block_size=16, enable_prefix_caching=False, mamba_ssm_cache_dtype=ssm_dtype)
    if align_block is not None:
        cache_fields.update(
            block_size=align_block,
            enable_prefix_caching=True,
            mamba_cache_mode="align",
            mamba_block_size=align_block,
        )
    if prefix_match_unit is not None:
        cache_fields["prefix_match_unit"] = prefix_match_unit
    scheduler = SchedulerConfig(
        max_num_seqs=min(64, budget),
        max_num_batched_tokens=budget,
        max_model_len=MAX_MODEL_LEN,
        is_encoder_decoder=False,
        enable_chunked_prefill=True,
        long_prefill_token_threshold=threshold,
    )
    config = VllmConfig(
        model_config=model, cache_config=CacheConfig(**cache_fields), scheduler_config=scheduler
    )
    config.cache_config.num_gpu_blocks = 8192
    return config


def kv_cache_config(config):
    """One full-attention group and one GDN group, as vLLM sizes them for the tiny model."""
    from vllm.v1.attention.backends.registry import MambaAttentionBackendEnum
    from vllm.v1.kv_cache_interface import (
        FullAttentionSpec,
        KVCacheConfig,
        KVCacheGroupSpec,
        MambaSpec,
    )

    cache = config.cache_config
    align = cache.mamba_cache_mode == "align"
    attention = FullAttentionSpec(
        block_size=cache.block_size, num_kv_heads=2, head_size=64, dtype=torch.bfloat16
    )
    names = {f.name for f in dataclasses.fields(MambaSpec)}
    fields = dict(
        block_size=cache.block_size if align else MAX_MODEL_LEN,
        shapes=((3, 512), (4, 64, 64)),
        dtypes=(torch.bfloat16, torch.float32),
        mamba_type=MambaAttentionBackendEnum.GDN_ATTN,
    )
    if "mamba_cache_mode" in names:
        fields["mamba_cache_mode"] = cache.mamba_cache_mode
    gdn = MambaSpec(**fields)
    return KVCacheConfig(
        num_blocks=8192,
        kv_cache_tensors=[],
        kv_cache_groups=[
            KVCacheGroupSpec([ATTENTION_LAYER], attention),
            KVCacheGroupSpec([GDN_LAYER], gdn),
        ],
    )


def scheduler(config):
    """vLLM's real ``Scheduler`` as the engine core builds it for ``config``."""
    from vllm.v1.core import kv_cache_utils
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.structured_output import StructuredOutputManager

    kv = kv_cache_config(config)
    block, hashed = kv_cache_utils.resolve_kv_cache_block_sizes(kv, config)
    sched = Scheduler(
        vllm_config=config,
        kv_cache_config=kv,
        structured_output_manager=StructuredOutputManager(config),
        block_size=block,
        hash_block_size=hashed,
    )
    sched.gdn_test_block_hasher = None
    if config.cache_config.enable_prefix_caching:
        from vllm.utils.hashing import get_hash_fn_by_name

        hash_fn = get_hash_fn_by_name(config.cache_config.prefix_caching_hash_algo)
        kv_cache_utils.init_none_hash(hash_fn)
        sched.gdn_test_block_hasher = kv_cache_utils.get_request_block_hasher(hashed, hash_fn)
    return sched


def request(request_id: str, prompt_len: int, first_token: int = 1, block_hasher=None):
    from vllm.sampling_params import SamplingParams
    from vllm.v1.request import Request

    tokens = [first_token + i % 400 for i in range(prompt_len)]
    return Request(
        request_id, tokens, SamplingParams(max_tokens=4), None, block_hasher=block_hasher
    )


def prefill_chunks(sched, prompts: dict[str, int], max_steps: int = 200) -> dict[str, list[int]]:
    """Schedule the prompts (all waiting at once) until every prompt is computed; the sizes of
    each request's prefill chunks, in order. No model runs: the scheduler advances
    ``num_computed_tokens`` itself, and a computed prompt asks for nothing more."""
    for request_id, length in prompts.items():
        hasher = sched.gdn_test_block_hasher
        sched.add_request(request(request_id, length, 1 + len(request_id), hasher))
    chunks: dict[str, list[int]] = {r: [] for r in prompts}
    for _ in range(max_steps):
        out = sched.schedule()
        for request_id, n in out.num_scheduled_tokens.items():
            chunks[request_id].append(n)
        if all(sum(c) >= prompts[r] for r, c in chunks.items()):
            return chunks
    raise AssertionError(f"prompts not computed after {max_steps} steps: {chunks}")


def chunk_ends(sizes: Sequence[int]) -> list[int]:
    """Token positions where each chunk ends."""
    ends, total = [], 0
    for n in sizes:
        total += n
        ends.append(total)
    return ends


def run_until_computed(sched, requests, generate=None, max_steps=400):
    """Schedule until every request has computed all its tokens; a request that has and
    still owes ``generate[id]`` tokens gets one more output token (as a decode step would
    produce). Returns each request's chunks as (start, size), in order."""
    generate = dict(generate or {})
    chunks = {r.request_id: [] for r in requests}
    for _ in range(max_steps):
        out = sched.schedule()
        for request_id, n in out.num_scheduled_tokens.items():
            req = sched.requests[request_id]
            chunks.setdefault(request_id, []).append((req.num_computed_tokens - n, n))
        for req in requests:
            if req.num_computed_tokens == req.num_tokens and generate.get(req.request_id, 0):
                req.append_output_token_ids(7)
                generate[req.request_id] -= 1
        if all(r.num_computed_tokens == r.num_tokens for r in requests) and not any(
            generate.values()
        ):
            return chunks
    raise AssertionError(f"not computed after {max_steps} steps: {chunks}")
