"""The shared contract of gpu-health: API group, kinds, field names and Node keys.

Agent, operator, simulator, chart and tests all name things through this
package, so a rename happens in one place. It imports no component.
"""

__version__ = "0.1.0"
