"""What the lending route tests build the routes from, and an in-memory HTTP client for them.

The routes run behind ``treq.testing.StubTreq``; the site is ``routerd.site.testing``'s (its registry
returns hand-made records); the store is a real in-memory ``Store``; the lending object records
every call.
"""

from __future__ import annotations

import json
from typing import Any, TypeVar

import attrs
from treq.testing import StubTreq

from routerd.api import guardians_routes, links_routes, push_routes, settings_routes
from routerd.api.dispatch import Dispatch
from routerd.catalog.model import Capabilities, ModelConfig
from routerd.config.lending import LendingSettings
from routerd.lending.bootstrap import PushedState
from routerd.lending.links import LinkSet
from routerd.routing.guardians import GuardianSet
from routerd.site.records import SiteRecords
from routerd.site.service import SiteService
from routerd.site.testing import agent_of, fake_site
from routerd.store.store import Store
from routerd.wire.records import ModelRecord

T = TypeVar("T")

MASTER = "master"




def record(node_id: str, local_id: str, *, model_hash: str = "", llm: bool = True, context: int = 4096,
           multimodal: bool = False, image_id: str | None = None, config_hash: str = "") -> ModelRecord:
    caps = Capabilities(llm=llm, image=image_id is not None, multimodal=multimodal,
                        context=context if llm else 0)
    return ModelRecord(local_id=local_id, public_id=local_id, image_id=image_id, public_image_id=image_id,
                       filename=f"{local_id}.kcpps", node_id=node_id, node_url=f"http://{node_id}:1",
                       config_hash=config_hash or f"cfg-{node_id}-{local_id}", model_hash=model_hash,
                       capabilities=caps)


def config_of(rec: ModelRecord, **changes: Any) -> ModelConfig:
    """The catalog config matching one of the master's own records (with ``changes``)."""
    return ModelConfig(local_id=rec.local_id, filename=rec.filename, path=f"/models/{rec.filename}",
                       backend_mode="llama_sdcpp", capabilities=rec.capabilities,
                       config_hash=rec.config_hash, model_hash=rec.model_hash, **changes)


@attrs.define
class FakeCatalog:
    configs: dict[str, ModelConfig] = attrs.Factory(dict)

    def get(self, local_id: str) -> ModelConfig | None:
        return self.configs.get(local_id)


@attrs.define
class FakeLending:
    """Records every seam call the routes make."""

    config_settings: LendingSettings = attrs.Factory(LendingSettings)
    settings: LendingSettings = attrs.Factory(LendingSettings)
    installed: list[tuple[LinkSet, LinkSet]] = attrs.Factory(list)
    applied: list[LendingSettings] = attrs.Factory(list)
    pushes: int = 0  # guardian edits push
    refreshes: int = 0  # link and settings edits push and re-plan


    guardians: GuardianSet = attrs.Factory(GuardianSet)

    def install_links(self, image: LinkSet, text: LinkSet) -> None:
        self.installed.append((image, text))

    def install_guardians(self, guardians: GuardianSet) -> None:
        self.guardians = guardians

    def apply_settings(self, settings: LendingSettings) -> None:
        self.applied.append(settings)
        self.settings = settings

    async def push(self) -> None:
        self.pushes += 1

    async def refresh(self) -> None:
        self.refreshes += 1


@attrs.define
class Parts:
    """What the lending routes are built from on node ``node_id``: its site, store, catalog and lending."""

    node_id: str = MASTER
    store: Store | None = attrs.Factory(Store.open_sync)
    site: SiteService = attrs.Factory(lambda self: fake_site(self.node_id), takes_self=True)
    catalog: FakeCatalog = attrs.Factory(FakeCatalog)
    lending: FakeLending = attrs.Factory(FakeLending)

    @classmethod
    def slave(cls, node_id: str = "slave-a") -> Parts:
        return cls(node_id=node_id, site=fake_site(node_id, role="slave"))

    def add(self, *records: ModelRecord) -> None:
        agent_of(self.site).registry.models.extend(records)

    def add_nodes(self, *node_ids: str) -> None:
        for node_id in node_ids:
            agent_of(self.site).registry.add_node(node_id)


class Client:
    """Synchronous JSON calls against the lending route sets (links, settings, push, guardians)."""

    def __init__(self, node: Parts) -> None:
        records = SiteRecords(node.site, node.lending, store=lambda: node.store, catalog=lambda: node.catalog)
        pushed = PushedState(node.lending, store=lambda: node.store)
        apis = [links_routes.LinksAPI(records), settings_routes.SettingsAPI(records),
                push_routes.PushAPI(site=node.site, pushed=pushed),
                guardians_routes.GuardiansAPI(records)]
        self.stub: Any = StubTreq(Dispatch(apis))  # its request methods are built at run time

    def call(self, method: str, path: str, body: Any = None, *, raw: bytes | None = None,
             params: dict[str, str] | None = None) -> tuple[int, Any]:
        data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
        out: list[Any] = []

        def answered(response: Any) -> Any:
            out.append(response.code)
            return response.content()

        d = self.stub.request(method, "http://node" + path, data=data, params=params,
                              headers={b"content-type": [b"application/json"]})
        d.addCallback(answered).addCallback(out.append)
        d.addErrback(out.append)
        self.stub.flush()
        assert len(out) == 2, out
        content = out[1]
        return int(out[0]), json.loads(content) if content else None

    def get(self, path: str, **params: str) -> tuple[int, Any]:
        return self.call("GET", path, params=params or None)

    def post(self, path: str, body: Any = None, *, raw: bytes | None = None) -> tuple[int, Any]:
        return self.call("POST", path, body, raw=raw)

    def delete(self, path: str, **params: str) -> tuple[int, Any]:
        return self.call("DELETE", path, params=params or None)
