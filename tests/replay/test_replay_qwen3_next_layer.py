"""The worked example of docs/replay.md, run on transformers' Qwen3-Next GDN layer.

The example's code block is read from docs/replay.md and executed, so the docs show code that
runs. Its ``gdn_response`` runs a ``Qwen3NextGatedDeltaNet`` (transformers) over packed response
tokens with replay_response in place of the layer's chunk / recurrent kernels, with the layer's
own weights; the core outputs and final states must be the goldens' decode steps token by token
on the same inputs, and the gradient must reach the layer's parameters.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from transformers import Qwen3NextConfig
from transformers.models.qwen3_next.modeling_qwen3_next import Qwen3NextGatedDeltaNet

from vllm_gdn_invariant.shadow.bits import raw_bits

from .helpers import BITWISE_EQUAL, ReplayCase, differing_elements, goldens_token_by_token, offsets

DOC = Path(__file__).resolve().parents[2] / "docs" / "replay.md"
LENGTHS = [3, 1, 0, 5]


def example_namespace() -> dict:
    """The names the worked example's code block defines."""
    text = DOC.read_text()
    section = text[text.index("## Worked example") :]
    block = re.search(r"```python\n(.*?)```", section, re.DOTALL).group(1)
    namespace: dict = {}
    exec(compile(block, f"{DOC}:worked example", "exec"), namespace)  # noqa: S102
    return namespace


@pytest.fixture(scope="module")
def example():
    return example_namespace()


def make_layer(seed: int = 0) -> Qwen3NextGatedDeltaNet:
    config = Qwen3NextConfig(
        hidden_size=32,
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        linear_key_head_dim=7,
        linear_value_head_dim=5,
        linear_conv_kernel_dim=4,
        num_hidden_layers=1,
        layer_types=["linear_attention"],
        hidden_act="silu",
    )
    torch.manual_seed(seed)
    layer = Qwen3NextGatedDeltaNet(config, 0).to(torch.bfloat16)
    layer.A_log.data = layer.A_log.data.float()  # vLLM keeps A_log in float32
    return layer


def layer_inputs(layer, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    n, s = sum(LENGTHS), len(LENGTHS)
    hidden = torch.randn(n, 32, generator=g).bfloat16()
    conv_state = torch.randn(s, layer.conv_dim, layer.conv_kernel_size - 1, generator=g).bfloat16()
    state = torch.randn(s, layer.num_v_heads, layer.head_v_dim, layer.head_k_dim, generator=g)
    return hidden, conv_state, state * 0.5, offsets(LENGTHS)


def test_the_layer_with_replay_response_gives_the_goldens_decode_steps(example):
    layer = make_layer()
    hidden, conv_state, state, cu_seqlens = layer_inputs(layer)
    with torch.no_grad():
        output, final_conv, final_state = example["gdn_response"](
            layer, hidden, conv_state, state, cu_seqlens
        )
        x, a, b, z = example["gdn_inputs"](layer, hidden)
        case = ReplayCase(
            x=x, a=a, b=b, A_log=layer.A_log, dt_bias=layer.dt_bias,
            conv_weight=layer.conv1d.weight[:, 0], conv_state=conv_state, state=state,
            cu_seqlens=cu_seqlens, conv_bias=layer.conv1d.bias,
            kwargs={"num_k_heads": layer.num_k_heads, "scale": layer.head_k_dim**-0.5,
                    "activation": "silu", "use_qk_l2norm": True},
        )  # fmt: skip
        core, conv_ref, state_ref = goldens_token_by_token(case)
        expected = example["gdn_output"](layer, core, z)
    assert differing_elements((core, final_conv, final_state), (core, conv_ref, state_ref)) == (
        BITWISE_EQUAL
    )
    assert output.shape == hidden.shape and output.dtype == torch.bfloat16
    assert torch.equal(raw_bits(output), raw_bits(expected))


def test_the_gradient_reaches_the_layers_parameters(example):
    layer = make_layer()
    hidden, conv_state, state, cu_seqlens = layer_inputs(layer)
    hidden.requires_grad_(True)
    output, _, final_state = example["gdn_response"](layer, hidden, conv_state, state, cu_seqlens)
    (output.float().square().sum() + final_state.sum()).backward()
    for name, parameter in [*layer.named_parameters(), ("hidden", hidden)]:
        assert parameter.grad is not None and bool(parameter.grad.abs().sum() > 0), name
        assert bool(torch.isfinite(parameter.grad).all()), name
