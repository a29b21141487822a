"""The JSONL records of the shadow checker and the per-process file they go to.

A check record (``"kind": "check"``), one per layer, step and reference::

    {"kind": "check", "time": 1733200000.123, "pid": 4242, "process": "VllmWorker-0",
     "layer": "model.layers.0.linear_attn", "step": 17, "step_kind": "mixed",
     "provider": "routed", "mode": "route", "reference": "golden",
     "reference_impl": "golden-kernels",
     "state_dtype": "float32", "conv_state_dtype": "bfloat16", "rows": 4,
     "decode_rows": 12, "snapshot_bytes": 8405120,
     "output": {"compared": ..., "differing": ..., "max_abs_diff": ..., "max_ulp": ...,
                "nan_mismatches": ..., "ulp_histogram": {"0": ..., "1": ..., ...}},
     "recurrent_state": {...}, "conv_state": {...}}

``step_kind`` is ``decode`` (a decode-only step) or ``mixed`` (decode rows beside prefills);
``provider`` says what served the rows (checker.py), ``reference_impl`` what computed the
reference (``goldens``, ``golden-kernels`` or ``vllm-decode-only``: reference.py);
``step`` counts this process's steps.
A failure record (``"kind": "failure"``) has time, pid, process, ``stage`` and ``error``.
A full file is rotated (:class:`JsonlWriter`). This module imports neither torch nor vLLM (the
``report`` command reads records with it).
"""

from __future__ import annotations

import json
import multiprocessing
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from vllm_gdn_invariant.shadow.config import ROTATED_FILES, rotated_path

if TYPE_CHECKING:
    from vllm_gdn_invariant.shadow.compare import FieldStats

FIELDS = ("output", "recurrent_state", "conv_state")  # the fields of a check, in order


def process_fields() -> dict[str, Any]:
    return {
        "time": round(time.time(), 6),
        "pid": os.getpid(),
        "process": multiprocessing.current_process().name,
    }


def check_record(
    *,
    layer: str,
    step: int,
    step_kind: str,
    provider: str,
    mode: str,
    reference: str,
    reference_impl: str,
    state_dtype: str,
    conv_state_dtype: str,
    rows: int,
    decode_rows: int,
    snapshot_bytes: int,
    stats: dict[str, FieldStats],
) -> dict[str, Any]:
    record: dict[str, Any] = {"kind": "check", **process_fields()}
    record.update(
        layer=layer,
        step=step,
        step_kind=step_kind,
        provider=provider,
        mode=mode,
        reference=reference,
        reference_impl=reference_impl,
        state_dtype=state_dtype,
        conv_state_dtype=conv_state_dtype,
        rows=rows,
        decode_rows=decode_rows,
        snapshot_bytes=snapshot_bytes,
    )
    for name in FIELDS:
        record[name] = stats[name].to_json()
    return record


def failure_record(stage: str, error: str) -> dict[str, Any]:
    return {"kind": "failure", **process_fields(), "stage": stage, "error": error}


class JsonlWriter:
    """Appends records to this process's file (``path_for(pid)``), opened on first write and
    reopened when the process's pid changes (a fork).

    With ``max_bytes``, a record that would take the file past it goes to a new file: the
    full one is renamed :func:`~vllm_gdn_invariant.shadow.config.rotated_path` ``1``, the
    older ones move up one index and the one beyond ``ROTATED_FILES`` is deleted. A file holds
    whole records only (a record longer than ``max_bytes`` gets a file of its own).
    """

    def __init__(self, path_for: Callable[[int], Path], max_bytes: int | None = None) -> None:
        if max_bytes is not None and max_bytes <= 0:
            raise ValueError(f"max_bytes must be positive, got {max_bytes}")
        self._path_for = path_for
        self.max_bytes = max_bytes
        self._file: IO[str] | None = None
        self._size = 0
        self._pid: int | None = None
        self._lock = threading.Lock()

    @property
    def path(self) -> Path:
        return Path(self._path_for(os.getpid()))

    def write(self, record: dict[str, Any]) -> None:
        line = json.dumps(record, separators=(",", ":")) + "\n"  # ASCII: chars are bytes
        with self._lock:
            if self._file is None or self._pid != os.getpid():
                self._open()
            full = self.max_bytes is not None and self._size + len(line) > self.max_bytes
            if full and self._size:
                self._file.close()
                self._file = None  # reopened by the next write if the rotation fails
                self._rotate()
                self._open()
            self._file.write(line)
            self._file.flush()
            self._size += len(line)

    def _open(self) -> None:
        self._pid = os.getpid()
        self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115
        self._size = os.fstat(self._file.fileno()).st_size

    def _rotate(self) -> None:
        """Move the current file to index 1 and each older one up one; drop the oldest."""
        path = self.path
        rotated_path(path, ROTATED_FILES).unlink(missing_ok=True)
        for index in range(ROTATED_FILES - 1, 0, -1):
            older = rotated_path(path, index)
            if older.exists():
                os.replace(older, rotated_path(path, index + 1))
        os.replace(path, rotated_path(path, 1))

    def close(self) -> None:
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None


def read_records(path: str | Path) -> list[dict[str, Any]]:
    """The records of one JSONL file; raises ValueError naming the file and line of a bad one."""
    records = []
    with open(path, encoding="utf-8") as fh:
        for number, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{number}: not JSON ({exc.msg})") from None
            if not isinstance(record, dict) or "kind" not in record:
                raise ValueError(f"{path}:{number}: not a shadow record")
            records.append(record)
    return records
