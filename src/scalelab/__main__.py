"""`python -m scalelab` runs the CLI."""

from scalelab.cli import main

main()
