"""The capacity ledger: what each node has left once Reservations in handover are counted.

kube-scheduler charges a node for every pod bound to it, placeholders included, so a
Reservation's capacity is safe while its placeholder lives. In the handover (DESIGN §2,
step 6) the controller records the owner, deletes the placeholder, and only then
ungates the owner; meanwhile the scheduler sees the capacity as free. From the moment an
owner is recorded the ledger charges the capacity to the Reservation itself until an owner
is bound, so that the extender can hold it for the owner.

It is fed by informer events (`on_node`, `on_pod`, `on_reservation`) and keeps per-node
sums up to date as they arrive, so every question is a few dict lookups whatever the size
of the cluster. A placeholder is an ordinary bound pod here; while a Reservation in
handover still has one in this cache, the two are the same capacity and count once.

A pod is a placeholder only if it is the one its Reservation records, as
`protocol.is_placeholder_of` decides: its controller reference names a Reservation this
ledger holds (name and UID), it runs in that Reservation's placeholder namespace, and its
UID is the one the controller recorded on the Reservation. A label, a hand-made owner
reference, or a reference to a Reservation not (yet) seen makes a pod an ordinary one.
Pods are charged again when the Reservation they name arrives, changes its record or goes.

Pure data structure: no I/O. Objects are the API server's dicts.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Set
from dataclasses import dataclass

from berth import protocol
from berth.api import ReservationPhase
from berth.protocol import Object
from berth.resources import (
    POD_SLOT,
    Resources,
    add,
    maximum,
    node_charge,
    parse_resources,
    resize_reported,
    subtract,
)
from berth.scheduling import HostPort, host_ports

DELETED = "DELETED"


@dataclass(frozen=True)
class PodEntry:
    """What the ledger remembers of a pod."""

    name: str
    """`namespace/name`, for messages."""
    node: str | None
    """The node it is bound to."""
    requests: Resources
    """Its effective requests and its pod slot, as the scheduler charges them."""
    claim: protocol.Placeholder | None
    """What the pod says it is (`protocol.placeholder_claim`): a Reservation's placeholder."""
    terminal: bool
    """Succeeded or Failed: it holds nothing any more."""
    generation: int | None = None
    """The pod's metadata.generation, which the API server bumps on every change of its
    spec (resizes included; not the binding, which only sets spec.nodeName): while it
    stays, and `reported` too, so do the requests."""
    reported: tuple[object, ...] = ()
    """What of its status the requests depend on (`resources.resize_reported`): the
    kubelet's account of a resize in place."""

    @property
    def charged_node(self) -> str | None:
        """The node whose capacity it uses."""
        return None if self.terminal else self.node


@dataclass(frozen=True)
class _Reservation:
    """An Available Reservation: the only phase that holds capacity or gives privileges."""

    node: str
    owners: frozenset[str]
    held: Resources
    ports: frozenset[HostPort]
    """The host ports of its template, which its placeholder took on the node."""


def held_by(reservation: Object) -> Resources:
    """What a Reservation holds: `status.allocatable` as recorded by the controller, else
    the effective requests of its template, which is what its placeholder was built from;
    and the pod slot its placeholder took."""
    allocatable = reservation.get("status", {}).get("allocatable")
    if allocatable:
        return {**POD_SLOT, **parse_resources(allocatable)}
    template = reservation.get("spec", {}).get("template") or {}
    return node_charge(template.get("spec") or {})


class Ledger:
    """Per-node capacity, kept up to date from watch events."""

    def __init__(self) -> None:
        self._allocatable: dict[str, Resources] = {}
        self._bound: dict[str, Resources] = {}
        self._bound_placeholders: dict[str, Resources] = {}
        self._pods: dict[str, PodEntry] = {}  # by UID
        self._uids: dict[str, str] = {}  # namespace/name -> UID, for replaced pods
        self._live_placeholders: dict[str, set[str]] = {}  # Reservation -> pod UIDs
        self._reservations: dict[str, _Reservation] = {}  # Available ones, by name
        self._owners: dict[str, str] = {}  # owner pod UID -> Reservation name
        self._handover: dict[str, dict[str, Resources]] = {}  # node -> Reservation -> held
        self._handover_node: dict[str, str] = {}  # Reservation -> node
        self._records: dict[str, protocol.Placeholder] = {}  # Reservation -> its placeholder
        self._recorded_uids: dict[str, str] = {}  # recorded placeholder's UID -> Reservation
        self._naming: dict[str, set[str]] = {}  # Reservation -> UIDs of pods that name it
        self._placeholder_of: dict[str, str] = {}  # pod UID -> Reservation, as charged
        # Reservation -> the most its placeholders were charged (a runtime class's
        # overhead included, which status.allocatable leaves out), kept once they are
        # gone: what the Reservation holds in handover is at least that.
        self._placeholder_charged: dict[str, Resources] = {}

    # ----- events ---------------------------------------------------------------------

    def on_node(self, kind: str, node: Object) -> None:
        name = node["metadata"]["name"]
        if kind == DELETED:
            self._allocatable.pop(name, None)
        else:
            self._allocatable[name] = parse_resources(node.get("status", {}).get("allocatable"))

    def on_pod(self, kind: str, pod: Object) -> None:
        metadata = pod["metadata"]
        key = f"{metadata.get('namespace')}/{metadata['name']}"
        old_uid = self._uids.get(key)
        held = self._pods[old_uid] if old_uid is not None and old_uid == metadata["uid"] else None
        entry = None if kind == DELETED else _entry(key, pod, held)
        if held is not None and held == entry:
            return  # a change of its status or metadata that charges nothing anew
        touched: set[str | None] = set()
        # A pod counts once, by UID; a pod recreated under the same name replaces it.
        if old_uid is not None:
            del self._uids[key]
            old = self._pods.pop(old_uid)
            touched |= {self._placeholder_of.get(old_uid), self._owners.get(old_uid)}
            self._uncharge(old_uid, old)
        if entry is not None:
            uid = str(metadata["uid"])
            self._pods[uid] = entry
            self._uids[key] = uid
            self._charge(uid, entry)
            touched |= {self._placeholder_of.get(uid), self._owners.get(uid)}
        for name in touched:
            if name is not None:
                self._refresh(name)

    def on_reservation(self, kind: str, reservation: Object) -> None:
        name = reservation["metadata"]["name"]
        old = self._reservations.pop(name, None)
        if kind == DELETED:
            self._placeholder_charged.pop(name, None)
        for uid in old.owners if old else ():
            if self._owners.get(uid) == name:
                del self._owners[uid]
        record = None if kind == DELETED else protocol.recorded_placeholder(reservation)
        if record != self._records.get(name):
            self._rerecord(name, record)
        node = protocol.node_of(reservation)
        if kind != DELETED and node and protocol.phase(reservation) == ReservationPhase.AVAILABLE:
            owners = frozenset(protocol.owner_uids(reservation))
            template = (reservation.get("spec") or {}).get("template") or {}
            self._reservations[name] = _Reservation(
                node=node,
                owners=owners,
                held=held_by(reservation),
                ports=host_ports(template.get("spec") or {}),
            )
            for uid in owners:
                self._owners[uid] = name
        self._refresh(name)

    # ----- questions ------------------------------------------------------------------

    def allocatable(self, node: str) -> Resources | None:
        """The node's allocatable resources; None for a node the ledger has not seen."""
        return self._allocatable.get(node)

    def free(self, node: str, *, for_reservation: str | None = None) -> Resources | None:
        """Allocatable minus the pods bound there and the Reservations in handover there.
        For the owner of `for_reservation`, what that Reservation holds is free: neither
        it nor its placeholders, while this cache still sees them, are taken away."""
        allocatable = self._allocatable.get(node)
        if allocatable is None:
            return None
        free = subtract(allocatable, self._bound.get(node, {}))
        if for_reservation is not None:
            free = add(free, self._placeholder_charge(for_reservation, node))
        for name, held in self._handover.get(node, {}).items():
            if name == for_reservation:
                continue
            # Its placeholder, while this cache still sees it, is the same capacity: once.
            free = add(subtract(free, held), self._placeholder_charge(name, node))
        return free

    def frozen_free(self) -> FreeCapacity:
        """Every node's `free` capacity as it is now, as it stays: later events change the
        ledger, never the mapping returned, which may be read from another thread. Costs
        a copy of two dicts, and `free` of the nodes with a Reservation in handover (the
        per-node sums are only ever replaced, never changed in place)."""
        return FreeCapacity(
            dict(self._allocatable),
            dict(self._bound),
            {node: free for node in self._handover if (free := self.free(node)) is not None},
        )

    def _placeholder_charge(self, reservation: str, node: str) -> Resources:
        """What the Reservation's placeholders still bound to `node` are charged there."""
        charge: Resources = {}
        for uid in self._live_placeholders.get(reservation, ()):
            entry = self._pods.get(uid)
            if entry is not None and entry.charged_node == node:
                charge = add(charge, entry.requests)
        return charge

    def handover(self, node: str) -> Mapping[str, Resources]:
        """The Reservations in handover on the node, with what each holds."""
        return self._handover.get(node, {})

    def held_ports(self, reservation: str) -> frozenset[HostPort]:
        """The host ports a Reservation in handover holds: its placeholder took them."""
        found = self._reservations.get(reservation)
        return found.ports if found is not None else frozenset()

    def handover_nodes(self) -> Set[str]:
        """The nodes with a Reservation in handover: a view, read it before any event."""
        return self._handover.keys()

    def promising_nodes(self) -> Set[str]:
        """The nodes where `promised` may be more than nothing (a superset)."""
        return self._bound_placeholders.keys() | self._handover.keys()

    def promised(self, node: str) -> Resources:
        """Capacity on the node held for Reservations: by their bound placeholders, and by
        the Reservations themselves while in handover."""
        promised = self._bound_placeholders.get(node, {})
        for name, held in self._handover.get(node, {}).items():
            promised = subtract(add(promised, held), self._placeholder_charge(name, node))
        return promised

    def reserved_for(self, pod_uid: str) -> tuple[str, str] | None:
        """`(reservation, node)` if the pod is a recorded owner of an Available Reservation."""
        name = self._owners.get(pod_uid)
        if name is None:
            return None
        return name, self._reservations[name].node

    def pod(self, uid: str) -> PodEntry | None:
        return self._pods.get(uid)

    def placeholder_of(self, uid: str) -> str | None:
        """The Reservation the pod with this UID is the placeholder of, if it is one:
        recorded as such, whether or not the ledger has seen the pod yet."""
        return self._placeholder_of.get(uid) or self._recorded_uids.get(uid)

    def placeholder_of_pod(self, pod: Object) -> str | None:
        """The Reservation `pod` is the placeholder of, checked against the Reservations
        held here, whether or not the ledger has seen the pod itself."""
        return self._recorded(protocol.placeholder_claim(pod))

    def _recorded(self, claim: protocol.Placeholder | None) -> str | None:
        """The Reservation whose recorded placeholder makes this claim, if any."""
        if claim is None or not protocol.is_recorded(claim, self._records.get(claim.reservation)):
            return None
        return claim.reservation

    # ----- bookkeeping ----------------------------------------------------------------

    def _rerecord(self, name: str, record: protocol.Placeholder | None) -> None:
        """The Reservation `name` now records `record` (None: none, or gone): charge again
        the pods that name it, so that only its recorded placeholder counts as one."""
        naming = [(uid, self._pods[uid]) for uid in self._naming.get(name, set())]
        for uid, entry in naming:
            self._uncharge(uid, entry)
        old = self._records.pop(name, None)
        if old is not None and self._recorded_uids.get(old.pod_uid) == name:
            del self._recorded_uids[old.pod_uid]
        if record is not None:
            self._records[name] = record
            self._recorded_uids[record.pod_uid] = name
        for uid, entry in naming:
            self._charge(uid, entry)

    def _charge(self, uid: str, entry: PodEntry) -> None:
        if entry.claim is not None:
            self._naming.setdefault(entry.claim.reservation, set()).add(uid)
        placeholder_for = self._recorded(entry.claim)
        node = entry.charged_node
        if node is not None:
            self._bound[node] = add(self._bound.get(node, {}), entry.requests)
            if placeholder_for is not None:
                self._bound_placeholders[node] = add(
                    self._bound_placeholders.get(node, {}), entry.requests
                )
        if placeholder_for is not None:
            self._placeholder_of[uid] = placeholder_for
            if not entry.terminal:
                self._live_placeholders.setdefault(placeholder_for, set()).add(uid)
                charged = self._placeholder_charged.get(placeholder_for, {})
                self._placeholder_charged[placeholder_for] = maximum(charged, entry.requests)

    def _uncharge(self, uid: str, entry: PodEntry) -> None:
        if entry.claim is not None:
            naming = self._naming.get(entry.claim.reservation, set())
            naming.discard(uid)
            if not naming:
                self._naming.pop(entry.claim.reservation, None)
        placeholder_for = self._placeholder_of.pop(uid, None)
        node = entry.charged_node
        if node is not None:
            _lessen(self._bound, node, entry.requests)
            if placeholder_for is not None:
                _lessen(self._bound_placeholders, node, entry.requests)
        if placeholder_for is not None:
            live = self._live_placeholders.get(placeholder_for, set())
            live.discard(uid)
            if not live:
                self._live_placeholders.pop(placeholder_for, None)

    def _refresh(self, name: str) -> None:
        """Put the Reservation in or out of handover after anything it depends on changed."""
        node = self._handover_node.pop(name, None)
        if node is not None:
            on_node = self._handover[node]
            del on_node[name]
            if not on_node:
                del self._handover[node]
        reservation = self._reservations.get(name)
        if reservation is not None and self._in_handover(reservation):
            held = maximum(reservation.held, self._placeholder_charged.get(name, {}))
            self._handover.setdefault(reservation.node, {})[name] = held
            self._handover_node[name] = reservation.node

    def _in_handover(self, reservation: _Reservation) -> bool:
        """An owner is recorded and no owner is bound yet.

        From the moment an owner is recorded the Reservation itself holds the capacity,
        whether or not this cache has seen its placeholder go: the scheduler may see the
        deletion first, and must not hand the place to another pod in between. An owner
        the ledger has not seen (or that was deleted) is not bound: the capacity stays
        held until the controller ends the Reservation.
        """
        if not reservation.owners:
            return False
        return not any(
            (owner := self._pods.get(uid)) is not None and owner.node is not None
            for uid in reservation.owners
        )


def _lessen(sums: dict[str, Resources], node: str, requests: Resources) -> None:
    """Take `requests` off the node's sums; a node left with none is dropped, so that
    the nodes a sum is kept for are those where it is more than nothing (a node deleted,
    a placeholder gone: `promising_nodes` stays as small as what is promised)."""
    left = subtract(sums.get(node, {}), requests)
    if any(left.values()):
        sums[node] = left
    else:
        sums.pop(node, None)


class FreeCapacity(Mapping[str, Resources]):
    """Node name → free capacity, as the ledger had it at one moment (`Ledger.frozen_free`);
    each node's worked out when first asked."""

    def __init__(
        self,
        allocatable: dict[str, Resources],
        bound: dict[str, Resources],
        handover: dict[str, Resources],
    ) -> None:
        self._allocatable = allocatable
        self._bound = bound
        self._free = handover
        """Node → free capacity, for the nodes with a Reservation in handover and those
        asked already."""

    def __getitem__(self, node: str) -> Resources:
        found = self._free.get(node)
        if found is None:
            found = subtract(self._allocatable[node], self._bound.get(node, {}))
            self._free[node] = found
        return found

    def __contains__(self, node: object) -> bool:
        return node in self._allocatable

    def __iter__(self) -> Iterator[str]:
        return iter(self._allocatable)

    def __len__(self) -> int:
        return len(self._allocatable)


def _entry(key: str, pod: Object, held: PodEntry | None) -> PodEntry:
    """What the ledger remembers of `pod`; its requests are parsed again only when its
    spec, or what its kubelet reports of a resize, changed since `held`, the entry kept
    for the same pod (most events change only the rest of its status)."""
    metadata = pod["metadata"]
    spec = pod.get("spec", {})
    status = pod.get("status")
    generation = metadata.get("generation")
    reported = resize_reported(status)
    same = (
        held is not None
        and generation is not None
        and held.generation == generation
        and held.reported == reported
    )
    return PodEntry(
        name=key,
        node=spec.get("nodeName") or None,
        requests=held.requests if held is not None and same else node_charge(spec, status),
        claim=protocol.placeholder_claim(pod),
        terminal=protocol.is_terminal_pod(pod),
        generation=generation,
        reported=reported,
    )
