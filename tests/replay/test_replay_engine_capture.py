"""The engine capture (gdn_evidence/e2e/gdn_capture.py) around vLLM's real ``_forward_core`` on the
CPU: vLLM's metadata builder, its layer class and method, the GDN kernels replaced by the
stand-ins of tests/routing/standins.py, and a stand-in model runner that lays out each step as
vLLM's V1 runner does (its input batch's order, decodes first, the scheduler's counts).

The capture must record exactly the rows the layer was given and gave back, for the request
that owns them, the requests' state blocks after the prompt and after the last step, and put
vLLM's method and the runner's back afterwards; a layer whose metadata packs the rows otherwise
than the scheduler said is refused.
"""

from __future__ import annotations

import types

import numpy as np
import pytest
import torch
from vllm.model_executor.layers.mamba.gdn import qwen_gdn_linear_attn as qwen
from vllm.model_executor.layers.mamba.mamba_utils import is_conv_state_dim_first

from gdn_evidence.e2e.gdn_capture import EngineCapture
from gdn_evidence.harness.layer import (
    PREFIX,
    LayerDims,
    Request,
    build_metadata,
    make_layer,
    make_layer_state,
    make_vllm_config,
    run_core,
    step_inputs,
)
from gdn_evidence.harness.replay_capture import CaptureStore
from vllm_gdn_invariant.shadow.bits import same_bits

from ..routing import standins

DIMS = LayerDims(num_k_heads=2, num_v_heads=4, head_k_dim=16, head_v_dim=16)
CPU = torch.device("cpu")
PROMPTS = {"a": 6, "b": 3}
BLOCKS = {"a": 2, "b": 1}
STEPS = [  # (request, tokens) in the runner's order: decode rows first
    [("a", 4), ("b", 3)],
    [("b", 1), ("a", 2)],  # b's first decode row beside the end of a's prompt
    [("a", 1), ("b", 1)],
    [("b", 1), ("a", 1)],
]
pytestmark = pytest.mark.usefixtures("standin_kernels")  # tests/conftest.py


@pytest.fixture(autouse=True)
def conv_update_in_place(standin_kernels, monkeypatch):
    """The decode conv update writes its output over its input, as vLLM's kernel does: the
    capture must copy the rows before the call."""

    def in_place(x, *args, **kwargs):
        x.copy_(standins.causal_conv1d_update(x, *args, **kwargs))
        return x

    monkeypatch.setattr(qwen, "causal_conv1d_update", in_place)


class StandInRunner:
    """What the capture reads of vLLM's V1 model runner; ``execute_model`` runs the layer on a
    step (the engine's forward), keeping what it served and the caches after it."""

    def __init__(self, vllm_config, layer, generator):
        self.config, self.layer, self.generator = vllm_config, layer, generator
        context = {PREFIX: layer, "model.layers.3.self_attn": object()}
        self.vllm_config = types.SimpleNamespace(
            compilation_config=types.SimpleNamespace(static_forward_context=context)
        )
        self.input_batch = types.SimpleNamespace(
            req_ids=[], num_reqs=0, num_computed_tokens_cpu=np.zeros(8, dtype=np.int32)
        )
        self.requests = {r: types.SimpleNamespace(num_prompt_tokens=p) for r, p in PROMPTS.items()}
        self.done = dict.fromkeys(PROMPTS, 0)
        self.served = []

    def execute_model(self, scheduler_output, rows=None):
        rows = rows or list(scheduler_output.num_scheduled_tokens.items())
        batch = self.input_batch
        batch.req_ids = [r for r, _ in rows]
        batch.num_reqs = len(rows)
        batch.num_computed_tokens_cpu[: len(rows)] = [self.done[r] for r, _ in rows]
        requests = [Request(n, self.done[r], self.done[r] < PROMPTS[r]) for r, n in rows]
        metadata = build_metadata(self.config, requests, CPU, [BLOCKS[r] for r, _ in rows])
        inputs = step_inputs(DIMS, sum(n for _, n in rows), CPU, self.generator)
        out = run_core(self.layer, self.config, metadata, *inputs)
        caches = tuple(c.clone() for c in self.layer.kv_cache)
        self.served.append((rows, inputs, out, caches))
        for r, n in rows:
            self.done[r] += n


def engine_of(runner):
    """An LLM-shaped object whose in-process engine core holds ``runner``."""
    ns = types.SimpleNamespace
    core = ns(model_executor=ns(driver_worker=ns(worker=ns(model_runner=runner))))
    return ns(llm_engine=ns(engine_core=ns(engine_core=core)))


@pytest.fixture
def engine():
    generator = torch.Generator().manual_seed(3)
    vllm_config = make_vllm_config(DIMS, torch.float32, max_num_seqs=8, max_num_batched_tokens=64)
    state = make_layer_state(DIMS, torch.float32, 4, CPU, generator)
    layer = make_layer(vllm_config, DIMS, state, gqa_interleaved_layout=True)
    object.__setattr__(layer, "chunk_gated_delta_rule", standins.chunk_gated_delta_rule)
    runner = StandInRunner(vllm_config, layer, generator)
    return engine_of(runner), runner, layer


def scheduled(rows):
    return types.SimpleNamespace(num_scheduled_tokens=dict(rows))


def conv_block(cache, block):
    conv = cache[block]
    return conv if is_conv_state_dim_first() else conv.transpose(-1, -2)


def served_rows(runner, request):
    """The request's rows of every step, in order: (x, a, b, out) each concatenated."""
    parts = []
    for rows, (x, b, a), out, _ in runner.served:
        first = 0
        for r, n in rows:
            if r == request:
                parts.append((x[first : first + n], a[first : first + n], b[first : first + n],
                              out[first : first + n]))  # fmt: skip
            first += n
    return [torch.cat(p) for p in zip(*parts, strict=True)]


def test_the_capture_records_each_requests_served_rows_and_states(engine):
    llm, runner, layer = engine
    store = CaptureStore()
    capture = EngineCapture(llm, store)
    assert list(capture.layers) == [PREFIX]
    with capture.installed():
        for rows in STEPS:
            runner.execute_model(scheduled(rows))
    assert [s.requests for s in store.steps] == [tuple(r for r, _ in rows) for rows in STEPS]
    assert [s.mixes_decode_and_prompt_rows for s in store.steps] == [False, True, False, False]
    captured = store.requests(PREFIX)
    assert set(captured) == set(PROMPTS)
    prompt_ends = {"a": 1, "b": 0}  # the step after which each prompt had ended
    for request, record in captured.items():
        x, a, b, out = served_rows(runner, request)
        assert record.prompt_tokens == PROMPTS[request]
        assert record.response_tokens == x.shape[0] - PROMPTS[request] > 0
        for got, want in ((record.x, x), (record.a, a), (record.b, b), (record.out, out)):
            assert same_bits(got, want)
        block = BLOCKS[request]
        after_prompt = runner.served[prompt_ends[request]][3]
        last = runner.served[-1][3]
        assert same_bits(record.prompt_conv_state, conv_block(after_prompt[0], block))
        assert same_bits(record.prompt_state, after_prompt[1][block])
        assert same_bits(record.final_conv_state, conv_block(last[0], block))
        assert same_bits(record.final_state, last[1][block])
        assert not same_bits(record.final_state, record.prompt_state)
    weights = store.weights[PREFIX]
    assert weights.num_k_heads == DIMS.num_k_heads and weights.head_v_dim == DIMS.head_v_dim
    assert weights.conv_weight.shape == (DIMS.conv_dim, DIMS.conv_width)


def test_the_capture_puts_vllms_method_and_the_runners_back(engine):
    llm, runner, _ = engine
    method = vars(qwen.QwenGatedDeltaNetAttention)["_forward_core"]
    capture = EngineCapture(llm, CaptureStore())
    with pytest.raises(RuntimeError, match="boom"), capture.installed():
        assert vars(qwen.QwenGatedDeltaNetAttention)["_forward_core"] is not method
        assert "execute_model" in vars(runner)
        raise RuntimeError("boom")
    assert vars(qwen.QwenGatedDeltaNetAttention)["_forward_core"] is method
    assert "execute_model" not in vars(runner)


def test_a_step_the_layer_packs_otherwise_than_the_scheduler_said_is_refused(engine):
    llm, runner, _ = engine
    capture = EngineCapture(llm, CaptureStore())
    with capture.installed(), pytest.raises(RuntimeError, match="not the scheduler's counts"):
        runner.execute_model(scheduled([("a", 3), ("b", 3)]), rows=[("a", 4), ("b", 2)])


def test_an_engine_core_in_another_process_is_refused():
    with pytest.raises(RuntimeError, match="VLLM_ENABLE_V1_MULTIPROCESSING=0"):
        EngineCapture(types.SimpleNamespace(llm_engine=types.SimpleNamespace()), CaptureStore())
