"""The experiment at its target scale, predicted before it is submitted (docs/plan.md)."""
