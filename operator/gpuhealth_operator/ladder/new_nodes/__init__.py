"""Validation of new nodes before they take work."""
