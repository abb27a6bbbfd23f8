"""Expected savings: how much shorter the run gets if one finding's cause went away.

    found = expected_savings(Window(trace, bounds), findings, tables, gap_options=...)
    found[["cause", "where", "lost_ns", "saving_ns", "fix"]]

A finding's lost GPU time is not what fixing it buys: an idle gap behind a host that stays
slow buys nothing when the GPU work is pulled earlier, a sync in front of a long host
section buys its wait at most. Each finding is mapped to its events (the same rows its
analyzer summed: the waits at its call site, the gaps of its key, its kernels, the host
time of its category) and to one named transformation of its rank's replay graph
(`replay.Replay`); the saving is how much shorter the replayed window gets.
`diagnosis_schema.FIXES` names each transformation and what it assumes; docs/analysis.md
("Expected savings") says where each is optimistic.

A job of several ranks is one replay, its ranks tied through their matched collectives
(a late rank's fix pulls its peers earlier too); a finding's saving is the most it
shortens any rank (see docs/analysis.md).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import pandas as pd

from gpudiag import intervals as iv
from gpudiag.analyzers import keys
from gpudiag.analyzers.critical.events import API, GPU, TABLES, Events
from gpudiag.analyzers.critical.replay import Outcome, Replay
from gpudiag.analyzers.critical.sample import Sample, count_in, extent, sample_of
from gpudiag.analyzers.losses.options import GapOptions
from gpudiag.analyzers.window import Window
from gpudiag.trace import Trace

IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]

#: what a CUDA graph replay costs the host per launch it replaces (its one
#: cudaGraphLaunch spread over the kernels it holds: a few µs for tens of kernels)
GRAPH_LAUNCH_NS = 1_000

#: the findings whose saving is exact, at least: findings are replayed from the largest
#: bound on their saving down, until no finding left can rank among this many
EXACT_TOP = 10

#: findings whose saving can be no more than this share of the window are not replayed
#: (NA): below it a saving does not change what to fix first
MIN_SHARE = 0.001
#: the most replays one diagnosis runs (each is a longest-path pass over the sample)
MAX_REPLAYS = 30


@dataclass(frozen=True)
class Selection:
    """A finding's events on every rank and the fix to replay: `rows` has `rank` (its
    `keys.key_array` value) and, by fix, `pid, correlation` (calls and work, `table` for
    work, `factor` for work made shorter) or `pid, tid, start_ns, end_ns` (host time)."""

    fix: str
    rows: pd.DataFrame


def expected_savings(seen: Window, findings: pd.DataFrame, tables: dict[str, pd.DataFrame],
                     *, gap_options: GapOptions, steps: pd.DataFrame | None = None,
                     notes: list[str] | None = None) -> pd.DataFrame:
    """`findings` with `saving_ns` (NA where no transformation applies), `saving_share`
    (of the replayed window), `saving_step_share` (per step, of the median steady step;
    NaN without steps) and `fix` (a `FIXES` key). `seen` is what the analyzers read (its
    `trace`) and the trace it was cut from (`whole`). A window of more than
    `SAMPLE_EVENTS` events is replayed on a sample of it (`sample_of`), its savings
    scaled to the window; `notes` gets a line saying which. Only the `MAX_PLANNED`
    findings that lost the most time are planned (a line says so when there are more).

    A job read rank by rank runs the same three steps apart: `sample_of` from its ranks'
    `extent`s, `selections` where each batch is read (with `replay_rows`, what its
    replay needs), `replayed` where the batches' rows are merged."""
    whole = seen.whole
    sample = sample_of(extent(whole, seen.bounds), steps)
    planned = most_lost(findings, notes)
    chosen = selections(Inputs(seen, tables, gap_options, sample.window), findings, planned)
    if sample.what and chosen and notes is not None:
        notes.append(sample.note(count_in(whole, sample.window)))
    return replayed(Replay.of(whole, sample.window) if chosen else None, findings, chosen,
                    sample, steps)


def replayed(replay: Replay | None, findings: pd.DataFrame, chosen: dict[int, Selection],
             sample: Sample, steps: pd.DataFrame | None) -> pd.DataFrame:
    """`findings` with their savings (see `expected_savings`), `chosen`'s fixes replayed
    on `replay` (None: nothing chosen)."""
    out = findings.copy()
    saving = pd.Series(pd.NA, index=out.index, dtype="Int64")
    if replay is not None:
        _replayed(replay, chosen, saving, sample.scale)
    length = sample.span if sample.scale != 1.0 else (
        replay.length_ns if replay is not None else 0)
    out["saving_ns"] = saving
    out["saving_share"] = (saving.astype("Float64") / length).astype("float64") if length \
        else np.nan
    out["saving_step_share"] = _per_step(saving, steps)
    fixes = pd.Series(pd.NA, index=out.index, dtype="string")
    for index, selection in chosen.items():
        if pd.notna(saving.iloc[index]):
            fixes.iloc[index] = selection.fix
    out["fix"] = fixes
    return out


#: the most findings planned (each plan joins its rows to the replay's events): a trace of
#: 100,000 distinct kernel names has a small-grid finding per name, and planning them all
#: took minutes and held an outcome (an array per graph edge) for each, 23 GB
MAX_PLANNED = 300


def most_lost(findings: pd.DataFrame, notes: list[str] | None) -> BoolArray:
    """Which findings are planned: the `MAX_PLANNED` that lost the most time."""
    if len(findings) <= MAX_PLANNED:
        return np.ones(len(findings), dtype=bool)
    lost = findings["lost_ns"].to_numpy(dtype=np.float64, na_value=0.0)
    chosen = np.zeros(len(findings), dtype=bool)
    chosen[np.argsort(-lost, kind="stable")[:MAX_PLANNED]] = True
    if notes is not None:
        notes.append(f"expected savings planned for the {MAX_PLANNED} findings that lost the "
                     f"most time, of {len(findings):,} (the rest have none)")
    return chosen


def _replayed(replay: Replay, chosen: dict[int, Selection], saving: pd.Series,
              scale: float) -> None:
    """Fill `saving` (by position): 0 where a plan changes nothing on a longest path, the
    replayed saving of the findings with the largest bounds, while one can still matter.
    Only the outcomes of the `MAX_REPLAYS` largest bounds are kept (no other is replayed)."""
    lookup = _Lookup(replay.graph.events)
    plans: dict[int, int] = {}  # position -> bound on its saving
    kept: dict[int, Outcome] = {}
    for index, selection in chosen.items():
        bound, outcome = _plan(replay, lookup, selection.fix, selection.rows)
        if outcome is None:
            continue  # none of its events is in the replay
        plans[index] = bound
        if not bound:
            saving.iloc[index] = 0  # nothing it changes is on a longest path
            continue
        kept[index] = outcome
        if len(kept) > MAX_REPLAYS:  # the smallest bound goes, the latest of equals
            del kept[min(reversed(list(kept)), key=lambda at: plans[at])]
    found: list[int] = []  # the savings replayed, on the replay's own scale
    least = MIN_SHARE * replay.length_ns
    for index in sorted(kept, key=lambda at: -plans[at]):
        if len(found) >= EXACT_TOP and plans[index] < sorted(found)[-EXACT_TOP]:
            break  # no finding left can enter the top EXACT_TOP: not replayed
        if plans[index] < least:
            break  # the rest could save under MIN_SHARE of the window
        gained = max(kept[index].saving(), 0)
        saving.iloc[index] = round(gained * scale)
        found.append(gained)


def _per_step(saving: pd.Series, steps: pd.DataFrame | None) -> pd.Series:
    """The saving spread evenly over each rank's steady steps, of the median steady step."""
    if steps is None or steps.empty:
        return pd.Series(np.nan, index=saving.index)
    steady = steps[~steps["warmup"].fillna(False).to_numpy(bool)]
    if steady.empty:
        return pd.Series(np.nan, index=saving.index)
    per_rank = steady.groupby(keys.key_array(steady["rank"])).size()
    median = float(steady["dur_ns"].median())
    count = float(per_rank.max())
    return (saving.astype("Float64") / count / median).astype("float64")


def _plan(replay: Replay, lookup: _Lookup, fix: str, rows: pd.DataFrame
          ) -> tuple[int, Outcome | None]:
    """`fix` applied to `rows` (of any rank) in `replay`, and the most it can save: the
    smaller of what it takes off the weights and what it takes off the longest path
    (`Outcome.bound`); (0, None) when none of the rows is in the replay."""
    events = lookup.events
    if fix == "no_host_time":  # the host time inside the replayed window
        low, high = events.window
        rows = rows[(rows["end_ns"] > low).to_numpy(bool)
                    & (rows["start_ns"] < high).to_numpy(bool)]
        pid, tid = lookup.processes(rows), keys.key_array(rows["tid"])
        start = np.maximum(rows["start_ns"].to_numpy(np.int64), low)
        end = np.minimum(rows["end_ns"].to_numpy(np.int64), high)
        most = int((end - start).sum())
        outcome = replay.without_host_time(pid, tid, start, end) if len(rows) else None
    elif fix in ("no_wait", "graph_launch"):
        calls = lookup.calls(lookup.known(rows))
        took = events.end[calls] - events.start[calls]
        if fix == "no_wait":
            most, outcome = int(took.sum()), replay.without_waits(calls)
        else:
            most = int(np.maximum(took - GRAPH_LAUNCH_NS, 0).sum())
            outcome = replay.faster_calls(calls, GRAPH_LAUNCH_NS)
        outcome = outcome if len(calls) else None
    else:
        rows = lookup.known(rows)
        works, row, matched = lookup.works(rows)
        if fix == "no_dependency":  # the idle time before the work: it moves no further
            most = int(rows["gap_ns"].to_numpy(np.int64)[matched].sum())
            outcome = replay.without_dependencies(works)
        else:
            factor = rows["factor"].to_numpy(np.float64)[row]
            most = int(np.ceil(((events.end[works] - events.start[works]) * (1 - factor)).sum()))
            outcome = replay.without_peer_waits(works, factor) if fix == "no_peer_wait" \
                else replay.shorter_work(works, factor)
        outcome = outcome if len(works) else None
    if outcome is None or most <= 0:
        return 0, None
    return min(most, outcome.bound()), outcome


class _Lookup:
    """Graph events by what analyzer rows name them by: (rank, pid, correlation) for calls
    and GPU work, (rank, pid, tid, start) for calls without a correlation id. Keys are
    sorted once; each lookup is a binary search."""

    def __init__(self, events: Events) -> None:
        self.events = events
        self.api = np.flatnonzero(events.kind == API)
        self.gpu = np.flatnonzero(events.kind == GPU)
        self.correlations = np.unique(events.correlation[events.correlation >= 0])
        pairs = pd.MultiIndex.from_arrays([events.rank, events.raw_pid, events.pid])
        self.process_index = pairs.droplevel(2)[~pairs.droplevel(2).duplicated()]
        self.process_codes = pairs.get_level_values(2)[~pairs.droplevel(2).duplicated()] \
            .to_numpy(np.int64)
        self.api_keys, self.api_order = _sorted(_key(events.pid[self.api], 0,
                                                     events.correlation[self.api]))
        self.gpu_keys, self.gpu_order = _sorted(_key(events.pid[self.gpu],
                                                     events.table[self.gpu],
                                                     events.correlation[self.gpu]))

    def known(self, rows: pd.DataFrame) -> pd.DataFrame:
        """The rows whose correlation id some event of the graph has (all without one):
        what a sampled replay can find, before the joins."""
        if "correlation" not in rows:
            return rows
        correlation = keys.key_array(rows["correlation"])
        known = self.correlations
        at = np.minimum(np.searchsorted(known, correlation), max(len(known) - 1, 0))
        found = known[at] == correlation if len(known) else np.zeros(len(rows), dtype=bool)
        return rows[(correlation == keys.MISSING) | found]

    def processes(self, rows: pd.DataFrame) -> IntArray:
        """The process code (`Events.pid`) of each row's (rank, pid); -1 when no event of
        the graph has it."""
        at = self.process_index.get_indexer(pd.MultiIndex.from_arrays(
            [keys.key_array(rows["rank"]), keys.key_array(rows["pid"])]))
        return keys.pick(self.process_codes, at, -1)

    def calls(self, rows: pd.DataFrame) -> IntArray:
        events, api = self.events, self.api
        correlation = keys.key_array(rows["correlation"]) if "correlation" in rows \
            else np.full(len(rows), keys.MISSING)
        process = self.processes(rows)
        hit, _, matched = _ranges(self.api_keys, self.api_order,
                                  _key(process, 0, correlation))
        found = api[hit]
        bare = ~matched
        if bare.any() and "tid" in rows and "start_ns" in rows:
            hit = _matching([events.pid[api], events.tid[api], events.start[api]],
                            [process[bare], keys.key_array(rows["tid"])[bare],
                             rows["start_ns"].to_numpy(np.int64)[bare]])
            found = np.concatenate([found, api[hit]])
        return np.unique(found)

    def works(self, rows: pd.DataFrame) -> tuple[IntArray, IntArray, BoolArray]:
        """The GPU events of the rows (a CUDA graph launch's correlation id names each of
        its kernels), the row of each, and which rows name some event."""
        table = rows["table"].map({name: index for index, name in enumerate(TABLES)})
        hit, row, matched = _ranges(self.gpu_keys, self.gpu_order,
                                    _key(self.processes(rows), table.to_numpy(np.int64),
                                         keys.key_array(rows["correlation"])))
        return self.gpu[hit], row, matched


def _key(process: IntArray, table: IntArray | int, correlation: IntArray) -> IntArray:
    """One int64 per (process code, table, correlation id); -1 where either is missing."""
    key = (np.asarray(process) * len(TABLES) + table) * (1 << 40) + np.asarray(correlation)
    return np.where((np.asarray(process) >= 0) & (np.asarray(correlation) >= 0), key, -1)


def _sorted(key: IntArray) -> tuple[IntArray, IntArray]:
    order = np.argsort(key, kind="stable")
    return key[order], order


def _ranges(sorted_keys: IntArray, order: IntArray, wanted: IntArray
            ) -> tuple[IntArray, IntArray, BoolArray]:
    """Each haystack position whose key some `wanted` row has (-1 keys never match), the
    first such row, and which wanted rows found one. A key may name several events (the
    kernels of one CUDA graph launch); each event comes once, so rows that share a key (a
    hostile trace's one correlation id on every kernel and call) cost what the events
    they name cost, not their product."""
    distinct, first = np.unique(wanted, return_index=True)
    first, distinct = first[distinct >= 0], distinct[distinct >= 0]
    low = np.searchsorted(sorted_keys, distinct, side="left")
    count = np.searchsorted(sorted_keys, distinct, side="right") - low
    offset = np.arange(int(count.sum())) - np.repeat(np.cumsum(count) - count, count)
    matched = np.isin(wanted, distinct[count > 0])
    return order[np.repeat(low, count) + offset], np.repeat(first, count), matched


def _matching(haystack: list[IntArray], needles: list[IntArray]) -> IntArray:
    """The haystack positions whose columns all equal some needle's (each once)."""
    names = [f"c{index}" for index in range(len(haystack))]
    left = pd.DataFrame(dict(zip(names, haystack, strict=True))).assign(
        _hay=np.arange(len(haystack[0])))
    right = pd.DataFrame(dict(zip(names, needles, strict=True))).drop_duplicates()
    return left.merge(right, on=names)["_hay"].to_numpy(np.int64)


# --- each cause's events ------------------------------------------------------------

@dataclass(frozen=True)
class Inputs:
    """What the selectors read: the analyzed window (its trace, what the analyzers read,
    and the whole trace, whose rows the idle gaps point into), the analyzers' tables, the
    gap options, the window the replay covers (`sample`, None: everything) and, where
    the window is one batch of a job, the job's short names of its kernels' full names
    (`names.job_short_names`; None: the trace's own, `names.short_names`)."""

    seen: Window
    tables: dict[str, pd.DataFrame]
    gap_options: GapOptions
    sample: tuple[int, int] | None
    shorts: Mapping[str, str] | None = None

    def during(self, start: npt.ArrayLike) -> npt.NDArray[np.bool_]:
        """Which of these start times fall in the replayed window (a sample's rows are
        all a large trace's selectors need to keep)."""
        start = np.asarray(start, dtype=np.int64)
        if self.sample is None:
            return np.ones(len(start), dtype=bool)
        return (start >= self.sample[0]) & (start <= self.sample[1])


Selector = Callable[[Inputs, pd.DataFrame], dict[int, Selection]]


def selections(inputs: Inputs, findings: pd.DataFrame, planned: BoolArray
                ) -> dict[int, Selection]:
    """Each `planned` finding's selection (by position in `findings`), where a fix
    applies."""
    out: dict[int, Selection] = {}
    positions = pd.Series(np.arange(len(findings)), index=findings.index)
    for causes, selector in _SELECTORS:
        mine = findings[findings["cause"].isin(causes).to_numpy(bool) & planned]
        if len(mine):
            picked = selector(inputs, mine.set_axis(positions[mine.index].to_numpy()))
            out.update({index: chosen for index, chosen in picked.items()
                        if len(chosen.rows)})
    return out


def _grouped(findings: pd.DataFrame, rows: pd.DataFrame, key: list[str], fix: str,
             columns: list[str]) -> dict[int, Selection]:
    """Each finding's rows: those whose `key` columns equal the finding's."""
    if rows.empty:
        return {}
    groups = rows.groupby(key, sort=False, dropna=False).indices
    out = {}
    for index, finding in findings.iterrows():  # a few dozen findings
        hit = groups.get(tuple(finding[column] for column in key) if len(key) > 1
                         else finding[key[0]])
        if hit is not None:
            out[int(index)] = Selection(fix, rows.iloc[hit][columns].reset_index(drop=True))
    return out


def _sync_calls(inputs: Inputs, findings: pd.DataFrame) -> dict[int, Selection]:
    """A sync site's finding: its blocking calls return at once."""
    from gpudiag.analyzers.sync import classified_waits, kind_of

    waits = classified_waits(inputs.seen.trace, **inputs.gap_options.kwargs())
    waits = waits.assign(rank=keys.key_array(waits["rank"]),
                         kind=[kind_of(kind) for kind in waits["kind"].astype(str)])
    return _grouped(findings, waits, ["where", "kind"], "no_wait",
                    ["rank", "pid", "tid", "start_ns", "correlation"])


def _gap_fixes(inputs: Inputs, findings: pd.DataFrame) -> dict[int, Selection]:
    """An idle-gap finding (`host_gaps` pieces of one cause, call site and whether the
    work was queued): launches at a graph's cost (launch_bound), the host sections of the
    gaps gone (host_bound), the queued work free of its dependency."""
    pieces = inputs.tables.get("host_gaps")
    if pieces is None or pieces.empty:
        return {}
    pieces = pieces[inputs.during(pieces["start_ns"])]
    dependency = ((pieces["rule"] == "queued") & (pieces["cause"] == "host_bound")
                  ).to_numpy(bool)
    nexts = _next_work(inputs.seen.whole, pieces)
    pieces = pieces.assign(rank=keys.key_array(pieces["rank"]), dependency=dependency,
                           **nexts)
    findings = findings.assign(dependency=(findings["kind"] == "dependency")
                               .fillna(False).to_numpy(bool))
    key = ["cause", "where", "dependency"]
    out = {}
    for cause, fix, wanted in (("launch_bound", "graph_launch", False),
                               ("host_bound", "no_dependency", True),
                               ("host_bound", "no_host_time", False)):
        rows = pieces[(pieces["cause"] == cause).to_numpy(bool) & (dependency == wanted)]
        if fix != "no_host_time":
            rows = rows[rows["correlation"] >= 0]
        if fix == "no_host_time":
            columns = ["rank", "pid", "tid", "start_ns", "end_ns"]
        else:
            rows = rows.assign(pid=rows["next_pid"], gap_ns=rows["end_ns"] - rows["start_ns"])
            columns = ["rank", "pid", "correlation", "table", "gap_ns"]
        mine = findings[(findings["cause"] == cause).to_numpy(bool)
                        & (findings["dependency"] == wanted).to_numpy(bool)]
        out.update(_grouped(mine, rows, key, fix, columns))
    return out


def _next_work(trace: Trace, pieces: pd.DataFrame) -> dict[str, object]:
    """The pid and correlation id of the GPU work after each gap piece (-1: none)."""
    correlation = np.full(len(pieces), keys.MISSING, dtype=np.int64)
    pid = keys.key_array(pieces["pid"])
    row = keys.key_array(pieces["next_row"])
    table = pieces["next_table"].astype(object).to_numpy()
    for name in ("kernels", "copies"):
        hit = (table == name) & (row >= 0)
        frame = getattr(trace, name)
        if hit.any() and len(frame):
            correlation[hit] = keys.key_array(frame["correlation"])[row[hit]]
            pid[hit] = keys.key_array(frame["pid"])[row[hit]]
    return {"correlation": correlation, "next_pid": pid, "table": table}


def _host_sections(inputs: Inputs, findings: pd.DataFrame) -> dict[int, Selection]:
    """A host-time finding of host_steps: its category's time (or one op's self time) on
    each process's training thread, in the steady steps, gone."""
    from gpudiag.analyzers.host.steps import CAUSES, lanes

    out = {}
    trace = inputs.seen.trace
    found = lanes(trace)
    ranges = trace.ranges
    threads = pd.DataFrame({"rank": keys.key_array(ranges["rank"]),
                            "pid": keys.key_array(ranges["pid"]),
                            "tid": keys.key_array(ranges["tid"])})
    by_thread = threads.groupby(["rank", "pid", "tid"], sort=False).indices
    by_process = threads.groupby(["rank", "pid"], sort=False).indices
    for index, finding in findings.iterrows():
        parts = []
        for lane in found:
            if finding["cause"] == "host_op":
                rows = by_process.get((lane.rank, lane.pid)) if lane.tid is None else \
                    by_thread.get((lane.rank, lane.pid, lane.tid))
                if rows is None:
                    continue
                spans = iv.intersect(_self_spans(ranges.iloc[rows], str(finding["where"])),
                                     iv.union(lane.steady["start_ns"], lane.steady["end_ns"]))
            elif finding["cause"] in CAUSES:
                spans = lane.time_of(CAUSES[str(finding["cause"])])
            else:
                continue
            tid = keys.MISSING if lane.tid is None else lane.tid
            parts.append(pd.DataFrame({"rank": lane.rank, "pid": lane.pid, "tid": tid,
                                       "start_ns": spans[0], "end_ns": spans[1]}))
        rows = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()
        if len(rows):
            out[int(index)] = Selection("no_host_time", rows)
    return out


def _self_spans(thread: pd.DataFrame, name: str) -> iv.Spans:
    """When ops named `name` ran on the thread (its ranges) outside the ranges nested in
    them."""
    named = (thread["name"].astype(str) == name).to_numpy(bool)
    spans = iv.union(thread["start_ns"].to_numpy(np.int64)[named],
                     thread["end_ns"].to_numpy(np.int64)[named])
    others = thread[~named]
    start, end = others["start_ns"].to_numpy(np.int64), others["end_ns"].to_numpy(np.int64)
    inside = iv.overlap(start, end, spans) == end - start
    return iv.subtract(spans, iv.union(start[inside], end[inside]))


def _small_grids(inputs: Inputs, findings: pd.DataFrame) -> dict[int, Selection]:
    """A small-grid or tail finding: its launches run at full-wave efficiency."""
    from gpudiag.analyzers.kernels.launch import idle_launches, occupancy
    from gpudiag.names import short_names

    trace = inputs.seen.trace
    kernels = trace.kernels
    if kernels.empty:
        return {}
    chosen, where = idle_launches(trace, inputs.shorts)
    inside = inputs.during(kernels["start_ns"].to_numpy(np.int64)[chosen])
    chosen, where = chosen[inside], where[inside]
    if not len(chosen):
        return {}
    found = occupancy(trace).iloc[chosen]
    mine = kernels.iloc[chosen]
    waves = found["waves"].to_numpy(np.float64)
    rows = pd.DataFrame({
        "rank": keys.key_array(mine["rank"]), "pid": keys.key_array(mine["pid"]),
        "correlation": keys.key_array(mine["correlation"]), "table": "kernels",
        "factor": found["tail_efficiency"].to_numpy(np.float64), "where": where,
        "kind": np.where(waves < 1, "small_grid", "tail"),
        "subject": (short_names(mine["name"]) if inputs.shorts is None
                    else mine["name"].astype(str).map(inputs.shorts)).astype(object).to_numpy()})
    # one finding per (kernel, call site, part of the grid)
    return _grouped(findings, rows, ["where", "kind", "subject"], "full_wave",
                    ["rank", "pid", "correlation", "table", "factor"])


def _copy_calls(inputs: Inputs, findings: pd.DataFrame) -> dict[int, Selection]:
    """A copy finding: the calls of its copies do not block the host."""
    from gpudiag.analyzers.copies import problem_copies, problem_sites

    if inputs.seen.trace.copies.empty:
        return {}
    rows = problem_copies(inputs.seen.trace)
    problem, site = problem_sites(rows)
    flagged = problem != ""
    rows = pd.DataFrame({"rank": keys.key_array(rows["rank"]), "pid": keys.key_array(rows["pid"]),
                         "correlation": keys.key_array(rows["correlation"]),
                         "where": site.to_numpy(dtype=object),
                         "kind": problem})[flagged]
    return _grouped(findings, rows, ["where", "kind"], "no_wait",
                    ["rank", "pid", "correlation"])


def _collectives(inputs: Inputs, findings: pd.DataFrame) -> dict[int, Selection]:
    """A comm_wait finding: its calls without their wait for late peers; an exposed-comm
    finding: its calls hidden under compute. Slow-transport findings have no fix here."""
    from gpudiag.analyzers.collectives.calls import finding_name

    trace = inputs.seen.trace
    calls = trace.collectives[trace.collectives["kernel_id"].notna().to_numpy(bool)]
    if calls.empty:
        return {}
    at = pd.Index(trace.kernels["kernel_id"]).get_indexer(calls["kernel_id"])
    calls, kernels = calls[at >= 0], trace.kernels.iloc[at[at >= 0]]
    dur = (kernels["end_ns"] - kernels["start_ns"]).to_numpy(np.int64)
    skew = inputs.tables.get("arrival_skew")
    wait = np.zeros(len(calls), dtype=np.int64)
    if skew is not None and len(skew):
        known = skew[~skew["clock_suspect"].fillna(False).to_numpy(bool)
                     & skew["kernel_id"].notna().to_numpy(bool)].drop_duplicates("kernel_id")
        wait = calls["kernel_id"].map(known.set_index("kernel_id")["wait_ns"]).fillna(0) \
            .to_numpy(np.int64)
    # a finding names one (communicator, op): its subject
    pair, pairs = pd.MultiIndex.from_arrays([calls["comm"].astype(object),
                                             calls["op"].astype(object)]).factorize()
    names = [finding_name(comm if pd.notna(comm) else "", op) for comm, op in pairs]
    rows = pd.DataFrame({
        "rank": keys.key_array(kernels["rank"]), "pid": keys.key_array(kernels["pid"]),
        "correlation": keys.key_array(kernels["correlation"]), "table": "kernels",
        "pair": pair, "wait": wait, "dur": dur})
    columns = ["rank", "pid", "correlation", "table", "factor"]
    out = {}
    for index, finding in findings.iterrows():
        named = [code for code, name in enumerate(names) if name == finding["subject"]]
        if finding["kind"] == "comm_wait":
            hit = rows[rows["pair"].isin(named).to_numpy(bool) & (rows["wait"] > 0).to_numpy(bool)]
            factor = 1 - hit["wait"] / hit["dur"].clip(lower=1)
            fix = "no_peer_wait"
        elif finding["kind"] == "comm_exposed":
            hit = rows[rows["pair"].isin(named).to_numpy(bool)]
            factor = pd.Series(0.0, index=hit.index)
            fix = "hidden_comm"
        else:
            continue
        if len(hit):
            out[int(index)] = Selection(fix, hit.assign(factor=factor.clip(lower=0))[columns]
                                        .reset_index(drop=True))
    return out


_SELECTORS: tuple[tuple[tuple[str, ...], Selector], ...] = (
    (("sync_stall",), _sync_calls),
    (("launch_bound", "host_bound"), _gap_fixes),
    (("host_data_loading", "host_python_overhead", "host_optimizer", "host_compile",
      "host_op", "host_off_cpu"), _host_sections),
    (("small_grid",), _small_grids),
    (("copy",), _copy_calls),
    (("comm_wait", "comm"), _collectives),
)
