"""The gpu-health simulator: a local control plane, a simulated GPU fleet, the demo and backtests.

One sub-package per concern: `controlplane` (the local cluster), `fleet`
(the simulated GPU nodes and their agents), `backtest` (traces and their
replay through the operator) and `demo`, which uses the other three; `cli`
is the `gpu-health-sim` command, `waiting` and `watches` serve them all.

It may import every other gpu-health package (import-linter checks that
nothing imports it back): the fleet runs the real agent code with the
simulated NVML backend, and the demo runs the real operator as a process.
"""
