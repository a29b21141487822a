"""``python -m vllm_gdn_invariant report LOG.jsonl ... [--plot out.png]``: the shadow checker's
records as tables.

One table per (reference, provider) found in the files, one row per GDN layer and field:
checks, checks in which some element differs, elements compared and differing, max |diff|,
max ULP distance and the summed ULP histogram (buckets of shadow/bits.py). Failures of the
shadow path are listed by stage. ``--plot FILE`` also draws the ULP histograms (matplotlib,
the ``plot`` extra): one panel per (reference, provider) and field, one bar per bucket,
summed over layers, log scale.

Exit status: 0 when the report is printed (and the figure written); 1 when a file cannot be
read, holds a line that is not a shadow record, or no file holds a check.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vllm_gdn_invariant.shadow.record import FIELDS, read_records

EXIT_OK = 0
EXIT_BAD_INPUT = 1


@dataclass
class Cell:
    """One (layer, field) of one table, summed over checks."""

    checks: int = 0
    with_difference: int = 0
    compared: int = 0
    differing: int = 0
    max_abs_diff: float = 0.0
    max_ulp: int = 0
    histogram: Counter = field(default_factory=Counter)

    def add(self, stats: dict[str, Any]) -> None:
        self.checks += 1
        self.with_difference += stats["differing"] > 0
        self.compared += stats["compared"]
        self.differing += stats["differing"]
        self.max_abs_diff = max(self.max_abs_diff, stats["max_abs_diff"])
        self.max_ulp = max(self.max_ulp, stats["max_ulp"])
        self.histogram.update(stats["ulp_histogram"])


@dataclass
class Group:
    """The checks of one (reference, provider)."""

    checks: int = 0
    step_kinds: Counter = field(default_factory=Counter)
    impls: Counter = field(default_factory=Counter)  # what computed the reference
    cells: dict[tuple[str, str], Cell] = field(default_factory=lambda: defaultdict(Cell))
    buckets: list[str] = field(default_factory=list)


@dataclass
class Summary:
    groups: dict[tuple[str, str], Group] = field(default_factory=lambda: defaultdict(Group))
    failures: Counter = field(default_factory=Counter)
    first_errors: dict[str, str] = field(default_factory=dict)

    @property
    def checks(self) -> int:
        return sum(g.checks for g in self.groups.values())


def summarize(records: Iterable[dict[str, Any]]) -> Summary:
    """Sum check records by (reference, provider), layer and field; count failures by stage."""
    summary = Summary()
    for record in records:
        if record["kind"] == "failure":
            summary.failures[record["stage"]] += 1
            summary.first_errors.setdefault(record["stage"], record["error"])
            continue
        if record["kind"] != "check":
            continue
        group = summary.groups[(record["reference"], record["provider"])]
        group.checks += 1
        group.step_kinds[record["step_kind"]] += 1
        if "reference_impl" in record:
            group.impls[record["reference_impl"]] += 1
        for name in FIELDS:
            stats = record[name]
            if not group.buckets:
                group.buckets = list(stats["ulp_histogram"])
            group.cells[(record["layer"], name)].add(stats)
    return summary


def totals(records: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """Check and failure counts: ``checks``, ``with_difference`` (checks in which some field
    differs), ``failures``, and the same by reference with the fields that differed and the
    max ULP distance of each field."""
    out: dict[str, Any] = {"checks": 0, "with_difference": 0, "failures": 0, "by_reference": {}}
    for record in records:
        if record["kind"] == "failure":
            out["failures"] += 1
            continue
        if record["kind"] != "check":
            continue
        ref = out["by_reference"].setdefault(
            record["reference"],
            {
                "checks": 0,
                "with_difference": 0,
                "providers": {},
                "step_kinds": {},
                "checks_with_difference_by_field": dict.fromkeys(FIELDS, 0),
                "max_ulp": dict.fromkeys(FIELDS, 0),
            },
        )
        differs = [name for name in FIELDS if record[name]["differing"]]
        for counts in (out, ref):
            counts["checks"] += 1
            counts["with_difference"] += bool(differs)
        for key, value in (("providers", record["provider"]), ("step_kinds", record["step_kind"])):
            ref[key][value] = ref[key].get(value, 0) + 1
        for name in FIELDS:
            ref["checks_with_difference_by_field"][name] += name in differs
            ref["max_ulp"][name] = max(ref["max_ulp"][name], record[name]["max_ulp"])
    return out


def table(group: Group) -> list[str]:
    """The rows of one group's table, aligned."""
    header = [
        "layer",
        "field",
        "checks",
        "with diff",
        "compared",
        "differing",
        "max |diff|",
        "max ULP",
        "ULP histogram " + "/".join(group.buckets),
    ]
    rows = [header]
    for (layer, name), cell in sorted(group.cells.items(), key=lambda kv: layer_order(kv[0])):
        rows.append(
            [
                layer,
                name,
                str(cell.checks),
                str(cell.with_difference),
                str(cell.compared),
                str(cell.differing),
                f"{cell.max_abs_diff:.3g}",
                str(cell.max_ulp),
                "/".join(str(cell.histogram[b]) for b in group.buckets),
            ]
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(header) - 1)]
    return [
        "  ".join(c.ljust(w) for c, w in zip(r[:-1], widths, strict=True)) + "  " + r[-1]
        for r in rows
    ]


def layer_order(key: tuple[str, str]) -> tuple:
    """Layers by their numbers (``model.layers.10`` after ``model.layers.9``), fields in order."""
    layer, name = key
    parts = tuple(int(p) if p.isdigit() else 0 for p in layer.split("."))
    return parts, layer, FIELDS.index(name)


def render(summary: Summary, files: list[str]) -> list[str]:
    failures = sum(summary.failures.values())
    lines = [
        f"gdn_invariant shadow report: {summary.checks} checks, {failures} failures, "
        f"{len(files)} file(s)"
    ]
    for (reference, provider), group in sorted(summary.groups.items()):
        kinds = ", ".join(f"{n} {kind}" for kind, n in sorted(group.step_kinds.items()))
        title = f"reference {reference}, provider {provider}: {group.checks} checks ({kinds})"
        if group.impls:
            title += "; computed by " + ", ".join(sorted(group.impls))
        lines += ["", title]
        lines += table(group)
    if summary.failures:
        lines += ["", "failures of the shadow path (the steps were served as usual):"]
        for stage, count in sorted(summary.failures.items()):
            lines.append(f"  {stage}: {count} (first: {summary.first_errors[stage]})")
    return lines


def plot(summary: Summary, out: str) -> None:
    """The ULP histograms, one panel per (reference, provider) and field, summed over layers."""
    import matplotlib  # the ``plot`` extra; imported only for --plot

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = sorted(summary.groups.items())
    fig, axes = plt.subplots(
        len(groups), len(FIELDS), figsize=(4.2 * len(FIELDS), 3.2 * len(groups)), squeeze=False
    )
    for row, ((reference, provider), group) in enumerate(groups):
        for col, name in enumerate(FIELDS):
            total = Counter()
            for (_, field_name), cell in group.cells.items():
                if field_name == name:
                    total.update(cell.histogram)
            counts = [total[b] for b in group.buckets]
            ax = axes[row][col]
            ax.bar(group.buckets, [max(c, 0) for c in counts], color="tab:blue")
            ax.set_yscale("symlog", linthresh=1)
            ax.set_title(f"{name}\n{reference} vs {provider}", fontsize=9)
            ax.set_xlabel("ULP distance")
            if col == 0:
                ax.set_ylabel("elements")
            for x, c in enumerate(counts):
                ax.annotate(str(c), (x, c), ha="center", va="bottom", fontsize=7)
    fig.suptitle(f"gdn_invariant shadow: ULP distance from the reference ({summary.checks} checks)")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def run(args: argparse.Namespace) -> int:
    """Print the report of ``args.logs``; with ``args.plot`` also write the figure."""
    records: list[dict[str, Any]] = []
    for path in args.logs:
        try:
            records += read_records(path)
        except (OSError, ValueError) as exc:
            print(f"report: {exc}", file=sys.stderr)
            return EXIT_BAD_INPUT
    summary = summarize(records)
    if summary.checks == 0:
        print(f"report: no check records in {', '.join(args.logs)}", file=sys.stderr)
        return EXIT_BAD_INPUT
    print("\n".join(render(summary, args.logs)), flush=True)
    if args.plot:
        plot(summary, args.plot)
        print(f"plot: {Path(args.plot).resolve()}")
    return EXIT_OK
