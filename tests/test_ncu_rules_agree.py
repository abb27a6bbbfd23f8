"""ncu's rule findings are one table: `rule_findings` filters and orders them, `analyze` puts
it in the Diagnosis (`dx.tables["ncu_rules"]`), and `gpudiag report` and `gpudiag heatmap`
both list exactly its rows, one per kernel and rule (`reports.ncu.rules.grouped_rules`: ncu repeats
each verdict for every launch), on every real Nsight Compute report.

The pages are parsed with `html.parser` (as tests/test_html_report.py does): the rule table
is the one whose caption starts with RULE_CAPTION, and a row is read back as the text of its
cells (the `<wbr>` wrap points dropped, entities decoded) plus the kernel cell's hover title.
"""

from __future__ import annotations

from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

import gpudiag
from gpudiag.analyzers.kernels import metrics as km
from gpudiag.analyzers.kernels.metrics import ACTIONABLE_RULE_TYPES, analyze, rule_findings
from gpudiag.reports.build import heatmap_page, report_page
from gpudiag.reports.ncu.rules import RULE_ROWS, grouped_rules
from gpudiag.trace import Trace
from tests.conftest import fixtures, fixtures_dir
from tests.test_kernel_metrics import SM, metric_trace

NCU = fixtures("ncu/*.ncu-rep")
RULE_CAPTION = "Nsight Compute rule results"
DURATION = "gpu__time_duration.sum"


class Tables(HTMLParser):
    """Every `<table>` of a page: its caption, headers and body rows (cell text, title)."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tables: list[dict[str, Any]] = []
        self._cell: list[str] | None = None
        self._title: str | None = None
        self._caption: list[str] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "table":
            self.tables.append({"caption": "", "headers": [], "rows": []})
        elif tag == "caption":
            self._caption = []
        elif tag == "tr" and self.tables:
            self.tables[-1]["rows"].append([])
        elif tag in ("td", "th"):
            self._cell, self._title = [], dict(attrs).get("title")

    def handle_endtag(self, tag: str) -> None:
        if tag == "caption" and self._caption is not None:
            self.tables[-1]["caption"] = "".join(self._caption)
            self._caption = None
        elif tag == "th" and self._cell is not None:
            self.tables[-1]["headers"].append("".join(self._cell))
            self._cell = None
        elif tag == "td" and self._cell is not None:
            self.tables[-1]["rows"][-1].append(("".join(self._cell), self._title))
            self._cell = None

    def handle_data(self, data: str) -> None:
        if self._caption is not None:
            self._caption.append(data)
        elif self._cell is not None:
            self._cell.append(data)


def page_rule_rows(document: str) -> list[tuple[str, ...]]:
    """The (launch ids, kernel, full name on hover, rule, message) rows of the page's ncu
    rule table; [] when the page has none. Fails when it has several."""
    parser = Tables()
    parser.feed(document)
    parser.close()
    found = [t for t in parser.tables if t["caption"].startswith(RULE_CAPTION)]
    assert len(found) <= 1, [t["caption"] for t in found]
    if not found:
        return []
    headers = found[0]["headers"]
    rows = []
    for cells in found[0]["rows"]:
        if not cells:  # the header row: <th> cells only
            continue
        by_header = dict(zip(headers, cells, strict=True))
        rows.append((by_header["ids"][0], by_header["kernel"][0], by_header["kernel"][1] or "",
                     by_header["rule"][0], by_header["message"][0]))
    return rows


def table_rows(found: pd.DataFrame) -> list[tuple[str, ...]]:
    """The rows a page must list from a `rule_findings` table, as its cells read back."""
    def text(value: Any) -> str:
        return "" if pd.isna(value) else str(value)

    return [(row.ids, text(row.short_name), text(row.name), text(row.rule),
             text(row.message))
            for row in grouped_rules(found).head(RULE_ROWS).itertuples(index=False)]


# -- every real Nsight Compute report ------------------------------------------------------


def real_report(path: Path | None) -> Trace:
    if path is None:
        pytest.skip(f"no shared Nsight Compute fixtures under {fixtures_dir() / 'ncu'}")
    pytest.importorskip("ncu_report")
    return gpudiag.load(path)


@pytest.mark.parametrize("path", NCU or [None], ids=[p.name for p in NCU] or ["absent"])
def test_report_and_heatmap_list_the_diagnosis_rule_rows(path: Path | None) -> None:
    trace = real_report(path)
    dx = gpudiag.diagnose(trace)
    assert "ncu_rules" in dx.tables, sorted(dx.tables)
    expected = table_rows(dx.tables["ncu_rules"])
    assert expected == table_rows(rule_findings(trace))  # the Diagnosis holds THE table
    report_rows = page_rule_rows(report_page(trace, dx, cdn=True))
    heatmap_rows = page_rule_rows(heatmap_page(trace, dx, cdn=True))
    assert report_rows == heatmap_rows
    assert report_rows == expected


@pytest.mark.parametrize("path", NCU or [None], ids=[p.name for p in NCU] or ["absent"])
def test_rule_findings_are_the_actionable_rules_most_speedup_first(path: Path | None) -> None:
    trace = real_report(path)
    every = km.rules(trace)
    found = rule_findings(trace)
    actionable = every[every["type"].isin(ACTIONABLE_RULE_TYPES).to_numpy(bool)]
    repeated_errors = actionable["type"].eq("error").to_numpy(bool) & \
        actionable.duplicated(["kernel_id", "rule"]).to_numpy(bool)
    assert len(found) == len(actionable) - int(repeated_errors.sum())
    assert found["type"].isin(ACTIONABLE_RULE_TYPES).all()
    assert not found[found["type"] == "error"].duplicated(["kernel_id", "rule"]).any()
    assert found.dtypes.astype(str).to_dict() == {
        c: str(pd.Series(dtype=t).dtype) for c, t in km.RULE_FINDING_COLUMNS.items()}
    scope = found["speedup_type"].where(found["speedup_pct"].notna()).fillna("none")
    groups = scope.map({"global": 0, "local": 1, "none": 2}).tolist()
    assert groups == sorted(groups)  # global estimates, then local ones, then none
    for kind in ("global", "local"):
        assert found.loc[scope == kind, "speedup_pct"].is_monotonic_decreasing


# -- synthetic rule results: the exact filter and order ------------------------------------


def rule(kernel_id: int, identifier: str, rule_type: str | None,
         speedup: float | None = None, message: str | None = None) -> dict[str, Any]:
    """One rule result as the ncu reader stores it in meta["ncu_rules"]."""
    return {"kernel_id": kernel_id, "rule_identifier": identifier, "name": identifier,
            "section_identifier": "S", "title": f"{identifier} title",
            "message": message or f"{identifier} on {kernel_id}", "type": rule_type,
            "speedup_type": None if speedup is None else "global", "speedup": speedup}


NAMES = ["void ns::gemm<float, 128>(float const*, float*, int)", "relu_kernel(float*)"]
RULES = [
    rule(0, "Ok", "ok", 90.0),                  # informative: dropped even with a speedup
    rule(0, "WarnNoSpeedup", "warning"),
    rule(1, "OptSmall", "optimization", 5.0),
    rule(0, "Untyped", "none"),                 # no type: dropped
    rule(1, "Failed", "error"),
    rule(0, "OptLarge", "optimization", 40.0),
    rule(1, "OptTie", "optimization", 5.0),     # ties keep ncu's order
    rule(0, "Missing", None),                   # no type at all: dropped
    rule(1, "Linked", "warning", message="see @section:Occupancy:the Occupancy section@"),
]


def rules_trace(ncu_rules: list[dict[str, Any]]) -> Trace:
    kernels = pd.DataFrame([{"kernel_id": i, "device": 0, "name": name, "start_ns": 0,
                             "end_ns": 0} for i, name in enumerate(NAMES)])
    return Trace(meta={"ncu_rules": ncu_rules, "timeline": False}, kernels=kernels)


def test_rule_findings_keep_warnings_optimizations_and_errors_by_speedup() -> None:
    found = rule_findings(rules_trace(RULES))
    assert found["rule"].tolist() == ["OptLarge", "OptSmall", "OptTie", "WarnNoSpeedup",
                                      "Failed", "Linked"]
    assert found["type"].tolist() == ["optimization"] * 3 + ["warning", "error", "warning"]
    assert found["speedup_pct"].tolist()[:3] == [40.0, 5.0, 5.0]
    assert found["speedup_pct"].isna().tolist() == [False] * 3 + [True] * 3
    assert found["kernel_id"].tolist() == [0, 1, 1, 0, 1, 1]
    assert found["name"].tolist() == [NAMES[i] for i in (0, 1, 1, 0, 1, 1)]
    assert found["short_name"].tolist()[:2] == ["gemm<float, 128>", "relu_kernel"]
    assert found["message"].iloc[-1] == "see the Occupancy section"  # plain text
    assert list(found.columns) == list(km.RULE_FINDING_COLUMNS)


def test_a_failed_rule_is_one_error_row_and_local_estimates_follow_global_ones() -> None:
    """ncu reports a failed rule twice (its own line, then the rule script's exception with
    the recording machine's paths, as in the a10g fixture): one row is kept, the first. A
    local speedup is a share of one unit's work, never ranked among global ones."""
    local = {**rule(0, "LocalBig", "optimization", 90.0), "speedup_type": "local"}
    found = rule_findings(rules_trace([
        rule(1, "Occupancy", "error", message="Rule Occupancy returned an error: Metric x"),
        rule(1, "Occupancy", "error", message="exception set\n/root/Sections/Occ.py:45"),
        local, rule(0, "GlobalSmall", "optimization", 2.0),
        rule(0, "Occupancy", "error", message="Rule Occupancy returned an error: Metric y")]))
    assert found["rule"].tolist() == ["GlobalSmall", "LocalBig", "Occupancy", "Occupancy"]
    errors = found[found["type"] == "error"]
    assert errors["kernel_id"].tolist() == [1, 0]  # one per (kernel, rule), in ncu's order
    assert errors["message"].str.startswith("Rule Occupancy").all()
    # a warning of the same rule on the same kernel is no repeat of its error
    both = rule_findings(rules_trace([rule(1, "Occupancy", "warning"),
                                      rule(1, "Occupancy", "error")]))
    assert both["type"].tolist() == ["warning", "error"]


def test_rule_findings_of_a_trace_without_problems_is_empty_and_typed() -> None:
    for trace in (Trace(), rules_trace([]), rules_trace([rule(0, "Ok", "ok")])):
        found = rule_findings(trace)
        assert found.empty
        assert found.dtypes.astype(str).to_dict() == {
            c: str(pd.Series(dtype=t).dtype) for c, t in km.RULE_FINDING_COLUMNS.items()}


def test_analyze_is_the_findings_and_tables_of_one_kernel_metrics() -> None:
    trace = metric_trace({SM: 20.0, DURATION: 1000.0},
                         ncu_rules=[rule(0, "OptSmall", "optimization", 5.0),
                                    rule(0, "Ok", "ok")])
    result = analyze(trace)
    assert result.findings.equals(km.findings(trace))
    assert result.tables["kernel_metrics"].equals(km.kernel_metrics(trace))
    assert result.tables["ncu_rules"].equals(rule_findings(trace))
    assert km.findings(trace, metrics=result.tables["kernel_metrics"]).equals(result.findings)


def test_both_pages_cut_a_long_rule_table_to_the_same_rows() -> None:
    many = [rule(0, f"R{i}", "warning", float(i % 7) if i % 3 else None)
            for i in range(RULE_ROWS + 20)]
    trace = metric_trace({SM: 20.0, DURATION: 1000.0}, ncu_rules=many)
    dx = gpudiag.diagnose(trace)
    report, heatmap = report_page(trace, dx, cdn=True), heatmap_page(trace, dx, cdn=True)
    report_rows = page_rule_rows(report)
    assert len(report_rows) == RULE_ROWS
    assert report_rows == page_rule_rows(heatmap) == table_rows(dx.tables["ncu_rules"])
    note = f"showing the top {RULE_ROWS} of {RULE_ROWS + 20} rule results"
    assert note in report and note in heatmap


def test_heatmap_without_a_diagnosis_says_why_no_rules_are_listed() -> None:
    trace = metric_trace({SM: 20.0}, ncu_rules=[rule(0, "WarnNoSpeedup", "warning")])
    document = heatmap_page(trace, None, cdn=True)
    assert page_rule_rows(document) == []
    assert "Not listed: no diagnosis was given" in document


def test_a_kernels_launches_share_one_row_per_rule() -> None:
    """105 launches of one kernel, each with the same two verdicts (their numbers differ
    from launch to launch, as ncu's do): two rows, not 210, each counting its launches and
    keeping the largest speedup and its message."""
    launches = 105
    many = [rule(i, rule_id, "optimization", float(i % 10),
                 message=f"{rule_id}: {i % 10}% of the issue slots idle")
            for i in range(launches) for rule_id in ("IssueSlot", "CPIStall")]
    trace = metric_trace(*([{SM: 20.0, DURATION: 1000.0}] * launches),
                         names=["silu_kernel(float*, float*, int)"] * launches,
                         ncu_rules=many)
    dx = gpudiag.diagnose(trace)
    assert len(dx.tables["ncu_rules"]) == 2 * launches  # the Diagnosis keeps every launch
    rows = page_rule_rows(report_page(trace, dx, cdn=True))
    assert [row[3] for row in rows] == ["IssueSlot", "CPIStall"]
    assert {row[0] for row in rows} == {"9, 19, 29, 39, 49, +100"}  # most speedup first
    assert all(row[4].endswith(": 9% of the issue slots idle") for row in rows)
    grouped = grouped_rules(dx.tables["ncu_rules"])
    assert grouped["launches"].tolist() == [launches, launches]
    assert grouped["speedup_pct"].tolist() == [9.0, 9.0]


def test_a_real_reports_launches_are_grouped() -> None:
    """a100pcie_selfjoin: 4 launches of nodeByPoint5 give 41 rule results; 11 verdicts."""
    trace = real_report(next((p for p in NCU if p.name.startswith("a100pcie")), None))
    rows = grouped_rules(gpudiag.diagnose(trace).tables["ncu_rules"])
    assert len(rows) == 11 and rows["launches"].sum() == 41
    assert rows["launches"].max() == 4
