"""Token-exactness of every schedule against a reference greedy loop (float64, random tiny models)."""

from __future__ import annotations

import pytest
import torch
from conftest import reference_greedy, tiny_model
from drafters import OracleLayout
from engine import decode

from hf_packed_ss.engine import ShiftedBlockLayout
from hf_packed_ss.engine.schedules import SCHEDULES

SPECULATIVE = ["linear_ss", "quadratic_ss", "packed_ss"]
WIDTHS = [1, 2, 3, 7, 15, 31]


def _prompt(seed: int, length: int, vocab: int) -> torch.Tensor:
    return torch.randint(vocab, (length,), generator=torch.Generator().manual_seed(1000 + seed))


def _decode(model, mode, width, prompt, max_new, eos=(), layout=None):
    layout = layout or ShiftedBlockLayout(model.config.mask_token_id)
    with torch.no_grad():
        seq, stats = decode(model, SCHEDULES[mode](width), prompt, max_new, layout=layout, eos=eos)
    return seq[prompt.numel():].tolist(), stats


@pytest.mark.parametrize("mode", SPECULATIVE)
@pytest.mark.parametrize("width", WIDTHS)
def test_generate_matches_reference_on_random_models(models, mode, width):
    """Through model.generate: three models, prompts of 1, 5 and 17 tokens, every max_new_tokens of the issue."""
    for (seed, model), length in zip(models.items(), (1, 5, 17), strict=True):
        prompt = _prompt(seed * 7 + length, length, model.config.vocab_size)
        full = _reference(model, seed, length)
        for max_new in sorted({1, 2, width, width + 1, 3 * width + 2, 100}):
            out = model.generate(prompt[None], assistant_mode=mode, speculative_width=width, max_new_tokens=max_new)
            assert out[0, :length].tolist() == prompt.tolist()
            assert out[0, length:].tolist() == full[:max_new], (seed, length, max_new)


_REFERENCES: dict = {}


def _reference(model, seed: int, length: int) -> list[int]:
    key = (seed, length)
    if key not in _REFERENCES:
        _REFERENCES[key] = reference_greedy(model, _prompt(seed * 7 + length, length, model.config.vocab_size), 100)
    return _REFERENCES[key]


@pytest.mark.parametrize("mode", ["ar", *SPECULATIVE])
@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("accuracy", [0.5, 0.9, 1.0])
def test_exact_with_a_good_drafter_and_eos_mid_block(mode, width, accuracy):
    """A drafter that is often right forces long acceptances; EOS is taken from inside the
    continuation so that it is accepted mid-block, and the output must stop exactly there."""
    model = tiny_model(11)
    vocab = model.config.vocab_size
    for seed in range(3):
        prompt = _prompt(seed, 4 + seed, vocab)
        full = reference_greedy(model, prompt, 100)
        oracle = OracleLayout(model.config.mask_token_id, vocab, full, prompt.numel(), accuracy, seed)
        # never-produced EOS: a token absent from the continuation (or none at all)
        absent = [t for t in range(vocab) if t not in full]
        for max_new in sorted({1, 2, width, width + 1, 3 * width + 2, 100}):
            got, stats = _decode(model, mode, width, prompt, max_new, absent[:1], oracle)
            assert got == full[:max_new]
            assert stats.new_tokens == len(got) == sum(stats.accepted_per_iteration)
        # EOS somewhere inside the continuation: first occurrence of the token at index 2 * width + 1
        eos_token = full[min(2 * width + 1, 60)]
        expected = full[: full.index(eos_token) + 1]
        oracle = OracleLayout(model.config.mask_token_id, vocab, full, prompt.numel(), accuracy, seed)
        got, _ = _decode(model, mode, width, prompt, 100, [eos_token], oracle)
        assert got == expected
        if accuracy == 1.0 and mode != "ar" and width > 1:
            assert max(_decode(model, mode, width, prompt, 100, (), oracle)[1].accepted_per_iteration) > 1


def test_mask_token_as_an_ordinary_output():
    """The AR mode may predict the mask token itself; it must decode like any other token."""
    for seed in range(40):
        model = tiny_model(seed)
        prompt = _prompt(seed, 3, model.config.vocab_size)
        full = reference_greedy(model, prompt, 40)
        if model.config.mask_token_id in full:
            break
    else:
        model.config.mask_token_id = full[5]  # make one of its outputs the mask token
    full = reference_greedy(model, prompt, 40)
    assert model.config.mask_token_id in full
    for mode in SPECULATIVE:
        for width in (1, 4, 9):
            oracle = OracleLayout(model.config.mask_token_id, model.config.vocab_size, full, prompt.numel(), 0.8, 1)
            assert _decode(model, mode, width, prompt, 40, (), oracle)[0] == full
            assert _decode(model, mode, width, prompt, 40)[0] == full


@pytest.mark.parametrize("mode", SPECULATIVE)
def test_many_seeds_small_widths(mode):
    """Twenty more random models, random widths, lengths and EOS, with a drafter right 70% of the time."""
    for seed in range(20):
        gen = torch.Generator().manual_seed(seed)
        model = tiny_model(100 + seed, num_hidden_layers=1)
        width = int(torch.randint(1, 9, (), generator=gen))
        prompt = _prompt(seed, int(torch.randint(1, 12, (), generator=gen)), model.config.vocab_size)
        full = reference_greedy(model, prompt, 40)
        eos = [full[int(torch.randint(0, 40, (), generator=gen))]] if seed % 2 else []
        expected = reference_greedy(model, prompt, 40, set(eos))
        oracle = OracleLayout(model.config.mask_token_id, model.config.vocab_size, full, prompt.numel(), 0.7, seed)
        assert _decode(model, mode, width, prompt, 40, eos, oracle)[0] == expected
