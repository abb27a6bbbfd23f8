"""Short display forms of C++ kernel names.

`void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>,
at::detail::Array<char*, 1> >(int, ...)` is shown as
`vectorized_elementwise_kernel<4, FillFunctor<float>, Array<char*, 1>>`: no return type, no
parameter list, no namespaces. Tables and figures show the short form; the full name stays in
the data, on hover and in exports.
"""

from __future__ import annotations

import re

import pandas as pd

_NAMESPACE = re.compile(r"(?:\b[A-Za-z_]\w*|\(anonymous namespace\))::")
_SPACES = re.compile(r"\s+")
#: `[^()]` (not `[^)]`): each "{lambda(" scans only to the next parenthesis, so a name of
#: many unclosed "{lambda(" is linear, not quadratic
_LAMBDA = re.compile(r"\{lambda\([^()]*\)#\d+\}")


def short_name(name: str, width: int = 80) -> str:
    """The display form of one kernel name, at most `width` characters."""
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
