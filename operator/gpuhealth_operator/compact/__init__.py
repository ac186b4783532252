"""How the cache holds many nodes' facts in little memory: read-only records in slots, one copy of each
value many GPUs and nodes hold alike.
"""
