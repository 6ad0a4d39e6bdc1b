"""`hf-packed-ss train`: the joint AR + diffusion objective of each model format, seeded, on CPU, resumable.

Both objectives evaluate the clean sequence once, causally (the AR mode), and add MASK copies that
share position ids with the tokens they predict, in one forward pass:

* Nemotron format: ``[noisy | clean]`` (2L rows). The sequence is cut into diffusion blocks of
  ``block_size`` at a random offset; a noisy row sees the clean rows before its block and its own block
  (bidirectional), and its logit scores its own position. Most blocks keep their first token and mask
  the rest (the ``[last, MASK x W]`` block Packed-SS drafts), some are fully masked (the first call and
  Quadratic-SS branches), the rest mask each token with a rate t ~ U(0, 1]. Loss: AR cross-entropy on the
  clean rows + diffusion cross-entropy on the masked rows.
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
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from transformers import GenerationConfig

from .bundled import gsm8k_texts, train_tokenizer, yarn_rope

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "gsm8k" / "train.jsonl"


@dataclass
class TrainConfig:
    format: str = "nemotron"
    out: str = "runs/tiny"
    data: str = str(DATA)
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


def build_model(cfg: TrainConfig, tokenizer):
    """A small model of the chosen format around `tokenizer` (its MASK and EOS ids)."""
    from .models import NemotronLabsDiffusionConfig, NemotronLabsDiffusionModel, SetDLMConfig, SetDLMModel

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
        config = SetDLMConfig(**common, max_block_size=cfg.block_size, block_size=cfg.seq_len,
                              tie_word_embeddings=False)
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
    return ar + dlm, {"ar": float(ar), "diffusion": float(dlm)}


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
                   attention_mask=mask[None, None].expand(batch, 1, -1, -1)).logits
    vocab = logits.shape[-1]
    ar = F.cross_entropy(logits[:, n : 2 * n].reshape(-1, vocab), x.reshape(-1))
    draft = F.cross_entropy(logits[:, 2 * n :].reshape(-1, vocab), x.reshape(-1))
    return ar + draft, {"ar": float(ar), "diffusion": float(draft)}


LOSSES = {"nemotron": nemotron_loss, "setdlm": setdlm_loss}


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
        tokenizer = train_tokenizer(texts, cfg.vocab)
        tokenizer.save_pretrained(out)
    torch.manual_seed(cfg.seed)
    return tokenizer, corpus(tokenizer, texts), build_model(cfg, tokenizer)


def train(cfg: TrainConfig, resume: bool = False, log=print):
    """Run (or continue) training; returns the model and tokenizer."""
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    tokenizer, stream, model = prepare(cfg)
    out = Path(cfg.out)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=(0.9, 0.95), weight_decay=0.1)
    gen = torch.Generator().manual_seed(cfg.seed)
    step = 0
    state_file = out / "trainer_state.pt"
    if resume and state_file.is_file():
        state = torch.load(state_file, weights_only=False)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        gen.set_state(state["generator"])
        step = state["step"]
        log(f"resumed at step {step}")
    loss_fn = LOSSES[cfg.format]
    model.train()
    tic = time.perf_counter()
    while step < cfg.steps:
        for group in opt.param_groups:
            group["lr"] = learning_rate(step, cfg)
        loss, parts = loss_fn(model, sample_batch(stream, cfg, gen), cfg, gen)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        if step % 20 == 0 or step == cfg.steps:
            rate = (time.perf_counter() - tic) / 20
            tic = time.perf_counter()
            log(json.dumps({"step": step, "loss": round(float(loss), 4), **{k: round(v, 4) for k, v in parts.items()},
                            "lr": round(learning_rate(step, cfg), 6), "s_per_step": round(rate, 3)}))
        if step % cfg.save_every == 0 or step == cfg.steps:
            torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "generator": gen.get_state(),
                        "step": step, "config": asdict(cfg)}, state_file)
    model.eval()
    save(model, tokenizer, cfg, out)
    return model, tokenizer


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
        parser.add_argument("--" + name.replace("_", "-"), type=type(value), default=value)
    parser.add_argument("--resume", action="store_true", help="continue from OUT/trainer_state.pt")
    args = vars(parser.parse_args(argv))
    resume = args.pop("resume")
    train(TrainConfig(**args), resume=resume)


if __name__ == "__main__":
    main()
