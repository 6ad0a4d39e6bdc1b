"""The speculative width may change from one iteration to the next (what `speculative_width="auto"` needs): every
schedule on both families, lean and static shapes, with the width redrawn at random after every call (up to the
width the schedule was built with), still gives exactly the AR mode's greedy tokens (float64, the trained tiny
checkpoints, so drafts made at a wider width are long and get cut)."""

from __future__ import annotations

import random

import pytest
import torch
from engine import schedule_for

from hf_packed_ss import bundled
from hf_packed_ss.engine import decode
from hf_packed_ss.front import model_forward
from hf_packed_ss.front.families import family


class Redrawn:
    """Wraps a schedule and sets its `width` at random after every call (the loop reads it for each window)."""

    def __init__(self, inner, top: int, seed: int):
        self.__dict__.update(inner=inner, top=top, rng=random.Random(seed), used=[])

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def __setattr__(self, name, value):
        setattr(self.inner, name, value)

    def advance(self, plan, result):
        verdict = self.inner.advance(plan, result)
        self.inner.width = self.rng.randint(1, self.top)
        self.used.append(self.inner.width)
        return verdict


@pytest.fixture(scope="module", params=["tiny-nemotron-gsm8k", "tiny-setdlm-gsm8k"])
def trained(request):
    model, tokenizer = bundled.load(request.param, torch.float64)
    from hf_packed_ss.tools.bench.suites import SAMPLE, read_jsonl

    prompts = [tokenizer(f"Question: {r['question']}\nAnswer:", return_tensors="pt").input_ids[0]
               for r in read_jsonl(SAMPLE)[:2]]
    return model, prompts, [tokenizer.eos_token_id]


@pytest.mark.parametrize("mode,top", [("packed_ss", 8), ("linear_ss", 8), ("quadratic_ss", 4), ("hybrid_ss", 8)])
@pytest.mark.parametrize("static", [False, True])
def test_a_width_redrawn_every_iteration_keeps_the_ar_tokens(trained, mode, top, static):
    model, prompts, eos = trained
    fam = family(model.config)
    forward = model_forward(model)
    for seed, prompt in enumerate(prompts):
        with torch.no_grad():
            ar = decode(forward, schedule_for(model, "ar", 1), fam.layout(model.config.mask_token_id), prompt, 60,
                        eos)[0]
            schedule = Redrawn(schedule_for(model, mode, top), top, seed)
            out, stats = decode(forward, schedule, fam.layout(model.config.mask_token_id, static_shapes=static),
                                prompt, 60, eos)
        assert out.tolist() == ar.tolist()
        assert len(set(schedule.used)) > 2 and max(stats.accepted_per_iteration) > 1  # it varied, and drafts paid
