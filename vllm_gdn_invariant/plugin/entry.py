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

from vllm_gdn_invariant.patches import Patch, PatchError, Selection, apply_all, describe, select
from vllm_gdn_invariant.plugin.config import ConfigError, Mode, PluginConfig, load_config
from vllm_gdn_invariant.plugin.platform import PlatformCheck, check_platform
from vllm_gdn_invariant.plugin.versions import (
    GuardResult,
    check_targets,
    guarded_targets,
    installed_release,
    installed_vllm,
)
from vllm_gdn_invariant.plugin.vllm_env import BATCH_INVARIANT, PACKED_DECODE, FlagValue

try:
    from vllm.logger import init_logger
except Exception:  # noqa: BLE001 - without vLLM (doctor) the stdlib logger of that name serves
    init_logger = logging.getLogger

LOGGER_NAME = "vllm.gdn_invariant"
logger = init_logger(LOGGER_NAME)

GOLDEN_NEEDS_PACKED_DECODE = (
    f"VLLM_GDN_INVARIANT_MODE=golden needs {PACKED_DECODE.name}=1 (vLLM's default): with 0, "
    "vLLM runs decode-only steps through fused_sigmoid_gating_delta_rule_update, which the "
    f"golden decode path does not replace; unset {PACKED_DECODE.name} or use mode route"
)

_lock = threading.Lock()
_registered: PluginStatus | None = None


class UnsupportedVllmError(RuntimeError):
    """Strict mode: the plugin cannot patch this vLLM (build, source, platform or import)."""


def patches_for(config: PluginConfig, batch_invariant: bool | None = None) -> list[Patch]:
    """The patches the plugin installs for ``config``, in the order of the patch index: the
    routing unless mode off (with the batch-invariance patches under
    ``VLLM_BATCH_INVARIANT=1``, mode golden's decode path and the history replay where it
    applies), then the shadow checker's wrappers when it is on. ``batch_invariant`` None
    reads ``VLLM_BATCH_INVARIANT``
    (:class:`ConfigError` on a value vLLM cannot parse)."""
    if batch_invariant is None:
        batch_invariant = BATCH_INVARIANT.read().enabled
    selection = Selection(
        mode=config.mode,
        batch_invariant=batch_invariant,
        shadow=config.shadow,
        release=installed_release(),
        replay=config.replays_history(batch_invariant),
    )
    return select(selection)


@dataclass(frozen=True)
class PluginStatus:
    """What the plugin would do (a plan) or did (after :func:`register`)."""

    config: PluginConfig
    guard: GuardResult | None
    patches: tuple[Patch, ...]
    platform: PlatformCheck | None = None
    applied: bool = False
    error: str | None = None
    packed_decode: FlagValue | None = None

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
        action = f"{verb} " + describe(self.patches)
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
        elif self.packed_decode is not None and not self.packed_decode.enabled:
            action += (
                f" ({self.packed_decode.name}={self.packed_decode.raw}: vLLM runs every decode "
                "row through fused_sigmoid_gating_delta_rule_update; mixed steps are left to vLLM)"
            )
        return action

    def build(self) -> str:
        """The vLLM build (read again when the guard did not run), and the supported build
        whose fingerprints it matches when it has no table of its own."""
        if self.guard is not None and self.guard.installed is not None:
            return f"vLLM {self.guard.describe_build()}"
        installed = installed_vllm()
        return "vLLM not found" if installed is None else f"vLLM {installed.describe()}"

    def summary(self) -> str:
        """The one log line: build, configuration, action, process."""
        build = self.build()
        proc = f"pid {os.getpid()} {multiprocessing.current_process().name}"
        return f"gdn_invariant: {build}, {self.config.describe()}; {self.action()} [{proc}]"


def plan(config: PluginConfig | None = None) -> PluginStatus:
    """Decide what :func:`register` would patch, without patching anything.

    vLLM's ``VLLM_BATCH_INVARIANT`` and ``VLLM_ENABLE_FLA_PACKED_RECURRENT_DECODE`` are read
    as vLLM reads them (a value it cannot parse is a refusal, with the valid values);
    fingerprints are read from the installed files; the platform is asked of vLLM only when
    the fingerprints pass.
    """
    config = load_config() if config is None else config
    if config.installs_nothing:
        return PluginStatus(config, None, ())
    try:
        batch_invariant = BATCH_INVARIANT.read()
        packed_decode = PACKED_DECODE.read()
    except ConfigError as exc:
        return PluginStatus(config, None, (), error=str(exc))
    if config.mode is Mode.GOLDEN and not packed_decode.enabled:
        return PluginStatus(
            config, None, (), error=GOLDEN_NEEDS_PACKED_DECODE, packed_decode=packed_decode
        )
    patches = tuple(patches_for(config, batch_invariant.enabled))
    guard = check_targets(guarded_targets(patches))
    platform = check_platform() if guard.ok else None
    return PluginStatus(config, guard, patches, platform, packed_decode=packed_decode)


def register_config(config: PluginConfig) -> PluginStatus:
    """Check and patch for ``config`` (what :func:`register` does once per process), log the
    line and return the status.

    Outside strict mode nothing escapes: a refusal or any failure (planning, applying a
    patch) logs one warning line, with the build and the guard's findings, and patches
    nothing (:func:`~vllm_gdn_invariant.patches.apply_all` reverts what it installed). In
    strict mode a refusal raises :class:`UnsupportedVllmError`, a target that is not vLLM's
    own function :class:`~vllm_gdn_invariant.patches.PatchError`, and any other failure
    :class:`UnsupportedVllmError` chained to its cause.
    """
    status: PluginStatus | None = None
    try:
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
        apply_all(status.patches)
    except (UnsupportedVllmError, PatchError) as exc:
        if config.strict:
            raise
        failed = status or PluginStatus(config, None, ())
        status = dataclasses.replace(failed, error=f"failed: {exc}")
        logger.warning(status.summary())
        return status
    except Exception as exc:  # noqa: BLE001 - the plugin never takes vLLM down unasked
        cause = f"{type(exc).__name__}: {exc}"
        if config.strict:
            raise UnsupportedVllmError(
                f"gdn_invariant (VLLM_GDN_INVARIANT_STRICT=1): {cause}"
            ) from exc
        failed = status or PluginStatus(config, None, ())
        status = dataclasses.replace(failed, error=f"failed: {cause}")
        logger.warning(status.summary())
        return status
    status = dataclasses.replace(status, applied=True)
    logger.info(status.summary())
    return status


def register() -> None:
    """Entry point: configure, check, patch (:func:`register_config`). A second call in the
    same process does nothing.

    Raises :class:`~vllm_gdn_invariant.plugin.config.ConfigError` on a bad value of the
    plugin's own environment variables. Outside strict mode nothing else escapes.
    """
    global _registered
    with _lock:
        if _registered is not None:
            return
        _registered = register_config(load_config())


def registered_status() -> PluginStatus | None:
    """The status of this process's :func:`register` call, None before it."""
    return _registered
