#!/usr/bin/env bash
# Nsight Compute around a command, set "launch": the cheapest useful profile. Launch
# Statistics (grid, block, registers, shared memory, waves per SM), Occupancy (theoretical
# and achieved) and Speed of Light (SM and memory throughput, duration): enough to tell a
# small-grid, low-occupancy or latency-bound kernel from a compute- or memory-bound one.
# A few replay passes per kernel; the default of `gpudiag profile --backend ncu`.
#
# Usage: launch.sh [-l LOG_FILE] OUTPUT [KERNEL_REGEX] -- CMD [ARG...]
# The arguments, environment, fixed options and exit status are the same for every set and
# documented, with the code that handles them, in _ncu_common.sh beside this script.
#
# Example: NCU_LAUNCH_COUNT=20 ./launch.sh out/gemm 'gemm|matmul' -- python bench.py --steps 3
# `gpudiag profile --backend ncu --ncu-set launch -- CMD` runs this script; the other
# *.sh beside it take the same arguments and differ only in the sections they collect.
set -euo pipefail

# --- the set: the only lines that differ between full.sh, memory.sh and launch.sh;
# _ncu_common.sh parses the arguments, appends set_args and runs ncu ---
# shellcheck disable=SC2034  # read by _ncu_common.sh, sourced below
set_args=(--section LaunchStats --section Occupancy --section SpeedOfLight)
# shellcheck source-path=SCRIPTDIR source=_ncu_common.sh disable=SC1091  # followed with -x only
. "$(dirname -- "$(readlink -f -- "${BASH_SOURCE[0]}")")/_ncu_common.sh"
