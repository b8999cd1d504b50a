"""``python -m cli``: the ``ckptlab`` command."""

from cli.main import main

main()
