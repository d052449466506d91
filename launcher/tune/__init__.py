"""launcher.tune: profile-driven tuning rounds inside one launch (docs/tuning.md).

candidates: the analyser's findings -> the changes worth a trial; trials: one short, fresh
training job per trial; decision: keep or reject on tokens/s (a rank test of the repeats,
outliers set aside, the noise, the loss); rounds: the loop; report: tune/report.{md,json},
the plot, tuned.yaml and W&B.
"""
