"""``hf-packed-ss demo``: start the Gradio app, ``demo/app.py`` of the source checkout.

The app is the repository's UI, not part of the package; what it decodes, times and reports is `race`.
"""

from __future__ import annotations

import importlib.util
import sys
from types import ModuleType

from .paths import demo_app

MODULE = "hf_packed_ss_demo_app"  # the app's name in sys.modules once loaded (it is no package module)


def load_app() -> ModuleType:
    """`demo/app.py` as a module, loaded once: the checkout's app (`build_app`, `launch`, `main`, ...)."""
    if MODULE in sys.modules:
        return sys.modules[MODULE]
    path = demo_app()
    if path is None or not path.is_file():
        raise ModuleNotFoundError("The Gradio demo is demo/app.py of the source checkout: clone the repository and "
                                  'run `pip install -e ".[demo]"` there.', name=MODULE)
    spec = importlib.util.spec_from_file_location(MODULE, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[MODULE] = module  # before running it, as an import does (dataclasses, pickling look it up)
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[MODULE]
        raise
    return module


def main(argv: list[str] | None = None) -> int:
    try:
        app = load_app()
    except ModuleNotFoundError as err:  # an installed package without the checkout: say so, not a traceback
        if err.name != MODULE:
            raise
        raise SystemExit(str(err)) from None
    return app.main(argv)
