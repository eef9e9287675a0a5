"""``python -m rankcollapse.cli``: the same as the ``rankcollapse`` console script."""

from . import main

main()
