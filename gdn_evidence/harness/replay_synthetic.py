"""A synthetic engine on the CPU for the smoke mode of ``scripts/replay_engine_check.py``.

vLLM's CPU build runs GDN layers through ``forward_cpu`` (not ``_forward_core``) and refuses
``VLLM_BATCH_INVARIANT=1`` for Qwen3-Next, so the engine evidence cannot run there. This module
stands in for the engine with the same record building and comparison (replay_capture.py,
replay_check.py):

* :func:`synthetic_schedule`: steps as vLLM's scheduler lays them out, decode rows first (one
  token per running request), then prompt chunks within a token budget;
* :func:`serve_synthetic`: each step's rows of each layer through the goldens token by token
  (``golden.conv_update`` then ``golden.recurrent_step``, the decode-step arithmetic of mode
  golden) on a pool of state blocks, recorded into a :class:`CaptureStore` like the engine's
  capture does;
* :data:`CPU_PATHS`: the prompt path is ``replay_response`` from zero states (on the CPU, the
  goldens token by token: what :func:`serve_synthetic` served the prompts with, where the engine
  has vLLM's prefill), the control a plain float32 PyTorch recurrence
  (``replay/recurrence.py``: the same function with other rounding).
"""

from __future__ import annotations

import torch
from torch import Tensor

from gdn_evidence.harness.replay_capture import CaptureStore, LayerWeights, StepLayout
from gdn_evidence.harness.replay_check import ReplayPaths, replay_arguments
from vllm_gdn_invariant import golden
from vllm_gdn_invariant.replay import replay_response
from vllm_gdn_invariant.replay.checks import ReplayInputs, check_replay_args
from vllm_gdn_invariant.replay.recurrence import replay_recurrence

SMOKE_PROMPTS = (5, 11, 3)
SMOKE_NEW_TOKENS = 7
SMOKE_BUDGET = 8  # tokens per step
SMOKE_LAYERS = ("layers.0.linear_attn", "layers.1.linear_attn")  # the second with a conv bias
NUM_K_HEADS, NUM_V_HEADS, HEAD_K, HEAD_V, WIDTH = 2, 4, 8, 8, 4
DTYPE = torch.bfloat16  # the model's dtype: inputs, outputs, conv weight and conv state


def synthetic_schedule(prompts: tuple[int, ...], new_tokens: int, budget: int) -> list[StepLayout]:
    """Every step until each request has fed its prompt and ``new_tokens - 1`` generated
    tokens: running requests' decode rows first, then prompt chunks in request order, as many
    tokens as the budget leaves."""
    done = [0] * len(prompts)
    totals = [p + new_tokens - 1 for p in prompts]
    steps = []
    while done != totals:
        order = [k for k in range(len(prompts)) if prompts[k] <= done[k] < totals[k]]
        order += [k for k in range(len(prompts)) if done[k] < prompts[k]]
        counts, left = [], budget
        for k in order:
            count = 1 if done[k] >= prompts[k] else min(left, prompts[k] - done[k])
            counts.append(count)
            left -= count
        kept = [(k, c) for k, c in zip(order, counts, strict=True) if c > 0]
        steps.append(
            StepLayout(
                requests=tuple(f"request-{k}" for k, _ in kept),
                counts=tuple(c for _, c in kept),
                starts=tuple(done[k] for k, _ in kept),
                prompt_lengths=tuple(prompts[k] for k, _ in kept),
            )
        )
        for k, c in kept:
            done[k] += c
    return steps


def synthetic_weights(generator: torch.Generator, with_bias: bool) -> LayerWeights:
    dim = 2 * NUM_K_HEADS * HEAD_K + NUM_V_HEADS * HEAD_V
    return LayerWeights(
        A_log=torch.rand(NUM_V_HEADS, generator=generator) * 2.0 - 1.0,
        dt_bias=torch.randn(NUM_V_HEADS, generator=generator),
        conv_weight=(torch.randn(dim, WIDTH, generator=generator) * 0.5).to(DTYPE),
        conv_bias=(torch.randn(dim, generator=generator) * 0.1).to(DTYPE) if with_bias else None,
        num_k_heads=NUM_K_HEADS,
        head_k_dim=HEAD_K,
        head_v_dim=HEAD_V,
        activation="silu",
    )


def serve_step(
    weights: LayerWeights,
    layout: StepLayout,
    blocks: list[int],
    x: Tensor,
    a: Tensor,
    b: Tensor,
    pools: tuple[Tensor, Tensor],
) -> tuple[Tensor, tuple[Tensor, Tensor]]:
    """The step's rows through the goldens, token position after token position (a request's
    prompt chunk is several positions); (outputs [R, HV, V], the new pools)."""
    conv_pool, state_pool = pools
    out = torch.empty((x.shape[0], NUM_V_HEADS, HEAD_V), dtype=x.dtype)
    firsts = [sum(layout.counts[:i]) for i in range(len(layout.counts))]
    for j in range(max(layout.counts)):
        active = [i for i, count in enumerate(layout.counts) if count > j]
        rows = torch.tensor([firsts[i] + j for i in active])
        indices = torch.tensor([blocks[i] for i in active], dtype=torch.int32)
        y, conv_pool = golden.conv_update(
            x[rows],
            conv_pool,
            weights.conv_weight,
            indices,
            bias=weights.conv_bias,
            activation=weights.activation,
        )
        o, state_pool = golden.recurrent_step(
            y,
            a[rows],
            b[rows],
            weights.A_log,
            weights.dt_bias,
            state_pool,
            indices,
            num_k_heads=weights.num_k_heads,
            scale=weights.scale,
        )
        out[rows] = o[:, 0]
    return out, (conv_pool, state_pool)


def serve_synthetic(
    store: CaptureStore,
    prompts: tuple[int, ...] = SMOKE_PROMPTS,
    new_tokens: int = SMOKE_NEW_TOKENS,
    budget: int = SMOKE_BUDGET,
    seed: int = 0,
) -> None:
    """Serve the schedule of ``prompts`` through every layer of :data:`SMOKE_LAYERS` (module
    docstring) and record each step into ``store``. Request ``request-k`` has block k + 1."""
    generator = torch.Generator().manual_seed(seed)
    dim = 2 * NUM_K_HEADS * HEAD_K + NUM_V_HEADS * HEAD_V
    layers = {}
    for i, name in enumerate(SMOKE_LAYERS):
        weights = synthetic_weights(generator, with_bias=i % 2 == 1)
        tokens = [p + new_tokens - 1 for p in prompts]
        inputs = [
            (
                torch.randn(n, dim, generator=generator).to(DTYPE),
                torch.randn(n, NUM_V_HEADS, generator=generator).to(DTYPE),
                torch.randn(n, NUM_V_HEADS, generator=generator).to(DTYPE),
            )
            for n in tokens
        ]
        pools = (
            torch.zeros(len(prompts) + 1, dim, WIDTH - 1, dtype=DTYPE),
            torch.zeros(len(prompts) + 1, NUM_V_HEADS, HEAD_V, HEAD_K, dtype=torch.float32),
        )
        layers[name] = [weights, inputs, pools]
    for layout in synthetic_schedule(prompts, new_tokens, budget):
        step = store.begin_step(layout)
        ks = [int(r.rsplit("-", 1)[1]) for r in layout.requests]
        blocks = [k + 1 for k in ks]
        for name, entry in layers.items():
            weights, inputs, pools = entry
            x, a, b = (
                torch.cat(
                    [
                        inputs[k][part][s : s + c]
                        for k, s, c in zip(ks, layout.starts, layout.counts, strict=True)
                    ]
                )
                for part in range(3)
            )
            out, pools = serve_step(weights, layout, blocks, x, a, b, pools)
            entry[2] = pools
            index = torch.tensor(blocks)
            store.record(name, weights, step, x, a, b, out, pools[0][index], pools[1][index])


def zero_states(
    x: Tensor, weights: LayerWeights, sequences: int, conv_dtype: torch.dtype
) -> tuple[Tensor, Tensor]:
    """Zero conv states [S, dim, W-1] in ``conv_dtype`` and float32 recurrent states."""
    conv = torch.zeros(sequences, x.shape[1], weights.conv_weight.shape[1] - 1, dtype=conv_dtype)
    state = torch.zeros(
        sequences,
        weights.dt_bias.shape[0],
        weights.head_v_dim,
        weights.head_k_dim,
        dtype=torch.float32,
    )
    return conv, state


def goldens_prefill(
    x: Tensor,
    a: Tensor,
    b: Tensor,
    weights: LayerWeights,
    cu_seqlens: Tensor,
    conv_state_dtype: torch.dtype,
) -> tuple[Tensor, Tensor, Tensor]:
    """Fresh sequences through ``replay_response`` from zero states (the goldens on the CPU)."""
    conv, state = zero_states(x, weights, cu_seqlens.numel() - 1, conv_state_dtype)
    args, kwargs = replay_arguments(weights, x, a, b, conv, state, cu_seqlens)
    return replay_response(*args, **kwargs)


def plain_recurrence(
    x: Tensor,
    a: Tensor,
    b: Tensor,
    weights: LayerWeights,
    cu_seqlens: Tensor,
    conv_state_dtype: torch.dtype,
) -> tuple[Tensor, Tensor, Tensor]:
    """Fresh sequences through the plain float32 recurrence, rounded to the served dtypes."""
    conv, state = zero_states(x, weights, cu_seqlens.numel() - 1, conv_state_dtype)
    args, kwargs = replay_arguments(weights, x, a, b, conv, state, cu_seqlens)
    checked = check_replay_args(*args, **kwargs)
    tensors = ReplayInputs(
        x, a, b, weights.A_log, weights.dt_bias, weights.conv_weight, weights.conv_bias, conv, state
    )
    out, final_conv, final_state = replay_recurrence(tensors, checked)
    return out.to(x.dtype), final_conv.to(conv_state_dtype), final_state


CPU_PATHS = ReplayPaths(
    prompt=goldens_prefill,
    control=plain_recurrence,
    prompt_name="replay_response from zero states (the goldens; the CPU stands in for the "
    "engine's prefill)",
    control_name="a plain float32 PyTorch recurrence over prompt + response",
)
