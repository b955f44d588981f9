"""Route wiring shared by every family: guarded endpoints, ``/sim/control``, 404s, and a family's
whole app built from its route table."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence

from klein import Klein
from twisted.internet.defer import Deferred
from twisted.python.failure import Failure
from twisted.web.server import Request
from werkzeug.exceptions import MethodNotAllowed, NotFound

from routerd.sim.control import ControlError, apply_control, snapshot
from routerd.sim.runtime import Handler, LoadingReply, SimRuntime
from routerd.sim.web import BadRequest, openai_error, read_json, send_json

__all__ = [
    "ErrorPage",
    "Route",
    "add_control_routes",
    "add_error_pages",
    "add_route",
    "build_family_app",
    "openai_error_page",
    "routes",
]

#: One served route: its path, its method, its handler, and whether it is work (counted, slowed,
#: refused while loading) rather than an information read.
Route = tuple[str, str, Handler, bool]


def add_route(
    app: Klein,
    runtime: SimRuntime,
    path: str,
    methods: Sequence[str],
    handler: Handler,
    *,
    work: bool,
    loading_reply: LoadingReply | None,
) -> None:
    """Serve ``handler`` at ``path`` behind the runtime's exit/hang/loading guards."""

    def endpoint(request: Request, **_path_parts: object) -> Deferred[bytes | None] | bytes:
        # a path template's parts (``<job_id>``) are read from ``request.path`` by the handler
        return runtime.serve(request, handler, work=work, loading_reply=loading_reply)

    app.route(path, methods=list(methods), endpoint=f"{','.join(methods)} {path}")(endpoint)


def add_control_routes(app: Klein, runtime: SimRuntime) -> None:
    """``GET``/``POST /sim/control``: always answered, even while loading or hanging."""

    def state() -> dict[str, object]:
        return {
            **snapshot(runtime.knobs, runtime.counters),
            "family": runtime.family,
            "weights": runtime.weights.label,
            "model_path": runtime.weights_path,
            "loading": runtime.loading,
            "time_scale": runtime.time_scale,
            "total_slots": runtime.total_slots,
        }

    @app.route("/sim/control", methods=["GET"], endpoint="sim-control-get")
    def get_control(request: Request) -> bytes:
        return send_json(request, 200, state())

    @app.route("/sim/control", methods=["POST"], endpoint="sim-control-post")
    def post_control(request: Request) -> bytes:
        try:
            apply_control(runtime.knobs, read_json(request))
        except (BadRequest, ControlError) as exc:
            return send_json(request, 400, {"error": {"code": 400, "message": str(exc),
                                                      "type": "invalid_request_error"}})
        SimRuntime.log.info("control changed: {knobs}", knobs=runtime.knobs)
        if runtime.knobs.crash_after == 0:
            runtime.clock.callLater(0.0, runtime.check_crash)
        return send_json(request, 200, state())


#: A family's own answer to an unknown path (404) or method (405): (request, status, message) -> body.
ErrorPage = Callable[[Request, int, str], bytes]


def add_error_pages(app: Klein, body: Callable[[int, str], object], page: ErrorPage | None = None) -> None:
    """Answer unknown paths and methods with the family's JSON error shape (or its own ``page``)."""

    def answer(request: Request, status: int, message: str) -> bytes:
        if page is not None:
            return page(request, status, message)
        return send_json(request, status, body(status, message))

    @app.handle_errors(NotFound)  # type: ignore[arg-type]
    def not_found(request: Request, failure: Failure) -> bytes:
        return answer(request, 404, "File Not Found")

    @app.handle_errors(MethodNotAllowed)  # type: ignore[arg-type]
    def not_allowed(request: Request, failure: Failure) -> bytes:
        return answer(request, 405, "Method Not Allowed")


def openai_error_page(code: int, message: str) -> object:
    """The OpenAI-shaped body of an unknown path (404) or method (405)."""
    return openai_error(code, message, "not_found_error" if code == 404 else "invalid_request_error")


def routes(method: str, table: Mapping[str, Handler], *, work: bool) -> list[Route]:
    """Every path of ``table`` served with ``method`` by its handler, in the table's order."""
    return [(path, method, handler, work) for path, handler in table.items()]


def build_family_app(runtime: SimRuntime, table: Iterable[Route], *, loading_reply: LoadingReply,
                     error_body: Callable[[int, str], object], error_page: ErrorPage | None = None) -> Klein:
    """A family's app: ``/sim/control``, every route of ``table`` in order, and its error pages."""
    app = Klein()
    add_control_routes(app, runtime)
    for path, method, handler, work in table:
        add_route(app, runtime, path, [method], handler, work=work, loading_reply=loading_reply)
    add_error_pages(app, error_body, error_page)
    return app
