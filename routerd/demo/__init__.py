"""routerd.demo: tools that run routerd, kept outside the daemon's packages.

:mod:`routerd.demo.launcher` is ``routerd-cluster``, a blocking launcher that
starts a master and two slaves on this machine as real ``twistd`` processes.
"""
