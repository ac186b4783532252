"""The operator's memory of the cluster between events: the cache, the agents' pods, the cohorts, budgets
and breakers at run time.
"""
