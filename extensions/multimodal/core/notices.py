"""What the user is told about a turn: one message, logged and added to `state['notices']`.

Hosts show `state['notices']` under the reply (this repository's UI) or in the API response's
`warnings`; a host that ignores the key still logs the message.
"""
from __future__ import annotations

from typing import Optional

from modules.logging_colors import logger


def tell(state: Optional[dict], message: str, level: str = "warning") -> None:
    getattr(logger, level)(f"Multimodal: {message}")
    if state is not None:
        state.setdefault("notices", []).append(message)
