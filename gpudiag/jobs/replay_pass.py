"""A job's expected savings: its findings' events selected where each batch is read, the
replay run where the job is reduced, on the rows the batches sent.

A saving is a replay of the job's schedule without one finding's cause (see
`critical.savings`). Its ranks are tied through their matched collectives, so the job is
replayed as one: the coordinator chooses the sample (`sample.sample_of`, from the ranks'
extents of the first pass), sends each batch the findings and the job's arrival skew of
its kernels (`asks`), and each batch, read a second time with the warm-up pass when there
is one, selects its events of each finding and sends the rows its replay needs over the
sample (`parts.savings_part`: a few tens of thousands of events, whatever the job's
size). `replayed` merges those rows as `gpudiag.load` would merge the ranks and replays
them: the merged diagnosis' savings, to the nanosecond.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pandas as pd

from gpudiag.analyzers.collectives.skew import arrival_skew
from gpudiag.analyzers.critical import savings
from gpudiag.analyzers.critical.sample import Sample, sample_of
from gpudiag.analyzers.pipeline.answer import Diagnosis
from gpudiag.analyzers.pipeline.parts import SavingsAsk
from gpudiag.analyzers.pipeline.reduce import collectives_trace
from gpudiag.jobs.rank_map import BatchPart
from gpudiag.names import job_short_names
from gpudiag.trace import merge

#: the arrival skew's columns a comm_wait finding's fix reads
SKEW_COLUMNS = ["kernel_id", "wait_ns", "clock_suspect"]


@dataclass(frozen=True)
class Plan:
    """The job's savings plan: the findings (joined, before ranking), which are planned,
    the replay's sample, and each batch's ask (in batch order)."""

    findings: pd.DataFrame
    sample: Sample
    asks: list[SavingsAsk]
    #: the arrival skew of the job's whole collectives (the replay ties ranks by all their
    #: matched calls, as a merged trace's replay does; the Diagnosis' table is the window's)
    skew: pd.DataFrame | None


def plan(batches: Sequence[BatchPart], findings: pd.DataFrame, dx: Diagnosis) -> Plan:
    """What each batch is asked (see the module docstring); notes go to `dx.notes`."""
    extents = [batch.group.extent for batch in batches
               if batch.group is not None and batch.group.extent is not None]
    found = None
    for one in extents:
        found = one if found is None else found.joined(one)
    sample = sample_of(found, dx.steps)
    planned = savings.most_lost(findings, dx.notes)
    skew = dx.tables.get("arrival_skew")
    shorts = job_short_names([batch.group.kernel_names for batch in batches
                              if batch.group is not None])
    asks, offset = [], 0
    for batch in batches:
        mine = None
        if skew is not None and len(skew):
            ids = skew["kernel_id"]
            inside = ((ids >= offset) & (ids < offset + batch.kernel_span)).fillna(False)
            mine = skew.loc[inside.to_numpy(bool), SKEW_COLUMNS].assign(
                kernel_id=lambda rows, at=offset: rows["kernel_id"] - at)
        asks.append(SavingsAsk(findings, planned, sample, mine, shorts))
        if batch.group is not None:
            offset += batch.kernel_span
    ranks, offset = [], 0
    for batch in batches:
        if batch.group is not None:
            ranks.append((offset, batch.group))
            offset += batch.kernel_span
    calls = collectives_trace(ranks, dx.meta)
    return Plan(findings, sample, asks, arrival_skew(calls) if len(calls.collectives) else None)


def replayed(job: Plan, again: Sequence[BatchPart | None], batches: Sequence[BatchPart],
             dx: Diagnosis) -> pd.DataFrame:
    """The findings with their savings, from each batch's answer (`again`, in batch
    order; None: the batch was lost on the second pass, and no saving is replayed)."""
    answers = [batch.savings if batch is not None else None for batch in again]
    if any(answer is None for answer in answers):
        dx.notes.append("expected savings not computed: a batch of the job's files could "
                        "not be read a second time for the replay")
        return savings.replayed(None, job.findings, {}, job.sample, dx.steps)
    chosen: dict[int, savings.Selection] = {}
    rows, offsets, offset, count = [], [], 0, 0
    for batch, answer in zip(batches, answers, strict=True):
        assert answer is not None
        count += answer.count
        for index, selection in answer.chosen.items():
            known = chosen.get(index)
            chosen[index] = selection if known is None else savings.Selection(
                known.fix, pd.concat([known.rows, selection.rows], ignore_index=True))
        if answer.rows is not None:
            rows.append(answer.rows)
            offsets.append(offset)
        if batch.group is not None:
            offset += batch.kernel_span
    if job.sample.what and chosen:
        dx.notes.append(job.sample.note(count))
    replay = None
    if chosen:
        from gpudiag.analyzers.critical.replay import Replay

        replay = Replay.of(merge(rows, offsets), job.sample.window, skew=job.skew)
    return savings.replayed(replay, job.findings, chosen, job.sample, dx.steps)
