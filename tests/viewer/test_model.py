"""``llenvs-async view`` without a browser: loading, the document, bad input, html, server."""

from __future__ import annotations

import dataclasses
import json
import re
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from llenvs_async import ScriptedBackend, Trajectory
from llenvs_async import TrajectoryRunner as Runner
from llenvs_async.cli import main
from llenvs_async.cli._results import load_results, record_fields
from llenvs_async.cli._sources import SourceSpec
from llenvs_async.envs import ChainEnv
from llenvs_async.serialization import JsonlWriter
from llenvs_async.testing.chat_tokenizer import IM_END, ChatMLTokenizer
from llenvs_async.types import Completion, GenerationRequest
from llenvs_async.viewer.model import ViewerInputError, load_files
from llenvs_async.viewer.page import render_page
from llenvs_async.viewer.server import serving

from .conftest import Generated


def test_document_counts_match_the_results_file(generated: Generated) -> None:
    records = load_results(generated.runs)
    document, details = load_files([generated.runs, generated.values0, generated.values1])
    assert [f["kind"] for f in document["files"]] == ["run", "values", "values"]
    runs = document["runs"]
    assert len(runs) == len(records) == 20
    assert sum(r["error"] is not None for r in runs) == sum(r.trajectory.error is not None
                                                            for r in records) > 0  # fmt: skip
    assert sum(r["success"] for r in runs) == sum(r.trajectory.success for r in records)
    by_key = {(r.task, r.rollout): r.trajectory for r in records}
    for row, detail in zip(runs, details, strict=True):
        traj = by_key[(row["task"], row["rollout"])]
        assert [s["action"] for s in detail["steps"]] == [a.text for a in traj.actions]
        assert detail["initial"] == traj.initial_state.observation.text
        if traj.error is not None:
            assert detail["error"]["type"] == traj.error.type == "EnvError"
            assert detail["error"]["phase"] == traj.error.phase
    # one node per estimated state; V(s) and each Q(s, a) as written
    rows = generated.estimates()
    nodes = document["values"]
    assert sum((n["v"] is not None) + len(n["q"]) for n in nodes) == len(rows)
    assert {(n["task"], n["step"]) for n in nodes} == {(r["task"], r["step"]) for r in rows}
    dec = [q for n in nodes for q in n["q"] if q["action"] == "dec"]
    assert dec and all(q["failed"] == 6 and q["n"] == 0 for q in dec)  # every one failed
    root = next(n for n in nodes if n["step"] == 0)
    through = {t["id"] for t in root["through"]}
    assert through == {r["id"] for r in runs if r["task"] == root["task"]}


async def _token_trajectories() -> list[Trajectory]:
    tok = ChatMLTokenizer()

    def policy(request: GenerationRequest) -> Completion:
        ids = (*tok.char_ids("right"), IM_END)
        return Completion(text="right", token_ids=ids, logprobs=tuple(-0.1 for _ in ids))

    runner = Runner(ChainEnv(max_steps=3), ScriptedBackend(policy, tokenizer=tok), token_mode=True)
    return await runner.run_batch([0, 1])


def token_file(path: Path, trajectories: list[Trajectory]) -> Path:
    with JsonlWriter(path) as writer:
        for i, traj in enumerate(trajectories):
            fields = record_fields(i, 0, SourceSpec(env="chain"))
            writer.write_trajectory(traj, **fields)
    return path


async def test_token_mode_detail_has_the_loss_mask(tmp_path: Path) -> None:
    trajs = await _token_trajectories()
    _, details = load_files([token_file(tmp_path / "tok.jsonl", trajs)])
    for detail, traj in zip(details, trajs, strict=True):
        record = traj.token_record()
        assert record is not None and detail["tokens"] is not None
        assert detail["tokens"]["loss_mask"] == list(record.loss_mask)
        assert detail["tokens"]["sampled"] == sum(record.loss_mask) > 0
        assert detail["steps"][0]["completion"]["tokens"] == len(tok_ids(traj))
        prompts = [s["completion"]["prompt_tokens"] for s in detail["steps"]]
        assert prompts == [start for start, _ in record.turns]  # what each turn was sent


def tok_ids(traj: Trajectory) -> tuple[int, ...]:
    completion = traj.transitions[0].completion
    assert completion is not None
    return completion.token_ids


def _bad_inputs(good_run: Path, good_values: Path, d: Path) -> list[tuple[str, Path, str]]:
    lines = good_run.read_text().splitlines(keepends=True)
    cut = d / "cut-middle.jsonl"  # a line cut short in the middle of the file: line 2
    cut.write_text(lines[0] + lines[1][: len(lines[1]) // 2] + "\n" + lines[2])
    values = good_values.read_text()
    truncated = d / "truncated.json"
    truncated.write_text(values[: len(values) // 2])
    foreign_line = d / "foreign.jsonl"
    foreign_line.write_text('{"name": "not a result"}\n')
    foreign_obj = d / "pretty.json"
    foreign_obj.write_text(json.dumps({"a": 1, "b": [1, 2]}, indent=2))
    foreign_list = d / "list.json"
    foreign_list.write_text(json.dumps([{"task": 1, "step": 0}]))
    numbers = d / "numbers.json"
    numbers.write_text("[1, 2, 3]")
    text = d / "notes.txt"
    text.write_text("hello\n")
    empty = d / "empty.jsonl"
    empty.write_text("")
    bad_field = d / "bad-field.jsonl"
    record = json.loads(lines[0])
    record["trajectory"]["stop_reason"] = "exploded"
    bad_field.write_text(lines[0] + json.dumps(record) + "\n")
    mixed = d / "mixed.jsonl"  # a run's record after a rollout's
    mixed.write_text(json.dumps({**json.loads(lines[0]), "estimate": "e-0"}) + "\n" + lines[1])
    bad_id = d / "bad-id.jsonl"
    bad_id.write_text(json.dumps({**json.loads(lines[0]), "estimate": 7}) + "\n")
    return [
        ("missing", d / "nope.jsonl", "no such file"),
        ("cut line", cut, f"{cut}:2: malformed JSON line"),
        ("truncated json", truncated, "invalid JSON at line"),
        ("foreign record", foreign_line, f"{foreign_line}:1: no 'key'"),
        ("foreign object", foreign_obj, "one JSON object over several lines"),
        ("foreign list", foreign_list, "item 0: missing field"),
        ("list of numbers", numbers, "item 0: expected an object"),
        ("text", text, "starts with 'h'"),
        ("empty", empty, "the file is empty"),
        ("bad field", bad_field, f"{bad_field}:2: Trajectory.stop_reason: unknown value"),
        ("mixed rollouts", mixed, f"{mixed}:2.estimate: unexpected value None"),
        ("estimate id", bad_id, f"{bad_id}:1.estimate: unexpected value 7"),
    ]


def test_bad_input_is_one_line_naming_the_file_and_exit_2(
    generated: Generated, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for name, path, expected in _bad_inputs(generated.runs, generated.values0, tmp_path):
        code = main(["view", str(generated.values1), str(path), "--html", str(tmp_path / "o")])
        err = capsys.readouterr().err
        assert code == 2, (name, err)
        assert err.count("\n") == 1 and err.startswith("error: "), (name, err)
        assert str(path) in err and expected in err, (name, err)
        with pytest.raises(ViewerInputError):
            load_files([path])
    assert not (tmp_path / "o").exists()


def test_truncated_last_line_is_ignored_as_everywhere(generated: Generated, tmp_path: Path) -> None:
    data = generated.runs.read_bytes()
    killed = tmp_path / "killed.jsonl"
    killed.write_bytes(data[: len(data) - 40])  # a writer killed mid-line
    document, _ = load_files([killed])
    assert len(document["runs"]) == len(load_results(generated.runs)) - 1


def test_html_file_is_self_contained(
    generated: Generated, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "view.html"
    assert main(["view", str(generated.runs), str(generated.values0), "--html", str(out)]) == 0
    assert f"wrote {out}" in capsys.readouterr().out
    html = out.read_text()
    assert not re.search(r"<(script|link|img)[^>]+(src|href)=", html)  # nothing fetched
    assert "http://" not in html and "https://" not in html
    document = _embedded(html, "viewer-document")
    assert len(document["runs"]) == 20 and document["values"]
    assert len(_embedded(html, "viewer-details")) == 20


def _embedded(html: str, ident: str) -> Any:
    match = re.search(rf'<script id="{ident}" type="application/json">(.*?)</script>', html, re.S)
    assert match is not None
    return json.loads(match.group(1))


def test_embedded_text_cannot_close_the_script() -> None:
    page = render_page({"runs": [], "values": [], "files": [{"path": "</script><b>x"}]}, [])
    assert "</script><b>" not in page
    assert _embedded(page, "viewer-document")["files"][0]["path"] == "</script><b>x"


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=30) as response:
        return json.loads(response.read())


def test_server_answers_api_and_closes(generated: Generated) -> None:
    document, details = load_files([generated.runs])
    with serving(document, details) as server:
        assert server.url.startswith("http://127.0.0.1:")
        assert len(_get(server.url + "api/document")["runs"]) == 20
        assert _get(server.url + "api/trajectory/3") == json.loads(json.dumps(details[3]))
        with pytest.raises(urllib.error.HTTPError) as missing:
            _get(server.url + "api/trajectory/20")
        assert missing.value.code == 404
        with urllib.request.urlopen(server.url, timeout=30) as response:
            page = response.read().decode()
        assert 'type="application/json">null</script>' in page  # fetched, not embedded
        port = server.server_address[1]
    server.close()  # idempotent: already closed on leaving the block
    with pytest.raises(OSError):
        urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=5)


def test_view_command_serves_until_interrupted(generated: Generated) -> None:
    cmd = [sys.executable, "-m", "llenvs_async.cli", "view", str(generated.runs)]
    child = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None
        line = child.stdout.readline()
        match = re.search(r"at (http://127\.0\.0\.1:\d+/)", line)
        assert match is not None, line + child.stderr.read() if child.stderr else line
        assert "20 trajectories" in line
        assert len(_get(match.group(1) + "api/document")["runs"]) == 20
        # the same port is taken now: a second viewer on it fails with one line
        port = match.group(1).rsplit(":", 1)[1].strip("/")
        busy = subprocess.run([*cmd, "--port", port], capture_output=True, text=True)
        assert busy.returncode == 2 and f"--port {port}" in busy.stderr
        child.send_signal(signal.SIGINT)
        out, err = child.communicate(timeout=60)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert child.returncode == 0, err
    assert "stopped" in out


def test_a_retried_rollout_shows_once_the_last_written(
    generated: Generated, tmp_path: Path
) -> None:
    lines = generated.runs.read_text().splitlines()
    retry = json.loads(lines[0])
    retry["trajectory"]["episode_id"] = "the-retry"
    path = tmp_path / "retried.jsonl"
    path.write_text("\n".join([*lines, json.dumps(retry)]) + "\n")
    document, details = load_files([path])
    assert len(document["runs"]) == len(lines)
    key = (retry["key"]["task"], retry["key"]["rollout"])
    (shown,) = [d for d in details if (d["task"], d["rollout"]) == key]
    assert shown["episode_id"] == "the-retry"


def test_rollouts_files_open_each_estimate_into_its_trajectories(generated: Generated) -> None:
    paths = [generated.runs, generated.values0, generated.values1]
    document, details = load_files([*paths, generated.rollouts0, generated.rollouts1])
    assert [f["kind"] for f in document["files"]] == ["run", *["values"] * 2, *["rollouts"] * 2]
    assert [f.get("unmatched") for f in document["files"][3:]] == [0, 0]
    assert len(document["runs"]) == 20  # rollouts open from the tree, not the run list
    without, _ = load_files(paths)  # the runs through each state are the same either way
    assert [n["through"] for n in document["values"]] == [n["through"] for n in without["values"]]
    written = {r["id"]: r for r in generated.estimates()}
    shown = [e for n in document["values"] for e in (n["v"], *n["q"]) if e is not None]
    assert {e["id"] for e in shown} == set(written) and len(shown) == len(written)
    for e in shown:
        rollouts = e["rollouts"]
        assert len(rollouts) == e["n"] + e["failed"]  # failures=exclude
        assert sum(r["error"] is not None for r in rollouts) == e["failed"]
        assert [r["return"] for r in rollouts if r["error"] is None] == e["returns"]
        assert [r["sample"] for r in rollouts] == list(range(len(rollouts)))
        for r in rollouts:
            detail = details[r["id"]]
            assert detail["id"] == r["id"] and detail["estimate"] == e["id"]
            if e["action"] is not None and r["error"] is None:
                assert detail["steps"][0]["action"] == e["action"]  # Q(s, a): a taken first
    dec = [e for e in shown if e["action"] == "dec"]
    assert dec and all(r["error"]["type"] == "EnvError" for e in dec for r in e["rollouts"])
    # a rollout from step 1 starts there: its steps are numbered from 1, after its prefix
    nested = next(e for e in shown if e["rollouts"] and details[e["rollouts"][0]["id"]]["prefix"])
    first = details[nested["rollouts"][0]["id"]]
    assert first["start_step"] == 1 and first["steps"][0]["step"] == 1


def test_estimates_without_ids_or_rollouts_still_load(generated: Generated, tmp_path: Path) -> None:
    old = tmp_path / "old.json"  # as q-values wrote before --trajectories
    rows = json.loads(generated.values0.read_text())
    old.write_text(json.dumps([{k: v for k, v in r.items() if k not in ("id", "trajectories")}
                               for r in rows]))  # fmt: skip
    document, _ = load_files([generated.runs, old, generated.rollouts0])
    estimates = [e for n in document["values"] for e in (n["v"], *n["q"]) if e is not None]
    assert len(estimates) == len(rows) and all(e["rollouts"] is None for e in estimates)
    records = len(load_results(generated.rollouts0))
    assert document["files"][2]["unmatched"] == records > 0  # none of them has its estimate
    document, _ = load_files([generated.values0])  # ids, but the rollouts file not given
    named = [e for n in document["values"] for e in (n["v"], *n["q"]) if e is not None]
    assert all(e["rollouts"] is None and e["trajectories"] == str(generated.rollouts0)
               for e in named)  # fmt: skip


@pytest.mark.docker
def test_a_docker_run_shows_each_commands_duration(docker_ready: None, tmp_path: Path) -> None:
    """Harbor steps record ``duration_sec`` in the step's info (beside the runner's own
    ``step_sec``/``generate_sec``): the page shows every one of them per step."""
    out = tmp_path / "h.jsonl"
    tasks = Path(__file__).resolve().parents[2] / "examples" / "tasks"
    assert main(["run", str(tasks), "-t", "csv-totals", "-n", "1", "-o", str(out), "-q"]) == 0
    (traj,) = [r.trajectory for r in load_results(out)]
    assert traj.error is None and len(traj) >= 2
    _, (detail,) = load_files([out])
    for step, transition in zip(detail["steps"], traj.transitions, strict=True):
        if "duration_sec" in transition.info:  # a command ran (the submit step runs none)
            timed = {k: v for k, v in transition.info.items() if k.endswith("_sec")}
            assert step["timing"] == timed
            assert {"duration_sec", "step_sec", "generate_sec"} <= set(timed)
            assert 0 < step["timing"]["duration_sec"] <= step["timing"]["step_sec"] < 60
    assert sum("duration_sec" in s["timing"] for s in detail["steps"]) == len(traj) - 1


def test_embedded_data_holding_a_template_marker_stays_intact() -> None:
    """Trajectory text may contain ``/*DETAILS*/``: the page is filled in one pass, so the
    details never land inside the document's JSON."""
    import json as _json
    import re as _re

    from llenvs_async.viewer.page import render_page

    document = {"note": "echo '/*DETAILS*/ /*JS*/ /*CSS*/'"}
    details = {"0": {"actions": ["ls"]}}
    html = render_page(document, details)
    found = dict(
        _re.findall(r'<script id="viewer-(\w+)" type="application/json">(.*?)</script>', html)
    )
    assert _json.loads(found["document"]) == document
    assert _json.loads(found["details"]) == details


async def test_a_steps_reasoning_and_format_error_reach_the_page(tmp_path: Path) -> None:
    def policy(request: GenerationRequest) -> Completion:
        return Completion(text="right", reasoning=f"step {request.step}: go right")

    runner = Runner(ChainEnv(min_length=2, num_tasks=1), ScriptedBackend(policy))
    [traj] = await runner.run_batch([0])
    first = traj.transitions[0]
    cut = dataclasses.replace(first, info={**first.info, "parse_error": "no code block"})
    traj = dataclasses.replace(traj, transitions=(cut, *traj.transitions[1:]))
    _, [detail] = load_files([token_file(tmp_path / "r.jsonl", [traj])])
    steps = detail["steps"]
    assert [s["completion"]["reasoning"] for s in steps] == ["step 0: go right", "step 1: go right"]
    assert [s["parse_error"] for s in steps] == ["no code block", None]
