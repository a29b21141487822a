"""Cases of the replay tests, the goldens applied token by token, and the bitwise comparison."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch
from torch import Tensor

from vllm_gdn_invariant import golden
from vllm_gdn_invariant.replay.checks import ReplayInputs
from vllm_gdn_invariant.shadow.bits import differ

from ..kernels.replay_cases import offsets, randn, random_layer_inputs

FIELDS = ("out", "conv_state", "state")


@dataclass
class ReplayCase:
    """Arguments of one replay_response call."""

    x: Tensor
    a: Tensor
    b: Tensor
    A_log: Tensor
    dt_bias: Tensor
    conv_weight: Tensor
    conv_state: Tensor
    state: Tensor
    cu_seqlens: Tensor
    conv_bias: Tensor | None = None
    kwargs: dict = field(default_factory=dict)

    def args(self) -> tuple:
        return (
            self.x,
            self.a,
            self.b,
            self.A_log,
            self.dt_bias,
            self.conv_weight,
            self.conv_state,
            self.state,
            self.cu_seqlens,
        )

    def inputs(self) -> ReplayInputs:
        """The tensors in the order of the replay's forward paths (conv_bias after conv_weight)."""
        return ReplayInputs(*self.args()[:6], self.conv_bias, self.conv_state, self.state)

    def all_kwargs(self) -> dict:
        return {"conv_bias": self.conv_bias, **self.kwargs}

    def tensors(self) -> dict[str, Tensor]:
        """Every tensor argument by name (conv_bias when given)."""
        names = ("x", "a", "b", "A_log", "dt_bias", "conv_weight", "conv_state", "state")
        found = {name: getattr(self, name) for name in names}
        found["cu_seqlens"] = self.cu_seqlens
        if self.conv_bias is not None:
            found["conv_bias"] = self.conv_bias
        return found

    def with_changes(self, **changes) -> ReplayCase:
        return replace(self, **changes)


def build_case(
    lengths: list[int],
    *,
    H: int = 2,
    HV: int = 4,
    K: int = 7,
    V: int = 5,
    W: int = 4,
    x_dtype: torch.dtype = torch.bfloat16,
    state_dtype: torch.dtype = torch.float32,
    conv_state_dtype: torch.dtype = torch.bfloat16,
    weight_dtype: torch.dtype = torch.bfloat16,
    with_bias: bool = False,
    seed: int = 0,
    use_qk_l2norm: bool = True,
    activation: str | None = "silu",
) -> ReplayCase:
    """Random inputs of a packed batch of sequences of ``lengths`` (odd K and V by default)."""
    g = torch.Generator().manual_seed(seed)
    n, s = sum(lengths), len(lengths)
    dim = 2 * H * K + HV * V
    layer = random_layer_inputs(
        g, n, H=H, HV=HV, K=K, V=V, W=W, x_dtype=x_dtype, weight_dtype=weight_dtype
    )
    return ReplayCase(
        **layer,
        conv_state=randn(g, s, dim, W - 1, dtype=conv_state_dtype),
        state=randn(g, s, HV, V, K, scale=0.5, dtype=state_dtype),
        cu_seqlens=offsets(lengths),
        conv_bias=randn(g, dim, dtype=weight_dtype) if with_bias else None,
        kwargs={
            "num_k_heads": H,
            "scale": K**-0.5,
            "activation": activation,
            "use_qk_l2norm": use_qk_l2norm,
        },
    )


def goldens_token_by_token(case: ReplayCase) -> tuple[Tensor, Tensor, Tensor]:
    """Each sequence alone, each token its own decode step: golden.conv_update, then
    golden.recurrent_step on its output, over a two-block cache (block 1 the sequence's)."""
    kwargs = case.kwargs
    one = torch.ones(1, dtype=torch.int32)
    lengths = case.cu_seqlens.diff().tolist()
    num_v_heads, head_v = case.state.shape[1], case.state.shape[2]
    out = torch.zeros((case.x.shape[0], num_v_heads, head_v), dtype=case.x.dtype)
    conv_state, state = case.conv_state.clone(), case.state.clone()
    for s, start in enumerate(case.cu_seqlens[:-1].tolist()):
        conv_cache = torch.stack([torch.zeros_like(conv_state[s]), conv_state[s]])
        cache = torch.stack([torch.zeros_like(state[s]), state[s]])
        for i in range(start, start + lengths[s]):
            y, conv_cache = golden.conv_update(
                case.x[i : i + 1],
                conv_cache,
                case.conv_weight,
                one,
                bias=case.conv_bias,
                activation=kwargs["activation"],
            )
            o, cache = golden.recurrent_step(
                y,
                case.a[i : i + 1],
                case.b[i : i + 1],
                case.A_log,
                case.dt_bias,
                cache,
                one,
                num_k_heads=kwargs["num_k_heads"],
                scale=kwargs["scale"],
                use_qk_l2norm=kwargs["use_qk_l2norm"],
            )
            out[i] = o[0, 0]
        conv_state[s], state[s] = conv_cache[1], cache[1]
    return out, conv_state, state


def differing_elements(
    result: tuple[Tensor, Tensor, Tensor], reference: tuple[Tensor, Tensor, Tensor]
) -> dict[str, int]:
    """Per field (out, conv_state, state): how many elements' bits differ. Dtypes and shapes
    must agree (a different dtype is not a bitwise match)."""
    counts = {}
    for name, got, want in zip(FIELDS, result, reference, strict=True):
        assert (got.dtype, tuple(got.shape)) == (want.dtype, tuple(want.shape)), name
        counts[name] = differ(got, want)
    return counts


BITWISE_EQUAL = dict.fromkeys(FIELDS, 0)
