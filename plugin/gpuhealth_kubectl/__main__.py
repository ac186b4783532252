"""`python -m gpuhealth_kubectl` runs the plugin, as the console script `kubectl-gpuhealth` does."""

import sys

from gpuhealth_kubectl.cli import main

sys.exit(main())
