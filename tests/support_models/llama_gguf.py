"""A llama-architecture GGUF that llama.cpp loads and that answers every chat with one known sentence.

Written with the ``gguf`` package (the test extra pins it), from the metadata and tensors llama.cpp's
llama loader asks for:

* metadata ``llama.context_length``, ``.embedding_length``, ``.block_count``, ``.feed_forward_length``,
  ``.attention.head_count(_kv)``, ``.attention.layer_norm_rms_epsilon``, ``.rope.dimension_count``,
  ``.rope.freq_base``; ``tokenizer.ggml.model = "llama"`` (SentencePiece) with tokens, scores and token
  types, the bos/eos/unk ids and a ChatML ``tokenizer.chat_template``;
* tensors ``token_embd``, ``output_norm``, ``output`` and per layer ``attn_norm``,
  ``attn_q/k/v/output``, ``ffn_norm``, ``ffn_gate/up/down``.

The vocabulary: ``<unk> <s> </s>``, the 256 byte tokens ``<0x00>..<0xFF>`` (byte fallback: any UTF-8
text tokenizes), ``▁`` and printable ASCII, every prefix of the answer's words written with the
SentencePiece space mark (``▁H``, ``▁He``, … ``▁Hello``: SentencePiece only merges two pieces into one
that is in the vocabulary, so the whole word is reached one letter at a time) and ``<|im_start|>
<|im_end|>``.

The weights: attention and feed-forward are zero, so every layer passes its input through and the
logits depend on the last token only.  Each of the answer's tokens has its own orthogonal ±1 embedding;
every other token shares one "start" embedding.  The output head maps each of those onto the next token
of the answer with a logit of :data:`LOGIT`, everything else 0: the start goes to `` Hello``, `` Hello``
to ``,`` … and ``.`` to ``</s>``.  ``.`` also leads to `` Hello`` at half the logit, so a request with
``ignore_eos`` repeats the sentence.  A prompt that ends in one of the answer's own tokens therefore
continues the sentence from there; a chat prompt always ends in the template's newline, so every chat
gets the whole sentence.  The sampler cannot pick anything else: the margin is far beyond what any
temperature up to 1 lets through.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import gguf
import numpy as np
import numpy.typing as npt

from .weights import chain_rows

ANSWER = " Hello, I am a tiny test model."
"""What the model answers to every chat (and to every completion prompt not ending in one of its tokens)."""

ANSWER_PIECES: tuple[str, ...] = ("▁Hello", ",", "▁I", "▁am", "▁a", "▁tiny", "▁test", "▁model", ".")
"""The answer as the model's own tokens (pieces with SentencePiece's space mark); then ``</s>``."""

LOGIT = 64.0
"""The logit of the next token of the answer; every other token scores 0 (``ignore_eos``'s way back: half)."""

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
"""ChatML: the template llama.cpp also recognises by its ``<|im_start|>`` marker."""

TOOL_NAME = "get_weather"
"""The one function the tool-calling variant (``write_tiny_llama(tools=True)``) calls."""

TOOL_ARGUMENTS = '{"city": "Paris"}'
"""The arguments it calls :data:`TOOL_NAME` with."""

TOOL_CALL_PIECES: tuple[str, ...] = (
    "<tool_call>\n", '{"name": "' + TOOL_NAME + '", "arguments": ', TOOL_ARGUMENTS, "}\n</tool_call>")
"""The tool-calling variant's answer, as four tokens of its own: a Hermes/Qwen-style call, which llama.cpp's
template analysis reads as a tool call (and its ``tool_choice: "required"`` grammar lets through)."""

TOOLS_CHAT_TEMPLATE = (
    "{%- if tools %}{{- '<|im_start|>system\\n' }}"
    "{%- if messages[0].role == 'system' %}{{- messages[0].content + '\\n\\n' }}{%- endif %}"
    "{{- '# Tools\\n\\nYou are provided with function signatures within <tools></tools> XML tags:"
    "\\n<tools>' }}"
    "{%- for tool in tools %}{{- '\\n' }}{{- tool | tojson }}{%- endfor %}"
    "{{- '\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments "
    "within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\"name\": <function-name>, \"arguments\": "
    "<args-json-object>}\\n</tool_call><|im_end|>\\n' }}"
    "{%- elif messages[0].role == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'user' or (message.role == 'system' and not loop.first)"
    " or (message.role == 'assistant' and not message.tool_calls) %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- elif message.role == 'assistant' %}{{- '<|im_start|>assistant' }}"
    "{%- if message.content %}{{- '\\n' + message.content }}{%- endif %}"
    "{%- for tool_call in message.tool_calls %}"
    "{%- if tool_call.function is defined %}{%- set tool_call = tool_call.function %}{%- endif %}"
    "{{- '\\n<tool_call>\\n{\"name\": \"' + tool_call.name + '\", \"arguments\": ' }}"
    "{{- tool_call.arguments | tojson }}{{- '}\\n</tool_call>' }}{%- endfor %}{{- '<|im_end|>\\n' }}"
    "{%- elif message.role == 'tool' %}"
    "{%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' + message.content + '\\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
"""ChatML that knows tools (Qwen 2.5's way): the tools listed in a system turn, an assistant's calls as
``<tool_call>`` JSON, tool results as ``<tool_response>`` in a user turn; without tools it renders as
:data:`CHAT_TEMPLATE` does."""

SPACE_MARK = "▁"
UNK_ID, BOS_ID, EOS_ID = 0, 1, 2
CONTEXT_LENGTH = 2048
ROPE_FREQ_BASE = 10000.0
RMS_EPSILON = 1e-5

TINY_SHAPE = {"n_embd": 64, "n_layer": 2, "n_head": 4, "n_ff": 128}
SLOW_SHAPE = {"n_embd": 512, "n_layer": 8, "n_head": 8, "n_ff": 1536}


def vocabulary(extra: Sequence[str] = ()) -> tuple[list[str], list[float], list[int]]:
    """Tokens, their SentencePiece scores and their token types, in id order; ``extra`` pieces (the
    tool-calling variant's) after the answer's prefixes."""
    tokens: list[str] = ["<unk>", "<s>", "</s>"]
    types: list[int] = [gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL]
    tokens += [f"<0x{byte:02X}>" for byte in range(256)]
    types += [gguf.TokenType.BYTE] * 256
    normal = [SPACE_MARK] + [chr(code) for code in range(0x21, 0x7F)]
    for piece in ANSWER_PIECES:
        for end in range(2, len(piece) + 1):
            prefix = piece[:end]
            if prefix not in normal:
                normal.append(prefix)
    normal += [piece for piece in extra if piece not in normal]
    tokens += normal
    types += [gguf.TokenType.NORMAL] * len(normal)
    tokens += ["<|im_start|>", "<|im_end|>"]
    types += [gguf.TokenType.CONTROL] * 2
    # SentencePiece merges the adjacent pair whose joined piece scores highest: longer pieces score higher.
    scores = [
        float(len(token)) if kind == gguf.TokenType.NORMAL else 0.0
        for token, kind in zip(tokens, types, strict=True)
    ]
    return tokens, scores, [int(kind) for kind in types]


def answer_pieces(answer: str) -> tuple[str, ...]:
    """``answer`` as the vocabulary's answer pieces (longest first); each piece at most once, since the
    next token follows from the last one alone.  :data:`ANSWER` and sentences made of its words, e.g.
    " Hello, I am a test model." (how tests tell two models apart by their answers)."""
    text = answer.replace(" ", SPACE_MARK)
    by_length = sorted(ANSWER_PIECES, key=len, reverse=True)
    pieces: list[str] = []
    while text:
        piece = next((p for p in by_length if text.startswith(p)), None)
        if piece is None or piece in pieces:
            raise ValueError(f"the answer {answer!r} is not made of distinct pieces of {ANSWER!r}")
        pieces.append(piece)
        text = text[len(piece):]
    return tuple(pieces)


def _head_and_embeddings(
    tokens: Sequence[str], n_embd: int, pieces: Sequence[str]
) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.float32]]:
    """``token_embd`` and ``output`` (both n_vocab × n_embd) that walk the answer's ``pieces``."""
    ids = [tokens.index(piece) for piece in pieces]
    rows = chain_rows(n_embd, len(ids) + 1)
    start, answer_rows = rows[0], rows[1:]
    embeddings = np.tile(start, (len(tokens), 1))
    for token_id, row in zip(ids, answer_rows, strict=True):
        embeddings[token_id] = row
    scale = LOGIT / n_embd
    head = np.zeros((len(tokens), n_embd), dtype=np.float32)
    head[ids[0]] += start * scale
    for here, following in zip(answer_rows[:-1], ids[1:], strict=True):
        head[following] += here * scale
    head[EOS_ID] += answer_rows[-1] * scale
    head[ids[0]] += answer_rows[-1] * (scale / 2)
    return embeddings, head


def _gguf_writer(path: Path, architecture: str, *, slow: bool, f16: bool,
                 mean_pooling: bool = False, answer: str = ANSWER, tools: bool = False) -> gguf.GGUFWriter:
    shape = SLOW_SHAPE if slow else TINY_SHAPE
    n_embd, n_layer, n_head, n_ff = shape["n_embd"], shape["n_layer"], shape["n_head"], shape["n_ff"]
    pieces = TOOL_CALL_PIECES if tools else answer_pieces(answer)
    tokens, scores, types = vocabulary(TOOL_CALL_PIECES if tools else ())
    weight_type = np.float16 if f16 else np.float32

    writer = gguf.GGUFWriter(path, architecture)
    writer.add_name("routerd tiny test model (slow)" if slow else "routerd tiny test model")
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16 if f16 else gguf.LlamaFileType.ALL_F32)
    writer.add_context_length(CONTEXT_LENGTH)
    writer.add_embedding_length(n_embd)
    writer.add_block_count(n_layer)
    writer.add_feed_forward_length(n_ff)
    writer.add_head_count(n_head)
    writer.add_head_count_kv(n_head)
    writer.add_layer_norm_rms_eps(RMS_EPSILON)
    writer.add_rope_dimension_count(n_embd // n_head)
    writer.add_rope_freq_base(ROPE_FREQ_BASE)
    writer.add_vocab_size(len(tokens))
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    writer.add_unk_token_id(UNK_ID)
    writer.add_bos_token_id(BOS_ID)
    writer.add_eos_token_id(EOS_ID)
    writer.add_add_bos_token(True)
    writer.add_add_eos_token(False)
    writer.add_chat_template(TOOLS_CHAT_TEMPLATE if tools else CHAT_TEMPLATE)
    if tools:
        # llama.cpp's tool-call grammar starts with the generation prompt ("<|im_start|>assistant\n") as
        # the model's own tokens: SentencePiece's space before "assistant" would break it.
        writer.add_add_space_prefix(False)
    if mean_pooling:
        # What an embedding model's GGUF says (llama.cpp reads ``<arch>.pooling_type``); without it
        # llama-server's OpenAI embeddings route refuses pooling type "none".
        writer.add_pooling_type(gguf.PoolingType.MEAN)

    embeddings, head = _head_and_embeddings(tokens, n_embd, pieces)
    ones = np.ones(n_embd, dtype=np.float32)
    writer.add_tensor("token_embd.weight", embeddings.astype(weight_type))
    writer.add_tensor("output_norm.weight", ones)
    writer.add_tensor("output.weight", head.astype(weight_type))
    square = np.zeros((n_embd, n_embd), dtype=weight_type)
    up = np.zeros((n_ff, n_embd), dtype=weight_type)
    down = np.zeros((n_embd, n_ff), dtype=weight_type)
    for layer in range(n_layer):
        block = f"blk.{layer}."
        writer.add_tensor(block + "attn_norm.weight", ones)
        for name in ("attn_q", "attn_k", "attn_v", "attn_output"):
            writer.add_tensor(block + name + ".weight", square)
        writer.add_tensor(block + "ffn_norm.weight", ones)
        writer.add_tensor(block + "ffn_gate.weight", up)
        writer.add_tensor(block + "ffn_up.weight", up)
        writer.add_tensor(block + "ffn_down.weight", down)
    return writer


def _write(writer: gguf.GGUFWriter) -> None:
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file(progress=False)
    writer.close()


def write_tiny_llama(path: str | Path, *, slow: bool = False, f16: bool = False,
                     mean_pooling: bool = False, answer: str = ANSWER, tools: bool = False) -> Path:
    """Write the known-answer llama GGUF to ``path`` and return it.

    Tiny: n_embd 64, 2 layers, 4 heads, n_ff 128 (≈ 0.5 MB F32, ≈ 0.26 MB with ``f16``).  ``slow``: n_embd
    512, 8 layers, 8 heads, n_ff 1536 (≈ 55 MB with ``f16``), the same answer with ≈ 210 times the
    weights (27.7 M against 0.13 M) to multiply per token.  ``mean_pooling``: the model says its embeddings
    are the mean over tokens, as an embedding model's GGUF does.  ``answer``: another sentence made of
    :data:`ANSWER`'s words (:func:`answer_pieces`), same vocabulary.  ``tools``: the tool-calling variant,
    whose chat template knows tools (:data:`TOOLS_CHAT_TEMPLATE`) and whose answer to every chat is a call
    of :data:`TOOL_NAME` with :data:`TOOL_ARGUMENTS` (:data:`TOOL_CALL_PIECES`, four tokens added to the
    vocabulary).  Same arguments, same bytes.
    """
    path = Path(path)
    _write(_gguf_writer(path, "llama", slow=slow, f16=f16, mean_pooling=mean_pooling, answer=answer,
                        tools=tools))
    return path


UNLOADABLE = ("truncated", "wrong_architecture")
UNKNOWN_ARCHITECTURE = "routerd-unknown-arch"
"""The ``general.architecture`` of the ``wrong_architecture`` file: a name llama.cpp does not know."""


def write_unloadable_gguf(path: str | Path, how: str) -> Path:
    """Write a GGUF that llama-server refuses to load, and return its path.

    ``truncated``: the tiny model cut off halfway through its tensor data (header, metadata and tensor
    list intact, so the loader gets as far as the data).  ``wrong_architecture``: the tiny model in every
    respect but ``general.architecture`` (and its key prefix), which is :data:`UNKNOWN_ARCHITECTURE`.
    """
    path = Path(path)
    if how == "truncated":
        write_tiny_llama(path)
        data_start = gguf.GGUFReader(path).data_offset
        size = path.stat().st_size
        with path.open("r+b") as handle:
            handle.truncate(data_start + (size - data_start) // 2)
    elif how == "wrong_architecture":
        _write(_gguf_writer(path, UNKNOWN_ARCHITECTURE, slow=False, f16=False))
    else:
        raise ValueError(f"unloadable GGUF how: {how!r}; one of {', '.join(UNLOADABLE)}")
    return path
