"""``python -m rankcollapse.cli``: the same as the ``rankcollapse`` console script."""

from . import main

if __name__ == "__main__":  # importing the module (walking the package) runs nothing
    main()
