"""The two lending lanes (spec "Backlog lending"): one vocabulary for routing, the store and lending."""

from __future__ import annotations

from typing import Literal

Lane = Literal["image", "text"]
LANES: tuple[Lane, ...] = ("image", "text")
