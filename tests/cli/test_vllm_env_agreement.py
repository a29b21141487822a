"""vLLM's ``VLLM_BATCH_INVARIANT`` and ``VLLM_ENABLE_FLA_PACKED_RECURRENT_DECODE``: the plugin's
log line and ``doctor`` read every value as vLLM's own ``vllm.envs`` does (on, off, or a value
it cannot parse), and agree on it. An invalid value is a refusal naming the variable, the
value and the valid values; doctor exits 2 on it, without a traceback."""

from __future__ import annotations

import pytest
import vllm.envs as envs

from vllm_gdn_invariant.cli import doctor, main
from vllm_gdn_invariant.plugin import entry
from vllm_gdn_invariant.plugin.config import PluginConfig
from vllm_gdn_invariant.plugin.platform import PlatformCheck
from vllm_gdn_invariant.plugin.vllm_env import BATCH_INVARIANT, PACKED_DECODE

from ..conftest import requires_ci_environment

pytestmark = requires_ci_environment

VALUES = [None, "0", "1", "2", "-1", " 1 ", "00", "+0", "1_0", "yes", "true", "", "1.0", "0x1"]
FLAGS = {BATCH_INVARIANT.name: ("invariance", BATCH_INVARIANT),
         PACKED_DECODE.name: ("packed decode", PACKED_DECODE)}  # fmt: skip
CUDA = PlatformCheck("CudaPlatform", "cuda")


def vllms_reading(name: str) -> str:
    """What vLLM itself makes of the variable: "on", "off" or "invalid"."""
    try:
        return "on" if getattr(envs, name) else "off"
    except ValueError:
        return "invalid"


def plugins_reading(name: str, line: str) -> str:
    value = BATCH_INVARIANT if name == BATCH_INVARIANT.name else PACKED_DECODE
    if f"nothing patched: {name}=" in line:
        assert "is not valid; valid values: an integer" in line
        return "invalid"
    assert line.count("would patch ") == 1, line
    if value is BATCH_INVARIANT:
        return "on" if "; VLLM_BATCH_INVARIANT=1: qwen-gdn-backend" in line else "off"
    return "off" if f"({name}=" in line and "fused_sigmoid_gating" in line else "on"


def doctors_reading(label: str, out: str) -> str:
    (text,) = [s for s in out.splitlines() if s.startswith(f"{label}:")]
    text = text[len(label) + 1 :].strip()
    for state in ("on", "off"):
        if text.startswith(f"{state} ("):
            return state
    assert text.startswith("INVALID: "), text
    return "invalid"


def field(out: str, label: str) -> str:
    (text,) = [s for s in out.splitlines() if s.startswith(f"{label}:")]
    return text[len(label) + 1 :].strip()


@pytest.fixture
def on_cuda(monkeypatch):
    monkeypatch.setattr(entry, "check_platform", lambda: CUDA)
    monkeypatch.setattr(doctor, "read_platform", lambda: (CUDA, None))
    for name in FLAGS:
        monkeypatch.delenv(name, raising=False)
    for name in (
        "VLLM_GDN_INVARIANT_MODE",
        "VLLM_GDN_INVARIANT_STRICT",
        "VLLM_GDN_INVARIANT_SHADOW",
    ):
        monkeypatch.delenv(name, raising=False)


@pytest.mark.parametrize("name", FLAGS)
@pytest.mark.parametrize("value", VALUES, ids=[repr(v) for v in VALUES])
def test_the_plugins_line_and_doctor_read_the_value_as_vllm_does(
    on_cuda, monkeypatch, capsys, name, value
):
    label, flag = FLAGS[name]
    if value is not None:
        monkeypatch.setenv(name, value)
    want = vllms_reading(name)
    line = entry.plan(PluginConfig()).summary()
    capsys.readouterr()
    code = main(["doctor"], prog="vllm-gdn-invariant")
    captured = capsys.readouterr()
    out = captured.out
    assert "Traceback" not in out + captured.err
    assert plugins_reading(name, line) == want, line
    assert doctors_reading(label, out) == want, out
    if want == "invalid":
        message = f"{name}={value!r} is not valid; valid values: {flag.choices}"
        assert f"nothing patched: {message}" in line
        assert field(out, label) == f"INVALID: {message}"
        assert field(out, "verdict") == f"REFUSE (patch nothing): {message}"
        assert code == 2
    else:
        assert code == 0, out
        assert field(out, "verdict") == line.split("; ", 1)[1].rsplit(" [pid", 1)[0]


def test_strict_mode_raises_on_a_value_vllm_cannot_parse(monkeypatch):
    monkeypatch.setenv(BATCH_INVARIANT.name, "yes")
    with pytest.raises(entry.UnsupportedVllmError, match="VLLM_BATCH_INVARIANT='yes' is not valid"):
        entry.register_config(PluginConfig(strict=True))
