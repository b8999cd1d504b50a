"""``python -m ckptlab.cli``: the ``ckptlab`` command."""

from ckptlab.cli.main import main

main()
