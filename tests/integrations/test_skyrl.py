"""The SkyRL adapter: our runner as SkyRL's ``GeneratorInterface``, fed SkyRL's own input
types, its output checked by SkyRL's ``validate_generator_output`` and padded by its
``convert_prompts_responses_to_batch_tensors``.

Marked ``trainers`` (``pip install 'llenvs-async[skyrl]'``; skipped locally without it,
FAILED in CI). SkyRL 0.3.0 does not import here as installed, so the ``skyrl`` fixture
loads its real modules with a shim, in the test only (never in the library):

- Python 3.11: pydantic refuses ``typing.TypedDict`` (SkyRL needs 3.12), so while SkyRL's
  modules import, ``typing.TypedDict`` is ``typing_extensions.TypedDict`` (then restored);
- ``skyrl.train.generators/__init__.py`` imports ``SkyRLGymGenerator``, which needs
  ``skyrl-gym`` (not installed): the package is entered without running its ``__init__``;
- ``skyrl/train/dataset/preprocess.py`` imports ``jaxtyping`` (not installed) for
  annotations only: a stand-in whose ``Float[...]``/``Integer[...]`` are ``Any``, removed
  from ``sys.modules`` after the import;
- ``validate_generator_output`` lives in ``skyrl/train/utils/trainer_utils.py``, whose
  imports need ``skyrl-gym`` (through ``skyrl.train.config``): its two validation functions
  are compiled from that installed file's source, with ``numpy`` and a logger.
"""

from __future__ import annotations

import ast
import asyncio
import inspect
import logging
import subprocess
import sys
import types
import typing
from pathlib import Path
from typing import Any

import pytest

from llenvs_async import (
    Action,
    Completion,
    EnvError,
    GenerationRequest,
    LlenvsError,
    SamplingParams,
    ScriptedBackend,
    State,
    StepResult,
    TrajectoryRunner,
)
from llenvs_async.adapters.harbor import HarborAdapter, HarborEnvironment, load_task
from llenvs_async.envs import ChainEnv
from llenvs_async.integrations.skyrl import SkyRLGenerator, skyrl_generator, to_skyrl
from llenvs_async.policies import shell_reply

pytestmark = pytest.mark.trainers

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples" / "tasks"


class CrashingChain(ChainEnv):
    """``ChainEnv`` whose second step fails on ``crash`` (a failed rollout with sampled ids)."""

    async def _step(self, state: State, action: Action) -> StepResult:
        if action.text.strip() == "crash" and state.step >= 1:
            raise EnvError("boom")
        return await super()._step(state, action)


@pytest.fixture(scope="module")
def skyrl() -> types.SimpleNamespace:
    """SkyRL's real generator types, validation and padding (the shim: module docs)."""
    pytest.importorskip("skyrl")
    typing_extensions = pytest.importorskip("typing_extensions")
    import importlib.util

    import numpy as np

    train = importlib.util.find_spec("skyrl.train")
    assert train is not None and train.submodule_search_locations
    root = Path(next(iter(train.submodule_search_locations)))
    generators = root / "generators"
    added: list[str] = []
    if "skyrl.train.generators" not in sys.modules:
        package = types.ModuleType("skyrl.train.generators")
        package.__path__ = [str(generators)]
        sys.modules["skyrl.train.generators"] = package
    if importlib.util.find_spec("jaxtyping") is None:
        stand_in = types.ModuleType("jaxtyping")
        stand_in.Float = stand_in.Integer = _AnyAnnotation  # type: ignore[attr-defined]
        sys.modules["jaxtyping"] = stand_in
        added.append("jaxtyping")
    original = typing.TypedDict
    typing.TypedDict = typing_extensions.TypedDict
    try:
        base = importlib.import_module("skyrl.train.generators.base")
        preprocess = importlib.import_module("skyrl.train.dataset.preprocess")
    finally:
        typing.TypedDict = original
        for name in added:
            del sys.modules[name]
    utils = root / "utils" / "trainer_utils.py"
    tree = ast.parse(utils.read_text())
    wanted = {"validate_generator_output", "_validate_step_wise_fields"}
    functions: list[ast.stmt] = [
        n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in wanted
    ]
    assert {getattr(f, "name", None) for f in functions} == wanted
    namespace: dict[str, Any] = {
        "np": np,
        "logger": logging.getLogger("skyrl.trainer_utils"),
        "GeneratorOutput": base.GeneratorOutput,
    }
    exec(compile(ast.Module(body=functions, type_ignores=[]), str(utils), "exec"), namespace)
    return types.SimpleNamespace(
        base=base,
        validate=namespace["validate_generator_output"],
        to_tensors=preprocess.convert_prompts_responses_to_batch_tensors,
    )


class _AnyAnnotation:
    def __class_getitem__(cls, item: Any) -> Any:
        return Any


@pytest.fixture(scope="module", params=["tiny", "smollm2-135m-instruct"])
def tokenizer(request: pytest.FixtureRequest) -> Any:
    """The tiny model's tokenizer, and the real model's (its BPE and ChatML template)."""
    transformers = pytest.importorskip("transformers")
    if request.param == "tiny":
        from llenvs_async.testing.tiny_model import cached_tiny_model

        return transformers.AutoTokenizer.from_pretrained(cached_tiny_model())
    pytest.importorskip("gguf")
    from llenvs_async.models import fetch_model

    return transformers.AutoTokenizer.from_pretrained(fetch_model(request.param))


def word_backend(tokenizer: Any, choose: Any) -> ScriptedBackend:
    """Each request gets ``choose(request)``'s ids (+ end of turn), logprobs -0.5, -1.5, ..."""
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")

    def policy(request: GenerationRequest) -> Completion:
        text = choose(request)
        ids = (*tokenizer.encode(text, add_special_tokens=False), end)
        return Completion(
            text=text,
            token_ids=ids,
            logprobs=tuple(-0.5 - i for i in range(len(ids))),
            finish_reason="stop",
            prompt_token_ids=request.prompt_token_ids or (),
        )

    return ScriptedBackend(policy, tokenizer=tokenizer)


def generator_input(skyrl: Any, tasks: list[Any], n: int) -> Any:
    """A ``GeneratorInput`` as SkyRL's ``prepare_generator_input`` builds it: every prompt
    ``n`` times, one ``TrajectoryID`` per row, the dataset's other columns in env_extras."""
    base = skyrl.base
    rows = [t for t in tasks for _ in range(n)]
    return base.GeneratorInput(
        prompts=[[{"role": "user", "content": f"task {t}"}] for t in rows],
        env_classes=["llenvs"] * len(rows),
        env_extras=[{"task": t} for t in rows],
        sampling_params={"temperature": 1.0, "max_generate_length": 16},
        trajectory_ids=[
            base.TrajectoryID(instance_id=f"uid-{t}", repetition_id=r)
            for t in tasks
            for r in range(n)
        ],
        batch_metadata=base.BatchMetadata(global_step=3, training_phase="train"),
    )


def test_generator_output_passes_skyrl_validation_and_padding(skyrl: Any, tokenizer: Any) -> None:
    # per row of a group of 3: right (goal, 1.0), left (truncated, 0.0), crash (failed)
    words = ("right", "left", "crash")
    backend = word_backend(tokenizer, lambda r: words[r.rollout_index % 3])
    runner = TrajectoryRunner(
        CrashingChain(min_length=2, num_tasks=2, max_steps=3),
        backend,
        SamplingParams(max_tokens=8),
        system_prompt="Walk right.",
        token_mode=True,
    )
    generator = skyrl_generator(runner, pad_token_id=tokenizer.pad_token_id)
    assert isinstance(generator, skyrl.base.GeneratorInterface)
    assert inspect.iscoroutinefunction(generator.generate)
    batch = generator_input(skyrl, [0, 1], 3)
    out = asyncio.run(generator.generate(batch))

    skyrl.validate(len(batch["prompts"]), out)  # SkyRL's own check, as its trainer runs it
    assert out["trajectory_ids"] == batch["trajectory_ids"]
    assert out["rewards"] == [1.0, 0.0, 0.0] * 2
    assert out["stop_reasons"] == ["stop", "stop", "error"] * 2
    assert [m["stop_reason"] for m in out["env_metrics"]] == [
        "terminated",
        "truncated",
        "error",
    ] * 2
    assert out["rollout_metrics"]["llenvs/avg_failed"] == pytest.approx(1 / 3)
    trajectories = generator.last_trajectories
    for i, trajectory in enumerate(trajectories):
        record = trajectory.token_record()
        assert record is not None
        split = record.prompt_length
        assert out["prompt_token_ids"][i] == list(record.input_ids[:split])
        assert out["response_ids"][i] == list(record.input_ids[split:])  # token exact
        mask = out["loss_masks"][i]
        if i % 3 == 2:  # failed: ids kept, nothing trained on
            assert len(mask) > 1 and set(mask) == {0}
            continue
        sampled = [t for t, m in zip(out["response_ids"][i], mask, strict=True) if m]
        assert sampled == [t for s in trajectory.transitions for t in s.completion.token_ids]
        assert 0 in mask  # the observation turns between the actions
        logprobs = out["rollout_logprobs"][i]
        assert [lp for lp, m in zip(logprobs, mask, strict=True) if m][:2] == [-0.5, -1.5]
        assert all(lp == 0.0 for lp, m in zip(logprobs, mask, strict=True) if not m)

    # SkyRL's padding into training tensors, as convert_to_training_input calls it
    per_token = [
        [0.0] * (len(r) - 1) + [w] for r, w in zip(out["response_ids"], out["rewards"], strict=True)
    ]
    sequences, _, action, rewards, loss_mask, logprobs, _experts = skyrl.to_tensors(
        tokenizer,
        out["prompt_token_ids"],
        out["response_ids"],
        per_token,
        out["loss_masks"],
        out["rollout_logprobs"],
    )
    assert sequences.shape[0] == 6 and loss_mask.shape == action.shape == logprobs.shape
    assert rewards.sum(dim=1).tolist() == [1.0, 0.0, 0.0] * 2
    assert loss_mask.sum().item() == sum(sum(m) for m in out["loss_masks"]) > 0


def test_failure_and_overlong_policies(skyrl: Any, tokenizer: Any) -> None:
    words = ("right", "crash")
    backend = word_backend(tokenizer, lambda r: words[r.rollout_index % 2])
    runner = TrajectoryRunner(
        CrashingChain(min_length=2, num_tasks=2, max_steps=3),
        backend,
        SamplingParams(max_tokens=8),
        token_mode=True,
    )
    trajectories = asyncio.run(runner.run_batch([0, 0, 9]))  # 9: reset fails, no ids
    zero = to_skyrl(trajectories, pad_token_id=7, failures="zero")
    skyrl.validate(3, zero)
    assert 1 in zero["loss_masks"][1] and zero["rewards"][1] == 0.0
    assert (zero["response_ids"][2], zero["loss_masks"][2]) == ([7], [0])
    filtered = to_skyrl(trajectories, failures="zero", overlong_filtering=True)
    assert filtered["loss_masks"][0] == zero["loss_masks"][0]  # "stop": kept
    assert set(filtered["loss_masks"][1]) == {0}  # "error": filtered like an overlong row
    with pytest.raises(LlenvsError, match=r"rollout 1 failed .*EnvError: boom"):
        to_skyrl(trajectories, failures="raise")

    generator = SkyRLGenerator(runner)
    bad = generator_input(skyrl, [0], 1)
    bad["env_extras"] = [{"instance": 0}]
    with pytest.raises(LlenvsError, match="env_extras has no 'task'"):
        asyncio.run(generator.generate(bad))
    with pytest.raises(ValueError, match="failures"):
        SkyRLGenerator(runner, failures="drop")  # type: ignore[arg-type]


async def harbor_factory() -> HarborEnvironment:
    return await HarborAdapter().get_environment(EXAMPLES, max_steps=8)


@pytest.mark.docker
@pytest.mark.timeout(300)
def test_harbor_task_in_containers_through_the_generator(
    skyrl: Any, tokenizer: Any, no_containers_left: None
) -> None:
    commands = load_task(EXAMPLES / "organize-files").solution_commands()

    def solve(request: GenerationRequest) -> str:
        return shell_reply(commands[request.step] if request.step < len(commands) else "SUBMIT")

    async def main() -> dict[str, Any]:
        environment = await harbor_factory()
        try:
            runner = TrajectoryRunner(
                environment,
                word_backend(tokenizer, solve),
                SamplingParams(max_tokens=64),
                env_factory=harbor_factory,
                token_mode=True,
            )
            generator = skyrl_generator(runner, pad_token_id=tokenizer.pad_token_id)
            batch = generator_input(skyrl, ["llenvs-examples/organize-files"], 2)
            return await generator.generate(batch)
        finally:
            await environment.aclose()

    out = asyncio.run(main())
    skyrl.validate(2, out)
    assert out["rewards"] == [1.0, 1.0] and out["stop_reasons"] == ["stop", "stop"]
    assert [m["num_steps"] for m in out["env_metrics"]] == [len(commands) + 1] * 2
    assert all(0 in m and 1 in m for m in out["loss_masks"])


def test_importing_the_adapter_does_not_import_skyrl() -> None:
    code = (
        "import sys, llenvs_async.integrations.skyrl as s; print('skyrl' in sys.modules)\n"
        "sys.modules['skyrl'] = None\n"
        "from llenvs_async import ScriptedBackend, TrajectoryRunner\n"
        "from llenvs_async.envs import ChainEnv\n"
        "runner = TrajectoryRunner(ChainEnv(), ScriptedBackend(lambda r: 'right'))\n"
        "try:\n    s.skyrl_generator(runner)\nexcept s.SkyRLUnavailableError as e:\n"
        "    print(isinstance(e, ImportError), 'llenvs-async[skyrl]' in str(e))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT
    )
    assert done.stdout.split() == ["False", "True", "True"], done.stderr
