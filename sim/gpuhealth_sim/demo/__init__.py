"""`gpu-health-sim demo`: the local control plane, a faulty simulated fleet and the operator, shown live.

`walkthrough` runs the demo from start to end; `workload` is its training
job; `record`, `live` and `view` follow and draw what the cluster shows;
`summary` closes it per node; `demotrace` backtests the demo's own run;
`defaults` holds what `gpu-health-sim demo --help` shows.
"""
