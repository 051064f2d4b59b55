"""The commands: `berth` (every component's sub-command, and the small tools) and
`kubectl-migrate`.

They sit above the apps so the kernel (`berth/`) and each app can be read, imported and
tested without the others; each app defines its own sub-command in its `cli` module.
"""
