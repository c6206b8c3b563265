import sys

from harness.cli import main

try:
    sys.exit(main())
except KeyboardInterrupt as e:  # Ctrl-C or SIGTERM (the sweep's SweepInterrupted says what is left): no traceback
    print(f"interrupted: {e}" if str(e) else "interrupted", file=sys.stderr)
    sys.exit(130)
