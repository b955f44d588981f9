"""How one ``routerd.node.Node`` is put together, in two phases: ``parts`` builds every part in
dependency order (each constructor takes what already exists; the catalog, store and config a node
replaces while it runs sit in the holders of ``current``), then ``wiring`` fills the references that
point forward in one visible block.  Beside them: what each role adds (``roles``), the documents a
node answers with (``documents``), its HTTP clients (``clients``), the reactions to own work,
settings and records (``reactions``), what lending reads of the local side (``ports``), the
restore-after-borrow hooks (``restore``), the cost refit loop (``refit``), start/drain/stop
(``lifecycle``) and the application of a reload (``reload``).  They build and connect objects; they
decide nothing.  Only this package and ``routerd.site`` (through ``routerd.edge.build_site``)
receive the node.
"""
