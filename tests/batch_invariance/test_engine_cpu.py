"""``scripts/e2e_determinism.py`` on vLLM's CPU build: the weighted tiny Qwen3-Next served
with the plugin loaded through the generated plugin site (arm 2), and arm 4 under
``VLLM_BATCH_INVARIANT=1``.

What the CPU build can and cannot show: GDN layers run ``forward_cpu`` there, and vLLM's CPU
build has no MoE backend that declares batch invariance, so under the mode it refuses the
tiny Qwen3-Next at its MoE layers, with or without the plugin, before it reaches the GDN
backend check (tested directly in ``test_selector.py``). The plugin is still loaded and
applies every batch-invariance patch in the engine core and the worker, which this test pins.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from ..conftest import requires_ci_environment

pytestmark = [pytest.mark.engine, requires_ci_environment]

BI_LABELS = ("qwen-gdn-backend", "triton-prefill", "float32-gdn-state", "chunk-grid-64")


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    out = tmp_path_factory.mktemp("e2e") / "e2e.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("VLLM_GDN_INVARIANT")}
    env.pop("VLLM_PLUGINS", None)
    proc = subprocess.run(
        [
            sys.executable,
            "scripts/e2e_determinism.py",
            "--out",
            str(out),
            "--models",
            "qwen3_next",
            "--arms",
            "2,4",
            "--settings",
            "eager",
            "--attention-backend",
            "",
            "--prefill-backend",
            "",
            "--gpu-memory-utilization",
            "0.2",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert out.exists(), proc.stdout[-3000:] + proc.stderr[-3000:]
    return {case["arm"]: case for case in json.loads(out.read_text())["cases"]}, proc


def test_the_plugin_serves_the_weighted_model_with_varying_greedy_tokens(report):
    cases, proc = report
    served = cases[2]
    assert served["refused"] is None and not served.get("error"), proc.stdout[-3000:]
    assert served["distinct_tokens_alone"] >= 16  # dummy weights would repeat one token
    assert len(served["tokens_alone"]) == 64
    assert served["tokens_identical"] and served["logprobs_identical"]  # forward_cpu
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
