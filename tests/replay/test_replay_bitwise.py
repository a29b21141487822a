"""replay_response gives the bits of the goldens applied token by token, and touches no input.

The reference (helpers.goldens_token_by_token) runs each sequence alone, one golden decode step
per token; the replay runs all sequences of a step as one batch. Sequences of different lengths
(one of 1 token, one of 0) in an order the replay has to rank, odd K and V, both state dtypes,
with and without a conv bias. The negative controls at the end run the same comparison on
other arithmetic of the same function (a plain PyTorch recurrence, the chunk form, the goldens
with another reduction order, a replay that steps the wrong sequences) and see it differ.
"""

import pytest
import torch
from transformers.models.qwen3_next.modeling_qwen3_next import torch_chunk_gated_delta_rule

from vllm_gdn_invariant import golden
from vllm_gdn_invariant.golden import recurrent as golden_recurrent
from vllm_gdn_invariant.replay import replay_response
from vllm_gdn_invariant.replay.checks import check_replay_args
from vllm_gdn_invariant.replay.recurrence import replay_recurrence
from vllm_gdn_invariant.shadow.bits import raw_bits

from .helpers import BITWISE_EQUAL, build_case, differing_elements, goldens_token_by_token

LENGTHS = [5, 1, 0, 9, 3]  # not sorted: the replay ranks them; one of 1 token, one empty

CASES = {
    "fp32 state, bias": dict(state_dtype=torch.float32, with_bias=True),
    "fp32 state, no bias": dict(state_dtype=torch.float32),
    "bf16 state, bias": dict(state_dtype=torch.bfloat16, with_bias=True),
    "bf16 state, no bias": dict(state_dtype=torch.bfloat16),
    "fp32 x, conv state and weight": dict(
        x_dtype=torch.float32, conv_state_dtype=torch.float32, weight_dtype=torch.float32
    ),
    "no activation, no qk norm, H = HV": dict(H=3, HV=3, activation=None, use_qk_l2norm=False),
}


@pytest.mark.parametrize("options", CASES.values(), ids=CASES.keys())
def test_every_token_and_final_state_is_the_goldens_token_by_token(options):
    case = build_case(LENGTHS, seed=1, **options)
    result = replay_response(*case.args(), **case.all_kwargs())
    assert differing_elements(result, goldens_token_by_token(case)) == BITWISE_EQUAL


def test_results_have_x_dtype_and_the_states_dtypes():
    case = build_case(LENGTHS, state_dtype=torch.bfloat16, conv_state_dtype=torch.float16)
    out, conv_state, state = replay_response(*case.args(), **case.all_kwargs())
    assert (out.dtype, conv_state.dtype, state.dtype) == (
        torch.bfloat16,
        torch.float16,
        torch.bfloat16,
    )
    assert out.shape == (sum(LENGTHS), 4, 5)


def test_int64_offsets_and_a_single_sequence():
    case = build_case([6], seed=3)
    case = case.with_changes(cu_seqlens=case.cu_seqlens.to(torch.int64))
    result = replay_response(*case.args(), **case.all_kwargs())
    assert differing_elements(result, goldens_token_by_token(case)) == BITWISE_EQUAL


def test_empty_sequences_return_their_states_unchanged():
    case = build_case([0, 0], seed=4)
    out, conv_state, state = replay_response(*case.args(), **case.all_kwargs())
    assert out.shape == (0, 4, 5)
    assert torch.equal(raw_bits(conv_state), raw_bits(case.conv_state))
    assert torch.equal(raw_bits(state), raw_bits(case.state))


def snapshot(case) -> dict[str, tuple[torch.Tensor, int]]:
    return {
        name: (t.detach().clone(), t._version)  # noqa: SLF001 - torch's in-place counter
        for name, t in case.tensors().items()
    }


def changed(case, before) -> list[str]:
    found = []
    for name, t in case.tensors().items():
        saved, version = before[name]
        same = (
            torch.equal(t, saved)
            if not t.is_floating_point()
            else torch.equal(raw_bits(t.detach()), raw_bits(saved))
        )
        if not same or t._version != version:  # noqa: SLF001
            found.append(name)
    return found


@pytest.mark.parametrize("state_dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_no_argument_is_modified(state_dtype):
    case = build_case(LENGTHS, seed=5, state_dtype=state_dtype, with_bias=True)
    before = snapshot(case)
    out, conv_state, state = replay_response(*case.args(), **case.all_kwargs())
    assert changed(case, before) == []
    for result in (conv_state, state):  # the results are new tensors, not views of the inputs
        assert result.untyped_storage().data_ptr() not in {
            t.untyped_storage().data_ptr() for t in case.tensors().values()
        }


def test_no_argument_is_modified_by_the_backward():
    case = build_case(LENGTHS, seed=6, x_dtype=torch.float32, with_bias=True)
    for t in case.tensors().values():
        if t.is_floating_point():
            t.requires_grad_(True)
    before = snapshot(case)
    out, conv_state, state = replay_response(*case.args(), **case.all_kwargs())
    (out.sum() + conv_state.float().sum() + state.sum()).backward()
    assert changed(case, before) == []


def test_the_check_sees_a_modified_input():
    case = build_case(LENGTHS, seed=7)
    before = snapshot(case)
    case.state[0, 0, 0, 0] += 0.0  # same value, new version
    case.x.view(torch.int16)[0, 0] ^= 1  # one bit
    assert changed(case, before) == ["x", "state"]


# Negative controls: the same comparison, other arithmetic.


def negative_case():
    """float32 x, so that out is float32 and shows differences bfloat16 would round away."""
    return build_case(LENGTHS, seed=8, with_bias=True, x_dtype=torch.float32)


def test_a_plain_pytorch_recurrence_differs():
    case = negative_case()
    checked = check_replay_args(*case.args(), **case.all_kwargs())
    with torch.no_grad():
        out, conv_state, state = replay_recurrence(case.inputs(), checked, dtype=torch.float32)
    result = (out.to(case.x.dtype), conv_state.to(case.conv_state.dtype), state)
    counts = differing_elements(result, goldens_token_by_token(case))
    assert counts["out"] > 0 and counts["state"] > 0, counts
    assert counts["conv_state"] == 0  # the conv history is a copy of inputs either way


def test_the_chunk_form_differs():
    """The chunk form of the same rule (transformers' torch_chunk_gated_delta_rule, the
    reference chunk algorithm) on the goldens' own conv outputs, gates and norms."""
    case = negative_case()
    H, HV, K = case.kwargs["num_k_heads"], case.state.shape[1], case.state.shape[3]
    out_ref, _, state_ref = goldens_token_by_token(case)
    out = torch.zeros_like(out_ref)
    state = case.state.clone()
    one = torch.ones(1, dtype=torch.int32)
    for s, (start, end) in enumerate(zip(case.cu_seqlens[:-1], case.cu_seqlens[1:], strict=True)):
        if end == start:
            continue
        conv_cache = torch.stack([case.conv_state[s], case.conv_state[s]])
        rows = []
        for i in range(start, end):
            y, conv_cache = golden.conv_update(
                case.x[i : i + 1], conv_cache, case.conv_weight, one, bias=case.conv_bias
            )
            rows.append(y)
        y = torch.cat(rows).float()
        q = y[:, : H * K].reshape(1, -1, H, K).repeat_interleave(HV // H, dim=2)
        k = y[:, H * K : 2 * H * K].reshape(1, -1, H, K).repeat_interleave(HV // H, dim=2)
        v = y[:, 2 * H * K :].reshape(1, -1, HV, case.state.shape[2])
        a, b = case.a[start:end].float(), case.b[start:end].float()
        g = -golden.exp(case.A_log) * golden.softplus(a + case.dt_bias)
        o, final = torch_chunk_gated_delta_rule(
            q, k, v, g[None], golden.sigmoid(b)[None], chunk_size=64,
            initial_state=case.state[s : s + 1].transpose(-1, -2).float(),
            output_final_state=True, use_qk_l2norm_in_kernel=True,
        )  # fmt: skip
        out[start:end] = o[0].to(out.dtype)
        state[s] = final[0].transpose(-1, -2)
    counts = differing_elements(
        (out, case.conv_state, state), (out_ref, case.conv_state, state_ref)
    )
    assert counts["out"] > 0 and counts["state"] > 0, counts


def test_goldens_with_another_reduction_order_differ(monkeypatch):
    case = negative_case()
    reference = goldens_token_by_token(case)
    monkeypatch.setattr(golden_recurrent, "fixed_order_sum", lambda x: x.sum(-1))
    result = replay_response(*case.args(), **case.all_kwargs())
    counts = differing_elements(result, reference)
    assert counts["out"] > 0 and counts["state"] > 0, counts
