"""The parts ``routerd.node.Node`` is assembled from, one module per concern: what each role adds
(``roles``), the documents a node answers with (``documents``), its HTTP clients (``clients``), the
cost refit loop (``refit``) and the restore-after-borrow hooks fed by the node's own work
(``restore``).  They build and connect objects; they decide nothing.  The HTTP edge is put in front
of a node by ``routerd.api.app.build_site``, the one place in ``routerd.api`` that receives the node.
"""
