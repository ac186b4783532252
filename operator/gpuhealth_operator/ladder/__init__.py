"""The ladder: what the operator does to a node, one sub-package per step, carried out by `remediation`."""
