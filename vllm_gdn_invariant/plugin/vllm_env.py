"""vLLM's own environment variables that decide what the plugin does, read as vLLM reads them.

Every supported vLLM (0.26-0.34, ``vllm/envs.py``) reads both as
``bool(int(os.getenv(NAME, default)))``:

* ``VLLM_BATCH_INVARIANT`` (default ``0``): on, the plugin adds the batch-invariance
  patches (``patches/bi_*.py``);
* ``VLLM_ENABLE_FLA_PACKED_RECURRENT_DECODE`` (default ``1``): off, vLLM runs every decode row
  through one kernel, so no step is routed, and mode golden is refused.

A value ``int`` cannot parse (``yes``, ``true``, ``1.0``, an empty string) makes vLLM raise
``ValueError`` where it reads it; :meth:`VllmFlag.read` raises
:class:`~vllm_gdn_invariant.plugin.config.ConfigError` for it, naming the variable, the value
and the valid values. The plugin's log line and ``doctor`` both read them here.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from vllm_gdn_invariant.plugin.config import ConfigError


@dataclass(frozen=True)
class FlagValue:
    """One variable as found: its raw text (None: unset) and what vLLM makes of it."""

    name: str
    raw: str | None
    enabled: bool

    def describe(self) -> str:
        """``NAME=value`` (or ``NAME unset``), with on/off."""
        state = "on" if self.enabled else "off"
        if self.raw is None:
            return f"{state} ({self.name} unset)"
        return f"{state} ({self.name}={self.raw})"


@dataclass(frozen=True)
class VllmFlag:
    """A boolean variable of vLLM's ``envs.py``: ``bool(int(os.getenv(name, default)))``."""

    name: str
    default: str

    @property
    def choices(self) -> str:
        return (
            f"an integer, as vLLM reads it with bool(int(value)): 0 off, any other integer on "
            f"(unset: {self.default})"
        )

    def read(self, environ: Mapping[str, str] | None = None) -> FlagValue:
        """The variable's value; :class:`ConfigError` when vLLM could not parse it."""
        env = os.environ if environ is None else environ
        raw = env.get(self.name)
        try:
            enabled = bool(int(self.default if raw is None else raw))
        except ValueError:
            raise ConfigError(self.name, str(raw), self.choices) from None
        return FlagValue(self.name, raw, enabled)


BATCH_INVARIANT = VllmFlag("VLLM_BATCH_INVARIANT", "0")
PACKED_DECODE = VllmFlag("VLLM_ENABLE_FLA_PACKED_RECURRENT_DECODE", "1")
