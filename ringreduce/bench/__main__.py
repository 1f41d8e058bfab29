"""`python -m ringreduce.bench`: see the package's docstring."""

from ringreduce.bench.cli import main

# Spawned ranks import this module again under another name; only the command itself runs main().
if __name__ == "__main__":
    main()
