"""Theoretical occupancy of kernel launches, computed from the launch and the GPU's limits.

How many blocks of a launch fit on one SM at once is the smallest of four limits, as the CUDA
occupancy calculator (`cuda_occupancy.h`, whose rules this module re-derives) counts them:

- **warps**: the SM's warp slots / warps per block (a block's threads rounded up to warps);
- **blocks**: the SM's resident-block limit;
- **registers**: registers are allocated per warp, `regs/thread x 32` rounded up to 256, out
  of each of the SM's 4 sub-partitions (a quarter of the register file each);
- **shared_memory**: static + dynamic + the 1 KB the driver reserves per block on cc >= 8.0,
  rounded up to 128 B (256 B on 7.x), out of the carveout the launch ran with where the trace
  records it, else the SM's whole shared memory (the calculator's default carveout); a
  carveout smaller than one block is rounded up to the next size the architecture offers.

A block that breaks a per-block limit (threads, registers, shared memory) fits 0 times.
Theoretical occupancy is resident warps / the SM's warp slots; it is what Nsight Compute
reports as `sm__maximum_warps_per_active_cycle_pct`, and our tests check it against that on
every real report. Nothing here reads ncu's own occupancy metrics.

Everything is numpy over all kernels at once; only the devices table (a handful of rows) is
walked row by row.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import pandas as pd

from gpudiag.analyzers import keys
from gpudiag.devices import fill_from_compute_capability, vendor_of
from gpudiag.schema import TABLES

KIB = 1024
#: registers are handed to warps in units of 256
REG_ALLOC_UNIT = 256
#: each SM's register file is split among 4 warp schedulers (cc 7.0 and later)
SUB_PARTITIONS = 4
MAX_REGS_PER_THREAD = 255
#: a limit that never binds (the calculator's INT_MAX)
UNLIMITED = np.int64(2**31 - 1)

#: columns of `calculate`'s result, in order
COLUMNS = ("theoretical_occupancy", "blocks_per_sm", "limiter", "waves", "tail_efficiency",
           "unavailable")
#: the limiter named when several limits tie: the SM's own limits first (then none of the
#: kernel's resources is what holds occupancy back), then registers and shared memory
LIMITERS = ("warps", "blocks", "registers", "shared_memory")


@dataclass(frozen=True)
class Granularity:
    """What the occupancy calculator needs beyond the devices table, per architecture."""

    smem_unit_bytes: int  # shared memory is allocated to blocks in these units
    smem_reserved_bytes: int  # the driver's per-block reservation (cc >= 8.0)


#: per compute-capability major; 7 = Volta/Turing, 8 Ampere/Ada, 9 Hopper, 10 and 12 Blackwell
GRANULARITY: dict[int, Granularity] = {
    7: Granularity(256, 0),
    8: Granularity(128, KIB),
    9: Granularity(128, KIB),
    10: Granularity(128, KIB),
    12: Granularity(128, KIB),
}

_AMPERE_DC = (0, 8, 16, 32, 64, 100, 132, 164)
_CONSUMER = (0, 8, 16, 32, 64, 100)
_HOPPER = (*_AMPERE_DC, 196, 228)
#: shared-memory carveouts (KiB) an SM can be configured with, per (major, minor)
CARVEOUTS_KIB: dict[tuple[int, int], tuple[int, ...]] = {
    (7, 0): (0, 8, 16, 32, 64, 96), (7, 2): (0, 8, 16, 32, 64, 96), (7, 5): (32, 64),
    (8, 0): _AMPERE_DC, (8, 7): _AMPERE_DC, (8, 6): _CONSUMER, (8, 9): _CONSUMER,
    (9, 0): _HOPPER, (10, 0): _HOPPER, (10, 3): _HOPPER, (12, 0): _CONSUMER,
}

#: product names -> compute capability, for devices whose source names the GPU but not its
#: compute capability (the SM count differs within a family, so it is never taken from here)
CC_BY_NAME: tuple[tuple[re.Pattern[str], tuple[int, int]], ...] = tuple(
    (re.compile(pattern), cc) for pattern, cc in (  # first match wins: Turing's Quadro
        (r"\bt4\b|rtx 20\d0|titan rtx|quadro rtx", (7, 5)),  # RTX 4000 is not an RTX 40x0
        (r"\bg?h(100|200|800|20)\b", (9, 0)),
        (r"\bg?b(100|200)\b", (10, 0)),
        (r"\bg?b300\b", (10, 3)),
        (r"\ba(100|800|30)\b", (8, 0)),
        (r"\ba(10g?|40|16|2)\b|rtx 30\d0|rtx a\d000", (8, 6)),
        (r"\bl(4|40s?)\b|rtx 40\d0|rtx \d000 ada", (8, 9)),
        (r"\bv100\b|titan v\b", (7, 0)),
        (r"rtx 50\d0|rtx pro \d000 blackwell", (12, 0)),
    )
)

#: the per-SM limits occupancy cannot do without
REQUIRED = ("max_threads_per_sm", "max_blocks_per_sm", "regs_per_sm", "smem_per_sm_bytes",
            "warp_size")
#: per-block limits with the value every cc 7.0-12.0 GPU has, used where a source omits them
PER_BLOCK_DEFAULTS = {"regs_per_block": 65536, "max_threads_per_block": 1024}


def cc_from_name(name: object) -> tuple[int, int] | None:
    """The compute capability of a known NVIDIA product name ('NVIDIA A100-SXM4-80GB')."""
    if not isinstance(name, str):
        return None
    lowered = name.lower()
    return next((capability for pattern, capability in CC_BY_NAME if pattern.search(lowered)),
                None)


def device_limits(devices: pd.DataFrame) -> pd.DataFrame:
    """The devices table with what occupancy needs filled in, plus `reason`: NA where the
    device's occupancy can be computed, else why not (one short phrase).

    Limits a source left out come from the compute capability (`devices.py`); a device with
    no compute capability gets one from its product name where `CC_BY_NAME` knows it.
    """
    out = TABLES["devices"].conform(devices)
    if out.empty:
        return out.assign(reason=pd.Series(dtype="string"))
    named = [cc_from_name(name) if pd.isna(major) or pd.isna(minor) else None
             for name, major, minor in zip(out["name"], out["cc_major"], out["cc_minor"],
                                           strict=True)]
    for col, part in (("cc_major", 0), ("cc_minor", 1)):
        guess = pd.array([None if capability is None else capability[part]
                          for capability in named], dtype="Int64")
        out[col] = out[col].fillna(pd.Series(guess, index=out.index))
    known = pd.Series([vendor_of(name) if capability is None else "nvidia"
                       for name, capability in zip(out["name"], named, strict=True)],
                      index=out.index)
    unsure = out["vendor"].isna() | (out["vendor"] == "unknown")
    out["vendor"] = out["vendor"].where(~unsure, known)
    out = fill_from_compute_capability(out)
    for col, value in PER_BLOCK_DEFAULTS.items():
        out[col] = out[col].fillna(value)
    out["reason"] = pd.array([_reason(row) for row in out.to_dict("records")],
                             dtype="string")  # one per GPU: a handful of rows
    return out


def _reason(row: dict[str, Any]) -> str | None:
    """Why a devices row cannot give occupancy, or None when it can."""
    label = f"device {row['device']}"
    if row["vendor"] == "amd":
        return f"{label} is not an NVIDIA GPU"
    if pd.isna(row["cc_major"]):
        return f"no compute capability for {label}"
    capability = f"{row['cc_major']}.{row['cc_minor']}"
    if int(row["cc_major"]) not in GRANULARITY:
        return f"compute capability {capability} of {label} is not supported"
    missing = [col for col in REQUIRED if pd.isna(row[col])]
    if missing and row["vendor"] != "nvidia":
        return f"{label} is not known to be an NVIDIA GPU and has no {missing[0]}"
    if missing:
        return f"no {missing[0]} for {label} (cc {capability})"
    return None


#: the kernels columns occupancy depends on: launches that agree on all of them share it
CONFIG_COLUMNS = ("rank", "device", "grid_x", "grid_y", "grid_z", "block_x", "block_y",
                  "block_z", "regs_per_thread", "smem_bytes", "smem_static_bytes",
                  "smem_dynamic_bytes", "smem_config_bytes")


def for_kernels(kernels: pd.DataFrame, devices: pd.DataFrame) -> pd.DataFrame:
    """`calculate` for a kernels table against a devices table, index aligned with `kernels`:
    COLUMNS plus `grid_blocks`, `block_threads` and `sm_count` (the other inputs of waves)
    and `config` (a code per distinct launch configuration).

    Computed once per distinct launch configuration and spread to every launch: a trace
    of millions of launches holds a few thousand configurations."""
    if kernels.empty:
        return _for_configs(kernels, devices).assign(config=pd.Series(dtype="int64"))
    config = keys.codes(*(kernels[col] for col in CONFIG_COLUMNS))
    inverse, uniques = pd.factorize(config)  # hashing: no sort of millions of keys
    first = np.zeros(len(uniques), dtype=np.int64)
    first[inverse[::-1]] = np.arange(len(inverse) - 1, -1, -1)  # last write = first seen
    unique = _for_configs(kernels.iloc[first], devices)
    out = unique.iloc[inverse].reset_index(drop=True)
    out["config"] = inverse.astype(np.int64)  # launches with one code share every column
    out.index = kernels.index
    return out


def _for_configs(kernels: pd.DataFrame, devices: pd.DataFrame) -> pd.DataFrame:
    limits = device_limits(devices)
    pos = _device_rows(kernels, limits)
    per_kernel = limits.reindex(pos).reset_index(drop=True)  # all-NA rows where pos is -1
    reason = per_kernel["reason"].to_numpy(dtype=object)
    lost = pos < 0
    device = kernels["device"].to_numpy(dtype=object)[lost]
    reason[lost] = np.where(pd.isna(device), "no device recorded for the kernel",
                            "no device properties for device " + device.astype(str))
    per_kernel["reason"] = reason  # object: `calculate` reads it back as such
    out = calculate(kernels.reset_index(drop=True), per_kernel)
    out.index = kernels.index
    return out


def _device_rows(kernels: pd.DataFrame, limits: pd.DataFrame) -> npt.NDArray[np.int64]:
    """Row position in `limits` of each kernel's device, -1 where there is none.

    The key is (rank, device). A devices row without a rank serves every rank; a kernel
    without a rank takes its device's row when the table lists that device only once. A
    kernel without a device matches no row (the devices table always names its device).
    """
    none = np.full(len(kernels), -1, dtype=np.int64)
    if limits.empty or kernels.empty:
        return none
    rank = kernels["rank"].astype("Int64").reset_index(drop=True)
    device = kernels["device"].astype("Int64").reset_index(drop=True)
    dev_rank = limits["rank"].astype("Int64").reset_index(drop=True)
    dev_device = limits["device"].to_numpy(np.int64)
    pos = keys.join([rank, device], [dev_rank, pd.Series(dev_device)])  # first row per key
    pos = np.where(pos >= 0, pos,  # rank NA matches rank NA; else a row serving every rank
                   _only_row(dev_device, dev_rank.isna().to_numpy(bool), device))
    return np.where((pos >= 0) | rank.notna().to_numpy(bool), pos,
                    _only_row(dev_device, np.ones(len(limits), dtype=bool), device))


def _only_row(dev_device: npt.NDArray[np.int64], among: npt.NDArray[np.bool_],
              device: pd.Series) -> npt.NDArray[np.int64]:
    """Per kernel device (Int64, NA: no row), the one row of `among` that lists it (-1:
    none, or several)."""
    rows = pd.Series(np.flatnonzero(among), index=dev_device[among])
    rows = rows[~rows.index.duplicated(keep=False)]
    if rows.empty:
        return np.full(len(device), -1, dtype=np.int64)
    found = rows.index.get_indexer(device)
    return np.where(found >= 0, rows.to_numpy()[np.maximum(found, 0)], -1).astype(np.int64)


def _floats(frame: pd.DataFrame, col: str) -> npt.NDArray[np.float64]:
    """A column as float64 with NaN for NA (integers up to 2**53 stay exact)."""
    if col not in frame:
        return np.full(len(frame), np.nan)
    return pd.to_numeric(frame[col], errors="coerce").astype("float64").to_numpy(np.float64)


@dataclass(frozen=True)
class _Launch:
    """The launch configuration of every kernel, as float arrays (NaN: not recorded)."""

    grid_blocks: npt.NDArray[np.float64]
    block_threads: npt.NDArray[np.float64]
    regs: npt.NDArray[np.float64]
    smem: npt.NDArray[np.float64]
    carveout: npt.NDArray[np.float64]

    @classmethod
    def of(cls, kernels: pd.DataFrame) -> _Launch:
        def product(axes: str) -> npt.NDArray[np.float64]:
            width, height, depth = (_floats(kernels, f"{axes}_{axis}") for axis in "xyz")
            return width * height * depth

        split = _floats(kernels, "smem_static_bytes") + _floats(kernels, "smem_dynamic_bytes")
        smem = _floats(kernels, "smem_bytes")
        return cls(product("grid"), product("block"), _floats(kernels, "regs_per_thread"),
                   np.where(np.isnan(smem), split, smem), _floats(kernels, "smem_config_bytes"))


def calculate(kernels: pd.DataFrame, limits: pd.DataFrame) -> pd.DataFrame:
    """Occupancy of each kernels row given its device's limits (`limits`: one row per kernel,
    positionally aligned, columns of `device_limits` including `reason`)."""
    launch = _Launch.of(kernels)
    dev = {col: _floats(limits, col) for col in (*REQUIRED, *PER_BLOCK_DEFAULTS, "sm_count",
                                                  "cc_major", "cc_minor",
                                                  "smem_per_block_optin_bytes")}
    reason = _launch_reasons(launch, limits["reason"].to_numpy(dtype=object))
    with np.errstate(invalid="ignore", divide="ignore"):
        stacked = np.vstack(_block_limits(launch, dev))
        valid = pd.isna(reason) & ~np.isnan(stacked).any(axis=0)
        usable = np.where(valid, stacked, 0)  # argmin takes the first minimum: LIMITERS order
        blocks = usable.min(axis=0)
        limiter = usable.argmin(axis=0)  # position in LIMITERS
        max_warps = np.floor(dev["max_threads_per_sm"] / dev["warp_size"])
        warps = np.ceil(launch.block_threads / dev["warp_size"])
        occupancy = np.where(valid, blocks * warps / max_warps, np.nan)
        waves = launch.grid_blocks / (blocks * dev["sm_count"])
        waves = np.where(valid & (blocks > 0) & np.isfinite(waves), waves, np.nan)
        tail = waves / np.ceil(waves)
    return pd.DataFrame({
        "theoretical_occupancy": occupancy,
        "blocks_per_sm": pd.arrays.IntegerArray(np.where(valid, blocks, 0).astype(np.int64),
                                                ~valid),
        # categorical: millions of launches share four limiters and a few reasons
        "limiter": pd.Categorical.from_codes(np.where(valid, limiter, -1),  # -1: NA
                                             categories=list(LIMITERS)),
        "waves": waves, "tail_efficiency": tail,
        "unavailable": pd.Categorical(_after(reason, valid, blocks, limiter, limits)),
        "grid_blocks": launch.grid_blocks, "block_threads": launch.block_threads,
        "sm_count": dev["sm_count"],
    })


def _after(reason: npt.NDArray[np.object_], valid: npt.NDArray[np.bool_],
           blocks: npt.NDArray[np.float64], limiter: npt.NDArray[np.intp],
           limits: pd.DataFrame) -> npt.NDArray[np.object_]:
    """The reasons for computed occupancy without waves: a block that fits nowhere (0
    blocks per SM: the limiter says which per-block limit it breaks), or no SM count."""
    reason = reason.copy()
    stuck = valid & (blocks == 0)
    names = np.array(LIMITERS, dtype=object)[limiter[stuck]]
    reason[stuck] = "the block does not fit on an SM (" + names + ")"
    no_sms = valid & ~stuck & np.isnan(_floats(limits, "sm_count"))
    reason[no_sms] = "no sm_count for device " + limits["device"].to_numpy(dtype=object)[
        no_sms].astype(str)
    return reason


def _launch_reasons(launch: _Launch, device_reason: npt.NDArray[np.object_]
                    ) -> npt.NDArray[np.object_]:
    """Per kernel, the first reason its occupancy cannot be computed (None: it can)."""
    checks = (
        (np.isnan(launch.grid_blocks) | np.isnan(launch.block_threads),
         "no grid or block size recorded"),
        ((launch.grid_blocks <= 0) | (launch.block_threads <= 0), "empty grid or block"),
        (np.isnan(launch.regs), "no registers per thread recorded"),
        (np.isnan(launch.smem), "no shared memory size recorded"),
    )
    out = np.array(device_reason, dtype=object)
    pending = pd.isna(out)
    out[pending] = None
    for hit, why in checks:  # the first check that fails wins
        out[pending & hit] = why
        pending &= ~hit
    return out


Arrays = dict[str, npt.NDArray[np.float64]]


def _block_limits(launch: _Launch, dev: Arrays) -> list[npt.NDArray[np.float64]]:
    """Blocks per SM allowed by each limit, in LIMITERS order (NaN where inputs are NA)."""
    warp = dev["warp_size"]
    with np.errstate(invalid="ignore", divide="ignore"):
        warps = np.ceil(launch.block_threads / warp)
        too_big = launch.block_threads > dev["max_threads_per_block"]
        slots = np.floor(dev["max_threads_per_sm"] / warp)
        by_warps = np.where(too_big, 0, np.floor(slots / warps))
        return [by_warps, dev["max_blocks_per_sm"], _by_registers(launch, dev, warps),
                _by_shared_memory(launch, dev)]


def _by_registers(launch: _Launch, dev: Arrays,
                  warps: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    """Registers go to warps in units of 256, from each sub-partition's quarter of the file.

    The hardware checks the per-block register limit as if the block's warps were spread
    over all 4 sub-partitions, so the block's warps are rounded up to 4 for that check.
    """
    per_warp = np.ceil(launch.regs * dev["warp_size"] / REG_ALLOC_UNIT) * REG_ALLOC_UNIT
    checked = per_warp * np.ceil(warps / SUB_PARTITIONS) * SUB_PARTITIONS
    fits = (checked <= dev["regs_per_block"]) & (launch.regs <= MAX_REGS_PER_THREAD)
    per_sub = np.floor(np.floor(dev["regs_per_sm"] / SUB_PARTITIONS) / per_warp)
    limit = np.where(per_warp > 0, np.floor(per_sub * SUB_PARTITIONS / warps), UNLIMITED)
    return np.where(fits | np.isnan(checked), limit, 0)


def _by_shared_memory(launch: _Launch, dev: Arrays) -> npt.NDArray[np.float64]:
    """Shared memory per block, with the driver's reservation and rounded to the allocation
    unit, out of the carveout the launch ran with (the whole SM's where not recorded)."""
    major = dev["cc_major"]
    unit = _per_major(major, lambda granularity: granularity.smem_unit_bytes)
    reserved = _per_major(major, lambda granularity: granularity.smem_reserved_bytes)
    per_block = np.ceil((launch.smem + reserved) / unit) * unit
    carveout = np.where(np.isnan(launch.carveout), dev["smem_per_sm_bytes"], launch.carveout)
    short = ~(carveout >= per_block)
    if short.any():
        carveout[short] = _next_carveout(per_block[short],
                                         {name: values[short] for name, values in dev.items()})
    cap = dev["smem_per_block_optin_bytes"] + reserved
    fits = ~(per_block > cap)  # true where the opt-in limit is unknown
    limit = np.where(per_block > 0, np.floor(carveout / per_block), UNLIMITED)
    return np.where(fits, limit, 0)


def _per_major(major: npt.NDArray[np.float64],
               value: Callable[[Granularity], int]) -> npt.NDArray[np.float64]:
    """A Granularity field per kernel (NaN for an unsupported or unknown major)."""
    out = np.full(len(major), np.nan)
    for number, granularity in GRANULARITY.items():
        out[major == number] = value(granularity)
    return out


def _next_carveout(per_block: npt.NDArray[np.float64], dev: Arrays) -> npt.NDArray[np.float64]:
    """The smallest carveout of each kernel's architecture that holds one block; the SM's
    whole shared memory where the architecture's carveouts are not known."""
    out = dev["smem_per_sm_bytes"].copy()
    for (major, minor), sizes in CARVEOUTS_KIB.items():
        rows = (dev["cc_major"] == major) & (dev["cc_minor"] == minor)
        if not rows.any():
            continue
        steps = np.asarray(sizes, dtype=np.float64) * KIB
        fit = np.searchsorted(steps, per_block[rows], side="left")  # first that holds a block
        out[rows] = np.where(fit < len(steps), steps[np.minimum(fit, len(steps) - 1)], out[rows])
    return out
