"""PodDisruptionBudgets in a round: which ones cover a pod, and what each has left.

Evicting a healthy pod takes one disruption from every PDB that selects it. The API
server's `status.disruptionsAllowed` lags behind migrations already under way, so a round
takes away the Running jobs' pods it still counts healthy (and has not yet recorded in
`status.disruptedPods`), then one more for each job it admits.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from berth.scheduling import selector_matches
from controller.arbitration.objects import Object, object_key, same_objects

if TYPE_CHECKING:
    from controller.arbitration.candidates import Candidate, PodFacts


class PdbIndex:
    """PDBs by namespace and one of their matchLabels, so a pod meets only the few PDBs
    that may select it. It holds nothing of a round, so a round reuses the last round's
    index (and the answers it gave) while the PDBs are the very same objects."""

    def __init__(self, pdbs: Sequence[Object]) -> None:
        self.pdbs = tuple(pdbs)
        self.by_label: dict[str, dict[tuple[str, str], list[tuple[str, Object]]]] = {}
        """namespace → (label, value) → (namespace/name, PDB); ("", "") holds those without
        matchLabels."""
        self.allowed: dict[str, int] = {}
        """namespace/name → status.disruptionsAllowed."""
        self.answers: dict[tuple[str, frozenset[tuple[str, str]]], list[tuple[str, Object]]] = {}
        for pdb in pdbs:
            selector = (pdb.get("spec") or {}).get("selector")
            if selector is None:  # a null selector selects no pod
                continue
            labels = selector.get("matchLabels") or {"": ""}
            index = self.by_label.setdefault(pdb["metadata"]["namespace"], {})
            key = object_key(pdb)
            index.setdefault(next(iter(labels.items())), []).append((key, pdb))
            self.allowed[key] = _allowed(pdb)

    def holds(self, pdbs: Sequence[Object]) -> bool:
        """Whether the index was built from these very objects."""
        return same_objects(pdbs, self.pdbs)

    def covering(
        self, namespace: str, labels: Mapping[str, str], label_set: frozenset[tuple[str, str]]
    ) -> list[tuple[str, Object]]:
        """The PDBs selecting a pod with these labels, with their namespace/name
        (`label_set` is the same labels, hashable: pods with equal labels share the
        answer)."""
        index = self.by_label.get(namespace)
        if not index:
            return []
        key = (namespace, label_set)
        found = self.answers.get(key)
        if found is None:
            found = self.answers[key] = [
                (name, pdb)
                for item in (*labels.items(), ("", ""))
                for name, pdb in index.get(item, ())
                if selector_matches(pdb["spec"]["selector"], labels)
            ]
        return found


def _allowed(pdb: Object) -> int:
    """status.disruptionsAllowed; none while the disruption controller has not yet seen
    the budget's current spec (the Eviction API answers 429 then)."""
    status = pdb.get("status") or {}
    generation = int(pdb["metadata"].get("generation") or 0)
    if int(status.get("observedGeneration") or 0) < generation:
        return 0
    return int(status.get("disruptionsAllowed") or 0)


def spares_unhealthy(pdb: Object) -> bool:
    """Whether the budget lets an unhealthy (not Ready) pod go without taking one of its
    disruptions, as the Eviction API judges it: `unhealthyPodEvictionPolicy: AlwaysAllow`,
    or the workload is as healthy as the budget asks (currentHealthy >= desiredHealthy
    > 0). Otherwise an unhealthy pod needs a disruption left, as a healthy one does."""
    if (pdb.get("spec") or {}).get("unhealthyPodEvictionPolicy") == "AlwaysAllow":
        return True
    status = pdb.get("status") or {}
    desired = int(status.get("desiredHealthy") or 0)
    return desired > 0 and int(status.get("currentHealthy") or 0) >= desired


def takes_a_disruption(facts: PodFacts, covering: Sequence[tuple[str, Object]]) -> bool:
    """Whether evicting the pod takes a disruption from the PDBs covering it, as the
    Eviction API judges it: a healthy pod's always; an unhealthy one's unless every PDB
    covering it spares it (`spares_unhealthy`); never a pod the API deletes without
    looking at budgets (Pending, finished, terminating)."""
    if facts.healthy:
        return True
    return facts.guarded and not all(spares_unhealthy(pdb) for _, pdb in covering)


class Disruptions:
    """The disruptions each PDB has left in this round."""

    def __init__(self, index: PdbIndex) -> None:
        self.index = index
        self.left = dict(index.allowed)
        """PDB namespace/name → disruptions still to be had this round."""

    def covering(self, c: Candidate) -> list[tuple[str, Object]]:
        """The PDBs covering the candidate's pod, kept on it while the index is the same."""
        known = c.pdbs
        if known is None or known[0] is not self.index:
            known = c.pdbs = (self.index, self.index.covering(c.namespace, c.labels, c.label_set))
        return known[1]

    def takes_one(self, c: Candidate) -> bool:
        """Whether evicting the candidate's pod takes a disruption from the PDBs covering
        it (`takes_a_disruption`)."""
        return takes_a_disruption(c, self.covering(c))

    def count_running(self, facts: PodFacts, name: str) -> None:
        """A Running job's pod `name`, whose eviction takes a disruption
        (`takes_a_disruption`), takes one from each PDB covering it that does not list it
        in status.disruptedPods yet."""
        covering = self.index.covering(facts.namespace, facts.labels, facts.label_set)
        if not takes_a_disruption(facts, covering):
            return
        for key, pdb in covering:
            if name not in ((pdb.get("status") or {}).get("disruptedPods") or {}):
                self.left[key] -= 1

    def take(self, c: Candidate) -> None:
        """An admitted job's pod takes a disruption from each PDB covering it."""
        for key, _ in self.covering(c):
            self.left[key] -= 1

    def exhausted(self, c: Candidate) -> tuple[str, int, int] | None:
        """The first PDB covering the pod with no disruption left, as (namespace/name,
        disruptionsAllowed, disruptions taken by migrations); None if every one has one."""
        for key, _ in self.covering(c):
            left = self.left[key]
            if left < 1:
                allowed = self.index.allowed[key]
                return key, allowed, allowed - left
        return None
