"""The outer XSpace messages: planes, their metadata and stats (see `xplane_wire`).

A plane serializes its lines (field 3) before the stat names (field 5) that the lines' stats
refer to, so a plane is walked twice: once to find where each part lies and decode the
metadata, then the lines, resolving stat names through one dict per plane.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Any

from gpudiag.readers.xplane.wire import (
    Line,
    StatCache,
    Stats,
    WireError,
    check_end,
    decode_line,
    decode_stat,
    int64,
    length,
    skip,
    tag_at,
    text,
    varint,
)


@dataclass(slots=True)
class EventMetadata:
    """What events of one kind share: their name, display name and stats."""

    name: str = ""
    display_name: str = ""
    stats: Stats = field(default_factory=dict)

    @property
    def label(self) -> str:
        return self.display_name or self.name


@dataclass(slots=True)
class Plane:
    """One XPlane: `/host:CPU`, `/device:GPU:N`, or a metadata plane."""

    id: int = 0
    name: str = ""
    lines: list[Line] = field(default_factory=list)
    event_metadata: dict[int, EventMetadata] = field(default_factory=dict)
    stat_names: dict[int, str] = field(default_factory=dict)
    stats: Stats = field(default_factory=dict)


@dataclass(slots=True)
class Space:
    """A decoded XSpace: its planes and what the profiler reported about the session."""

    planes: list[Plane] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    hostnames: list[str] = field(default_factory=list)


def parse_space(buf: bytes) -> Space:
    """Decode an XSpace; raises WireError on anything malformed or truncated."""
    try:
        return _space(buf)
    except (IndexError, struct.error, RecursionError) as exc:  # read past the end
        raise WireError(f"truncated message ({exc.__class__.__name__})") from exc


def _space(buf: bytes) -> Space:
    space = Space()
    texts = {0x12: space.errors, 0x1A: space.warnings, 0x22: space.hostnames}
    pos, end = 0, len(buf)
    while pos < end:
        tag, pos = tag_at(buf, pos)
        if tag == 0x0A:
            stop, start = length(buf, pos, end)
            space.planes.append(_plane(buf, start, stop))
            pos = stop
        elif tag in texts:
            stop, start = length(buf, pos, end)
            texts[tag].append(text(buf, start, stop))
            pos = stop
        else:
            pos = skip(buf, pos, end, tag)
    check_end(pos, end)
    return space


def _plane(buf: bytes, pos: int, end: int) -> Plane:
    """Locate the parts of a plane, decode its stat names first, then everything else."""
    plane = Plane()
    parts: dict[int, list[tuple[int, int]]] = {0x1A: [], 0x22: [], 0x2A: [], 0x32: []}
    while pos < end:
        tag, pos = tag_at(buf, pos)
        if tag == 0x08:
            value, pos = varint(buf, pos)
            plane.id = int64(value)
        elif tag == 0x12:
            stop, start = length(buf, pos, end)
            plane.name = text(buf, start, stop)
            pos = stop
        elif tag in parts:
            stop, start = length(buf, pos, end)
            parts[tag].append((start, stop))
            pos = stop
        else:
            pos = skip(buf, pos, end, tag)
    check_end(pos, end)
    names = plane.stat_names
    for start, stop in parts[0x2A]:
        key, name = _map_entry(buf, start, stop, _stat_name, names)
        names[key] = name
    for start, stop in parts[0x22]:
        key, meta = _map_entry(buf, start, stop, _event_meta, names)
        plane.event_metadata[key] = meta
    plane.stats = _stats(buf, parts[0x32], names)
    cache: StatCache = {}
    plane.lines = [decode_line(buf, start, stop, names, cache) for start, stop in parts[0x1A]]
    return plane


def _map_entry(buf: bytes, pos: int, end: int, value: Any, names: dict[int, str]) -> Any:
    """(key, decoded value) of one map<int64, Message> entry: field 1 key, field 2 value."""
    key = 0
    decoded = None
    while pos < end:
        tag, pos = tag_at(buf, pos)
        if tag == 0x08:
            key, pos = varint(buf, pos)
        elif tag == 0x12:
            stop, start = length(buf, pos, end)
            decoded = value(buf, start, stop, names)
            pos = stop
        else:
            pos = skip(buf, pos, end, tag)
    check_end(pos, end)
    return int64(key), decoded if decoded is not None else value(buf, 0, 0, names)


def _stat_name(buf: bytes, pos: int, end: int, names: dict[int, str]) -> str:
    """XStatMetadata: only the name (field 2) matters; the id repeats the map key."""
    name = ""
    while pos < end:
        tag, pos = tag_at(buf, pos)
        if tag == 0x12:
            stop, start = length(buf, pos, end)
            name = text(buf, start, stop)
            pos = stop
        else:
            pos = skip(buf, pos, end, tag)
    check_end(pos, end)
    return name


def _event_meta(buf: bytes, pos: int, end: int, names: dict[int, str]) -> EventMetadata:
    meta = EventMetadata()
    stat_spans = []
    while pos < end:
        tag, pos = tag_at(buf, pos)
        if tag in (0x12, 0x22, 0x2A):
            stop, start = length(buf, pos, end)
            if tag == 0x12:
                meta.name = text(buf, start, stop)
            elif tag == 0x22:
                meta.display_name = text(buf, start, stop)
            else:
                stat_spans.append((start, stop))
            pos = stop
        else:
            pos = skip(buf, pos, end, tag)
    check_end(pos, end)
    meta.stats = _stats(buf, stat_spans, names)
    return meta


def _stats(buf: bytes, spans: list[tuple[int, int]], names: dict[int, str]) -> Stats:
    out: Stats = {}
    for start, stop in spans:
        key, value = decode_stat(buf, start, stop, names)
        out[key] = value
    return out
