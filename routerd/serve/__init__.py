"""Serving inference calls: choose the model and node (``front``), serve on this node's own
backends (``local``), and the node's model administration (``admin``).  Below the HTTP edge: these
take a :class:`routerd.routing.call.Call` and answer through its ``Reply``."""
