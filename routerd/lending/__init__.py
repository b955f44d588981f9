"""Backlog lending: owners lend queued requests to helpers, on leases the master plans.

The pure core decides: the lane queue and its waiting line (``queue``, ``waiting_line``,
``priority``), the lease planner on arrays (``planner``, ``plan_lane``, ``plan_columns``), cost
fits (``pricing``), links and their layering, the hold and cut-off rules, and the offload wire
headers.  The shell performs: the node's lending service on the owner's request path
(``service``, ``waiting``, ``watch``) and as helper (``helper_side``), its queue events to the
master (``events``, ``transport``), the master's coordinator and relay (``coordinator``,
``stall_check``), the decision log, restore, and the node's lending reports (the site's link,
settings and guardian editors live in ``routerd.site``).
"""
