"""``python -m spotwright`` is the ``spotwright`` command."""

from spotwright.cli import main

main()
