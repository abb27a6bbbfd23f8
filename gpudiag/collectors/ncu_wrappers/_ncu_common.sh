# shellcheck shell=bash
# The body the ncu wrapper scripts share: argument parsing, the NCU_* environment, the
# options every set gets, and the exec of ncu. full.sh, memory.sh and launch.sh each set
# `set_args` (the sections of their set) and then source this file, so the three take the
# same arguments by construction and a fix to the handling lands in all of them. Not run on
# its own: it reads the sourcing script's arguments and name ($0, in the usage line) and runs
# under its `set -euo pipefail`.
#
# Usage: <set>.sh [-l LOG_FILE] OUTPUT [KERNEL_REGEX] -- CMD [ARG...]
#   OUTPUT        report path without .ncu-rep (ncu adds it); its folder is created
#   KERNEL_REGEX  profile only kernels whose function name matches (ncu -k regex:...);
#                 leave it out, or pass "", for every kernel
#   -l LOG_FILE   ncu's own lines (==PROF==, ==WARNING==, ==ERROR==) go to LOG_FILE instead
#                 of the terminal; the program's own output is never redirected
#   CMD ARG...    the program, after a literal --
# Environment (each optional):
#   NCU               the ncu to run (default: ncu on PATH; e.g. /usr/local/cuda/bin/ncu)
#   NCU_LAUNCH_COUNT  stop after profiling this many launches (ncu --launch-count)
#   NCU_LAUNCH_SKIP   first let this many matching launches run unprofiled (--launch-skip)
# Always: --clock-control none (kernels run at the clocks they would get in production, not
# locked to base), --target-processes all (children of CMD too, e.g. torchrun workers),
# --nvtx (the NVTX ranges open at each launch, e.g. gpudiag steps, go into the report),
# --force-overwrite. ncu needs GPU counter access: run as root, or see ERR_NVGPUCTRPERM in
# `gpudiag doctor`. Exit status: ncu's, or 2 for a usage error.
#
# ncu's argv: --export OUTPUT, the options above, -k, --launch-count, --launch-skip and
# --log-file when given, then the set's `set_args`, then -- CMD ARG...

usage() {
    echo "usage: ${0##*/} [-l LOG_FILE] OUTPUT [KERNEL_REGEX] -- CMD [ARG...]" >&2
    if [[ -n ${1:-} ]]; then echo "${0##*/}: $1" >&2; fi
    exit 2
}

args=(--export)
log_file=""
if [[ ${1:-} == -l ]]; then
    [[ $# -ge 2 ]] || usage "-l needs a file"
    log_file=$2
    shift 2
fi
[[ $# -ge 3 ]] || usage "missing OUTPUT, -- or CMD"
output=$1
shift
args+=("$output" --force-overwrite --clock-control none --target-processes all --nvtx)
if [[ $1 != -- ]]; then
    if [[ -n $1 ]]; then args+=(-k "regex:$1"); fi
    shift
fi
[[ ${1:-} == -- ]] || usage "expected -- before the command"
shift
[[ $# -ge 1 ]] || usage "no command after --"
for name in NCU_LAUNCH_COUNT NCU_LAUNCH_SKIP; do
    value=${!name:-}
    [[ -z $value || $value =~ ^[0-9]+$ ]] || usage "$name must be a whole number, not '$value'"
done
if [[ -n ${NCU_LAUNCH_COUNT:-} ]]; then args+=(--launch-count "$NCU_LAUNCH_COUNT"); fi
if [[ -n ${NCU_LAUNCH_SKIP:-} ]]; then args+=(--launch-skip "$NCU_LAUNCH_SKIP"); fi
if [[ -n $log_file ]]; then args+=(--log-file "$log_file"); fi
mkdir -p -- "$(dirname -- "$output")"

# shellcheck disable=SC2154  # set_args: set by the script that sources this file
args+=("${set_args[@]}")
exec "${NCU:-ncu}" "${args[@]}" -- "$@"
