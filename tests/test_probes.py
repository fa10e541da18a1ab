"""Probes against independent references: hand-built weights, autograd, direct formulas, the science."""

import math

import lightning as L
import pytest
import torch
from omegaconf import OmegaConf

from attnlab import wandb_records
from attnlab.attention import AttentionConfig, MultiHeadAttention
from attnlab.data import build_data
from attnlab.data.module import IGNORE
from attnlab.models import attention_layers, sequence_loss
from attnlab.probes import AttentionRecord, attention_entropy, layer_statistics, recording
from attnlab.probes.maps import crop, draw
from attnlab.probes.statistics import records_statistics
from attnlab.runs import read_metrics
from attnlab.task import SequenceTask
from helpers import cli, compose_run, run_train, wandb_run_files

# --- entropy on hand-built weights -------------------------------------------------------


def test_entropy_of_uniform_one_hot_and_masked_rows():
    weights = torch.tensor(
        [
            [0.25, 0.25, 0.25, 0.25],  # uniform over 4 → log 4
            [0.0, 1.0, 0.0, 0.0],  # one-hot → 0
            [0.5, 0.5, 0.0, 0.0],  # uniform over the 2 visible keys → log 2
        ]
    )
    torch.testing.assert_close(attention_entropy(weights), torch.tensor([math.log(4), 0.0, math.log(2)]))


def test_layer_entropy_ignores_masked_keys_and_padded_queries():
    # one head, 3 queries over 4 keys; query 2 is padding; key 3 is masked for everyone
    weights = torch.tensor([[[[0.5, 0.5, 0.0, 0.0], [1 / 3, 1 / 3, 1 / 3, 0.0], [0.1, 0.2, 0.3, 0.0]]]])
    real_keys = torch.tensor([True, True, True, False])[None, None, None, :]
    real_queries = torch.tensor([True, True, False])[None, None, :, None]
    stats = layer_statistics(weights, torch.zeros_like(weights), visible=real_keys & real_queries)
    expected = (math.log(2) + math.log(3)) / 2  # the padded query's row is not counted
    assert stats["entropy"].item() == pytest.approx(expected, rel=1e-6)
    # normalised by log(visible keys) = log 3 for both rows
    assert stats["entropy_norm"].item() == pytest.approx((math.log(2) / math.log(3) + 1) / 2, rel=1e-6)


def random_recorded_layer(heads=3, n=7, m=9, scale=3.0):
    logits = scale * torch.randn(2, heads, n, m, dtype=torch.float64)
    mask = torch.rand(2, 1, n, m) > 0.3
    mask[..., 0] = True
    mask[1, :, 4] = False  # a query that sees nothing
    mask[0, :, -2:] = False  # two padded queries
    weights = torch.softmax(logits.masked_fill(~mask, -math.inf), dim=-1).nan_to_num(0.0)
    grad = torch.randn_like(logits).masked_fill(~mask, 0.0)
    return weights, logits, grad, mask


def test_statistics_equal_direct_formulas_and_do_not_depend_on_chunking():
    weights, logits, grad, mask = random_recorded_layer()
    visible = mask.expand_as(weights)
    rows = visible.any(-1)
    stats = layer_statistics(weights, logits, grad, mask, chunk_size=2)

    jacobian = (weights * (1 - weights)).sum(-1)[rows].mean()
    assert stats["softmax_jac"].item() == pytest.approx(jacobian.item(), rel=1e-5)
    assert stats["saturation"].item() == pytest.approx((weights.max(-1).values > 0.99)[rows].float().mean().item())
    assert stats["logit_std"].item() == pytest.approx(logits[visible].std(unbiased=False).item(), rel=1e-5)
    assert stats["logit_max"].item() == pytest.approx(logits[visible].max().item(), rel=1e-6)
    assert stats["grad_logits"].item() == pytest.approx(grad[visible].square().mean().sqrt().item(), rel=1e-5)
    row_norms = (grad * visible).norm(dim=-1)[rows]
    assert stats["grad_logits_row_median"].item() == pytest.approx(row_norms.median().item(), rel=1e-5)
    per_head = torch.stack([attention_entropy(weights[:, h])[rows[:, h]].mean() for h in range(3)])
    torch.testing.assert_close(stats["entropy_per_head"], per_head.float())
    unchunked = layer_statistics(weights, logits, grad, mask, chunk_size=1000)
    for key, value in stats.items():
        torch.testing.assert_close(unchunked[key], value, msg=key)


def test_layers_stacked_on_a_leading_dim_get_what_each_gets_alone():
    layers = [random_recorded_layer() for _ in range(3)]
    together = layer_statistics(*(torch.stack(parts) for parts in zip(*layers, strict=True)), chunk_size=2)
    for index, parts in enumerate(layers):
        for key, value in layer_statistics(*parts, chunk_size=2).items():
            torch.testing.assert_close(together[key][index], value, msg=key)


def test_records_of_different_shapes_measured_together_get_what_each_gets_alone():
    records = []
    for n, m, masked in ((7, 9, True), (5, 9, True), (7, 6, False), (7, 9, True)):
        weights, logits, grad, mask = random_recorded_layer(n=n, m=m)
        logits.requires_grad_(True).grad = grad
        records.append(AttentionRecord(logits=logits, weights=weights, visible=mask if masked else None))
    for record, together in zip(records, records_statistics(records, chunk_size=3), strict=True):
        alone = layer_statistics(record.weights, record.logits, record.logits.grad, record.visible, chunk_size=3)
        assert together.keys() == alone.keys()
        for key, value in alone.items():
            torch.testing.assert_close(together[key], value, msg=key)


# --- the probes inside a real training run match autograd -----------------------------------

PROBE_EVERY_STEP = [
    "callbacks.probes.every_n_steps=1",
    "model.dropout=0.0",
    "trainer.max_steps=1",
    "test=false",
    "logger=csv",
    "model=lm",
    "data=reverse",
]


def initial_model_and_first_batch(cfg):
    """What train() builds, in the same order from the same seed: the model at init, batch 0."""
    resolved = OmegaConf.to_container(cfg, resolve=True)
    L.seed_everything(cfg.seed)
    data = build_data(cfg.data, cfg.model.kind, cfg.seed, cfg.paths.cache_dir)
    task = SequenceTask(resolved, data.vocab)
    return task, next(iter(data.train_dataloader())), resolved


def test_logged_gradient_probes_equal_autograd_on_the_same_batch(tmp_path):
    cfg = compose_run(tmp_path, PROBE_EVERY_STEP)
    task, batch, resolved = initial_model_and_first_batch(cfg)
    from attnlab.train import train

    train(cfg)
    logged = {k: v for row in read_metrics(tmp_path) if row["step"] == 0 for k, v in row.items()}

    # Reference: the same model at init on the same batch, recorded, with autograd asked for
    # d loss / d logits directly (not the probe's retained .grad), and the visible entries
    # built here from the batch's padding and the causal rule (not the record's mask).
    layers = attention_layers(task.model)
    with recording(*layers) as records:
        logits, targets = task(batch)
        loss = sequence_loss(logits, targets, IGNORE, resolved["optim"]["label_smoothing"])
        grads = torch.autograd.grad(loss, [record.logits for record in records], retain_graph=True)
        loss.backward()
    real = batch["mask"]
    length = real.shape[1]
    causal = torch.ones(length, length, dtype=torch.bool).tril()
    visible = (causal & real[:, None, :, None] & real[:, None, None, :]).expand_as(grads[0])

    # rows that see one key (the first causal query) are left out of all but the logit statistics
    counted = visible & (visible.sum(-1, keepdim=True) > 1)
    for layer, record, grad in zip(layers, records, grads, strict=True):
        rms = grad[counted].square().mean().sqrt().item()
        assert logged[f"grad/logits/{layer.name}"] == pytest.approx(rms, rel=1e-4)
        weights = record.weights.detach()
        jacobian = (weights * (1 - weights)).sum(-1)[counted.any(-1)].mean().item()
        assert logged[f"grad/softmax_jac/{layer.name}"] == pytest.approx(jacobian, rel=1e-4)
    for name, param in task.model.named_parameters():
        key = f"grad/norm/{name.removesuffix('.weight')}"
        if name.endswith(".weight") and key in logged:
            assert logged[key] == pytest.approx(torch.linalg.vector_norm(param.grad).item(), rel=1e-4), name
    assert "grad/norm/embed.tokens" in logged and "grad/norm/decoder.layers.0.self_attn.q_proj" in logged
    norms = [p.grad.norm() for p in task.model.parameters() if p.grad is not None]
    assert logged["grad/global_norm"] == pytest.approx(torch.stack(norms).norm().item(), rel=1e-4)


def test_activation_probe_logs_the_mean_size_of_each_output_at_init(tmp_path):
    """act/* at step 0 against the LM's forward spelled out by hand on the same batch."""
    cfg = compose_run(tmp_path, [*PROBE_EVERY_STEP, "callbacks.probes.activations=true", "model.n_layers=2"])
    task, batch, _ = initial_model_and_first_batch(cfg)
    from attnlab.train import train

    train(cfg)
    logged = {k: v for row in read_metrics(tmp_path) if row["step"] == 0 for k, v in row.items()}
    model, mask = task.model.train(), batch["mask"]
    expected = {}
    with torch.no_grad():
        x = model.embed(batch["tokens"])
        expected["act/embed"] = x
        for index, block in enumerate(model.decoder.layers):  # model=lm is pre-LN: x + sublayer(norm(x))
            attended = block.self_attn(block.norms[0](x), key_mask=mask, causal=True)
            x = x + attended
            ffn = block.ffn(block.norms[1](x))
            x = x + ffn
            path = f"act/decoder.layers.{index}"
            expected.update({f"{path}.self_attn": attended, f"{path}.ffn": ffn, path: x})
        expected["act/head"] = model.head(model.decoder.final_norm(x))
    for key, output in expected.items():
        assert logged[key] == pytest.approx(output.abs().mean().item(), rel=1e-4), key


def test_attention_map_at_step_0_is_the_initial_models_weights_on_the_first_validation_example(tmp_path):
    maps = "callbacks.probes.maps_every_n_steps=1"
    cfg = compose_run(tmp_path, [*PROBE_EVERY_STEP, "model=transformer", "data=copy", maps])
    task, _, _ = initial_model_and_first_batch(cfg)
    data = build_data(cfg.data, cfg.model.kind, cfg.seed, cfg.paths.cache_dir)
    data.setup("fit")
    batch = next(iter(data.val_dataloader()))
    example = {key: value[:1] for key, value in batch.items() if isinstance(value, torch.Tensor)}
    from attnlab.train import train

    train(cfg)
    # Reference: the initial model in eval mode on that example, recorded here, drawn with the same renderer.
    model = task.model.eval()
    with torch.no_grad(), recording(*attention_layers(model)) as records:
        model.forward_batch(example)
    weights = {layer.name: record.weights[0] for layer, record in zip(attention_layers(model), records, strict=True)}
    lengths = {"src": int(example["src_mask"].sum()), "tgt": int(example["tgt_mask"].sum()), "tokens": None}
    reference = draw(weights, lengths, tmp_path / "reference.png", step=0)
    assert (tmp_path / "attention_maps" / "step_000000.png").read_bytes() == reference.read_bytes()
    assert crop("dec.cross.L0", weights["dec.cross.L0"], lengths).shape[1:] == (lengths["tgt"], lengths["src"])


class RecordingCheck(L.Callback):
    """Runs after the probes' hooks: which steps took the explicit path."""

    def __init__(self):
        self.recorded_steps = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if all(layer.record is not None for layer in attention_layers(pl_module.model)):
            self.recorded_steps.append(trainer.global_step)


def test_only_probe_steps_take_the_explicit_path(tmp_path):
    check = RecordingCheck()
    run_train(tmp_path, "callbacks.probes.every_n_steps=4", "trainer.max_steps=9", "logger=csv",
              "test=false", extra_callbacks=(check,))  # fmt: skip
    assert check.recorded_steps == [0, 4, 8]


# --- the science at initialisation ---------------------------------------------------------


def init_statistics(rule, d_k=256, n=16):
    """One head with d_k = 256 at init, unit-variance random inputs, a random upstream gradient."""
    torch.manual_seed(0)
    layer = MultiHeadAttention(d_k, 1, attn=AttentionConfig(scale=rule))
    x = torch.randn(64, n, d_k)
    with recording(layer) as [record]:
        (layer(x) * torch.randn(64, n, d_k)).sum().backward()
    stats = layer_statistics(record.weights, record.logits, record.logits.grad)
    return {key: value.item() for key, value in stats.items() if key != "entropy_per_head"}


def test_at_init_unscaled_logits_saturate_and_starve_the_typical_row():
    """Unscaled, the logits' std is √d_k = 16, rows saturate and the gradient at
    the logits vanishes for the typical row. Its RMS does not show this: the few rows whose
    top two logits nearly tie get large gradients and dominate the mean square."""
    stats = {rule: init_statistics(rule) for rule in ("none", "sqrt_dk", "dk")}
    for rule, values in stats.items():
        print(rule, {key: round(value, 5) for key, value in values.items()})
    entropy = {rule: s["entropy"] for rule, s in stats.items()}
    saturation = {rule: s["saturation"] for rule, s in stats.items()}
    assert entropy["none"] < entropy["sqrt_dk"] < entropy["dk"] <= math.log(16) + 1e-6
    assert saturation["none"] == max(saturation.values()) and saturation["none"] > 0.3
    assert stats["sqrt_dk"]["logit_std"] == pytest.approx(1.0, rel=0.15)
    assert stats["none"]["logit_std"] == pytest.approx(16.0, rel=0.15)
    typical = stats["sqrt_dk"]["grad_logits_row_median"] / stats["none"]["grad_logits_row_median"]
    jacobian = stats["sqrt_dk"]["softmax_jac"] / stats["none"]["softmax_jac"]
    rms = stats["sqrt_dk"]["grad_logits"] / stats["none"]["grad_logits"]
    print(f"sqrt_dk / none: typical-row gradient {typical:.0f}x, softmax Jacobian {jacobian:.1f}x, RMS {rms:.2f}x")
    assert typical >= 10
    assert jacobian >= 5
    assert rms < 10  # the RMS alone would hide the effect


# --- a real run logs every family for every layer, and a learned τ moves --------------------


def test_learned_run_logs_every_probe_family_for_every_layer_to_wandb(tmp_path):
    run_train(tmp_path, "attention.scale=learned", "callbacks.probes.every_n_steps=5", "trainer.max_steps=30",
              "callbacks.probes.maps_every_n_steps=5",
              "optim.lr=1e-2", "optim.warmup_steps=5", "test=false")  # fmt: skip
    (run_file,) = wandb_run_files(tmp_path)
    rows = wandb_records.history(run_file)
    keys = set().union(*rows)
    probe_steps = sorted({row["trainer/global_step"] for row in rows if "attn/entropy/enc.L0" in row})
    assert probe_steps == [0, 5, 10, 15, 20, 25]
    layers = ["enc.L0", "enc.L1", "dec.self.L0", "dec.cross.L0", "dec.self.L1", "dec.cross.L1"]
    for layer in layers:
        for family in ("grad/logits", "grad/logits_row_median", "grad/softmax_jac", "attn/entropy", "attn/entropy_norm",
                       "attn/logit_std", "attn/logit_max", "attn/saturation"):  # fmt: skip
            assert f"{family}/{layer}" in keys, f"{family}/{layer}"
        for head in range(4):
            assert f"attn/entropy/{layer}.H{head}" in keys and f"attn/tau/{layer}.H{head}" in keys
    assert "grad/global_norm" in keys and any(key.startswith("grad/norm/") for key in keys)
    taus = [row["attn/tau/enc.L0.H0"] for row in rows if "attn/tau/enc.L0.H0" in row]
    assert taus[0] == pytest.approx(math.sqrt(16)) and abs(taus[-1] - taus[0]) > 1e-3
    # The attention maps: an image at every probe step in W&B, a PNG each in the run dir.
    images = {row["trainer/global_step"]: row for row in rows if row.get("attn/maps/_type") == "images/separated"}
    assert sorted(images) == probe_steps
    (image,) = images[25]["attn/maps/filenames"]
    assert (run_file.parent / "files" / image).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert sorted(path.name for path in (tmp_path / "attention_maps").glob("*.png")) == [
        f"step_{step:06d}.png" for step in probe_steps
    ]


def test_rows_that_see_one_key_are_left_out_of_saturation_entropy_and_gradients():
    """Causal self-attention's first query sees one key: weight 1 whatever the logits. Counted,
    it would read as saturated with entropy 0, Σa(1−a) = 0 and no gradient."""
    torch.manual_seed(0)
    logits = torch.randn(2, 3, 5, 5, requires_grad=True)  # (B, h, n, m), all rows causal
    causal = torch.ones(5, 5, dtype=torch.bool).tril()
    weights = logits.masked_fill(~causal, float("-inf")).softmax(-1)
    (weights * torch.randn_like(weights)).sum().backward()
    stats = layer_statistics(weights.detach(), logits.detach(), logits.grad, causal[None, None])
    many = weights.detach()[..., 1:, :]  # rows 1–4 see 2–5 keys
    entropy = -torch.special.xlogy(many, many).sum(-1)
    assert stats["entropy"] == pytest.approx(entropy.mean().item(), rel=1e-5)
    assert stats["saturation"] == pytest.approx((many.amax(-1) > 0.99).float().mean().item())
    assert stats["softmax_jac"] == pytest.approx((many * (1 - many)).sum(-1).mean().item(), rel=1e-5)
    grad = logits.grad[..., 1:, :][causal[1:].expand_as(many)]
    assert stats["grad_logits"] == pytest.approx(grad.square().mean().sqrt().item(), rel=1e-5)
    # the logit statistics keep every visible entry, the first row's included
    assert stats["logit_std"] == pytest.approx(
        logits.detach()[causal.expand_as(logits)].std(unbiased=False).item(), rel=1e-4
    )
    # a row with its one key certain is not saturation: all-first-row input reads 0, not 1
    only_first = layer_statistics(
        weights.detach()[..., :1, :], logits.detach()[..., :1, :], None, causal[None, None, :1]
    )
    assert only_first["saturation"] == 0 and only_first["entropy"] == 0


@pytest.mark.slow  # ≈60 s each: a 2-process DDP run beside a single-process one
@pytest.mark.parametrize("lengths", ["equal", "varied"])
def test_ddp_probe_values_equal_one_process_on_the_same_global_batch(tmp_path, lengths):
    """trainer=ddp_cpu: each rank sees half of the batch. Its statistics are combined by row
    counts and its gradient at the logits is that of the whole batch's loss, so the logged
    values are those of one process on the whole batch. With varied lengths the ranks hold
    different numbers of rows (unweighted means would differ), and DDP's mean of per-rank
    losses is no longer the whole batch's loss, so only the attention statistics compare."""
    min_len = 8 if lengths == "equal" else 2
    overrides = ["model=lm", "data=copy", f"data.min_len={min_len}", "data.max_len=8", "data.batch_size=16",
                 "model.dropout=0.0", "callbacks.probes.every_n_steps=1", "trainer.max_steps=1",
                 "trainer.val_check_interval=1", "test=false", "logger=csv", "trainer.enable_progress_bar=false",
                 "data.train_size=256", "data.val_size=16", "data.test_size=16"]  # fmt: skip
    logged = {}
    for trainer in ("cpu", "ddp_cpu"):
        run_dir = tmp_path / trainer
        result = cli("attnlab-train", f"trainer={trainer}", f"hydra.run.dir={run_dir}", *overrides, cwd=tmp_path)
        assert result.returncode == 0, result.stderr[-3000:]
        logged[trainer] = {k: v for row in read_metrics(run_dir) if row["step"] == 0 for k, v in row.items()}
    compared = ("attn/", "grad/softmax_jac") + (("grad/logits",) if lengths == "equal" else ())
    probed = [key for key in logged["cpu"] if key.startswith(compared)]
    assert {"attn/saturation/L0", "attn/entropy/L0.H0", "grad/softmax_jac/L0"} <= set(probed)
    assert lengths == "varied" or {"grad/logits/L0", "grad/logits_row_median/L0"} <= set(probed)
    for key in probed:
        assert logged["ddp_cpu"][key] == pytest.approx(logged["cpu"][key], rel=1e-4, abs=1e-7), key
