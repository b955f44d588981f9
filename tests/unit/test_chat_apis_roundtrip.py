"""Property: a chat completions request put into Anthropic's Messages API (as a client speaking it would
send it) and translated back by routerd keeps its content: the roles, texts, images, tool calls and their
results, the system prompt, the stop strings and max_tokens (issue 34: "chat -> Messages -> chat keeps the
content")."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from routerd.routing.adapters.chat_apis import anthropic

# -- chat -> Messages, as a client of the Messages API would write the same conversation ------------------


def _image_block(url: str) -> dict[str, Any]:
    if url.startswith("data:"):
        head, data = url.split(",", 1)
        return {
            "type": "image",
            "source": {"type": "base64", "media_type": head[5:].split(";")[0], "data": data},
        }
    return {"type": "image", "source": {"type": "url", "url": url}}


def _user_blocks(content: str | list[dict[str, Any]]) -> str | list[dict[str, Any]]:
    if isinstance(content, str):
        return content
    return [
        {"type": "text", "text": p["text"]} if p["type"] == "text" else _image_block(p["image_url"]["url"])
        for p in content
    ]


def chat_to_messages_request(chat: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {"model": chat["model"], "max_tokens": chat["max_tokens"], "messages": []}
    if "stop" in chat:
        out["stop_sequences"] = chat["stop"]
    turns = chat["messages"]
    if turns and turns[0]["role"] == "system":
        out["system"] = turns[0]["content"]
        turns = turns[1:]
    results: list[dict[str, Any]] = []
    for message in turns:
        if message["role"] == "tool":
            results.append(
                {"type": "tool_result", "tool_use_id": message["tool_call_id"], "content": message["content"]}
            )
            continue
        if results:
            out["messages"].append({"role": "user", "content": results})
            results = []
        if message["role"] == "user":
            out["messages"].append({"role": "user", "content": _user_blocks(message["content"])})
        elif "tool_calls" not in message:
            out["messages"].append({"role": "assistant", "content": message["content"]})
        else:
            blocks = [{"type": "text", "text": message["content"]}] if message["content"] else []
            blocks += [
                {
                    "type": "tool_use",
                    "id": c["id"],
                    "name": c["function"]["name"],
                    "input": json.loads(c["function"]["arguments"]),
                }
                for c in message["tool_calls"]
            ]
            out["messages"].append({"role": "assistant", "content": blocks})
    if results:
        out["messages"].append({"role": "user", "content": results})
    return out


# -- chat requests -----------------------------------------------------------------------------------------

texts = st.text(max_size=40)
names = st.from_regex(r"[a-z][a-z0-9_]{0,15}", fullmatch=True)
images = st.one_of(
    st.builds(
        lambda mime, data: f"data:{mime};base64,{data}",
        st.sampled_from(["image/png", "image/jpeg"]),
        st.from_regex(r"[A-Za-z0-9+/]{4,40}={0,2}", fullmatch=True),
    ),
    st.builds(lambda path: f"https://img.test/{path}.png", names),
)
parts = st.one_of(
    st.builds(lambda t: {"type": "text", "text": t}, texts),
    st.builds(lambda u: {"type": "image_url", "image_url": {"url": u}}, images),
)
users = st.builds(
    lambda c: {"role": "user", "content": c}, st.one_of(texts, st.lists(parts, min_size=1, max_size=4))
)
arguments = st.dictionaries(names, st.one_of(st.integers(), texts, st.booleans(), st.none()), max_size=3)


@st.composite
def tool_turns(draw: st.DrawFn, n: int) -> list[dict[str, Any]]:
    """An assistant's tool calls (with or without text) and a tool message answering each."""
    count = draw(st.integers(1, 3))
    calls = [
        {
            "id": f"call_{n}_{i}",
            "type": "function",
            "function": {"name": draw(names), "arguments": json.dumps(draw(arguments))},
        }
        for i in range(count)
    ]
    text = draw(st.one_of(st.none(), texts.filter(bool)))
    return [
        {"role": "assistant", "content": text, "tool_calls": calls},
        *[{"role": "tool", "tool_call_id": c["id"], "content": draw(texts)} for c in calls],
    ]


@st.composite
def chat_requests(draw: st.DrawFn) -> dict[str, Any]:
    messages: list[dict[str, Any]] = []
    if draw(st.booleans()):
        messages.append({"role": "system", "content": draw(texts)})
    for n in range(draw(st.integers(1, 5))):
        messages.append(draw(users))
        kind = draw(st.sampled_from(["none", "text", "tools"]))
        if kind == "text":
            messages.append({"role": "assistant", "content": draw(texts)})
        elif kind == "tools":
            messages += draw(tool_turns(n))
    chat: dict[str, Any] = {
        "model": "local-7",
        "max_tokens": draw(st.integers(1, 4096)),
        "messages": messages,
    }
    if draw(st.booleans()):
        chat["stop"] = draw(st.lists(texts.filter(bool), min_size=1, max_size=3))
    return chat


def _canonical(chat: dict[str, Any]) -> dict[str, Any]:
    """Tool-call arguments compared as the JSON they are (their spelling is the client's)."""
    for message in chat["messages"]:
        for call in message.get("tool_calls", ()):
            call["function"]["arguments"] = json.loads(call["function"]["arguments"])
    return chat


@settings(max_examples=150, deadline=None)
@given(chat_requests())
def test_chat_to_messages_to_chat_keeps_roles_text_images_tool_calls_results_system_stop_and_max_tokens(
    chat: dict[str, Any],
) -> None:
    back = anthropic.messages_to_chat(chat_to_messages_request(chat), "local-7", stream=False)
    assert _canonical(back) == _canonical(json.loads(json.dumps(chat)))
