"""Node-to-node work: who may call what (bearer auth), the node HTTP client with its allow-list,
bounded fan-out to many nodes, the master's registration and health polling, and a slave's
registration loop."""
