"""The HTTP edge of one node assembled: :func:`build_site` puts every API class of ``routerd.api`` in
front of a node — the client API (contract §5, :mod:`~routerd.api.client_routes`), the node API (§6)
and the admin and site API (§7) — behind the access guard.

It sits above ``routerd.api`` and ``routerd.node``, so nothing in ``routerd.api`` receives or imports
the node: every API class is given only the collaborators it calls.  It builds the node's site
service (:class:`routerd.site.service.SiteService`) and hands each API class that service plus the
one domain service it calls.  Each API class declares its routes in a class-level
:class:`~routerd.api.routes.Routes` (path, methods, auth class, handler); a route parses the
request, calls one collaborator and answers.  Errors are raised as ``StatusError`` and answered by
the one handler in :mod:`routerd.api.errors`.
"""

from __future__ import annotations

from typing import Any

from routerd.api.admin_routes import AdminAPI
from routerd.api.analytics_routes import AnalyticsAPI
from routerd.api.assets_routes import AssetsAPI
from routerd.api.bench_routes import BenchAPI
from routerd.api.browser import browser_rules
from routerd.api.client_routes import ClientAPI
from routerd.api.cook_routes import CookAPI
from routerd.api.decisions_routes import DecisionsAPI
from routerd.api.dispatch import Dispatch
from routerd.api.guardians_routes import GuardiansAPI
from routerd.api.jobs_routes import JobsAPI
from routerd.api.links_routes import LinksAPI
from routerd.api.node_routes import NodeAPI
from routerd.api.offload_routes import OffloadAPI
from routerd.api.openapi import OpenAPI
from routerd.api.push_routes import PushAPI
from routerd.api.reload_routes import ReloadAPI
from routerd.api.settings_routes import SettingsAPI
from routerd.api.site import GuardResource, NodeSite
from routerd.api.webui import WebUI, webui_dir
from routerd.lending.bootstrap import PushedState
from routerd.lending.reports import LendingReports
from routerd.node import Node
from routerd.site.assets import SiteAssets
from routerd.site.cook import Kitchen
from routerd.site.records import SiteRecords
from routerd.site.service import SiteService
from routerd.wire.records import PROTOCOL_VERSION

__all__ = ["PROTOCOL_VERSION", "build_apis", "build_site"]


def build_apis(node: Node) -> list[Any]:
    """Every API class of the node, each built from the site service and the one domain service it
    calls (read per request where a reload or the store's opening replaces it)."""
    cluster = node.config.cluster
    site = SiteService(node.node_id, node.site, node.role,
                       master_url=cluster.master_url if node.role == "slave" else None)
    records = SiteRecords(site, node.lending, store=lambda: node.store, catalog=lambda: node.catalog)
    reports = LendingReports(node.node_id, node.lending, store=lambda: node.store,
                             coordinator=node.coordinator)
    assets = SiteAssets(site, node.assets, file_roots=lambda: node.config.models.file_roots,
                        run_in_thread=node.run_in_thread)
    return [
        ClientAPI(node_id=node.node_id, role=node.role, front=node.front, listing=node.listing,
                  image_listing=node.image_listing,
                  metrics=node.metrics.render, phase=lambda: node.phase,
                  ollama_control=node.ollama_control, jobs=node.jobs),
        JobsAPI(node.jobs),
        NodeAPI(site=site, documents=node.documents, admin=node.admin),
        AssetsAPI(site=site, assets=assets),
        OffloadAPI(coordinator=node.coordinator, lending=node.lending, tracer=node.tracer),
        PushAPI(site=site, pushed=PushedState(node.lending, store=lambda: node.store)),
        DecisionsAPI(site=site, reports=reports),
        AnalyticsAPI(site=site, analytics=node.analytics),
        BenchAPI(site=site, bench=node.bench),
        AdminAPI(site=site, documents=node.documents, admin=node.admin),
        LinksAPI(records),
        SettingsAPI(records),
        ReloadAPI(node.reloader),
        GuardiansAPI(records),
        CookAPI(site=site, kitchen=Kitchen(node.node_id, lambda: node.config, node.reloader, node.recipes)),
        WebUI(webui_dir()),
        OpenAPI(),
    ]


def build_site(node: Node) -> NodeSite:
    """The listening site of ``node``: body limit and access guard, then every API class."""
    apis = build_apis(node)
    limit = node.config.limits.max_body_bytes
    dispatch = Dispatch(apis)  # dispatch.route_class: the auth class of a path, from the declared routes
    guard = GuardResource(dispatch, node.policy, limit, node.config.server.cors_origins,
                          lambda: node.phase, node.config.server, browser_rules(node.config))
    site = NodeSite(guard, limit, node.config.limits.replay_buffer_bytes)
    node.reloader.on_applied.append(lambda config: guard.update(node.policy, site, config))
    return site
