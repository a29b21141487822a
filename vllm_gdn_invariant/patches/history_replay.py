"""Patch: a preempted request that vLLM recomputes keeps its bits (decode-history replay).

* **Targets**:
  - ``GDNAttentionMetadataBuilder.build`` (``vllm/v1/attention/backends/gdn_attn.py``),
    wrapped by :func:`~vllm_gdn_invariant.patches.history_plan.make_build`: vLLM's metadata,
    plus the step's :class:`~vllm_gdn_invariant.patches.history_plan.HistoryPlan` when a row
    recomputes generated tokens.
  - ``QwenGatedDeltaNetAttention._forward_core``: the routing patch's target, replaced by
    :func:`~vllm_gdn_invariant.patches.replayed_forward_core.replayed_forward_core` (the
    routing, plus the replay of the plan's rows).
  - ``Scheduler.__init__`` / ``Scheduler._mamba_block_aligned_split``: the chunk-grid patch
    (``bi_chunk_grid.py``) with the prompt-end rule; in mode golden without batch-invariant
    mode the rule alone.
  - Model Runner V2 (``vllm/v1/worker/gpu/model_states/mamba_hybrid.py``):
    ``MambaHybridModelState.add_request``, wrapped to keep each request slot's prompt length,
    and ``MambaHybridModelState.prepare_attn``, wrapped to say which rows of the step it
    prepares are past their prompt while vLLM builds the step's metadata.
* **Why**: under KV-cache pressure vLLM preempts a request and later recomputes it as prefill
  chunks over its prompt and every token it generated. Those tokens' GDN states were first
  built by decode steps (conv update + packed decode, or mode golden's kernels), one token at
  a time; the chunk kernels rebuild them with other rounding, so the request's tokens and
  logprobs change where it was preempted, depending on what else the server did. With the
  patch the prompt is recomputed on its own chunk grid, ending at the prompt's end as its
  first prefill did, and the generated tokens are replayed token by token through the layer's
  decode path from the state after the prompt.
* **Upstream**: vllm-project/vllm PR #54993 (open) does the same for Mamba2 (recovery keeps
  the prompt's chunk boundaries and replays generated history through the decode path);
  nothing exists for GDN.
* **Remove when**: vLLM recovers preempted GDN requests with their decode-step arithmetic.
* **Applies**: modes route and golden, with VLLM_BATCH_INVARIANT=1, and mode golden; with
  VLLM_GDN_INVARIANT_REPLAY=on.

Where it applies: ``VLLM_GDN_INVARIANT_REPLAY=on`` (the default) with
``VLLM_BATCH_INVARIANT=1`` in modes ``route`` and ``golden``, and in mode ``golden``. The
builder tells a recomputed history row by vLLM's V1 model runner's ``is_prefilling``
(``GPUModelRunner._build_attention_metadata``: ``num_computed_tokens < num_prompt_tokens``)
or, with Model Runner V2 (whose ``is_prefilling`` counts the recomputed length), by the flags
the mamba model state's wrapper computes from the slot's prompt length and the row's
``num_computed_tokens`` (``GPUModelRunner.prepare_inputs``). With speculative decoding (its
steps are left to vLLM) and where vLLM writes checkpoints inside prefill chunks (which the
replay does not write) no row is replayed; the builder says so once in the log, and
``doctor`` says the same.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from vllm_gdn_invariant.patches.base import Patch, SourceTarget
from vllm_gdn_invariant.patches.bi_chunk_grid import (
    ALIGNED_SPLIT,
    SCHEDULE,
    SCHEDULER_INIT,
    make_history_init,
    make_split,
)
from vllm_gdn_invariant.patches.history_plan import (
    PLAN_ATTR,
    current_past_prompt,
    history_plan,
    step_past_prompt,
)
from vllm_gdn_invariant.patches.routing import METADATA_BUILD, SPLIT_DECODES

LABEL = "history-replay"
V1_RUNNER_MODULE = "vllm.v1.worker.gpu_model_runner"
V1_BUILD_ATTENTION_METADATA = SourceTarget(
    V1_RUNNER_MODULE, "GPUModelRunner._build_attention_metadata"
)
COMMON_METADATA_CLASS = SourceTarget("vllm.v1.attention.backend", "CommonAttentionMetadata")
V2_STATE_MODULE = "vllm.v1.worker.gpu.model_states.mamba_hybrid"
V2_ADD_REQUEST = SourceTarget(V2_STATE_MODULE, "MambaHybridModelState.add_request")
V2_PREPARE_ATTN = SourceTarget(V2_STATE_MODULE, "MambaHybridModelState.prepare_attn")
V2_PREPARE_INPUTS = SourceTarget("vllm.v1.worker.gpu.model_runner", "GPUModelRunner.prepare_inputs")
V2_INPUT_BATCH = SourceTarget("vllm.v1.worker.gpu.input_batch", "InputBatch")
PROMPT_LENS_ATTR = "gdn_invariant_prompt_lens"

V2_UNREPORTED_NOTE = (
    "Model Runner V2 built GDN metadata outside the mamba model state's prepare_attn: that "
    "step's rows are not replayed"
)
SPECULATIVE_NOTE = (
    "speculative decoding is on: preempted requests are recomputed without the history "
    "replay (speculative steps are left to vLLM)"
)
CHECKPOINT_NOTE = (
    "vLLM exports prefill checkpoints inside prefill chunks here (align mode with FlashInfer "
    "prefill): preempted requests are recomputed without the history replay"
)
KV_CONNECTOR_NOTE = (
    "a KV connector is configured: a request resumed from externally computed tokens starts "
    "where they end, off its prompt's chunk grid, and its state comes from elsewhere; such a "
    "request is not recovered bit for bit (locally recomputed requests are)"
)

logger = logging.getLogger("vllm.gdn_invariant")


def runs_v1_model_runner(vllm_config: Any) -> bool:
    """Whether the engine's model runner is vLLM's V1 ``GPUModelRunner``."""
    return not bool(getattr(vllm_config, "use_v2_model_runner", True))


def exports_prefill_checkpoints(kv_cache_spec: Any) -> bool:
    """Whether the GDN layers write checkpoints inside prefill chunks (vLLM 0.33+ align mode
    with FlashInfer prefill)."""
    return bool(getattr(kv_cache_spec, "num_prefill_checkpoint_blocks", 0))


def replay_gaps(vllm_config: Any, kv_cache_spec: Any = None) -> list[str]:
    """Why recomputed requests of this configuration are not replayed, in words."""
    gaps = []
    if getattr(vllm_config, "speculative_config", None) is not None:
        gaps.append(SPECULATIVE_NOTE)
    if exports_prefill_checkpoints(kv_cache_spec):
        gaps.append(CHECKPOINT_NOTE)
    return gaps


def replay_caveats(vllm_config: Any) -> list[str]:
    """What the replay does not make exact in this configuration, in words."""
    if getattr(vllm_config, "kv_transfer_config", None) is not None:
        return [KV_CONNECTOR_NOTE]
    return []


def replay_off_reason(replay_setting: bool, mode: str, batch_invariant: bool) -> str | None:
    """Why the plugin's configuration installs no replay (None: it does)."""
    if not replay_setting:
        return "VLLM_GDN_INVARIANT_REPLAY=off"
    if mode == "off":
        return "mode off"
    if mode != "golden" and not batch_invariant:
        return "needs VLLM_BATCH_INVARIANT=1 or mode golden"
    return None


def replay_summary(gaps: list[str], caveats: list[str]) -> str:
    """One line for ``doctor``: whether recomputed requests replay their history."""
    if gaps:
        return "off: " + "; ".join(gaps)
    return "on: a preempted request's recomputation replays its generated tokens" + (
        "; " + "; ".join(caveats) if caveats else ""
    )


def make_build(original: Callable[..., Any]) -> Callable[..., Any]:
    """The replacement ``GDNAttentionMetadataBuilder.build``: vLLM's metadata, with the step's
    history plan attached when a row replays history. The first build of a builder decides
    (and logs, once) what keeps this configuration from being replayed and which model
    runner it serves; a step without prefills costs one attribute test."""

    def build(self: Any, common_prefix_len: int, common_attn_metadata: Any, *args, **kwargs):
        metadata = original(self, common_prefix_len, common_attn_metadata, *args, **kwargs)
        if not hasattr(self, "gdn_invariant_replay_gaps"):
            self.gdn_invariant_replay_gaps = replay_gaps(self.vllm_config, self.kv_cache_spec)
            self.gdn_invariant_v1_runner = runs_v1_model_runner(self.vllm_config)
            notes = self.gdn_invariant_replay_gaps + replay_caveats(self.vllm_config)
            for note in notes:
                logger.warning("gdn_invariant: %s", note)
        if not metadata.num_prefills or self.gdn_invariant_replay_gaps:
            return metadata
        past_prompt = current_past_prompt()
        if past_prompt is None and not self.gdn_invariant_v1_runner:
            if not getattr(self, "gdn_invariant_unreported", False):
                self.gdn_invariant_unreported = True
                logger.warning("gdn_invariant: %s", V2_UNREPORTED_NOTE)
            return metadata
        plan = history_plan(common_attn_metadata, metadata, past_prompt)
        if plan is not None:
            setattr(metadata, PLAN_ATTR, plan)
        return metadata

    return build


def prompt_length(new_req_data: Any) -> int:
    """A new (or resumed) request's prompt length, from vLLM's ``NewRequestData``."""
    if new_req_data.prompt_token_ids is not None:
        return len(new_req_data.prompt_token_ids)
    return int(new_req_data.prompt_embeds.shape[0])


def make_add_request(original: Callable[..., Any]) -> Callable[..., Any]:
    """``MambaHybridModelState.add_request`` that keeps the slot's prompt length."""

    def add_request(self: Any, req_index: int, new_req_data: Any) -> None:
        original(self, req_index, new_req_data)
        lengths = self.__dict__.setdefault(PROMPT_LENS_ATTR, {})
        lengths[req_index] = prompt_length(new_req_data)

    return add_request


def past_prompt_flags(input_batch: Any, prompt_lens: dict[int, int]) -> list[bool]:
    """Per row of a V2 input batch: whether its request has computed its whole prompt (a slot
    with no recorded prompt, a dummy run's, is not)."""
    rows = input_batch.num_reqs
    computed = input_batch.num_computed_tokens_np[:rows].tolist()
    slots = input_batch.idx_mapping_np[:rows].tolist()
    return [
        slot in prompt_lens and done >= prompt_lens[slot]
        for done, slot in zip(computed, slots, strict=True)
    ]


def make_prepare_attn(original: Callable[..., Any]) -> Callable[..., Any]:
    """``MambaHybridModelState.prepare_attn`` that says, while vLLM builds the step's
    metadata, which rows are past their prompt."""

    def prepare_attn(self: Any, input_batch: Any, *args: Any, **kwargs: Any) -> Any:
        flags = past_prompt_flags(input_batch, self.__dict__.get(PROMPT_LENS_ATTR, {}))
        with step_past_prompt(flags):
            return original(self, input_batch, *args, **kwargs)

    return prepare_attn


def builder_patch() -> Patch:
    return Patch(
        target=METADATA_BUILD,
        replacement=make_build,
        why="attach the step's history plan: the rows that recompute generated tokens",
        relies_on=(V1_BUILD_ATTENTION_METADATA, COMMON_METADATA_CLASS, SPLIT_DECODES),
        label=LABEL,
    )


def model_state_patches() -> list[Patch]:
    """Model Runner V2's mamba model state: prompt lengths per slot, past-prompt rows per step."""
    return [
        Patch(
            target=V2_ADD_REQUEST,
            replacement=make_add_request,
            why="keep each request slot's prompt length (Model Runner V2)",
            label=LABEL,
        ),
        Patch(
            target=V2_PREPARE_ATTN,
            replacement=make_prepare_attn,
            why="say which rows of the step are past their prompt (Model Runner V2)",
            relies_on=(V2_PREPARE_INPUTS, V2_INPUT_BATCH),
            label=LABEL,
        ),
    ]


def history_replay_patches(batch_invariant: bool) -> list[Patch]:
    """The builder's and the V2 model state's patches, and without batch-invariant mode the
    scheduler's prompt-end rule (under the mode the chunk grid's patch carries it)."""
    patches = [builder_patch(), *model_state_patches()]
    if not batch_invariant:
        patches += history_scheduler_patches()
    return patches


def history_scheduler_patches() -> list[Patch]:
    """The prompt-end rule alone (mode golden without batch-invariant mode)."""
    return [
        Patch(
            target=SCHEDULER_INIT,
            replacement=make_history_init,
            why="a recomputed request's chunks end at its prompt's end",
            relies_on=(SCHEDULE,),
            label=LABEL,
        ),
        Patch(
            target=ALIGNED_SPLIT,
            replacement=make_split,
            why="a recomputed request's chunks end at its prompt's end",
            label=LABEL,
        ),
    ]
