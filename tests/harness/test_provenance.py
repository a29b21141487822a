import subprocess

import pytest

from gdn_evidence.harness.provenance import ROOT, git_state, provenance, source_digest


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


def make_tree(root, text):
    (root / "vllm_gdn_invariant" / "sub").mkdir(parents=True)
    (root / "scripts").mkdir()
    (root / "vllm_gdn_invariant" / "sub" / "a.py").write_text(text)
    (root / "scripts" / "b.py").write_text("B = 2\n")
    (root / "notes.txt").write_text("not a source")


def test_the_source_digest_names_the_code_not_the_copy(tmp_path):
    first, second = tmp_path / "one", tmp_path / "two"
    make_tree(first, "A = 1\n")
    make_tree(second, "A = 1\n")
    assert source_digest(first) == source_digest(second)  # same sources, another place
    (second / "notes.txt").write_text("changed")
    assert source_digest(first) == source_digest(second)  # not a source
    (second / "vllm_gdn_invariant" / "sub" / "a.py").write_text("A = 2\n")
    assert source_digest(first) != source_digest(second)
    (second / "vllm_gdn_invariant" / "sub" / "a.py").rename(
        second / "vllm_gdn_invariant" / "sub" / "c.py"
    )
    (second / "vllm_gdn_invariant" / "sub" / "c.py").write_text("A = 1\n")
    assert source_digest(first) != source_digest(second)  # a renamed file is another tree
    assert provenance()["source_sha256"] == source_digest()
