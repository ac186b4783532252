"""`python -m gpuhealth_operator` runs the operator (same as `gpu-health-operator`)."""

from gpuhealth_operator.runtime import cli

cli.main()
