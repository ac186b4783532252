"""The simulated GPU fleet: kwok GPU Nodes, each with a real gpu-health agent, run against any cluster.

Fleet files (`fleetfile`, `names`) say which nodes exist; `nodes`, `dra` and
`baselines` give each its Node, DRA ResourceSlice and healthy readings;
`agents` builds one real agent per node and `agentpool` runs them all in one
process; `repairs` plays the operator's repair Jobs on the simulated nodes
(`defaults`: its namespace, which `gpu-health-sim run --help` shows).
"""
