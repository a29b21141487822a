"""The demo's decisions without an engine: when it runs batch-invariant, what it says it
compared, and its exit status for each verdict."""

from __future__ import annotations

import json
import math

import pytest

from vllm_gdn_invariant import cli
from vllm_gdn_invariant.cli import demo
from vllm_gdn_invariant.cli.demo import Completion, DemoReport, DemoSetupError


def report(alone: list[float], batched: list[float], caveat: str | None = None) -> DemoReport:
    tokens = list(range(len(alone)))
    same, bits_same, divergence, max_diff = demo.compare(
        Completion(tokens, alone), Completion(tokens, batched)
    )
    return DemoReport(
        plugin="patched",
        device="test",
        batch_invariant=True,
        compared=demo.what_is_compared(True, len(alone), "tiny", "route"),
        caveat=caveat,
        tokens_identical=same,
        logprobs_identical=bits_same,
        first_token_divergence=divergence,
        max_logprob_diff=max_diff,
        alone=Completion(tokens, alone),
        batched=Completion(tokens, batched),
    )


@pytest.mark.parametrize(
    "flag, environ, cuda, expected",
    [
        (None, {}, True, True),  # CUDA: the plugin's batch-invariant mode
        (None, {}, False, False),  # CPU: vLLM's CPU build refuses it for Qwen3-Next
        (None, {"VLLM_BATCH_INVARIANT": "0"}, True, False),
        (None, {"VLLM_BATCH_INVARIANT": "1"}, False, True),
        (False, {"VLLM_BATCH_INVARIANT": "1"}, True, False),
        (True, {}, False, True),
    ],
)
def test_batch_invariant_follows_the_flag_then_the_environment_then_the_platform(
    flag, environ, cuda, expected
):
    assert demo.choose_batch_invariant(flag, environ, cuda) is expected


def test_a_non_integer_environment_value_is_refused_by_name():
    with pytest.raises(DemoSetupError, match="VLLM_BATCH_INVARIANT='yes' is not an integer"):
        demo.choose_batch_invariant(None, {"VLLM_BATCH_INVARIANT": "yes"}, True)


def test_the_report_says_what_was_compared_and_the_cpu_caveat():
    lines = "\n".join(report([-0.5], [-0.5], caveat=demo.CPU_CAVEAT).lines())
    assert "VLLM_BATCH_INVARIANT: 1" in lines
    assert "plugin (mode route) + VLLM_BATCH_INVARIANT=1" in lines and "bit for bit" in lines
    assert "; plugin (mode golden); " in demo.what_is_compared(False, 4, "tiny", "golden")
    assert "CPU run:  vLLM's CPU build runs GDN layers through forward_cpu" in lines
    assert "CPU run" not in "\n".join(report([-0.5], [-0.5]).lines())


@pytest.mark.parametrize(
    "batched, verdict, status",
    [([-0.5, -1.25], "IDENTICAL", 0), ([-0.5, math.nextafter(-1.25, 0.0)], "DIFFERENT", 1)],
)
def test_exit_status_is_one_when_the_verdict_is_different(
    monkeypatch, tmp_path, capsys, batched, verdict, status
):
    made = report([-0.5, -1.25], batched)
    monkeypatch.setattr(demo, "run_demo", lambda *args: made)
    monkeypatch.setattr(demo, "has_cuda", lambda: False)
    out = tmp_path / "report.json"
    assert cli.main(["demo", "--json", str(out)]) == status
    assert f"target alone vs batched: {verdict}" in capsys.readouterr().out
    assert json.loads(out.read_text())["verdict"] == verdict


def test_negative_zero_logprob_is_a_difference(monkeypatch):
    made = report([0.0], [-0.0])
    monkeypatch.setattr(demo, "run_demo", lambda *args: made)
    monkeypatch.setattr(demo, "has_cuda", lambda: False)
    assert cli.main(["demo"]) == 1


def test_a_vllm_that_does_not_start_exits_one_with_its_error(monkeypatch, capsys):
    def refuse(*args):
        raise RuntimeError("No Unquantized MoE backend supports the deployment configuration")

    monkeypatch.setattr(demo, "run_demo", refuse)
    monkeypatch.setattr(demo, "has_cuda", lambda: False)
    assert cli.main(["demo", "--batch-invariant"]) == 1
    assert "vLLM did not start or serve: RuntimeError: No Unquantized MoE" in (
        capsys.readouterr().err
    )


def test_a_bad_environment_value_exits_two_before_vllm_starts(monkeypatch, capsys):
    monkeypatch.setenv("VLLM_BATCH_INVARIANT", "on")
    monkeypatch.setattr(demo, "run_demo", lambda *args: pytest.fail("vLLM started"))
    assert cli.main(["demo"]) == 2
    assert "VLLM_BATCH_INVARIANT='on' is not an integer" in capsys.readouterr().err


def test_the_attention_backend_reaches_vllms_engine_and_none_leaves_vllms_choice(
    monkeypatch, tmp_path
):
    import vllm

    seen = []

    class Refuse(Exception):
        pass

    def fake_llm(**kwargs):
        seen.append(kwargs)
        raise Refuse

    monkeypatch.setattr(vllm, "LLM", fake_llm)
    monkeypatch.setenv("VLLM_BATCH_INVARIANT", "0")  # run_demo sets both; restored after
    monkeypatch.setenv("VLLM_PLUGINS", "gdn_invariant")
    for backend in ("TRITON_ATTN", None):
        with pytest.raises(Refuse):
            demo.run_demo(str(tmp_path), 4, 0, False, backend)
    assert seen[0]["attention_backend"] == "TRITON_ATTN"
    assert "attention_backend" not in seen[1]
    captured = []
    monkeypatch.setattr(demo, "run_demo", lambda *args: captured.append(args) or report([0], [0]))
    monkeypatch.setattr(demo, "has_cuda", lambda: False)
    assert cli.main(["demo", "--attention-backend", "TRITON_ATTN"]) == 0
    assert captured[0][4] == "TRITON_ATTN"
