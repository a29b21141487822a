"""The replayed function in plain differentiable PyTorch: what the replay's backward differentiates.

The math of the goldens' docstrings (golden/conv.py, golden/recurrent.py) in one floating dtype
(float32 in the backward), with torch's own ``exp``, ``softplus`` (threshold 20), ``sigmoid``,
``silu``, ``sqrt`` and sums, for every sequence of a step at once (plan.py's steps). Per token:

    window = [hist, x_t]                      hist: the sequence's last W-1 conv inputs
    y      = silu(bias + sum_j window_j * w_j) (no silu when activation is None)
    hist   = window[1:]
    q, k, v = y split as 2*H*K + HV*V;  q, k = q / sqrt(q.q + 1e-6), k / sqrt(k.k + 1e-6)
    q      = q * scale;  q, k repeated to HV heads (value head hv reads k-head hv // (HV/H))
    g      = -exp(A_log) * softplus(a + dt_bias);  beta = sigmoid(b)
    h      = h * exp(g);  v = (v - h k) * beta;  h = h + v k^T;  o = h q

The forward's roundings (the conv token to the cache dtype, products to the operand dtype, the
output to x's dtype, the state to its dtype) are not applied: as for any dtype cast under
autograd, their derivative is taken as the identity.

Memory: autograd keeps about two [n, HV, V, K] tensors per step (the state before and after
the decay), so the steps run in segments of about sqrt(T) steps (T: the longest sequence),
each under ``torch.utils.checkpoint``: the segments' input states are kept, and each segment is
recomputed once more when the backward reaches it. That holds about ``sqrt(T)`` states per
sequence at any time, for one extra forward.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from .checks import ReplayArgs, ReplayInputs

QK_NORM_EPS = 1e-6
SOFTPLUS_THRESHOLD = 20.0


@dataclass(frozen=True)
class Weights:
    """The per-layer tensors of a step, in the compute dtype; ``decay`` is -exp(A_log)."""

    conv_weight: Tensor
    conv_bias: Tensor | None
    decay: Tensor
    dt_bias: Tensor


def l2_normalize(x: Tensor) -> Tensor:
    """x / sqrt(x.x + 1e-6) over the last dimension."""
    return x / torch.sqrt((x * x).sum(-1, keepdim=True) + QK_NORM_EPS)


def gdn_step(
    x: Tensor, a: Tensor, b: Tensor, hist: Tensor, h: Tensor, weights: Weights, args: ReplayArgs
) -> tuple[Tensor, Tensor, Tensor]:
    """One token of n sequences: x [n, dim], a, b [n, HV], hist [n, dim, W-1], h [n, HV, V, K].

    Returns (o [n, HV, V], new h, new hist).
    """
    dims = args.dims
    n = x.shape[0]
    window = torch.cat([hist, x[:, :, None]], dim=2)
    y = (window * weights.conv_weight).sum(-1)
    if weights.conv_bias is not None:
        y = y + weights.conv_bias
    if args.activation is not None:
        y = F.silu(y)
    qk = dims.num_k_heads * dims.head_k
    q = y[:, :qk].reshape(n, dims.num_k_heads, dims.head_k)
    k = y[:, qk : 2 * qk].reshape(n, dims.num_k_heads, dims.head_k)
    v = y[:, 2 * qk :].reshape(n, dims.num_v_heads, dims.head_v)
    if dims.use_qk_l2norm:
        q, k = l2_normalize(q), l2_normalize(k)
    group = dims.num_v_heads // dims.num_k_heads
    q = (q * dims.scale).repeat_interleave(group, dim=1)[:, :, None, :]  # [n, HV, 1, K]
    k = k.repeat_interleave(group, dim=1)[:, :, None, :]
    g = weights.decay * F.softplus(a + weights.dt_bias, threshold=SOFTPLUS_THRESHOLD)
    beta = torch.sigmoid(b)
    h = h * torch.exp(g)[:, :, None, None]
    v = (v - (h * k).sum(-1)) * beta[:, :, None]
    h = h + v[:, :, :, None] * k
    o = (h * q).sum(-1)
    return o, h, window[:, :, 1:]


def run_steps(
    h: Tensor,
    hist: Tensor,
    x: Tensor,
    a: Tensor,
    b: Tensor,
    weights: Weights,
    args: ReplayArgs,
    sizes: tuple[int, ...],
) -> tuple[Tensor, Tensor, Tensor]:
    """Consecutive steps of ``sizes[i]`` sequences each, from states h, hist of ``sizes[0]``
    (or more) ranked sequences; x, a, b hold the steps' tokens, step after step.

    Returns (the steps' outputs, step after step; h; hist), the states of every sequence given,
    those that finished on the way holding their final values.
    """
    finished: list[tuple[Tensor, Tensor]] = []
    outputs = []
    for x_t, a_t, b_t in zip(x.split(sizes), a.split(sizes), b.split(sizes), strict=True):
        h, hist = set_aside_finished(h, hist, x_t.shape[0], finished)
        o, h, hist = gdn_step(x_t, a_t, b_t, hist, h, weights, args)
        outputs.append(o)
    h, hist = with_finished(h, hist, finished)
    return torch.cat(outputs), h, hist


def set_aside_finished(
    h: Tensor, hist: Tensor, keep: int, finished: list[tuple[Tensor, Tensor]]
) -> tuple[Tensor, Tensor]:
    """The states of the first ``keep`` ranked sequences; those of the others (finished: the
    ranking puts them last) are appended to ``finished``."""
    n = h.shape[0]
    if keep == n:
        return h, hist
    h, h_done = h.split([keep, n - keep])
    hist, hist_done = hist.split([keep, n - keep])
    finished.append((h_done, hist_done))
    return h, hist


def with_finished(
    h: Tensor, hist: Tensor, finished: list[tuple[Tensor, Tensor]]
) -> tuple[Tensor, Tensor]:
    """The states of every ranked sequence again: ``h``, ``hist`` followed by those set aside
    (``set_aside_finished``), in ranking order."""
    h = torch.cat([h, *(done[0] for done in reversed(finished))])
    hist = torch.cat([hist, *(done[1] for done in reversed(finished))])
    return h, hist


def segment_length(max_length: int) -> int:
    """Steps per checkpointed segment: about sqrt(T)."""
    return max(1, math.isqrt(max(max_length - 1, 0)) + 1)


def replay_recurrence(
    inputs: ReplayInputs, args: ReplayArgs, dtype: torch.dtype = torch.float32
) -> tuple[Tensor, Tensor, Tensor]:
    """(out [N, HV, V], final conv state [S, dim, W-1], final state [S, HV, V, K]) in ``dtype``,
    differentiable in every tensor of ``inputs`` (module docstring)."""
    t = inputs
    plan, device = args.plan, t.x.device
    ranking = plan.ranking_on(device)
    tokens = torch.tensor(plan.step_major_tokens(), dtype=torch.int64, device=device)
    weights = Weights(
        conv_weight=t.conv_weight.to(dtype),
        conv_bias=None if t.conv_bias is None else t.conv_bias.to(dtype),
        decay=-torch.exp(t.A_log.to(dtype)),
        dt_bias=t.dt_bias.to(dtype),
    )
    x_steps = t.x.to(dtype).index_select(0, tokens)
    a_steps = t.a.to(dtype).index_select(0, tokens)
    b_steps = t.b.to(dtype).index_select(0, tokens)
    h = t.state.to(dtype).index_select(0, ranking)
    hist = t.conv_state.to(dtype).index_select(0, ranking)

    sizes, length = plan.step_sizes, segment_length(plan.max_length)
    segments = [sizes[t : t + length] for t in range(0, len(sizes), length)]
    counts = [sum(segment) for segment in segments]
    finished: list[tuple[Tensor, Tensor]] = []
    outputs = []
    for segment, x_seg, a_seg, b_seg in zip(
        segments, x_steps.split(counts), a_steps.split(counts), b_steps.split(counts), strict=True
    ):
        h, hist = set_aside_finished(h, hist, segment[0], finished)
        step = (h, hist, x_seg, a_seg, b_seg, weights, args, segment)
        if torch.is_grad_enabled():
            o, h, hist = checkpoint(run_steps, *step, use_reentrant=False)
        else:
            o, h, hist = run_steps(*step)
        outputs.append(o)
    h, hist = with_finished(h, hist, finished)
    dims = args.dims
    out_steps = (
        torch.cat(outputs)
        if outputs
        else torch.zeros((0, dims.num_v_heads, dims.head_v), dtype=dtype, device=device)
    )
    unrank = torch.argsort(ranking)
    return (
        out_steps.index_select(0, torch.argsort(tokens)),
        hist.index_select(0, unrank),
        h.index_select(0, unrank),
    )
