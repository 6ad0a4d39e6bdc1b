"""A verifier's own greedy answers to GSM8K train questions: a drafter's training text (self-distillation).

A drafter is rewarded for agreeing with the verifier, not with the data, so it is best trained where the
verifier will be: on the text the model itself writes (SmolLM2's style differs from GSM8K's reference
answers; a tiny joint model's AR mode writes its own). Answers are made with batched greedy `generate`
(stock for an adapter's base, `assistant_mode="ar"` for a joint model), in the prompt format the benchmark
uses, and appended to a JSON-lines file as ``{"question", "answer", "ended_with_eos", "max_6gram_repeats"}``,
so a run can resume and a trainer can keep only the answers that end and do not loop.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from .bench.suites import CHAT_SHOTS, question_ids, read_jsonl
from .quality import max_ngram_repeats

BATCH = 16


def generate_answers(model, tokenizer, questions: list[str], out: Path, max_new_tokens: int = 160,
                     log=print, batch: int = BATCH, encode=question_ids, **generate_kwargs) -> list[dict]:
    """Answer `questions` in batches (left padding) into `out`, skipping those already there; `encode(tokenizer,
    question)` makes a prompt's `(1, n)` ids (default the benchmark's GSM8K prompt); `generate_kwargs` go to
    `generate` (e.g. ``assistant_mode="ar"``)."""
    out = Path(out)
    done = read_jsonl(out) if out.is_file() else []
    todo = questions[len(done):]
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    for i in range(0, len(todo), batch):
        chunk = todo[i : i + batch]
        prompts = [encode(tokenizer, q)[0] for q in chunk]  # exactly the benchmark's prompt
        width = max(p.numel() for p in prompts)
        ids = torch.stack([torch.cat([torch.full((width - p.numel(),), pad), p]) for p in prompts])
        mask = torch.stack([torch.arange(width) >= width - p.numel() for p in prompts]).long()
        with torch.no_grad():
            new = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=max_new_tokens, do_sample=False,
                                 pad_token_id=pad, **generate_kwargs)[:, width:].tolist()
        with out.open("a") as f:
            for question, row in zip(chunk, new, strict=True):
                ended = tokenizer.eos_token_id in row
                row = row[: row.index(tokenizer.eos_token_id)] if ended else row
                f.write(json.dumps({"question": question, "answer": tokenizer.decode(row), "ended_with_eos": ended,
                                    "max_6gram_repeats": max_ngram_repeats(row)}) + "\n")
        log(f"base answers: {len(done) + i + len(chunk)}/{len(questions)}")
    return read_jsonl(out)


def train_questions(file: Path, n: int) -> list[str]:
    """`n` GSM8K train questions after the worked examples (which come from the head of the split)."""
    return [r["question"] for r in read_jsonl(Path(file))[CHAT_SHOTS : CHAT_SHOTS + n]]
