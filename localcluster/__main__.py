"""Entry point: ``python -m localcluster``."""

import sys

from .cli import main

sys.exit(main())
