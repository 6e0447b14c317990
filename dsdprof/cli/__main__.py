"""``python -m dsdprof.cli``: the same as the ``dsdprof`` command."""

from dsdprof.cli.app import main

main()
