"""`hf-packed-ss train`: each objective's training step lowers its loss on a tiny fixed batch, the
drafter objective never changes the verifier rows, and a run resumes where it stopped."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from hf_packed_ss import bundled
from hf_packed_ss.lora import proposal_only_adapters
from hf_packed_ss.tools.train import LOSSES, TrainConfig, build_model, corpus, sample_batch

TINY = dict(hidden=32, layers=1, heads=2, kv_heads=1, intermediate=64, block_size=8, seq_len=48, batch=4)


def _steps(model, loss_fn, batch, cfg, params, n=8, lr=3e-3):
    opt = torch.optim.AdamW(params, lr=lr)
    losses = []
    for i in range(n):
        gen = torch.Generator().manual_seed(i % 2)  # the same noise draws again and again
        loss, _ = loss_fn(model, batch, cfg, gen)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


@pytest.mark.parametrize("fmt", ["nemotron", "setdlm"])
def test_a_training_step_lowers_the_loss(fmt):
    _, tokenizer = bundled.load("tiny-nemotron-random")
    cfg = TrainConfig(format=fmt, **TINY)
    torch.manual_seed(0)
    model = build_model(cfg, tokenizer)
    stream = corpus(tokenizer, ["Question: 2 + 3?\nAnswer: 5", "Question: 7 - 4?\nAnswer: 3"] * 8)
    batch = sample_batch(stream, cfg, torch.Generator().manual_seed(0))
    losses = _steps(model, LOSSES[fmt], batch, cfg, list(model.parameters()))
    assert losses[-1] < losses[0] - 0.5


def test_drafter_step_lowers_kl_and_never_touches_the_verifier():
    from peft import LoraConfig, get_peft_model

    from hf_packed_ss.smollm2 import MaskEmbedding, attach_drafter

    torch.manual_seed(0)
    base = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=128))
    ids = torch.randint(20, 64, (1, 40), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        before = base(ids).logits
    model = get_peft_model(base, LoraConfig(r=4, lora_alpha=4, target_modules=["q_proj", "v_proj", "down_proj"],
                                            init_lora_weights=False))
    embedding = MaskEmbedding(32)
    attach_drafter(model, block_size=4, mask_embedding=embedding)
    cfg = TrainConfig(format="drafter", block_size=4, blocks=6)
    params = [p for p in model.parameters() if p.requires_grad] + [embedding.delta]
    with proposal_only_adapters(model.get_base_model()):
        losses = _steps(model, LOSSES["drafter"], (ids, 10), cfg, params, n=10, lr=1e-2)
        with torch.no_grad():
            after = model(ids).logits  # outside proposal rows: no adapter, no MASK offset
    assert losses[-1] < losses[0] * 0.8
    assert torch.equal(before, after) and embedding.delta.abs().sum() > 0


def test_resume_continues_the_same_run(tmp_path, monkeypatch):
    from hf_packed_ss.tools import train as train_module

    _, tokenizer = bundled.load("tiny-nemotron-random")
    monkeypatch.setattr(train_module, "train_tokenizer", lambda texts, vocab: tokenizer)
    data = tmp_path / "train.jsonl"
    data.write_text("\n".join(json.dumps({"question": f"{i} + 1?", "answer": f"#### {i + 1}"}) for i in range(40)))
    fields = dict(format="nemotron", data=str(data), steps=4, save_every=2, warmup=1, **TINY)
    straight, _ = train_module.train(TrainConfig(out=str(tmp_path / "a"), **fields), log=lambda *_: None)
    # stop after 2 of 4 steps (warm-up 1: both runs use the same learning rates for steps 0 and 1), then resume
    train_module.train(TrainConfig(out=str(tmp_path / "b"), **{**fields, "steps": 2}), log=lambda *_: None)
    resumed, _ = train_module.train(TrainConfig(out=str(tmp_path / "b"), **fields), resume=True, log=lambda *_: None)
    for (name, a), (_, b) in zip(straight.state_dict().items(), resumed.state_dict().items(), strict=True):
        assert torch.allclose(a, b, atol=1e-6), name
    assert (tmp_path / "b" / "model.safetensors").is_file() and (tmp_path / "b" / "generation_config.json").is_file()


def test_base_answers_are_the_base_models_own_greedy_answers_and_resume(tmp_path):
    """Batched (left-padded) answers equal each question's own stock greedy answer in the benchmark's
    prompt format; a second call with more questions only answers the new ones."""
    from transformers import AutoTokenizer

    from hf_packed_ss.tools.base_answers import generate_answers
    from hf_packed_ss.tools.bench.suites import question_ids

    tokenizer = AutoTokenizer.from_pretrained(bundled.path("smollm2-135m-drafter"))
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=len(tokenizer), hidden_size=16, intermediate_size=32,
                                         num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                                         max_position_embeddings=2048)).to(torch.float64).eval()
    questions = ["What is 2 + 3?", "Tom has 12 apples and eats 5 of them. How many are left?", "Is 7 prime?"]
    out = tmp_path / "answers.jsonl"
    rows = generate_answers(model, tokenizer, questions[:2], out, max_new_tokens=6, log=lambda _: None)
    assert [r["question"] for r in rows] == questions[:2]
    for row in rows:
        ids = question_ids(tokenizer, row["question"])
        alone = model.generate(ids, max_new_tokens=6, do_sample=False, pad_token_id=tokenizer.eos_token_id)
        new = alone[0, ids.shape[1]:].tolist()
        new = new[: new.index(tokenizer.eos_token_id)] if tokenizer.eos_token_id in new else new
        assert row["answer"] == tokenizer.decode(new)
    seen = []
    rows = generate_answers(model, tokenizer, questions, out, max_new_tokens=6, log=seen.append)
    assert [r["question"] for r in rows] == questions and seen == ["base answers: 3/3"]


def test_train_data_defaults_to_the_gsm8k_folder_variable(tmp_path, monkeypatch, capsys):
    """`--data` defaults to train.jsonl in $HF_PACKED_SS_GSM8K (read when the command runs; `--help` shows it),
    and a missing file stops the run before anything is written."""
    from hf_packed_ss.tools import train as train_module

    monkeypatch.setenv("HF_PACKED_SS_GSM8K", str(tmp_path))
    with pytest.raises(SystemExit):
        train_module.main(["--help"])
    assert "HF_PACKED_SS_GSM8K" in capsys.readouterr().out
    assert TrainConfig().data == str(tmp_path / "train.jsonl")
    with pytest.raises(SystemExit, match="HF_PACKED_SS_GSM8K"):
        train_module.train(TrainConfig(out=str(tmp_path / "run"), **TINY), log=lambda *_: None)
    assert not (tmp_path / "run").exists()
