"""The routing suite on the Python code of every supported vLLM release.

Each release runs in its own interpreter (``overlay.release_env``): vLLM's real metadata
builder, ``_forward_core`` and checkpoint code of that release, the plugin's guard and patch,
and CPU stand-ins for the kernels. Two releases run at a time (the CI machine has 2 cores).
"""

from __future__ import annotations

import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest
from packaging.version import Version

from vllm_gdn_invariant.plugin.versions import SUPPORTED_VERSIONS

from .overlay import ROOT, release_env, release_tree

# the first test downloads missing wheels, extracts them and runs every release's suite
# (~1-3 min each, two at a time)
pytestmark = [pytest.mark.wheels, pytest.mark.timeout(3600)]

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


@pytest.fixture(scope="module")
def suite_runs() -> dict[str, subprocess.CompletedProcess]:
    for version in SUPPORTED_VERSIONS:
        release_tree(version)  # extract serially; the runs then only read
    with ThreadPoolExecutor(max_workers=2) as pool:
        runs = pool.map(run_suite, SUPPORTED_VERSIONS)
        return dict(zip(SUPPORTED_VERSIONS, runs, strict=True))


@pytest.mark.parametrize("version", SUPPORTED_VERSIONS)
def test_routing_suite_passes_on_the_release(suite_runs, version):
    proc = suite_runs[version]
    summary = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else ""
    detail = f"vLLM {version}: {summary}\n{proc.stdout[-6000:]}{proc.stderr[-3000:]}"
    assert proc.returncode == 0, detail
    assert " passed" in summary, detail
    # Only the checkpoint tests may skip, and only where the release has no checkpoint plans.
    has_checkpoint_plans = Version(version) >= Version("0.33.0")
    assert ("skipped" in summary) != has_checkpoint_plans, detail
