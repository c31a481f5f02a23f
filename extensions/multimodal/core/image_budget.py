"""What a picture may cost: the budget each picture is read at, from a setting, a request or a message.

A budget is one of:
- "default": the checkpoint's own processor settings;
- "low": at most 512x512 pixels per picture, and never more than the default (a quick look: fewer
  tokens, a faster, smaller prompt);
- "high": at most 2048x2048 pixels per picture, and never less than the default (small text);
- a whole number of pixels: at most that many per picture.
It comes from the message or request (`state[IMAGE_BUDGET]`: the UI's choice, the API's
`image_budget` field), else from the `image_budget` setting (`multimodal-image_budget`). The pipeline
turns it into its processor's own keyword arguments (`hf_auto/budget_kwargs.py`); families whose
processor has no per-call size knob read every picture the same way.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from extensions.multimodal.core.defaults import IMAGE_BUDGET

LEVEL_PIXELS = {"low": 512 * 512, "high": 2048 * 2048}
MIN_PIXELS = 28 * 28  # below one patch a budget means nothing


@dataclass(frozen=True)
class Budget:
    name: str  # "default", "low", "high", or the pixel count as text
    pixels: Optional[int] = None  # the cap; None: the checkpoint's own settings
    at_least_default: bool = False  # "high": a family whose default reads more keeps its default
    at_most_default: bool = False  # "low": a family whose default reads less keeps its default


DEFAULT = Budget("default")


class BudgetError(ValueError):
    """A budget none of those accepted (a request's: the API's 400, naming the parameter)."""
    code, param = "invalid_parameter", "image_budget"


def parse(value: Any) -> Budget:
    """A budget from a setting or a request; a ValueError names what is accepted."""
    if value is None or value == "" or value == "default":
        return DEFAULT
    if isinstance(value, str) and value in LEVEL_PIXELS:
        return Budget(value, LEVEL_PIXELS[value], at_least_default=value == "high", at_most_default=value == "low")
    pixels = int(value) if isinstance(value, int) or (isinstance(value, str) and value.isdigit()) else None
    if isinstance(value, bool) or pixels is None or pixels < MIN_PIXELS:
        raise BudgetError(f"image_budget must be 'default', 'low', 'high' or a number of pixels of at least "
                         f"{MIN_PIXELS}, got {value!r}")
    return Budget(str(pixels), pixels)


def check_request(state: dict) -> None:
    """A message's or request's budget refused at the start of the turn, with or without a picture."""
    if state.get(IMAGE_BUDGET) not in (None, ""):
        parse(state[IMAGE_BUDGET])


def resolve(state: dict, params: dict) -> Budget:
    """The message's or request's budget, else the setting's."""
    chosen = state.get(IMAGE_BUDGET)
    return parse(chosen if chosen not in (None, "") else params.get("image_budget"))
