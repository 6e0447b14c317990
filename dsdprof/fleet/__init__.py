"""Profile a fleet: many sweeps (model x draft x GPU x TP), locally one after another or as Ray tasks.

* :mod:`dsdprof.fleet.plan`   the fleet file (TOML, validated) -> one :class:`RunPlan` per run
* :mod:`dsdprof.fleet.store`  where runs go: a local directory or a pyarrow filesystem URL
* :mod:`dsdprof.fleet.runner` one run (or one shard of a run) as an ordinary resumable sweep
* :mod:`dsdprof.fleet.orchestrate` the fleet: skip finished runs, run the rest (local or Ray)
* :mod:`dsdprof.fleet.export` one K table per (model, draft, hardware, TP) and an index of them
* :mod:`dsdprof.cli.fleet`    ``dsdprof fleet`` and ``dsdprof fleet-export`` (rich lives there)

Ray is optional (``pip install 'dsdprof[ray]'``) and imported only when ``--ray`` is used.
"""
