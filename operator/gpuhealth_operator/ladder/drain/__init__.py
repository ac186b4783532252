"""A node's drain as an action over time."""
