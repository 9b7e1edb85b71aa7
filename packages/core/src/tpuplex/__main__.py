"""`python -m tpuplex`: the same command as `tpuplex`."""

from tpuplex.cli import main

raise SystemExit(main())
