"""`python -m labkit` is the `labkit` command (handy inside subprocesses and containers)."""

from labkit.cli import main

raise SystemExit(main())
