"""The two ways the real-cluster tier fails to come up, kept apart from the launcher's parts
so that certificates, command lines, process supervision and the facade all raise the same
classes: a host that cannot run the tier is a reason to skip, a component that misbehaves
is a bug to look at.
"""

from __future__ import annotations


class ClusterUnavailable(RuntimeError):
    """The tier cannot run here; ``str(exc)`` is a one-line reason suitable for a skip."""


class ClusterStartError(RuntimeError):
    """A component failed to start or become healthy; the message carries its log tail."""
