"""python -m kbit_vllm.cli (same as the kbit-vllm script)."""

import sys

from . import main

sys.exit(main())
