"""docs/kernels.md's speed tables and verdicts are what their evidence files say: the run at
344febd (docs/evidence/h200_engine/344febd/, on an H100, the package's kernel asking for the state
ahead, taken out again since; its A/B is test_evidence_344febd.py's), the one at 4356317 (an H100,
the package as it is, with the device time with L2 flushed, the
pipelined loop's variants and the engine's profiled rounds), the engine runs with 24 layers at
3af9122 (h200_engine/3af9122/, an H100), the one at b6f5081 (on an H100, the
conv caches in vLLM's default layout), the
one at 1ee138d (h200_engine/1ee138d/, with its engine run and profile), the one at 12a52f9
(h200_engine/12a52f9/, with its two engine runs), the one at fbcbb14
(h200_engine/fbcbb14/, the host path on an H100), the one at ea50d1f
(h200_engine/ea50d1f/, beside 6aa67cf's package on the same machine) and the engine run after it
(h200_engine/67c154e/), the latest H200 run
at 6aa67cf, whose Triton functions are today's (h200_engine/6aa67cf/bench_decode.json, and the
engine run beside it, bench_engine_golden.json), the run at 613a30b
(docs/evidence/h200_engine/613a30b/bench_decode.json), the one at 67cd0fa before it
(docs/evidence/h200_engine/67cd0fa/bench_decode.json) and the earlier one with vLLM 0.34.0's
kernels (docs/evidence/h200/bench_decode_0.34.0_a7cbbb3.json)."""

from __future__ import annotations

import ast
import json
import math
import statistics
import subprocess
from pathlib import Path

import pytest

from gdn_evidence.harness.pipelined_kernel import STAGES_PER_SHAPE

from ..doc_blocks import marked_block, printed
from ..evidence_cases import cells, fastest_pipelined, span

ROOT = Path(__file__).resolve().parents[2]
EVIDENCE = ROOT / "docs" / "evidence" / "h200" / "bench_decode_0.34.0_a7cbbb3.json"
# the H200 run of the Triton functions as they are
CURRENT = ROOT / "docs" / "evidence" / "h200_engine" / "6aa67cf" / "bench_decode.json"
HOST_PATH = ROOT / "docs" / "evidence" / "h200_engine" / "ea50d1f"  # an H100
AT_EA50D1F = HOST_PATH / "bench_decode.json"
LATEST_RUN = ROOT / "docs" / "evidence" / "h200_engine" / "344febd"  # an H100
LATEST = LATEST_RUN / "bench_decode.json"
AT_4356317_RUN = ROOT / "docs" / "evidence" / "h200_engine" / "4356317"  # an H100
PACKAGE_RUN = ROOT / "docs" / "evidence" / "h200_engine" / "ff22b8e"  # an H100, the package now
AT_PACKAGE = PACKAGE_RUN / "bench_decode.json"
AT_4356317 = AT_4356317_RUN / "bench_decode.json"
DEEP_ENGINE_RUN = ROOT / "docs" / "evidence" / "h200_engine" / "3af9122"  # an H100, 24 layers
AT_B6F5081_RUN = ROOT / "docs" / "evidence" / "h200_engine" / "b6f5081"  # an H100
AT_1EE138D_RUN = ROOT / "docs" / "evidence" / "h200_engine" / "1ee138d"  # an H100
AT_12A52F9_RUN = ROOT / "docs" / "evidence" / "h200_engine" / "12a52f9"  # an H100
AT_FBCBB14_RUN = ROOT / "docs" / "evidence" / "h200_engine" / "fbcbb14"  # an H100
AT_FBCBB14 = AT_FBCBB14_RUN / "bench_decode.json"
SAME_MACHINE = HOST_PATH / "bench_decode_6aa67cf_same_machine.json"
KERNEL_SOURCES = ("conv.py", "elementary.py", "recurrent.py")
AT_613A30B = ROOT / "docs" / "evidence" / "h200_engine" / "613a30b" / "bench_decode.json"
ENGINE_AT_6AA67CF = (
    ROOT / "docs" / "evidence" / "h200_engine" / "6aa67cf" / "bench_engine_golden.json"
)
ENGINE_HOST_PATH = (
    ROOT / "docs" / "evidence" / "h200_engine" / "67c154e" / "bench_engine_golden.json"
)
ENGINE_AT_613A30B = (
    ROOT / "docs" / "evidence" / "h200_engine" / "613a30b" / "bench_engine_golden.json"
)
PREVIOUS = ROOT / "docs" / "evidence" / "h200_engine" / "67cd0fa" / "bench_decode.json"
DOC = ROOT / "docs" / "kernels.md"
STATE = {"float32": "fp32", "bfloat16": "bf16"}


def cases() -> list[dict]:
    return json.loads(EVIDENCE.read_text())["cases"]


def flat_doc() -> str:
    return " ".join(DOC.read_text().split())


def round_ratios(case: dict, arm: str = "ours") -> list[float]:
    rounds = case["rounds_us"]
    return [v / o for v, o in zip(rounds["vllm"], rounds[arm], strict=True)]


def test_every_case_is_a_row_of_the_speed_table():
    doc = DOC.read_text()
    for c in cases():
        row = (
            f"| {c['op']} | {STATE[c['state_dtype']]} | {c['batch']} | {c['us']['vllm']} | "
            f"{c['us']['ours']} | {c['speed_vs_vllm']} | {c['fraction_of_copy']['vllm']} | "
            f"{c['fraction_of_copy']['ours']} |"
        )
        assert row in doc, row


def test_the_target_verdicts_are_the_rounds():
    large = [c for c in cases() if c["batch"] >= 64]
    conv_fp32 = [c for c in large if c["op"] == "conv" and c["state_dtype"] == "float32"]
    conv_bf16 = [c for c in large if c["op"] == "conv" and c["state_dtype"] == "bfloat16"]
    recurrent = [c for c in large if c["op"] == "recurrent"]
    assert all(min(round_ratios(c)) >= 1.0 for c in conv_fp32)  # met in every round
    assert all(min(round_ratios(c)) < 1.0 <= max(round_ratios(c)) for c in conv_bf16)
    assert all(max(round_ratios(c)) < 1.0 for c in recurrent)  # not met in any round
    lowest = min(min(round_ratios(c)) for c in conv_fp32)
    doc = flat_doc()
    assert f"(every round {math.floor(100 * lowest) / 100:.2f}x or more)" in doc
    medians = ", ".join(f"{c['speed_vs_vllm']:.3f}" for c in conv_bf16)
    assert f"at B = 64, 256 and 1024 (medians {medians})" in doc


def test_the_public_functions_speed_is_quoted():
    large = [c for c in cases() if c["batch"] >= 64]
    small = [c for c in cases() if c["batch"] < 64]

    def api(chosen: list[dict], op: str | None = None) -> list[float]:
        return [c["speed_vs_vllm_api"] for c in chosen if op is None or c["op"] == op]

    recurrent, conv = api(large, "recurrent"), api(large, "conv")
    doc = flat_doc()
    assert (
        f"at B >= 64, {min(recurrent):.2f}–{max(recurrent):.2f}x vLLM's kernels for "
        f"`recurrent_step` and {min(conv):.3f}–{max(conv):.2f}x for `conv_update`" in doc
    )
    assert f"; {min(api(small)):.3f}–{max(api(small)):.3f}x at B = 1 and 16)" in doc


def current_cases(min_batch: int = 64) -> list[dict]:
    return [c for c in json.loads(AT_613A30B.read_text())["cases"] if c["batch"] >= min_batch]


def by_cell(path: Path) -> dict[tuple, dict]:
    return {
        (c["op"], c["state_dtype"], c["batch"]): c for c in json.loads(path.read_text())["cases"]
    }


LOOSE = [  # cells of the current run the doc calls loose
    ("conv", "float32", 128),
    ("conv", "bfloat16", 128),
    ("conv", "float32", 256),
    ("conv", "bfloat16", 256),
    ("decode_step", "bfloat16", 64),
    ("decode_step", "float32", 128),
]


def git(*arguments: str) -> str:
    """``git``'s output in this checkout; the test skips where git or the commit is missing."""
    try:
        result = subprocess.run(
            ["git", *arguments], cwd=ROOT, capture_output=True, text=True, timeout=60
        )
    except FileNotFoundError:
        pytest.skip("git is not installed")
    if result.returncode != 0:
        pytest.skip(f"git {arguments[0]}: {result.stderr.strip()}")
    return result.stdout


def test_the_package_is_the_one_the_gpu_run_checked_and_timed():
    """docs/kernels.md says the package is the one of the latest GPU run (ff22b8e's: the GPU
    matrix and the bench), and a test compares the package with git; it is 4356317's too."""
    commit = json.loads(AT_PACKAGE.read_text())["provenance"]["git_commit"]
    assert (
        f"The package (`vllm_gdn_invariant/`) is the one of {commit[:7]}'s run (a test "
        "compares it with git)"
    ) in flat_doc()
    for run in (commit, json.loads(AT_4356317.read_text())["provenance"]["git_commit"]):
        changed = git("diff", "--name-only", run, "--", "vllm_gdn_invariant").split()
        assert changed == [], f"the package changed since the GPU run at {run[:7]}"


def jit_functions(source: str) -> dict[str, str]:
    """The source of each ``@triton.jit`` function of a module."""
    tree = ast.parse(source)
    return {
        node.name: ast.get_source_segment(source, node)
        for node in tree.body
        if isinstance(node, ast.FunctionDef)
        and any("jit" in ast.unparse(d) for d in node.decorator_list)
    }


def test_the_triton_functions_are_the_h200_runs():
    """The H200 run's device times hold for the kernels' Triton functions as they are: those of
    6aa67cf, the L2 request of 344febd taken out again."""
    commit = json.loads(CURRENT.read_text())["provenance"]["git_commit"]
    assert (
        f"Since {commit[:7]} the kernels' Triton functions have not changed (344febd's request "
        "into L2 was taken out again at"
    ) in flat_doc()
    for name in KERNEL_SOURCES:
        path = f"vllm_gdn_invariant/kernels/{name}"
        then = jit_functions(git("show", f"{commit}:{path}"))
        now = jit_functions((ROOT / path).read_text())
        assert then and now == then, name


def test_the_b6f5081_run_is_quoted():
    report = json.loads((AT_B6F5081_RUN / "bench_decode.json").read_text())
    cases = report["cases"]
    assert report["provenance"]["git_commit"] == "b6f5081" and report["complete"]
    assert not report["provenance"]["git_dirty"]
    assert report["settings"]["conv_layout"] == "state-first"
    assert "171 passed" in (AT_B6F5081_RUN / "pytest_kernels.log").read_text()
    (miss,) = report["summary"]["api_bound_misses"]
    assert (miss["op"], miss["state_dtype"], miss["batch"]) == ("conv", "float32", 128)
    earlier = [
        next(
            c["api_bound"]
            for c in json.loads((run / "bench_decode.json").read_text())["cases"]
            if (c["op"], c["state_dtype"], c["batch"]) == ("conv", "float32", 128)
        )
        for run in (AT_1EE138D_RUN, AT_12A52F9_RUN)
    ]
    assert all(e["within"] for e in earlier)

    def device(op: str, state: str, low: int = 64, high: int = 1024) -> str:
        return device_span(cases, op, state, low, high, fmt=".3f")

    conv_bf16 = {c["batch"]: c for c in cells(cases, "conv", "bfloat16")}
    conv_fp32 = min(c["speed_vs_vllm_device"] for c in cells(cases, "conv", "float32"))
    below = [b for b, c in conv_bf16.items() if c["speed_vs_vllm_device"] < 1]
    assert below == [2, 512]
    lowest = min(c["speed_vs_vllm_wall"] for c in cases if c["batch"] < 64)
    doc = flat_doc()
    assert (
        f"device time, the conv with a bf16 cache {device('conv', 'bfloat16', 1)} vLLM's "
        f"(below 1 at B = 2, {conv_bf16[2]['speed_vs_vllm_device']:.3f}x, and B = 512, "
        f"{conv_bf16[512]['speed_vs_vllm_device']:.3f}x, where do_bench with L2 flushed gives "
        f"{conv_bf16[512]['speed_vs_vllm']:.2f}x), with fp32 "
        f"{conv_fp32:.2f}x "
        f"and more; at B >= 64 the recurrent step {device('recurrent', 'float32')} (fp32) and "
        f"{device('recurrent', 'bfloat16')} (bf16), the decode step "
        f"{device('decode_step', 'float32')} and {device('decode_step', 'bfloat16')}; below B = 64 "
        f"the decode step {device('decode_step', 'bfloat16', 1, 32)} with bf16; wall time below "
        f"B = 64 {lowest:.2f}x vLLM or more." in doc
    )
    assert (
        f"The API bound is met in {len(cases) - 1} of {len(cases)} cases: the conv with an fp32 "
        f"cache at B = 128 took {miss['api_wall_us']:.1f} µs per public call against "
        f"{miss['launch_wall_us']:.1f} µs per launch ({miss['ratio']:.2f}x; its checks "
        f"{miss['checks_us']:.1f} µs), where the bound is 1.25x; the same case met it at "
        f"{earlier[0]['ratio']:.2f}x at 1ee138d and {earlier[1]['ratio']:.2f}x at 12a52f9" in doc
    )


def assert_stage_kernels_run_quoted(run: Path, commit: str, passed: int = 171) -> list[dict]:
    """A clean stage ``kernels`` run at ``commit`` with the whole GPU matrix (``passed`` cases)
    passed and the API bound met everywhere, quoted in one sentence; returns its cases."""
    report = json.loads((run / "bench_decode.json").read_text())
    cases = report["cases"]
    assert report["provenance"]["git_commit"][:7] == commit and report["complete"]
    assert not report["provenance"]["git_dirty"] and report["summary"]["api_bound_misses"] == []
    assert f"{passed} passed" in (run / "pytest_kernels.log").read_text()

    def device(op: str, state: str) -> str:
        return device_span(cases, op, state, 64, fmt=".3f")

    lowest = min(c["speed_vs_vllm_wall"] for c in cases if c["batch"] < 64)
    assert (
        f"the API bound is met in all {len(cases)} cases; device time at B >= 64 the recurrent "
        f"step {device('recurrent', 'float32')} with an fp32 state and "
        f"{device('recurrent', 'bfloat16')} with bf16, the decode step "
        f"{device('decode_step', 'float32')} and {device('decode_step', 'bfloat16')}; wall time "
        f"below B = 64 {lowest:.2f}x vLLM or more." in flat_doc()
    )
    return cases


def test_the_ff22b8e_run_is_quoted():
    cases = assert_stage_kernels_run_quoted(PACKAGE_RUN, "ff22b8e", passed=173)
    assert "173 passed" in (AT_4356317_RUN / "pytest_kernels.log").read_text()  # the same matrix
    small = device_span(cases, "recurrent", "bfloat16", 1, 32, fmt=".3f")
    assert f"Below B = 64 the bf16 recurrent step ran at {small}." in flat_doc()


def test_the_1ee138d_run_is_quoted():
    assert_stage_kernels_run_quoted(AT_1EE138D_RUN, "1ee138d")


def test_the_12a52f9_run_is_quoted():
    cases = assert_stage_kernels_run_quoted(AT_12A52F9_RUN, "12a52f9")
    fp32 = [c["speed_vs_vllm_device"] for c in cells(cases, "recurrent", "float32", 256)]
    later = json.loads((AT_1EE138D_RUN / "bench_decode.json").read_text())["cases"]
    now = {c["speed_vs_vllm_device"] for c in cells(later, "recurrent", "float32", 256)}
    assert (
        f"At B = 256 to 1024 the fp32 recurrent step went from {min(fp32):.3f}–{max(fp32):.3f}x "
        f"(12a52f9) to {min(now):.3f}x." in flat_doc()
    )
    assert len({f"{v:.3f}" for v in now}) == 1


def own_throughput_spread(report: dict) -> list[float]:
    """Each engine's (route, golden) highest decode throughput over its lowest, across rounds."""
    return [
        max(r[arm]["decode"]["output_tok_s"] for r in report["rounds"])
        / min(r[arm]["decode"]["output_tok_s"] for r in report["rounds"])
        for arm in ("route", "golden")
    ]


def test_the_4356317_run_and_its_l2_flushed_device_time_are_quoted():
    cases = assert_stage_kernels_run_quoted(AT_4356317_RUN, "4356317", passed=173)
    doc = flat_doc()
    assert "the 173 cases of" in doc
    conv = cells(cases, "conv", "bfloat16")
    below = {c["batch"]: c["speed_vs_vllm_device"] for c in conv if c["speed_vs_vllm_device"] < 1}
    assert list(below) == [2, 512]
    assert min(c["speed_vs_vllm_device_cold"] for c in conv) >= 1
    assert (
        f"With L2 flushed the conv with a bf16 cache is "
        f"{span_of(conv, 'speed_vs_vllm_device_cold', fmt='.3f')}x vLLM's at every B (device time "
        f"as profiled back to back: {span_of(conv, 'speed_vs_vllm_device', fmt='.3f')}x, below 1 "
        f"at B = 2, {below[2]:.3f}x, and B = 512, {below[512]:.3f}x," in doc
    )
    large, small = (
        span_of(
            cells(cases, "recurrent", "bfloat16", low, high), "speed_vs_vllm_device_cold", fmt=".3f"
        )
        for low, high in ((64, 1024), (1, 32))
    )
    assert f"B >= 64 ({large}x flushed;" in doc
    assert f"below B = 64 the flushed ratio is {small}x." in doc


def pipelined_shape(variant: str) -> str:
    """The arm that times ``variant``'s launch shape unpipelined: ``ours`` for the default."""
    return next(
        shape or "ours"
        for shape, all_stages in STAGES_PER_SHAPE
        for stages in all_stages
        if variant == f"pipelined_s{stages}" + (f"_{shape}" if shape else "")
    )


def test_the_pipelined_loop_timed_is_quoted():
    report = json.loads((AT_4356317_RUN / "bench_decode_pipelined.json").read_text())
    assert report["provenance"]["git_commit"][:7] == "4356317" and report["complete"]
    assert not report["provenance"]["git_dirty"]
    sets = [(c["state_dtype"], c["batch"], c["pipelined"]) for c in report["cases"]]
    assert all(all(p["same_bits"].values()) for _, _, p in sets)
    compared = sum(len(p["same_bits"]) for _, _, p in sets)

    def fastest(p: dict, key: str = "speed_vs_vllm_device") -> float:
        return fastest_pipelined(p[key])

    def ratios(state: str, value, low: int = 64) -> list[float]:
        return [value(p) for s, b, p in sets if s == state and b >= low]

    assert all(fastest(p) < p["speed_vs_vllm_device"]["ours"] for _, b, p in sets if b >= 32)
    device = "speed_vs_vllm_device"
    ours = {s: span(ratios(s, lambda p: p[device]["ours"]), unit="x") for s in STATE}
    best = {s: span(ratios(s, fastest), unit="x") for s in STATE}
    best_cold = span(
        ratios("bfloat16", lambda p: fastest(p, "speed_vs_vllm_device_cold")), unit="x"
    )
    alone = {
        s: [
            v / p[device][pipelined_shape(k)]
            for p in ratios(s, lambda p: p)
            for k, v in p[device].items()
            if k.startswith("pipelined_")
        ]
        for s in STATE
    }
    slab = span(ratios("bfloat16", lambda p: p[device]["pipelined_s3_w1c16_slab"]), unit="x")
    slab_alone = span(ratios("bfloat16", lambda p: p[device]["w1c16_slab"]), unit="x")
    wide = ("pipelined_s2_w2c4", "pipelined_s2_w4c4", "pipelined_s3_w4c4")
    many_warps = span(
        [v for k in wide for v in ratios("float32", lambda p, k=k: p[device][k], 256)], ".2f", "x"
    )
    doc = flat_doc()
    assert f"every variant gave ours' bits in all {compared} comparisons" in doc
    assert (
        f"At B >= 64 with a bf16 state ours ran at {ours['bfloat16']} vLLM's device time and the "
        f"fastest pipelined variant of each B at {best['bfloat16']} ({best_cold} with L2 flushed); "
        f"with fp32 ours {ours['float32']} and the fastest variant {best['float32']}." in doc
    )
    assert (
        f"pipelining alone gave a bf16 state {span(alone['bfloat16'], unit='x')} ours' speed "
        "at B >= 64" in doc
    )
    assert (
        f"the most promising on paper, {slab} vLLM's with three stages against {slab_alone}" in doc
    )
    assert f"with fp32 it gained up to {max(alone['float32']):.3f}x at the one-slab shapes" in doc
    assert f"ran at {many_warps} vLLM's from B = 256" in doc
    passed = {
        (s, b): sorted(
            v for k, v in p[device].items() if k.startswith("pipelined_") and v > p[device]["ours"]
        )
        for s, b, p in sets
    }
    assert {key: len(v) for key, v in passed.items() if v} == {
        ("float32", 16): 3,
        ("float32", 8): 1,
    }
    fp32 = {b: p[device] for s, b, p in sets if s == "float32"}
    assert (
        f"three variants passed ours at B = 16 (up to {passed['float32', 16][-1]:.3f}x against "
        f"ours' {fp32[16]['ours']:.3f}x; ours' own 32 rows over 2 warps, unpipelined, gave "
        f"{fp32[16]['w2c4']:.3f}x there" in doc
    )
    assert f"one at B = 8 ({passed['float32', 8][0]:.3f}x against {fp32[8]['ours']:.3f}x)" in doc


def test_the_4356317_engine_profile_and_the_deep_model_attempts_are_quoted():
    report = json.loads((AT_4356317_RUN / "bench_engine_golden_profile.json").read_text())
    assert report["provenance"]["git_commit"][:7] == "4356317"
    assert not report["provenance"]["git_dirty"]
    profile = report["profile"]
    assert profile["workload"] == "decode"
    route, golden = (profile["device_us_rounds"][arm] for arm in ("route", "golden"))
    versus = profile["vs_route"]["golden"]
    by_round = versus["device_time_ratio_rounds"]
    assert by_round == pytest.approx([g / r for g, r in zip(golden, route, strict=True)], abs=2e-3)
    spread = versus["device_time_ratio_spread"]
    first = {arm: profile["arms"][arm]["categories_us"] for arm in ("route", "golden")}
    gdn = first["route"]["gdn_decode"], first["golden"]["gdn_decode"]
    conv = first["route"]["gdn_conv"], first["golden"]["gdn_conv"]
    (timed,) = report["rounds"]
    seconds = timed["golden"]["decode"]["seconds"], timed["route"]["decode"]["seconds"]
    ratio = report["summary"]["ratios"]["golden"]["decode_throughput_vs_route"]
    doc = flat_doc()
    assert (
        f"route's kernels took {min(route) / 1e3:.2f}–{max(route) / 1e3:.2f} ms on the device, "
        f"golden's {min(golden) / 1e3:.2f}–{max(golden) / 1e3:.2f} ms; golden/route "
        f"{by_round[0]:.4f}, {by_round[1]:.4f} and {by_round[2]:.4f} by round (spread "
        f"{100 * spread['spread']:.2f} %), so where the engine is bound by the GPU mode golden's "
        f"decode throughput is {1 / spread['median']:.3f}x mode route's." in doc
    )
    assert (
        f"({gdn[1] / 1e3:.2f} against {gdn[0] / 1e3:.2f} ms in the first round, "
        f"{gdn[0] / gdn[1]:.3f}x:" in doc
    )
    assert (
        f"mode golden's conv took less ({conv[1] / 1e3:.2f} against {conv[0] / 1e3:.2f} ms)" in doc
    )
    assert (
        f"The one timed round gave {ratio:.3f}x ({seconds[0]:.2f} against {seconds[1]:.2f} s)"
        in doc
    )
    refused = json.loads((AT_4356317_RUN / "bench_engine_golden_48l_kv8.json").read_text())
    assert refused["provenance"]["model"]["num_hidden_layers"] == 48
    assert all(e["status"] == "FAILED" for e in refused["engines"].values())
    assert (
        "max_num_seqs (1024) exceeds available Mamba cache blocks (642)"
        in (refused["engines"]["route"]["root_cause"])
    )
    lost = json.loads((AT_4356317_RUN / "bench_engine_golden_48l.json").read_text())
    assert lost["provenance"]["engine"]["kv_cache_gib"] == 13.5 and lost["rounds"] == []
    started = [float(e["start_seconds"]) for e in lost["engines"].values()]
    assert all(e["status"] == "READY" for e in lost["engines"].values())
    assert "BrokenPipeError" in (AT_4356317_RUN / "bench_engine_golden_48l.log").read_text()
    assert (
        f"with `--kv-cache-gib 13.5` both engines started ({max(started):.0f} s) and the route "
        "engine's process had exited" in doc
    )


def test_the_24_layer_engine_runs_are_quoted():
    def run(name: str) -> dict:
        report = json.loads((DEEP_ENGINE_RUN / name).read_text())
        provenance = report["provenance"]
        assert provenance["git_commit"] == "3af9122" and not provenance["git_dirty"]
        assert provenance["model"]["num_hidden_layers"] == 24
        assert "H100" in provenance["device"]
        return report

    def golden(report: dict, ratio: str = "decode_throughput_vs_route") -> tuple:
        summary = report["summary"]
        rounds = summary["round_ratios"]["golden"][ratio]
        spread = summary["ratio_spread"]["golden"][ratio]
        return rounds, spread, summary["ratios"]["golden"][ratio]

    def seconds(report: dict) -> list[float]:
        return [
            r[arm]["decode"]["seconds"] for r in report["rounds"] for arm in ("route", "golden")
        ]

    def arm_spread(report: dict, arm: str) -> float:
        rates = [r[arm]["decode"]["output_tok_s"] for r in report["rounds"]]
        return (max(rates) - min(rates)) / statistics.median(rates)

    doc = flat_doc()
    deep, long, itl = (
        run(f"bench_engine_golden_deep{tail}.json") for tail in ("", "_1536", "_itl")
    )
    rounds, spread, ratio = golden(deep)
    assert len(rounds) == 7 and "--decode-new-tokens 512" in " ".join(deep["provenance"]["argv"])
    assert (
        f"rounds of {min(seconds(deep)):.2f}–{max(seconds(deep)):.2f} s per arm, 7 rounds, then 3 "
        f"profiled decode runs per arm; `bench_engine_golden_deep.json`): round ratios "
        f"{min(rounds):.3f}–{max(rounds):.3f} (spread {100 * spread['spread']:.2f} %, median "
        f"{spread['median']:.4f}), ratio of the arms' median throughputs {ratio:.4f}." in doc
    )
    versus = deep["profile"]["vs_route"]["golden"]
    by_round = versus["device_time_ratio_rounds"]
    device = versus["device_time_ratio_spread"]
    first = {arm: deep["profile"]["arms"][arm] for arm in ("route", "golden")}
    gdn = [first[arm]["categories_us"]["gdn_decode"] for arm in ("route", "golden")]
    assert (
        f"golden/route {by_round[0]:.4f}, {by_round[1]:.4f} and {by_round[2]:.4f} by round "
        f"(spread {100 * device['spread']:.2f} %): where the GPU bounds the engine mode golden's "
        f"decode throughput is {1 / device['median']:.3f}x mode route's." in doc
    )
    assert (
        f"the GDN decode, {100 * first['route']['categories_share']['gdn_decode']:.1f} % of "
        f"route's device time ({gdn[1] / 1e3:.2f} against {gdn[0] / 1e3:.2f} ms in the first "
        f"round, {gdn[0] / gdn[1]:.3f}x)." in doc
    )
    rounds, spread, ratio = golden(long)
    assert len(rounds) == 7 and spread["spread"] < 0.03
    assert (
        f"(rounds of {min(seconds(long)):.2f}–{max(seconds(long)):.2f} s, 7 rounds; "
        f"`bench_engine_golden_deep_1536.json`): route's throughput spread "
        f"{100 * arm_spread(long, 'route'):.2f} % over the rounds, golden's "
        f"{100 * arm_spread(long, 'golden'):.2f} %, the round ratios "
        f"{min(rounds):.3f}–{max(rounds):.3f} (**spread {100 * spread['spread']:.2f} %**, median "
        f"{spread['median']:.4f}, its 95 % interval "
        f"{spread['median_interval']['interval'][0]:.3f}–"
        f"{spread['median_interval']['interval'][1]:.3f}), ratio of the median throughputs "
        f"**{ratio:.4f}**." in doc
    )
    assert min(rounds) < 0.99 < max(rounds) and ratio < 0.99 < spread["median"]
    rounds, spread, ratio = golden(itl)
    latency_rounds, latency_spread, latency = golden(itl, "itl_vs_route")
    medians = itl["summary"]["medians"]
    assert (
        f"throughput round ratios {min(rounds):.3f}–{max(rounds):.3f} (spread "
        f"{100 * spread['spread']:.2f} %, median {spread['median']:.4f}), ratio of medians "
        f"{ratio:.4f}; inter-token latency {medians['golden']['itl_ms']:.3f} against "
        f"{medians['route']['itl_ms']:.3f} ms (medians, ratio {latency:.4f}), round ratios "
        f"{min(latency_rounds):.3f}–{max(latency_rounds):.3f} (spread "
        f"{100 * latency_spread['spread']:.2f} %, median {latency_spread['median']:.4f})." in doc
    )
    earlier = json.loads(ENGINE_AT_6AA67CF.read_text())["summary"]["ratio_spread"]["golden"]
    assert (
        f"(8 layers and 9 s rounds at 6aa67cf: "
        f"{100 * earlier['decode_throughput_vs_route']['spread']:.1f} %)" in doc
    )
    kernel = next(
        c
        for c in json.loads(AT_4356317.read_text())["cases"]
        if (c["op"], c["state_dtype"], c["batch"]) == ("recurrent", "bfloat16", 128)
    )
    assert (
        f"the GDN decode's {gdn[0] / gdn[1]:.3f}x (the bf16 recurrent step, "
        f"{kernel['speed_vs_vllm_device']:.3f}x vLLM in 4356317's kernel bench at B = 128) on "
        f"{100 * first['route']['categories_share']['gdn_decode']:.0f} % of the device time" in doc
    )


def test_the_small_batch_bf16_recurrent_step_is_quoted():
    small = [
        c["speed_vs_vllm_device"]
        for c in json.loads(AT_4356317.read_text())["cases"]
        if (c["op"], c["state_dtype"]) == ("recurrent", "bfloat16") and c["batch"] <= 16
    ]
    assert len(small) == 5
    assert (
        f"From B = 1 to 16 the bf16 recurrent step is {min(small):.3f}–{max(small):.3f}x vLLM by "
        "device time (4356317)" in flat_doc()
    )


def test_the_1ee138d_engine_run_and_its_profile_are_quoted():
    report = json.loads((AT_1EE138D_RUN / "bench_engine_golden.json").read_text())
    assert report["provenance"]["git_commit"] == "1ee138d"
    assert not report["provenance"]["git_dirty"]
    summary = report["summary"]
    assert summary["targets"]["golden_decode_throughput_at_least_0.99x_route"] == "inconclusive"
    spread = summary["ratio_spread"]["golden"]["decode_throughput_vs_route"]
    rounds = summary["round_ratios"]["golden"]["decode_throughput_vs_route"]
    ratio = summary["ratios"]["golden"]["decode_throughput_vs_route"]
    own = own_throughput_spread(report)
    profile = report["profile"]
    assert profile["workload"] == "decode"
    route, golden = (profile["arms"][arm] for arm in ("route", "golden"))
    extra = profile["vs_route"]["golden"]["categories_us_extra"]
    others = max(
        abs(v) for k, v in extra.items() if k not in ("gdn_decode", "gdn_conv", "memcpy_memset")
    )
    doc = flat_doc()
    assert (
        f"decode throughput moved {own[0]:.2f}x (route) and {own[1]:.2f}x (golden) from round to "
        f"round, golden/route decode throughput {ratio:.3f}x by the medians and "
        f"{spread['median']:.3f}x by the median round ratio (rounds {min(rounds):.2f}–"
        f"{max(rounds):.2f}x, spread {100 * spread['spread']:.0f} %): inconclusive." in doc
    )
    inverse = route["device_us"] / golden["device_us"]
    assert (
        f"the GPU ran {golden['device_us'] / 1e3:.2f} ms of kernels under mode golden against "
        f"{route['device_us'] / 1e3:.2f} ms under mode route "
        f"({golden['device_us'] / route['device_us']:.4f}x; route/golden {inverse:.3f}x)" in doc
    )
    gdn = route["categories_us"]["gdn_decode"], golden["categories_us"]["gdn_decode"]
    assert (
        f"({gdn[1] / 1e3:.2f} ms against {gdn[0] / 1e3:.2f} ms for vLLM's packed decode, "
        f"{gdn[0] / gdn[1]:.3f}x:" in doc
    )
    assert f"and the conv ({extra['gdn_conv'] / 1e3:+.2f} ms)" in doc
    assert f"the other categories moved by {others / 1e3:.2f} ms at most" in doc
    assert f"the copies and memsets by {extra['memcpy_memset'] / 1e3:+.2f} ms" in doc


def test_the_12a52f9_engine_runs_are_quoted_as_inconclusive():
    doc = flat_doc()
    quoted = []
    for name in ("bench_engine_golden.json", "bench_engine_golden_2.json"):
        report = json.loads((AT_12A52F9_RUN / name).read_text())
        assert report["provenance"]["git_commit"].startswith("12a52f9")
        summary = report["summary"]
        assert summary["targets"]["golden_decode_throughput_at_least_0.99x_route"] == (
            "inconclusive"
        )
        spread = summary["ratio_spread"]["golden"]["decode_throughput_vs_route"]
        rounds = summary["round_ratios"]["golden"]["decode_throughput_vs_route"]
        ratio = summary["ratios"]["golden"]["decode_throughput_vs_route"]
        own = own_throughput_spread(report)
        quoted.append((ratio, spread, rounds, own))
    (r1, s1, rounds1, own1), (r2, s2, rounds2, own2) = quoted
    assert (
        f"moved {own1[0]:.2f}x (route) and {own1[1]:.2f}x (golden) in the first run, "
        f"{own2[0]:.2f}x and {own2[1]:.2f}x in the second" in doc
    )
    assert (
        f"{r1:.3f}x by the medians and {s1['median']:.3f}x by the median round ratio in the first "
        f"run (rounds {min(rounds1):.2f}–{max(rounds1):.2f}x, spread {100 * s1['spread']:.0f} %), "
        f"{r2:.3f}x and {s2['median']:.3f}x in the second (rounds "
        f"{min(rounds2):.2f}–{max(rounds2):.2f}x, spread {100 * s2['spread']:.0f} %)" in doc
    )


def test_the_fbcbb14_run_is_quoted():
    report = json.loads(AT_FBCBB14.read_text())
    cases = report["cases"]
    assert report["provenance"]["git_commit"] == "fbcbb14" and report["complete"]
    assert report["summary"]["api_bound_misses"] == []
    doc = flat_doc()
    assert f"the API bound is met in all {len(cases)} cases (ea50d1f: {len(cases) - 1})" in doc
    bitwise = (AT_FBCBB14_RUN / "pytest_kernels.log").read_text()
    assert bitwise.count(".") >= 161 and "F" not in bitwise and "passed" not in bitwise  # cut off
    assert "4 passed" in (AT_FBCBB14_RUN / "pytest_kernels_tail.log").read_text()
    assert "9 passed" in (AT_FBCBB14_RUN / "pytest_kernels_launch.log").read_text()
    assert "after 161 of the 162 cases" in doc

    def median_ratio(op: str) -> str:
        return f"{statistics.median(c['api_bound']['ratio'] for c in cases if c['op'] == op):.2f}"

    assert (
        f"`recurrent_step` {median_ratio('recurrent')}, `conv_update` {median_ratio('conv')}, "
        f"the pair {median_ratio('decode_step')}" in doc
    )

    def device(op: str, state: str, low: int) -> str:
        return device_span(cases, op, state, low, fmt=".3f")

    assert (
        f"at B >= 64 the recurrent step {device('recurrent', 'float32', 64)} with an fp32 state "
        f"and {device('recurrent', 'bfloat16', 64)} with bf16" in doc
    )
    lowest = min(c["speed_vs_vllm_wall"] for c in cases if c["batch"] < 64)
    assert f"every op below B = 64 {lowest:.2f}x or more" in doc


def test_the_host_path_run_is_quoted():
    new, old = (json.loads(p.read_text()) for p in (AT_EA50D1F, SAME_MACHINE))
    assert new["provenance"]["device"] == old["provenance"]["device"]
    assert (
        old["provenance"]["git_commit"]
        == json.loads(CURRENT.read_text())["provenance"]["git_commit"]
    )
    doc = flat_doc()
    misses, before = new["summary"]["api_bound_misses"], old["summary"]["api_bound_misses"]
    (miss,) = misses
    worst = max(m["ratio"] for m in before)
    assert (
        f"missed once of {len(new['cases'])} (the {STATE[miss['state_dtype']]} {miss['op']} at "
        f"B = {miss['batch']}, {miss['ratio']:.2f}x), against {len(before)} of "
        f"{len(old['cases'])} for 6aa67cf's host path on the same machine (up to {worst:.2f}x)"
    ) in doc

    def median_ratio(report: dict, op: str) -> str:
        ratios = [c["api_bound"]["ratio"] for c in report["cases"] if c["op"] == op]
        return f"{statistics.median(ratios):.2f}"

    assert (
        f"`recurrent_step` {median_ratio(new, 'recurrent')} (1.23 with 6aa67cf's host path), "
        f"`conv_update` {median_ratio(new, 'conv')} ({median_ratio(old, 'conv')}), the pair "
        f"{median_ratio(new, 'decode_step')} ({median_ratio(old, 'decode_step')})"
    ) in doc
    assert median_ratio(old, "recurrent") == "1.23"
    single = [c["api_bound"] for c in new["cases"] if c["op"] != "decode_step"]
    pair = [c["api_bound"] for c in new["cases"] if c["op"] == "decode_step"]
    conv = [c for c in new["cases"] if c["op"] == "conv"]
    assert (
        f"{span_of(single, 'checks_us', fmt='.1f')} µs per call of `recurrent_step` or "
        f"`conv_update` and {span_of(pair, 'checks_us', fmt='.1f')} µs for the pair" in doc
    )
    launches = span_of([c["api_bound"] for c in conv], "launch_wall_us", fmt=".0f")
    assert (
        f"the conv's launch took {launches} µs of wall time per call across batch sizes, for "
        f"kernels of "
        f"{span_of(conv, 'kernel_us', 'ours', '.0f')} µs" in doc
    )

    def wall(report: dict, op: str) -> str:
        small = [
            c["speed_vs_vllm_wall"] for c in report["cases"] if c["op"] == op and c["batch"] < 64
        ]
        return f"{statistics.median(small):.2f}x"

    assert (
        f"medians {wall(new, 'recurrent')} for the recurrent step ({wall(old, 'recurrent')} with "
        f"6aa67cf's host path on the same machine), {wall(new, 'conv')} for the conv "
        f"({wall(old, 'conv')}), {wall(new, 'decode_step')} for the decode step "
        f"({wall(old, 'decode_step')})"
    ) in doc
    lowest = [
        min(c["speed_vs_vllm_wall"] for c in r["cases"] if c["batch"] < 64) for r in (new, old)
    ]
    assert f"every op below B = 64 {lowest[0]:.2f}x or more ({lowest[1]:.2f}x)" in doc

    def device(op: str, state: str, low: int, high: int = 1024) -> str:
        return device_span(new["cases"], op, state, low, high)

    assert (
        f"at B >= 64 the recurrent step {device('recurrent', 'float32', 64)} with an fp32 state "
        f"and {device('recurrent', 'bfloat16', 64)} with bf16, the decode step "
        f"{device('decode_step', 'float32', 64)} and {device('decode_step', 'bfloat16', 64)}, the "
        f"conv {device('conv', 'float32', 64)} (fp32 cache) and {device('conv', 'bfloat16', 64)} "
        f"(bf16; " in doc
    )
    assert (
        f"below B = 64 the recurrent step {device('recurrent', 'float32', 1, 32)} and "
        f"{device('recurrent', 'bfloat16', 1, 32)}." in doc
    )
    h200 = by_cell(CURRENT)[("conv", "bfloat16", 512)]["speed_vs_vllm_device"]
    h100 = by_cell(AT_EA50D1F)[("conv", "bfloat16", 512)]["speed_vs_vllm_device"]
    assert f"{h100:.2f}x at B = 512, where the H200 run gave {h200:.2f}x)" in doc
    logs = (HOST_PATH / "pytest_kernels.log").read_text()
    assert "171 passed" in logs and "the 171 cases of" in doc


@pytest.mark.parametrize(
    "evidence, marker",
    [
        (AT_FBCBB14, "bench-decode-table-fbcbb14"),
        (AT_EA50D1F, "bench-decode-table-ea50d1f"),
        (CURRENT, "bench-decode-table"),
        (AT_613A30B, "bench-decode-table-613a30b"),
        (AT_4356317, "bench-decode-table-4356317"),
        (LATEST, "bench-decode-table-344febd"),
        (AT_PACKAGE, "bench-decode-table-ff22b8e"),
    ],
    ids=["fbcbb14", "ea50d1f", "6aa67cf", "613a30b", "4356317", "344febd", "ff22b8e"],
)
def test_each_table_is_its_evidence_file(evidence, marker):
    assert marked_block(DOC.read_text(), marker) == printed("bench_decode.py", "--table", evidence)


def span_of(chosen: list[dict], key: str, arm: str | None = None, fmt: str = ".2f") -> str:
    """``min–max`` of ``case[key]`` (``case[key][arm]`` with an arm) over ``chosen``."""
    values = [c[key] if arm is None else c[key][arm] for c in chosen]
    return f"{min(values):{fmt}}–{max(values):{fmt}}"


def device_span(
    cases: list[dict], op: str, state: str, low: int, high: int = 1024, fmt: str = ".2f"
) -> str:
    """``span_of`` the device-time ratio over ``cases`` of ``op`` and ``state`` with
    ``low <= B <= high``, with its ``x``."""
    return span_of(cells(cases, op, state, low, high), "speed_vs_vllm_device", fmt=fmt) + "x"


def test_the_current_runs_quoted_ranges():
    every = json.loads(CURRENT.read_text())["cases"]

    def device(op: str, state: str, low: int, high: int = 1024) -> str:
        return device_span(every, op, state, low, high)

    doc = flat_doc()
    assert (
        f"the recurrent step {device('recurrent', 'float32', 64)} vLLM with an fp32 state and "
        f"{device('recurrent', 'bfloat16', 64)} with bf16"
    ) in doc
    assert (
        f"serves it {device('decode_step', 'float32', 64)} (fp32) and "
        f"{device('decode_step', 'bfloat16', 64)} (bf16), the conv update "
        f"{device('conv', 'float32', 64)} (fp32 cache) and {device('conv', 'bfloat16', 64)} (bf16)"
    ) in doc
    assert (
        f"Below B = 64 the recurrent step is {device('recurrent', 'float32', 1, 32)} with fp32 "
        f"and {device('recurrent', 'bfloat16', 1, 32)} with bf16, the decode step "
        f"{device('decode_step', 'float32', 1, 32)} and {device('decode_step', 'bfloat16', 1, 32)}"
        f", the conv {device('conv', 'float32', 1, 32)} and {device('conv', 'bfloat16', 1, 32)}."
    ) in doc
    before = cells(current_cases(), "recurrent", "bfloat16")
    assert f"({span_of(before, 'speed_vs_vllm_device')}x at 613a30b's shapes)" in doc
    small_wall = min(c["speed_vs_vllm_wall"] for c in every if c["batch"] < 64)
    assert f"every op below B = 64 is {small_wall:.2f}x vLLM or more" in doc
    exceptions = [c for c in every if c["speed_vs_vllm"] < 1.0 <= c["speed_vs_vllm_device"]]
    assert [(c["op"], c["state_dtype"], c["batch"]) for c in exceptions] == [
        ("conv", "bfloat16", 1)
    ]
    (odd,) = exceptions
    rounds = odd["rounds_us"]
    assert (
        f"the bf16 conv at B = 1 ({odd['speed_vs_vllm']:.3f}), which is the machine's: its "
        f"rounds fall in two groups (ours {min(rounds['ours']):.1f}–{max(rounds['ours']):.1f} "
        f"µs, vLLM {min(rounds['vllm']):.1f}–{max(rounds['vllm']):.1f} µs"
    ) in doc
    assert f"and device time says {odd['speed_vs_vllm_device']:.2f}x" in doc
    fp32, bf16 = (
        cells(every, "recurrent", "float32", 64),
        cells(every, "recurrent", "bfloat16", 128),
    )
    assert (
        f"vLLM moves its bytes at {span_of(fp32, 'fraction_of_copy', 'vllm')} of a same-size "
        f"device copy timed in the same rounds, ours at {span_of(fp32, 'fraction_of_copy', 'ours')}"
    ) in doc
    assert (
        f"ours reaches {span_of(bf16, 'fraction_of_copy', 'ours')} of the copy from B = 128 "
        f"(vLLM {span_of(bf16, 'fraction_of_copy', 'vllm')})"
    ) in doc
    what_if = [c["what_if"] for c in every if "what_if" in c and c["batch"] >= 64]
    plain = [w["grouped"]["speed_vs_vllm"] for w in what_if]
    fma = [w["grouped_fma"]["speed_vs_vllm"] for w in what_if]
    assert (
        f"ran at {min(plain):.2f}–{max(plain):.2f}x vLLM at B >= 64 "
        f"({min(fma):.2f}–{max(fma):.2f}x with FMAs)"
    ) in doc
    small = cells(every, "recurrent", "bfloat16", 1, 32)
    assert (
        f"takes {span_of(small, 'kernel_us', 'ours', '.1f')} µs of device time against vLLM's "
        f"{span_of(small, 'kernel_us', 'vllm', '.1f')} µs"
    ) in doc
    more = [c["kernel_us"]["ours"] - c["kernel_us"]["vllm"] for c in small if c["batch"] <= 16]
    assert f"({min(more):.2f}–{max(more):.2f} µs more per call up to B = 16; less at B = 32)" in doc
    (at_32,) = [c for c in small if c["batch"] == 32]
    assert at_32["kernel_us"]["ours"] < at_32["kernel_us"]["vllm"]


def test_the_current_runs_api_bound_is_quoted():
    report = json.loads(CURRENT.read_text())
    every, misses = report["cases"], report["summary"]["api_bound_misses"]
    missed = [c for c in every if not c["api_bound"]["within"]]
    assert len(missed) == len(misses)
    bounds = [c["api_bound"] for c in missed]
    assert all(
        b["launch_wall_us"] > c["kernel_us"]["ours"] for b, c in zip(bounds, missed, strict=True)
    )
    assert {c["batch"] for c in missed} <= {64, 128, 256, 512}
    single = [c for c in every if c["op"] != "decode_step"]
    pair = [c for c in every if c["op"] == "decode_step"]
    share = [100 * b["checks_us"] / b["excess_us"] for b in bounds]
    doc = flat_doc()
    assert (
        f"the API bound is missed {len(misses)} times of {len(every)}, each at B = 64 to 512" in doc
    )
    assert (
        f"({span_of(bounds, 'launch_wall_us', fmt='.0f')} µs of wall time per call for kernels "
        f"of {span_of(missed, 'kernel_us', 'ours', '.0f')} µs of device time)"
    ) in doc
    assert f"the public functions' {span_of(bounds, 'excess_us', fmt='.1f')} µs over" in doc
    assert (
        f"{span_of([c['api_bound'] for c in single], 'checks_us', fmt='.1f')} µs per call of "
        f"`recurrent_step` or `conv_update` "
        f"({span_of([c['api_bound'] for c in pair], 'checks_us', fmt='.1f')} µs for the pair)"
    ) in doc
    assert f"in the misses {min(share):.0f}–{max(share):.0f} % of the excess" in doc
    within = {(c["op"], c["batch"]) for c in every if c["api_bound"]["within"]}
    assert all((c["op"], 1024) in within for c in every)
    assert all(
        c["api_bound"]["within"] for c in every if c["op"] == "recurrent" and c["batch"] >= 128
    )


def test_the_loose_cells_are_the_machines():
    """In the loose cells vLLM's own kernels (the same in both runs) took over 1.3x their time in
    the run before; in every other cell from B = 64 up they took it within 1.15x."""
    current, previous = by_cell(AT_613A30B), by_cell(PREVIOUS)
    moved = {
        cell: current[cell]["us"]["vllm"] / previous[cell]["us"]["vllm"]
        for cell in current
        if cell[2] >= 64
    }
    assert {cell for cell, m in moved.items() if m > 1.3} == set(LOOSE)
    assert max(m for cell, m in moved.items() if cell not in LOOSE) < 1.15
    loose = [moved[cell] for cell in LOOSE]
    others = [m for cell, m in moved.items() if cell not in LOOSE]
    doc = flat_doc()
    assert f"took {min(loose):.2f}–{max(loose):.2f}x their time there" in doc
    assert f"(every other cell from B = 64 up within {max(others):.2f}x)" in doc


def test_the_613a30b_runs_quoted_ranges_and_misses():
    large = current_cases()
    clean = [c for c in large if (c["op"], c["state_dtype"], c["batch"]) not in LOOSE]

    def span(op: str, state: str, key: str = "speed_vs_vllm", chosen=None) -> str:
        chosen = large if chosen is None else chosen
        values = [c[key] for c in chosen if (c["op"], c["state_dtype"]) == (op, state)]
        return f"{min(values):.2f}–{max(values):.2f}x"

    doc = flat_doc()
    assert f"the recurrent step is {span('recurrent', 'float32')} vLLM with an fp32 state" in doc
    assert f"and {span('recurrent', 'bfloat16')} with bf16" in doc
    assert (
        f"(fp32 {span('decode_step', 'float32', chosen=clean)}, "
        f"bf16 {span('decode_step', 'bfloat16', chosen=clean)}, leaving out the loose cells"
    ) in doc
    conv_fp32 = min(
        c["speed_vs_vllm"] for c in large if c["op"] == "conv" and c["state_dtype"] == "float32"
    )
    assert f"The conv update is {math.floor(100 * conv_fp32) / 100:.2f}x and more" in doc
    bf16 = {
        c["batch"]: c["speed_vs_vllm"]
        for c in clean
        if (c["op"], c["state_dtype"]) == ("conv", "bfloat16")
    }
    assert set(bf16) == {64, 512, 1024}
    assert f"with bf16 it is {bf16[64]:.2f}x at B = 64, {bf16[512]:.2f}x at B = 512 and 1024" in doc
    assert f"{bf16[1024]:.2f}" == f"{bf16[512]:.2f}"
    misses = json.loads(AT_613A30B.read_text())["summary"]["api_bound_misses"]
    missed = {(m["op"], m["state_dtype"], m["batch"]) for m in misses}
    assert missed - set(LOOSE) == {("conv", "float32", 64)}  # the one miss of a clean cell
    assert f"the API bound is missed {len(misses)} times of {len(current_cases(0))}" in doc
    what_if = [c["what_if"] for c in large if "what_if" in c]
    plain = [w["grouped"]["speed_vs_vllm"] for w in what_if]
    fma = [w["grouped_fma"]["speed_vs_vllm"] for w in what_if]
    ours = [c["speed_vs_vllm"] for c in large if "what_if" in c]
    assert max(plain) < 1.0 and max(fma) < 1.0  # neither reaches vLLM
    gains = [f - o for f, o in zip(fma, ours, strict=True)]
    assert -0.05 < min(gains) and max(gains) < 0.03  # "between 0.04 below and 0.02 above ours"
    assert (
        f"ran at {min(plain):.2f}–{max(plain):.2f}x vLLM at B >= 64 "
        f"({min(fma):.2f}–{max(fma):.2f}x with FMAs), against ours at "
        f"{min(ours):.2f}–{max(ours):.2f}x" in doc
    )


def test_the_conv_sweep_is_quoted():
    """128 channels over 4 warps: the fastest shape or within 4 % of it in every swept cell."""
    conv = [c for c in current_cases() if c["op"] == "conv"]
    quoted = []
    for c in conv:
        times = {(r["config"]["block_d"], r["config"]["num_warps"]): r["us"] for r in c["sweep"]}
        assert times[(128, 4)] <= 1.04 * min(times.values()), c["batch"]
        quoted.append(
            (c["state_dtype"], c["batch"], times[(128, 4)], times[(256, 4)], c["us"]["vllm"])
        )
    doc = flat_doc()
    for state, batch, fast, default, vllm in quoted:
        if (state, batch) in (("bfloat16", 64), ("bfloat16", 512), ("bfloat16", 1024)):
            assert f"{fast:.1f} / {default:.1f} µs at" in doc and f"(vLLM {vllm:.1f} µs)" in doc
        if (state, batch) == ("float32", 1024):
            assert f"cache {fast:.1f} / {default:.1f} µs at B = 1024" in doc


def test_the_engine_paragraph_quotes_bench_engine_golden():
    summary = json.loads(ENGINE_AT_6AA67CF.read_text())["summary"]
    ratios, spread = summary["ratios"]["golden"], summary["ratio_spread"]["golden"]
    decode = summary["round_ratios"]["golden"]["decode_throughput_vs_route"]
    doc = flat_doc()
    assert (
        f"decode throughput {ratios['decode_throughput_vs_route']:.3f}x, inter-token latency "
        f"{ratios['itl_vs_route']:.3f}x" in doc
    )
    assert f"ratio ran {min(decode):.2f}–{max(decode):.2f}x (a spread of " in doc
    assert f"spread of {100 * spread['decode_throughput_vs_route']['spread']:.0f} % of its" in doc
    assert f"latency {100 * spread['itl_vs_route']['spread']:.0f} %" in doc
    assert f"the decode throughput is {statistics.median(decode):.3f}x" in doc
    interval = spread["decode_throughput_vs_route"]["median_interval"]
    low, high = interval["interval"]
    assert interval["coverage"] >= 0.95
    first, last = (sorted(decode).index(v) + 1 for v in (low, high))
    assert (first, last) == (2, 8)  # the doc's ordinals
    assert (
        f"(the 2nd and 8th of the {len(decode)} ordered rounds, "
        f"{100 * interval['coverage']:.1f} % coverage)" in doc
    )
    assert f"coverage) runs {low:.2f}–{high:.2f}." in doc
    assert summary["targets"]["golden_decode_throughput_at_least_0.99x_route"] in doc
    rounds = json.loads(ENGINE_AT_6AA67CF.read_text())["rounds"]
    for arm in ("route", "golden"):
        throughput = [r[arm]["decode"]["output_tok_s"] for r in rounds]
        assert f"{max(throughput) / min(throughput):.2f}x ({arm})" in doc
    before = json.loads(ENGINE_AT_613A30B.read_text())["summary"]
    earlier = before["round_ratios"]["golden"]["decode_throughput_vs_route"]
    spread = before["ratio_spread"]["golden"]["decode_throughput_vs_route"]["spread"]
    assert (
        f"gave {before['ratios']['golden']['decode_throughput_vs_route']:.3f}x by medians, "
        f"{statistics.median(earlier):.3f}x by the median round ratio, rounds "
        f"{min(earlier):.2f}–{max(earlier):.2f}x (spread {100 * spread:.0f} %)"
    ) in doc


def test_the_triton_3_6_counts_behind_the_what_if_timing_are_quoted():
    def ipe(name: str) -> dict[str, dict]:
        cases = json.loads((ROOT / "docs" / "evidence" / name).read_text())["cases"]
        return {c["arm"]: c for c in cases if (c["state"], c["batch"]) == ("bf16", 64)}

    timed, guarded = ipe("sass_mix_triton3.6.0_as_timed.json"), ipe("sass_mix_triton3.6.0.json")
    divisions = timed["what_if_grouped"]["top_opcodes"]["FCHK"]
    assert divisions >= 64  # one per replicated element, not a few per thread
    # top_opcodes holds the 12 most frequent: FCHK is not among them once guarded
    assert "FCHK" not in guarded["what_if_grouped"]["top_opcodes"]
    assert (
        guarded["what_if_grouped"]["instructions_per_element"]
        < guarded["ours"]["instructions_per_element"]
        < timed["what_if_grouped"]["instructions_per_element"]
    )
    doc = flat_doc()
    assert (
        f"issues {timed['what_if_grouped']['instructions_per_element']:.2f} instructions per "
        f"element with a bf16 state, {divisions} IEEE divisions per thread among them" in doc
    )
    assert (
        f"{guarded['what_if_grouped']['instructions_per_element']:.2f} and "
        f"{guarded['what_if_grouped_fma']['instructions_per_element']:.2f} instructions per "
        f"element under Triton 3.6.0, against vLLM 0.26.0's "
        f"{guarded['vllm']['instructions_per_element']:.2f} and ours' "
        f"{guarded['ours']['instructions_per_element']:.2f}" in doc
    )


def test_the_fp32_counts_of_the_kernels_as_timed_are_quoted():
    cases = json.loads((ROOT / "docs/evidence/sass_mix_triton3.6.0.json").read_text())["cases"]
    fp32 = {c["arm"]: c for c in cases if (c["state"], c["batch"]) == ("fp32", 64)}
    assert (
        f"ours issues {fp32['ours']['instructions_per_element']:.2f} instructions per element "
        f"against vLLM 0.26.0's {fp32['vllm']['instructions_per_element']:.2f}" in flat_doc()
    )


def test_the_engine_run_with_the_call_plans_is_quoted():
    report = json.loads(ENGINE_HOST_PATH.read_text())
    summary, rounds = report["summary"], report["rounds"]
    assert "H100" in report["provenance"]["device"]
    decode = summary["round_ratios"]["golden"]["decode_throughput_vs_route"]
    by_medians = summary["ratios"]["golden"]["decode_throughput_vs_route"]
    spread = summary["ratio_spread"]["golden"]["decode_throughput_vs_route"]["spread"]
    own = {
        arm: max(r[arm]["decode"]["output_tok_s"] for r in rounds)
        / min(r[arm]["decode"]["output_tok_s"] for r in rounds)
        for arm in ("route", "golden")
    }
    doc = flat_doc()
    assert (
        f"the same measurement with {len(rounds)} rounds was tight: each engine's own decode "
        f"throughput varied {own['route']:.2f}x (route) and {own['golden']:.2f}x (golden)" in doc
    )
    assert (
        f"ran {min(decode):.3f}–{max(decode):.3f}x (a spread of {100 * spread:.1f} % of its "
        f"median): {by_medians:.3f}x by the medians, {statistics.median(decode):.3f}x by the "
        f"median round ratio; inter-token latency "
        f"{summary['ratios']['golden']['itl_vs_route']:.3f}x (longer)" in doc
    )
    below = sum(r < 0.99 for r in decode)
    assert below == len(decode) - 1 and f"{max(decode):.3f}x" in doc
    assert summary["targets"]["golden_decode_throughput_at_least_0.99x_route"] == "inconclusive"
    cost = sorted(100 * (1 - r) for r in (by_medians, statistics.median(decode)))
    assert f"costs this workload {cost[0]:.1f}–{cost[1]:.1f} % of its decode throughput" in doc
    recurrent = by_cell(AT_EA50D1F)[("recurrent", "bfloat16", 128)]["speed_vs_vllm_device"]
    assert f"is {recurrent:.2f}x vLLM's with a bfloat16 state at B = 128" in doc
