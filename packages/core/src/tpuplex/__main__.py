"""`python -m tpuplex`: the same command as `tpuplex`."""

from tpuplex.commands.cli import main

raise SystemExit(main())
