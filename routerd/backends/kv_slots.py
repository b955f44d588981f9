"""KV slots kept across swaps (``models.slot_keep_count`` / ``models.slot_keep_bytes``).

A llama-server started with ``--slot-save-path <dir>`` writes a slot's KV cache to a file
(``POST /slots/{id}?action=save`` with ``{"filename": ...}``) and reads it back
(``action=restore``); its answers (llama.cpp b11434)::

    save    200 {"id_slot": 0, "filename": "f", "n_saved": 589, "n_written": 311092, "timings": {...}}
    restore 200 {"id_slot": 0, "filename": "f", "n_restored": 589, "n_read": 311092, "timings": {...}}
    400 {"error": {"message": "Invalid filename" | "Unable to restore slot: ..."}}   (a bad name; a file
        the model's cache cannot take: another architecture or size)
    501 {"error": {"type": "not_supported_error"}}   (started without --slot-save-path)

A file saved by one model restores into another of the same architecture and size without a
complaint (an f16 copy of the weights takes an f32 one's file), so a saved slot is keyed by the model's
weight hash (``ModelConfig.model_hash``) and the session's: a different file never restores it.

What the keeper does:

* every request a keeping family's single-slot text model serves (``parallel`` 1: slot 0 holds the last
  prompt) tells it the request's session (:meth:`SlotKeeper.session_of`: the key
  ``routing.affinity_key`` names, the one replica choice steers by, so a session the master keeps on
  this node is the session whose slot is kept); the process (by port) remembers the last one;
* before the runtime stops that process (a swap to another model, an unload: the slot's
  ``before_stop`` hook, called once its users are gone), slot 0 is saved as that session's file;
* the saved slots are bounded by count and bytes (``n_written``), the oldest dropped (its file
  deleted);
* when the session's next request reaches the model back, the file is restored into slot 0 before
  the request is sent, and forgotten (the slot holds it now).

A backend answering 404 or 501 (no slot routes: the simulator, or a server started without the
flag) is skipped; any failed save or restore is logged and never fails the request or the stop.
Models with more than one slot are skipped (which slot held a session is llama-server's choice and its
chat answers do not say).
"""

from __future__ import annotations

import hashlib
import os
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, Protocol

import attrs
from twisted.internet.defer import Deferred, succeed
from twisted.logger import Logger

from routerd.catalog.model import ModelConfig
from routerd.config.schema import Config
from routerd.families import keeps_kv_slots
from routerd.replica_modes import KeySource
from routerd.routing.call import Call
from routerd.routing.session_key import session_key

__all__ = ["KeptSlot", "SlotKeeper", "SlotPoster", "keeps_slots", "kv_slot_keeper", "slot_file_name"]

log = Logger()

#: How long one save or restore may take before it is given up (seconds).
SLOT_CALL_TIMEOUT_S = 30.0
#: The slot a single-slot llama-server runs every request in.
SLOT = 0
#: The statuses of a backend without the slot routes.
UNSUPPORTED = frozenset({404, 501})


class SlotPoster(Protocol):
    """The treq-like client the keeper posts with (``treq.testing.StubTreq`` in tests)."""

    def post(self, url: str, *, json: Any = ..., timeout: float | None = None) -> Deferred[Any]: ...


@attrs.frozen
class KeptSlot:
    """One saved slot: whose it is, its file in the save folder, and its size."""

    model_hash: str
    session: str  # the session key's hash (never the key)
    filename: str
    size: int
    saved_at: float


@attrs.define
class SlotTally:
    """Cumulative counts of one model's saves and restores."""

    saved: int = 0
    restored: int = 0
    saved_bytes: int = 0
    restored_bytes: int = 0
    failed: int = 0


def keeps_slots(model: ModelConfig) -> bool:
    """Whether ``model``'s slot can be kept: its family saves slots, it runs one slot (the request's
    prompt is slot 0's) and its weights are hashed (the key of its files)."""
    return (keeps_kv_slots(model.backend_mode) and (model.parallel or 1) == 1
            and bool(model.model_hash) and not model.model_hash.startswith("missing"))


def session_hash(session: str) -> str:
    return hashlib.sha256(session.encode("utf-8")).hexdigest()[:32]


def slot_file_name(model_hash: str, session: str) -> str:
    """The file a session's slot is saved as: letters, digits and dashes only (llama-server refuses
    anything its ``fs_validate_filename`` does not like)."""
    return f"{model_hash[:16]}-{session}.bin"


def _remove(path: str) -> None:
    try:
        os.remove(path)
    except OSError:
        pass


class SlotKeeper:
    """The saved slots of one node and the last session each running process served."""

    def __init__(self, http: SlotPoster, folder: str, *, keep_count: int, keep_bytes: int,
                 clock: Callable[[], float], timeout_s: float = SLOT_CALL_TIMEOUT_S,
                 remove: Callable[[str], None] = _remove, key_source: KeySource = "auto") -> None:
        self.http = http
        #: Where a request's session comes from (``routing.affinity_key``).
        self.key_source: KeySource = key_source
        self.folder = folder
        self.keep_count = keep_count
        self.keep_bytes = keep_bytes
        self._now = clock
        self.timeout_s = timeout_s
        self._remove = remove
        #: (model hash, session hash) -> the saved slot, oldest first.
        self.kept: OrderedDict[tuple[str, str], KeptSlot] = OrderedDict()
        #: port -> (model hash, session hash, weight file) of the last request its process served.
        self._last: dict[int, tuple[str, str, str]] = {}  # + the weight file
        self.tallies: dict[str, SlotTally] = {}

    @property
    def enabled(self) -> bool:
        return self.keep_count > 0 and self.keep_bytes > 0

    @property
    def kept_bytes(self) -> int:
        return sum(slot.size for slot in self.kept.values())

    def _tally(self, model: ModelConfig) -> SlotTally:
        tally = self.tallies.get(model.local_id)
        if tally is None:
            tally = self.tallies[model.local_id] = SlotTally()
        return tally

    # -- a request -------------------------------------------------------------------------------

    def session_of(self, call: Call) -> str | None:
        """``call``'s session as replica choice keys it (``routing.affinity_key``), or None."""
        return session_key(call, self.key_source)

    async def before_request(self, port: int, model: ModelConfig, session: str | None) -> None:
        """Before a request of ``session`` runs on the process at ``port``: restore its saved slot if
        one is kept for ``model``'s weights, and remember it as the process's last session.  Never
        raises."""
        if not self.enabled or not keeps_slots(model):
            return
        if session is None:
            self._last.pop(port, None)  # slot 0 will hold a prompt nobody can ask for again
            return
        key = (model.model_hash, session_hash(session))
        self._last[port] = (*key, _weights(model))
        kept = self.kept.pop(key, None)
        if kept is None:
            return
        tally = self._tally(model)
        try:
            code, answer = await self._post(port, "restore", kept.filename)
        except Exception as exc:
            tally.failed += 1
            log.warn("{model}: restoring a kept slot failed: {error}", model=model.local_id, error=repr(exc))
        else:
            if code == 200:
                tally.restored += 1
                tally.restored_bytes += _int(answer, "n_read")
                log.info("{model}: slot restored ({tokens} tokens)", model=model.local_id,
                         tokens=_int(answer, "n_restored"))
            elif code not in UNSUPPORTED:
                tally.failed += 1
                log.warn("{model}: the backend refused to restore a kept slot ({status}: {answer})",
                         model=model.local_id, status=code, answer=_message(answer))
        self._remove(os.path.join(self.folder, kept.filename))

    # -- a stop ----------------------------------------------------------------------------------

    def before_stop(self, model: ModelConfig, port: int) -> Deferred[None]:
        """The runtime slot's hook before it stops the process serving ``model`` at ``port`` (its users
        gone): save slot 0 as the last session's.  Fires when done; never fails."""
        last = self._last.pop(port, None)
        if not self.enabled or last is None:
            return succeed(None)
        model_hash, session, weights = last
        if model.model_hash != model_hash:
            # a process started before the catalog was hashed (a startup model) holds the unhashed
            # config: the weight file its last request named decides
            if model.model_hash or weights != _weights(model):
                return succeed(None)
            model = attrs.evolve(model, model_hash=model_hash)
        if not keeps_slots(model):
            return succeed(None)
        return Deferred.fromCoroutine(self._save(model, port, session))

    async def _save(self, model: ModelConfig, port: int, session: str) -> None:
        filename = slot_file_name(model.model_hash, session)
        tally = self._tally(model)
        try:
            code, answer = await self._post(port, "save", filename)
        except Exception as exc:
            tally.failed += 1
            log.warn("{model}: saving the slot before the stop failed: {error}", model=model.local_id,
                     error=repr(exc))
            return
        if code in UNSUPPORTED:
            log.info("{model}: the backend keeps no slots ({status})", model=model.local_id, status=code)
            return
        if code != 200:
            tally.failed += 1
            log.warn("{model}: the backend refused to save the slot ({status}: {answer})",
                     model=model.local_id, status=code, answer=_message(answer))
            return
        size = _int(answer, "n_written")
        tally.saved += 1
        tally.saved_bytes += size
        key = (model.model_hash, session)
        self.kept.pop(key, None)  # the same file, written again
        self.kept[key] = KeptSlot(model.model_hash, session, filename, size, self._now())
        self._bound()

    def _bound(self) -> None:
        """Drop the oldest saved slots (their files deleted) until both bounds hold."""
        while self.kept and (len(self.kept) > self.keep_count or self.kept_bytes > self.keep_bytes):
            _key, oldest = self.kept.popitem(last=False)
            self._remove(os.path.join(self.folder, oldest.filename))

    async def _post(self, port: int, action: str, filename: str) -> tuple[int, Any]:
        url = f"http://127.0.0.1:{port}/slots/{SLOT}?action={action}"
        response = await self.http.post(url, json={"filename": filename}, timeout=self.timeout_s)
        code = int(response.code)
        try:
            answer = await response.json()
        except Exception:
            answer = None
        return code, answer

    def rows(self) -> list[tuple[str, str, int, int, int, int, int]]:
        """(runtime, model, saved, restored, saved bytes, restored bytes, failed) per model (metrics)."""
        return [("text", model, t.saved, t.restored, t.saved_bytes, t.restored_bytes, t.failed)
                for model, t in sorted(self.tallies.items())]


def _weights(model: ModelConfig) -> str:
    return model.text_model or model.embeddings_model or ""


def _int(answer: Any, key: str) -> int:
    value = answer.get(key) if isinstance(answer, dict) else None
    return value if isinstance(value, int) and value >= 0 else 0


def _message(answer: Any) -> str:
    error = answer.get("error") if isinstance(answer, dict) else None
    message = error.get("message") if isinstance(error, dict) else None
    return message if isinstance(message, str) else repr(answer)[:200]


#: The folder under the node's data dir (``cluster.store_dir``) llama-server writes kept slots in.
FOLDER = "kv-slots"


def kv_slot_keeper(config: Config, http: SlotPoster, clock: Any) -> SlotKeeper | None:
    """The node's keeper (None when ``models.slot_keep_count`` is 0), its folder made and emptied of
    a previous run's files (the index of what they hold lived in that run's memory)."""
    models = config.models
    if models.slot_keep_count <= 0:
        return None
    folder = os.path.abspath(os.path.join(config.cluster.store_dir, FOLDER))
    os.makedirs(folder, exist_ok=True)
    for name in os.listdir(folder):
        if name.endswith(".bin"):
            _remove(os.path.join(folder, name))
    return SlotKeeper(http, folder, keep_count=models.slot_keep_count, keep_bytes=models.slot_keep_bytes,
                      clock=clock.seconds, key_source=config.routing.affinity_key)
