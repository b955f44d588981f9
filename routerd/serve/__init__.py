"""The site's analytics and benchmark reads, on their way to ``routerd.site``.  The request path
lives in ``routerd.inference``, the HTTP clients in ``routerd.clients``."""
