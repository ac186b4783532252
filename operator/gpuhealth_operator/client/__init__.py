"""The Kubernetes client and the requests the operator makes with it: Nodes, Events, evictions, status."""
