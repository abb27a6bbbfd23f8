"""What the NVML sampler reads: the job's GPUs through pynvml, one probe at a time.

    source = NvmlSource(require("pynvml", "Sampling GPU utilization (NVML)"))
    why_not = source.open(child_env)          # None, or why nothing can be sampled
    readings = source.read(source.gpus[0], time.time_ns())  # [(metric, value, unit), ...]

Separate from `nvml_sampler` (the thread, the chunk files and their reading back) because
this is the half that knows NVML: which calls give which metric and unit, which GPUs
CUDA_VISIBLE_DEVICES leaves the job, how a refused probe or a wrapped counter is handled.
It holds no thread and writes no file, so it is tested against a fake pynvml alone.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from gpudiag.collectors.probes import nvml_call, nvml_text
from gpudiag.devices import fill_from_compute_capability
from gpudiag.readers.ncu.metrics import peak_bandwidth

log = logging.getLogger(__name__)

KIB = 1024  # NVML's "KB" in PCIe and NVLink throughput is KiB
CLOCK_SM, CLOCK_MEM = 1, 2  # nvmlClockType_t
TEMPERATURE_GPU = 0  # nvmlTemperatureSensors_t
PCIE_UTIL_TX, PCIE_UTIL_RX = 0, 1  # nvmlPcieUtilCounter_t
ALL_LINKS = 0xFFFFFFFF  # field scopeId: the NVLink counter summed over every link
#: cumulative counters read with one nvmlDeviceGetFieldValues call:
#: field id -> (metric, bytes per count, scopeId)
COUNTERS: dict[int, tuple[str, int, int]] = {
    197: ("pcie_tx", 1, 0),  # NVML_FI_DEV_PCIE_COUNT_TX_BYTES
    198: ("pcie_rx", 1, 0),  # NVML_FI_DEV_PCIE_COUNT_RX_BYTES
    138: ("nvlink_tx", KIB, ALL_LINKS),  # NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, KiB
    139: ("nvlink_rx", KIB, ALL_LINKS),  # NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX, KiB
}
PCIE_FIELDS = (197, 198)
#: the c_nvmlValue_t member for each nvmlValueType_t, and the bits of the narrow ones
VALUE_MEMBERS = ("dVal", "uiVal", "ulVal", "ullVal", "sllVal", "siVal", "usVal")
WRAP_BITS = {1: 32, 6: 16}
#: nvmlDeviceGetPcieThroughput blocks ~20 ms per direction: the fallback reads it at 1 Hz
PCIE_FALLBACK_PERIOD_NS = 1_000_000_000
THROTTLE_CALLS = ("nvmlDeviceGetCurrentClocksEventReasons",
                  "nvmlDeviceGetCurrentClocksThrottleReasons")  # new name first
#: one NVML call each: probe -> (call, its arguments after the handle,
#: ((metric, attribute of the answer or None for the answer itself, unit, scale), ...))
Output = tuple[str, str | None, str, float]
SIMPLE_PROBES: dict[str, tuple[str, tuple[int, ...], tuple[Output, ...]]] = {
    "utilization": ("nvmlDeviceGetUtilizationRates", (),
                    (("gpu_util", "gpu", "%", 1.0), ("mem_util", "memory", "%", 1.0))),
    "memory": ("nvmlDeviceGetMemoryInfo", (),
               (("mem_used", "used", "bytes", 1.0), ("mem_total", "total", "bytes", 1.0))),
    "sm_clock": ("nvmlDeviceGetClockInfo", (CLOCK_SM,), (("sm_clock", None, "MHz", 1.0),)),
    "mem_clock": ("nvmlDeviceGetClockInfo", (CLOCK_MEM,), (("mem_clock", None, "MHz", 1.0),)),
    "power": ("nvmlDeviceGetPowerUsage", (), (("power", None, "W", 1e-3),)),  # mW
    "temperature": ("nvmlDeviceGetTemperature", (TEMPERATURE_GPU,),
                    (("temperature", None, "C", 1.0),)),
}
#: the metrics of each probe (what `unavailable` names when NVML refuses the probe)
PROBE_METRICS = {
    **{name: tuple(o[0] for o in spec[2]) for name, spec in SIMPLE_PROBES.items()},
    "throttle": ("throttle_reasons",), "counters": (), "pcie_fallback": ("pcie_tx", "pcie_rx"),
}

Reading = tuple[str, float, str]  # metric, value, unit


@dataclass
class Gpu:
    """One GPU the job sees: `device` is the job's index (the Nth visible GPU)."""

    device: int
    index: int  # NVML's index
    uuid: str
    handle: Any
    working: set[str] = field(default_factory=set)  # probes that gave a value once
    refused: set[str] = field(default_factory=set)  # probes refused before that: skipped
    fields: list[int] = field(default_factory=list)  # counter fields NVML answers
    last: dict[int, tuple[int, float]] = field(default_factory=dict)  # field -> (ts_us, raw)
    pcie_fallback: bool = False
    pcie_fallback_ns: int = -PCIE_FALLBACK_PERIOD_NS


class NvmlSource:
    """The job's GPUs through pynvml (or a fake with its functions): every call goes through
    `probes.nvml_call`, which turns a failure into None ("not available").

    A probe that NVML refuses on its first read is not supported there: it is skipped on that
    GPU from then on and named once in `unavailable`. One that worked before and fails later
    only loses that sample.
    """

    def __init__(self, nvml: Any) -> None:
        self.nvml = nvml
        self.gpus: list[Gpu] = []
        self.unavailable: dict[int, list[str]] = {}
        self.notes: list[str] = []
        self.driver: str | None = None
        self._throttle = [name for name in THROTTLE_CALLS if hasattr(nvml, name)]
        self._special: dict[str, Callable[[Gpu, int], list[Reading] | None]] = {
            "throttle": self._throttle_reasons, "counters": self._counters,
            "pcie_fallback": self._pcie_fallback,
        }

    def call(self, name: str, *args: Any) -> Any:
        return nvml_call(self.nvml, name, *args)

    # -- opening ----------------------------------------------------------------------------

    def open(self, env: Mapping[str, str]) -> str | None:
        """Start NVML and find the GPUs the job sees; None, or why nothing can be sampled."""
        self.call("nvmlInit")  # None either way: the count below tells whether NVML runs
        count = self.call("nvmlDeviceGetCount")
        if count is None:
            return "NVML could not start: no NVIDIA driver (`gpudiag doctor` says more)"
        handles = [self.call("nvmlDeviceGetHandleByIndex", position) for position in range(count)]
        uuids = [nvml_text(self.call("nvmlDeviceGetUUID", handle)) if handle is not None else ""
                 for handle in handles]
        spec = env.get("CUDA_VISIBLE_DEVICES")
        indices, self.notes = visible_indices(spec, uuids)
        for device, index in enumerate(indices):
            if handles[index] is None:
                self.notes.append(f"GPU {index}: NVML gives no handle, not sampled")
            else:
                self.gpus.append(Gpu(device, index, uuids[index], handles[index]))
        if not self.gpus:
            self.close()
            return (f"no GPU visible to the job (CUDA_VISIBLE_DEVICES={spec!r})"
                    if spec is not None else "NVML sees no GPU")
        driver = self.call("nvmlSystemGetDriverVersion")
        self.driver = None if driver is None else nvml_text(driver)
        self._order_note(env, handles)
        for gpu in self.gpus:
            self._find_counters(gpu)
        return None

    def _order_note(self, env: Mapping[str, str], handles: Sequence[Any]) -> None:
        """CUDA numbers GPUs fastest first unless CUDA_DEVICE_ORDER=PCI_BUS_ID; NVML always
        by PCI bus. The two agree when the GPUs are alike, so only mixed models get a note."""
        if env.get("CUDA_DEVICE_ORDER") == "PCI_BUS_ID":
            return
        names = {nvml_text(self.call("nvmlDeviceGetName", handle)) for handle in handles
                 if handle is not None}
        if len(names) > 1:
            self.notes.append("mixed GPU models: CUDA may number them differently from NVML "
                              "(set CUDA_DEVICE_ORDER=PCI_BUS_ID to be sure)")

    def _find_counters(self, gpu: Gpu) -> None:
        """Which cumulative counters this GPU answers; their first reading is the base of the
        first rate. PCIe counters refused: nvmlDeviceGetPcieThroughput stands in."""
        values = self.call("nvmlDeviceGetFieldValues", gpu.handle,
                           [(field_id, COUNTERS[field_id][2]) for field_id in COUNTERS]) or []
        answered = {int(value.fieldId) for value in values if int(value.nvmlReturn) == 0}
        gpu.fields = [field_id for field_id in COUNTERS if field_id in answered]
        gpu.pcie_fallback = not set(PCIE_FIELDS) <= answered
        self._note(gpu, [COUNTERS[field_id][0] for field_id in COUNTERS
                         if field_id not in answered and field_id not in PCIE_FIELDS])
        if gpu.fields:
            self._rates(gpu, values, time.time_ns())

    def close(self) -> None:
        self.call("nvmlShutdown")

    # -- what the sampler reads -------------------------------------------------------------

    def read(self, gpu: Gpu, ts_ns: int) -> list[Reading]:
        """One reading of every probe this GPU supports."""
        out: list[Reading] = []
        for name, metrics in PROBE_METRICS.items():
            if name in gpu.refused:
                continue
            special = self._special.get(name)
            readings = self._simple(gpu, name) if special is None else special(gpu, ts_ns)
            if readings is None:
                if name not in gpu.working:
                    gpu.refused.add(name)
                    self._note(gpu, metrics)
                continue
            if readings:
                gpu.working.add(name)
                out += readings
        return out

    def _note(self, gpu: Gpu, metrics: Sequence[str]) -> None:
        if metrics:
            self.unavailable.setdefault(gpu.device, []).extend(metrics)
            log.debug("NVML: %s not available on GPU %d", ", ".join(metrics), gpu.index)

    def _simple(self, gpu: Gpu, probe: str) -> list[Reading] | None:
        call, args, outputs = SIMPLE_PROBES[probe]
        answer = self.call(call, gpu.handle, *args)
        if answer is None:
            return None
        return [(metric, float(answer if attr is None else getattr(answer, attr)) * scale, unit)
                for metric, attr, unit, scale in outputs]

    def _throttle_reasons(self, gpu: Gpu, _ts: int) -> list[Reading] | None:
        """nvmlClocksEventReasons bits; a driver without the new call answers the old one."""
        for name in list(self._throttle):
            value = self.call(name, gpu.handle)
            if value is not None:
                return [("throttle_reasons", float(value), "bitmask")]
            if len(self._throttle) > 1 and name == self._throttle[0]:
                self._throttle.remove(name)
        return None

    def _counters(self, gpu: Gpu, ts_ns: int) -> list[Reading] | None:
        if not gpu.fields:
            return []
        values = self.call("nvmlDeviceGetFieldValues", gpu.handle,
                           [(field_id, COUNTERS[field_id][2]) for field_id in gpu.fields])
        return None if values is None else self._rates(gpu, values, ts_ns)

    def _rates(self, gpu: Gpu, values: Sequence[Any], ts_ns: int) -> list[Reading]:
        """bytes/s since each counter's previous reading, on NVML's own timestamps. A value
        not refreshed since (same timestamp) waits; one that went back wrapped (32- and
        16-bit values) or was reset (wider ones: no rate this time)."""
        out: list[Reading] = []
        for field_value in values:
            fid = int(field_value.fieldId)
            if fid not in COUNTERS or int(field_value.nvmlReturn) != 0:
                continue
            kind = int(field_value.valueType)
            raw = float(getattr(field_value.value, VALUE_MEMBERS[kind]))
            ts_us = int(field_value.timestamp) or ts_ns // 1000
            prev = gpu.last.get(fid)
            if prev is not None and ts_us <= prev[0]:
                continue
            gpu.last[fid] = (ts_us, raw)
            if prev is None:
                continue
            delta = raw - prev[1]
            if delta < 0 and kind in WRAP_BITS:
                delta += 2.0 ** WRAP_BITS[kind]
            if delta >= 0:
                metric, scale, _scope = COUNTERS[fid]
                out.append((metric, delta * scale * 1e6 / (ts_us - prev[0]), "bytes/s"))
        return out

    def _pcie_fallback(self, gpu: Gpu, ts_ns: int) -> list[Reading] | None:
        if not gpu.pcie_fallback or ts_ns - gpu.pcie_fallback_ns < PCIE_FALLBACK_PERIOD_NS:
            return []
        gpu.pcie_fallback_ns = ts_ns
        sent = self.call("nvmlDeviceGetPcieThroughput", gpu.handle, PCIE_UTIL_TX)
        received = self.call("nvmlDeviceGetPcieThroughput", gpu.handle, PCIE_UTIL_RX)
        if sent is None or received is None:
            return None
        return [("pcie_tx", float(sent) * KIB, "bytes/s"),
                ("pcie_rx", float(received) * KIB, "bytes/s")]

    # -- description ------------------------------------------------------------------------

    def devices(self) -> pd.DataFrame:
        """The `devices` table of the visible GPUs (per-SM limits from the compute capability)."""
        return fill_from_compute_capability(
            pd.DataFrame([self._device_row(gpu) for gpu in self.gpus]))

    def _device_row(self, gpu: Gpu) -> dict[str, Any]:
        handle = gpu.handle
        name, memory = (self.call("nvmlDeviceGetName", handle),
                        self.call("nvmlDeviceGetMemoryInfo", handle))
        capability = self.call("nvmlDeviceGetCudaComputeCapability", handle) or (None, None)
        # MIG handles only, on most drivers
        attributes = self.call("nvmlDeviceGetAttributes", handle)
        sm_mhz = self.call("nvmlDeviceGetMaxClockInfo", handle, CLOCK_SM)
        mem_mhz = self.call("nvmlDeviceGetMaxClockInfo", handle, CLOCK_MEM)
        bus_bits = self.call("nvmlDeviceGetMemoryBusWidth", handle)
        bandwidth = peak_bandwidth(mem_mhz * 1000 if mem_mhz else None, bus_bits)
        return {
            "device": gpu.device,
            "name": nvml_text(name) if name is not None else f"GPU {gpu.index}",
            "vendor": "nvidia", "cc_major": capability[0], "cc_minor": capability[1],
            "sm_count": getattr(attributes, "multiprocessorCount", None),
            "mem_bytes": None if memory is None else int(memory.total),
            "clock_khz": None if sm_mhz is None else int(sm_mhz) * 1000,
            "mem_bandwidth_bytes_per_s": np.nan if bandwidth is None else bandwidth,
        }

    def meta(self) -> dict[str, Any]:
        return {
            "gpus": [{"device": gpu.device, "nvml_index": gpu.index, "uuid": gpu.uuid}
                     for gpu in self.gpus],
            "unavailable": {str(device): sorted(set(metrics))
                            for device, metrics in self.unavailable.items()},
            "notes": list(self.notes), "driver": self.driver,
        }


def visible_indices(spec: str | None, uuids: Sequence[str]) -> tuple[list[int], list[str]]:
    """NVML indices of the GPUs a CUDA program sees, in its order, and notes on what was left.

    CUDA_VISIBLE_DEVICES as CUDA reads it: unset = every GPU; else a comma list of indices or
    UUIDs (`GPU-` and a unique prefix), read up to the first entry that names no GPU (CUDA
    ignores the rest). MIG instances stop the list too: NVML counters are per physical GPU.
    """
    if spec is None:
        return list(range(len(uuids))), []
    chosen: list[int] = []
    notes: list[str] = []
    for raw in spec.split(","):
        entry = raw.strip()
        index = _match(entry, uuids)
        if index is None or index in chosen:
            if entry:
                why = "a MIG instance, not sampled" if entry.upper().startswith("MIG-") \
                    else "no single GPU here"
                notes.append(f"CUDA_VISIBLE_DEVICES entry {entry!r} names {why}; it and the "
                             "entries after it are ignored")
            break
        chosen.append(index)
    return chosen, notes


def _match(entry: str, uuids: Sequence[str]) -> int | None:
    if entry.isdigit():
        return int(entry) if int(entry) < len(uuids) else None
    if entry.upper().startswith("GPU-"):
        hits = [index for index, uuid in enumerate(uuids) if uuid.upper().startswith(entry.upper())]
        return hits[0] if len(hits) == 1 else None
    return None
