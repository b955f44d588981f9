"""Whether a parsed request body carries an image, read from its structure only (spec "Guardian
models": an ``image_url``, ``input_image`` or ``image`` content part, or an Ollama ``images`` list).

:func:`has_image` never reads text and never decodes the image: it looks at the shapes OpenAI chat
(``messages[].content[]`` parts), OpenAI Responses (``input`` as parts or as messages with parts),
Ollama chat (``messages[].images``) and Ollama/Kobold generate (top-level ``images``) use.
"""

from __future__ import annotations

from typing import Any

#: Content-part ``type`` values that carry an image.
IMAGE_PART_TYPES = frozenset({"image_url", "input_image", "image"})


def _is_image_part(part: Any) -> bool:
    return isinstance(part, dict) and part.get("type") in IMAGE_PART_TYPES


def _has_images_list(obj: dict[str, Any]) -> bool:
    images = obj.get("images")
    return isinstance(images, list) and len(images) > 0


def _message_has_image(message: Any) -> bool:
    if not isinstance(message, dict):
        return False
    if _is_image_part(message) or _has_images_list(message):
        return True
    content = message.get("content")
    return isinstance(content, list) and any(_is_image_part(part) for part in content)


def has_image(parsed: Any) -> bool:
    """True when the JSON request body ``parsed`` carries at least one image."""
    if not isinstance(parsed, dict):
        return False
    if _has_images_list(parsed):
        return True
    for key in ("messages", "input"):
        items = parsed.get(key)
        if isinstance(items, list) and any(_message_has_image(item) for item in items):
            return True
    return False


__all__ = ["IMAGE_PART_TYPES", "has_image"]
