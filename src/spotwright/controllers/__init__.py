"""The controllers: written once against the ports, run live and in simulation alike."""

from spotwright.controllers.context import Context, NodePoolSource, Settings
from spotwright.controllers.garbage_collection import GarbageCollector
from spotwright.controllers.interruption import InterruptionHandler
from spotwright.controllers.nodeclaims import NodeClaimLifecycle
from spotwright.controllers.provisioning import Provisioner
from spotwright.controllers.termination import Terminator
from spotwright.controllers.unavailable import UnavailableOfferings

__all__ = [
    "Context",
    "GarbageCollector",
    "InterruptionHandler",
    "NodeClaimLifecycle",
    "NodePoolSource",
    "Provisioner",
    "Settings",
    "Terminator",
    "UnavailableOfferings",
]
