"""The rack at a glance: each node's host, GPUs and runtimes, read at the master's health poll
(:mod:`routerd.telemetry.collector`), and the rules that say which of them needs attention
(:mod:`routerd.telemetry.attention`)."""
