"""Degraded topology domains: judged, their nodes marked, said."""
