"""The end-of-run table of ``spotwright simulate``."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table

from spotwright.model.durations import format_duration

__all__ = ["render_summary"]


def render_summary(summary: dict[str, Any], console: Console) -> None:
    cost = summary["cost"]
    nodes = summary["nodes"]
    intr = summary["interruptions"]
    pods = summary["pods"]
    table = Table(
        title=f"{summary['scenario']} (seed {summary['seed']}, "
        f"{format_duration(summary['simulated_seconds'])} simulated)",
        show_header=False,
        title_justify="left",
    )
    table.add_column("what", style="bold")
    table.add_column("value")
    table.add_row("cost", f"${cost['total_usd']:.2f}")
    table.add_row("on-demand equivalent", f"${cost['on_demand_equivalent_usd']:.2f}")
    table.add_row("savings", f"{cost['savings_pct']:.1f}%")
    launched = nodes["launched"]
    table.add_row(
        "nodes launched",
        f"{launched.get('spot', 0)} spot, {launched.get('on-demand', 0)} on-demand "
        f"(peak {nodes['peak']} at once)",
    )
    failures = summary["launch_failures"]
    table.add_row(
        "launch failures",
        ", ".join(f"{k} {v}" for k, v in failures.items()) if failures else "none",
    )
    table.add_row(
        "interruptions",
        f"{intr['notices']} notices, {intr['rebalance_recommendations']} rebalance recommendations",
    )
    table.add_row(
        "drains",
        f"{intr['drained_before_deadline']} before the deadline, "
        f"{intr['lost_before_drained']} lost before drained",
    )
    table.add_row("pods evicted / lost", f"{pods['evicted']} / {pods['lost']}")
    table.add_row("longest pending", f"{pods['max_pending_seconds']:.1f}s")
    table.add_row(
        "recovery p50 / p99",
        f"{pods['recovery_p50_seconds']:.1f}s / {pods['recovery_p99_seconds']:.1f}s",
    )
    if intr["nodes_with_pods_moved"]:
        table.add_row(
            "per notice p50 / p99",
            f"{pods['notice_recovery_p50_seconds']:.1f}s / "
            f"{pods['notice_recovery_p99_seconds']:.1f}s until its last pod was ready",
        )
        table.add_row(
            "replacement first",
            f"{intr['replaced_before_first_eviction']} of {intr['nodes_with_pods_moved']} "
            f"nodes; {pods['waited_for_node']} of {pods['moved']} pods waited for a node",
        )
    budgets = summary["disruption_budgets"]
    if budgets["by_budget"]:
        table.add_row(
            "below a PDB",
            f"{budgets['below_seconds']:.1f}s in {budgets['drops']} drop(s)"
            if budgets["drops"]
            else "never",
        )
    table.add_row("availability", f"{summary['availability_pct']:.3f}%")
    for name, group in summary.get("node_groups", {}).items():
        have, want, launched = group["nodes"], group["target"], group["launched"]
        table.add_row(
            f"node group {name}",
            f"{have['on-demand']} on-demand + {have['spot']} spot at the end "
            f"(target {want['on-demand']} + {want['spot']}); "
            f"launched {launched['on-demand']} on-demand, {launched['spot']} spot; "
            f"at target {group['at_target_pct']:.1f}% of the time",
        )
    console.print(table)
