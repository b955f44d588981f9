"""A whisper.cpp model (legacy ggml file) that transcribes any audio of a second or more to a known sentence.

The file, as whisper.cpp's loader reads it (all little-endian):

1. the magic ``0x67676d6c`` ("ggml") as uint32;
2. eleven int32 hyperparameters: n_vocab, n_audio_ctx, n_audio_state, n_audio_head, n_audio_layer,
   n_text_ctx, n_text_state, n_text_head, n_text_layer, n_mels, ftype (1: 2-D weights in F16);
3. the mel filter bank: int32 n_mel, int32 n_fft, then n_mel × n_fft float32;
4. the vocabulary: int32 count, then per word a uint32 byte length and the word's raw bytes.  The
   loader names the ids it was not given itself (``[_EOT_]``, ``[_SOT_]``, ``[_TT_n]`` timestamps …), so
   the file lists only the words the model needs; the special ids follow from n_vocab alone (51864:
   the English-only layout, end of text 50256, start of transcript 50257, no-timestamps 50362, first
   timestamp 50363);
5. the tensors, in any order, each as int32 n_dims, int32 name length, int32 type (0 F32, 1 F16),
   n_dims int32 sizes (fastest-varying first), the name, the raw data.  F32 are the 1-D tensors, the
   positional embeddings and the conv biases; every other weight is F16.

The model: width 64, one encoder and one decoder layer, one attention head each, mel filters and the
whole encoder zero (its output is the same for every audio), attention and cross-attention zero.  What
remains is the decoder's token embedding (also its output head) and its MLP.  The prompt tokens
whisper.cpp ends its prompt with (start of transcript, no-timestamps, the previous-text marker and
every timestamp) share one "start" embedding; each of the sentence's tokens and the end of text has
its own orthogonal ±1 embedding.  The MLP adds ``next - current`` to each of those (a linear map,
built from GELU as ``gelu(z) - gelu(-z) = z``), so the token after the sentence's k-th is the k+1-th
with a logit of 64 against 0 for every other token, and the end of text closes it.  Whisper's rules
(blank suppression, timestamp pairing, the timestamp-probability rule, the fallback thresholds) all let
that choice through, with or without timestamps.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import numpy.typing as npt

from .weights import chain_rows

ANSWER = " Hello world from a tiny whisper."
"""What the model transcribes any audio of one second or more to."""

ANSWER_WORDS: tuple[bytes, ...] = (b" Hello", b" world", b" from", b" a", b" tiny", b" whisper", b".")

MAGIC = 0x67676D6C
N_VOCAB = 51864
N_AUDIO_CTX = 1500
N_TEXT_CTX = 448
N_MELS = 80
N_FFT_BINS = 201
WIDTH = 64
HEADS = 1
LAYERS = 1
FTYPE_F16 = 1
HPARAMS: tuple[int, ...] = (
    N_VOCAB,
    N_AUDIO_CTX,
    WIDTH,
    HEADS,
    LAYERS,
    N_TEXT_CTX,
    WIDTH,
    HEADS,
    LAYERS,
    N_MELS,
    FTYPE_F16,
)
"""The header's eleven int32 values, in file order."""

TOKEN_EOT, TOKEN_SOT, TOKEN_PREV, TOKEN_NOT, TOKEN_BEG = 50256, 50257, 50360, 50362, 50363
"""Special ids of the English-only layout (n_vocab 51864), as whisper.cpp derives them."""

TYPE_F32, TYPE_F16 = 0, 1


def vocabulary() -> list[bytes]:
    """The words the file lists: the 256 single bytes (id = the byte), then the sentence's longer words."""
    words = [bytes([byte]) for byte in range(256)]
    words += [word for word in ANSWER_WORDS if len(word) > 1]
    return words


def answer_ids(answer: str = ANSWER) -> list[int]:
    """``answer`` as token ids of :func:`vocabulary`: :data:`ANSWER` or another sentence of its words
    (longest first), each at most once, since the next token follows from the current one alone."""
    words = vocabulary()
    by_length = sorted(ANSWER_WORDS, key=len, reverse=True)
    text = answer.encode()
    ids: list[int] = []
    while text:
        word = next((w for w in by_length if text.startswith(w)), None)
        if word is None or words.index(word) in ids:
            raise ValueError(f"the answer {answer!r} is not made of distinct words of {ANSWER!r}")
        ids.append(words.index(word))
        text = text[len(word):]
    return ids


def _token_embedding(answer: str = ANSWER) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.float32]]:
    """The token embedding (n_vocab × width) and the MLP's linear map (width × width)."""
    ids = answer_ids(answer)
    rows = chain_rows(WIDTH, len(ids) + 2)
    start, sentence, end = rows[0], rows[1:-1], rows[-1]
    embedding = np.zeros((N_VOCAB, WIDTH), dtype=np.float32)
    for token in (TOKEN_SOT, TOKEN_PREV, TOKEN_NOT):
        embedding[token] = start
    embedding[TOKEN_BEG:] = start
    for token, row in zip(ids, sentence, strict=True):
        embedding[token] = row
    embedding[TOKEN_EOT] = end
    # next - current for each link of the chain; the rows are orthogonal with |row|² = WIDTH.
    inputs = [start, *sentence]
    outputs = [*sentence, end]
    step = (
        sum(np.outer(after - before, before) for before, after in zip(inputs, outputs, strict=True)) / WIDTH
    )
    return embedding, np.asarray(step, dtype=np.float32)


def _linear_mlp(step: npt.NDArray[np.float32]) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.float32]]:
    """mlp.0 and mlp.2 weights whose GELU network computes exactly ``step @ x``: gelu(z) - gelu(-z) = z."""
    hidden = 4 * WIDTH
    first = np.zeros((hidden, WIDTH), dtype=np.float32)
    first[:WIDTH] = step
    first[WIDTH : 2 * WIDTH] = -step
    second = np.zeros((WIDTH, hidden), dtype=np.float32)
    second[:, :WIDTH] = np.eye(WIDTH, dtype=np.float32)
    second[:, WIDTH : 2 * WIDTH] = -np.eye(WIDTH, dtype=np.float32)
    return first, second


def _block(
    prefix: str, *, cross: bool, mlp: tuple[npt.NDArray[np.float32], npt.NDArray[np.float32]] | None
) -> Iterator[tuple[str, npt.NDArray[np.float32]]]:
    ones = np.ones(WIDTH, dtype=np.float32)
    zeros = np.zeros(WIDTH, dtype=np.float32)
    square = np.zeros((WIDTH, WIDTH), dtype=np.float32)
    first, second = (
        mlp
        if mlp is not None
        else (
            np.zeros((4 * WIDTH, WIDTH), dtype=np.float32),
            np.zeros((WIDTH, 4 * WIDTH), dtype=np.float32),
        )
    )
    yield prefix + "mlp_ln.weight", ones
    yield prefix + "mlp_ln.bias", zeros
    yield prefix + "mlp.0.weight", first
    yield prefix + "mlp.0.bias", np.zeros(4 * WIDTH, dtype=np.float32)
    yield prefix + "mlp.2.weight", second
    yield prefix + "mlp.2.bias", zeros
    for attention in ("attn", "cross_attn") if cross else ("attn",):
        yield prefix + attention + "_ln.weight", ones
        yield prefix + attention + "_ln.bias", zeros
        yield prefix + attention + ".query.weight", square
        yield prefix + attention + ".query.bias", zeros
        yield prefix + attention + ".key.weight", square
        yield prefix + attention + ".value.weight", square
        yield prefix + attention + ".value.bias", zeros
        yield prefix + attention + ".out.weight", square
        yield prefix + attention + ".out.bias", zeros


def tensors(answer: str = ANSWER) -> Iterator[tuple[str, npt.NDArray[np.float32]]]:
    """Every tensor whisper.cpp expects, by name, in numpy's (slowest-first) shape."""
    ones = np.ones(WIDTH, dtype=np.float32)
    zeros = np.zeros(WIDTH, dtype=np.float32)
    yield "encoder.positional_embedding", np.zeros((N_AUDIO_CTX, WIDTH), dtype=np.float32)
    yield "encoder.conv1.weight", np.zeros((WIDTH, N_MELS, 3), dtype=np.float32)
    yield "encoder.conv1.bias", np.zeros((WIDTH, 1), dtype=np.float32)
    yield "encoder.conv2.weight", np.zeros((WIDTH, WIDTH, 3), dtype=np.float32)
    yield "encoder.conv2.bias", np.zeros((WIDTH, 1), dtype=np.float32)
    for layer in range(LAYERS):
        yield from _block(f"encoder.blocks.{layer}.", cross=False, mlp=None)
    yield "encoder.ln_post.weight", ones
    yield "encoder.ln_post.bias", zeros
    embedding, step = _token_embedding(answer)
    yield "decoder.positional_embedding", np.zeros((N_TEXT_CTX, WIDTH), dtype=np.float32)
    yield "decoder.token_embedding.weight", embedding
    for layer in range(LAYERS):
        yield from _block(f"decoder.blocks.{layer}.", cross=True, mlp=_linear_mlp(step))
    yield "decoder.ln.weight", ones
    yield "decoder.ln.bias", zeros


def stored_as_f32(name: str, array: npt.NDArray[np.float32]) -> bool:
    """Whether whisper.cpp expects this tensor in F32 (the rest of an F16 model is F16)."""
    return array.ndim < 2 or name.endswith(("positional_embedding", "conv1.bias", "conv2.bias"))


def write_tiny_whisper(path: str | Path, *, answer: str = ANSWER) -> Path:
    """Write the known-answer whisper model (≈ 7.5 MB, F16) to ``path`` and return it; same bytes each run.
    ``answer``: another sentence of :data:`ANSWER`'s words (:func:`answer_ids`) to transcribe to."""
    path = Path(path)
    with path.open("wb") as out:
        out.write(struct.pack("<I", MAGIC))
        out.write(struct.pack(f"<{len(HPARAMS)}i", *HPARAMS))
        out.write(struct.pack("<ii", N_MELS, N_FFT_BINS))
        out.write(np.zeros((N_MELS, N_FFT_BINS), dtype="<f4").tobytes())
        words = vocabulary()
        out.write(struct.pack("<i", len(words)))
        for word in words:
            out.write(struct.pack("<I", len(word)))
            out.write(word)
        for name, array in tensors(answer):
            f32 = stored_as_f32(name, array)
            data = array.astype("<f4" if f32 else "<f2")
            encoded = name.encode()
            out.write(struct.pack("<iii", array.ndim, len(encoded), TYPE_F32 if f32 else TYPE_F16))
            out.write(struct.pack(f"<{array.ndim}i", *reversed(array.shape)))
            out.write(encoded)
            out.write(data.tobytes())
    return path
