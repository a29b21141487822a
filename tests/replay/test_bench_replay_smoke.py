"""scripts/bench_replay.py runs end to end in its CPU smoke mode and writes its JSON."""

import json
import subprocess
import sys
from pathlib import Path

from ..doc_blocks import marked_block

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "bench_replay.py"


def test_the_smoke_run_writes_timings_ratios_and_provenance(tmp_path):
    out = tmp_path / "smoke.json"
    subprocess.run(
        [sys.executable, str(SCRIPT), "--smoke", "--out", str(out)], check=True, timeout=300
    )
    record = json.loads(out.read_text())
    assert record["schema"] == "vllm-gdn-invariant/bench-replay/1"
    assert record["provenance"]["source_sha256"]
    (row,) = record["rows"]
    assert set(row["median_s"]) == {"replay", "per_token", "replay_backward"}
    assert all(len(times) == 2 and min(times) > 0 for times in row["seconds"].values())
    assert row["ratios"]["per_token/replay"] > 0
    assert set(row["skipped"]) == {"chunk", "chunk_backward"}


def test_the_docs_speed_table_is_the_evidence_files():
    root = SCRIPT.parents[1]
    table = subprocess.run(
        [sys.executable, str(SCRIPT), "--table", str(root / "docs/evidence/bench_replay.json")],
        check=True,
        capture_output=True,
        text=True,
        timeout=300,
    ).stdout.strip()
    doc = (root / "docs" / "replay.md").read_text()
    assert marked_block(doc, "bench-replay-table") == table
