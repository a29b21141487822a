"""docs/kernels.md quotes stage kernels at 44d625b (docs/evidence/h200_engine/44d625b/, an H100,
the package as at 12a6389) as its evidence files say: section "Stage kernels again at 44d625b"
and the sentence on it in "Where issue 20 stands"."""

from __future__ import annotations

import functools
import json
import subprocess

from ..evidence_cases import cells, clean_report, span
from .test_evidence_docs import ROOT, flat_doc

RUN = ROOT / "docs" / "evidence" / "h200_engine" / "44d625b"
BEFORE = ROOT / "docs" / "evidence" / "h200_engine" / "12a6389" / "bench_decode.json"
UNCHANGED = ("vllm_gdn_invariant", "tests/gpu", "scripts")


@functools.cache
def report(path=RUN / "bench_decode.json") -> dict:
    return json.loads(path.read_text())


def cases(path=RUN / "bench_decode.json") -> list[dict]:
    return report(path)["cases"]


def conv_checks_from_64(path=RUN / "bench_decode.json") -> list[float]:
    """``checks_us`` of the run's conv cases from B = 64, both cache dtypes."""
    return [
        c["api_bound"]["checks_us"] for c in cases(path) if c["op"] == "conv" and c["batch"] >= 64
    ]


def device(op: str, state: str, low: int, high: int = 1024, key: str = "speed_vs_vllm_device"):
    return [c[key] for c in cells(cases(), op, state, low, high)]


def test_the_run_is_44d625b_on_an_h100_with_12a6389s_package():
    run = clean_report(RUN / "bench_decode.json", "44d625b")
    before = report(BEFORE)["provenance"]
    assert run["provenance"]["source_sha256"] == before["source_sha256"]
    assert "H100" in run["provenance"]["device"] and len(run["cases"]) == 66
    changed = subprocess.run(
        ["git", "diff", "--name-only", before["git_commit"], "44d625b", "--", *UNCHANGED],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert changed == ""
    log = (RUN / "pytest_kernels.log").read_text()
    assert "174 passed, 2 warnings in 217.83s" in log and "failed" not in log


def test_the_device_times_are_quoted():
    doc = flat_doc()
    assert "(`pytest_kernels.log`: 174 passed in 218 s)" in doc
    cold = device("conv", "bfloat16", 1, key="speed_vs_vllm_device_cold")
    small_wall = min(c["speed_vs_vllm_wall"] for c in cases() if c["batch"] < 64)
    assert (
        f"the recurrent step {span(device('recurrent', 'bfloat16', 64))}x with a bf16 state and "
        f"{span(device('recurrent', 'float32', 64))}x with fp32, the decode step "
        f"{span(device('decode_step', 'bfloat16', 64))}x and "
        f"{span(device('decode_step', 'float32', 64))}x, the conv "
        f"{span(device('conv', 'bfloat16', 64))}x with a bf16 cache (with L2 flushed "
        f"{span(cold)}x at every B) and {min(device('conv', 'float32', 64)):.3f}x or more with "
        "fp32; below B = 64 the bf16 recurrent step "
        f"{span(device('recurrent', 'bfloat16', 1, 32))}x, and every op's wall time "
        f"{small_wall:.3f}x vLLM or more" in doc
    )
    before = {(c["op"], c["state_dtype"], c["batch"]): c for c in cases(BEFORE)}
    moved = [
        c["speed_vs_vllm_device"]
        - before[c["op"], c["state_dtype"], c["batch"]]["speed_vs_vllm_device"]
        for c in cases()
        if c["op"] != "conv" and c["batch"] >= 64
    ]
    assert round(max(abs(m) for m in moved), 3) <= 0.005  # "within 0.5 points"
    assert f"within 0.5 points of 12a6389's run ({min(moved):+.3f} to {max(moved):+.3f})" in (
        doc.replace("−", "-")
    )


def test_the_api_misses_are_quoted():
    misses = report()["summary"]["api_bound_misses"]
    assert [(m["op"], m["state_dtype"], m["batch"]) for m in misses] == [
        ("conv", "float32", 64),
        ("conv", "bfloat16", 512),
    ]
    assert report(BEFORE)["summary"]["api_bound_misses"] == []
    doc = flat_doc()
    assert (
        f"by the conv at B = 64 with an fp32 cache ({misses[0]['ratio']:.2f}x the launch's wall "
        f"time) and at B = 512 with a bf16 cache ({misses[1]['ratio']:.2f}x)" in doc
    )
    bound = [
        c
        for c in cases()
        if c["op"] == "conv"
        and c["batch"] >= 64
        and c["batch"] <= (512 if c["state_dtype"] == "bfloat16" else 256)
    ]
    walls = [c["api_bound"]["launch_wall_us"] for c in bound]
    kernels = [c["kernel_us"]["ours"] for c in bound]
    beyond = [w - k for w, k in zip(walls, kernels, strict=True)]
    assert min(beyond) > 10
    assert (
        f"({span(walls, '.1f')} µs of wall time per call for kernels of {span(kernels, '.1f')} µs "
        "of device time, B = 64 to 512 with a bf16 cache and to 256 with fp32: "
        f"{span(beyond, '.1f')} µs of host time beyond the device's)" in doc
    )
    assert f"so a quarter of it is {span([w / 4 for w in walls], '.1f')} µs" in doc
    assert (
        f"this host took {span(conv_checks_from_64(), '.1f')} µs per call for the conv's checks "
        "from B = 64" in doc
    )
    assert f"where 12a6389's took {span(conv_checks_from_64(BEFORE), '.1f')} µs" in doc
