"""scripts/h200_engine_evidence.sh's stages, without a GPU: every stage the script has is named
in its unknown-stage message, and each stage's command lines (``EVIDENCE_DRY_RUN=1``) are
accepted by their scripts' argument parsers and name test files that exist, so that no device
call is spent on a flag a script does not have. For the scripts of CHECKED_UNTIL, what the
script checks after parsing (e.g. bench_engine's ``--profile`` against its workloads, its
``--pin-cpus`` against this machine's CPUs) is covered too: the run stops at the first thing
the script does once every argument is checked. For the others, that is not covered."""

from __future__ import annotations

import collections
import functools
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "h200_engine_evidence.sh"

# A script whose checks after parsing are covered: the module and name of the first thing its
# main calls once every argument is checked.
CHECKED_UNTIL = {"scripts/bench_engine.py": ("gdn_evidence.e2e.bench", "scratch_folder")}
# Each argv runs the script as __main__, with parse_args wrapped (a successful parse raises
# Parsed before the script does anything else) or, given a module and a name, with that name
# replaced (reaching it raises Checked); argparse's errors exit 2. One verdict a line.
PARSE_ONLY = """
import argparse, importlib, json, os, runpy, sys
script, argvs, until = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3])
sys.path.insert(0, os.path.dirname(script))  # as python puts a script's folder first
class Parsed(BaseException):
    pass
class Checked(BaseException):
    pass
def stop(*args, **kwargs):
    raise Checked
if until:
    setattr(importlib.import_module(until[0]), until[1], stop)
else:
    parse = argparse.ArgumentParser.parse_args
    def parse_then_stop(self, args=None, namespace=None):
        parse(self, args, namespace)
        raise Parsed
    argparse.ArgumentParser.parse_args = parse_then_stop
for argv in argvs:
    sys.argv = [script, *argv]
    try:
        runpy.run_path(script, run_name="__main__")
        verdict = "not stopped"
    except Parsed:
        verdict = "parsed"
    except Checked:
        verdict = "checked"
    except SystemExit as exc:
        verdict = f"exit {exc.code}"
    print(json.dumps(verdict), flush=True)
"""
# An existing folder for the stages' OUT: the runs stop before they write anything.
OUT = ROOT

ENVIRONMENTS = {  # stage: the extra environments its command lines are checked under
    "golden-deep": [{"DEEP_LAYERS": "48", "DEEP_MAX_NUM_SEQS": "512"}],
    "golden-long": [
        {
            "DEEP_LAYERS": "48",
            "LONG_NEW_TOKENS": "768",
            "DEEP_MAX_NUM_SEQS": "128",
            "START_TIMEOUT": "480",
        }
    ],
}


def stages() -> list[str]:
    """The stages of the script's ``case``: its labels that are stage names."""
    return re.findall(r"^  ([a-z0-9-]+)\)$", SCRIPT.read_text(), flags=re.MULTILINE)


def command_lines(stage: str, extra: dict[str, str]) -> list[list[str]]:
    """The command lines ``stage`` runs in the environment with ``extra``."""
    env = {**os.environ, "EVIDENCE_DRY_RUN": "1", **extra}
    result = subprocess.run(
        ["bash", str(SCRIPT), str(OUT), stage],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return [shlex.split(line) for line in result.stdout.splitlines() if line.strip()]


def expected_verdict(script: str) -> str:
    return "checked" if script in CHECKED_UNTIL else "parsed"


def parse_only(script: str, argvs: list[list[str]]) -> list[str]:
    """``script``'s verdict on each argv: ``parsed`` (or ``checked``, CHECKED_UNTIL), ``exit N``
    or ``not stopped``."""
    until = json.dumps(CHECKED_UNTIL.get(script))
    result = subprocess.run(
        [sys.executable, "-c", PARSE_ONLY, str(ROOT / script), json.dumps(argvs), until],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    verdicts = [json.loads(line) for line in result.stdout.splitlines() if line.startswith('"')]
    assert len(verdicts) == len(argvs), result.stderr[-2000:]
    return verdicts


@functools.cache
def every_stage_lines() -> dict[str, list[list[str]]]:
    return {
        stage: [
            line
            for extra in [{}, *ENVIRONMENTS.get(stage, [])]
            for line in command_lines(stage, extra)
        ]
        for stage in stages()
    }


@functools.cache
def verdicts() -> dict[tuple[str, ...], str]:
    """Each script command line of every stage: its script's verdict, one process a script."""
    by_script: dict[str, list[list[str]]] = collections.defaultdict(list)
    for lines in every_stage_lines().values():
        for line in lines:
            if line[1:3] != ["-m", "pytest"] and line[2:] not in by_script[line[1]]:
                by_script[line[1]].append(line[2:])
    return {
        (script, *argv): verdict
        for script, argvs in by_script.items()
        for argv, verdict in zip(argvs, parse_only(script, argvs), strict=True)
    }


def test_the_unknown_stage_message_names_every_stage(tmp_path):
    result = subprocess.run(
        ["bash", str(SCRIPT), str(tmp_path / "out"), "no-such-stage"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    listed = re.search(r"\((.*)\)", result.stderr).group(1)
    named = [name.strip() for name in re.split(r",| or ", listed) if name.strip()]
    assert named == stages()


@pytest.mark.parametrize("stage", stages())
def test_each_stage_runs_commands_its_scripts_accept(stage):
    lines = every_stage_lines()[stage]
    assert lines, f"stage {stage} runs nothing"
    for line in lines:
        assert line[0] == "python", line
        if line[1:3] == ["-m", "pytest"]:
            files = [a.split("::")[0] for a in line[3:] if a.startswith("tests/")]
            assert files and all((ROOT / f).is_file() for f in files), line
            continue
        assert (ROOT / line[1]).is_file() and line[1].startswith("scripts/"), line
        assert verdicts()[tuple(line[1:])] == expected_verdict(line[1]), line


def test_a_flag_the_script_does_not_have_is_refused():
    """Negative control: the parse check refuses a command line with an unknown flag."""
    assert parse_only(
        "scripts/bench_decode.py", [["--quick", "--rounds", "1"], ["--num-rounds", "1"]]
    ) == ["parsed", "exit 2"]


def test_what_bench_engine_checks_after_parsing_is_covered():
    """Negative controls: command lines that parse but that bench_engine's main refuses (a
    profiled workload not run, a model depth it cannot build, no --out) exit 2 here, as they
    would on the device; the line they differ from is checked."""
    out = ["--out", str(OUT / "bench.json")]
    golden = ["--arms", "route,golden", "--workloads", "decode", *out]
    assert parse_only(
        "scripts/bench_engine.py",
        [
            [*golden, "--profile", "decode"],
            [*golden, "--profile", "itl"],
            [*golden, "--num-layers", "6"],
            ["--arms", "route,golden"],
        ],
    ) == ["checked", "exit 2", "exit 2", "exit 2"]


def test_golden_long_takes_its_knobs_into_the_bench_command():
    """Stage golden-long's knobs reach bench_engine's command line (none accepted and dropped);
    without them the line has the defaults."""

    def options(extra: dict[str, str]) -> dict[str, str]:
        (line,) = command_lines("golden-long", extra)
        flags = ("--num-layers", "--decode-new-tokens", "--max-num-seqs", "--start-timeout")
        return {flag: line[line.index(flag) + 1] for flag in flags}

    assert options(ENVIRONMENTS["golden-long"][0]) == {
        "--num-layers": "48",
        "--decode-new-tokens": "768",
        "--max-num-seqs": "128",
        "--start-timeout": "480",
    }
    assert options({}) == {
        "--num-layers": "24",
        "--decode-new-tokens": "1536",
        "--max-num-seqs": "256",
        "--start-timeout": "400",
    }
