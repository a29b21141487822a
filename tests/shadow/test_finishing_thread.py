"""Checks whose statistics are still on their way (CUDA) are finished once they arrive: by the
serving thread at the start of a step (never waiting), by the checker's thread when the hooks
are idle, by ``drain`` and ``close``; in launch order, and a failure there is counted like
any other. ``close`` stops the checker's thread and lets the checker go. An event stand-in
plays the CUDA event."""

from __future__ import annotations

import gc
import threading
import time
import weakref
from types import SimpleNamespace

import torch

from vllm_gdn_invariant.shadow import checker as checker_module
from vllm_gdn_invariant.shadow.checker import InFlight, Probe, ShadowChecker
from vllm_gdn_invariant.shadow.compare import STATS_WIDTH, PendingStats
from vllm_gdn_invariant.shadow.config import parse_shadow
from vllm_gdn_invariant.shadow.metrics import ShadowMetrics
from vllm_gdn_invariant.shadow.record import read_records

from .helpers import make_checker, records

FIELDS = ("output", "recurrent_state", "conv_state")


class Arrival:
    """An event stand-in: ``query`` is True and ``synchronize`` returns once ``arrived`` is
    set."""

    def __init__(self) -> None:
        self.arrived = threading.Event()

    def query(self) -> bool:
        return self.arrived.is_set()

    def synchronize(self) -> None:
        self.arrived.wait()


def in_flight(event: Arrival, differing: int = 0) -> InFlight:
    host = torch.zeros((len(FIELDS), STATS_WIDTH), dtype=torch.int64)
    host[:, 3:9] = 4  # 4 elements at distance 0 ...
    host[:, 10] = 2  # ... in 2 rows of 2 elements
    host[1, 0] = differing
    host[1, 3:9] -= differing
    host[1, 1] = 40 if differing else 0
    record = {
        "layer": "model.layers.0.linear_attn",
        "step": 1,
        "step_kind": "decode",
        "provider": "vllm-packed-decode",
        "mode": "route",
        "reference": "golden",
        "reference_impl": "golden-kernels",
        "state_dtype": "float32",
        "conv_state_dtype": "bfloat16",
        "decode_rows": 2,
        "snapshot_bytes": 100,
    }
    return InFlight(PendingStats(list(FIELDS), [2, 2, 2], host, event), record)


def test_a_check_is_recorded_once_its_statistics_arrive(tmp_path):
    checker = make_checker(tmp_path, "1.0")
    event = Arrival()
    checker.submit(in_flight(event, differing=1))
    assert not checker.drain(timeout=0.05)  # still on its way: nothing written, nothing counted
    assert records(checker) == [] and checker.stats.checks == 0
    event.arrived.set()
    assert checker.drain(timeout=10)
    (record,) = records(checker)
    assert record["rows"] == 2 and record["reference_impl"] == "golden-kernels"
    assert record["recurrent_state"]["differing"] == 1
    assert record["recurrent_state"]["ulp_histogram"][">16"] == 1
    assert checker.stats.checks == 1 and checker.stats.with_difference == 1


def submit_steps(checker, steps: int) -> list[Arrival]:
    """Submit checks of steps 0, 1, ...; their events, none arrived."""
    events = [Arrival() for _ in range(steps)]
    for i, event in enumerate(events):
        check = in_flight(event)
        check.record["step"] = i
        checker.submit(check)
    return events


def test_checks_are_finished_in_launch_order(tmp_path):
    checker = make_checker(tmp_path, "1.0")
    events = submit_steps(checker, 3)
    for event in reversed(events):
        event.arrived.set()
    assert checker.drain(timeout=10)
    assert [r["step"] for r in records(checker)] == [0, 1, 2]


def test_a_failure_while_finishing_is_counted_and_the_rest_are_finished(tmp_path):
    checker = make_checker(tmp_path, "1.0")
    broken, fine = Arrival(), Arrival()
    bad = in_flight(broken)
    bad.stats.host = torch.zeros(1)  # not a statistics row: finishing it raises
    checker.submit(bad)
    checker.submit(in_flight(fine))
    broken.arrived.set()
    fine.arrived.set()
    assert checker.drain(timeout=10)
    assert checker.stats.failures == {"compare": 1} and checker.stats.checks == 1
    kinds = [r["kind"] for r in records(checker)]
    assert kinds == ["failure", "check"]


def test_a_new_step_finishes_the_arrived_checks_in_order_without_waiting(tmp_path, monkeypatch):
    monkeypatch.setattr(checker_module, "IDLE_S", 60.0)  # the idle thread stays out of it
    checker = make_checker(tmp_path, "1.0")
    events = submit_steps(checker, 3)
    events[0].arrived.set()
    events[2].arrived.set()  # behind check 1, still on its way
    metadata = SimpleNamespace(num_decodes=0)  # a step with nothing to check

    def step() -> None:
        probe = Probe(object(), SimpleNamespace(prefix="model.layers.0.linear_attn"), metadata)
        assert checker.prepare(lambda: probe, None, None, None, None) is None

    step()
    assert [r["step"] for r in records(checker)] == [0]
    events[1].arrived.set()
    step()
    assert [r["step"] for r in records(checker)] == [0, 1, 2]


def test_the_checkers_thread_finishes_arrived_checks_when_the_hooks_are_idle(tmp_path):
    checker = make_checker(tmp_path, "1.0")
    event = Arrival()
    checker.submit(in_flight(event))
    event.arrived.set()
    deadline = time.monotonic() + 10
    while not records(checker) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(records(checker)) == 1 and checker.stats.checks == 1


def finishing_threads() -> int:
    """The checkers' threads and their metrics' export threads that run now."""
    names = ("gdn-invariant-shadow", "gdn-shadow-metrics")
    return sum(t.name in names for t in threading.enumerate())


def test_close_finishes_the_checks_in_flight_stops_the_thread_and_lets_the_checker_go(
    tmp_path, monkeypatch
):
    monkeypatch.setattr(checker_module, "IDLE_S", 60.0)  # only close finishes the check
    before = finishing_threads()
    for i in range(3):  # owners that make checkers one after another accumulate nothing
        config = parse_shadow(f"1.0,out={tmp_path}/s{i}.jsonl")
        checker = ShadowChecker(config, "route", metrics=ShadowMetrics(str(tmp_path)))
        event = Arrival()
        checker.submit(in_flight(event, differing=1))
        assert finishing_threads() == before + 1
        checker.failed("record", OSError("disk full"))  # a change the metrics thread exports
        assert finishing_threads() == before + 2
        event.arrived.set()
        assert checker.close(timeout=10)
        assert finishing_threads() == before
        assert [r["kind"] for r in read_records(checker.writer.path)] == ["failure", "check"]
        metrics_text = next(tmp_path.glob("*.prom")).read_text()
        assert 'gdn_invariant_shadow_checks_total{layer="model.layers.0.linear_attn"' in (
            metrics_text
        )  # exported at close, not a second later by the metrics thread
        (tmp_path / next(tmp_path.glob("*.prom")).name).unlink()
        gone = weakref.ref(checker)
        del checker, event
        gc.collect()
        assert gone() is None  # no thread and no exit finalizer holds it


def test_close_gives_up_after_its_timeout_and_a_closed_checker_only_serves(tmp_path):
    checker = make_checker(tmp_path, "1.0")
    late = Arrival()
    checker.submit(in_flight(late))
    assert not checker.close(timeout=0.05)
    assert checker.close(timeout=0.05) is False  # again: still nothing arrived, nothing raised
    late.arrived.set()
    assert checker.close(timeout=10)
    assert len(records(checker)) == 1

    def not_called(*args):
        raise AssertionError("a closed checker looked at the step")

    assert checker.run(not_called, not_called, None, None, None, None, lambda: "served") == (
        "served"
    )
    assert checker.stats.failures == {}
