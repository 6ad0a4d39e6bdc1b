"""The base model's own greedy answers to GSM8K train questions: the drafter's training text.

A drafter that imitates the verifier is best trained where the verifier will be: on the text the base
model itself writes (SmolLM2's style differs from GSM8K's reference answers). Answers are made with
stock batched greedy `generate`, in the prompt format the benchmark uses (`question_ids`' worked
examples), and appended to a JSON-lines file as ``{"question", "answer"}``, so a run can resume.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from .bench.suites import CHAT_SHOTS, question_ids, read_jsonl

BATCH = 16


def generate_answers(model, tokenizer, questions: list[str], out: Path, max_new_tokens: int = 160,
                     log=print) -> list[dict]:
    """Answer `questions` in batches of 16 (left padding) into `out`, skipping those already there."""
    out = Path(out)
    done = read_jsonl(out) if out.is_file() else []
    todo = questions[len(done):]
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    for i in range(0, len(todo), BATCH):
        chunk = todo[i : i + BATCH]
        prompts = [question_ids(tokenizer, q)[0] for q in chunk]  # exactly the benchmark's prompt
        width = max(p.numel() for p in prompts)
        ids = torch.stack([torch.cat([torch.full((width - p.numel(),), pad), p]) for p in prompts])
        mask = torch.stack([torch.arange(width) >= width - p.numel() for p in prompts]).long()
        with torch.no_grad():
            new = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=max_new_tokens, do_sample=False,
                                 pad_token_id=pad)[:, width:].tolist()
        with out.open("a") as f:
            for question, row in zip(chunk, new, strict=True):
                row = row[: row.index(tokenizer.eos_token_id)] if tokenizer.eos_token_id in row else row
                f.write(json.dumps({"question": question, "answer": tokenizer.decode(row)}) + "\n")
        log(f"base answers: {len(done) + i + len(chunk)}/{len(questions)}")
    return read_jsonl(out)


def train_questions(file: Path, n: int) -> list[str]:
    """`n` GSM8K train questions after the worked examples (which come from the head of the split)."""
    return [r["question"] for r in read_jsonl(Path(file))[CHAT_SHOTS : CHAT_SHOTS + n]]
