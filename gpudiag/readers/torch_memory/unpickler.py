"""Opening pickles from strangers: plain data only, never code.

A pickle is a small program. Its GLOBAL / STACK_GLOBAL / INST opcodes import any callable by
name and REDUCE calls it, which is how `pickle.load` runs `os.system` from a crafted file.
`PlainDataUnpickler` refuses every global (`find_class`) and every persistent id
(`persistent_load`), so all that can come out is what the opcodes build on their own: dict,
list, tuple, set, frozenset, str, bytes, bytearray, int, float, bool and None. A torch memory
snapshot is exactly such data (torch's C++ pickler writes no globals), so nothing is lost.

Subclassing the C `pickle.Unpickler` keeps its speed: the hooks run only when a file asks for
a global, which a snapshot never does (a 3.7 MB snapshot unpickles in about 30 ms).

One path skips `find_class`: the EXT1/EXT2/EXT4 opcodes name a callable by an integer code
registered with `copyreg.add_extension`, and the C unpickler hands back a code it has already
resolved in this process (`copyreg._extension_cache`) without asking `find_class`. A code not
in that cache does go through `find_class` and is refused. So whenever the cache is not empty
the opcodes are scanned first (`pickletools.genops`) and a pickle with any EXT opcode is
refused before anything is built. The scan is pure Python (0.7 s for a 3.7 MB snapshot, twice
the whole read), which is why it runs only when some code in the process cached an extension.
"""

from __future__ import annotations

import copyreg
import io
import math
import pickle
import pickletools
from collections.abc import Mapping
from itertools import islice
from pathlib import Path
from typing import Any

from gpudiag.errors import InputError
from gpudiag.readers.files import read_bytes

HOW_TO_DUMP = (
    "dump a snapshot with torch.cuda.memory._record_memory_history(max_entries=100000), "
    "run the code, then torch.cuda.memory._dump_snapshot('snapshot.pickle')"
)
#: how deep and how many values `plain_json` copies from a stranger's settings dict
JSON_DEPTH = 6
JSON_ITEMS = 2000
TEXT_CHARS = 1000
#: opcodes that fetch a callable from the process's extension registry, past find_class
EXTENSION_OPCODES = frozenset({"EXT1", "EXT2", "EXT4"})


class RefusedObject(pickle.UnpicklingError):
    """The pickle names code or an external object; nothing of it was imported or called."""


class PlainDataUnpickler(pickle.Unpickler):
    """An unpickler that builds plain containers and scalars and refuses everything else."""

    def find_class(self, module: str, name: str) -> Any:
        raise RefusedObject(f"a reference to {shown(f'{module}.{name}')}")

    def persistent_load(self, pid: Any) -> Any:
        raise RefusedObject("a persistent object id (as torch.save writes for tensors)")


def load_plain(path: Path) -> Any:
    """The plain data in the pickle at `path` (gzip-aware), or InputError; never runs code."""
    data = read_bytes(path)
    if not data:
        raise InputError(path, "is empty (0 bytes)", "the program did not finish writing it")
    try:
        if getattr(copyreg, "_extension_cache", True):  # the cache the C unpickler trusts
            refuse_extensions(data)
        return PlainDataUnpickler(io.BytesIO(data)).load()
    except RefusedObject as exc:
        raise InputError(
            path, f"carries code/objects ({exc}), refusing to load",
            f"gpudiag opens only plain-data pickles; {HOW_TO_DUMP}",
        ) from None
    # Damaged bytes make the unpickler raise a dozen types (UnpicklingError, EOFError,
    # ValueError, KeyError for a missing memo, AttributeError from BUILD on a list,
    # MemoryError for a forged length...). With globals refused no foreign code runs inside
    # load(), so every exception here is the file's fault, not a gpudiag bug.
    except Exception as exc:
        raise InputError(
            path, f"is not a readable pickle ({type(exc).__name__}: {shown(str(exc))})",
            "the file is truncated or damaged: copy or dump it again",
        ) from exc


def refuse_extensions(data: bytes) -> None:
    """Raise RefusedObject when the pickle `data` holds an EXT1/EXT2/EXT4 opcode.

    Damaged bytes make `genops` raise ValueError; the caller reports those as damage.
    """
    for opcode, arg, position in pickletools.genops(data):
        if opcode.name in EXTENSION_OPCODES:
            raise RefusedObject(f"extension code {arg} ({opcode.name} at byte {position})")
        if opcode.name == "STOP":
            return


def shown(text: str, limit: int = 60) -> str:
    """`text` from a stranger's file made safe for a one-line message: printable, short."""
    text = ascii(text)[1:-1]
    return text if len(text) <= limit else text[: limit - 3] + "..."


def plain_json(value: Any) -> Any:
    """A JSON-serializable copy of plain unpickled data, bounded in depth and size.

    Tuples and sets become lists, dict keys strings, bytes a hex string, non-finite floats
    their name, other objects their type name; anything deeper than JSON_DEPTH or past
    JSON_ITEMS values becomes None, so a hostile settings dict cannot blow up meta.json.
    """
    budget = [JSON_ITEMS]
    return _copy(value, 0, budget)


def _copy(value: Any, depth: int, budget: list[int]) -> Any:
    budget[0] -= 1
    if budget[0] < 0 or depth > JSON_DEPTH:
        return None
    if isinstance(value, Mapping):
        items = islice(value.items(), max(budget[0], 0))
        return {_key(key): _copy(item, depth + 1, budget) for key, item in items}
    if isinstance(value, list | tuple | set | frozenset):
        return [_copy(item, depth + 1, budget) for item in islice(value, max(budget[0], 0))]
    return _scalar(value)


def _scalar(value: Any) -> Any:
    if isinstance(value, str):
        value = value[:TEXT_CHARS]
    elif isinstance(value, bytes | bytearray):
        value = bytes(value[: TEXT_CHARS // 2]).hex()
    elif isinstance(value, float) and not math.isfinite(value):
        value = str(value)
    elif isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 64:
        value = "<large int>"  # Python refuses str() of ints past 4300 digits, and so JSON
    elif not (value is None or isinstance(value, bool | int | float)):
        value = f"<{type(value).__name__}>"
    return value


def _key(key: Any) -> str:
    """A dict key as a JSON key; never repr() of a container, which could nest too deep."""
    if isinstance(key, str):
        return key[:TEXT_CHARS]
    if key is None or isinstance(key, bool | float):
        return str(key)
    if isinstance(key, int):
        return str(key) if key.bit_length() <= 64 else "<large int>"
    return f"<{type(key).__name__}>"
