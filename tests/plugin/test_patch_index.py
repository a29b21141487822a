"""The patch index (``patches/__init__.py``) lists every patch module, and each entry says what
that module's opening note says: summary, targets, upstream PR, removal condition, when it
applies."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import vllm_gdn_invariant.patches as patches_package
from vllm_gdn_invariant.patches import INDEX, Entry, Mode, Selection, select
from vllm_gdn_invariant.shadow.config import ShadowConfig

PACKAGE = Path(patches_package.__file__).parent
BULLETS = ("Target", "Why", "Upstream", "Remove when", "Applies")


def words(text: str) -> str:
    return " ".join(text.split())


def declares_patches(path: Path) -> bool:
    """Whether the module builds :class:`Patch` objects (calls ``Patch(...)``)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return any(
        isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "Patch"
        for node in ast.walk(tree)
    )


def note(file: str) -> str:
    return ast.get_docstring(ast.parse((PACKAGE / file).read_text(encoding="utf-8"))) or ""


def bullet(text: str, name: str) -> str:
    """The text of the note's ``* **name...**`` bullets (each up to the next bullet or an
    unindented paragraph), joined."""
    found = re.findall(
        r"^\* \*\*" + re.escape(name) + r"[^*]*\*\*[^:\n]*:?(.*?)(?=^\* \*\*|\n\n(?=\S)|\Z)",
        text,
        re.S | re.M,
    )
    assert found, f"no **{name}** bullet"
    return words(" ".join(found))


def summary(text: str) -> str:
    """The note's first paragraph after ``Patch:`` or ``Patch (...):``."""
    first = words(text.split("\n\n")[0])
    match = re.match(r"Patch(?: \([^)]*\))?: (.*)", first)
    assert match, f"the note does not open with 'Patch: ...': {first!r}"
    return match.group(1)


def prs(text: str) -> set[str]:
    return set(re.findall(r"#\d+", text))


def test_every_module_that_declares_patches_is_in_the_index_once():
    declaring = sorted(p.name for p in PACKAGE.glob("*.py") if declares_patches(p))
    assert declaring, "the check finds patch modules"
    assert sorted(e.file for e in INDEX) == declaring


def test_the_check_tells_a_patch_module_from_a_helper():
    assert declares_patches(PACKAGE / "routing.py")
    assert not declares_patches(PACKAGE / "routed_forward_core.py")


@pytest.mark.parametrize("entry", INDEX, ids=[e.file for e in INDEX])
def test_the_entry_says_what_the_modules_note_says(entry: Entry):
    text = note(entry.file)
    assert words(entry.why) == summary(text)
    targets = {p.target.qualname for p in entry.patches(Selection())}
    assert set(entry.targets) == targets
    target_bullet = bullet(text, "Target")
    for qualname in entry.targets:
        assert qualname in target_bullet
    upstream = bullet(text, "Upstream")
    assert entry.upstream.startswith("none") == upstream.startswith("none")
    if not entry.upstream.startswith("none"):
        assert prs(entry.upstream) == prs(upstream)
    assert bullet(text, "Remove when").startswith(words(entry.remove_when))
    assert bullet(text, "Applies").rstrip(".") == entry.applies()
    assert bullet(text, "Why")


BI_FILES = [e.file for e in INDEX if e.file.startswith("bi_")]


@pytest.mark.parametrize(
    "mode, batch_invariant, shadow, files",
    [
        (Mode.OFF, True, False, []),
        (Mode.OFF, True, True, ["shadow.py"]),
        (Mode.ROUTE, False, False, ["routing.py"]),
        (Mode.ROUTE, True, False, ["routing.py", *BI_FILES]),
        (Mode.GOLDEN, False, True, ["routing.py", "golden_decode.py", "shadow.py"]),
        (Mode.GOLDEN, True, False, ["routing.py", *BI_FILES, "golden_decode.py"]),
    ],
)
def test_the_index_selects_by_mode_batch_invariance_and_shadow_in_its_order(
    mode, batch_invariant, shadow, files
):
    selection = Selection(mode, batch_invariant, ShadowConfig(rate=1.0) if shadow else None)
    by_target_and_name = {(p.target, p.name): e.file for e in INDEX for p in e.patches(Selection())}
    chosen = [by_target_and_name[(p.target, p.name)] for p in select(selection)]
    assert list(dict.fromkeys(chosen)) == files


def test_a_patch_applies_from_its_first_release():
    names = {
        release: [p.name for p in select(Selection(Mode.ROUTE, True, release=release))]
        for release in ("0.32.0", "0.33.0", "0.34.0")
    }
    assert "blackwell-decode-tile" not in names["0.32.0"]
    assert "blackwell-decode-tile" in names["0.33.0"]
    assert names["0.33.0"].count("gated-norm-rows-1") == 1
    assert names["0.34.0"].count("gated-norm-rows-1") == 2
