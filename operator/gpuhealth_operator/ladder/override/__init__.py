"""Human overrides: a node someone uncordoned, and drain state tied to its cordon."""
