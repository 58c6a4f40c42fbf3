"""Where Medusa's output first differs from plain decoding's, how close the base model's choice was.

A tree forward and a one-token forward round differently, so a near-tie may flip a choice: the
exactness badge says how close it was (the top-2 logit gap when greedy, the gap between the two
tokens' scores in the seeded draw when sampling). The sampled comparison's cost panel scores each
run under the model at T (``sample_scores``). Each check runs at most one extra forward, untimed.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Sequence

import torch

from ..core.acceptance import race_noise, sampling_probs
from ..core.model import input_device
from .numerics import dtype_name
from .page import GreedyCheck, greedy_check, sample_rows
from .records import RunRecord
from .settings import Settings


class ExactnessChecks:
    """The Playground's checks (a mixin): they read its ``model``, ``variants`` and ``pair``."""

    def greedy_check(self, plain: RunRecord, medusa: RunRecord, settings: Settings | None = None) -> GreedyCheck:
        """greedy_check (exact sampling against plain sampling, when ``settings.sample``), and where the
        outputs differ, how close the base model's choice was there: the top-2 logit gap (greedy), or
        the gap between the two tokens' scores in the draw (sampling). A tree forward and a one-token
        forward round differently, so a near-tie may flip the choice."""
        sampled = settings is not None and settings.sample
        model = self.pair(settings)[0]
        numerics = dtype_name(model)
        check = replace(
            greedy_check(plain.tokens, medusa.tokens, sampled=sampled),
            numerics=numerics,
            exact_available="float32" in self.variants,
        )
        k = check.first_diff
        if check.equal or k >= min(len(plain.tokens), len(medusa.tokens)):
            return check
        if sampled:
            gap = self.draw_gap(
                plain.prompt_ids,
                plain.tokens[:k],
                plain.tokens[k],
                medusa.tokens[k],
                settings.config(medusa.method),
                draw=k,
                model=model,
            )
        else:
            gap = self.logit_gap(plain.prompt_ids, plain.tokens[:k], model=model)
        # 16-bit logits near 20 are spaced 0.125 apart; 30 layers add more
        tol = 1e-3 if numerics == "float32" else 0.5
        return replace(check, logit_gap=gap, tie=gap <= tol)

    @torch.inference_mode()
    def draw_gap(
        self,
        prompt_ids: Sequence[int],
        tokens: Sequence[int],
        a: int,
        b: int,
        config,
        *,
        draw: int,
        signed: bool = False,
        model=None,
    ) -> float:
        """How far apart tokens a and b were in draw number ``draw`` (0-based) of a seeded sampled run
        after prompt + tokens: T x |(log p_a - log E_a) - (log p_b - log E_b)|, in logit units, where
        the draw is argmax(p / E) (``sample_token``) and E is the noise of that position under the
        seed (``race_noise``; ``signed``: without the absolute value, positive where a wins the draw)."""
        model = model or self.model
        ids = torch.tensor([list(prompt_ids) + list(tokens)], device=input_device(model))
        logits = model(input_ids=ids, logits_to_keep=1).logits[0, -1].float()
        probs = sampling_probs(logits, temperature=config.temperature, top_p=config.top_p)
        # the token at that position
        race = race_noise(config.seed, len(prompt_ids) + draw, probs.shape[-1], device=probs.device)
        score = probs.log() - race.log()
        gap = float(config.temperature * (score[a] - score[b]))
        return gap if signed else abs(gap)

    @torch.inference_mode()
    def sample_scores(self, record: RunRecord, *, temperature: float, model=None) -> tuple[float, float]:
        """(mean log p, mean entropy) of the model's distribution at T over the tokens a run produced,
        from one forward over prompt + output (not timed). For a true sample the mean log p is
        minus the mean entropy, up to noise; tokens chosen for being likely score higher."""
        n, model = len(record.tokens), model or self.model
        ids = torch.tensor([list(record.prompt_ids) + list(record.tokens)], device=input_device(model))
        # the distribution each token was drawn from
        logits = model(input_ids=ids, logits_to_keep=n + 1).logits[0, :-1].float()
        probs = sampling_probs(logits, temperature=temperature, top_p=1.0)
        logp = probs.gather(-1, torch.tensor(record.tokens, device=probs.device)[:, None]).clamp_min(1e-30).log()
        return float(logp.mean()), float(torch.special.entr(probs).sum(-1).mean())

    def sample_fidelity(self, records: dict[str, RunRecord], settings: Settings) -> list[dict]:
        """The sampled comparison's cost panel (``page.sample_rows``); [] when the runs did not sample."""
        if not settings.sample:
            return []
        return sample_rows(
            records,
            {
                v: self.sample_scores(r, temperature=float(settings.temperature), model=self.pair(settings)[0])
                for v, r in records.items()
                if r.tokens
            },
            temperature=float(settings.temperature),
        )

    @torch.inference_mode()
    def logit_gap(self, prompt_ids: Sequence[int], tokens: Sequence[int], *, model=None) -> float:
        """Top-1 minus top-2 logit of the base model after prompt + tokens (one plain forward, no cache)."""
        model = model or self.model
        ids = torch.tensor([list(prompt_ids) + list(tokens)], device=input_device(model))
        top = model(input_ids=ids, logits_to_keep=1).logits[0, -1].float().topk(2).values
        return float(top[0] - top[1])
