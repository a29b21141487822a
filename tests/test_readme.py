"""README.md as the package index shows it, and its accounts of the code: links that work
without the repository's files, the plugin's log line as it prints it today, the
configuration table, the layout's scripts and docs."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from vllm_gdn_invariant.plugin import entry
from vllm_gdn_invariant.plugin.config import ENV_NAMES, PluginConfig, load_config
from vllm_gdn_invariant.plugin.versions import InstalledVllm

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
SAMPLE_LINES = {  # file: (vLLM release, VLLM_BATCH_INVARIANT) of its sample log line
    "README.md": ("0.34.0", False),
    "docs/batch-invariance.md": ("0.26.0", True),
}
LINE_START = "gdn_invariant: vLLM "
ABSOLUTE = re.compile(r"^(https?://|mailto:|#)")
MARKDOWN_TARGET = re.compile(r"!?\[[^\]\n]*\]\(\s*<?([^)\s>]+)")
REFERENCE_TARGET = re.compile(r"^\s*\[[^\]\n]+\]:\s*<?(\S+?)>?(\s|$)", re.MULTILINE)
HTML_TARGET = re.compile(r"<(?:img|a|source)\b[^>]*\b(?:src|href)\s*=\s*[\"']([^\"']+)", re.I)


def prose(markdown: str) -> str:
    """The text outside fenced code blocks and inline code spans."""
    text = re.sub(r"^```.*?^```", "", markdown, flags=re.MULTILINE | re.DOTALL)
    return re.sub(r"`[^`\n]*`", "", text)


def relative_targets(markdown: str) -> list[str]:
    """Link and image targets a page without the repository's files cannot resolve."""
    text = prose(markdown)
    targets = [
        m.group(1)
        for pattern in (MARKDOWN_TARGET, REFERENCE_TARGET, HTML_TARGET)
        for m in pattern.finditer(text)
    ]
    return [t for t in targets if not ABSOLUTE.match(t)]


def test_the_readme_has_no_relative_link_or_image():
    assert relative_targets(README.read_text()) == []


@pytest.mark.parametrize(
    "markdown",
    [
        "![ULP histograms](docs/evidence/shadow_cpu_report.png)",
        "see [the routing](docs/routing.md) for more",
        "[routing]: docs/routing.md",
        '<img src="docs/evidence/shadow_cpu_report.png">',
        "[up](../README.md)",
    ],
)
def test_a_relative_link_or_image_is_found(markdown):
    assert relative_targets(f"text\n{markdown}\ntext") != []


def test_absolute_links_and_paths_in_code_are_not_relative_links():
    markdown = (
        "[vLLM](https://github.com/vllm-project/vllm) [top](#layout) "
        "`![x](docs/a.png)`\n```\n[a](docs/b.md)\n```\n"
    )
    assert relative_targets(markdown) == []


def printed_line(monkeypatch, release: str, batch_invariant: bool) -> str:
    """What the plugin logs after patching vLLM ``release`` with the default configuration,
    up to the process part (`` [pid ...]``)."""
    monkeypatch.setattr(entry, "installed_vllm", lambda: InstalledVllm("vllm", release))
    monkeypatch.setattr(entry, "installed_release", lambda: release)
    config = load_config({})
    patches = tuple(entry.patches_for(config, batch_invariant))
    status = entry.PluginStatus(config, None, patches, applied=True)
    return status.summary().split(" [pid ")[0]


def sample_lines(path: str) -> list[str]:
    return [line for line in (ROOT / path).read_text().splitlines() if LINE_START in line]


@pytest.mark.parametrize("path", list(SAMPLE_LINES))
def test_the_sample_log_line_is_what_the_plugin_prints(path, monkeypatch):
    (line,) = sample_lines(path)
    release, batch_invariant = SAMPLE_LINES[path]
    printed = printed_line(monkeypatch, release, batch_invariant)
    body = line[line.index(LINE_START) :]
    assert body.split(" [pid ")[0] == printed
    assert re.fullmatch(r" \[pid \d+ [A-Za-z]+\]", body[len(printed) :])


def test_the_readme_sample_line_names_the_line_that_logs_it():
    """vLLM's logger prefixes ``[entry.py:N]``: N is the line of ``register_config``'s
    ``logger.info`` after patching."""
    (line,) = sample_lines("README.md")
    number = int(re.search(r"\[entry\.py:(\d+)\]", line).group(1))
    source = Path(entry.__file__).read_text()
    (function,) = [
        node
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.FunctionDef) and node.name == "register_config"
    ]
    last = function.body[-1]  # return status
    logged = function.body[-2]
    assert isinstance(last, ast.Return) and ast.unparse(logged) == "logger.info(status.summary())"
    assert logged.lineno == number


def test_a_sample_line_of_another_configuration_does_not_match(monkeypatch):
    """Negative control: the batch-invariant line is not the default one, and the line before
    the replay setting existed is not today's."""
    assert printed_line(monkeypatch, "0.26.0", True) != printed_line(monkeypatch, "0.26.0", False)
    old = "gdn_invariant: vLLM vllm 0.34.0, mode=route strict=0; patched "
    assert not printed_line(monkeypatch, "0.34.0", False).startswith(old)


def configuration_rows() -> dict[str, list[str]]:
    rows = {}
    for line in README.read_text().splitlines():
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line.strip().strip("|"))]
        if cells and re.fullmatch(r"`VLLM_GDN_INVARIANT_\w+`", cells[0]):
            rows[cells[0].strip("`")] = cells
    return rows


def test_every_plugin_variable_is_in_the_configuration_table_with_its_default():
    rows = configuration_rows()
    assert set(rows) == set(ENV_NAMES)
    defaults = PluginConfig()
    assert load_config({}) == defaults
    assert rows["VLLM_GDN_INVARIANT_MODE"][2] == f"`{defaults.mode.value}`"
    assert rows["VLLM_GDN_INVARIANT_STRICT"][2] == f"`{int(defaults.strict)}`"
    assert rows["VLLM_GDN_INVARIANT_SHADOW"][2] == f"`{defaults.shadow.describe()}`"
    assert rows["VLLM_GDN_INVARIANT_REPLAY"][2] == "`on`" and defaults.replay


def test_the_replay_row_lists_the_values_the_plugin_accepts():
    values = re.findall(r"`(\w+)`", configuration_rows()["VLLM_GDN_INVARIANT_REPLAY"][1])
    assert values == ["on", "off"]
    assert [load_config({"VLLM_GDN_INVARIANT_REPLAY": v}).replay for v in values] == [True, False]


def layout_row(folder: str) -> str:
    (row,) = [line for line in README.read_text().splitlines() if line.startswith(f"| `{folder}`")]
    return row


def test_the_layout_names_every_script_and_every_doc():
    scripts = layout_row("scripts/")
    unnamed = [
        p.name for p in (ROOT / "scripts").iterdir() if p.is_file() and p.name not in scripts
    ]
    assert unnamed == []
    docs = layout_row("docs/")
    assert [p.name for p in (ROOT / "docs").glob("*.md") if f"`{p.name}`" not in docs] == []
