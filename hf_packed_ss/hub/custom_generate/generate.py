"""Packed-SS (and Linear-SS, Quadratic-SS, AR) as a transformers `custom_generate` function.

    model.generate(input_ids, custom_generate="<this repo or folder>", trust_remote_code=True,
                   assistant_mode="packed_ss", speculative_width=15, max_new_tokens=256)

works on any model with an AR mode and a masked-diffusion mode in the Nemotron-Labs-Diffusion
structure (`encoder` + `diffusion_head`, config with `mask_token_id` and `block_size`), including one
loaded with remote code by a process that never imported `hf_packed_ss`, and on the formats of
`hf_packed_ss` itself (SetDLM, a causal LM with a proposal-only drafter). Requires the
`hf-packed-ss` package (requirements.txt).
"""

import transformers

from hf_packed_ss.front.generate import speculative_generate
from hf_packed_ss.models.release import attach_twin


def generate(model, input_ids=None, generation_config=None, **kwargs):
    """Same arguments as `model.generate`; `assistant_mode` / `speculative_width` pick the schedule."""
    input_ids = input_ids if input_ids is not None else kwargs.pop("inputs", None)
    kwargs = {k: v for k, v in kwargs.items() if v is not None or k == "assistant_mode"}
    kwargs.setdefault("assistant_mode", "packed_ss")
    if hasattr(model, "encoder") and hasattr(model, "diffusion_head"):  # the released structure
        attach_twin(model)

    def stock(*args, **stock_kwargs):
        return transformers.GenerationMixin.generate(model, *args, **stock_kwargs)

    return speculative_generate(model, stock, input_ids, generation_config, **kwargs)
