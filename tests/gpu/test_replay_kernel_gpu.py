"""The compiled replay kernels give the goldens' bits token by token on CUDA (skipped without it).

Qwen3-Next's GDN heads (K = V = 128, W = 4, bf16 x, conv state and weights, no conv bias) at TP1
(H=16, HV=32) and TP4 per rank (H=4, HV=8), fp32 and bf16 state: one 8192-token response with
shorter ones beside it (a 1-token and an empty one among them), blocks in shuffled order.
``replay_tokens`` runs once on copies of the caches; the goldens run token by token on the same
CUDA tensors (replay_cases.golden_replay: one batched step per token position); every output and
the whole caches are compared on bit views. Then the goldens on CPU against the kernel on CUDA,
inactive sequences, a second launch shape, and the contraction check on the compiled kernel.
"""

from __future__ import annotations

import pytest
import torch

from vllm_gdn_invariant.kernels import codegen
from vllm_gdn_invariant.kernels.replay import (
    ReplayConfig,
    ReplayTensors,
    launch_replay,
    multiprocessors,
    replay_config,
    replay_dims,
    replay_tokens,
)
from vllm_gdn_invariant.shadow.bits import differ, same_bits

from ..kernels.replay_cases import ReplayCase, build_replay_case, golden_replay

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]

HEADS = {"tp1": {"H": 16, "HV": 32}, "tp4": {"H": 4, "HV": 8}}
STATE_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
QWEN3_NEXT = {"K": 128, "V": 128, "W": 4}


def qwen3_next_case(heads: str, state: str, lengths: list[int], *, device, seed: int, **options):
    options.setdefault("with_bias", False)
    return build_replay_case(
        lengths,
        **HEADS[heads],
        **QWEN3_NEXT,
        state_dtype=STATE_DTYPES[state],
        seed=seed,
        device=device,
        **options,
    )


def run_kernel(case: ReplayCase, config: ReplayConfig | None = None):
    """(out, conv_state, state) of the kernel on copies of the caches, and the compiled kernel."""
    got = case.with_states_copied()
    tensors = ReplayTensors(*got.tensors())
    dims = replay_dims(tensors, **got.options)
    out = torch.empty((got.x.shape[0], *got.state.shape[1:3]), dtype=got.x.dtype, device="cuda")
    compiled, _ = launch_replay(
        tensors,
        out,
        dims,
        config or replay_config(dims, got.state.dtype, multiprocessors(got.x.device)),
    )
    torch.cuda.synchronize()
    return (out, got.conv_state, got.state), compiled


def assert_same(got, want):
    for name, g, w in zip(("out", "conv_state", "state"), got, want, strict=True):
        assert same_bits(g, w), f"{name}: {differ(g, w)} of {w.numel()} elements differ"


@pytest.mark.parametrize("state", list(STATE_DTYPES))
@pytest.mark.parametrize("heads", list(HEADS))
def test_an_8192_token_response_gives_the_goldens_bits(heads, state):
    case = qwen3_next_case(heads, state, [8192, 1500, 1, 0, 37], device="cuda", seed=1)
    got, _ = run_kernel(case)
    assert_same(got, golden_replay(case))
    assert torch.isfinite(got[2].float()).all()


@pytest.mark.parametrize("state", list(STATE_DTYPES))
def test_goldens_on_cpu_equal_the_kernel_on_cuda(state):
    cpu = qwen3_next_case("tp4", state, [48, 1, 0, 9], device="cpu", seed=2, dim_first=False)
    want = golden_replay(cpu)
    on_gpu = ReplayCase(*(t if t is None else t.cuda() for t in cpu.tensors()), cpu.options)
    got = replay_tokens(*on_gpu.tensors(), **on_gpu.options)
    torch.cuda.synchronize()
    assert_same((got.cpu(), on_gpu.conv_state.cpu(), on_gpu.state.cpu()), want)


def test_inactive_sequences_and_a_bias_give_the_goldens_bits():
    case = qwen3_next_case(
        "tp4",
        "bf16",
        [300, 200, 100, 50, 1],
        device="cuda",
        seed=3,
        with_bias=True,
        conv_inactive={1: 0, 2: -1},
        state_inactive={2: 0, 3: -1},
    )
    got, _ = run_kernel(case)
    assert_same(got, golden_replay(case))


@pytest.mark.parametrize("state", list(STATE_DTYPES))
def test_launch_shapes_give_the_same_bits(state):
    case = qwen3_next_case("tp1", state, [257, 64, 1], device="cuda", seed=4)
    want = golden_replay(case)
    dims = replay_dims(ReplayTensors(*case.tensors()), num_k_heads=16, scale=1.0)
    split = replay_config(dims, case.state.dtype, 0)
    for block_v, num_warps in ((16, 2), (32, 4), (64, 4), (128, 4), (128, 8)):
        config = ReplayConfig(block_v, split.log2_j, split.log2_cl, split.log2_vec, num_warps)
        got, _ = run_kernel(case, config)
        assert_same(got, want)


def test_compiled_replay_kernel_has_no_contraction():
    case = qwen3_next_case("tp1", "bf16", [3, 2], device="cuda", seed=5)
    _, compiled = run_kernel(case)
    assert getattr(compiled.metadata, "enable_fp_fusion", False) is False
    report = codegen.report_of(compiled)
    assert report.clean, report
