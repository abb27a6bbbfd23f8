"""GPU properties that profiles leave out, from the compute capability.

Kineto's deviceProperties, nsys' TARGET_INFO_GPU and ncu's device attributes each omit some
per-SM limits (Kineto has no blocks-per-SM limit; old nsys exports lack more). These limits
are fixed per compute capability; the values are those of the CUDA C++ Programming Guide's
"Technical Specifications per Compute Capability" table.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from gpudiag.schema import TABLES


@dataclass(frozen=True)
class ArchLimits:
    max_blocks_per_sm: int
    max_warps_per_sm: int
    regs_per_sm: int
    max_smem_per_sm_bytes: int  # the largest shared-memory carveout
    max_smem_per_block_optin_bytes: int


KIB = 1024

#: (cc_major, cc_minor) -> per-SM limits
ARCH_LIMITS: dict[tuple[int, int], ArchLimits] = {
    (7, 0): ArchLimits(32, 64, 65536, 96 * KIB, 96 * KIB),
    (7, 2): ArchLimits(32, 64, 65536, 96 * KIB, 96 * KIB),
    (7, 5): ArchLimits(16, 32, 65536, 64 * KIB, 64 * KIB),
    (8, 0): ArchLimits(32, 64, 65536, 164 * KIB, 163 * KIB),
    (8, 6): ArchLimits(16, 48, 65536, 100 * KIB, 99 * KIB),
    (8, 7): ArchLimits(16, 48, 65536, 164 * KIB, 163 * KIB),
    (8, 9): ArchLimits(24, 48, 65536, 100 * KIB, 99 * KIB),
    (9, 0): ArchLimits(32, 64, 65536, 228 * KIB, 227 * KIB),
    (10, 0): ArchLimits(32, 64, 65536, 228 * KIB, 227 * KIB),
    (10, 3): ArchLimits(32, 64, 65536, 228 * KIB, 227 * KIB),
    (12, 0): ArchLimits(32, 48, 65536, 100 * KIB, 99 * KIB),
}


def arch_limits(cc_major: int, cc_minor: int) -> ArchLimits | None:
    """Limits for a compute capability, or None for one not in the table."""
    return ARCH_LIMITS.get((int(cc_major), int(cc_minor)))


def fill_from_compute_capability(devices: pd.DataFrame) -> pd.DataFrame:
    """The devices table (conformed to the schema) with NA per-SM limits of NVIDIA devices
    filled from their compute capability."""
    out = TABLES["devices"].conform(devices)
    if out.empty:
        return out
    known = [_defaults(major, minor) if vendor == "nvidia" else {}
             for major, minor, vendor in zip(out["cc_major"], out["cc_minor"], out["vendor"],
                                             strict=True)]  # one per GPU: a handful of rows
    for col in _FILLED:
        fallback = pd.array([row.get(col) for row in known], dtype="Int64")
        out[col] = out[col].fillna(pd.Series(fallback, index=out.index))
    return out


_FILLED = ("max_blocks_per_sm", "max_threads_per_sm", "regs_per_sm", "smem_per_sm_bytes",
           "warp_size")


def _defaults(major: object, minor: object) -> dict[str, int]:
    if pd.isna(major) or pd.isna(minor):
        return {}
    limits = arch_limits(int(major), int(minor))  # type: ignore[call-overload]
    if limits is None:
        return {}
    return dict(zip(_FILLED, (limits.max_blocks_per_sm, limits.max_warps_per_sm * 32,
                              limits.regs_per_sm, limits.max_smem_per_sm_bytes, 32),
                    strict=True))


def vendor_of(name: object) -> str:
    """'nvidia', 'amd' or 'unknown' from a product name."""
    if not isinstance(name, str):
        return "unknown"
    lowered = name.lower()
    if any(k in lowered for k in ("nvidia", "tesla", "geforce", "quadro", "rtx", "titan")):
        return "nvidia"
    if any(k in lowered for k in ("amd", "radeon", "instinct", "mi2", "mi3")):
        return "amd"
    return "unknown"
