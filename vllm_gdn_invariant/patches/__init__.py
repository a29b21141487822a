"""What the plugin changes in vLLM: one module per change, and :data:`INDEX`, the list of them.

Every patch module opens with its patch note: a summary line (``Patch: ...``), then
**Target(s)**, **Why**, **Upstream**, **Remove when** and **Applies**. :data:`INDEX` has one
entry per module, in the order the plugin applies them (wrappers last: they go over what the
others installed), with the module's file, targets, summary, upstream PR, removal condition
and when it applies; the plugin selects its patches from it (:func:`select`).
``tests/plugin/test_patch_index.py`` checks that every patch module is in the index and that
each entry says what the module's note says.

Modules that are not patches:

* ``base.py``: the mechanism (:class:`~.base.Patch`, :func:`~.base.apply_all`, all or nothing).
* ``selection.py``: the mode, :class:`~.selection.Selection`, :class:`~.selection.When`.
* ``bi_patch.py``: what the ``bi_*`` patches share.
* ``routed_forward_core.py``, ``golden_decode_step.py``, ``shadow_hooks.py``: replacement
  bodies; they import vLLM and are loaded only when a patch is installed.
* ``diffs.py``: the routing change as unified diffs against vLLM's source (``vllm-diffs/`` at
  the repository root).

Adding a patch:

1. Write ``patches/<name>.py`` opening with the note above. Declare the vLLM functions as
   :class:`~.base.SourceTarget` constants and a factory returning the
   :class:`~.base.Patch` objects, e.g.::

       def my_patch() -> Patch:
           return Patch(
               target=SOME_TARGET,            # the vLLM function replaced
               replacement=make_replacement,  # make_replacement(vllm_original) -> new function
               why="one line",
               relies_on=(OTHER_TARGET,),     # what the replacement calls or assumes
           )

   ``kind="classmethod"``/``"object"``, ``binding`` (a ``from ... import`` name in another
   module), ``keep_original_as``, ``wraps``, ``prepare``, ``label``, ``group`` and ``since``
   are described on :class:`~.base.Patch`. The module imports nothing from vLLM: a factory
   that needs vLLM imports inside.
2. Add an :class:`Entry` to :data:`INDEX` at its place in the order: the note's summary,
   targets, upstream, removal condition (up to its first ``;``), a :class:`When` and the
   factory (``patches=lambda selection: [my_patch()]``).
3. Add the fingerprints of every target and ``relies_on`` function to ``plugin/versions.py``
   for every supported release, with its SourceTarget imported there;
   ``tests/plugin/test_fingerprints_wheels.py`` checks them against the published wheels.
4. Test the replacement, and that the patch applies and reverts (``applied([my_patch()])``);
   ``tests/plugin/test_all_or_nothing.py`` injects failures into every patch of the index.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from vllm_gdn_invariant.patches import (
    bi_align_block,
    bi_autotune,
    bi_cache_hit,
    bi_chunk_grid,
    bi_gated_norm,
    bi_packed_decode,
    bi_prefill,
    bi_selector,
    bi_ssm_state,
    golden_decode,
    history_cache_key,
    history_replay,
    shadow,
)
from vllm_gdn_invariant.patches.base import (
    Patch,
    PatchError,
    SourceTarget,
    applied,
    apply_all,
    describe,
    revert_all,
)
from vllm_gdn_invariant.patches.routing import routing_patch
from vllm_gdn_invariant.patches.selection import (
    PATCHING_MODES,
    Mode,
    Selection,
    When,
    describe_since,
    in_release,
)


@dataclass(frozen=True)
class Entry:
    """One patch module: its file, the qualified names of its targets, its note's summary
    (``why``), upstream PR, removal condition (the note's, up to its first ``;``), when it
    applies, and the factory of its patches for a :class:`Selection`."""

    file: str
    targets: tuple[str, ...]
    why: str
    upstream: str
    remove_when: str
    when: When
    patches: Callable[[Selection], Sequence[Patch]]

    def applies(self) -> str:
        """When it applies, in words (the note's **Applies**)."""
        since = describe_since(self.patches(Selection(shadow=None)))
        return self.when.describe() + (f"; {since}" if since else "")


BATCH_INVARIANT = When(PATCHING_MODES, batch_invariant=True)

INDEX: tuple[Entry, ...] = (
    Entry(
        file="routing.py",
        targets=("QwenGatedDeltaNetAttention._forward_core",),
        why="route the decode rows of mixed decode+prefill steps through the decode-only kernels.",
        upstream="vllm-project/vllm PR #49827 (open)",
        remove_when="a supported vLLM runs the decode rows of mixed steps through the "
        "decode-only kernels itself (PR #49827 or equivalent merged, default on)",
        when=When(PATCHING_MODES),
        patches=lambda selection: [
            routing_patch(history_replay=selection.replay, golden=selection.mode is Mode.GOLDEN)
        ],
    ),
    Entry(
        file="bi_selector.py",
        targets=("MambaBase.get_attn_backend",),
        why="batch-invariant mode serves Qwen GDN layers; other GDN layers keep vLLM's refusal.",
        upstream="vllm-project/vllm PR #49827 (open)",
        remove_when="a supported vLLM declares it for Qwen GDN layers and closes the sources "
        "itself",
        when=BATCH_INVARIANT,
        patches=lambda selection: [bi_selector.selector_patch()],
    ),
    Entry(
        file="bi_prefill.py",
        targets=("_resolve_gdn_prefill_backend",),
        why="under batch-invariant mode GDN prefill runs one implementation, Triton/FLA.",
        upstream="none (FlashInfer's use_cp=False once vLLM passes it)",
        remove_when="vLLM pins the GDN prefill implementation under batch-invariant mode.",
        when=BATCH_INVARIANT,
        patches=lambda selection: [bi_prefill.prefill_patch()],
    ),
    Entry(
        file="bi_ssm_state.py",
        targets=("HybridAttentionMambaModelConfig.verify_and_update_config",),
        why="under batch-invariant mode a Qwen GDN model keeps its recurrent state in float32.",
        upstream="none.",
        remove_when="vLLM carries the prefill state exactly across chunks in batch-invariant "
        "mode, or makes float32 the GDN state dtype there.",
        when=BATCH_INVARIANT,
        patches=lambda selection: [bi_ssm_state.ssm_state_patch()],
    ),
    Entry(
        file="bi_chunk_grid.py",
        targets=("Scheduler.__init__", "Scheduler._mamba_block_aligned_split"),
        why="under batch-invariant mode every non-final prefill chunk of a Qwen GDN model ends "
        "on the 64-token grid of the GDN chunk kernels.",
        upstream="vllm-project/vllm PR #49827 (open), PR #54993 (open)",
        remove_when="vLLM aligns GDN prefill chunks to the kernel grid under the mode and ends "
        "a recomputed request's chunks at its prompt's end.",
        when=BATCH_INVARIANT,
        patches=lambda selection: bi_chunk_grid.scheduler_patches(history=selection.replay),
    ),
    Entry(
        file="bi_align_block.py",
        targets=("Platform._align_hybrid_block_size",),
        why='under batch-invariant mode with prefix caching (``mamba_cache_mode="align"``), a '
        "Qwen GDN model's block size is a multiple of 64 tokens.",
        upstream="vLLM 0.33+ aligns the block only for FlashInfer prefill checkpoints",
        remove_when="vLLM aligns GDN mamba blocks to the chunk grid under batch-invariant mode.",
        when=BATCH_INVARIANT,
        patches=lambda selection: [bi_align_block.align_block_patch()],
    ),
    Entry(
        file="bi_cache_hit.py",
        targets=("HybridKVCacheCoordinator.find_longest_cache_hit",),
        why="under batch-invariant mode a prefix-cache hit never leaves a Qwen GDN prompt a "
        "single token to compute.",
        upstream="none.",
        remove_when="vLLM computes the rest of a cached prompt on the prefill path whatever its "
        "length, or GDN decode reproduces the chunk kernels' bits.",
        when=BATCH_INVARIANT,
        patches=lambda selection: [bi_cache_hit.cache_hit_patch()],
    ),
    Entry(
        file="bi_gated_norm.py",
        targets=("calc_rows_per_block",),
        why="under batch-invariant mode the gated RMSNorm after the GDN core tiles one row per "
        "program, whatever the number of rows.",
        upstream="none.",
        remove_when="vLLM fixes the tile under batch-invariant mode.",
        when=BATCH_INVARIANT,
        patches=lambda selection: bi_gated_norm.gated_norm_patches(),
    ),
    Entry(
        file="bi_packed_decode.py",
        targets=("fused_recurrent_gated_delta_rule_packed_decode_kernel",),
        why="under batch-invariant mode the packed-decode kernel's value tile on Blackwell does "
        "not depend on the batch size.",
        upstream="none.",
        remove_when="vLLM fixes the tile under batch-invariant mode.",
        when=BATCH_INVARIANT,
        patches=lambda selection: [bi_packed_decode.packed_decode_patch()],
    ),
    Entry(
        file="bi_autotune.py",
        targets=tuple(target.qualname for target in bi_autotune.TARGETS),
        why="under batch-invariant mode the autotuned Triton kernels of the GDN prefill run one "
        "fixed config, so that no process picks another tile than the last one.",
        upstream="vllm-project/vllm PR #55895 (open)",
        remove_when="vLLM pins (or stops autotuning) the FLA chunk kernels under the mode.",
        when=BATCH_INVARIANT,
        patches=lambda selection: bi_autotune.autotune_patches(),
    ),
    Entry(
        file="golden_decode.py",
        targets=(
            "QwenGatedDeltaNetAttention._forward_core_decode_non_spec",
            "_cpu_gdn_attention_nonspec",
        ),
        why="in mode ``golden``, every non-speculative decode row runs the golden arithmetic.",
        upstream="none; golden-matched kernels are this package's.",
        remove_when="never for mode ``golden``",
        when=When(frozenset({Mode.GOLDEN})),
        patches=lambda selection: golden_decode.golden_decode_patches(),
    ),
    Entry(
        file="history_replay.py",
        targets=(
            "GDNAttentionMetadataBuilder.build",
            "Scheduler.__init__",
            "Scheduler._mamba_block_aligned_split",
            "MambaHybridModelState.add_request",
            "MambaHybridModelState.prepare_attn",
        ),
        why="a preempted request that vLLM recomputes keeps its bits (decode-history replay).",
        upstream="vllm-project/vllm PR #54993 (open)",
        remove_when="vLLM recovers preempted GDN requests with their decode-step arithmetic.",
        when=When(PATCHING_MODES, replay=True),
        patches=lambda selection: history_replay.history_replay_patches(selection.batch_invariant),
    ),
    Entry(
        file="history_cache_key.py",
        targets=("generate_block_hash_extra_keys",),
        why="a cached block whose GDN state came from decode steps is found only by a request "
        "that decoded it from the same prompt end.",
        upstream="none; vLLM PR #54993 (open, Mamba2) recomputes preempted requests without "
        "touching the cache keys.",
        remove_when="vLLM keys cached mamba states by how they were computed, or GDN decode "
        "reproduces the chunk kernels' bits.",
        when=When(PATCHING_MODES, replay=True),
        patches=lambda selection: history_cache_key.cache_key_patches(),
    ),
    Entry(
        file="shadow.py",
        targets=("QwenGatedDeltaNetAttention._forward_core", "_cpu_gdn_attention_nonspec"),
        why="the shadow checker's hooks around the GDN decode path "
        "(``VLLM_GDN_INVARIANT_SHADOW``).",
        upstream="none; a checker, not a fix.",
        remove_when="not tied to a vLLM change",
        when=When(frozenset(Mode), shadow=True),
        patches=lambda selection: shadow.shadow_patches(selection.shadow, selection.mode.value),
    ),
)


def select(selection: Selection) -> list[Patch]:
    """The patches for ``selection``, new objects in :data:`INDEX` order (the order to apply
    them in)."""
    return [
        patch
        for entry in INDEX
        if entry.when.holds(selection)
        for patch in entry.patches(selection)
        if in_release(patch, selection.release)
    ]


def every_patch() -> list[Patch]:
    """Every patch of every mode and release (what the fingerprint table must cover)."""
    return [patch for entry in INDEX for patch in entry.patches(Selection())]


def batch_invariance_patches(release: str | None = None) -> list[Patch]:
    """The patches installed for ``VLLM_BATCH_INVARIANT=1`` on vLLM ``release`` (None: every
    release's), without the routing."""
    return [
        patch
        for entry in INDEX
        if entry.when.batch_invariant
        for patch in entry.patches(Selection(batch_invariant=True))
        if in_release(patch, release)
    ]


__all__ = [
    "INDEX",
    "Entry",
    "Mode",
    "Patch",
    "PatchError",
    "Selection",
    "SourceTarget",
    "When",
    "applied",
    "apply_all",
    "batch_invariance_patches",
    "describe",
    "every_patch",
    "revert_all",
    "routing_patch",
    "select",
]
