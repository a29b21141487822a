"""The engine benchmark on CPU with stand-in engine processes: an engine lost mid-run (exited,
stdin closed, FAILED, no answer) is recorded with its log's root cause and last lines, and
``--max-num-seqs`` reaches the engine's ``LLM`` arguments."""

from __future__ import annotations

import json
import sys
import textwrap

import pytest

from gdn_evidence.e2e import bench
from gdn_evidence.e2e.plugin_site import plugin_site

CAUSE = "RuntimeError: CUDA error: an illegal memory access was encountered"

# A stand-in engine: READY, then answers every op but the n-th (argv[2]: 0 never, -1 exits
# at once), at which it logs CAUSE and exits 3; argv[3] "hang" makes it sleep 4 s first,
# "failed" answers FAILED instead, "slow_warm" answers the warm-up op 1 s late. It logs each
# op it answers with the time.
STAND_IN = textwrap.dedent(
    f"""
    import json, sys, time
    arm, die_at, how = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    print("{bench.PROTOCOL}READY " + json.dumps({{"start_seconds": 0.1}}), flush=True)
    if die_at < 0:
        print({CAUSE!r}, file=sys.stderr, flush=True)
        sys.exit(3)
    asked = 0
    for line in sys.stdin:
        op = line.strip()
        if op == "quit":
            break
        if op == {bench.WARMED!r} and how == "slow_warm":
            time.sleep(1.0)
        asked += 1
        if asked == die_at:
            print("step 1 of 2", file=sys.stderr)
            print({CAUSE!r}, file=sys.stderr, flush=True)
            if how == "hang":
                time.sleep(4)
            if how == "failed":
                print("{bench.PROTOCOL}FAILED " + json.dumps({{"error": "bad op"}}), flush=True)
                continue
            sys.exit(3)
        payload = {{"itl_ms": 2.0, "seconds": 1.0, "device_us": 1.0, "output_tok_s": 100.0,
                    "categories_share": {{"gdn": 1.0}}}}
        print(f"answered {{op}} at {{time.time()}}", file=sys.stderr, flush=True)
        print("{bench.PROTOCOL}" + op + " " + json.dumps(payload), flush=True)
    """
)


def stand_in(arm: str, die_at: int = 0, how: str = "exit") -> list[str]:
    return [sys.executable, "-c", STAND_IN, arm, str(die_at), how]


@pytest.fixture
def engine(tmp_path, request):
    """A started stand-in engine of arm ``route`` with ``request.param``: (die_at, how)."""
    die_at, how = request.param
    started = bench.Engine(
        "route",
        {},
        plugin_site(tmp_path / "site"),
        tmp_path / "route.log",
        command=stand_in("route", die_at, how),
    )
    assert started.wait_for({"READY"}, 60)[0] == "READY"
    yield started
    started.stop()


@pytest.mark.parametrize("engine", [(1, "exit")], indirect=True)
def test_an_engine_that_exits_when_asked_is_lost_with_its_return_code_and_log(engine):
    with pytest.raises(bench.EngineLost) as info:
        engine.ask("itl", 30)
    lost = info.value
    assert (lost.arm, lost.op, lost.status, lost.returncode) == ("route", "itl", "DIED", 3)
    assert lost.root_cause == CAUSE
    assert lost.log_tail[-2:] == ["step 1 of 2", CAUSE]


@pytest.mark.parametrize("engine", [(2, "exit")], indirect=True)
def test_an_engine_whose_stdin_is_closed_is_lost_not_a_broken_pipe(engine):
    engine.ask("itl", 30)  # the first op is answered; the second kills it
    with pytest.raises(bench.EngineLost):
        engine.ask("itl", 30)
    assert engine.proc.wait(timeout=30) == 3
    with pytest.raises(bench.EngineLost) as info:  # its stdin now has no reader
        engine.ask("prefill", 30)
    record = info.value.record()
    assert record["status"] == "DIED" and record["op"] == "prefill"
    assert record["returncode"] == 3 and record["root_cause"] == CAUSE
    assert "BrokenPipeError" in record["error"]


@pytest.mark.parametrize("engine", [(1, "hang")], indirect=True)
def test_an_engine_that_gives_no_answer_is_lost_by_timeout_while_still_running(engine):
    with pytest.raises(bench.EngineLost) as info:
        engine.ask("itl", 2)
    assert info.value.status == "TIMEOUT" and info.value.returncode is None
    assert info.value.root_cause == CAUSE


@pytest.mark.parametrize("engine", [(1, "failed")], indirect=True)
def test_an_engine_that_answers_failed_is_lost_with_its_error(engine):
    with pytest.raises(bench.EngineLost) as info:
        bench.ask_round(engine, ["itl"], 30, 4)
    assert info.value.record()["status"] == "FAILED" and info.value.error == "bad op"
    assert info.value.round == 4
    assert "route FAILED at op 'itl' in round 4" in str(info.value)


def test_a_profile_that_loses_an_engine_names_its_profile_round(tmp_path):
    site = plugin_site(tmp_path / "site")
    engines = {
        arm: bench.Engine(arm, {}, site, tmp_path / f"{arm}.log", command=stand_in(arm, die))
        for arm, die in (("route", 0), ("golden", 2))
    }
    try:
        for engine in engines.values():
            assert engine.wait_for({"READY"}, 60)[0] == "READY"
        with pytest.raises(bench.EngineLost) as info:
            bench.profile(engines, ["route", "golden"], 10.0, "decode", rounds=3)
        assert (info.value.arm, info.value.op, info.value.round) == ("golden", "profile", 2)
        assert info.value.returncode == 3 and info.value.root_cause == CAUSE
    finally:
        for engine in engines.values():
            engine.stop()


@pytest.mark.parametrize("die_at, lost_round, op", [(3, 2, "itl"), (-1, 0, bench.WARMED)])
def test_the_benchmark_records_an_engine_lost_mid_run_and_exits_1(
    tmp_path, monkeypatch, capsys, die_at, lost_round, op
):
    """``route`` dies at its third op (the warm-up's, then round 1's, then round 2's), or right
    after READY (its stdin closed when first asked, the wait for its warm-up: round 0): the
    rounds before and their summary stay, route's entry gives the op, round, return code, root
    cause and log tail, and every engine is stopped."""
    started: list[bench.Engine] = []
    real = bench.Engine

    def engine(arm, spec, site, log, cpus=None):
        started.append(
            real(arm, spec, site, log, cpus, stand_in(arm, die_at if arm == "route" else 0))
        )
        return started[-1]

    monkeypatch.setattr(bench, "Engine", engine)
    out = tmp_path / "bench.json"
    argv = ["--out", str(out), "--tiny", "--arms", "vllm,route", "--workloads", "itl"]
    assert bench.main([*argv, "--rounds", "3"]) == 1
    report = json.loads(out.read_text())
    assert len(report["rounds"]) == max(0, lost_round - 1)
    if lost_round > 1:
        assert "itl_vs_vllm" in report["summary"]["ratios"]["route"]
    route = report["engines"]["route"]
    assert route["status"] == "DIED" and route["start_seconds"] == 0.1
    assert (route["op"], route["round"], route["returncode"]) == (op, lost_round, 3)
    assert route["root_cause"] == CAUSE and route["log_tail"][-1] == CAUSE
    assert report["engines"]["vllm"]["status"] == "READY"
    assert all(e.proc.poll() is not None for e in started)
    err = capsys.readouterr().err
    assert f"engine route DIED at op '{op}' in round {lost_round} (return code 3): {CAUSE}" in err
    assert "Traceback" not in err


def answered(log: str) -> dict[str, list[float]]:
    """The times a stand-in logged answering each op."""
    times: dict[str, list[float]] = {}
    for line in log.splitlines():
        if line.startswith("answered "):
            _, op, _, at = line.split()
            times.setdefault(op, []).append(float(at))
    return times


def stand_in_engines(monkeypatch, slow_warm: tuple[str, ...] = ()) -> dict[str, str]:
    """Every engine ``bench.main`` starts a stand-in that answers every op (the arms in
    ``slow_warm`` answer the warm-up op 1 s late); returns each arm's log, filled as it stops."""
    logs: dict[str, str] = {}

    class Recorded(bench.Engine):
        def stop(self) -> None:
            logs[self.arm] = self.log_text()
            super().stop()

    def engine(arm, spec, site, log, cpus=None):
        how = "slow_warm" if arm in slow_warm else "exit"
        return Recorded(arm, spec, site, log, cpus, stand_in(arm, 0, how))

    monkeypatch.setattr(bench, "Engine", engine)
    return logs


def test_the_first_round_waits_for_every_engines_warm_up(tmp_path, monkeypatch):
    """``golden`` answers the warm-up op 1 s late (its warm-ups still running): ``route``, first
    in round 1, is asked its first timed op only after that answer, and each engine's wait is
    recorded. Without the wait, route's round 1 would run beside golden's warm-up."""
    logs = stand_in_engines(monkeypatch, slow_warm=("golden",))
    out = tmp_path / "bench.json"
    argv = ["--out", str(out), "--tiny", "--arms", "route,golden", "--workloads", "decode"]
    assert bench.main([*argv, "--rounds", "2"]) == 0
    report = json.loads(out.read_text())
    assert report["rounds"][0]["order"][0] == "route"
    route, golden = (answered(logs[arm]) for arm in ("route", "golden"))
    assert route["decode"][0] > golden[bench.WARMED][0]
    assert report["engines"]["golden"]["warm_wait_seconds"] >= 0.9
    assert report["engines"]["route"]["warm_wait_seconds"] < 0.9


@pytest.mark.parametrize("settle", [0, 1])
def test_settling_rounds_run_untimed_before_the_timed_ones(tmp_path, monkeypatch, settle):
    """With ``--settle-rounds 1`` each engine answers one round more than the timed ones, before
    them, and the summary covers the timed rounds only; without it (the control) the first
    timed round is each engine's first run after its warm-ups."""
    logs = stand_in_engines(monkeypatch)
    out = tmp_path / "bench.json"
    argv = ["--out", str(out), "--tiny", "--arms", "route,golden", "--workloads", "decode"]
    assert bench.main([*argv, "--rounds", "2", "--settle-rounds", str(settle)]) == 0
    report = json.loads(out.read_text())
    assert len(report.get("settle_rounds", [])) == settle and len(report["rounds"]) == 2
    ratios = report["summary"]["round_ratios"]["golden"]["decode_throughput_vs_route"]
    assert len(ratios) == 2
    for arm in ("route", "golden"):
        assert len(answered(logs[arm])["decode"]) == 2 + settle
    if settle:
        assert report["settle_rounds"][0]["order"] == ["route", "golden"]
        assert set(report["settle_rounds"][0]["route"]) == {"decode"}


def test_settle_rounds_take_zero_or_more(tmp_path, capsys):
    out = tmp_path / "bench.json"
    with pytest.raises(SystemExit) as info:
        bench.main(["--out", str(out), "--tiny", "--settle-rounds", "-1"])
    assert info.value.code == 2 and not out.exists()
    assert "--settle-rounds must be 0 or more" in capsys.readouterr().err


def spec(**settings):
    base = {
        "arm": "route",
        "model_dir": "/m",
        "tensor_parallel_size": 1,
        "cuda_graphs": True,
        "attention_backend": None,
        "prefill_backend": None,
        "gpu_memory_utilization": 0.4,
        "kv_cache_gib": None,
    }
    return {**base, **settings}


def engine_specs(monkeypatch, argv: list[str]) -> list[dict]:
    """The engine specs ``bench.main(argv)`` makes, the run stopped at its first engine."""
    specs: list[dict] = []

    class Recorded(Exception):
        pass

    def engine(arm, spec, site, log, cpus=None):
        specs.append(spec)
        raise Recorded

    monkeypatch.setattr(bench, "Engine", engine)
    with pytest.raises(Recorded):
        bench.main(argv)
    return specs


def test_max_num_seqs_reaches_the_engine_spec_and_its_llm_arguments(tmp_path, monkeypatch):
    argv = ["--out", str(tmp_path / "bench.json"), "--tiny", "--max-num-seqs", "512"]
    specs = engine_specs(monkeypatch, argv)
    assert specs[0]["max_num_seqs"] == 512
    report = json.loads((tmp_path / "bench.json").read_text())
    assert report["provenance"]["engine"]["max_num_seqs"] == 512
    assert bench.serve_kwargs(spec(max_num_seqs=512))["max_num_seqs"] == 512
    assert "max_num_seqs" not in bench.serve_kwargs(spec(max_num_seqs=None))
    assert bench.build_parser().parse_args([]).max_num_seqs is None


@pytest.mark.parametrize("value", ["0", "-3", "many"])
def test_max_num_seqs_takes_positive_integers_only(tmp_path, capsys, value):
    out = tmp_path / "bench.json"
    with pytest.raises(SystemExit) as info:
        bench.main(["--out", str(out), "--tiny", "--max-num-seqs", value])
    assert info.value.code == 2 and not out.exists()
    assert "argument --max-num-seqs: " in capsys.readouterr().err
