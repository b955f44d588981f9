"""The cluster's agents and shared rules: the master's health poller and registry sync
(``master``), a slave's registration loop (``slave``), bearer-token auth and the cluster
allow-list (``auth``), and fan-out of one node-API call to every healthy node (``fanout``).  The
node API client itself lives in ``routerd.clients.node_client``."""
