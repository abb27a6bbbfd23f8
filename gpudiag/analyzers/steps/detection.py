"""Finding the training steps of a trace, with or without step markers.

    steps = detect_steps(trace)          # one row per step, with the method that found it
    steps.groupby("method").size()

Most real programs carry no step markers (pytorch/examples, nanoGPT, a jax loop), so the
steps are found from what the framework records anyway. The first method that finds
steps wins, in this order:

1. `markers`: ranges with source `step` (Kineto's `ProfilerStep#N`, `gpudiag.step()`, the
   profiler's optimizer-step hook), and `ProfilerStep#N` ops of the 2021 Kineto schema.
   When any process of a rank has them, only they are used for that rank (its other
   processes, DataLoader workers and the like, are helpers); a rank without them (another
   program's, merged into one job) has its steps found as below.
2. `optimizer_step` (torch): `Optimizer.step#<Class>.step` ranges. Step k runs from the end
   of optimizer step k-1 (for k = 1: the first top-level op of that thread) to the end of
   optimizer step k. Several optimizers per iteration, or gradient accumulation: one
   optimizer is counted, the (name, calling user frame) with the most calls.
3. `jit_function` (jax): executions of the jitted step, the host `PjitFunction(f)` ranges
   not nested in another jit call (those are traced during the outer call's compile, not
   run). The function executed the most times (at least `min_steps`), ties to the one with
   the most time in its executions: a training loop runs its step more often than any
   setup function, and setup functions can compile for longer than the whole loop. Step
   k runs from the start of execution k to the start of execution k+1; the last to its
   own end or to the end of the device module `jit_f` started in it.
4. `repeating_ops`: the same sequence of op / annotation names recurring. On each
   process's main thread (most top-level op time, autograd-engine threads aside), at each
   nesting level 0-3 of the op ranges, every name seen `min_steps` times is tried as the
   anchor that opens a step: the sequence is cut at its occurrences, and the segments that
   repeat the most common one are the pattern. The anchor kept maximizes the median
   pattern segment's time x its number of repeats (a one-off long segment such as a CUDA
   init does not win), and its repeats must cover `min_cover` of the thread's op time.
   A step runs from one anchor to the next; the last, the pattern's length of ops from
   the last anchor when they repeat the pattern. On torch ops, a pattern is a loop that
   trains or serves only when its steps compute (`COMPUTE`: a matmul, convolution,
   attention, embedding, a backward node, compiled code; or the GPU runtime called then):
   set-up that repeats (`fully_shard`'s `as_strided_` per parameter, a garbage collector's
   frees) is no step, and the trace is diagnosed as one window.

Steps are per process (`rank`, `pid`; NA counts as one value). The segment keys of (4)
are polynomial hashes over prefix sums (one vectorized pass per anchor), so a trace of a
million top-level ops is not walked op by op.
"""

from __future__ import annotations

import re
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt
import pandas as pd

from gpudiag.analyzers import callsites, keys
from gpudiag.intervals import nesting_depth
from gpudiag.trace import Trace

COLUMNS = ("rank", "pid", "tid", "step", "start_ns", "end_ns", "method", "detail")

#: what each method means, for notes and documentation
METHODS = {
    "markers": "step markers",
    "optimizer_step": "torch optimizer steps",
    "jit_function": "jitted-step executions",
    "repeating_ops": "a repeating op sequence",
}

OPTIMIZER_STEP = re.compile(r"^Optimizer\.step#[^#]+\.step$")
JIT_CALL = re.compile(r"^PjitFunction\((?P<fn>.+)\)$")
JIT_MODULE = re.compile(r"^jit_(?P<fn>[^:(\s]+)")
#: autograd's work: `evaluate_function` wrappers, and the bare node names older Kineto
#: traces record (`CudnnConvolutionBackward`, `torch::autograd::AccumulateGrad`)
BACKWARD_OP = re.compile(r"^autograd::engine::evaluate_function|Backward\d*$|"
                         r"^torch::autograd::AccumulateGrad$")
#: torch ops that compute: a repeating torch op sequence without one is set-up, not a loop
COMPUTE = re.compile(r"^aten::(mm|bmm|addmm|baddbmm|matmul|linear|einsum|conv|_convolution|"
                     r"cudnn_|mkldnn_|miopen_|embedding|scaled_dot_product|_scaled_dot_product|"
                     r"_flash_attention|_efficient_attention)|^autograd::engine::"
                     r"evaluate_function|Backward\d*$|^cu(da)?LaunchKernel|^cudaGraphLaunch|"
                     r"^Torch-Compiled Region|^CompiledFunction")
#: Kineto's step ranges (user annotations; torch_op in the 2021 schema)
STEP_NAME = re.compile(r"^ProfilerStep#\d+$")
#: range sources that are framework ops or user annotations on a host thread
OP_SOURCES = ("torch_op", "annotation", "nvtx", "host")

IntArray = npt.NDArray[np.int64]


def detect_steps(trace: Trace, *, min_steps: int = 2, min_cover: float = 0.1,
                 levels: int = 6, max_anchors: int = 256) -> pd.DataFrame:
    """One row per step: `rank, pid, tid, step, start_ns, end_ns, method, detail`, sorted
    by process and start (see the module docstring for the methods, in their order).

        detect_steps(trace)[["step", "start_ns", "end_ns", "method"]].head()

    `min_steps`: fewest repeats a method accepts; `min_cover`: share of the thread's op
    time a repeating pattern must cover; `levels`: nesting levels searched for it;
    `max_anchors`: names tried as its anchor per level. Computed once per trace.
    """
    key = f"steps:{min_steps}:{min_cover}:{levels}:{max_anchors}"
    if (min_steps, min_cover, levels, max_anchors) == _DEFAULTS:
        key = _KEY  # what `restrict` seeds
    return trace.derived(key, lambda: _detect(trace, min_steps, min_cover, levels,
                                              max_anchors))


_DEFAULTS = (2, 0.1, 6, 256)
_KEY = "steps:default"


def restrict(whole: Trace, window: tuple[int, int], into: Trace) -> None:
    """Give `into` (the part of `whole` inside `window`, which `window.within` cuts) the
    steps of the whole trace that overlap the window, cut to it, when first asked: a
    window of a few steps holds too few optimizer steps or repeats to find them again."""
    def cut() -> pd.DataFrame:
        steps = detect_steps(whole)
        start, end = window
        inside = steps[(steps["end_ns"] > start) & (steps["start_ns"] < end)].copy()
        inside["start_ns"] = inside["start_ns"].clip(lower=start)
        inside["end_ns"] = inside["end_ns"].clip(upper=end)
        return inside.reset_index(drop=True)

    into.seed(_KEY, cut)


def _detect(trace: Trace, min_steps: int, min_cover: float, levels: int,
            max_anchors: int) -> pd.DataFrame:
    ranges = trace.ranges
    marked = ranges[(ranges["source"] == "step").to_numpy(bool)
                    | keys.matches(ranges["name"], STEP_NAME)]
    frames = [_markers(marked)] if len(marked) else []
    ops = host_ops(trace)
    if len(marked):  # a rank with markers: its other processes are helpers, without steps
        ops = ops[~np.isin(keys.key_array(ops["rank"]), keys.key_array(marked["rank"]))]
    for _, mine in ops.groupby("proc", sort=True):
        found = _optimizer(trace, mine, min_steps)
        if found is None:
            found = _jit(trace, mine, min_steps)
        if found is None:
            found = _pattern(mine, min_steps, min_cover, levels, max_anchors,
                               api=trace.api)
        if found is not None:
            frames.append(found)
    return _frame(pd.concat(frames, ignore_index=True) if frames else None)


def _frame(steps: pd.DataFrame | None) -> pd.DataFrame:
    if steps is None or steps.empty:
        return pd.DataFrame({"rank": pd.array([], "Int64"), "pid": pd.array([], "Int64"),
                             "tid": pd.array([], "Int64"), "step": pd.Series([], dtype=str),
                             "start_ns": np.zeros(0, np.int64), "end_ns": np.zeros(0, np.int64),
                             "method": pd.Series([], dtype=str),
                             "detail": pd.Series([], dtype=str)})
    out = steps.loc[:, list(COLUMNS)].copy()
    for col in ("rank", "pid", "tid"):
        out[col] = out[col].astype("Int64")
    for col in ("start_ns", "end_ns"):
        out[col] = out[col].astype(np.int64)
    order = ["rank", "pid", "start_ns"]
    return out.sort_values(order, kind="stable", na_position="first", ignore_index=True)


def host_ops(trace: Trace) -> pd.DataFrame:
    """The trace's host op and annotation ranges (`OP_SOURCES`, on a thread) with `proc`
    (one code per rank and pid), `lane` (one per thread) and `level`, their nesting depth
    among themselves (Python frames and other ranges left out, so the outermost torch op
    is level 0 even under `with_stack` frames). Computed once per trace."""
    def compute() -> pd.DataFrame:
        ranges = trace.ranges
        ops = ranges[ranges["source"].isin(OP_SOURCES).to_numpy(bool)
                     & ranges["tid"].notna().to_numpy(bool)
                     & ~keys.matches(ranges["name"], STEP_NAME)]
        ops = ops[["rank", "pid", "tid", "start_ns", "end_ns", "name", "source"]]
        ops = ops.sort_values("start_ns", kind="stable").reset_index(drop=True)
        rank = ops["rank"].astype("Int64")  # keys.codes: NA is a rank, a pid of its own
        pid = ops["pid"].astype("Int64")
        ops["proc"] = keys.codes(rank, pid)
        ops["lane"] = keys.codes(rank, pid, ops["tid"])
        ops["level"] = nesting_depth(ops["lane"], ops["start_ns"], ops["end_ns"])
        return ops
    return trace.derived("host_ops", compute)


# -- 1. markers -----------------------------------------------------------------------------


def _markers(marked: pd.DataFrame) -> pd.DataFrame:
    names = marked["name"].astype(str)
    profiler = names.str.startswith("ProfilerStep#")
    detail = np.where(profiler, "ProfilerStep#N ranges of the torch.profiler schedule",
                      "gpudiag.step() or the profiler's step hook")
    return _frame(pd.DataFrame({
        "rank": marked["rank"].to_numpy(), "pid": marked["pid"].to_numpy(),
        "tid": marked["tid"].to_numpy(), "step": names.to_numpy(),
        "start_ns": marked["start_ns"].to_numpy(), "end_ns": marked["end_ns"].to_numpy(),
        "method": "markers", "detail": detail}))


# -- 2. torch optimizer steps ---------------------------------------------------------------


def _optimizer(trace: Trace, ops: pd.DataFrame, min_steps: int) -> pd.DataFrame | None:
    calls = _outermost_named(ops[keys.matches(ops["name"], OPTIMIZER_STEP)])
    if len(calls) < min_steps:
        return None
    site = pd.Series("", index=calls.index)
    if (trace.ranges["source"] == "python").any():  # the user's line tells two optimizers apart
        found = pd.Series(callsites.where_at(trace, calls["pid"], calls["tid"],
                                             calls["start_ns"], calls["rank"]), index=calls.index)
        site = found.where(found.astype(str).str.contains(r"\.py:\d"), "").fillna("")
    calls = calls.assign(site=site)
    groups = calls.groupby(["name", "site"], observed=True, sort=False)
    sizes = groups["start_ns"].agg(["size", "min"]).sort_values(
        ["size", "min"], ascending=[False, True])
    (name, where), chosen = sizes.index[0], sizes.iloc[0]
    if chosen["size"] < min_steps:
        return None
    mine = calls[(calls["name"] == name) & (calls["site"] == where)].sort_values("start_ns")
    lane = mine["lane"].iloc[0]
    mine = mine[mine["lane"] == lane]
    ends = mine["end_ns"].to_numpy(np.int64)
    thread = ops[(ops["lane"] == lane) & (ops["level"] == 0)]
    first = int(min(thread["start_ns"].min(), mine["start_ns"].iloc[0]))
    starts = np.concatenate([[first], ends[:-1]])
    others = len(sizes) - 1
    detail = (f"{name}, {len(ends)} calls{' at ' + where if where else ''}"
              + (f"; {others} other optimizer{'s' if others > 1 else ''} not counted"
                 if others else ""))
    return _steps(mine.iloc[0], starts, ends, "optimizer_step", detail)


def _outermost_named(rows: pd.DataFrame) -> pd.DataFrame:
    """Rows not nested in a row of the same name on the same thread (a wrapped call
    records the same range twice)."""
    if rows.empty:
        return rows
    group = keys.codes(rows["lane"], rows["name"].astype(str))
    return rows[nesting_depth(group, rows["start_ns"], rows["end_ns"]) == 0]


def _steps(first: pd.Series, starts: IntArray, ends: IntArray, method: str,
           detail: str) -> pd.DataFrame:
    count = len(starts)
    return pd.DataFrame({
        "rank": [first["rank"]] * count, "pid": [first["pid"]] * count,
        "tid": [first["tid"]] * count,
        "step": [f"step {number}" for number in range(1, count + 1)],
        "start_ns": starts, "end_ns": np.maximum(ends, starts),
        "method": method, "detail": detail})


# -- 3. jax jitted steps --------------------------------------------------------------------


def _jit(trace: Trace, ops: pd.DataFrame, min_steps: int) -> pd.DataFrame | None:
    calls = ops[keys.matches(ops["name"], JIT_CALL)]
    if calls.empty:
        return None
    # outermost among jit calls: functions traced inside another's first call are not run
    calls = calls[nesting_depth(calls["lane"], calls["start_ns"], calls["end_ns"]) == 0]
    calls = calls.assign(fn=calls["name"].astype(str).str.extract(JIT_CALL)["fn"].to_numpy(),
                         dur=calls["end_ns"] - calls["start_ns"])
    stats = calls.groupby("fn").agg(n=("dur", "size"), time=("dur", "sum"))
    stats = stats[stats["n"] >= min_steps]
    if stats.empty:
        return None
    function = str(stats.sort_values(["n", "time"], ascending=False).index[0])
    mine = calls[calls["fn"] == function]
    mine = mine[mine["lane"] == mine["lane"].mode().iloc[0]].sort_values("start_ns")
    starts = mine["start_ns"].to_numpy(np.int64)
    last_end = max(int(mine["end_ns"].iloc[-1]), _module_end(trace, function, int(starts[-1])))
    ends = np.concatenate([starts[1:], [last_end]])
    return _steps(mine.iloc[0], starts, ends, "jit_function",
                  f"PjitFunction({function}), {len(starts)} executions")


def _module_end(trace: Trace, function: str, after: int) -> int:
    """The latest end of the device module `jit_<function>` started at or after `after`
    (the GPU finishes the last step after the host dispatched it); 0 if none."""
    ranges = trace.ranges
    late = ranges[(ranges["start_ns"] >= after) & ranges["source"].isin(["host", "device_op"])]
    if late.empty:
        return 0
    fns = late["name"].astype(str).str.extract(JIT_MODULE)["fn"]
    return int(late.loc[fns == function, "end_ns"].max()) if (fns == function).any() else 0


# -- 4. repeating top-level ops -------------------------------------------------------------


class Pattern(NamedTuple):
    """The best anchor of one level: what `_repeats` found."""

    score: float
    repeats: int
    first: int           # position of the anchor's first occurrence
    anchor: int          # name code
    length: int          # ops per step
    positions: IntArray  # every occurrence of the anchor
    tail: bool           # whether the ops after the last anchor repeat the pattern


def _pattern(ops: pd.DataFrame, min_steps: int, min_cover: float, levels: int,
             max_anchors: int, *, api: pd.DataFrame) -> pd.DataFrame | None:
    lane = _main_lane(ops)
    if lane is None:
        return None
    thread = ops[ops["lane"] == lane]
    top = thread[thread["level"] == 0]
    total = int(top["end_ns"].max() - top["start_ns"].min())
    best: tuple[Any, ...] | None = None
    for level in range(levels):
        seq = thread[thread["level"] == level]
        if seq.empty:
            break
        codes, names = pd.factorize(seq["name"].astype(str))
        start = seq["start_ns"].to_numpy(np.int64)
        end = seq["end_ns"].to_numpy(np.int64)
        found = _repeats(codes.astype(np.int64), start, end, min_steps, max_anchors)
        if found is None:
            continue
        rank = (found.score, found.repeats, -int(start[found.first]), -level)
        if best is None or rank > best[0]:
            best = (rank, found, start, end, str(names[found.anchor]), level)
    if best is None:
        return None
    _, found, start, end, anchor, level = best
    positions = found.positions
    starts = start[positions]
    ends = (np.concatenate([start[positions[1:]], [end[positions[-1] + found.length - 1]]])
            if found.tail else start[positions[1:]])
    starts = starts if found.tail else starts[:-1]
    if len(starts) < min_steps or (ends - starts).sum() < min_cover * total:
        return None
    if not _computes(thread, api, int(starts[0]), int(ends[-1])):
        return None
    detail = (f"'{anchor}' opens each step of {found.length} op{'s' if found.length > 1 else ''}"
              f" (nesting level {level}), {found.repeats} repeats")
    return _steps(thread.iloc[0], starts, ends, "repeating_ops", detail)


def _computes(thread: pd.DataFrame, api: pd.DataFrame, start: int, end: int) -> bool:
    """Whether the thread's ops in [start, end) hold a `COMPUTE` op, or are not torch's, or
    its process called the GPU runtime then (launches: the loop runs on the device)."""
    inside = thread[(thread["start_ns"] >= start) & (thread["start_ns"] < end)]
    torch = inside[(inside["source"] == "torch_op").to_numpy(bool)]
    if torch.empty or keys.matches(torch["name"], COMPUTE).any():
        return True
    pid = thread["pid"].iloc[0]
    calls = api[((api["start_ns"] >= start) & (api["start_ns"] < end)).to_numpy(bool)]
    if pd.isna(pid):
        return len(calls) > 0
    return bool((calls["pid"] == pid).fillna(False).any())


def _main_lane(ops: pd.DataFrame) -> int | None:
    """The thread with the most top-level op time, threads that only run autograd's
    engine (backward) aside."""
    top = ops[ops["level"] == 0]
    top = top[~keys.matches(top["name"], BACKWARD_OP)]
    if top.empty:
        return None
    return int((top["end_ns"] - top["start_ns"]).groupby(top["lane"]).sum().idxmax())


def _repeats(codes: IntArray, start: IntArray, end: IntArray, min_steps: int,
             max_anchors: int) -> Pattern | None:
    """The anchor whose cut of the sequence repeats best (see the module docstring)."""
    count = len(codes)
    counts = np.bincount(codes)
    cand = np.flatnonzero(counts >= min_steps)
    if len(cand) > max_anchors:  # prefer names whose count many names share: once per step
        shared = np.bincount(counts[cand])[counts[cand]]
        cand = cand[np.lexsort((counts[cand], -shared))[:max_anchors]]
    weight = np.random.default_rng(0).integers(1, 2**62, size=len(counts), dtype=np.uint64)
    weights = weight[codes]
    pos = np.arange(count, dtype=np.uint64)
    a_sum = np.concatenate([[np.uint64(0)], np.cumsum(weights, dtype=np.uint64)])
    b_sum = np.concatenate([[np.uint64(0)], np.cumsum(weights * pos, dtype=np.uint64)])

    def key(first: IntArray, after: IntArray) -> npt.NDArray[np.uint64]:
        """A hash of the name sequence [first, after), position-weighted, and its length."""
        first_u, after_u = first.astype(np.uint64), after.astype(np.uint64)
        hashed = (b_sum[after] - b_sum[first]) - first_u * (a_sum[after] - a_sum[first])
        return hashed + (after_u - first_u) * np.uint64(0x9E3779B97F4A7C15)

    best: Pattern | None = None
    with np.errstate(over="ignore"):
        for anchor in cand:
            positions = np.flatnonzero(codes == anchor)
            seg = key(positions[:-1], positions[1:])
            if len(seg) == 0:
                continue
            uniq, inverse, tally = np.unique(seg, return_inverse=True, return_counts=True)
            mode = int(np.argmax(tally))
            modal = inverse == mode
            length = int((positions[1:] - positions[:-1])[modal][0])
            durations = (start[positions[1:]] - start[positions[:-1]])[modal]
            last = int(positions[-1])
            tail = last + length <= count and key(np.array([last]),
                                                  np.array([last + length]))[0] == uniq[mode]
            if tail:
                durations = np.append(durations, end[last + length - 1] - start[last])
            repeats = len(durations)
            if repeats < min_steps:
                continue
            score = float(np.median(durations)) * repeats
            found = Pattern(score, repeats, int(positions[0]), int(anchor), length, positions,
                            bool(tail))
            if best is None or (score, repeats, -found.first) > (best.score, best.repeats,
                                                                   -best.first):
                best = found
    return best
