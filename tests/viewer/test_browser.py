"""The viewer in real headless Chromium: served on 127.0.0.1 and as a ``--html`` file."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from PIL import Image

from llenvs_async.cli import main
from llenvs_async.cli._results import load_results
from llenvs_async.serialization import read_jsonl
from llenvs_async.types import Trajectory
from llenvs_async.viewer.model import load_files
from llenvs_async.viewer.server import serving

from .conftest import Generated
from .test_model import _token_trajectories, token_file


def wait_ready(driver: Any, url: str) -> None:
    """Load ``url`` and wait for the page; for a trajectory's page (``#/t/N``), fetched after
    the page is ready, until that trajectory is shown too."""
    from selenium.webdriver.support.ui import WebDriverWait

    driver.get("about:blank")
    driver.get(url)
    WebDriverWait(driver, 60).until(
        lambda d: d.execute_script("return document.body.dataset.ready === '1'")
    )
    if match := re.search(r"#/t/(\d+)$", url):
        wait_for(driver, f'#traj-title[data-id="{match.group(1)}"]')


def wait_for(driver: Any, selector: str) -> None:
    """Wait until an element matching ``selector`` is on the page."""
    from selenium.webdriver.support.ui import WebDriverWait

    WebDriverWait(driver, 60).until(lambda d: d.find_elements("css selector", selector))


def open_trajectory(driver: Any, row: Any) -> None:
    """Click a row (of runs or rollouts) and wait for its trajectory page (fetched or parsed
    on first use)."""
    ident = row.get_attribute("data-id")
    row.click()
    wait_for(driver, f'#traj-title[data-id="{ident}"]')


def css(driver: Any, selector: str) -> list[Any]:
    return list(driver.find_elements("css selector", selector))


def text(driver: Any, selector: str) -> str:
    return str(driver.find_element("css selector", selector).text)


@pytest.fixture(scope="module")
def served(generated: Generated) -> Iterator[str]:
    document, details = load_files([generated.runs, generated.values0, generated.values1])
    with serving(document, details) as server:
        yield server.url


@pytest.fixture(scope="module")
def html_file(generated: Generated, tmp_path_factory: pytest.TempPathFactory) -> str:
    out = tmp_path_factory.mktemp("html") / "view.html"
    files = [str(generated.runs), str(generated.values0), str(generated.values1)]
    assert main(["view", *files, "--html", str(out)]) == 0
    return out.as_uri()


@pytest.fixture(params=["served", "file"])
def page(request: pytest.FixtureRequest) -> str:
    """The same page two ways: from the server, and the --html file over file://."""
    return str(request.getfixturevalue("served" if request.param == "served" else "html_file"))


def test_run_list_shows_the_counts_of_the_file(
    browser: Any, page: str, generated: Generated
) -> None:
    records = load_results(generated.runs)
    wait_ready(browser, page)
    assert text(browser, "#total-row .rollouts") == str(len(records)) == "20"
    errors = sum(r.trajectory.error is not None for r in records)
    assert text(browser, "#total-row .errors") == str(errors)
    success = sum(r.trajectory.success for r in records) / len(records)
    assert text(browser, "#total-row .success") == f"{round(100 * success)}%"
    per_task = {str(t): sum(r.task == t for r in records) for t in {r.task for r in records}}
    rows = {r.get_attribute("data-task"): r for r in css(browser, "#task-summary .task-row")}
    assert {k: int(v.find_element("css selector", ".rollouts").text) for k, v in rows.items()} == (
        per_task
    )
    assert len(css(browser, "#run-table .run-row")) == 20
    assert len(css(browser, "#run-table .run-row.failed")) == errors > 0
    # filters: with error only, then a task on top
    browser.find_element("css selector", "#filter-error option[value=error]").click()
    assert text(browser, "#match-count") == f"{errors} of 20 trajectories"
    assert len(css(browser, "#run-table .run-row")) == errors
    assert all("failed" in r.get_attribute("class") for r in css(browser, "#run-table .run-row"))
    browser.find_element("css selector", "#filter-success option[value=success]").click()
    assert text(browser, "#match-count") == "0 of 20 trajectories"  # a failed one never succeeds
    browser.find_element("css selector", "#filter-error option[value=all]").click()
    css(browser, '#task-summary .task-row[data-task="2"]')[0].click()  # filters by its task
    assert text(browser, "#match-count") == (
        f"{sum(r.task == 2 and r.trajectory.success for r in records)} of 20 trajectories"
    )


def test_clicking_a_trajectory_shows_its_actions(
    browser: Any, page: str, generated: Generated
) -> None:
    records = load_results(generated.runs)
    wait_ready(browser, page)
    rows = css(browser, "#run-table .run-row")
    ok = [i for i, r in enumerate(records) if r.trajectory.error is None]
    longest = max(ok, key=lambda i: len(records[i].trajectory))
    open_trajectory(browser, rows[longest])
    traj = records[longest].trajectory
    assert len(traj) >= 2
    actions = [e.text for e in css(browser, "#messages .msg-action pre")]
    assert actions == [a.text for a in traj.actions]
    observations = [e.text for e in css(browser, "#messages .msg-observation pre")]
    assert observations == [s.observation.text for s in traj.states]
    assert not css(browser, "#traj-error")
    # a failed one: its error, with type and phase
    wait_ready(browser, page)
    failed = next(i for i, r in enumerate(records) if r.trajectory.error is not None)
    open_trajectory(browser, css(browser, "#run-table .run-row")[failed])
    error = records[failed].trajectory.error
    assert error is not None
    box = text(browser, "#traj-error")
    assert f"{error.type} in phase {error.phase}" in box and error.message in box


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"


def test_value_tree_shows_the_intervals(browser: Any, page: str, generated: Generated) -> None:
    rows = generated.estimates()
    wait_ready(browser, page + "#/values")
    estimates = css(browser, ".estimate")
    assert len(estimates) == len(rows)
    shown = []
    for e in estimates:
        line = e.find_element("css selector", ".est-line")
        label = line.find_element("css selector", ".est-label").text
        ci = line.find_element("css selector", ".est-ci").text
        bar = line.find_element("css selector", ".bar-ci").get_attribute("style")
        left, width = (float(x) for x in re.findall(r"([\d.]+)%", bar))
        shown.append((label, ci, round(left, 3), round(left + width, 3)))
    expected = []
    for r in rows:
        label = "V(s)" if r["kind"] == "V" else f"Q(s, {r['action']})"
        lo, hi = r["reward_range"]
        ci = f"[{_fmt(r['ci_low'])}, {_fmt(r['ci_high'])}]"
        left = 100 * (r["ci_low"] - lo) / (hi - lo)
        width = max(100 * (r["ci_high"] - lo) / (hi - lo) - left, 0.5)
        expected.append((label, ci, round(left, 3), round(left + width, 3)))
    assert sorted(shown) == sorted(expected)
    # the step-1 states sit inside their step-0 parent's Q(s, a) row
    assert len(css(browser, ".state-node .children .state-node")) == len(
        {(r["task"], r["step"]) for r in rows if r["step"] == 1}
    )
    # failed rollouts are marked: Q(s, dec) crashed every time
    failed = sum(r["failed"] for r in rows)
    assert len(css(browser, ".ret.failed-rollout")) == failed > 0
    assert css(browser, ".estimate.has-failed")
    details = css(browser, "details.rollouts")[0]
    assert not details.find_element("css selector", ".returns").is_displayed()
    details.find_element("css selector", "summary").click()
    chips = details.find_elements("css selector", ".returns .ret")
    assert chips and all(c.is_displayed() for c in chips)
    assert details.find_elements("css selector", ".through a.traj-link")  # into the runs


def test_screenshot_of_the_value_tree_is_not_blank(
    browser: Any, served: str, tmp_path: Path
) -> None:
    wait_ready(browser, served + "#/values")
    for summary in css(browser, "details.rollouts summary")[:2]:
        summary.click()
    path = tmp_path / "value-tree.png"
    assert browser.save_screenshot(str(path))
    with Image.open(path) as image:
        assert image.width >= 800 and image.height >= 600
        colours = image.convert("RGB").getcolors(maxcolors=1 << 20)
    assert colours is not None and len(colours) > 50  # text, bars and chips, not a blank page


async def test_token_mode_shows_the_loss_mask(browser: Any, tmp_path: Path) -> None:
    trajs = await _token_trajectories()
    document, details = load_files([token_file(tmp_path / "tok.jsonl", trajs)])
    record = trajs[0].token_record()
    assert record is not None
    with serving(document, details) as server:
        wait_ready(browser, server.url + "#/t/0")
        tokens = css(browser, "#loss-mask .tok")
        assert len(tokens) == len(record.input_ids)
        assert len(css(browser, "#loss-mask .tok.m1")) == sum(record.loss_mask) > 0
        assert f"sampled {sum(record.loss_mask)}" in text(browser, "#token-summary")


def _big_file(generated: Generated, path: Path, copies: int) -> Path:
    """``copies`` times the generated file, each copy with its own rollout numbers."""
    lines = generated.runs.read_text().splitlines()
    with path.open("w") as f:
        for k in range(copies):
            for line in lines:
                record = json.loads(line)
                record["key"]["rollout"] += 1000 * k
                f.write(json.dumps(record) + "\n")
    return path


def test_ten_thousand_trajectories_paginate(
    browser: Any, generated: Generated, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    big = _big_file(generated, tmp_path / "big.jsonl", 500)
    started = time.perf_counter()
    document, details = load_files([big])
    loaded = time.perf_counter() - started
    assert len(document["runs"]) == 10_000
    out = tmp_path / "big.html"
    assert main(["view", str(big), "--html", str(out)]) == 0
    timings = {}
    with serving(document, details) as server:
        for name, url in (("file", out.as_uri()), ("served", server.url)):
            wait_ready(browser, url)
            assert text(browser, "#run-pager .pager-info") == "page 1 of 200"
            assert len(css(browser, "#run-table .run-row")) == 50  # only one page in the DOM
            assert len(css(browser, "#task-summary .task-row")) == 5
            assert text(browser, "#total-row .rollouts") == "10000"
            browser.find_element("css selector", "#run-pager .next").click()
            assert text(browser, "#run-pager .pager-info") == "page 2 of 200"
            first = css(browser, "#run-table .run-row")[0]
            assert first.get_attribute("data-id") == "50"
            open_trajectory(browser, first)
            # its details rendered (this one may have failed before acting: no action)
            assert css(browser, "#messages .msg-observation")
            timings[name] = browser.execute_script("return window.__viewerTimings")
    with capsys.disabled():
        print(f"\n10,000 trajectories: python load {loaded:.2f}s, "
              f"{out.stat().st_size / 1e6:.1f} MB html, browser {timings}")  # fmt: skip


@pytest.fixture(scope="module")
def served_with_rollouts(generated: Generated) -> Iterator[str]:
    files = [generated.runs, generated.values0, generated.values1]
    document, details = load_files([*files, generated.rollouts0, generated.rollouts1])
    with serving(document, details) as server:
        yield server.url


@pytest.fixture(scope="module")
def html_with_rollouts(generated: Generated, tmp_path_factory: pytest.TempPathFactory) -> str:
    out = tmp_path_factory.mktemp("html") / "rollouts.html"
    files = [generated.runs, generated.values0, generated.values1]
    paths = [str(p) for p in (*files, generated.rollouts0, generated.rollouts1)]
    assert main(["view", *paths, "--html", str(out)]) == 0
    return out.as_uri()


@pytest.fixture(params=["served", "file"])
def rollouts_page(request: pytest.FixtureRequest) -> str:
    name = "served_with_rollouts" if request.param == "served" else "html_with_rollouts"
    return str(request.getfixturevalue(name))


def _behind(generated: Generated) -> dict[str, list[Trajectory]]:
    """Each estimate's rollouts as q-values wrote them, in order."""
    out: dict[str, list[Trajectory]] = {}
    for path in (generated.rollouts0, generated.rollouts1):
        for record, raw in zip(load_results(path), read_jsonl(path), strict=True):
            out.setdefault(raw["estimate"], []).append(record.trajectory)
    return out


def test_expanding_an_estimate_lists_its_rollouts_and_opens_them(
    browser: Any, rollouts_page: str, generated: Generated
) -> None:
    rows = {r["id"]: r for r in generated.estimates()}
    behind = _behind(generated)
    wait_ready(browser, rollouts_page + "#/values")
    estimates = css(browser, ".estimate")
    assert {e.get_attribute("data-id") for e in estimates} == set(rows)
    for e in estimates:
        row = rows[e.get_attribute("data-id")]
        listed = e.find_elements("css selector", ":scope > details .rollout-row")
        assert len(listed) == row["n"] + row["failed"] == len(behind[row["id"]])
        failed = e.find_elements("css selector", ":scope > details .rollout-row.failed")
        assert len(failed) == row["failed"]
        assert not listed[0].is_displayed()  # folded until the estimate is expanded
    # expand a Q(s, a) at step 1 and open its second rollout: that trajectory, from that state
    row = next(r for r in rows.values() if r["step"] == 1 and r["kind"] == "Q" and r["n"] >= 2)
    target = browser.find_element("css selector", f'.estimate[data-id="{row["id"]}"]')
    target.find_element("css selector", ":scope > details > summary").click()
    links = target.find_elements("css selector", ":scope > details .rollout-link")
    assert [x.text for x in links] == [f"rollout {i}" for i in range(len(links))]
    assert links[1].is_displayed()
    open_trajectory(browser, links[1].find_element("xpath", "./ancestor::tr"))
    traj = behind[row["id"]][1]
    actions = [x.text for x in css(browser, "#messages .msg-action pre")]
    assert actions == [a.text for a in traj.actions] and actions[0] == row["action"]
    assert text(browser, "#traj-estimate") == f"Q(s, {row['action']}) at task {row['task']}, step 1"
    assert text(browser, "#traj-title").endswith(f"task {row['task']}, rollout 1")
    assert text(browser, "#app .view > p:first-child a") == "\u2190 value tree"  # not: runs
    assert f"step 1, after {row['prefix'][0]}" in text(browser, ".facts")
    # a failed one is marked in the list and opens on its error: every Q(s, dec) crashed
    wait_ready(browser, rollouts_page + "#/values")
    dec = next(r for r in rows.values() if r["action"] == "dec")
    target = browser.find_element("css selector", f'.estimate[data-id="{dec["id"]}"]')
    target.find_element("css selector", ":scope > details > summary").click()
    crashed = target.find_elements("css selector", ":scope > details .rollout-row.failed")
    assert len(crashed) == dec["failed"] == 6
    assert "failed: EnvError (step)" in crashed[0].text
    crashed[0].find_element("css selector", ".rollout-link").click()
    wait_for(browser, "#traj-error")
    assert "EnvError in phase step" in text(browser, "#traj-error")


def test_estimates_name_their_trajectories_file_when_it_is_not_loaded(
    browser: Any, served: str, generated: Generated
) -> None:
    wait_ready(browser, served + "#/values")
    notes = css(browser, ".estimate .not-loaded")
    assert len(notes) == len(generated.estimates())
    assert not css(browser, ".rollout-row")
    browser.find_element("css selector", "details.rollouts summary").click()
    assert str(generated.rollouts0) in notes[0].text or str(generated.rollouts1) in notes[0].text


def _timed_file(generated: Generated, path: Path) -> tuple[Path, int]:
    """The generated runs with runner-style timing keys on one trajectory (and a restore)."""
    records = [json.loads(line) for line in generated.runs.read_text().splitlines()]
    index = max(
        (i for i, r in enumerate(records) if r["trajectory"]["error"] is None),
        key=lambda i: len(records[i]["trajectory"]["transitions"]),
    )
    for record in records:  # the runner's own timing off: only the hand-made one is shown
        record["trajectory"]["info"] = {}
        for step in record["trajectory"]["transitions"]:
            step["info"] = {}
    traj = records[index]["trajectory"]
    traj["info"] = {"started_at": "2026-12-02T06:00:00Z", "wall_sec": 1.5, "node_id": "n1"}
    traj["initial_state"]["info"] = {"replay_sec": 0.5}
    for step in traj["transitions"]:
        step["info"] = {"generate_sec": 0.25, "step_sec": 0.125, "duration_sec": 0.1, "x": 1}
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path, index


def test_trajectory_page_shows_recorded_timing(
    browser: Any, generated: Generated, tmp_path: Path
) -> None:
    path, index = _timed_file(generated, tmp_path / "timed.jsonl")
    document, details = load_files([path])
    steps = len(details[index]["steps"])
    assert steps >= 2
    with serving(document, details) as server:
        wait_ready(browser, server.url + f"#/t/{index}")
        per_step = [x.text for x in css(browser, "#messages .step-timing")]
        assert (
            per_step == ["generate 0.250 s \u00b7 env step 0.125 s \u00b7 command 0.100 s"] * steps
        )
        assert text(browser, "#traj-timing") == " \u00b7 ".join([
            "started 2026-12-02T06:00:00Z", "wall 1.500 s", "restore (replay) 0.500 s",
            f"\u03a3 generate {0.25 * steps:.3f} s", f"\u03a3 env step {0.125 * steps:.3f} s",
            f"\u03a3 command {0.1 * steps:.3f} s",
        ])  # fmt: skip
        other = next(i for i, d in enumerate(details) if i != index and d["error"] is None)
        wait_ready(browser, server.url + f"#/t/{other}")
        assert text(browser, "#traj-timing") == "not recorded"
        assert not css(browser, "#messages .step-timing")


def test_the_timing_a_real_run_records_is_shown(browser: Any, generated: Generated) -> None:
    """``run`` output (the runner's own timing keys, through JSONL) on the trajectory page."""
    records = read_jsonl(generated.runs)
    index = next(i for i, r in enumerate(records) if len(r["trajectory"]["transitions"]) >= 2)
    traj = records[index]["trajectory"]
    info, steps = traj["info"], traj["transitions"]
    assert {"started_at", "wall_sec", "restore_sec"} <= set(info)
    assert all({"generate_sec", "step_sec"} <= set(s["info"]) for s in steps)
    document, details = load_files([generated.runs])
    with serving(document, details) as server:
        wait_ready(browser, server.url + f"#/t/{index}")
        per_step = [x.text for x in css(browser, "#messages .step-timing")]
        timed = [(s["info"]["generate_sec"], s["info"]["step_sec"]) for s in steps]
        assert per_step == [f"generate {g:.3f} s \u00b7 env step {e:.3f} s" for g, e in timed]
        shown = text(browser, "#traj-timing").split(" \u00b7 ")
        assert shown[:3] == [
            f"started {info['started_at']}",
            f"restore {info['restore_sec']:.3f} s",
            f"wall {info['wall_sec']:.3f} s",
        ]
        rest = shown[3:]
        if "setup_sec" in info:  # `run` records the task's setup (its image build) too
            assert rest[0] == f"setup {info['setup_sec']:.3f} s"
            rest = rest[1:]
        assert rest[0].startswith("\u03a3 generate ") and rest[1].startswith("\u03a3 env step ")
