"""The shared contract of gpu-health: API group, kinds, field names and Node keys.

Agent, operator, simulator, chart and tests all name things through this
package, so a rename happens in one place. It imports no component.
"""

# The one version of gpu-health (PEP 440; a development version between releases): the package
# metadata, image tag and chart read it; `hack/version.py check` (make release-check) checks the rest.
__version__ = "0.2.0.dev0"
