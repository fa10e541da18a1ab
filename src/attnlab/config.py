"""The run config: its schema (typed, registered in Hydra's ConfigStore) and its checks.

Every ``conf/<group>/*.yaml`` extends one of the dataclasses below through its defaults
list (``- /schema/optim@_here_``), and ``conf/train.yaml`` extends ``TrainSchema``.
Hydra itself then rejects a value of the wrong type (``seed=abc``, ``model.d_k=16.5``)
or an unknown key, naming it. ``validate`` checks what a type cannot say, before
anything is built: ranges (the ``check`` in a field's metadata, or the library's own
dataclasses: ``AttentionConfig``, ``ModelConfig``), keys added with ``+`` that nothing
reads, and rules between fields. Accepted values come from the registries the keys
select from (``MODELS``, ``DATASETS``, ``OPTIMIZERS`` …), never from a second list.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib
import re
import shutil
import typing
from dataclasses import dataclass, field
from typing import Any

from hydra.core.config_store import ConfigStore
from hydra.errors import CompactHydraException
from omegaconf import MISSING, DictConfig, ListConfig, OmegaConf

from attnlab.attention import AttentionConfig
from attnlab.checks import non_negative_int, non_negative_number, positive_int, positive_number, probability
from attnlab.data.synthetic import check_sizes
from attnlab.evaluation import DECODERS
from attnlab.models import ModelConfig


class ConfigError(CompactHydraException, ValueError):
    """A bad configuration value; the message says which key, what value, what is accepted.

    Hydra prints it as one line (no traceback).
    """


def check(function) -> dict:
    return {"check": function}


# --- the schema ----------------------------------------------------------------------
# Types and ranges only: the default values live in conf/ (MISSING here = the YAML sets it).


# conf/model: model.kind, the fields of attnlab.models.ModelConfig (it checks their ranges)
# but the two that come from elsewhere: vocab_size (the data) and attention (its own group),
# and how to run it: model.compile (torch.compile) and its mode.
_model_hints = typing.get_type_hints(ModelConfig)
_model_fields = [f.name for f in dataclasses.fields(ModelConfig) if f.name not in ("vocab_size", "attention")]
ModelSchema = dataclasses.make_dataclass(
    "ModelSchema",
    [("kind", str, MISSING)]
    + [(name, _model_hints[name], MISSING) for name in _model_fields]
    + [("compile", bool, False), ("compile_mode", str, "default")],
)
COMPILE_MODES = ["default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"]
ModelSchema.__module__ = __name__  # picklable by name, like the schemas written as classes


@dataclass
class OptimSchema:
    name: str = MISSING
    lr: float = field(default=MISSING, metadata=check(positive_number))
    betas: list[float] = MISSING
    eps: float = field(default=MISSING, metadata=check(positive_number))
    weight_decay: float = field(default=MISSING, metadata=check(non_negative_number))
    schedule: str = MISSING
    warmup_steps: int = field(default=MISSING, metadata=check(positive_int))
    label_smoothing: float = field(default=MISSING, metadata=check(probability))


@dataclass
class TrainerSchema:
    """Lightning Trainer arguments (passed as they are). Training is counted in optimizer steps.

    conf/trainer/cpu.yaml sets the first group; the rest keep Lightning's defaults."""

    accelerator: str = MISSING
    devices: Any = MISSING
    strategy: str = MISSING
    precision: Any = MISSING
    max_steps: int = field(default=MISSING, metadata=check(positive_int))
    val_check_interval: int = field(default=MISSING, metadata=check(positive_int))
    check_val_every_n_epoch: int | None = MISSING
    log_every_n_steps: int = field(default=MISSING, metadata=check(positive_int))
    gradient_clip_val: float | None = field(
        default=MISSING, metadata=check(lambda n, v: non_negative_number(n, v, True))
    )
    num_sanity_val_steps: int = field(default=MISSING, metadata=check(non_negative_int))
    enable_progress_bar: bool = MISSING
    enable_model_summary: bool = MISSING
    deterministic: bool = MISSING
    min_steps: int | None = None
    gradient_clip_algorithm: str | None = None
    accumulate_grad_batches: int = field(default=1, metadata=check(positive_int))
    limit_val_batches: Any = None
    limit_test_batches: Any = None
    num_nodes: int = field(default=1, metadata=check(positive_int))
    # conf/debug/*.yaml
    fast_dev_run: Any = False
    overfit_batches: Any = 0.0
    limit_train_batches: Any = None
    profiler: Any = None  # "simple", "advanced", or {_target_: <a Lightning profiler>, ...}
    detect_anomaly: bool = False


@dataclass
class ProbesSchema:
    enabled: bool = MISSING
    every_n_steps: int = field(default=MISSING, metadata=check(positive_int))
    gradients: bool = MISSING
    attention: bool = MISSING
    temperature: bool = MISSING
    activations: bool = False
    maps_every_n_steps: int | None = field(default=None, metadata=check(lambda n, v: positive_int(n, v, True)))
    chunk_size: int = field(default=MISSING, metadata=check(positive_int))


@dataclass
class AverageSchema:
    last_k: int | None = field(default=None, metadata=check(lambda n, v: positive_int(n, v, True)))
    every_n_steps: int = field(default=1000, metadata=check(positive_int))


@dataclass
class CallbacksSchema:
    checkpoint_every_n_steps: int = field(default=MISSING, metadata=check(positive_int))
    average: AverageSchema = field(default_factory=AverageSchema)
    probes: ProbesSchema = MISSING
    # Any Lightning callback, by name: {_target_: <class>, <its arguments>} (conf/callbacks/extra/)
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class LoggerSchema:
    csv: bool = True
    wandb: bool = True
    project: str = "attnlab"
    entity: str | None = None
    group: str | None = None
    tags: list[str] = field(default_factory=list)
    # Any Lightning logger, by name: {_target_: <class>, <its arguments>}
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class PathsSchema:
    """conf/paths: where runs, sweeps and caches go."""

    cache_dir: str = MISSING  # datasets, tokenizers, the corpus
    outputs: str = MISSING  # single runs: <outputs>/<name>/<time>
    multirun: str = MISSING  # sweeps: <multirun>/<name>/<time>/<job>


@dataclass
class DataSchema:
    """What every data config has."""

    name: str = MISSING
    batch_size: int = field(default=MISSING, metadata=check(positive_int))
    eval_batch_size: int | None = field(default=None, metadata=check(lambda n, v: positive_int(n, v, True)))
    num_workers: int = field(default=0, metadata=check(non_negative_int))
    # Token-based batches: at most this many (padded) tokens per batch instead of batch_size examples.
    max_tokens: int | None = field(default=None, metadata=check(lambda n, v: positive_int(n, v, True)))


@dataclass
class SyntheticSchema(DataSchema):
    vocab: int = field(default=MISSING, metadata=check(positive_int))
    min_len: int = field(default=MISSING, metadata=check(positive_int))
    max_len: int = field(default=MISSING, metadata=check(positive_int))
    train_size: int = field(default=MISSING, metadata=check(positive_int))
    val_size: int = field(default=MISSING, metadata=check(positive_int))
    test_size: int = field(default=MISSING, metadata=check(positive_int))
    seed: int | None = None  # null = the run's seed
    eval_lengths: list[int] = field(default_factory=list)  # after training: test sets of these lengths


@dataclass
class FilesSchema:
    train: str | None = MISSING
    validation: str | None = MISSING
    test: str | None = MISSING


@dataclass
class CorpusSchema(DataSchema):
    """Real text: where it comes from, its fixed splits and its BPE."""

    source: str = MISSING
    files: FilesSchema = MISSING
    vocab_size: int = field(default=MISSING, metadata=check(positive_int))
    val_size: int = field(default=MISSING, metadata=check(positive_int))
    test_size: int = field(default=MISSING, metadata=check(positive_int))
    split_seed: int = MISSING


@dataclass
class TranslationHubSchema:
    name: str = MISSING
    subset: str | None = MISSING
    source_lang: str = MISSING
    target_lang: str = MISSING


@dataclass
class BleuSchema:
    """How val/bleu and test/bleu decode (attnlab/evaluation.py)."""

    val: str = field(default=MISSING, metadata=check(lambda n, v: choice(n, v, DECODERS)))
    test: str = field(default=MISSING, metadata=check(lambda n, v: choice(n, v, DECODERS)))
    beam: int = field(default=MISSING, metadata=check(positive_int))
    alpha: float = field(default=MISSING, metadata=check(non_negative_number))
    extra_length: int = field(default=MISSING, metadata=check(positive_int))


@dataclass
class TranslationSchema(CorpusSchema):
    sword_dir: str = MISSING
    source_module: str = MISSING
    target_module: str = MISSING
    hub: TranslationHubSchema = MISSING
    max_ratio: float = field(default=MISSING, metadata=check(positive_number))
    max_length: int = field(default=MISSING, metadata=check(positive_int))
    bleu: BleuSchema = MISSING


@dataclass
class TextHubSchema:
    name: str = MISSING
    subset: str | None = MISSING
    text_column: str = MISSING


@dataclass
class TextSchema(CorpusSchema):
    hub: TextHubSchema = MISSING
    vocab_size: int = field(default=MISSING, metadata=check(positive_int))
    block_size: int = field(default=MISSING, metadata=check(positive_int))


@dataclass
class TrainSchema:
    """conf/train.yaml: the run's own keys, and one typed node per config group."""

    name: str = MISSING
    seed: int = MISSING
    resume: str | None = MISSING
    test: bool = MISSING
    optimized_metric: str = MISSING
    imports: list[str] = field(default_factory=list)
    run_dir: str = MISSING
    paths: PathsSchema = MISSING
    attention: AttentionConfig = MISSING
    model: ModelSchema = MISSING
    data: Any = MISSING  # each conf/data/*.yaml extends its own schema
    optim: OptimSchema = MISSING
    trainer: TrainerSchema = MISSING
    logger: LoggerSchema = MISSING
    callbacks: CallbacksSchema = MISSING


def register_schemas() -> None:
    """schema/train (conf/train.yaml extends it) types every group's node; each group's schema
    is also stored on its own, for configs of yours to extend (``- /schema/model@_here_``)."""
    store = ConfigStore.instance()
    groups = {"train": TrainSchema, "attention": AttentionConfig, "model": ModelSchema, "optim": OptimSchema,
              "trainer": TrainerSchema, "logger": LoggerSchema, "callbacks": CallbacksSchema,
              "paths": PathsSchema}  # fmt: skip
    for name, node in groups.items():
        store.store(group="schema", name=name, node=node)
    for name, node in {"synthetic": SyntheticSchema, "translation": TranslationSchema, "text": TextSchema}.items():
        store.store(group="schema/data", name=name, node=node)


register_schemas()


# --- the checks ----------------------------------------------------------------------


def choice(key: str, value, accepted) -> None:
    if value not in accepted:
        raise ConfigError(f"{key}={value!r} is not valid; accepted values: {', '.join(map(str, accepted))}")


def qualify(error: ValueError, prefix: str, names) -> ConfigError:
    """'d_k=0 is not valid…' from a library check → 'model.d_k=0 is not valid…' (also 'scale_options.x.y=')."""
    pattern = re.compile(rf"(?<![\w.])({'|'.join(map(re.escape, names))})(?=[=.])")
    return ConfigError(pattern.sub(rf"{prefix}.\1", str(error)))


def check_node(node: DictConfig, path: str) -> None:
    """Keys a schema does not know (added with +) and the ranges in its fields' metadata."""
    schema = OmegaConf.get_type(node)
    if not dataclasses.is_dataclass(schema):
        return  # an untyped node (a user's own config group): nothing to check against
    fields = {f.name: f for f in dataclasses.fields(schema)}
    for key in node:
        if key not in fields and not (path == "" and key == "hydra"):
            close = difflib.get_close_matches(str(key), fields, n=1)
            hint = f"did you mean {path}{close[0]}? " if close else ""
            raise ConfigError(
                f"{path}{key} is not a setting of {path.rstrip('.') or 'the run'} (nothing reads it); {hint}"
                f"accepted keys: {', '.join(fields)}"
            )
    for name, spec in fields.items():
        value = node._get_node(name)
        if isinstance(value, DictConfig):
            check_node(value, f"{path}{name}.")
        elif not isinstance(value, ListConfig) and "check" in spec.metadata:
            try:
                spec.metadata["check"](f"{path}{name}", node[name])
            except ValueError as error:
                raise ConfigError(str(error)) from None


def check_target(key: str, spec) -> None:
    """An entry that names a class to build: {_target_: <importable class>, <its arguments>}; null switches it off."""
    if spec is None:
        return
    if not isinstance(spec, DictConfig) or "_target_" not in spec:
        example = "lightning.pytorch.callbacks.EarlyStopping"
        raise ConfigError(f"{key}={spec!r}: give {{_target_: <a class, e.g. {example}>, <its arguments>}}, "
                          "or null to switch it off")  # fmt: skip
    module, _, name = str(spec._target_).rpartition(".")
    try:
        getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError, ValueError) as error:
        raise ConfigError(f"{key}._target_={spec._target_!r} cannot be imported ({error}); "
                          "give the full dotted path of a class") from None  # fmt: skip


def import_plugins(modules) -> None:
    """Import the modules named in ``imports``: your own variants and rules register themselves there."""
    for module in modules:
        try:
            importlib.import_module(module)
        except ImportError as error:
            raise ConfigError(
                f"imports: module {module!r} cannot be imported ({error}); give a module on PYTHONPATH "
                "(e.g. imports=[my_rules] with my_rules.py in the working directory or PYTHONPATH)"
            ) from None


def validate(cfg: DictConfig, datasets: dict) -> None:
    """Everything a run config must satisfy that Hydra's types cannot say."""
    from attnlab.models import MODELS
    from attnlab.optim import OPTIMIZERS, SCHEDULES

    check_node(cfg, "")
    import_plugins(cfg.get("imports") or [])
    attention = OmegaConf.to_container(cfg.attention, resolve=True)
    try:
        attention = AttentionConfig(**attention)
    except (TypeError, ValueError) as error:
        raise qualify(error, "attention", [f.name for f in dataclasses.fields(AttentionConfig)]) from None
    model = OmegaConf.to_container(cfg.model, resolve=True)
    choice("model.kind", model.pop("kind", None), list(MODELS))
    choice("model.compile_mode", model.pop("compile_mode", "default"), COMPILE_MODES)
    if model.pop("compile", False) and not any(shutil.which(cxx) for cxx in ("c++", "g++", "clang++")):
        raise ConfigError(
            "model.compile=true needs a C++ compiler for torch.compile's generated code, and none is on PATH "
            "(c++, g++, clang++); install one (Debian: apt install g++) or leave model.compile=false"
        )
    try:
        ModelConfig(vocab_size=1, attention=attention, **model)
    except (TypeError, ValueError) as error:
        raise qualify(error, "model", [f.name for f in dataclasses.fields(ModelConfig)]) from None

    data = cfg.data
    choice("data.name", data.name, sorted(datasets))
    if data.name == "text" and cfg.model.kind != "lm":
        raise ConfigError("data=text is a language-modelling corpus; use model=lm with it")
    if "source" in data:
        from attnlab.data import SOURCES

        choice("data.source", data.source, list(SOURCES[data.name]))
    if "min_len" in data and data.min_len > data.max_len:
        raise ConfigError(f"data.min_len={data.min_len} > data.max_len={data.max_len}; need min_len <= max_len")
    for length in data.get("eval_lengths") or []:
        try:
            check_sizes(data.name, data.vocab, length, length)
        except ValueError as error:
            raise ConfigError(f"data.eval_lengths={list(data.eval_lengths)}: {error}") from None

    for group in ("callbacks", "logger"):
        for name, spec in cfg[group].extra.items():
            check_target(f"{group}.extra.{name}", spec)
    if isinstance(cfg.trainer.profiler, DictConfig):
        check_target("trainer.profiler", cfg.trainer.profiler)

    choice("optim.name", cfg.optim.name, list(OPTIMIZERS))
    choice("optim.schedule", cfg.optim.schedule, list(SCHEDULES))
    for beta in cfg.optim.betas:
        if not 0 <= beta < 1:
            raise ConfigError(f"optim.betas={list(cfg.optim.betas)} is not valid; each must be in [0, 1)")

    trainer = cfg.trainer
    if str(trainer.accelerator) in ("gpu", "cuda"):
        import torch

        if not torch.cuda.is_available():
            raise ConfigError(
                f"trainer.accelerator={trainer.accelerator!r} but torch sees no CUDA GPU "
                f"(torch {torch.__version__}, torch.cuda.is_available() is False); "
                "use trainer=cpu or trainer=ddp_cpu here, or install a CUDA build of torch on a GPU machine"
            )
