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
import re
from dataclasses import dataclass, field
from typing import Any

from hydra.core.config_store import ConfigStore
from hydra.errors import CompactHydraException
from omegaconf import MISSING, DictConfig, ListConfig, OmegaConf

from attnlab.attention import AttentionConfig
from attnlab.checks import non_negative_int, non_negative_number, positive_int, positive_number, probability


class ConfigError(CompactHydraException, ValueError):
    """A bad configuration value; the message says which key, what value, what is accepted.

    Hydra prints it as one line (no traceback).
    """


def check(function) -> dict:
    return {"check": function}


# --- the schema ----------------------------------------------------------------------


@dataclass
class ModelSchema:
    """conf/model: the fields of attnlab.models.ModelConfig (ranges checked there) and the kind."""

    kind: str = "transformer"
    d_model: int = 64
    n_heads: int = 4
    d_k: int | None = None
    d_v: int | None = None
    d_ff: int = 256
    n_layers: int = 2
    dropout: float = 0.1
    max_len: int = 256
    pre_norm: bool = False
    tie_embeddings: bool = True


@dataclass
class OptimSchema:
    name: str = "adam"
    lr: float = field(default=3e-3, metadata=check(positive_number))
    betas: list[float] = field(default_factory=lambda: [0.9, 0.98])
    eps: float = field(default=1e-9, metadata=check(positive_number))
    weight_decay: float = field(default=0.0, metadata=check(non_negative_number))
    schedule: str = "inverse_sqrt"
    warmup_steps: int = field(default=100, metadata=check(positive_int))
    label_smoothing: float = field(default=0.1, metadata=check(probability))


@dataclass
class TrainerSchema:
    """Lightning Trainer arguments (passed as they are). Training is counted in optimizer steps."""

    accelerator: str = "cpu"
    devices: Any = 1
    strategy: str = "auto"
    precision: Any = "32-true"
    max_steps: int = field(default=600, metadata=check(positive_int))
    min_steps: int | None = None
    val_check_interval: int = field(default=200, metadata=check(positive_int))
    check_val_every_n_epoch: int | None = None
    log_every_n_steps: int = field(default=10, metadata=check(positive_int))
    gradient_clip_val: float | None = field(default=1.0, metadata=check(lambda n, v: non_negative_number(n, v, True)))
    gradient_clip_algorithm: str | None = None
    accumulate_grad_batches: int = field(default=1, metadata=check(positive_int))
    limit_val_batches: Any = None
    limit_test_batches: Any = None
    num_sanity_val_steps: int = field(default=0, metadata=check(non_negative_int))
    num_nodes: int = field(default=1, metadata=check(positive_int))
    enable_progress_bar: bool = True
    enable_model_summary: bool = False
    deterministic: bool = False


@dataclass
class ProbesSchema:
    enabled: bool = True
    every_n_steps: int = field(default=50, metadata=check(positive_int))
    gradients: bool = True
    attention: bool = True
    temperature: bool = True
    chunk_size: int = field(default=256, metadata=check(positive_int))


@dataclass
class CallbacksSchema:
    checkpoint_every_n_steps: int = field(default=100, metadata=check(positive_int))
    probes: ProbesSchema = field(default_factory=ProbesSchema)


@dataclass
class LoggerSchema:
    csv: bool = True
    wandb: bool = True
    project: str = "attnlab"
    entity: str | None = None
    group: str | None = None
    tags: list[str] = field(default_factory=list)


@dataclass
class DataSchema:
    """What every data config has."""

    name: str = MISSING
    batch_size: int = field(default=64, metadata=check(positive_int))
    eval_batch_size: int | None = field(default=None, metadata=check(lambda n, v: positive_int(n, v, True)))
    num_workers: int = field(default=0, metadata=check(non_negative_int))


@dataclass
class SyntheticSchema(DataSchema):
    vocab: int = field(default=16, metadata=check(positive_int))
    min_len: int = field(default=4, metadata=check(positive_int))
    max_len: int = field(default=12, metadata=check(positive_int))
    train_size: int = field(default=10000, metadata=check(positive_int))
    val_size: int = field(default=500, metadata=check(positive_int))
    test_size: int = field(default=500, metadata=check(positive_int))
    seed: int | None = None  # null = the run's seed


@dataclass
class FilesSchema:
    train: str | None = None
    validation: str | None = None
    test: str | None = None


@dataclass
class CorpusSchema(DataSchema):
    """Real text: where it comes from, its fixed splits and its BPE."""

    source: str = "files"
    files: FilesSchema = field(default_factory=FilesSchema)
    vocab_size: int = field(default=8000, metadata=check(positive_int))
    val_size: int = field(default=500, metadata=check(positive_int))
    test_size: int = field(default=500, metadata=check(positive_int))
    split_seed: int = 0


@dataclass
class TranslationHubSchema:
    name: str = "wmt14"
    subset: str | None = "de-en"
    source_lang: str = "en"
    target_lang: str = "de"


@dataclass
class TranslationSchema(CorpusSchema):
    source: str = "sword"
    sword_dir: str = MISSING
    source_module: str = "engWEB2015eb"
    target_module: str = "spaRV1909eb"
    hub: TranslationHubSchema = field(default_factory=TranslationHubSchema)
    max_ratio: float = field(default=2.0, metadata=check(positive_number))
    max_tokens: int = field(default=96, metadata=check(positive_int))
    bleu_batches: int = field(default=2, metadata=check(non_negative_int))


@dataclass
class TextHubSchema:
    name: str = "wikitext"
    subset: str | None = "wikitext-2-raw-v1"
    text_column: str = "text"


@dataclass
class TextSchema(CorpusSchema):
    hub: TextHubSchema = field(default_factory=TextHubSchema)
    vocab_size: int = field(default=4000, metadata=check(positive_int))
    block_size: int = field(default=64, metadata=check(positive_int))


@dataclass
class TrainSchema:
    """conf/train.yaml: the run's own keys, and one typed node per config group."""

    name: str = "default"
    seed: int = 0
    resume: str | None = None
    test: bool = True
    optimized_metric: str = "val/loss"
    run_dir: str = MISSING
    cache_dir: str = MISSING
    attention: AttentionConfig = field(default_factory=AttentionConfig)
    model: ModelSchema = field(default_factory=ModelSchema)
    data: Any = MISSING  # each conf/data/*.yaml extends its own schema
    optim: OptimSchema = field(default_factory=OptimSchema)
    trainer: TrainerSchema = field(default_factory=TrainerSchema)
    logger: LoggerSchema = field(default_factory=LoggerSchema)
    callbacks: CallbacksSchema = field(default_factory=CallbacksSchema)


def register_schemas() -> None:
    store = ConfigStore.instance()
    store.store(group="schema", name="train", node=TrainSchema)
    for name, node in {"synthetic": SyntheticSchema, "translation": TranslationSchema, "text": TextSchema}.items():
        store.store(group="schema/data", name=name, node=node)


register_schemas()


# --- the checks ----------------------------------------------------------------------


def choice(key: str, value, accepted) -> None:
    if value not in accepted:
        raise ConfigError(f"{key}={value!r} is not valid; accepted values: {', '.join(map(str, accepted))}")


def qualify(error: ValueError, prefix: str, names) -> ConfigError:
    """'d_k=0 is not valid…' from a library check → 'model.d_k=0 is not valid…'."""
    pattern = re.compile(rf"(?<![\w.])({'|'.join(map(re.escape, names))})=")
    return ConfigError(pattern.sub(rf"{prefix}.\1=", str(error)))


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


def validate(cfg: DictConfig, datasets: dict) -> None:
    """Everything a run config must satisfy that Hydra's types cannot say."""
    from attnlab.models import MODELS, ModelConfig
    from attnlab.optim import OPTIMIZERS, SCHEDULES

    check_node(cfg, "")
    attention = OmegaConf.to_container(cfg.attention, resolve=True)
    try:
        attention = AttentionConfig(**attention)
    except (TypeError, ValueError) as error:
        raise qualify(error, "attention", [f.name for f in dataclasses.fields(AttentionConfig)]) from None
    model = OmegaConf.to_container(cfg.model, resolve=True)
    choice("model.kind", model.pop("kind", None), list(MODELS))
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
