from __future__ import annotations

from idemstore.cli import main

raise SystemExit(main())
