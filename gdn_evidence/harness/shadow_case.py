"""The shadow checker around vLLM's real ``_forward_core`` outside an engine (GPU evidence,
the bench and the GPU tests).

:func:`shadow_case` runs one step of a composition (decode rows, prefills) through a layer of
vLLM's class (harness/layer.py) twice from the same state and inputs: with no checker, and
with a checker at rate 1.0 and no caps, under the patches asked for (the routing patch, mode
golden's patches, and always the shadow wrappers). It returns the checker's records and
whether every served bit (output, recurrent and conv state) was the same both times.
"""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from unittest import mock

import torch

from gdn_evidence.harness.layer import (
    LayerDims,
    build_metadata,
    make_layer,
    make_layer_state,
    run_core,
    step_inputs,
    step_requests,
)
from gdn_evidence.harness.mixed_step import Composition
from vllm_gdn_invariant.patches import applied, routing_patch
from vllm_gdn_invariant.patches.golden_decode import golden_decode_patches
from vllm_gdn_invariant.patches.shadow import shadow_patches
from vllm_gdn_invariant.shadow import checker as checker_module
from vllm_gdn_invariant.shadow import metrics
from vllm_gdn_invariant.shadow.bits import same_bits
from vllm_gdn_invariant.shadow.config import parse_shadow
from vllm_gdn_invariant.shadow.metrics import ShadowMetrics

FIELDS = ("output", "recurrent_state", "conv_state")


@dataclass
class MemoryWriter:
    """A JSONL writer that keeps the records in memory."""

    records: list[dict[str, Any]] = field(default_factory=list)
    path: Path = Path("<memory>")

    def write(self, record: dict[str, Any]) -> None:
        self.records.append(record)

    def close(self) -> None:
        """Nothing to close: the records stay readable."""


@contextlib.contextmanager
def installed(routed: bool, golden_mode: bool = False) -> Iterator[None]:
    """The routing patch (``routed``), mode golden's patches, then the shadow wrappers."""
    patches = [routing_patch()] if routed else []
    patches += golden_decode_patches() if golden_mode else []
    patches += shadow_patches()
    with contextlib.ExitStack() as stack:
        with mock.patch.object(metrics, "setup_process", lambda: None):
            stack.enter_context(applied(patches))
        try:
            yield
        finally:
            checker_module.install(None)


def make_checker(reference: str, mode: str, **options: Any) -> checker_module.ShadowChecker:
    """A checker at rate 1.0 with room for every row, keeping its records in memory."""
    settings = {"max_rows": 1 << 20, "max_snapshot_mb": 1 << 20, **options}
    text = ",".join(["1.0", f"ref={reference}", *(f"{k}={v}" for k, v in settings.items())])
    out = Path(tempfile.gettempdir()) / "gdn_invariant_shadow_evidence.jsonl"
    config = parse_shadow(f"{text},out={out}")
    return checker_module.ShadowChecker(
        config, mode, metrics=ShadowMetrics(), writer=MemoryWriter()
    )


def shadow_case(
    vllm_config: Any,
    dims: LayerDims,
    state_dtype: torch.dtype,
    composition: Composition,
    *,
    device: torch.device,
    reference: str = "golden+decode",
    mode: str = "route",
    seed: int = 0,
) -> dict[str, Any]:
    """One step with the checker off and on (patches installed by the caller)."""
    g = torch.Generator().manual_seed(seed)
    requests = step_requests(composition.decodes, composition.prefills, composition.fresh_prefill)
    state0 = make_layer_state(dims, state_dtype, len(requests) + 2, device, g)
    inputs = step_inputs(dims, sum(r.query_len for r in requests), device, g)
    metadata = build_metadata(vllm_config, requests, device)

    def serve():
        state = state0.clone()
        layer = make_layer(vllm_config, dims, state, gqa_interleaved_layout=True)
        return run_core(layer, vllm_config, metadata, *inputs), state

    checker_module.install(None)
    with mock.patch.object(checker_module, "active_checker", return_value=None):
        off_out, off_state = serve()
    checker = make_checker(reference, mode)
    checker_module.install(checker)
    try:
        on_out, on_state = serve()
    finally:
        checker.close()
        checker_module.install(None)
    unchanged = (
        same_bits(on_out, off_out)
        and same_bits(on_state.ssm_state, off_state.ssm_state)
        and same_bits(on_state.conv_state, off_state.conv_state)
    )
    return {
        "decodes": metadata.num_decodes,
        "prefills": list(composition.prefills),
        "state_dtype": str(state_dtype).removeprefix("torch."),
        "served_bits_unchanged": unchanged,
        "failures": dict(checker.stats.failures),
        "records": checker.writer.records,
    }


def field_summary(record: dict[str, Any]) -> dict[str, Any]:
    """A record's per-field differing / compared / max ULP / histogram."""
    return {
        name: {
            key: record[name][key]
            for key in ("differing", "compared", "max_ulp", "max_abs_diff", "ulp_histogram")
        }
        for name in FIELDS
    }
