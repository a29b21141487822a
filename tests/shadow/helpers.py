"""A GDN layer step with the shadow checker installed, outside an engine.

vLLM's real ``_forward_core`` (and the routing patch when asked for) runs with the CPU
stand-ins of tests/routing/standins.py for its Triton kernels: the decode-only pair are the
goldens, the mixed-step recurrent kernel a float64 recurrence that rounds differently.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from gdn_evidence.harness.layer import (
    LayerState,
    build_metadata,
    make_layer_state,
    make_vllm_config,
    run_core,
    step_inputs,
    step_requests,
)
from vllm_gdn_invariant.shadow import checker as checker_module
from vllm_gdn_invariant.shadow.config import parse_shadow
from vllm_gdn_invariant.shadow.metrics import ShadowMetrics
from vllm_gdn_invariant.shadow.record import read_records

from ..routing.test_routing_cpu import DIMS, new_layer

CPU = torch.device("cpu")
MADE: list[checker_module.ShadowChecker] = []  # closed after each test (conftest.py)


def make_checker(tmp_path: Path, setting: str, mode: str = "route"):
    """A checker writing to ``tmp_path``, installed as this process's."""
    config = parse_shadow(f"{setting},out={tmp_path}/shadow.jsonl")
    checker = checker_module.ShadowChecker(config, mode, metrics=ShadowMetrics())
    MADE.append(checker)
    checker_module.install(checker)
    return checker


def close_made() -> None:
    """Close every checker made by :func:`make_checker` and install none."""
    checker_module.install(None)
    while MADE:
        MADE.pop().close(timeout=10)


def records(checker) -> list[dict]:
    path = checker.writer.path
    return read_records(path) if path.exists() else []


@dataclass
class Step:
    """One step's inputs: requests (decode rows first), a state, mixed_qkv/b/a."""

    requests: list
    state: LayerState
    inputs: tuple
    vllm_config: object

    @classmethod
    def make(cls, decodes, prefills, state_dtype, seed=0, fresh=False, vllm_config=None):
        g = torch.Generator().manual_seed(seed)
        requests = step_requests(decodes, prefills, fresh)
        state = make_layer_state(DIMS, state_dtype, len(requests) + 2, CPU, g)
        inputs = step_inputs(DIMS, sum(r.query_len for r in requests), CPU, g)
        if vllm_config is None:
            vllm_config = make_vllm_config(
                DIMS, state_dtype, max_num_seqs=32, max_num_batched_tokens=512
            )
        return cls(requests, state, inputs, vllm_config)

    def run(self, blocks=None):
        """Serve the step through ``_forward_core`` on a copy of the state; (out, state)."""
        state = self.state.clone()
        layer = new_layer(self.vllm_config, state)
        metadata = build_metadata(self.vllm_config, self.requests, CPU, blocks)
        out = run_core(layer, self.vllm_config, metadata, *self.inputs)
        return out, state
