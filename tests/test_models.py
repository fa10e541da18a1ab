"""Both models run forward/backward, overfit a tiny batch, and match the paper's sizes."""

import pytest
import torch

from attnlab.attention import AttentionConfig
from attnlab.models import DecoderLM, ModelConfig, Transformer, attention_layers, sequence_loss
from attnlab.optim import param_groups
from attnlab.probes import recording

BOS, EOS = 1, 2


def tiny(**overrides):
    return ModelConfig(
        **{
            "vocab_size": 16,
            "d_model": 32,
            "n_heads": 4,
            "d_ff": 64,
            "n_layers": 2,
            "dropout": 0.0,
            "max_len": 32,
            **overrides,
        }
    )


def copy_batch(batch=8, length=6, vocab=16):
    """Source: random ids ≥ 3; target: the same ids, BOS-shifted for teacher forcing."""
    src = torch.randint(3, vocab, (batch, length))
    tgt_in = torch.cat([torch.full((batch, 1), BOS), src], dim=1)
    tgt_out = torch.cat([src, torch.full((batch, 1), EOS)], dim=1)
    return src, tgt_in, tgt_out


def overfit(model, loss_fn, steps=150, lr=3e-3):
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    for _ in range(steps):
        optimizer.zero_grad()
        loss = loss_fn()
        loss.backward()
        optimizer.step()
    return loss.item()


@pytest.mark.parametrize("pre_norm", [False, True])
@pytest.mark.parametrize("scale", ["sqrt_dk", "learned"])
def test_transformer_overfits_a_copy_batch_and_decodes_it(pre_norm, scale):
    model = Transformer(tiny(pre_norm=pre_norm, attention=AttentionConfig(scale=scale)))
    src, tgt_in, tgt_out = copy_batch()
    initial = sequence_loss(model(src, tgt_in), tgt_out).item()
    final = overfit(model, lambda: sequence_loss(model(src, tgt_in), tgt_out))
    assert final < 0.05 < initial
    model.eval()
    decoded = model.generate(src, None, BOS, EOS)
    assert torch.equal(decoded[:, : src.shape[1] + 1], tgt_out)


@pytest.mark.parametrize("variant", ["dot", "cosine", "additive"])
def test_decoder_lm_overfits_a_batch(variant):
    scale = {"dot": "sqrt_dk", "cosine": "learned", "additive": "none"}[variant]
    options = {"learned": {"init": 0.1}} if variant == "cosine" else {}
    model = DecoderLM(tiny(attention=AttentionConfig(variant=variant, scale=scale, scale_options=options)))
    tokens = torch.randint(0, 16, (4, 12))
    final = overfit(model, lambda: sequence_loss(model(tokens[:, :-1]), tokens[:, 1:]), steps=200)
    assert final < 0.1


def test_without_positions_the_encoder_is_permutation_equivariant():
    """model.positions=none: nothing but content tells tokens apart (and the default does)."""
    src = torch.randint(4, 16, (2, 7))
    order = torch.randperm(7)
    for positions, equivariant in (("none", True), ("sinusoidal", False)):
        model = Transformer(tiny(positions=positions, dropout=0.0)).eval()
        with torch.no_grad():
            shuffled, original = model.encode(src[:, order]), model.encode(src)[:, order]
        assert torch.allclose(shuffled, original, atol=1e-5) == equivariant, positions


def test_padding_does_not_change_real_positions():
    model = Transformer(tiny()).eval()
    src, tgt_in, _ = copy_batch(batch=2)
    padded = torch.cat([src, torch.zeros(2, 3, dtype=torch.long)], dim=1)
    src_mask = torch.cat([torch.ones(2, 6), torch.zeros(2, 3)], dim=1).bool()
    torch.testing.assert_close(model(padded, tgt_in, src_mask=src_mask), model(src, tgt_in))


def test_target_padding_changes_no_real_position_and_the_records_mark_it_in_every_layer():
    model = Transformer(tiny()).eval()
    src, tgt_in, _ = copy_batch(batch=2)
    padded = torch.cat([tgt_in, torch.zeros(2, 2, dtype=torch.long)], dim=1)
    real = torch.cat([torch.ones(2, 7), torch.zeros(2, 2)], dim=1).bool()
    layers = attention_layers(model)
    with recording(*layers) as records:
        out = model(src, padded, tgt_mask=real)
    torch.testing.assert_close(out[:, :7], model(src, tgt_in))
    for layer, record in zip(layers, records, strict=True):
        if layer.name.startswith("enc."):  # no source padding: every key visible
            assert record.visible is None
            continue
        queries = record.visible.any(-1).expand(2, 4, -1)  # rows that see at least one key
        assert torch.equal(queries, real[:, None, :].expand_as(queries)), layer.name


def test_lm_is_causal():
    model = DecoderLM(tiny()).eval()
    tokens = torch.randint(0, 16, (2, 10))
    changed = tokens.clone()
    changed[:, 7:] = (changed[:, 7:] + 1) % 16
    torch.testing.assert_close(model(tokens)[:, :7], model(changed)[:, :7])


def test_attention_layers_are_named_by_kind():
    names = [layer.name for layer in attention_layers(Transformer(tiny()))]
    assert names == ["enc.L0", "enc.L1", "dec.self.L0", "dec.cross.L0", "dec.self.L1", "dec.cross.L1"]
    assert [layer.name for layer in attention_layers(DecoderLM(tiny()))] == ["L0", "L1"]


def test_base_model_size_matches_the_paper():
    """Vaswani et al. Table 3 'base': N=6, d_model=512, d_ff=2048, h=8 → 65M parameters.

    With a 37,000-token shared BPE vocabulary and tied embeddings we count 63.1M; the
    paper does not state its exact vocabulary or what it counted, so allow 5%.
    """
    model = Transformer(ModelConfig(vocab_size=37000, d_model=512, n_heads=8, d_ff=2048, n_layers=6))
    count = sum(p.numel() for p in model.parameters())
    print(f"base Transformer: {count / 1e6:.1f}M parameters (paper: 65M)")
    assert count == pytest.approx(65e6, rel=0.05)
    assert {layer.d_k for layer in attention_layers(model)} == {64}


def test_learned_tau_norms_biases_and_embeddings_are_not_decayed():
    model = Transformer(tiny(attention=AttentionConfig(scale="learned")))
    decay, no_decay = param_groups(model, weight_decay=0.1)
    no_decay_ids = {id(p) for p in no_decay["params"]}
    for layer in attention_layers(model):
        assert id(layer.temperature.log_tau) in no_decay_ids
        assert id(layer.q_proj.weight) in {id(p) for p in decay["params"]}
    assert id(model.embed.tokens.weight) in no_decay_ids
    total = len(decay["params"]) + len(no_decay["params"])
    assert total == len(list(model.parameters()))  # each parameter once, tied ones included


def test_step_flops_count_every_matmul_and_attention_pair():
    from attnlab.perf import step_flops

    cfg = tiny(d_model=32, n_heads=4, d_ff=64, n_layers=1, vocab_size=16)
    model = DecoderLM(cfg)
    # per block: q, k, v, o (32×32 each) + FFN (32×64, 64×32); the tied head 32×16
    weights = 4 * 32 * 32 + 2 * 32 * 64 + 32 * 16
    tokens, pairs = 2 * 10, 2 * 10 * 10
    expected = 6 * weights * tokens + 6 * 4 * (8 + 8) * pairs
    assert step_flops(model, tokens, {"L0": pairs}) == expected


def test_each_model_counts_its_own_step_flops_from_a_batch():
    from attnlab.perf import step_flops

    cfg = tiny(d_model=32, n_heads=4, d_ff=64, n_layers=1, vocab_size=16)
    lm = DecoderLM(cfg)
    assert lm.step_flops({"tokens": torch.zeros(2, 10, dtype=torch.long)}) == step_flops(lm, 20, {"L0": 200})
    seq2seq = Transformer(cfg)
    batch = {"src": torch.zeros(3, 7, dtype=torch.long), "tgt_in": torch.zeros(3, 5, dtype=torch.long)}
    pairs = {"enc.L0": 3 * 7 * 7, "dec.self.L0": 3 * 5 * 5, "dec.cross.L0": 3 * 5 * 7}
    assert seq2seq.step_flops(batch) == step_flops(seq2seq, 3 * (7 + 5), pairs)


@pytest.mark.parametrize(
    ("name", "precision", "tf32", "peak"),
    [
        ("NVIDIA H100 80GB HBM3", "bf16-mixed", True, 989.4e12),  # SXM
        ("NVIDIA H100 PCIe", "bf16-mixed", True, 756.5e12),  # not the SXM's
        ("NVIDIA H100 PCIe", "32-true", True, 378e12),
        ("NVIDIA H100 80GB HBM3", "32-true", False, 67e12),  # TF32 off: no tensor cores for float32
        ("NVIDIA H200", "16-mixed", True, 989.4e12),
        ("NVIDIA A100-SXM4-80GB", "32-true", True, 156e12),
        ("Tesla T4", "bf16-mixed", True, None),  # unknown: no perf/mfu rather than a wrong one
    ],
)
def test_the_peak_for_mfu_tells_the_h100s_apart_and_knows_tf32_off(name, precision, tf32, peak):
    from attnlab.perf import peak_for

    assert peak_for(name, precision, tf32) == peak
