"""Load the plugin in every vLLM process when the package is not pip-installed.

vLLM finds general plugins with ``importlib.metadata.entry_points(group="vllm.general_plugins")``
in every process it starts (the ``LLM`` process, the engine core, the workers) and runs the
ones ``VLLM_PLUGINS`` names. ``importlib.metadata`` reads ``*.dist-info`` folders on
``sys.path``. On the GPU machine the project is only on ``PYTHONPATH`` (the engine bundle), so
there is no installed distribution and no entry point. :func:`plugin_site` writes a minimal
``vllm_gdn_invariant_e2e_plugins-<version>.dist-info`` (``METADATA`` and ``entry_points.txt``)
into a folder (a name of its own: a ``vllm_gdn_invariant.egg-info`` in the working directory,
which comes first on ``sys.path``, would hide a dist-info of the package's own name).
:func:`engine_env` puts that folder and the project root on ``PYTHONPATH`` and sets
``VLLM_PLUGINS``. Every process vLLM then starts, spawned or forked, finds the entry point the
way it finds an installed plugin: vLLM's own supported mechanism, nothing patched to get there.

Besides ``gdn_invariant`` the folder declares the negative controls of
``gdn_evidence.e2e.controls`` (never installed with the package).
"""

from __future__ import annotations

import importlib.metadata
import os
from collections.abc import Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DIST_NAME = "vllm_gdn_invariant_e2e_plugins"
PLUGIN = "gdn_invariant"
CONTROL_WITHOUT_ROUTING = "gdn_invariant_without_routing"
# NVLink multicast off in every engine process: on a shared host of several GPUs, a program
# that uses it can put the GPUs out of service for others (the GPU machine's README).
MULTICAST_OFF = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}
ENTRY_POINTS = {
    PLUGIN: "vllm_gdn_invariant.plugin.entry:register",
    CONTROL_WITHOUT_ROUTING: "gdn_evidence.e2e.controls:register_without_routing",
}


def plugin_site(folder: str | Path) -> Path:
    """Write the dist-info that declares the entry points into ``folder``; return ``folder``."""
    from vllm_gdn_invariant import __version__

    version = __version__ if "unknown" not in __version__ else "0.0.0"
    site = Path(folder)
    info = site / f"{DIST_NAME}-{version}.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: vllm-gdn-invariant-e2e-plugins\nVersion: {version}\n",
        encoding="utf-8",
    )
    lines = [f"{name} = {value}" for name, value in ENTRY_POINTS.items()]
    (info / "entry_points.txt").write_text(
        "[vllm.general_plugins]\n" + "\n".join(lines) + "\n", encoding="utf-8"
    )
    return site


def installed_entry_point() -> bool:
    """Whether ``gdn_invariant`` is already an installed entry point (``pip install``)."""
    return any(
        ep.name == PLUGIN for ep in importlib.metadata.entry_points(group="vllm.general_plugins")
    )


def engine_env(base: Mapping[str, str], plugins: list[str], site: Path | None) -> dict[str, str]:
    """The environment of a process that starts vLLM with ``plugins`` (names of
    :data:`ENTRY_POINTS`; empty: none). ``site`` (from :func:`plugin_site`) and the project
    root go first on ``PYTHONPATH`` so that vLLM's processes find the entry points. NVLink
    multicast is off (:data:`MULTICAST_OFF`), whatever ``base`` says."""
    env = {k: v for k, v in base.items() if not k.startswith("VLLM_GDN_INVARIANT")}
    paths = [str(ROOT)] if site is None else [str(site), str(ROOT)]
    if base.get("PYTHONPATH"):
        paths.append(base["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(paths)
    # An empty VLLM_PLUGINS loads no general plugin (vLLM splits it on commas).
    env["VLLM_PLUGINS"] = ",".join(plugins)
    env.update(MULTICAST_OFF)
    return env
