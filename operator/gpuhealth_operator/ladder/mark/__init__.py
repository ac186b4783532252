"""The Label and Taint actions: the node's health labels and the `gpuhealth.io/unhealthy` taint."""
