"""Golden Gated DeltaNet decode step (one token per row) over a paged recurrent state.

Arithmetic, per active row and value head ``hv``, all in fp32 (inputs are converted to fp32,
which is exact; the state block is loaded to fp32):

    i_h   = hv // (HV // H)                                  # k-head shared by hv
    q, k  = q[i_h], k[i_h]                                   # [K]
    q     = q / sqrt(S(q * q) + 1e-6)                        # if use_qk_l2norm
    k     = k / sqrt(S(k * k) + 1e-6)                        # if use_qk_l2norm
    q     = q * scale
    g     = -exp(A_log[hv]) * softplus(a[hv] + dt_bias[hv])  # softplus(x) = x for x > 20
    beta  = sigmoid(b[hv])
    h     = h * exp(g)                                       # h: [V, K]
    v     = (v[hv] - S_k(h * k)) * beta                      # [V]
    h     = h + v[:, None] * k[None, :]
    o     = S_k(h * q)                                       # [V]

``S`` is ``fixed_order_sum`` (reduction.py) over K; exp, softplus and sigmoid are the fixed
IEEE sequences of elementary.py, sqrt is its correctly rounded square root, and division is
IEEE. Every product and sum is its own rounded fp32 op (no FMA). Rounding happens only where
``o`` is stored (to mixed_qkv's dtype) and where ``h`` is stored (to the state's dtype).

This follows vLLM's ``fused_recurrent_gated_delta_rule_packed_decode`` kernel
(vllm/third_party/flash_linear_attention/ops/fused_recurrent.py, identical arithmetic in
0.30.0 to 0.34.0): the same op sequence, head map, norm epsilon, place of ``scale``, gate
formulas and threshold. It differs in: the order of the three K-reductions (the kernel's
``tl.sum`` reduces in Triton's layout order, which in 0.34 depends on the tile ``BV`` chosen from
``B * HV`` on Blackwell); exp and log (the kernel uses ``tl.exp``/``tl.log``, hardware
approximations, or ``fast_expf``/``fast_logf`` under FLA_USE_FAST_OPS=1); softplus (the kernel
computes ``log(1 + exp(x))``, the golden ``log1p(exp(x))``); sigmoid (``tl.sigmoid`` against
``e / (1 + e)`` with ``e = exp(-|b|)`` below zero); sqrt and division (Triton's default
``tl.sqrt`` and ``/`` are approximate, the golden's are IEEE); and contraction (the compiler may
fuse the kernel's products into FMAs, the golden rounds each product). So the golden is not
bitwise equal to the kernel; it is the reference the golden-matched kernels reproduce.
"""

import functools
import math
from dataclasses import dataclass

import torch
from torch import Tensor

from .contract import (
    FLOAT_DTYPES,
    STATE_DTYPES,
    ActiveRows,
    active_rows,
    check_state_index_values,
    require_bool,
    require_positive_int,
    require_real,
    require_shape,
    require_state_indices,
    require_tensor,
)
from .elementary import exp, sigmoid, softplus, sqrt
from .reduction import fixed_order_sum

QK_NORM_EPS = float.fromhex("0x1.0c6f7ap-20")  # fp32(1e-6)


def l2_normalize(x: Tensor) -> Tensor:
    """x / sqrt(S(x * x) + 1e-6) over the last dimension, fp32."""
    norm = sqrt(fixed_order_sum(x * x) + QK_NORM_EPS)
    return x / norm[..., None]


def gated_delta_step(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    a: Tensor,
    b: Tensor,
    A_log: Tensor,
    dt_bias: Tensor,
    h: Tensor,
    *,
    scale: float,
    use_qk_l2norm: bool,
) -> tuple[Tensor, Tensor]:
    """One decode step for n rows, fp32 throughout (the arithmetic of the module docstring).

    Shapes: q, k [n, H, K]; v [n, HV, V]; a, b [n, HV]; A_log, dt_bias [HV]; h [n, HV, V, K].
    Returns o [n, HV, V] and the new h [n, HV, V, K].
    """
    num_k_heads, num_v_heads = q.shape[1], v.shape[1]
    head_of = torch.arange(num_v_heads, device=q.device) // (num_v_heads // num_k_heads)
    if use_qk_l2norm:
        q = l2_normalize(q)
        k = l2_normalize(k)
    q = q * scale
    q = q.index_select(1, head_of)[:, :, None, :]  # [n, HV, 1, K]
    k = k.index_select(1, head_of)[:, :, None, :]

    g = -exp(A_log) * softplus(a + dt_bias)  # [n, HV]
    beta = sigmoid(b)

    h = h * exp(g)[:, :, None, None]
    v = (v - fixed_order_sum(h * k)) * beta[:, :, None]
    h = h + v[:, :, :, None] * k
    o = fixed_order_sum(h * q)
    return o, h


def fp32_scale(scale: float) -> float:
    """``scale`` rounded once to fp32, as torch rounds a Python float (kept per value)."""
    return fp32_of(scale, math.copysign(1.0, scale))


@functools.lru_cache(maxsize=256)
def fp32_of(value: float, sign: float) -> float:
    """``value`` rounded to fp32 by torch; ``sign`` (``copysign(1, value)``) keeps -0.0 and 0.0,
    which compare equal, apart in the cache."""
    return torch.tensor(value, dtype=torch.float32).item()


@dataclass(frozen=True)
class RecurrentDims:
    """Sizes of a recurrent step, its scale rounded to fp32 and whether q and k are normalized."""

    batch: int
    num_k_heads: int
    num_v_heads: int
    head_k: int
    head_v: int
    scale: float
    use_qk_l2norm: bool


@dataclass(frozen=True)
class RecurrentArgs(RecurrentDims):
    """The dims of checked recurrent_step arguments and their active rows."""

    active: ActiveRows


def check_recurrent_dims(
    mixed_qkv: object,
    a: object,
    b: object,
    A_log: object,
    dt_bias: object,
    state: object,
    state_indices: object,
    *,
    num_k_heads: object,
    scale: object,
    use_qk_l2norm: object,
) -> RecurrentDims:
    """recurrent_step's argument checks but the index values (contract.py): every type, dtype,
    rank, device and shape, the indices' included; reads no tensor's values."""
    require_tensor(mixed_qkv, "mixed_qkv", ndim=2, dtypes=FLOAT_DTYPES)
    device = mixed_qkv.device
    batch, width = mixed_qkv.shape
    require_tensor(a, "a", ndim=2, dtypes=FLOAT_DTYPES, device=device, device_of="mixed_qkv")
    num_v_heads = a.shape[1]
    require_shape(a, "a", (batch, num_v_heads), "[B, HV]")
    require_tensor(b, "b", ndim=2, dtypes=FLOAT_DTYPES, device=device, device_of="mixed_qkv")
    require_shape(b, "b", (batch, num_v_heads), "[B, HV] (HV from a)")
    require_tensor(
        A_log, "A_log", ndim=1, dtypes=FLOAT_DTYPES, device=device, device_of="mixed_qkv"
    )
    require_shape(A_log, "A_log", (num_v_heads,), "[HV]")
    require_tensor(
        dt_bias, "dt_bias", ndim=1, dtypes=FLOAT_DTYPES, device=device, device_of="mixed_qkv"
    )
    require_shape(dt_bias, "dt_bias", (num_v_heads,), "[HV]")
    require_tensor(
        state, "state", ndim=4, dtypes=STATE_DTYPES, device=device, device_of="mixed_qkv"
    )
    state_heads, head_v, head_k = state.shape[1:]
    if state_heads != num_v_heads:
        raise ValueError(
            f"state must have shape [num_blocks, HV, V, K] with HV={num_v_heads} (from a), "
            f"got {tuple(state.shape)}"
        )
    num_k_heads = require_positive_int(num_k_heads, "num_k_heads")
    if num_v_heads % num_k_heads != 0:
        raise ValueError(f"num_k_heads={num_k_heads} must divide HV={num_v_heads} (HV % H != 0)")
    qk_width = width - num_v_heads * head_v
    if qk_width <= 0 or qk_width % (2 * num_k_heads) != 0:
        raise ValueError(
            f"mixed_qkv width {width} is not 2*H*K + HV*V for H=num_k_heads={num_k_heads}, "
            f"HV={num_v_heads}, V={head_v}"
        )
    if qk_width // (2 * num_k_heads) != head_k:
        raise ValueError(
            f"mixed_qkv width {width} gives K={qk_width // (2 * num_k_heads)} for "
            f"num_k_heads={num_k_heads}, HV={num_v_heads}, V={head_v}, but state.shape[3]={head_k}"
        )
    scale = require_real(scale, "scale")
    use_qk_l2norm = require_bool(use_qk_l2norm, "use_qk_l2norm")
    require_state_indices(state_indices, batch=batch, device=device, device_of="mixed_qkv")

    return RecurrentDims(
        batch=batch,
        num_k_heads=num_k_heads,
        num_v_heads=num_v_heads,
        head_k=head_k,
        head_v=head_v,
        scale=fp32_scale(scale),
        use_qk_l2norm=use_qk_l2norm,
    )


def check_recurrent_args(
    mixed_qkv: object,
    a: object,
    b: object,
    A_log: object,
    dt_bias: object,
    state: object,
    state_indices: object,
    *,
    num_k_heads: object,
    scale: object,
    use_qk_l2norm: object,
) -> RecurrentArgs:
    """recurrent_step's argument checks (contract.py): ``check_recurrent_dims``, then the
    index values; raises before anything is computed."""
    dims = check_recurrent_dims(
        mixed_qkv,
        a,
        b,
        A_log,
        dt_bias,
        state,
        state_indices,
        num_k_heads=num_k_heads,
        scale=scale,
        use_qk_l2norm=use_qk_l2norm,
    )
    check_state_index_values(state_indices, num_blocks=state.shape[0])
    return RecurrentArgs(**dims.__dict__, active=active_rows(state_indices))


def recurrent_step(
    mixed_qkv: Tensor,
    a: Tensor,
    b: Tensor,
    A_log: Tensor,
    dt_bias: Tensor,
    state: Tensor,
    state_indices: Tensor,
    *,
    num_k_heads: int,
    scale: float,
    use_qk_l2norm: bool = True,
) -> tuple[Tensor, Tensor]:
    """Golden GDN decode step; returns ``(out [B, 1, HV, V], new_state)``, out of place.

    ``mixed_qkv`` [B, 2*H*K + HV*V] is q | k | v, ``a``, ``b`` [B, HV], ``A_log``, ``dt_bias``
    [HV], ``state`` [num_blocks, HV, V, K] (fp32 or bf16), ``state_indices`` [B] (<= 0:
    inactive). Fixes vLLM's packed-decode arithmetic in fp32 with a fixed pairwise K-reduction,
    IEEE sqrt and division, no FMA and the golden exp/softplus/sigmoid, rounding only at the
    two stores; it differs from the kernel in reduction order, those function implementations,
    softplus as ``log1p(exp(x))`` and contraction (module docstring). ``out`` has mixed_qkv's
    dtype; ``new_state`` equals ``state`` outside the active rows' blocks.
    """
    checked = check_recurrent_args(
        mixed_qkv,
        a,
        b,
        A_log,
        dt_bias,
        state,
        state_indices,
        num_k_heads=num_k_heads,
        scale=scale,
        use_qk_l2norm=use_qk_l2norm,
    )
    batch, num_k_heads, num_v_heads = checked.batch, checked.num_k_heads, checked.num_v_heads
    head_k, head_v, active = checked.head_k, checked.head_v, checked.active
    qk_dim = num_k_heads * head_k
    n = active.rows.numel()
    rows = mixed_qkv.index_select(0, active.rows).to(torch.float32)
    q = rows[:, :qk_dim].reshape(n, num_k_heads, head_k)
    k = rows[:, qk_dim : 2 * qk_dim].reshape(n, num_k_heads, head_k)
    v = rows[:, 2 * qk_dim :].reshape(n, num_v_heads, head_v)
    h = state.index_select(0, active.blocks).to(torch.float32)
    o, h = gated_delta_step(
        q,
        k,
        v,
        a.index_select(0, active.rows).to(torch.float32),
        b.index_select(0, active.rows).to(torch.float32),
        A_log.to(torch.float32),
        dt_bias.to(torch.float32),
        h,
        scale=checked.scale,
        use_qk_l2norm=checked.use_qk_l2norm,
    )

    out = torch.zeros(
        (batch, 1, num_v_heads, head_v), dtype=mixed_qkv.dtype, device=mixed_qkv.device
    )
    out[active.rows, 0] = o.to(mixed_qkv.dtype)
    new_state = state.clone()
    new_state[active.blocks] = h.to(state.dtype)
    return out, new_state
