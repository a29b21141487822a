"""The JSONL file of a process is capped: a full file is rotated, the oldest dropped."""

from __future__ import annotations

from pathlib import Path

import pytest

from vllm_gdn_invariant.shadow.checker import ShadowChecker
from vllm_gdn_invariant.shadow.config import ROTATED_FILES, parse_shadow, rotated_path
from vllm_gdn_invariant.shadow.metrics import ShadowMetrics
from vllm_gdn_invariant.shadow.record import JsonlWriter, read_records

LINE = len('{"kind":"check","i":"000"}\n')


def record(i: int) -> dict:
    return {"kind": "check", "i": f"{i:03d}"}


def numbers(path: Path) -> list[int]:
    return [int(r["i"]) for r in read_records(path)]


def test_a_full_file_is_rotated_and_the_oldest_beyond_the_kept_ones_is_dropped(tmp_path):
    path = tmp_path / "s.7.jsonl"
    writer = JsonlWriter(lambda pid: path, max_bytes=3 * LINE)
    for i in range(20):
        writer.write(record(i))
    writer.close()
    assert ROTATED_FILES == 3
    assert numbers(path) == [18, 19]
    assert [numbers(rotated_path(path, n)) for n in (1, 2, 3)] == [
        [15, 16, 17],
        [12, 13, 14],
        [9, 10, 11],
    ]
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "s.7.1.jsonl",
        "s.7.2.jsonl",
        "s.7.3.jsonl",
        "s.7.jsonl",
    ]
    assert sum(p.stat().st_size for p in tmp_path.iterdir()) <= (ROTATED_FILES + 1) * 3 * LINE


def test_a_file_left_by_an_earlier_writer_counts_toward_the_cap(tmp_path):
    path = tmp_path / "s.jsonl"
    first = JsonlWriter(lambda pid: path, max_bytes=2 * LINE)
    first.write(record(0))
    first.close()
    second = JsonlWriter(lambda pid: path, max_bytes=2 * LINE)
    second.write(record(1))
    second.write(record(2))
    second.close()
    assert numbers(rotated_path(path, 1)) == [0, 1]
    assert numbers(path) == [2]


def test_a_record_longer_than_the_cap_gets_a_file_of_its_own(tmp_path):
    path = tmp_path / "s.jsonl"
    writer = JsonlWriter(lambda pid: path, max_bytes=LINE)
    writer.write(record(0))
    writer.write({"kind": "check", "i": "001", "pad": "x" * 100})
    writer.write(record(2))
    writer.close()
    assert [numbers(rotated_path(path, n)) for n in (2, 1)] == [[0], [1]]
    assert numbers(path) == [2]


def test_without_a_cap_the_file_grows(tmp_path):
    path = tmp_path / "s.jsonl"
    writer = JsonlWriter(lambda pid: path)
    for i in range(50):
        writer.write(record(i))
    writer.close()
    assert numbers(path) == list(range(50)) and list(tmp_path.iterdir()) == [path]


def test_rotated_files_keep_the_suffix_so_a_glob_of_every_process_finds_them():
    assert rotated_path(Path("/a/shadow.42.jsonl"), 1) == Path("/a/shadow.42.1.jsonl")
    assert rotated_path(Path("/a/run-42"), 2) == Path("/a/run-42.2")


def test_the_checkers_file_is_capped_by_max_file_mb(tmp_path):
    config = parse_shadow(f"1.0,max_file_mb=0.5,out={tmp_path}/s.jsonl")
    checker = ShadowChecker(config, "route", metrics=ShadowMetrics())
    assert checker.writer.max_bytes == 512 * 1024
    checker.close()


def test_a_cap_that_is_not_positive_is_refused(tmp_path):
    with pytest.raises(ValueError, match="max_bytes must be positive"):
        JsonlWriter(lambda pid: tmp_path / "s.jsonl", max_bytes=0)
