"""The schema of every Diagnosis frame and analyzer table, declared once as schema.py does.

`gpudiag.diagnose(trace)` returns a `Diagnosis` with five frames (`losses`, `findings`,
`by_step`, `gaps`, `steps`) and the detail tables that the analyzers of
`analyzers.registry.ANALYZERS` put into `Diagnosis.tables`. Each is declared here as a
`schema.Table` of `Column(name, dtype, unit, meaning, values)`, with the analyzer that
produces it and the function whose result it is. `diagnose` passes every frame through
`conform_frame` and every analyzer table through `conform_table`: columns in declared order
and cast to their declared dtypes, while an undeclared table, an undeclared column or a
missing one raises `SchemaError` (a bug in gpudiag, never the user's input). `markdown()`
generates the Diagnosis part of docs/schema.md (`full_markdown()` is the whole file).

Dtypes besides the Trace's: `str` is pandas' default string dtype (missing: NaN), `string`
the nullable one (missing: pd.NA), `Float64` a nullable float, `bool` a flag that is never
missing (`boolean` may be NA). `values` on a string column lists what it can hold: the tests
check it (`problems`), `conform` does not (that would read every value of every table).
Imports ground modules only, so readers, analyzers and reports may all read it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from gpudiag import schema
from gpudiag.errors import SchemaError
from gpudiag.schema import Column, Table, column_lines, conform_column, empty_series

#: dtypes a Diagnosis column may declare
DTYPES = (*schema.DTYPES, "Float64", "bool", "string", "str")

#: names of the Diagnosis frames (attributes), in the order the docs list them
FRAME_NAMES = ("losses", "findings", "by_step", "gaps", "steps")


@dataclass(frozen=True)
class Part:
    """One Diagnosis frame or analyzer table: its declaration, which analyzer produces it
    (its `ANALYZERS` name; `diagnose` for the frames) and the function it is the result of."""

    table: Table
    analyzer: str
    source: str

    @property
    def where(self) -> str:
        """Where a user finds it: `Diagnosis.losses` or `Diagnosis.tables["copy_stats"]`."""
        name = self.table.name
        return f"Diagnosis.{name}" if name in FRAME_NAMES else f'Diagnosis.tables["{name}"]'

    def problems(self, frame: pd.DataFrame) -> list[str]:
        """Every way `frame` breaks the declaration: names, order, dtypes, values."""
        return self.table.problems(frame)


FRAMES: dict[str, Part] = {}
TABLES: dict[str, Part] = {}


def _declare(analyzer: str, source: str, name: str, row: str, *columns: Column) -> None:
    assert all(c.dtype in DTYPES for c in columns), name
    part = Part(Table(name, row, columns), analyzer, source)
    (FRAMES if name in FRAME_NAMES else TABLES)[name] = part


def _c(name: str, dtype: str, unit: str, meaning: str, values: tuple[str, ...] = ()) -> Column:
    return Column(name, dtype, unit, meaning, values)


def _ns(name: str, meaning: str, dtype: str = "int64") -> Column:
    return Column(name, dtype, "ns", meaning)


RANK = _c("rank", "Int64", "", "distributed rank (NA: none given)")
DEVICE = _c("device", "Int64", "", "CUDA device (NA: none given)")
PID = _c("pid", "Int64", "", "host process id")
TID = _c("tid", "Int64", "", "host thread id")
LOSS_CAUSES = ("useful", "sync_stall", "launch_bound", "host_bound", "copy", "comm_wait",
               "small_grid")
OTHER_CAUSES = ("fragmentation", "kernel", "comm", "throttle", "host_data_loading",
                "host_python_overhead", "host_optimizer", "host_compile", "host_op",
                "host_off_cpu")
GAP_CAUSES = ("sync_stall", "copy", "launch_bound", "host_bound")
GAP_RULES = ("sync", "copy_in_progress", "queued", "host_wait", "launch_latency", "no_launch")
WAIT_KINDS = ("device", "context", "stream", "event", "copy", "unknown")
#: a wait's kind once the torch op open at it says which implicit sync it was
SYNC_KINDS = (*WAIT_KINDS, "item", "to_cpu", "blocking_copy", "data_dependent")
STEP_METHODS = ("markers", "optimizer_step", "jit_function", "repeating_ops")
HOST_CATEGORIES = {"data_loading": "data loading", "optimizer": "the optimizer",
                   "backward": "backward", "compile": "compilation", "forward": "forward",
                   "other_ops": "other ops", "ops": "framework ops",
                   "python": "Python between ops"}
THROTTLE_REASONS = {
    "gpu_idle": "nothing runs: clocks drop to idle (harmless)",
    "app_clocks": "clocks pinned by `nvidia-smi -ac` (applications clocks)",
    "sw_power_cap": "the power limit (`nvidia-smi -pl`) holds clocks down",
    "hw_slowdown": "clocks halved or worse: heat, power brake or power draw too high",
    "sw_thermal": "above the GPU's or memory's max operating temperature",
    "hw_thermal": "hardware slowdown for temperature",
    "hw_power_brake": "the system's power supply asserted the power brake",
}
BOTTLENECKS = ("Small Grid", "Latency Issue", "High Compute Throughput",
               "High Memory Throughput", "Balanced Throughput", "High Throughput")

#: the transformation replayed for a finding's expected saving (`findings.fix`), and what
#: it keeps fixed (analyzers/critical/savings.py; docs/analysis.md, "Expected savings")
FIXES = {
    "no_wait": "the blocking calls return at once; the GPU work they waited for is kept",
    "graph_launch": "the launch calls behind the gaps cost what a CUDA graph replay costs "
                    "per kernel (savings.GRAPH_LAUNCH_NS); the ops around them keep their time",
    "no_host_time": "the host thread spends no time in the finding's host sections; "
                    "waits inside them still wait",
    "no_dependency": "the queued work starts when its stream is free, not waiting for "
                     "another stream or event",
    "full_wave": "the kernels run at full-wave efficiency (their idle SM share taken away)",
    "no_peer_wait": "the collectives do not wait for late peers (their transfer time kept)",
    "hidden_comm": "the collectives overlap compute entirely (no time on this rank's path)",
}

# -- the Diagnosis frames ------------------------------------------------------------------

_declare(
    "diagnose", "analyzers.losses.waterfall.LossTimeline.totals", "losses",
    "(device, cause) of the loss waterfall: every nanosecond of the device's window (first "
    "to last GPU event, cut to the diagnosis window) attributed to one cause",
    RANK,
    DEVICE,
    _c("cause", "string", "", "loss cause; `useful` is the window minus every other cause, "
       "so a device's rows sum to its window", LOSS_CAUSES),
    _ns("lost_ns", "time of the device's window attributed to the cause"),
    _c("share", "float64", "", "lost_ns / the device's window (NaN: an empty window)"),
)

_declare(
    "diagnose", "analyzers.findings.combine", "findings",
    "finding, one problem at one place: by expected saving (`rank_by='lost'`: GPU findings "
    "by lost time, then host-time findings), those mostly inside the warm-up steps last",
    _c("cause", "string", "", "a loss cause of the waterfall, or a cause that is not a share "
       "of the timeline", (*LOSS_CAUSES[1:], *OTHER_CAUSES)),
    _ns("lost_ns", "the GPU time it cost (host findings: host time in the steady steps; 0 "
        "where nothing can say how much, e.g. throttling)"),
    _c("share", "float64", "", "lost_ns / the analyzed GPU time (host findings: of the steady "
       "steps' time); NaN without a timeline"),
    _c("where", "string", "", "where it happens: a Python call site when the trace has stacks, "
       "else the torch op, NVTX range or kernel name"),
    _c("count", "int64", "", "how often"),
    _c("evidence", "string", "", "the evidence in numbers (durations by `format_ns`)"),
    _c("advice", "string", "", "one concrete action (`findings.ADVICE`)"),
    _ns("saving_ns", "expected saving: how much shorter the window gets in a replay of the "
        "schedule with this cause fixed (`fix`); NA where no fix applies or it was not "
        "replayed (it could not reach the top ten, or save 0.1% of the window: "
        "analyzers.critical.savings)", "Int64"),
    _c("saving_share", "float64", "", "saving_ns / the replayed window"),
    _c("saving_step_share", "float64", "", "saving_ns spread over the steady steps, / the "
       "median steady step (NaN without steps)"),
    _c("fix", "string", "", "the transformation replayed (`critical.savings.FIXES`)",
       tuple(FIXES)),
    _c("kind", "string", "", "the kind of problem, a stable name scripts can read whatever the "
       "wording of the advice (`findings.ADVICE`'s key); NA for advice composed per finding"),
    _c("subject", "string", "", "what the finding is about where `where` names its call site: "
       "the kernel of a small_grid finding, the communicator and op of a comm finding"),
)

_declare(
    "diagnose", "analyzers.steps.training.losses_by_step", "by_step",
    "(device, training step, cause): the loss waterfall of each step (`diagnose(trace, "
    "steps=True)`)",
    RANK,
    DEVICE,
    _c("step", "str", "", "step name"),
    _ns("start_ns", "start of the step's window"),
    _ns("end_ns", "end of the step's window: the next step's start on its process (the last "
        "step: its own end)"),
    _c("warmup", "bool", "", "a warm-up step (`Diagnosis.steps`)"),
    _c("cause", "str", "", "loss cause", LOSS_CAUSES),
    _ns("lost_ns", "time of the step's window on that device attributed to the cause"),
    _c("share", "float64", "", "lost_ns / the step's window on that device (NaN: empty)"),
)

GAP_COLUMNS = (
    RANK,
    DEVICE,
    _ns("start_ns", "start of the piece"),
    _ns("end_ns", "end of the piece"),
    _ns("gap_start_ns", "start of the whole idle gap (rules 2 and 4 split a gap in pieces)"),
    _ns("gap_end_ns", "end of the whole idle gap: the next event's start"),
    _c("cause", "string", "", "loss cause of the piece", GAP_CAUSES),
    _c("rule", "string", "", "which rule attributed the piece (docs/analysis.md)", GAP_RULES),
    _c("pid", "Int64", "", "process of the next event (the GPU event that ends the gap)"),
    _c("tid", "Int64", "", "host thread of the next event's API call"),
    _c("next_table", "str", "", "table of the next event (NA: none, the window ends idle)",
       ("kernels", "copies")),
    _c("next_row", "Int64", "", "row label of the next event in that table (NA: none)"),
    _ns("launch_ns", "start `l0` of the next event's API call (NA: no launch call found)",
        "Int64"),
    _c("wait_kind", "string", "", "kind of the blocking host wait that explains the gap "
       "(rule 1; NA: none)", WAIT_KINDS),
    _c("wait_api", "string", "", "API call of that wait"),
    _ns("wait_start_ns", "start of that wait", "Int64"),
    _c("wait_tid", "Int64", "", "host thread of that wait"),
)

_declare(
    "diagnose", "analyzers.losses.gaps.idle_gaps", "gaps",
    "idle piece of a device's timeline with its cause (`losses.gaps`, cut to the diagnosis "
    "window): the pieces of a device tile its idle time",
    *GAP_COLUMNS,
)

_declare(
    "diagnose", "analyzers.steps.training.training_steps", "steps",
    "training step of a process: its step marker, or a step that step detection found",
    RANK, PID,
    _c("tid", "Int64", "", "host thread of the step range"),
    _c("step", "str", "", "step name"),
    _c("index", "int64", "", "0-based position of the step in its process"),
    _ns("start_ns", "start of the step's window"),
    _ns("end_ns", "end of the step's window: the next step's start on its process (the last "
        "step: its own end)"),
    _ns("dur_ns", "end_ns - start_ns"),
    _c("warmup", "bool", "", "warm-up: one of a process's first min(3, n // 2) steps lasting "
       "over 1.5 x the median of the steps after them"),
    _c("method", "str", "", "how the steps were found", STEP_METHODS),
    _c("detail", "str", "", "what was found, in words (the marker, op or function)"),
)

# -- the analyzers' tables -----------------------------------------------------------------

_declare(
    "timeline", "analyzers.timeline.stream_summary", "stream_summary",
    "(rank, device, stream): HTA's per-stream idle time",
    RANK, DEVICE, _c("stream", "Int64", "", "CUDA stream (NA: events without one)"),
    _ns("span_ns", "from the stream's first event start to its last event end"),
    _ns("busy_ns", "union of its kernels and copies (overlaps counted once, touching events "
        "merged)"),
    _ns("idle_ns", "span_ns - busy_ns"),
    _c("events", "int64", "", "kernels and copies, zero-length ones included"),
)

_declare(
    "sync", "analyzers.sync.sync_points", "sync_points",
    "(kind, call site) of blocking syncs, most GPU idle first",
    _c("kind", "string", "", "what the host waited on; an implicit sync is named by the torch "
       "op open at the wait", SYNC_KINDS),
    _c("where", "string", "", "call site (else the API call or the kind)"),
    _c("count", "int64", "", "syncs"),
    _ns("host_wait_ns", "how long the host waited"),
    _ns("gpu_idle_ns", "GPU idle the loss model attributed to them: the sync_stall gaps they "
        "ended"),
    _c("steps_with", "Int64", "", "training steps (step ranges) holding such a sync (NA "
       "without step markers)"),
    _c("per_step", "float64", "", "count / steps (NaN without step markers)"),
    _c("api", "string", "", "the most common API call of these syncs"),
)

_declare(
    "sync", "analyzers.sync.classified_waits", "sync_waits",
    "blocking host wait (syncs table and API calls, one wait counted once), sorted by start",
    RANK, PID, TID, _c("device", "Int64", "", "CUDA device waited on, where recorded"),
    _ns("start_ns", "the wait's start"), _ns("end_ns", "the wait's end"),
    _c("kind", "string", "", "device/stream/event/context, `copy` for a synchronous memcpy, "
       "`unknown` otherwise; an implicit sync is named by the torch op open at the wait",
       SYNC_KINDS),
    _c("api", "string", "", "the API call (NA: a syncs row without its call)"),
    _c("correlation", "Int64", "", "CUPTI correlation id of the call"),
    _c("where", "string", "", "call site (else the API call or the kind)"),
    _ns("gpu_idle_ns", "sync_stall time it ended"),
    _c("step", "Int64", "", "position, among the trace's step ranges, of the step holding the "
       "wait (on its thread, else its process; NA: none)"),
)

_declare(
    "host_gaps", "analyzers.host.bound.host_gaps", "host_gaps",
    "launch_bound or host_bound piece of `Diagnosis.gaps` (same index), with where it happens",
    *GAP_COLUMNS,
    _c("where", "string", "", "call site: of the next launch for a launch piece, the innermost "
       "user frame the launching thread was in mid-piece for a host wait; else the next "
       "kernel's short name"),
    _c("site_known", "bool", "", "`where` is a call site, not the next kernel's name"),
    _c("next_short", "bool", "", "the kernel after the piece ran shorter than its launch call "
       "(HTA's short kernel: the call took at most 50 µs)"),
)

_declare(
    "launch", "analyzers.kernels.launch.small_grid", "small_grid",
    "compute-kernel name (collectives left out), most SM-time lost first",
    _c("name", "string", "", "short kernel name"),
    _c("full_name", "string", "", "kernel name as recorded"),
    _c("count", "int64", "", "launches"),
    _ns("dur_ns", "summed duration"),
    _ns("small_grid_ns", "SM-time left idle by launches under one wave (duration x "
        "(1 - tail_efficiency))"),
    _ns("tail_ns", "SM-time left idle by the partial last wave of longer grids"),
    _ns("lost_ns", "small_grid_ns + tail_ns"),
    _c("ncu_small_grid_speedup", "float64", "", "ncu's Small Grid rule ((SMs - grid) / SMs "
       "when grid < SMs), duration-weighted over the launches"),
    _c("ncu_tail_speedup", "float64", "", "ncu's Tail Effect rule (1 / (1 + whole waves) when "
       "the last wave is partial, where it reaches 20 %), duration-weighted"),
    _c("odd_block_launches", "int64", "", "launches whose block size is not a multiple of 32"),
    _c("ncu_block_size_speedup", "float64", "", "ncu's Block Size rule (the idle share of a "
       "block's last warp), duration-weighted"),
    _c("unknown_launches", "int64", "", "launches without waves (occupancy `unavailable`)"),
    _c("grid_blocks", "Int64", "blocks", "grid of the launch that lost the most"),
    _c("block_threads", "Int64", "threads", "block size of that launch"),
    _c("blocks_per_sm", "Int64", "blocks", "resident blocks per SM of that launch"),
    _c("sm_count", "Int64", "", "SMs of its device"),
    _c("waves", "float64", "", "grid blocks / (blocks_per_sm x SMs), duration-weighted"),
    _c("theoretical_occupancy", "float64", "", "resident warps / the SM's warp slots (0-1), "
       "duration-weighted"),
    _c("limiter", "string", "", "what limits that launch's occupancy",
       ("warps", "blocks", "registers", "shared_memory")),
)

_declare(
    "launch", "analyzers.kernels.launch.launch_rate", "launch_rate",
    "host thread that issued a kernel launch, most launches first",
    RANK, PID, TID,
    _c("launches", "int64", "", "API calls that launched at least one kernel (matched by "
       "correlation id)"),
    _c("kernels", "int64", "", "kernels they launched (a graph launch starts many)"),
    _ns("window_ns", "the thread's span: its first to last API call or range"),
    _c("launches_per_s", "float64", "1/s", "launches / window"),
    _ns("launch_ns", "time inside launch calls, overlaps counted once"),
    _c("launch_share", "float64", "", "launch_ns / window_ns"),
)

_declare(
    "copies", "analyzers.copies.copy_stats", "copy_stats",
    "(rank, device, kind, host memory) of copies and memsets",
    RANK, DEVICE,
    _c("kind", "string", "", "direction",
       ("HtoD", "DtoH", "DtoD", "HtoH", "PtoP", "memset", "other")),
    _c("host_mem", "string", "", "kind of the host side of a host<->device copy",
       ("pageable", "pinned")),
    _c("count", "int64", "", "copies"),
    _c("bytes", "Int64", "bytes", "bytes copied or set (NA: none known)"),
    _ns("dur_ns", "summed duration"),
    _c("bytes_per_s", "float64", "bytes/s", "summed bytes / summed duration, over copies with "
       "known bytes and a non-zero duration"),
    _c("median_bytes_per_s", "float64", "bytes/s", "median per-copy rate (small copies drag "
       "it down)"),
    _c("peak_ref", "string", "", "the peak compared with: `dram` for DtoD copies on a device "
       "whose DRAM peak is known, else NA (no profile records a host link's peak)", ("dram",)),
    _c("peak_bytes_per_s", "float64", "bytes/s", "that peak (devices.mem_bandwidth_bytes_per_s)"),
    _c("peak_share", "float64", "", "2 x bytes_per_s / peak_bytes_per_s (a DtoD copy reads and "
       "writes every byte)"),
)

_declare(
    "collectives", "analyzers.collectives.calls.collective_stats", "collective_stats",
    "(op, bytes, group_size, dtype) of collectives",
    _c("op", "string", "", "collective",
       ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce", "all_to_all",
        "send_recv", "send", "recv", "barrier", "other")),
    _c("bytes", "Int64", "bytes", "message size S as nccl-tests defines it"),
    _c("group_size", "Int64", "ranks", "ranks in the communicator (the trace's world size when "
       "the call lacks it: `group_size_assumed`)"),
    _c("dtype", "string", "", "element type"),
    _c("count", "int64", "", "calls"),
    _ns("total_ns", "summed duration"),
    _ns("mean_ns", "mean duration", "float64"),
    _ns("min_ns", "shortest call"),
    _ns("max_ns", "longest call"),
    _c("algbw_gbps", "float64", "GB/s", "Σ bytes / Σ duration (nccl-tests' algbw; GB/s = 1e9 "
       "bytes/s)"),
    _c("busbw_gbps", "float64", "GB/s", "algbw x the op's bus factor (nccl-tests' busbw)"),
    _c("busbw_peak_gbps", "float64", "GB/s", "busbw of the fastest single call"),
    _c("group_size_assumed", "bool", "", "group_size was taken from the trace's world size"),
)

_declare(
    "collectives", "analyzers.collectives.calls.overlap", "overlap",
    "(rank, device) that ran collectives: communication hidden behind compute, by HTA's, "
    "Nsight Systems' and tb-profiler's definitions",
    RANK, DEVICE,
    _ns("comm_ns", "union of the collective kernels' intervals"),
    _ns("compute_ns", "union of every other kernel (copies are neither)"),
    _ns("overlap_ns", "their intersection"),
    _ns("exposed_comm_ns", "comm_ns - overlap_ns"),
    _ns("comm_kernel_ns", "Σ collective kernel durations"),
    _ns("comm_kernel_overlap_ns", "Σ per collective kernel |kernel ∩ compute|"),
    _ns("step_ns", "the rank's steps, each extended to the end of the last kernel launched in "
        "it; without steps the device's GPU window"),
    _ns("step_overlap_ns", "overlap inside step_ns"),
    _c("step_source", "string", "", "which window step_ns is", ("steps", "gpu_window")),
    _c("overlap_of_comm", "float64", "", "overlap_ns / comm_ns: HTA's comp_comm_overlap_pctg "
       "/ 100 (NaN: denominator 0)"),
    _c("overlap_of_comm_kernel_ns", "float64", "", "comm_kernel_overlap_ns / comm_kernel_ns: "
       "Nsight Systems' nccl_gpu_overlap_trace"),
    _c("overlap_of_step", "float64", "", "step_overlap_ns / step_ns: tb-profiler's overlap "
       "share of the step"),
)

_declare(
    "collectives", "analyzers.collectives.skew.arrival_skew", "arrival_skew",
    "rank of a collective matched across ranks (empty with fewer than two ranks)",
    _c("match_id", "int64", "", "the matched collective, numbered in time order"),
    _c("comm", "string", "", "communicator"),
    _c("op", "string", "", "collective"),
    RANK, DEVICE,
    _c("kernel_id", "Int64", "", "the kernels row of this rank's collective kernel"),
    _c("seq", "Int64", "", "order of the call within its (rank, comm)"),
    _c("bytes", "Int64", "bytes", "message size"),
    _ns("start_ns", "this rank's start"), _ns("end_ns", "this rank's end"),
    _ns("wait_ns", "latest start of the group - own start, clipped to [0, own duration]: the "
        "part of this rank's call spent waiting for the last rank"),
    _c("last_rank", "Int64", "", "the rank that arrived last"),
    _ns("skew_ns", "latest - earliest start"),
    _c("ranks", "int64", "ranks", "ranks present in the group"),
    _c("matched_by", "string", "", "how the calls were matched", ("seq", "end")),
    _c("clock_suspect", "bool", "", "skew over 100 x the longest matched kernel: offset clocks, "
       "not waiting (left out of the waits and findings)"),
)

_declare(
    "stragglers", "analyzers.stragglers.late_arrivals", "late_arrivals",
    "(collective op, rank that arrived last) of a job of two or more ranks, the costliest "
    "first (clock-suspect calls left out)",
    _c("op", "str", "", "collective"),
    _c("rank", "int64", "", "the rank that arrived last"),
    _c("last_calls", "int64", "calls", "calls of the op at which this rank arrived last"),
    _c("op_calls", "int64", "calls", "the op's calls matched across ranks"),
    _c("share", "float64", "", "last_calls / op_calls (1 / ranks is chance)"),
    _c("ranks", "float64", "ranks", "median ranks present in those calls"),
    _ns("skew_median_ns", "median latest - earliest start of those calls", "float64"),
    _ns("skew_max_ns", "largest latest - earliest start of those calls"),
    _ns("margin_ns", "sum over those calls of its start - the next-latest rank's start: how "
        "much earlier they would start were this rank only as late as the next one"),
    _ns("caused_wait_ns", "every rank's wait in those calls (`arrival_skew.wait_ns`)"),
)

_declare(
    "stragglers", "analyzers.stragglers.step_stragglers", "step_stragglers",
    "training step that two or more ranks ran, in step order",
    _c("step", "str", "", "step name (or position, when a process repeats names)"),
    _c("index", "int64", "", "0-based position of the step (the lowest of its ranks')"),
    _c("warmup", "bool", "", "a warm-up step on some rank (`Diagnosis.steps`)"),
    _c("ranks", "int64", "ranks", "ranks that ran the step"),
    _c("slowest_rank", "int64", "", "the rank with the longest step window (ties: lowest)"),
    _ns("slowest_ns", "its step window (a rank's longest process)"),
    _ns("median_ns", "median step window of the ranks"),
    _ns("excess_ns", "slowest_ns - median_ns"),
    _c("last_rank", "Int64", "", "the rank whose late arrivals at the step's collectives "
       "caused the most waiting (NA: no matched collectives in the step)"),
    _c("last_calls", "Int64", "calls", "the step's collectives that rank arrived last at"),
    _ns("caused_wait_ns", "every rank's wait in those calls", "Int64"),
    _ns("wait_ns", "every rank's wait in all the step's collectives", "Int64"),
)

_declare(
    "stragglers", "analyzers.stragglers.rank_losses", "rank_losses",
    "rank of a job of two or more: the loss waterfall of its devices together, the least "
    "useful first",
    _c("rank", "Int64", "", "distributed rank"),
    _c("devices", "int64", "devices", "devices of the rank in the waterfall"),
    _ns("window_ns", "the rank's devices' windows, summed"),
    *(_c(f"{cause}_share", "float64", "", f"share of the window: {cause}")
      for cause in LOSS_CAUSES),
)

_declare(
    "memory", "analyzers.memory.allocator.fragmentation", "fragmentation",
    "allocator state of a device at a moment the history changes it (host memory left out)",
    RANK, DEVICE,
    _ns("ts_ns", "event time (-1: a snapshot without history, time unknown)"),
    _c("action", "category", "", "the event's `memory.action` (NA: the state before the "
       "first event)"),
    _c("event", "Int64", "", "the event's `memory` row label"),
    _c("source", "category", "", "how the row was obtained, and so what it can say",
       ("replay", "snapshot", "totals", "deltas")),
    _c("reserved_bytes", "Int64", "bytes", "segments the allocator holds from the driver"),
    _c("allocated_bytes", "Int64", "bytes", "blocks in use (allocated, or freed but awaiting "
       "their streams)"),
    _c("free_bytes", "Int64", "bytes", "inactive blocks inside reserved segments"),
    _c("largest_free_bytes", "Int64", "bytes", "the largest of them (NA without the block "
       "layout)"),
    _c("fragmentation", "float64", "", "1 - largest free block / free bytes (0 when nothing "
       "is free; NA without the block layout)"),
)

_PCT = "% of the unit's sustained peak (ncu)"
_declare(
    "kernel_metrics", "analyzers.kernels.metrics.kernel_metrics", "kernel_metrics",
    "profiled kernel (Nsight Compute): the numbers ncu's Details page leads with, its SOL "
    "bottleneck and flags (NA where an input is missing)",
    _c("kernel_id", "int64", "", "the kernels row"),
    DEVICE,
    _c("name", "string", "", "kernel name"),
    _c("short_name", "string", "", "short form of the name (`names.short_names`)"),
    _ns("duration_ns", "gpu__time_duration.sum", "Int64"),
    _c("grid_size", "Int64", "blocks", "blocks in the grid"),
    _c("block_size", "Int64", "threads", "threads per block"),
    _c("sm_count", "Int64", "", "SMs of its device"),
    _c("sm_throughput_pct", "Float64", "%", "SM throughput, " + _PCT),
    _c("memory_throughput_pct", "Float64", "%", "the busiest of DRAM, L1 and L2, " + _PCT),
    _c("dram_throughput_pct", "Float64", "%", "DRAM throughput, " + _PCT),
    _c("l1_hit_rate_pct", "Float64", "%", "L1 sector hit rate"),
    _c("l2_hit_rate_pct", "Float64", "%", "L2 sector hit rate"),
    _c("achieved_occupancy_pct", "Float64", "%", "achieved occupancy"),
    _c("theoretical_occupancy_pct", "Float64", "%", "theoretical occupancy"),
    _c("waves_per_sm", "Float64", "", "waves per SM (launch__waves_per_multiprocessor)"),
    _c("regs_per_thread", "Int64", "registers", "registers per thread"),
    _c("smem_bytes", "Int64", "bytes", "shared memory per block"),
    _c("bottleneck", "string", "", "ncu's SOLBottleneck decision (NA without both "
       "throughputs)", BOTTLENECKS),
    _c("small_grid", "boolean", "", "waves per SM < 1"),
    _c("low_l2_hit", "boolean", "", "L2 hit rate < 62 %"),
    _c("low_memory_throughput", "boolean", "", "memory throughput < 50 %: no memory unit is "
       "even half busy"),
    _c("achieved_occupancy_gap", "boolean", "", "theoretical - achieved occupancy > 10 points "
       "(ncu's AchievedOccupancy rule)"),
    _c("low_theoretical_occupancy", "boolean", "", "theoretical occupancy < 80 % (ncu's "
       "TheoreticalOccupancy rule)"),
    _c("missing", "string", "", "the metric columns that are NA, comma-separated ('' when "
       "none)"),
)

_declare(
    "kernel_metrics", "analyzers.kernels.metrics.rule_findings", "ncu_rules",
    "ncu rule result that names a problem (type warning, optimization or error), most "
    "estimated speedup first",
    _c("kernel_id", "int64", "", "the kernels row"),
    _c("name", "string", "", "kernel name"),
    _c("short_name", "string", "", "short form of the name (`names.short_names`)"),
    _c("rule", "string", "", "rule identifier, e.g. 'SOLBottleneck'"),
    _c("rule_name", "string", "", "the rule's name"),
    _c("title", "string", "", "title of the result"),
    _c("type", "string", "", "result type (ncu_report's MsgType, lower-cased)"),
    _c("speedup_type", "string", "", "`global`: a share of the kernel's whole duration, "
       "`local`: of one unit's work", ("global", "local")),
    _c("speedup_pct", "Float64", "%", "ncu's estimated speedup"),
    _c("message", "string", "", "the rule's message as plain text"),
)

_declare(
    "gpu_samples", "analyzers.gpu_samples.sample_summary", "sample_summary",
    "(rank, device) sampled by NVML, beside the kernels' view of the same span",
    RANK, DEVICE,
    _c("samples", "int64", "", "sampling moments"),
    _ns("start_ns", "first sample"), _ns("end_ns", "last sample"),
    _ns("span_ns", "end_ns - start_ns"),
    _c("gpu_util_mean_pct", "float64", "%", "gpu_util, time-weighted mean"),
    _c("gpu_util_median_pct", "float64", "%", "gpu_util, median of the samples"),
    _c("low_util_share", "float64", "", "share of the time with gpu_util < 30 %"),
    _c("kernel_busy_share", "float64", "", "share of [start_ns, end_ns] covered by the trace's "
       "kernels on that device (NaN: none, or the times are not a timeline)"),
    _c("mem_used_peak_bytes", "Int64", "bytes", "NVML's memory used, all processes, peak"),
    _c("mem_total_bytes", "Int64", "bytes", "NVML's memory total"),
    _c("power_mean_w", "float64", "W", "mean power"),
    _c("temperature_max_c", "float64", "C", "peak temperature"),
    _c("sm_clock_mean_mhz", "float64", "MHz", "mean SM clock"),
    _c("throttle_samples", "int64", "", "samples of the clocks-event (throttle) reasons"),
    *(_c(f"throttle_{name}", "float64", "", f"share of those samples with `{name}`: {why}")
      for name, why in THROTTLE_REASONS.items()),
    _c("power_throttled_share", "float64", "", "share with a power reason (sw_power_cap, "
       "hw_power_brake, or hw_slowdown without a thermal one)"),
    _c("thermal_throttled_share", "float64", "", "share with a thermal reason (sw_thermal, "
       "hw_thermal)"),
    _c("sm_clock_throttled_mhz", "float64", "MHz", "mean SM clock in power or thermal "
       "throttled samples"),
    _c("sm_clock_unthrottled_mhz", "float64", "MHz", "mean SM clock in the others"),
)

_declare(
    "host_steps", "analyzers.host.steps.host_breakdown", "host_breakdown",
    "(process, category) of host step time",
    RANK, PID,
    _c("category", "str", "", "what the host spent the time on", tuple(HOST_CATEGORIES)),
    _ns("time_ns", "in the profiled steps that are not warm-up"),
    _c("share", "float64", "", "of those steps' time"),
    _ns("per_step_ns", "mean per step", "float64"),
    _ns("warmup_ns", "in the warm-up steps"),
    _c("steps", "int64", "", "profiled steps that are not warm-up"),
)

_declare(
    "host_steps", "analyzers.host.steps.host_by_step", "host_by_step",
    "step of a process, its host time cut into categories (without steps: the process's "
    "profiled span, step '(whole trace)')",
    RANK, PID, TID,
    _c("step", "str", "", "step name"),
    _c("index", "int64", "", "0-based position of the step in its process"),
    _ns("start_ns", "start of the step's window"), _ns("end_ns", "end of the step's window"),
    _ns("dur_ns", "end_ns - start_ns less gpudiag's pauses in it and, in a profiled step, "
        "its part the profiler did not record"),
    _c("warmup", "bool", "", "a warm-up step"),
    _c("profiled", "bool", "", "the profiler recorded at least half of the step's time "
       "that was the program's (the span of its process's host ranges but gpudiag's own "
       "markers, less gpudiag's pauses)"),
    *(_ns(f"{name}_ns", f"host time in {what} (the categories sum to dur_ns; 0 in steps not "
          "profiled)") for name, what in HOST_CATEGORIES.items()),
    _c("cpu_time", "Int64", "ns", "time the training thread ran on a CPU in the step (its "
       "thread CPU time, measured by `gpudiag profile` at each step edge; NA: not measured)"),
    _ns("python_off_cpu_ns", "of python_ns, the time the thread was off a CPU (wall less "
        "CPU time, less data loading waits, at most python_ns; 0 without cpu_time): "
        "descheduled or blocked, not Python to optimize"),
    _c("cpu_peak_bytes", "Int64", "bytes", "highest running total of CPU allocations in the "
       "step (NA without CPU memory events)"),
)

_declare(
    "host_steps", "analyzers.host.steps.host_top_ops", "host_top_ops",
    "op (torch op, framework event) by self time in the steady profiled steps, all threads",
    _c("name", "str", "", "op name"),
    _c("calls", "int64", "", "calls"),
    _ns("self_ns", "self time"),
    _c("share", "float64", "", "of the steady steps' summed time"),
)

_declare(
    "host_steps", "analyzers.host.steps.host_memory", "host_memory",
    "process with host events: its CPU memory peak",
    RANK,
    PID,
    _c("peak_bytes", "Int64", "bytes", "highest running total of CPU allocations (NA without "
       "CPU memory events)"),
    _c("peak_step", "str", "", "the step it happened in (NA outside steps)"),
    _c("steady_peak_bytes", "Int64", "bytes", "highest in a step that is not warm-up"),
)


# -- enforcement ---------------------------------------------------------------------------


def conform_frame(name: str, frame: pd.DataFrame | None) -> pd.DataFrame | None:
    """The Diagnosis frame `name` (`losses`, `gaps`, ...) as declared (None stays None)."""
    if frame is None:
        return None
    part = FRAMES.get(name)
    if part is None:
        raise SchemaError(f"Diagnosis.{name} is not declared in gpudiag/diagnosis_schema.py")
    return conform(part, frame)


def conform_table(name: str, frame: pd.DataFrame, analyzer: str) -> pd.DataFrame:
    """The table `name` that `analyzer` returned, as declared; a table that is not declared,
    or declared as another analyzer's, raises `SchemaError`."""
    part = TABLES.get(name)
    if part is None:
        raise SchemaError(f"analyzer {analyzer!r} returned table {name!r}, which "
                          "gpudiag/diagnosis_schema.py does not declare")
    if part.analyzer != analyzer:
        raise SchemaError(f"analyzer {analyzer!r} returned table {name!r}, declared as the "
                          f"{part.analyzer!r} analyzer's")
    return conform(part, frame)


def conform(part: Part, frame: pd.DataFrame) -> pd.DataFrame:
    """`frame` with the declared columns in order, each at its dtype; its index and `attrs`
    are kept, and a frame that already conforms is returned as it is (no copy).

    Undeclared or missing columns raise `SchemaError`; a frame without rows gets its missing
    columns empty (there is nothing in them to lose).
    """
    label, table = part.where, part.table
    if not isinstance(frame, pd.DataFrame):
        raise SchemaError(f"{label} is a {type(frame).__name__}, not a DataFrame")
    names = table.names
    unknown = [c for c in frame.columns if c not in names]
    if unknown or frame.columns.has_duplicates:
        raise SchemaError(f"{label} has undeclared or repeated columns "
                          f"{unknown or list(frame.columns)}")
    missing = [c for c in names if c not in frame.columns]
    if missing and len(frame):
        raise SchemaError(f"{label} lacks the declared columns {missing}")
    changed = list(frame.columns) != names
    out: dict[str, pd.Series] = {}
    for col in table.columns:
        if col.name in frame.columns:
            series = frame[col.name]
            out[col.name] = conform_column(series, col, label)
            changed |= out[col.name] is not series
        else:
            out[col.name] = empty_series(col)
    if not changed:
        return frame
    result = pd.DataFrame({name: s.to_numpy() if isinstance(s.dtype, np.dtype) else s.array
                           for name, s in out.items()}, index=frame.index, copy=False)
    result.attrs.update(frame.attrs)
    return result


# -- docs ------------------------------------------------------------------------------------


def markdown() -> str:
    """The Diagnosis part of docs/schema.md."""
    lines = [
        "# Diagnosis schema",
        "",
        "Generated from `gpudiag/diagnosis_schema.py` by the same command; do not edit by hand.",
        "`gpudiag.diagnose(trace)` returns a `Diagnosis`; each frame and analyzer table below "
        "is checked against",
        "this declaration as it is built (dtypes cast; an undeclared table or column is a "
        "gpudiag bug, `SchemaError`).",
        "`str` is pandas' default string dtype (missing: NaN), `string` the nullable one "
        "(pd.NA); `Float64` is a",
        "nullable float, `bool` a flag that is never missing (`boolean` may be NA).",
        "",
    ]
    for part in (*FRAMES.values(), *TABLES.values()):
        origin = (f"Built by `diagnose`: `{part.source}`." if part.analyzer == "diagnose"
                  else f"From the `{part.analyzer}` analyzer: `{part.source}`.")
        lines += [f"## `{part.where}`", "", f"One row per {part.table.row}. {origin}", ""]
        lines += column_lines(part.table.columns)
        lines.append("")
    return "\n".join(lines)


def full_markdown() -> str:
    """docs/schema.md: the Trace schema, then the Diagnosis part (`gpudiag schema`)."""
    return schema.markdown() + "\n" + markdown()
