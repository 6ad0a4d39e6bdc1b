"""The tools around the decoder, kept out of the engine (`engine/`) and the Hugging Face front (`front/`).

`cli` (the `hf-packed-ss` command), `bench` (the benchmark and the call-cost probe), `train` and `base_answers`
(training), `quality` (a checkpoint's drafting bar), `publish` (Hub folders), `loading` (models, devices and
prompts for the commands), `paths` (files outside the package), `race` (the decoding side of the demo), `demo`
(`hf-packed-ss demo`, which starts the Gradio app `demo/app.py` of the source checkout), `serve` (`hf-packed-ss
serve`, the OpenAI-compatible server) and `shard` (decoding tensor-parallel under `torchrun`). Decoding never
imports them.
"""
