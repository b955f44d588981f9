"""routing.images.has_image: image content found by the body's structure, never its text."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

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


# -- property tests: random JSON never crashes the detector; words never trigger it ---------------------

_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=10), children,
                                                                      max_size=5),
    max_leaves=40)
_mentions = st.sampled_from(["image_url", "input_image", "image", "images", "an image_url here"])


@settings(max_examples=300, deadline=None)
@given(_json)
def test_any_json_value_gives_an_answer_and_never_raises(value: Any) -> None:
    assert has_image(value) in (True, False)


@settings(max_examples=200, deadline=None)
@given(st.lists(_mentions | st.text(max_size=30), min_size=1, max_size=4),
       st.sampled_from(["text", "input_text"]))
def test_text_that_mentions_image_keys_never_triggers_it(words: list[str], part_type: str) -> None:
    """Every string of the body (text content, text parts, a prompt) names the image keys; no part
    or list is an image by its structure, so the answer is no."""
    text = " ".join(words)
    bodies = [
        {"messages": [{"role": "user", "content": text}], "prompt": text},
        {"messages": [{"role": "user", "content": [{"type": part_type, "text": w} for w in words]}]},
        {"input": text, "instructions": text},
        {"input": [{"role": "user", "content": [{"type": "input_text", "text": w} for w in words]}]},
        {"prompt": text, "system": text, "model": text},
    ]
    for body in bodies:
        assert has_image(body) is False
