"""The operator's runtime: watches, handlers, priming, resync, the pass queue and passes, the timer, the
leader.
"""
