"""Open claims indexed by the room their current type has left.

Filling that room costs nothing (the claim's price does not change), so before a claim
grows the packer looks for one that already holds the pod. Scanning every open claim
per pod is quadratic, and scanning only a few misses most of the room, so claims sit in
cells by how much CPU and memory they have free (powers of two of a small unit): a
query visits the cells that can hold the pod, tightest first, and checks exactly only
the claims in them.
"""

from __future__ import annotations

from collections.abc import Iterator

from spotwright.scheduling.candidates import Vec
from spotwright.scheduling.state import ClaimState

__all__ = ["FreeRoom"]

_CPU_UNIT = 50  # millicores
_MEM_UNIT = 64 * 2**20  # bytes
_TOP = 24


def _cell(cpu: int, mem: int) -> tuple[int, int]:
    return (min(_TOP, (cpu // _CPU_UNIT).bit_length()), min(_TOP, (mem // _MEM_UNIT).bit_length()))


class FreeRoom:
    """Claims with room for at least ``need`` on their current (cheapest fitting) type."""

    __slots__ = ("_order", "cells", "need")

    def __init__(self, need: Vec) -> None:
        self.need = need
        self.cells: dict[tuple[int, int], dict[int, ClaimState]] = {}
        self._order: list[tuple[int, int]] | None = None  # cells, tightest first

    def update(self, claim: ClaimState) -> None:
        """Re-file ``claim`` after its pods or type changed (or drop it when full)."""
        top, total, need = claim.cands.types[claim.idx].cap, claim.total, self.need
        free_cpu, free_mem = top[0] - total[0], top[1] - total[1]
        if claim.retired or free_cpu < need[0] or free_mem < need[1] or top[3] <= total[3]:
            self.remove(claim)
            return
        cell = _cell(free_cpu, free_mem)
        if cell == claim.cell:
            return
        self.remove(claim)
        members = self.cells.get(cell)
        if members is None:
            members = self.cells[cell] = {}
            self._order = None
        members[id(claim)] = claim
        claim.cell = cell

    def remove(self, claim: ClaimState) -> None:
        if claim.cell is None:
            return
        members = self.cells.get(claim.cell)
        if members is not None:
            members.pop(id(claim), None)
            if not members:
                del self.cells[claim.cell]
                self._order = None
        claim.cell = None

    def fitting(self, req: Vec) -> Iterator[ClaimState]:
        """Claims whose current type still holds ``req``, tightest cells first."""
        qc, qm = _cell(req[0], req[1])
        if self._order is None:
            self._order = sorted(self.cells, key=lambda k: (k[0] + k[1], k))
        cells = [k for k in self._order if k[0] >= qc and k[1] >= qm]
        for cell in cells:
            members = self.cells.get(cell)
            if not members:
                continue
            for claim in list(members.values()):
                top, total = claim.cands.types[claim.idx].cap, claim.total
                if (
                    top[0] - total[0] >= req[0]
                    and top[1] - total[1] >= req[1]
                    and top[3] - total[3] >= req[3]
                    and top[2] - total[2] >= req[2]
                    and top[4] - total[4] >= req[4]
                ):
                    yield claim
