"""How the cache holds many nodes' facts in little memory: slotted records, interned values, shared
conditions.
"""
