"""Repair: drained → step Job → effect → validation → return or retire, with its Jobs, the agent's release
and the operands.
"""
