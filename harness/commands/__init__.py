"""Front ends of `python -m harness`: one module per command, each with `add_parser(sub)` and `run(args)`."""
