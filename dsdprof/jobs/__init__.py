"""Jobs a command runs end to end over the measure → decide → export stages: the budgeted sweep and
validate (planners over :func:`dsdprof.measure.runner.run_plan`) and the analytic engine's calibration."""
