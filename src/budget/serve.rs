//! `POST /budgets/{name}/take` and `/penalize` on `pool serve`.
