"""`python -m enginefoundry.cli`."""

import sys

from enginefoundry.cli import main

sys.exit(main())
