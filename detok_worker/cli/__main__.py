import sys

from detok_worker.cli.main import main

sys.exit(main())
