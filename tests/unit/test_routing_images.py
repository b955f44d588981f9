"""routing.images.has_image: image content found by the body's structure, never its text."""

from __future__ import annotations

from typing import Any

import pytest

from routerd.routing.images import has_image

PNG = "data:image/png;base64,iVBORw0KGgo="


@pytest.mark.parametrize("body", [
    {"messages": [{"role": "user", "content": [{"type": "text", "text": "what is this"},
                                               {"type": "image_url", "image_url": {"url": PNG}}]}]},
    {"input": [{"role": "user", "content": [{"type": "input_text", "text": "hi"},
                                            {"type": "input_image", "image_url": PNG}]}]},
    {"input": [{"type": "input_image", "image_url": PNG}]},
    {"messages": [{"role": "user", "content": [{"type": "image", "source": {"data": "..."}}]}]},
    {"messages": [{"role": "user", "content": "what is this", "images": ["iVBORw0KGgo="]}]},
    {"prompt": "describe", "images": ["iVBORw0KGgo="]},
], ids=["openai-chat", "responses-message", "responses-part", "image-part", "ollama-chat", "ollama-generate"])
def test_every_image_shape_the_spec_names_is_detected(body: dict[str, Any]) -> None:
    assert has_image(body) is True


@pytest.mark.parametrize("body", [
    {"messages": [{"role": "user", "content": "an image_url of a cat, input_image and images"}]},
    {"messages": [{"role": "user", "content": [{"type": "text", "text": "image_url"}]}]},
    {"messages": [{"role": "user", "content": "hi", "images": []}]},
    {"prompt": "hi", "images": []},
    {"input": "describe an image_url"},
    {"messages": "not a list"},
    None,
    [],
], ids=["words-only", "text-part", "empty-images", "empty-top-images", "input-string", "bad-messages",
        "none", "list"])
def test_text_that_only_talks_about_images_is_not_an_image(body: Any) -> None:
    assert has_image(body) is False
