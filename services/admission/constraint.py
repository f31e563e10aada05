"""Pure: `--constraint` feature expressions; the grammar lives in `shared.constraint`
(the placer matches nodes with it too). Kept for admission's imports."""

from __future__ import annotations

from shared.constraint import FORMS as CONSTRAINT_FORMS
from shared.constraint import Constraint, feasible, node_fits, parse

parse_constraint = parse

__all__ = ["CONSTRAINT_FORMS", "Constraint", "feasible", "node_fits", "parse_constraint"]
