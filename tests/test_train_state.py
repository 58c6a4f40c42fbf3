"""A training that resumes reads its saved state as tensors and numbers only: a planted train_state*.pt that
would run code on unpickling is refused in one sentence, and the code never runs."""

from __future__ import annotations

import os

import pytest
import torch
from conftest import answer_records, make_model

from medusa_lib.core.heads import HeadsConfig, MedusaHeads
from medusa_lib.pipeline.hidden_cache import HiddenCache, frequent_tokens
from medusa_lib.pipeline.medusa_trainer import TrainConfig, train_heads

K = 3


class Planted:
    """What an attacker leaves where a training looks for its state: unpickling it makes a folder."""

    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return os.mkdir, (self.marker,)


@pytest.fixture(scope="module")
def setup():
    model = make_model("llama")
    model.requires_grad_(False)
    train = HiddenCache.build(model, answer_records(4, 0), num_heads=K, log=lambda m: None)
    held = HiddenCache.build(model, answer_records(2, 1), num_heads=K, log=lambda m: None)
    return model, train, held


def heads_and_config():
    heads = MedusaHeads(HeadsConfig(hidden_size=64, vocab_size=320, num_heads=K, num_proposal_tokens=64))
    heads.proposal_ids.copy_(frequent_tokens(answer_records(4, 0), 64, 320))
    cfg = TrainConfig(num_heads=K, proposal_tokens=64, batch_size=64, epochs=2, eval_every=1, patience=50, lr=1e-2)
    return heads, cfg


def test_the_medusa_training_resumes_from_its_own_state(setup, tmp_path):
    model, train, held = setup
    lines: list[str] = []
    heads, cfg = heads_and_config()
    train_heads(model, train, held, heads, cfg, out=tmp_path, log=lambda m: None)
    heads, cfg = heads_and_config()
    train_heads(model, train, held, heads, cfg, out=tmp_path, log=lines.append)
    assert any(line.startswith("resumed at step") for line in lines), lines


@pytest.mark.parametrize("trainer", ["medusa", "eagle"])
def test_a_planted_train_state_is_refused_and_runs_no_code(setup, tmp_path, trainer):
    model, train, held = setup
    marker = tmp_path / "the-planted-code-ran"
    torch.save({"run": Planted(str(marker)), "planned": 1}, tmp_path / "train_state.pt")
    with pytest.raises(SystemExit) as e:
        if trainer == "medusa":
            heads, cfg = heads_and_config()
            train_heads(model, train, held, heads, cfg, out=tmp_path, log=lambda m: None)
        else:
            from medusa_lib.core.eagle import new_eagle_head
            from medusa_lib.pipeline.eagle_trainer import train as train_eagle
            from medusa_lib.pipeline.feature_cache import FeatureCache, fused_layers

            eagle_model = make_model("llama", num_hidden_layers=6)
            records = [{"prompt_ids": [5, 6, 7, 8], "answer_ids": [9, 10, 11, 12, 13, 14]}]
            cache = FeatureCache.build(eagle_model, records, layers=fused_layers(6))
            head = new_eagle_head(eagle_model)
            train_eagle(head, cache, cache, out=tmp_path, lr=1e-3, epochs=1, batch_tokens=40, minutes=1,
                        eval_every=1, seed=0, save_dtype=torch.float32, sim_prompts=1, log=lambda m: None)  # fmt: skip
    assert not marker.exists()
    assert str(e.value).startswith(
        f"error: {tmp_path / 'train_state.pt'} is not a plain training state (tensors and numbers) and is not "
        "loaded, for safety (UnpicklingError); "
    ), e.value
