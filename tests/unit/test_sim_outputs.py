"""routerd.sim.outputs: answers are deterministic in (weights label, input)."""

from __future__ import annotations

import math
import struct
import zlib

import pytest

from routerd.sim.outputs import (
    WORDS,
    embedding_vector,
    generate_tokens,
    png_image,
    transcript,
)


def test_generated_text_has_exactly_the_requested_token_count() -> None:
    for count in (0, 1, 16, 200):
        tokens = generate_tokens("w", "hello", count)
        assert len(tokens) == count
        assert len("".join(tokens).split()) == count


def test_generated_tokens_join_into_space_separated_words_from_the_word_list() -> None:
    tokens = generate_tokens("w", "hello", 8)
    assert not tokens[0].startswith(" ")
    assert all(t.startswith(" ") for t in tokens[1:])
    assert all(word in WORDS for word in "".join(tokens).split())


def test_same_label_and_input_give_the_same_text() -> None:
    assert generate_tokens("llama-a", "why is the sky blue", 20) == generate_tokens(
        "llama-a", "why is the sky blue", 20)


def test_different_weights_or_inputs_give_visibly_different_text() -> None:
    base = "".join(generate_tokens("llama-a", "prompt", 20))
    assert "".join(generate_tokens("llama-b", "prompt", 20)) != base
    assert "".join(generate_tokens("llama-a", "prompt!", 20)) != base


def test_a_longer_answer_extends_the_shorter_one() -> None:
    assert generate_tokens("w", "p", 30)[:10] == generate_tokens("w", "p", 10)


def test_embedding_is_a_deterministic_unit_vector_of_the_requested_size() -> None:
    vector = embedding_vector("emb", "some text", 8)
    assert len(vector) == 8
    assert math.sqrt(sum(v * v for v in vector)) == pytest.approx(1.0)
    assert vector == embedding_vector("emb", "some text", 8)
    assert vector != embedding_vector("emb2", "some text", 8)
    assert vector != embedding_vector("emb", "other text", 8)
    assert len(embedding_vector("emb", "x", 384)) == 384


def _png_pixels(data: bytes) -> tuple[int, int, bytes]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    offset, idat, size = 8, b"", (0, 0)
    while offset < len(data):
        (length,) = struct.unpack_from(">I", data, offset)
        kind = data[offset + 4: offset + 8]
        body = data[offset + 8: offset + 8 + length]
        (crc,) = struct.unpack_from(">I", data, offset + 8 + length)
        assert crc == zlib.crc32(kind + body) & 0xFFFFFFFF
        if kind == b"IHDR":
            size = struct.unpack_from(">II", body)
            assert body[8:10] == b"\x08\x02"  # 8-bit RGB
        elif kind == b"IDAT":
            idat += body
        offset += 12 + length
    return size[0], size[1], zlib.decompress(idat)


def test_png_is_a_valid_solid_image_whose_colour_comes_from_the_hash() -> None:
    width, height, raw = _png_pixels(png_image("sd-a", "a cat"))
    assert (width, height) == (8, 8)
    rows = [raw[i * (1 + 3 * width): (i + 1) * (1 + 3 * width)] for i in range(height)]
    assert all(row[0] == 0 for row in rows)
    colour = rows[0][1:4]
    assert all(row[1:] == colour * width for row in rows)
    assert png_image("sd-a", "a cat") == png_image("sd-a", "a cat")
    other_colours = {_png_pixels(png_image(label, "a cat", i))[2][1:4]
                     for label in ("sd-a", "sd-b") for i in range(3)}
    assert len(other_colours) == 6


def test_transcript_depends_on_weights_audio_and_duration() -> None:
    audio = b"RIFF...."
    text = transcript("whisper-a", audio, 4.0)
    assert text == transcript("whisper-a", audio, 4.0)
    assert text.endswith(".") and text[0].isupper()
    assert len(text.split()) == 10  # 2.5 words a second
    assert transcript("whisper-b", audio, 4.0) != text
    assert transcript("whisper-a", b"other", 4.0) != text
