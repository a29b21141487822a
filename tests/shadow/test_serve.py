"""A real ``vllm serve`` (vLLM's CPU build, tiny Qwen3-Next, the plugin) with the shadow
checker at rate 1.0, beside the same server with it off, answering the same concurrent
completion requests over loopback: ``served``, one run of the pair for the whole session
(tests/serving.py; tests/engine/test_serve.py reads the server with it off).

The tests read the JSONL records, ``/metrics``, ``report``, the served tokens, the golden
reference against vLLM's CPU kernels, and a failure injected into the shadow path (the first
golden reference call of each process raises, through a ``sitecustomize`` on the server's
``PYTHONPATH``). Mode golden needs its own server.
"""

from __future__ import annotations

import concurrent.futures
import json
import re
import subprocess
import sys
import time

import pytest
import torch

from vllm_gdn_invariant.models.tiny import write_tiny_model
from vllm_gdn_invariant.shadow.record import read_records

from ..conftest import requires_ci_environment
from ..serving import (
    MAX_TOKENS,
    PROMPT_WORDS,
    START_TIMEOUT_S,
    Served,
    Server,
    plugin_env,
    prompts,
)

# the first test to read ``served`` starts the pair of servers (~1.5-3 min)
pytestmark = [pytest.mark.engine, requires_ci_environment, pytest.mark.timeout(1200)]

GDN_LAYERS = [f"model.layers.{i}.linear_attn" for i in range(3)]  # layer 3 is full attention
FIELDS = ("output", "recurrent_state", "conv_state")


def checks(served: Served, reference: str | None = None) -> list[dict]:
    return [
        r for r in served.records if r["kind"] == "check" and reference in (None, r["reference"])
    ]


def test_served_tokens_and_logprobs_are_bitwise_those_of_shadow_off(served):
    on, off = served["on"].completions, served["off"].completions
    assert [c["text"] for c in on] == [c["text"] for c in off]
    assert json.dumps([c["logprobs"] for c in on]) == json.dumps([c["logprobs"] for c in off])
    assert all(len(c["logprobs"]) == MAX_TOKENS for c in on)


def cpu_ssm_state_dtype() -> str:
    """The recurrent state dtype vLLM's CPU build gives the tiny model (bfloat16 weights, the
    cache dtype "auto"): float32 where its accelerated GDN backend runs (AVX-512 BF16), the
    model's dtype elsewhere (vllm/platforms/cpu.py)."""
    return "float32" if torch.cpu._is_avx512_bf16_supported() else "bfloat16"


def test_jsonl_has_records_for_every_gdn_layer_in_decode_only_and_mixed_steps(served):
    expected = {(layer, kind) for layer in GDN_LAYERS for kind in ("decode", "mixed")}
    decode = {(r["layer"], r["step_kind"]) for r in checks(served["on"], "decode")}
    assert decode == expected
    # The injected failure takes the worker's first golden check; when the requests' arrival
    # makes that the only mixed step, its (layer, kind) pair has no golden record.
    golden = {(r["layer"], r["step_kind"]) for r in checks(served["on"], "golden")}
    injected = [
        r for r in served["on"].records if r["kind"] == "failure" and "injected" in r["error"]
    ]
    assert golden <= expected and len(expected - golden) <= len(injected) == 1
    record = checks(served["on"])[0]
    assert record["provider"] == "vllm-cpu" and record["mode"] == "route"
    assert record["state_dtype"] == cpu_ssm_state_dtype()
    assert record["process"].startswith("VllmWorker")
    assert set(record) >= {"time", "pid", "step", "rows", "snapshot_bytes", *FIELDS}
    # one file per process, named with its pid
    for path in served["on"].out_dir.glob("shadow.*.jsonl"):
        assert {r["pid"] for r in read_records(path)} == {int(path.name.split(".")[1])}


def test_golden_reference_shows_vllms_cpu_kernels_differences_and_decode_reference_none(served):
    golden, decode = checks(served["on"], "golden"), checks(served["on"], "decode")
    assert all(r["recurrent_state"]["differing"] > 0 for r in golden)
    assert all(r["conv_state"]["differing"] == 0 for r in golden)  # the CPU conv update is exact
    # vLLM's CPU path runs decode rows through its decode kernels in every step (L1 holds)
    assert all(r[name]["differing"] == 0 for r in decode for name in FIELDS)


def test_metrics_endpoint_shows_the_shadow_counters(served):
    text = served["on"].metrics
    by_layer = {layer: 0.0 for layer in GDN_LAYERS}
    for layer, value in re.findall(
        r'^gdn_invariant_shadow_checks_total\{layer="([^"]+)",.*\} (\S+)$', text, re.M
    ):
        by_layer[layer] += float(value)
    want = {layer: sum(r["layer"] == layer for r in checks(served["on"])) for layer in GDN_LAYERS}
    assert by_layer == want
    differing = re.findall(
        r'^gdn_invariant_shadow_checks_with_difference_total\{field="recurrent_state",'
        r'layer="model.layers.0.linear_attn",reference="golden"\} (\S+)$',
        text,
        re.M,
    )
    golden_0 = [r for r in checks(served["on"], "golden") if r["layer"] == GDN_LAYERS[0]]
    assert differing == [f"{float(len(golden_0))}"]
    assert "gdn_invariant_shadow_max_ulp_bucket{" in text


def test_injected_failure_is_counted_and_requests_still_succeed(served):
    failures = [r for r in served["on"].records if r["kind"] == "failure"]
    assert [(r["stage"], r["error"]) for r in failures] == [
        ("reference", "RuntimeError: injected by tests/serving.py")
    ]
    assert re.search(
        r'^gdn_invariant_shadow_failures_total\{stage="reference"\} 1\.0$',
        served["on"].metrics,
        re.M,
    )
    assert served["on"].log.count("gdn_invariant shadow: reference failed") == 1
    assert len(served["on"].completions) == len(PROMPT_WORDS)


def test_report_prints_the_table_of_the_served_records(served):
    logs = sorted(str(p) for p in served["on"].out_dir.glob("shadow.*.jsonl"))
    proc = subprocess.run(
        [sys.executable, "-m", "vllm_gdn_invariant", "report", *logs],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith(f"gdn_invariant shadow report: {len(checks(served['on']))} checks")
    for layer in GDN_LAYERS:
        for name in FIELDS:
            assert sum(line.split()[:2] == [layer, name] for line in lines) == 2  # 2 references


def test_golden_reference_shows_no_difference_under_mode_golden(tmp_path):
    """A CPU engine in mode golden serves, and its decode rows are the goldens' bits."""
    model = write_tiny_model(tmp_path / "model")
    env = plugin_env(
        VLLM_GDN_INVARIANT_MODE="golden",
        VLLM_GDN_INVARIANT_SHADOW=f"1.0,out={tmp_path}/shadow.jsonl",
    )
    server = Server(model, tmp_path / "serve.log", env)
    try:
        server.wait_healthy(time.monotonic() + START_TIMEOUT_S)
        sent = prompts()
        with concurrent.futures.ThreadPoolExecutor(len(sent)) as pool:
            list(pool.map(server.complete, sent))
    finally:
        server.stop()
    records = [r for p in tmp_path.glob("shadow.*.jsonl") for r in read_records(p)]
    golden = [r for r in records if r["kind"] == "check"]
    assert {(r["layer"], r["step_kind"]) for r in golden} == {
        (layer, kind) for layer in GDN_LAYERS for kind in ("decode", "mixed")
    }
    assert all(r["provider"] == "goldens" for r in golden)
    assert all(r[name]["differing"] == 0 for r in golden for name in FIELDS)
