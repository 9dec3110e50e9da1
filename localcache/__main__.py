"""`python -m localcache` runs the command line."""

import sys

from localcache.cli import main

sys.exit(main())
