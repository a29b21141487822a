"""``replay_response``: a whole response's GDN outputs and final states with the rollout's bits."""

from __future__ import annotations

import functools

from torch import Tensor

from .checks import ReplayInputs, check_replay_args, require_float32_state_for_grad
from .function import ReplayFunction
from .golden_path import replay_with_goldens
from .kernel_path import replay_with_kernel


def replay_response(
    x: Tensor,
    a: Tensor,
    b: Tensor,
    A_log: Tensor,
    dt_bias: Tensor,
    conv_weight: Tensor,
    conv_state: Tensor,
    state: Tensor,
    cu_seqlens: Tensor,
    *,
    num_k_heads: int,
    scale: float,
    conv_bias: Tensor | None = None,
    activation: str | None = "silu",
    use_qk_l2norm: bool = True,
) -> tuple[Tensor, Tensor, Tensor]:
    """Every response token's GDN output and each sequence's final states, as mode golden's
    decode steps computed them: ``golden.conv_update`` then ``golden.recurrent_step`` on its
    output, token after token, bit for bit.

    ``x`` [N, 2*H*K + HV*V]: each token's q | k | v before the convolution, sequences packed
    back to back; ``cu_seqlens`` [S+1] (int32 or int64, from 0 to N, on x's device or the
    CPU); ``a``, ``b`` [N, HV]; ``A_log``, ``dt_bias`` [HV]; ``conv_weight`` [dim, W];
    ``conv_bias`` [dim] or None; ``conv_state`` [S, dim, W-1] and ``state`` [S, HV, V, K]
    (float32 or bfloat16): each sequence's conv history and recurrent state before its first
    token. ``num_k_heads`` is H; ``scale``, ``activation`` and ``use_qk_l2norm`` are the
    goldens'.

    Returns ``out`` [N, HV, V] in x's dtype and the final conv state [S, dim, W-1] and state
    [S, HV, V, K] in the dtypes of the states given. No argument is modified. On CUDA tensors
    one launch of the golden-matched replay kernel computes it; on other devices the goldens,
    one batched step per token position. The bits are the same on both.

    Differentiable in every tensor argument, with a float32 ``state`` (a bfloat16 one that
    would need a gradient is refused): the backward recomputes the function in float32
    PyTorch and backpropagates through the recurrence (recurrence.py, docs/replay.md).
    Arguments are checked first, with the goldens' errors (checks.py).
    """
    checked = check_replay_args(
        x,
        a,
        b,
        A_log,
        dt_bias,
        conv_weight,
        conv_state,
        state,
        cu_seqlens,
        num_k_heads=num_k_heads,
        scale=scale,
        conv_bias=conv_bias,
        activation=activation,
        use_qk_l2norm=use_qk_l2norm,
    )
    inputs = ReplayInputs(x, a, b, A_log, dt_bias, conv_weight, conv_bias, conv_state, state)
    require_float32_state_for_grad(state, inputs._asdict())  # NamedTuple's public name map
    if x.device.type == "cuda":
        forward = functools.partial(replay_with_kernel, cu_seqlens=cu_seqlens, checked=checked)
    else:
        forward = functools.partial(replay_with_goldens, checked=checked)
    return ReplayFunction.apply(forward, checked, *inputs)
