"""Berth's mutating admission webhook: binds a replacement pod to its Reservation.

When a migrated pod's controller creates the replacement, this webhook claims the
Reservation made for it and holds the pod with a scheduling gate, pinned to the reserved
node, until the controller has handed the placeholder's capacity over. It is stateless
and runs as several replicas; the claim on the API server keeps them from binding one
Reservation twice.
"""
