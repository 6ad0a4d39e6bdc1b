"""What the commands share to load a model and its prompts: a bundled checkpoint or a local folder
(`load_model`), `--device` / `--dtype` (`resolve`), what the loaded model can decode (`check_schedules`) and
prompt ids (`encode`, a suite's prompt; `encode_prompt`, `run`'s prompt or the default question)."""

from __future__ import annotations

from pathlib import Path

import torch

from ..front.families import family
from .bench.measure import PEERS, schedule_mode
from .bench.suites import CHAT_SHOTS, Prompt, chat_ids, question_ids

# GSM8K test question 0 (MIT licence), the benchmark's first prompt: SmolLM2's answer runs the full 128 tokens,
# where the old short default ended after 21 tokens, too short to time a speculative schedule.
QUESTION = ("Janet\u2019s ducks lay 16 eggs per day. She eats three for breakfast every morning and bakes muffins "
            "for her friends every day with four. She sells the remainder at the farmers' market daily for $2 per "
            "fresh duck egg. How much in dollars does she make every day at the farmers' market?")


def load_model(name_or_path: str, dtype: torch.dtype):
    """A bundled checkpoint name or a local folder; never the network."""
    from .. import bundled

    if name_or_path in bundled.names():
        return bundled.load(name_or_path, dtype)
    folder = Path(name_or_path)
    if not folder.is_dir():
        raise SystemExit(f"--model {name_or_path!r} is neither a bundled checkpoint {bundled.names()} "
                         "nor a local folder.")
    return bundled.load_folder(folder, dtype)


def fastest_dtype(device: torch.device) -> torch.dtype:
    """bfloat16 where the hardware runs it natively: CUDA, and a CPU with AVX512-BF16 or AMX (oneDNN's
    kernels: a call of 16 rows costs about what one of 1 row does once compiled, where float32's grows with the
    rows); float32 elsewhere. In bfloat16 AR is stock `generate` bit for bit and the speculative schedules leave
    it only at near-ties (docs/experiments/bf16_exactness.py); float32/float64 keep every schedule identical."""
    if device.type == "cuda":
        return torch.bfloat16
    native = device.type == "cpu" and (torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported())
    return torch.bfloat16 if native else torch.float32


def resolve(device: str, dtype: str) -> tuple[torch.device, torch.dtype]:
    """`--device` and `--dtype` as given, `auto` by what this machine runs fastest (`fastest_dtype`)."""
    dev = torch.device(("cuda" if torch.cuda.is_available() else "cpu") if device == "auto" else device)
    return dev, fastest_dtype(dev) if dtype == "auto" else getattr(torch, dtype)


def check_schedules(schedules: list[str], model) -> None:
    """Reject up front what the model cannot decode (e.g. `native` on a left-to-right format)."""
    fam = family(model.config)  # also a plain causal LM given a MASK id and block size (the SmolLM2 drafter)
    ours = [schedule_mode(s)[0] for s in schedules if s not in PEERS]
    if ours and fam is None:
        raise SystemExit(f"{type(model).__name__} has no packed layout: run only {list(PEERS)}.")
    wrong = [s for s in ours if s not in fam.schedules]
    if wrong:
        raise SystemExit(f"{wrong} not available on model_type {model.config.model_type!r}; "
                         f"choose from {sorted(fam.schedules) + list(PEERS)}.")
    if len(set(schedules)) != len(schedules):
        raise SystemExit(f"--schedules lists a schedule twice: {schedules}")


def encode(tokenizer, prompt: Prompt, chat: bool | None, shots: int = CHAT_SHOTS) -> torch.Tensor:
    """Prompt ids `(1, n)`. In the chat template (by default when the tokenizer has one) the user turn is
    the bare question where the suite has one, after `shots` worked GSM8K examples for a GSM8K question,
    else the prompt text."""
    has_template = bool(getattr(tokenizer, "chat_template", None))
    if chat and not has_template:
        raise SystemExit("--chat: this tokenizer has no chat template.")
    if chat is False or not has_template:
        return tokenizer(prompt.text, return_tensors="pt").input_ids
    if prompt.grader == "gsm8k" and prompt.question is not None:
        return question_ids(tokenizer, prompt.question, shots)
    return chat_ids(tokenizer, prompt.question or prompt.text)


def encode_prompt(tokenizer, prompt: str | None) -> torch.Tensor:
    """`prompt` as given, or the default question in the model's own prompt format."""
    return question_ids(tokenizer, QUESTION) if prompt is None else tokenizer(prompt, return_tensors="pt").input_ids
