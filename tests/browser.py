"""Open an HTML report in headless Chromium and say what the browser saw.

One call per page: ``open_report(path)`` launches Debian's ``chromium`` through Playwright's
Python package (which bundles its driver; ``playwright install`` is never needed, nor wanted:
it downloads browsers and fails offline), opens the file as a ``file://`` URL with every
network request blocked and recorded, waits until each ``.plotly-graph-div`` has drawn (or an
error makes that moot), measures the layout (:data:`LAYOUT_CHECKS`), takes a full-page
screenshot and returns a :class:`Result`.

Tests call :func:`require_browser` first: it skips with the exact reason (no chromium binary,
no playwright) or, with ``GPUDIAG_REQUIRE_BROWSER=1`` (set by CI), fails instead, so CI cannot
pass by silently skipping. ``GPUDIAG_CHROMIUM`` overrides the browser binary;
``GPUDIAG_BROWSER_ARTIFACTS=dir`` copies every screenshot there as a build artifact.
"""

from __future__ import annotations

import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

CHROMIUM_ARGS = [
    "--no-sandbox",  # CI runs as root in a container
    "--disable-gpu",
    "--disable-dev-shm-usage",  # containers often have a 64 MB /dev/shm
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]

# Runs before any page script: wraps Plotly.newPlot (plotly.js assigns `window.Plotly`, which
# hits this setter) so the wait knows when every plot's promise has settled, and counts errors
# so a page that threw stops the wait at once instead of running into the timeout.
_INIT_SCRIPT = """
(() => {
  const state = {pending: 0, errors: 0, rejections: []};
  window.__gpudiag = state;
  window.addEventListener('error', () => { state.errors += 1; });
  window.addEventListener('unhandledrejection', () => { state.errors += 1; });
  let plotly;
  Object.defineProperty(window, 'Plotly', {
    configurable: true,
    get() { return plotly; },
    set(value) {
      plotly = value;
      if (value && typeof value.newPlot === 'function' && !value.__gpudiagWrapped) {
        const newPlot = value.newPlot;
        value.newPlot = function (...args) {
          state.pending += 1;
          let promise;
          try {
            promise = Promise.resolve(newPlot.apply(this, args));
          } catch (err) {
            state.pending -= 1;
            throw err;
          }
          promise.then(
            () => { state.pending -= 1; },
            (err) => {
              state.pending -= 1;
              state.errors += 1;
              state.rejections.push('Plotly.newPlot rejected: ' + String(err));
            });
          return promise;
        };
        value.__gpudiagWrapped = true;
      }
    },
  });
})();
"""

_SETTLED = """
() => {
  const state = window.__gpudiag || {pending: 0, errors: 0};
  if (state.errors > 0) return true;
  const divs = Array.from(document.querySelectorAll('.plotly-graph-div'));
  return state.pending === 0 && divs.every(d => d.querySelector('.main-svg'));
}
"""

_INSPECT = """
() => {
  const divs = Array.from(document.querySelectorAll('.plotly-graph-div'));
  return {
    drawn: divs.map(d => Boolean(d._fullLayout && d.querySelector('.main-svg'))),
    traces: divs.map(d => Array.isArray(d.data) ? d.data.length : 0),
    rejections: (window.__gpudiag && window.__gpudiag.rejections) || [],
    plotly: typeof window.Plotly !== 'undefined',
  };
}
"""

LAYOUT_CHECKS = {
    "page_overflow": "the page is wider than the viewport (a horizontal scroll)",
    "table_overflow": "a table is wider than its container (its right columns scroll)",
    "legend_overlap": "two labels of one figure's legends or colorbars overlap",
    "legend_clipped": "a legend scrolls (plotly's .scrollbar) or a legend or colorbar "
                      "sticks out of its figure",
    "figure_blank": "a figure's box is taller than the figure drawn in it (a blank band)",
    "empty_section": "a heading with nothing visible under it, or a table without rows",
}
"""What `Result.layout` lists per check: a page that reads well at a glance has none."""

# Layout problems, measured on the drawn page (after the plots settled). Boxes are client
# rectangles; 1 px of slack absorbs subpixel rounding. Every message names where it is (the
# section's heading, the figure's index), so a failing test says what to look at.
_LAYOUT = """
() => {
  const out = {page_overflow: [], table_overflow: [], legend_overlap: [],
               legend_clipped: [], figure_blank: [], empty_section: []};
  const heading = (el) => {
    const s = el.closest('section');
    const h = s && s.querySelector('h1, h2, h3');
    return h ? JSON.stringify(h.textContent.trim()) : '(outside any section)';
  };
  const shown = (el) => {
    const r = el.getBoundingClientRect();
    return r.width > 0 && r.height > 0 && getComputedStyle(el).visibility !== 'hidden';
  };
  const doc = document.scrollingElement || document.documentElement;
  if (doc.scrollWidth > doc.clientWidth + 1)
    out.page_overflow.push(`page ${doc.scrollWidth} px wide, viewport ${doc.clientWidth} px`);
  document.querySelectorAll('table').forEach((t, i) => {
    const box = t.parentElement;
    const width = t.getBoundingClientRect().width;
    const room = box.clientWidth;
    const cap = t.caption ? JSON.stringify(t.caption.textContent.trim()) : `table ${i + 1}`;
    if (width > room + 1 || box.scrollWidth > box.clientWidth + 1)
      out.table_overflow.push(`${heading(t)} ${cap}: ${Math.round(width)} px in ${room} px`);
    if (t.tBodies.length && !Array.from(t.tBodies).some(b => b.rows.length))
      out.empty_section.push(`${heading(t)} ${cap}: a table without rows`);
  });
  document.querySelectorAll('.plotly-graph-div').forEach((gd, i) => {
    const fig = `${heading(gd)} figure ${i + 1}`;
    const frame = gd.getBoundingClientRect();
    const svg = gd.querySelector('.main-svg');
    const drawn = svg ? svg.getBoundingClientRect().height : 0;
    if (svg && frame.height > drawn + 24)
      out.figure_blank.push(`${fig}: a ${Math.round(frame.height)} px box holds a `
                            + `${Math.round(drawn)} px figure`);
    const labels = [];
    gd.querySelectorAll('.legend .legendtext, .colorbar text').forEach(el => {
      const r = el.getBoundingClientRect();
      const text = el.textContent.trim();
      if (text && r.width > 0 && r.height > 0) labels.push({text, r});
    });
    for (let a = 0; a < labels.length; a++) {
      for (let b = a + 1; b < labels.length; b++) {
        const p = labels[a].r, q = labels[b].r;
        const w = Math.min(p.right, q.right) - Math.max(p.left, q.left);
        const h = Math.min(p.bottom, q.bottom) - Math.max(p.top, q.top);
        if (w > 1 && h > 1)
          out.legend_overlap.push(`${fig}: ${JSON.stringify(labels[a].text)} overlaps `
                                  + JSON.stringify(labels[b].text));
      }
    }
    gd.querySelectorAll('.legend .scrollbar').forEach(bar => {
      const r = bar.getBoundingClientRect();
      if (r.width > 0 && r.height > 0) out.legend_clipped.push(`${fig}: the legend scrolls`);
    });
    gd.querySelectorAll('.legend, .colorbar').forEach(el => {
      const r = el.getBoundingClientRect();
      if (r.width <= 0 || r.height <= 0) return;
      if (r.left < frame.left - 1 || r.right > frame.right + 1 || r.top < frame.top - 1
          || r.bottom > frame.bottom + 1)
        out.legend_clipped.push(`${fig}: a ${el.classList.contains('legend') ? 'legend'
          : 'colorbar'} spans ${Math.round(r.left - frame.left)}..`
          + `${Math.round(r.right - frame.left)} x ${Math.round(r.top - frame.top)}..`
          + `${Math.round(r.bottom - frame.top)} px of a ${Math.round(frame.width)} x `
          + `${Math.round(frame.height)} px figure`);
    });
  });
  document.querySelectorAll('section').forEach(s => {
    const head = s.querySelector('h1, h2, h3');
    const body = Array.from(s.children).filter(el => el !== head && el.tagName !== 'SCRIPT');
    const visible = body.some(el => {
      if (!shown(el)) return false;
      if (el.matches('.plotly-graph-div')) return Boolean(el.querySelector('.main-svg'));
      const tables = el.matches('table') ? [el] : Array.from(el.querySelectorAll('table'));
      if (tables.length) return tables.some(t => Array.from(t.tBodies).some(b => b.rows.length));
      return el.innerText.trim() !== '';
    });
    if (!visible) out.empty_section.push(`${heading(s)}: nothing under the heading`);
  });
  return out;
}
"""

_TWO_FRAMES = "() => new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)))"


@dataclass
class Result:
    """What the browser saw on one page."""

    console_errors: list[str]
    page_errors: list[str]  # uncaught exceptions and rejected Plotly.newPlot promises
    plots: int  # number of .plotly-graph-div elements
    drawn: int  # how many of them have plotly's .main-svg and a laid-out figure
    traces_per_plot: list[int]  # len(gd.data) per plot, in document order
    screenshot_path: Path
    external_requests: list[str] = field(default_factory=list)  # blocked: report not offline
    timed_out: bool = False  # the plots had not settled within the timeout
    seconds: float = 0.0  # launch to screenshot
    render_seconds: float = 0.0  # navigation start to every plot drawn (what a user waits)
    layout: dict[str, list[str]] = field(default_factory=dict)  # LAYOUT_CHECKS -> problems

    @property
    def layout_problems(self) -> list[str]:
        """Every layout problem as 'check: where and what' (empty: the page reads well)."""
        return [f"{check}: {problem}" for check, found in self.layout.items()
                for problem in found]

    @property
    def ok(self) -> bool:
        """No errors, nothing fetched from outside, and every plot drawn."""
        return (
            not self.console_errors
            and not self.page_errors
            and not self.external_requests
            and not self.timed_out
            and self.drawn == self.plots
        )


def chromium_path() -> str | None:
    """$GPUDIAG_CHROMIUM, else `chromium` (Debian) or `chromium-browser` on PATH."""
    given = os.environ.get("GPUDIAG_CHROMIUM")
    if given:
        return given if Path(given).exists() else None
    return shutil.which("chromium") or shutil.which("chromium-browser")


def unavailable_reason() -> str | None:
    """Why the browser tests cannot run here, or None when they can."""
    missing = []
    if chromium_path() is None:
        where = os.environ.get("GPUDIAG_CHROMIUM")
        missing.append(
            f"no chromium binary at $GPUDIAG_CHROMIUM={where}"
            if where
            else "no chromium binary on PATH (apt-get install -y chromium)"
        )
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        missing.append(
            "no playwright Python package (pip install playwright; never run "
            "`playwright install`, the system chromium is used)"
        )
    return "; ".join(missing) or None


def require_browser() -> None:
    """Skip the calling test with the reason; fail instead when $GPUDIAG_REQUIRE_BROWSER=1."""
    reason = unavailable_reason()
    if reason is None:
        return
    if os.environ.get("GPUDIAG_REQUIRE_BROWSER") == "1":
        pytest.fail(f"browser test required (GPUDIAG_REQUIRE_BROWSER=1) but {reason}")
    pytest.skip(reason)


def open_report(
    path: str | Path,
    screenshot: str | Path | None = None,
    *,
    timeout_s: float = 60.0,
    viewport: tuple[int, int] = (1280, 900),
) -> Result:
    """Open one HTML file in headless Chromium and report errors, plots and a screenshot.

    The screenshot goes to ``screenshot`` (default: beside the page, ``<name>.png``) and is
    copied into ``$GPUDIAG_BROWSER_ARTIFACTS`` when that is set. Failures on the page are
    returned, not raised, so a test asserts on them (and can assert that a broken page fails).
    """
    from playwright.sync_api import TimeoutError as PlaywrightTimeout
    from playwright.sync_api import sync_playwright

    page_path = Path(path).resolve()
    if not page_path.is_file():
        raise FileNotFoundError(f"no report to open at {page_path}")
    shot = Path(screenshot) if screenshot is not None else page_path.with_suffix(".png")
    console_errors: list[str] = []
    page_errors: list[str] = []
    external: list[str] = []

    def on_console(message) -> None:
        if message.type == "error":
            where = message.location.get("url", "") if message.location else ""
            console_errors.append(f"{message.text} ({where})" if where else message.text)

    def on_route(route) -> None:
        url = route.request.url
        if url.startswith(("file:", "data:", "blob:")):
            route.continue_()
        else:
            external.append(url)
            route.abort()

    start = time.perf_counter()
    timed_out = False
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium_path(), args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": viewport[0], "height": viewport[1]})
            page.add_init_script(_INIT_SCRIPT)
            page.on("console", on_console)
            page.on("pageerror", lambda err: page_errors.append(str(err)))
            page.route("**/*", on_route)
            opened = time.perf_counter()
            page.goto(page_path.as_uri(), wait_until="load", timeout=timeout_s * 1000)
            try:
                page.wait_for_function(_SETTLED, timeout=timeout_s * 1000)
                page.evaluate(_TWO_FRAMES)
            except PlaywrightTimeout:
                timed_out = True
            render_seconds = time.perf_counter() - opened
            seen = page.evaluate(_INSPECT)
            layout = page.evaluate(_LAYOUT)
            shot.parent.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(shot), full_page=True)
        finally:
            browser.close()
    seconds = time.perf_counter() - start
    if seen["drawn"] and not seen["plotly"]:
        # The init script's accessor makes a bare `Plotly` read undefined rather than throw a
        # ReferenceError, so say plainly what happened.
        page_errors.append("window.Plotly is undefined: plotly.js never loaded (not inlined?)")

    artifacts = os.environ.get("GPUDIAG_BROWSER_ARTIFACTS")
    if artifacts:
        Path(artifacts).mkdir(parents=True, exist_ok=True)
        shutil.copy2(shot, Path(artifacts) / shot.name)

    return Result(
        console_errors=console_errors,
        page_errors=page_errors + list(seen["rejections"]),
        plots=len(seen["drawn"]),
        drawn=sum(seen["drawn"]),
        traces_per_plot=list(seen["traces"]),
        screenshot_path=shot,
        external_requests=external,
        timed_out=timed_out,
        seconds=seconds,
        render_seconds=render_seconds,
        layout={check: list(layout.get(check, [])) for check in LAYOUT_CHECKS},
    )
