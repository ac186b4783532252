"""Pure decision logic: conditions, health, stragglers, rule selection and budgets.

Nothing here does I/O or imports kopf or a Kubernetes client; every function
takes plain data and the clock (`now`) and returns plain data, so it can be
tested table-driven and with hypothesis, and replayed after a restart from
the state the cluster holds.
"""
