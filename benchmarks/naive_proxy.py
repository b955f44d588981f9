"""The naive floor: a ~60-line Klein + treq proxy in front of one backend (issue 14).

What a router costs at the least when written the obvious way: Klein routing, the body parsed and
re-serialised with ``json``, a treq call on a persistent pool, the answer's ``model`` replaced;
streams passed through chunk by chunk.  ``benchmarks/overhead.py`` runs it beside routerd so every
run prints routerd ÷ floor ratios.

Run: python benchmarks/naive_proxy.py PORT BACKEND_URL [MODEL]  (MODEL: what the backend calls it,
``zero`` by default; ``benchmarks/cluster.py`` puts it in front of a slave node)
"""

from __future__ import annotations

import json
import sys
from typing import Any

import treq
from klein import Klein
from twisted.internet import reactor
from twisted.web.client import Agent, HTTPConnectionPool
from twisted.web.iweb import IRequest

app = Klein()
pool = HTTPConnectionPool(reactor, persistent=True)
pool.maxPersistentPerHost = 128
http = treq.client.HTTPClient(Agent(reactor, pool=pool))
BACKEND = sys.argv[2] if len(sys.argv) > 2 else "http://127.0.0.1:8080"
MODEL = sys.argv[3] if len(sys.argv) > 3 else "zero"  # the name the backend knows the model by


@app.route("/v1/chat/completions", methods=["POST"])
async def chat(request: IRequest) -> Any:
    body = json.loads(request.content.read())
    public = body.get("model")
    body["model"] = MODEL
    response = await http.post(BACKEND + "/v1/chat/completions", json.dumps(body).encode(),
                               headers={b"content-type": [b"application/json"]}, unbuffered=True)
    request.setResponseCode(response.code)
    ctype = response.headers.getRawHeaders(b"content-type", [b"application/json"])[0]
    request.setHeader(b"content-type", ctype)
    if ctype.startswith(b"text/event-stream"):
        await treq.collect(response, request.write)
        return b""
    answer = json.loads(await response.content())
    answer["model"] = public
    return json.dumps(answer).encode()


@app.route("/health", methods=["GET"])
def health(request: IRequest) -> bytes:
    return b"ok"


if __name__ == "__main__":
    app.run("127.0.0.1", int(sys.argv[1]), logFile=open("/dev/null", "w"))  # noqa: SIM115
