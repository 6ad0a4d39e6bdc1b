"""Decode with the model tensor-parallel over `torchrun` processes, to show the sharded model decodes exactly.

Why: a model too big for one device is split across several with transformers' tensor parallelism
(`from_pretrained(..., distributed_config=DistributedConfig(tp_plan="auto"))`, which shards by the config's
`base_model_tp_plan`). Every rank then runs the same decoder on the same (all-reduced) logits, so every schedule
must give the tokens one process gives. This script decodes a few fixed prompts greedily with each schedule and
writes, on rank 0, one JSON file that a single-process run (plain `python -m hf_packed_ss.tools.shard`) can be
compared with::

    torchrun --nproc-per-node 2 -m hf_packed_ss.tools.shard --model tiny-nemotron-gsm8k \\
        --schedules ar packed_ss --max-new-tokens 24 --dtype float64 --out tp.json   # CPU: gloo
    python -m hf_packed_ss.tools.shard --model tiny-nemotron-gsm8k ... --out one.json  # one process

The JSON holds `outputs` ({schedule: [new tokens per prompt]}), `nfe` (same shape), `world_size`, `backend`,
`tp_plan` (the plan the model resolved), and `sharded`: for layer 0's q_proj weights (an adapter's too), the full
shape and the local shape each rank holds. On CUDA the backend is nccl (one GPU per rank), on CPU gloo.
`--adapter FOLDER` loads a PEFT LoRA adapter onto the (sharded) model, to exercise the proposal-only gate on
shards: PEFT shards the adapter with its base layers, and the same adapter must draft the same proposals, so the
NFE must match one process's too. `--trust-remote-code` loads a released folder with its own class and
`hf_packed_ss.enable`s it (the twin it decodes through gets the TP forwards of the model's sharded modules).
`--sample-seed SEED` also samples with every schedule from a generator seeded SEED on every rank (`sampled`), and
`--batch` also decodes all prompts as one left-padded batch (`batched`: each row must be its prompt's `outputs`);
`ranks_agree` says whether every rank decoded the same tokens.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

from .bench.measure import schedule_mode

PROMPTS = (  # GSM8K test questions (MIT licence) in the format the bundled tiny models were trained on
    "Question: Janet's ducks lay 16 eggs per day. She eats three for breakfast every morning and bakes muffins "
    "for her friends every day with four. How many eggs does she have left?\nAnswer:",
    "Question: A robe takes 2 bolts of blue fiber and half that much white fiber. How many bolts in total does "
    "it take?\nAnswer:",
)
FALLBACK_IDS = ((5, 9, 2, 7, 1, 3), (11, 4, 8, 6))  # for a folder without a tokenizer
DTYPES = {"float64": torch.float64, "float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m hf_packed_ss.tools.shard", description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="tiny-nemotron-gsm8k", help="a bundled checkpoint name or a local folder")
    parser.add_argument("--schedules", nargs="+", default=["ar", "packed_ss"],
                        help="assistant modes; hybrid_ss:K sets speculative_branches=K")
    parser.add_argument("--max-new-tokens", type=int, default=24)
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="float64")
    parser.add_argument("--adapter", type=Path, help="a PEFT LoRA adapter folder to load onto the model")
    parser.add_argument("--trust-remote-code", action="store_true",
                        help="a released folder with its own code: AutoModel(trust_remote_code=True) + enable()")
    parser.add_argument("--backend", choices=["auto", "gloo", "nccl"], default="auto",
                        help="torch.distributed backend (auto: nccl on CUDA, gloo on CPU)")
    parser.add_argument("--sample-seed", type=int, default=None,
                        help="also sample (do_sample=True) with a generator of this seed, the same on every rank")
    parser.add_argument("--batch", action="store_true", help="also decode the prompts as one batch")
    parser.add_argument("--out", type=Path, help="JSON file written by rank 0 (default: print it)")
    return parser.parse_args(argv)


def init_distributed(backend: str) -> tuple[int, int, str, torch.device]:
    """Join the `torchrun` process group (rank, world size, backend, this rank's device); one process needs none."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    cuda = torch.cuda.is_available()
    if world == 1:
        return 0, 1, "none", torch.device("cuda" if cuda else "cpu")
    missing = [k for k in ("RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT") if k not in os.environ]
    if missing:
        raise SystemExit(f"WORLD_SIZE={world} but {', '.join(missing)} unset: start this script with "
                         "`torchrun --nproc-per-node N -m hf_packed_ss.tools.shard ...`.")
    backend = ("nccl" if cuda else "gloo") if backend == "auto" else backend
    if backend == "nccl" and not cuda:
        raise SystemExit("--backend nccl needs CUDA devices; on CPU use gloo (the default there).")
    local_rank = int(os.environ["LOCAL_RANK"])
    device = torch.device("cpu")
    if cuda:
        if local_rank >= torch.cuda.device_count():
            raise SystemExit(f"LOCAL_RANK {local_rank} but only {torch.cuda.device_count()} CUDA devices: one GPU "
                             "per process, so --nproc-per-node must not exceed the GPUs of a node.")
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    if not dist.is_initialized():  # transformers would pick the same backend; doing it here gives a clear error
        try:
            dist.init_process_group(backend, device_id=device if backend == "nccl" else None)
        except Exception as error:
            raise SystemExit(f"torch.distributed.init_process_group({backend!r}) failed for rank "
                             f"{os.environ['RANK']} of {world}: {error}") from error
    if dist.get_world_size() != world:
        raise SystemExit(f"WORLD_SIZE={world} but the process group has {dist.get_world_size()} ranks.")
    return dist.get_rank(), world, backend, device


def check_divisible(config, world: int) -> None:
    """Heads, KV heads and the vocabulary must split evenly over the ranks (a shard must hold whole heads)."""
    names = ("num_attention_heads", "num_key_value_heads", "vocab_size", "intermediate_size")
    sizes = {k: getattr(config, k, None) for k in names}
    if bad := {k: v for k, v in sizes.items() if v is not None and v % world}:
        raise SystemExit(f"Cannot shard this model over {world} ranks: {bad} not divisible by {world}.")


def load(model: str, dtype: torch.dtype, world: int, device: torch.device, adapter: Path | None = None,
         remote: bool = False):
    """The model (tensor-parallel when world > 1) and its tokenizer (None when the folder has none)."""
    from transformers import AutoConfig, AutoModel, AutoModelForCausalLM, AutoTokenizer
    from transformers.distributed import DistributedConfig

    import hf_packed_ss  # noqa: F401  (registers the model formats)
    from hf_packed_ss import bundled

    folder = bundled.path(model) if model in bundled.names() else Path(model)
    check_divisible(AutoConfig.from_pretrained(folder, trust_remote_code=remote), world)
    # world > 1: tp_size = WORLD_SIZE, by the config's base_model_tp_plan; each rank's shard goes to its device
    kwargs = {"distributed_config": DistributedConfig(tp_plan="auto")} if world > 1 else {"device_map": device}
    if remote:  # the release's own class, with our generate front
        net = hf_packed_ss.enable(AutoModel.from_pretrained(folder, dtype=dtype, trust_remote_code=True, **kwargs))
    else:
        net = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype, **kwargs)
    net.eval()
    if adapter is not None:  # a saved adapter, not a fresh one: PEFT initialises a TP adapter at its local shape
        from peft import PeftModel

        net = PeftModel.from_pretrained(net, str(adapter)).eval()
    tokenizer = AutoTokenizer.from_pretrained(folder) if (folder / "tokenizer.json").is_file() else None
    return net, tokenizer


def shard_shapes(net, world: int) -> dict:
    """Layer 0's q_proj weights (the base one and any adapter's): full shape and each rank's local shape."""
    shapes = {}
    for name, weight in net.named_parameters():
        if "layers.0.self_attn.q_proj." in name and name.endswith("weight"):
            local = list((weight.to_local() if hasattr(weight, "to_local") else weight).shape)
            ranks = [local]
            if world > 1:
                ranks = [None] * world
                dist.all_gather_object(ranks, local)
            shapes[name] = {"full_shape": list(weight.shape), "local_shapes": ranks,
                            "dtensor": hasattr(weight, "device_mesh")}
    return shapes


def decode(net, prompts: list[torch.Tensor], schedules: list[str], max_new_tokens: int) -> tuple[dict, dict]:
    """Greedy new tokens and NFE per schedule and prompt."""
    outputs, nfe = {}, {}
    for schedule in schedules:
        mode, extra = schedule_mode(schedule)
        outputs[schedule], nfe[schedule] = [], []
        for ids in prompts:
            out = net.generate(input_ids=ids, assistant_mode=mode, max_new_tokens=max_new_tokens, do_sample=False,
                               return_dict_in_generate=True, **extra)
            outputs[schedule].append(out.sequences[0, ids.shape[1]:].tolist())
            nfe[schedule].append(int(out.decoding_stats.nfe))
    return outputs, nfe


def sample(net, prompts: list[torch.Tensor], schedules: list[str], max_new_tokens: int, seed: int) -> dict:
    """Sampled new tokens per schedule and prompt: each decode from a fresh generator seeded `seed` (every rank
    draws the same numbers, so every rank accepts and samples the same tokens from the same all-reduced logits)."""
    outputs = {}
    for schedule in schedules:
        mode, extra = schedule_mode(schedule)
        outputs[schedule] = []
        for ids in prompts:
            generator = torch.Generator(device=ids.device).manual_seed(seed)
            out = net.generate(input_ids=ids, assistant_mode=mode, max_new_tokens=max_new_tokens, do_sample=True,
                               generator=generator, **extra)
            outputs[schedule].append(out[0, ids.shape[1]:].tolist())
    return outputs


def batched(net, prompts: list[torch.Tensor], schedules: list[str], max_new_tokens: int, pad: int) -> dict:
    """Greedy new tokens per schedule of all prompts decoded as one left-padded batch (the row's own tokens)."""
    longest = max(p.shape[1] for p in prompts)
    ids = torch.full((len(prompts), longest), pad, dtype=torch.long, device=prompts[0].device)
    mask = torch.zeros_like(ids)
    for b, p in enumerate(prompts):
        ids[b, longest - p.shape[1]:], mask[b, longest - p.shape[1]:] = p[0], 1
    outputs = {}
    for schedule in schedules:
        mode, extra = schedule_mode(schedule)
        streamers = [Tokens() for _ in prompts]  # each row's own tokens, without the batch's padding
        net.generate(input_ids=ids, attention_mask=mask, assistant_mode=mode, max_new_tokens=max_new_tokens,
                     do_sample=False, pad_token_id=pad, streamer=streamers, **extra)
        outputs[schedule] = [s.tokens for s in streamers]
    return outputs


class Tokens:
    """A streamer that keeps a row's new tokens (the first put is the prompt)."""

    def __init__(self):
        self.tokens, self.prompt_seen = [], False

    def put(self, value: torch.Tensor) -> None:
        if self.prompt_seen:
            self.tokens.extend(value.reshape(-1).tolist())
        self.prompt_seen = True

    def end(self) -> None:
        pass


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    rank, world, backend, device = init_distributed(args.backend)
    try:
        net, tokenizer = load(args.model, DTYPES[args.dtype], world, device, args.adapter, args.trust_remote_code)
        texts = [tokenizer(p).input_ids for p in PROMPTS] if tokenizer is not None else FALLBACK_IDS
        prompts = [torch.tensor([list(t)], device=device) for t in texts]
        started = time.perf_counter()
        outputs, nfe = decode(net, prompts, args.schedules, args.max_new_tokens)
        decoded = {"outputs": outputs}
        if args.sample_seed is not None:
            decoded["sampled"] = sample(net, prompts, args.schedules, args.max_new_tokens, args.sample_seed)
        if args.batch:
            pad = net.generation_config.pad_token_id
            decoded["batched"] = batched(net, prompts, args.schedules, args.max_new_tokens, 0 if pad is None else pad)
        agree = [None] * world
        if world > 1:
            dist.all_gather_object(agree, decoded)
        report = {"model": args.model, "dtype": args.dtype, "world_size": world, "backend": backend,
                  "adapter": str(args.adapter) if args.adapter else None, **decoded, "nfe": nfe,
                  "ranks_agree": world == 1 or all(a == decoded for a in agree),
                  "decode_s": time.perf_counter() - started, "tp_plan": dict(getattr(net, "tp_plan", None) or {}),
                  "sharded": shard_shapes(net, world)}
        if rank == 0:
            text = json.dumps(report, indent=1)
            if args.out:
                args.out.write_text(text + "\n")
            else:
                print(text)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
