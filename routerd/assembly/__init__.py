"""The parts ``routerd.node.Node`` is assembled from, one module per concern: what each role adds
(``roles``), the documents a node answers with (``documents``) and the restore-after-borrow hooks
fed by the node's own work (``restore``).  They build and connect objects; they decide nothing.
"""
