"""`kubectl gpuhealth`: day-2 answers from what gpu-health already keeps in the cluster.

`status` (the fleet at a glance), `why NODE` (facts → conditions → rule → action → Events),
`drill NODE CONDITION` (a fire drill), `pause|resume POLICY`. It reads GPUNodes,
GPUHealthPolicies, Nodes and Events, and writes only what the docs tell a human to write
(the drill annotation, `spec.dryRun`, the breaker-reset annotation). Nothing imports it.
"""
