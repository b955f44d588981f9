"""The tiny-model generators: same bytes each run, the layout the real backends read, the known answers.

The answers themselves are proven against the real servers in the real-backend tier; here they are
checked the cheap way: the weights are read back from the files and the one path through the network
that is not zero is computed with numpy.
"""

from __future__ import annotations

import hashlib
import math
import struct
import wave
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import numpy.typing as npt
import pytest

from tests.support_models import (
    LLAMA_ANSWER,
    UNLOADABLE,
    WHISPER_ANSWER,
    llama_gguf,
    whisper_ggml,
    write_tiny_llama,
    write_tiny_whisper,
    write_tone_wav,
    write_unloadable_gguf,
)

Floats = npt.NDArray[np.float32]


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def field(reader: gguf.GGUFReader, key: str) -> Any:
    """A metadata value as Python: str, int, float, bool or a list of them."""
    return reader.fields[key].contents()


def tensor_map(reader: gguf.GGUFReader) -> dict[str, gguf.ReaderTensor]:
    return {tensor.name: tensor for tensor in reader.tensors}


def llama_tensor_names(n_layer: int) -> set[str]:
    names = {"token_embd.weight", "output_norm.weight", "output.weight"}
    per_layer = (
        "attn_norm",
        "attn_q",
        "attn_k",
        "attn_v",
        "attn_output",
        "ffn_norm",
        "ffn_gate",
        "ffn_up",
        "ffn_down",
    )
    return names | {f"blk.{layer}.{name}.weight" for layer in range(n_layer) for name in per_layer}


# --- the llama GGUF ---


@pytest.mark.parametrize("f16", [False, True])
def test_tiny_llama_same_bytes_each_run(tmp_path: Path, f16: bool) -> None:
    first = write_tiny_llama(tmp_path / "a.gguf", f16=f16)
    second = write_tiny_llama(tmp_path / "b.gguf", f16=f16)
    assert first == tmp_path / "a.gguf"
    assert first.read_bytes() == second.read_bytes()
    assert 100_000 < first.stat().st_size < 1_000_000


def test_tiny_llama_metadata_is_what_llama_cpp_reads(tmp_path: Path) -> None:
    reader = gguf.GGUFReader(write_tiny_llama(tmp_path / "tiny.gguf"))
    assert field(reader, "general.architecture") == "llama"
    assert field(reader, "general.file_type") == gguf.LlamaFileType.ALL_F32
    expected = {
        "llama.context_length": 2048,
        "llama.embedding_length": 64,
        "llama.block_count": 2,
        "llama.feed_forward_length": 128,
        "llama.attention.head_count": 4,
        "llama.attention.head_count_kv": 4,
        "llama.rope.dimension_count": 16,
    }
    assert {key: field(reader, key) for key in expected} == expected
    assert field(reader, "llama.attention.layer_norm_rms_epsilon") == pytest.approx(1e-5)
    assert field(reader, "llama.rope.freq_base") == pytest.approx(10000.0)
    assert field(reader, "tokenizer.ggml.model") == "llama"
    tokens = field(reader, "tokenizer.ggml.tokens")
    assert isinstance(tokens, list)
    assert len(tokens) == field(reader, "llama.vocab_size")
    assert len(field(reader, "tokenizer.ggml.scores")) == len(tokens)
    assert len(field(reader, "tokenizer.ggml.token_type")) == len(tokens)
    special = [tokens[field(reader, f"tokenizer.ggml.{kind}_token_id")] for kind in ("unknown", "bos", "eos")]
    assert special == ["<unk>", "<s>", "</s>"]
    assert field(reader, "tokenizer.ggml.add_bos_token") is True
    assert field(reader, "tokenizer.ggml.add_eos_token") is False
    template = field(reader, "tokenizer.chat_template")
    assert isinstance(template, str)
    assert "<|im_start|>" in template and "add_generation_prompt" in template


def test_tiny_llama_tensors_have_the_llama_names_and_shapes(tmp_path: Path) -> None:
    reader = gguf.GGUFReader(write_tiny_llama(tmp_path / "tiny.gguf"))
    tensors = tensor_map(reader)
    assert set(tensors) == llama_tensor_names(2)
    n_vocab = len(llama_gguf.vocabulary()[0])
    shapes = {name: [int(size) for size in tensor.shape] for name, tensor in tensors.items()}
    assert shapes["token_embd.weight"] == shapes["output.weight"] == [64, n_vocab]
    assert shapes["output_norm.weight"] == shapes["blk.1.attn_norm.weight"] == [64]
    assert shapes["blk.0.attn_q.weight"] == shapes["blk.0.attn_output.weight"] == [64, 64]
    assert shapes["blk.0.ffn_gate.weight"] == shapes["blk.0.ffn_up.weight"] == [64, 128]
    assert shapes["blk.0.ffn_down.weight"] == [128, 64]
    assert {tensor.tensor_type for tensor in tensors.values()} == {gguf.GGMLQuantizationType.F32}


def test_f16_stores_the_matrices_in_f16_and_the_norms_in_f32(tmp_path: Path) -> None:
    reader = gguf.GGUFReader(write_tiny_llama(tmp_path / "tiny.gguf", f16=True))
    assert field(reader, "general.file_type") == gguf.LlamaFileType.MOSTLY_F16
    for name, tensor in tensor_map(reader).items():
        wanted = (
            gguf.GGMLQuantizationType.F32 if name.endswith("norm.weight") else gguf.GGMLQuantizationType.F16
        )
        assert tensor.tensor_type == wanted, name


def test_slow_variant_is_the_larger_shape(tmp_path: Path) -> None:
    path = write_tiny_llama(tmp_path / "slow.gguf", slow=True, f16=True)
    assert 50_000_000 < path.stat().st_size < 60_000_000
    reader = gguf.GGUFReader(path)
    shape = {
        key: field(reader, f"llama.{key}")
        for key in ("embedding_length", "block_count", "feed_forward_length")
    }
    assert shape == {"embedding_length": 512, "block_count": 8, "feed_forward_length": 1536}
    assert field(reader, "llama.attention.head_count") == 8
    assert set(tensor_map(reader)) == llama_tensor_names(8)
    assert greedy_llama_answer(reader, "<0x0A>") == [*llama_gguf.ANSWER_PIECES, "</s>"]


def test_vocabulary_reaches_each_answer_word_one_letter_at_a_time() -> None:
    tokens, scores, types = llama_gguf.vocabulary()
    assert len(set(tokens)) == len(tokens)
    assert tokens[3:259] == [f"<0x{byte:02X}>" for byte in range(256)]
    assert set(types[3:259]) == {gguf.TokenType.BYTE}
    score = dict(zip(tokens, scores, strict=True))
    assert "▁" in score
    for piece in llama_gguf.ANSWER_PIECES:
        prefixes = [piece[:end] for end in range(1, len(piece) + 1)]
        assert all(prefix in score for prefix in prefixes), piece
        assert [score[prefix] for prefix in prefixes] == sorted(score[prefix] for prefix in prefixes)
    assert "".join(llama_gguf.ANSWER_PIECES).replace("▁", " ") == LLAMA_ANSWER
    assert types[tokens.index("<|im_start|>")] == types[tokens.index("<|im_end|>")] == gguf.TokenType.CONTROL


def llama_logits(reader: gguf.GGUFReader, token: int) -> Floats:
    """The logits after ``token`` when attention and feed-forward add nothing: head · rmsnorm(embedding)."""
    tensors = tensor_map(reader)
    embedding = np.asarray(tensors["token_embd.weight"].data, dtype=np.float32)[token]
    norm = np.asarray(tensors["output_norm.weight"].data, dtype=np.float32)
    normed = embedding / np.sqrt(np.mean(embedding**2) + 1e-5) * norm
    logits: Floats = np.asarray(tensors["output.weight"].data, dtype=np.float32) @ normed
    return logits


def greedy_llama_answer(reader: gguf.GGUFReader, last_prompt_piece: str) -> list[str]:
    tokens = field(reader, "tokenizer.ggml.tokens")
    assert isinstance(tokens, list)
    token, answer = tokens.index(last_prompt_piece), list[str]()
    while len(answer) < 20:
        token = int(np.argmax(llama_logits(reader, token)))
        answer.append(tokens[token])
        if token == llama_gguf.EOS_ID:
            break
    return answer


@pytest.mark.parametrize("f16", [False, True])
def test_every_layer_adds_nothing_so_the_head_alone_decides(tmp_path: Path, f16: bool) -> None:
    reader = gguf.GGUFReader(write_tiny_llama(tmp_path / "tiny.gguf", f16=f16))
    for name, tensor in tensor_map(reader).items():
        if name.startswith("blk.") and not name.endswith("norm.weight"):
            assert not np.any(tensor.data), name


@pytest.mark.parametrize("last_prompt_piece", ["<0x0A>", "<s>", "<|im_end|>", "H", "▁He", "?"])
def test_every_prompt_end_outside_the_answer_leads_to_the_whole_answer(
    tmp_path: Path, last_prompt_piece: str
) -> None:
    reader = gguf.GGUFReader(write_tiny_llama(tmp_path / "tiny.gguf"))
    assert greedy_llama_answer(reader, last_prompt_piece) == [*llama_gguf.ANSWER_PIECES, "</s>"]


def test_margins_leave_a_sampler_no_other_choice_and_ignore_eos_starts_over(tmp_path: Path) -> None:
    reader = gguf.GGUFReader(write_tiny_llama(tmp_path / "tiny.gguf", f16=True))
    tokens = field(reader, "tokenizer.ggml.tokens")
    assert isinstance(tokens, list)
    for piece in ("<0x0A>", *llama_gguf.ANSWER_PIECES):
        ranked = np.sort(llama_logits(reader, tokens.index(piece)))[::-1]
        assert ranked[0] == pytest.approx(llama_gguf.LOGIT, rel=1e-3)
        assert ranked[0] - ranked[1] >= llama_gguf.LOGIT / 2 - 0.1
    after_stop = llama_logits(reader, tokens.index("."))
    after_stop[llama_gguf.EOS_ID] = -np.inf
    assert tokens[int(np.argmax(after_stop))] == "▁Hello"


def test_another_answer_from_the_same_words_is_walked_with_the_same_vocabulary(tmp_path: Path) -> None:
    other = " Hello, I am a test model."
    reader = gguf.GGUFReader(write_tiny_llama(tmp_path / "other.gguf", answer=other))
    default = gguf.GGUFReader(write_tiny_llama(tmp_path / "tiny.gguf"))
    assert field(reader, "tokenizer.ggml.tokens") == field(default, "tokenizer.ggml.tokens")
    answer = greedy_llama_answer(reader, "<0x0A>")
    assert answer[-1] == "</s>"
    assert "".join(answer[:-1]).replace("▁", " ") == other


@pytest.mark.parametrize("answer", [" Hello, Hello.", " Goodbye.", " Hello, I am a tiny test model!"])
def test_an_answer_needing_a_piece_twice_or_outside_the_vocabulary_is_refused(
    tmp_path: Path, answer: str
) -> None:
    with pytest.raises(ValueError, match="distinct pieces"):
        write_tiny_llama(tmp_path / "bad.gguf", answer=answer)


# --- the unloadable GGUFs ---


def test_unloadable_files_are_the_same_bytes_each_run(tmp_path: Path) -> None:
    for how in UNLOADABLE:
        first = write_unloadable_gguf(tmp_path / f"{how}-a.gguf", how)
        assert first.read_bytes() == write_unloadable_gguf(tmp_path / f"{how}-b.gguf", how).read_bytes()


def test_truncated_keeps_the_header_and_cuts_the_tensor_data(tmp_path: Path) -> None:
    whole = write_tiny_llama(tmp_path / "whole.gguf").read_bytes()
    cut = write_unloadable_gguf(tmp_path / "cut.gguf", "truncated").read_bytes()
    reader = gguf.GGUFReader(tmp_path / "whole.gguf")
    data_end = max(tensor.data_offset + tensor.n_bytes for tensor in reader.tensors)
    assert whole.startswith(cut)
    assert reader.data_offset < len(cut) < data_end
    beyond = [tensor.name for tensor in reader.tensors if tensor.data_offset + tensor.n_bytes > len(cut)]
    assert beyond and "blk.1.ffn_down.weight" in beyond
    with pytest.raises(ValueError):
        gguf.GGUFReader(tmp_path / "cut.gguf")


def test_wrong_architecture_differs_from_the_tiny_model_only_in_its_architecture(tmp_path: Path) -> None:
    good = gguf.GGUFReader(write_tiny_llama(tmp_path / "good.gguf"))
    bad = gguf.GGUFReader(write_unloadable_gguf(tmp_path / "bad.gguf", "wrong_architecture"))
    architecture = field(bad, "general.architecture")
    assert architecture == llama_gguf.UNKNOWN_ARCHITECTURE
    assert architecture not in gguf.MODEL_ARCH_NAMES.values()
    renamed = {key.replace("llama.", f"{architecture}.", 1): field(good, key) for key in good.fields}
    renamed.pop("general.architecture")
    assert {key: field(bad, key) for key in bad.fields if key != "general.architecture"} == renamed
    good_tensors, bad_tensors = tensor_map(good), tensor_map(bad)
    assert set(good_tensors) == set(bad_tensors)
    for name, tensor in good_tensors.items():
        assert np.array_equal(tensor.data, bad_tensors[name].data), name


def test_unknown_how_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="truncated, wrong_architecture"):
        write_unloadable_gguf(tmp_path / "x.gguf", "empty")


# --- the whisper model ---


class WhisperFile:
    """The legacy ggml whisper file read back field by field."""

    def __init__(self, data: bytes) -> None:
        self.data, self.at = data, 0
        (self.magic,) = self.take("<I")
        self.hparams = self.take("<11i")
        self.n_mel, self.n_fft = self.take("<ii")
        self.filters = np.frombuffer(self.raw(4 * self.n_mel * self.n_fft), dtype="<f4")
        (count,) = self.take("<i")
        self.words = []
        for _ in range(count):
            (length,) = self.take("<I")
            self.words.append(self.raw(length))
        self.tensors: dict[str, tuple[int, tuple[int, ...], Floats]] = {}
        while self.at < len(data):
            n_dims, name_length, kind = self.take("<iii")
            sizes = self.take(f"<{n_dims}i")
            name = self.raw(name_length).decode()
            dtype = {0: "<f4", 1: "<f2"}[kind]
            count = math.prod(sizes)
            array = np.frombuffer(self.raw(count * np.dtype(dtype).itemsize), dtype=dtype)
            self.tensors[name] = (kind, sizes, array.astype(np.float32).reshape(tuple(reversed(sizes))))

    def take(self, layout: str) -> tuple[int, ...]:
        values = struct.unpack_from(layout, self.data, self.at)
        self.at += struct.calcsize(layout)
        return tuple(int(value) for value in values)

    def raw(self, length: int) -> bytes:
        assert self.at + length <= len(self.data), "read past the end of the file"
        chunk = self.data[self.at : self.at + length]
        self.at += length
        return chunk


def whisper_tensor_names() -> set[str]:
    attention = (
        "_ln.weight",
        "_ln.bias",
        ".query.weight",
        ".query.bias",
        ".key.weight",
        ".value.weight",
        ".value.bias",
        ".out.weight",
        ".out.bias",
    )
    mlp = ("mlp_ln.weight", "mlp_ln.bias", "mlp.0.weight", "mlp.0.bias", "mlp.2.weight", "mlp.2.bias")
    encoder = {"encoder.blocks.0." + name for name in mlp} | {
        "encoder.blocks.0.attn" + name for name in attention
    }
    decoder = (
        {"decoder.blocks.0." + name for name in mlp}
        | {"decoder.blocks.0.attn" + name for name in attention}
        | {"decoder.blocks.0.cross_attn" + name for name in attention}
    )
    top = {
        "encoder.positional_embedding",
        "encoder.conv1.weight",
        "encoder.conv1.bias",
        "encoder.conv2.weight",
        "encoder.conv2.bias",
        "encoder.ln_post.weight",
        "encoder.ln_post.bias",
        "decoder.positional_embedding",
        "decoder.token_embedding.weight",
        "decoder.ln.weight",
        "decoder.ln.bias",
    }
    return top | encoder | decoder


@pytest.fixture(scope="module")
def whisper_file(tmp_path_factory: pytest.TempPathFactory) -> WhisperFile:
    return WhisperFile(write_tiny_whisper(tmp_path_factory.mktemp("whisper") / "tiny.bin").read_bytes())


def test_whisper_same_bytes_each_run(tmp_path: Path) -> None:
    first = write_tiny_whisper(tmp_path / "a.bin")
    assert first == tmp_path / "a.bin"
    assert digest(first) == digest(write_tiny_whisper(tmp_path / "b.bin"))
    assert 7_000_000 < first.stat().st_size < 8_000_000


def test_whisper_header_is_the_english_only_layout(whisper_file: WhisperFile) -> None:
    assert whisper_file.magic == 0x67676D6C
    n_vocab, n_audio_ctx, n_audio_state, n_audio_head, n_audio_layer, *rest = whisper_file.hparams
    n_text_ctx, n_text_state, n_text_head, n_text_layer, n_mels, ftype = rest
    assert n_vocab == 51864  # English-only: 50257 text tokens + specials + 1501 timestamps, no languages
    assert (n_audio_ctx, n_audio_state, n_audio_head, n_audio_layer) == (1500, 64, 1, 1)
    assert (n_text_ctx, n_text_state, n_text_head, n_text_layer) == (448, 64, 1, 1)
    assert n_text_layer != 2  # whisper.cpp takes 2 decoder layers for a distilled model and drops timestamps
    assert (n_mels, ftype) == (80, 1)
    assert (whisper_file.n_mel, whisper_file.n_fft) == (80, 201)
    assert whisper_file.words[:256] == [bytes([byte]) for byte in range(256)]
    assert b" " in whisper_file.words  # whisper.cpp looks the blank up by text to suppress it
    assert len(whisper_file.words) < whisper_ggml.TOKEN_EOT


def test_whisper_tensors_are_the_set_and_types_whisper_cpp_expects(whisper_file: WhisperFile) -> None:
    tensors = whisper_file.tensors
    assert set(tensors) == whisper_tensor_names()
    assert len(tensors) == 7 + 15 + 4 + 24  # whisper.cpp's count for one encoder and one decoder layer
    assert whisper_file.at == len(whisper_file.data)
    sizes = {name: sizes for name, (_, sizes, _) in tensors.items()}
    assert sizes["encoder.positional_embedding"] == (64, 1500)
    assert sizes["encoder.conv1.weight"] == (3, 80, 64)
    assert sizes["encoder.conv2.weight"] == (3, 64, 64)
    assert sizes["encoder.conv1.bias"] == sizes["encoder.conv2.bias"] == (1, 64)
    assert sizes["decoder.positional_embedding"] == (64, 448)
    assert sizes["decoder.token_embedding.weight"] == (64, 51864)
    assert sizes["decoder.blocks.0.mlp.0.weight"] == (64, 256)
    assert sizes["decoder.blocks.0.mlp.2.weight"] == (256, 64)
    assert sizes["decoder.blocks.0.cross_attn.key.weight"] == (64, 64)
    f32 = {name for name, (kind, _, _) in tensors.items() if kind == 0}
    assert f32 == {name for name, (_, dims, _) in tensors.items() if len(dims) == 1} | {
        "encoder.positional_embedding",
        "decoder.positional_embedding",
        "encoder.conv1.bias",
        "encoder.conv2.bias",
    }


def layer_norm(x: Floats, weight: Floats, bias: Floats) -> Floats:
    centred = x - x.mean()
    normed: Floats = centred / np.sqrt(np.mean(centred**2) + 1e-5) * weight + bias
    return normed


def gelu(z: Floats) -> Floats:
    value: Floats = 0.5 * z * (1 + np.tanh(math.sqrt(2 / math.pi) * (z + 0.044715 * z**3)))
    return value


def whisper_logits(whisper_file: WhisperFile, token: int) -> Floats:
    """The decoder's logits after ``token`` when every attention adds nothing (the encoder is zero)."""
    t = {name: array for name, (_, _, array) in whisper_file.tensors.items()}
    block = "decoder.blocks.0."
    x = t["decoder.token_embedding.weight"][token] + t["decoder.positional_embedding"][0]
    h = layer_norm(x, t[block + "mlp_ln.weight"], t[block + "mlp_ln.bias"])
    h = gelu(t[block + "mlp.0.weight"] @ h + t[block + "mlp.0.bias"])
    x = x + t[block + "mlp.2.weight"] @ h + t[block + "mlp.2.bias"]
    return t["decoder.token_embedding.weight"] @ layer_norm(x, t["decoder.ln.weight"], t["decoder.ln.bias"])


def test_whisper_encoder_and_attention_add_nothing(whisper_file: WhisperFile) -> None:
    for name, (_, _, array) in whisper_file.tensors.items():
        if name.endswith(("ln.weight", "ln_post.weight")):
            assert np.all(array == 1), name
        elif name.startswith("encoder.") or "attn." in name or name.endswith("ln.bias"):
            assert not np.any(array), name
    assert not np.any(whisper_file.filters)


@pytest.mark.parametrize(
    "prompt_end", [whisper_ggml.TOKEN_SOT, whisper_ggml.TOKEN_NOT, whisper_ggml.TOKEN_BEG]
)
def test_whisper_decoder_walks_the_sentence_then_ends(whisper_file: WhisperFile, prompt_end: int) -> None:
    token, text = prompt_end, b""
    for _ in range(20):
        logits = whisper_logits(whisper_file, token)
        ranked = np.sort(logits)[::-1]
        assert ranked[0] - ranked[1] > 60  # far beyond whisper's fallback thresholds and its timestamp rule
        token = int(np.argmax(logits))
        if token == whisper_ggml.TOKEN_EOT:
            break
        text += whisper_file.words[token]
    assert text.decode() == WHISPER_ANSWER


def test_whisper_another_answer_of_the_same_words_is_walked(tmp_path: Path) -> None:
    other = " Hello world from a whisper."
    walked = WhisperFile(write_tiny_whisper(tmp_path / "other.bin", answer=other).read_bytes())
    token, text = whisper_ggml.TOKEN_SOT, b""
    for _ in range(20):
        token = int(np.argmax(whisper_logits(walked, token)))
        if token == whisper_ggml.TOKEN_EOT:
            break
        text += walked.words[token]
    assert text.decode() == other
    with pytest.raises(ValueError, match="distinct words"):
        write_tiny_whisper(tmp_path / "bad.bin", answer=" Hello Hello.")


# --- the tone ---


def test_tone_is_16k_mono_pcm_of_the_asked_length_and_the_same_bytes_each_run(tmp_path: Path) -> None:
    path = write_tone_wav(tmp_path / "a.wav", seconds=1.5)
    assert path == tmp_path / "a.wav"
    assert path.read_bytes() == write_tone_wav(tmp_path / "b.wav", seconds=1.5).read_bytes()
    with wave.open(str(path), "rb") as audio:
        assert (audio.getnchannels(), audio.getsampwidth(), audio.getframerate()) == (1, 2, 16_000)
        assert audio.getnframes() == 24_000
        samples = np.frombuffer(audio.readframes(audio.getnframes()), dtype="<i2")
    assert 9_000 < int(np.abs(samples).max()) < 10_000
    assert write_tone_wav(tmp_path / "default.wav").stat().st_size == 44 + 2 * 32_000
