"""``python -m nest_integrations.cli``: the ``nest`` command."""

from nest_integrations.cli import main

raise SystemExit(main())
