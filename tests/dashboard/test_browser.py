"""The dashboard in a real browser: Debian's headless Chromium driven by Playwright, against the
real server. Charts are drawn (no script error, no CSP violation), skipped steps read as gaps
under the cursor and sit on grey bands, a trajectory shows its two policy versions in two colours
and run data never executes, the live page updates in place, the exported file works from disk.

Screenshots go to ``$LOOPRL_SCREENSHOTS`` (default: the test's tmp dir): overview.png, run.png,
trajectory.png, compare.png, export.png. Needs ``chromium`` (``scripts/setup.sh`` installs it)
and ``playwright`` (the ``test`` extra); Playwright's own browser download is not used.
"""

from __future__ import annotations

import json
import os
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Page, sync_playwright

from looprl.dashboard.app import DashboardConfig, create_app, export_html

from .conftest import SKIPPED_STEP, STEPS, serve

pytestmark = pytest.mark.slow  # a browser start and a few page loads: ~10-20 s in all


def chromium() -> str:
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    assert path, "no chromium on PATH: run scripts/setup.sh (apt-get install chromium)"
    return path


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=chromium(), args=["--no-sandbox"])
        yield b
        b.close()


@pytest.fixture
def shots(tmp_path: Path) -> Path:
    d = Path(os.environ.get("LOOPRL_SCREENSHOTS") or tmp_path)
    d.mkdir(parents=True, exist_ok=True)
    return d


class Tab:
    """A page that records script errors, console errors and dialogs (an injected alert)."""

    def __init__(self, browser: Browser) -> None:
        self.page: Page = browser.new_page(viewport={"width": 1400, "height": 1000})
        self.errors: list[str] = []
        self.dialogs: list[str] = []
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))
        self.page.on("console", lambda m: self.errors.append(m.text) if m.type == "error" else None)
        self.page.on("dialog", lambda d: (self.dialogs.append(d.message), d.dismiss()))

    def open(self, url: str) -> Page:
        self.page.goto(url)
        self.page.wait_for_load_state("networkidle")
        figures = self.page.locator("figure[data-chart]").count()
        # functions, not expressions: the page's CSP forbids eval, which a string predicate needs
        self.page.wait_for_function(f"() => document.querySelectorAll('.uplot').length === {figures}")
        assert self.errors == [] and self.dialogs == [], (self.errors, self.dialogs)
        return self.page


def _figure(page: Page, title: str):
    return page.locator("figure[data-chart]", has=page.locator("figcaption", has_text=title))


def _hover_step(page: Page, title: str, step: float, steps: int = STEPS) -> list[str]:
    """Move the cursor over ``step`` (of ``steps``) of a chart; the values its legend shows."""
    fig = _figure(page, title).first
    over = fig.locator(".u-over")
    box = over.bounding_box()
    x = box["x"] + min(box["width"] * (step - 1) / (steps - 1), box["width"] - 1)
    page.mouse.move(x, box["y"] + box["height"] / 2)
    return fig.locator(".u-legend .u-series .u-value").all_inner_texts()


def _ink(page: Page, title: str, step: float) -> int:
    """How opaque a chart's canvas is at ``step``: the least alpha over a 30 px column under the
    plot's top edge (0: nothing drawn there; a grid line or curve crossing it does not count)."""
    return page.evaluate("""([title, step, steps]) => {
        const fig = [...document.querySelectorAll('figure[data-chart]')]
            .find(f => f.querySelector('figcaption').textContent === title);
        const canvas = fig.querySelector('canvas'), over = fig.querySelector('.u-over');
        const r = canvas.getBoundingClientRect(), o = over.getBoundingClientRect();
        const k = canvas.width / r.width;
        const x = (o.left - r.left + o.width * (step - 1) / (steps - 1)) * k;
        const y = (o.top - r.top + 2) * k;
        const px = canvas.getContext('2d').getImageData(Math.round(x), Math.round(y), 1, 30 * k).data;
        let least = 255;
        for (let i = 3; i < px.length; i += 4) least = Math.min(least, px[i]);
        return least;
    }""", [title, step, STEPS])


def test_run_page_and_overview(browser: Browser, grpo_run: Path, run_copy: Path, shots: Path):
    cfg = DashboardConfig(runs=(grpo_run,), refresh_s=0)
    for base in serve(create_app(cfg)):
        tab = Tab(browser)
        page = tab.open(base + "/runs/alpha")
        assert page.locator(".uplot").count() >= 12
        # the skipped step is a gap under the cursor, its neighbours are values
        values = _hover_step(page, "IS ratio trainer/engine", SKIPPED_STEP)
        assert values[1:] == ["—", "—"], values
        values = _hover_step(page, "IS ratio trainer/engine", 1)
        assert all(v not in ("—", "0") for v in values[1:]), values
        # its reward was measured: a value there
        assert _hover_step(page, "mean reward", SKIPPED_STEP)[1] != "—"
        # and it sits on a grey band; step 1 does not
        assert _ink(page, "loss", SKIPPED_STEP) > 0 and _ink(page, "loss", 1.25) == 0
        page.mouse.move(0, 0)
        page.screenshot(path=str(shots / "run.png"), full_page=True)
        tab.page.close()
    (run_copy / "metrics.jsonl").write_text(
        "".join(line + "\n" for line in (run_copy / "metrics.jsonl").read_text().splitlines()[:2]))
    for base in serve(create_app(DashboardConfig(runs=(grpo_run, run_copy), refresh_s=0))):
        tab = Tab(browser)
        page = tab.open(base + "/")
        legend = _figure(page, "mean reward").locator(".u-legend .u-series .u-label").all_inner_texts()
        assert legend[1:] == [f"{grpo_run.parent.name}-alpha", f"{run_copy.parent.name}-alpha"]
        page.screenshot(path=str(shots / "overview.png"), full_page=True)
        # tick both runs, compare
        page.locator("button", has_text="compare selected runs").click()
        page.wait_for_load_state("networkidle")
        page.wait_for_function("() => document.querySelectorAll('.uplot').length === "
                               "document.querySelectorAll('figure[data-chart]').length")
        assert page.url.startswith(base + "/compare?run=")
        assert page.locator("figure[data-chart]").count() == 8 and tab.errors == []
        page.screenshot(path=str(shots / "compare.png"), full_page=True)
        tab.page.close()


def test_trajectory_viewer(browser: Browser, grpo_run: Path, shots: Path):
    for base in serve(create_app(DashboardConfig(runs=(grpo_run,), refresh_s=0))):
        tab = Tab(browser)
        page = tab.open(base + "/runs/alpha/trajectories/eval_rl/0")
        assert page.locator(".msg").count() == 11
        assert page.locator(".call strong").all_inner_texts() == [
            "grep", "read_file", "edit_file", "finish"]
        assert "It subtracts. <script>alert(1)</script>" in page.locator(".msg.assistant").nth(3).inner_text()
        assert page.locator("pre.diff .add").inner_text() == "+    return a + b"
        assert page.locator(".flag").all_inner_texts() == ["broken_tool_calls"]
        colors = page.evaluate("""() => [...new Set([...document.querySelectorAll('.tokens .tok:not(.ctx)')]
            .map(e => getComputedStyle(e).borderBottomColor))]""")
        assert len(colors) == 2  # tokens of v1 and of v2
        # decoded with the run's tokenizer; the long prompt (tool schemas) starts folded
        assert "Let me find add. <tool_call>" in page.locator(".tokens").inner_text()
        assert page.locator(".tokens details:not([open]) summary").first.inner_text().endswith(
            "prompt / tool-output tokens")
        assert tab.dialogs == []  # the model's <script> never ran
        page.screenshot(path=str(shots / "trajectory.png"), full_page=True)
        tab.page.close()


def test_a_hinted_continuation_and_the_hint_charts(browser: Browser, hinted_run: Path,
                                                  shots: Path):
    from .conftest import HINT

    for base in serve(create_app(DashboardConfig(runs=(hinted_run,), refresh_s=0))):
        tab = Tab(browser)
        page = tab.open(base + "/runs/alpha/trajectories/hinted/0")
        hint = page.locator(".msg.hint")
        assert hint.count() == 1 and HINT in hint.inner_text()
        assert hint.locator(".role").inner_text().lower() == "hint"
        # in place: after turn 3's tool result, before the continuation's first turn
        roles = page.evaluate("() => [...document.querySelectorAll('.msg')].map(e => e.className)")
        at = roles.index("msg hint")
        assert roles[at - 1] == "msg tool" and roles[at + 1] == "msg assistant"
        style = page.evaluate("""() => [...document.querySelectorAll('.msg.hint, .msg.user')]
            .map(e => getComputedStyle(e).borderLeftColor + getComputedStyle(e).backgroundColor)""")
        assert len(set(style)) == 2  # drawn apart from the user's prompt
        assert page.locator(".tokens .tok.hint").count() > 0
        hint.scroll_into_view_if_needed()
        page.screenshot(path=str(shots / "hint.png"), full_page=True)
        page = tab.open(base + "/runs/alpha")
        assert _figure(page, "hint KL (teacher with hint || student without)").count() == 1
        assert _hover_step(page, "hint KL (teacher with hint || student without)", 1)[1] == "—"
        page.screenshot(path=str(shots / "run_hints.png"), full_page=True)
        assert tab.errors == [] and tab.dialogs == []
        tab.page.close()


def test_live_page_updates_in_place(browser: Browser, run_copy: Path):
    for base in serve(create_app(DashboardConfig(runs=(run_copy,), refresh_s=1))):
        tab = Tab(browser)
        page = tab.open(base + "/runs/alpha")
        page.evaluate("window.__sameDocument = true")
        row = json.loads((run_copy / "metrics.jsonl").read_text().splitlines()[-1])
        row.update({"step": STEPS + 1, "reward/total_mean": 0.875})
        with open(run_copy / "metrics.jsonl", "a") as f:
            f.write(json.dumps(row) + "\n")
        page.wait_for_function("() => [...document.querySelectorAll('.card')].some(c => "
                               f"c.textContent === 'step{STEPS + 1}')", timeout=15_000)
        assert page.evaluate("window.__sameDocument") is True  # data swapped in, no reload
        # the chart got the new point (its x axis grew to the new step)
        assert _hover_step(page, "mean reward", STEPS + 1, STEPS + 1)[:2] == [str(STEPS + 1), "0.875"]
        assert tab.errors == []
        tab.page.close()


def test_export_works_from_disk(browser: Browser, grpo_run: Path, tmp_path: Path, shots: Path):
    out = export_html(DashboardConfig(runs=(grpo_run,)), tmp_path / "report.html")
    tab = Tab(browser)
    page = tab.open(out.as_uri())  # CSP violations would show as console errors
    assert page.locator(".uplot").count() >= 12
    assert page.locator(".report img").evaluate("img => img.naturalWidth") > 100
    page.screenshot(path=str(shots / "export.png"), full_page=True)
    tab.page.close()


def test_infrastructure_failures_by_class(browser: Browser, tmp_path: Path, shots: Path):
    """A run with faults injected: the page lists each class's count and last rate beside the
    injector's books (agreeing), and draws the per-step rate of each class."""
    from looprl import faults
    from looprl.faults import FaultInjector, FaultsConfig, InfraLedger
    from looprl.rundir import RunDir
    from looprl.types import Counters, StopReason, Trajectory

    from .conftest import write_grpo_run

    run = tmp_path / "runs" / "drill"
    run.mkdir(parents=True)
    inj = FaultInjector(FaultsConfig({"engine_error": 0.3, "sandbox_create": 0.2}, seed=1),
                        books=RunDir(run).fault_books)
    ledger = InfraLedger(RunDir(run).infra_ledger)

    def rollouts(step: int) -> None:  # what a step's 8 rollout attempts met
        for _ in range(8):
            kind = next((k for k in (faults.InfraKind.ENGINE_ERROR, faults.InfraKind.SANDBOX_CREATE)
                         if inj.fires(k)), None)
            ledger.attempt(Trajectory("t", "g", (), (), Counters(),
                                      StopReason.INFRA_ERROR if kind else StopReason.FINISHED,
                                      infra_kind=kind.value if kind else ""))

    before = faults.install(inj)
    try:  # in a thread: Playwright's event loop runs in this one
        t = threading.Thread(target=write_grpo_run, args=(run,),
                             kwargs={"infra": ledger, "before_step": rollouts})
        t.start()
        t.join()
    finally:
        faults.install(before)
    books = inj.books()["settled"]
    assert books.get("engine_error") and books.get("sandbox_create")
    for base in serve(create_app(DashboardConfig(runs=(run,), refresh_s=0))):
        tab = Tab(browser)
        page = tab.open(base + "/runs/drill")
        table = page.locator("table.infra")
        cells = {r.locator("td").first.inner_text(): r.locator("td").all_inner_texts()
                 for r in table.locator("tr").all()[1:]}
        assert set(cells) == {"engine_error", "sandbox_create"}
        for kind, row in cells.items():
            assert row[1] == str(books[kind]) and row[4] == str(books[kind]) and row[-1] == "yes"
        title = "infrastructure failures per rollout attempt (each step)"
        _figure(page, title).scroll_into_view_if_needed()  # below the fold: the mouse must reach it
        values = _hover_step(page, title, 2)
        assert len(values) == 4 and all(v != "—" for v in values[1:]), values
        assert _figure(page, "infrastructure failures so far, by class").count() == 1
        page.locator("section[id$='-infra']").screenshot(path=str(shots / "infra.png"))
        tab.page.close()
