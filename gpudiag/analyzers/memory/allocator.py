"""Memory the caching allocator holds but cannot use: fragmentation, over time, and why.

    frag = fragmentation(trace)
    frag.groupby("device").tail(1)        # at the snapshot: reserved, allocated, free, ratio
    findings(trace)                       # one finding per fragmented device, with advice

Definitions (docs: REFERENCE "What none of them do" 3), per device:
- reserved = bytes of the segments the allocator holds from the driver (cudaMalloc'd);
- allocated = bytes of the blocks in use (allocated, or freed but awaiting their streams);
- free = inactive blocks inside reserved segments: cached, reusable only by a request that
  fits one of them;
- fragmentation = 1 - largest free block / free bytes (0 when nothing is free): 0 when all
  free memory is one block, near 1 when it is split into many pieces.

From a snapshot the state is exact at dump time and replayed backwards through the history
for every earlier moment. Profiler memory events (Kineto `[memory]`) carry only totals, so
free bytes are reserved - allocated and the fragmentation ratio is NA: without the block
layout nobody can say how the free bytes are split (`SOURCES` says what each row can tell).

The family: `memory_layout` (the allocator's layout as a model: splitting, merging, what a
replay must infer), `memory_replay` (undoing the history from the snapshot), `memory_sites`
(which call sites strand free bytes or waste them), `memory_grid` (address x time grid for
a heatmap); this module assembles the tables and the findings and re-exports the rest.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pandas as pd

from gpudiag.analyzers import findings as found
from gpudiag.analyzers.findings import Contract, Result
from gpudiag.analyzers.keys import key_array
from gpudiag.analyzers.memory.grid import occupancy_grid
from gpudiag.analyzers.memory.replay import Key, Steps, keys_of, replay_devices, select
from gpudiag.analyzers.memory.sites import free_pieces, internal_waste, site_label, sites
from gpudiag.analyzers.steps.training import step_windows
from gpudiag.trace import Trace

__all__ = ["REUSE_ADVICE", "churn", "findings", "fragmentation", "free_pieces",
           "internal_waste", "occupancy_grid", "ooms", "sites"]

#: how each `fragmentation` row was obtained, and so what it can say (the reason a
#: fragmentation is NA)
SOURCES = {
    "replay": "the snapshot's layout with the later history undone",
    "snapshot": "the snapshot's own layout, exact",
    "totals": "profiler totals: free = reserved - allocated, but without the block layout "
              "how it is split is unknown, so largest free block and fragmentation are NA",
    "deltas": "running sum of tensor sizes: allocated only; reserved, free and "
              "fragmentation are unknown",
}
FRAGMENTATION_COLUMNS = {
    "rank": "Int64", "device": "Int64", "ts_ns": "int64", "action": "category",
    "event": "Int64", "source": "category", "reserved_bytes": "Int64",
    "allocated_bytes": "Int64", "free_bytes": "Int64", "largest_free_bytes": "Int64",
    "fragmentation": "float64",
}
#: what an `oom` event says about the memory at that moment
VERDICTS = ("fragmentation", "fragmentation_with_driver", "exhausted", "unknown")
SEGMENT_GROWS = ("segment_alloc", "segment_map")
SEGMENT_SHRINKS = ("segment_free", "segment_unmap")
#: the advice when expandable segments would not help (already on, or the free bytes are
#: in few segments): keep long-lived tensors from pinning the pieces the step frees
REUSE_ADVICE = (
    "keep long-lived tensors out of the memory the step churns through: preallocate and "
    "reuse buffers (out=, in-place ops), allocate the largest long-lived tensors first, or "
    "stop the allocator splitting big cached blocks with "
    "PYTORCH_CUDA_ALLOC_CONF=max_split_size_mb:<MB>"
)


# -- fragmentation over time --------------------------------------------------------------


def fragmentation(trace: Trace) -> pd.DataFrame:
    """Per device, the allocator's state at every moment the history changes it.

        frag = fragmentation(trace)
        frag.plot(x="ts_ns", y=["reserved_bytes", "allocated_bytes", "free_bytes"])
        frag.groupby("device").tail(1)[["free_bytes", "largest_free_bytes", "fragmentation"]]

    Columns: `rank, device, ts_ns, action, event, source, reserved_bytes, allocated_bytes,
    free_bytes, largest_free_bytes, fragmentation` (module docstring for the definitions).
    From a snapshot (`source` replay/snapshot): the first row is the state before the first
    event (`action` NA, `ts_ns` of that event), then one row per layout-changing event
    (`event` = its `memory` row label) with the state after it; the last row is the snapshot
    itself, exact. A snapshot without history is one row (`ts_ns` -1: its time is unknown).
    Without a snapshot: one row per profiler event with totals (`source` totals: free =
    reserved - allocated, fragmentation NA: the layout is unknown), else per event with a
    `delta_bytes` (`source` deltas: allocated = their running sum, reserved unknown).
    Host memory (`device` -1) is left out. Computed once per trace (the findings and the
    report's memory figures read the same frame); do not modify the frame you get back.
    """
    return trace.derived("fragmentation",
                         lambda: _fragmentation(trace, replay_devices(trace)))


def _fragmentation(trace: Trace, replays: dict[Key, Steps]) -> pd.DataFrame:
    parts = [_replay_frame(trace.memory, key, steps) for key, steps in replays.items()]
    parts += _profiler_frames(trace, exclude=set(replays))
    if not parts:
        return _typed(pd.DataFrame({col: [] for col in FRAGMENTATION_COLUMNS}))
    return _typed(pd.concat(parts, ignore_index=True))


def _replay_frame(memory: pd.DataFrame, key: Key, steps: Steps) -> pd.DataFrame:
    """One device's replayed states as `fragmentation` rows."""
    events = steps.row[1:]
    times = memory["ts_ns"].to_numpy(np.int64)[events]
    actions = memory["action"].astype("object").to_numpy()[events]
    count = len(events)
    free, largest = steps.free, steps.largest
    event = pd.array(steps.row, dtype="Int64")
    event[steps.row < 0] = pd.NA
    return pd.DataFrame({
        "rank": key[0], "device": key[1],
        "ts_ns": np.concatenate([times[:1], times]) if count else [-1],  # -1: time unknown
        "action": [None, *actions] if count else ["snapshot"],
        "event": event,
        "source": ["replay"] * count + ["snapshot"],
        "reserved_bytes": steps.reserved, "allocated_bytes": steps.allocated,
        "free_bytes": free, "largest_free_bytes": largest,
        "fragmentation": np.where(free > 0, 1 - largest / np.maximum(free, 1), 0.0),
    })


def _profiler_frames(trace: Trace, exclude: set[Key]) -> list[pd.DataFrame]:
    """Totals (or running deltas) per device of the memory rows no snapshot replays."""
    mem = trace.memory[trace.memory["device"].fillna(0).ge(0).to_numpy(bool)]  # -1: host
    out = []
    for key in [pair for pair in keys_of(mem) if pair not in exclude]:
        rows = select(mem, key).sort_values("ts_ns", kind="stable")
        totals = rows["total_reserved_bytes"].notna() | rows["total_allocated_bytes"].notna()
        if totals.any():
            rows = rows[totals]
            reserved = rows["total_reserved_bytes"]
            allocated = rows["total_allocated_bytes"]
            source = "totals"
        else:
            rows = rows[rows["delta_bytes"].notna()]
            reserved = pd.Series(pd.NA, index=rows.index, dtype="Int64")
            allocated = rows["delta_bytes"].cumsum()
            source = "deltas"
        if len(rows):
            out.append(pd.DataFrame({
                "rank": key[0], "device": key[1], "ts_ns": rows["ts_ns"],
                "action": rows["action"].astype("object"), "event": rows.index.to_numpy(),
                "source": source, "reserved_bytes": reserved, "allocated_bytes": allocated,
                "free_bytes": reserved - allocated, "largest_free_bytes": pd.NA,
                "fragmentation": np.nan}))
    return out


def _typed(frame: pd.DataFrame) -> pd.DataFrame:
    frame = frame.astype({col: dtype for col, dtype in FRAGMENTATION_COLUMNS.items()
                          if dtype != "category"})
    frame["action"] = frame["action"].astype("category")
    frame["source"] = pd.Categorical(frame["source"], categories=list(SOURCES))
    return frame.reset_index(drop=True)


# -- out-of-memory verdicts ----------------------------------------------------------------


def ooms(trace: Trace, frag: pd.DataFrame | None = None) -> pd.DataFrame:
    """Every `oom` event with the memory it could have used: fragmentation or exhaustion?

        o = ooms(trace)
        o[["ts_ns", "bytes", "free_bytes", "largest_free_bytes", "verdict"]]
        (o.verdict == "fragmentation").sum()

    `free_bytes` / `largest_free_bytes` are the state just before the OOM (after the
    allocator already gave back every fully free segment, so what is left is stranded).
    `verdict`: `fragmentation` when the request fits in the free bytes (they were there, in
    pieces too small); `fragmentation_with_driver` when it fits only in free + the driver's
    free bytes (`device_free_bytes`, NA read as 0); `exhausted` otherwise; `unknown` without
    a state (no snapshot and no totals). Pass `frag` to reuse a `fragmentation()` result.
    """
    mem = trace.memory
    oom = mem[(mem["action"] == "oom").to_numpy(bool)]
    if frag is None:  # the replay is the costly part; an OOM-free trace needs none
        frag = fragmentation(trace) if len(oom) else fragmentation(Trace())
    state = _state_at(frag, oom)
    size = oom["bytes"].astype("float64").to_numpy()
    free = state["free_bytes"].astype("float64").to_numpy()
    driver = oom["device_free_bytes"].fillna(0).astype("float64").to_numpy()
    verdict = np.select([np.isnan(free), size <= free, size <= free + driver],
                        ["unknown", "fragmentation", "fragmentation_with_driver"], "exhausted")
    out = pd.DataFrame({
        "rank": oom["rank"].array, "device": oom["device"].array,
        "ts_ns": oom["ts_ns"].to_numpy(), "event": pd.array(oom.index, dtype="Int64"),
        "bytes": oom["bytes"].array, "device_free_bytes": oom["device_free_bytes"].array,
        "free_bytes": state["free_bytes"].array,
        "largest_free_bytes": state["largest_free_bytes"].array,
        "site": oom["site"].astype("string").array,
        "verdict": pd.Categorical(verdict, categories=list(VERDICTS)),
    })
    return out.reset_index(drop=True)


def _state_at(frag: pd.DataFrame, rows: pd.DataFrame) -> pd.DataFrame:
    """For each `memory` row, the `fragmentation` row of its device in force just before it."""
    picked = np.full(len(rows), -1, dtype=np.int64)
    for key in keys_of(rows):
        mine = select(frag, key).sort_values("event", na_position="first", kind="stable")
        if mine.empty:
            continue
        where = np.flatnonzero(_mask(rows, key))
        known = mine["event"].notna().to_numpy(bool)
        # the start row and a lone snapshot row (event NA, sorted first) hold before every
        # event: the last row in force before each row is `before`
        labels = mine["event"][known].to_numpy(np.int64)
        before = (int((~known).sum()) - 1
                  + np.searchsorted(labels, rows.index.to_numpy(np.int64)[where], side="left"))
        picked[where] = np.where(before >= 0, mine.index.to_numpy()[np.maximum(before, 0)], -1)
    state = frag.reindex(picked)[["free_bytes", "largest_free_bytes"]]
    return state.astype("Int64")


def _mask(frame: pd.DataFrame, key: Key) -> np.ndarray:
    return frame.index.isin(select(frame, key).index)


# -- churn, waste, sites ---------------------------------------------------------------------


def churn(trace: Trace) -> pd.DataFrame:
    """Segments taken from and given back to the driver, per device and step.

        c = churn(trace)
        c[["step", "segment_allocs", "segment_frees", "alloc_site"]]
        c.segment_frees.sum()         # cudaFree calls: empty_cache or OOM retries

    Columns `rank, device, step, segment_allocs, segment_frees, alloc_bytes, free_bytes,
    alloc_site`: counts and bytes of `segment_alloc`/`segment_map` and
    `segment_free`/`segment_unmap` events, and the call site that most often needed a new
    segment. `step` is the step range (`steps.step_windows`) the event falls in, NA outside
    steps or when the trace has none (then one row per device covers the whole history).
    Segment churn means cudaMalloc/cudaFree inside the loop, which synchronize the device.
    """
    mem = trace.memory
    seg = mem[mem["action"].isin(SEGMENT_GROWS + SEGMENT_SHRINKS).to_numpy(bool)].copy()
    seg["step"] = _steps_of(trace, seg)
    grows = seg["action"].isin(SEGMENT_GROWS).to_numpy(bool)
    seg["grows"], seg["shrinks"] = grows.astype(int), (~grows).astype(int)
    seg["grow_bytes"] = seg["bytes"].where(grows, 0)
    seg["shrink_bytes"] = seg["bytes"].where(~grows, 0)
    keys = ["rank", "device", "step"]
    out = seg.groupby(keys, dropna=False, sort=True).agg(
        segment_allocs=("grows", "sum"), segment_frees=("shrinks", "sum"),
        alloc_bytes=("grow_bytes", "sum"), free_bytes=("shrink_bytes", "sum")).reset_index()
    sites = seg[grows].groupby([*keys, "site"], dropna=False, observed=True).size()
    top = sites.sort_values(ascending=False, kind="stable").reset_index()
    top = top.drop_duplicates(keys).rename(columns={"site": "alloc_site"})
    out = out.merge(top[[*keys, "alloc_site"]], on=keys, how="left")
    return out.astype({"rank": "Int64", "device": "Int64", "step": "string",
                       "segment_allocs": "int64", "segment_frees": "int64",
                       "alloc_bytes": "int64", "free_bytes": "int64", "alloc_site": "string"})


def _steps_of(trace: Trace, rows: pd.DataFrame) -> pd.Series:
    """The step name each row's `ts_ns` falls in (the windows of its rank, else any)."""
    windows = step_windows(trace)
    out = pd.Series(pd.NA, index=rows.index, dtype="string")
    if windows.empty or rows.empty:
        return out
    rank, window_rank = key_array(rows["rank"]), key_array(windows["rank"])  # NA: MISSING
    for value in np.unique(rank):
        mine = windows[window_rank == value]
        mine = mine if len(mine) else windows[window_rank == window_rank[0]]
        times = rows["ts_ns"].to_numpy(np.int64)[rank == value]
        step = np.searchsorted(mine["start_ns"].to_numpy(np.int64), times, side="right") - 1
        inside = (step >= 0) & (times < mine["end_ns"].to_numpy(np.int64)[np.maximum(step, 0)])
        names = np.where(inside, mine["step"].to_numpy(object)[np.maximum(step, 0)], None)
        out[rank == value] = pd.array(names, dtype="string")
    return out


def peaks(frag: pd.DataFrame) -> pd.DataFrame:
    """Per (rank, device) of a `fragmentation` table: its events, peak reserved and allocated.

        frag = allocator.fragmentation(trace)
        top = allocator.peaks(frag)
        top[["device", "peak_reserved", "peak_allocated", "max_frag", "last_frag"]]

    Also the worst and final fragmentation: what the report and, for a file without a
    timeline, `analyze` show.
    """
    return frag.groupby(["rank", "device"], sort=True, dropna=False).agg(
        events=("ts_ns", "size"), peak_reserved=("reserved_bytes", "max"),
        peak_allocated=("allocated_bytes", "max"), max_frag=("fragmentation", "max"),
        last_frag=("fragmentation", "last")).reset_index()


# -- findings ----------------------------------------------------------------------------------


def analyze(trace: Trace) -> Result:
    """The allocator analyzer's one result: its findings and the table they were read from.

        result = allocator.analyze(trace)
        result.findings[["where", "count", "evidence"]]
        result.tables["fragmentation"].groupby("device").tail(1)

    One replay per device serves both (`replay_devices` is computed once per trace).
    """
    return combine([part(trace)])


@dataclass(frozen=True)
class Part:
    """One rank's share of a job's allocator analysis (every question is one device's):
    its findings, and its `fragmentation` rows of replayed devices and of devices with
    profiler totals only (the table lists the first kind, then the second)."""

    findings: pd.DataFrame
    replayed: pd.DataFrame
    profiled: pd.DataFrame
    first: tuple[int, int]  # its first replayed device: a job's parts sort by it


def part(trace: Trace) -> Part:
    """This rank's findings and fragmentation rows (see `Part`).

        pieces = [allocator.part(rank) for rank in ranks]   # one per rank's trace
        pieces[0].replayed.groupby("device").tail(1)        # each device's snapshot row
        allocator.combine(pieces).tables["fragmentation"]   # == analyze(merged)'s
    """
    frag = fragmentation(trace)
    replayed = frag["source"].isin(["replay", "snapshot"]).to_numpy(bool)
    mine = _by_key(frag[replayed])
    first = (int(key_array(mine["rank"])[0]), int(key_array(mine["device"])[0])) \
        if len(mine) else (np.iinfo(np.int64).max, 0)
    return Part(findings(trace), frag[replayed], frag[~replayed], first)


def shift_rows(piece: Part, rows: Callable[[str, np.ndarray], np.ndarray]) -> Part:
    """The part with its `event` labels the merged job's memory rows (`rows` maps labels).

        before = len(first_rank.memory)                        # rows of the ranks before
        later = shift_rows(part(second_rank), lambda table, rows: rows + before)
        later.replayed["event"]                                # labels of the merged table
    """
    def shifted(frame: pd.DataFrame) -> pd.DataFrame:
        known = frame["event"].notna().to_numpy(bool)
        if not known.any():
            return frame
        event = frame["event"].to_numpy(dtype=np.float64, na_value=np.nan)
        event[known] = rows("memory", event[known].astype(np.int64))
        return frame.assign(event=pd.array(np.where(known, event, np.nan), dtype="Float64")
                            .astype("Int64"))
    return Part(piece.findings, shifted(piece.replayed), shifted(piece.profiled), piece.first)


def combine(parts: list[Part]) -> Result:
    """The job's result: findings and rows of every device, in (rank, device) order.

        result = allocator.combine([allocator.part(rank) for rank in ranks])
        result.findings[["where", "count", "evidence"]]
        result.tables["fragmentation"]
    """
    if len(parts) == 1:
        frag = _typed(pd.concat([parts[0].replayed, parts[0].profiled], ignore_index=True))
        return Result(parts[0].findings, {"fragmentation": frag})
    frames = [_by_key(pd.concat([getattr(piece, kind) for piece in parts], ignore_index=True))
              for kind in ("replayed", "profiled")]
    found_rows = pd.concat([piece.findings for piece in sorted(parts, key=lambda p: p.first)],
                           ignore_index=True)  # one device's each, in the replays' order
    return Result(found.frame(found_rows),
                  {"fragmentation": _typed(pd.concat(frames, ignore_index=True))})


def _by_key(rows: pd.DataFrame) -> pd.DataFrame:
    """Rows in (rank, device) order, NA first (as `keys_of` lists devices)."""
    order = np.lexsort((key_array(rows["device"]), key_array(rows["rank"])))
    return rows.iloc[order].reset_index(drop=True)


def findings(trace: Trace, *, min_stranded_bytes: int = 1 << 30,
             min_stranded_share: float = 0.1, min_fragmentation: float = 0.5,
             expandable_min_segments: int = 4) -> pd.DataFrame:
    """One `fragmentation` finding per device whose snapshot shows memory lost to pieces.

        f = findings(trace)
        f[["where", "count", "evidence"]]
        f.advice.iloc[0]

    Only *stranded* free bytes count (`memory_sites.free_pieces`): free blocks in segments
    that also hold blocks in use. Wholly free segments are cache, which the allocator gives
    back before it reports an OOM. A device is reported when, at the snapshot, stranded
    bytes are at least `min_stranded_bytes` (default 1 GiB) and `min_stranded_share` (0.1)
    of reserved and the free bytes are split (fragmentation >= `min_fragmentation`, 0.5),
    or when any OOM had the bytes free (verdict `fragmentation*`). `lost_ns` is 0: memory,
    not time. `where` is the call site stranding the most bytes (`sites`); `count` the
    stranded free blocks. Expandable segments are advised only where they would help: not
    already on, the free bytes split (ratio >= `min_fragmentation`) and the stranded bytes
    spread over at least `expandable_min_segments` segments (holes in a few segments are
    the allocation pattern's doing, and REUSE_ADVICE is the fix). Profiler totals without a
    snapshot give no finding: they cannot tell free bytes from split ones.
    """
    replays, frag = replay_devices(trace), fragmentation(trace)
    verdicts = ooms(trace, frag)
    pieces, culprits = free_pieces(trace), sites(trace)
    rows = []
    for key, steps in replays.items():
        final = select(frag, key).iloc[-1]
        mine = select(pieces, key)
        piece = mine.iloc[0] if len(mine) else pd.Series(0, index=pieces.columns)
        stranded, ratio = int(piece["stranded_bytes"]), float(final["fragmentation"])
        split = (stranded >= min_stranded_bytes and ratio >= min_fragmentation
                 and stranded >= min_stranded_share * int(final["reserved_bytes"]))
        oom = select(verdicts, key)
        if split or oom["verdict"].astype(str).str.startswith("fragmentation").any():
            expandable = _expandable(trace, key)
            helps = (not expandable and ratio >= min_fragmentation
                     and piece["stranded_segments"] >= expandable_min_segments)
            rows.append({
                "cause": "fragmentation", "lost_ns": 0, "where": _worst_site(culprits, key),
                "count": int(piece["stranded_holes"]),
                "evidence": _evidence(final, piece, steps, oom, expandable),
                "advice": found.ADVICE["fragmentation"] if helps else REUSE_ADVICE})
    return found.frame(rows)


def _expandable(trace: Trace, key: Key) -> bool:
    settings = trace.meta.get("allocator_settings")
    enabled = isinstance(settings, dict) and bool(settings.get("expandable_segments"))
    return enabled or bool(select(trace.memory_blocks, key)["expandable"].fillna(False).any())


def _worst_site(culprits: pd.DataFrame, key: Key) -> str:
    mine = select(culprits, key)
    if mine.empty:
        return f"device {key[1]} (no block in use borders the free memory)"
    site = mine["site"].iloc[0]
    if pd.isna(site):
        return "unknown call site (snapshot recorded without stacks)"
    return site_label(str(site))


def _evidence(final: pd.Series, piece: pd.Series, steps: Steps, verdicts: pd.DataFrame,
              expandable: bool) -> str:
    """The numbers behind one finding, in words."""
    free, reserved = int(final["free_bytes"]), int(final["reserved_bytes"])
    text = (f"at the snapshot {_size(free)} of {_size(reserved)} reserved is free: "
            f"{_size(int(piece['stranded_bytes']))} stranded in "
            f"{int(piece['stranded_holes'])} blocks over {int(piece['stranded_segments'])} "
            f"segments beside blocks in use, {_size(int(piece['cached_bytes']))} in "
            f"{int(piece['cached_segments'])} wholly free segments; largest free block "
            f"{_size(int(final['largest_free_bytes']))}{_ratio(final['fragmentation'])}; "
            f"allocated {_size(int(final['allocated_bytes']))}")
    if len(steps.moved):
        text += (f"; over {len(steps.moved)} allocator events free bytes ranged "
                 f"{_size(int(steps.free.min()))}-{_size(int(steps.free.max()))}")
    if steps.skipped:
        text += f" ({steps.skipped} events did not fit the replay)"
    counts = verdicts["verdict"].value_counts()
    text += ("; OOMs: " + ", ".join(f"{int(count)} {verdict}"
                                    for verdict, count in counts.items() if count)
             if len(verdicts) else "; no OOM recorded")
    return text + ("; expandable segments already on" if expandable else "")


def _ratio(value: float) -> str:
    """' (fragmentation 0.99)', or nothing when the layout could not say (NaN)."""
    ratio = float(value) if not pd.isna(value) else math.nan
    return "" if math.isnan(ratio) else f" (fragmentation {ratio:.2f})"


def _size(size: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(size) < 1024:
            return f"{size:.3g} {unit}"
        size /= 1024
    return f"{size:.3g} TiB"


#: what `diagnose` and a job call (`findings.Contract`)
CONTRACT = Contract(analyze, part, combine, shift_rows=shift_rows)
