"""The ``ckptlab`` command, assembled where both processes are visible (see
docs/architecture.md): each process contributes its own typer app; ``up`` starts both."""
