"""Build ``multipart/form-data`` bodies (for whisper-server's ``/inference`` and ``/load``)."""

from __future__ import annotations

import uuid
from collections.abc import Mapping

__all__ = ["FilePart", "encode_multipart"]

#: (file name, content, content type)
FilePart = tuple[str, bytes, str]


def encode_multipart(fields: Mapping[str, str | bytes | FilePart]) -> tuple[bytes, str]:
    """Encode form fields; returns (body, Content-Type header value with the boundary)."""
    boundary = f"routerd-{uuid.uuid4().hex}"
    out = bytearray()
    for name, value in fields.items():
        out += f"--{boundary}\r\n".encode()
        if isinstance(value, tuple):
            filename, content, content_type = value
            out += (f'Content-Disposition: form-data; name="{name}"; filename="{filename}"\r\n'
                    f"Content-Type: {content_type}\r\n\r\n").encode()
        else:
            content = value.encode("utf-8") if isinstance(value, str) else value
            out += f'Content-Disposition: form-data; name="{name}"\r\n\r\n'.encode()
        out += content + b"\r\n"
    out += f"--{boundary}--\r\n".encode()
    return bytes(out), f"multipart/form-data; boundary={boundary}"
