"""The probe child of `harness.registry.probe`: import each origin given as JSON in argv[1], printing a line
before and after each, so the parent can tell which import ended this process."""

from __future__ import annotations

import json
import sys


def _main(argv: list[str]) -> int:
    """argv: [ORIGINS_JSON] (`harness.registry.probe`'s children; `harness.engine.early_probe` runs the one a
    command starts before its own imports, through `probe_origins_here`)."""
    return probe_origins_here(json.loads(argv[0]))


def probe_origins_here(origins: list) -> int:
    """Import each origin in this process, a line before and after each (the probe child's part)."""
    from importlib import import_module, metadata

    from harness import registry

    points = {ep.name: ep for ep in metadata.entry_points(group=registry.ENTRY_POINT_GROUP)}
    for i, (kind, target) in enumerate(origins):
        print(f"probe-start {i}", flush=True)
        try:
            with registry._watched_import(f"{kind} {target!r}"):  # exits from Python are refused, as in the parent
                if kind == "entry-point":
                    if target in points:
                        points[target].load()
                else:
                    import_module(target)
        except BaseException:  # an import that raises is the parent's to report, not a death
            pass
        print(f"probe-done {i}", flush=True)
    # what the imports read: the parent records an all-clear against these files' contents (probe_cache)
    files = sorted({f for m in list(sys.modules.values()) if isinstance(f := getattr(m, "__file__", None), str)})
    print("probe-files " + json.dumps(files), flush=True)
    print("probe-end", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
