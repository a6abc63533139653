"""`python -m edgevit` runs the command line."""
from edgevit.cli import main

main()
