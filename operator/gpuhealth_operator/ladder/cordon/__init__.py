"""The cordon within the disruption budget, and what the fleet breakers decided."""
