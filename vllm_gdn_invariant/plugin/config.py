"""Configuration of the plugin, read once from environment variables.

| variable | values | default |
| --- | --- | --- |
| ``VLLM_GDN_INVARIANT_MODE`` | ``route``, ``golden``, ``off`` | ``route`` |
| ``VLLM_GDN_INVARIANT_STRICT`` | ``0``, ``1`` | ``0`` |
| ``VLLM_GDN_INVARIANT_SHADOW`` | ``off`` or ``<rate>[,out=<path>][,seed=<int>]`` | ``off`` |

A bad value raises :class:`ConfigError`, whose message names the variable, the value and the
valid choices.
"""

from __future__ import annotations

import enum
import os
from collections.abc import Mapping
from dataclasses import dataclass

MODE_ENV = "VLLM_GDN_INVARIANT_MODE"
STRICT_ENV = "VLLM_GDN_INVARIANT_STRICT"
SHADOW_ENV = "VLLM_GDN_INVARIANT_SHADOW"
ENV_NAMES = (MODE_ENV, STRICT_ENV, SHADOW_ENV)

DEFAULT_SHADOW_OUT = "gdn_invariant_shadow.jsonl"


class ConfigError(ValueError):
    """An environment variable of the plugin holds a value it does not accept."""

    def __init__(self, name: str, value: str, choices: str) -> None:
        super().__init__(f"{name}={value!r} is not valid; valid values: {choices}")
        self.name = name
        self.value = value
        self.choices = choices


class Mode(str, enum.Enum):
    """What the plugin installs.

    ``route``: mixed-step decode rows run vLLM's decode-only kernels.
    ``golden``: as ``route``, and every non-speculative decode row runs the golden arithmetic.
    ``off``: nothing is patched.
    """

    ROUTE = "route"
    GOLDEN = "golden"
    OFF = "off"


@dataclass(frozen=True)
class ShadowConfig:
    """Shadow sampling: the fraction of decode rows re-checked against the goldens."""

    rate: float
    out: str = DEFAULT_SHADOW_OUT
    seed: int = 0


@dataclass(frozen=True)
class PluginConfig:
    mode: Mode = Mode.ROUTE
    strict: bool = False
    shadow: ShadowConfig | None = None

    def describe(self) -> str:
        shadow = "off"
        if self.shadow is not None:
            shadow = f"rate={self.shadow.rate:g},out={self.shadow.out},seed={self.shadow.seed}"
        return f"mode={self.mode.value} strict={int(self.strict)} shadow={shadow}"


_SHADOW_CHOICES = "off | 0 | <rate in (0, 1]>[,out=<jsonl path>][,seed=<int>]"


def parse_mode(value: str) -> Mode:
    try:
        return Mode(value.strip().lower())
    except ValueError:
        raise ConfigError(MODE_ENV, value, " | ".join(m.value for m in Mode)) from None


def parse_strict(value: str) -> bool:
    text = value.strip()
    if text not in ("0", "1"):
        raise ConfigError(STRICT_ENV, value, "0 | 1")
    return text == "1"


def parse_shadow(value: str) -> ShadowConfig | None:
    text = value.strip()
    if text.lower() in ("", "0", "off"):
        return None
    head, *options = [part.strip() for part in text.split(",")]
    if head.startswith("rate="):
        head = head[len("rate=") :]
    try:
        rate = float(head)
    except ValueError:
        raise ConfigError(SHADOW_ENV, value, _SHADOW_CHOICES) from None
    if not 0.0 < rate <= 1.0:
        raise ConfigError(SHADOW_ENV, value, _SHADOW_CHOICES)
    fields: dict[str, str] = {}
    for option in options:
        key, sep, val = option.partition("=")
        if not sep or key not in ("out", "seed") or key in fields or not val:
            raise ConfigError(SHADOW_ENV, value, _SHADOW_CHOICES)
        fields[key] = val
    try:
        seed = int(fields.get("seed", "0"))
    except ValueError:
        raise ConfigError(SHADOW_ENV, value, _SHADOW_CHOICES) from None
    return ShadowConfig(rate=rate, out=fields.get("out", DEFAULT_SHADOW_OUT), seed=seed)


def load_config(environ: Mapping[str, str] | None = None) -> PluginConfig:
    """Parse the plugin's environment variables; raise :class:`ConfigError` on a bad value."""
    env = os.environ if environ is None else environ
    return PluginConfig(
        mode=parse_mode(env.get(MODE_ENV, Mode.ROUTE.value)),
        strict=parse_strict(env.get(STRICT_ENV, "0")),
        shadow=parse_shadow(env.get(SHADOW_ENV, "off")),
    )
