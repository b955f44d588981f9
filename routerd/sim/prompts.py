"""What the simulated llama-server reads of a request: a chat's prompt text and images, a completion's prompt,
embedding inputs (each with its token count, :func:`routerd.sim.timing.count_tokens`)."""

from __future__ import annotations

from routerd.sim.timing import count_tokens
from routerd.sim.web import BadRequest, openai_bad_request

__all__ = ["chat_prompt", "embedding_inputs", "prompt_text"]


def chat_prompt(messages: object) -> tuple[str, list[str]]:
    """The prompt text of a chat (message contents joined by newlines) and its image URLs."""
    if not isinstance(messages, list) or not messages:
        raise BadRequest("'messages' must be a non-empty array")
    texts: list[str] = []
    images: list[str] = []
    for message in messages:
        if not isinstance(message, dict):
            raise BadRequest("each message must be an object")
        content = message.get("content")
        if content is None:
            continue
        if isinstance(content, str):
            texts.append(content)
            continue
        if not isinstance(content, list):
            raise BadRequest("message 'content' must be a string or an array of parts")
        for part in content:
            if not isinstance(part, dict):
                raise BadRequest("content parts must be objects")
            kind = part.get("type")
            if kind == "text":
                text = part.get("text")
                if not isinstance(text, str):
                    raise BadRequest("a text part needs a string 'text'")
                texts.append(text)
            elif kind == "image_url":
                image = part.get("image_url")
                url = image.get("url") if isinstance(image, dict) else image
                if not isinstance(url, str):
                    raise BadRequest("an image_url part needs a 'url'")
                images.append(url)
    return "\n".join(texts), images


def prompt_text(prompt: object) -> tuple[str, int]:
    """(text, token count) of a completion prompt: a string, strings, or token ids."""
    if isinstance(prompt, str):
        return prompt, count_tokens(prompt)
    if isinstance(prompt, list) and prompt:
        if all(isinstance(p, str) for p in prompt):
            text = "\n".join(prompt)
            return text, count_tokens(text)
        if all(isinstance(p, int) and not isinstance(p, bool) for p in prompt):
            return " ".join(map(str, prompt)), len(prompt)
    raise BadRequest("'prompt' must be a string, an array of strings or an array of token ids")


def embedding_inputs(raw: object) -> list[tuple[str, int]]:
    """(text, tokens) per input: a string, a token-id array, or an array of either."""
    if isinstance(raw, list) and raw and all(isinstance(item, str | list) for item in raw):
        items: list[object] = list(raw)
    else:
        items = [raw]
    try:
        return [prompt_text(item) if not isinstance(item, str) else (item, count_tokens(item))
                for item in items]
    except BadRequest:
        raise openai_bad_request(
            "'input' must be a string, an array of strings or an array of token arrays") from None
