"""``python -m paravt.dryrun``: see :mod:`paravt.dryrun.cli`."""

from paravt.dryrun.cli import main

raise SystemExit(main())
