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
    known = out["cc_major"].notna() & out["cc_minor"].notna() & (out["vendor"] == "nvidia")
    for idx in out.index[known]:
        limits = arch_limits(out.at[idx, "cc_major"], out.at[idx, "cc_minor"])
        if limits is None:
            continue
        defaults = {
            "max_blocks_per_sm": limits.max_blocks_per_sm,
            "max_threads_per_sm": limits.max_warps_per_sm * 32,
            "regs_per_sm": limits.regs_per_sm,
            "smem_per_sm_bytes": limits.max_smem_per_sm_bytes,
            "warp_size": 32,
        }
        for col, value in defaults.items():
            if pd.isna(out.at[idx, col]):
                out.at[idx, col] = value
    return out


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
