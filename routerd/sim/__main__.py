"""``python -m routerd.sim FAMILY [flags]``."""

from routerd.sim.cli import main

raise SystemExit(main())
