"""The shadow checker's setting: ``VLLM_GDN_INVARIANT_SHADOW``.

Grammar: ``off`` (default; also ``0`` or empty), or
``<rate>[,ref=golden|decode|golden+decode][,golden_impl=auto|torch][,out=PATH][,seed=INT]``
``[,max_rows=INT][,max_snapshot_mb=NUM][,max_file_mb=NUM]``.

* ``rate``: the fraction of decode rows checked, in (0, 1]; a decimal (``0.015625``) or a
  fraction (``1/64``).
* ``ref``: what recomputes a sampled row. ``golden``: the PyTorch goldens (an L2 check: do the
  serving kernels give the trainer's bits?). ``decode``: vLLM's own decode-only path on a copy
  of the row's state (an L1 check: does a row get the bits of a decode-only step, i.e. does
  the routing hold live?). ``golden+decode``: both, one record each. Default ``golden``.
* ``golden_impl``: what computes the golden reference. ``auto`` (default): on CUDA, the
  golden-matched Triton kernels (bitwise the goldens, two launches per check) for rows they
  did not serve, i.e. outside mode ``golden``; otherwise the PyTorch goldens. ``torch``: the
  PyTorch goldens always (hundreds of launches per check on CUDA). Each record names the one
  used (``reference_impl``).
* ``out``: the JSONL file. Each process writes its own file, named with its pid: ``{pid}`` in
  the path is replaced by it, otherwise it goes before the suffix
  (``shadow.jsonl`` -> ``shadow.12345.jsonl``). Default ``gdn_invariant_shadow.jsonl`` in the
  working directory. Its folder must exist and be writable when the setting is read.
* ``seed``: the sampler's seed (every process draws the same rows of the same steps).
* ``max_rows``: at most this many rows per step and layer (default 64).
* ``max_snapshot_mb``: the snapshot of one layer's sampled rows (their inputs and state blocks,
  copied before the step) stays within this many MiB of device memory (default 256); fewer rows
  are taken to fit.
* ``max_file_mb``: a process's JSONL file grows to at most this many MiB (default 256); then it
  is renamed ``<name>.1.jsonl`` (the older ones move up to ``.2``, ``.3``; the oldest beyond
  ``ROTATED_FILES`` is deleted) and a new file is started, so a process keeps at most
  ``(ROTATED_FILES + 1) * max_file_mb`` MiB of records on disk.

:func:`parse_shadow` raises :class:`ShadowSettingError` (plugin/config.py turns it into the
plugin's ``ConfigError``, which names the variable, the value and the valid values).
"""

from __future__ import annotations

import math
import os
import tempfile
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

OFF_VALUES = ("", "0", "off")
REFERENCES = ("golden", "decode", "golden+decode")
GOLDEN_IMPLS = ("auto", "torch")
DEFAULT_OUT = "gdn_invariant_shadow.jsonl"
DEFAULT_MAX_ROWS = 64
DEFAULT_MAX_SNAPSHOT_MB = 256.0
DEFAULT_MAX_FILE_MB = 256.0
ROTATED_FILES = 3  # older JSONL files kept beside the one being written (record.py)
OPTIONS = ("ref", "golden_impl", "out", "seed", "max_rows", "max_snapshot_mb", "max_file_mb")
SHADOW_CHOICES = (
    "off | 0 | <rate>[,ref=golden|decode|golden+decode][,golden_impl=auto|torch][,out=PATH]"
    "[,seed=INT][,max_rows=INT][,max_snapshot_mb=NUM][,max_file_mb=NUM], "
    "rate in (0, 1] (e.g. 1/64 or 0.05)"
)


class ShadowSettingError(ValueError):
    """The shadow setting is malformed; ``choices`` spells the grammar and the reason."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.choices = f"{SHADOW_CHOICES}; {reason}"


@dataclass(frozen=True)
class ShadowConfig:
    """Parsed ``VLLM_GDN_INVARIANT_SHADOW``; ``rate`` None means off."""

    rate: float | None = None
    rate_text: str = "off"
    reference: str = "golden"
    golden_impl: str = "auto"
    out: str = DEFAULT_OUT
    seed: int = 0
    max_rows: int = DEFAULT_MAX_ROWS
    max_snapshot_mb: float = DEFAULT_MAX_SNAPSHOT_MB
    max_file_mb: float = DEFAULT_MAX_FILE_MB

    @property
    def enabled(self) -> bool:
        return self.rate is not None

    @property
    def references(self) -> tuple[str, ...]:
        """The references each check runs, in record order."""
        return tuple(self.reference.split("+"))

    @property
    def max_snapshot_bytes(self) -> int:
        return int(self.max_snapshot_mb * 1024 * 1024)

    @property
    def max_file_bytes(self) -> int:
        return int(self.max_file_mb * 1024 * 1024)

    def describe(self) -> str:
        if not self.enabled:
            return "off"
        golden_impl = f" golden_impl={self.golden_impl}" if "golden" in self.references else ""
        return (
            f"{self.rate_text} ref={self.reference}{golden_impl} out={self.out} seed={self.seed} "
            f"max_rows={self.max_rows} max_snapshot_mb={self.max_snapshot_mb:g} "
            f"max_file_mb={self.max_file_mb:g}"
        )

    def path_for(self, pid: int) -> Path:
        """The JSONL file of process ``pid``."""
        return output_path(self.out, pid)

    def files(self) -> list[Path]:
        """The JSONL files of every process that wrote one (any pid), rotated ones included."""
        found: set[Path] = set()
        for pattern in (output_path(self.out, "*"), rotated_path(output_path(self.out, "*"), "*")):
            found.update(pattern.parent.glob(pattern.name))
        return sorted(found)


def output_path(template: str, pid: int | str) -> Path:
    """``template`` with ``{pid}`` replaced, or the pid put before the suffix (``pid="*"``
    gives the glob pattern of every process's file)."""
    if "{pid}" in template:
        return Path(template.replace("{pid}", str(pid)))
    path = Path(template)
    suffix = path.suffix or ".jsonl"
    return path.with_name(f"{path.stem if path.suffix else path.name}.{pid}{suffix}")


def rotated_path(path: Path, index: int | str) -> Path:
    """The ``index``-th older file of ``path``: the index before the suffix
    (``shadow.4242.jsonl`` -> ``shadow.4242.1.jsonl``), so a glob of every process's files
    (``shadow.*.jsonl``) finds the rotated ones too."""
    if path.suffix:
        return path.with_name(f"{path.stem}.{index}{path.suffix}")
    return path.with_name(f"{path.name}.{index}")


def parse_rate(text: str) -> float:
    """A rate in (0, 1], written as a decimal or a fraction ``a/b``."""
    try:
        rate = float(Fraction(text.strip()))
    except (ValueError, ZeroDivisionError):
        raise ShadowSettingError(f"rate {text!r} is not a number or a fraction a/b") from None
    if not math.isfinite(rate) or not 0.0 < rate <= 1.0:
        raise ShadowSettingError(f"rate {text!r} is not in (0, 1]")
    return rate


def parse_int(key: str, text: str, minimum: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise ShadowSettingError(f"{key}={text!r} is not an integer") from None
    if value < minimum:
        raise ShadowSettingError(f"{key}={value} is below {minimum}")
    return value


def parse_mb(key: str, text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ShadowSettingError(f"{key}={text!r} is not a number") from None
    if not math.isfinite(value) or value <= 0:
        raise ShadowSettingError(f"{key}={text!r} is not a positive number")
    return value


def check_writable(template: str) -> str:
    """The absolute template; raises unless its folder exists and a file can be created in it.

    The probe is an unnamed temporary file (nothing is left behind); it catches read-only
    file systems and permissions that ``os.access`` reports wrongly for root.
    """
    if not template.strip():
        raise ShadowSettingError("out= is empty")
    path = Path(template).expanduser()
    if not path.is_absolute():
        path = Path.cwd() / path
    folder = path.parent
    if not folder.is_dir():
        raise ShadowSettingError(f"out={template!r}: folder {str(folder)!r} does not exist")
    try:
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as exc:
        raise ShadowSettingError(
            f"out={template!r}: cannot write in {str(folder)!r} ({exc.strerror or exc})"
        ) from None
    probe = output_path(str(path), os.getpid())
    if probe.exists() and not (probe.is_file() and os.access(probe, os.W_OK)):
        raise ShadowSettingError(f"out={template!r}: {str(probe)!r} is not a writable file")
    return str(path)


def parse_shadow(value: str) -> ShadowConfig:
    """Parse the setting; raise :class:`ShadowSettingError` on anything malformed."""
    text = value.strip()
    if text.lower() in OFF_VALUES:
        return ShadowConfig()
    rate_text, *options = [part.strip() for part in text.split(",")]
    fields: dict[str, str] = {}
    for option in options:
        key, sep, item = option.partition("=")
        key = key.strip().lower()
        if not sep or key not in OPTIONS:
            hint = " (the caps are max_snapshot_mb and max_file_mb)" if key == "max_mb" else ""
            raise ShadowSettingError(f"unknown option {option!r}{hint}")
        if key in fields:
            raise ShadowSettingError(f"option {key} given twice")
        fields[key] = item.strip()
    rate = parse_rate(rate_text)
    reference = fields.get("ref", "golden").lower()
    if reference not in REFERENCES:
        raise ShadowSettingError(f"ref={reference!r} is not one of {', '.join(REFERENCES)}")
    golden_impl = fields.get("golden_impl", "auto").lower()
    if golden_impl not in GOLDEN_IMPLS:
        raise ShadowSettingError(
            f"golden_impl={golden_impl!r} is not one of {', '.join(GOLDEN_IMPLS)}"
        )
    if golden_impl != "auto" and "golden" not in reference.split("+"):
        raise ShadowSettingError(f"golden_impl={golden_impl} needs ref=golden or golden+decode")
    return ShadowConfig(
        rate=rate,
        rate_text=rate_text,
        reference=reference,
        golden_impl=golden_impl,
        out=check_writable(fields.get("out", DEFAULT_OUT)),
        seed=parse_int("seed", fields.get("seed", "0"), 0),
        max_rows=parse_int("max_rows", fields.get("max_rows", str(DEFAULT_MAX_ROWS)), 1),
        max_snapshot_mb=parse_mb(
            "max_snapshot_mb", fields.get("max_snapshot_mb", str(DEFAULT_MAX_SNAPSHOT_MB))
        ),
        max_file_mb=parse_mb("max_file_mb", fields.get("max_file_mb", str(DEFAULT_MAX_FILE_MB))),
    )
