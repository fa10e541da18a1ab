"""Checks a composed run config before anything trains, naming key, value and choices."""

from __future__ import annotations

from numbers import Real

from omegaconf import DictConfig

from attnlab.attention import parse_rule, variant_class

MODEL_KINDS = ("transformer", "lm")
OPTIMIZERS = ("adam", "adamw")
SCHEDULES = ("inverse_sqrt", "cosine", "constant")


class ConfigError(ValueError):
    """A bad configuration value; the message says which key, what value, what is accepted."""


def choice(key: str, value, accepted) -> None:
    if value not in accepted:
        raise ConfigError(f"{key}={value!r} is not valid; accepted values: {', '.join(map(str, accepted))}")


def positive(key: str, value) -> None:
    if not (isinstance(value, Real) and not isinstance(value, bool) and value > 0):
        raise ConfigError(f"{key}={value!r} is not valid; it must be a positive number")


def validate(cfg: DictConfig, datasets: dict) -> None:
    try:  # the same checks the builders make, raised before anything is built
        parse_rule(cfg.attention.scale)
        variant_class(cfg.attention.variant)
    except ValueError as error:
        raise ConfigError(str(error)) from error
    if cfg.attention.tau_init is not None:
        positive("attention.tau_init", cfg.attention.tau_init)

    model = cfg.model
    choice("model.kind", model.kind, MODEL_KINDS)
    for key in ("d_model", "n_heads", "n_layers", "d_ff", "max_len"):
        positive(f"model.{key}", model[key])
    for key in ("d_k", "d_v"):
        if model[key] is not None:
            positive(f"model.{key}", model[key])
    if model.d_k is None and model.d_model % model.n_heads:
        divisors = [h for h in range(1, model.d_model + 1) if model.d_model % h == 0]
        raise ConfigError(
            f"model.d_model={model.d_model} is not divisible by model.n_heads={model.n_heads}, so "
            f"model.d_k cannot default to d_model / n_heads; set model.d_k explicitly or use "
            f"model.n_heads in {divisors}"
        )

    choice("data.name", cfg.data.name, sorted(datasets))
    if cfg.data.name == "text" and model.kind != "lm":
        raise ConfigError("data=text is a language-modelling corpus; use model=lm with it")
    positive("data.batch_size", cfg.data.batch_size)

    choice("optim.name", cfg.optim.name, OPTIMIZERS)
    choice("optim.schedule", cfg.optim.schedule, SCHEDULES)
    positive("optim.lr", cfg.optim.lr)
    positive("trainer.max_steps", cfg.trainer.max_steps)
