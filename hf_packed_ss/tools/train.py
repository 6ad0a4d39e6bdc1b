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

A run writes ``trainer_state.pt`` (weights, optimizer, step, RNG) every ``--save-every`` steps; ``--resume``
continues from it with the same data order. The last step writes a Hub-style folder (safetensors,
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
from .bench.suites import read_jsonl
from .paths import GSM8K_ENV, GSM8K_HELP, gsm8k_split

HELP = {"data": f"GSM8K train split, JSON lines (default: train.jsonl in {GSM8K_HELP}; now %(default)s)"}


def __getattr__(name: str):
    """`DATA`: the default `--data`, `paths.gsm8k_split("train")` (read when asked for)."""
    if name == "DATA":
        return gsm8k_split("train")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


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
    init: str = ""  # a trained run folder (either format, same tokenizer) whose stack and head start this run


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
    start = pos - (pos + offset) % cfg.block_size  # first position of each position's block
    # Noise per block: 0 = keep the first token, mask the rest; 1 = mask all; 2 = mask at rate t.
    n_blocks = int(block.max()) + 1
    kind = torch.multinomial(torch.tensor([0.5, 0.2, 0.3]), batch * n_blocks, replacement=True, generator=gen)
    kind = kind.view(batch, n_blocks)[:, block]
    rate = torch.rand(batch, n_blocks, generator=gen).clamp_min(0.05)[:, block]
    first = (pos == start)[None].expand(batch, -1)
    masked = torch.where(kind == 0, ~first, torch.where(kind == 1, torch.ones_like(first),
                                                        torch.rand(batch, n, generator=gen) < rate))
    noisy = torch.where(masked, torch.full_like(x, mask_id), x)
    causal = torch.ones(n, n, dtype=torch.bool).tril()
    sees_clean = pos[None, :] < start[:, None]
    same_block = block[:, None] == block[None, :]
    none = torch.zeros(n, n, dtype=torch.bool)
    mask = torch.cat([torch.cat([same_block, sees_clean], 1), torch.cat([none, causal], 1)])
    logits = model(input_ids=torch.cat([noisy, x], 1), position_ids=torch.cat([pos, pos])[None].expand(batch, -1),
                   attention_mask=mask[None, None].expand(batch, 1, -1, -1)).logits
    vocab = logits.shape[-1]
    ar = F.cross_entropy(logits[:, n:-1].reshape(-1, vocab), x[:, 1:].reshape(-1))
    dlm = F.cross_entropy(logits[:, :n][masked], x[masked])
    return ar + dlm, {"ar": ar.item(), "diffusion": dlm.item()}


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
    draft = F.cross_entropy(logits[:, n:].reshape(-1, vocab), x.reshape(-1))
    return ar + draft, {"ar": ar.item(), "diffusion": draft.item()}


def drafter_loss(model, example, cfg: TrainConfig, gen: torch.Generator) -> tuple[torch.Tensor, dict]:
    """KL(base || drafter) at the MASK rows of `cfg.blocks` anchored blocks in one packed forward.

    `example` is one sequence ``(1, L)`` and where its answer starts; the verifier rows (the sequence,
    causal) run with the adapter gated off, so the teacher is the untouched base computed in the same call."""
    from ..lora import proposal_rows

    x, answer_start = example
    n, b, k = x.shape[1], cfg.block_size, cfg.blocks
    inner = model.get_base_model()
    anchors = torch.randint(answer_start - 1, n - b + 1, (k,), generator=gen)
    pos = torch.arange(n)
    offsets = torch.arange(b)
    block_pos = (anchors[:, None] + offsets).reshape(-1)
    block_ids = torch.full((k, b), inner.config.mask_token_id)
    block_ids[:, 0] = x[0, anchors]
    block_of = torch.arange(k).repeat_interleave(b)
    sees_seq = pos[None, :] < anchors.repeat_interleave(b)[:, None]
    rows = n + k * b
    mask = torch.zeros(rows, rows, dtype=torch.bool)
    mask[:n, :n] = torch.ones(n, n, dtype=torch.bool).tril()
    mask[n:, :n] = sees_seq
    mask[n:, n:] = block_of[:, None] == block_of[None, :]
    teacher_rows = (anchors[:, None] + offsets[:-1]).reshape(-1)  # AR row j scores j + 1
    student_rows = n + (torch.arange(k)[:, None] * b + offsets[1:]).reshape(-1)
    keep = torch.cat([teacher_rows, student_rows])
    with proposal_rows(inner, n):  # the blocks follow the sequence
        logits = inner(input_ids=torch.cat([x[0], block_ids.reshape(-1)])[None],
                       position_ids=torch.cat([pos, block_pos])[None], attention_mask=mask[None, None],
                       logits_to_keep=keep).logits[0].float()
    teacher, student = logits[: keep.numel() // 2].detach(), logits[keep.numel() // 2 :]
    kl = F.kl_div(student.log_softmax(-1), teacher.log_softmax(-1), log_target=True, reduction="batchmean")
    agree = (student.argmax(-1) == teacher.argmax(-1)).float().mean()
    return kl, {"kl": kl.item(), "argmax_agreement": agree.item()}


LOSSES = {"nemotron": nemotron_loss, "setdlm": setdlm_loss, "drafter": drafter_loss}


def learning_rate(step: int, cfg: TrainConfig) -> float:
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    progress = (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup)
    return cfg.lr * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))


def prepare(cfg: TrainConfig):
    """Tokenizer (trained once, then reused from `out`), token stream and a fresh model."""
    from transformers import AutoTokenizer

    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    texts = gsm8k_texts(Path(cfg.data))
    if (out / "tokenizer.json").is_file():
        tokenizer = AutoTokenizer.from_pretrained(out)
    else:
        tokenizer = AutoTokenizer.from_pretrained(cfg.init) if cfg.init else train_tokenizer(texts, cfg.vocab)
        tokenizer.save_pretrained(out)
    torch.manual_seed(cfg.seed)
    model = build_model(cfg, tokenizer)
    if cfg.init:
        warm_start(model, Path(cfg.init))
    return tokenizer, corpus(tokenizer, texts), model


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


DRAFTER_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def prepare_drafter(cfg: TrainConfig):
    """SmolLM2-135M-Instruct in `base_dtype` (frozen), a float32 LoRA and MASK embedding, and GSM8K train
    examples in its chat template with the position where each answer starts: the reference answers, or
    with `base_answers` the base model's own greedy ones (made once into OUT/base_answers.jsonl)."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from .. import smollm2

    folder = smollm2.base_folder()
    tokenizer = AutoTokenizer.from_pretrained(folder)
    base = AutoModelForCausalLM.from_pretrained(folder, dtype=getattr(torch, cfg.base_dtype))
    if cfg.base_answers:
        rows = generate_answers(base.eval(), tokenizer, train_questions(Path(cfg.data), cfg.base_answers),
                                Path(cfg.out) / "base_answers.jsonl")
    else:
        rows = read_jsonl(Path(cfg.data))
    torch.manual_seed(cfg.seed)
    model = get_peft_model(base, LoraConfig(r=cfg.lora_rank, lora_alpha=cfg.lora_rank, lora_dropout=0.0,
                                            target_modules=DRAFTER_TARGETS))
    embedding = smollm2.MaskEmbedding(base.config.hidden_size)
    smollm2.attach_drafter(model, cfg.block_size, embedding)
    examples = []
    for row in rows:
        chat = [{"role": "user", "content": row["question"]}]
        prompt = tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)
        full = tokenizer.apply_chat_template(chat + [{"role": "assistant", "content": row["answer"]}], tokenize=False)
        ids = tokenizer(full, add_special_tokens=False, return_tensors="pt").input_ids[:, : cfg.seq_len]
        start = len(tokenizer(prompt, add_special_tokens=False).input_ids)
        if ids.shape[1] - start > cfg.block_size + 1:
            examples.append((ids, start))
    return tokenizer, examples, model, embedding


def save_drafter(model, embedding, tokenizer, cfg: TrainConfig, out: Path) -> None:
    """The adapter folder: PEFT files, `mask_embedding.safetensors`, generation config, arguments."""
    from safetensors.torch import save_file

    model.save_pretrained(out)
    tensors = {k: v.detach().contiguous() for k, v in embedding.state_dict().items()}
    save_file(tensors, out / "mask_embedding.safetensors")
    GenerationConfig(eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.eos_token_id, max_new_tokens=128,
                     do_sample=False, assistant_mode="packed_ss", speculative_width=cfg.block_size - 1,
                     ).save_pretrained(out)
    (out / "training_args.json").write_text(json.dumps(asdict(cfg), indent=2))


def train(cfg: TrainConfig, resume: bool = False, log=print):
    """Run (or continue) training; returns the model and tokenizer."""
    from ..lora import proposal_only_adapters

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
        tokenizer, stream, model = prepare(cfg)
        params = list(model.parameters())

        def batch(gen):
            return sample_batch(stream, cfg, gen)
    opt = torch.optim.AdamW(params, lr=cfg.lr, betas=(0.9, 0.95), weight_decay=0.0 if cfg.format == "drafter" else 0.1)
    gen = torch.Generator().manual_seed(cfg.seed)
    step = 0
    state_file = out / "trainer_state.pt"
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
        step = state["step"]
        log(f"resumed at step {step}")
    loss_fn = LOSSES[cfg.format]
    model.train()
    tic = time.perf_counter()
    with proposal_only_adapters(model.get_base_model() if cfg.format == "drafter" else model):
        while step < cfg.steps:
            parts = _step(model, loss_fn, batch(gen), cfg, gen, opt, params, step)
            step += 1
            if step % 20 == 0 or step == cfg.steps:
                rate = (time.perf_counter() - tic) / 20
                tic = time.perf_counter()
                log(json.dumps({"step": step, **{k: round(v, 4) for k, v in parts.items()},
                                "lr": round(learning_rate(step, cfg), 6), "s_per_step": round(rate, 3)}))
            if step % cfg.save_every == 0 or step == cfg.steps:
                state = {k: v.detach() for k, v in trainable.items()}
                torch.save({"model": state, "optimizer": opt.state_dict(), "generator": gen.get_state(),
                            "step": step, "config": asdict(cfg)}, state_file)
    model.eval()
    if cfg.format == "drafter":
        save_drafter(model, embedding, tokenizer, cfg, out)
    else:
        save(model, tokenizer, cfg, out)
    return model, tokenizer


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
    args = vars(parser.parse_args(argv))
    resume = args.pop("resume")
    train(TrainConfig(**args), resume=resume)


if __name__ == "__main__":
    main()
