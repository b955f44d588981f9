"""The inference request path below the HTTP edge: the front that executes the routing choice
(``front``, ``serving``, ``ending``), serving on this node's own backends (``local``, ``video``,
``keepalive``), split recipes (``recipes``), the node's own loads and explicit load/unload
(``own_loads``, ``admin``), and what a request leaves behind (``timing``, ``samples``,
``analytics``, ``memory``), plus the benchmark runner that drives the same path (``bench``).
These take a :class:`routerd.routing.call.Call` and answer through its ``Reply``."""
