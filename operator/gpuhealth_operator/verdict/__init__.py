"""Judging: which verdict a node deserves under each policy, and when its pass need not run again."""
