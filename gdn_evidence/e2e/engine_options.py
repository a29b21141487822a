"""Engine arguments the evidence scripts share: backends, logprobs mode, memory, KV cache, and
the ``LLM`` keyword arguments built from them (``llm_kwargs``).

The GPU machine's vLLM carries neither flash-attn nor FlashInfer, so the scripts ask for
Triton attention and Triton GDN prefill by default (an empty value leaves the choice to vLLM)
and sample with ``processed_logprobs``, which keeps vLLM's sampler off FlashInfer. Engines
that start together on one GPU size their KV cache from the memory the others leave free; a
fixed ``kv_cache_memory_bytes`` (``--kv-cache-gib``) makes each start independent of the rest,
and each must still find ``--gpu-memory-utilization`` of the device free when it starts.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from typing import Any

ATTENTION_BACKEND = "TRITON_ATTN"
PREFILL_BACKEND = "triton"
GIB = 2**30


def add_engine_arguments(
    parser: argparse.ArgumentParser, gpu_memory_utilization: float, kv_cache_gib: float = 0.0
) -> None:
    """``--attention-backend``, ``--prefill-backend``, ``--gpu-memory-utilization`` and
    ``--kv-cache-gib`` on ``parser``, with the script's defaults for the last two."""
    parser.add_argument(
        "--attention-backend",
        default=ATTENTION_BACKEND,
        help="vLLM attention backend ('' for vLLM's choice); the GPU bundle has no flash-attn",
    )
    parser.add_argument(
        "--prefill-backend",
        default=PREFILL_BACKEND,
        help="additional_config gdn_prefill_backend ('' for vLLM's choice)",
    )
    parser.add_argument(
        "--gpu-memory-utilization",
        type=float,
        default=gpu_memory_utilization,
        help="vLLM's gpu_memory_utilization (on CPU: the share of CPU memory)",
    )
    parser.add_argument(
        "--kv-cache-gib",
        type=float,
        default=kv_cache_gib,
        help="fixed KV cache per engine, so that engines starting together size alike "
        "(0: vLLM sizes it from --gpu-memory-utilization)",
    )


def engine_options(
    attention_backend: str | None,
    prefill_backend: str | None,
    gpu_memory_utilization: float,
    kv_cache_gib: float | None = None,
) -> dict[str, Any]:
    """``LLM`` keyword arguments for the chosen backends, memory share and KV cache size."""
    options: dict[str, Any] = {
        "logprobs_mode": "processed_logprobs",
        "gpu_memory_utilization": gpu_memory_utilization,
    }
    if attention_backend:
        options["attention_backend"] = attention_backend
    if prefill_backend:
        options["additional_config"] = {"gdn_prefill_backend": prefill_backend}
    if kv_cache_gib:
        options["kv_cache_memory_bytes"] = int(kv_cache_gib * GIB)
    return options


def llm_kwargs(spec: Mapping[str, Any], **settings: Any) -> dict[str, Any]:
    """``LLM`` keyword arguments of an engine's ``spec``: its model folder, chunked prefill,
    seed 0, the script's ``settings`` (lengths, caching, eager), :func:`engine_options` from
    the spec's backends, memory share and KV cache (``kv_cache_gib``, when it has one), and
    the Qwen3.5 checkpoint's language model alone."""
    kwargs: dict[str, Any] = dict(
        model=spec["model_dir"],
        enable_chunked_prefill=True,
        seed=0,
        **settings,
        **engine_options(
            spec["attention_backend"],
            spec["prefill_backend"],
            spec["gpu_memory_utilization"],
            spec.get("kv_cache_gib"),
        ),
    )
    if spec["model"] == "qwen3_5":
        kwargs["language_model_only"] = True
    return kwargs
