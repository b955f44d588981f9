"""routerd.demo: tools that run routerd on this machine, kept outside the daemon's packages.

:mod:`~routerd.demo.configs` prepares the example configs purely (ports moved, paths anchored, the
plan of nodes); :mod:`~routerd.demo.launcher` is ``routerd-cluster``, a blocking launcher that starts a
master and two slaves as real ``twistd`` processes; :mod:`~routerd.demo.demo` is ``routerd demo``, the
same cluster with settings and traffic that show lending within a minute.
"""
