"""``python -m telegram_fence``: the same command line as ``telegram-fence``."""

import sys

from .cli.main import main

sys.exit(main())
