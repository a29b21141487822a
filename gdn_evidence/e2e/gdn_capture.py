"""The engine evidence's capture: every GDN layer's rows in vLLM's engine, step by step.

It runs in the engine's own process, with the engine core in-process
(``VLLM_ENABLE_V1_MULTIPROCESSING=0``) and vLLM's V1 GPU model runner, eager
(``enforce_eager=True``: no CUDA graph replays a step past Python). While
:meth:`EngineCapture.installed` is active:

* the model runner's ``execute_model`` notes each step's scheduler output;
* ``QwenGatedDeltaNetAttention._forward_core``, as the class holds it (in mode golden, the
  plugin's replacement: decode rows through the golden-matched kernels, prompt rows through
  vLLM's prefill), is wrapped: the layer's custom op calls it with the step's rows, and the
  wrapper copies the rows' ``mixed_qkv`` (q | k | v before the conv), ``a`` and ``b`` before
  the call (the conv update overwrites its input) and the rows' outputs after it, then the
  conv and recurrent state blocks of the step's requests (the indices of that layer's
  metadata, ``non_spec_state_indices_tensor``), into a
  :class:`~gdn_evidence.harness.replay_capture.CaptureStore`. Everything stays on the GPU.

The rows' owners come from the runner: the step's requests in its input batch's order (the
order it packs the rows in, decodes first), each with the scheduler's token count and the
runner's count of tokens computed before the step; the layer's ``non_spec_query_start_loc``
must give the same counts. Both wrappers are removed when the context ends.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from vllm.model_executor.layers.mamba.gdn import qwen_gdn_linear_attn as qwen
from vllm.model_executor.layers.mamba.mamba_utils import is_conv_state_dim_first

from gdn_evidence.harness.replay_capture import CaptureStore, LayerWeights, StepLayout


def model_runner(llm: Any) -> Any:
    """The V1 GPU model runner of an ``LLM`` whose engine core runs in this process."""
    try:
        core = llm.llm_engine.engine_core.engine_core
        runner = core.model_executor.driver_worker.worker.model_runner
    except AttributeError as exc:
        raise RuntimeError(
            "the capture needs the engine core in this process "
            "(VLLM_ENABLE_V1_MULTIPROCESSING=0) and one worker"
        ) from exc
    if not hasattr(runner, "input_batch"):
        raise RuntimeError(f"the capture reads V1's input batch; {type(runner).__name__} has none")
    return runner


def layer_weights(layer: Any) -> LayerWeights:
    """What the layer's GDN core computes with, this rank's share."""
    weight = layer.conv1d.weight
    return LayerWeights(
        A_log=layer.A_log,
        dt_bias=layer.dt_bias,
        conv_weight=weight.view(weight.size(0), weight.size(2)),
        conv_bias=layer.conv1d.bias,
        num_k_heads=layer.num_k_heads // layer.tp_size,
        head_k_dim=layer.head_k_dim,
        head_v_dim=layer.head_v_dim,
        activation=layer.activation,
    )


class EngineCapture:
    """Captures an in-process engine's GDN layers into ``store`` (module docstring)."""

    def __init__(self, llm: Any, store: CaptureStore) -> None:
        self.store = store
        self.runner = model_runner(llm)
        self.layer_class = qwen.QwenGatedDeltaNetAttention
        context = self.runner.vllm_config.compilation_config.static_forward_context
        self.layers = {
            name: layer
            for name, layer in context.items()
            if isinstance(layer, qwen.QwenGatedDeltaNetAttention)
        }
        shadowed = [n for n, layer in self.layers.items() if "_forward_core" in vars(layer)]
        if not self.layers or shadowed:
            raise RuntimeError(
                f"GDN layers {sorted(self.layers)}; with an instance "
                f"_forward_core (not captured): {shadowed}"
            )
        self.scheduler_output: Any = None
        self.step: int | None = None

    def step_layout(self, attn_metadata: Any) -> StepLayout:
        """This step's layout from the runner, checked against the layer's metadata."""
        if attn_metadata.spec_sequence_masks is not None:
            raise RuntimeError("the capture does not cover speculative decoding")
        batch = self.runner.input_batch
        num_reqs = batch.num_reqs
        requests = tuple(batch.req_ids[:num_reqs])
        counts = tuple(int(self.scheduler_output.num_scheduled_tokens[r]) for r in requests)
        layout = StepLayout(
            requests=requests,
            counts=counts,
            starts=tuple(int(n) for n in batch.num_computed_tokens_cpu[:num_reqs]),
            prompt_lengths=tuple(self.runner.requests[r].num_prompt_tokens for r in requests),
        )
        if attn_metadata.num_decodes + attn_metadata.num_prefills != num_reqs:
            raise RuntimeError(
                f"the metadata has {attn_metadata.num_decodes} decodes and "
                f"{attn_metadata.num_prefills} prefills; the batch {num_reqs} "
                "requests"
            )
        return layout

    def check_rows(self, attn_metadata: Any, layout: StepLayout) -> torch.Tensor:
        """The layer's state blocks of the step's requests, after checking that its metadata
        packs the rows as the layout says."""
        num_reqs = len(layout.requests)
        starts = attn_metadata.non_spec_query_start_loc[: num_reqs + 1].tolist()
        counts = tuple(hi - lo for lo, hi in zip(starts, starts[1:], strict=False))
        if counts != layout.counts or attn_metadata.num_actual_tokens != layout.num_rows:
            raise RuntimeError(
                f"the layer's query starts {starts} (of "
                f"{attn_metadata.num_actual_tokens} rows) are not the "
                f"scheduler's counts {layout.counts}"
            )
        blocks = attn_metadata.non_spec_state_indices_tensor
        if blocks.dim() != 1:
            raise RuntimeError(
                f"state indices of shape {tuple(blocks.shape)}: the capture "
                "expects one block per request (prefix caching off)"
            )
        return blocks[:num_reqs].to(torch.int64)

    def capture(
        self,
        served: Any,
        layer: Any,
        mixed_qkv: torch.Tensor,
        b: torch.Tensor,
        a: torch.Tensor,
        core_attn_out: torch.Tensor,
    ) -> Any:
        """Serve the step through ``served`` and record its rows and blocks."""
        raw = qwen.get_forward_context().attn_metadata
        attn_metadata = raw.get(layer.prefix) if isinstance(raw, dict) else None
        if attn_metadata is None:  # the profile run
            return served(layer, mixed_qkv=mixed_qkv, b=b, a=a, core_attn_out=core_attn_out)
        rows = attn_metadata.num_actual_tokens
        x, a_rows, b_rows = mixed_qkv[:rows].clone(), a[:rows].clone(), b[:rows].clone()
        result = served(layer, mixed_qkv=mixed_qkv, b=b, a=a, core_attn_out=core_attn_out)
        if self.step is None:
            self.step = self.store.begin_step(self.step_layout(attn_metadata))
        layout = self.store.steps[self.step]
        blocks = self.check_rows(attn_metadata, layout)
        conv = layer.kv_cache[0].index_select(0, blocks)
        if not is_conv_state_dim_first():  # vLLM keeps [W-1, dim] per block
            conv = conv.transpose(-1, -2).contiguous()
        self.store.record(
            layer.prefix,
            layer_weights(layer),
            self.step,
            x,
            a_rows,
            b_rows,
            core_attn_out[:rows].clone(),
            conv,
            layer.kv_cache[1].index_select(0, blocks),
        )
        return result

    @contextlib.contextmanager
    def installed(self) -> Iterator[EngineCapture]:
        """Both wrappers (module docstring) while the context lasts."""
        served = self.layer_class.__dict__["_forward_core"]
        execute = self.runner.execute_model
        own = vars(self.runner).get("execute_model")

        def execute_model(scheduler_output: Any, *args: Any, **kwargs: Any) -> Any:
            self.scheduler_output, self.step = scheduler_output, None
            return execute(scheduler_output, *args, **kwargs)

        def forward_core(layer, mixed_qkv, b, a, core_attn_out):
            return self.capture(served, layer, mixed_qkv, b, a, core_attn_out)

        self.runner.execute_model = execute_model
        self.layer_class._forward_core = forward_core
        try:
            yield self
        finally:
            self.layer_class._forward_core = served
            if own is None:
                del self.runner.execute_model
            else:
                self.runner.execute_model = own
