"""Harbor tasks and datasets, HarborAdapter/HarborEnvironment, restore (replay or
snapshot-fork) and replay checks; separate verifiers, artifacts and multi-step tasks."""

from __future__ import annotations

from .adapter import HarborAdapter, default_cache_dir
from .episode.environment import HarborEnvironment, HarborRuntime
from .episode.steps import oracle_actions, start_at_step
from .images.image import BuildSettings, ImageResolver, TaskImages, normalise_image_ref
from .oracle import (
    HARBOR_DESTRUCTIVE,
    HARBOR_MISTAKES,
    dataset_oracle,
    harbor_mistakes,
    harbor_oracle,
    next_solution_command,
)
from .restore.consistency import collect_probes, default_probes, validate_replay_consistency
from .restore.replay import harbor_restore
from .restore.snapshot import SnapshotRestore, SnapshotStats
from .settings import HarborSettings, HarborSettingsError
from .tasks.config import (
    AgentConfig,
    ArtifactSpec,
    Author,
    CollectHook,
    EnvironmentConfig,
    NetworkMode,
    SolutionConfig,
    StepConfig,
    TaskConfig,
    TaskInfo,
    VerifierConfig,
)
from .tasks.dataset import HarborDataset, load_local_dataset
from .tasks.registry import (
    DEFAULT_REGISTRY_URL,
    RegistryDataset,
    RegistryTask,
    TaskCache,
    parse_registry,
    split_dataset_spec,
)
from .tasks.task import HarborTask, TaskStep, load_task
from .tasks.task_toml import parse_task_config
from .verify.verifier import VerifierResult, parse_reward

__all__ = [
    "HARBOR_DESTRUCTIVE",
    "HARBOR_MISTAKES",
    "DEFAULT_REGISTRY_URL",
    "AgentConfig",
    "ArtifactSpec",
    "Author",
    "BuildSettings",
    "CollectHook",
    "EnvironmentConfig",
    "HarborAdapter",
    "HarborDataset",
    "HarborEnvironment",
    "HarborRuntime",
    "HarborSettings",
    "HarborSettingsError",
    "HarborTask",
    "ImageResolver",
    "NetworkMode",
    "RegistryDataset",
    "RegistryTask",
    "SnapshotRestore",
    "SnapshotStats",
    "SolutionConfig",
    "StepConfig",
    "TaskCache",
    "TaskConfig",
    "TaskImages",
    "TaskInfo",
    "TaskStep",
    "VerifierConfig",
    "VerifierResult",
    "collect_probes",
    "default_cache_dir",
    "default_probes",
    "dataset_oracle",
    "harbor_mistakes",
    "harbor_oracle",
    "harbor_restore",
    "next_solution_command",
    "load_local_dataset",
    "load_task",
    "normalise_image_ref",
    "oracle_actions",
    "parse_registry",
    "parse_reward",
    "parse_task_config",
    "split_dataset_spec",
    "start_at_step",
    "validate_replay_consistency",
]
