"""`hf-packed-ss train`: the joint AR + diffusion objective of each model format, seeded, on CPU, resumable.

Both objectives evaluate the clean sequence once, causally (the AR mode), and add MASK copies that
share position ids with the tokens they predict, in one forward pass:

* Nemotron format: ``[noisy | clean]`` (2L rows). The sequence is cut into diffusion blocks of
  ``block_size`` at a random offset; a noisy row sees the clean rows before its block and its own block
  (bidirectional), and its logit scores its own position. Most blocks keep their first token and mask
  the rest (the ``[last, MASK x W]`` block Packed-SS drafts), some are fully masked (the first call and
  Quadratic-SS branches), the rest mask each token with a rate t ~ U(0, 1]. Loss: AR cross-entropy on the
  clean rows + diffusion cross-entropy on the masked rows.
* Drafter (``--format drafter``): SmolLM2-135M-Instruct stays the AR verifier; a LoRA on every
  projection plus a learned MASK embedding, applied to proposal rows only, learn to imitate the base
  model's own next-token distributions (KL) at the positions of ``[last token, MASK x (B - 1)]`` blocks
  placed at random in the answers of GSM8K train questions (chat template): the reference answers, or
  with ``--base-answers N`` the base model's own greedy answers to N of them (see `base_answers`).
* SetDLM format: the duplicate-mask construction with the left-to-right order and two MASK copies per
  position, ``[clean | MASK | MASK]`` (3L rows): the first sees the clean tokens before its position (the
  AR conditional the verifier uses), the second only those more than k positions back, k ~ U{1..W}
  (what a window drafter sees: the verified prefix, not the k tokens in between). Loss: cross-entropy on
  both MASK copies.

A second stage for the joint formats (issue 21) starts from a trained run (``--init``) and trains where the
decoders run rather than on the data alone: ``--self-distill N`` swaps the reference answers of the first N
train questions for the init model's own greedy ones where those end and do not loop (acceptance rewards
agreeing with the verifier); ``--unlikelihood w`` pushes down the tokens that continue the init's own loops
(sequence-level unlikelihood, Welleck et al. 2019: what the filter left out, the model is also told not to
do); ``--distill w`` mixes KL from the AR mode's own distribution into the diffusion loss; ``--augment p``
writes a share of examples in other prompt formats (bare question, ``Q:``/``A:``, chat-style turns);
``--variable-blocks p`` cuts a share of the Nemotron blocks at random lengths, the ``[last, MASK x W]``
blocks of every width W; ``--eval-every N`` records the learning curve (``OUT/curve.jsonl``).

A run writes ``trainer_state.pt`` (weights, optimizer, step, RNG) every ``--save-every`` steps; ``--resume``
continues from it with the same data order. Every 20th step's losses go to stdout and ``OUT/train_log.jsonl``
(kept across resumes). The last step writes a Hub-style folder (safetensors,
config, tokenizer, generation_config).
"""

from __future__ import annotations

import argparse
import json
import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from transformers import GenerationConfig

from ..bundled import gsm8k_texts, train_tokenizer, yarn_rope
from .base_answers import generate_answers, train_questions
from .bench.suites import question_ids, read_jsonl
from .paths import GSM8K_ENV, GSM8K_HELP, gsm8k_split
from .quality import MAX_REPEATS

HELP = {"data": f"GSM8K train split, JSON lines (default: train.jsonl in {GSM8K_HELP}; now %(default)s)"}


def __getattr__(name: str):
    """`DATA`: the default `--data`, `paths.gsm8k_split("train")` (read when asked for)."""
    if name == "DATA":
        return gsm8k_split("train")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


DRAFTER_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


@dataclass
class TrainConfig:
    format: str = "nemotron"
    out: str = "runs/tiny"
    data: str = field(default_factory=lambda: str(gsm8k_split("train")))  # $HF_PACKED_SS_GSM8K/train.jsonl
    steps: int = 3000
    batch: int = 16
    seq_len: int = 256
    lr: float = 3e-3
    warmup: int = 100
    vocab: int = 4096
    hidden: int = 128
    layers: int = 4
    heads: int = 4
    kv_heads: int = 2
    intermediate: int = 384
    block_size: int = 16
    seed: int = 0
    save_every: int = 200
    threads: int = 0
    lora_rank: int = 32  # drafter only
    blocks: int = 16  # drafter only: blocks of `block_size` rows per sequence and step
    base_dtype: str = "float32"  # drafter only: the frozen base (bfloat16 matmuls are ~7x slower on AVX2 CPUs)
    rope: str = "default"  # setdlm only: "yarn" uses the Nemotron format's RoPE (for --init from it)
    base_answers: int = 0  # drafter only: train on the base's own greedy answers to this many GSM8K train questions
    code_answers: int = 0  # drafter only: and to this many stdlib code prompts (`code_prompts`, train split)
    answer_batch: int = 16  # drafter only: questions the base answers per batched generate call
    lora_targets: str = ",".join(DRAFTER_TARGETS)  # drafter only: the projections that carry the adapter
    hard_targets: float = 0.0  # drafter only: share of the loss that is cross-entropy with the base's argmax token
    # (what greedy verification accepts) instead of KL from its whole distribution
    init: str = ""  # a trained run folder (either format, same tokenizer) whose stack and head start this run
    self_distill: int = 0  # joint formats, with --init: train on the init model's own greedy answers to this many
    augment: float = 0.0  # joint formats: share of examples written in another prompt format (`FORMATS`)
    variable_blocks: float = 0.0  # nemotron only: share of diffusion blocks cut to a random length 2..block_size
    distill: float = 0.0  # joint formats: share of the diffusion loss that is KL from the AR mode's own (detached)
    # next-token distribution at the same position, instead of cross-entropy with the text
    unlikelihood: float = 0.0  # joint formats, with --self-distill: weight of the loss against the init's own loops
    negatives: str = ""  # more looping answers for --unlikelihood: an earlier round's OUT/self_answers.jsonl
    eval_every: int = 0  # joint formats: every N steps, greedy Packed-SS on dev and held-out questions (`Curve`)
    eval_width: int = 8  # the width those evaluations decode at


def build_model(cfg: TrainConfig, tokenizer):
    """A small model of the chosen format around `tokenizer` (its MASK and EOS ids)."""
    from ..models import NemotronLabsDiffusionConfig, NemotronLabsDiffusionModel, SetDLMConfig, SetDLMModel

    common = dict(
        vocab_size=len(tokenizer), hidden_size=cfg.hidden, intermediate_size=cfg.intermediate,
        num_hidden_layers=cfg.layers, num_attention_heads=cfg.heads, num_key_value_heads=cfg.kv_heads,
        head_dim=cfg.hidden // cfg.heads, max_position_embeddings=4096, mask_token_id=tokenizer.mask_token_id,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, bos_token_id=None,
    )
    if cfg.format == "nemotron":
        config = NemotronLabsDiffusionConfig(**common, rope_parameters=yarn_rope(4096), block_size=cfg.block_size)
        return NemotronLabsDiffusionModel(config)
    if cfg.format == "setdlm":
        # Qwen3 reads YaRN without the Ministral3-only llama-4 scaling and the duplicated context length
        yarn = {k: v for k, v in yarn_rope(4096).items()
                if k not in ("llama_4_scaling_beta", "max_position_embeddings")}
        rope = {"rope_parameters": yarn} if cfg.rope == "yarn" else {}
        config = SetDLMConfig(**common, max_block_size=cfg.block_size, block_size=cfg.seq_len,
                              tie_word_embeddings=False, **rope)
        return SetDLMModel(config)
    raise ValueError(f"Unknown --format {cfg.format!r}; choose nemotron or setdlm.")


def corpus(tokenizer, texts: list[str]) -> torch.Tensor:
    """All examples as one token stream, each followed by EOS."""
    ids = tokenizer(texts, add_special_tokens=False).input_ids
    return torch.tensor([t for x in ids for t in [*x, tokenizer.eos_token_id]], dtype=torch.long)


def sample_batch(stream: torch.Tensor, cfg: TrainConfig, gen: torch.Generator) -> torch.Tensor:
    starts = torch.randint(0, stream.numel() - cfg.seq_len, (cfg.batch,), generator=gen)
    return torch.stack([stream[s : s + cfg.seq_len] for s in starts.tolist()])


def nemotron_loss(model, x: torch.Tensor, cfg: TrainConfig, gen: torch.Generator) -> tuple[torch.Tensor, dict]:
    batch, n = x.shape
    mask_id = model.config.mask_token_id
    offset = int(torch.randint(0, cfg.block_size, (1,), generator=gen))
    pos = torch.arange(n)
    block = (pos + offset) // cfg.block_size
    inner = (pos + offset) % cfg.block_size
    # Noise per block: 0 = keep the first token, mask the rest; 1 = mask all; 2 = mask at rate t.
    n_blocks = int(block.max()) + 1
    kind = torch.multinomial(torch.tensor([0.5, 0.2, 0.3]), batch * n_blocks, replacement=True, generator=gen)
    kind = kind.view(batch, n_blocks)[:, block]
    rate = torch.rand(batch, n_blocks, generator=gen).clamp_min(0.05)[:, block]
    start, part = (pos - inner)[None], block[None]  # (1, n): first position of each position's block; its block
    if cfg.variable_blocks:  # cut some blocks at 2..block_size - 1: the [last, MASK x W] blocks of every width W
        cut = torch.randint(2, cfg.block_size, (batch, n_blocks), generator=gen)
        cut = torch.where(torch.rand(batch, n_blocks, generator=gen) < cfg.variable_blocks, cut, cfg.block_size)
        tail = inner >= cut[:, block]  # (batch, n): the rest of a cut block is a block of its own, same noise kind
        start, part = torch.where(tail, start + cut[:, block], start), 2 * part + tail
    first = (pos == start).expand(batch, -1)
    masked = torch.where(kind == 0, ~first, torch.where(kind == 1, torch.ones_like(first),
                                                        torch.rand(batch, n, generator=gen) < rate))
    noisy = torch.where(masked, torch.full_like(x, mask_id), x)
    causal = torch.ones(n, n, dtype=torch.bool).tril().expand(start.shape[0], -1, -1)
    sees_clean = pos[None, None, :] < start[:, :, None]
    same_block = part[:, :, None] == part[:, None, :]
    mask = torch.cat([torch.cat([same_block, sees_clean], -1), torch.cat([torch.zeros_like(causal), causal], -1)], -2)
    logits = model(input_ids=torch.cat([noisy, x], 1), position_ids=torch.cat([pos, pos])[None].expand(batch, -1),
                   attention_mask=mask[:, None].expand(batch, 1, -1, -1)).logits
    vocab = logits.shape[-1]
    ar = F.cross_entropy(logits[:, n:-1].reshape(-1, vocab), x[:, 1:].reshape(-1))
    if cfg.distill:
        masked[:, 0] = False  # position 0 has no AR prediction to agree with
    teacher = torch.cat([logits[:, n : n + 1], logits[:, n:-1]], 1)  # clean row j - 1 scores position j
    dlm = diffusion_loss(logits[:, :n][masked], x[masked], teacher[masked], cfg)
    return ar + dlm, {"ar": ar.item(), "diffusion": dlm.item()}


def diffusion_loss(student: torch.Tensor, tokens: torch.Tensor, teacher: torch.Tensor, cfg: TrainConfig):
    """Cross-entropy of the drafting rows with the text, mixed with `cfg.distill` x KL(AR mode || drafting rows)
    at the same positions: acceptance rewards agreeing with the verifier, not with the data."""
    ce = F.cross_entropy(student, tokens)
    if not cfg.distill:
        return ce
    target, log_q = teacher.detach().log_softmax(-1), student.log_softmax(-1)
    kl = torch.where(target.isfinite(), target.exp() * (target - log_q), 0.0).sum(-1).mean()  # a -inf logit: p = 0
    return (1 - cfg.distill) * ce + cfg.distill * kl


def setdlm_loss(model, x: torch.Tensor, cfg: TrainConfig, gen: torch.Generator) -> tuple[torch.Tensor, dict]:
    batch, n = x.shape
    mask_id = model.config.mask_token_id
    window = max(1, cfg.block_size // 2)
    pos = torch.arange(n)
    back = torch.randint(1, window + 1, (n,), generator=gen)
    causal = torch.ones(n, n, dtype=torch.bool).tril()
    eye = torch.eye(n, dtype=torch.bool)
    none = torch.zeros(n, n, dtype=torch.bool)
    ar_rows = torch.cat([causal & ~eye, eye, none], 1)  # clean < j, itself
    draft_rows = torch.cat([pos[None, :] <= (pos - back)[:, None], none, eye], 1)  # clean <= j - k, itself
    mask = torch.cat([torch.cat([causal, none, none], 1), ar_rows, draft_rows])
    masks = torch.full_like(x, mask_id)
    logits = model(input_ids=torch.cat([x, masks, masks], 1), position_ids=torch.cat([pos] * 3)[None].expand(batch, -1),
                   attention_mask=mask[None, None].expand(batch, 1, -1, -1), logits_to_keep=2 * n).logits
    vocab = logits.shape[-1]  # the MASK rows only: the clean rows carry no loss
    ar = F.cross_entropy(logits[:, :n].reshape(-1, vocab), x.reshape(-1))
    draft = diffusion_loss(logits[:, n:].reshape(-1, vocab), x.reshape(-1), logits[:, :n].reshape(-1, vocab), cfg)
    return ar + draft, {"ar": ar.item(), "diffusion": draft.item()}


def drafter_loss(model, example, cfg: TrainConfig, gen: torch.Generator) -> tuple[torch.Tensor, dict]:
    """KL(base || drafter) at the MASK rows of `cfg.blocks` anchored blocks placed at random in the answer, mixed
    with cross-entropy with the base's argmax token by `cfg.hard_targets`: greedy verification accepts a draft token
    only if it is that argmax, so the hard target asks for the top token only, not the tail of the distribution
    (measured neutral against KL alone at 400 steps: docs/training.md, run 6)."""
    n, b = example.ids.shape[1], cfg.block_size
    anchors = torch.randint(example.answer_start - 1, n - b + 1, (cfg.blocks,), generator=gen)
    student, teacher = drafter_logits(model, example, anchors, b)
    log_q, top = student.log_softmax(-1), teacher.argmax(-1)
    kl = F.kl_div(log_q, teacher.log_softmax(-1), log_target=True, reduction="batchmean")
    ce = F.nll_loss(log_q, top)
    agree = (student.argmax(-1) == top).float().mean()
    loss = (1 - cfg.hard_targets) * kl + cfg.hard_targets * ce
    return loss, {"kl": kl.item(), "ce": ce.item(), "argmax_agreement": agree.item()}


def drafter_logits(model, example, anchors: torch.Tensor, block_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(drafter, base) logits, ``(len(anchors) * (block_size - 1), vocab)`` each, at the MASK rows of the blocks
    `[ids[a], MASK x (block_size - 1)]` anchored at `anchors`: row j of a block drafts the token j positions past its
    anchor, and the base's row is its next-token distribution there (teacher-forced on `example.ids`).

    `example` is a `DrafterExample`. The verifier (the untouched base: the adapter is off outside proposal rows)
    runs the sequence once without gradients, over the cached KV of its shared prompt head: that gives the
    teacher's distributions and the cache the blocks see. The blocks then run as one call of proposal rows over
    that cache, so the backward pass covers only them: the same gradient as one packed forward of sequence and
    blocks (the sequence rows do not depend on the adapter), at a fraction of the cost."""
    from transformers import DynamicCache

    from ..modeling import cache_keyword
    from ..models.lora import proposal_rows

    x, n, b, k = example.ids, example.ids.shape[1], block_size, len(anchors)
    inner = model.get_base_model()
    head = example.head_length
    offsets = torch.arange(b)
    block_pos = (anchors[:, None] + offsets).reshape(-1)
    block_ids = torch.full((k, b), inner.config.mask_token_id)
    block_ids[:, 0] = x[0, anchors]
    block_of = torch.arange(k).repeat_interleave(b)
    teacher_rows = (anchors[:, None] + offsets[:-1]).reshape(-1)  # AR row j scores j + 1
    cache = DynamicCache()
    for i, (key, value) in enumerate(example.head_cache):
        cache.update(key, value, i)  # a copy: the shared head stays as it is
    kw = {cache_keyword(inner): cache}
    with torch.no_grad():
        teacher = _wide(inner(input_ids=x[:, head:], position_ids=torch.arange(head, n)[None], use_cache=True,
                              logits_to_keep=teacher_rows - head, **kw).logits[0])
    mask = torch.cat([torch.arange(n)[None, :] < anchors.repeat_interleave(b)[:, None],
                      block_of[:, None] == block_of[None, :]], dim=1)
    student_rows = (torch.arange(k)[:, None] * b + offsets[1:]).reshape(-1)
    with proposal_rows(inner, 0):  # every row of this call drafts
        student = _wide(inner(input_ids=block_ids.reshape(1, -1), position_ids=block_pos[None], use_cache=True,
                              attention_mask=mask[None, None], logits_to_keep=student_rows, **kw).logits[0])
    return student, teacher


LOSSES = {"nemotron": nemotron_loss, "setdlm": setdlm_loss, "drafter": drafter_loss}


def learning_rate(step: int, cfg: TrainConfig) -> float:
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    progress = (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup)
    return cfg.lr * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))


# The prompt formats a joint checkpoint is trained in: the benchmark's (`bench.suites.gsm8k_prompt`) first, then the
# ones `--augment` mixes in, so a bare question or a chat-style turn still gets an answer that ends.
FORMATS = ("Question: {question}\nAnswer: {answer}", "{question}\n{answer}", "Q: {question}\nA: {answer}",
           "User: {question}\nAssistant: {answer}")


def render(rows: list[dict], augment: float, seed: int) -> list[str]:
    """Each (question, answer) as training text: in the first of `FORMATS`, or with probability `augment` in one of
    the others (seeded, drawn apart from the training stream)."""
    gen = torch.Generator().manual_seed(seed)
    texts = []
    for row in rows:
        other = augment and float(torch.rand((), generator=gen)) < augment
        form = FORMATS[1 + int(torch.randint(0, len(FORMATS) - 1, (), generator=gen))] if other else FORMATS[0]
        texts.append(form.format(question=row["question"], answer=row["answer"].strip()))
    return texts


def self_distilled(rows: list[dict], cfg: TrainConfig, log=print) -> tuple[list[dict], list[dict]]:
    """`rows` with the first `cfg.self_distill` reference answers replaced by the `--init` model's own greedy
    answers (AR mode, the benchmark's prompt, `OUT/self_answers.jsonl`, made once), where those end with EOS
    within 128 tokens and repeat no 6-gram more than 3 times; elsewhere the reference answer stays. Also returns
    the looping answers (those and `cfg.negatives`'), for `--unlikelihood`."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if not cfg.init:
        raise SystemExit("--self-distill needs --init RUN: the trained model whose own answers to train on.")
    teacher = AutoModelForCausalLM.from_pretrained(cfg.init, dtype=torch.float32).eval()
    answers = generate_answers(teacher, AutoTokenizer.from_pretrained(cfg.init),
                               [r["question"] for r in rows[: cfg.self_distill]], Path(cfg.out) / "self_answers.jsonl",
                               max_new_tokens=128, log=log, batch=32, assistant_mode="ar")
    kept = [a for a in answers if a["ended_with_eos"] and a["max_6gram_repeats"] <= MAX_REPEATS]
    log(f"self-distillation: {len(kept)} of {len(answers)} own answers end with EOS and do not loop")
    own = {a["question"]: a["answer"] for a in kept}
    loops = [a for a in answers if a["max_6gram_repeats"] > MAX_REPEATS]
    if cfg.negatives:  # an earlier model's loops are still loops: the round after keeps pushing them down
        loops += [a for a in read_jsonl(Path(cfg.negatives)) if a["max_6gram_repeats"] > MAX_REPEATS]
    return [{**r, "answer": own.get(r["question"], r["answer"])} for r in rows], loops


def prepare(cfg: TrainConfig, log=print):
    """Tokenizer (trained once, then reused from `out`), token stream, a fresh (or warm-started) model, and the
    unlikelihood negatives (`repeats`; empty without `--self-distill`)."""
    from transformers import AutoTokenizer

    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    if (out / "tokenizer.json").is_file():
        tokenizer = AutoTokenizer.from_pretrained(out)
    else:
        tokenizer = (AutoTokenizer.from_pretrained(cfg.init) if cfg.init
                     else train_tokenizer(gsm8k_texts(Path(cfg.data)), cfg.vocab))
        tokenizer.save_pretrained(out)
    rows, loops = read_jsonl(Path(cfg.data)), []
    if cfg.self_distill:
        rows, loops = self_distilled(rows, cfg, log)
    torch.manual_seed(cfg.seed)
    model = build_model(cfg, tokenizer)
    if cfg.init:
        warm_start(model, Path(cfg.init))
    return tokenizer, corpus(tokenizer, render(rows, cfg.augment, cfg.seed)), model, repeats(tokenizer, loops, cfg)


def repeats(tokenizer, loops: list[dict], cfg: TrainConfig) -> list[tuple[list[int], list[int]]]:
    """Each looping own answer as (prompt + answer ids, the answer positions whose token completes a 6-gram
    already seen): the tokens that keep a greedy loop going, which `with_unlikelihood` makes unlikely. The prompt is
    the one the answer was generated in (`question_ids`, as `generate_answers` used)."""
    out = []
    for a in loops:
        prompt = question_ids(tokenizer, a["question"])[0].tolist()
        ids = (prompt + tokenizer(a["answer"], add_special_tokens=False).input_ids)[: cfg.seq_len]
        seen, marked = set(), []
        for t in range(5, len(ids)):
            gram = tuple(ids[t - 5 : t + 1])
            if gram in seen and t >= len(prompt):
                marked.append(t)
            seen.add(gram)
        if marked:
            out.append((ids, marked))
    return out


def ar_logits(model, x: torch.Tensor, cfg: TrainConfig) -> torch.Tensor:
    """(batch, n, vocab): the AR mode's logit for each position of `x` given the tokens before it (row 0 has no
    context and is never read): the clean causal rows (Nemotron format), or one MASK row per position that sees
    the clean tokens before it (SetDLM's duplicate-mask construction)."""
    batch, n = x.shape
    pos = torch.arange(n)
    causal = torch.ones(n, n, dtype=torch.bool).tril()
    if cfg.format == "nemotron":
        logits = model(input_ids=x, position_ids=pos[None].expand(batch, -1),
                       attention_mask=causal[None, None].expand(batch, 1, -1, -1)).logits
        return torch.cat([logits[:, :1], logits[:, :-1]], 1)
    eye = torch.eye(n, dtype=torch.bool)
    mask = torch.cat([torch.cat([causal, torch.zeros(n, n, dtype=torch.bool)], 1), torch.cat([causal & ~eye, eye], 1)])
    return model(input_ids=torch.cat([x, torch.full_like(x, model.config.mask_token_id)], 1),
                 position_ids=torch.cat([pos, pos])[None].expand(batch, -1),
                 attention_mask=mask[None, None].expand(batch, 1, -1, -1), logits_to_keep=n).logits


def with_unlikelihood(loss_fn, negatives: list, cfg: TrainConfig, pad: int, per_step: int = 8):
    """`loss_fn` plus `cfg.unlikelihood` x the mean of -log(1 - p) over the marked tokens of `per_step` of the
    init's looping answers (sequence-level unlikelihood training, Welleck et al. 2019): the greedy loops the
    self-distillation filter dropped are pushed down, not only left out."""
    if not cfg.unlikelihood or not negatives:
        return loss_fn

    def loss(model, x, cfg, gen):
        total, parts = loss_fn(model, x, cfg, gen)
        picks = torch.randint(0, len(negatives), (per_step,), generator=gen).tolist()
        n = max(len(negatives[i][0]) for i in picks)
        ids = torch.tensor([negatives[i][0] + [pad] * (n - len(negatives[i][0])) for i in picks])
        rows = torch.tensor([b for b, i in enumerate(picks) for _ in negatives[i][1]])
        cols = torch.tensor([t for i in picks for t in negatives[i][1]])
        p = ar_logits(model, ids, cfg)[rows, cols].float().softmax(-1).gather(-1, ids[rows, cols][:, None])
        ul = -torch.log1p(-p.clamp(max=1 - 1e-5)).mean()
        return total + cfg.unlikelihood * ul, {**parts, "unlikelihood": ul.item()}

    return loss


def warm_start(model, init: Path) -> None:
    """Copy the decoder stack and output head of a trained model of either format into `model`.

    Both formats read a MASK row's logit as the token at its own position and share layer shapes, so a
    trained Nemotron-format model is a strong start for the SetDLM objective; parameters only one side
    has (Qwen3's q/k norms) keep their fresh initialisation."""
    from transformers import AutoModelForCausalLM

    source = AutoModelForCausalLM.from_pretrained(init, dtype=torch.float32)
    theirs = {**{f"stack.{k}": v for k, v in getattr(source, source.base_model_prefix).state_dict().items()},
              **{f"head.{k}": v for k, v in getattr(source, source.head_name).state_dict().items()}}
    ours = {**{f"stack.{k}": v for k, v in getattr(model, model.base_model_prefix).state_dict().items()},
            **{f"head.{k}": v for k, v in getattr(model, model.head_name).state_dict().items()}}
    shared = [k for k in ours if k in theirs and theirs[k].shape == ours[k].shape]
    if not any(k.startswith("stack.layers.") for k in shared):
        raise ValueError(f"--init {init}: no decoder layer matches this model's shapes; train from scratch instead.")
    with torch.no_grad():
        for k in shared:
            ours[k].copy_(theirs[k])



def _wide(logits: torch.Tensor) -> torch.Tensor:
    """Logits in at least float32 for the loss (a bfloat16 base's), float64 kept."""
    return logits if logits.dtype in (torch.float32, torch.float64) else logits.float()


@dataclass
class DrafterExample:
    """One training sequence `ids` ``(1, L)`` (prompt, answer, EOS), where its answer starts, and the cached KV
    of its prompt's first `head_length` tokens, which every prompt of its kind shares (the worked examples of the
    GSM8K prompt, the system turn of a chat): computed once per run, not once per step."""

    ids: torch.Tensor
    answer_start: int
    head_length: int
    head_cache: list


def _shared_head(prompts: list[list[int]]) -> int:
    """The length of the token prefix every prompt shares, short of the shortest prompt."""
    first, size = prompts[0], min(len(p) for p in prompts) - 1
    for p in prompts[1:]:
        size = next((i for i in range(size) if p[i] != first[i]), size)
    return size


def drafter_examples(base, tokenizer, kinds: list[tuple[list[list[int]], list[str]]], seq_len: int,
                     block_size: int) -> list[DrafterExample]:
    """Examples from (prompt ids, answers) pairs of each kind: answers cut to `seq_len` tokens, each kind's shared
    prompt head run once through the base (its KV kept)."""
    examples = []
    for prompts, answers in kinds:
        if not prompts:
            continue
        head = _shared_head(prompts)
        with torch.no_grad():
            cache = base(input_ids=torch.tensor([prompts[0][:head]]), use_cache=True).past_key_values
        layers = [(layer.keys, layer.values) for layer in cache.layers]
        for prompt, answer in zip(prompts, answers, strict=True):
            tokens = tokenizer(answer, add_special_tokens=False).input_ids[:seq_len] + [tokenizer.eos_token_id]
            if len(tokens) > block_size + 1:
                examples.append(DrafterExample(torch.tensor([prompt + tokens]), len(prompt), head, layers))
    return examples


def prepare_drafter(cfg: TrainConfig):
    """SmolLM2-135M-Instruct in `base_dtype` (frozen), a float32 LoRA and MASK embedding, and the examples: GSM8K
    train questions with their reference answers in the bare chat template, or with `base_answers` / `code_answers`
    the base model's own greedy answers (made once into OUT/base_answers.jsonl and OUT/code_answers.jsonl) in the
    prompts the benchmark sends: the 4-shot GSM8K chat prompt, and a code stub as the user turn (`code_prompts`)."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ..models import smollm2
    from .bench.suites import chat_ids
    from .code_prompts import code_prompts

    folder = smollm2.base_folder()
    tokenizer = AutoTokenizer.from_pretrained(folder)
    base = AutoModelForCausalLM.from_pretrained(folder, dtype=getattr(torch, cfg.base_dtype))
    kinds = []
    if cfg.base_answers or cfg.code_answers:
        out = Path(cfg.out)
        for n, file, questions, encode in (
                (cfg.base_answers, "base_answers.jsonl", lambda: train_questions(Path(cfg.data), cfg.base_answers),
                 question_ids),
                (cfg.code_answers, "code_answers.jsonl", lambda: code_prompts("train", cfg.code_answers), chat_ids)):
            if n:
                rows = generate_answers(base.eval(), tokenizer, questions(), out / file, encode=encode,
                                        batch=cfg.answer_batch)
                kinds.append(([encode(tokenizer, r["question"])[0].tolist() for r in rows],
                              [r["answer"] for r in rows]))
    else:
        rows = read_jsonl(Path(cfg.data))
        kinds.append(([chat_ids(tokenizer, r["question"])[0].tolist() for r in rows], [r["answer"] for r in rows]))
    examples = drafter_examples(base.eval(), tokenizer, kinds, cfg.seq_len, cfg.block_size)
    torch.manual_seed(cfg.seed)
    model = get_peft_model(base, LoraConfig(r=cfg.lora_rank, lora_alpha=cfg.lora_rank, lora_dropout=0.0,
                                            target_modules=cfg.lora_targets.split(",")))
    embedding = smollm2.MaskEmbedding(base.config.hidden_size)
    smollm2.attach_drafter(model, cfg.block_size, embedding)
    return tokenizer, examples, model, embedding


def save_drafter(model, embedding, tokenizer, cfg: TrainConfig, out: Path, stages: list[dict] | None = None) -> None:
    """The adapter folder: PEFT files, `mask_embedding.safetensors`, generation config, arguments (with every
    command's arguments under "stages" when the run was resumed with other ones, so the folder alone reproduces it)."""
    from safetensors.torch import save_file

    model.save_pretrained(out)
    tensors = {k: v.detach().contiguous() for k, v in embedding.state_dict().items()}
    save_file(tensors, out / "mask_embedding.safetensors")
    GenerationConfig(eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.eos_token_id, max_new_tokens=128,
                     do_sample=False, assistant_mode="packed_ss", speculative_width=cfg.block_size - 1,
                     ).save_pretrained(out)
    args = asdict(cfg)
    if stages and any(stage != args for stage in stages):
        args["stages"] = stages
    (out / "training_args.json").write_text(json.dumps(args, indent=2))


def train(cfg: TrainConfig, resume: bool = False, log=print, until: int | None = None):
    """Run (or continue) training; returns the model and tokenizer. `until` stops after that step with the learning
    rate still scheduled over `cfg.steps` (a stage that a later `resume` with other arguments continues)."""
    from ..models.lora import proposal_only_adapters

    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    if not Path(cfg.data).is_file():
        raise SystemExit(f"GSM8K train file not found at {cfg.data}: pass --data FILE or set {GSM8K_ENV} to the "
                         "folder holding train.jsonl.")
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    if cfg.format == "drafter":
        tokenizer, examples, model, embedding = prepare_drafter(cfg)
        params = [p for p in model.parameters() if p.requires_grad] + [embedding.delta]

        def batch(gen):
            return examples[int(torch.randint(0, len(examples), (1,), generator=gen))]
    else:
        tokenizer, stream, model, negatives = prepare(cfg, log)
        params = list(model.parameters())

        def batch(gen):
            return sample_batch(stream, cfg, gen)
    opt = torch.optim.AdamW(params, lr=cfg.lr, betas=(0.9, 0.95), weight_decay=0.0 if cfg.format == "drafter" else 0.1)
    gen = torch.Generator().manual_seed(cfg.seed)
    step, stages = 0, []
    state_file, log_file = out / "trainer_state.pt", out / "train_log.jsonl"
    trainable = {k: v for k, v in model.named_parameters() if v.requires_grad}
    if cfg.format == "drafter":
        trainable["mask_embedding.delta"] = embedding.delta
    if resume and state_file.is_file():
        state = torch.load(state_file, weights_only=False)
        for k, v in state["model"].items():
            if k in trainable:  # trainable parameters only (buffers are rebuilt)
                trainable[k].data.copy_(v)
        opt.load_state_dict(state["optimizer"])
        gen.set_state(state["generator"])
        step, stages = state["step"], state.get("stages", [state["config"]])
        log(f"resumed at step {step}")
    # the loss log up to the step this run starts from: a resumed run's continues, a fresh run's starts empty
    rows = log_file.read_text().splitlines() if log_file.is_file() else []
    log_file.write_text("".join(r + "\n" for r in rows if json.loads(r)["step"] <= step))
    stages = stages if stages and stages[-1] == asdict(cfg) else [*stages, asdict(cfg)]
    loss_fn = LOSSES[cfg.format]
    if cfg.format != "drafter":
        loss_fn = with_unlikelihood(loss_fn, negatives, cfg, tokenizer.pad_token_id)
    curve = Curve(cfg, tokenizer) if cfg.eval_every and cfg.format != "drafter" else None
    if curve is not None and step == 0:
        curve.point(model, 0, log)
    model.train()
    tic = time.perf_counter()
    with proposal_only_adapters(model.get_base_model() if cfg.format == "drafter" else model):
        last = min(cfg.steps, until or cfg.steps)
        while step < last:
            parts = _step(model, loss_fn, batch(gen), cfg, gen, opt, params, step)
            step += 1
            if curve is not None and (step % cfg.eval_every == 0 or step == cfg.steps):
                curve.point(model, step, log)
                tic = time.perf_counter()
            if step % 20 == 0 or step == last:
                rate = (time.perf_counter() - tic) / 20
                tic = time.perf_counter()
                row = json.dumps({"step": step, **{k: round(v, 4) for k, v in parts.items()},
                                  "lr": round(learning_rate(step, cfg), 6), "s_per_step": round(rate, 3)})
                log(row)
                with log_file.open("a") as f:
                    f.write(row + "\n")
            if step % cfg.save_every == 0 or step == last:
                state = {k: v.detach() for k, v in trainable.items()}
                torch.save({"model": state, "optimizer": opt.state_dict(), "generator": gen.get_state(),
                            "step": step, "config": asdict(cfg), "stages": stages}, state_file)
    model.eval()
    if cfg.format == "drafter":
        save_drafter(model, embedding, tokenizer, cfg, out, stages)
    else:
        save(model, tokenizer, cfg, out)
    return model, tokenizer


class Curve:
    """The learning curve: greedy Packed-SS at `eval_width` on the `DEV` questions (where choices are made) and
    the `HELD_OUT` ones (never chosen on), in the trained and the bare prompt, appended to OUT/curve.jsonl."""

    def __init__(self, cfg: TrainConfig, tokenizer):
        from .quality import dev_questions, held_out_questions

        self.cfg, self.tokenizer, self.file = cfg, tokenizer, Path(cfg.out) / "curve.jsonl"
        self.sets = {"dev": dev_questions(), "held_out": held_out_questions()}

    def point(self, model, step: int, log=print) -> None:
        from .quality import measure

        model.eval()
        with self.file.open("a") as f:
            for name, questions in self.sets.items():
                for prompt in ("trained", "bare"):
                    r = measure(model, self.tokenizer, questions, ["packed_ss"], self.cfg.eval_width,
                                prompt=prompt)["packed_ss"]
                    row = {"step": step, "set": name, "prompt": prompt, "width": self.cfg.eval_width,
                           **{k: r[k] for k in ("tokens_per_nfe", "ended_with_eos", "looping", "n")}}
                    f.write(json.dumps(row) + "\n")
                    log(json.dumps(row))
        model.train()


def _step(model, loss_fn, batch, cfg: TrainConfig, gen, opt, params, step: int) -> dict:
    """One optimiser step at the scheduled learning rate; returns the loss and its parts."""
    for group in opt.param_groups:
        group["lr"] = learning_rate(step, cfg)
    loss, parts = loss_fn(model, batch, cfg, gen)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(params, 1.0)
    opt.step()
    return {"loss": loss.item(), **parts}


def save(model, tokenizer, cfg: TrainConfig, out: Path, width: int | None = None) -> None:
    """Write the Hub-style folder: weights, config, tokenizer, generation config with our defaults."""
    default = cfg.block_size - 1 if cfg.format == "nemotron" else max(1, cfg.block_size // 2)
    model.generation_config = GenerationConfig(
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, max_new_tokens=128,
        do_sample=False, assistant_mode="packed_ss", speculative_width=width or default,
    )
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    (out / "training_args.json").write_text(json.dumps(asdict(cfg), indent=2))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="hf-packed-ss train", description=__doc__.split("\n")[0])
    for name, value in asdict(TrainConfig()).items():
        parser.add_argument("--" + name.replace("_", "-"), type=type(value), default=value, help=HELP.get(name))
    parser.add_argument("--resume", action="store_true", help="continue from OUT/trainer_state.pt")
    parser.add_argument("--until", type=int, default=None, help="stop after this step, the learning rate still "
                        "scheduled over --steps (a later --resume, with other arguments, continues the run)")
    parser.add_argument("--export", action="store_true", help="drafter only: write OUT/trainer_state.pt's weights "
                        "(the last checkpoint of a running or stopped run) as an adapter folder OUT/step-N, no "
                        "training")
    args = vars(parser.parse_args(argv))
    resume, export, until = args.pop("resume"), args.pop("export"), args.pop("until")
    if export:
        print(export_drafter(Path(args["out"])))
        return
    train(TrainConfig(**args), resume=resume, until=until)


def export_drafter(run: Path) -> Path:
    """The adapter folder of a drafter run's last checkpoint (`trainer_state.pt`), as `save_drafter` writes it at
    the end of a run, into ``run/step-N``: checkpoints are compared (on dev prompts) before one is bundled."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ..models import smollm2

    state = torch.load(Path(run) / "trainer_state.pt", weights_only=False)
    cfg = TrainConfig(**{k: v for k, v in state["config"].items() if k in TrainConfig.__dataclass_fields__})
    folder = smollm2.base_folder()
    base = AutoModelForCausalLM.from_pretrained(folder)
    model = get_peft_model(base, LoraConfig(r=cfg.lora_rank, lora_alpha=cfg.lora_rank, lora_dropout=0.0,
                                            target_modules=cfg.lora_targets.split(",")))
    embedding = smollm2.MaskEmbedding(base.config.hidden_size)
    trainable = {k: v for k, v in model.named_parameters() if v.requires_grad}
    trainable["mask_embedding.delta"] = embedding.delta
    missing = set(trainable) - set(state["model"])
    if missing:
        raise SystemExit(f"{run}/trainer_state.pt lacks {sorted(missing)[:3]}: not a drafter run of this config.")
    with torch.no_grad():
        for k, v in trainable.items():
            v.copy_(state["model"][k])
    out = Path(run) / f"step-{state['step']}"
    save_drafter(model, embedding, AutoTokenizer.from_pretrained(folder), cfg, out, state.get("stages"))
    return out


if __name__ == "__main__":
    main()
