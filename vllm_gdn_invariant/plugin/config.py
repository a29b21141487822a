"""Configuration of the plugin, read once from environment variables.

| variable | values | default |
| --- | --- | --- |
| ``VLLM_GDN_INVARIANT_MODE`` | ``route``, ``golden``, ``off`` | ``route`` |
| ``VLLM_GDN_INVARIANT_STRICT`` | ``0``, ``1`` | ``0`` |
| ``VLLM_GDN_INVARIANT_SHADOW`` | ``off``, ``0``, ``<rate>[,option=value...]`` | ``off`` |
| ``VLLM_GDN_INVARIANT_REPLAY`` | ``on``, ``off`` | ``on`` |

A bad value raises :class:`ConfigError`, whose message names the variable, the value and the
valid choices. The modes are :class:`~vllm_gdn_invariant.patches.selection.Mode` (they select
the patches); the shadow setting's grammar and checks (a writable output folder among them)
are in ``vllm_gdn_invariant/shadow/config.py``. vLLM's own variables the plugin reads are in
``vllm_env.py``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from vllm_gdn_invariant.patches.selection import Mode
from vllm_gdn_invariant.shadow.config import ShadowConfig, ShadowSettingError, parse_shadow

MODE_ENV = "VLLM_GDN_INVARIANT_MODE"
STRICT_ENV = "VLLM_GDN_INVARIANT_STRICT"
SHADOW_ENV = "VLLM_GDN_INVARIANT_SHADOW"
REPLAY_ENV = "VLLM_GDN_INVARIANT_REPLAY"
ENV_NAMES = (MODE_ENV, STRICT_ENV, SHADOW_ENV, REPLAY_ENV)


class ConfigError(ValueError):
    """An environment variable the plugin reads holds a value it does not accept."""

    def __init__(self, name: str, value: str, choices: str) -> None:
        super().__init__(f"{name}={value!r} is not valid; valid values: {choices}")
        self.name = name
        self.value = value
        self.choices = choices


@dataclass(frozen=True)
class PluginConfig:
    """``replay``: a preempted request's recomputed history is replayed through the decode
    path where that applies (:meth:`replays_history`)."""

    mode: Mode = Mode.ROUTE
    strict: bool = False
    shadow: ShadowConfig = ShadowConfig()
    replay: bool = True

    def describe(self) -> str:
        return (
            f"mode={self.mode.value} strict={int(self.strict)} "
            f"shadow={self.shadow.describe()} replay={'on' if self.replay else 'off'}"
        )

    def replays_history(self, batch_invariant: bool) -> bool:
        """Whether recomputed requests replay their history: replay on, with
        ``VLLM_BATCH_INVARIANT=1`` in modes route and golden, or in mode golden."""
        if not self.replay or self.mode is Mode.OFF:
            return False
        return batch_invariant or self.mode is Mode.GOLDEN

    @property
    def installs_nothing(self) -> bool:
        """Mode off without the shadow checker: nothing to patch."""
        return self.mode is Mode.OFF and not self.shadow.enabled


def parse_mode(value: str) -> Mode:
    text = value.strip().lower()
    choices = " | ".join(m.value for m in Mode)
    try:
        return Mode(text)
    except ValueError:
        raise ConfigError(MODE_ENV, value, choices) from None


def parse_strict(value: str) -> bool:
    text = value.strip()
    if text not in ("0", "1"):
        raise ConfigError(STRICT_ENV, value, "0 | 1")
    return text == "1"


def parse_replay(value: str) -> bool:
    text = value.strip().lower()
    if text not in ("on", "off"):
        raise ConfigError(REPLAY_ENV, value, "on | off")
    return text == "on"


def load_shadow(value: str) -> ShadowConfig:
    """The shadow checker's setting (shadow/config.py); a bad one raises :class:`ConfigError`."""
    try:
        return parse_shadow(value)
    except ShadowSettingError as exc:
        raise ConfigError(SHADOW_ENV, value, exc.choices) from None


def load_config(environ: Mapping[str, str] | None = None) -> PluginConfig:
    """Parse the plugin's environment variables; raise :class:`ConfigError` on a bad value."""
    env = os.environ if environ is None else environ
    shadow = load_shadow(env.get(SHADOW_ENV, "off"))
    return PluginConfig(
        mode=parse_mode(env.get(MODE_ENV, Mode.ROUTE.value)),
        strict=parse_strict(env.get(STRICT_ENV, "0")),
        shadow=shadow,
        replay=parse_replay(env.get(REPLAY_ENV, "on")),
    )
