"""One mixed-step invariance case: decode rows alone vs. the same rows beside prefills.

For a composition (decode rows, prefill lengths, fresh or continued prefills) it runs, from
the same caches and inputs:

* the decode rows alone, a decode-only step (``_forward_core``);
* the whole mixed step through ``_forward_core`` (the routed method when patched);
* the whole mixed step through ``_forward_core_upstream`` (vLLM's own method);
* 16 following decode-only steps from each resulting state,

and counts differing elements (bitwise; an output row nobody wrote stays NaN and counts
where the other side wrote it).
"Decode rows" are the rows vLLM's builder counts as decodes: a one-token prefill chunk after
context (and, in 0.30, a one-token fresh prompt) is one, and is routed like any decode row.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

import torch

from gdn_evidence.harness.layer import (
    LayerDims,
    LayerState,
    align_block_table,
    align_mode,
    build_metadata,
    make_layer,
    make_layer_state,
    run_core,
    step_inputs,
    step_requests,
)
from vllm_gdn_invariant.shadow.bits import differ

FOLLOWING_DECODE_STEPS = 16


@dataclass(frozen=True)
class Composition:
    decodes: int
    prefills: tuple[int, ...]
    fresh_prefill: bool


COMPOSITIONS = (
    Composition(1, (37,), True),
    Composition(4, (37, 300), True),
    Composition(33, (1000,), False),
    Composition(4, (64,), False),
    Composition(1, (1, 300), True),
    Composition(33, (1, 37, 64, 300, 1000), False),
    Composition(4, (1000, 64), True),
)


def run_case(
    vllm_config,
    dims: LayerDims,
    state_dtype: torch.dtype,
    composition: Composition,
    *,
    gqa_interleaved_layout: bool,
    device: torch.device,
    seed: int = 0,
    prefill_backend: str = "triton",
) -> dict:
    """Counts for one composition. In align mode (``make_vllm_config(align_block_size=...)``)
    each request owns a block-table row, continued prefills start on a block boundary so
    that they can hold a prefill checkpoint, and the checkpoint blocks a prefill exports
    (vLLM 0.33+ with FlashInfer prefill) are compared as well."""
    g = torch.Generator().manual_seed(seed)
    align = align_mode(vllm_config)
    block = vllm_config.cache_config.mamba_block_size if align else None
    requests = step_requests(
        composition.decodes, composition.prefills, composition.fresh_prefill, context=block
    )
    num_tokens = sum(r.query_len for r in requests)
    rows = align_block_table(requests, block) if align else list(range(1, len(requests) + 1))
    num_blocks = 1 + len(rows) * len(rows[0]) if align else len(requests) + 2
    state0 = make_layer_state(dims, state_dtype, num_blocks, device, g)
    inputs = step_inputs(dims, num_tokens, device, g)
    mixed_meta = build_metadata(vllm_config, requests, device, rows, prefill_backend)
    # vLLM's builder decides which rows are decodes (a one-token chunk usually is one).
    d = mixed_meta.num_decodes
    decode_meta = build_metadata(vllm_config, requests[:d], device, rows[:d], prefill_backend)
    assert decode_meta.num_prefills == 0 and mixed_meta.num_decode_tokens == d
    follow = [step_inputs(dims, d, device, g) for _ in range(FOLLOWING_DECODE_STEPS)]

    alone, routed, upstream = state0.clone(), state0.clone(), state0.clone()
    layers = {
        id(s): make_layer(vllm_config, dims, s, gqa_interleaved_layout=gqa_interleaved_layout)
        for s in (alone, routed, upstream)
    }

    def step(state: LayerState, meta, x, method="_forward_core") -> torch.Tensor:
        return run_core(layers[id(state)], vllm_config, meta, *x, method=method)

    def follow_up(state: LayerState) -> list[torch.Tensor]:
        return [step(state, decode_meta, x) for x in follow]

    out_alone = step(alone, decode_meta, tuple(t[:d] for t in inputs))
    out_routed = step(routed, mixed_meta, inputs)
    out_upstream = step(upstream, mixed_meta, inputs, method="_forward_core_upstream")
    indices = mixed_meta.non_spec_state_indices_tensor.long()
    dec, pre = indices[:d], indices[d:]
    checkpoint = getattr(mixed_meta, "checkpoint", None)
    exported = (
        checkpoint.state_indices[checkpoint.checkpoint_offsets > 0].long()
        if checkpoint is not None
        else indices[:0]
    )
    after_alone = follow_up(alone)
    after_routed = follow_up(routed)
    after_upstream = follow_up(upstream)
    base = {
        **asdict(composition),
        "prefills": list(composition.prefills),
        "state_dtype": str(state_dtype).removeprefix("torch."),
        "H": dims.num_k_heads,
        "HV": dims.num_v_heads,
        "gqa_interleaved_layout": gqa_interleaved_layout,
        "builder_num_decodes": d,
        "builder_num_prefills": mixed_meta.num_prefills,
        "prefill_backend": prefill_backend,
        "mamba_cache_mode": "align" if align else "none",
        "checkpoint_plan": getattr(mixed_meta, "flashinfer_checkpoint_plan", None) is not None,
        "checkpoints": int(exported.numel()),
        "decode_out_elements": out_alone.numel(),
        "decode_state_elements": alone.ssm_state[dec].numel(),
    }

    def counts(out, state: LayerState, after) -> dict:
        return {
            "out_differ": differ(out[:d], out_alone),
            "state_differ": differ(state.ssm_state[dec], alone.ssm_state[dec]),
            "conv_differ": differ(state.conv_state[dec], alone.conv_state[dec]),
            "following_out_differ": sum(
                differ(x, y) for x, y in zip(after, after_alone, strict=True)
            ),
        }

    routed_row = {
        **base,
        "plugin": True,
        **counts(out_routed, routed, after_routed),
        "prefill_out_differ_vs_unpatched": differ(out_routed[d:], out_upstream[d:]),
        "prefill_state_differ_vs_unpatched": differ(routed.ssm_state[pre], upstream.ssm_state[pre]),
        "prefill_conv_differ_vs_unpatched": differ(
            routed.conv_state[pre], upstream.conv_state[pre]
        ),
        "prefill_checkpoint_differ_vs_unpatched": differ(
            routed.ssm_state[exported], upstream.ssm_state[exported]
        )
        + differ(routed.conv_state[exported], upstream.conv_state[exported]),
        "unwritten_out_rows": int(out_routed[:num_tokens].isnan().any(-1).any(-1).sum()),
    }
    upstream_row = {**base, "plugin": False, **counts(out_upstream, upstream, after_upstream)}
    return {"routed": routed_row, "upstream": upstream_row}


def all_cases(
    dims_list: Sequence[LayerDims],
    state_dtypes: Sequence[torch.dtype],
    layouts: Sequence[bool] = (True, False),
    compositions: Sequence[Composition] = COMPOSITIONS,
):
    for dims in dims_list:
        for state_dtype in state_dtypes:
            for layout in layouts:
                for composition in compositions:
                    yield dims, state_dtype, layout, composition
