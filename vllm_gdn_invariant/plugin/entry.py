"""The ``vllm.general_plugins`` entry point ``gdn_invariant``.

vLLM calls :func:`register` in every process it starts (API server, engine core, workers,
the model-inspection subprocess). It reads the configuration, checks the installed vLLM
build and the source fingerprint of every function it touches, then patches all or nothing
and logs one line saying what it did.
"""

from __future__ import annotations

import dataclasses
import logging
import multiprocessing
import os
import sys
import threading
from dataclasses import dataclass

from vllm_gdn_invariant.patches import MethodPatch, PatchError, apply_all, patches_for
from vllm_gdn_invariant.plugin.config import Mode, PluginConfig, load_config
from vllm_gdn_invariant.plugin.versions import GuardResult, check_targets

logger = logging.getLogger("vllm_gdn_invariant")

PACKED_DECODE_ENV = "VLLM_ENABLE_FLA_PACKED_RECURRENT_DECODE"

_lock = threading.Lock()
_registered: PluginStatus | None = None


class UnsupportedVllmError(RuntimeError):
    """Strict mode: the installed vLLM build or its source is not one the plugin knows."""


@dataclass(frozen=True)
class PluginStatus:
    """What the plugin would do (a plan) or did (after :func:`register`)."""

    config: PluginConfig
    guard: GuardResult | None
    patches: tuple[MethodPatch, ...]
    applied: bool = False
    patch_error: str | None = None

    @property
    def packed_decode(self) -> bool:
        """vLLM's ``VLLM_ENABLE_FLA_PACKED_RECURRENT_DECODE`` (default on); parsed as vLLM does."""
        try:
            return bool(int(os.environ.get(PACKED_DECODE_ENV, "1")))
        except ValueError:
            return True

    @property
    def refusal(self) -> str | None:
        if self.config.mode is Mode.OFF:
            return None
        if self.patch_error is not None:
            return self.patch_error
        return None if self.guard is None else self.guard.refusal

    @property
    def will_patch(self) -> bool:
        return self.config.mode is not Mode.OFF and self.refusal is None

    def action(self) -> str:
        """What the plugin did or would do, in words."""
        if self.config.mode is Mode.OFF:
            return "nothing patched (mode off)"
        if self.refusal is not None:
            return f"nothing patched: {self.refusal}"
        verb = "patched" if self.applied else "would patch"
        action = f"{verb} " + ", ".join(p.name for p in self.patches)
        if self.config.mode is Mode.GOLDEN:
            action += (
                " (mode golden: the golden-matched kernels are not in this release, so decode"
                " rows run vLLM's decode-only kernels exactly as in mode route)"
            )
        if not self.packed_decode:
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
    """Decide what :func:`register` would patch, without patching anything."""
    config = load_config() if config is None else config
    if config.mode is Mode.OFF:
        return PluginStatus(config, None, ())
    patches = tuple(patches_for(config))
    targets = [(p.target, "replaced") for p in patches]
    targets += [(t, "relied on") for p in patches for t in p.relies_on]
    return PluginStatus(config, check_targets(targets), patches)


def configure_logging() -> None:
    """Give the package logger a stderr handler at INFO unless logging is configured."""
    if logger.handlers or logging.getLogger().handlers:
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        logging.Formatter("%(levelname)s %(asctime)s [%(name)s] %(message)s", "%m-%d %H:%M:%S")
    )
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False


def register() -> None:
    """Entry point: configure, check, patch. A second call in the same process does nothing.

    Raises :class:`~vllm_gdn_invariant.plugin.config.ConfigError` on a bad environment
    variable and, in strict mode, :class:`UnsupportedVllmError` on an unknown build or source
    and :class:`~vllm_gdn_invariant.patches.PatchError` when a target is not vLLM's own method.
    Outside strict mode those log one warning line and patch nothing.
    """
    global _registered
    with _lock:
        if _registered is not None:
            return
        configure_logging()
        status = plan()
        if status.refusal is not None:
            if status.config.strict:
                raise UnsupportedVllmError(
                    f"gdn_invariant (VLLM_GDN_INVARIANT_STRICT=1): {status.refusal}"
                )
            logger.warning(status.summary())
        elif status.will_patch:
            try:
                apply_all(status.patches)
            except PatchError as exc:
                if status.config.strict:
                    raise
                status = dataclasses.replace(status, patch_error=str(exc))
                logger.warning(status.summary())
            else:
                status = dataclasses.replace(status, applied=True)
                level = logging.WARNING if status.config.mode is Mode.GOLDEN else logging.INFO
                logger.log(level, status.summary())
        else:
            logger.info(status.summary())
        _registered = status


def registered_status() -> PluginStatus | None:
    """The status of this process's :func:`register` call, None before it."""
    return _registered
