"""IsolateGPU: one GPU quarantined through a DRA device taint, its Kubernetes I/O and its sweep."""
