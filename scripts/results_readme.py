"""Write results/README.md, the index of the committed results, from the result files' own records.

    python scripts/results_readme.py            # rewrite it
    python scripts/results_readme.py --check    # exit 1 when it is stale
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from harness.store.record import main

if __name__ == "__main__":
    raise SystemExit(main())
