"""The simulator: the real controllers, a simulated spot market, a virtual clock."""

from spotwright.simulation.runner import EPOCH, simulate

__all__ = ["EPOCH", "simulate"]
