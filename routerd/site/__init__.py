"""What a node does for its site: the master's work for the whole cluster, or a standalone node's for
its site of one (a slave has no site).

:mod:`routerd.site.service` holds the one master-only check, the one rule that runs an operation on
this node or on the named node (with the one mapping of a remote node's error) and the fan-out to
every node; beside it live the site halves of analytics (:mod:`~routerd.site.analytics`), benchmarks
(:mod:`~routerd.site.bench`), the lending reports (:mod:`~routerd.site.reports`), the admin records
(links, settings and guardians: :mod:`~routerd.site.links`, :mod:`~routerd.site.settings`,
:mod:`~routerd.site.guardians`, edited through :mod:`~routerd.site.records`), model assets
(:mod:`~routerd.site.assets`) and Cook on the node holding the files (:mod:`~routerd.site.cook`).
:mod:`routerd.site.testing` ships the fakes the tests build a site from.  The HTTP edge
(``routerd.api``) calls these with parsed input; nothing here sees an HTTP request or the node.
"""
