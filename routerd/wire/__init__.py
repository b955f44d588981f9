"""Wire vocabulary every layer may use: node documents (records, snapshot, runtime status) and
lending documents (links, leases, lanes, costs), each surface with its cattrs converter."""
