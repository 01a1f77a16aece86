"""The Kubernetes adapter: the Cluster port on a real API server, and leader election.

``client`` wraps lightkube (throttled, recorded calls, dict-shaped objects), ``convert``
turns API objects into the records the controllers read, ``informer`` keeps them cached,
``nodeclaims`` persists NodeClaims as custom resources, ``cluster`` implements the port,
``leader`` elects one active controller with a Lease, and ``kwok`` is the simulated cloud
whose instances are kwok-managed fake nodes.
"""
