"""The gpu-health simulator: a local control plane, a simulated GPU fleet and the demo.

It may import every other gpu-health package (import-linter checks that
nothing imports it back): the fleet runs the real agent code with the
simulated NVML backend, and the demo runs the real operator as a process.
"""
