#!/usr/bin/env bash
# Nsight Compute around a command, set "memory": where each kernel's memory traffic goes
# (L1/TEX, shared, L2, DRAM: throughput, hit rates, the memory chart and tables), plus Speed
# of Light, Occupancy and Launch Statistics so every column of `gpudiag heatmap` is filled
# (SM and memory throughput, occupancy, waves per SM, registers, shared memory per block).
# About half the replay passes of full.sh.
#
# Usage: memory.sh [-l LOG_FILE] OUTPUT [KERNEL_REGEX] -- CMD [ARG...]
# The arguments, environment, fixed options and exit status are the same for every set and
# documented, with the code that handles them, in _ncu_common.sh beside this script.
#
# Example: NCU_LAUNCH_COUNT=20 ./memory.sh out/gemm 'gemm|matmul' -- python bench.py --steps 3
# `gpudiag profile --backend ncu --ncu-set memory -- CMD` runs this script; the other
# *.sh beside it take the same arguments and differ only in the sections they collect.
set -euo pipefail

# --- the set: the only lines that differ between full.sh, memory.sh and launch.sh;
# _ncu_common.sh parses the arguments, appends set_args and runs ncu ---
# Sections by their ncu identifier (`ncu --list-sections`); the three metrics are named as
# well because gpudiag's heatmap reads exactly these (kernel_metrics.METRIC_ALIASES) and a
# section file of another ncu release may not list them.
hit_rates="lts__t_sector_hit_rate.pct,l1tex__t_sector_hit_rate.pct"
dram="dram__throughput.avg.pct_of_peak_sustained_elapsed"
# shellcheck disable=SC2034  # read by _ncu_common.sh, sourced below
set_args=(--section SpeedOfLight --section Occupancy --section LaunchStats
          --section MemoryWorkloadAnalysis --section MemoryWorkloadAnalysis_Chart
          --section MemoryWorkloadAnalysis_Tables --metrics "$hit_rates,$dram")
# shellcheck source-path=SCRIPTDIR source=_ncu_common.sh disable=SC1091  # followed with -x only
. "$(dirname -- "$(readlink -f -- "${BASH_SOURCE[0]}")")/_ncu_common.sh"
