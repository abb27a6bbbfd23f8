"""Streaming a Chrome-trace JSON file (Kineto, JAX Perfetto) as chunks of decoded events.

A 54 MB Kineto trace held whole costs its text plus a Python object per event, about four
times the file. Here the gzip stream is inflated a block at a time, the `traceEvents` array is
cut into pieces of a few MB at event boundaries, and each piece is decoded with msgspec and
handed to the caller, who keeps only compact columns; the piece's text and objects are freed
before the next one is read. Memory stays near one piece plus the columns, whatever the size.

Cutting: a boundary is `}` `,` `{` between two events (any whitespace between). The same bytes
can occur inside a string or a nested object; a piece cut there is never valid JSON (a string
or a bracket is left open), so its decode fails and the cut is retried past twice the piece's
length (never once per false boundary: a 1 MB name of `},{` would cost 300,000 decodes). An
event longer than MAX_EVENT_BYTES is an InputError.
The keys around the array (`deviceProperties`, `baseTimeNanoseconds`, ...) are decoded at the
end from the text before and after it. The top-level array form of the Chrome format works too.
"""

from __future__ import annotations

import os
import queue
import re
import threading
import zlib
from collections.abc import Generator, Iterator
from pathlib import Path
from typing import BinaryIO

import msgspec

from gpudiag.errors import InputError
from gpudiag.readers.chrome.structs import Document, Event, invalid_json, no_events, not_a_trace
from gpudiag.readers.files import (
    GZIP_MAGIC,
    READ_BYTES,
    Inflater,
    budget,
    damaged,
    size_text,
)

PIECE_BYTES = 1 << 20
#: files this large on disk or larger are read and inflated by a thread of their own
THREAD_BYTES = 2 << 20
#: the longest event (or header before the events) read; GPUDIAG_MAX_EVENT_BYTES raises it
MAX_EVENT_BYTES = 64 << 20
#: the most events one trace may hold; GPUDIAG_MAX_EVENTS raises it
MAX_EVENTS = 20_000_000
_BOUNDARY = re.compile(rb"\}\s*,\s*\{")
_EVENTS_KEY = re.compile(rb'"traceEvents"\s*:\s*\[')
_TRAILING = re.compile(r"trailing characters \(byte (\d+)\)")
_PIECE = msgspec.json.Decoder(list[Event])
_HEADER = msgspec.json.Decoder(Document)
_TAIL = msgspec.json.Decoder(dict)


class ChromeTraceStream:
    """Iterate `pieces()` for lists of events; afterwards `header` holds the other keys.

        stream = ChromeTraceStream(path)
        for events in stream.pieces():
            ...
        stream.header.deviceProperties
    """

    def __init__(self, path: Path, piece_bytes: int = PIECE_BYTES) -> None:
        self.path = path
        self.piece_bytes = piece_bytes
        self.max_event_bytes = budget("GPUDIAG_MAX_EVENT_BYTES", MAX_EVENT_BYTES)
        self.max_events = budget("GPUDIAG_MAX_EVENTS", MAX_EVENTS)
        self.header = Document()
        self._text = _Text(path)

    def pieces(self) -> Iterator[list[Event]]:
        try:
            prefix = self._find_array()
            if prefix is None:  # the top-level array form: no header
                yield from self._counted(self._events(array_form=True))
                return
            yield from self._counted(self._events(array_form=False))
            rest = self._text.rest()
            self.header = self._decode_header(prefix + b'"traceEvents": []' + rest)
        finally:
            self._text.close()

    def _counted(self, pieces: Iterator[list[Event]]) -> Iterator[list[Event]]:
        """The pieces, until more than `max_events` events in all: reading an event costs
        about 1 µs however small it is, and 400 MB of `{},` is 130 million of them."""
        count = 0
        for events in pieces:
            count += len(events)
            if count > self.max_events:
                raise InputError(
                    self.path, f"holds more than {self.max_events:,} events (real traces of a "
                    "GB hold a few million)", "if it is a real profile, raise the budget: "
                    "GPUDIAG_MAX_EVENTS=<count>, or record fewer steps")
            yield events

    def _find_array(self) -> bytes | None:
        """Consume the text up to the first event; the header text before it, or None for
        the array form. Each byte is searched once (a key cut by a block edge is found from
        the last few bytes searched)."""
        text = self._text
        scanned = 0
        while True:
            stripped = bytes(text.buf[:64]).lstrip(b"\xef\xbb\xbf \t\r\n")
            if stripped.startswith(b"["):
                text.consume(text.buf.index(b"[") + 1)
                return None
            match = _EVENTS_KEY.search(text.buf, scanned)
            if match:
                prefix = bytes(text.buf[: match.start()])
                text.consume(match.end())
                return prefix
            scanned = max(0, len(text.buf) - 64)
            if len(text.buf) > self.max_event_bytes:
                raise self._too_long("a header before 'traceEvents'")
            if not text.more():
                return self._no_events()

    def _no_events(self) -> bytes:
        """The whole text has no traceEvents array: say what it is instead."""
        doc = self._decode_header(bytes(self._text.buf))
        if doc.traceEvents is None:
            raise no_events(self.path)
        raise not_a_trace(self.path, ValueError("'traceEvents' is not a list"))

    def _events(self, array_form: bool) -> Iterator[list[Event]]:
        """Pieces cut at the first boundary past `piece_bytes`. A cut that fails to decode
        (a `},{` inside a string) is retried past twice its length, so a run of false
        boundaries costs a few decodes of the piece, never one per boundary; and a boundary
        search resumes where the last one stopped. Both keep the splitter linear."""
        text = self._text
        scanned = self.piece_bytes
        while True:
            cut = _BOUNDARY.search(text.buf, scanned) if scanned < len(text.buf) else None
            if cut is None:
                scanned = max(scanned, len(text.buf) - 16)  # a boundary may span the edge
                if len(text.buf) > self.piece_bytes + self.max_event_bytes:
                    raise self._too_long("an event")
                if text.more():
                    continue
                yield from self._last_piece(array_form)
                return
            events = self._try(text.bracketed(cut.start() + 1))
            if events is None:  # a false boundary, inside a string or a nested object
                if cut.end() > self.piece_bytes + self.max_event_bytes:
                    raise self._too_long("an event")
                scanned = min(2 * cut.end(), self.piece_bytes + self.max_event_bytes)
                continue
            text.consume(cut.end() - 1)
            scanned = self.piece_bytes
            yield events

    def _too_long(self, what: str) -> InputError:
        return InputError(
            self.path, f"holds {what} longer than {size_text(self.max_event_bytes)} "
            "(a damaged or hostile file: real events are a few KB)",
            "if it is a real profile, raise the budget: GPUDIAG_MAX_EVENT_BYTES=<bytes>")

    def _last_piece(self, array_form: bool) -> Iterator[list[Event]]:
        """The events after the last boundary, up to the `]` that closes the array.

        Usually the text after the array's `]` is the rest of the header (`}`, or
        `, "key": ...}`): `_closing_bracket` finds it from the end and the events are
        decoded once. Otherwise decoding "[" + rest stops at that `]` and reports the offset
        of what trails it, which is where the array ends (a second decode, cut there).
        """
        text = self._text
        data = b"[" + bytes(text.buf)
        events: list[Event] | None
        end = None if array_form else _closing_bracket(data)
        if end is not None:  # the array's end found from the header after it: one decode
            events = self._try(memoryview(data)[:end + 1])
            if events is not None:
                text.consume(end)
                yield events
                return
        try:
            events = _PIECE.decode(data)
            trail = len(data)
        except msgspec.ValidationError as exc:
            raise not_a_trace(self.path, exc) from exc
        except msgspec.DecodeError as exc:
            trailing = _TRAILING.search(str(exc))
            if trailing is None or array_form:
                raise invalid_json(self.path, exc) from exc
            trail = int(trailing.group(1)) - 1  # msgspec counts from 1
            events = self._try(b"[" + data[1:trail].rstrip().removesuffix(b"]") + b"]")
            if events is None:
                raise invalid_json(self.path, exc) from exc
        text.consume(trail - 1)
        yield events

    def _try(self, piece: bytes | bytearray | memoryview) -> list[Event] | None:
        """The events of `piece` (a JSON array), or None when it is not valid JSON."""
        try:
            return _PIECE.decode(piece)
        except msgspec.ValidationError as exc:
            raise not_a_trace(self.path, exc) from exc
        except msgspec.DecodeError:
            return None

    def _decode_header(self, text: bytes) -> Document:
        try:
            return _HEADER.decode(text)
        except msgspec.ValidationError as exc:
            raise not_a_trace(self.path, exc) from exc
        except msgspec.DecodeError as exc:
            raise invalid_json(self.path, exc) from exc


def _closing_bracket(data: bytes, tries: int = 8) -> int | None:
    """The position of the `]` that most likely closes the events array: the last one
    after which the text is the rest of the header object (`}`, or `, "key": ...}`, checked
    by decoding it, a few bytes). None when none of the last `tries` `]` is (a header with
    lists after the array): the caller then lets the decoder find the end."""
    position = len(data)
    for _ in range(tries):
        position = data.rfind(b"]", 0, position)
        if position <= 0:
            return None
        tail = data[position + 1:].strip()
        if tail == b"}":
            return position
        if tail.startswith(b","):
            try:
                _TAIL.decode(b"{" + tail[1:])
            except msgspec.DecodeError:
                continue
            return position
    return None


class _Text:
    """The decompressed text of a file, as a sliding buffer filled a block at a time.

    A large file is read and inflated by a background thread while the caller decodes the
    previous block: zlib releases the GIL while it inflates, so on two cores gunzip costs
    almost no wall time. A bounded queue keeps at most a few blocks ahead. A small file
    (under `THREAD_BYTES` on disk) is read in the caller's thread: its inflation takes a
    few ms, less than starting a thread and handing it every block (and in a job's
    workers, one per core, there is no idle core for the thread anyway).
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self.buf = bytearray()
        try:
            file = path.open("rb")
            size = os.fstat(file.fileno()).st_size
        except OSError as exc:
            raise InputError(path, f"cannot be read ({exc.strerror or exc})") from exc
        self._file = file
        self._source = self._texts(file, size)
        self._done = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if size >= THREAD_BYTES:
            self._blocks: queue.Queue[bytes | InputError | None] = queue.Queue(maxsize=2)
            self._thread = threading.Thread(target=self._produce, daemon=True)
            self._thread.start()

    def _texts(self, file: BinaryIO, size: int) -> Generator[bytes, None, None]:
        """The file's text a block at a time; a read or gzip error as an InputError."""
        try:
            with file:
                block = file.read(2)
                inflater = Inflater(self.path, size) if block == GZIP_MAGIC else None
                while block:
                    if inflater is None:
                        yield block
                    else:
                        yield from inflater.feed(block)
                    block = file.read(READ_BYTES)
                if inflater is not None:
                    inflater.finish()
        except zlib.error as exc:
            raise damaged(self.path, exc) from None
        except OSError as exc:
            raise InputError(self.path, f"cannot be read ({exc.strerror or exc})") from None

    def _produce(self) -> None:
        """The reader thread: every block into the queue, then None (or the error)."""
        try:
            for text in self._source:
                self._put(text)
                if self._stop.is_set():
                    self._source.close()
                    return
        except InputError as exc:
            self._put(exc)
        self._put(None)

    def _put(self, item: bytes | InputError | None) -> None:
        while not self._stop.is_set():
            try:
                self._blocks.put(item, timeout=0.1)
                return
            except queue.Full:
                continue

    def more(self) -> bool:
        """Append the next block; False at the end of the file."""
        while not self._done:
            item = self._next()
            if item is None:
                self._done = True
            elif isinstance(item, InputError):
                self._done = True
                raise item
            elif item:
                self.buf += item
                return True
        return False

    def _next(self) -> bytes | InputError | None:
        if self._thread is not None:
            return self._blocks.get()
        try:
            return next(self._source)
        except StopIteration:
            return None
        except InputError as exc:
            return exc

    def close(self) -> None:
        """Stop the reader (when the caller gives up before the end)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        else:
            self._source.close()
            self._file.close()  # also when the generator never started

    def consume(self, count: int) -> None:
        del self.buf[:count]

    def bracketed(self, count: int) -> bytearray:
        """'[' + the first `count` bytes + ']', a copy (decoded events keep references into it)."""
        piece = bytearray(count + 2)
        piece[0], piece[-1] = 0x5B, 0x5D  # [ and ]
        piece[1:-1] = self.buf[:count]
        return piece

    def rest(self) -> bytes:
        """Everything not consumed yet, reading to the end of the file."""
        while self.more():
            pass
        return bytes(self.buf)
