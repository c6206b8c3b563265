"""Planted-bug (mutant) suite: proof that the generic property test catches real kernel bugs."""
