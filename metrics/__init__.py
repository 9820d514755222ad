"""Privacy, utility and cost metrics; importing the package registers them all."""
from metrics import labels, leakage, membership, run, text, vision  # noqa: F401  (registration)
from metrics.schema import Evidence, Metric, metric

__all__ = ["Evidence", "Metric", "metric"]
