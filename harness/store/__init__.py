"""Storage: the append-only results store, replayable case files, and the matrix rendered from them. Imports the
layers below (core, registry, ops, engine); nothing here runs a kernel."""
