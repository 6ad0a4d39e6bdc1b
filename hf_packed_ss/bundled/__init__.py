"""Checkpoints that ship inside the package, loadable offline.

`names()` lists them; `load(name)` returns `(model, tokenizer)` with the `assistant_mode` front.
`tiny-nemotron-random` is a randomly initialised model of the Nemotron-Labs-Diffusion format with a
byte-level BPE tokenizer trained on GSM8K (MIT licence); it exercises every code path, but its text
is noise and its drafts are rarely accepted.

Refreshing the bundled checkpoints is a maintainer's job in a source checkout; nothing here writes into the
package unless told to: `build_random`, `bundle` and `bundle_drafter` (and ``python -m hf_packed_ss.bundled``,
see its ``--help``) write only to the destination they are given, e.g. ``hf_packed_ss/bundled`` of the checkout.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig, PreTrainedTokenizerFast

HERE = Path(__file__).parent
RANDOM = "tiny-nemotron-random"
MASK_TOKEN, EOS_TOKEN = "<|mask|>", "<|endoftext|>"


def yarn_rope(max_position_embeddings: int) -> dict:
    """The release's RoPE kind (YaRN with llama-4 attention scaling), scaled to a tiny context."""
    return {
        "rope_type": "yarn", "rope_theta": 1_000_000.0, "factor": 4.0,
        "original_max_position_embeddings": max_position_embeddings // 4,
        "max_position_embeddings": max_position_embeddings, "beta_fast": 32.0, "beta_slow": 1.0,
        "mscale_all_dim": 1.0, "mscale": 1.0, "llama_4_scaling_beta": 0.1,
    }


def names() -> list[str]:
    """Bundled checkpoint names: full models (config.json) and drafter adapters (adapter_config.json)."""
    marks = ("config.json", "adapter_config.json")
    return sorted(p.name for p in HERE.iterdir() if any((p / m).is_file() for m in marks))


def path(name: str) -> Path:
    if name not in names():
        raise ValueError(f"Unknown bundled checkpoint {name!r}; choose one of {names()}.")
    return HERE / name


def load(name: str, dtype: torch.dtype | None = None):
    """Load a bundled checkpoint offline: returns `(model, tokenizer)`, model in eval mode (the model formats are
    registered: importing this module imported `hf_packed_ss` first)."""
    return load_folder(path(name), dtype)


def load_folder(folder: Path, dtype: torch.dtype | None = None):
    """`load` of a local folder of either kind: a checkpoint, or a drafter adapter (`adapter_config.json`) over
    its base model installed separately (the SmolLM2 drafter, e.g. its Hub repo downloaded); never the network."""
    if (Path(folder) / "adapter_config.json").is_file():
        from ..models import smollm2

        return smollm2.load(folder, dtype)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype or torch.float32, local_files_only=True).eval()
    return model, AutoTokenizer.from_pretrained(folder, local_files_only=True)


def train_tokenizer(texts: list[str], vocab_size: int) -> PreTrainedTokenizerFast:
    """A byte-level BPE with EOS and MASK special tokens (the MASK id is the diffusion mode's)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOS_TOKEN, MASK_TOKEN],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(texts, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS_TOKEN, mask_token=MASK_TOKEN,
                                   pad_token=EOS_TOKEN)


def gsm8k_texts(file: Path) -> list[str]:
    rows = [json.loads(line) for line in file.read_text().splitlines() if line.strip()]
    return [f"Question: {r['question']}\nAnswer: {r['answer']}" for r in rows]


def _destination(out: Path | None, function: str, example: str) -> Path:
    """`out` as a Path; refuses a missing one (no default: the package folder is never written to implicitly)."""
    if out is None:
        raise ValueError(f"{function}(...) writes only where it is told: pass out=FOLDER (to refresh the bundled "
                         f"copy in a source checkout: out=Path({example!r})).")
    return Path(out)


def bundle(run: Path, name: str, width: int | None = None, dtype: torch.dtype = torch.bfloat16, *,
           out: Path | None = None) -> Path:
    """Copy a trained run folder to `out / name`: weights in `dtype` (bfloat16 halves the size; decoding
    upcasts to the dtype `load` asks for), tokenizer, generation config (with `width` if given) and the
    training arguments. `out` is required (a ValueError without it; nothing is written); returns `out / name`."""
    import shutil

    out = _destination(out, "bundle", "hf_packed_ss/bundled") / name
    model = AutoModelForCausalLM.from_pretrained(run, dtype=dtype)
    if width is not None:
        model.generation_config.speculative_width = width
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(run).save_pretrained(out)
    if (Path(run) / "training_args.json").is_file():
        shutil.copy2(Path(run) / "training_args.json", out / "training_args.json")
    curve = learning_curve(Path(run))
    if curve:
        (out / "curve.jsonl").write_text("".join(json.dumps(row) + "\n" for row in curve))
    return out


def learning_curve(run: Path, seen: frozenset = frozenset()) -> list[dict]:
    """The run's `curve.jsonl` (`train --eval-every`) after those of the runs it was warm-started from (`--init`,
    followed back while they have one), steps counted from the first: one curve over every recorded stage. A
    folder met twice (a stage started from a bundled folder that was later overwritten) ends the chain."""
    if not (run / "curve.jsonl").is_file() or run.resolve() in seen:
        return []
    args = json.loads((run / "training_args.json").read_text()) if (run / "training_args.json").is_file() else {}
    earlier = learning_curve(Path(args["init"]), seen | {run.resolve()}) if args.get("init") else []
    offset = earlier[-1]["step"] if earlier else 0
    rows = [json.loads(line) for line in (run / "curve.jsonl").read_text().splitlines() if line.strip()]
    return earlier + [{**r, "step": r["step"] + offset, "run": run.name} for r in rows
                      if not (earlier and r["step"] == 0)]  # its step 0 is the earlier run's last point


def bundle_drafter(run: Path, name: str, width: int | None = None, *, out: Path | None = None,
                   targets: list[str] | None = None, rank: int | None = None) -> Path:
    """Copy a trained drafter run (PEFT adapter in bfloat16 + MASK embedding) to `out / name`, with the base
    model's tokenizer (so the folder is complete on the Hub), the Hub id of the base in `adapter_config.json`,
    and `width` in the generation config if given. `targets` keeps the adapters of those projections only (e.g.
    the q/k/v and gate/up ones): each projection that keeps an adapter is a matmul pair in every proposal call, so
    a pruned drafter is cheaper per call, at whatever tokens/NFE it keeps (chosen on dev prompts). `rank` keeps the
    best rank-`rank` approximation of each projection's update (truncated SVD, the scale kept): half the rank is
    half the file (a compiled CPU call costs the same at rank 32 and 64, docs/results.md). `run` may be a bundled
    folder itself (`out` elsewhere). `out` is required, as for `bundle`; returns `out / name`."""
    import shutil

    from safetensors.torch import load_file, save_file

    from ..models import smollm2

    out = _destination(out, "bundle_drafter", "hf_packed_ss/bundled") / name
    config = json.loads((Path(run) / "adapter_config.json").read_text())
    if targets is not None and (not targets or set(targets) - set(config["target_modules"])):
        raise ValueError(f"targets {sorted(set(targets) - set(config['target_modules'])) or targets} are not among "
                         f"the adapter's projections {sorted(config['target_modules'])}; name one or more of those.")
    if rank is not None and not 0 < rank <= config["r"]:
        raise ValueError(f"rank {rank} must be 1 to the adapter's rank {config['r']}.")
    out.mkdir(parents=True, exist_ok=True)
    for file in ("mask_embedding.safetensors", "generation_config.json", "training_args.json"):
        shutil.copy2(Path(run) / file, out / file)
    adapter = load_file(Path(run) / "adapter_model.safetensors")  # bfloat16 halves the size; loading upcasts
    if targets is not None:  # keys end in <projection>.lora_A.weight / .lora_B.weight
        adapter = {k: v for k, v in adapter.items() if k.split(".")[-3] in targets}
        config["target_modules"] = sorted(targets)
    if rank is not None and rank < config["r"]:
        adapter = truncate_rank(adapter, rank)
        config["lora_alpha"] = config["lora_alpha"] * rank / config["r"]  # the same alpha / r scale
        config["r"] = rank
    save_file({k: v.to(torch.bfloat16) for k, v in adapter.items()}, out / "adapter_model.safetensors",
              metadata={"format": "pt"})
    config["base_model_name_or_path"] = smollm2.HUB_ID
    (out / "adapter_config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    AutoTokenizer.from_pretrained(smollm2.base_folder()).save_pretrained(out)
    if width is not None:
        generation = GenerationConfig.from_pretrained(out)
        generation.speculative_width = width
        generation.save_pretrained(out)
    return out


def truncate_rank(adapter: dict[str, torch.Tensor], rank: int) -> dict[str, torch.Tensor]:
    """Each LoRA pair (`lora_A` r x in, `lora_B` out x r) replaced by the rank-`rank` pair whose product is the best
    approximation of B @ A (Eckart-Young: its top singular vectors, the singular values split evenly)."""
    truncated = dict(adapter)
    for key in adapter:
        if key.endswith("lora_A.weight"):
            b_key = key.replace("lora_A", "lora_B")
            u, s, vh = torch.linalg.svd(adapter[b_key].double() @ adapter[key].double(), full_matrices=False)
            root = s[:rank].sqrt()
            truncated[b_key] = (u[:, :rank] * root).to(adapter[b_key].dtype).contiguous()
            truncated[key] = (root[:, None] * vh[:rank]).to(adapter[key].dtype).contiguous()
    return truncated


def build_random(data: Path, out: Path | None = None, seed: int = 0) -> None:
    """Rebuild `tiny-nemotron-random` (seeded) into the folder `out` (required; the bundled copy of a source
    checkout is ``hf_packed_ss/bundled/tiny-nemotron-random``): 1,024-token tokenizer, 2 layers, hidden 64,
    trained on the GSM8K train file `data`."""
    from ..models import NemotronLabsDiffusionConfig, NemotronLabsDiffusionModel

    out = _destination(out, "build_random", f"hf_packed_ss/bundled/{RANDOM}")
    tokenizer = train_tokenizer(gsm8k_texts(data), vocab_size=1024)
    config = NemotronLabsDiffusionConfig(
        vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=4096,
        rope_parameters=yarn_rope(4096),
        mask_token_id=tokenizer.mask_token_id, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id, bos_token_id=None, block_size=16,
    )
    torch.manual_seed(seed)
    model = NemotronLabsDiffusionModel(config)
    model.generation_config = GenerationConfig(
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, max_new_tokens=64,
        assistant_mode="packed_ss", speculative_width=config.block_size - 1,
    )
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)

