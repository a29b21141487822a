"""The ``vllm.general_plugins`` entry point ``gdn_invariant``.

vLLM calls :func:`register` in every process it starts (API server, engine core, workers,
the model-inspection subprocess). It reads the configuration, checks the installed vLLM
build, the source fingerprint of every function it touches and the platform, then patches
all or nothing and logs one line saying what it did, through vLLM's logger
(``vllm.gdn_invariant``: ``VLLM_LOGGING_LEVEL`` and ``VLLM_CONFIGURE_LOGGING`` apply).

A bad value of the plugin's own environment variables raises :class:`ConfigError`, as vLLM
does for its own. Anything else that goes wrong (an unknown build or source, an unsupported
platform, a failing import, a failing patch) logs one warning line and patches nothing;
with ``VLLM_GDN_INVARIANT_STRICT=1`` it raises instead, with the cause.
"""

from __future__ import annotations

import dataclasses
import logging
import multiprocessing
import os
import threading
from dataclasses import dataclass

from vllm_gdn_invariant.patches import MethodPatch, PatchError, apply_all, routing_patch
from vllm_gdn_invariant.patches.batch_invariance import describe_patches, invariance_patches
from vllm_gdn_invariant.patches.bi_patch import batch_invariant_enabled
from vllm_gdn_invariant.patches.golden_decode import golden_decode_patches
from vllm_gdn_invariant.patches.history_replay import (
    builder_patch,
    history_scheduler_patches,
    model_state_patches,
)
from vllm_gdn_invariant.patches.shadow import shadow_patches
from vllm_gdn_invariant.plugin.config import Mode, PluginConfig, load_config
from vllm_gdn_invariant.plugin.platform import PlatformCheck, check_platform
from vllm_gdn_invariant.plugin.versions import GuardResult, check_targets, installed_release

try:
    from vllm.logger import init_logger
except Exception:  # noqa: BLE001 - without vLLM (doctor) the stdlib logger of that name serves
    init_logger = logging.getLogger

LOGGER_NAME = "vllm.gdn_invariant"
logger = init_logger(LOGGER_NAME)

PACKED_DECODE_ENV = "VLLM_ENABLE_FLA_PACKED_RECURRENT_DECODE"
GOLDEN_NEEDS_PACKED_DECODE = (
    f"VLLM_GDN_INVARIANT_MODE=golden needs {PACKED_DECODE_ENV}=1 (vLLM's default): with 0, "
    "vLLM runs decode-only steps through fused_sigmoid_gating_delta_rule_update, which the "
    f"golden decode path does not replace; unset {PACKED_DECODE_ENV} or use mode route"
)

_lock = threading.Lock()
_registered: PluginStatus | None = None


class UnsupportedVllmError(RuntimeError):
    """Strict mode: the plugin cannot patch this vLLM (build, source, platform or import)."""


def patches_for(config: PluginConfig) -> list[MethodPatch]:
    """The patches the plugin installs for ``config``: the routing unless mode off (with the
    batch-invariance patches under ``VLLM_BATCH_INVARIANT=1``, mode golden's decode path and
    the history replay where it applies), then the shadow checker's wrappers when it is on
    (last: they wrap what the others installed)."""
    batch_invariant = batch_invariant_enabled()
    replay = config.replays_history(batch_invariant)
    patches = (
        []
        if config.mode is Mode.OFF
        else [
            routing_patch(history_replay=replay),
            *invariance_patches(installed_release(), history_replay=replay),
        ]
    )
    if config.mode is Mode.GOLDEN:
        patches += golden_decode_patches()
    if replay:
        patches += [builder_patch(), *model_state_patches()]
        if not batch_invariant:
            patches += history_scheduler_patches()
    if config.shadow.enabled:
        patches += shadow_patches()
    return patches


def packed_decode_enabled() -> bool:
    """vLLM's ``VLLM_ENABLE_FLA_PACKED_RECURRENT_DECODE`` (default on), parsed as vLLM does."""
    try:
        return bool(int(os.environ.get(PACKED_DECODE_ENV, "1")))
    except ValueError:
        return True


@dataclass(frozen=True)
class PluginStatus:
    """What the plugin would do (a plan) or did (after :func:`register`)."""

    config: PluginConfig
    guard: GuardResult | None
    patches: tuple[MethodPatch, ...]
    platform: PlatformCheck | None = None
    applied: bool = False
    error: str | None = None

    @property
    def refusal(self) -> str | None:
        if self.config.installs_nothing:
            return None
        if self.error is not None:
            return self.error
        if self.guard is not None and self.guard.refusal is not None:
            return self.guard.refusal
        if self.platform is not None:
            return self.platform.refusal
        return None

    @property
    def will_patch(self) -> bool:
        return not self.config.installs_nothing and self.refusal is None

    def action(self) -> str:
        """What the plugin did or would do, in words."""
        if self.config.installs_nothing:
            return "nothing patched (mode off)"
        if self.refusal is not None:
            return f"nothing patched: {self.refusal}"
        verb = "patched" if self.applied else "would patch"
        action = f"{verb} " + describe_patches(self.patches)
        on_cpu = self.platform is not None and self.platform.is_cpu
        if self.config.mode is Mode.GOLDEN:
            action += (
                " (mode golden: non-speculative decode rows run the goldens' arithmetic, "
                + (
                    "the PyTorch goldens on vLLM's CPU build"
                    if on_cpu
                    else "golden-matched kernels"
                )
                + "; prefill and speculative rows keep vLLM's kernels)"
            )
        if on_cpu:
            action += (
                " (CPU platform: GDN layers run forward_cpu, which does not call"
                " _forward_core, so no step is routed)"
            )
        elif not packed_decode_enabled():
            action += (
                f" ({PACKED_DECODE_ENV}=0: vLLM runs every decode row through "
                "fused_sigmoid_gating_delta_rule_update; mixed steps are left to vLLM)"
            )
        return action

    def summary(self) -> str:
        """The one log line: build, configuration, action, process."""
        build = "vLLM not found"
        if self.guard is not None and self.guard.installed is not None:
            build = f"vLLM {self.guard.installed.describe()}"
        proc = f"pid {os.getpid()} {multiprocessing.current_process().name}"
        return f"gdn_invariant: {build}, {self.config.describe()}; {self.action()} [{proc}]"


def plan(config: PluginConfig | None = None) -> PluginStatus:
    """Decide what :func:`register` would patch, without patching anything.

    Fingerprints are read from the installed files; the platform is asked of vLLM only
    when the fingerprints pass.
    """
    config = load_config() if config is None else config
    if config.installs_nothing:
        return PluginStatus(config, None, ())
    if config.mode is Mode.GOLDEN and not packed_decode_enabled():
        return PluginStatus(config, None, (), error=GOLDEN_NEEDS_PACKED_DECODE)
    patches = tuple(patches_for(config))
    targets = [(p.target, "replaced") for p in patches]
    targets += [(t, "relied on") for p in patches for t in p.relies_on]
    targets = list(dict.fromkeys(targets))  # the shadow wrappers share targets with the rest
    guard = check_targets(targets)
    platform = check_platform() if guard.ok else None
    return PluginStatus(config, guard, patches, platform)


def _register(config: PluginConfig) -> PluginStatus:
    status = plan(config)
    if status.refusal is not None:
        if config.strict:
            raise UnsupportedVllmError(
                f"gdn_invariant (VLLM_GDN_INVARIANT_STRICT=1): {status.refusal}"
            )
        logger.warning(status.summary())
        return status
    if not status.will_patch:
        logger.info(status.summary())
        return status
    try:
        apply_all(status.patches)
    except PatchError as exc:
        if config.strict:
            raise
        status = dataclasses.replace(status, error=str(exc))
        logger.warning(status.summary())
        return status
    status = dataclasses.replace(status, applied=True)
    logger.info(status.summary())
    return status


def register() -> None:
    """Entry point: configure, check, patch. A second call in the same process does nothing.

    Raises :class:`~vllm_gdn_invariant.plugin.config.ConfigError` on a bad environment
    variable. Outside strict mode nothing else escapes: any failure logs one warning line
    and patches nothing. In strict mode an unknown build, source or platform raises
    :class:`UnsupportedVllmError`, a target that is not vLLM's own method
    :class:`~vllm_gdn_invariant.patches.PatchError`, and any other failure
    :class:`UnsupportedVllmError` chained to its cause.
    """
    global _registered
    with _lock:
        if _registered is not None:
            return
        config = load_config()
        try:
            status = _register(config)
        except (UnsupportedVllmError, PatchError):
            raise
        except Exception as exc:  # noqa: BLE001 - the plugin never takes vLLM down unasked
            cause = f"{type(exc).__name__}: {exc}"
            if config.strict:
                raise UnsupportedVllmError(
                    f"gdn_invariant (VLLM_GDN_INVARIANT_STRICT=1): {cause}"
                ) from exc
            status = PluginStatus(config, None, (), error=f"failed: {cause}")
            logger.warning(status.summary())
        _registered = status


def registered_status() -> PluginStatus | None:
    """The status of this process's :func:`register` call, None before it."""
    return _registered
