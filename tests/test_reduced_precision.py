"""bfloat16: our AR mode is stock `generate`'s computation bit for bit (a plain causal call goes without our 4D
mask, so transformers picks stock's kernels); the speculative schedules' contract in reduced precision is
measured, not tested (`docs/experiments/bf16_exactness.py`)."""

import torch

from hf_packed_ss import bundled
from hf_packed_ss.tools.bench.suites import question_ids
from hf_packed_ss.tools.loading import QUESTION


def test_ar_equals_stock_generate_in_bfloat16():
    """GSM8K test question 0 on SmolLM2: with our 4D mask on every call, the AR mode's 33rd token differed from
    stock's (a one-ulp top-2 margin, the masked SDPA kernel rounding otherwise)."""
    model, tokenizer = bundled.load("smollm2-135m-drafter", torch.bfloat16)
    ids = question_ids(tokenizer, QUESTION)
    stock = model.generate(ids, max_new_tokens=40, assistant_mode=None, do_sample=False)
    ours = model.generate(ids, max_new_tokens=40, assistant_mode="ar", do_sample=False)
    assert torch.equal(ours, stock)


def test_only_plain_causal_calls_go_without_the_mask():
    """AR's calls and a prefill without proposal rows run as stock's (no mask); a call with proposal rows keeps
    its packed mask."""
    model, tokenizer = bundled.load("tiny-nemotron-gsm8k", torch.float64)
    ids = question_ids(tokenizer, "What is 2 + 3?")
    masks = []
    hook = model.register_forward_pre_hook(lambda m, a, kw: masks.append(kw.get("attention_mask")), with_kwargs=True)
    try:
        model.generate(ids, max_new_tokens=6, assistant_mode="ar", do_sample=False)
        ar, masks[:] = list(masks), []
        model.generate(ids, max_new_tokens=6, assistant_mode="packed_ss", do_sample=False)
    finally:
        hook.remove()
    assert ar and all(m is None for m in ar)
    assert masks and all(m is not None and m.dim() == 4 for m in masks)
