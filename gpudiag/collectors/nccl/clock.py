"""The `nccl` plugin's GPU clock: CUDA events around each call, placed on `time.time_ns()`.

    gpu = GpuClock(cuda=None, clock=time.time_ns)  # torch.cuda, wrapped at the first call
    started = gpu.start(token, tensor.device)      # before the call; False while capturing
    gpu.end(token); gpu.queue(token)               # after it; later gpu.completed(fail): rows

Kept apart from the wrappers in `nccl_timing` because this is the part that touches
torch.cuda (through `_TorchCuda`, which the tests replace by a fake GPU clock) and the only
one that turns GPU time into epoch time; `nccl_timing` decides when it may be called.

**Clocks.** Event times are relative; to place them on `time.time_ns()` each device has an
anchor: an event recorded on a private stream (nothing queued on it, so no user work is waited
for) and synchronized, between two `time.time_ns()` readings t0 <= GPU time <= t1; the anchor
is their midpoint, its error (t1 - t0) / 2, typically a few µs (best of 3 tries). It is taken
at the first collective on a device and again every 10 s (`REANCHOR_NS`): float32 `elapsed_time`
then rounds by < 0.5 µs, and the GPU timer's drift against the host clock can only build up for
10 s; each new anchor measures that drift (its time as the old anchor predicts it vs. as read).
Error of a start time <= clock_error_ns + clock_drift_ns (both the largest seen, in
`meta["nccl_timing"]`) + ~1 µs; durations come from the start/end pair alone (~0.5 µs).
"""

from __future__ import annotations

import sys
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gpudiag.collectors.nccl.rows import Row, Token

REANCHOR_NS = 10_000_000_000
ANCHOR_TRIES = 3
ANCHOR_GOOD_NS = 20_000


@dataclass(frozen=True)
class Anchor:
    event: Any
    ns: int
    error_ns: int
    taken_ns: int  # monotonic, to know when to take a new one


class _TorchCuda:
    """The torch.cuda calls of the GPU path, in one place (tests pass a fake instead)."""

    def __init__(self, cuda: Any) -> None:
        self._cuda = cuda

    def event(self) -> Any:
        return self._cuda.Event(enable_timing=True)

    def current_stream(self, device: int) -> Any:
        return self._cuda.current_stream(device)

    def new_stream(self, device: int) -> Any:
        return self._cuda.Stream(device=device, priority=-1)  # rarely shared with user streams

    def current_device(self) -> int:
        return int(self._cuda.current_device())

    def capturing(self) -> bool:
        return bool(self._cuda.is_current_stream_capturing())


class GpuClock:
    """One process's GPU timing state: each device's anchor and private stream, the largest
    anchor error and drift seen, and the timed calls whose events may still be pending, one
    queue per (device, stream). No lock of its own: `NcclTiming` calls `queue` and
    `completed` under its lock, the rest in the thread making or completing the call."""

    def __init__(self, cuda: Any, clock: Callable[[], int]) -> None:
        self._cuda = cuda  # None: torch.cuda, wrapped at the first GPU call
        self._clock = clock
        self.anchors: dict[int, Anchor] = {}
        self.streams: dict[int, Any] = {}
        self.pending: dict[tuple[Any, Any], deque[Token]] = {}
        self.error_ns = 0
        self.drift_ns = 0

    def api(self) -> Any:
        if self._cuda is None:
            self._cuda = _TorchCuda(sys.modules["torch"].cuda)
        return self._cuda

    def start(self, token: Token, device: Any) -> bool:
        """Record `token`'s start event on the current stream of `device` (a torch.device);
        False, and nothing recorded, while the stream is capturing a CUDA graph."""
        cuda = self.api()
        if cuda.capturing():
            return False
        index = cuda.current_device() if device.index is None else int(device.index)
        token.anchor = self.anchor(cuda, index)
        stream = cuda.current_stream(index)
        token.device, token.stream = index, int(stream.stream_id)
        token.start = cuda.event()
        token.start.record(stream)
        return True

    def end(self, token: Token) -> None:
        cuda = self.api()
        assert token.device is not None
        event = cuda.event()
        event.record(cuda.current_stream(token.device))
        token.ends.append(event)

    def anchor(self, cuda: Any, device: int) -> Anchor:
        """The device's anchor, taken anew every REANCHOR_NS; the old one's prediction of the
        new one's time measures the GPU timer's drift against the host clock meanwhile."""
        old = self.anchors.get(device)
        if old is not None and time.monotonic_ns() - old.taken_ns <= REANCHOR_NS:
            return old
        if device not in self.streams:
            self.streams[device] = cuda.new_stream(device)
        anchor = _take_anchor(cuda, self.streams[device], self._clock)
        self.anchors[device] = anchor
        self.error_ns = max(self.error_ns, anchor.error_ns)
        if old is not None:
            predicted = old.ns + round(old.event.elapsed_time(anchor.event) * 1e6)
            self.drift_ns = max(self.drift_ns, abs(anchor.ns - predicted))
        return anchor

    def queue(self, token: Token) -> None:
        self.pending.setdefault((token.device, token.stream), deque()).append(token)

    def completed(self, fail: Callable[[BaseException], None]) -> list[Row]:
        """The rows of queued calls whose events completed (oldest first per stream, where
        they complete in order); a call whose row raises is dropped and passed to `fail`."""
        rows: list[Row] = []
        for fifo in self.pending.values():
            while fifo:
                try:
                    row = _gpu_row(fifo[0])
                except Exception as exc:  # a broken record must not block its stream
                    row = None
                    fail(exc)
                if row == ():
                    break
                fifo.popleft()
                if row:
                    rows.append(row)
        self.pending = {key: fifo for key, fifo in self.pending.items() if fifo}
        return rows

    def waiting(self) -> int:
        return sum(len(fifo) for fifo in self.pending.values())


def _take_anchor(cuda: Any, stream: Any, clock: Callable[[], int]) -> Anchor:
    """The tightest of a few (event, epoch ns) pairs: record on an idle private stream and
    synchronize that event only, so t0 <= its GPU time <= t1."""
    best: Anchor | None = None
    for _ in range(ANCHOR_TRIES):
        event = cuda.event()
        t0 = clock()
        event.record(stream)
        event.synchronize()
        t1 = clock()
        if best is None or (t1 - t0 + 1) // 2 < best.error_ns:
            best = Anchor(event, (t0 + t1) // 2, (t1 - t0 + 1) // 2, time.monotonic_ns())
        if best.error_ns <= ANCHOR_GOOD_NS:
            break
    assert best is not None
    return best


def _gpu_row(token: Token) -> Row:
    """The row of a GPU call whose events all completed; () while any is still pending."""
    if len(token.ends) < token.expected or not all(event.query() for event in token.ends):
        return ()
    anchor = token.anchor
    assert anchor is not None
    start_ns = anchor.ns + round(anchor.event.elapsed_time(token.start) * 1e6)
    dur_ns = max(round(token.start.elapsed_time(event) * 1e6) for event in token.ends)
    return token.row(start_ns, start_ns + max(dur_ns, 0))

