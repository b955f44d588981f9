"""The node API's paths (``/router/v1/node/…``, cluster token): the one place they are spelled.

The HTTP edge declares its node routes with these names (``routerd/api/*_routes.py``) and every
client that calls another node (the cluster client, the master's poller and the slave's sync, the
lending transport and coordinator, forwarding, the site's fan-outs, asset pulls) builds its URLs
from the same names, so a route and its callers cannot drift apart.  Plain strings, no imports:
every layer may read them.
"""

from __future__ import annotations

#: The node API's namespace: every path under it needs the cluster token.
NODE_PREFIX = "/router/v1/node"

# -- cluster membership and the node's documents ------------------------------------------
NODE_REGISTER = NODE_PREFIX + "/register"
NODE_MODELS = NODE_PREFIX + "/models"
NODE_RUNTIME_STATUS = NODE_PREFIX + "/runtime-status"
NODE_STATE = NODE_PREFIX + "/state"
NODE_LOAD = NODE_PREFIX + "/load"
NODE_UNLOAD = NODE_PREFIX + "/unload"

# -- inference a master forwards to the node that serves it ------------------------------
#: ``<INFERENCE_PREFIX><client path>``: a client path answered by this node for a master.
INFERENCE_PREFIX = NODE_PREFIX + "/inference"

# -- lending -------------------------------------------------------------------------------
#: An owner's lane events to the master.
EVENT_PATH = NODE_PREFIX + "/offload/event"
#: An owner's request relayed through the master to its helper.
RELAY_PATH = NODE_PREFIX + "/offload/request"
#: The master's lease grant pushed to an owner.
GRANT_PATH = NODE_PREFIX + "/offload/grant"
#: The borrowed work a helper holds (the stall check asks it).
BORROWED_PATH = NODE_PREFIX + "/offload/borrowed"
#: The lending links and settings a master pushes to every node.
LINKS_PATH = NODE_PREFIX + "/offload/links"
SETTINGS_PATH = NODE_PREFIX + "/offload/settings"
NODE_DECISIONS = NODE_PREFIX + "/offload/decisions"
NODE_SUMMARY = NODE_PREFIX + "/offload/summary"

# -- analytics and benchmarks --------------------------------------------------------------
NODE_ANALYTICS = NODE_PREFIX + "/analytics"
NODE_ANALYTICS_FLUSH = NODE_PREFIX + "/analytics/flush"
NODE_RECENT = NODE_PREFIX + "/analytics/recent"
NODE_REQUESTS = NODE_PREFIX + "/requests"
NODE_REQUEST_BODY = NODE_PREFIX + "/requests/body"
NODE_LOAD_ERRORS = NODE_PREFIX + "/load-errors"
NODE_BENCH_RUN = NODE_PREFIX + "/benchmarks/run"
NODE_BENCH_LIST = NODE_PREFIX + "/benchmarks"

# -- model assets and recipes --------------------------------------------------------------
#: ``<ASSET_PREFIX><sha256>``: one asset's bytes.
ASSET_PREFIX = NODE_PREFIX + "/assets/"
NODE_ASSETS_STATE = NODE_PREFIX + "/assets/state"
LOOKUP_PATH = NODE_PREFIX + "/assets/lookup"
LOOKUP_CLUSTER_PATH = NODE_PREFIX + "/assets/lookup-cluster"
#: The node half of the site's model-asset operations (``<NODE_ASSET_OPS>/<op>``, ``…/jobs``).
NODE_ASSET_OPS = NODE_PREFIX + "/site/model-assets"
NODE_MODEL_FILES_HASH = NODE_PREFIX + "/site/model-files/hash"
#: The node half of the site's recipe cooking (``<NODE_COOK>/files|preview|apply|delete``).
NODE_COOK = NODE_PREFIX + "/cook"

#: The node routes the lean HTTP channel serves (exact paths, and the forwarding prefix): the peer
#: client sends these on its lean pool (the route table's lean routes under the node API).
LEAN_PATHS = (INFERENCE_PREFIX + "/", EVENT_PATH, GRANT_PATH, RELAY_PATH)

__all__ = [
    "ASSET_PREFIX", "BORROWED_PATH", "EVENT_PATH", "GRANT_PATH", "INFERENCE_PREFIX", "LEAN_PATHS",
    "LINKS_PATH",
    "LOOKUP_CLUSTER_PATH", "LOOKUP_PATH", "NODE_ANALYTICS", "NODE_ANALYTICS_FLUSH", "NODE_ASSETS_STATE",
    "NODE_ASSET_OPS", "NODE_BENCH_LIST", "NODE_BENCH_RUN", "NODE_COOK", "NODE_DECISIONS", "NODE_LOAD",
    "NODE_LOAD_ERRORS", "NODE_MODELS", "NODE_MODEL_FILES_HASH", "NODE_PREFIX", "NODE_RECENT", "NODE_REQUESTS",
    "NODE_REQUEST_BODY",
    "NODE_REGISTER", "NODE_RUNTIME_STATUS", "NODE_STATE", "NODE_SUMMARY", "NODE_UNLOAD", "RELAY_PATH",
    "SETTINGS_PATH",
]
