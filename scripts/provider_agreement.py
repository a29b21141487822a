"""How far vLLM's GDN decode kernels are from the goldens, on CUDA, as JSON with provenance.

    python scripts/provider_agreement.py --out agreement.json

Needs CUDA and a vLLM (0.30.0 to 0.34.0) whose Triton kernels import. For each head layout
(Qwen3-Next TP1: H=16, HV=32, K=V=128; TP4 per rank: H=4, HV=8), batch size and state dtype,
the same random inputs (bf16 mixed_qkv/a/b, fp32 A_log/dt_bias, scale K**-0.5, QK norm on, two
rows inactive with index 0 from B=4 up) go through the golden ``recurrent_step`` and vLLM's
``fused_recurrent_gated_delta_rule_packed_decode``, and through the golden ``conv_update`` and
vLLM's ``causal_conv1d_update`` (SiLU, no bias, dim-first cache, W=4). For outputs and states
the report gives elements whose bits differ, the total, max |diff| and a histogram of ULP
distances (in the dtype's ULP, from bit patterns read as ordered integers). The goldens run on
the same GPU (tests/gpu/test_golden_device_bitwise.py checks they equal their CPU bits).

Exit status: 0 when the report is written; 2 when CUDA or vLLM's kernels are not available
(nothing is measured or written).
"""

import argparse
import importlib
import inspect
import json
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch import Tensor

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))  # measure the checkout this script belongs to

from vllm_gdn_invariant.golden import conv_update, recurrent_step  # noqa: E402
from vllm_gdn_invariant.harness.bits import compare, ordered_bits  # noqa: E402
from vllm_gdn_invariant.harness.provenance import provenance  # noqa: E402

SCHEMA = "vllm-gdn-invariant/provider-agreement/1"
RECURRENT_MODULES = (
    "vllm.model_executor.layers.fla.ops",
    "vllm.third_party.flash_linear_attention.ops",
)
RECURRENT_FUNCTION = "fused_recurrent_gated_delta_rule_packed_decode"
CONV_MODULE = "vllm.model_executor.layers.mamba.ops.causal_conv1d"
CONV_FUNCTION = "causal_conv1d_update"
BATCH_SIZES = (1, 4, 17, 64, 256)
STATE_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
CONV_WIDTH = 4


@dataclass(frozen=True)
class HeadLayout:
    name: str
    H: int
    HV: int
    K: int
    V: int

    @property
    def conv_dim(self) -> int:
        return 2 * self.H * self.K + self.HV * self.V


LAYOUTS = {
    "tp1": HeadLayout("tp1", H=16, HV=32, K=128, V=128),
    "tp4": HeadLayout("tp4", H=4, HV=8, K=128, V=128),
}


@dataclass(frozen=True)
class Providers:
    packed_decode: Callable
    conv_update: Callable
    recurrent_name: str  # module.function that ran
    conv_name: str


# Inputs and cases


def block_indices(batch: int, num_blocks: int, generator: torch.Generator) -> Tensor:
    """Shuffled active blocks in 1..num_blocks-1, with rows 1 and B//2 inactive (0) from B=4."""
    indices = torch.randperm(num_blocks - 1, generator=generator)[:batch] + 1
    if batch >= 4:
        indices[[1, batch // 2]] = 0
    return indices.to(torch.int32)


def recurrent_inputs(
    layout: HeadLayout, batch: int, state_dtype: torch.dtype, seed: int, device: torch.device
) -> dict:
    """Random decode inputs, generated on CPU (same values on any device)."""
    g = torch.Generator().manual_seed(seed)
    num_blocks = batch + 8
    tensors = {
        "mixed_qkv": torch.randn(batch, layout.conv_dim, generator=g).to(torch.bfloat16),
        "a": torch.randn(batch, layout.HV, generator=g).to(torch.bfloat16),
        "b": torch.randn(batch, layout.HV, generator=g).to(torch.bfloat16),
        "A_log": torch.log(torch.rand(layout.HV, generator=g) * 15.0 + 1.0),
        "dt_bias": torch.randn(layout.HV, generator=g),
        "state": (torch.randn(num_blocks, layout.HV, layout.V, layout.K, generator=g) * 0.1).to(
            state_dtype
        ),
        "state_indices": block_indices(batch, num_blocks, g),
    }
    return {name: t.to(device) for name, t in tensors.items()}


def untouched_equal(before: Tensor, after: Tensor, indices: Tensor) -> bool:
    keep = torch.ones(before.shape[0], dtype=torch.bool, device=before.device)
    keep[indices[indices > 0].long()] = False
    return torch.equal(ordered_bits(before[keep]), ordered_bits(after[keep]))


def run_recurrent_case(
    packed_decode: Callable,
    layout: HeadLayout,
    batch: int,
    state_dtype: torch.dtype,
    seed: int,
    device: torch.device,
) -> dict:
    """Golden vs the packed-decode kernel (called with vLLM's signature, in place) on one input."""
    x = recurrent_inputs(layout, batch, state_dtype, seed, device)
    scale = layout.K**-0.5
    golden_out, golden_state = recurrent_step(
        x["mixed_qkv"],
        x["a"],
        x["b"],
        x["A_log"],
        x["dt_bias"],
        x["state"],
        x["state_indices"],
        num_k_heads=layout.H,
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
    active = indices[indices > 0].long()
    return {
        "layout": asdict(layout),
        "batch": batch,
        "state_dtype": str(state_dtype).removeprefix("torch."),
        "seed": seed,
        "inactive_rows": (indices <= 0).nonzero().flatten().tolist(),
        "out": compare(provider_out, golden_out),
        "state": compare(provider_state[active], golden_state[active]),
        "untouched_blocks_equal": {
            "golden": untouched_equal(x["state"], golden_state, indices),
            "provider": untouched_equal(x["state"], provider_state, indices),
        },
    }


def conv_inputs(
    layout: HeadLayout, batch: int, cache_dtype: torch.dtype, seed: int, device: torch.device
) -> dict:
    g = torch.Generator().manual_seed(seed)
    num_blocks = batch + 8
    tensors = {
        "x": torch.randn(batch, layout.conv_dim, generator=g).to(torch.bfloat16),
        "conv_state": torch.randn(num_blocks, layout.conv_dim, CONV_WIDTH - 1, generator=g).to(
            cache_dtype
        ),
        "weight": (torch.randn(layout.conv_dim, CONV_WIDTH, generator=g) * 0.5).to(torch.bfloat16),
        "state_indices": block_indices(batch, num_blocks, g),
    }
    return {name: t.to(device) for name, t in tensors.items()}


def run_conv_case(
    causal_conv1d_update: Callable,
    layout: HeadLayout,
    batch: int,
    cache_dtype: torch.dtype,
    seed: int,
    device: torch.device,
) -> dict:
    """Golden vs causal_conv1d_update (SiLU, no bias, dim-first cache) on one input.

    The kernel leaves the output rows of inactive indices unwritten, so outputs are compared on
    the active rows only.
    """
    x = conv_inputs(layout, batch, cache_dtype, seed, device)
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
    active = indices[rows].long()
    return {
        "layout": asdict(layout),
        "dim": layout.conv_dim,
        "width": CONV_WIDTH,
        "batch": batch,
        "cache_dtype": str(cache_dtype).removeprefix("torch."),
        "activation": "silu",
        "bias": False,
        "seed": seed,
        "inactive_rows": (indices <= 0).nonzero().flatten().tolist(),
        "out_active_rows": compare(provider_out[rows], golden_out[rows]),
        "state": compare(provider_state[active], golden_state[active]),
        "untouched_blocks_equal": {
            "golden": untouched_equal(x["conv_state"], golden_state, indices),
            "provider": untouched_equal(x["conv_state"], provider_state, indices),
        },
    }


def build_report(
    providers: Providers,
    layouts: list[HeadLayout],
    batch_sizes: list[int],
    seed: int,
    device: torch.device,
) -> dict:
    recurrent, conv = [], []
    for layout in layouts:
        for batch in batch_sizes:
            for dtype in STATE_DTYPES.values():
                case_seed = seed * 1000 + batch
                recurrent.append(
                    run_recurrent_case(
                        providers.packed_decode, layout, batch, dtype, case_seed, device
                    )
                )
                conv.append(
                    run_conv_case(providers.conv_update, layout, batch, dtype, case_seed, device)
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
            "layouts": [layout.name for layout in layouts],
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
    missing = [n for n in names if n not in inspect.signature(function).parameters]
    if missing:
        raise ImportError(f"{function.__module__}.{function.__name__} has no {missing}")


def load_providers() -> Providers:
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


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, type=Path, help="JSON file to write")
    parser.add_argument(
        "--batch-sizes", default=",".join(map(str, BATCH_SIZES)), help="comma separated"
    )
    parser.add_argument("--layouts", default="tp1,tp4", help=f"from {sorted(LAYOUTS)}")
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not torch.cuda.is_available():
        print("provider_agreement: CUDA is not available; nothing measured", file=sys.stderr)
        return 2
    try:
        providers = load_providers()
    except (ImportError, AttributeError) as error:
        print(f"provider_agreement: vLLM's kernels are not available: {error}", file=sys.stderr)
        return 2
    batch_sizes = [int(b) for b in args.batch_sizes.split(",")]
    layouts = [LAYOUTS[name] for name in args.layouts.split(",")]
    report = build_report(providers, layouts, batch_sizes, args.seed, torch.device("cuda"))
    args.out.write_text(json.dumps(report, indent=2, allow_nan=False) + "\n")
    print(f"provider_agreement: wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
