import sys

from harness.core import bytecode, stopping

bytecode.keep_for_run()  # before the imports this run's processes would compile again

stopping.own_tree()  # before any process starts: every one this run starts carries its mark
stopping.interrupt_on_signals()  # SIGTERM and SIGHUP stop the run as Ctrl-C does, through its cleanup
try:
    from harness.cli import main

    code = main()
except KeyboardInterrupt as e:  # Ctrl-C or SIGTERM (the sweep's SweepInterrupted says what is left): no traceback
    with stopping.uninterrupted():
        print(f"interrupted: {e}" if str(e) else "interrupted", file=sys.stderr)
    code = 130
finally:
    with stopping.uninterrupted():  # what the run started ends with it (fork servers, hosts, their children)
        stopping.end_tree()
stopping.exit_now(code)
