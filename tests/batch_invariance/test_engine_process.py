"""gdn_evidence.e2e.engine_process with stand-in engines (a module that answers like an engine
script's ``--run-engine``): each engine's outcome reaches the orchestrator, whether it returned,
raised, exited without a result or ran past the time."""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

from gdn_evidence.e2e.engine_process import (
    run_engine_processes,
    start_engine_process,
    write_outcome,
)

ROOT = Path(__file__).resolve().parents[2]
STAND_IN = """
    import sys
    import time
    from pathlib import Path

    from gdn_evidence.e2e.engine_process import write_outcome


    def run(spec):
        print("engine log line", spec["kind"], flush=True)
        if spec["kind"] == "raise":
            raise RuntimeError("boom")
        if spec["kind"] == "exit":
            sys.exit(3)
        if spec["kind"] == "hang":
            time.sleep(120)
        return {"engine": spec["kind"]}


    argv = sys.argv
    write_outcome(run, argv[argv.index("--run-engine") + 1], Path(argv[argv.index("--result") + 1]))
"""


def test_each_engines_outcome_reaches_the_orchestrator(tmp_path):
    (tmp_path / "stand_in_engine.py").write_text(textwrap.dedent(STAND_IN))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])}

    def start(kind: str):
        return start_engine_process(
            "stand_in_engine", {"kind": kind}, env, prefix=str(tmp_path / "engine_")
        )

    outcomes, logs = {}, {}

    def finished(kind: str, outcome: dict, log: str) -> None:
        outcomes[kind], logs[kind] = outcome, log

    kinds = ["ok", "raise", "exit", "hang"]
    run_engine_processes(kinds, start, finished, parallel=2, timeout=10.0)

    assert outcomes["ok"] == {"engine": "ok"}
    assert outcomes["raise"]["error"] == "RuntimeError: boom"
    assert "Traceback" in outcomes["raise"]["trace"]
    assert outcomes["exit"] == {"error": "exited 3"}
    assert outcomes["hang"] == {"error": "timed out"}
    assert all(f"engine log line {kind}" in logs[kind] for kind in kinds)


def test_write_outcome_records_the_return_value_or_the_exception(tmp_path):
    result = tmp_path / "result.json"
    write_outcome(lambda spec: {"twice": spec["n"] * 2}, '{"n": 21}', result)
    assert result.read_text() == '{"twice": 42}'
    write_outcome(lambda spec: 1 / spec["n"], '{"n": 0}', result)
    assert '"error": "ZeroDivisionError: division by zero"' in result.read_text()
