"""What decides which patches apply: the plugin's mode, ``VLLM_BATCH_INVARIANT``, the shadow
checker's setting and the vLLM release.

:class:`Selection` holds those for one process; each entry of the patch index
(``patches/__init__.py``) says :class:`When` it applies, and each :class:`~.base.Patch` may
name the first release it applies to (``since``). This module imports nothing from vLLM.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from packaging.version import InvalidVersion, Version

if TYPE_CHECKING:
    from vllm_gdn_invariant.patches.base import Patch
    from vllm_gdn_invariant.shadow.config import ShadowConfig


class Mode(str, enum.Enum):
    """What the plugin installs (``VLLM_GDN_INVARIANT_MODE``).

    ``route``: mixed-step decode rows run vLLM's decode-only kernels.
    ``golden``: as ``route``, and every non-speculative decode row runs the golden arithmetic
    (the golden-matched kernels on CUDA, the goldens on vLLM's CPU build).
    ``off``: nothing is patched (but the shadow checker, when it is on).
    """

    ROUTE = "route"
    GOLDEN = "golden"
    OFF = "off"


PATCHING_MODES = frozenset({Mode.ROUTE, Mode.GOLDEN})


@dataclass(frozen=True)
class Selection:
    """One process's answers: the mode, whether vLLM's ``VLLM_BATCH_INVARIANT`` is on, the
    shadow checker's setting (None or off: no checker) and the vLLM release (None: the
    patches of every release)."""

    mode: Mode = Mode.ROUTE
    batch_invariant: bool = False
    shadow: ShadowConfig | None = None
    release: str | None = None
    replay: bool = False  # recomputed requests replay their history (PluginConfig.replays_history)

    @property
    def shadow_on(self) -> bool:
        return self.shadow is not None and self.shadow.enabled


@dataclass(frozen=True)
class When:
    """When an index entry applies: in ``modes``, and only under ``VLLM_BATCH_INVARIANT=1``
    (``batch_invariant``), only with the shadow checker on (``shadow``) or only where
    recomputed requests replay their history (``replay``)."""

    modes: frozenset[Mode] = PATCHING_MODES
    batch_invariant: bool = False
    shadow: bool = False
    replay: bool = False

    def holds(self, selection: Selection) -> bool:
        return (
            selection.mode in self.modes
            and (selection.batch_invariant or not self.batch_invariant)
            and (selection.shadow_on or not self.shadow)
            and (selection.replay or not self.replay)
        )

    def describe(self) -> str:
        if self.modes == frozenset(Mode):
            modes = "in every mode"
        else:
            names = [m.value for m in Mode if m in self.modes]
            modes = ("modes " if len(names) > 1 else "mode ") + " and ".join(names)
        if self.shadow:
            return f"with VLLM_GDN_INVARIANT_SHADOW on, {modes}"
        if self.replay:
            return (
                "modes route and golden, with VLLM_BATCH_INVARIANT=1, and mode golden; with "
                "VLLM_GDN_INVARIANT_REPLAY=on"
            )
        if self.batch_invariant:
            return f"{modes}, with VLLM_BATCH_INVARIANT=1"
        return modes


def in_release(patch: Patch, release: str | None) -> bool:
    """Whether ``patch`` applies to vLLM ``release`` (None, or a version that does not parse:
    every patch)."""
    if patch.since is None or release is None:
        return True
    try:
        return Version(release) >= Version(patch.since)
    except InvalidVersion:
        return True


def describe_since(patches: Iterable[Patch]) -> str:
    """The releases the patches apply to, in words ("" when every one applies everywhere)."""
    patches = list(patches)
    since = {p.since for p in patches}
    if since == {None}:
        return ""
    if len(since) == 1:
        return f"from vLLM {since.pop()}"
    return "; ".join(f"{p.where} from vLLM {p.since}" for p in patches if p.since is not None)
