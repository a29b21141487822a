"""``kernels.serving.decode_step``: vLLM's tensors in, the goldens' bits out, no host reads."""

from __future__ import annotations

import importlib
import math
from types import SimpleNamespace

import pytest
import torch

from vllm_gdn_invariant.golden import conv_update as golden_conv_update
from vllm_gdn_invariant.golden import recurrent_step as golden_recurrent_step
from vllm_gdn_invariant.shadow.bits import same_bits

from .conftest import INTERPRETED_KERNELS

H, HV, K, V, W = 2, 4, 24, 20, 4  # K and V off the 32 grid


@pytest.fixture(scope="module")
def serving(kernels):
    return importlib.import_module(f"{INTERPRETED_KERNELS}.serving")


def make_step(state_dtype, dim_first, batch=5, blocks=9, seed=0):
    g = torch.Generator().manual_seed(seed)
    dim = 2 * H * K + HV * V

    def randn(*shape, dtype=torch.bfloat16, scale=1.0):
        return (torch.randn(*shape, generator=g) * scale).to(dtype)

    conv_shape = (blocks, dim, W - 1) if dim_first else (blocks, W - 1, dim)
    return dict(
        x=randn(batch, dim),
        a=randn(batch, HV),
        b=randn(batch, HV),
        A_log=randn(HV, dtype=torch.float32, scale=0.5),
        dt_bias=randn(HV, dtype=torch.float32, scale=0.5),
        conv_state=randn(*conv_shape, scale=0.3),
        conv_weight=randn(dim, W, scale=0.3),
        conv_bias=randn(dim, scale=0.1),
        state=randn(blocks, HV, V, K, dtype=state_dtype, scale=0.05),
        # vLLM pads with -1 (PAD_SLOT_ID) or 0 (the null block): both inactive.
        state_indices=torch.tensor([3, -1, 7, 0, 1][:batch], dtype=torch.int32),
    )


def step_call(serving, step, **kwargs):
    return serving.decode_step(
        step["x"], step["a"], step["b"], step["A_log"], step["dt_bias"], step["conv_state"],
        step["conv_weight"], step["conv_bias"], step["state"], step["state_indices"],
        num_k_heads=H, scale=K**-0.5, **kwargs,
    )  # fmt: skip


@pytest.mark.parametrize("state_dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("dim_first", [True, False], ids=["dim-first", "state-first"])
def test_decode_step_gives_the_goldens_conv_then_recurrent_bits(serving, state_dtype, dim_first):
    step = make_step(state_dtype, dim_first)
    scale = K**-0.5
    conv_out, conv_state = golden_conv_update(
        step["x"],
        step["conv_state"],
        step["conv_weight"],
        step["state_indices"],
        bias=step["conv_bias"],
        activation="silu",
        dim_first=dim_first,
    )
    want_out, want_state = golden_recurrent_step(
        conv_out,
        step["a"],
        step["b"],
        step["A_log"],
        step["dt_bias"],
        step["state"],
        step["state_indices"],
        num_k_heads=H,
        scale=scale,
    )
    got = {k: v.clone() for k, v in step.items()}
    out = step_call(serving, got, activation="silu", dim_first=dim_first)
    assert same_bits(out, want_out)
    assert same_bits(got["state"], want_state)
    assert same_bits(got["conv_state"], conv_state)


def test_decode_step_differs_from_the_goldens_without_the_conv(serving):
    """Negative control: skipping the conv (feeding x to the recurrent step) is caught."""
    step = make_step(torch.float32, True)
    scale = K**-0.5
    want_out, _ = golden_recurrent_step(
        step["x"],
        step["a"],
        step["b"],
        step["A_log"],
        step["dt_bias"],
        step["state"],
        step["state_indices"],
        num_k_heads=H,
        scale=scale,
    )
    out = step_call(serving, step)
    assert not same_bits(out, want_out)


def test_decode_plans_keep_a_negative_zero_scale_apart(serving):
    plans = [serving.decode_plan(2, 64, 4, True, True, 2, 4, 8, 8, s, math.copysign(1.0, s),
                                 torch.float32) for s in (0.0, -0.0)]  # fmt: skip
    assert [math.copysign(1.0, plan[2].scale) for plan in plans] == [1.0, -1.0]


@pytest.mark.parametrize("state_dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_decode_step_writes_a_given_out_with_the_bits_of_a_new_one(serving, state_dtype):
    step = make_step(state_dtype, True)
    first = {k: v.clone() for k, v in step.items()}
    want = step_call(serving, first)
    given = {k: v.clone() for k, v in step.items()}
    out = torch.full(tuple(want.shape), float("nan"), dtype=want.dtype)
    got = step_call(serving, given, out=out)
    assert got is out
    assert same_bits(out, want)
    assert same_bits(given["state"], first["state"])
    assert same_bits(given["conv_state"], first["conv_state"])


@pytest.mark.parametrize(
    "make_out, message",
    [
        (lambda shape, dtype: torch.empty(shape[0] + 1, *shape[1:], dtype=dtype), "must be"),
        (lambda shape, dtype: torch.empty(shape, dtype=torch.float32), "must be"),
        (
            lambda shape, dtype: torch.empty(*shape[:-1], 2 * shape[-1], dtype=dtype)[..., ::2],
            "contiguous",
        ),
    ],
    ids=["rows", "dtype", "strided"],
)
def test_decode_step_rejects_an_unfit_out_before_writing_anything(serving, make_out, message):
    step = make_step(torch.float32, True)
    before = {k: v.clone() for k, v in step.items()}
    with pytest.raises(ValueError, match=message):
        step_call(serving, step, out=make_out((len(step["x"]), 1, HV, V), step["x"].dtype))
    for name in ("conv_state", "state"):
        assert same_bits(step[name], before[name]), name


def run_patched_decode(serving, golden_decode_step, monkeypatch, core_attn_out_like):
    """The patched ``_forward_core_decode_non_spec`` on a bf16 step padded by 3 rows, with
    ``core_attn_out = core_attn_out_like(rows)`` filled with NaN: (the ``out`` it handed to
    ``decode_step``, core_attn_out, the rows, the goldens' output, the step, the expected step)."""
    outs = []

    def decode_step(*args, **kwargs):
        outs.append(kwargs.get("out"))
        return serving.decode_step(*args, **kwargs)

    monkeypatch.setattr(golden_decode_step, "decode_step", decode_step)
    dim_first = golden_decode_step.is_conv_state_dim_first()
    step = make_step(torch.bfloat16, dim_first)
    expected = {k: v.clone() for k, v in step.items()}
    want = step_call(serving, expected, activation="silu", dim_first=dim_first)
    batch, padding = len(step["x"]), 3
    layer = SimpleNamespace(
        A_log=step["A_log"],
        dt_bias=step["dt_bias"],
        kv_cache=(step["conv_state"], step["state"]),
        conv1d=SimpleNamespace(weight=step["conv_weight"][:, None, :], bias=step["conv_bias"]),
        num_k_heads=H,
        tp_size=1,
        head_k_dim=K,
        activation="silu",
    )
    metadata = SimpleNamespace(
        num_actual_tokens=batch,
        non_spec_state_indices_tensor=torch.cat(
            [step["state_indices"], torch.zeros(padding, dtype=torch.int32)]
        ),
    )
    pad = lambda t: torch.cat([t, torch.zeros(padding, *t.shape[1:], dtype=t.dtype)])  # noqa: E731
    core_attn_out = core_attn_out_like(batch + padding).fill_(float("nan"))
    golden_decode_step.golden_forward_core_decode_non_spec(
        layer, pad(step["x"]), pad(step["b"]), pad(step["a"]), core_attn_out, metadata
    )
    assert len(outs) == 1
    return outs[0], core_attn_out, batch, want, step, expected


def test_mode_golden_decode_writes_the_goldens_bits_into_core_attn_out_only(serving, monkeypatch):
    """The patched ``_forward_core_decode_non_spec`` hands vLLM's ``core_attn_out`` to the
    kernels (no copy after them): its first ``num_actual_tokens`` rows get the goldens' bits,
    the padding rows after them stay as they were."""
    from vllm_gdn_invariant.patches import golden_decode_step  # imports vLLM

    out, core_attn_out, batch, want, step, expected = run_patched_decode(
        serving,
        golden_decode_step,
        monkeypatch,
        lambda rows: torch.empty(rows, HV, V, dtype=torch.bfloat16),
    )
    assert out is not None, "the kernels write core_attn_out itself"
    assert out.data_ptr() == core_attn_out.data_ptr()
    assert same_bits(core_attn_out[:batch], want.squeeze(1))
    assert core_attn_out[batch:].isnan().all()
    assert same_bits(step["state"], expected["state"])
    assert same_bits(step["conv_state"], expected["conv_state"])


@pytest.mark.parametrize(
    "core_attn_out_like",
    [
        lambda rows: torch.empty(rows, HV, V, dtype=torch.float32),
        lambda rows: torch.empty(rows, HV, 2 * V, dtype=torch.bfloat16)[..., :V],
    ],
    ids=["other-dtype", "strided"],
)
def test_mode_golden_decode_copies_into_a_core_attn_out_the_kernel_cannot_write(
    serving, monkeypatch, core_attn_out_like
):
    """A ``core_attn_out`` of another dtype than mixed_qkv's or not contiguous (vLLM allocates
    neither) still gets the goldens' output, through a new tensor and a copy; decode_step would
    refuse it as ``out``."""
    from vllm_gdn_invariant.patches import golden_decode_step  # imports vLLM

    out, core_attn_out, batch, want, step, expected = run_patched_decode(
        serving, golden_decode_step, monkeypatch, core_attn_out_like
    )
    assert out is None, "a new output, then a copy"
    assert same_bits(core_attn_out[:batch], want.squeeze(1).to(core_attn_out.dtype))
    assert core_attn_out[batch:].isnan().all()
    assert same_bits(step["state"], expected["state"])
    assert same_bits(step["conv_state"], expected["conv_state"])
