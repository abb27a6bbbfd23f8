"""Theoretical occupancy: Nsight Compute as the oracle on every real report, and exact
answers on synthetic launches for each limiter, each granularity and each kind of missing
data."""

from __future__ import annotations

from functools import cache
from typing import Any

import numpy as np
import pandas as pd
import pytest

import gpudiag
from gpudiag.analyzers.kernels import occupancy as occ
from gpudiag.analyzers.kernels.launch import occupancy
from gpudiag.trace import Trace
from tests.builders import kernel, trace
from tests.conftest import fixture, fixtures

NCU = [p.name for p in fixtures("ncu/*.ncu-rep")] or ["(shared fixtures absent)"]
OCC_PCT = "sm__maximum_warps_per_active_cycle_pct"
LIMIT = "launch__occupancy_limit_"

#: kernels of the real reports we do not compare with ncu, and why; every entry is checked
#: to still be an exception, so the table cannot go stale
ORACLE_EXCEPTIONS: dict[tuple[str, int], str] = {
    ("a10g_esmm_4kernels_default.ncu-rep", 3):
        "ncu recorded no launch__* metrics for this result (its own LaunchConfiguration rule "
        "failed with 'launch__block_size not found'), so neither side has an occupancy",
}
#: how many kernels of each report must match ncu exactly (the test's own tally)
ORACLE_MATCHES = {
    "a100pcie_selfjoin_setfull_ncu2022.ncu-rep": 4, "a100sxm4_silu_setfull.ncu-rep": 3,
    "a10g_esmm_4kernels_default.ncu-rep": 3, "gh200_aarch64_rmsnorm_setfull.ncu-rep": 1,
    "rtx3050laptop_filter_nvtx.ncu-rep": 1, "rtx4090_readsegment_unroll_36launches.ncu-rep": 36,
    "rtx4090_smem_square_9kernels_smallgrid.ncu-rep": 9,
    "rtx4090_smem_transpose_15sections_source.ncu-rep": 5, "t4_matadd_setfull.ncu-rep": 1,
    "v100_jacobi_basic.ncu-rep": 1,
}
#: per-limit comparison: where ncu's shared-memory limit is computed differently, and why
SMEM_LIMIT_EXCEPTIONS: dict[tuple[str, int], str] = {
    ("t4_matadd_setfull.ncu-rep", 0):
        "no shared memory at all (cc 7.5 reserves none): the calculator's limit is unlimited, "
        "ncu prints the block limit (16) instead",
    ("v100_jacobi_basic.ncu-rep", 0):
        "this older ncu divides the SM's whole 96 KB (384 blocks of 256 B); we divide the 8 KB "
        "carveout the launch ran with (32 blocks). Registers (4) bind either way",
}


@cache
def load(name: str) -> Trace:
    return gpudiag.load(fixture(f"ncu/{name}"))


def ncu_values(trace: Trace, metric: str) -> pd.Series:
    """One ncu metric per kernels row (NaN where the report lacks it)."""
    m = trace.metrics
    values = m[m["metric"] == metric].set_index("kernel_id")["value"]
    return trace.kernels["kernel_id"].map(values).astype("float64")


def ncu_limits(trace: Trace) -> pd.DataFrame:
    return pd.DataFrame({name: ncu_values(trace, LIMIT + name)
                         for name in ("warps", "blocks", "registers", "shared_mem")})


@pytest.mark.parametrize("name", NCU)
def test_theoretical_occupancy_equals_ncu_on_every_real_report(name: str) -> None:
    t = load(name)
    ours = occupancy(t)
    want_pct = ncu_values(t, OCC_PCT)
    want_blocks = ncu_limits(t).min(axis=1, skipna=False)
    matched = 0
    for i, kid in enumerate(t.kernels["kernel_id"]):
        if (name, kid) in ORACLE_EXCEPTIONS:
            assert pd.isna(want_pct.iloc[i]) and pd.notna(ours["unavailable"].iloc[i])
            continue
        assert pd.isna(ours["unavailable"].iloc[i]), (kid, ours["unavailable"].iloc[i])
        assert ours["theoretical_occupancy"].iloc[i] * 100 == pytest.approx(
            want_pct.iloc[i], rel=0, abs=1e-9), kid
        assert ours["blocks_per_sm"].iloc[i] == want_blocks.iloc[i], kid
        matched += 1
    assert matched == ORACLE_MATCHES[name]


@pytest.mark.parametrize("name", NCU)
def test_waves_equal_ncu_waves_per_multiprocessor(name: str) -> None:
    t = load(name)
    want = ncu_values(t, "launch__waves_per_multiprocessor")
    got = occupancy(t)["waves"]
    known = want.notna()
    assert got[known].to_numpy() == pytest.approx(want[known].to_numpy(), rel=1e-9)
    assert got[~known].isna().all()


@pytest.mark.parametrize("name", NCU)
def test_each_limit_equals_ncus_occupancy_limit(name: str) -> None:
    """Not only the minimum: each of the four limits, computed on its own, is ncu's."""
    t = load(name)
    lim = occ.device_limits(t.devices)
    rows = lim.iloc[occ._device_rows(t.kernels, lim)].reset_index(drop=True)
    dev = {c: occ._floats(rows, c) for c in (*occ.REQUIRED, *occ.PER_BLOCK_DEFAULTS,
                                             "cc_major", "cc_minor",
                                             "smem_per_block_optin_bytes")}
    ours = dict(zip(("warps", "blocks", "registers", "shared_mem"),
                    occ._block_limits(occ._Launch.of(t.kernels), dev), strict=True))
    want = ncu_limits(t)
    for i, kid in enumerate(t.kernels["kernel_id"]):
        if (name, kid) in ORACLE_EXCEPTIONS:
            continue
        for limit in ("warps", "blocks", "registers", "shared_mem"):
            if limit == "shared_mem" and (name, kid) in SMEM_LIMIT_EXCEPTIONS:
                assert ours[limit][i] != want[limit].iloc[i]
                continue
            assert ours[limit][i] == want[limit].iloc[i], (kid, limit)


def test_ncus_own_occupancy_metrics_are_not_read() -> None:
    """Drop every metric: the answer must not change (it comes from the launch alone)."""
    t = load(NCU[0])
    bare = Trace(kernels=t.kernels, devices=t.devices, meta=t.meta)
    pd.testing.assert_frame_equal(occupancy(bare), occupancy(t))


# -- synthetic launches --------------------------------------------------------------------

A100 = {"device": 0, "name": "NVIDIA A100-SXM4-80GB", "vendor": "nvidia", "sm_count": 108,
        "cc_major": 8, "cc_minor": 0, "max_threads_per_sm": 2048, "max_blocks_per_sm": 32,
        "max_threads_per_block": 1024, "regs_per_sm": 65536, "regs_per_block": 65536,
        "smem_per_sm_bytes": 167936, "smem_per_block_optin_bytes": 166912, "warp_size": 32}
V100 = {"device": 0, "name": "Tesla V100-SXM2-32GB", "vendor": "nvidia", "sm_count": 80,
        "cc_major": 7, "cc_minor": 0}
T4 = {"device": 0, "name": "Tesla T4", "vendor": "nvidia", "sm_count": 40, "cc_major": 7,
      "cc_minor": 5}


def launch(block: int = 128, grid: int = 1000, regs: int | None = 16,
           smem: int | None = 0, device: dict[str, Any] | None = A100,
           **extra: Any) -> pd.Series:
    """The occupancy row of one launch on one device."""
    k = kernel(0, 1000, grid=(grid, 1, 1), block=(block, 1, 1), regs_per_thread=regs,
               smem_bytes=smem, **extra)
    devices = pd.DataFrame([device]) if device is not None else None
    return occupancy(trace(kernels=[k], devices=devices)).iloc[0]


@pytest.mark.parametrize(("block", "regs", "smem", "blocks", "limiter"), [
    (256, 16, 0, 8, "warps"),                  # 8 warps/block: 64 slots / 8
    (256, 32, 0, 8, "warps"),                  # registers also allow 8: ties go to warps
    (32, 16, 0, 32, "blocks"),                 # 1-warp blocks: the 32-block limit binds
    (256, 64, 0, 4, "registers"),              # 2048 regs/warp: 8 warps per sub-partition
    (128, 16, 48 * 1024, 3, "shared_memory"),  # 49 KB + 1 KB reserved per block of 164 KB
])
def test_each_limiter_on_an_a100(block: int, regs: int, smem: int, blocks: int,
                                 limiter: str) -> None:
    row = launch(block=block, regs=regs, smem=smem)
    assert (row["blocks_per_sm"], row["limiter"]) == (blocks, limiter)
    assert row["theoretical_occupancy"] == blocks * (block // 32) / 64
    assert pd.isna(row["unavailable"])


def test_registers_are_allocated_per_warp_in_units_of_256() -> None:
    """33 regs/thread = 1056 per warp, allocated as 1280: 12 warps per sub-partition, 48 per
    SM, 12 blocks of 4 warps (per-thread arithmetic would say 65536 / (33 x 128) = 15)."""
    row = launch(block=128, regs=33)
    assert (row["blocks_per_sm"], row["limiter"]) == (12, "registers")
    assert row["theoretical_occupancy"] == 0.75


def test_shared_memory_is_allocated_in_256_byte_units_on_volta() -> None:
    """3100 B -> 3328 B per block on cc 7.0 (29 of 96 KB); 128 B units would give 30."""
    row = launch(block=32, smem=3100, device=V100)
    assert (row["blocks_per_sm"], row["limiter"]) == (29, "shared_memory")


def test_shared_memory_is_allocated_in_128_byte_units_from_ampere() -> None:
    """3100 + 1024 reserved = 4124 B -> 4224 B per block: 164 KB holds 39, the block limit
    (32) binds; with 256 B units it would be 4352 B (38)."""
    row = launch(block=32, smem=3100, smem_config_bytes=32 * 1024)
    assert row["blocks_per_sm"] == 7  # 32 KB carveout / 4224 B
    assert launch(block=32, smem=3100)["limiter"] == "blocks"


def test_the_driver_reserves_1kb_per_block_from_cc_8() -> None:
    """No shared memory declared still costs 1 KB a block on an A100 (8 per 8 KB carveout),
    nothing on a T4."""
    a100 = launch(block=32, smem=0, smem_config_bytes=8 * 1024)
    assert (a100["blocks_per_sm"], a100["limiter"]) == (8, "shared_memory")
    t4 = launch(block=32, smem=0, device=T4)
    assert (t4["blocks_per_sm"], t4["limiter"]) == (16, "blocks")


def test_the_recorded_carveout_limits_shared_memory_and_a_short_one_is_rounded_up() -> None:
    # 4096 + 1024 = 5120 B per block: 32 KB holds 6; the whole SM (164 KB) 32
    assert launch(block=32, smem=4096, smem_config_bytes=32 * 1024)["blocks_per_sm"] == 6
    assert launch(block=32, smem=4096)["blocks_per_sm"] == 32
    # a recorded 8 KB carveout cannot hold 11136 B: the next size up (16 KB) holds one
    row = launch(block=32, smem=10000, smem_config_bytes=8 * 1024)
    assert (row["blocks_per_sm"], row["limiter"]) == (1, "shared_memory")


@pytest.mark.parametrize(("kwargs", "limiter"), [
    ({"block": 2048}, "warps"),               # more threads than a block may have
    ({"regs": 256}, "registers"),             # more than 255 registers per thread
    ({"block": 1024, "regs": 128}, "registers"),  # 128 x 1024 > 64K registers per block
    ({"smem": 200 * 1024}, "shared_memory"),  # beyond the 163 KB opt-in limit
])
def test_a_block_that_breaks_a_per_block_limit_fits_zero_times(
        kwargs: dict[str, int], limiter: str) -> None:
    row = launch(**kwargs)
    assert (row["blocks_per_sm"], row["limiter"]) == (0, limiter)
    assert row["theoretical_occupancy"] == 0
    assert np.isnan(row["waves"])
    assert row["unavailable"] == f"the block does not fit on an SM ({limiter})"


@pytest.mark.parametrize(("grid", "waves", "tail"), [
    (864, 1.0, 1.0),                      # exactly one wave: 8 blocks/SM x 108 SMs
    (865, 865 / 864, 865 / 864 / 2),      # one block over: a second, nearly empty wave
    (54, 54 / 864, 54 / 864),             # fewer blocks than SMs
    (2160, 2.5, 2.5 / 3),                 # two and a half waves
])
def test_waves_and_tail_efficiency_at_the_thresholds(grid: int, waves: float,
                                                     tail: float) -> None:
    row = launch(block=256, grid=grid)
    assert row["blocks_per_sm"] == 8
    assert row["waves"] == pytest.approx(waves, rel=1e-15)
    assert row["tail_efficiency"] == pytest.approx(tail, rel=1e-15)


def test_a_multidimensional_grid_and_block_count_their_product() -> None:
    k = kernel(0, 10, grid=(27, 4, 2), block=(16, 16, 1), regs_per_thread=16, smem_bytes=0)
    row = occupancy(trace(kernels=[k], devices=pd.DataFrame([A100]))).iloc[0]
    assert row["blocks_per_sm"] == 8 and row["waves"] == 1.0 / 4


# -- missing data: said, never guessed ---------------------------------------------------------


def test_without_a_devices_table_nothing_is_guessed() -> None:
    row = launch(device=None)
    assert row["unavailable"] == "no device properties for device 0"
    assert pd.isna(row["theoretical_occupancy"]) and pd.isna(row["blocks_per_sm"])
    assert pd.isna(row["limiter"]) and np.isnan(row["waves"])


def test_a_kernel_on_a_device_the_table_lacks() -> None:
    k = kernel(0, 10, device=3, grid=(1, 1, 1), regs_per_thread=16, smem_bytes=0)
    row = occupancy(trace(kernels=[k], devices=pd.DataFrame([A100]))).iloc[0]
    assert row["unavailable"] == "no device properties for device 3"


def test_limits_come_from_the_compute_capability_or_a_known_name() -> None:
    by_cc = launch(block=256, regs=64, device={"device": 0, "vendor": "nvidia",
                                               "sm_count": 108, "cc_major": 8, "cc_minor": 0})
    by_name = launch(block=256, regs=64, device={"device": 0, "sm_count": 108,
                                                 "name": "NVIDIA A100-SXM4-80GB"})
    for row in (by_cc, by_name):
        assert (row["blocks_per_sm"], row["limiter"]) == (4, "registers")
        assert pd.isna(row["unavailable"])


def test_a_known_name_without_an_sm_count_gives_occupancy_but_no_waves() -> None:
    row = launch(block=256, regs=64, device={"device": 0, "name": "Tesla V100-SXM2-16GB"})
    assert row["theoretical_occupancy"] == 0.5 and np.isnan(row["waves"])
    assert row["unavailable"] == "no sm_count for device 0"


@pytest.mark.parametrize(("device", "reason"), [
    ({"device": 0, "name": "AMD Instinct MI250X", "vendor": "amd", "cc_major": 9,
      "cc_minor": 0, "sm_count": 104}, "device 0 is not an NVIDIA GPU"),
    ({"device": 0, "name": "Tesla P100", "vendor": "nvidia", "cc_major": 6, "cc_minor": 0,
      "sm_count": 56}, "compute capability 6.0 of device 0 is not supported"),
    ({"device": 0, "name": "Mystery GPU", "sm_count": 10},
     "no compute capability for device 0"),
    ({"device": 0, "vendor": "unknown", "cc_major": 8, "cc_minor": 0, "sm_count": 10},
     "device 0 is not known to be an NVIDIA GPU and has no max_threads_per_sm"),
])
def test_devices_we_cannot_compute_say_why(device: dict[str, Any], reason: str) -> None:
    assert launch(device=device)["unavailable"] == reason


@pytest.mark.parametrize(("kwargs", "reason"), [
    ({"regs": None}, "no registers per thread recorded"),
    ({"smem": None}, "no shared memory size recorded"),
    ({"grid": 0}, "empty grid or block"),
])
def test_launches_missing_an_input_say_which(kwargs: dict[str, Any], reason: str) -> None:
    row = launch(**kwargs)
    assert row["unavailable"] == reason and pd.isna(row["theoretical_occupancy"])


def test_static_plus_dynamic_stand_in_for_a_missing_total() -> None:
    row = launch(block=128, smem=None, smem_static_bytes=40 * 1024,
                 smem_dynamic_bytes=8 * 1024)
    assert (row["blocks_per_sm"], row["limiter"]) == (3, "shared_memory")


def test_kernels_find_their_own_ranks_device() -> None:
    small = {**A100, "rank": 1, "sm_count": 54}
    kernels = [kernel(0, 10, grid=(864, 1, 1), block=(256, 1, 1), regs_per_thread=16,
                      smem_bytes=0, rank=r) for r in (0, 1)]
    t = trace(kernels=kernels, devices=pd.DataFrame([{**A100, "rank": 0}, small]))
    assert occupancy(t)["waves"].tolist() == [1.0, 2.0]


def test_result_is_aligned_with_the_kernels_table_in_order() -> None:
    kernels = [kernel(i, i + 1, grid=(g, 1, 1), block=(256, 1, 1), regs_per_thread=16,
                      smem_bytes=0) for i, g in enumerate((864, 432, 1728))]
    t = trace(kernels=kernels, devices=pd.DataFrame([A100]))
    out = occupancy(t)
    assert out.index.equals(t.kernels.index)
    assert out["waves"].tolist() == [1.0, 0.5, 2.0]


def test_empty_trace_gives_an_empty_typed_frame() -> None:
    out = occupancy(Trace())
    assert list(out.columns) == list(occ.COLUMNS) and out.empty
    assert out.dtypes.astype(str).tolist() == ["float64", "Int64", "category", "float64",
                                                "float64", "category"]


def test_types_of_a_computed_frame() -> None:
    out = occupancy(trace(kernels=[kernel(0, 1, regs_per_thread=16, smem_bytes=0)],
                          devices=pd.DataFrame([A100])))
    assert out.dtypes.astype(str).tolist() == ["float64", "Int64", "category", "float64",
                                                "float64", "category"]


@pytest.mark.parametrize("name", ["NVIDIA A100-SXM4-80GB", "NVIDIA A10G", "Tesla T4",
                                  "NVIDIA GeForce RTX 3050 Laptop GPU", "NVIDIA H100 80GB HBM3",
                                  "NVIDIA GH200 480GB", "NVIDIA B200", "NVIDIA L4",
                                  "NVIDIA GeForce RTX 4090", "NVIDIA GeForce RTX 5090",
                                  "Quadro RTX 4000"])
def test_known_product_names_map_to_their_compute_capability(name: str) -> None:
    want = {"A100": (8, 0), "A10G": (8, 6), "T4": (7, 5), "3050": (8, 6), "H100": (9, 0),
            "GH200": (9, 0), "B200": (10, 0), "L4": (8, 9), "4090": (8, 9), "5090": (12, 0),
            "Quadro RTX": (7, 5)}
    key = next(k for k in sorted(want, key=len, reverse=True) if k in name)
    assert occ.cc_from_name(name) == want[key]


@pytest.mark.parametrize("name", ["nsys/rtx3090x4_tensorrt_nvtx.sqlite",
                                  "kineto/a100_80gb_rank0of16_nccl_streamsync.json.gz",
                                  "kineto/b200_rank0of8_nccl_allgather_pystack.json.gz"])
def test_every_launch_of_a_complete_real_trace_is_computed(name: str) -> None:
    out = occupancy(gpudiag.load(fixture(name)))
    assert out["unavailable"].isna().all(), out["unavailable"].value_counts()
    assert out["theoretical_occupancy"].between(0, 1).all()


@pytest.mark.parametrize(("name", "reason"), [
    ("kineto/mi250_rocm_minitoy_nonnvidia.json.gz", r"^device \d+ is not an NVIDIA GPU$"),
    ("kineto/world128_sampled_rank0.json.gz", r"^no device properties for device \d+$"),
])
def test_real_traces_without_usable_devices_say_why(name: str, reason: str) -> None:
    out = occupancy(gpudiag.load(fixture(name)))
    assert out["unavailable"].str.match(reason).all()
