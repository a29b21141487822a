import subprocess

import pytest

from gdn_evidence.harness.provenance import (
    ROOT,
    checkout_git_state,
    git_state,
    provenance,
    record_commit,
    recorded_commit,
    source_digest,
)


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


def git(root, *args):
    """``git args`` in the checkout at ``root``, as a committer named t."""
    command = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(root), *args]
    subprocess.run(command, check=True)


def make_checkout(root):
    """A git checkout with one commit of a source tree; returns its HEAD."""
    make_tree(root, "A = 1\n")
    (root / "gdn_evidence").mkdir()
    (root / "gdn_evidence" / "e.py").write_text("E = 1\n")
    git(root, "init", "-q")
    git(root, "add", "-A")
    git(root, "commit", "-qm", "tree")
    return checkout_git_state(root)[0]


def copy_without_git(source, target):
    """The tree as the GPU machine gets it: the files, not the .git they came from."""
    for path in source.rglob("*"):
        if ".git" in path.relative_to(source).parts or not path.is_file():
            continue
        (target / path.relative_to(source)).parent.mkdir(parents=True, exist_ok=True)
        (target / path.relative_to(source)).write_bytes(path.read_bytes())


def test_a_copied_tree_names_the_commit_recorded_for_it(tmp_path, monkeypatch):
    monkeypatch.delenv("GDN_INVARIANT_GIT_COMMIT", raising=False)
    checkout, copy = tmp_path / "checkout", tmp_path / "copy"
    head = make_checkout(checkout)
    record = record_commit(checkout)
    assert record["git_commit"] == head and record["git_dirty"] is False
    copy_without_git(checkout, copy)
    assert recorded_commit(copy) == (head, False)
    assert git_state(copy) == (head, False)


def test_a_stale_git_reads_dirty_and_the_record_wins(tmp_path, monkeypatch):
    """The GPU machine's copy: a .git from an older commit, the files of a newer one."""
    monkeypatch.delenv("GDN_INVARIANT_GIT_COMMIT", raising=False)
    checkout = tmp_path / "checkout"
    older = make_checkout(checkout)
    (checkout / "scripts" / "b.py").write_text("B = 3\n")
    git(checkout, "commit", "-qam", "newer")
    newer = record_commit(checkout)["git_commit"]
    git(checkout, "reset", "-q", "--soft", older)  # HEAD back, files not
    assert checkout_git_state(checkout) == (older, True)
    assert git_state(checkout) == (newer, False)


def test_a_clean_checkout_names_its_head_over_an_older_record(tmp_path, monkeypatch):
    """A record left from an earlier commit with the same Python files (a docs-only commit
    since) does not win over a clean checkout's HEAD."""
    monkeypatch.delenv("GDN_INVARIANT_GIT_COMMIT", raising=False)
    checkout = tmp_path / "checkout"
    older = make_checkout(checkout)
    record_commit(checkout)
    (checkout / "notes.txt").write_text("docs only")
    git(checkout, "commit", "-qam", "docs")
    head = checkout_git_state(checkout)[0]
    assert head != older and recorded_commit(checkout) == (older, False)
    assert git_state(checkout) == (head, False)


@pytest.mark.parametrize("folder", ["vllm_gdn_invariant/sub/a.py", "gdn_evidence/e.py"])
def test_a_record_of_another_tree_is_not_used(tmp_path, folder):
    """The negative control: one Python file changed after the record (the package's or the
    evidence code's), and the record names nothing."""
    checkout, copy = tmp_path / "checkout", tmp_path / "copy"
    make_checkout(checkout)
    record_commit(checkout)
    copy_without_git(checkout, copy)
    (copy / folder).write_text("CHANGED = 1\n")
    assert recorded_commit(copy) is None


def test_a_dirty_tree_is_recorded_dirty(tmp_path):
    checkout = tmp_path / "checkout"
    make_checkout(checkout)
    (checkout / "scripts" / "b.py").write_text("B = 3\n")
    assert record_commit(checkout)["git_dirty"] is True
    assert recorded_commit(checkout)[1] is True


def test_no_record_and_no_git_is_refused(tmp_path):
    make_tree(tmp_path, "A = 1\n")
    assert recorded_commit(tmp_path) is None
    for text in ("not json", "[1, 2]", '{"tree_sha256": "x"}'):
        (tmp_path / ".device-commit").write_text(text)
        assert recorded_commit(tmp_path) is None
    with pytest.raises(RuntimeError, match="not a git checkout"):
        record_commit(tmp_path)
