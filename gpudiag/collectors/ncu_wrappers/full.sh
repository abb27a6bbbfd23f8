#!/usr/bin/env bash
# Nsight Compute around a command, set "full": every section ncu ships in `--set full`
# (Speed of Light, compute and memory workload, occupancy, launch stats, scheduler and warp
# state, instruction stats, source counters). The most detail and the slowest: ncu replays
# each kernel some 40 times, so limit it with a regex or NCU_LAUNCH_COUNT on a real model.
#
# Usage: full.sh [-l LOG_FILE] OUTPUT [KERNEL_REGEX] -- CMD [ARG...]
# The arguments, environment, fixed options and exit status are the same for every set and
# documented, with the code that handles them, in _ncu_common.sh beside this script.
#
# Example: NCU_LAUNCH_COUNT=20 ./full.sh out/gemm 'gemm|matmul' -- python bench.py --steps 3
# `gpudiag profile --backend ncu --ncu-set full -- CMD` runs this script; memory.sh and
# launch.sh take the same arguments and differ only in the sections they collect.
set -euo pipefail

# --- the set: the only lines that differ between full.sh, memory.sh and launch.sh;
# _ncu_common.sh parses the arguments, appends set_args and runs ncu ---
# shellcheck disable=SC2034  # read by _ncu_common.sh, sourced below
set_args=(--set full)
# shellcheck source-path=SCRIPTDIR source=_ncu_common.sh disable=SC1091  # followed with -x only
. "$(dirname -- "$(readlink -f -- "${BASH_SOURCE[0]}")")/_ncu_common.sh"
