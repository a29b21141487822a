"""The routing suite on the Python code of every supported vLLM release.

Each release runs in its own interpreter (``overlay.release_env``): vLLM's real metadata
builder, ``_forward_core`` and checkpoint code of that release, the plugin's guard and patch,
and CPU stand-ins for the kernels. One test per release, so that pytest-xdist's workers share
them out.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
from packaging.version import Version

from vllm_gdn_invariant.plugin.versions import SUPPORTED_VERSIONS

from .overlay import ROOT, release_env

# each test downloads its release's wheel if missing, extracts it and runs the suite (~40 s)
pytestmark = [pytest.mark.wheels, pytest.mark.timeout(1500)]

SUITE = (
    "tests/releases/test_release_identity.py",
    "tests/routing/test_routing_cpu.py",
    "tests/routing/test_checkpoint_routing.py",
    "tests/routing/test_history_replay_cpu.py",
    "tests/batch_invariance/test_selector.py",
    "tests/batch_invariance/test_prefill_backend.py",
    "tests/batch_invariance/test_ssm_state.py",
    "tests/batch_invariance/test_chunk_grid.py",
    "tests/batch_invariance/test_history_scheduler.py",
    "tests/batch_invariance/test_history_cache_key.py",
    "tests/batch_invariance/test_cache_hit.py",
    "tests/batch_invariance/test_autotune_pin.py",
    "tests/batch_invariance/test_align_block.py",
    "tests/batch_invariance/test_gated_norm.py",
    "tests/batch_invariance/test_packed_decode_tile.py",
)


def run_suite(version: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-W", "ignore", *SUITE],
        env=release_env(version),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=1200,
    )


@pytest.mark.parametrize("version", SUPPORTED_VERSIONS)
def test_routing_suite_passes_on_the_release(version):
    proc = run_suite(version)
    summary = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else ""
    detail = f"vLLM {version}: {summary}\n{proc.stdout[-6000:]}{proc.stderr[-3000:]}"
    assert proc.returncode == 0, detail
    assert " passed" in summary, detail
    # Only the checkpoint tests may skip, and only where the release has no checkpoint plans.
    has_checkpoint_plans = Version(version) >= Version("0.33.0")
    assert ("skipped" in summary) != has_checkpoint_plans, detail
