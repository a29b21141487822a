"""Which engine steps the plugin routes, given what the deployment looks like.

A pure decision, no vLLM import: ``doctor`` feeds it what it reads from the environment and
from vLLM's config; the README and the tests rely on it.

* Nothing is routed when the plugin patches nothing (not loaded, mode off, refused), on vLLM's
  CPU build (GDN layers run ``forward_cpu``, which does not call ``_forward_core``) and with
  ``VLLM_ENABLE_FLA_PACKED_RECURRENT_DECODE=0`` (vLLM then runs every decode row through one
  kernel, ``fused_sigmoid_gating_delta_rule_update``, in every step).
* Otherwise the routed steps are the mixed decode+prefill steps without speculative rows whose
  decode rows carry one token each (``gdn_invariant_routes``), whatever the prefill backend and
  mamba cache mode; decode-only, prefill-only, speculative and multi-token-decode steps run
  vLLM's ``_forward_core`` unchanged.
* The prefill backend and cache mode qualify the routed steps: the routing is written for
  Triton and FlashInfer prefill (it does not look at the backend, so another one still gets
  routed steps, on a prefill path it does not cover); under ``mamba_cache_mode="align"`` vLLM writes
  checkpoints inside prefills only with FlashInfer prefill on vLLM 0.33+, and the routed step
  rebases those checkpoint rows and FlashInfer's checkpoint plan to the prefill tail.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from packaging.version import InvalidVersion, Version

from vllm_gdn_invariant.plugin.platform import PlatformCheck
from vllm_gdn_invariant.plugin.vllm_env import PACKED_DECODE

FINGERPRINTED_PREFILL_BACKENDS = ("triton", "flashinfer")
FLASHINFER_CHECKPOINTS_SINCE = Version("0.33.0")


class Step(str, enum.Enum):
    """A kind of engine step, as the routing tells them apart."""

    MIXED = "mixed decode+prefill steps without speculative rows whose decode rows carry one token"
    DECODE_ONLY = "decode-only steps"
    PREFILL_ONLY = "prefill-only steps"
    SPECULATIVE = "steps with speculative rows"
    MULTI_TOKEN_DECODES = "mixed steps whose decode rows carry more than one token"


@dataclass(frozen=True)
class RoutingScope:
    """The steps whose decode rows the plugin routes, and the steps it leaves to vLLM.

    ``none_because`` says why nothing is routed (``routed`` is then empty); ``notes`` qualify
    the routed steps (prefill backend, cache mode, what is not known).
    """

    routed: tuple[Step, ...]
    left_to_vllm: tuple[Step, ...]
    none_because: str | None = None
    notes: tuple[str, ...] = ()

    def routed_text(self) -> str:
        if not self.routed:
            return f"no step ({self.none_because})"
        return "; ".join([", ".join(s.value for s in self.routed), *self.notes])

    def left_text(self) -> str:
        if not self.routed:
            return "every step"
        return ", ".join(s.value for s in self.left_to_vllm)


def _release(version: str | None) -> Version | None:
    if version is None:
        return None
    try:
        return Version(Version(version).base_version)
    except InvalidVersion:
        return None


def _nothing(reason: str) -> RoutingScope:
    return RoutingScope((), tuple(Step), none_because=reason)


def _backend_note(backend: str | None) -> str | None:
    if backend is None:
        return None
    if backend in FINGERPRINTED_PREFILL_BACKENDS:
        return f"prefill rows run vLLM's {backend} prefill on the prefill tail"
    return (
        f"prefill rows run vLLM's {backend} prefill on the prefill tail, a path the routing "
        "was not written for (it covers triton and flashinfer prefill)"
    )


def _cache_mode_note(mode: str | None, backend: str | None, version: str | None) -> str | None:
    if mode is None or mode == "none":
        return None
    if mode != "align":
        return f"mamba_cache_mode {mode!r} is not one the plugin knows for GDN layers"
    release = _release(version)
    if backend == "flashinfer" and release is not None:
        if release >= FLASHINFER_CHECKPOINTS_SINCE:
            return (
                "mamba_cache_mode align: FlashInfer writes checkpoints inside prefills; the routed "
                "step rebases their rows and FlashInfer's checkpoint plan to the prefill tail"
            )
        return (
            f"mamba_cache_mode align: no checkpoints inside prefills on vLLM {release} "
            "(vLLM writes them with FlashInfer prefill from 0.33)"
        )
    if backend is None or backend == "flashinfer":
        return (
            "mamba_cache_mode align: where vLLM writes checkpoints inside prefills (FlashInfer "
            "prefill, vLLM 0.33+), the routed step rebases them to the prefill tail"
        )
    return (
        f"mamba_cache_mode align: no checkpoints inside prefills with {backend} prefill "
        "(vLLM writes them with FlashInfer prefill only)"
    )


def routing_scope(
    *,
    platform: PlatformCheck | None,
    packed_decode: bool,
    not_patched: str | None = None,
    speculative: bool | None = None,
    prefill_backend: str | None = None,
    mamba_cache_mode: str | None = None,
    vllm_version: str | None = None,
) -> RoutingScope:
    """Which steps are routed.

    ``platform``: the plugin's platform check (None when vLLM's platform could not be read:
    the plugin then patches nothing). ``packed_decode``: vLLM's
    ``VLLM_ENABLE_FLA_PACKED_RECURRENT_DECODE``. ``not_patched``: why the plugin patches
    nothing (not loaded, mode off, a refusal), None when it patches. ``speculative``,
    ``prefill_backend`` (the active one: ``triton``, ``flashinfer``, ...),
    ``mamba_cache_mode`` and ``vllm_version`` come from vLLM's config; None is "not known".
    """
    if not_patched is not None:
        return _nothing(f"the plugin patches nothing: {not_patched}")
    if platform is None:
        return _nothing("vLLM's platform could not be read, so the plugin patches nothing")
    if platform.refusal is not None:
        return _nothing(f"the plugin patches nothing: {platform.refusal}")
    if platform.is_cpu:
        return _nothing(
            "CPU platform: GDN layers run forward_cpu, which does not call _forward_core"
        )
    if not packed_decode:
        return _nothing(
            f"{PACKED_DECODE.name}=0: vLLM runs every decode row through one kernel, "
            "fused_sigmoid_gating_delta_rule_update, in every step"
        )
    left = [Step.DECODE_ONLY, Step.PREFILL_ONLY]
    if speculative is not False:
        left.append(Step.SPECULATIVE)
    left.append(Step.MULTI_TOKEN_DECODES)
    unknown = [
        name
        for name, value in (
            ("speculative decoding", speculative),
            ("prefill backend", prefill_backend),
            ("mamba cache mode", mamba_cache_mode),
        )
        if value is None
    ]
    notes = [
        note
        for note in (
            _backend_note(prefill_backend),
            _cache_mode_note(mamba_cache_mode, prefill_backend, vllm_version),
            f"not known: {', '.join(unknown)}" if unknown else None,
        )
        if note is not None
    ]
    return RoutingScope((Step.MIXED,), tuple(left), notes=tuple(notes))
