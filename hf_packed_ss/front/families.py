"""The engine registry: which layout and schedules decode each model family, and the widths they allow.

Kept apart from the rest of the front so that tools (cli, bench, demo) can list modes and families without
pulling in `generate`."""

from __future__ import annotations

from dataclasses import dataclass

from ..engine import SCHEDULES, WINDOW_SCHEDULES, SamePositionLayout, ShiftedBlockLayout


@dataclass(frozen=True)
class Family:
    """How one model family decodes: its layout, schedules and the widths it allows."""

    layout: type
    schedules: dict
    any_order: bool

    def widths(self, config) -> tuple[int, int]:
        """(largest width, default width for a mode) from the config."""
        if self.any_order:  # W <= S_max; the release pairs smax 2W with window W (appendix E.1)
            return config.max_block_size, max(1, config.max_block_size // 2)
        return config.block_size - 1, config.block_size - 1


# Decoding engine per model family (config.model_type). Any other causal LM whose config carries
# `mask_token_id` and `block_size` (a base model with a proposal-only drafter) uses the prefix family.
PREFIX = Family(ShiftedBlockLayout, SCHEDULES, any_order=False)
FAMILIES = {
    "nemotron_labs_diffusion": PREFIX,
    "setdlm": Family(SamePositionLayout, WINDOW_SCHEDULES, any_order=True),
}


def family(config) -> Family | None:
    """A registered format's family, or the prefix family for any causal LM given a MASK id and block size."""
    if config.model_type in FAMILIES:
        return FAMILIES[config.model_type]
    return PREFIX if getattr(config, "block_size", None) and getattr(config, "mask_token_id", None) else None


MODES = sorted(set(SCHEDULES) | set(WINDOW_SCHEDULES))


def default_width(config, mode: str) -> int:
    """Nemotron: the largest width the block size allows (W = B - 1). SetDLM: half the training horizon
    (smax16 -> W = 8). A schedule may cap it (`default_width_cap`: Quadratic-SS keeps the paper's B = 8)."""
    fam = family(config)
    _, default = fam.widths(config)
    cap = fam.schedules[mode].default_width_cap
    return default if cap is None else min(default, cap)


def takers(option: str) -> list[str]:
    """The modes whose schedule takes `option` (in any family)."""
    return sorted({m for fam in FAMILIES.values() for m, s in fam.schedules.items() if option in s.options})


# Options some schedule takes (`Schedule.options`); each is refused for the schedules that do not.
SCHEDULE_OPTIONS = sorted({o for fam in FAMILIES.values() for s in fam.schedules.values() for o in s.options})
