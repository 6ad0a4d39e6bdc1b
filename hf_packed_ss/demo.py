"""Old import path of the demo, now split: the decoding side is `hf_packed_ss.tools.race` (re-exported here), the
Gradio UI is ``demo/app.py`` of the source checkout. The UI's names (`build_app`, `launch`, `lane_html`, ...) are
loaded from the app when first asked for, so importing this module never imports gradio.
"""

from .tools.race import (
    DECODE_LOCK,
    DEFAULT_MAX_NEW_TOKENS,
    DEFAULT_MODELS,
    DEFAULT_REPEATS,
    DEFAULT_SCHEDULES,
    EXACT,
    EXAMPLES,
    LABELS,
    MAX_REPEATS,
    ORDER,
    Stopped,
    Trace,
    available_schedules,
    decode_one,
    default_model,
    fastest,
    measure,
    sampling_kwargs,
    summary,
    token_pieces,
    verdict,
    warm_up,
)

APP_NAMES = ("CSS", "KINDS", "build_app", "chart", "free_port", "launch", "lane_html", "legend_html", "main", "table")


def __getattr__(name: str):
    """The UI's names, from ``demo/app.py`` (see `hf_packed_ss.tools.demo.load_app`)."""
    if name in APP_NAMES:
        from .tools.demo import load_app

        return getattr(load_app(), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "DECODE_LOCK",
    "DEFAULT_MAX_NEW_TOKENS",
    "DEFAULT_MODELS",
    "DEFAULT_REPEATS",
    "DEFAULT_SCHEDULES",
    "EXACT",
    "EXAMPLES",
    "LABELS",
    "MAX_REPEATS",
    "ORDER",
    "Stopped",
    "Trace",
    "available_schedules",
    "decode_one",
    "default_model",
    "fastest",
    "measure",
    "sampling_kwargs",
    "summary",
    "token_pieces",
    "verdict",
    "warm_up",
]
