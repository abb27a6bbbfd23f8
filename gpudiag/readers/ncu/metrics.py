"""Metric values out of ncu_report objects: typed scalars, durations, the long metrics table
and the device attributes. Used by `gpudiag.readers.ncu.reader`; nothing here imports ncu_report.

ncu_report hands out one `IMetric` per name and per call, so reading a report costs one Python
round trip per (action, metric): about 5 SWIG calls each (`metric_by_name`, `kind`,
`has_value`, `as_*`, `unit`). The loop below does only that and appends to plain lists; the
DataFrame is built once at the end. A whole `--set full` report (GH200, 2,136 metrics) reads
in about 0.2 s in a fresh process, most of it ncu_report decoding the result and formatting
units; units are therefore asked once per metric name.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from gpudiag.devices import fill_from_compute_capability, vendor_of
from gpudiag.schema import NS_PER_UNIT

#: an ncu_report IAction or IMetric (SWIG proxies without type information), or a test fake
Action = Any
Metric = Any
Value = float | int | str | None
Dims = tuple[int | None, int | None, int | None]

@dataclass(frozen=True)
class ValueKinds:
    """The `IMetric.ValueKind_*` codes, read from the class rather than hard-coded, so a
    renumbering in a later ncu_report cannot turn numbers into strings silently."""

    string: int
    integer: frozenset[int]
    floating: frozenset[int]

    @classmethod
    def of(cls, metric_class: Any) -> ValueKinds:
        return cls(
            string=metric_class.ValueKind_STRING,
            integer=frozenset({metric_class.ValueKind_UINT32, metric_class.ValueKind_UINT64}),
            floating=frozenset({metric_class.ValueKind_FLOAT, metric_class.ValueKind_DOUBLE}),
        )


def clean_text(text: Any) -> str:
    """`text` from ncu_report as valid UTF-8: SWIG hands the bytes of a damaged report over
    with lone surrogates (surrogateescape), which Parquet and JSON writers refuse; each bad
    byte becomes U+FFFD."""
    text = str(text)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
    return text


def clean_name(name: Any) -> bool:
    """Whether a metric name can be asked for: ncu's names are ASCII; one that is not came
    from a damaged report, and SWIG refuses it (TypeError) when passed back."""
    return isinstance(name, str) and name.isascii() and bool(name)


def metric_value(metric: Metric, kinds: ValueKinds) -> Value:
    """The aggregate value of one metric as int, float or str; None when it has none.

    The kind decides the accessor: `as_double` on a string metric returns 0.0 and
    `as_uint64` truncates doubles, so guessing would invent values. Instanced metrics (per-SM,
    per-sample) keep their aggregate here; some (pmsampling:*) have instances only, and
    `has_value()` is False for them.
    """
    kind = metric.kind()
    if not metric.has_value():
        return None
    if kind in kinds.floating:
        return float(metric.as_double())
    if kind in kinds.integer:
        return int(metric.as_uint64())
    if kind == kinds.string:
        text = metric.as_string()
        return None if text is None else clean_text(text)
    return None  # ValueKind_ANY / UNKNOWN: ncu recorded the name without a value


def scalar(action: Action, name: str, kinds: ValueKinds) -> Value:
    """One metric of an action by name, or None when the action does not have it."""
    metric = action.metric_by_name(name)
    return None if metric is None else metric_value(metric, kinds)


def number(action: Action, name: str, kinds: ValueKinds) -> int | None:
    """An integer-valued metric (launch sizes, ids, device attributes), or None."""
    value = scalar(action, name, kinds)
    if isinstance(value, int | float) and math.isfinite(value):
        return round(value)
    return None


def duration_ns(action: Action, kinds: ValueKinds) -> int | None:
    """gpu__time_duration.sum in integer nanoseconds, from whatever time unit it carries.

    ncu reports it in "nsecond" (and older versions in "ns"), but `--print-units` and
    metric options can change the unit stored; an unknown unit gives None, not a guess.
    """
    metric = action.metric_by_name("gpu__time_duration.sum")
    if metric is None:
        return None
    value = metric_value(metric, kinds)
    scale = NS_PER_UNIT.get(str(metric.unit()).strip().lower())
    if not isinstance(value, int | float) or scale is None or not math.isfinite(value):
        return None
    return round(value * scale)


def axes(action: Action, kinds: ValueKinds, prefix: str, total: str) -> tuple[Dims, bool]:
    """(x, y, z) of a grid or block, and whether they had to come from the total.

    Reports from older ncu versions (and the `basic` set on Volta) have only
    launch__grid_size / launch__block_size; the x, y, z split is then unknown and we give
    (total, 1, 1), which keeps the product (what occupancy and wave math need) exact.
    """
    x, y, z = (number(action, f"{prefix}_{axis}", kinds) for axis in "xyz")
    if x is not None and y is not None and z is not None:
        return (x, y, z), False
    size = number(action, total, kinds)
    if size is None:
        return (None, None, None), False
    return (size, 1, 1), True


@dataclass
class MetricRows:
    """The long `metrics` table, accumulated as plain lists and turned into columns once."""

    kinds: ValueKinds
    keep: frozenset[str] | None = None
    kernel_id: list[int] = field(default_factory=list)
    metric: list[str] = field(default_factory=list)
    value: list[float] = field(default_factory=list)
    unit: list[str | None] = field(default_factory=list)
    text: list[str | None] = field(default_factory=list)
    per_kernel: list[int] = field(default_factory=list)
    units: dict[str, str | None] = field(default_factory=dict)
    #: metrics of a damaged report left out: a name that is not ASCII, or no metric object
    skipped: int = 0

    def add(self, kernel_id: int, action: Action) -> None:
        """Append one row per metric of `action` (those in `keep`, when given).

        `IMetric.unit()` costs more than the value itself (about 15 µs a call), and a metric
        name has one unit throughout a report, so units are looked up once per name.
        """
        listed = list(action.metric_names())
        names = [metric_name for metric_name in listed if clean_name(metric_name)]
        if self.keep is not None:
            names = [metric_name for metric_name in names if metric_name in self.keep]
        get, kinds, known = action.metric_by_name, self.kinds, self.units
        values, units, texts = self.value, self.unit, self.text
        found = []
        for name in names:
            metric = get(name)
            if metric is None:
                continue
            found.append(name)
            value = metric_value(metric, kinds)
            if isinstance(value, str):
                values.append(math.nan)
                texts.append(value)
            else:
                values.append(math.nan if value is None else float(value))
                texts.append(None)
            if name not in known:
                unit = metric.unit()
                known[name] = clean_text(unit) if unit else None
            units.append(known[name])
        self.skipped += (sum(not clean_name(metric_name) for metric_name in listed)
                         + len(names) - len(found))
        self.metric += found
        self.kernel_id += [kernel_id] * len(found)
        self.per_kernel.append(len(found))

    def frame(self, kernel_names: list[str], devices: list[int | None]) -> pd.DataFrame:
        """The table, with each kernel's name and device repeated over its rows."""
        owner = np.repeat(np.arange(len(self.per_kernel)), self.per_kernel)
        names = pd.Categorical(kernel_names)
        device = pd.array(devices, dtype="Int64")
        return pd.DataFrame({
            "kernel_id": np.asarray(self.kernel_id, dtype=np.int64),
            "device": device.take(owner) if len(owner) else device[:0],
            "name": pd.Categorical.from_codes(names.codes[owner], names.categories),
            "metric": pd.Categorical(self.metric),
            "value": np.asarray(self.value, dtype=np.float64),
            "unit": pd.Categorical(self.unit),
            "text": pd.Categorical(self.text),
        })


#: devices column <- device__attribute_* names, first present wins
DEVICE_ATTRIBUTES: dict[str, tuple[str, ...]] = {
    "sm_count": ("multiprocessor_count",),
    "cc_major": ("compute_capability_major",),
    "cc_minor": ("compute_capability_minor",),
    "max_threads_per_sm": ("max_threads_per_multiprocessor",),
    "max_blocks_per_sm": ("limits_max_cta_per_sm", "max_blocks_per_multiprocessor"),
    "max_threads_per_block": ("max_threads_per_block",),
    "regs_per_sm": ("max_registers_per_multiprocessor",),
    "regs_per_block": ("max_registers_per_block",),
    "smem_per_sm_bytes": ("max_shared_memory_per_multiprocessor",),
    "smem_per_block_bytes": ("max_shared_memory_per_block",),
    "smem_per_block_optin_bytes": ("max_shared_memory_per_block_optin",),
    "warp_size": ("warp_size",),
    "mem_bytes": ("total_memory",),
    "l2_bytes": ("l2_cache_size",),
    "clock_khz": ("max_gpu_frequency_khz", "clock_rate"),
}


def device_row(action: Action, device: int, kinds: ValueKinds) -> dict[str, Any]:
    """One `devices` row from the device__attribute_* metrics that every action carries."""
    row: dict[str, Any] = {"device": device}
    for column, names in DEVICE_ATTRIBUTES.items():
        values = (number(action, f"device__attribute_{attribute}", kinds) for attribute in names)
        row[column] = next((value for value in values if value is not None), None)
    name = scalar(action, "device__attribute_display_name", kinds)
    row["name"] = name if isinstance(name, str) and name else None
    row["vendor"] = vendor_of(row["name"] or "nvidia")  # ncu profiles only NVIDIA GPUs
    row["mem_bandwidth_bytes_per_s"] = peak_bandwidth(
        number(action, "device__attribute_memory_clock_rate", kinds),
        number(action, "device__attribute_global_memory_bus_width", kinds),
    )
    return row


def peak_bandwidth(memory_clock_khz: int | None, bus_width_bits: int | None) -> float | None:
    """Peak DRAM bandwidth in bytes/s: two transfers per memory clock over the whole bus.

    CUDA reports the memory clock in kHz such that this double-data-rate formula gives the
    data-sheet number for HBM and GDDR alike (A100-40GB: 1.56e12, RTX 4090: 1.01e12).
    """
    if not memory_clock_khz or not bus_width_bits:
        return None
    return 2.0 * memory_clock_khz * 1e3 * bus_width_bits / 8


def devices_frame(rows: list[dict[str, Any]]) -> pd.DataFrame:
    """The devices table: rows as read, per-SM limits ncu left out filled from the CC."""
    return fill_from_compute_capability(pd.DataFrame(rows) if rows else None)
