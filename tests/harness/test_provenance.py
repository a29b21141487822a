import subprocess

import pytest

from vllm_gdn_invariant.harness.provenance import ROOT, git_state, provenance


def test_commit_named_in_the_environment_wins_over_the_checkouts_git(monkeypatch):
    monkeypatch.setenv("GDN_INVARIANT_GIT_COMMIT", "0" * 40)
    monkeypatch.setenv("GDN_INVARIANT_GIT_DIRTY", "0")
    assert git_state() == ("0" * 40, False)
    assert provenance()["git_commit"] == "0" * 40


def test_without_the_environment_the_checkouts_head_is_recorded(monkeypatch):
    monkeypatch.delenv("GDN_INVARIANT_GIT_COMMIT", raising=False)
    try:
        head = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    assert git_state()[0] == head
