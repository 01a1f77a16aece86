"""Logs, metrics and Kubernetes Events: every action is seen three ways."""

from spotwright.observability.logs import LogFormat, configure_logging, get_logger
from spotwright.observability.metrics import Metrics

__all__ = ["LogFormat", "Metrics", "configure_logging", "get_logger"]
