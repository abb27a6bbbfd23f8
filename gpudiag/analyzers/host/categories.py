"""What a process's training thread did, as disjoint time spans per category.

The host side of a step is cut into categories, each taking only the time no category
before it in `CATEGORIES` already took (so they never overlap and, with `python`, sum to
the step's time):

- `data_loading`: DataLoader `__next__` (the `enumerate(DataLoader)#...__next__`
  annotation, or its Python frame) on the step's thread;
- `optimizer`: `Optimizer.step#...` and `Optimizer.zero_grad#...`, less the closure's work
  inside them: a closure optimizer (LBFGS, Lightning's `optimizer.step(closure)`) runs the
  forward and backward inside `step`, and those are forward and backward (the ops before
  the first backward op inside the step, and the backward itself);
- `backward`: autograd's `autograd::engine::evaluate_function: ...` ops (older traces:
  the bare `...Backward` node names) on any thread of the process (on a GPU they run on
  autograd's own thread while the training thread waits), and the training thread's
  `backward` / `run_backward` frames;
- `compile`: compiler work on the step's thread (XLA `...Compile...` events; torch's
  `Torch-Compiled Region` is running compiled code, not compiling);
- `forward`: the other outermost torch ops on the step's thread that start before the
  step's first backward op (all of them in a step without backward);
- `other_ops`: outermost torch ops after the step's backward (gradient clipping, `.item()`
  of the loss, metrics);
- `ops`: the outermost events of other frameworks (jax: the jitted calls and the runtime
  around them);
- `python`: the rest of the step: Python between ops (and whatever the profiler does not
  record).

Self time of an op is its duration minus that of the ops directly inside it (torch ops
and framework events only; annotations and Python frames do not count as ops).
"""

from __future__ import annotations

import re

import numpy as np
import numpy.typing as npt
import pandas as pd

from gpudiag import intervals as iv
from gpudiag.analyzers import keys
from gpudiag.analyzers.host.columns import Columns
from gpudiag.analyzers.steps.detection import BACKWARD_OP, STEP_NAME
from gpudiag.intervals import nesting_depth

CATEGORIES = ("data_loading", "optimizer", "backward", "compile", "forward", "other_ops",
              "ops", "python")

DATA = re.compile(r"DataLoader.*__next__|utils/data/dataloader\.py\(\d+\): __next__")
OPTIMIZER = re.compile(r"^Optimizer\.(step|zero_grad)#")
BACKWARD_FRAME = re.compile(r"run_backward|_engine_run_backward|"
                            r"(autograd/__init__|_tensor)\.py\(\d+\): backward$")
COMPILE = re.compile(r"Compile(?!d Region)|compile_fx|backend_compile")
#: range sources that count as ops: self time, forward / other_ops / ops
OP_SOURCES = ("torch_op", "host")
#: the name tests of `category_spans`, by the column that may hold them: a caller that cuts
#: one frame into many processes computes them once for all (`name_flags`), since each
#: test costs a regex per distinct name of the whole frame
NAME_TESTS = {"_is_step": STEP_NAME, "_is_data": DATA, "_is_optimizer": OPTIMIZER,
              "_is_compile": COMPILE, "_is_backward_op": BACKWARD_OP,
              "_is_backward_frame": BACKWARD_FRAME}

IntArray = npt.NDArray[np.int64]


def name_flags(ranges: pd.DataFrame) -> dict[str, npt.NDArray[np.bool_]]:
    """Every name test of `category_spans` on `ranges`, as columns to add to it."""
    return {column: keys.matches(ranges["name"], test) for column, test in NAME_TESTS.items()}


def host_columns(ranges: pd.DataFrame, **more: np.ndarray) -> Columns:
    """What `category_spans` and `self_times` read of host ranges, as arrays computed once
    for all the processes a caller cuts them into: times, `tid` (float, NaN: none), `name`
    (text) and `name_code` (its number, -1 for none), the name tests (`NAME_TESTS`) and
    the source tests (`_op`: one of `OP_SOURCES`; `_torch_op`, `_host`, `_python`,
    `_annotation`)."""
    source = ranges["source"].to_numpy(dtype=object)
    names = keys.texts(ranges["name"])
    return Columns.of(
        ranges, ["start_ns", "end_ns", "tid"], name=names,
        name_code=pd.factorize(names)[0].astype(np.int64),
        _op=np.logical_or.reduce([source == op_source for op_source in OP_SOURCES]),
        _torch_op=source == "torch_op",
        _host=source == "host", _python=source == "python",
        _annotation=source == "annotation", **name_flags(ranges), **more)


def category_spans(ranges: Columns, lane_tid: int | None, step_start: npt.ArrayLike,
                   step_end: npt.ArrayLike) -> dict[str, iv.Spans]:
    """Disjoint spans per category (not `python`, the remainder) for one process's
    host ranges (`host_columns` of that process only), with `lane_tid` its training thread
    (None: the thread with the most op time) and its steps' windows (sorted, disjoint:
    they decide forward vs other_ops)."""
    ranges = ranges.take(~ranges["_is_step"])  # a step is not an op
    if not len(ranges):
        return {category: _empty() for category in CATEGORIES if category != "python"}
    if lane_tid is None:
        lane_tid = _busiest_thread(ranges)
    # no training thread: NaN equals no tid, so the thread has no rows
    main = ranges.take(ranges["tid"] == (np.nan if lane_tid is None else lane_tid))
    picked = {
        "data_loading": main["_is_data"],
        "optimizer": main["_is_optimizer"],
        "compile": main["_is_compile"] & main["_host"],
    }
    backward_all = ranges.take(ranges["_is_backward_op"] & ranges["_torch_op"])
    frames = main.take(main["_is_backward_frame"] & main["_python"])
    raw = {category: _spans(main.take(hit)) for category, hit in picked.items()}
    raw["backward"] = iv.union(np.concatenate([backward_all["start_ns"], frames["start_ns"]]),
                               np.concatenate([backward_all["end_ns"], frames["end_ns"]]))
    ops = _outermost_ops(main)
    torch = ops["_torch_op"]
    op_start = ops["start_ns"]
    before = op_start < _first_backward(raw["backward"], iv.as_ns(step_start),
                                        iv.as_ns(step_end), op_start)
    raw["forward"] = _spans(ops.take(torch & before))
    raw["other_ops"] = _spans(ops.take(torch & ~before))
    raw["optimizer"] = _without_closure(raw["optimizer"], raw["backward"], ops)
    raw["ops"] = _spans(ops.take(~torch))
    out: dict[str, iv.Spans] = {}
    taken = _empty()
    for category in CATEGORIES[:-1]:
        mine = iv.subtract(raw[category], taken) if len(taken[0]) else raw[category]
        out[category] = mine
        taken = iv.union(np.concatenate([taken[0], mine[0]]),
                         np.concatenate([taken[1], mine[1]]))
    return out


def _without_closure(optimizer: iv.Spans, backward: iv.Spans, ops: Columns) -> iv.Spans:
    """The optimizer's spans less the closure it ran: in each optimizer span that holds
    backward work, the outermost ops that start before that backward (the closure's
    forward) and the backward itself. A span without backward (a plain `step()`, which
    runs after the backward) is the optimizer's whole."""
    if not len(optimizer[0]) or not len(backward[0]):
        return optimizer
    start, end = optimizer
    first = _first_backward(backward, start, end, ops["start_ns"])  # int64 max: no closure
    held = first < np.iinfo(np.int64).max
    closure_forward = ops.take(ops["_torch_op"] & held & (ops["start_ns"] < first))
    inside = iv.intersect(backward, optimizer)
    work = iv.union(np.concatenate([closure_forward["start_ns"], inside[0]]),
                    np.concatenate([closure_forward["end_ns"], inside[1]]))
    return iv.subtract(optimizer, work)


def _first_backward(backward: iv.Spans, start: IntArray, end: IntArray,
                    times: IntArray) -> IntArray:
    """For each time in `times`, when backward first runs in the step containing it (int64
    max outside steps or in a step without backward)."""
    never = np.iinfo(np.int64).max
    b_start, b_end = backward
    if len(b_start) == 0 or len(start) == 0:
        return np.full(len(times), never, dtype=np.int64)
    # per step, the first backward span that ends after the step starts
    span = np.minimum(np.searchsorted(b_end, start, side="right"), len(b_start) - 1)
    first = np.maximum(b_start[span], start)
    first = np.where((b_end[span] > start) & (first < end), first, never)
    step = np.searchsorted(start, times, side="right") - 1
    inside = (step >= 0) & (times < end[np.maximum(step, 0)])
    return np.where(inside, first[np.maximum(step, 0)], never).astype(np.int64)


def amounts(spans: iv.Spans, start: npt.ArrayLike, end: npt.ArrayLike) -> IntArray:
    """Time of a disjoint set inside each `[start, end)`."""
    starts, ends = iv.as_ns(start), iv.as_ns(end)
    return (iv.covered_before(spans, ends) - iv.covered_before(spans, starts)).astype(np.int64)


def self_times(ops: Columns) -> IntArray:
    """Each op's duration minus its direct children's (ops of `OP_SOURCES` on one process,
    any threads), int64 ns, aligned with `ops`' rows (`host_columns`)."""
    count = len(ops)
    if count == 0:
        return np.zeros(0, dtype=np.int64)
    lane = keys.codes(ops["tid"])
    start = ops["start_ns"]
    end = np.maximum(ops["end_ns"], start)
    level = nesting_depth(lane, start, end)
    (key,), _ = keys.time_keys([lane], [start])
    children = np.zeros(count, dtype=np.int64)
    for depth in range(1, int(level.max()) + 1 if count else 1):
        kids = np.flatnonzero(level == depth)
        parents = np.flatnonzero(level == depth - 1)
        if len(kids) == 0 or len(parents) == 0:
            continue
        order = parents[np.argsort(key[parents], kind="stable")]
        parent = np.searchsorted(key[order], key[kids], side="right") - 1
        same = (parent >= 0) & (lane[order[np.maximum(parent, 0)]] == lane[kids])
        np.add.at(children, order[parent[same]], (end - start)[kids[same]])
    return np.maximum((end - start) - children, 0)


def _outermost_ops(main: Columns) -> Columns:
    ops = main.take(main["_op"])
    if not len(ops):
        return ops
    depth = nesting_depth(np.zeros(len(ops), dtype=np.int64), ops["start_ns"], ops["end_ns"])
    return ops.take(depth == 0)


def _busiest_thread(ranges: Columns) -> int | None:
    """The thread with the most op time (of equal ones, the lowest tid)."""
    ops = ranges.take(ranges["_op"] & ~np.isnan(ranges["tid"]))
    if not len(ops):
        return None
    tids, thread = np.unique(ops["tid"], return_inverse=True)
    time = np.zeros(len(tids), dtype=np.int64)
    np.add.at(time, thread.reshape(-1), ops["end_ns"] - ops["start_ns"])
    return int(tids[np.argmax(time)])


def _spans(rows: Columns) -> iv.Spans:
    return iv.union(rows["start_ns"], rows["end_ns"])


def _empty() -> iv.Spans:
    return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
