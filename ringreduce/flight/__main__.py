"""``python -m ringreduce.flight [DIR_OR_FILE ...]``: see ringreduce.flight."""

import sys

from ringreduce.flight import main

sys.exit(main())
