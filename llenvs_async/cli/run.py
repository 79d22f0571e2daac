"""``llenvs-async run``: collect trajectories into a JSONL file, streamed, resumable."""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Annotated

import anyio
import typer

from .. import _timing
from .._extras import import_extra
from .._shield import shielded
from ..env import EnvFactory, Environment, replay_restore
from ..errors import DockerUnavailableError, MissingExtraError
from ..serialization import JsonlWriter, SerializationError, StepJournal, read_journal
from ..types import ErrorInfo, Observation, State, Trajectory, Transition
from . import _options as opt
from ._backend import BackendKind, BackendOptions, open_runner
from ._common import CliError, console, err_console, run_async
from ._progress import RolloutProgress
from ._results import load_results, print_summary, record_fields, summary_table, unique_by_key
from ._sources import Source, SourceSpec, TaskRef, open_source, select_tasks

__all__ = ["run"]

# Not a task failure: a bug, or no Docker engine at all. These abort the command.
_Key = tuple[int | str, int]
_FATAL = (TypeError, AttributeError, AssertionError, NameError, DockerUnavailableError)


@dataclass(frozen=True, slots=True)
class _Job:
    ref: TaskRef
    rollout: int

    @property
    def key(self) -> _Key:
        return (self.ref.key, self.rollout)


@dataclass(frozen=True, slots=True)
class _Setup:
    """A task's setup before its rollouts (its image built unless cached, a first reset):
    when it began and how long it took, the share every trajectory of the task records."""

    started_at: str
    seconds: float

    def add_to(self, trajectory: Trajectory) -> Trajectory:
        """``trajectory`` with ``setup_sec`` in its info and in its ``wall_sec``."""
        info = dict(trajectory.info)
        info.setdefault("started_at", self.started_at)
        info["setup_sec"] = self.seconds
        info["wall_sec"] = _timing.seconds(float(info.get("wall_sec", 0.0)) + self.seconds)
        return replace(trajectory, info=info)

    @classmethod
    def none(cls) -> _Setup:
        """A resumed rollout's: its task was set up by the run it was cut from."""
        return cls(started_at=_timing.utc_now(), seconds=0.0)


def run(
    dataset: opt.DatasetArg = None,
    env: opt.EnvOpt = None,
    out: Annotated[Path, typer.Option("--out", "-o", help="Results JSONL file.")] = Path(
        "results.jsonl"
    ),
    resume: Annotated[
        bool,
        typer.Option(
            "--resume",
            help="Skip (task, rollout) pairs already in --out; continue the ones a kill cut "
            "from their last journaled step.",
        ),
    ] = False,
    retry_failed: Annotated[
        bool, typer.Option("--retry-failed", help="With --resume: rerun rollouts that failed.")
    ] = False,
    force: Annotated[bool, typer.Option("--force", help="Overwrite an existing --out.")] = False,
    tasks: Annotated[
        list[str] | None, typer.Option("--task", "-t", help="Task key/name/index (repeatable).")
    ] = None,
    limit: Annotated[int | None, typer.Option("--limit", help="Only the first N tasks.")] = None,
    rollouts: Annotated[int, typer.Option("--rollouts", "-n", help="Rollouts per task.")] = 1,
    n_concurrent: opt.NConcurrentOpt = 4,
    schedule: opt.ScheduleOpt = opt.ScheduleKind.refill,
    max_steps: opt.MaxStepsOpt = None,
    backend: opt.BackendOpt = BackendKind.scripted,
    model: opt.ModelOpt = None,
    base_url: opt.BaseUrlOpt = None,
    epsilon: opt.EpsilonOpt = 0.0,
    seed: opt.SeedOpt = 0,
    temperature: opt.TemperatureOpt = None,
    max_tokens: opt.MaxTokensOpt = None,
    token_mode: opt.TokenModeOpt = False,
    tokenizer: opt.TokenizerOpt = None,
    action_format: opt.ActionFormatOpt = "text",
    max_format_errors: opt.MaxFormatErrorsOpt = 3,
    observation_chars: opt.ObservationCharsOpt = opt.DEFAULT_MAX_OBSERVATION_CHARS,
    system_prompt: opt.SystemPromptOpt = None,
    chat_template_kwargs: opt.ChatTemplateKwargsOpt = None,
    keep_reasoning: opt.KeepReasoningOpt = False,
    tool_choice: opt.ToolChoiceOpt = None,
    tool_call_parser: opt.ToolCallParserOpt = None,
    reasoning_parser: opt.ReasoningParserOpt = None,
    quiet: opt.QuietOpt = False,
    base_image: opt.BaseImageOpt = None,
    build_network: opt.BuildNetworkOpt = False,
    build_ca_bundle: opt.BuildCaBundleOpt = None,
    provision_verifier: opt.ProvisionVerifierOpt = False,
    provision_index_url: opt.ProvisionIndexUrlOpt = None,
    allow_network: opt.AllowNetworkOpt = False,
    command_timeout: opt.CommandTimeoutOpt = None,
    runtime: opt.RuntimeOpt = "runc",
    artifacts_dir: opt.ArtifactsDirOpt = None,
    start_step: opt.StartStepOpt = None,
    ray_address: opt.RayAddressOpt = None,
) -> None:
    """Collect trajectories over a Harbor dataset or a built-in env; one JSONL line each."""
    harbor = opt.harbor_options(
        base_image, build_network, build_ca_bundle, allow_network, command_timeout,
        provision_verifier, runtime, artifacts_dir, start_step, provision_index_url,
        action_format=action_format, max_format_errors=max_format_errors,
        observation_chars=observation_chars,
    )  # fmt: skip
    spec = SourceSpec.from_flags(dataset, env, max_steps, harbor)
    options = opt.backend_options(
        backend, model, base_url, epsilon, seed, temperature, max_tokens, token_mode, tokenizer,
        chat_template_kwargs=chat_template_kwargs, keep_reasoning=keep_reasoning,
        tool_choice=tool_choice, system_prompt=system_prompt, tool_call_parser=tool_call_parser,
        reasoning_parser=reasoning_parser,
    )  # fmt: skip
    if rollouts < 1 or n_concurrent < 1:
        raise CliError("--rollouts and --n-concurrent must be >= 1")
    prior = _prior_run(out, spec, resume=resume, retry_failed=retry_failed, force=force)
    written = 0
    try:
        with _on_ray(ray_address):
            written = run_async(
                lambda: _collect(
                    spec, options, out, prior, tasks or [], limit, rollouts, n_concurrent,
                    quiet, force, on_ray=ray_address is not None, schedule=schedule.value,
                )
            )  # fmt: skip
    except KeyboardInterrupt:
        records = unique_by_key(load_results(out)) if out.exists() else []
        print_summary(console, summary_table(records, f"{out} (interrupted)"))
        err_console.print(
            f"interrupted: {len(records)} trajectories saved in {out}; continue with --resume"
        )
        raise typer.Exit(130) from None
    records = unique_by_key(load_results(out))
    print_summary(console, summary_table(records, str(out)))
    console.print(f"wrote {written} trajectories to {out} ({len(records)} in the file)")
    failed = [r.trajectory.error for r in records if r.trajectory.error is not None]
    if records and len(failed) == len(records):
        # Failures are data, but a run where nothing worked (server down, bad model name)
        # must not look like success to a script.
        first = failed[0]
        message = " ".join(f"{first.type}: {first.message}".split())
        err_console.print(
            f"error: every rollout failed; first error: {message}", soft_wrap=True, markup=False
        )
        raise typer.Exit(1)


@dataclass(frozen=True, slots=True)
class _Prior:
    """What a resumed run finds in ``--out``: the (task, rollout) pairs to skip, every pair
    the file holds, and (``--retry-failed``) the failed trajectories to continue."""

    skip: frozenset[_Key] = frozenset()
    recorded: frozenset[_Key] = frozenset()
    failed: Mapping[_Key, Trajectory] = field(default_factory=dict)


def _prior_run(
    out: Path, spec: SourceSpec, *, resume: bool, retry_failed: bool, force: bool
) -> _Prior | None:
    """What ``out`` holds for a resumed run; ``None`` when the run starts afresh."""
    if resume and force:
        raise CliError("--resume and --force contradict each other")
    if retry_failed and not resume:
        raise CliError("--retry-failed only makes sense with --resume")
    if not out.parent.is_dir():
        raise CliError(f"--out {str(out)!r}: directory {str(out.parent)!r} does not exist")
    if out.is_dir():
        raise CliError(f"--out {str(out)!r} is a directory")
    if force:  # replaced only once the run is known to start (see _collect)
        return None
    if not out.exists() or out.stat().st_size == 0:
        return _Prior() if resume else None
    if not resume:
        raise CliError(
            f"{out} already exists: pass --resume to continue it or --force to replace it"
        )
    records = unique_by_key(load_results(out))
    for record in records:
        if record.source != spec:
            raise CliError(f"{out} was written for {record.source.label}, not {spec.label}")
    failed = {r.key: r.trajectory for r in records if retry_failed and r.trajectory.error}
    return _Prior(
        skip=frozenset(r.key for r in records if r.key not in failed),
        recorded=frozenset(r.key for r in records),
        failed=failed,
    )


async def _collect(
    spec: SourceSpec,
    options: BackendOptions,
    out: Path,
    prior: _Prior | None,
    selectors: list[str],
    limit: int | None,
    rollouts: int,
    n_concurrent: int,
    quiet: bool,
    replace: bool = False,
    *,
    on_ray: bool = False,
    schedule: str = "refill",
) -> int:
    """Run every job ``prior`` does not skip, each trajectory appended to ``out`` as it
    finishes and each settled step to the journal beside it (``journal_path``). Resumed
    (``prior``): a job the journal has steps of and ``out`` has not, or a failed one to
    retry, continues from its last step; otherwise the journal starts empty. A run that
    ends with every job written removes its journal."""
    journal = journal_path(out)
    async with open_source(spec) as source:
        if on_ray:
            _distribute(source)
        refs = select_tasks(source.tasks, selectors, limit)
        skip = prior.skip if prior is not None else frozenset()
        jobs = [_Job(ref, r) for ref in refs for r in range(rollouts) if (ref.key, r) not in skip]
        if not jobs:
            return 0
        cut = {} if prior is None else _cut_rollouts(journal, jobs, prior)
        await source.check()
        async with open_runner(source, options, schedule=schedule) as runner:
            if replace:  # --force: the old file goes only once nothing can stop the run
                await anyio.Path(out).unlink(missing_ok=True)
            if prior is None:
                await anyio.Path(journal).unlink(missing_ok=True)
            with (
                JsonlWriter(out) as writer,
                StepJournal(journal, cut.items()) as steps,
                RolloutProgress(
                    len(jobs), runner.stats, console=err_console, enabled=not quiet
                ) as progress,
            ):
                fresh = [job for job in jobs if job.key not in cut]
                starts = dict(zip(fresh, await _initial_states(source, fresh, n_concurrent),
                                  strict=True))  # fmt: skip
                runnable: list[tuple[_Job, State, _Setup]] = []
                prefixes: list[tuple[Transition, ...]] = []
                for job in jobs:
                    if job.key in cut:  # continued from its last journaled step
                        partial = cut[job.key]
                        runnable.append((job, partial.final_state, _Setup.none()))
                        prefixes.append(partial.transitions)
                        continue
                    start, setup = starts[job]
                    if isinstance(start, State):
                        runnable.append((job, start, setup))
                        prefixes.append(())
                    else:  # the task itself failed to start: that is data too
                        _save(writer, progress, spec, job, setup.add_to(start))
                if runnable:
                    # Seeds follow each rollout's (task, rollout) key, not its place in this
                    # run: a resumed run draws what the first one would have.
                    ids = [job.rollout for job, _, _ in runnable]
                    states = [state for _, state, _ in runnable]

                    def journal_step(index: int, step: int, transition: Transition) -> None:
                        steps.write(runnable[index][0].key, step, transition)

                    async with contextlib.aclosing(
                        runner.iter_batch_from_states(
                            states, batch_size=n_concurrent, rollout_ids=ids, prefixes=prefixes,
                            on_step=journal_step,
                        )
                    ) as trajectories:  # fmt: skip
                        async for trajectory in trajectories:
                            assert trajectory.index is not None
                            job, _, setup = runnable[trajectory.index]
                            _save(writer, progress, spec, job, setup.add_to(trajectory))
                            steps.finished(job.key)
                written = writer.written
        await anyio.Path(journal).unlink(missing_ok=True)  # every job is in ``out`` now
        return written


def journal_path(out: Path) -> Path:
    """Where a run writing ``out`` journals its in-flight rollouts' steps."""
    return out.with_name(f"{out.name}.steps")


def _cut_rollouts(journal: Path, jobs: list[_Job], prior: _Prior) -> dict[_Key, Trajectory]:
    """The steps to continue each job from, by key: a failed one's recorded steps (retried),
    else what the journal holds of one a kill cut (not in the results); checked to belong
    to the job's task."""
    try:
        journaled = read_journal(journal)
    except SerializationError as exc:
        raise CliError(f"cannot resume from the step journal: {exc}") from None
    tasks = {job.key: job.ref.task for job in jobs}
    cut: dict[_Key, Trajectory] = {}
    for name, partial in journaled.items():
        if len(name) != 2 or not isinstance(name[1], int):
            raise CliError(f"{journal}: {list(name)} is not a (task, rollout) key")
        key = (name[0], name[1])
        if key in prior.recorded or key not in tasks or not partial.transitions:
            continue  # finished (in the results), not asked for this time, or no step yet
        if partial.initial_state.task != tasks[key]:
            raise CliError(
                f"{journal}: rollout {list(key)} began in task "
                f"{partial.initial_state.task!r}, not {tasks[key]!r}: it was written by "
                "another run"
            )
        cut[key] = partial
    for key, failed in prior.failed.items():
        if key in tasks and failed.transitions:  # retried from its last good step
            cut[key] = replace(failed, error=None, stop_reason="unfinished")
    return cut


@contextlib.contextmanager
def _on_ray(address: str | None) -> Iterator[None]:
    """Connected to the Ray cluster at ``address`` for the run (nothing when ``None``)."""
    with contextlib.ExitStack() as stack:
        if address is not None:
            try:
                ray = import_extra("llenvs_async.distributed.ray", extra="ray", package="Ray",
                                   what="--ray-address")  # fmt: skip
            except MissingExtraError as exc:
                raise CliError(str(exc)) from None
            RayConnectError, connect = ray.RayConnectError, ray.connect
            try:
                stack.enter_context(connect(address))
            except RayConnectError as exc:
                raise CliError(str(exc)) from None
        yield


def _distribute(source: Source) -> None:
    """Each instance in a Ray actor on a node with a ``docker`` resource, its restore run
    there; the runner and the backend stay here."""
    from ..distributed.ray import ray_env_factory, remote_restore

    if source.env_factory is None:
        raise CliError(
            f"--ray-address needs a stateful environment (a dataset or --env counter); "
            f"{source.spec.label} runs in this process"
        )
    source.env_factory = ray_env_factory(source.env_factory)
    source.restore_fn = remote_restore(source.restore_fn or replay_restore)


def _save(
    writer: JsonlWriter, progress: RolloutProgress, spec: SourceSpec, job: _Job, traj: Trajectory
) -> None:
    writer.write_trajectory(traj, **record_fields(job.ref.key, job.rollout, spec))
    progress.advance(traj)


async def _timed(start: Awaitable[State | Trajectory]) -> tuple[State | Trajectory, _Setup]:
    started_at, began = _timing.utc_now(), _timing.clock()
    result = await start
    return result, _Setup(started_at=started_at, seconds=_timing.seconds(_timing.clock() - began))


async def _initial_states(
    source: Source, jobs: list[_Job], n_concurrent: int
) -> list[tuple[State | Trajectory, _Setup]]:
    """Each job's start state and its setup's timing: a reset per rollout on a pure env,
    else one reset per task on a throwaway instance (which builds the task's image). A task
    that cannot start yields failed trajectories instead.
    """
    env = source.environment
    if env.pure_step:
        return [await _timed(_reset(source, env, job.ref, seed=job.rollout)) for job in jobs]
    factory = source.env_factory
    assert factory is not None
    by_task: dict[int | str, tuple[State | Trajectory, _Setup]] = {}
    gate = anyio.Semaphore(n_concurrent)

    async def start(ref: TaskRef) -> None:
        async with gate:
            by_task[ref.key] = await _timed(_fresh_reset(source, factory, ref))

    async with anyio.create_task_group() as tg:
        for ref in {job.ref.key: job.ref for job in jobs}.values():
            tg.start_soon(start, ref)
    return [by_task[job.ref.key] for job in jobs]


async def _fresh_reset(source: Source, factory: EnvFactory, ref: TaskRef) -> State | Trajectory:
    try:
        instance = await factory()
    except _FATAL:
        raise
    except Exception as exc:
        return _failed(ref, exc, None)
    try:
        return await _reset(source, instance, ref, seed=None)
    finally:
        await shielded(instance.aclose(), within=None)


async def _reset(
    source: Source, env: Environment, ref: TaskRef, seed: int | None
) -> State | Trajectory:
    try:
        return await source.reset(env, ref, seed)
    except _FATAL:
        raise
    except Exception as exc:
        return _failed(ref, exc, seed)


def _failed(ref: TaskRef, exc: Exception, seed: int | None) -> Trajectory:
    return Trajectory(
        episode_id="",
        initial_state=State(observation=Observation(text=""), task=ref.task, seed=seed),
        error=ErrorInfo.from_exception(exc, phase="reset"),
        stop_reason="error",
    )
