#!/usr/bin/env bash
# Every GPU check of gpudiag in one run (issue 6): the examples' planted bottlenecks under
# `python3 -m gpudiag profile` with each backend, ncu on small_grids and its heatmap, the
# profiling overhead, tests/gpu, then scripts/gpu_checks.py, which writes
# OUTDIR/validation.json and exits 1 when a planted cause is not its workload's top finding.
#
# Usage: scripts/gpu_validate.sh OUTDIR        (from anywhere; a fresh OUTDIR is best)
# Environment (each optional):
#   PYTHON                  interpreter (default python3); gpudiag must be importable
#                           (PYTHONPATH=<repo>, see ../shared/gpu/README.md)
#   GPUDIAG_BACKENDS        profiled backends, space-separated (default "cupti torch")
#   GPUDIAG_VALIDATE_BUDGET_S  seconds after which no further step starts (default 480)
#   GPUDIAG_VALIDATE_HARD_S    every step's timeout is cut so that the whole run ends
#                           before this (default 540); the final check always runs
#   NCU_WRAPPER             scripts/ncu_wrappers/<name>.sh to use (default launch)
#   GPUDIAG_ONLY            run only these sections, space-separated (default all): sync
#                           small_grids fragmentation ncu grad nccl overhead cupy pytest jax
#                           (a rerun of a few; the planted checks of the others then read
#                           as unmeasured, which fails them)
#   GPUDIAG_PRUNE_RAW=1     at the end, delete raw per-process files over 20 MB under
#                           runs/*/procs (the merged runs/*/trace stay)
#
# Layout of OUTDIR: log-<step>.txt (stderr of each step), steps.jsonl (name, rc, seconds,
# command of each step), runs/<name>-<backend>/ (run dirs), workload/<name>.out (stdout:
# the example's JSON line), analyze/<name>.json (`gpudiag analyze --json`, windowed on
# steps >= 5 when the run has step ranges), tables/<name>.json (gpu_checks.py extract),
# ncu/ (reports and heatmaps), overhead.json, compare-grad.json, validation.json.
# A failing step is recorded and the rest still run (`set -u`, no `-e`).
set -u

if [[ $# -ne 1 ]]; then
    echo "usage: ${0##*/} OUTDIR" >&2
    exit 2
fi
ROOT=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$1" || exit 2
OUT=$(cd "$1" && pwd)
cd "$ROOT" || exit 2
mkdir -p "$OUT"/{runs,analyze,tables,workload,ncu}
PY=${PYTHON:-python3}
BACKENDS=${GPUDIAG_BACKENDS:-cupti torch}
BUDGET_S=${GPUDIAG_VALIDATE_BUDGET_S:-480}
HARD_S=${GPUDIAG_VALIDATE_HARD_S:-540}
NCU_WRAPPER=${NCU_WRAPPER:-launch}
STEPS_RE='step ([5-9]|[1-9][0-9]+)'  # leave the first 5 steps (warm-up) out of the analysis
START=$(date +%s)
export PYTHONUNBUFFERED=1

want() {  # want SECTION: true unless GPUDIAG_ONLY names other sections
    [[ -z ${GPUDIAG_ONLY:-} || " $GPUDIAG_ONLY " == *" $1 "* ]]
}

record() {  # record NAME RC MILLISECONDS COMMAND...
    "$PY" -c 'import json, sys; print(json.dumps({"name": sys.argv[1], "rc": int(sys.argv[2]),
        "seconds": int(sys.argv[3]) / 1000, "cmd": " ".join(sys.argv[4:])}))' "$@" \
        >>"$OUT/steps.jsonl"
}

run_step() {  # run_step NAME STDOUT_FILE TIMEOUT_S CMD... -> CMD's status (124: timeout/skipped)
    local name=$1 stdout=$2 limit=$3
    shift 3
    local elapsed=$(( $(date +%s) - START ))
    local left=$(( HARD_S - elapsed - 20 ))  # 20 s stay for the final check
    (( left < limit )) && limit=$left
    if (( elapsed > BUDGET_S || limit < 15 )); then
        echo "skipped: ${elapsed} s elapsed, over the time budget" >"$OUT/log-$name.txt"
        record "$name" 124 0 "skipped (budget)" "$@"
        echo "[gpu_validate] $name: skipped (time budget)"
        return 124
    fi
    local t0 rc
    t0=$(date +%s%N)
    timeout -k 5 "$limit" "$@" >"$stdout" 2>"$OUT/log-$name.txt"
    rc=$?
    record "$name" "$rc" "$(( ($(date +%s%N) - t0) / 1000000 ))" "$@"
    echo "[gpu_validate] $name: exit $rc ($(( $(date +%s) - START )) s elapsed)"
    return "$rc"
}

analyze() {  # analyze NAME PATH: windowed on steps when it can be, else the whole trace
    local name=$1 path=$2
    if ! run_step "analyze-$name" "$OUT/analyze/$name.json" 120 \
            "$PY" -m gpudiag analyze "$path" --json --top 50 --window "$STEPS_RE"; then
        run_step "analyze-$name-whole" "$OUT/analyze/$name.json" 120 \
            "$PY" -m gpudiag analyze "$path" --json --top 50
    fi
}

extract() {  # extract NAME PATH: the detail tables analyze --json leaves out
    run_step "extract-$1" /dev/null 120 "$PY" scripts/gpu_checks.py extract "$2" \
        --window "$STEPS_RE" -o "$OUT/tables/$1.json"
}

profile() {  # profile NAME BACKEND [VAR=VALUE...] -- EXAMPLE ARGS...: profile, then analyze
    local name=$1-$2 backend=$2
    shift 2
    local envs=()
    while [[ $# -gt 0 && $1 != -- ]]; do envs+=("$1"); shift; done
    shift
    rm -rf "$OUT/runs/$name"
    run_step "$name" "$OUT/workload/$name.out" 180 env "${envs[@]}" \
        "$PY" -m gpudiag profile -o "$OUT/runs/$name" --backend "$backend" --no-report \
        -- "$PY" "$@"
    [[ -d $OUT/runs/$name/trace ]] && analyze "$name" "$OUT/runs/$name/trace"
}

saving_pair() {  # saving_pair PAIR BEFORE AFTER BACKEND: compare-PAIR-BACKEND.json
    local pair=$1-$4
    [[ -d $OUT/runs/$2/trace && -d $OUT/runs/$3/trace ]] || return 0
    mkdir -p "$OUT/compare"  # links named after the runs: compare labels by folder name
    ln -sfn "../runs/$2/trace" "$OUT/compare/$2"
    ln -sfn "../runs/$3/trace" "$OUT/compare/$3"
    run_step "compare-$pair" "$OUT/compare-$pair.json" 120 "$PY" -m gpudiag compare \
        "$OUT/compare/$2" "$OUT/compare/$3" --json
}

echo "[gpu_validate] OUTDIR=$OUT backends: $BACKENDS sections: ${GPUDIAG_ONLY:-all}"
run_step nvidia-smi "$OUT/workload/nvidia-smi.out" 30 nvidia-smi
run_step doctor "$OUT/workload/doctor.out" 60 "$PY" -m gpudiag doctor

# 1. sync_in_loop: planted per-step sync, and the fix (report.html built once, for torch)
if want sync; then
    for b in $BACKENDS; do
        profile sync_in_loop "$b" -- examples/sync_in_loop.py --steps 120
        profile sync_in_loop_fixed "$b" -- examples/sync_in_loop.py --steps 120 --fixed
    done
    for b in $BACKENDS; do  # the saving the planted run predicts vs the fix's measured
        saving_pair sync "sync_in_loop-$b" "sync_in_loop_fixed-$b" "$b"
    done
    rm -rf "$OUT/runs/sync_in_loop-report"
    run_step sync_in_loop-report "$OUT/workload/sync_in_loop-report.out" 180 \
        "$PY" -m gpudiag profile -o "$OUT/runs/sync_in_loop-report" --backend torch \
        -- "$PY" examples/sync_in_loop.py --steps 50
fi

# 2. small_grids with torch ops: 1 launch vs 32 launches of the same work
if want small_grids; then
    for b in $BACKENDS; do
        for n in 1 32; do
            profile "small_grids_$n" "$b" -- examples/small_grids.py --launches "$n" --steps 20
        done
        saving_pair small_grids "small_grids_32-$b" "small_grids_1-$b" "$b"
    done
fi

# 3. fragmentation: bare runs dump allocator snapshots (with and without expandable
#    segments); profiled runs check the torch backend's own memory collection
if want fragmentation; then
    run_step frag_snapshot "$OUT/workload/frag_snapshot.out" 120 env -u PYTORCH_CUDA_ALLOC_CONF \
        "$PY" examples/fragmentation.py --snapshot "$OUT/frag.pickle"
    run_step frag_snapshot_expandable "$OUT/workload/frag_snapshot_expandable.out" 120 \
        env PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True \
        "$PY" examples/fragmentation.py --snapshot "$OUT/frag_expandable.pickle"
    for s in frag frag_expandable; do
        name=${s/frag/frag_snapshot}
        if [[ -f $OUT/$s.pickle ]]; then
            run_step "analyze-$name" "$OUT/analyze/$name.json" 120 \
                "$PY" -m gpudiag analyze "$OUT/$s.pickle" --json --top 50
            extract "$name" "$OUT/$s.pickle"
        fi
    done
    profile fragmentation torch -- examples/fragmentation.py --steps 10
    profile fragmentation_expandable torch PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True \
        -- examples/fragmentation.py --steps 10
fi

# 4. ncu on small_grids (CuPy RawKernel: the exact published grids), then the heatmap
if want ncu; then
    for n in 1 32; do
        run_step "ncu-small_grids_$n" "$OUT/workload/ncu_small_grids_$n.out" 150 \
            env NCU_LAUNCH_COUNT=32 bash "scripts/ncu_wrappers/$NCU_WRAPPER.sh" \
            -l "$OUT/ncu/small_grids_$n.ncu-log" "$OUT/ncu/small_grids_$n" gpudiag_small_grid \
            -- "$PY" examples/small_grids.py --impl cupy --launches "$n" --steps 1 \
            --repeat 1 --warmup 0
        rep=$OUT/ncu/small_grids_$n.ncu-rep
        if [[ -f $rep ]]; then
            run_step "heatmap-small_grids_$n" /dev/null 120 \
                "$PY" -m gpudiag heatmap "$rep" -o "$OUT/ncu/small_grids_$n.html"
            run_step "analyze-ncu_small_grids_$n" "$OUT/analyze/ncu_small_grids_$n.json" 120 \
                "$PY" -m gpudiag analyze "$rep" --json --top 50
            run_step "extract-ncu_small_grids_$n" /dev/null 120 "$PY" scripts/gpu_checks.py \
                extract "$rep" -o "$OUT/tables/ncu_small_grids_$n.json"
        fi
    done
fi

# 5. grad accumulation: bare runs for samples/s and peak memory, profiled runs to compare
if want grad; then
    run_step grad_fp32 "$OUT/workload/grad_fp32.out" 120 \
        "$PY" examples/grad_accumulation.py --dtype fp32 --accum 1
    run_step grad_bf16x4 "$OUT/workload/grad_bf16x4.out" 120 \
        "$PY" examples/grad_accumulation.py --dtype bf16 --accum 4
    profile grad_fp32 torch -- examples/grad_accumulation.py --dtype fp32 --accum 1
    profile grad_bf16x4 torch -- examples/grad_accumulation.py --dtype bf16 --accum 4
    if [[ -d $OUT/runs/grad_fp32-torch/trace && -d $OUT/runs/grad_bf16x4-torch/trace ]]; then
        mkdir -p "$OUT/compare"  # links named after the runs: compare labels by folder name
        ln -sfn ../runs/grad_fp32-torch/trace "$OUT/compare/grad_fp32"
        ln -sfn ../runs/grad_bf16x4-torch/trace "$OUT/compare/grad_bf16x4"
        run_step compare-grad "$OUT/compare-grad.json" 120 "$PY" -m gpudiag compare \
            "$OUT/compare/grad_fp32" "$OUT/compare/grad_bf16x4" --step-size 8192 --json \
            -o "$OUT/compare/grad.html"
    fi
fi

# 6. NCCL all_reduce in a world of size 1
if want nccl; then
    for b in $BACKENDS; do
        profile nccl "$b" -- examples/nccl_allreduce.py --steps 20
        [[ -d $OUT/runs/nccl-$b/trace ]] && extract "nccl-$b" "$OUT/runs/nccl-$b/trace"
    done
fi

# 7. overhead: steps/s bare, under --backend torch and --backend cupti
if want overhead; then
    run_step overhead "$OUT/workload/overhead.out" 240 "$PY" benchmarks/bench_overhead.py \
        --steps 300 --repeats 3 --timeout 60 --backends "${BACKENDS// /,}" \
        --json "$OUT/overhead.json"
fi

# 8. small_grids with the CuPy RawKernel, under cupti (the torch backend starts only in
#    programs that import torch, and this one does not)
if want cupy && [[ " $BACKENDS " == *" cupti "* ]]; then
    for n in 1 32; do
        profile "small_grids_cupy_$n" cupti -- examples/small_grids.py --impl cupy \
            --launches "$n" --steps 20
    done
fi

# 9. tests/gpu, reusing the run dirs above where they exist
if want pytest; then
    run_step pytest-gpu "$OUT/workload/pytest-gpu.out" 240 env GPUDIAG_GPU_RUNS="$OUT/runs" \
        "$PY" -m pytest -q -m gpu tests/gpu -p no:cacheprovider
fi

# 10. JAX: planted per-step readback under --backend jax (checked, but not required)
if want jax; then
    profile jax_train jax -- examples/jax_train.py --steps 120
    profile jax_train_fixed jax -- examples/jax_train.py --steps 120 --fixed
fi

# 11. the verdict (always runs): validation.json, exit 1 when a planted cause is not on top
"$PY" scripts/gpu_checks.py check "$OUT" --backends "${BACKENDS// /,}" | tee "$OUT/checks.txt"
status=${PIPESTATUS[0]}
du -sh "$OUT"/runs/* 2>/dev/null | sort -h | tail -5
if [[ ${GPUDIAG_PRUNE_RAW:-0} == 1 ]]; then  # keep merged traces, drop raw per-process files
    find "$OUT/runs" -path '*/procs/*' -type f -size +20M -print -delete
fi
echo "[gpu_validate] done in $(( $(date +%s) - START )) s; validation: $OUT/validation.json"
exit "$status"
