"""The kube-scheduler HTTP extender: keeps a Reservation's capacity for its owner.

A Reservation is real capacity the scheduler already accounts for while its placeholder
pod lives. The extender covers the rest: it sends the Reservation's recorded owner to the
Reservation's node, keeps other pods off capacity held during the handover, places
placeholders by a strategy, and never lets preemption take a placeholder.
`extender.decide` holds the decisions; `extender.app` is the HTTP and watch plumbing.
"""
