"""Display names: short forms of C++ kernel names, and the user's frame of a Python stack.

`void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>,
at::detail::Array<char*, 1> >(int, ...)` is shown as
`vectorized_elementwise_kernel<4, FillFunctor<float>, Array<char*, 1>>`: no return type, no
parameter list, no namespaces. Tables and figures show the short form; the full name stays in
the data, on hover and in exports.

A Python stack (a call site, an allocation's frames) is shown by its user frame: frames in
library files (torch, numpy, jax, site-packages, the standard library) are passed over, so a
finding points at a line the user can change rather than at the framework's.
"""

from __future__ import annotations

import functools
import re

import pandas as pd

_NAMESPACE = re.compile(r"(?:\b[A-Za-z_]\w*|\(anonymous namespace\))::")
_SPACES = re.compile(r"\s+")
#: `[^()]` (not `[^)]`): each "{lambda(" scans only to the next parenthesis, so a name of
#: many unclosed "{lambda(" is linear, not quadratic
_LAMBDA = re.compile(r"\{lambda\([^()]*\)#\d+\}")


@functools.lru_cache(maxsize=1 << 16)
def short_name(name: str, width: int = 80) -> str:
    """The display form of one kernel name, at most `width` characters (remembered: the
    analyzers and reports shorten the same few hundred names of a trace many times)."""
    text = name.strip()
    text = re.sub(r"^void\s+", "", text)
    text = _strip_parameters(text)
    text = _LAMBDA.sub("lambda", text)
    text = _inner_parameters(text).replace("::lambda", ".lambda")
    text = _NAMESPACE.sub("", text)
    text = _SPACES.sub(" ", text).replace(" >", ">")
    if len(text) > width:
        text = text[: width - 1] + "…"
    return text or name[:width]


def short_names(names: pd.Series, width: int = 80) -> pd.Series:
    """short_name over a Series, computed once per distinct name; categorical, like the
    names (a long trace repeats a few hundred names millions of times)."""
    cat = names.astype("category")
    shorts = [short_name(str(c), width) for c in cat.cat.categories]
    return cat.cat.rename_categories(_dedupe(shorts))


def job_short_names(names: list[tuple[str, ...]]) -> dict[str, str]:
    """Full -> short kernel name over the kernel names of a job's ranks (each rank's
    category order), as `short_names` gives them on the merged trace: the categories in the
    ranks' own order when all agree, else sorted (how `trace.concat_tables` merges them),
    so the same two names get the same `#2` either way."""
    order = list(names[0]) if all(group == names[0] for group in names) else sorted(
        {name for group in names for name in group})
    shorts = short_names(pd.Series(pd.Categorical([], categories=order)))
    return dict(zip(order, shorts.cat.categories.astype(str), strict=True))


def _strip_parameters(text: str) -> str:
    """Drop a trailing balanced '(...)' parameter list (templates may contain parentheses)."""
    if not text.endswith(")"):
        return text
    depth = 0
    for i in range(len(text) - 1, -1, -1):
        if text[i] == ")":
            depth += 1
        elif text[i] == "(":
            depth -= 1
            if depth == 0:
                head = text[:i]
                # a C++ parameter list follows the name directly: "f(int)", not "Memcpy (x)"
                return head if head and head[-1] not in " <," else text
    return text


def _inner_parameters(text: str) -> str:
    """Drop parameter lists inside template arguments ('f(TensorIteratorBase&, Scalar)::x'
    -> 'f::x'), keeping '(anonymous namespace)' and casts like '(int)3'."""
    out: list[str] = []
    depth = 0
    for i, ch in enumerate(text):
        if ch == "(" and depth == 0 and i and (text[i - 1].isalnum() or text[i - 1] in "_>"):
            depth = 1
            continue
        if depth:
            depth += {"(": 1, ")": -1}.get(ch, 0)
            continue
        out.append(ch)
    return "".join(out)


def _dedupe(values: list[str]) -> list[str]:
    """rename_categories needs unique values: distinct names with equal short forms get #2, #3."""
    seen: dict[str, int] = {}
    out = []
    for value in values:
        count = seen.get(value, 0) + 1
        seen[value] = count
        out.append(value if count == 1 else f"{value} #{count}")
    return out


#: Python frames from these top-level packages are library code, not the user's call site
LIBRARY_ROOTS = (
    "torch", "torchvision", "torchaudio", "triton", "numpy", "jax", "jaxlib", "flax", "optax",
    "functools", "contextlib", "logging", "threading", "typing", "importlib", "abc", "copy",
    "collections", "enum", "inspect", "weakref", "warnings", "site-packages", "dist-packages",
    "multiprocessing", "queue", "selectors", "socket", "traceback", "os", "posixpath",
)
PY_FRAME = re.compile(r"^(?P<file>.+?)\((?P<line>\d+)\): (?P<func>.+)$")
LIBRARY_FILE = re.compile(r"(^|/)(" + "|".join(re.escape(r) for r in LIBRARY_ROOTS) + r")(/|\.py)"
                      r"|^<|/lib/python3|/usr/lib/")


def frame_label(name: str) -> str:
    """Kineto's `file.py(42): func` as `file.py:42 (func)`; other names unchanged."""
    m = PY_FRAME.match(name)
    return f"{m['file']}:{m['line']} ({m['func']})" if m else name


def is_user_frame(name: str) -> bool:
    """A Python frame (`file.py(42): func`) outside the libraries: a line the user can change."""
    m = PY_FRAME.match(name)
    return m is not None and not LIBRARY_FILE.search(m["file"])
