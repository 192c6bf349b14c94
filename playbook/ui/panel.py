"""The live panel as one anywidget: the HTML of its parts and its buttons, kept in traits that
every anywidget front-end syncs (JupyterLab, Notebook 7, VS Code, Colab through the ipywidgets
protocol; marimo through its own).

The view (:mod:`playbook.ui.widget`) writes the parts' HTML, already escaped; ``panel.js`` puts
each part in its place and sends ``{"press": name}`` when a button is clicked.  A press names
one of the buttons the panel shows: anything else a front end sends is ignored.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import anywidget
import traitlets

from playbook.ui.svg import svg_rules

__all__ = ["BUTTONS", "Panel"]

BUTTONS = ("stop", "retry_parked", "retry_failed")  # in the order they show; labels in panel.js
_CSS = (
    ".playbook-live{line-height:1.4;overflow-x:auto}"
    ".playbook-live table{border-collapse:collapse;margin:4px 0}"
    ".playbook-live th,.playbook-live td{padding:1px 10px 1px 0;text-align:left}"
    ".playbook-live th{border-bottom:1px solid var(--jp-border-color2,#ccc);white-space:nowrap}"
    ".playbook-live .playbook-buttons{display:flex;gap:4px;margin:2px 0 4px}"
    ".playbook-live .playbook-button{font:inherit;font-size:var(--jp-widgets-font-size,13px);"
    "padding:2px 12px;border:none;border-radius:2px;cursor:pointer;"
    "color:var(--jp-ui-font-color1,inherit);background:var(--jp-layout-color2,rgba(128,128,128,.18))}"
    ".playbook-live .playbook-button:hover:enabled{filter:brightness(.92)}"
    ".playbook-live .playbook-button:disabled{opacity:.5;cursor:default}" + svg_rules()
)


class Panel(anywidget.AnyWidget):
    """The parts (``status``, ``pictures``, ``tables``, ``summary``: HTML) and the buttons shown
    (``buttons``, of :data:`BUTTONS`; ``disabled``, those greyed out)."""

    _esm = Path(__file__).with_name("panel.js")
    _css = _CSS
    status = traitlets.Unicode("").tag(sync=True)
    pictures = traitlets.Unicode("").tag(sync=True)
    tables = traitlets.Unicode("").tag(sync=True)
    summary = traitlets.Unicode("").tag(sync=True)
    buttons = traitlets.List(traitlets.Unicode()).tag(sync=True)
    disabled = traitlets.List(traitlets.Unicode()).tag(sync=True)

    def __init__(self, **traits: Any) -> None:
        super().__init__(**traits)
        self._pressed: dict[str, Callable[[], None]] = {}
        self.on_msg(self._on_message)

    def on_press(self, name: str, action: Callable[[], None]) -> None:
        """Run ``action`` when button ``name`` is clicked (while it shows and is enabled)."""
        self._pressed[name] = action

    def press(self, name: str) -> None:
        """What a click on button ``name`` does; nothing if it is hidden or disabled."""
        action = self._pressed.get(name)
        if action is not None and name in self.buttons and name not in self.disabled:
            action()

    def _on_message(self, _: Any, content: Any, buffers: Any) -> None:
        if isinstance(content, dict) and isinstance(content.get("press"), str):
            self.press(content["press"])
