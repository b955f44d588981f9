"""The simulated llama-server's tokenizer: ``/tokenize``, ``/detokenize`` and ``/apply-template``.

A token is a word with the whitespace before it (so a text has as many tokens as the timing model counts,
:func:`routerd.sim.timing.count_tokens`); ids are given in the order pieces are first seen, after the three
special tokens, so ``/detokenize`` turns ids from ``/tokenize`` back into the text.
"""

from __future__ import annotations

import re

import attrs

from routerd.sim.web import BadRequest

__all__ = ["SPECIAL", "Vocabulary", "apply_template_body", "chatml"]

SPECIAL = ("<unk>", "<s>", "</s>")
_PIECE = re.compile(r"\s*\S+")


@attrs.define
class Vocabulary:
    pieces: list[str] = attrs.field(factory=lambda: list(SPECIAL))
    ids: dict[str, int] = attrs.field(factory=lambda: {piece: i for i, piece in enumerate(SPECIAL)})

    def id_of(self, piece: str) -> int:
        found = self.ids.get(piece)
        if found is None:
            found = self.ids[piece] = len(self.pieces)
            self.pieces.append(piece)
        return found

    def tokenize(self, text: str) -> list[tuple[int, str]]:
        """(id, piece) of each token of ``text``."""
        return [(self.id_of(piece), piece) for piece in _PIECE.findall(text)]

    def detokenize(self, ids: list[int]) -> str:
        return "".join(self.pieces[i] if 0 <= i < len(self.pieces) and i >= len(SPECIAL) else "" for i in ids)

    def tokenize_body(self, body: dict[str, object]) -> dict[str, object]:
        """The answer to ``/tokenize``: ids, or ``{"id", "piece"}`` objects with ``with_pieces``."""
        content = body.get("content", "")
        if not isinstance(content, str):
            raise BadRequest("'content' must be a string")
        tokens = self.tokenize(content)
        if body.get("with_pieces") is True:
            return {"tokens": [{"id": token, "piece": piece} for token, piece in tokens]}
        return {"tokens": [token for token, _piece in tokens]}

    def detokenize_body(self, body: dict[str, object]) -> dict[str, object]:
        ids = body.get("tokens", [])
        if not isinstance(ids, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
            raise BadRequest("'tokens' must be an array of token ids")
        return {"content": self.detokenize(ids)}


def chatml(messages: list[tuple[str, str]]) -> str:
    """The prompt a ChatML template (the tiny test model's) makes of (role, text) messages."""
    turns = "".join(f"<|im_start|>{role}\n{text}<|im_end|>\n" for role, text in messages)
    return turns + "<|im_start|>assistant\n"


def apply_template_body(body: dict[str, object]) -> dict[str, object]:
    """The answer to ``/apply-template``: the prompt the chat ``messages`` make."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest("'messages' is required")
    turns: list[tuple[str, str]] = []
    for message in messages:
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise BadRequest("each message needs a 'role'")
        content = message.get("content")
        if isinstance(content, list):
            content = "".join(part.get("text", "") for part in content
                              if isinstance(part, dict) and isinstance(part.get("text"), str))
        turns.append((str(message["role"]), content if isinstance(content, str) else ""))
    return {"prompt": chatml(turns)}
