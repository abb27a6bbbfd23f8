"""Call sites of allocator frames: which line of the user's code asked for the memory.

A snapshot entry's `frames` is a list of `{"filename", "line", "name"}` dicts, innermost
first, mixing C++ frames (`filename` like 'CUDACachingAllocator.cpp' or '??') with Python
frames when it was recorded with stacks='all'. The useful answer is the innermost Python
frame that is neither torch itself nor an installed package: `model.py:42 (forward)` rather
than `torch/nn/modules/module.py:1750 (_call_impl)`. A Python frame is one whose file is a
`.py` file or a code object's pseudo-file: `<string>` (`python -c`, `exec`), `<stdin>`,
`<ipython-input-...>` (typed by the user, so user frames), `<frozen ...>` or torch.fx's
`<eval_with_key>.N` (library). Without a user frame, the innermost Python frame;
without any (autograd's backward thread has only C++ frames), the innermost native frame with
a file name, past the recorder, the allocator and the generated dispatcher wrappers that
every C++ stack starts with, which leaves the op (`VariableType_0.cpp:0 (...mul_Tensor...)`)
or, for a free, the destructor that released it.

The pickle shares frame dicts and frame lists between entries (a 22k-entry snapshot holds
665 distinct frames in 15k distinct lists), so `Sites` judges each distinct frame and each
distinct list once, keyed by object identity. The objects stay referenced by the cache, so
an id is never reused while a `Sites` lives.
"""

from __future__ import annotations

from typing import Any

#: how good a frame is as a site: lower wins; NOTHING means not usable at all
USER_PY, LIBRARY_PY, NATIVE, NOTHING = range(4)
LIBRARY_MARKS = ("/torch/", "/site-packages/", "/dist-packages/")
NO_FILE = ("", "??", "<unknown>")
#: pseudo-files of Python code the user typed (`python -c`, a REPL, a notebook cell)
TYPED_FILES = ("<string>", "<stdin>", "<console>", "<ipython-input-")
#: native files of the recorder and allocator themselves: in every C++ stack, never the cause
RECORDER_FILES = frozenset({
    "memory_snapshot.cpp", "CUDACachingAllocator.cpp", "unwind.cpp", "combined_traceback.cpp",
})


def frame_rank(frame: Any) -> tuple[int, str | None]:
    """(rank, 'file:line (function)') of one frame dict; (NOTHING, None) when unusable."""
    if type(frame) is not dict:
        return NOTHING, None
    filename = frame.get("filename")
    if type(filename) is not str or filename in NO_FILE:
        return NOTHING, None
    line = frame.get("line")
    name = frame.get("name")
    # a stranger's line may be a 5000-digit int, which str() refuses
    shown_line = line if type(line) is int and line.bit_length() < 64 else "?"
    label = f"{filename}:{shown_line} ({name if type(name) is str else '?'})"
    slashed = filename.replace("\\", "/")
    if filename.endswith(".py") or filename.startswith("<"):  # `<...>`: a code object's
        library = ((filename.startswith("<") and not filename.startswith(TYPED_FILES))
                   or any(mark in slashed for mark in LIBRARY_MARKS))
        return (LIBRARY_PY if library else USER_PY), label
    base = slashed.rsplit("/", 1)[-1]
    # generated dispatcher wrappers (RegisterCUDA_0.cpp...) sit between every op and the
    # allocator; skipping them and the recorder leaves the op (VariableType_0.cpp: mul)
    if base in RECORDER_FILES or base.startswith("Register"):
        return NOTHING, None
    return NATIVE, label


class Sites:
    """The site of each frames list, computed once per distinct list and per distinct frame.

    The walk stops at the first user frame, which in real stacks sits about halfway down;
    each frame's rank is one dict lookup after its first sighting. (Mapping whole lists
    through C calls instead was slower: it cannot stop early.)
    """

    def __init__(self) -> None:
        self._lists: dict[int, tuple[Any, str | None]] = {}
        self._frames: dict[int, tuple[int, str | None, Any]] = {}

    def of(self, frames: Any) -> str | None:
        """The best frame's 'file:line (function)', or None without a usable frame."""
        if type(frames) is not list or not frames:
            return None
        cached = self._lists.get(id(frames))
        if cached is None:
            cached = self._lists[id(frames)] = (frames, self._best(frames))
        return cached[1]

    def _best(self, frames: list[Any]) -> str | None:
        best_rank, best = NOTHING, None
        known = self._frames
        for frame in frames:
            hit = known.get(id(frame))
            if hit is None:  # holding the frame in the cache keeps its id unique
                hit = known[id(frame)] = (*frame_rank(frame), frame)
            rank = hit[0]
            if rank < best_rank:
                best_rank, best = rank, hit[1]
                if rank == USER_PY:
                    break
        return best
