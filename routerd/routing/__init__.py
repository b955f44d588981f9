"""Request facts and the routing choice, pure or thin: classifying a request (``classify``,
``selector``, ``call``), the one choice of the target that serves it (``choice``, with replica,
STT, embeddings and guardian rules from ``stt``, ``embeddings``, ``guardians``), planning the
backend call per family (``plan``, ``adapters``), and moving the bytes: forwarding to another node
(``forward``, ``relay``, ``upstream``), rewriting IDs in JSON, SSE and NDJSON (``rewrite``, ``sse``),
multipart and audio bodies, video jobs (``jobs``) and per-key limits (``key_limits``)."""
