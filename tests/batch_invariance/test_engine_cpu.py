"""``scripts/e2e_determinism.py`` on vLLM's CPU build: the weighted tiny Qwen3-Next served
with the plugin loaded through the generated plugin site (arm 2), and arm 4 under
``VLLM_BATCH_INVARIANT=1``.

What the CPU build can and cannot show: GDN layers run ``forward_cpu`` there, and vLLM's CPU
build has no MoE backend that declares batch invariance, so under the mode it refuses the
tiny Qwen3-Next at its MoE layers, with or without the plugin, before it reaches the GDN
backend check (tested directly in ``test_selector.py``). The plugin is still loaded and
applies every batch-invariance patch in the engine core and the worker, which this test pins.

The script runs both arms at tensor parallel 2 where the machine has two CPUs (two CPU
workers, threads bound one group per rank; the plugin patches every rank), else at 1.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from ..conftest import requires_ci_environment

# the module's engine runs take ~2.5-4 min on the 2-core CI machine
pytestmark = [pytest.mark.engine, requires_ci_environment, pytest.mark.timeout(1200)]

BI_LABELS = ("qwen-gdn-backend", "triton-prefill", "float32-gdn-state", "chunk-grid-64")


def run_script(out, arms: str, *extra: str) -> tuple[dict, subprocess.CompletedProcess]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("VLLM_GDN_INVARIANT")}
    env.pop("VLLM_PLUGINS", None)
    env.pop("VLLM_CPU_OMP_THREADS_BIND", None)
    proc = subprocess.run(
        [
            sys.executable,
            "scripts/e2e_determinism.py",
            "--out",
            str(out),
            "--models",
            "qwen3_next",
            "--arms",
            arms,
            "--settings",
            "eager",
            "--attention-backend",
            "",
            "--prefill-backend",
            "",
            "--gpu-memory-utilization",  # of RAM per CPU rank, zeroed at start
            "0.08",
            *extra,
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert out.exists(), proc.stdout[-3000:] + proc.stderr[-3000:]
    data = json.loads(out.read_text())
    return {case["arm"]: case for case in data["cases"]}, proc


# Two CPU ranks where the machine has two CPUs (one engine run per arm serves every test).
TENSOR_PARALLEL = 2 if len(os.sched_getaffinity(0)) >= 2 else 1


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    out = tmp_path_factory.mktemp("e2e") / "e2e.json"
    return run_script(out, "2,4", "--tensor-parallel-size", str(TENSOR_PARALLEL))


def test_the_plugin_serves_the_weighted_model_with_varying_greedy_tokens(report):
    cases, proc = report
    served = cases[2]
    assert served["refused"] is None and not served.get("error"), proc.stdout[-3000:]
    assert served["distinct_tokens_alone"] >= 16  # dummy weights would repeat one token
    assert len(served["tokens_alone"]) == len(served["tokens_batched"]) == 64
    # Alone vs batched bits are not asserted here: outside the GDN layers vLLM's CPU build is
    # not batch-invariant (its MoE and attention take the batch as it comes), and a fresh-clone
    # CI run saw them differ once after several identical runs.
    assert isinstance(served["tokens_identical"], bool)
    processes = " ".join(served["plugin_log"])
    assert "EngineCore" in processes and "Worker" in processes
    assert "VLLM_BATCH_INVARIANT=1" not in processes


def test_under_batch_invariant_mode_every_engine_process_applies_the_patches(report):
    cases, _ = report
    refused = cases[4]
    assert "No Unquantized MoE backend supports the deployment configuration" in (
        refused["refused"] or ""
    )
    lines = [line for line in refused["plugin_log"] if "VLLM_BATCH_INVARIANT=1:" in line]
    assert any("EngineCore" in line for line in lines)
    assert any("Worker" in line for line in lines)
    for label in BI_LABELS:
        assert all(label in line for line in lines), label


@pytest.mark.skipif(TENSOR_PARALLEL < 2, reason="two CPU ranks need two CPUs")
def test_tensor_parallel_two_runs_with_the_plugin_on_every_rank(report):
    cases, proc = report
    for arm in (2, 4):
        assert cases[arm]["tensor_parallel_size"] == 2
        processes = " ".join(cases[arm]["plugin_log"])
        for process in ("EngineCore", "VllmWorker-0", "VllmWorker-1"):
            assert process in processes, cases[arm]["plugin_log"]
    served = cases[2]
    assert served["refused"] is None and not served.get("error"), proc.stdout[-3000:]
    assert len(served["tokens_alone"]) == len(served["tokens_batched"]) == 64
    assert "tp2:" in proc.stdout
