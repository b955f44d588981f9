"""The node's backend processes: the runtime slots that start, switch, lease and stop them
(``slot``, ``slot_load``, ``slot_state``), the processes themselves (``process``), the readiness
probes (``readiness``), the node's runtimes across families with the one-family-at-a-time rule
(``runtimes``), ``--check`` of the family binaries (``check``), and the backend families as plug-ins
(``families``: one module per family and their registry).  ``testing`` ships the fakes (launcher,
backend HTTP) the tests drive slots with.
"""
