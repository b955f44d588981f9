"""The cluster-wide model registry, pure: the records every node publishes merged on the master,
public-ID assignment across nodes, replica choice and reservation with busy counts, and split
recipes (one public model made of components on several nodes)."""
