"""The shadow checker: snapshot sampled decode rows, let the step run, recompute, compare.

A hook (patches/shadow_hooks.py) calls :meth:`ShadowChecker.run` around the serving call of
one GDN layer in one step, with a :class:`Probe` of the step (run in every step: the step's
identity, the layer, its metadata) and a factory of the :class:`Site` (run only in checked
steps: caches and their storage layout, what serves the rows, how to call the references).
``run`` then:

1. draws the step's rows (sampling.py) and copies their inputs and state blocks
   (snapshot.py), unless the device stream is being captured into a CUDA graph, the step is
   speculative, or it has no one-token decode rows;
2. runs the serving call, untouched;
3. recomputes the rows with each configured reference (reference.py) and launches the
   comparison of output, recurrent state and conv state with what was served (compare.py).
   The golden reference is computed by the golden-matched kernels where they can run and did
   not serve the rows (CUDA, outside mode ``golden``) unless ``golden_impl=torch``, otherwise
   by the PyTorch goldens (:meth:`ShadowChecker.golden_impl`);
4. once the statistics are on the host, writes one JSONL record per reference (record.py)
   and updates the metrics (metrics.py). On CUDA the serving thread does not wait for that:
   the statistics travel to pinned memory behind an event, and the serving thread finishes
   the checks whose statistics have arrived at the start of the next step (one thread
   doing Python work at a time: a second one would take the GIL from it at every torch
   call); a daemon thread finishes them when the hooks have been idle for ``IDLE_S``, and
   :meth:`ShadowChecker.drain` waits for every check launched so far; on CPU step 4 follows
   at once.

It never changes what is served: the serving call gets the same arguments and runs whatever
happens in steps 1, 3 and 4. An exception in any of them is caught, counted by stage (metrics
and a JSONL failure record) and logged once per stage; the step goes on.

Whoever makes a checker closes it (:meth:`ShadowChecker.close`: the daemon thread stops, the
checks in flight are finished, the JSONL file is closed); the checker of a serving process is
closed at its exit (``multiprocessing.util.Finalize``, which also runs in vLLM's engine core).
"""

from __future__ import annotations

import collections
import logging
import multiprocessing.util
import os
import threading
import time
from collections import Counter as Tally
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from vllm_gdn_invariant.shadow.compare import FIELDS, FieldPair, PendingStats, start
from vllm_gdn_invariant.shadow.config import ShadowConfig
from vllm_gdn_invariant.shadow.metrics import ShadowMetrics, export_dir
from vllm_gdn_invariant.shadow.record import JsonlWriter, check_record, failure_record
from vllm_gdn_invariant.shadow.reference import (
    GOLDEN_KERNELS,
    GOLDENS,
    VLLM_DECODE,
    DecodeCall,
    GoldenParams,
    StateLayout,
    decode_reference,
    golden_kernels_reference,
    golden_reference,
)
from vllm_gdn_invariant.shadow.sampling import RowSampler
from vllm_gdn_invariant.shadow.snapshot import Snapshot, SnapshotSize, take_snapshot

try:
    from vllm.logger import init_logger
except Exception:  # noqa: BLE001 - without vLLM the stdlib logger of that name serves
    init_logger = logging.getLogger

logger = init_logger("vllm.gdn_invariant.shadow")

STAGES = ("setup", "snapshot", "reference", "compare", "submit", "record", "metrics")
MAX_IN_FLIGHT = 1024  # checks waiting for their statistics; the serving thread waits beyond
POLL_S = 0.0002  # wait between looks at the oldest check in flight (drain, idle thread)
IDLE_S = 0.05  # hooks idle this long: the daemon thread finishes the checks in flight
EXIT_DRAIN_S = 10.0  # at process exit, wait this long at most for checks in flight
GOLDEN_MODE = "golden"  # the plugin's mode in which the golden-matched kernels serve the rows


@dataclass(frozen=True)
class Probe:
    """What a hook finds cheaply in every step: the step, the layer and its metadata."""

    step_key: object  # the same object for every layer of a step
    layer: Any
    attn_metadata: Any


@dataclass
class Site:
    """What a hook sees of one layer in a checked step."""

    layer: Any
    attn_metadata: Any
    conv_cache: Tensor  # storage layout
    ssm_cache: Tensor  # storage layout
    layout: StateLayout
    provider: str
    step_kind: str  # "decode" or "mixed"
    golden_params: Callable[[], GoldenParams]
    decode_call: DecodeCall


@dataclass
class Pending:
    site: Site
    snapshot: Snapshot
    decode_rows: int
    step: int


@dataclass
class InFlight:
    """A launched check: its statistics on their way and the rest of its record."""

    stats: PendingStats
    record: dict[str, Any]  # check_record's arguments but rows and stats


@dataclass
class ShadowStats:
    """This process's totals (the demo and the bench read them in-process)."""

    checks: int = 0
    with_difference: int = 0
    rows_checked: int = 0
    fields_with_difference: Tally = field(default_factory=Tally)
    reference_impls: Tally = field(default_factory=Tally)  # checks by what computed them
    failures: Tally = field(default_factory=Tally)
    skipped_memory: int = 0
    max_snapshot_bytes: int = 0


def capturing() -> bool:
    """Whether the current CUDA stream is being captured into a graph."""
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


def describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {' '.join(str(exc).split())}"


class ShadowChecker:
    """One per process; see the module docstring."""

    def __init__(
        self,
        config: ShadowConfig,
        mode: str,
        *,
        metrics: ShadowMetrics | None = None,
        writer: JsonlWriter | None = None,
    ) -> None:
        if not config.enabled:
            raise ValueError("the shadow checker needs a rate (VLLM_GDN_INVARIANT_SHADOW)")
        self.config = config
        self.mode = mode
        self.sampler = RowSampler(config.rate, config.seed)
        self.metrics = metrics if metrics is not None else ShadowMetrics(export_dir())
        self.writer = (
            writer if writer is not None else JsonlWriter(config.path_for, config.max_file_bytes)
        )
        self.stats = ShadowStats()
        self._logged: set[str] = set()
        self._sizes: dict[str, SnapshotSize] = {}  # by layer: a layer's shapes do not change
        self._lock = threading.Lock()  # stats and logging, shared with the finishing thread
        self._in_flight: collections.deque[InFlight] = collections.deque()
        self._finishing = threading.Lock()  # one finisher at a time: records in launch order
        self._worker_pid: int | None = None  # the process that owns _in_flight and the thread
        self._stop = threading.Event()  # the daemon thread's
        self._thread: threading.Thread | None = None
        self._finalizer: multiprocessing.util.Finalize | None = None
        self._closed = False
        self._step_key: object | None = None
        self._last_hook = time.monotonic()

    # the hook's entry point

    def run(
        self,
        probe: Callable[[], Probe | None],
        make_site: Callable[[Probe], Site],
        mixed_qkv: Tensor,
        b: Tensor,
        a: Tensor,
        core_attn_out: Tensor,
        serve: Callable[[], Any],
    ) -> Any:
        """Serve the step with ``serve()``; check the sampled rows around it. ``probe`` runs in
        every step, ``make_site`` only in checked ones. A closed checker only serves."""
        if self._closed:
            return serve()
        pending = None
        self._last_hook = time.monotonic()
        try:
            pending = self.prepare(probe, make_site, mixed_qkv, b, a)
        except Exception as exc:  # noqa: BLE001 - never fail the step
            self.failed("snapshot", exc)
        result = serve()
        if pending is not None:
            self.finish(pending, core_attn_out)
        return result

    def prepare(
        self,
        probe: Callable[[], Probe | None],
        make_site: Callable[[Probe], Site],
        mixed_qkv: Tensor,
        b: Tensor,
        a: Tensor,
    ) -> Pending | None:
        """Draw the rows and snapshot them; None when this layer's step is not checked."""
        if capturing():
            return None
        found = probe()
        if found is None:
            return None
        if found.step_key is not self._step_key:  # a new step: finish what has arrived
            self._step_key = found.step_key
            self.finish_arrived()
        metadata = found.attn_metadata
        num_decodes = metadata.num_decodes
        if (
            not num_decodes
            or metadata.spec_sequence_masks is not None
            or metadata.num_decode_tokens != num_decodes
        ):
            return None
        state_indices = metadata.non_spec_state_indices_tensor
        size = self._sizes.get(found.layer.prefix)
        if size is None:
            kv_cache = found.layer.kv_cache
            size = SnapshotSize.of(state_indices, kv_cache[0], kv_cache[1], mixed_qkv, b, a)
            self._sizes[found.layer.prefix] = size
        limit = min(self.config.max_rows, size.rows_within(self.config.max_snapshot_bytes))
        if limit < 1:
            self.stats.skipped_memory += 1
            self._log_once(
                "memory",
                f"a snapshot of one decode row needs {size.fixed + size.per_row} bytes, more "
                f"than max_snapshot_mb={self.config.max_snapshot_mb:g}; no row is checked",
            )
            return None
        draw = self.sampler.draw(found.step_key, num_decodes, limit)
        if draw is None:
            return None
        site = make_site(found)
        snapshot = take_snapshot(
            draw.start,
            min(draw.count, limit),  # this layer's cap, should it be below the drawing one's
            state_indices[:num_decodes],
            site.conv_cache,
            site.ssm_cache,
            mixed_qkv,
            b,
            a,
        )
        self.stats.max_snapshot_bytes = max(self.stats.max_snapshot_bytes, snapshot.nbytes)
        return Pending(site, snapshot, num_decodes, self.sampler.steps)

    def finish(self, pending: Pending, core_attn_out: Tensor) -> None:
        """Recompute and launch the comparison after the serving call; failures are caught and
        counted."""
        site, snapshot = pending.site, pending.snapshot
        served = {
            "output": (core_attn_out, snapshot.rows),
            "recurrent_state": (site.ssm_cache, snapshot.blocks),
            "conv_state": (site.conv_cache, snapshot.blocks),
        }
        references = self.config.references
        for i, reference in enumerate(references):
            spend = i == len(references) - 1  # the last reference updates the snapshot
            self._check(pending, served, reference, core_attn_out.dtype, spend)

    def golden_impl(self, site: Site) -> str:
        """What computes the golden reference at ``site``: the golden-matched kernels on CUDA
        caches in vLLM's CUDA layout, except in mode golden (they served the rows) and with
        ``golden_impl=torch``; the PyTorch goldens otherwise."""
        if (
            self.config.golden_impl == "torch"
            or self.mode == GOLDEN_MODE
            or not site.ssm_cache.is_cuda
            or site.layout.recurrent_k_major
        ):
            return GOLDENS
        return GOLDEN_KERNELS

    def _check(
        self,
        pending: Pending,
        served: dict[str, tuple[Tensor, Tensor]],
        reference: str,
        out_dtype: torch.dtype,
        spend: bool,
    ) -> None:
        site, snapshot = pending.site, pending.snapshot
        stage = "reference"
        try:
            if reference == "golden":
                impl = self.golden_impl(site)
                params = site.golden_params()
                if impl == GOLDEN_KERNELS:
                    result = golden_kernels_reference(
                        snapshot, params, site.layout, out_dtype, spend=spend
                    )
                else:
                    result = golden_reference(snapshot, params, site.layout, out_dtype)
            else:
                impl = VLLM_DECODE
                result = decode_reference(
                    snapshot,
                    site.layer,
                    site.attn_metadata,
                    site.decode_call,
                    out_dtype,
                    spend=spend,
                )
            stage = "compare"
            pairs = {
                name: FieldPair(served[name][0], getattr(result, name), served[name][1])
                for name in FIELDS
            }
            stats = start(pairs, snapshot.active)
            stage = "submit"
            record = {
                "layer": site.layer.prefix,
                "step": pending.step,
                "step_kind": site.step_kind,
                "provider": site.provider,
                "mode": self.mode,
                "reference": reference,
                "reference_impl": impl,
                "state_dtype": str(site.ssm_cache.dtype).removeprefix("torch."),
                "conv_state_dtype": str(site.conv_cache.dtype).removeprefix("torch."),
                "decode_rows": pending.decode_rows,
                "snapshot_bytes": snapshot.nbytes,
            }
            check = InFlight(stats, record)
            if stats.event is None:
                self.complete(check)  # catches its own failures
            else:
                self.submit(check)
        except Exception as exc:  # noqa: BLE001 - never fail the step
            self.failed(stage, exc)

    def complete(self, check: InFlight) -> None:
        """Write the record and count the check once its statistics are on the host."""
        stage = "compare"
        try:
            stats = check.stats.result()
            rows = stats["output"].rows
            if rows == 0:  # every sampled row was inactive
                return
            stage = "record"
            record = check.record
            self.writer.write(check_record(**record, rows=rows, stats=stats))
            stage = "metrics"
            differing = {name: s.differing for name, s in stats.items()}
            self._count(differing, rows, record["reference_impl"])
            self.metrics.observe_check(
                layer=record["layer"],
                reference=record["reference"],
                provider=record["provider"],
                step_kind=record["step_kind"],
                rows=rows,
                max_ulp={name: s.max_ulp for name, s in stats.items()},
                differing=differing,
            )
        except Exception as exc:  # noqa: BLE001 - never fail the step
            self.failed(stage, exc)

    # finishing checks whose statistics are on their way (CUDA)

    def submit(self, check: InFlight) -> None:
        """Keep ``check`` until its statistics are on the host: the serving thread finishes
        the arrived ones at the start of each step (:meth:`finish_arrived`), a daemon thread
        when the hooks have been idle for ``IDLE_S``, :meth:`drain` on demand, :meth:`close`
        at the end. Raises what starting the thread raises (the caller counts it)."""
        if self._worker_pid != os.getpid():  # first use, or a fork (no thread came with it)
            self._in_flight = collections.deque()
            self._finishing = threading.Lock()
            self._stop = threading.Event()
            thread = threading.Thread(
                target=self._finish_when_idle, name="gdn-invariant-shadow", daemon=True
            )
            thread.start()
            self._thread = thread
            self._worker_pid = os.getpid()
            # runs at exit of the main process and of multiprocessing's children (vLLM's
            # engine core), which leave without atexit; a fork's child drops the parent's
            self._finalizer = multiprocessing.util.Finalize(
                None, self.close, kwargs={"timeout": EXIT_DRAIN_S}, exitpriority=100
            )
        if len(self._in_flight) >= MAX_IN_FLIGHT:
            self.drain()
        self._in_flight.append(check)

    def finish_arrived(self) -> None:
        """Finish, in launch order, the checks whose statistics have arrived, without waiting
        for any (the serving thread: no other thread then competes with it for the GIL)."""
        if not self._in_flight or not self._finishing.acquire(blocking=False):
            return
        try:
            self._complete_arrived()
        finally:
            self._finishing.release()

    def _complete_arrived(self) -> None:
        """Complete the oldest checks while their statistics have arrived (``_finishing``
        held)."""
        while self._in_flight and self._arrived(self._in_flight[0]):
            self.complete(self._in_flight.popleft())

    def _arrived(self, check: InFlight) -> bool:
        try:
            return check.stats.ready()
        except Exception as exc:  # noqa: BLE001 - a broken check is dropped, counted
            self._in_flight.remove(check)
            self.failed("compare", exc)
            return False

    def _finish_when_idle(self) -> None:
        stop = self._stop
        while not stop.wait(IDLE_S):
            # only while the hooks stay idle: a busy serving thread finishes its own checks
            while (
                self._in_flight
                and time.monotonic() - self._last_hook >= IDLE_S
                and not stop.is_set()
            ):
                self.finish_arrived()
                time.sleep(POLL_S)

    def drain(self, timeout: float | None = None) -> bool:
        """Finish every check launched so far, waiting for its statistics (at most
        ``timeout`` seconds); whether none is left in flight."""
        if self._worker_pid != os.getpid():
            return True
        deadline = None if timeout is None else time.monotonic() + timeout
        if not self._finishing.acquire(timeout=-1 if timeout is None else timeout):
            return False
        try:
            while True:
                self._complete_arrived()
                if not self._in_flight:
                    return True
                if deadline is not None and time.monotonic() > deadline:
                    return False
                time.sleep(POLL_S)
        finally:
            self._finishing.release()

    def close(self, timeout: float | None = None) -> bool:
        """Stop the daemon thread, finish the checks in flight (waiting at most ``timeout``
        seconds for their statistics), close the JSONL file and export the metrics a last
        time; whether none was left in flight. Afterwards the checker only serves; closing
        again finishes what is still in flight."""
        self._closed = True
        if self._finalizer is not None:
            self._finalizer.cancel()  # nothing left for the exit to do
            self._finalizer = None
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join()  # it never waits: at most one pass over the arrived checks
        done = self.drain(timeout)
        for stage, close in (("record", self.writer.close), ("metrics", self.metrics.close)):
            try:
                close()
            except Exception as exc:  # noqa: BLE001 - counted like any other failure
                self.failed(stage, exc)
        return done

    def _count(self, differing: dict[str, int], rows: int, impl: str) -> None:
        with self._lock:
            self.stats.checks += 1
            self.stats.reference_impls[impl] += 1
            self.stats.rows_checked += rows
            if any(differing.values()):
                self.stats.with_difference += 1
            self.stats.fields_with_difference.update(name for name, n in differing.items() if n)

    # failures

    def failed(self, stage: str, exc: BaseException) -> None:
        """Count a failure of ``stage``, record it, log the first of its stage."""
        with self._lock:
            self.stats.failures[stage] += 1
        text = describe(exc)
        try:
            self.metrics.observe_failure(stage)
        except Exception:  # noqa: BLE001, S110 - the count above still holds
            pass
        try:
            self.writer.write(failure_record(stage, text))
        except Exception:  # noqa: BLE001, S110
            pass
        self._log_once(
            stage,
            f"{stage} failed ({text}); the step was served as usual. Further {stage} "
            "failures are counted (gdn_invariant_shadow_failures_total), not logged",
        )

    def _log_once(self, kind: str, message: str) -> None:
        with self._lock:
            if kind in self._logged:
                return
            self._logged.add(kind)
        logger.warning("gdn_invariant shadow: %s", message)


_active: ShadowChecker | None = None
_setup_failed = False
_settings: tuple[ShadowConfig, str] | None = None
_lock = threading.Lock()


def configure(config: ShadowConfig | None, mode: str) -> None:
    """The setting this process's checker is built from on first use, with the plugin's mode
    (the shadow patch's ``prepare`` calls it); None: no checker is built."""
    global _settings, _setup_failed
    with _lock:
        _settings = None if config is None else (config, mode)
        _setup_failed = False


def install(checker: ShadowChecker | None) -> None:
    """Make ``checker`` this process's checker (None: build it from the configured setting on
    the next hook call)."""
    global _active, _setup_failed
    with _lock:
        _active = checker
        _setup_failed = False


def active_checker() -> ShadowChecker | None:
    """This process's checker, built on first use from the configured setting; None when
    there is none, shadow is off or its setup failed (then the hooks only serve)."""
    global _active, _setup_failed
    if _active is not None or _setup_failed:
        return _active
    with _lock:
        if _active is None and not _setup_failed:
            try:
                if _settings is not None and _settings[0].enabled:
                    _active = ShadowChecker(*_settings)
                else:
                    _setup_failed = True
            except Exception as exc:  # noqa: BLE001 - the hooks then only serve
                _setup_failed = True
                logger.warning(
                    "gdn_invariant shadow: setup failed (%s); no row is checked", describe(exc)
                )
    return _active
