"""What every part of the operator shares: the context, the settings, the metrics."""
