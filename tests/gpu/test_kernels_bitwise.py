"""The compiled kernels give the goldens' bits on a GPU (skipped without CUDA).

The acceptance matrix of the golden-matched kernels: B in {1, 2, 7, 64, 256, 1024}, fp32 and
bf16 state, Qwen3-Next's heads at TP1 (H=16, HV=32), TP4 (H=4, HV=8) and TP8 (H=2, HV=4) with
K = V = 128, with and without the QK norm; the conv update of the same layouts (W=4) with and
without bias and SiLU, both cache layouts; inactive rows (0 and -1) mixed in from B=2. Then odd
K and V, other dtypes and strided inputs. Inputs are generated on the GPU, and the golden runs
on the same CUDA tensors (its CUDA bits are its CPU bits: test_golden_device_bitwise.py). The
kernel updates a copy of the state in place; ``out`` and the whole state are compared with the
golden's on bit views. Then every launch shape the bench's sweep times
(gdn_evidence/harness/launch_shapes.py). The last tests run codegen's contraction check on
the kernels that these launches compiled, with the Triton installed here.
"""

import pytest
import torch

from gdn_evidence.harness.launch_shapes import conv_candidates, recurrent_candidates
from gdn_evidence.harness.layer import LayerDims
from vllm_gdn_invariant.golden import conv_update as golden_conv_update
from vllm_gdn_invariant.golden import recurrent_step as golden_recurrent_step
from vllm_gdn_invariant.kernels import codegen, conv_update, recurrent_step
from vllm_gdn_invariant.kernels.conv import conv_config, launch_conv
from vllm_gdn_invariant.kernels.recurrent import launch_recurrent, recurrent_config
from vllm_gdn_invariant.kernels.validation import check_conv_args, check_recurrent_args
from vllm_gdn_invariant.shadow.bits import differ, same_bits

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]

BATCH_SIZES = (1, 2, 7, 64, 256, 1024)
LAYOUTS = {"tp1": LayerDims(16, 32), "tp4": LayerDims(4, 8), "tp8": LayerDims(2, 4)}
STATE_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def generator(seed: int) -> torch.Generator:
    return torch.Generator(device="cuda").manual_seed(seed)


def block_indices(batch: int, num_blocks: int, g: torch.Generator) -> torch.Tensor:
    """Shuffled blocks in 1..num_blocks-1; row 1 inactive (0) from B=2, row B//2 (-1) from
    B=4, the last row (0) from B=7."""
    indices = torch.randperm(num_blocks - 1, generator=g, device="cuda")[:batch] + 1
    if batch >= 2:
        indices[1] = 0
    if batch >= 4:
        indices[batch // 2] = -1
    if batch >= 7:
        indices[-1] = 0
    return indices.to(torch.int32)


def recurrent_inputs(
    batch, H, HV, K, V, state_dtype, *, mixed_dtype=torch.bfloat16, norm=True, seed=0
):
    g = generator(seed)
    num_blocks = batch + 4
    width = 2 * H * K + HV * V
    args = (
        torch.randn(batch, width, generator=g, device="cuda").to(mixed_dtype),
        torch.randn(batch, HV, generator=g, device="cuda").to(mixed_dtype),
        torch.randn(batch, HV, generator=g, device="cuda").to(mixed_dtype),
        torch.log(torch.rand(HV, generator=g, device="cuda") * 15.0 + 1.0),
        torch.randn(HV, generator=g, device="cuda"),
        (torch.randn(num_blocks, HV, V, K, generator=g, device="cuda") * 0.1).to(state_dtype),
        block_indices(batch, num_blocks, g),
    )
    return args, {"num_k_heads": H, "scale": K**-0.5, "use_qk_l2norm": norm}


def assert_recurrent_matches_golden(args, kwargs):
    golden_out, golden_state = golden_recurrent_step(*args, **kwargs)
    state = args[5].clone()
    out = recurrent_step(*args[:5], state, args[6], **kwargs)
    torch.cuda.synchronize()
    assert same_bits(out, golden_out), f"out: {differ(out, golden_out)} elements differ"
    assert same_bits(state, golden_state), f"state: {differ(state, golden_state)} differ"


@pytest.mark.parametrize("norm", [True, False], ids=["qknorm", "noqknorm"])
@pytest.mark.parametrize("state", list(STATE_DTYPES))
@pytest.mark.parametrize("batch", BATCH_SIZES)
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_recurrent_kernel_gives_the_goldens_bits(layout, batch, state, norm):
    dims = LAYOUTS[layout]
    args, kwargs = recurrent_inputs(
        batch,
        dims.num_k_heads,
        dims.num_v_heads,
        dims.head_k_dim,
        dims.head_v_dim,
        STATE_DTYPES[state],
        norm=norm,
        seed=batch,
    )
    assert_recurrent_matches_golden(args, kwargs)


ODD_SHAPES = [
    # B, H, HV, K, V, state dtype, mixed_qkv dtype
    (7, 1, 3, 33, 17, torch.float32, torch.bfloat16),
    (64, 2, 4, 100, 60, torch.bfloat16, torch.bfloat16),
    (5, 4, 8, 256, 64, torch.float32, torch.float16),
    (3, 1, 1, 1, 1, torch.bfloat16, torch.float32),
    (9, 2, 6, 200, 130, torch.bfloat16, torch.float16),
    (300, 16, 32, 128, 128, torch.float32, torch.float32),
    (2, 2, 4, 64, 96, torch.float32, torch.bfloat16),
]


@pytest.mark.parametrize("shape", ODD_SHAPES, ids=lambda s: "-".join(map(str, s[:5])))
def test_recurrent_kernel_gives_the_goldens_bits_on_odd_shapes(shape):
    batch, H, HV, K, V, state_dtype, mixed_dtype = shape
    for norm in (True, False):
        args, kwargs = recurrent_inputs(
            batch, H, HV, K, V, state_dtype, mixed_dtype=mixed_dtype, norm=norm, seed=K + V
        )
        assert_recurrent_matches_golden(args, kwargs)


def test_recurrent_kernel_with_strided_inputs_gives_the_goldens_bits():
    args, kwargs = recurrent_inputs(33, 2, 4, 48, 40, torch.float32, seed=3)
    mixed, a, b, A_log, dt_bias, state, indices = args
    buffer = torch.randn(*state.shape[:3], 64, generator=generator(4), device="cuda")
    buffer[..., :48] = state
    strided = (
        mixed.t().contiguous().t(),
        a.t().contiguous().t(),
        torch.cat([b, b], dim=1)[:, : b.shape[1]],
        A_log,
        dt_bias,
        buffer[..., :48],
        indices.to(torch.int64),
    )
    assert strided[0].stride(1) != 1
    golden_out, golden_state = golden_recurrent_step(*strided, **kwargs)
    before = buffer.clone()
    out = recurrent_step(*strided, **kwargs)
    assert same_bits(out, golden_out)
    assert same_bits(strided[5], golden_state)
    assert same_bits(buffer[..., 48:], before[..., 48:])


@pytest.mark.parametrize("state", list(STATE_DTYPES))
@pytest.mark.parametrize("batch", [7, 64])
def test_recurrent_launch_shapes_of_the_sweep_give_the_goldens_bits(batch, state):
    """Every launch shape ``bench_decode.py --sweep`` times, compiled, with Qwen3-Next's heads
    at TP1 and inactive rows mixed in; the contraction check on each compiled kernel."""
    args, kwargs = recurrent_inputs(batch, 16, 32, 128, 128, STATE_DTYPES[state], seed=batch + 9)
    golden_out, golden_state = golden_recurrent_step(*args, **kwargs)
    checked = check_recurrent_args(*args, **kwargs, interpreted=False)
    candidates = recurrent_candidates(checked, STATE_DTYPES[state])
    assert any(c.chunks > 1 for c in candidates)
    for config in candidates:
        state_copy = args[5].clone()
        out, compiled = launch_recurrent(*args[:5], state_copy, args[6], checked, config)
        torch.cuda.synchronize()
        assert same_bits(out, golden_out), f"{config}: out"
        assert same_bits(state_copy, golden_state), f"{config}: state"
        if batch == 64:
            report = codegen.report_of(compiled)
            assert report.clean, (config, report)


def conv_inputs(batch, dim, cache_dtype, dim_first, with_bias, *, x_dtype=torch.bfloat16, seed=0):
    g = generator(seed)
    num_blocks = batch + 4
    shape = (num_blocks, dim, 3) if dim_first else (num_blocks, 3, dim)
    args = (
        torch.randn(batch, dim, generator=g, device="cuda").to(x_dtype),
        torch.randn(shape, generator=g, device="cuda").to(cache_dtype),
        (torch.randn(dim, 4, generator=g, device="cuda") * 0.5).to(torch.bfloat16),
        block_indices(batch, num_blocks, g),
    )
    bias = torch.randn(dim, generator=g, device="cuda").to(torch.bfloat16) if with_bias else None
    return args, bias


@pytest.mark.parametrize("dim_first", [True, False], ids=["dim_first", "token_first"])
@pytest.mark.parametrize("activation", ["silu", None], ids=["silu", "linear"])
@pytest.mark.parametrize("with_bias", [False, True], ids=["nobias", "bias"])
@pytest.mark.parametrize("cache", ["fp32", "bf16", "fp16"])
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_conv_kernel_gives_the_goldens_bits(layout, cache, with_bias, activation, dim_first):
    dim = LAYOUTS[layout].conv_dim
    cache_dtype = {"fp16": torch.float16, **STATE_DTYPES}[cache]
    for batch in BATCH_SIZES:
        for x_dtype in (torch.bfloat16, torch.float32):
            args, bias = conv_inputs(
                batch, dim, cache_dtype, dim_first, with_bias, x_dtype=x_dtype, seed=batch
            )
            kwargs = {"bias": bias, "activation": activation, "dim_first": dim_first}
            golden_out, golden_state = golden_conv_update(*args, **kwargs)
            state = args[1].clone()
            out = conv_update(args[0], state, args[2], args[3], **kwargs)
            assert same_bits(out, golden_out), f"B={batch} {x_dtype}: out"
            assert same_bits(state, golden_state), f"B={batch} {x_dtype}: state"


@pytest.mark.parametrize("dim_first", [True, False], ids=["dim_first", "token_first"])
def test_conv_launch_shapes_of_the_sweep_give_the_goldens_bits(dim_first):
    """Every launch shape ``bench_decode.py --sweep conv`` times, compiled (TP1 conv dim, B =
    64 with inactive rows, bf16 and fp32 caches, bias and SiLU)."""
    dim = LAYOUTS["tp1"].conv_dim
    for cache_dtype in (torch.bfloat16, torch.float32):
        args, bias = conv_inputs(64, dim, cache_dtype, dim_first, True, seed=11)
        kwargs = {"bias": bias, "activation": "silu", "dim_first": dim_first}
        golden_out, golden_state = golden_conv_update(*args, **kwargs)
        checked = check_conv_args(*args, **kwargs, interpreted=False)
        for config in conv_candidates():
            state = args[1].clone()
            out, _ = launch_conv(args[0], state, args[2], args[3], bias, checked, config)
            torch.cuda.synchronize()
            assert same_bits(out, golden_out), f"{cache_dtype} {config}: out"
            assert same_bits(state, golden_state), f"{cache_dtype} {config}: state"


@pytest.mark.parametrize("state", list(STATE_DTYPES))
def test_compiled_recurrent_kernel_has_no_contraction(state):
    args, kwargs = recurrent_inputs(64, 16, 32, 128, 128, STATE_DTYPES[state], seed=5)
    checked = check_recurrent_args(*args, **kwargs, interpreted=False)
    config = recurrent_config(checked, STATE_DTYPES[state])
    _, compiled = launch_recurrent(*args, checked, config)
    assert getattr(compiled.metadata, "enable_fp_fusion", False) is False
    report = codegen.report_of(compiled)
    assert report.clean, report


@pytest.mark.parametrize("dim_first", [True, False], ids=["dim_first", "token_first"])
def test_compiled_conv_kernel_has_no_contraction(dim_first):
    args, bias = conv_inputs(64, 8192, torch.bfloat16, dim_first, True, seed=6)
    kwargs = {"bias": bias, "activation": "silu", "dim_first": dim_first}
    checked = check_conv_args(*args, **kwargs, interpreted=False)
    _, compiled = launch_conv(*args, bias, checked, conv_config(checked))
    report = codegen.report_of(compiled)
    assert report.clean, report
