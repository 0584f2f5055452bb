"""`python -m detok_worker ...` is the `detok` command."""

import sys

from detok_worker.cli.main import main

sys.exit(main())
