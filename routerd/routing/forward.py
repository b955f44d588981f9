"""Forwarding a client request from the master to the node that holds the chosen replica.

The master rewrites the public model ID to the replica's local ID, sends the
request to ``<node_url>/router/v1/node/inference<path>`` with the cluster
token, and streams the answer back with IDs rewritten to the public value.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

from twisted.internet.error import ConnectError, DNSLookupError, TimeoutError
from twisted.web.client import ResponseNeverReceived
from twisted.web.http_headers import Headers
from twisted.web.iweb import IAgent

from routerd.api.call import Call
from routerd.api.errors import HTTPError
from routerd.cluster.client import AllowList
from routerd.cluster.wire import ModelRecord
from routerd.routing.body import BytesProducer
from routerd.routing.relay import collect, query_args, relay, response_header
from routerd.routing.rewrite import make_rewriter, rewrite_json_model
from routerd.routing.selector import replace_model

INFERENCE_PREFIX = "/router/v1/node/inference"
_PASSED_HEADERS = (b"x-routerd-node", b"x-routerd-lent-to", b"cache-control", b"x-content-type-options")


class Forwarder:
    def __init__(self, agent: IAgent, token: str, allowed: AllowList) -> None:
        self.agent = agent
        self.token = token
        self.allowed = allowed

    async def forward(self, call: Call, record: ModelRecord, public_id: str) -> bytes:
        request = call.request
        base = record.node_url.rstrip("/")
        if not base or not self.allowed.permits(base + INFERENCE_PREFIX):
            raise HTTPError(502, f"node {record.node_id!r} is not an allowed cluster target",
                            "backend_error", "node_not_allowed")
        local = self._local_selector(call, record)
        body = call.body
        if call.selector is not None and call.selector != local:
            body = replace_model(call.route, body, call.content_type, local, old_model=call.selector)
        query = self._query(call, local)
        url = base + INFERENCE_PREFIX + call.path + (f"?{query}" if query else "")
        headers = Headers({
            b"authorization": [b"Bearer " + self.token.encode()],
            b"content-type": [call.content_type.encode() or b"application/json"],
            b"x-routerd-request-id": [call.request_id.encode()],
        })
        try:
            response = await self.agent.request(b"POST", url.encode(), headers, BytesProducer(body))
        except (ConnectError, DNSLookupError, TimeoutError, ResponseNeverReceived) as exc:
            raise HTTPError(502, f"node {record.node_id!r} is unreachable: {exc.__class__.__name__}",
                            "backend_error", "node_unreachable") from None
        code = int(response.code)
        call.outcome.http_status = code
        call.outcome.status = "ok" if 200 <= code < 300 else f"http_{code}"
        request.setResponseCode(code)
        for name in _PASSED_HEADERS:
            values = response.headers.getRawHeaders(name)
            if values:
                request.setHeader(name, values[0])
        ctype = response_header(response, b"content-type") or "application/json"
        request.setHeader(b"content-type", ctype.encode())
        rewrite = self._rewrites(call, code)

        def mapping(_old: str) -> str:
            return public_id

        if ctype.startswith(("text/event-stream", "application/x-ndjson", "application/ndjson")):
            converter = make_rewriter(ctype, mapping) if rewrite else None
            if converter is None:
                await relay(response, request, _same, _nothing)
            else:
                await relay(response, request, converter.feed, converter.flush)
            return b""
        raw = await collect(response)
        if rewrite and ctype.startswith("application/json"):
            return rewrite_json_model(raw, mapping)
        return raw

    @staticmethod
    def _local_selector(call: Call, record: ModelRecord) -> str:
        if call.route.runtime == "image" and record.image_id:
            return record.image_id
        return record.local_id

    @staticmethod
    def _rewrites(call: Call, code: int) -> bool:
        if call.route.runtime == "stt":
            return False  # audio answers carry no model ID (reference §5.5)
        if call.route.runtime == "image":
            return 200 <= code < 300
        return True

    @staticmethod
    def _query(call: Call, local: str) -> str:
        args = query_args(call.request)
        if not args:
            return ""
        for key in ("model", "sd_model_checkpoint"):
            if key in args:
                args[key] = [local if v == call.selector else v for v in args[key]]
        return urlencode([(k, v) for k, vs in args.items() for v in vs])


def _same(data: bytes) -> bytes:
    return data


def _nothing() -> bytes:
    return b""


__all__ = ["Forwarder", "INFERENCE_PREFIX", "Any"]
