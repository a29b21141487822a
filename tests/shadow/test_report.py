"""``python -m vllm_gdn_invariant report`` and the demo's shadow summary, on written records."""

from __future__ import annotations

import json

import pytest

from vllm_gdn_invariant.cli import main
from vllm_gdn_invariant.cli.demo import shadow_line, shadow_summary
from vllm_gdn_invariant.shadow.compare import FieldStats
from vllm_gdn_invariant.shadow.config import ShadowConfig, parse_shadow
from vllm_gdn_invariant.shadow.record import check_record, failure_record

BUCKETS = ("0", "1", "2", "3-4", "5-8", "9-16", ">16")


def stats(compared, differing, max_ulp=0):
    histogram = dict.fromkeys(BUCKETS, 0)
    histogram["0"] = compared - differing
    histogram["1" if max_ulp <= 1 else ">16"] += differing
    return FieldStats(compared, differing, 1e-7 * bool(differing), max_ulp, 0, histogram, rows=2)


def record(layer, reference="golden", provider="routed", step_kind="mixed", state_diff=0):
    return check_record(
        layer=f"model.layers.{layer}.linear_attn",
        step=1,
        step_kind=step_kind,
        provider=provider,
        mode="route",
        reference=reference,
        reference_impl="goldens" if reference == "golden" else "vllm-decode-only",
        state_dtype="float32",
        conv_state_dtype="bfloat16",
        rows=2,
        decode_rows=5,
        snapshot_bytes=1000,
        stats={
            "output": stats(512, 0),
            "recurrent_state": stats(32768, state_diff, 40 if state_diff else 0),
            "conv_state": stats(3072, 0),
        },
    )


def write(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return str(path)


def report(argv, capsys):
    code = main(["report", *argv], prog="vllm-gdn-invariant")
    out = capsys.readouterr()
    return code, out.out, out.err


def test_report_prints_a_table_per_reference_and_provider_by_layer_and_field(tmp_path, capsys):
    first = write(
        tmp_path / "s.1.jsonl",
        [record(10, state_diff=7), record(2), record(2, provider="vllm-packed-decode")],
    )
    second = write(
        tmp_path / "s.2.jsonl",
        [record(2, state_diff=3), failure_record("reference", "RuntimeError: boom")],
    )
    code, out, _ = report([first, second], capsys)
    assert code == 0
    lines = out.splitlines()
    assert lines[0] == "gdn_invariant shadow report: 4 checks, 1 failures, 2 file(s)"
    assert "reference golden, provider routed: 3 checks (3 mixed); computed by goldens" in lines
    assert (
        "reference golden, provider vllm-packed-decode: 1 checks (1 mixed); computed by goldens"
        in lines
    )
    start = lines.index(
        "reference golden, provider routed: 3 checks (3 mixed); computed by goldens"
    )
    rows = [line.split() for line in lines[start + 2 : start + 8]]
    # layers in numeric order (2 before 10), fields in order; summed over checks
    assert [r[:2] for r in rows] == [
        [f"model.layers.{n}.linear_attn", name]
        for n in (2, 10)
        for name in ("output", "recurrent_state", "conv_state")
    ]
    state_2 = rows[1]
    assert state_2[2:6] == ["2", "1", str(2 * 32768), "3"]  # checks, with diff, compared, differing
    assert state_2[7] == "40" and state_2[8] == f"{2 * 32768 - 3}/0/0/0/0/0/3"
    assert "  reference: 1 (first: RuntimeError: boom)" in lines


@pytest.mark.parametrize(
    "content, message",
    [
        ("not json\n", "s.jsonl:1: not JSON"),
        ('{"a": 1}\n', "s.jsonl:1: not a shadow record"),
        ("", "no check records"),
    ],
)
def test_unreadable_input_exits_1_with_the_file_and_line(tmp_path, capsys, content, message):
    path = tmp_path / "s.jsonl"
    path.write_text(content)
    code, out, err = report([str(path)], capsys)
    assert code == 1 and out == "" and message in err


def test_missing_file_exits_1(tmp_path, capsys):
    code, _, err = report([str(tmp_path / "none.jsonl")], capsys)
    assert code == 1 and "No such file" in err


def test_plot_writes_a_png_of_the_ulp_histograms(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    log = write(tmp_path / "s.1.jsonl", [record(0, state_diff=5), record(0, reference="decode")])
    png = tmp_path / "ulp.png"
    code, out, _ = report([log, "--plot", str(png)], capsys)
    assert code == 0 and f"plot: {png}" in out
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_demo_summary_counts_this_runs_checks_from_every_process(tmp_path):
    config = parse_shadow(f"1.0,ref=golden+decode,out={tmp_path}/s.jsonl")
    old = {**record(0, state_diff=9), "time": 1.0}  # an earlier run appended to the same file
    write(config.path_for(11), [old, record(0, state_diff=2), record(0, reference="decode")])
    write(config.path_for(12), [record(1), failure_record("record", "OSError: full")])
    summary = shadow_summary(config, since=100.0)
    assert (summary["checks"], summary["with_difference"], summary["failures"]) == (3, 1, 1)
    golden = summary["by_reference"]["golden"]
    assert golden["checks_with_difference_by_field"]["recurrent_state"] == 1
    assert golden["max_ulp"]["recurrent_state"] == 40
    assert summary["by_reference"]["decode"]["with_difference"] == 0
    assert len(summary["files"]) == 2
    assert shadow_line(summary).startswith("3 checks, 1 with a difference, 1 failures")
    assert shadow_summary(ShadowConfig(), since=0.0) == {"enabled": False}
