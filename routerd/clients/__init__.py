"""The node's HTTP clients: the lean keep-alive client for its own backend processes
(``backend_http``), the same client for other nodes' lean routes and control calls (``peer_http``),
and the node API client with its allow-list, redirect and body-size rules (``node_client``)."""
