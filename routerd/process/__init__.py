"""What the running daemon process does for itself: readiness notification to systemd
(``notify``) and reload without a restart on ``SIGHUP`` or ``POST /router/v1/reload`` (``reload``)."""
