"""A minimal protobuf wire-format walker for XSpace (`.xplane.pb`), with no dependency.

The XSpace schema (tsl/profiler/protobuf/xplane.proto) is small and stable, so instead of
requiring `protobuf` and generated classes we walk the wire format ourselves and keep only
the fields gpudiag uses (field numbers):

    XSpace         1 planes, 2 errors, 3 warnings, 4 hostnames
    XPlane         1 id, 2 name, 3 lines, 4 event_metadata (map), 5 stat_metadata (map), 6 stats
    XLine          1 id, 10 display_id, 2 name, 11 display_name, 3 timestamp_ns, 9 duration_ps,
                   4 events
    XEvent         1 metadata_id, 2 offset_ps | 5 num_occurrences, 3 duration_ps, 4 stats
    XStat          1 metadata_id, 2 double, 3 uint64, 4 int64, 5 str, 6 bytes, 7 ref
    XEventMetadata 1 id, 2 name, 4 display_name, 5 stats
    XStatMetadata  1 id, 2 name

This module holds the primitives and the per-event hot loop (lines, events, stats);
`xplane_space` walks the outer messages. Events are kept as parallel lists per line (no
object per event): the per-event loop is the whole cost of reading a file, so it does as
little as possible.

Every malformed input ends in `WireError` (a length past the end, an unknown wire type, a
varint that does not stop) or in an IndexError/struct.error from reading past the buffer,
which `xplane_space.parse_space` turns into WireError; the reader turns that into an
InputError naming the file.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Any

_DOUBLE = struct.Struct("<d")
_INT64_SIGN = 1 << 63
_UINT64 = 1 << 64
_UINT64_MASK = _UINT64 - 1  # a 10-byte varint can carry bits past 64: drop them as protobuf does

Stats = dict[Any, Any]  # stat name (or the raw id, when the name is missing) -> value
StatCache = dict[bytes, tuple[Any, Any]]  # encoded XStat -> (name, value)


class WireError(ValueError):
    """The bytes are not a well-formed XSpace message."""


@dataclass(slots=True)
class Line:
    """One XLine: a thread on the host, a stream or a derived timeline on a device.

    Events are columns: `metadata_ids[i]`, `offsets_ps[i]`, `durations_ps[i]`, `stats[i]`
    (None when the event has no stats of its own).
    """

    id: int = 0
    display_id: int = 0
    name: str = ""
    display_name: str = ""
    timestamp_ns: int = 0
    duration_ps: int = 0
    metadata_ids: list[int] = field(default_factory=list)
    offsets_ps: list[int] = field(default_factory=list)
    durations_ps: list[int] = field(default_factory=list)
    stats: list[Stats | None] = field(default_factory=list)
    aggregated: int = 0  # events with num_occurrences instead of a time: not on the timeline

    @property
    def label(self) -> str:
        """The name a viewer shows: the display name when there is one."""
        return self.display_name or self.name


# -- primitives ---------------------------------------------------------------------------


def varint(buf: bytes, pos: int) -> tuple[int, int]:
    """(value, next position) of the unsigned varint at `pos`."""
    byte = buf[pos]
    if byte < 0x80:
        return byte, pos + 1
    result = byte & 0x7F
    shift = 7
    pos += 1
    while True:
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result & _UINT64_MASK, pos
        shift += 7
        if shift > 63:
            raise WireError("varint longer than 10 bytes")


def int64(value: int) -> int:
    """Reinterpret a decoded varint as a two's-complement int64 (negative ids, offsets)."""
    return value - _UINT64 if value >= _INT64_SIGN else value


def length(buf: bytes, pos: int, end: int) -> tuple[int, int]:
    """(end of the length-delimited field at `pos`, its start); checked against `end`."""
    size, pos = varint(buf, pos)
    stop = pos + size
    if stop > end:
        raise WireError("length-delimited field runs past the end of its message")
    return stop, pos


def skip(buf: bytes, pos: int, end: int, tag: int) -> int:
    """Position after the value of a field we do not use."""
    if tag < 8:  # field number 0 does not exist: zeros or garbage, stop before walking it
        raise WireError("field number 0 (the bytes are zeros or garbage, not a message)")
    wire = tag & 7
    if wire == 0:
        return varint(buf, pos)[1]
    if wire == 2:
        return length(buf, pos, end)[0]
    if wire == 1:
        pos += 8
    elif wire == 5:
        pos += 4
    else:
        raise WireError(f"unsupported wire type {wire}")
    if pos > end:
        raise WireError("fixed-size field runs past the end of its message")
    return pos


def tag_at(buf: bytes, pos: int) -> tuple[int, int]:
    byte = buf[pos]
    return (byte, pos + 1) if byte < 0x80 else varint(buf, pos)


def text(buf: bytes, start: int, stop: int) -> str:
    return buf[start:stop].decode("utf-8", "replace")


def check_end(pos: int, end: int) -> None:
    if pos != end:
        raise WireError("field runs past the end of its message")


# -- lines, events, stats ----------------------------------------------------------------


def decode_stat(  # noqa: PLR0912
    buf: bytes, pos: int, end: int, names: dict[int, str]
) -> tuple[Any, Any]:
    """(name, value) of one XStat; a ref value is the name of the stat metadata it points
    to (how XLA interns repeated strings such as kernel_details).

    This runs for every stat of every event, so one-byte varints and lengths (most ids,
    refs and strings) are decoded in place instead of through `varint`. Reading the byte
    after a tag cannot go wrong: every field has at least one, and a varint or length that
    runs past `end` is caught by the checks below."""
    mid = 0
    value: Any = None
    while pos < end:
        tag = buf[pos]
        next_byte = buf[pos + 1]
        if tag == 0x08:
            if next_byte < 0x80:
                mid = next_byte
                pos += 2
            else:
                mid, pos = varint(buf, pos + 1)
                mid = int64(mid)  # map keys are int64: negative ids must match them
        elif tag in {0x38, 0x18, 0x20}:
            if next_byte < 0x80:
                raw = next_byte
                pos += 2
            else:
                raw, pos = varint(buf, pos + 1)
            if tag == 0x38:
                value = names.get(raw, names.get(int64(raw), raw))
            else:
                value = raw - _UINT64 if tag == 0x20 and raw >= _INT64_SIGN else raw
        elif tag in {0x2A, 0x32}:
            if next_byte < 0x80:
                start = pos + 2
                stop = start + next_byte
                if stop > end:
                    raise WireError("string runs past the end of its stat")
            else:
                stop, start = length(buf, pos + 1, end)
            value = buf[start:stop].decode("utf-8", "replace") if tag == 0x2A else buf[start:stop]
            pos = stop
        elif tag == 0x11:
            if pos + 9 > end:
                raise WireError("double runs past the end of its stat")
            value = _DOUBLE.unpack_from(buf, pos + 1)[0]
            pos += 9
        else:
            tag, pos = tag_at(buf, pos)
            pos = skip(buf, pos, end, tag)
    if pos != end:
        raise WireError("stat runs past the end of its message")
    return names.get(mid, mid), value


def decode_line(
    buf: bytes, pos: int, end: int, names: dict[int, str], cache: StatCache
) -> Line:
    """One XLine with its events appended to its columns (no object per event)."""
    line = Line()
    mids, offs, durs, stats = line.metadata_ids, line.offsets_ps, line.durations_ps, line.stats
    while pos < end:
        tag = buf[pos]
        pos += 1
        if tag == 0x22:
            stop, start = length(buf, pos, end)
            metadata_id, off, dur, ev_stats, timed = _event(buf, start, stop, names, cache)
            if timed:
                mids.append(metadata_id)
                offs.append(off)
                durs.append(dur)
                stats.append(ev_stats)
            else:
                line.aggregated += 1
            pos = stop
        elif tag == 0x08:
            value, pos = varint(buf, pos)
            line.id = int64(value)
        elif tag == 0x50:
            value, pos = varint(buf, pos)
            line.display_id = int64(value)
        elif tag == 0x18:
            value, pos = varint(buf, pos)
            line.timestamp_ns = int64(value)
        elif tag == 0x48:
            value, pos = varint(buf, pos)
            line.duration_ps = int64(value)
        elif tag in {0x12, 0x5A}:
            stop, start = length(buf, pos, end)
            if tag == 0x12:
                line.name = text(buf, start, stop)
            else:
                line.display_name = text(buf, start, stop)
            pos = stop
        else:
            tag, pos = tag_at(buf, pos - 1)
            pos = skip(buf, pos, end, tag)
    check_end(pos, end)
    return line


def _event(  # noqa: PLR0912
    buf: bytes, pos: int, end: int, names: dict[int, str], cache: StatCache
) -> tuple[int, int, int, Stats | None, bool]:
    """(metadata id, offset ps, duration ps, stats, timed) of one XEvent. Offsets and
    durations stay raw unsigned varints; the reader reinterprets them as int64 in bulk.
    One-byte ids and stat lengths are decoded in place, as in `decode_stat`.

    Most stats repeat byte for byte (the same interned kernel_details ref, group_id 0,
    ...), so each distinct encoding is decoded once per plane: `cache` maps the stat's
    bytes to its (name, value), which are immutable and safe to share."""
    metadata_id = off = dur = 0
    stats: Stats | None = None
    timed = True
    while pos < end:
        tag = buf[pos]
        next_byte = buf[pos + 1]
        if tag == 0x22:
            if next_byte < 0x80:
                start = pos + 2
                stop = start + next_byte
                if stop > end:
                    raise WireError("stat runs past the end of its event")
            else:
                stop, start = length(buf, pos + 1, end)
            raw = buf[start:stop]
            pair = cache.get(raw)
            if pair is None:
                pair = cache[raw] = decode_stat(buf, start, stop, names)
            if stats is None:
                stats = {pair[0]: pair[1]}
            else:
                stats[pair[0]] = pair[1]
            pos = stop
        elif tag == 0x08:
            if next_byte < 0x80:
                metadata_id = next_byte
                pos += 2
            else:
                metadata_id, pos = varint(buf, pos + 1)
                metadata_id = int64(metadata_id)
        elif tag == 0x10:
            off, pos = varint(buf, pos + 1)
        elif tag == 0x18:
            dur, pos = varint(buf, pos + 1)
        elif tag == 0x28:
            pos = varint(buf, pos + 1)[1]
            timed = False
        else:
            tag, pos = tag_at(buf, pos)
            pos = skip(buf, pos, end, tag)
    if pos != end:
        raise WireError("event runs past the end of its message")
    return metadata_id, off, dur, stats, timed
