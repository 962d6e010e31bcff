"""Which graphs the overlay owns, found again at update time by (role, batch descriptor).

Graphs are held weakly: when the runner drops a graph (sleep mode, recapture), its tasks go with it.
"""

from __future__ import annotations

import weakref
from typing import Any

from ascend_graph_patch.core.graph import OwnedGraph


class GraphRegistry:
    def __init__(self) -> None:
        self._owned: weakref.WeakKeyDictionary[Any, OwnedGraph] = weakref.WeakKeyDictionary()
        # (role, descriptor) -> {id(owner): weakref(graph)}; owner = the wrapper / manager.
        self._index: dict[tuple[str, Any], dict[int, weakref.ref]] = {}
        self.refused: dict[tuple[str, Any], str] = {}
        # (role, descriptor) -> (weakref(graph), weakref(owned)) when one owner holds the key;
        # weak on both sides, so the fast path never keeps a dead graph's tasks alive.
        self._fast: dict[tuple[str, Any], tuple[weakref.ref, weakref.ref]] = {}

    def register(self, owner: Any, graph: Any, owned: OwnedGraph) -> None:
        self._owned[graph] = owned
        slot = self._index.setdefault((owned.role, owned.descriptor), {})
        slot[id(owner)] = weakref.ref(graph)
        self.refused.pop((owned.role, owned.descriptor), None)
        self._fast.pop((owned.role, owned.descriptor), None)

    def refuse(self, owner: Any, role: str, descriptor: Any, reason: str) -> None:
        """Remember a graph left to stock (and drop any older owned graph of that owner/key)."""
        slot = self._index.get((role, descriptor))
        if slot is not None:
            slot.pop(id(owner), None)
        self.refused[(role, descriptor)] = reason
        self._fast.pop((role, descriptor), None)

    def lookup(self, role: str, descriptor: Any) -> OwnedGraph | None:
        """The one live owned graph for this key, or None (unknown or ambiguous: stock)."""
        key = (role, descriptor)
        fast = self._fast.get(key)
        if fast is not None and fast[0]() is not None:
            owned = fast[1]()
            if owned is not None:
                return owned
        slot = self._index.get(key)
        if not slot:
            return None
        alive = [(ref, g) for ref, g in ((r, r()) for r in slot.values()) if g is not None]
        if len(alive) != 1:
            return None
        owned = self._owned.get(alive[0][1])
        if owned is not None:
            self._fast[key] = (alive[0][0], weakref.ref(owned))
        return owned

    def graphs(self) -> list[OwnedGraph]:
        return list(self._owned.values())

    def clear(self) -> None:
        self._owned = weakref.WeakKeyDictionary()
        self._index.clear()
        self.refused.clear()
        self._fast.clear()


REGISTRY = GraphRegistry()
