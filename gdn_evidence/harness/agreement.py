"""How far vLLM's GDN decode kernels are from the goldens: the cases and the report.

For each head layout (``LAYOUTS``: Qwen3-Next TP1, H=16, HV=32, K=V=128, and its TP4 per-rank
head counts, H=4, HV=8), batch size and state dtype, the same random inputs (bf16
mixed_qkv/a/b, fp32 A_log/dt_bias, scale K**-0.5, QK norm on, two rows inactive with index 0
from B=4 up) go through the golden ``recurrent_step`` and vLLM's
``fused_recurrent_gated_delta_rule_packed_decode``, and through the golden ``conv_update`` and
vLLM's ``causal_conv1d_update`` (SiLU, no bias, dim-first cache, W=4). For outputs and states
the report gives elements whose bits differ, the total, max |diff| and a histogram of ULP
distances (shadow/bits.py). Inputs are generated on CPU, so every device sees the same values; the
providers are passed in (``load_providers`` finds vLLM's), so the cases also run on CPU with
stand-ins. scripts/provider_agreement.py is the command line.
"""

from __future__ import annotations

import importlib
import inspect
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from gdn_evidence.harness.layer import STATE_DTYPES, LayerDims
from gdn_evidence.harness.provenance import provenance
from vllm_gdn_invariant.golden import conv_update, recurrent_step
from vllm_gdn_invariant.shadow.bits import compare, same_bits

SCHEMA = "vllm-gdn-invariant/provider-agreement/1"
RECURRENT_MODULES = (
    "vllm.model_executor.layers.fla.ops",
    "vllm.third_party.flash_linear_attention.ops",
)
RECURRENT_FUNCTION = "fused_recurrent_gated_delta_rule_packed_decode"
CONV_MODULE = "vllm.model_executor.layers.mamba.ops.causal_conv1d"
CONV_FUNCTION = "causal_conv1d_update"
BATCH_SIZES = (1, 4, 17, 64, 256)


@dataclass(frozen=True)
class Providers:
    """The two kernels measured, with the module.function names that ran."""

    packed_decode: Callable
    conv_update: Callable
    recurrent_name: str
    conv_name: str


def layout_record(name: str, dims: LayerDims) -> dict:
    """The report's description of a head layout: its name, H, HV, K and V."""
    return {
        "name": name,
        "H": dims.num_k_heads,
        "HV": dims.num_v_heads,
        "K": dims.head_k_dim,
        "V": dims.head_v_dim,
    }


# Inputs and cases


def block_indices(batch: int, num_blocks: int, generator: torch.Generator) -> Tensor:
    """Shuffled active blocks in 1..num_blocks-1, with rows 1 and B//2 inactive (0) from B=4."""
    indices = torch.randperm(num_blocks - 1, generator=generator)[:batch] + 1
    if batch >= 4:
        indices[[1, batch // 2]] = 0
    return indices.to(torch.int32)


def recurrent_inputs(
    dims: LayerDims, batch: int, state_dtype: torch.dtype, seed: int, device: torch.device
) -> dict:
    """Random decode inputs, generated on CPU (same values on any device)."""
    g = torch.Generator().manual_seed(seed)
    num_blocks = batch + 8
    HV, K, V = dims.num_v_heads, dims.head_k_dim, dims.head_v_dim
    tensors = {
        "mixed_qkv": torch.randn(batch, dims.conv_dim, generator=g).to(torch.bfloat16),
        "a": torch.randn(batch, HV, generator=g).to(torch.bfloat16),
        "b": torch.randn(batch, HV, generator=g).to(torch.bfloat16),
        "A_log": torch.log(torch.rand(HV, generator=g) * 15.0 + 1.0),
        "dt_bias": torch.randn(HV, generator=g),
        "state": (torch.randn(num_blocks, HV, V, K, generator=g) * 0.1).to(state_dtype),
        "state_indices": block_indices(batch, num_blocks, g),
    }
    return {name: t.to(device) for name, t in tensors.items()}


def conv_inputs(
    dims: LayerDims, batch: int, cache_dtype: torch.dtype, seed: int, device: torch.device
) -> dict:
    """Random conv-update inputs (dim-first cache), generated on CPU."""
    g = torch.Generator().manual_seed(seed)
    num_blocks = batch + 8
    dim, width = dims.conv_dim, dims.conv_width
    tensors = {
        "x": torch.randn(batch, dim, generator=g).to(torch.bfloat16),
        "conv_state": torch.randn(num_blocks, dim, width - 1, generator=g).to(cache_dtype),
        "weight": (torch.randn(dim, width, generator=g) * 0.5).to(torch.bfloat16),
        "state_indices": block_indices(batch, num_blocks, g),
    }
    return {name: t.to(device) for name, t in tensors.items()}


def untouched_equal(before: Tensor, after: Tensor, indices: Tensor) -> bool:
    """Whether the blocks no active index names kept their bits (a -0 written over +0, or a
    NaN's payload changed, is a write)."""
    keep = torch.ones(before.shape[0], dtype=torch.bool, device=before.device)
    keep[indices[indices > 0].long()] = False
    return same_bits(before[keep], after[keep])


def state_agreement(before: Tensor, golden: Tensor, provider: Tensor, indices: Tensor) -> dict:
    """The provider's new state against the golden's on the active blocks, and whether each
    left the other blocks as they were."""
    active = indices[indices > 0].long()
    return {
        "state": compare(provider[active], golden[active]),
        "untouched_blocks_equal": {
            "golden": untouched_equal(before, golden, indices),
            "provider": untouched_equal(before, provider, indices),
        },
    }


def run_recurrent_case(
    packed_decode: Callable,
    layout: str,
    dims: LayerDims,
    batch: int,
    state_dtype: torch.dtype,
    seed: int,
    device: torch.device,
) -> dict:
    """Golden vs the packed-decode kernel (called with vLLM's signature, in place) on one input."""
    x = recurrent_inputs(dims, batch, state_dtype, seed, device)
    scale = dims.head_k_dim**-0.5
    golden_out, golden_state = recurrent_step(
        x["mixed_qkv"],
        x["a"],
        x["b"],
        x["A_log"],
        x["dt_bias"],
        x["state"],
        x["state_indices"],
        num_k_heads=dims.num_k_heads,
        scale=scale,
        use_qk_l2norm=True,
    )
    provider_state = x["state"].clone()
    provider_out = torch.empty_like(golden_out)
    packed_decode(
        mixed_qkv=x["mixed_qkv"],
        a=x["a"],
        b=x["b"],
        A_log=x["A_log"],
        dt_bias=x["dt_bias"],
        scale=scale,
        initial_state=provider_state,
        out=provider_out,
        ssm_state_indices=x["state_indices"],
        use_qk_l2norm_in_kernel=True,
    )
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    indices = x["state_indices"]
    return {
        "layout": layout_record(layout, dims),
        "batch": batch,
        "state_dtype": str(state_dtype).removeprefix("torch."),
        "seed": seed,
        "inactive_rows": (indices <= 0).nonzero().flatten().tolist(),
        "out": compare(provider_out, golden_out),
        **state_agreement(x["state"], golden_state, provider_state, indices),
    }


def run_conv_case(
    causal_conv1d_update: Callable,
    layout: str,
    dims: LayerDims,
    batch: int,
    cache_dtype: torch.dtype,
    seed: int,
    device: torch.device,
) -> dict:
    """Golden vs causal_conv1d_update (SiLU, no bias, dim-first cache) on one input.

    The kernel leaves the output rows of inactive indices unwritten, so outputs are compared on
    the active rows only.
    """
    x = conv_inputs(dims, batch, cache_dtype, seed, device)
    golden_out, golden_state = conv_update(
        x["x"], x["conv_state"], x["weight"], x["state_indices"], activation="silu"
    )
    provider_state = x["conv_state"].clone()
    provider_out = causal_conv1d_update(
        x["x"].clone(),  # the kernel writes its output over x when x has the cache dtype
        provider_state,
        x["weight"],
        bias=None,
        activation="silu",
        conv_state_indices=x["state_indices"],
        validate_data=False,  # as vLLM's decode path calls it
    )
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    indices = x["state_indices"]
    rows = (indices > 0).nonzero().flatten()
    return {
        "layout": layout_record(layout, dims),
        "dim": dims.conv_dim,
        "width": dims.conv_width,
        "batch": batch,
        "cache_dtype": str(cache_dtype).removeprefix("torch."),
        "activation": "silu",
        "bias": False,
        "seed": seed,
        "inactive_rows": (indices <= 0).nonzero().flatten().tolist(),
        "out_active_rows": compare(provider_out[rows], golden_out[rows]),
        **state_agreement(x["conv_state"], golden_state, provider_state, indices),
    }


def build_report(
    providers: Providers,
    layouts: Mapping[str, LayerDims],
    batch_sizes: list[int],
    seed: int,
    device: torch.device,
) -> dict:
    """Every recurrent and conv case of ``layouts`` x ``batch_sizes`` x ``STATE_DTYPES``, with
    the schema, the run's provenance and the settings."""
    recurrent, conv = [], []
    for layout, dims in layouts.items():
        for batch in batch_sizes:
            for dtype in STATE_DTYPES.values():
                case_seed = seed * 1000 + batch
                recurrent.append(
                    run_recurrent_case(
                        providers.packed_decode, layout, dims, batch, dtype, case_seed, device
                    )
                )
                conv.append(
                    run_conv_case(
                        providers.conv_update, layout, dims, batch, dtype, case_seed, device
                    )
                )
    return {
        "schema": SCHEMA,
        "provenance": provenance(
            golden_module=str(Path(sys.modules[recurrent_step.__module__].__file__)),
            recurrent_provider=providers.recurrent_name,
            conv_provider=providers.conv_name,
        ),
        "settings": {
            "seed": seed,
            "batch_sizes": batch_sizes,
            "layouts": list(layouts),
            "golden_device": str(device),
            "inputs": "bf16 randn mixed_qkv/a/b/x; A_log = log(U(1, 16)); dt_bias randn; "
            "state randn*0.1; conv weight bf16 randn*0.5; conv cache randn",
        },
        "recurrent": recurrent,
        "conv": conv,
    }


# vLLM


def import_first(names: tuple[str, ...]):
    """The first of the modules ``names`` that exists; ModuleNotFoundError if none does."""
    for name in names:
        try:
            return importlib.import_module(name)
        except ModuleNotFoundError as error:
            if error.name is None or not name.startswith(error.name):
                raise  # the module exists but one of its own imports is missing
    raise ModuleNotFoundError(f"none of {', '.join(names)} can be imported")


def qualified_name(function: Callable) -> str:
    return f"{function.__module__}.{function.__qualname__}"


def require_parameters(function: Callable, names: tuple[str, ...]) -> None:
    """ImportError unless ``function`` takes every parameter of ``names``."""
    missing = [n for n in names if n not in inspect.signature(function).parameters]
    if missing:
        raise ImportError(f"{function.__module__}.{function.__name__} has no {missing}")


def load_providers() -> Providers:
    """vLLM's packed-decode and conv-update kernels; ImportError or AttributeError when the
    installed vLLM lacks them (or their Triton code does not import)."""
    recurrent_module = import_first(RECURRENT_MODULES)
    conv_module = importlib.import_module(CONV_MODULE)
    packed_decode = getattr(recurrent_module, RECURRENT_FUNCTION)
    conv = getattr(conv_module, CONV_FUNCTION)
    require_parameters(
        packed_decode,
        ("mixed_qkv", "a", "b", "A_log", "dt_bias", "scale", "initial_state", "out",
         "ssm_state_indices", "use_qk_l2norm_in_kernel"),
    )  # fmt: skip
    require_parameters(conv, ("bias", "activation", "conv_state_indices", "validate_data"))
    return Providers(packed_decode, conv, qualified_name(packed_decode), qualified_name(conv))
