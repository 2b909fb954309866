"""Truncated importance sampling against the sampler/trainer mismatch (``UpdateConfig(importance_sampling_cap=...)``):
exact where the sampler and the trainer agree (weight 1, the same loss and update), and bounded where they do not
(the weight stops at the cap, and so does the update)."""

from __future__ import annotations

import copy
import math

import pytest
import torch

from hf_rollouts.agents.hf import TransformersAgent
from hf_rollouts.envs.guess_number import GuessNumberEnv
from hf_rollouts.rounds import collect_rollouts
from hf_rollouts.training import (
    UpdateConfig,
    grpo_loss,
    grpo_update,
    prepare_rollouts,
    truncated_importance_weights,
)

CAP = 3.0


def _loss_inputs(seed=0, shape=(3, 7)):
    g = torch.Generator().manual_seed(seed)
    trainer = -torch.rand(shape, generator=g) * 3
    logprobs = (trainer + 0.05 * torch.randn(shape, generator=g)).requires_grad_()
    advantages = torch.randn(shape, generator=g)
    mask = (torch.rand(shape, generator=g) > 0.3).float()
    return logprobs, trainer, advantages, mask


def test_weights_are_one_where_sampler_and_trainer_agree_and_stop_at_the_cap():
    logprobs, trainer, advantages, mask = _loss_inputs()
    agree = truncated_importance_weights(trainer, trainer.clone(), mask, CAP)
    assert torch.equal(agree, torch.ones_like(agree))
    plain, _ = grpo_loss(logprobs, trainer, advantages, mask)
    (plain_grad,) = torch.autograd.grad(plain, logprobs)
    weighted, metrics = grpo_loss(logprobs, trainer, advantages, mask, sampling_weights=agree)
    (weighted_grad,) = torch.autograd.grad(weighted, logprobs)
    assert torch.equal(plain, weighted) and torch.equal(plain_grad, weighted_grad)  # exact, not close
    assert metrics["sampling_weight_mean"] == 1.0
    # the sampler gave the tokens e^5 less mass than the trainer: every weight stops at the cap
    capped = truncated_importance_weights(trainer, trainer - 5.0, mask, CAP)
    assert torch.equal(capped[mask.bool()], torch.full_like(capped[mask.bool()], CAP))
    assert torch.equal(capped[~mask.bool()], torch.ones_like(capped[~mask.bool()]))  # off the loss: untouched
    loss, _ = grpo_loss(logprobs, trainer, advantages, mask, sampling_weights=capped)
    (grad,) = torch.autograd.grad(loss, logprobs)
    torch.testing.assert_close(loss, CAP * plain)
    torch.testing.assert_close(grad, CAP * plain_grad)
    # the other way round (the sampler over-weighted them) the weight is the plain ratio, below 1, untruncated
    low = truncated_importance_weights(trainer, trainer + 2.0, mask, CAP)
    torch.testing.assert_close(low[mask.bool()], torch.full_like(low[mask.bool()], math.exp(-2.0)))
    with pytest.raises(ValueError, match="cap must be > 0"):
        truncated_importance_weights(trainer, trainer, mask, 0.0)
    with pytest.raises(ValueError, match="importance_sampling_cap must be > 0"):
        UpdateConfig(importance_sampling_cap=-1.0)


@pytest.fixture()
def round_rows(tiny):
    """A round of the tiny model's rollouts (the generate backend, float32: its stored log-probs are the trainer's to
    ~1e-7), with alternating advantages so every minibatch has a gradient."""
    model, tok = tiny
    rollouts = collect_rollouts(
        GuessNumberEnv(tok, {"low": 1, "high": 3, "max_turns": 2}).get_train_dataset(4),
        TransformersAgent(model, tok, temperature=0.7, max_new_tokens=4, seed=0),
        4,
        seed=11,
    )
    rows = prepare_rollouts(rollouts, flatten=True, progress=False).dataset
    return rows.map(lambda r, i: {"advantage": 1.0 if i % 2 else -1.0}, with_indices=True)


def _step(tiny, rows, cap):
    """One plain-SGD update (no gradient clipping: the step is linear in the loss) of a copy of the tiny model;
    ``(parameter change, metrics)``."""
    model = copy.deepcopy(tiny[0])
    before = [p.detach().clone() for p in model.parameters()]
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    config = UpdateConfig(minibatch_size=64, max_grad_norm=None, importance_sampling_cap=cap)
    metrics = grpo_update(model, optimizer, rows, pad_token_id=tiny[1].pad_token_id, config=config, seed=0)
    return torch.cat([(p.detach() - b).reshape(-1) for p, b in zip(model.parameters(), before)]), metrics


def test_grpo_update_with_the_correction_is_the_plain_update_where_they_agree(tiny, round_rows):
    plain, off = _step(tiny, round_rows, None)
    corrected, on = _step(tiny, round_rows, CAP)
    assert math.isnan(off.logprob_gap_max) and math.isnan(off.sampling_weight_mean)  # off: nothing measured
    print(f"\ngap trainer vs sampler: max {on.logprob_gap_max:.1e}, mean {on.logprob_gap_mean:.1e}")
    assert on.logprob_gap_max < 1e-5 and on.sampling_weight_capped == 0.0
    assert on.sampling_weight_mean == pytest.approx(1.0, abs=1e-5)
    assert plain.abs().max() > 1e-3  # the update moved the weights...
    torch.testing.assert_close(corrected, plain, atol=1e-5, rtol=1e-4)  # ...and the correction did not change it


def test_grpo_update_with_the_correction_bounds_the_weight_where_they_disagree(tiny, round_rows):
    """The stored sampler log-probs put 5 nats below the trainer's (a sampler that found the tokens e^5 times less
    likely): every weight hits the cap, so the step is the agreeing step times the cap, not times e^5."""
    shifted = round_rows.map(
        lambda r: {"old_logprobs": [x - 5.0 if x is not None else None for x in r["old_logprobs"]]}
    )
    agreeing, _ = _step(tiny, round_rows, CAP)
    bounded, m = _step(tiny, shifted, CAP)
    assert m.logprob_gap_mean == pytest.approx(5.0, abs=1e-4) and m.sampling_weight_capped == 1.0
    assert m.sampling_weight_mean == pytest.approx(CAP)
    torch.testing.assert_close(bounded, CAP * agreeing, atol=1e-5, rtol=1e-3)
