"""replay_response's gradient is the gradient of the replayed function.

The reference is float64 autograd of the plain math, written here from the goldens' docstrings
one sequence, one token and one value head at a time (independent of the replay's own
vectorized recomputation). The comparison is the largest error relative to the largest
reference gradient, per input, against a regression bound with the measured value beside it.
A backward that does not carry the gradient through the recurrence exceeds the bound.
"""

import pytest
import torch
import torch.nn.functional as F

from vllm_gdn_invariant.replay import recurrence, replay_response

from .helpers import build_case

LENGTHS = [3, 1, 0, 6]
NAMES = ("x", "a", "b", "A_log", "dt_bias", "conv_weight", "conv_state", "state", "conv_bias")
# Regression bound, float32 inputs: measured max 5.3e-7 (conv_bias; the other inputs 4e-8 to
# 3.5e-7), over the three loss variants of USES.
FLOAT32_GRAD_BOUND = 1e-5
# Regression bound, bfloat16 x, a, b, conv weight and conv state: their gradients, and the
# gradient reaching the bfloat16 out, are bfloat16 (rounded to 2^-9 relative). Measured max
# 3.4e-3 (x; the float32 A_log, dt_bias and state 2.6e-4 to 4.3e-4).
BFLOAT16_GRAD_BOUND = 1e-2


def plain_math(case, x, a, b, A_log, dt_bias, conv_weight, conv_state, state, conv_bias):
    """(out, final conv state, final state) of the goldens' docstring math, unvectorized."""
    H, scale = case.kwargs["num_k_heads"], case.kwargs["scale"]
    HV, V, K = state.shape[1:]
    offsets = case.cu_seqlens.tolist()
    outs, conv_finals, finals = [], [], []
    for s in range(len(offsets) - 1):
        hist, h = conv_state[s], state[s]
        for i in range(offsets[s], offsets[s + 1]):
            window = torch.cat([hist, x[i][:, None]], dim=1)
            y = F.silu((window * conv_weight).sum(-1) + conv_bias)
            hist = window[:, 1:]
            q = y[: H * K].reshape(H, K)
            k = y[H * K : 2 * H * K].reshape(H, K)
            v = y[2 * H * K :].reshape(HV, V)
            q = q / torch.sqrt((q * q).sum(-1, keepdim=True) + 1e-6) * scale
            k = k / torch.sqrt((k * k).sum(-1, keepdim=True) + 1e-6)
            g = -torch.exp(A_log) * F.softplus(a[i] + dt_bias)
            beta = torch.sigmoid(b[i])
            heads, out = [], []
            for hv in range(HV):
                qh, kh = q[hv // (HV // H)], k[hv // (HV // H)]
                hh = h[hv] * torch.exp(g[hv])
                vh = (v[hv] - hh @ kh) * beta[hv]
                hh = hh + torch.outer(vh, kh)
                heads.append(hh)
                out.append(hh @ qh)
            h = torch.stack(heads)
            outs.append(torch.stack(out))
        conv_finals.append(hist)
        finals.append(h)
    return torch.stack(outs), torch.stack(conv_finals), torch.stack(finals)


def loss_weights(case, seed=11):
    g = torch.Generator().manual_seed(seed)
    n, (s, hv, v, k), dim_w = case.x.shape[0], case.state.shape, case.conv_state.shape[1:]
    return (
        torch.randn(n, hv, v, generator=g, dtype=torch.float64),
        torch.randn(s, *dim_w, generator=g, dtype=torch.float64),
        torch.randn(s, hv, v, k, generator=g, dtype=torch.float64),
    )


def weighted_loss(outputs, weights, use):
    return sum((o.double() * w).sum() for o, w, u in zip(outputs, weights, use, strict=True) if u)


def replay_grads(case, use):
    leaves = {n: getattr(case, n).detach().clone().requires_grad_(True) for n in NAMES}
    args = [leaves[n] for n in NAMES[:8]]
    outputs = replay_response(*args, case.cu_seqlens, conv_bias=leaves["conv_bias"], **case.kwargs)
    weighted_loss(outputs, loss_weights(case), use).backward()
    return {n: leaves[n].grad for n in NAMES}


def float64_grads(case, use):
    leaves = {n: getattr(case, n).detach().double().requires_grad_(True) for n in NAMES}
    outputs = plain_math(case, **leaves)
    weighted_loss(outputs, loss_weights(case), use).backward()
    return {n: leaves[n].grad for n in NAMES}


def relative_errors(grads, reference) -> dict[str, float]:
    errors = {}
    for name in NAMES:
        got, want = grads[name], reference[name]
        errors[name] = (got.double() - want).abs().max().item() / want.abs().max().item()
    return errors


def float32_case():
    dtypes = dict(x_dtype=torch.float32, conv_state_dtype=torch.float32)
    return build_case(LENGTHS, seed=2, weight_dtype=torch.float32, with_bias=True, **dtypes)


USES = {
    "out, conv state and state": (True, True, True),
    "out only": (True, False, False),
    "final state only": (False, False, True),
}


@pytest.mark.parametrize("use", USES.values(), ids=USES.keys())
def test_float32_gradients_agree_with_float64_autograd_of_the_plain_math(use):
    case = float32_case()
    errors = relative_errors(replay_grads(case, use), float64_grads(case, use))
    assert max(errors.values()) < FLOAT32_GRAD_BOUND, errors


def test_gradients_have_the_inputs_dtypes():
    case = build_case(LENGTHS, seed=3, with_bias=True)  # bf16 x, a, b, weight, conv state
    grads = replay_grads(case, (True, True, True))
    assert {n: g.dtype for n, g in grads.items()} == {n: getattr(case, n).dtype for n in NAMES}
    errors = relative_errors(grads, float64_grads(case, (True, True, True)))
    assert max(errors.values()) < BFLOAT16_GRAD_BOUND, errors


def test_a_backward_that_does_not_carry_the_state_fails_the_bound(monkeypatch):
    """Truncated backpropagation (the state's gradient stopped at every step) is the gradient
    of another function; the check must see it."""
    step = recurrence.gdn_step

    def truncated(x, a, b, hist, h, weights, args):
        return step(x, a, b, hist, h.detach(), weights, args)

    case = float32_case()
    reference = float64_grads(case, (True, True, True))
    monkeypatch.setattr(recurrence, "gdn_step", truncated)
    errors = relative_errors(replay_grads(case, (True, True, True)), reference)
    assert max(errors.values()) > 100 * FLOAT32_GRAD_BOUND, errors


def test_a_bfloat16_state_that_needs_a_gradient_is_refused():
    case = build_case(LENGTHS, seed=4, state_dtype=torch.bfloat16)
    x = case.x.clone().requires_grad_(True)
    with pytest.raises(TypeError, match=r"float32 recurrent state only; state is torch.bfloat16 "
                                        r"and x require grad"):  # fmt: skip
        replay_response(x, *case.args()[1:], **case.all_kwargs())
    with torch.no_grad():
        out, _, state = replay_response(x, *case.args()[1:], **case.all_kwargs())
    assert state.dtype == torch.bfloat16 and not out.requires_grad


def test_outputs_need_no_gradient_when_no_input_does():
    case = float32_case()
    out, conv_state, state = replay_response(*case.args(), **case.all_kwargs())
    assert not (out.requires_grad or conv_state.requires_grad or state.requires_grad)
