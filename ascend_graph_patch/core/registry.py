"""Which graphs the overlay owns, found again at update time.

The update seam is not told which graph it updates, only the role and the batch descriptor, and
an engine or drafter rebuilt in one process leaves its old graphs alive until the cyclic garbage
collector runs (vllm-ascend's proposer holds a reference cycle to its graph wrapper). So each
owned graph is filed under (role, descriptor) *and* its owner (the graph wrapper, or the v2
manager), in registration order, and found again by:

- the owner that just replayed it, when the caller knows it (the replay aspects note it): exact;
- otherwise (the ENPU order updates before it replays) the newest live graph for the key: the one
  the current engine captured.

Everything is held weakly: when the runner drops a graph (sleep mode, recapture, a rebuilt
engine), its tasks go with it.
"""

from __future__ import annotations

import weakref
from typing import Any

from ascend_graph_patch.core.graph import OwnedGraph


def _tokens(descriptor: Any) -> Any:
    """The cheap part of a batch descriptor (v1 and v2 descriptors both carry num_tokens)."""
    return getattr(descriptor, "num_tokens", descriptor)


def _same(a: Any, b: Any) -> bool:
    """Descriptor equality; their field dicts compare in C where the dataclass __eq__ does not."""
    try:
        return type(a) is type(b) and a.__dict__ == b.__dict__
    except AttributeError:  # slotted: the type's own equality
        return bool(a == b)


def _ref(owner: Any) -> Any:
    try:
        return weakref.ref(owner)
    except TypeError:  # an owner without weak references: identity is all we have
        return lambda owner=owner: owner


class GraphRegistry:
    def __init__(self) -> None:
        self._owned: weakref.WeakKeyDictionary[Any, OwnedGraph] = weakref.WeakKeyDictionary()
        # (role, num_tokens) -> [(descriptor, [(weakref(owner), weakref(graph), weakref(owned))])]
        # with the entries oldest first. Descriptors hash and compare in Python (dataclasses):
        # the int key finds the few candidates, identity (the dispatcher hands out the
        # descriptors it captured with) or equality picks one.
        self._index: dict[tuple[str, Any], list[tuple[Any, list[tuple[Any, Any, Any]]]]] = {}
        #: (role, descriptor) -> why the newest graph captured for it was left to stock
        self.refused: dict[tuple[str, Any], str] = {}
        #: role -> (descriptor, whether no owner was given, entry) of its last lookup: a step
        #: that replays the size the previous one did (the dispatcher hands out the same
        #: descriptor object) skips the index. Only weak references to owners and graphs, as in
        #: the index; any registration or refusal forgets them
        self._last: dict[str, tuple[Any, bool, tuple[Any, Any, Any]]] = {}

    def register(self, owner: Any, graph: Any, owned: OwnedGraph) -> None:
        self._last.clear()
        key = (owned.role, owned.descriptor)
        entries = self._live(key)
        entries[:] = [e for e in entries if e[0]() is not owner]  # a recapture replaces
        entries.append((_ref(owner), weakref.ref(graph), weakref.ref(owned)))
        self._owned[graph] = owned
        self.refused.pop(key, None)

    def refuse(self, owner: Any, role: str, descriptor: Any, reason: str) -> None:
        """Remember a graph left to stock (and drop that owner's older graph for the key)."""
        self._last.clear()
        key = (role, descriptor)
        entries = self._live(key)
        entries[:] = [e for e in entries if e[0]() is not owner]
        self.refused[key] = reason

    def _entries(self, role: str, descriptor: Any) -> list[tuple[Any, Any, Any]] | None:
        for known, entries in self._index.get((role, _tokens(descriptor)), ()):
            if known is descriptor or _same(known, descriptor):
                return entries
        return None

    def _live(self, key: tuple[str, Any]) -> list[tuple[Any, Any, Any]]:
        role, descriptor = key
        entries = self._entries(role, descriptor)
        if entries is None:
            entries = []
            self._index.setdefault((role, _tokens(descriptor)), []).append((descriptor, entries))
        entries[:] = [e for e in entries if e[1]() is not None and e[0]() is not None]
        return entries

    def lookup(self, role: str, descriptor: Any, owner: Any = None) -> OwnedGraph | None:
        """The owned graph for this key: ``owner``'s if given, else the newest live one."""
        last = self._last.get(role)
        if last is not None and last[0] is descriptor and last[1] is (owner is None):
            owner_ref, graph_ref, owned_ref = last[2]
            live_owner = owner_ref()
            if (
                live_owner is not None
                and (owner is None or live_owner is owner)
                and graph_ref() is not None
            ):
                return owned_ref()  # type: ignore[no-any-return]
        entries = self._entries(role, descriptor)
        if not entries:
            return None
        for entry in reversed(entries):
            owner_ref, graph_ref, owned_ref = entry
            live_owner = owner_ref()
            if live_owner is None or (owner is not None and live_owner is not owner):
                continue
            if graph_ref() is not None:
                self._last[role] = (descriptor, owner is None, entry)
                return owned_ref()  # type: ignore[no-any-return]
        return None

    def live_owners(self, role: str, descriptor: Any) -> int:
        """How many owners have a live owned graph for this key (more than one: a rebuild)."""
        return len(self._live((role, descriptor)))

    def graphs(self) -> list[OwnedGraph]:
        return list(self._owned.values())

    def clear(self) -> None:
        self._last.clear()
        self._owned = weakref.WeakKeyDictionary()
        self._index.clear()
        self.refused.clear()


REGISTRY = GraphRegistry()
