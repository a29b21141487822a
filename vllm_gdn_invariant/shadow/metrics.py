"""Prometheus metrics of the shadow checker, and their way to vLLM's ``/metrics``.

Metrics (``prometheus_client``), counted in the processes that run the model:

* ``gdn_invariant_shadow_checks_total{layer, reference, provider, step_kind}``
* ``gdn_invariant_shadow_checks_with_difference_total{layer, reference, field}``: checks in
  which at least one element of that field differs in bits
* ``gdn_invariant_shadow_rows_checked_total{layer, reference}``
* ``gdn_invariant_shadow_failures_total{stage}``: failures inside the shadow path
* ``gdn_invariant_shadow_max_ulp{layer, reference, field}``: histogram of each check's max
  ULP distance

vLLM serves ``/metrics`` from its API server process; the checks run in the engine's worker
processes. Two ways bring them there:

* Prometheus multiprocess mode (``PROMETHEUS_MULTIPROC_DIR`` set before ``vllm serve``, or
  set by vLLM itself when it runs several API servers): ``prometheus_client`` then keeps every
  process's values in files of that folder and vLLM's ``/metrics`` collects the folder
  (``vllm.v1.metrics.prometheus.get_prometheus_registry``). Nothing else is needed.
* Otherwise (vLLM's default: one API server, ``/metrics`` serves the process's own default
  registry) the plugin sets up a folder when it loads in the first process (the API server,
  before the engine starts), passes it to the processes vLLM starts through
  ``VLLM_GDN_INVARIANT_SHADOW_METRICS_DIR``, and registers :class:`ExportedMetricsCollector`
  on the default registry. Each worker writes its metrics in Prometheus text format to
  ``<folder>/<pid>.prom`` (at most once per :data:`EXPORT_INTERVAL_S`, by a daemon thread,
  after the first check); the collector sums the files' samples at each scrape.
"""

from __future__ import annotations

import atexit
import dataclasses
import os
import shutil
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
EXPORT_DIR_ENV = "VLLM_GDN_INVARIANT_SHADOW_METRICS_DIR"
EXPORT_INTERVAL_S = 1.0
MAX_ULP_BUCKETS = (0, 1, 2, 4, 8, 16, 256, 65536, float("inf"))
PREFIX = "gdn_invariant_shadow"


def multiprocess_mode() -> bool:
    """Whether prometheus_client runs in multiprocess mode in this process."""
    return bool(os.environ.get(MULTIPROC_ENV))


@dataclass
class CheckSeries:
    """The labelled series one kind of check (layer, reference, provider, step kind) adds to."""

    checks: Counter
    rows: Counter
    max_ulp: dict[str, Histogram]
    with_difference: dict[str, Counter] = dataclasses.field(default_factory=dict)


class ShadowMetrics:
    """The checker's metrics, in a registry of their own (exported, never double-registered).

    ``export_dir``: where this process writes its text snapshot (None: no export, e.g. in
    multiprocess mode, where prometheus_client writes its own files).
    """

    def __init__(self, export_dir: str | None = None) -> None:
        self.registry = CollectorRegistry()
        self.checks = Counter(
            f"{PREFIX}_checks",
            "Shadow checks (one per layer, step and reference)",
            ["layer", "reference", "provider", "step_kind"],
            registry=self.registry,
        )
        self.with_difference = Counter(
            f"{PREFIX}_checks_with_difference",
            "Shadow checks in which some element of the field differs in bits",
            ["layer", "reference", "field"],
            registry=self.registry,
        )
        self.rows = Counter(
            f"{PREFIX}_rows_checked",
            "Decode rows checked",
            ["layer", "reference"],
            registry=self.registry,
        )
        self.failures = Counter(
            f"{PREFIX}_failures",
            "Failures inside the shadow path (the step was served as usual)",
            ["stage"],
            registry=self.registry,
        )
        self.max_ulp = Histogram(
            f"{PREFIX}_max_ulp",
            "Max ULP distance of a check, per field",
            ["layer", "reference", "field"],
            buckets=MAX_ULP_BUCKETS,
            registry=self.registry,
        )
        self._exporter = None if export_dir is None else FileExporter(self.registry, export_dir)
        self._series: dict[tuple[str, str, str, str], CheckSeries] = {}

    def observe_check(
        self,
        *,
        layer: str,
        reference: str,
        provider: str,
        step_kind: str,
        rows: int,
        max_ulp: dict[str, int],
        differing: dict[str, int],
    ) -> None:
        key = (layer, reference, provider, step_kind)
        series = self._series.get(key)
        if series is None:  # labels() validates its values each call: look them up once
            series = CheckSeries(
                checks=self.checks.labels(layer, reference, provider, step_kind),
                rows=self.rows.labels(layer, reference),
                max_ulp={f: self.max_ulp.labels(layer, reference, f) for f in max_ulp},
            )
            self._series[key] = series
        series.checks.inc()
        series.rows.inc(rows)
        for field, ulp in max_ulp.items():
            series.max_ulp[field].observe(ulp)
            if differing[field]:  # a field's series appears with its first difference
                counter = series.with_difference.get(field)
                if counter is None:
                    counter = self.with_difference.labels(layer, reference, field)
                    series.with_difference[field] = counter
                counter.inc()
        self._changed()

    def observe_failure(self, stage: str) -> None:
        self.failures.labels(stage).inc()
        self._changed()

    def _changed(self) -> None:
        if self._exporter is not None:
            self._exporter.mark()

    def export_now(self) -> None:
        if self._exporter is not None:
            self._exporter.write()

    def close(self) -> None:
        """Stop the export thread after writing what changed (the values stay readable)."""
        if self._exporter is not None:
            self._exporter.close()


class FileExporter:
    """Writes a registry as Prometheus text to ``<folder>/<pid>.prom``, atomically, from a
    daemon thread, at most once per :data:`EXPORT_INTERVAL_S` after a change, until
    :meth:`close`."""

    def __init__(self, registry: CollectorRegistry, folder: str) -> None:
        self._registry = registry
        self._folder = Path(folder)
        self._changed = threading.Event()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._pid: int | None = None

    def mark(self) -> None:
        self._changed.set()
        if self._stop.is_set():
            return
        if self._thread is None or self._pid != os.getpid():
            self._pid = os.getpid()
            self._thread = threading.Thread(
                target=self._loop, name="gdn-shadow-metrics", daemon=True
            )
            self._thread.start()

    def _loop(self) -> None:
        while True:
            self._changed.wait()
            if self._stop.wait(EXPORT_INTERVAL_S):
                return
            self._changed.clear()
            self._write_quietly()

    def close(self) -> None:
        """Stop the thread; write the registry once more if it changed since the last write."""
        self._stop.set()
        unwritten = self._changed.is_set()
        thread, self._thread = self._thread, None
        if thread is None or self._pid != os.getpid():
            return  # nothing was marked in this process
        self._changed.set()  # wake it: it returns at once
        thread.join()
        if unwritten:
            self._write_quietly()

    def _write_quietly(self) -> None:
        try:
            self.write()
        except OSError:
            pass  # the folder went away (the server is shutting down)

    def write(self) -> None:
        with self._lock:
            path = self._folder / f"{os.getpid()}.prom"
            tmp = path.with_suffix(".tmp")
            tmp.write_bytes(generate_latest(self._registry))
            os.replace(tmp, path)


class ExportedMetricsCollector(Collector):
    """The sum over the ``*.prom`` files of a folder: one family per metric name, each sample
    (name and labels) summed over the files; ``_created`` series are left out."""

    def __init__(self, folder: str) -> None:
        self.folder = Path(folder)

    def collect(self) -> Iterator[Metric]:
        families: dict[str, Metric] = {}
        sums: dict[tuple[str, str, tuple], float] = {}
        for path in sorted(self.folder.glob("*.prom")):
            try:
                text = path.read_text(encoding="utf-8")
            except OSError:
                continue
            for family in text_string_to_metric_families(text):
                if family.name.endswith("_created"):
                    continue  # per-process creation times: no sum
                families.setdefault(
                    family.name, Metric(family.name, family.documentation, family.type)
                )
                for sample in family.samples:
                    if sample.name.endswith("_created"):
                        continue
                    key = (family.name, sample.name, tuple(sorted(sample.labels.items())))
                    sums[key] = sums.get(key, 0.0) + sample.value
        for (family_name, sample_name, labels), value in sums.items():
            families[family_name].add_sample(sample_name, dict(labels), value)
        yield from families.values()


_collector: ExportedMetricsCollector | None = None
_setup_lock = threading.Lock()


def export_dir() -> str | None:
    """This process's export folder (None in multiprocess mode or before setup)."""
    if multiprocess_mode():
        return None
    return os.environ.get(EXPORT_DIR_ENV) or None


def setup_process() -> str | None:
    """Prepare this process's path to ``/metrics`` (idempotent); return the export folder.

    In multiprocess mode nothing is needed. Otherwise: the first process creates the folder
    (removed when it exits) and hands it to its children through the environment; every
    process registers the collector of the folder on prometheus_client's default registry
    (the one vLLM's single API server serves).
    """
    global _collector
    if multiprocess_mode():
        return None
    with _setup_lock:
        folder = os.environ.get(EXPORT_DIR_ENV)
        if not folder:
            folder = tempfile.mkdtemp(prefix="gdn_invariant_shadow_metrics_")
            os.environ[EXPORT_DIR_ENV] = folder
            atexit.register(shutil.rmtree, folder, ignore_errors=True)
        if _collector is None:
            _collector = ExportedMetricsCollector(folder)
            REGISTRY.register(_collector)
        return folder
