"""Anthropic's Messages API and OpenAI's Responses API over a backend that speaks chat completions only.

A family whose program does not speak one of these APIs (its ``translates``, :mod:`routerd.families`)
gets the client's request as a chat completions request and its answer, plain or streamed, back in the
client's API (README "APIs" says per family what is translated and what is lost):

* :mod:`.anthropic`: a Messages (or count-tokens) request -> a chat (or tokenizer) request, a chat
  answer -> a Messages answer, a backend error -> Anthropic's error shape;
* :mod:`.anthropic_stream`: a streamed chat answer -> Anthropic's named events;
* :mod:`.responses`: a Responses request -> a chat request, a chat answer -> a Response object;
* :mod:`.responses_stream`: a streamed chat answer -> the Responses API's named events;
* :mod:`.chat`: the chat side both share (tools, sampling fields, the stream setting, reading an answer);
* :mod:`.chat_stream`: the one reader of a streamed chat answer, and the converter both streams build on.

Everything here is pure: no I/O, no reactor; ids and times are passed in.
"""

from __future__ import annotations
