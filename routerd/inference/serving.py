"""Executing a routing target (:mod:`routerd.routing.choice`): the one place a replica is reserved
and released, this node's model served (through its lane's router queue, as borrowed work, or
straight to the backend), a request forwarded, or a guardian reached.

A target without a reservation or guardian is served without a frame of this module: what serves
it (a lending queue's Deferred, or the local coroutine) is returned as it is, so a request held in
a queue keeps no suspended coroutine of the front.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any

from twisted.internet.defer import Deferred
from twisted.logger import Logger

from routerd.catalog.model import ModelConfig, RuntimeKind
from routerd.errors import HTTPError
from routerd.inference.local import LocalInference
from routerd.lending.offload import Borrowed, offload_returned
from routerd.lending.service import LendingService
from routerd.registry.registry import Registry
from routerd.routing.call import Call
from routerd.routing.choice import Forward, Guard, Guardian, Local, Refuse, Target, Unmodelled
from routerd.routing.forward import Forwarder
from routerd.routing.guardians import GUARDIAN_HEADER, ImageRefused
from routerd.routing.guardians import Guardian as GuardianSetting

log = Logger(namespace="routerd.inference.front")

#: What serves a request: a coroutine, or the Deferred of a lending queue's wait.
Served = Deferred[bytes] | Coroutine[Any, Any, bytes]


class TargetRunner:
    """Serves a :data:`~routerd.routing.choice.Target` on this node's parts."""

    def __init__(self, *, node_id: str, local: LocalInference, lending: LendingService | None,
                 forwarder: Forwarder | None, registry: Registry | None,
                 loaded_config: Callable[[RuntimeKind], str | None]) -> None:
        self.node_id = node_id
        self.local = local
        self.lending = lending
        self.forwarder = forwarder
        self.registry = registry
        self.loaded_config = loaded_config

    def serve(self, call: Call, target: Target, borrowed: Borrowed | None) -> Served:
        """What serves ``call`` on ``target``; raises what a :class:`Refuse` names."""
        if isinstance(target, Local):
            if target.reserve is None and target.guard is None:
                return self.serve_model(call, target.model, target.public_id, borrowed)
        elif isinstance(target, Refuse):
            if target.returned:
                raise offload_returned(f"cannot serve the borrowed request: {target.error.message}")
            raise target.error
        elif isinstance(target, Unmodelled):
            return self.local.serve_unmodelled(call)
        return self._run(call, target)

    def serve_model(self, call: Call, model: ModelConfig, public_id: str,
                    borrowed: Borrowed | None) -> Served:
        """Serve on this node: through the lane's router queue (every own request of a lane, linked
        or not, waits there in one class order), as borrowed work, or straight to the backend (a
        route with no lane)."""
        call.model_id = model.local_id  # as its loads are keyed: one analytics row per model
        lane = call.route.lane
        lending = self.lending
        if borrowed is not None:
            if lane is None or lending is None:
                raise offload_returned("this route is never lent")
            if not borrowed.load_allowed and self.loaded_config(call.route.runtime) != model.filename:
                raise offload_returned("the linked model is not loaded and the link forbids loading it")
            return lending.serve(call, model, lane, borrowed, public_id=public_id)
        if lane is not None and lending is not None:
            return lending.serve(call, model, lane, None, public_id=public_id)
        return self.local.serve(call, model, public_id)

    async def _run(self, call: Call, target: Local | Forward | Guardian) -> bytes:
        """Reserve the target's replica, serve, release: the one place a reservation lives."""
        held = target.reserve
        reservation = None
        if held is not None:
            assert self.registry is not None
            seconds = 0.0 if isinstance(target, Guardian) else target.seconds
            reservation = self.registry.reserve(held, call.route.runtime, seconds=seconds)
        try:
            return await self._perform(call, target)
        except ImageRefused as refused:
            guard = None if isinstance(target, Guardian) else target.guard
            if guard is None:
                raise
            if reservation is not None and isinstance(target, Forward):
                reservation.release()  # the forwarded node's replica is free before the guardian runs
            return await self._refused(call, guard, refused)
        finally:
            if reservation is not None:
                reservation.release()

    async def _perform(self, call: Call, target: Local | Forward | Guardian) -> bytes:
        if isinstance(target, Local):
            guard = target.guard
            if guard is not None:
                if guard.skipped:
                    self._unusable(call, guard.setting)
                call.guardian_fallback = guard.raises
            return await self.serve_model(call, target.model, target.public_id, None)
        if isinstance(target, Forward):
            assert self.forwarder is not None
            guard, record = target.guard, target.record
            if guard is not None and guard.skipped:
                self._unusable(call, guard.setting)
            call.model_id = record.local_id
            call.forwarded_to = record.node_id
            answer = await self.forwarder.forward(call, record, target.public_id,
                                                  image_refusal_raises=guard is not None)
            if call.route.kind == "sd_vid_gen" and self.local.jobs is not None:
                # its polls go there
                self.local.jobs.forwarded(call, answer, record.node_id, target.public_id)
            return answer
        self._mark_guardian(call, target)
        if target.model is not None:
            call.guardian_fallback = False
            # the guardian shares this node's runtime with the model it stands in for: that
            # model is loaded back once the node is quiet (lending.restore)
            call.guardian_restore = target.origin.node_id == self.node_id
            return await self.serve_model(call, target.model, target.public_id, None)
        assert target.record is not None and self.forwarder is not None
        call.forwarded_to = target.record.node_id
        return await self.forwarder.forward(call, target.record, target.public_id)

    async def _refused(self, call: Call, guard: Guard, refused: ImageRefused) -> bytes:
        """A backend refused the image: the guardian answers, or the refusal is answered."""
        if guard.fallback is not None:
            return await self._run(call, guard.fallback)
        self._unusable(call, guard.setting)
        kind = "invalid_request_error" if refused.status == 400 else "server_error"
        raise HTTPError(refused.status, refused.message, kind, "image_not_supported")

    def _unusable(self, call: Call, setting: GuardianSetting) -> None:
        if setting.guardian.node_id == self.node_id:
            log.warn("guardian {guardian} is not a multimodal text model of this node; request"
                     " {request_id} is not redirected", guardian=setting.label, request_id=call.request_id)
        else:
            log.warn("guardian {guardian} is not an available multimodal text model; request"
                     " {request_id} is not redirected", guardian=setting.label, request_id=call.request_id)

    def _mark_guardian(self, call: Call, target: Guardian) -> None:
        setting, origin = target.setting, target.origin
        call.reply.set_header(GUARDIAN_HEADER, setting.label.encode())
        call.guardian = True
        log.info("request {request_id} for {node}/{model} goes to guardian {guardian} ({reason})",
                 request_id=call.request_id, node=origin.node_id, model=origin.model_id,
                 guardian=setting.label, reason=target.reason)
        decisions = self.lending.decisions if self.lending is not None else None
        if decisions is not None:
            decisions.record("dispatch", "guardian", lane="text", owner_node_id=origin.node_id,
                             owner_model_id=origin.model_id, helper_node_id=setting.guardian.node_id,
                             helper_model_id=setting.guardian.model_id, reason=target.reason,
                             request_id=call.request_id)
